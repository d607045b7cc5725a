"""
mqproxy.codecs.grpc_framing
~~~~~~~~~~~~~~~~~~~~~~~~~~~

The gRPC-over-HTTP/2 vocabulary of :mod:`mqproxy.codecs.grpc_wire`, independent of ``h2``: status codes,
the events the connection emits, request-header validation (:func:`parse_request`), status trailers,
``grpc-timeout`` / ``grpc-message`` / ``-bin`` metadata encodings and the length-prefixed message framing
(:func:`encode_message`, :class:`MessageReader`). Pure functions and values; no I/O.
"""

from __future__ import annotations

import base64
import binascii
import enum
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "MAX_STATUS_MESSAGE_CHARS",
    "MESSAGE_PREFIX",
    "BadRequest",
    "ConnectionTerminated",
    "GrpcEvent",
    "GrpcStatus",
    "GrpcWireError",
    "MessageReader",
    "MessageReceived",
    "Metadata",
    "RequestEnded",
    "RequestReceived",
    "RequestRejected",
    "StreamReset",
    "encode_message",
    "encode_metadata",
    "parse_grpc_timeout",
    "parse_request",
    "percent_encode",
    "status_headers",
]

#: Request/response metadata: lower-case names; ``-bin`` names carry ``bytes``, others ``str``.
Metadata = tuple[tuple[str, str | bytes], ...]

#: The prefix of each message: compressed flag, payload length.
MESSAGE_PREFIX = struct.Struct(">BI")
_TIMEOUT = re.compile(r"([0-9]{1,8})([HMSmun])")
_TIMEOUT_UNIT_S = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
#: Longest ``grpc-message`` sent (characters, before encoding): clients cap the header list size
#: (grpc-python advertises 16 KiB).
MAX_STATUS_MESSAGE_CHARS = 1024
#: Request headers consumed by the codec, not passed on as metadata.
_RESERVED = frozenset({"te", "content-type", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding"})


class GrpcStatus(enum.IntEnum):
    """gRPC status codes (``grpc-status``)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class GrpcWireError(Exception):
    """The connection is unusable; a GOAWAY with ``error_code`` is already queued in ``data_to_send()``."""

    def __init__(self, error_code: int, reason: str) -> None:
        super().__init__(f"{reason} (GOAWAY error code {error_code})")
        self.error_code = error_code
        self.reason = reason


# ------------------------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True, kw_only=True)
class GrpcEvent:
    """Base class of everything :meth:`GrpcServerConnection.receive_data` returns."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestReceived(GrpcEvent):
    """A valid call started. Header values are decoded as UTF-8 (invalid bytes replaced)."""

    stream_id: int
    #: The ``:path``, e.g. ``/apache.rocketmq.v2.MessagingService/SendMessage``.
    method: str
    authority: str
    metadata: Metadata
    #: The ``grpc-timeout`` in seconds, relative to receipt of the headers; ``None`` when absent.
    deadline_s: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageReceived(GrpcEvent):
    """One complete, uncompressed request message (raw protobuf bytes; decoding is the caller's job)."""

    stream_id: int
    payload: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestEnded(GrpcEvent):
    """The client half-closed the call after whole messages only."""

    stream_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRejected(GrpcEvent):
    """The codec answered and finished this stream itself (bad request or framing error).

    If a :class:`RequestReceived` was emitted for ``stream_id`` the call is over: drop its handler.
    ``http_status`` is 200 when the answer was a gRPC status.
    """

    stream_id: int
    http_status: int
    grpc_status: GrpcStatus
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamReset(GrpcEvent):
    """The stream was reset (by the client, or by h2 on a stream error); its state is gone."""

    stream_id: int
    error_code: int
    remote: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionTerminated(GrpcEvent):
    """The client sent GOAWAY. Streams up to ``last_stream_id`` may still be answered; then close."""

    error_code: int
    last_stream_id: int


# ----------------------------------------------------------------------------------------- helpers


def parse_grpc_timeout(value: str) -> float | None:
    """``grpc-timeout`` (1-8 digits + one of ``H M S m u n``) in seconds; ``None`` if malformed."""
    match = _TIMEOUT.fullmatch(value)
    if match is None:
        return None
    return int(match[1]) * _TIMEOUT_UNIT_S[match[2]]


def percent_encode(message: str) -> str:
    """``grpc-message`` encoding: UTF-8, then %XX for bytes outside 0x20-0x7E and for ``%``."""
    return "".join(
        chr(b) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}" for b in message.encode("utf-8")
    )


def encode_message(payload: bytes) -> bytes:
    """One uncompressed length-prefixed gRPC message."""
    return MESSAGE_PREFIX.pack(0, len(payload)) + payload


def encode_metadata(metadata: Iterable[tuple[str, str | bytes]]) -> list[tuple[str, str]]:
    out = []
    for name, value in metadata:
        key = name.lower()
        if isinstance(value, bytes):
            out.append((key, base64.b64encode(value).decode("ascii").rstrip("=")))
        else:
            out.append((key, value))
    return out


class BadRequest(Exception):
    """A request the codec answers itself: HTTP ``http_status`` (200: a gRPC ``grpc_status``)."""

    def __init__(self, http_status: int, grpc_status: GrpcStatus, message: str) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.grpc_status = grpc_status
        self.message = message


def parse_request(
    sid: int, raw_headers: Iterable[tuple[bytes | str, bytes | str]],
) -> tuple[RequestReceived, GrpcStatus]:
    """Validate a call's request headers (see :mod:`.grpc_wire`); returns the event to emit and the status
    a compressed message earns on this stream. Raises :class:`BadRequest` with the answer to give."""
    pseudo: dict[str, str] = {}
    plain: dict[str, str] = {}
    metadata: list[tuple[str, str | bytes]] = []
    for raw_name, raw_value in raw_headers:
        name = raw_name.decode("ascii", "replace") if isinstance(raw_name, bytes) else raw_name
        value = raw_value.decode("utf-8", "replace") if isinstance(raw_value, bytes) else raw_value
        if name.startswith(":"):
            pseudo.setdefault(name, value)
        elif name in _RESERVED:
            plain.setdefault(name, value)
        elif name.endswith("-bin"):
            try:
                metadata.append((name, base64.b64decode(value + "=" * (-len(value) % 4), validate=True)))
            except (binascii.Error, ValueError) as e:
                raise BadRequest(200, GrpcStatus.INTERNAL, f"invalid base64 in {name}") from e
        else:
            metadata.append((name, value))
    if pseudo.get(":method") != "POST":
        raise BadRequest(405, GrpcStatus.INTERNAL, f"method {pseudo.get(':method')!r} is not POST")
    content_type = plain.get("content-type", "")
    if not (content_type == "application/grpc" or content_type.startswith(("application/grpc+",
                                                                              "application/grpc;"))):
        raise BadRequest(415, GrpcStatus.INVALID_ARGUMENT, f"invalid content-type {content_type!r}")
    if plain.get("te") != "trailers":
        raise BadRequest(400, GrpcStatus.INTERNAL, "te: trailers is required")
    path = pseudo.get(":path", "")
    if path.count("/") != 2 or not path.startswith("/") or path.endswith("/"):
        raise BadRequest(200, GrpcStatus.UNIMPLEMENTED, f"malformed method path {path!r}")
    deadline_s = None
    if "grpc-timeout" in plain:
        timeout = plain["grpc-timeout"]
        deadline_s = parse_grpc_timeout(timeout)
        if deadline_s is None:
            raise BadRequest(200, GrpcStatus.INTERNAL, f"malformed grpc-timeout {timeout!r}")
    encoding = plain.get("grpc-encoding", "identity")
    compressed_status = GrpcStatus.INTERNAL if encoding == "identity" else GrpcStatus.UNIMPLEMENTED
    request = RequestReceived(stream_id=sid, method=path, authority=pseudo.get(":authority", ""),
                              metadata=tuple(metadata), deadline_s=deadline_s)
    return request, compressed_status


def status_headers(status: int, message: str) -> list[tuple[str, str]]:
    """``grpc-status`` and (when ``message``) a truncated, percent-encoded ``grpc-message``."""
    headers = [("grpc-status", str(int(status)))]
    if message:
        if len(message) > MAX_STATUS_MESSAGE_CHARS:
            message = message[:MAX_STATUS_MESSAGE_CHARS - 3] + "..."
        headers.append(("grpc-message", percent_encode(message)))
    return headers


class MessageReader:
    """Length-prefixed message reassembly for one stream; a message is copied once, when complete."""

    __slots__ = ("_expect", "_have", "_parts", "_prefix", "compressed_status", "max_message_bytes")

    def __init__(self, max_message_bytes: int, compressed_status: GrpcStatus) -> None:
        self.max_message_bytes = max_message_bytes
        self.compressed_status = compressed_status  # what a compressed message earns on this stream
        self._prefix = b""
        self._expect = -1  # payload length of the message being read; -1 while reading a prefix
        self._have = 0
        self._parts: list[bytes] = []

    @property
    def buffered(self) -> int:
        """Bytes held for the incomplete message (0 between messages)."""
        return len(self._prefix) + self._have

    @property
    def mid_message(self) -> bool:
        """True if a message was started but not completed."""
        return self._expect >= 0 or bool(self._prefix)

    def feed(self, data: bytes) -> list[bytes]:
        """Complete messages in ``data``; raises ``BadRequest`` on a framing violation."""
        out: list[bytes] = []
        pos, end = 0, len(data)
        while pos < end:
            if self._expect < 0:
                take = 5 - len(self._prefix)
                self._prefix += data[pos:pos + take]
                pos += take
                if len(self._prefix) < 5:
                    break
                flag, length = MESSAGE_PREFIX.unpack(self._prefix)
                self._check(flag, length)
                self._prefix, self._expect = b"", length
            take = min(self._expect - self._have, end - pos)
            if take:
                self._parts.append(data[pos:pos + take])
                self._have += take
                pos += take
            if self._have == self._expect:
                out.append(self._parts[0] if len(self._parts) == 1 else b"".join(self._parts))
                self._parts, self._have, self._expect = [], 0, -1
        return out

    def _check(self, flag: int, length: int) -> None:
        if flag == 1:
            raise BadRequest(200, self.compressed_status, "compressed messages are not supported"
                              if self.compressed_status is GrpcStatus.UNIMPLEMENTED
                              else "compressed flag set without grpc-encoding")
        if flag != 0:
            raise BadRequest(200, GrpcStatus.INTERNAL, f"invalid compressed flag {flag}")
        if length > self.max_message_bytes:
            raise BadRequest(200, GrpcStatus.RESOURCE_EXHAUSTED,
                              f"message of {length} bytes exceeds the limit of {self.max_message_bytes}")
