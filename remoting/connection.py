"""
mqproxy.remoting.connection
~~~~~~~~~~~~~~~~~~~~~~~~~~~

The trio driver of one remoting connection, and the in-process registry of consumer-group
connections. Entry point (what :class:`~mqproxy.remoting.service.RemotingService` calls)::

    async def serve_remoting(
        stream: trio.abc.Stream,
        broker: BrokerFacade,
        ctx: ServerContext,                 # ctx.groups should be the server's ConnectionRegistry
        *,
        peer: tuple[str, int] = ("127.0.0.1", 0),
        initial: bytes = b"",               # bytes the protocol sniffer already read
        on_request: RequestCallback = ignore_request,
        stats: ConnectionStats | None = None,   # filled in live; also returned
        log: structlog BoundLogger | None = None,   # for internal.error (bind conn_id on it)
        limits: ConnectionLimits = ConnectionLimits(),
    ) -> ConnectionStats

It returns when the peer closes the stream, sends an undecodable frame (``stats.error`` = the codec's
reason, e.g. ``bad_json_header``), stays idle too long (``idle_timeout``), leaves a frame incomplete too
long (``frame_timeout``) or stops reading our writes (``write_timeout``). It never closes ``stream``; the
caller does, then logs ``conn.closed`` from ``stats``. Cancelling it is safe.

Behaviour: a request frame that arrives alone in its read and whose code is in ``limits.inline_codes``
(requests that complete without waiting on anything but the store's write, e.g. sends and offset updates on
the embedded backend) is handled inline by the read loop: no task, and the next read waits for it; its
response goes straight to the socket when nothing else is being written (plain TCP,
:mod:`mqproxy.remoting.wire`, which also does the reads). Request frames whose code is in
``limits.batch_codes`` (pulls on the embedded store) are handled inline however many a read brings, one after
another, and their answers leave together in one write after the read's frames were handled; one that would
wait (a pull to be held) runs in its own task instead. Every other request frame runs in its own task
(long polls do not block other requests; the frames of one read run concurrently, so their sends share one
store write). Responses may go out of order (clients match them by opaque); responses are queued whole in
the connection's :class:`~mqproxy.remoting_client.outbox.FrameOutbox` (those of concurrent requests leave in
one ``send_all``; while ``max_outbox_bytes`` wait to be written, writers wait); frames with the response bit
are matched against this connection's own server->client calls (:meth:`RemotingConnection.call`) and never
dispatched. In-flight limit (``max_in_flight``): a two-way request beyond it is answered SYSTEM_BUSY
``[OVERLOAD]`` at once by the reader, as a broker whose request queue is full does (the Java producer
retries code 2 elsewhere), and a oneway one (which has no answer to carry a refusal, and which a broker
would drop) waits for a slot; either way reading stops while the answer or the slot waits, so a flooding
client is slowed by TCP back-pressure and its requests never pile up as tasks. While the server drains, a
client newer than 5.3.1 gets GO_AWAY (1500) for each further two-way request (it reconnects and sends it
again) until the requests in flight are done; an older one is no longer read. When the peer closes, oneway
requests still in flight complete (up to ``cleanup_timeout_s``; a consumer's last offset commits are
oneway), the others are cancelled. When the connection ends its consumers are unregistered and the remaining
members of their groups get NOTIFY_CONSUMER_IDS_CHANGED.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import structlog
import trio

from mqproxy.acl.holder import AclHolder
from mqproxy.codecs.remoting import (
    FLAG_ONEWAY,
    FrameDecoder,
    RemotingCodecError,
    RemotingCommand,
    encode_command,
)
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.facade.api import BrokerFacade
from mqproxy.remoting.context import RequestCallback, ServerContext, ignore_request
from mqproxy.remoting.errors import WouldWait
from mqproxy.remoting.limits import ConnectionLimits, ConnectionStats
from mqproxy.remoting.session import RemotingSession
from mqproxy.remoting.transactions import check_command
from mqproxy.remoting.wire import SocketWire
from mqproxy.remoting_client.outbox import FrameOutbox, OutboxBroken

if TYPE_CHECKING:
    from mqproxy.facade.types import TransactionCheck

__all__ = ["ConnectionLimits", "ConnectionStats", "RemotingConnection", "serve_remoting"]

_RECEIVE_BYTES = 64 * 1024
_OVERLOAD_REMARK = "[OVERLOAD] too many requests in flight on this connection"
#: Clients newer than RocketMQ 5.3.1 (``version`` > 475) understand GO_AWAY (1500): they reconnect and send
#: the request again once (a broker shutting down answers requests with it).
GO_AWAY_MIN_VERSION = 476
_GO_AWAY_REMARK = "please go away"


class RemotingConnection:
    """The write side and server->client calls of one connection (a
    :class:`~mqproxy.remoting.registry.GroupPeer`)."""

    def __init__(
        self, stream: trio.abc.Stream, nursery: trio.Nursery, stats: ConnectionStats, limits: ConnectionLimits
    ) -> None:
        self.stream = stream
        self.wire = SocketWire(stream)
        self.nursery = nursery
        self.stats = stats
        self.limits = limits
        self.session: RemotingSession | None = None
        self.last_activity = trio.current_time()
        self.closed = False
        self._outbox = FrameOutbox(
            stream,
            max_bytes=limits.max_outbox_bytes,
            write_timeout_s=limits.write_timeout_s,
            nursery=nursery,
            on_sent=self._sent,
            on_broken=self._write_failed,
        )
        self._calls: dict[int, trio.MemorySendChannel[RemotingCommand]] = {}

    async def write(self, frame: bytes) -> None:
        """Queue one whole frame for the peer; it leaves with the frames queued beside it. A write the
        peer does not take within ``write_timeout_s`` (or that fails) ends the connection; frames
        queued on a connection that ended are dropped."""
        if self.closed:
            return
        try:
            await self._outbox.put(frame)
        except OutboxBroken:
            pass  # the connection ended (see _write_failed)

    async def write_now(self, frame: bytes) -> None:
        """:meth:`write`, but while nothing is queued or being written the socket (plain TCP) takes what
        it can at once, without a schedule point; only the rest is queued."""
        if not self.closed and self._outbox.idle:
            try:
                sent = self.wire.send_now(frame)
            except trio.BrokenResourceError as exc:
                self.fail("connection_lost", str(exc) or None)
                return
            if sent:
                self._sent(sent)
                if sent == len(frame):
                    return
                frame = frame[sent:]
        await self.write(frame)

    async def flush(self) -> None:
        """Wait until every frame queued so far was written (or the connection ended)."""
        await self._outbox.flush()

    def _sent(self, size: int) -> None:
        self.stats.bytes_out += size
        self.last_activity = trio.current_time()

    def _write_failed(self, reason: str, detail: str | None) -> None:
        if reason == "write_cancelled":  # the connection is ending (its tasks are cancelled): no error
            self.close_calls()
        else:
            self.fail(reason, detail)

    def fail(self, reason: str, detail: str | None = None) -> None:
        """End the connection with an error (first reason wins)."""
        if self.stats.error is None:
            self.stats.error, self.stats.detail = reason, detail
        self.close_calls()
        self.nursery.cancel_scope.cancel()

    def close_calls(self) -> None:
        """Mark the connection closed; server->client calls still waiting return None at once."""
        self.closed = True
        self._outbox.close()
        calls, self._calls = self._calls, {}
        for channel in calls.values():
            channel.close()

    def notify_consumer_ids_changed(self, group: str) -> None:
        if self.closed or self.session is None:
            return
        command = RemotingCommand(
            code=RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
            opaque=self.session.next_opaque(),
            flag=FLAG_ONEWAY,
            ext_fields={"consumerGroup": group},
        )
        self.nursery.start_soon(self._send_quietly, command)

    def check_transaction_state(self, check: TransactionCheck) -> bool:
        session = self.session
        if self.closed or session is None:
            return False
        command = check_command(check, session.ctx, legacy=session.legacy_records)
        command.opaque = session.next_opaque()
        self.nursery.start_soon(self._send_quietly, command)
        return True

    async def call(self, command: RemotingCommand, timeout_s: float) -> RemotingCommand | None:
        """Send a server->client request and wait for its response.

        None when no response came within ``timeout_s`` or the connection ended first (then at once;
        :attr:`closed` tells the two apart)."""
        if self.closed or self.session is None:
            return None
        opaque = self.session.next_opaque()
        command.opaque, command.flag = opaque, command.flag & ~FLAG_ONEWAY
        send, receive = trio.open_memory_channel[RemotingCommand](1)
        self._calls[opaque] = send
        try:
            await self.write(encode_command(command))
            if self.closed:
                return None
            with trio.move_on_after(timeout_s):
                try:
                    return await receive.receive()
                except trio.EndOfChannel:  # the connection ended while we waited
                    return None
            return None
        finally:
            self._calls.pop(opaque, None)

    def deliver_response(self, response: RemotingCommand) -> None:
        channel = self._calls.pop(response.opaque, None)
        if channel is None:  # late (timed out) or never asked for: dropped, like a Java peer does
            return
        try:
            channel.send_nowait(response)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _send_quietly(self, command: RemotingCommand) -> None:
        await self.write(encode_command(command))


async def serve_remoting(
    stream: trio.abc.Stream,
    broker: BrokerFacade,
    ctx: ServerContext,
    *,
    peer: tuple[str, int] = ("127.0.0.1", 0),
    initial: bytes = b"",
    on_request: RequestCallback = ignore_request,
    stats: ConnectionStats | None = None,
    log: Any = None,
    limits: ConnectionLimits | None = None,
    draining: trio.Event | None = None,
    acl: AclHolder | None = None,
) -> ConnectionStats:
    """Serve remoting requests on ``stream`` until it ends; see the module docstring.

    When ``draining`` is set (server shutdown) no further frames are read; held long polls are answered at
    once (PULL_NOT_FOUND / POLLING_TIMEOUT), other requests already in flight run to completion (the server
    bounds that with its grace period), then the call returns. ``acl``: the access rules every request is
    checked against (:mod:`mqproxy.remoting.auth`); None = unchecked.
    """
    stats = ConnectionStats() if stats is None else stats
    limits = ConnectionLimits() if limits is None else limits
    log = structlog.get_logger("mqproxy.remoting") if log is None else log
    decoder = FrameDecoder(limits.max_frame_bytes)
    in_flight = 0
    drained: trio.Event | None = None  # set when the last request in flight ends during a drain
    oneways = 0  # oneway requests in flight
    oneways_done: trio.Event | None = None  # set when the last one ends after the peer closed
    slot_free: trio.Event | None = None  # set when a request ends while a oneway one waits for a slot
    go_away = False  # the peer understands GO_AWAY: while draining, requests are answered with it
    connection: RemotingConnection | None = None
    read_scope: trio.CancelScope | None = None
    frame_started = math.inf  # when the first byte of the incomplete frame in the decoder arrived

    async def stop_reading_on_drain(event: trio.Event, session: RemotingSession) -> None:
        nonlocal drained
        await event.wait()
        session.holds.drain()  # held long polls are answered now
        if go_away:  # read on, answering GO_AWAY, until the requests in flight are done
            if in_flight:
                drained = trio.Event()
                await drained.wait()
        if read_scope is not None:
            read_scope.cancel()

    async def answer_at_once(
        conn: RemotingConnection, session: RemotingSession, request: RemotingCommand, size: int, code: int
    ) -> None:
        """Answer a two-way request without running it (overload, go-away), in the reader: a client that
        does not read its answers stops being read once the outbox is full."""
        remark = _GO_AWAY_REMARK if code == ResponseCode.GO_AWAY else _OVERLOAD_REMARK
        handled = session.reject(request, ResponseCode(code), remark)
        frame = (
            b"" if handled.response is None else _encode_response(handled.response, limits.max_frame_bytes)
        )
        if frame:
            await conn.write(frame)
        on_request(handled.event(latency_ms=0.0, req_bytes=size, resp_bytes=len(frame)))

    async def serve_request(
        conn: RemotingConnection,
        session: RemotingSession,
        request: RemotingCommand,
        size: int,
        inline: bool,
        batch: list[bytes] | None = None,
    ) -> None:
        """Run one request; ``inline``: in the read loop. With ``batch`` (inline) its answer is added to it
        instead of written, and a request that would wait goes to a task of its own."""
        nonlocal in_flight, oneways
        started = trio.current_time()
        oneway = request.is_oneway
        oneways += oneway
        try:
            try:
                handled = await session.dispatch(request, answer_at_once=batch is not None)
            except WouldWait:
                in_flight += 1  # the task's own slot: this run's is given back below
                conn.nursery.start_soon(serve_request, conn, session, request, size, False)
                return
            resp_bytes = 0
            if handled.response is not None:
                frame = _encode_response(handled.response, limits.max_frame_bytes)
                handled.response.body = b""  # kept once (in the frame) while it waits for the outbox
                if batch is not None:
                    batch.append(frame)
                else:
                    await (conn.write_now(frame) if inline else conn.write(frame))
                resp_bytes = len(frame)
            latency_ms = (trio.current_time() - started) * 1000.0
            on_request(handled.event(latency_ms=latency_ms, req_bytes=size, resp_bytes=resp_bytes))
        finally:
            oneways -= oneway
            if oneways == 0 and oneways_done is not None:
                oneways_done.set()
            in_flight -= 1
            if slot_free is not None:
                slot_free.set()
            if in_flight == 0 and drained is not None:
                drained.set()

    try:
        async with trio.open_nursery() as nursery:
            connection = RemotingConnection(stream, nursery, stats, limits)
            session = RemotingSession(broker, ctx, conn=connection, peer=peer, log=log, acl=acl)
            connection.session = session
            if draining is not None:
                nursery.start_soon(stop_reading_on_drain, draining, session)
            data: bytes | bytearray = initial
            while True:
                if data:
                    stats.bytes_in += len(data)
                    connection.last_activity = trio.current_time()
                    before = decoder.buffered
                    try:
                        commands = decoder.receive_data(data)
                    except RemotingCodecError as exc:
                        connection.fail(exc.reason, exc.detail or None)
                        break
                    consumed = before + len(data) - decoder.buffered
                    batch: list[bytes] = []  # answers of the batch-code requests of this read
                    batched = 0
                    for index, command in enumerate(commands):
                        if command.is_response:
                            connection.deliver_response(command)
                            continue
                        stats.requests += 1
                        # exact for one frame per read; pipelined frames share the read's bytes evenly
                        size = consumed // len(commands) + (consumed % len(commands) if index == 0 else 0)
                        knows_go_away = command.version >= GO_AWAY_MIN_VERSION
                        go_away = go_away or knows_go_away
                        if (
                            knows_go_away
                            and not command.is_oneway
                            and draining is not None
                            and draining.is_set()
                        ):
                            await answer_at_once(connection, session, command, size, ResponseCode.GO_AWAY)
                            continue
                        if in_flight >= limits.max_in_flight:
                            if not command.is_oneway:
                                await answer_at_once(
                                    connection, session, command, size, ResponseCode.SYSTEM_BUSY
                                )
                                continue
                            while in_flight >= limits.max_in_flight:  # back-pressure: reading waits
                                slot_free = trio.Event()
                                await slot_free.wait()
                            slot_free = None
                        in_flight += 1
                        if command.code in limits.batch_codes:
                            answers = len(batch)
                            await serve_request(connection, session, command, size, True, batch)
                            batched += len(batch[-1]) if len(batch) > answers else 0
                            if batched >= limits.batch_bytes:
                                await connection.write_now(b"".join(batch))
                                batch.clear()
                                batched = 0
                        elif len(commands) == 1 and command.code in limits.inline_codes:
                            await serve_request(connection, session, command, size, True)
                        else:
                            nursery.start_soon(serve_request, connection, session, command, size, False)
                    if batch:
                        await connection.write_now(b"".join(batch) if len(batch) > 1 else batch[0])
                    if not decoder.buffered:
                        frame_started = math.inf
                    elif commands or math.isinf(frame_started):  # this read began the frame
                        frame_started = trio.current_time()
                if draining is not None and draining.is_set() and not (go_away and in_flight):
                    break
                data = b""
                frame_deadline = frame_started + limits.frame_timeout_s
                while not connection.closed:  # one cancel scope per read: its deadline, or the drain
                    read_scope = trio.CancelScope(deadline=_read_deadline(connection, frame_deadline))
                    with read_scope:
                        data = await _receive(connection)
                    if not read_scope.cancelled_caught or (draining is not None and draining.is_set()):
                        break
                    _check_deadlines(connection, frame_deadline)  # else activity moved the idle deadline
                read_scope = None
                if not data:
                    break
            if draining is not None and draining.is_set() and in_flight:
                drained = trio.Event()
                await drained.wait()
            elif oneways:
                # The peer closed. A oneway request is a client's last word (the offset commits a consumer
                # sends as it shuts down): it still completes; other requests' answers have nowhere to go.
                oneways_done = trio.Event()
                with trio.move_on_after(limits.cleanup_timeout_s):
                    await oneways_done.wait()
            # A response's write may return before it left (another one was being written): let the
            # last ones go out before the connection's tasks end.
            with trio.move_on_after(limits.cleanup_timeout_s):
                await connection.flush()
            nursery.cancel_scope.cancel()
    finally:
        if connection is not None:
            connection.close_calls()
            if connection.session is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(limits.cleanup_timeout_s):
                    await connection.session.close()
    return stats


def _read_deadline(conn: RemotingConnection, frame_deadline: float) -> float:
    idle = conn.limits.idle_timeout_s
    return min(conn.last_activity + idle if math.isfinite(idle) else math.inf, frame_deadline)


def _check_deadlines(conn: RemotingConnection, frame_deadline: float) -> None:
    """After a read ran out of time: fail the connection if the frame or idle timeout passed."""
    now, idle = trio.current_time(), conn.limits.idle_timeout_s
    if now >= frame_deadline:
        conn.fail("frame_timeout", f"a frame stayed incomplete for {conn.limits.frame_timeout_s:g} s")
    elif now >= conn.last_activity + idle:
        conn.fail("idle_timeout", f"nothing read or written for {idle:g} s")


async def _receive(conn: RemotingConnection) -> bytes | bytearray:
    """The next bytes from the peer; b"" at EOF or when the connection failed (bound it with a scope)."""
    try:
        return await conn.wire.receive_some(_RECEIVE_BYTES)
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        if conn.stats.error is None:
            conn.stats.error, conn.stats.detail = "connection_lost", str(exc) or None
        return b""


def _encode_response(response: RemotingCommand, max_frame_bytes: int) -> bytes:
    """The response frame; one that cannot be encoded (too large) becomes SYSTEM_ERROR."""
    try:
        return encode_command(response, max_frame_bytes=max_frame_bytes)
    except RemotingCodecError as exc:
        fallback = RemotingCommand(
            code=ResponseCode.SYSTEM_ERROR,
            opaque=response.opaque,
            flag=response.flag,
            remark=f"response cannot be encoded: {exc.reason}",
            ext_fields={k: v for k, v in response.ext_fields.items() if k in ("MSG_REGION", "TRACE_ON")},
            version=response.version,
        )
        return encode_command(fallback)
