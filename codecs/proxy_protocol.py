"""
mqproxy.codecs.proxy_protocol
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

HAProxy PROXY protocol, version 1 (text) and version 2 (binary), per haproxy's
``doc/proxy-protocol.txt`` (cited below as §2.1 for v1 and §2.2 for v2).

Sans-IO: :func:`parse_proxy_header` looks at the bytes received so far and answers with a
:class:`ProxyHeader`, ``None`` (a strict prefix of a header: read more) or raises
:class:`ProxyProtocolError` (not a valid header: close the connection, nothing is sent back).
:func:`encode_v1` and :func:`encode_v2` build headers (tests, benchmarks, relays).

Parsing uses ``struct``/slicing rather than construct: the input is a few dozen bytes read before
the length is known, so every field is bounds-checked by hand before it is read.
"""

from __future__ import annotations

import ipaddress
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "MAX_V1_HEADER",
    "MAX_V2_HEADER",
    "PP2_TYPE_ALPN",
    "PP2_TYPE_AUTHORITY",
    "PP2_TYPE_CRC32C",
    "PP2_TYPE_NOOP",
    "PP2_TYPE_SSL",
    "PP2_TYPE_UNIQUE_ID",
    "V1_PREFIX",
    "V2_SIGNATURE",
    "ProxyHeader",
    "ProxyProtocolError",
    "crc32c",
    "encode_v1",
    "encode_v2",
    "parse_proxy_header",
]

#: A v1 header starts with ``"PROXY"`` and exactly one space (§2.1).
V1_PREFIX = b"PROXY "
#: The 12-byte v2 signature (§2.2); note the NUL at the fifth position.
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"

#: Longest v1 line the receiver must accept, CRLF included (§2.1, "worst case").
MAX_V1_HEADER = 107
#: Fixed part of a v2 header: signature, version/command, family/transport, length (§2.2).
V2_FIXED_HEADER = 16
#: Largest v2 header accepted. The wire length field allows 16 + 65535 bytes, but §2 sizes headers to
#: fit one 536-byte segment; 2 KiB holds the largest address block (UNIX, 216 bytes) plus every TLV a
#: real sender emits (ALPN, authority, unique id <= 128 bytes, SSL sub-TLVs, cloud endpoint ids) while
#: bounding what an untrusted peer makes us buffer.
MAX_V2_HEADER = 2048

# TLV types (§2.2); values are returned raw in ProxyHeader.tlvs.
PP2_TYPE_ALPN = 0x01
PP2_TYPE_AUTHORITY = 0x02
PP2_TYPE_CRC32C = 0x03
PP2_TYPE_NOOP = 0x04
PP2_TYPE_UNIQUE_ID = 0x05
PP2_TYPE_SSL = 0x20

_BAD_HEADER = "bad_proxy_header"

_CMD_LOCAL = 0x0
_CMD_PROXY = 0x1

# Family/transport byte → (name, address block length) for the combinations §2.2 lists.
_V2_FAMILIES: Mapping[int, tuple[str, int]] = {
    0x00: ("UNKNOWN", 0),
    0x11: ("TCP4", 12),
    0x12: ("UDP4", 12),
    0x21: ("TCP6", 36),
    0x22: ("UDP6", 36),
    0x31: ("UNIX", 216),
    0x32: ("UNIX_DGRAM", 216),
}
_V2_FAMILY_BYTES = {name: fam for fam, (name, _) in _V2_FAMILIES.items()}
_UNIX_PATH_BYTES = 108

_V1_FAMILIES = {b"TCP4": 4, b"TCP6": 6}
_V1_UNKNOWN = b"UNKNOWN"
_V1_NOT_TEXT = re.compile(rb"[^\x20-\x7e]")
_V1_PORT = re.compile(rb"0|[1-9][0-9]{0,4}")


class ProxyProtocolError(Exception):
    """The bytes are not a valid PROXY protocol header; the connection must be closed.

    Nothing is sent back (§2.1: "abort the connection"). ``reason`` is machine-readable
    (``bad_proxy_header``), ``str(exc)`` is the human-readable detail.
    """

    def __init__(self, detail: str, reason: str = _BAD_HEADER) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """One parsed PROXY protocol header.

    ``command`` is ``"PROXY"`` or ``"LOCAL"`` (v1 headers are always ``"PROXY"``). ``family`` is one of
    ``TCP4``, ``TCP6``, ``UDP4``, ``UDP6``, ``UNIX``, ``UNIX_DGRAM`` or ``UNKNOWN``. ``source`` and
    ``destination`` are ``(address, port)``; they are ``None`` whenever the receiver must use the real
    connection endpoints: v1 ``UNKNOWN``, v2 ``LOCAL``, and v2 families it cannot interpret. For UNIX
    families the address is the socket path and the port is 0. ``consumed`` is the header's length in
    bytes: the caller drops that many bytes and keeps the rest. ``tlvs`` maps v2 TLV type to raw value
    (first occurrence of each type; NOOP padding omitted).
    """

    version: int
    command: str
    family: str
    source: tuple[str, int] | None
    destination: tuple[str, int] | None
    consumed: int
    tlvs: Mapping[int, bytes] = field(default_factory=dict, hash=False)


def parse_proxy_header(data: bytes) -> ProxyHeader | None:
    """Parse the PROXY header at the start of ``data``.

    Returns ``None`` while ``data`` is a valid strict prefix of a header (read more, then call again
    with the longer buffer); raises :class:`ProxyProtocolError` as soon as the bytes cannot be a valid
    header. Never needs more than :data:`MAX_V1_HEADER` / :data:`MAX_V2_HEADER` bytes.
    """
    if not data:
        return None
    first = data[0]
    if first == V2_SIGNATURE[0]:
        return _parse_v2(data)
    if first == V1_PREFIX[0]:
        return _parse_v1(data)
    raise ProxyProtocolError(f"not a PROXY protocol header (first byte 0x{first:02x})")


# -- version 1 (§2.1) ---------------------------------------------------------------------------------


def _parse_v1(data: bytes) -> ProxyHeader | None:
    window = data[:MAX_V1_HEADER]
    if not window.startswith(V1_PREFIX):
        if V1_PREFIX.startswith(window):
            return None
        raise ProxyProtocolError("v1 header must start with 'PROXY '")
    end = window.find(b"\r\n")
    if end < 0:
        # A CR may be the first half of the CRLF still to come; anything else must be text already.
        partial = window[:-1] if window.endswith(b"\r") else window
        _check_v1_text(partial)
        if len(data) >= MAX_V1_HEADER:
            raise ProxyProtocolError(f"v1 header has no CRLF within {MAX_V1_HEADER} bytes")
        return None
    line = window[:end]
    _check_v1_text(line)
    consumed = end + 2
    parts = line.split(b" ")
    proto = parts[1]
    if proto == _V1_UNKNOWN:
        # §2.1: for UNKNOWN the receiver ignores everything before the CRLF.
        return ProxyHeader(1, "PROXY", "UNKNOWN", None, None, consumed, {})
    ip_version = _V1_FAMILIES.get(proto)
    if ip_version is None:
        raise ProxyProtocolError(f"v1 unknown protocol {proto!r}")
    if len(parts) != 6:
        raise ProxyProtocolError("v1 header must have 6 fields separated by single spaces")
    _, _, src, dst, sport, dport = parts
    source = (_v1_address(src, ip_version), _v1_port(sport))
    destination = (_v1_address(dst, ip_version), _v1_port(dport))
    return ProxyHeader(1, "PROXY", proto.decode("ascii"), source, destination, consumed, {})


def _check_v1_text(line: bytes) -> None:
    bad = _V1_NOT_TEXT.search(line)
    if bad is not None:
        raise ProxyProtocolError(f"v1 header has non-text byte 0x{line[bad.start()]:02x}")


def _v1_address(raw: bytes, ip_version: int) -> str:
    text = raw.decode("ascii")  # _check_v1_text guarantees ASCII
    try:
        if ip_version == 4:
            return str(ipaddress.IPv4Address(text))  # rejects leading zeros, as §2.1 requires
        if "%" in text:
            raise ValueError("scoped address")
        return str(ipaddress.IPv6Address(text))
    except ValueError:
        raise ProxyProtocolError(f"v1 invalid TCP{ip_version} address {text!r}") from None


def _v1_port(raw: bytes) -> int:
    if _V1_PORT.fullmatch(raw) is None or int(raw) > 0xFFFF:
        raise ProxyProtocolError(f"v1 invalid port {raw.decode('ascii')!r}")
    return int(raw)


# -- version 2 (§2.2) ---------------------------------------------------------------------------------


def _parse_v2(data: bytes) -> ProxyHeader | None:
    n = len(data)
    if not V2_SIGNATURE.startswith(data[:12]):
        raise ProxyProtocolError("bad v2 signature")
    if n < 13:
        return None
    version, command = data[12] >> 4, data[12] & 0x0F
    if version != 2:
        raise ProxyProtocolError(f"unsupported v2 version {version}")
    if command not in (_CMD_LOCAL, _CMD_PROXY):
        raise ProxyProtocolError(f"unassigned v2 command {command}")
    if n < 14:
        return None
    fam = data[13]
    if fam >> 4 > 3 or fam & 0x0F > 2:
        raise ProxyProtocolError(f"invalid v2 family/transport byte 0x{fam:02x}")
    if n < V2_FIXED_HEADER:
        return None
    total = V2_FIXED_HEADER + ((data[14] << 8) | data[15])
    if total > MAX_V2_HEADER:
        raise ProxyProtocolError(f"v2 header of {total} bytes exceeds the {MAX_V2_HEADER}-byte limit")
    # Combinations §2.2 does not list fall back to UNSPEC: block skipped, real endpoints used.
    family, addr_len = _V2_FAMILIES.get(fam, ("UNKNOWN", 0))
    skip_block = command == _CMD_LOCAL or family == "UNKNOWN"
    if not skip_block and total - V2_FIXED_HEADER < addr_len:
        raise ProxyProtocolError(f"v2 length {total - V2_FIXED_HEADER} too short for {family} addresses")
    if n < total:
        return None
    if skip_block:
        # §2.2: LOCAL (and UNSPEC) — discard the whole block and use the real endpoints.
        return ProxyHeader(2, "LOCAL" if command == _CMD_LOCAL else "PROXY", family, None, None, total, {})
    header = bytes(data[:total])
    source, destination = _v2_addresses(header, addr_len)
    tlvs = _v2_tlvs(header, V2_FIXED_HEADER + addr_len)
    return ProxyHeader(2, "PROXY", family, source, destination, total, tlvs)


def _v2_addresses(header: bytes, addr_len: int) -> tuple[tuple[str, int], tuple[str, int]]:
    at = V2_FIXED_HEADER
    if addr_len == 12:
        src, dst, sport, dport = struct.unpack_from(">4s4sHH", header, at)
        return (str(ipaddress.IPv4Address(src)), sport), (str(ipaddress.IPv4Address(dst)), dport)
    if addr_len == 36:
        src, dst, sport, dport = struct.unpack_from(">16s16sHH", header, at)
        return (str(ipaddress.IPv6Address(src)), sport), (str(ipaddress.IPv6Address(dst)), dport)
    src_path = header[at : at + _UNIX_PATH_BYTES]
    dst_path = header[at + _UNIX_PATH_BYTES : at + 2 * _UNIX_PATH_BYTES]
    return (_unix_path(src_path), 0), (_unix_path(dst_path), 0)


def _unix_path(raw: bytes) -> str:
    return raw.split(b"\x00", 1)[0].decode("utf-8", "backslashreplace")


def _v2_tlvs(header: bytes, at: int) -> dict[int, bytes]:
    tlvs: dict[int, bytes] = {}
    crc_at = -1
    end = len(header)
    while at < end:
        if end - at < 3:
            raise ProxyProtocolError(f"v2 truncated TLV at offset {at}")
        kind = header[at]
        value_at = at + 3
        value_end = value_at + ((header[at + 1] << 8) | header[at + 2])
        if value_end > end:
            raise ProxyProtocolError(f"v2 TLV 0x{kind:02x} at offset {at} overruns the header")
        if kind != PP2_TYPE_NOOP and kind not in tlvs:
            tlvs[kind] = header[value_at:value_end]
            if kind == PP2_TYPE_CRC32C:
                crc_at = value_at
        at = value_end
    if crc_at >= 0:
        _check_crc32c(header, crc_at, tlvs[PP2_TYPE_CRC32C])
    return tlvs


def _check_crc32c(header: bytes, value_at: int, value: bytes) -> None:
    """§2.2.3: recompute the CRC32c of the header with the checksum field zeroed."""
    if len(value) != 4:
        raise ProxyProtocolError(f"v2 CRC32C TLV must be 4 bytes, got {len(value)}")
    zeroed = header[:value_at] + b"\x00\x00\x00\x00" + header[value_at + 4 :]
    if crc32c(zeroed) != int.from_bytes(value, "big"):
        raise ProxyProtocolError("v2 CRC32C checksum mismatch")


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli, RFC 4960 appendix B), as PP2_TYPE_CRC32C uses."""
    crc = 0xFFFFFFFF
    table = _CRC32C_TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


# -- encoders -------------------------------------------------------------------------------------------


def encode_v1(source: tuple[str, int] | None, destination: tuple[str, int] | None) -> bytes:
    """Build a v1 line; ``None`` endpoints give the short ``PROXY UNKNOWN\\r\\n`` form.

    Raises ``ValueError`` for mismatched families, invalid addresses or ports (caller bugs).
    """
    if source is None or destination is None:
        if source is not None or destination is not None:
            raise ValueError("give both endpoints or neither")
        return b"PROXY UNKNOWN\r\n"
    src, dst = ipaddress.ip_address(source[0]), ipaddress.ip_address(destination[0])
    if src.version != dst.version:
        raise ValueError("source and destination must be the same IP version")
    ports = (_checked_port(source[1]), _checked_port(destination[1]))
    return f"PROXY TCP{src.version} {src} {dst} {ports[0]} {ports[1]}\r\n".encode("ascii")


def encode_v2(
    source: tuple[str, int] | None = None,
    destination: tuple[str, int] | None = None,
    *,
    command: str = "PROXY",
    family: str | None = None,
    tlvs: Mapping[int, bytes] | Iterable[tuple[int, bytes]] = (),
    checksum: bool = False,
) -> bytes:
    """Build a v2 header.

    ``family`` defaults to ``TCP4``/``TCP6`` from the source address, or ``UNKNOWN`` (no address block)
    without endpoints. UNIX families take socket paths as addresses (ports ignored). ``tlvs`` are
    appended in order; ``checksum=True`` appends a PP2_TYPE_CRC32C TLV over the whole header.
    Raises ``ValueError`` on invalid arguments (caller bugs); the size is not limited to
    :data:`MAX_V2_HEADER`, so tests can build oversized headers.
    """
    if command not in ("PROXY", "LOCAL"):
        raise ValueError(f"command must be PROXY or LOCAL, not {command!r}")
    if family is None:
        family = "UNKNOWN" if source is None else f"TCP{ipaddress.ip_address(source[0]).version}"
    fam = _V2_FAMILY_BYTES.get(family)
    if fam is None:
        raise ValueError(f"unknown family {family!r}")
    block = b""
    if family != "UNKNOWN":
        if source is None or destination is None:
            raise ValueError(f"family {family} needs both endpoints")
        block = _v2_address_block(fam >> 4, source, destination)
    items = list(tlvs.items()) if isinstance(tlvs, Mapping) else list(tlvs)
    for kind, value in items:
        if not 0 <= kind <= 0xFF or len(value) > 0xFFFF:
            raise ValueError(f"invalid TLV type {kind} or value length {len(value)}")
        block += struct.pack(">BH", kind, len(value)) + value
    crc_at = -1
    if checksum:
        crc_at = V2_FIXED_HEADER + len(block) + 3
        block += struct.pack(">BH", PP2_TYPE_CRC32C, 4) + b"\x00\x00\x00\x00"
    if len(block) > 0xFFFF:
        raise ValueError(f"v2 block of {len(block)} bytes exceeds 65535")
    ver_cmd = 0x20 | (_CMD_PROXY if command == "PROXY" else _CMD_LOCAL)
    header = V2_SIGNATURE + struct.pack(">BBH", ver_cmd, fam, len(block)) + block
    if crc_at >= 0:
        header = header[:crc_at] + crc32c(header).to_bytes(4, "big")
    return header


def _v2_address_block(af: int, source: tuple[str, int], destination: tuple[str, int]) -> bytes:
    if af == 3:
        paths = [_unix_path_bytes(source[0]), _unix_path_bytes(destination[0])]
        return b"".join(p.ljust(_UNIX_PATH_BYTES, b"\x00") for p in paths)
    cls = ipaddress.IPv4Address if af == 1 else ipaddress.IPv6Address
    src, dst = cls(source[0]), cls(destination[0])
    ports = (_checked_port(source[1]), _checked_port(destination[1]))
    return src.packed + dst.packed + struct.pack(">HH", *ports)


def _unix_path_bytes(path: str) -> bytes:
    raw = path.encode("utf-8")
    if len(raw) > _UNIX_PATH_BYTES:
        raise ValueError(f"UNIX path longer than {_UNIX_PATH_BYTES} bytes")
    return raw


def _checked_port(port: int) -> int:
    if not 0 <= port <= 0xFFFF:
        raise ValueError(f"port {port} out of range")
    return port
