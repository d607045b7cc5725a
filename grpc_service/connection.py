"""
mqproxy.grpc_service.connection
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

The trio driver of one gRPC connection: :class:`GrpcConnectionDriver` runs a
:class:`~mqproxy.codecs.grpc_wire.GrpcServerConnection` over the stream and a
:class:`~mqproxy.grpc_service.service.MessagingService` behind it.

Tasks: one reader (bytes -> ``receive_data`` -> events), one writer (the only task that touches the
socket: it writes ``data_to_send()`` whenever a task marks the connection dirty, so a cancelled call can
never cut a frame in half), and one task per call. Per call:

* the deadline is the ``grpc-timeout`` (DEADLINE_EXCEEDED when it passes); RST_STREAM from the client or a
  codec rejection cancels the call's task;
* request messages reach the task through a small channel (a unary call takes exactly one);
* a response waits while more than ``STREAM_HIGH_WATER`` bytes of the stream are queued behind flow
  control (back-pressure);
* one ``request`` event is logged when it ends.

The connection ends on EOF, a wire error (GOAWAY already queued and flushed), a client GOAWAY once its calls
are done, idleness (no call and no byte for ``ConnectionLimits.idle_timeout_s``), a frame (or the preface
and its SETTINGS) left incomplete for ``ConnectionLimits.frame_timeout_s`` (GOAWAY PROTOCOL_ERROR, error
``frame_timeout``), or the server draining:
then a GOAWAY(NO_ERROR) is sent, calls in flight finish (long polls and Telemetry end early) and the
connection closes when none is left. Everything else is cancelled when the connection goes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import trio
from google.protobuf.message import DecodeError

from mqproxy.codecs import grpc_framing as frames
from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.codecs.grpc_framing import GrpcStatus
from mqproxy.codecs.grpc_wire import GrpcServerConnection
from mqproxy.grpc_service.call import Call
from mqproxy.grpc_service.errors import RpcError
from mqproxy.grpc_service.service import MessagingService
from mqproxy.grpc_service.settings import ConnectionLimits
from mqproxy.runtime.context import ConnectionContext

__all__ = ["STREAM_HIGH_WATER", "GrpcConnectionDriver"]

RECEIVE_BYTES = 65_536
#: Queued response bytes per stream above which a handler's send waits for the client's window.
STREAM_HIGH_WATER = 256 * 1024
#: Request messages buffered per call before it is failed (Telemetry is the only multi-message call).
INBOUND_QUEUE = 16
#: The HTTP/2 error code (RFC 9113 §7) of the GOAWAY that ends a connection stalled mid-frame.
H2_PROTOCOL_ERROR = 0x1
#: How long the final GOAWAY/trailers may take to flush once the connection is ending.
CLOSE_FLUSH_S = 2.0


@dataclass(eq=False)
class _CallState:
    stream_id: int
    name: str
    started: float
    call: Call
    inbound_send: trio.MemorySendChannel[bytes]
    inbound_recv: trio.MemoryReceiveChannel[bytes]
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    req_bytes: int = 0
    resp_bytes: int = 0
    grpc_status: GrpcStatus | None = None


class GrpcConnectionDriver:
    """Runs one connection; see the module docstring. ``run`` returns when the connection is over."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        ctx: ConnectionContext,
        service: MessagingService,
        limits: ConnectionLimits | None = None,
    ) -> None:
        self._stream = stream
        self._ctx = ctx
        self._service = service
        self._limits = limits = limits or ConnectionLimits()
        self._conn = GrpcServerConnection(
            max_message_bytes=limits.max_message_bytes, max_concurrent_streams=limits.max_concurrent_streams
        )
        self._calls: dict[int, _CallState] = {}
        self._dirty = trio.Event()
        self._progress = trio.Event()
        self._closing = False  # no new reads: the writer exits once everything is flushed
        self._goaway_received = False
        self._draining = False
        self._broken = False
        self._read_scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None

    # --------------------------------------------------------------------------------- lifecycle

    async def run(self) -> None:
        self._conn.initiate()
        async with trio.open_nursery() as outer:
            outer.start_soon(self._writer)
            async with trio.open_nursery() as inner:
                self._nursery = inner
                inner.start_soon(self._watch_drain)
                await self._read_loop()
                inner.cancel_scope.cancel()
            self._closing = True
            self._kick()
            outer.cancel_scope.deadline = trio.current_time() + CLOSE_FLUSH_S

    def _kick(self) -> None:
        self._dirty.set()

    async def _writer(self) -> None:
        try:
            while True:
                data = self._conn.data_to_send()
                if data:
                    await self._stream.send_all(data)
                    continue
                if self._closing:
                    return
                self._dirty = trio.Event()
                await self._dirty.wait()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._broken = True
            self._ctx.error = self._ctx.error or "connection_reset"
            self._ctx.detail = self._ctx.detail or str(exc) or type(exc).__name__
            if self._read_scope is not None:
                self._read_scope.cancel()
            if self._nursery is not None:
                self._nursery.cancel_scope.cancel()

    async def _watch_drain(self) -> None:
        await self._ctx.draining.wait()
        self._draining = True
        self._conn.shutdown()
        self._kick()
        for state in self._calls.values():
            state.call.drain()  # long polls answer now
            if state.name == "Telemetry":
                state.inbound_send.close()  # the stream completes with grpc-status 0
        self._maybe_stop_reading()

    def _should_close(self) -> bool:
        return (self._goaway_received or self._draining) and not self._calls

    def _maybe_stop_reading(self) -> None:
        scope = self._read_scope
        if scope is None:
            return
        if self._should_close():
            scope.cancel()
        elif not self._calls:  # the last call ended: the idle clock starts now
            scope.deadline = min(scope.deadline, trio.current_time() + self._limits.idle_timeout_s)

    async def _read_loop(self) -> None:
        frame_started = trio.current_time()  # the sniffed preface began the first "frame"
        frames_before = 0
        while not self._broken and not self._should_close():
            idle = self._limits.idle_timeout_s if not self._calls else math.inf
            frame_deadline = frame_started + self._limits.frame_timeout_s
            data: bytes | bytearray | None = None
            with trio.CancelScope(deadline=min(trio.current_time() + idle, frame_deadline)) as scope:
                self._read_scope = scope
                try:
                    data = await self._stream.receive_some(RECEIVE_BYTES)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    self._ctx.error = self._ctx.error or "connection_reset"
                    self._ctx.detail = self._ctx.detail or str(exc) or type(exc).__name__
                    return
            self._read_scope = None
            if data is None:
                if scope.cancelled_caught and not self._should_close() and not self._broken:
                    if trio.current_time() >= frame_deadline:
                        self._conn.close(H2_PROTOCOL_ERROR)
                        self._ctx.error = self._ctx.error or "frame_timeout"
                        limit = self._limits.frame_timeout_s
                        self._ctx.detail = self._ctx.detail or f"a frame stayed incomplete for {limit:g} s"
                    else:
                        self._conn.shutdown()  # idle: say goodbye properly
                        self._ctx.detail = self._ctx.detail or "idle timeout"
                    self._kick()
                return
            if not data:
                return  # EOF
            try:
                events = self._conn.receive_data(data)
            except frames.GrpcWireError as err:
                self._ctx.error = self._ctx.error or "protocol_error"
                self._ctx.detail = self._ctx.detail or err.reason
                self._kick()
                return
            if not self._conn.frame_incomplete:
                frame_started = math.inf
            elif self._conn.frames_received != frames_before or math.isinf(frame_started):
                frame_started = trio.current_time()  # this read began the frame now incomplete
            frames_before = self._conn.frames_received
            for event in events:
                self._on_event(event)
            self._progress.set()
            self._progress = trio.Event()
            self._kick()

    # --------------------------------------------------------------------------------- events

    def _on_event(self, event: frames.GrpcEvent) -> None:
        if isinstance(event, frames.RequestReceived):
            self._on_request(event)
        elif isinstance(event, frames.MessageReceived):
            state = self._calls.get(event.stream_id)
            if state is None:
                return
            state.req_bytes += len(event.payload) + 5
            try:
                state.inbound_send.send_nowait(event.payload)
            except trio.WouldBlock:
                self._fail(state, GrpcStatus.RESOURCE_EXHAUSTED, "too many request messages queued")
            except trio.ClosedResourceError:
                pass
        elif isinstance(event, frames.RequestEnded):
            state = self._calls.get(event.stream_id)
            if state is not None:
                state.inbound_send.close()
        elif isinstance(event, frames.RequestRejected):
            state = self._calls.get(event.stream_id)
            if state is not None:
                state.grpc_status = event.grpc_status
                state.scope.cancel()
            else:
                self._log_refused("?", event.grpc_status, None)
        elif isinstance(event, frames.StreamReset):
            state = self._calls.get(event.stream_id)
            if state is not None:
                state.grpc_status = GrpcStatus.CANCELLED
                state.scope.cancel()
        elif isinstance(event, frames.ConnectionTerminated):
            self._goaway_received = True

    def _log_refused(self, op: str, status: GrpcStatus, client_id: str | None) -> None:
        """The ``request`` event of a call refused before it started."""
        self._ctx.request_event(
            op=op,
            code=None,
            status=status.name,
            outcome="error",
            latency_ms=0.0,
            req_bytes=0,
            resp_bytes=0,
            client_id=client_id,
            group=None,
            topic=None,
        )

    def _fail(self, state: _CallState, status: GrpcStatus, message: str) -> None:
        state.grpc_status = status
        self._conn.end_response(state.stream_id, status, message)
        state.scope.cancel()
        self._kick()

    def _on_request(self, event: frames.RequestReceived) -> None:
        method = pb.METHODS.get(event.method)
        metadata = {k: v for k, v in event.metadata if isinstance(v, str)}
        client_id = metadata.get("x-mq-client-id", "")
        if client_id:
            self._ctx.client_id = client_id
        name = method.name if method is not None else event.method.rsplit("/", 1)[-1][:64]
        if method is None or not self._service.handles(method.name) or self._nursery is None:
            self._conn.end_response(
                event.stream_id, GrpcStatus.UNIMPLEMENTED, f"unknown method {event.method}"
            )
            self._log_refused(name, GrpcStatus.UNIMPLEMENTED, client_id or None)
            return
        deadline = math.inf if event.deadline_s is None else trio.current_time() + event.deadline_s
        send, recv = trio.open_memory_channel[bytes](INBOUND_QUEUE)
        call = Call(
            method=name,
            client_id=client_id,
            peer=self._ctx.peer,
            metadata=metadata,
            deadline=deadline,
            acl=self._ctx.acl,
            log=self._ctx.log,
        )
        state = _CallState(event.stream_id, name, time.monotonic(), call, send, recv)
        self._calls[event.stream_id] = state
        self._nursery.start_soon(self._run_call, state, method)

    # --------------------------------------------------------------------------------- calls

    async def _send(self, state: _CallState, message: Any) -> None:
        payload = message.SerializeToString()
        state.resp_bytes += len(payload) + 5
        sid = state.stream_id
        self._conn.send_message(sid, payload)
        self._kick()
        while self._conn.pending_outbound_bytes(sid) > STREAM_HIGH_WATER:
            await self._progress.wait()

    async def _run_call(self, state: _CallState, method: pb.MethodInfo) -> None:
        sid, call = state.stream_id, state.call
        status, message = GrpcStatus.OK, ""
        finished = False  # False in `finally` means the task is being cancelled from outside
        try:
            with state.scope:
                state.scope.deadline = call.deadline
                try:
                    if method.client_streaming:
                        await self._service.telemetry(
                            call, state.inbound_recv, lambda m: self._send(state, m)
                        )
                    else:
                        request = await self._single_request(state, method)
                        if method.server_streaming:
                            await self._service.server_stream(call, request, lambda m: self._send(state, m))
                        else:
                            response = await self._service.unary(call, request)
                            await self._send(state, response)
                except RpcError as err:
                    status, message = err.status, err.message
            if state.scope.cancelled_caught and state.grpc_status is None:
                status, message = GrpcStatus.DEADLINE_EXCEEDED, "deadline exceeded"
            finished = True
        except Exception as exc:  # a handler bug ends this call, never the connection
            self._ctx.log.error(
                "internal.error", exc_info=exc, op=state.name, client_id=call.client_id or None
            )
            status, message = GrpcStatus.INTERNAL, "internal error"
            finished = True
        finally:
            if not finished:
                status, message = GrpcStatus.CANCELLED, "connection closed"
            self._calls.pop(sid, None)
            if state.grpc_status is not None:
                status = state.grpc_status
            else:
                self._conn.end_response(sid, status, message)
                self._kick()
            state.inbound_recv.close()
            self._log_call(state, status)
            self._maybe_stop_reading()

    async def _single_request(self, state: _CallState, method: pb.MethodInfo) -> Any:
        payload: bytes | None = None
        async for item in state.inbound_recv:
            if payload is not None:
                raise RpcError(GrpcStatus.UNIMPLEMENTED, "more than one request message on a unary call")
            payload = item
        if payload is None:
            raise RpcError(GrpcStatus.UNIMPLEMENTED, "no request message")
        try:
            return method.request.FromString(payload)
        except DecodeError:
            raise RpcError(
                GrpcStatus.INVALID_ARGUMENT, f"cannot parse {method.request.DESCRIPTOR.name}"
            ) from None

    def _log_call(self, state: _CallState, status: GrpcStatus) -> None:
        call = state.call
        if status is not GrpcStatus.OK:
            # a client cancelling its Telemetry stream is how official clients shut down
            status_name, ok = status.name, status is GrpcStatus.CANCELLED and state.name == "Telemetry"
        elif call.code is not None:
            status_name = call.code.name
            ok = call.code in (pb.Code.OK, pb.Code.MULTIPLE_RESULTS, pb.Code.MESSAGE_NOT_FOUND)
        else:
            status_name, ok = "OK", True
        self._ctx.request_event(
            op=state.name,
            code=None,
            status=status_name,
            outcome="ok" if ok else "error",
            latency_ms=round((time.monotonic() - state.started) * 1000, 3),
            req_bytes=state.req_bytes,
            resp_bytes=state.resp_bytes,
            client_id=call.client_id or None,
            group=call.group,
            topic=call.topic,
        )
