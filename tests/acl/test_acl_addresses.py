"""White remote address patterns (RocketMQ RemoteAddressStrategyFactory forms)."""

from __future__ import annotations

import pytest

from mqproxy.acl.addresses import compile_pattern, normalize_ip


@pytest.mark.parametrize(
    ("pattern", "ip", "expected"),
    [
        ("", "127.0.0.1", False),
        ("*", "10.1.2.3", True),
        ("*.*.*.*", "::1", True),
        ("192.168.0.1", "192.168.0.1", True),
        ("192.168.0.1", "192.168.0.2", False),
        ("192.168.0.{1,2}", "192.168.0.2", True),
        ("192.168.0.{1,2}", "192.168.0.3", False),
        ("10.0.0.1,10.0.0.9", "10.0.0.9", True),
        ("10.0.0.1,10.0.0.9", "10.0.0.2", False),
        ("192.168.1.1-5", "192.168.1.5", True),
        ("192.168.1.1-5", "192.168.1.6", False),
        ("192.168.1.1-5", "192.168.2.3", False),
        ("192.168.*", "192.168.77.1", True),
        ("192.168.*", "192.169.0.1", False),
        ("192.168.1-3.*", "192.168.3.200", True),
        ("192.168.1-3.*", "192.168.4.1", False),
        ("127.0.0.*", "::ffff:127.0.0.1", True),
        ("::1", "0:0:0:0:0:0:0:1", True),
        ("1050:0:0:0:5:600:300c:*", "1050::5:600:300c:abcd", True),
        ("1050:0:0:0:5:600:300c:1-f", "1050::5:600:300c:10", False),
        ("192.168.*", "::1", False),
        ("192.168.*", "not-an-ip", False),
    ],
)
def test_pattern_matches(pattern: str, ip: str, expected: bool) -> None:
    assert compile_pattern(pattern).matches(ip) is expected


@pytest.mark.parametrize(
    "pattern",
    ["300.1.1.1", "192.168.0.{1,x}", "192.*.1.1", "*.1.1.1", "192.168.5-1.*", "hello", "1.2.3.4.5.*", "1-.2"],
)
def test_bad_patterns_raise(pattern: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        compile_pattern(pattern)


def test_normalize_ip() -> None:
    assert normalize_ip("::ffff:10.0.0.1") == "10.0.0.1"
    assert normalize_ip("[::1]") == "0000:0000:0000:0000:0000:0000:0000:0001"
    assert normalize_ip(" 10.0.0.1 ") == "10.0.0.1"
