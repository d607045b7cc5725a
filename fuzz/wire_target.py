"""
mqproxy.fuzz.wire_target
~~~~~~~~~~~~~~~~~~~~~~~~

Fuzz targets for what reads a connection's very first bytes: the PROXY protocol v1/v2 parser and the
protocol sniffer.

Documented behaviour: :func:`~mqproxy.codecs.proxy_protocol.parse_proxy_header` returns a header whose
``consumed`` lies within the input, ``None``, or raises
:class:`~mqproxy.codecs.proxy_protocol.ProxyProtocolError`;
:func:`~mqproxy.negotiation.sniff.sniff` never raises and never answers ``NeedMore`` once it holds
:data:`~mqproxy.negotiation.sniff.MAX_SNIFF_BYTES_NEEDED` bytes. A broken contract raises
:class:`ContractError` (a finding).
"""

from __future__ import annotations

from mqproxy.codecs import mqtt as mq
from mqproxy.codecs.proxy_protocol import (
    PP2_TYPE_ALPN,
    PP2_TYPE_AUTHORITY,
    PP2_TYPE_NOOP,
    PP2_TYPE_SSL,
    PP2_TYPE_UNIQUE_ID,
    V2_SIGNATURE,
    ProxyProtocolError,
    encode_v1,
    encode_v2,
    parse_proxy_header,
)
from mqproxy.codecs.remoting import SERIALIZE_ROCKETMQ, RemotingCommand, encode_command
from mqproxy.fuzz.mutator import Field, Seed
from mqproxy.negotiation.sniff import MAX_SNIFF_BYTES_NEEDED, Detected, NeedMore, Protocol, Unknown, sniff

__all__ = ["PROXY_ERRORS", "SNIFF_ERRORS", "ContractError", "proxy_run", "proxy_seeds", "sniff_run",
           "sniff_seeds"]

PROXY_ERRORS: tuple[type[BaseException], ...] = (ProxyProtocolError,)
SNIFF_ERRORS: tuple[type[BaseException], ...] = ()

_PROTOCOLS = tuple(Protocol)


class ContractError(AssertionError):
    """A result outside the documented ones (a finding)."""


def proxy_run(data: bytes, split: int) -> None:
    """Parse the grown prefix ``data[:split]`` (a ``None`` is expected there), then the whole input."""
    for view in (data[:split], data) if split else (data,):
        header = parse_proxy_header(view)
        if header is not None and not 0 < header.consumed <= len(view):
            raise ContractError(f"consumed {header.consumed} of {len(view)} bytes")


def sniff_run(data: bytes, split: int) -> None:
    """Sniff ``data`` with the protocols picked by the low six bits of ``split`` allowed (0: all)."""
    mask = split & 0x3F
    allowed = [p for i, p in enumerate(_PROTOCOLS) if mask >> i & 1] if mask else _PROTOCOLS
    verdict = sniff(data, allowed)
    if isinstance(verdict, NeedMore):
        if len(data) >= MAX_SNIFF_BYTES_NEEDED:
            raise ContractError(f"NeedMore at {len(data)} bytes")
    elif isinstance(verdict, Detected):
        if verdict.protocol not in allowed:
            raise ContractError(f"{verdict.protocol} detected but not allowed")
    elif not isinstance(verdict, Unknown):
        raise ContractError(f"verdict {verdict!r}")


# --- seeds ---------------------------------------------------------------------------------------


def _v2_fields(header: bytes) -> tuple[Field, ...]:
    """The v2 length and every TLV length (the SSL TLV's sub-TLVs too)."""
    fields = [Field(14, 2)]
    family_len = {0x11: 12, 0x12: 12, 0x21: 36, 0x22: 36, 0x31: 216, 0x32: 216}.get(header[13], 0)
    at = 16 + family_len
    while at + 3 <= len(header):
        fields.append(Field(at + 1, 2))
        size = int.from_bytes(header[at + 1 : at + 3], "big")
        if header[at] == PP2_TYPE_SSL:
            sub = at + 3 + 5
            while sub + 3 <= at + 3 + size:
                fields.append(Field(sub + 1, 2))
                sub += 3 + int.from_bytes(header[sub + 1 : sub + 3], "big")
        at += 3 + size
    return tuple(fields)


def proxy_seeds() -> list[Seed]:
    src4, dst4 = ("192.0.2.1", 56324), ("198.51.100.7", 9876)
    src6, dst6 = ("2001:db8::1", 1), ("2001:db8::2", 65535)
    ssl = b"\x05" + b"\x00\x00\x00\x00" + b"\x21\x00\x07TLSv1.3" + b"\x22\x00\x03CN1"
    tlvs = [(PP2_TYPE_ALPN, b"h2"), (PP2_TYPE_AUTHORITY, b"example.com"), (PP2_TYPE_UNIQUE_ID, b"u" * 16),
            (PP2_TYPE_SSL, ssl), (PP2_TYPE_NOOP, b"\x00\x00")]
    v1 = [encode_v1(src4, dst4), encode_v1(src6, dst6), encode_v1(None, None)]
    v2 = [
        encode_v2(src4, dst4), encode_v2(src6, dst6, tlvs=tlvs, checksum=True),
        encode_v2(("/tmp/a.sock", 0), ("/tmp/b.sock", 0), family="UNIX"), encode_v2(command="LOCAL"),
        encode_v2(src4, dst4, family="UDP4", tlvs=tlvs[:2]), encode_v2(),
    ]
    out = [Seed(raw + b"tail") for raw in v1]
    out += [Seed(raw + b"\x10\x00", _v2_fields(raw)) for raw in v2]
    return out


def sniff_seeds() -> list[Seed]:
    remoting = encode_command(RemotingCommand(34, opaque=1, ext_fields={"a": "b"}))
    binary = encode_command(
        RemotingCommand(11, opaque=2, ext_fields={"a": "b"}, serialize_type=SERIALIZE_ROCKETMQ)
    )
    connects = [mq.encode(mq.Connect("c", level, username="u"), level) for level in (3, 4, 5)]
    hello = (b"\x16\x03\x01\x00\x40" + b"\x01\x00\x00\x3c\x03\x03" + bytes(32)
             + b"\x00\x00\x02\x13\x01\x01\x00")
    prefixes = [
        remoting, binary, *connects, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
        hello, b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n", b"POST /metrics HTTP/1.0\r\n\r\n",
        encode_v1(("192.0.2.1", 1), ("192.0.2.2", 2)) + connects[1],
        encode_v2(("192.0.2.1", 1), ("192.0.2.2", 2)) + remoting,
    ]
    fields = {0: (Field(0, 4), Field(5, 3)), 1: (Field(0, 4), Field(5, 3))}
    out = [Seed(raw[:80], fields.get(i, (Field(1, 1),))) for i, raw in enumerate(prefixes)]
    out.append(Seed(V2_SIGNATURE))
    return out
