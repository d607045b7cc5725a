"""Tests for mqproxy.codecs.proxy_protocol: golden headers, split feeding, strict rejection, fuzzing."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqproxy.codecs.proxy_protocol import (
    MAX_V1_HEADER,
    MAX_V2_HEADER,
    PP2_TYPE_ALPN,
    PP2_TYPE_AUTHORITY,
    PP2_TYPE_CRC32C,
    PP2_TYPE_NOOP,
    V2_SIGNATURE,
    ProxyHeader,
    ProxyProtocolError,
    crc32c,
    encode_v1,
    encode_v2,
    parse_proxy_header,
)

PAYLOAD = b"GET / HTTP/1.1\r\n\r\n"
SIG = V2_SIGNATURE.hex()

# (id, header bytes, expected header) — each is parsed with PAYLOAD appended.
GOLDEN: list[tuple[str, bytes, ProxyHeader]] = [
    (
        "v1-tcp4-spec-example",
        b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n",
        ProxyHeader(1, "PROXY", "TCP4", ("192.168.0.1", 56324), ("192.168.0.11", 443), 47, {}),
    ),
    (
        "v1-tcp4-max",
        b"PROXY TCP4 255.255.255.255 255.255.255.255 65535 65535\r\n",
        ProxyHeader(1, "PROXY", "TCP4", ("255.255.255.255", 65535), ("255.255.255.255", 65535), 56, {}),
    ),
    (
        "v1-tcp6",
        b"PROXY TCP6 2001:DB8::1 ::ffff:192.0.2.1 0 9876\r\n",
        ProxyHeader(1, "PROXY", "TCP6", ("2001:db8::1", 0), ("::ffff:c000:201", 9876), 48, {}),
    ),
    (
        "v1-unknown-short",
        b"PROXY UNKNOWN\r\n",
        ProxyHeader(1, "PROXY", "UNKNOWN", None, None, 15, {}),
    ),
    (
        "v1-unknown-worst-case-107",
        b"PROXY UNKNOWN " + b":".join([b"ffff"] * 8) + b" " + b":".join([b"ffff"] * 8) + b" 65535 65535\r\n",
        ProxyHeader(1, "PROXY", "UNKNOWN", None, None, 107, {}),
    ),
    (
        "v2-tcp4",
        bytes.fromhex(SIG + "21 11 000c c0000207 c6336401 9c40 2694"),
        ProxyHeader(2, "PROXY", "TCP4", ("192.0.2.7", 40000), ("198.51.100.1", 9876), 28, {}),
    ),
    (
        "v2-udp6",
        bytes.fromhex(
            SIG + "21 22 0024 20010db8000000000000000000000001 20010db8000000000000000000000002 0035 1f90"
        ),
        ProxyHeader(2, "PROXY", "UDP6", ("2001:db8::1", 53), ("2001:db8::2", 8080), 52, {}),
    ),
    (
        "v2-tcp4-tlvs",
        bytes.fromhex(
            SIG + "21 11 0024 0a000001 0a000002 3039 01bb"
            "01 0002 6832"  # ALPN "h2"
            "04 0003 000000"  # NOOP padding (dropped)
            "02 000a 6d712e6578616d706c65"  # AUTHORITY "mq.example"
        ),
        ProxyHeader(
            2,
            "PROXY",
            "TCP4",
            ("10.0.0.1", 12345),
            ("10.0.0.2", 443),
            52,
            {PP2_TYPE_ALPN: b"h2", PP2_TYPE_AUTHORITY: b"mq.example"},
        ),
    ),
    (
        "v2-unix",
        bytes.fromhex(SIG + "21 31 00d8")
        + b"/run/lb.sock".ljust(108, b"\x00")
        + b"/run/mqproxy.sock".ljust(108, b"\x00"),
        ProxyHeader(2, "PROXY", "UNIX", ("/run/lb.sock", 0), ("/run/mqproxy.sock", 0), 232, {}),
    ),
    (
        "v2-local-health-check",
        bytes.fromhex(SIG + "20 00 0000"),
        ProxyHeader(2, "LOCAL", "UNKNOWN", None, None, 16, {}),
    ),
    (
        "v2-local-with-ignored-addresses",
        bytes.fromhex(SIG + "20 11 000c 7f000001 7f000001 d431 2694"),
        ProxyHeader(2, "LOCAL", "TCP4", None, None, 28, {}),
    ),
    (
        "v2-proxy-unspec",
        bytes.fromhex(SIG + "21 00 0004 deadbeef"),
        ProxyHeader(2, "PROXY", "UNKNOWN", None, None, 20, {}),
    ),
    (
        "v2-unlisted-combination-falls-back-to-unspec",
        bytes.fromhex(SIG + "21 10 000c 7f000001 7f000001 d431 2694"),
        ProxyHeader(2, "PROXY", "UNKNOWN", None, None, 28, {}),
    ),
]
GOLDEN_IDS = [g[0] for g in GOLDEN]


@pytest.mark.parametrize(("name", "raw", "expected"), GOLDEN, ids=GOLDEN_IDS)
def test_golden_at_every_split(name: str, raw: bytes, expected: ProxyHeader) -> None:
    data = raw + PAYLOAD
    for k in range(len(raw)):
        assert parse_proxy_header(data[:k]) is None, k
    for k in range(len(raw), len(data) + 1):
        assert parse_proxy_header(data[:k]) == expected
    assert data[expected.consumed :] == PAYLOAD


@pytest.mark.parametrize(
    ("source", "destination"),
    [
        (("192.0.2.1", 1), ("192.0.2.2", 65535)),
        (("2001:db8::1", 0), ("::1", 443)),
        (None, None),
    ],
)
def test_encode_v1_round_trip(source: tuple[str, int] | None, destination: tuple[str, int] | None) -> None:
    raw = encode_v1(source, destination)
    header = parse_proxy_header(raw)
    assert header is not None
    assert (header.version, header.source, header.destination, header.consumed) == (
        1,
        source,
        destination,
        len(raw),
    )


def test_encode_v1_golden() -> None:
    assert encode_v1(("192.168.0.1", 56324), ("192.168.0.11", 443)) == GOLDEN[0][1]
    assert encode_v1(None, None) == b"PROXY UNKNOWN\r\n"


def test_encode_v2_golden() -> None:
    assert encode_v2(("192.0.2.7", 40000), ("198.51.100.1", 9876)) == GOLDEN[5][1]
    assert encode_v2(command="LOCAL") == GOLDEN[9][1]
    unix = encode_v2(("/run/lb.sock", 0), ("/run/mqproxy.sock", 0), family="UNIX")
    assert unix == GOLDEN[8][1]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((("192.0.2.1", 1), ("::1", 2)), {}),
        ((("192.0.2.1", 70000), ("192.0.2.2", 2)), {}),
        ((("192.0.2.1", 1), None), {}),
        ((("not-an-ip", 1), ("192.0.2.2", 2)), {}),
    ],
)
def test_encode_v1_rejects_bad_arguments(args: tuple[object, ...], kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - any ValueError subclass is fine for a caller bug
        encode_v1(*args, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"command": "HELLO"},
        {"family": "SCTP4", "source": ("192.0.2.1", 1), "destination": ("192.0.2.2", 2)},
        {"family": "TCP4"},
        {"source": ("192.0.2.1", -1), "destination": ("192.0.2.2", 2)},
        {"family": "UNIX", "source": ("/" + "x" * 108, 0), "destination": ("/y", 0)},
        {"tlvs": {256: b""}},
        {"tlvs": [(1, bytes(0x10000))]},
    ],
)
def test_encode_v2_rejects_bad_arguments(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - any ValueError subclass is fine for a caller bug
        encode_v2(**kwargs)  # type: ignore[arg-type]


# -- CRC32C (§2.2.3) ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [  # RFC 3720 appendix B.4 test vectors, plus the classic check value
        (bytes(32), 0x8A9136AA),
        (b"\xff" * 32, 0x62A8AB43),
        (bytes(range(32)), 0x46DD794E),
        (bytes(range(31, -1, -1)), 0x113FDB5C),
        (b"123456789", 0xE3069283),
    ],
)
def test_crc32c_vectors(data: bytes, expected: int) -> None:
    assert crc32c(data) == expected


def test_v2_crc32c_verified() -> None:
    raw = encode_v2(("192.0.2.7", 40000), ("198.51.100.1", 9876), tlvs={PP2_TYPE_ALPN: b"h2"}, checksum=True)
    header = parse_proxy_header(raw)
    assert header is not None
    assert header.tlvs[PP2_TYPE_ALPN] == b"h2"
    assert header.tlvs[PP2_TYPE_CRC32C] == raw[-4:]
    zeroed = raw[:-4] + bytes(4)
    assert int.from_bytes(raw[-4:], "big") == crc32c(zeroed)
    corrupted = raw[:20] + bytes([raw[20] ^ 1]) + raw[21:]
    with pytest.raises(ProxyProtocolError, match="CRC32C"):
        parse_proxy_header(corrupted)
    short_crc = bytes.fromhex(SIG + "21 11 000f c0000207 c6336401 9c40 2694 03 0000")
    with pytest.raises(ProxyProtocolError, match="4 bytes"):
        parse_proxy_header(short_crc)


# -- rejections --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"GET / HTTP/1.1\r\n", id="not-proxy"),
        pytest.param(b"PROXZ TCP4", id="v1-bad-prefix"),
        pytest.param(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n", id="v1-bare-lf"),
        pytest.param(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\r\n", id="v1-bare-cr"),
        pytest.param(b"PROXY TCP4  1.2.3.4 5.6.7.8 1 2\r\n", id="v1-double-space"),
        pytest.param(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 \r\n", id="v1-trailing-space"),
        pytest.param(b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", id="v1-missing-port"),
        pytest.param(b"PROXY TCP4 01.2.3.4 5.6.7.8 1 2\r\n", id="v1-leading-zero-address"),
        pytest.param(b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n", id="v1-leading-zero-port"),
        pytest.param(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 65536\r\n", id="v1-port-too-big"),
        pytest.param(b"PROXY TCP4 1.2.3.4 5.6.7.8 -1 2\r\n", id="v1-negative-port"),
        pytest.param(b"PROXY TCP4 ::1 ::1 1 2\r\n", id="v1-tcp4-with-ipv6"),
        pytest.param(b"PROXY TCP6 1.2.3.4 5.6.7.8 1 2\r\n", id="v1-tcp6-with-ipv4"),
        pytest.param(b"PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n", id="v1-scoped-ipv6"),
        pytest.param(b"PROXY TCP4 1.2.3.256 5.6.7.8 1 2\r\n", id="v1-octet-too-big"),
        pytest.param(b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n", id="v1-udp"),
        pytest.param(b"PROXY tcp4 1.2.3.4 5.6.7.8 1 2\r\n", id="v1-lowercase-family"),
        pytest.param(b"PROXY TCP4 1.2.3.4 5.6.7.\xc3\xa9 1 2\r\n", id="v1-non-ascii"),
        pytest.param(b"PROXY TCP4 1.2.3.4\x00", id="v1-nul-in-partial-line"),
        pytest.param(b"PROXY " + b"A" * (MAX_V1_HEADER - 6), id="v1-no-crlf-within-107"),
        pytest.param(b"PROXY " + b"A" * (MAX_V1_HEADER - 7) + b"\r\n", id="v1-crlf-at-108"),
        pytest.param(bytes.fromhex("0d0a0d0a000d0a515549540b"), id="v2-bad-signature"),
        pytest.param(b"\r\n\r\n\x00\n", id="v2-partial-then-wrong"),
        pytest.param(bytes.fromhex(SIG + "11"), id="v2-version-1"),
        pytest.param(bytes.fromhex(SIG + "31"), id="v2-version-3"),
        pytest.param(bytes.fromhex(SIG + "22"), id="v2-command-2"),
        pytest.param(bytes.fromhex(SIG + "2f"), id="v2-command-15"),
        pytest.param(bytes.fromhex(SIG + "21 41"), id="v2-family-4"),
        pytest.param(bytes.fromhex(SIG + "21 13"), id="v2-transport-3"),
        pytest.param(bytes.fromhex(SIG + "21 11 0004 7f000001"), id="v2-inet-too-short"),
        pytest.param(bytes.fromhex(SIG + "21 21 000c" + "00" * 12), id="v2-inet6-too-short"),
        pytest.param(bytes.fromhex(SIG + "21 31 000c" + "00" * 12), id="v2-unix-too-short"),
        pytest.param(
            bytes.fromhex(SIG + "21 11 000e 7f000001 7f000001 0001 0002 01 00"), id="v2-tlv-truncated"
        ),
        pytest.param(
            bytes.fromhex(SIG + "21 11 000f 7f000001 7f000001 0001 0002 01 0001"), id="v2-tlv-no-value"
        ),
        pytest.param(
            bytes.fromhex(SIG + "21 11 0012 7f000001 7f000001 0001 0002 01 0005 683268"), id="v2-tlv-overruns"
        ),
        pytest.param(V2_SIGNATURE + b"\x21\x11" + (MAX_V2_HEADER - 15).to_bytes(2, "big"), id="v2-too-large"),
        pytest.param(V2_SIGNATURE + b"\x21\x11\xff\xff", id="v2-max-wire-length"),
    ],
)
def test_rejects(data: bytes) -> None:
    with pytest.raises(ProxyProtocolError) as info:
        parse_proxy_header(data)
    assert info.value.reason == "bad_proxy_header"
    assert str(info.value)


@pytest.mark.parametrize("fam", ["11", "12", "21", "22", "31", "32"])
def test_v2_short_address_block_rejected_from_fixed_header(fam: str) -> None:
    fixed = bytes.fromhex(SIG + "21" + fam + "000b")
    with pytest.raises(ProxyProtocolError, match="too short"):
        parse_proxy_header(fixed)
    # LOCAL discards the block, so any length is fine.
    local = bytes.fromhex(SIG + "20" + fam + "000b") + bytes(11)
    assert parse_proxy_header(local[:-1]) is None
    header = parse_proxy_header(local)
    assert header is not None
    assert (header.command, header.source, header.consumed) == ("LOCAL", None, 27)


def test_v1_without_crlf_needs_more_until_107_bytes() -> None:
    line = b"PROXY UNKNOWN " + b"f" * 200
    for k in range(MAX_V1_HEADER):
        assert parse_proxy_header(line[:k]) is None, k
    with pytest.raises(ProxyProtocolError, match="107"):
        parse_proxy_header(line[:MAX_V1_HEADER])
    # The CR of the CRLF may arrive alone.
    assert parse_proxy_header(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r") is None


def test_v2_largest_allowed_header() -> None:
    value = bytes(MAX_V2_HEADER - 16 - 12 - 3)
    raw = encode_v2(("192.0.2.1", 1), ("192.0.2.2", 2), tlvs=[(0xE0, value)])
    assert len(raw) == MAX_V2_HEADER
    header = parse_proxy_header(raw)
    assert header is not None
    assert header.tlvs == {0xE0: value}
    bigger = encode_v2(("192.0.2.1", 1), ("192.0.2.2", 2), tlvs=[(0xE0, value + b"x")])
    with pytest.raises(ProxyProtocolError, match="exceeds"):
        parse_proxy_header(bigger)
    # Rejected as soon as the declared length is visible, before the body arrives.
    with pytest.raises(ProxyProtocolError, match="exceeds"):
        parse_proxy_header(bigger[:16])


def test_v2_duplicate_tlv_keeps_first_and_noop_is_dropped() -> None:
    raw = encode_v2(
        ("192.0.2.1", 1),
        ("192.0.2.2", 2),
        tlvs=[(PP2_TYPE_AUTHORITY, b"first"), (PP2_TYPE_NOOP, b"\x00"), (PP2_TYPE_AUTHORITY, b"second")],
    )
    header = parse_proxy_header(raw)
    assert header is not None
    assert header.tlvs == {PP2_TYPE_AUTHORITY: b"first"}


def test_v2_unix_path_with_invalid_utf8_is_escaped() -> None:
    raw = bytes.fromhex(SIG + "21 31 00d8") + b"/tmp/\xff".ljust(108, b"\x00") + b"\x00" * 108
    header = parse_proxy_header(raw)
    assert header is not None
    assert header.source == ("/tmp/\\xff", 0)
    assert header.destination == ("", 0)  # abstract/unnamed socket


# -- fuzzing ---------------------------------------------------------------------------------------------

_near_header = st.builds(
    lambda prefix, tail: prefix + tail,
    st.sampled_from(
        [V2_SIGNATURE, V2_SIGNATURE + b"\x21", V2_SIGNATURE + b"\x21\x11", b"PROXY ", b"PROXY TCP4 "]
    ),
    st.binary(max_size=300),
)


# No hypothesis deadline: timing varies on shared cores; these tests check correctness only.
@settings(deadline=None)
@given(data=st.one_of(st.binary(max_size=300), _near_header))
def test_fuzz_only_proxy_protocol_error(data: bytes) -> None:
    reason = None
    try:
        header = parse_proxy_header(data)
    except ProxyProtocolError as exc:
        header, reason = None, exc.reason
    assert reason in (None, "bad_proxy_header")
    if header is not None:
        assert 0 < header.consumed <= len(data)
        assert header.consumed <= max(MAX_V1_HEADER, MAX_V2_HEADER)
        assert parse_proxy_header(data[: header.consumed]) == header


_ipv4 = st.ip_addresses(v=4).map(str)
_ipv6 = st.ip_addresses(v=6).map(str)
_port = st.integers(0, 65535)


@settings(deadline=None)
@given(
    v6=st.booleans(),
    data=st.data(),
    tlvs=st.dictionaries(
        st.integers(0, 255).filter(lambda t: t not in (PP2_TYPE_NOOP, PP2_TYPE_CRC32C)),
        st.binary(max_size=40),
        max_size=4,
    ),
    checksum=st.booleans(),
)
def test_fuzz_encode_parse_round_trip(
    v6: bool, data: st.DataObject, tlvs: dict[int, bytes], checksum: bool
) -> None:
    addresses = _ipv6 if v6 else _ipv4
    source = (data.draw(addresses), data.draw(_port))
    destination = (data.draw(addresses), data.draw(_port))
    canonical_source = (str(ipaddress.ip_address(source[0])), source[1])
    canonical_destination = (str(ipaddress.ip_address(destination[0])), destination[1])

    v1 = parse_proxy_header(encode_v1(source, destination) + PAYLOAD)
    assert v1 is not None
    assert (v1.source, v1.destination) == (canonical_source, canonical_destination)

    raw = encode_v2(source, destination, tlvs=tlvs, checksum=checksum)
    v2 = parse_proxy_header(raw + PAYLOAD)
    assert v2 is not None
    assert (v2.family, v2.source, v2.destination, v2.consumed) == (
        "TCP6" if v6 else "TCP4",
        canonical_source,
        canonical_destination,
        len(raw),
    )
    assert {k: v for k, v in v2.tlvs.items() if k != PP2_TYPE_CRC32C} == tlvs
    assert (PP2_TYPE_CRC32C in v2.tlvs) == checksum
