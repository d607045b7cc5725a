"""MQTT CONNECT and topic decisions from the ACL account file and the [mqtt] tables (mqproxy.mqtt.access),
without sockets; the wire answers are in test_mqtt_acl_server.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
import trio.testing

from mqproxy.acl.holder import AclHolder
from mqproxy.acl.rules import parse_acl
from mqproxy.codecs.mqtt import ReasonCode
from mqproxy.mqtt.access import MqttAccess, subscribable
from mqproxy.mqtt.auth import Authorizer, hash_password

ACL = """
globalWhiteRemoteAddresses: ["10.9.*.*"]
accounts:
  - accessKey: app
    secretKey: app-secret
    defaultTopicPerm: DENY
    topicPerms: ["sensors=PUB|SUB", "alerts=SUB", "cmd=PUB"]
  - accessKey: lan
    secretKey: lan-secret
    whiteRemoteAddress: 192.168.7.*
    topicPerms: ["vault=SUB"]
    defaultTopicPerm: PUB|SUB
  - accessKey: wide
    secretKey: wide-secret
    defaultTopicPerm: SUB
  - accessKey: alice
    secretKey: account-password
    defaultTopicPerm: PUB|SUB
"""
PEER = ("127.0.0.1", 50000)


@dataclass
class Reports:
    """A logger that keeps ``auth.denied`` events, and the holder's counter calls."""

    events: list[dict[str, Any]] = field(default_factory=list)
    counted: list[tuple[str, str]] = field(default_factory=list)

    def warning(self, event: str, **fields: Any) -> None:
        assert event == "auth.denied"
        assert fields["protocol"] == "mqtt"
        self.events.append(fields)

    def count(self, protocol: str, reason: str) -> None:
        self.counted.append((protocol, reason))

    @property
    def seen(self) -> list[tuple[str | None, str]]:
        return [(e["access_key"], e["reason"]) for e in self.events]


@dataclass
class Gate:
    """An :class:`MqttAccess` with its connection-side holder and log."""

    access: MqttAccess
    holder: AclHolder
    reports: Reports

    async def connect(self, username: str | None, password: bytes | None, peer: tuple[str, int]) -> Any:
        return await self.access.connect(username, password, peer, self.holder, self.reports)

    @property
    def throttle(self) -> Any:
        return self.holder.throttle


def access(*, rules: bool = True, **users_kw: Any) -> tuple[Gate, Reports]:
    users = Authorizer.from_settings(
        users_kw.get("allow_anonymous", True),
        users_kw.get("users", {"alice": hash_password("wonderland", 1000)}),
        users_kw.get("acl", {}),
    )
    reports = Reports()
    holder = AclHolder(
        parse_acl(ACL, "plain_acl.yml") if rules else None, on_denied=reports.count, clock=trio.current_time
    )
    return Gate(MqttAccess(users), holder, reports), reports


async def test_access_key_and_secret_connect() -> None:
    gate, reports = access()
    ok = await gate.connect("app", b"app-secret", PEER)
    assert ok.verdict == ReasonCode.SUCCESS
    assert ok.can_publish("c1", "app", "sensors/room1/temp")
    assert not ok.can_publish("c1", "app", "alerts/fire")  # SUB only
    assert ok.can_subscribe("c1", "app", "alerts/#")
    assert not ok.can_subscribe("c1", "app", "cmd/+")  # PUB only
    assert not ok.can_publish("c1", "app", "other/x")  # default DENY
    assert ok.can_subscribe("c1", "app", "$share/g/sensors/+/temp")  # the filter inside $share
    assert reports.seen == [("app", "no_permission")] * 3
    assert reports.counted == [("mqtt", "no_permission")] * 3
    assert reports.events[0]["detail"] == (
        "PUBLISH alerts/fire: No PUB permission for topic alerts (accessKey=app)"
    )
    assert reports.events[0]["peer"] == "127.0.0.1:50000"


@pytest.mark.parametrize(
    ("username", "password", "verdict", "reason"),
    [
        ("app", b"wrong", ReasonCode.BAD_USER_NAME_OR_PASSWORD, "bad_signature"),
        ("app", None, ReasonCode.BAD_USER_NAME_OR_PASSWORD, "bad_signature"),
        ("app", b"\xff\xfe", ReasonCode.BAD_USER_NAME_OR_PASSWORD, "bad_signature"),
        ("nobody", b"x", ReasonCode.BAD_USER_NAME_OR_PASSWORD, "unknown_access_key"),
        (None, None, ReasonCode.NOT_AUTHORIZED, "no_access_key"),  # allow_anonymous is true
    ],
)
async def test_refusals(
    username: str | None, password: bytes | None, verdict: ReasonCode, reason: str
) -> None:
    gate, reports = access()
    refused = await gate.connect(username, password, PEER)
    assert refused.verdict == verdict
    assert not refused.can_publish("c", username, "sensors/x")
    assert reports.seen == [(username, reason)]


async def test_users_file_is_a_second_source() -> None:
    gate, _ = access()
    by_file = await gate.connect("alice", b"wonderland", PEER)  # the [mqtt] users password
    by_account = await gate.connect("alice", b"account-password", PEER)  # the account's secret
    assert by_file.verdict == by_account.verdict == ReasonCode.SUCCESS
    assert (await gate.connect("alice", b"neither", PEER)).verdict == ReasonCode.BAD_USER_NAME_OR_PASSWORD


async def test_white_addresses() -> None:
    gate, _ = access()
    anyone = await gate.connect(None, None, ("10.9.3.4", 1))
    assert anyone.verdict == ReasonCode.SUCCESS
    assert anyone.can_publish("c", None, "anything/at/all")
    lan = await gate.connect("lan", b"not-the-secret", ("192.168.7.9", 1))
    assert lan.verdict == ReasonCode.SUCCESS
    assert lan.can_publish("c", "lan", "vault/anything")  # trusted address: no topic permission checks
    elsewhere = await gate.connect("lan", b"not-the-secret", ("192.168.8.9", 1))
    assert elsewhere.verdict == ReasonCode.BAD_USER_NAME_OR_PASSWORD


async def test_mqtt_acl_patterns_apply_on_top() -> None:
    gate, _ = access(acl={"*": {"publish": ["sensors/%c/#"], "subscribe": ["sensors/#"]}})
    ok = await gate.connect("app", b"app-secret", PEER)
    assert ok.can_publish("dev1", "app", "sensors/dev1/temp")
    assert not ok.can_publish("dev1", "app", "sensors/dev2/temp")  # account allows, [mqtt] acl does not


async def test_without_an_account_file_the_mqtt_tables_decide_as_before() -> None:
    gate, _ = access(rules=False)
    assert (await gate.connect(None, None, PEER)).verdict == ReasonCode.SUCCESS
    assert (await gate.connect("app", b"app-secret", PEER)).verdict == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert (await gate.connect("alice", b"wonderland", PEER)).verdict == ReasonCode.SUCCESS


def test_wildcard_first_level_needs_sub_everywhere() -> None:
    rules = parse_acl(ACL, "plain_acl.yml")
    app, wide, lan = rules.account("app"), rules.account("wide"), rules.account("lan")
    assert app is not None
    assert wide is not None
    assert lan is not None
    assert subscribable(app, "+/temp") is not None  # default DENY
    assert subscribable(app, "#") is not None
    assert subscribable(wide, "#") is None
    assert subscribable(lan, "+/x/#") is None
    assert subscribable(app, "$SYS/x") is not None  # stored under MQTT_OTHER, which app may not read


async def test_failed_connects_are_throttled_per_address(autojump_clock: trio.testing.MockClock) -> None:
    gate, reports = access()
    for _ in range(gate.throttle.free_failures + 1):
        assert (await gate.connect("app", b"guess", PEER)).verdict == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    # backing off: refused unseen, even with the right password; counted, not logged
    throttled = await gate.connect("app", b"app-secret", PEER)
    assert throttled.verdict == ReasonCode.CONNECTION_RATE_EXCEEDED
    assert reports.counted[-1] == ("mqtt", "throttled")
    assert [reason for _, reason in reports.seen] == ["bad_signature"] * (gate.throttle.free_failures + 1)
    assert (await gate.connect("app", b"app-secret", ("127.0.0.2", 1))).verdict == ReasonCode.SUCCESS
    assert (await gate.connect(None, None, ("10.9.0.1", 1))).verdict == ReasonCode.SUCCESS  # global white
    await trio.sleep(gate.throttle.delay_for(PEER[0], trio.current_time()))
    assert (await gate.connect("app", b"app-secret", PEER)).verdict == ReasonCode.SUCCESS
    assert gate.throttle.delay_for(PEER[0], trio.current_time()) == 0  # a success forgets the address


async def test_a_reload_applies_to_admitted_connections() -> None:
    gate, reports = access()
    ok = await gate.connect("app", b"app-secret", PEER)
    assert not ok.can_publish("c1", "app", "alerts/fire")
    gate.holder.replace(parse_acl(ACL.replace('"alerts=SUB"', '"alerts=PUB|SUB"'), "plain_acl.yml"))
    assert ok.can_publish("c1", "app", "alerts/fire")
    gate.holder.replace(parse_acl("accounts: []", "plain_acl.yml"))  # the account is gone
    assert not ok.can_publish("c1", "app", "sensors/x")
    assert not ok.can_subscribe("c1", "app", "sensors/#")
    assert reports.events[-1]["detail"] == "SUBSCRIBE sensors/#: No acl config for app"


async def test_connections_admitted_by_the_users_share_one_admission_until_the_users_change() -> None:
    gate, _ = access(rules=False)
    first = await gate.connect("alice", b"wonderland", PEER)
    second = await gate.connect("alice", b"wonderland", PEER)
    assert first.verdict == ReasonCode.SUCCESS
    assert second is first, "no permission objects per connection"
    gate.access.users = Authorizer.from_settings(False, {"bob": hash_password("builder", 1000)}, {})
    third = await gate.connect("bob", b"builder", PEER)
    assert third.verdict == ReasonCode.SUCCESS
    assert third is not first
    assert third.can_publish.__self__ is gate.access.users  # type: ignore[attr-defined]
