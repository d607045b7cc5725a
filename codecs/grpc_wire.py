"""
mqproxy.codecs.grpc_wire
~~~~~~~~~~~~~~~~~~~~~~~~

A sans-IO gRPC server connection over ``h2`` (shape of purerpc's ``GRPCConnection``): feed bytes with
:meth:`GrpcServerConnection.receive_data`, get :class:`GrpcEvent` objects back, answer with
``start_response`` / ``send_message`` / ``end_response`` and write out
:meth:`~GrpcServerConnection.data_to_send`.

Contracts:

* Requests are validated (``:method POST``, ``content-type application/grpc[+…|;…]``, ``te: trailers``,
  ``:path /Service/Method``, ``grpc-timeout``, ``-bin`` metadata) before a :class:`RequestReceived` is
  emitted; a bad one is answered by the codec (HTTP 405/415/400 or a gRPC Trailers-Only status) and reported
  as :class:`RequestRejected`. Framing errors on an accepted call (compressed message, message over
  ``max_message_bytes``, truncated message at END_STREAM, connection buffer budget exceeded) are answered
  the same way; the call is then over.
* Inbound DATA is acknowledged as soon as it is framed, so a peer never stalls; memory is bounded by
  ``max_message_bytes`` per stream and ``max_buffered_bytes`` per connection (partial messages only).
* Outbound messages are queued per stream and written as flow control allows; the queue is flushed on
  WINDOW_UPDATE/SETTINGS. ``pending_outbound_bytes`` lets the I/O layer apply back-pressure.
* Calls on a stream that is gone (reset by the peer, finished, connection closed) are ignored.
* HTTP/2 connection errors raise :class:`GrpcWireError`, with the GOAWAY already queued in
  ``data_to_send()``: flush it, then close the socket.
* :meth:`~GrpcServerConnection.shutdown` is the graceful close (GOAWAY NO_ERROR, in-flight calls finish, new
  streams refused); :meth:`~GrpcServerConnection.close` is the hard one.

Three deliberate deviations from stock ``h2`` (see :class:`_ServerH2Connection`): a client GOAWAY does not
close the connection (python-hyper/h2 #1181; in-flight streams still finish), a HEADERS frame over
``SETTINGS_MAX_CONCURRENT_STREAMS`` is refused with RST_STREAM(REFUSED_STREAM) (RFC 9113 §5.1.2) instead of
h2's connection-wide PROTOCOL_ERROR, and a frame header is judged as soon as its 9 bytes arrive (see
:class:`_EagerFrameBuffer`), so an oversized or malformed frame gets its GOAWAY before any body is awaited.

The h2-independent vocabulary (status codes, events, header validation, message framing) lives in
:mod:`mqproxy.codecs.grpc_framing`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from h2.errors import ErrorCodes
from h2.frame_buffer import FrameBuffer
from h2.stream import StreamClosedBy
from hyperframe.frame import Frame, GoAwayFrame, HeadersFrame, RstStreamFrame

from mqproxy.codecs.grpc_framing import (
    MESSAGE_PREFIX,
    BadRequest,
    ConnectionTerminated,
    GrpcEvent,
    GrpcStatus,
    GrpcWireError,
    MessageReader,
    MessageReceived,
    RequestEnded,
    RequestRejected,
    StreamReset,
    encode_metadata,
    parse_request,
    status_headers,
)

__all__ = ["GrpcServerConnection"]


# ------------------------------------------------------------------------------------ h2 subclass


_SETTINGS_FRAME_TYPE = 0x04


class _EagerFrameBuffer(FrameBuffer):
    """h2's server ``FrameBuffer`` that judges each frame header as soon as its 9 bytes are buffered.

    Stock h2 checks a frame's length against ``max_frame_size`` only once the whole body has arrived, so
    a header declaring 16 MiB (or random bytes read as one) leaves the connection waiting for a body that
    never comes. Here the length is checked at once (FRAME_SIZE_ERROR), and the client's first frame must be
    SETTINGS (RFC 9113 §3.4; PROTOCOL_ERROR otherwise). Relies on h2 4.x's ``_data`` and
    ``_validate_frame_length``.
    """

    _settings_seen = False
    #: Frames taken whole from the buffer so far.
    frames = 0

    @property
    def incomplete(self) -> bool:
        """Part of the preface, of a frame or of a header block has arrived, but not all of it (or the
        preface has, but not the SETTINGS that must follow it)."""
        return bool(self._preamble_len or not self._settings_seen or self._data or self._headers_buffer)

    def __next__(self) -> Frame:
        head = self._data[:9]
        if len(head) == 9:
            length = int.from_bytes(head[:3], "big")
            self._validate_frame_length(length)
            if len(self._data) >= 9 + length:
                self.frames += 1
            if not self._settings_seen:
                if head[3] != _SETTINGS_FRAME_TYPE:
                    raise h2.exceptions.ProtocolError(f"first frame has type {head[3]}, not SETTINGS")
                self._settings_seen = True
        return super().__next__()


class _ServerH2Connection(h2.connection.H2Connection):
    """``H2Connection`` with the server-side fixes described in the module docstring.

    Relies on h2 4.x internals (``_receive_goaway_frame``, ``_receive_headers_frame``, ``_closed_streams``,
    ``incoming_buffer``), exercised by ``tests/codecs/test_grpc_wire.py``.
    """

    #: Set by :meth:`GrpcServerConnection.shutdown`: every new stream is refused.
    draining = False

    incoming_buffer: _EagerFrameBuffer

    def __init__(self, config: h2.config.H2Configuration) -> None:
        super().__init__(config)
        self.incoming_buffer = _EagerFrameBuffer(server=True)

    def _receive_goaway_frame(self, frame: GoAwayFrame) -> tuple[list[Frame], list[h2.events.Event]]:
        event = h2.events.ConnectionTerminated()
        event.error_code = h2.errors._error_code_from_int(frame.error_code)
        event.last_stream_id = frame.last_stream_id
        event.additional_data = frame.additional_data or None
        return [], [event]

    def _receive_headers_frame(self, frame: HeadersFrame) -> tuple[list[Frame], list[h2.events.Event]]:
        sid, limit = frame.stream_id, self.local_settings.max_concurrent_streams
        # len(self.streams) bounds the open count from above and is O(1); open_inbound_streams is O(n)
        if sid in self.streams or (
            sid > self.highest_inbound_stream_id
            and not self.draining
            and (len(self.streams) < limit or self.open_inbound_streams < limit)
        ):
            return super()._receive_headers_frame(frame)
        # A new stream over the limit or while draining (REFUSED_STREAM), or HEADERS for a stream h2
        # already forgot (STREAM_CLOSED). Either way a stream error: decode the block anyway so the HPACK
        # dynamic table stays in sync (this raises on a bomb), then reset.
        h2.connection._decode_headers(self.decoder, frame.data)
        events = self.state_machine.process_input(h2.connection.ConnectionInputs.RECV_HEADERS)
        if sid % 2 == 0:
            raise h2.exceptions.ProtocolError(f"client used even stream id {sid}")
        rst = RstStreamFrame(sid)
        rst.error_code = ErrorCodes.STREAM_CLOSED
        if sid > self.highest_inbound_stream_id:
            self.highest_inbound_stream_id = sid
            self._closed_streams[sid] = StreamClosedBy.SEND_RST_STREAM
            rst.error_code = ErrorCodes.REFUSED_STREAM
        return [rst], events


# ------------------------------------------------------------------------------------- connection


@dataclass(slots=True)
class _Stream:
    reader: MessageReader
    headers_sent: bool = False
    pending: bytearray = field(default_factory=bytearray)
    trailers: list[tuple[str, str]] | None = None


class GrpcServerConnection:
    """Server side of one HTTP/2 connection carrying gRPC calls. See the module docstring.

    ``max_message_bytes``: largest request message (RESOURCE_EXHAUSTED beyond); ``max_buffered_bytes``:
    partial request messages held across all streams; ``max_concurrent_streams`` and
    ``max_header_list_size``: advertised in SETTINGS and enforced (REFUSED_STREAM; GOAWAY
    ENHANCE_YOUR_CALM); ``initial_window_bytes`` / ``connection_window_bytes``: receive windows;
    ``max_frame_bytes``: largest inbound frame. Raises ``ValueError`` for out-of-range values.
    """

    def __init__(
        self,
        *,
        max_message_bytes: int = 16 * 1024 * 1024,
        max_buffered_bytes: int = 64 * 1024 * 1024,
        max_concurrent_streams: int = 1000,
        max_header_list_size: int = 64 * 1024,
        initial_window_bytes: int = 1024 * 1024,
        connection_window_bytes: int = 16 * 1024 * 1024,
        max_frame_bytes: int = 65_536,
    ) -> None:
        if min(max_message_bytes, max_buffered_bytes, max_concurrent_streams, max_header_list_size) < 1:
            raise ValueError("limits must be positive")
        if not all(65_535 <= w <= 2**31 - 1 for w in (initial_window_bytes, connection_window_bytes)):
            raise ValueError("window sizes must be within 65535..2**31-1")
        if not 16_384 <= max_frame_bytes <= 2**24 - 1:
            raise ValueError("max_frame_bytes must be within 16384..2**24-1")
        self.max_message_bytes = max_message_bytes
        self.max_buffered_bytes = max_buffered_bytes
        self._connection_window_bytes = connection_window_bytes
        # Outbound headers are built here from constants and validated values, so h2's per-call
        # outbound validation and normalisation (a large share of a unary call's CPU) is skipped;
        # inbound headers, which come from the peer, stay fully validated.
        self._h2 = _ServerH2Connection(
            h2.config.H2Configuration(
                client_side=False,
                header_encoding=None,
                validate_outbound_headers=False,
                normalize_outbound_headers=False,
            )
        )
        self._h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: max_concurrent_streams,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: max_header_list_size,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: initial_window_bytes,
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.MAX_FRAME_SIZE: max_frame_bytes,
            },
        )
        self._h2.max_inbound_frame_size = max_frame_bytes
        self._h2.decoder.max_header_list_size = max_header_list_size
        self._streams: dict[int, _Stream] = {}
        self._buffered = 0  # bytes of partial inbound messages, all streams
        self._closed = False
        self._out = b""  # bytes queued outside h2 (the graceful GOAWAY), sent before h2's own

    # --------------------------------------------------------------------------------- inbound

    def initiate(self) -> None:
        """Queue the server preface (SETTINGS) and open the connection-level receive window."""
        self._h2.initiate_connection()
        if self._connection_window_bytes > 65_535:
            self._h2.increment_flow_control_window(self._connection_window_bytes - 65_535)

    def receive_data(self, data: bytes) -> list[GrpcEvent]:
        """Process bytes from the client; raises :class:`GrpcWireError` on an HTTP/2 connection error.

        Returns ``[]`` once the connection is closed (by :meth:`close` or an earlier error).
        """
        if self._closed:
            return []
        try:
            h2_events = self._h2.receive_data(data)
        except h2.exceptions.H2Error as e:
            code = int(getattr(e, "error_code", ErrorCodes.INTERNAL_ERROR))
            if self._h2.state_machine.state is not h2.connection.ConnectionState.CLOSED:
                # h2 raised before queueing its GOAWAY (e.g. a bad client preface): queue it here
                self._h2.close_connection(code, last_stream_id=self._h2.highest_inbound_stream_id)
            self._fail_connection()
            raise GrpcWireError(code, str(e)) from e
        events: list[GrpcEvent] = []
        for ev in h2_events:
            if isinstance(ev, h2.events.DataReceived):
                self._on_data(ev, events)
            elif isinstance(ev, h2.events.RequestReceived):
                self._on_request(ev, events)
            elif isinstance(ev, h2.events.StreamEnded):
                self._on_request_end(ev.stream_id, events)
            elif isinstance(ev, h2.events.WindowUpdated) and ev.stream_id:
                self._flush(ev.stream_id)
            elif isinstance(ev, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
                self._flush_all()
            elif isinstance(ev, h2.events.StreamReset):
                if self._drop(ev.stream_id):
                    events.append(StreamReset(stream_id=ev.stream_id, error_code=int(ev.error_code),
                                              remote=ev.remote_reset))
            elif isinstance(ev, h2.events.ConnectionTerminated):
                events.append(ConnectionTerminated(error_code=int(ev.error_code or 0),
                                                   last_stream_id=ev.last_stream_id or 0))
        return events

    def _on_request(self, ev: h2.events.RequestReceived, events: list[GrpcEvent]) -> None:
        sid = ev.stream_id
        h2_stream = self._h2.streams.get(sid)
        if h2_stream is None or h2_stream.closed:
            return  # reset by a later frame of this read (HEADERS after END_STREAM): nothing to answer
        try:
            request, compressed_status = parse_request(sid, ev.headers or ())
        except BadRequest as bad:
            self._reject(sid, bad, events)
            return
        self._streams[sid] = _Stream(reader=MessageReader(self.max_message_bytes, compressed_status))
        events.append(request)


    def _on_data(self, ev: h2.events.DataReceived, events: list[GrpcEvent]) -> None:
        sid = ev.stream_id
        if ev.flow_controlled_length:
            self._h2.acknowledge_received_data(ev.flow_controlled_length, sid)
        stream = self._streams.get(sid)
        if stream is None or not ev.data:
            return  # stream already answered by us: discard
        reader = stream.reader
        self._buffered -= reader.buffered
        try:
            messages = reader.feed(ev.data)
            if reader.buffered and self._buffered + reader.buffered > self.max_buffered_bytes:
                raise BadRequest(200, GrpcStatus.RESOURCE_EXHAUSTED, "connection receive buffer exhausted")
        except BadRequest as bad:
            stream.reader = MessageReader(0, GrpcStatus.INTERNAL)  # drop the partial message
            self._reject(sid, bad, events)
            return
        self._buffered += reader.buffered
        events.extend(MessageReceived(stream_id=sid, payload=m) for m in messages)

    def _on_request_end(self, sid: int, events: list[GrpcEvent]) -> None:
        stream = self._streams.get(sid)
        if stream is None:
            return
        if stream.reader.mid_message:
            self._reject(sid, BadRequest(200, GrpcStatus.INTERNAL, "request ended inside a message"), events)
            return
        events.append(RequestEnded(stream_id=sid))

    def _reject(self, sid: int, bad: BadRequest, events: list[GrpcEvent]) -> None:
        stream = self._streams.get(sid)
        if stream is not None:
            stream.pending.clear()
            headers_sent = stream.headers_sent
            self._drop(sid)
        else:
            headers_sent = False
        if headers_sent:
            trailers = status_headers(bad.grpc_status, bad.message)
        else:
            trailers = [(":status", str(bad.http_status)), ("content-type", "application/grpc"),
                        *status_headers(bad.grpc_status, bad.message)]
            if bad.http_status == 405:
                trailers.append(("allow", "POST"))
            if bad.grpc_status is GrpcStatus.UNIMPLEMENTED:
                trailers.append(("grpc-accept-encoding", "identity"))
        self._end_stream(sid, trailers)
        events.append(RequestRejected(stream_id=sid, http_status=bad.http_status, grpc_status=bad.grpc_status,
                                      message=bad.message))

    # -------------------------------------------------------------------------------- outbound

    def start_response(self, stream_id: int, metadata: Sequence[tuple[str, str | bytes]] = ()) -> None:
        """Send the response headers (``:status 200``) with optional metadata."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.headers_sent:
            return
        stream.headers_sent = True
        headers = [(":status", "200"), ("content-type", "application/grpc"),
                   ("grpc-accept-encoding", "identity"), *encode_metadata(metadata)]
        try:
            self._h2.send_headers(stream_id, headers)
        except h2.exceptions.NoSuchStreamError:  # h2 reset it (a stream error) without telling us
            self._drop(stream_id)

    def send_message(self, stream_id: int, payload: bytes) -> None:
        """Queue one message (headers are sent first if needed) and write what flow control allows."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.trailers is not None:
            return
        self.start_response(stream_id)
        stream.pending += MESSAGE_PREFIX.pack(0, len(payload))
        stream.pending += payload
        self._flush(stream_id)

    def end_response(self, stream_id: int, status: int, message: str = "",
                     trailers: Sequence[tuple[str, str | bytes]] = ()) -> None:
        """Finish the call with ``grpc-status``/``grpc-message`` (Trailers-Only if nothing was sent yet).

        The trailers follow any queued messages. If the client has not half-closed, RST_STREAM(NO_ERROR)
        follows them.
        """
        stream = self._streams.get(stream_id)
        if stream is None or stream.trailers is not None:
            return
        block = [*status_headers(status, message), *encode_metadata(trailers)]
        if not stream.headers_sent:
            stream.headers_sent = True
            block = [(":status", "200"), ("content-type", "application/grpc"), *block]
        stream.trailers = block
        self._flush(stream_id)

    def pending_outbound_bytes(self, stream_id: int | None = None) -> int:
        """Queued response bytes waiting for flow-control window (one stream, or all)."""
        if stream_id is not None:
            stream = self._streams.get(stream_id)
            return len(stream.pending) if stream is not None else 0
        return sum(len(s.pending) for s in self._streams.values())

    def data_to_send(self) -> bytes:
        """Bytes to write to the socket now."""
        out, self._out = self._out + self._h2.data_to_send(), b""
        return out

    def shutdown(self) -> None:
        """Start a graceful close: queue GOAWAY(NO_ERROR, last stream id seen) and refuse new streams.

        Calls already received keep working; close the socket once :attr:`open_streams` is 0 (or the grace
        period is over: then :meth:`close`).
        """
        if self._closed or self._h2.draining:
            return
        self._h2.draining = True
        goaway = GoAwayFrame(0)
        goaway.last_stream_id = self._h2.highest_inbound_stream_id
        goaway.error_code = ErrorCodes.NO_ERROR
        self._out += self._h2.data_to_send() + goaway.serialize()

    def close(self, error_code: int = 0) -> None:
        """Queue GOAWAY(error_code); every stream is dropped and later calls are ignored."""
        if self._closed:
            return
        self._closed = True
        self._streams.clear()
        self._buffered = 0
        self._h2.close_connection(error_code, last_stream_id=self._h2.highest_inbound_stream_id)

    @property
    def frame_incomplete(self) -> bool:
        """A frame (or the preface and its SETTINGS) has begun arriving but is not whole yet: the I/O layer
        bounds how long that may last."""
        return self._h2.incoming_buffer.incomplete

    @property
    def frames_received(self) -> int:
        """Whole frames read from the client so far (advances as incomplete frames complete)."""
        return self._h2.incoming_buffer.frames

    @property
    def open_streams(self) -> int:
        """Streams with codec state (accepted calls not yet finished)."""
        return len(self._streams)

    # -------------------------------------------------------------------------------- internals

    def _flush_all(self) -> None:
        for sid in [sid for sid, s in self._streams.items() if s.pending or s.trailers is not None]:
            self._flush(sid)

    def _flush(self, sid: int) -> None:
        stream = self._streams.get(sid)
        if stream is None:
            return
        pending = stream.pending
        try:
            while pending:
                window = self._h2.local_flow_control_window(sid)
                size = min(window, self._h2.max_outbound_frame_size, len(pending))
                if size <= 0:
                    return
                self._h2.send_data(sid, bytes(pending[:size]))
                del pending[:size]
        except h2.exceptions.NoSuchStreamError:  # h2 reset it (a stream error) without telling us
            self._drop(sid)
            return
        if stream.trailers is not None:
            self._finish(sid, stream)

    def _finish(self, sid: int, stream: _Stream) -> None:
        self._end_stream(sid, stream.trailers or [])
        self._drop(sid)

    def _end_stream(self, sid: int, headers: list[tuple[str, str]]) -> None:
        """Send the final HEADERS; if the client has not half-closed, RST_STREAM(NO_ERROR) stops its body.
        Nothing is sent on a stream h2 has already closed."""
        try:
            self._h2.send_headers(sid, headers, end_stream=True)
        except h2.exceptions.NoSuchStreamError:
            return
        h2_stream = self._h2.streams.get(sid)
        if h2_stream is not None and not h2_stream.closed:
            self._h2.reset_stream(sid, ErrorCodes.NO_ERROR)

    def _drop(self, sid: int) -> bool:
        stream = self._streams.pop(sid, None)
        if stream is None:
            return False
        self._buffered -= stream.reader.buffered
        return True

    def _fail_connection(self) -> None:
        self._closed = True
        self._streams.clear()
        self._buffered = 0
