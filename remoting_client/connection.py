"""
mqproxy.remoting_client.connection
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

One client connection to a remoting server.

Contracts:

* :meth:`RemotingConnection.request` assigns the opaque, sends, and returns the response with that opaque;
  it raises :class:`RemotingTimeout` after ``timeout_s`` seconds (the late response is dropped) and
  :class:`ConnectionClosed` when the connection ends first. Any number of requests may be outstanding.
* :meth:`RemotingConnection.oneway` sends with the oneway flag and returns once queued.
* Frames of concurrent callers leave together (:class:`~.outbox.FrameOutbox`): a caller that finds a
  write under way leaves its frame for that writer's next ``send_all``, so N requests in flight cost
  about one write, not N. A write that fails or is not taken within ``write_timeout_s`` ends the
  connection (every pending request fails with ConnectionClosed at once). A write once begun is shielded
  from its caller's cancellation (the connection is shared by many callers: one that goes away must not
  cut a frame), so a request's own timeout does not cover a write the socket does not take.
* A request from the server is passed to the handler in a task of its own; a non-None answer is sent
  back with the request's opaque (oneway requests are never answered). Without a handler, requests are
  answered REQUEST_CODE_NOT_SUPPORTED.
* :meth:`RemotingConnection.run` reads until the peer closes or a frame is malformed; then every pending
  request fails with ConnectionClosed and :attr:`RemotingConnection.closed` is set.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Awaitable, Callable
from typing import Final

import structlog
import trio

from mqproxy.codecs.remoting import (
    DEFAULT_MAX_FRAME_BYTES,
    FLAG_ONEWAY,
    FrameDecoder,
    RemotingCodecError,
    RemotingCommand,
    encode_command,
)
from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.remoting_client.outbox import FrameOutbox, OutboxBroken

__all__ = [
    "ConnectionClosed",
    "RemotingClientError",
    "RemotingConnection",
    "RemotingTimeout",
    "ServerRequestHandler",
]

#: Handles one request the server sent; returns the response (None: no answer).
ServerRequestHandler = Callable[[RemotingCommand], Awaitable[RemotingCommand | None]]
#: A request hook applied to every outgoing request (e.g. ACL signing), in place.
RequestHook = Callable[[RemotingCommand], None]

_RECEIVE_BYTES: Final = 256 * 1024
#: Bytes queued for the writer beyond which callers wait for it to take them.
DEFAULT_MAX_OUTBOX_BYTES: Final = 4 * 1024 * 1024
#: Longest :meth:`Connection.aclose` waits for frames already sent to be written.
CLOSE_FLUSH_S: Final = 2.0
_log = structlog.get_logger("mqproxy.remoting_client")


class RemotingClientError(Exception):
    """A request could not be completed; ``addr`` is the server's address."""

    def __init__(self, addr: str, reason: str) -> None:
        super().__init__(f"{addr}: {reason}")
        self.addr = addr
        self.reason = reason


class RemotingTimeout(RemotingClientError):
    """No response within the request's timeout."""


class ConnectionClosed(RemotingClientError):
    """The connection ended before the response arrived (or was already closed)."""


class _Pending:
    __slots__ = ("done", "event", "response")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.response: RemotingCommand | None = None
        #: The request returned (answered, timed out, failed or cancelled): its deadline no longer counts.
        self.done = False


class RemotingConnection:
    """A multiplexed remoting connection over ``stream``; start :meth:`run` in a nursery."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        addr: str,
        *,
        on_request: ServerRequestHandler | None = None,
        hook: RequestHook | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_outbox_bytes: int = DEFAULT_MAX_OUTBOX_BYTES,
        write_timeout_s: float = 30.0,
    ) -> None:
        self.addr = addr
        self._stream = stream
        self._on_request = on_request
        self._hook = hook
        self._max_frame_bytes = max_frame_bytes
        self._opaques = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        # Shared by every client of a node that talks to this broker: one client's request cancelled
        # (it disconnected) must not cut a frame and end the connection for the others.
        self._outbox = FrameOutbox(
            stream,
            max_bytes=max_outbox_bytes,
            write_timeout_s=write_timeout_s,
            shield_writes=True,
            on_broken=self._write_failed,
        )
        self._read_scope = trio.CancelScope()
        self._handlers: trio.Nursery | None = None
        #: Request deadlines, earliest first: (trio time, sequence, pending); see :meth:`_expire`.
        self._deadlines: list[tuple[float, int, _Pending]] = []
        self._deadline_seq = itertools.count()
        self._timer = trio.CancelScope(deadline=math.inf)
        #: Set once the connection has ended; no request succeeds after that.
        self.closed = trio.Event()
        self.close_reason = ""

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    async def request(self, command: RemotingCommand, timeout_s: float) -> RemotingCommand:
        """Send ``command`` and wait up to ``timeout_s`` seconds for its response."""
        if self.closed.is_set():
            raise ConnectionClosed(self.addr, f"connection closed ({self.close_reason})")
        command.opaque = opaque = next(self._opaques) & 0x7FFFFFFF
        command.flag &= ~FLAG_ONEWAY
        pending = self._pending[opaque] = _Pending()
        deadline = trio.current_time() + timeout_s
        try:
            if self._handlers is None:  # not running yet: no deadline keeper
                with trio.move_on_after(timeout_s):
                    await self._write(command)
                    await pending.event.wait()
            else:
                self._expire_at(deadline, pending)
                await self._write(command, deadline=deadline)
                await pending.event.wait()
        except trio.TooSlowError:
            pass  # no room to queue the request before its deadline
        finally:
            pending.done = True
            self._pending.pop(opaque, None)
        if pending.response is not None:
            return pending.response
        if self.closed.is_set():
            raise ConnectionClosed(self.addr, f"connection closed before the response ({self.close_reason})")
        raise RemotingTimeout(self.addr, f"no response to request code {command.code} within {timeout_s:g} s")

    async def oneway(self, command: RemotingCommand) -> None:
        if self.closed.is_set():
            raise ConnectionClosed(self.addr, f"connection closed ({self.close_reason})")
        command.opaque = next(self._opaques) & 0x7FFFFFFF
        command.flag |= FLAG_ONEWAY
        await self._write(command)

    def _expire_at(self, deadline: float, pending: _Pending) -> None:
        heapq.heappush(self._deadlines, (deadline, next(self._deadline_seq), pending))
        if deadline < self._timer.deadline:
            self._timer.deadline = deadline

    async def _expire(self) -> None:
        """Wake each request whose deadline passed (its response stays None, so it times out).

        One task and one cancel scope per connection instead of one scope per request (a scope costs a
        node several microseconds per forwarded request). The heap keeps the deadlines of requests that
        already returned until they reach its head, where they are dropped without waiting for them; so
        the keeper sleeps until the oldest request still waiting is due, and the deadlines it keeps are
        about those of one timeout's worth of requests."""
        heap = self._deadlines
        while True:
            now = trio.current_time()
            while heap and (heap[0][2].done or heap[0][0] <= now):
                _, _, pending = heapq.heappop(heap)
                if not pending.done:
                    pending.event.set()
            self._timer = trio.CancelScope(deadline=heap[0][0] if heap else math.inf)
            with self._timer:
                await trio.sleep_forever()

    async def _write(
        self, command: RemotingCommand, *, hooked: bool = True, deadline: float = math.inf
    ) -> None:
        if hooked and self._hook is not None:
            self._hook(command)
        frame = encode_command(command, max_frame_bytes=self._max_frame_bytes)
        try:
            await self._outbox.put(frame, deadline=deadline)
        except OutboxBroken:
            raise ConnectionClosed(self.addr, f"connection closed ({self.close_reason})") from None

    def _write_failed(self, reason: str, detail: str | None) -> None:
        self._finish(f"write failed: {reason} ({detail})" if detail else f"write failed: {reason}")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read responses and server requests until the connection ends; then close the stream."""
        decoder = FrameDecoder(self._max_frame_bytes)
        reason = "closed by peer"
        try:
            async with trio.open_nursery() as handlers:
                self._handlers = self._outbox.nursery = handlers
                handlers.start_soon(self._expire)
                task_status.started()
                try:
                    with self._read_scope:  # cancelled by _finish: a connection given up stops reading
                        while True:
                            data = await self._stream.receive_some(_RECEIVE_BYTES)
                            if not data:
                                break
                            for command in decoder.receive_data(data):
                                self._dispatch(command)
                except RemotingCodecError as exc:
                    reason = f"malformed frame from server: {exc}"
                    _log.warning("remoting_client.bad_frame", remote=self.addr, reason=str(exc))
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    reason = f"read failed: {exc}"
                finally:
                    self._finish(reason)
                    handlers.cancel_scope.cancel()
        finally:
            self._finish(reason)
            await trio.aclose_forcefully(self._stream)

    def _dispatch(self, command: RemotingCommand) -> None:
        if command.is_response:
            pending = self._pending.get(command.opaque)
            if pending is not None:
                pending.response = command
                pending.event.set()
            return
        assert self._handlers is not None
        self._handlers.start_soon(self._serve_request, command)

    async def _serve_request(self, request: RemotingCommand) -> None:
        if self._on_request is None:
            response: RemotingCommand | None = RemotingCommand.response_to(
                request, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"request type {request.code} not supported"
            )
        else:
            try:
                response = await self._on_request(request)
            except Exception as exc:  # a handler bug answers SYSTEM_ERROR, the connection lives on
                _log.error("internal.error", exc_info=exc, remote=self.addr, code=request.code)
                response = RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR, repr(exc)[:256])
        if response is None or request.is_oneway:
            return
        response.opaque = request.opaque
        try:
            await self._write(response, hooked=False)
        except ConnectionClosed:
            pass

    def _finish(self, reason: str) -> None:
        if self.closed.is_set():
            return
        self.close_reason = reason
        self.closed.set()
        self._outbox.close(reason)
        self._read_scope.cancel()
        for pending in self._pending.values():
            pending.event.set()

    async def aclose(self) -> None:
        """Close the connection once every frame already sent (a oneway's too) was written, waiting at most
        :data:`CLOSE_FLUSH_S`; pending requests fail with ConnectionClosed."""
        try:
            with trio.move_on_after(CLOSE_FLUSH_S):
                await self._outbox.flush()
        finally:
            self._finish("closed by client")
            await trio.aclose_forcefully(self._stream)
