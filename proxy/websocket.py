"""MQTT over WebSocket (RFC 6455 + MQTT 5.0 section 6): the HTTP upgrade check and a byte-stream adapter.

:func:`upgrade_response` decides an ``h11.Request``: the headers of a 101 (subprotocol ``mqtt`` or
``mqttv3.1``, the one listed first by the client) or a refusal (426 without a WebSocket upgrade or with a
version other than 13, 400 without an MQTT subprotocol or key).

:class:`WebSocketStream` is a ``trio.abc.Stream`` over a wsproto server connection in the OPEN state:
``receive_some`` returns the payload of binary messages as a plain byte stream (MQTT packets may span or
share messages), ``send_all`` sends one binary message. Pings are answered, a peer's close is echoed and
then reads end with ``b""``. A text message closes with 1003, a message longer than ``max_message_bytes``
with 1009, a framing error with wsproto's code (1002/1007); :attr:`WebSocketStream.close_code` records the
code sent. Buffering is bounded: the underlying stream is read only when no decoded payload is pending, so
at most one read (``READ_BYTES``) of decoded payload is held.

Logging: an upgraded connection is logged as ``conn.negotiated`` with protocol ``http`` and a ``request``
event ``GET /mqtt`` with code 101; from then on ``ctx.protocol`` is ``mqtt``, so its ``request`` events and
its ``conn.closed`` say ``mqtt`` (the metrics' open-connection gauge moves from http to mqtt too).
"""

from __future__ import annotations

import base64
import binascii

import trio
from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import LocalProtocolError, generate_accept_token

SUBPROTOCOLS = ("mqtt", "mqttv3.1")
READ_BYTES = 65536
#: Seconds the close handshake may take before the connection is dropped.
CLOSE_TIMEOUT_S = 2.0

Headers = list[tuple[str, str]]


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> list[str]:
    """Comma-separated values of every header ``name`` (lower-case), stripped."""
    out: list[str] = []
    for key, value in headers:
        if key.lower() == name:
            out.extend(v.strip() for v in value.decode("latin-1").split(",") if v.strip())
    return out


def is_websocket_upgrade(headers: list[tuple[bytes, bytes]]) -> bool:
    """True if the request asks to upgrade to WebSocket (``Upgrade: websocket``)."""
    return "websocket" in (v.lower() for v in _header(headers, b"upgrade"))


def upgrade_response(headers: list[tuple[bytes, bytes]]) -> tuple[int, Headers, str]:
    """``(101, headers, subprotocol)`` to accept, or ``(status, headers, reason)`` to refuse."""
    if not is_websocket_upgrade(headers) or "upgrade" not in (
        v.lower() for v in _header(headers, b"connection")
    ):
        return 426, [("upgrade", "websocket"), ("connection", "Upgrade")], "websocket upgrade required"
    if _header(headers, b"sec-websocket-version") != ["13"]:
        return 426, [("sec-websocket-version", "13")], "websocket version 13 required"
    keys = _header(headers, b"sec-websocket-key")
    try:
        valid_key = len(keys) == 1 and len(base64.b64decode(keys[0], validate=True)) == 16
    except (binascii.Error, ValueError):
        valid_key = False
    if not valid_key:
        return 400, [], "missing or invalid Sec-WebSocket-Key"
    offered = [v.lower() for v in _header(headers, b"sec-websocket-protocol")]
    chosen = next((p for p in offered if p in SUBPROTOCOLS), None)
    if chosen is None:
        return 400, [], "no mqtt subprotocol offered"
    accept = generate_accept_token(keys[0].encode("ascii")).decode("ascii")
    return (
        101,
        [
            ("upgrade", "websocket"),
            ("connection", "Upgrade"),
            ("sec-websocket-accept", accept),
            ("sec-websocket-protocol", chosen),
        ],
        chosen,
    )


class WebSocketStream(trio.abc.Stream):
    """Binary WebSocket messages as a byte stream (server side, after the 101)."""

    def __init__(self, transport: trio.abc.Stream, trailing_data: bytes, max_message_bytes: int) -> None:
        self.transport = transport
        self.max_message_bytes = max_message_bytes
        self.close_code: int | None = None
        self.close_reason = ""
        self._ws = Connection(ConnectionType.SERVER)
        self._pending = bytearray()
        self._message_bytes = 0
        self._eof = False
        self._send_lock = trio.Lock()
        self._unprocessed = trailing_data

    # --- sending --------------------------------------------------------------------------------
    async def _write(self, data: bytes) -> None:
        if data:
            async with self._send_lock:
                await self.transport.send_all(data)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._ws.state is not ConnectionState.OPEN:
            raise trio.ClosedResourceError("websocket is closing")
        await self._write(self._ws.send(BytesMessage(data=bytes(data))))

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport.wait_send_all_might_not_block()

    async def close(self, code: int = CloseReason.NORMAL_CLOSURE, reason: str = "") -> None:
        """Start the close handshake with ``code`` (no-op once closing); reads then end."""
        if self._ws.state in (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING):
            if self.close_code is None:
                self.close_code, self.close_reason = int(code), reason
            data = self._ws.send(CloseConnection(code=int(code), reason=reason))
            try:
                await self._write(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        self._eof = True

    # --- receiving ------------------------------------------------------------------------------
    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        while not self._pending and not self._eof:
            data: bytes | bytearray = self._unprocessed
            self._unprocessed = b""
            if not data:
                data = await self.transport.receive_some(READ_BYTES)
                if not data:
                    self._eof = True
                    break
            self._ws.receive_data(bytes(data))  # no copy: trio sockets return bytes
            await self._process_events()
        limit = len(self._pending) if max_bytes is None else max_bytes
        out = bytes(self._pending[:limit])
        del self._pending[:limit]
        return out

    async def _process_events(self) -> None:
        for event in self._ws.events():
            if self._eof:
                return
            if isinstance(event, BytesMessage):
                self._message_bytes += len(event.data)
                if self._message_bytes > self.max_message_bytes:
                    await self.close(CloseReason.MESSAGE_TOO_BIG, "message too big")
                    return
                self._pending += event.data
                if event.message_finished:
                    self._message_bytes = 0
            elif isinstance(event, TextMessage):
                await self.close(CloseReason.UNSUPPORTED_DATA, "MQTT needs binary messages")
                return
            elif isinstance(event, Ping):
                await self._write(self._ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                if self._ws.state is ConnectionState.REMOTE_CLOSING:  # the peer closed: echo its code
                    try:
                        await self._write(self._ws.send(event.response()))
                    except LocalProtocolError:
                        pass
                    self._eof = True
                elif self._ws.state is ConnectionState.OPEN:  # wsproto found a framing error
                    await self.close(event.code, event.reason or "")
                else:  # the answer to our close
                    self._eof = True
                return

    async def aclose(self) -> None:
        """Close handshake (:meth:`finish`), then close the transport."""
        await self.finish()
        await self.transport.aclose()

    async def finish(self) -> None:
        """Send a close (1000 unless one was sent) and wait up to ``CLOSE_TIMEOUT_S`` for the answer;
        the transport stays open."""
        with trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
            scope.shield = True
            await self.close()
            try:
                while self._ws.state is ConnectionState.LOCAL_CLOSING:  # wait for the peer's answer
                    data = await self.transport.receive_some(READ_BYTES)
                    if not data:
                        break
                    self._ws.receive_data(bytes(data))
                    for _event in self._ws.events():
                        pass
            except (trio.BrokenResourceError, trio.ClosedResourceError, LocalProtocolError):
                pass
