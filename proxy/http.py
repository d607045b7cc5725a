"""HTTP/1.1 on the shared port, driven by the sans-IO ``h11`` state machine.

Paths: ``GET /healthz`` (200 when ready; 503 while starting or draining, and with the reason while the
backend reports itself unavailable, e.g. a RocketMQ cluster it cannot reach) and ``GET /metrics``
(Prometheus text format); ``/console`` and below: the live console (:mod:`mqproxy.console`).
``GET /mqtt`` (and ``GET /`` with ``Upgrade: websocket``) upgrades to MQTT
over WebSocket (see :mod:`mqproxy.websocket`); a refused upgrade gets its 400/426 and the connection
closes. Anything else is a 404 (405 for a wrong method on a known path). A malformed request, or headers
beyond :data:`MAX_HEADER_BYTES`, gets a 400/431 and the connection closes. Keep-alive is honoured up to
``server.idle_timeout_s`` between requests; a request whose first byte arrived must be whole within
``server.frame_timeout_s`` (else 408 and ``conn.closed`` error ``frame_timeout``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from http import HTTPStatus

import h11
import orjson
import structlog
import trio

from mqproxy import console
from mqproxy.context import ServerState, receive_unless_draining
from mqproxy.metrics import refresh_backend_metrics, render_metrics
from mqproxy.negotiation import Detected, Protocol
from mqproxy.runtime.context import ConnectionContext
from mqproxy.websocket import WebSocketStream, is_websocket_upgrade, upgrade_response

MAX_HEADER_BYTES = 16 * 1024
READ_CHUNK = 16 * 1024
#: Paths that upgrade to MQTT over WebSocket (``/`` only with ``Upgrade: websocket``).
MQTT_PATHS = ("/mqtt", "/")

Response = tuple[int, str, bytes]


async def _healthz(server: ServerState) -> Response:
    if server.ready and not server.draining.is_set():
        reason = server.backend_health()
        if reason is not None:
            return 503, "application/json", orjson.dumps({"status": "unavailable", "reason": reason})
        return 200, "application/json", orjson.dumps({"status": "ok"})
    state = "draining" if server.draining.is_set() else "starting"
    return 503, "application/json", orjson.dumps({"status": state})


async def _metrics(server: ServerState) -> Response:
    await refresh_backend_metrics(server)
    body, content_type = render_metrics(server)
    return 200, content_type, body


PATHS: dict[str, Callable[[ServerState], Awaitable[Response]]] = {
    "/healthz": _healthz,
    "/metrics": _metrics,
}


async def _send(stream: trio.abc.Stream, conn: h11.Connection, event: h11.Event) -> None:
    data = conn.send(event)
    if data:
        await stream.send_all(data)


async def _respond(
    stream: trio.abc.Stream,
    conn: h11.Connection,
    status: int,
    content_type: str,
    body: bytes,
    close: bool,
    extra_headers: list[tuple[str, str]] | None = None,
) -> None:
    headers = [("content-type", content_type), ("content-length", str(len(body))), *(extra_headers or [])]
    if close:
        headers.append(("connection", "close"))
    reason = HTTPStatus(status).phrase.encode("ascii")
    await _send(stream, conn, h11.Response(status_code=status, headers=headers, reason=reason))
    await _send(stream, conn, h11.Data(data=body))
    await _send(stream, conn, h11.EndOfMessage())


def _path(target: bytes) -> str:
    return target.split(b"?", 1)[0].decode("ascii", "replace")


async def _route(server: ServerState, method: bytes, target: bytes) -> Response:
    path = _path(target)
    handler = PATHS.get(path)
    if handler is None:
        return 404, "text/plain; charset=utf-8", b"not found\n"
    if method not in (b"GET", b"HEAD"):
        return 405, "text/plain; charset=utf-8", b"method not allowed\n"
    return await handler(server)


async def _serve_console(
    stream: trio.abc.Stream,
    conn: h11.Connection,
    ctx: ConnectionContext,
    server: ServerState,
    event: h11.Request,
) -> bool:
    """Answer a ``/console`` request; True when the connection must close after it (an event stream ended)."""
    started = trio.current_time()
    path = _path(event.target)
    headers = list(event.headers)
    ans = await console.answer(server, ctx, event.method, path, headers)
    ctx.request_event(
        op=f"{event.method.decode('ascii', 'replace')[:16]} {console.op_path(path)}",
        code=ans.status,
        status=str(ans.status),
        outcome="ok" if ans.status < 400 else "error",
        latency_ms=round((trio.current_time() - started) * 1000, 3),
        req_bytes=0,
        resp_bytes=len(ans.body),
    )
    if not ans.stream:
        body = b"" if event.method == b"HEAD" else ans.body
        await _respond(
            stream, conn, ans.status, ans.content_type, body, ctx.draining.is_set(), list(ans.headers)
        )
        return False
    # No content-length: h11 frames the stream chunked (HTTP/1.1) or by closing (HTTP/1.0).
    response_headers = [("content-type", ans.content_type), *ans.headers, ("connection", "close")]
    await _send(stream, conn, h11.Response(status_code=200, headers=response_headers, reason=b"OK"))
    authorization = next((v.decode("latin-1") for k, v in headers if k.lower() == b"authorization"), None)

    async def send(data: bytes) -> None:
        await _send(stream, conn, h11.Data(data=data))

    await console.stream_events(server, ctx, authorization, send)
    return True


def _wants_mqtt(event: h11.Request) -> bool:
    path = _path(event.target)
    return event.method == b"GET" and (
        path == "/mqtt" or (path in MQTT_PATHS and is_websocket_upgrade(list(event.headers)))
    )


async def _upgrade_to_mqtt(
    stream: trio.abc.Stream,
    conn: h11.Connection,
    ctx: ConnectionContext,
    server: ServerState,
    event: h11.Request,
) -> None:
    """Answer a WebSocket upgrade request, then serve MQTT over it until it ends."""
    started = trio.current_time()
    status, headers, why = upgrade_response(list(event.headers))
    ctx.request_event(
        op=f"GET {_path(event.target)}",
        code=status,
        status=str(status),
        outcome="ok" if status == 101 else "error",
        latency_ms=round((trio.current_time() - started) * 1000, 3),
        req_bytes=0,
        resp_bytes=0,
    )
    if status != 101:
        ctx.error = "websocket_refused"
        ctx.detail = why
        body = (why + "\n").encode("ascii")
        await _respond(stream, conn, status, "text/plain; charset=utf-8", body, True, headers)
        return
    while True:  # reach the end of the request so that h11 can switch protocols
        try:
            next_event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            ctx.error, ctx.detail = "bad_http_request", str(exc)
            return
        if next_event is h11.NEED_DATA:  # the rest of a started request: under the frame timeout
            frame_s = server.settings.server.frame_timeout_s
            data: bytes | bytearray | None = None
            with trio.move_on_after(frame_s):
                data = await stream.receive_some(READ_CHUNK)
            if data is None:
                ctx.error, ctx.detail = "frame_timeout", f"request incomplete after {frame_s:g} s"
                return
            conn.receive_data(bytes(data))
            continue
        if next_event is h11.PAUSED or isinstance(next_event, h11.EndOfMessage):
            break
        if not isinstance(next_event, h11.Data):
            return
    await _send(stream, conn, h11.InformationalResponse(status_code=101, headers=headers))
    trailing, _closed = conn.trailing_data
    metrics = server.metrics
    metrics.connections_open.labels(ctx.protocol).dec()
    ctx.protocol = "mqtt"
    structlog.contextvars.bind_contextvars(protocol=ctx.protocol)
    metrics.connections_total.labels(ctx.protocol).inc()
    metrics.connections_open.labels(ctx.protocol).inc()
    assert server.protocols is not None  # set before the first connection is accepted
    mqtt = server.protocols.mqtt
    websocket = WebSocketStream(stream, bytes(trailing), mqtt.max_packet_size)
    try:
        await mqtt.serve(websocket, ctx, Detected(Protocol.MQTT))
    finally:
        if websocket.close_code not in (None, 1000) and ctx.error is None:
            ctx.error = "websocket_closed"
            ctx.detail = f"{websocket.close_code} {websocket.close_reason}"
        await websocket.finish()


async def _request_timeout(
    stream: trio.abc.Stream, conn: h11.Connection, ctx: ConnectionContext, frame_s: float
) -> None:
    """A started request stayed incomplete for ``frame_s``: 408 (if no response began) and close."""
    ctx.error, ctx.detail = "frame_timeout", f"request incomplete after {frame_s:g} s"
    if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
        body = b"request timeout\n"
        await _respond(stream, conn, 408, "text/plain; charset=utf-8", body, True)


class HttpService:
    """HTTP/1.1 as a :class:`~mqproxy.runtime.handlers.ProtocolService` of the server core: health and metrics
    read the server's state; a WebSocket upgrade hands the connection to the server's MQTT service."""

    def __init__(self, server: ServerState) -> None:
        self._server = server

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    async def serve(self, stream: trio.abc.Stream, ctx: ConnectionContext, detected: Detected) -> None:
        await serve_http(stream, ctx, self._server)


async def serve_http(stream: trio.abc.Stream, ctx: ConnectionContext, server: ServerState) -> None:
    """Serve HTTP/1.1 requests on ``stream`` until the peer closes, the server drains or an upgrade ends."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
    idle_s = server.settings.server.idle_timeout_s
    frame_s = server.settings.server.frame_timeout_s
    # Set by a request's first byte (the sniffed bytes began the first one), cleared at its end. A started
    # request is read to its end even while the server drains; an idle keep-alive connection is not.
    request_deadline: float | None = trio.current_time() + frame_s
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            ctx.error = "bad_http_request"
            ctx.detail = str(exc)
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                status = exc.error_status_hint
                await _respond(stream, conn, status, "text/plain; charset=utf-8", b"bad request\n", True)
            return
        if event is h11.NEED_DATA:
            data: bytes | bytearray | None
            if request_deadline is None:
                data = await receive_unless_draining(stream, READ_CHUNK, server, idle_s)
                if data is None:
                    return
                request_deadline = trio.current_time() + frame_s
            else:
                data = None
                with trio.move_on_at(request_deadline):
                    data = await stream.receive_some(READ_CHUNK)
                if data is None:
                    await _request_timeout(stream, conn, ctx, frame_s)
                    return
            conn.receive_data(bytes(data))
            continue
        if isinstance(event, h11.Request):
            if _wants_mqtt(event):
                await _upgrade_to_mqtt(stream, conn, ctx, server, event)
                return
            if console.is_console_path(_path(event.target)):
                if await _serve_console(stream, conn, ctx, server, event):
                    return
                if ctx.draining.is_set() or conn.our_state is h11.MUST_CLOSE:
                    return
                continue
            started = trio.current_time()
            path = _path(event.target)
            status, content_type, body = await _route(server, event.method, event.target)
            closing = ctx.draining.is_set()
            if event.method == b"HEAD":
                body = b""
            await _respond(stream, conn, status, content_type, body, closing)
            ctx.request_event(
                op=f"{event.method.decode('ascii', 'replace')[:16]} {path if path in PATHS else '*'}",
                code=status,
                status=str(status),
                outcome="ok" if status < 400 else "error",
                latency_ms=round((trio.current_time() - started) * 1000, 3),
                req_bytes=0,
                resp_bytes=len(body),
            )
            if closing or conn.our_state is h11.MUST_CLOSE:
                return
            continue
        if isinstance(event, (h11.Data, h11.EndOfMessage)):
            if isinstance(event, h11.EndOfMessage):
                request_deadline = None
            if isinstance(event, h11.EndOfMessage) and conn.our_state is h11.DONE:
                try:
                    conn.start_next_cycle()
                except h11.LocalProtocolError:
                    return  # peer asked to close or sent a body we did not read; end cleanly
            continue
        if isinstance(event, (h11.ConnectionClosed,)):
            return
        return
