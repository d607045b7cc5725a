"""MQTT data representations (section 1.5): integers, Variable Byte Integers, UTF-8 strings, binary data.

`Reader` walks one complete, length-checked packet body; running past its end is a Malformed Packet (0x81).
The `encode_*` functions build the same types and refuse values the receiving side would reject.
"""

from __future__ import annotations

from mqproxy.codecs.mqtt.errors import MqttCodecError, malformed

MAX_VARINT = 268_435_455
"""Largest Variable Byte Integer (4 bytes, 7 bits each)."""

MAX_STRING_BYTES = 65_535
"""Largest UTF-8 string or binary data field: a two-byte length prefix."""


def encode_varint(value: int) -> bytes:
    """The Variable Byte Integer encoding of 0 <= value <= MAX_VARINT, in the fewest bytes."""
    if value < 128 and value >= 0:
        return bytes((value,))
    if not 0 <= value <= MAX_VARINT:
        raise malformed(f"variable byte integer {value} out of range")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def check_text(text: str) -> None:
    """Refuse a string MQTT forbids: U+0000 or a surrogate code point ([MQTT-1.5.4-1], [MQTT-1.5.4-2])."""
    if "\x00" in text:
        raise malformed("UTF-8 string contains U+0000")
    # Surrogates cannot be encoded by the strict UTF-8 codec, so encode_utf8 catches them; this path is for
    # strings that are validated without being encoded.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise malformed("UTF-8 string contains a surrogate code point") from None


def encode_utf8(text: str) -> bytes:
    """A UTF-8 Encoded String: two-byte length, then the text (no U+0000, no surrogates, <= 65535 bytes)."""
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        raise malformed("UTF-8 string contains a surrogate code point") from None
    if len(raw) > MAX_STRING_BYTES:
        raise malformed(f"UTF-8 string of {len(raw)} bytes is longer than 65535")
    if b"\x00" in raw:
        raise malformed("UTF-8 string contains U+0000")
    return len(raw).to_bytes(2, "big") + raw


def encode_binary(data: bytes) -> bytes:
    """Binary Data: two-byte length, then the bytes (<= 65535)."""
    if len(data) > MAX_STRING_BYTES:
        raise malformed(f"binary data of {len(data)} bytes is longer than 65535")
    return len(data).to_bytes(2, "big") + data


def encode_u16(value: int) -> bytes:
    """A Two Byte Integer, big-endian."""
    try:
        return value.to_bytes(2, "big")
    except OverflowError:
        raise malformed(f"two byte integer {value} out of range") from None


def encode_u32(value: int) -> bytes:
    """A Four Byte Integer, big-endian."""
    try:
        return value.to_bytes(4, "big")
    except OverflowError:
        raise malformed(f"four byte integer {value} out of range") from None


def decode_text(raw: bytes) -> str:
    """The text of a UTF-8 Encoded String's bytes; invalid UTF-8, surrogates or U+0000 are Malformed."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise malformed("invalid UTF-8 string") from None
    if "\x00" in text:
        raise malformed("UTF-8 string contains U+0000")
    return text


class Reader:
    """A cursor over one packet body that raises MqttCodecError(0x81) instead of reading past the end."""

    __slots__ = ("_data", "_end", "pos")

    def __init__(self, data: bytes, pos: int = 0, end: int | None = None) -> None:
        self._data = data
        self.pos = pos
        self._end = len(data) if end is None else end

    @property
    def remaining(self) -> int:
        """Bytes left before the end."""
        return self._end - self.pos

    def _take(self, count: int) -> int:
        start = self.pos
        if start + count > self._end:
            raise malformed("packet is shorter than its fields")
        self.pos = start + count
        return start

    def u8(self) -> int:
        """A Byte."""
        return self._data[self._take(1)]

    def u16(self) -> int:
        """A Two Byte Integer."""
        start = self._take(2)
        return int.from_bytes(self._data[start : start + 2], "big")

    def u32(self) -> int:
        """A Four Byte Integer."""
        start = self._take(4)
        return int.from_bytes(self._data[start : start + 4], "big")

    def varint(self) -> int:
        """A Variable Byte Integer of at most four bytes, minimally encoded."""
        value = 0
        for shift in (0, 7, 14, 21):
            byte = self.u8()
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                if byte == 0 and shift:
                    raise malformed("variable byte integer is not minimally encoded")
                return value
        raise malformed("variable byte integer longer than 4 bytes")

    def binary(self) -> bytes:
        """Binary Data: a two-byte length and that many bytes."""
        length = self.u16()
        start = self._take(length)
        return self._data[start : start + length]

    def utf8(self) -> str:
        """A UTF-8 Encoded String."""
        return decode_text(self.binary())

    def rest(self) -> bytes:
        """Every byte left; the reader is then at its end."""
        start, self.pos = self.pos, self._end
        return self._data[start : self._end]

    def sub(self, length: int) -> Reader:
        """A reader over the next `length` bytes, which this reader skips."""
        start = self._take(length)
        return Reader(self._data, start, start + length)


__all__ = [
    "MAX_STRING_BYTES",
    "MAX_VARINT",
    "MqttCodecError",
    "Reader",
    "check_text",
    "decode_text",
    "encode_binary",
    "encode_u16",
    "encode_u32",
    "encode_utf8",
    "encode_varint",
]
