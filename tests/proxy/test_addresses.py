"""``[server] advertised_address``: what is accepted, and that a malformed value stops the start with exit
status 2 naming the setting."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from mqproxy.addresses import format_hostport, id_address, parse_advertised
from mqproxy.cli import main
from mqproxy.settings import SettingsError, build_settings


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("203.0.113.7:9876", ("203.0.113.7", 9876)),
        ("[2001:db8::1]:9876", ("2001:db8::1", 9876)),
        ("[::1]:1", ("::1", 1)),
        ("mq.example.com:443", ("mq.example.com", 443)),
        ("proxy-0.proxy.ns.svc.cluster.local.:30876", ("proxy-0.proxy.ns.svc.cluster.local.", 30876)),
        ("localhost:65535", ("localhost", 65535)),
    ],
)
def test_accepted(value: str, expected: tuple[str, int]) -> None:
    assert parse_advertised(value) == expected


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("mq.example.com", r"expected HOST:PORT"),
        (":9876", r"expected HOST:PORT"),
        ("2001:db8::1:9876", r"IPv6 address goes in brackets"),
        ("[2001:db8::1]9876", r"expected \[IPV6\]:PORT"),
        ("[2001:db8::zz]:9876", r"not an IPv6 address"),
        ("[10.0.0.1]:9876", r"not an IPv6 address"),
        ("0.0.0.0:9876", r"unspecified address"),
        ("[::]:9876", r"unspecified address"),
        ("10.0.0.1:0", r"out of range 1\.\.65535"),
        ("10.0.0.1:65536", r"out of range"),
        ("10.0.0.1:http", r"port must be an integer"),
        ("10.0.0.1:-1", r"port must be an integer"),
        ("999.1.1.1:9876", r"neither an IP address nor a host name"),
        ("bad_host:9876", r"neither an IP address nor a host name"),
        ("-lead.example:9876", r"neither an IP address nor a host name"),
        ("a..b:9876", r"neither an IP address nor a host name"),
        (f"{'x' * 64}.example:9876", r"neither an IP address nor a host name"),
        ("host name:9876", r"neither an IP address nor a host name"),
    ],
)
def test_malformed_values_name_the_setting(value: str, match: str) -> None:
    with pytest.raises(SettingsError, match=rf"server\.advertised_address: .*{match}|{match}") as caught:
        build_settings({"server": {"advertised_address": value}})
    assert str(caught.value).startswith("server.advertised_address: ")


def test_format_brackets_ipv6() -> None:
    assert format_hostport(("2001:db8::1", 9876)) == "[2001:db8::1]:9876"
    assert format_hostport(("mq.example.com", 9876)) == "mq.example.com:9876"


def test_malformed_env_value_exits_with_status_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MQPROXY_SERVER_ADVERTISED_ADDRESS", "2001:db8::1:9876")
    assert main(["serve", "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert "server.advertised_address" in err
    assert "brackets" in err


def _resolver(answer: list[str] | OSError | None) -> Any:
    async def resolve(host: str) -> list[Any]:
        if answer is None:
            await trio.sleep_forever()
        if isinstance(answer, OSError):
            raise answer
        return [(0, 0, 0, "", (ip, 0)) for ip in answer]  # getaddrinfo's shape

    return resolve


async def test_id_address_keeps_an_ip_and_resolves_a_name_preferring_ipv4() -> None:
    unused = _resolver(OSError("unused"))
    assert await id_address(("2001:db8::1", 9876), resolve=unused) == ("2001:db8::1", 9876)
    resolve = _resolver(["2001:db8::5", "198.51.100.5"])
    assert await id_address(("mq.example.com", 30876), resolve=resolve) == ("198.51.100.5", 30876)
    assert await id_address(("v6only.example", 1), resolve=_resolver(["fe80::1%eth0"])) == ("fe80::1", 1)


async def test_id_address_falls_back_to_loopback_and_says_why(log_sink: Any, autojump_clock: Any) -> None:
    gaierror = OSError("Name or service not known")
    assert await id_address(("nowhere.invalid", 9876), resolve=_resolver(gaierror)) == ("127.0.0.1", 9876)
    slow = _resolver(None)
    assert await id_address(("slow.example", 9876), resolve=slow, timeout_s=5) == ("127.0.0.1", 9876)
    events = log_sink.named("proxy.advertised_unresolved")
    assert [(e["advertised"], e["detail"]) for e in events] == [
        ("nowhere.invalid:9876", "Name or service not known"),
        ("slow.example:9876", "no answer within 5 s"),
    ]
