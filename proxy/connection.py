"""One accepted connection, from first byte to close: sniff, PROXY header, TLS, route, account.

Flow: ``conn.accepted`` → read a bounded prefix under ``server.sniff_timeout_s`` → consume a PROXY
header (its source becomes the peer) → terminate TLS and sniff again inside it → hand the connection,
with the sniffed bytes replayed, to the route's handler (``conn.negotiated``) → ``conn.closed``.
A connection that never gets a protocol ends with exactly one ``conn.rejected`` instead. The
``conn.accepted``, ``conn.negotiated`` and ``conn.closed`` lines are rendered straight to the log sink
(:func:`~mqproxy.log.log_info`: the same lines, about half the cost of structlog's chain).

Limits (:mod:`mqproxy.limits`): a socket accepted while ``server.max_connections`` are admitted, or one
whose source address (the PROXY header's when present) already has ``server.max_connections_per_address``,
is refused: it is read just long enough to tell its protocol (at most ``REFUSAL_READ_S``, no TLS handshake;
only ``MAX_POLITE_REFUSALS`` at a time, others are closed at once), told so in its protocol when that is
cheap, and closed, with one ``conn.refused`` event (reason, peer) and ``mqproxy_connections_refused_total``.
"""

from __future__ import annotations

import random
import ssl
import time
from dataclasses import dataclass

import structlog
import trio

from mqproxy.accepting import Addresses
from mqproxy.codecs.proxy_protocol import ProxyProtocolError, parse_proxy_header
from mqproxy.context import LiveConnection, ServerState, format_addr
from mqproxy.limits import REASON_MAX_CONNECTIONS, REASON_MAX_PER_ADDRESS, REFUSAL_READ_S, refusal_bytes
from mqproxy.log import log_info
from mqproxy.metrics import count_bytes
from mqproxy.negotiation import Detected, NeedMore, Protocol, Unknown, sniff
from mqproxy.runtime.context import ConnectionContext
from mqproxy.runtime.streams import CountingStream, PrefixedStream, receive_now

_log = structlog.get_logger("mqproxy.conn")
#: Source of ``conn_id``s: 48 random bits each, from a generator seeded once from the OS (``secrets``
#: read ``os.urandom``, a system call, per connection; an id names a connection in logs, it is no secret).
_conn_ids = random.Random()

_OUTER = frozenset(Protocol)
#: Time allowed for a TLS close_notify exchange when a negotiated TLS connection ends cleanly.
CLOSE_NOTIFY_TIMEOUT_S = 1.0
_INNER_TLS = frozenset(p for p in Protocol if p not in (Protocol.TLS, Protocol.PROXY))


class Refused(Exception):
    """Over a connection limit: ``reason`` is the ``conn.refused`` reason; ``detected`` what the peer
    speaks, when known."""

    def __init__(self, reason: str, detected: Detected | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detected = detected


class Rejected(Exception):
    """Negotiation failed; ``reason`` is the machine-readable cause logged in ``conn.rejected``."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


@dataclass
class _Sniffer:
    """Accumulates the prefix of one (plain or TLS) stream until a protocol is detected.

    The whole phase (not each read) is bounded by ``timeout_s`` and ``max_bytes``.
    """

    stream: trio.abc.Stream
    max_bytes: int
    timeout_s: float
    buf: bytearray
    deadline: float = 0.0

    def __post_init__(self) -> None:
        self.deadline = trio.current_time() + self.timeout_s

    async def detect(self, allowed: frozenset[Protocol]) -> Detected:
        while True:
            verdict = sniff(bytes(self.buf), allowed)
            if isinstance(verdict, Detected):
                return verdict
            if isinstance(verdict, Unknown):
                raise Rejected(verdict.reason, verdict.detail)
            assert isinstance(verdict, NeedMore)
            await self.read_more()

    async def read_more(self) -> None:
        room = self.max_bytes - len(self.buf)
        if room <= 0:
            raise Rejected("sniff_limit", f"no decision within {self.max_bytes} bytes")
        # A plain TCP client's first bytes are usually there already: no cancel scope or wait for them.
        data = receive_now(self.stream, room) if isinstance(self.stream, CountingStream) else None
        if data is None:
            data = await self._receive(room)
        if not data:
            if self.buf:
                raise Rejected("eof_during_sniff", f"peer closed after {len(self.buf)} bytes")
            raise Rejected("empty_connection", "peer closed before sending anything")
        self.buf += data

    async def _receive(self, room: int) -> bytes | bytearray:
        """Wait for more bytes until the phase's deadline (``sniff_timeout`` after it)."""
        data = None
        with trio.move_on_at(self.deadline):
            try:
                data = await self.stream.receive_some(room)
            except trio.BrokenResourceError as exc:
                raise Rejected("reset_during_sniff", str(exc)) from None
        if data is None:
            raise Rejected("sniff_timeout", f"{len(self.buf)} bytes in {self.timeout_s}s, no decision")
        return data


def _peer_of(stream: trio.SocketStream) -> tuple[tuple[str, int], tuple[str, int]]:
    try:
        peer = stream.socket.getpeername()
        local = stream.socket.getsockname()
        return (peer[0], peer[1]), (local[0], local[1])
    except (OSError, AttributeError):
        return ("?", 0), ("?", 0)


async def handle_connection(
    raw: trio.abc.Stream,
    server: ServerState,
    ssl_context: ssl.SSLContext | None,
    addresses: Addresses | None = None,
) -> None:
    """Serve one accepted stream to completion; never raises (except cancellation). ``addresses``: (peer,
    local) as the accept loop knows them; None: asked of the socket."""
    started = time.monotonic()
    conn_id = f"{_conn_ids.getrandbits(48):012x}"
    wire = CountingStream(raw)
    if addresses is not None:
        peer, local = addresses
    elif isinstance(raw, trio.SocketStream):
        peer, local = _peer_of(raw)
    else:
        peer, local = ("memory", 0), ("memory", 0)
    structlog.contextvars.bind_contextvars(conn_id=conn_id)
    ctx = ConnectionContext(
        conn_id=conn_id,
        peer=peer,
        local=local,
        draining=server.draining,
        recorder=server.recorder,
        acl=server.acl,
        log=_log,
    )
    server.connection_opened()
    live = server.live[conn_id] = LiveConnection(ctx, wire, started)
    limiter = server.limiter
    admitted = limiter.open_total()
    address: str | None = None  # counted against its per-address limit
    log_info(_log, "conn.accepted", {"peer": format_addr(peer), "local": format_addr(local)})
    negotiated = False
    sniff_ms = 0.0
    stream: trio.abc.Stream | None = None
    try:
        if not admitted:
            await _refuse_total(wire, ctx, server)
            return
        stream, detected = await _negotiate(wire, ctx, server, ssl_context)
        if not limiter.open_address(ctx.peer[0]):
            raise Refused(REASON_MAX_PER_ADDRESS, detected)
        address = ctx.peer[0]
        sniff_ms = (time.monotonic() - started) * 1000
        ctx.protocol = detected.protocol.value
        structlog.contextvars.bind_contextvars(protocol=ctx.protocol)
        log_info(
            _log,
            "conn.negotiated",
            {
                "protocol": ctx.protocol,
                "tls": ctx.tls,
                "alpn": ctx.alpn,
                "proxied": ctx.proxied,
                "peer": format_addr(ctx.peer),
                "sniff_ms": round(sniff_ms, 3),
            },
        )
        negotiated = True
        series = server.metrics.connection_series(ctx.protocol)
        series.opened.inc()
        series.open.inc()
        assert server.protocols is not None, "the server builds its protocols before it accepts"
        await server.protocols.route(detected.protocol).serve(stream, ctx, detected)
    except Refused as refused:
        await _refuse(stream if stream is not None else wire, ctx, server, refused)
    except Rejected as rej:
        sniff_ms = (time.monotonic() - started) * 1000
        server.metrics.negotiation_failures.labels(rej.reason).inc()
        server.rejections.add(
            time.time(),
            "conn.rejected",
            protocol=None,
            peer=format_addr(ctx.peer),
            reason=rej.reason,
            detail=rej.detail or None,
        )
        _log.info(
            "conn.rejected",
            reason=rej.reason,
            detail=rej.detail or None,
            peer=format_addr(ctx.peer),
            sniff_ms=round(sniff_ms, 3),
            bytes_in=wire.bytes_in,
        )
    except trio.BrokenResourceError as exc:
        ctx.error = ctx.error or "connection_reset"
        ctx.detail = ctx.detail or str(exc)
    except trio.ClosedResourceError:
        ctx.error = ctx.error or "closed_locally"
    except Exception as exc:  # a bug in a handler must not take the server down
        ctx.error = "internal_error"
        ctx.detail = f"{type(exc).__name__}: {exc}"
        _log.error("internal.error", exc_info=True)
    finally:
        with trio.CancelScope(shield=True):
            if stream is not None and ctx.tls and ctx.error is None:
                with trio.move_on_after(CLOSE_NOTIFY_TIMEOUT_S):
                    try:
                        await stream.aclose()  # TLS close_notify, so the peer sees a clean end
                    except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError):
                        pass
            await trio.aclose_forcefully(wire)
        if negotiated:
            server.metrics.connection_series(ctx.protocol).open.dec()
            count_bytes(server.metrics, live)  # what scrapes have not counted yet
            log_info(
                _log,
                "conn.closed",
                {
                    "protocol": ctx.protocol,
                    "bytes_in": wire.bytes_in,
                    "bytes_out": wire.bytes_out,
                    "duration_ms": round((time.monotonic() - started) * 1000, 3),
                    "requests": ctx.requests,
                    "error": ctx.error,
                    "detail": ctx.detail,
                },
            )
        if address is not None:
            limiter.close_address(address)
        if admitted:
            limiter.close_total()
        server.live.pop(conn_id, None)
        server.connection_closed()
        structlog.contextvars.unbind_contextvars("conn_id", "protocol")


async def _refuse_total(wire: CountingStream, ctx: ConnectionContext, server: ServerState) -> None:
    """Refuse a socket accepted over ``server.max_connections``: read its protocol briefly (no TLS) when
    few refusals run, so that it can be told in its protocol; else close it at once."""
    detected: Detected | None = None
    if server.limiter.begin_refusal():
        try:
            timeout_s = min(REFUSAL_READ_S, server.settings.server.sniff_timeout_s)
            _, detected = await _negotiate(wire, ctx, server, None, timeout_s)
        except (Rejected, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            server.limiter.end_refusal()
    await _refuse(wire, ctx, server, Refused(REASON_MAX_CONNECTIONS, detected))


async def _refuse(
    wire: trio.abc.Stream, ctx: ConnectionContext, server: ServerState, refused: Refused
) -> None:
    """Tell the peer (when its protocol has a cheap refusal), log ``conn.refused``, count it; the caller
    closes. After the answer the rest of the peer's bytes are read briefly, so that closing does not reset
    the connection before the answer is read."""
    answer = refusal_bytes(refused.detected, refused.reason)
    server.metrics.connections_refused.labels(refused.reason).inc()
    protocol = refused.detected.protocol.value if refused.detected is not None else None
    server.rejections.add(time.time(), "conn.refused", protocol=protocol, peer=format_addr(ctx.peer),
                          reason=refused.reason)  # fmt: skip
    # info, not warning: a flood of refusals stays in the buffered log writes
    _log.info("conn.refused", reason=refused.reason, peer=format_addr(ctx.peer), protocol=protocol,
              answered=bool(answer))  # fmt: skip
    if not answer:
        return
    with trio.move_on_after(REFUSAL_READ_S):
        try:
            await wire.send_all(answer)
            while await wire.receive_some(4096):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


async def _negotiate(
    wire: CountingStream,
    ctx: ConnectionContext,
    server: ServerState,
    ssl_context: ssl.SSLContext | None,
    timeout_s: float | None = None,
) -> tuple[trio.abc.Stream, Detected]:
    """Sniff (and unwrap PROXY/TLS); return the stream to hand over, prefix replayed, and the verdict."""
    max_bytes = server.settings.server.max_sniff_bytes
    if timeout_s is None:
        timeout_s = server.settings.server.sniff_timeout_s
    sniffer = _Sniffer(wire, max_bytes, timeout_s, bytearray())
    allowed = _OUTER
    while True:
        detected = await sniffer.detect(allowed)
        if detected.protocol is not Protocol.PROXY:
            break
        header = None
        while header is None:
            try:
                header = parse_proxy_header(bytes(sniffer.buf))
            except ProxyProtocolError as exc:
                raise Rejected("bad_proxy_header", str(exc)) from None
            if header is None:
                await sniffer.read_more()
        del sniffer.buf[: header.consumed]
        ctx.proxied = True
        if header.source is not None:
            ctx.peer = header.source
        allowed = allowed - {Protocol.PROXY}
    if detected.protocol is not Protocol.TLS:
        return PrefixedStream(wire, bytes(sniffer.buf)), detected
    if ssl_context is None:
        raise Rejected("tls_not_configured", "TLS ClientHello received but tls.cert_file is not set")
    tls = trio.SSLStream(PrefixedStream(wire, bytes(sniffer.buf)), ssl_context, server_side=True)
    try:
        with trio.fail_after(server.settings.server.tls_handshake_timeout_s):
            await tls.do_handshake()
    except trio.TooSlowError:
        raise Rejected("tls_handshake_timeout", "") from None
    except (trio.BrokenResourceError, ssl.SSLError) as exc:
        raise Rejected("tls_handshake_failed", str(exc.__cause__ or exc)) from None
    ctx.tls = True
    ctx.alpn = tls.selected_alpn_protocol()
    inner = _Sniffer(tls, max_bytes, timeout_s, bytearray())
    detected = await inner.detect(_INNER_TLS)
    return PrefixedStream(tls, bytes(inner.buf)), detected
