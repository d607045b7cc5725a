"""
mqproxy.codecs.remoting
~~~~~~~~~~~~~~~~~~~~~~~

Sans-IO codec for RocketMQ 4.x "remoting" frames.

A frame is ``i32 length`` (not counting itself) + ``i32 (serializeType << 24 | headerLen)`` + header +
body. The header is JSON (serialize type 0) or the ROCKETMQ binary layout (type 1). Feed received bytes
to :class:`FrameDecoder` and get :class:`RemotingCommand` objects back; turn commands into bytes with
:func:`encode_command`. Every malformed input raises :class:`RemotingCodecError`, and nothing else; the
I/O layer then closes the connection (a Java peer sends nothing before closing either).

Decoded ``ext_fields`` always map ``str`` to ``str``: JSON numbers become ``str(int)``, booleans
``"true"``/``"false"``, ``null`` values are dropped, nested JSON is kept as its compact JSON text.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import orjson

from mqproxy.codecs.remoting_codes import LanguageCode

__all__ = [
    "CURRENT_VERSION",
    "DEFAULT_MAX_FRAME_BYTES",
    "FLAG_ONEWAY",
    "FLAG_RESPONSE",
    "SERIALIZE_JSON",
    "SERIALIZE_ROCKETMQ",
    "FrameDecoder",
    "RemotingCodecError",
    "RemotingCommand",
    "decode_frame",
    "encode_command",
    "normalise_ext_fields",
]

SERIALIZE_JSON = 0
SERIALIZE_ROCKETMQ = 1

FLAG_RESPONSE = 1
FLAG_ONEWAY = 2

#: MQVersion ordinal of V5_3_3, what current Java brokers put in every response.
CURRENT_VERSION = 479

#: Java peers refuse frames whose total size (length prefix included) exceeds 16 MiB.
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024

#: The header length travels in the low 24 bits of the second word.
MAX_HEADER_BYTES = 0xFFFFFF

_I32 = struct.Struct(">i")
_PREFIX = struct.Struct(">ii")
#: ROCKETMQ binary header, fixed part: code i16, language u8, version i16, opaque i32, flag i32.
_BIN_FIXED = struct.Struct(">hBhii")
_I16 = struct.Struct(">h")

_I32_MIN = -(2**31)
_I32_MAX = 2**31 - 1
_I16_MIN = -(2**15)
_I16_MAX = 2**15 - 1

_LANGUAGE_BY_NAME: dict[str, str] = {m.name: m.name for m in LanguageCode}
_LANGUAGE_BY_ORDINAL: dict[int, str] = {m.value: m.name for m in LanguageCode}
_ORDINAL_BY_LANGUAGE: dict[str, int] = {m.name: m.value for m in LanguageCode}
_OTHER_ORDINAL = LanguageCode.OTHER.value
_SERIALIZE_NAMES = {SERIALIZE_JSON: "JSON", SERIALIZE_ROCKETMQ: "ROCKETMQ"}


class RemotingCodecError(Exception):
    """The one error of the remoting codec layer.

    ``reason`` is a stable machine-readable token (for logs and metrics): ``bad_frame_length``,
    ``frame_too_large``, ``bad_header_length``, ``bad_serialize_type``, ``bad_json_header``,
    ``bad_binary_header``, ``bad_command`` (encode side); :class:`~mqproxy.codecs.message_record.RecordError`
    adds record/batch reasons. Nothing needs to be sent before closing the connection.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(slots=True)
class RemotingCommand:
    """One remoting request or response.

    ``code`` is a request code for requests and a response code for responses (see
    :mod:`mqproxy.codecs.remoting_codes`). ``serialize_type`` is the header format the command arrived
    in, or is to be sent in.
    """

    code: int
    opaque: int = 0
    flag: int = 0
    language: str = "JAVA"
    version: int = CURRENT_VERSION
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    serialize_type: int = SERIALIZE_JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    @classmethod
    def response_to(
        cls,
        request: RemotingCommand,
        code: int,
        remark: str | None = None,
        ext_fields: dict[str, str] | None = None,
        body: bytes = b"",
    ) -> RemotingCommand:
        """A response to ``request``: same opaque, response flag, same header serialize type."""
        return cls(
            code=code,
            opaque=request.opaque,
            flag=FLAG_RESPONSE,
            remark=remark,
            ext_fields={} if ext_fields is None else ext_fields,
            body=body,
            serialize_type=request.serialize_type,
        )


class FrameDecoder:
    """Incremental frame decoder: ``receive_data(bytes) -> list[RemotingCommand]``.

    The length prefix is checked as soon as its 4 bytes are in, before any body is waited for, so a
    hostile 2 GiB prefix fails at once. ``max_frame_bytes`` counts the whole frame including the
    4-byte prefix (Netty's ``LengthFieldBasedFrameDecoder`` rule). After an error the decoder is dead:
    every later call raises the same reason.
    """

    __slots__ = ("_buffer", "_failed", "_max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes < 8:
            raise ValueError("max_frame_bytes must be at least 8")
        self._buffer = bytearray()
        self._max_frame_bytes = max_frame_bytes
        self._failed: RemotingCodecError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a command."""
        return len(self._buffer)

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[RemotingCommand]:
        """Add ``data`` and return every command it completes (possibly none).

        Raises :class:`RemotingCodecError` at the first malformed frame; commands decoded before it in
        the same call are dropped with it (the connection is closing anyway).
        """
        if self._failed is not None:
            raise RemotingCodecError(self._failed.reason, "decoder already failed")
        # Common case: nothing buffered, so parse ``data`` in place and keep only its incomplete tail.
        source: bytes | bytearray | memoryview
        if self._buffer:
            self._buffer += data
            source = self._buffer
        else:
            source = data
        try:
            commands, consumed = self._parse(source)
        except RemotingCodecError as exc:
            self._failed = exc
            self._buffer = bytearray()
            raise
        if source is self._buffer:
            del self._buffer[:consumed]
        elif consumed < len(data):
            self._buffer = bytearray(data[consumed:])
        return commands

    def _parse(self, source: bytes | bytearray | memoryview) -> tuple[list[RemotingCommand], int]:
        commands: list[RemotingCommand] = []
        pos = 0
        end = len(source)
        with memoryview(source) as view:
            while end - pos >= 4:
                (length,) = _I32.unpack_from(view, pos)
                _check_length(length, self._max_frame_bytes)
                stop = pos + 4 + length
                if stop > end:
                    break
                commands.append(decode_frame(view[pos + 4 : stop]))
                pos = stop
        return commands, pos


def _check_length(length: int, max_frame_bytes: int) -> None:
    if length < 4:
        raise RemotingCodecError("bad_frame_length", f"length prefix {length} < 4")
    if length + 4 > max_frame_bytes:
        raise RemotingCodecError("frame_too_large", f"frame of {length + 4} bytes > limit {max_frame_bytes}")


def decode_frame(frame: bytes | bytearray | memoryview) -> RemotingCommand:
    """Decode one complete frame given WITHOUT its 4-byte length prefix; the rest is the body."""
    size = len(frame)
    if size < 4:
        raise RemotingCodecError("bad_frame_length", f"frame of {size} bytes has no header length")
    (word,) = _I32.unpack_from(frame, 0)
    serialize_type = (word >> 24) & 0xFF
    header_len = word & 0xFFFFFF
    if header_len > size - 4:
        raise RemotingCodecError("bad_header_length", f"header length {header_len} > {size - 4} bytes left")
    header = frame[4 : 4 + header_len]
    body = bytes(frame[4 + header_len :])
    if serialize_type == SERIALIZE_JSON:
        return _decode_json_header(header, body)
    if serialize_type == SERIALIZE_ROCKETMQ:
        return _decode_binary_header(header, body)
    raise RemotingCodecError("bad_serialize_type", f"serialize type {serialize_type}")


# --- JSON header -------------------------------------------------------------------------------------


def _json_int(obj: dict[str, Any], key: str, default: int | None, lo: int, hi: int) -> int:
    value = obj.get(key)
    if value is None:
        if default is None:
            raise RemotingCodecError("bad_json_header", f"missing {key!r}")
        return default
    if type(value) is int:
        number = value
    elif type(value) is str:  # fastjson coerces numeric strings into int fields
        try:
            number = int(value.strip(), 10)
        except ValueError:
            raise RemotingCodecError("bad_json_header", f"{key!r} is not an integer") from None
    else:
        raise RemotingCodecError("bad_json_header", f"{key!r} is not an integer")
    if not lo <= number <= hi:
        raise RemotingCodecError("bad_json_header", f"{key!r} out of range")
    return number


def _json_language(value: object) -> str:
    if value is None:
        return "JAVA"
    if type(value) is str:
        return _LANGUAGE_BY_NAME.get(value, "OTHER")
    if type(value) is int:
        return _LANGUAGE_BY_ORDINAL.get(value, "OTHER")
    return "OTHER"


def _scalar_text(value: object) -> str | None:
    """The string form of one JSON value as a Java peer would read it into a ``String`` field."""
    kind = type(value)
    if kind is str:
        return value  # type: ignore[return-value]
    if value is None:
        return None
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return str(value)
    if kind is float:
        number: float = value  # type: ignore[assignment]
        return str(int(number)) if number.is_integer() else repr(number)
    return orjson.dumps(value).decode()


def normalise_ext_fields(raw: Mapping[str, object]) -> dict[str, str]:
    """``raw`` with every value as a string and ``None`` values dropped (the wire rule for extFields)."""
    for value in raw.values():
        if type(value) is not str:
            break
    else:  # all strings already (Java, Go): no copy needed for a fresh dict
        return cast("dict[str, str]", raw if type(raw) is dict else dict(raw))
    return {key: cast(str, _scalar_text(value)) for key, value in raw.items() if value is not None}


def _decode_json_header(header: bytes | bytearray | memoryview, body: bytes) -> RemotingCommand:
    try:
        obj = orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        raise RemotingCodecError("bad_json_header", str(exc)) from None
    if type(obj) is not dict:
        raise RemotingCodecError("bad_json_header", "header is not a JSON object")
    raw_ext = obj.get("extFields")
    if raw_ext is None:
        ext: dict[str, str] = {}
    elif type(raw_ext) is dict:
        ext = normalise_ext_fields(raw_ext)
    else:
        raise RemotingCodecError("bad_json_header", "extFields is not an object")
    remark = obj.get("remark")
    if remark is not None and type(remark) is not str:
        if type(remark) in (dict, list):
            raise RemotingCodecError("bad_json_header", "remark is not a string")
        remark = _scalar_text(remark)
    return RemotingCommand(
        code=_json_int(obj, "code", None, _I32_MIN, _I32_MAX),
        opaque=_json_int(obj, "opaque", 0, _I32_MIN, _I32_MAX),
        flag=_json_int(obj, "flag", 0, _I32_MIN, _I32_MAX),
        language=_json_language(obj.get("language")),
        version=_json_int(obj, "version", 0, _I32_MIN, _I32_MAX),
        remark=remark,
        ext_fields=ext,
        body=body,
        serialize_type=SERIALIZE_JSON,
    )


# --- ROCKETMQ binary header --------------------------------------------------------------------------


def _decode_binary_header(header: bytes | bytearray | memoryview, body: bytes) -> RemotingCommand:
    header = bytes(header)
    size = len(header)
    if size < _BIN_FIXED.size + 8:
        raise RemotingCodecError("bad_binary_header", f"binary header of {size} bytes is too short")
    code, language, version, opaque, flag = _BIN_FIXED.unpack_from(header, 0)
    remark, pos = _prefixed_text(header, _BIN_FIXED.size, _I32, size, "remark")
    if size - pos < 4:
        raise RemotingCodecError("bad_binary_header", "extFields length missing")
    (ext_len,) = _I32.unpack_from(header, pos)
    pos += 4
    if ext_len < 0 or ext_len > size - pos:
        raise RemotingCodecError("bad_binary_header", f"extFields length {ext_len} past the header end")
    stop = pos + ext_len
    ext = _binary_ext_fields(header, pos, stop)
    return RemotingCommand(
        code=code,
        opaque=opaque,
        flag=flag,
        language=_LANGUAGE_BY_ORDINAL.get(language, "OTHER"),
        version=version,
        remark=remark or None,
        ext_fields=ext,
        body=body,
        serialize_type=SERIALIZE_ROCKETMQ,
    )


def _binary_ext_fields(header: bytes, pos: int, stop: int) -> dict[str, str]:
    """The key/value pairs of ``header[pos:stop]`` (i16 key length + key, i32 value length + value)."""
    ext: dict[str, str] = {}
    start = pos
    key_length, value_length = _I16.unpack_from, _I32.unpack_from
    try:
        while pos < stop:  # the hot loop of a binary header: inline, no call per field
            if stop - pos < 2:
                break
            (k,) = key_length(header, pos)
            pos += 2
            if k < 0 or k > stop - pos - 4:
                break
            key_end = pos + k
            (v,) = value_length(header, key_end)
            value_at = key_end + 4
            if v < 0 or v > stop - value_at:
                break
            ext[header[pos:key_end].decode("utf-8")] = header[value_at : value_at + v].decode("utf-8")
            pos = value_at + v
        else:
            return ext
    except UnicodeDecodeError:
        pass
    # A malformed field: walk again with the checks that name it (and raise).
    return _binary_ext_fields_checked(header, start, stop)


def _binary_ext_fields_checked(header: bytes, pos: int, stop: int) -> dict[str, str]:
    ext: dict[str, str] = {}
    while pos < stop:
        key, pos = _prefixed_text(header, pos, _I16, stop, "extFields key")
        ext[key], pos = _prefixed_text(header, pos, _I32, stop, "extFields value")
    return ext


def _prefixed_text(buf: bytes, pos: int, prefix: struct.Struct, stop: int, what: str) -> tuple[str, int]:
    """The UTF-8 text at ``pos`` after its length ``prefix``, and the position after it (before ``stop``)."""
    if stop - pos < prefix.size:
        raise RemotingCodecError("bad_binary_header", f"truncated {what} length")
    (length,) = prefix.unpack_from(buf, pos)
    pos += prefix.size
    return _binary_text(buf, pos, length, stop, what), pos + length


def _binary_text(buf: bytes, pos: int, length: int, limit: int, what: str) -> str:
    if length < 0 or length > limit - pos:
        raise RemotingCodecError("bad_binary_header", f"{what} length {length} past the header end")
    try:
        return buf[pos : pos + length].decode("utf-8")
    except UnicodeDecodeError:
        raise RemotingCodecError("bad_binary_header", f"{what} is not valid UTF-8") from None


# --- encoding ----------------------------------------------------------------------------------------


def _language_name(language: object) -> str:
    if type(language) is str:
        return language
    if isinstance(language, int):
        return _LANGUAGE_BY_ORDINAL.get(int(language), "OTHER")
    return str(language)


def _encode_json_header(cmd: RemotingCommand) -> bytes:
    header: dict[str, object] = {
        "code": cmd.code,
        "extFields": normalise_ext_fields(cmd.ext_fields),
        "flag": cmd.flag,
        "language": _language_name(cmd.language),
        "opaque": cmd.opaque,
    }
    if cmd.remark is not None:
        header["remark"] = cmd.remark
    header["serializeTypeCurrentRPC"] = "JSON"
    header["version"] = cmd.version
    return orjson.dumps(header)


def _encode_binary_header(cmd: RemotingCommand) -> bytes:
    language = _ORDINAL_BY_LANGUAGE.get(_language_name(cmd.language), _OTHER_ORDINAL)
    remark = cmd.remark.encode("utf-8") if cmd.remark else b""
    fields = bytearray()
    for key, value in normalise_ext_fields(cmd.ext_fields).items():
        key_bytes = key.encode("utf-8")
        value_bytes = value.encode("utf-8")
        if len(key_bytes) > _I16_MAX:
            raise RemotingCodecError("bad_command", "extFields key longer than 32767 bytes")
        fields += len(key_bytes).to_bytes(2, "big")
        fields += key_bytes
        fields += len(value_bytes).to_bytes(4, "big")
        fields += value_bytes
    head = _BIN_FIXED.pack(int(cmd.code), language, int(cmd.version), int(cmd.opaque), int(cmd.flag))
    return b"".join((head, _I32.pack(len(remark)), remark, _I32.pack(len(fields)), fields))


def _fits_binary(cmd: RemotingCommand) -> bool:
    return (
        _I16_MIN <= cmd.code <= _I16_MAX
        and _I16_MIN <= cmd.version <= _I16_MAX
        and _I32_MIN <= cmd.opaque <= _I32_MAX
        and _I32_MIN <= cmd.flag <= _I32_MAX
    )


def encode_command(cmd: RemotingCommand, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytes:
    """The complete frame (length prefix included) for ``cmd``.

    JSON header unless ``cmd.serialize_type`` is ROCKETMQ; a command whose ``code`` or ``version`` does
    not fit the binary header's i16 is sent with a JSON header instead (Java peers decode each frame by
    its own type byte). Non-string ``ext_fields`` values are written as strings. Raises
    :class:`RemotingCodecError` (``bad_command``, ``frame_too_large``) for a command that cannot be sent.
    """
    if not (
        isinstance(cmd.code, int)
        and isinstance(cmd.opaque, int)
        and isinstance(cmd.flag, int)
        and isinstance(cmd.version, int)
    ):
        raise RemotingCodecError("bad_command", "code, opaque, flag and version must be integers")
    try:
        if cmd.serialize_type == SERIALIZE_ROCKETMQ and _fits_binary(cmd):
            header = _encode_binary_header(cmd)
            serialize_type = SERIALIZE_ROCKETMQ
        else:
            header = _encode_json_header(cmd)
            serialize_type = SERIALIZE_JSON
        body = cmd.body
        header_len = len(header)
        if header_len > MAX_HEADER_BYTES:
            raise RemotingCodecError("bad_command", f"header of {header_len} bytes does not fit 24 bits")
        length = 4 + header_len + len(body)
        if length + 4 > max_frame_bytes:
            raise RemotingCodecError(
                "frame_too_large", f"frame of {length + 4} bytes > limit {max_frame_bytes}"
            )
        return b"".join((_PREFIX.pack(length, serialize_type << 24 | header_len), header, body))
    except (TypeError, ValueError, AttributeError, OverflowError, struct.error) as exc:
        # orjson.JSONEncodeError is a TypeError; wrong field types end up here too
        raise RemotingCodecError("bad_command", f"{type(exc).__name__}: {exc}") from None


def serialize_type_name(serialize_type: int) -> str:
    """``"JSON"`` or ``"ROCKETMQ"`` (for logs)."""
    return _SERIALIZE_NAMES.get(serialize_type, str(serialize_type))
