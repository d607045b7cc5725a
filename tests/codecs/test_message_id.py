from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqproxy.model.ids import MessageIdError, new_uniq_key, offset_msg_id, parse_offset_msg_id


def test_offset_msg_id_ipv4_golden() -> None:
    # ali-ons showed "7F00000100004DC3..." for a broker on 127.0.0.1:19907 (remoting-clients.md §2)
    assert offset_msg_id(("127.0.0.1", 19907), 0) == "7F00000100004DC30000000000000000"
    assert offset_msg_id(("10.0.0.8", 8080), 0x0123456789ABCDEF) == "0A00000800001F900123456789ABCDEF"


def test_offset_msg_id_ipv6_golden() -> None:
    msg_id = offset_msg_id(("fd00::2", 8080), 4096)
    assert msg_id == "FD000000000000000000000000000002" + "00001F90" + "0000000000001000"
    assert len(msg_id) == 56


@pytest.mark.parametrize(
    ("host", "offset"),
    [
        (("127.0.0.1", 10911), 0),
        (("192.0.2.200", 65535), 2**63 - 1),
        (("2001:db8::1", 1), 123),
        (("::", 0), 0),
    ],
)
def test_offset_msg_id_round_trip(host: tuple[str, int], offset: int) -> None:
    msg_id = offset_msg_id(host, offset)
    assert msg_id == msg_id.upper()
    assert parse_offset_msg_id(msg_id) == (host, offset)
    assert parse_offset_msg_id(msg_id.lower()) == (host, offset)


@settings(max_examples=50, deadline=None)
@given(st.ip_addresses(), st.integers(0, 65535), st.integers(0, 2**63 - 1))
def test_offset_msg_id_property(ip: object, port: int, offset: int) -> None:
    msg_id = offset_msg_id((str(ip), port), offset)
    assert len(msg_id) == (32 if ip.version == 4 else 56)  # type: ignore[attr-defined]
    assert parse_offset_msg_id(msg_id) == ((str(ip), port), offset)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "7F00000100004DC3000000000000000",  # 31 chars
        "7F00000100004DC300000000000000000",  # 33 chars
        "7F00000100004DC3000000000000000G",
        "7F 000001 00004DC3 0000000000000",  # spaces (bytes.fromhex would skip them)
        "０" * 32,  # non-ASCII digits  # noqa: RUF001
        "7F00000100004DC30000000000000000\n",
        "7F000001FFFFFFFF0000000000000000",  # negative port
        "7F0000010001000080000000000000FF",  # port 65536
        "7F00000100004DC3FFFFFFFFFFFFFFFF",  # negative offset
        None,
        b"7F00000100004DC30000000000000000",
    ],
)
def test_parse_offset_msg_id_rejects(bad: object) -> None:
    with pytest.raises(MessageIdError):
        parse_offset_msg_id(bad)  # type: ignore[arg-type]


def test_message_id_error_is_value_error() -> None:
    assert issubclass(MessageIdError, ValueError)


@pytest.mark.parametrize(
    ("host", "port", "offset"),
    [("localhost", 1, 0), ("127.0.0.1", 70000, 0), ("127.0.0.1", 1, 2**63), ("127.0.0.1", 1, -1)],
)
def test_offset_msg_id_rejects_bad_input(host: str, port: int, offset: int) -> None:
    with pytest.raises(MessageIdError):
        offset_msg_id((host, port), offset)


def test_uniq_key_layout() -> None:
    # 2024-03-02T00:00:01.500Z is 86_401_500 ms (0x052661DC) after the start of the month
    key = new_uniq_key(
        "127.0.0.1", pid=70000, counter=65537, timestamp_ms=1_709_337_601_500, class_hash=0x12345678
    )
    assert key == "7F000001" + "1170" + "12345678" + "052661DC" + "0001"


def test_uniq_key_wraps_like_java_int_cast() -> None:
    # 2024-12-31T23:59:59.999Z: 2_678_399_999 ms into December, more than an int holds
    key = new_uniq_key("10.0.0.1", pid=1, counter=0xFFFF, timestamp_ms=1_735_689_599_999, class_hash=-1)
    assert key == "0A000001" + "0001" + "FFFFFFFF" + "9FA523FF" + "FFFF"


def test_uniq_key_ipv6_and_uniqueness() -> None:
    keys = {new_uniq_key("fd00::2", pid=42, counter=i, timestamp_ms=1_709_337_601_500) for i in range(1000)}
    assert len(keys) == 1000
    assert all(len(k) == 56 and k == k.upper() for k in keys)


def test_uniq_key_rejects_bad_host() -> None:
    with pytest.raises(MessageIdError):
        new_uniq_key("not-an-ip", pid=1, counter=1, timestamp_ms=0)
