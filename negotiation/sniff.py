"""
mqproxy.negotiation.sniff
~~~~~~~~~~~~~~~~~~~~~~~~~

Protocol detection from the first bytes of a connection: a pure, bounded function.

:func:`sniff` asks one detector per allowed protocol (the :data:`DETECTORS` route table) and
combines their verdicts: any :class:`Detected` wins, else any :class:`NeedMore` asks the caller for
more bytes, else :class:`Unknown`. Every detector decides within :data:`MAX_SNIFF_BYTES_NEEDED`
bytes, never raises, and on the golden first bytes of the other protocols answers ``Unknown``, so a
true prefix is never misrouted. The caller calls :func:`sniff` again on the grown prefix; after it
consumed a PROXY header or terminated TLS it sniffs the inner bytes with those two removed from
``allowed``.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from mqproxy.codecs.proxy_protocol import V1_PREFIX as _PROXY_V1_PREFIX
from mqproxy.codecs.proxy_protocol import V2_SIGNATURE as _PROXY_V2_SIGNATURE

__all__ = [
    "ALL",
    "DETECTORS",
    "MAX_SNIFF_BYTES_NEEDED",
    "Detected",
    "NeedMore",
    "Protocol",
    "Unknown",
    "Verdict",
    "detect_grpc",
    "detect_http",
    "detect_mqtt",
    "detect_proxy",
    "detect_remoting",
    "detect_tls",
    "sniff",
]

#: No detector needs more bytes than this to decide; the I/O layer can bound its reads with it.
MAX_SNIFF_BYTES_NEEDED = 64


class Protocol(enum.StrEnum):
    """What the first bytes of a connection speak; the value is the ``protocol`` log field."""

    REMOTING = "remoting"
    MQTT = "mqtt"
    GRPC = "grpc"
    HTTP = "http"
    TLS = "tls"
    PROXY = "proxy"


@dataclass(frozen=True, slots=True)
class Detected:
    """The prefix is ``protocol``; ``info`` holds what the detector read on the way.

    Keys: remoting ``serialize_type``/``frame_length``/``header_length``, MQTT ``mqtt_level``,
    TLS ``record_version``, HTTP ``method``, PROXY ``proxy_version``.
    """

    protocol: Protocol
    info: Mapping[str, object] = field(default_factory=dict, hash=False)


@dataclass(frozen=True, slots=True)
class NeedMore:
    """The prefix is still compatible with an allowed protocol: read more bytes and sniff again."""


@dataclass(frozen=True, slots=True)
class Unknown:
    """No allowed protocol matches. ``reason`` is machine-readable; ``detail`` is short and printable."""

    reason: str
    detail: str = ""


Verdict = Detected | NeedMore | Unknown

_NEED_MORE = NeedMore()
_DETAIL_BYTES = 16


# -- RocketMQ remoting (spec/remoting.md §1.1-§1.3, §8.2) ------------------------------------------------

_FRAME_PREFIX = struct.Struct(">II")  # length, serializeType << 24 | headerLen
_JSON_WHITESPACE = b" \t\r\n"  # RFC 8259 §2
_JSON_HEADER_MIN = 2  # "{}"
# code i16, language u8, version i16, opaque i32, flag i32, remark length i32, extFields length i32 (§1.3)
_BINARY_HEADER_MIN = 21
_BINARY_PROBE = struct.Struct(">hBhiii")  # through the remark length: 17 bytes
_LANGUAGE_CODES = range(14)  # LanguageCode JAVA(0) … NODE_JS(13) (§1.5)
_FLAG_BITS = 0b11  # bit0 response, bit1 oneway (§1.4)


def detect_remoting(data: bytes) -> Verdict:
    """A remoting frame: ``i32 length`` + ``i32 (serializeType << 24 | headerLen)`` + header (§1.1).

    Checks: length > 4; serialize type 0 (JSON) or 1 (ROCKETMQ binary); headerLen <= length - 4. A JSON
    header (§1.2) must open an object — ``{`` then ``"`` or ``}``, JSON whitespace allowed around the
    brace (jsoncpp, fastjson and ali-ons all emit ``{"code"…``; jsoncpp ends the text with ``"\\n"``);
    the ``"`` must fall within the first :data:`MAX_SNIFF_BYTES_NEEDED` bytes.
    A binary header (§1.3) must be at least 21 bytes with a known LanguageCode (§1.5), only flag
    bits 0-1 set (§1.4) and a remark length within the header. The length is read unsigned and not
    capped: a plausible frame with a huge length is still remoting, so the remoting codec can close it
    as too large rather than the connection being dropped as unknown.
    """
    if len(data) < 8:
        if len(data) >= 4 and int.from_bytes(data[:4], "big") <= 4:
            return Unknown("remoting_bad_length")
        if len(data) >= 5 and data[4] > 1:
            return Unknown("remoting_bad_serialize_type")
        return _NEED_MORE
    length, word = _FRAME_PREFIX.unpack_from(data)
    if length <= 4:
        return Unknown("remoting_bad_length")
    serialize_type = word >> 24
    if serialize_type > 1:
        return Unknown("remoting_bad_serialize_type")
    header_length = word & 0xFFFFFF
    if header_length > length - 4:
        return Unknown("remoting_header_exceeds_frame")
    if serialize_type == 0:
        verdict = _remoting_json_header(data, header_length)
    else:
        verdict = _remoting_binary_header(data, header_length)
    if verdict is not None:
        return verdict
    info = {"serialize_type": serialize_type, "frame_length": length, "header_length": header_length}
    return Detected(Protocol.REMOTING, info)


def _remoting_json_header(data: bytes, header_length: int) -> Verdict | None:
    """``None`` when the header opens a JSON object; else the verdict to return."""
    if header_length < _JSON_HEADER_MIN:
        return Unknown("remoting_bad_header_length")
    end = min(8 + header_length, MAX_SNIFF_BYTES_NEEDED)
    at = _skip_json_whitespace(data, 8, end)
    for expected in (b"{", b'"}'):
        if at >= end:
            return Unknown("remoting_json_header_not_object")
        if at >= len(data):
            return _NEED_MORE
        if data[at] not in expected:
            return Unknown("remoting_json_header_not_object")
        at = _skip_json_whitespace(data, at + 1, end)
    return None


def _skip_json_whitespace(data: bytes, at: int, end: int) -> int:
    stop = min(end, len(data))
    while at < stop and data[at] in _JSON_WHITESPACE:
        at += 1
    return at


def _remoting_binary_header(data: bytes, header_length: int) -> Verdict | None:
    """``None`` when the binary header's fixed fields are plausible; else the verdict to return."""
    if header_length < _BINARY_HEADER_MIN:
        return Unknown("remoting_bad_header_length")
    if len(data) < 8 + _BINARY_PROBE.size:
        return _NEED_MORE
    _code, language, _version, _opaque, flag, remark_length = _BINARY_PROBE.unpack_from(data, 8)
    if language not in _LANGUAGE_CODES:
        return Unknown("remoting_bad_language")
    if flag & ~_FLAG_BITS:
        return Unknown("remoting_bad_flag")
    if not 0 <= remark_length <= header_length - _BINARY_HEADER_MIN:
        return Unknown("remoting_bad_remark_length")
    return None


# -- MQTT CONNECT (MQTT 3.1.1 §2.2, §3.1; MQTT 5.0 §1.5.5, §2.1.4, §3.1; MQTT 3.1 "MQIsdp") ----------------

_MQTT_CONNECT = 0x10  # packet type 1, reserved flags 0000 (3.1.1 §2.2.2, 5.0 §2.1.3)
# Protocol name → {protocol level: minimum remaining length}. The minimum is the variable header
# (name, level, connect flags, keep alive) plus the 2-byte client identifier length; 5.0 adds the
# property length byte (5.0 §3.1.2.11).
_MQTT_NAMES: tuple[tuple[bytes, Mapping[int, int]], ...] = (
    (b"\x00\x04MQTT", {4: 12, 5: 13}),
    (b"\x00\x06MQIsdp", {3: 14}),
)


def detect_mqtt(data: bytes) -> Verdict:
    """An MQTT CONNECT: 0x10, remaining length (variable byte integer, at most 4 bytes), then protocol
    name ``MQTT`` with level 4 (3.1.1) or 5 (5.0), or ``MQIsdp`` with level 3 (3.1).

    The first packet a client sends must be CONNECT (3.1.1 §3.1, 5.0 §3.1). ``info``: ``mqtt_level``.
    """
    n = len(data)
    if n == 0:
        return _NEED_MORE
    if data[0] != _MQTT_CONNECT:
        return Unknown("mqtt_not_connect")
    remaining = 0
    at = 1
    while True:
        if at > 4:
            return Unknown("mqtt_bad_remaining_length")  # a fifth length byte (3.1.1 §2.2.3)
        if at >= n:
            return _NEED_MORE
        byte = data[at]
        remaining |= (byte & 0x7F) << (7 * (at - 1))
        at += 1
        if not byte & 0x80:
            break
    rest = data[at : at + 9]
    for name, levels in _MQTT_NAMES:
        if rest.startswith(name):
            if len(rest) == len(name):
                return _NEED_MORE
            level = rest[len(name)]
            minimum = levels.get(level)
            if minimum is None:
                return Unknown("mqtt_unsupported_level")
            if remaining < minimum:
                return Unknown("mqtt_remaining_length_too_short")
            return Detected(Protocol.MQTT, {"mqtt_level": level})
        if name.startswith(rest):
            return _NEED_MORE
    return Unknown("mqtt_bad_protocol_name")


# -- gRPC: HTTP/2 with prior knowledge (RFC 9113 §3.4) ---------------------------------------------------

_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def detect_grpc(data: bytes) -> Verdict:
    """The 24-byte HTTP/2 client connection preface (RFC 9113 §3.4), all of it."""
    if data.startswith(_H2_PREFACE):
        return Detected(Protocol.GRPC)
    if _H2_PREFACE.startswith(data):
        return _NEED_MORE
    return Unknown("h2_no_preface")


# -- TLS ClientHello (RFC 8446 §4, §5.1; RFC 5246 §6.2.1) -----------------------------------------------

_TLS_HANDSHAKE = 22
_TLS_CLIENT_HELLO = 1
_TLS_MAX_PLAINTEXT = 1 << 14


def detect_tls(data: bytes) -> Verdict:
    """A TLSPlaintext record of type handshake(22), version 3.0-3.3, length 1..2^14, whose first
    handshake byte is client_hello(1). SSLv2-format hellos do not start with 22 and are ``Unknown``.

    ``info``: ``record_version`` (``"3.1"`` for most ClientHellos, RFC 8446 §5.1 legacy_record_version).
    """
    n = len(data)
    if n == 0:
        return _NEED_MORE
    if data[0] != _TLS_HANDSHAKE:
        return Unknown("tls_not_handshake")
    if n >= 2 and data[1] != 3:
        return Unknown("tls_bad_record_version")
    if n >= 3 and data[2] > 3:
        return Unknown("tls_bad_record_version")
    if n < 5:
        return _NEED_MORE
    record_length = (data[3] << 8) | data[4]
    if not 1 <= record_length <= _TLS_MAX_PLAINTEXT:
        return Unknown("tls_bad_record_length")
    if n < 6:
        return _NEED_MORE
    if data[5] != _TLS_CLIENT_HELLO:
        return Unknown("tls_not_client_hello")
    return Detected(Protocol.TLS, {"record_version": f"3.{data[2]}"})


# -- HTTP/1.x request line (RFC 9112 §3; methods RFC 9110 §9, RFC 5789) -----------------------------------

_HTTP_METHODS = tuple(
    m + b" "
    for m in (b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"CONNECT", b"TRACE")
)
_HTTP_FIRST_BYTES = frozenset(m[0] for m in _HTTP_METHODS)


def detect_http(data: bytes) -> Verdict:
    """``method SP`` and the first byte of the request-target, which must be a VCHAR (RFC 9112 §3).

    Methods are case-sensitive (RFC 9110 §9.1). ``PRI`` is not a method here: it is the h2 preface.
    ``info``: ``method``.
    """
    if not data:
        return _NEED_MORE
    if data[0] not in _HTTP_FIRST_BYTES:
        return Unknown("http_no_method")
    for method in _HTTP_METHODS:
        if data.startswith(method):
            if len(data) == len(method):
                return _NEED_MORE
            if 0x21 <= data[len(method)] <= 0x7E:
                return Detected(Protocol.HTTP, {"method": method[:-1].decode("ascii")})
            return Unknown("http_bad_request_target")
        if method.startswith(data):
            return _NEED_MORE
    return Unknown("http_no_method")


# -- PROXY protocol (haproxy doc/proxy-protocol.txt §2.1, §2.2) ------------------------------------------


def detect_proxy(data: bytes) -> Verdict:
    """A PROXY v1 line start (``"PROXY "``) or the 12-byte v2 signature.

    Only the start is checked; :func:`mqproxy.codecs.proxy_protocol.parse_proxy_header` validates the
    header. ``info``: ``proxy_version``.
    """
    if data.startswith(_PROXY_V2_SIGNATURE):
        return Detected(Protocol.PROXY, {"proxy_version": 2})
    if data.startswith(_PROXY_V1_PREFIX):
        return Detected(Protocol.PROXY, {"proxy_version": 1})
    if _PROXY_V2_SIGNATURE.startswith(data) or _PROXY_V1_PREFIX.startswith(data):
        return _NEED_MORE
    return Unknown("proxy_no_signature")


# -- the route table ------------------------------------------------------------------------------------

#: Protocol → detector. Order only breaks ties between crafted inputs two detectors both accept
#: (e.g. a ``0x16 03 …`` "remoting length"): fixed signatures first, the length-prefixed remoting last.
DETECTORS: Mapping[Protocol, Callable[[bytes], Verdict]] = MappingProxyType(
    {
        Protocol.PROXY: detect_proxy,
        Protocol.TLS: detect_tls,
        Protocol.GRPC: detect_grpc,
        Protocol.HTTP: detect_http,
        Protocol.MQTT: detect_mqtt,
        Protocol.REMOTING: detect_remoting,
    }
)

#: Every protocol: the default ``allowed`` set.
ALL: frozenset[Protocol] = frozenset(Protocol)

_Candidates = tuple[tuple[Protocol, Callable[[bytes], Verdict]], ...]


def _candidates_by_first_byte() -> tuple[_Candidates, ...]:
    """For each first byte, the detectors that do not already reject a prefix starting with it.

    Sound because detectors are monotone: a prefix they call ``Unknown`` stays ``Unknown`` however it
    grows (tested). Skipping them changes no verdict; it spares most connections five calls.
    """
    return tuple(
        tuple((p, d) for p, d in DETECTORS.items() if not isinstance(d(bytes([first])), Unknown))
        for first in range(256)
    )


_ALL_CANDIDATES: _Candidates = tuple(DETECTORS.items())
_BY_FIRST_BYTE = _candidates_by_first_byte()


def sniff(data: bytes, allowed: Iterable[Protocol] = ALL) -> Verdict:
    """Decide which allowed protocol ``data`` (the connection's first bytes so far) speaks.

    Pure and total: never raises, and never answers :class:`NeedMore` once ``data`` holds
    :data:`MAX_SNIFF_BYTES_NEEDED` bytes. ``Unknown.reason`` is ``unknown_protocol``; its ``detail``
    is the length and the hex of the first bytes.
    """
    if not isinstance(allowed, (frozenset, set)):
        allowed = frozenset(allowed)
    need_more = False
    for protocol, detect in _BY_FIRST_BYTE[data[0]] if data else _ALL_CANDIDATES:
        if protocol in allowed:
            verdict = detect(data)
            if isinstance(verdict, Detected):
                return verdict
            if isinstance(verdict, NeedMore):
                need_more = True
    if need_more and len(data) < MAX_SNIFF_BYTES_NEEDED:
        return _NEED_MORE
    return Unknown("unknown_protocol", f"{len(data)} bytes: {data[:_DETAIL_BYTES].hex(' ')}")
