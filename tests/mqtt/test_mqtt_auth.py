"""Authentication and ACLs of the MQTT gateway: hash lines, pattern coverage, the ``[mqtt]`` settings,
and CONNECT / SUBSCRIBE / PUBLISH refusals over loopback at 3.1.1 and 5.0."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from mqproxy.codecs import mqtt as mq
from mqproxy.mqtt.auth import (
    Authorizer,
    filter_covers,
    hash_password,
    main,
    parse_password_hash,
    verify_password,
)
from mqproxy.mqtt.gateway import config_from_settings
from mqproxy.settings import MqttSettings, Settings, SettingsError, build_settings, load_settings

from .conftest import arrivals, connect, gateway_of, running_server  # type: ignore[import-not-found]

Q0, Q1, Q2 = mq.QoS.AT_MOST_ONCE, mq.QoS.AT_LEAST_ONCE, mq.QoS.EXACTLY_ONCE
# RFC 7914 section 11: PBKDF2-HMAC-SHA-256, P="passwd", S="salt", c=1 (first 32 of its 64 bytes).
RFC7914 = bytes.fromhex("55ac046e56e3089fec1691c22544b605f94185216dde0465e68b9d57c20dacbc")


def test_hash_line_format_is_pbkdf2_sha256() -> None:
    line = hash_password("passwd", 1, b"salt")
    assert line == f"pbkdf2_sha256$1$c2FsdA==${base64.b64encode(RFC7914).decode()}"
    parsed = parse_password_hash(line)
    assert (parsed.iterations, parsed.salt, parsed.key) == (1, b"salt", RFC7914)
    assert verify_password(b"passwd", parsed)
    assert not verify_password(b"passwd ", parsed)
    fresh = parse_password_hash(hash_password("pw", 1000))
    assert fresh.iterations == 1000
    assert len(fresh.salt) == 16
    assert len(fresh.key) == 32


@pytest.mark.parametrize(
    "line",
    [
        "",
        "pbkdf2_sha1$1$c2FsdA==$" + "A" * 44,
        "pbkdf2_sha256$x$c2FsdA==$" + "A" * 44,
        "pbkdf2_sha256$0$c2FsdA==$" + "A" * 44,
        "pbkdf2_sha256$1$not base64$" + "A" * 44,
        "pbkdf2_sha256$1$$" + "A" * 44,
        "pbkdf2_sha256$1$c2FsdA==$AAAA",
        "pbkdf2_sha256$1$c2FsdA==$" + "A" * 44 + "$extra",
    ],
)
def test_bad_hash_lines_are_value_errors(line: str) -> None:
    with pytest.raises(ValueError, match=r"pbkdf2_sha256\$|iterations|salt"):
        parse_password_hash(line)


def test_cli_prints_a_verifiable_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hash", "s3cret", "--iterations", "1000"]) == 0
    line = capsys.readouterr().out.strip()
    assert verify_password(b"s3cret", parse_password_hash(line))
    assert main(["hash"]) == 2
    assert main(["hash", "x", "--iterations", "zero"]) == 2
    assert "usage" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("pattern", "topic_filter", "covered"),
    [
        ("a/#", "a/b/c", True),
        ("a/#", "a", True),
        ("a/#", "a/+/#", True),
        ("a/+", "a/b", True),
        ("a/+", "a/+", True),
        ("a/+", "a/#", False),
        ("a/+", "a/b/c", False),
        ("a/b", "a/+", False),
        ("a/b", "a/b", True),
        ("#", "$SYS/x", False),
        ("+/x", "$SYS/x", False),
        ("$SYS/#", "$SYS/x", True),
        ("a/b/c", "a/b", False),
    ],
)
def test_filter_covers(pattern: str, topic_filter: str, covered: bool) -> None:
    assert filter_covers(pattern, topic_filter) is covered


LEVEL = st.sampled_from(["a", "b", "+", "$s", ""])


@given(
    st.lists(LEVEL, min_size=1, max_size=4),
    st.lists(LEVEL, min_size=1, max_size=4),
    st.booleans(),
    st.lists(st.sampled_from(["a", "b", "$s", ""]), min_size=1, max_size=5),
)
def test_a_covering_pattern_matches_every_topic_of_the_filter(
    pattern: list[str], wanted: list[str], hash_tail: bool, topic: list[str]
) -> None:
    p = "/".join([*pattern, "#"] if hash_tail else pattern)
    f = "/".join(wanted)
    t = "/".join(topic)
    if filter_covers(p, f) and mq.topic_matches(f, t):
        assert mq.topic_matches(p, t)


def _authorizer(**kw: Any) -> Authorizer:
    return Authorizer.from_settings(
        kw.get("allow_anonymous", True),
        kw.get("users", {"alice": hash_password("wonderland", 1000)}),
        kw.get("acl", {"*": {"publish": ["devices/%c/#"], "subscribe": ["devices/%c/#", "users/%u/#"]}}),
    )


async def test_authenticate_rules() -> None:
    auth = _authorizer()
    assert await auth.authenticate("alice", b"wonderland") == mq.ReasonCode.SUCCESS
    assert await auth.authenticate("alice", b"wrong") == mq.ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert await auth.authenticate("alice", None) == mq.ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert await auth.authenticate("bob", b"wonderland") == mq.ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert await auth.authenticate(None, None) == mq.ReasonCode.SUCCESS
    closed = _authorizer(allow_anonymous=False)
    assert await closed.authenticate(None, None) == mq.ReasonCode.NOT_AUTHORIZED
    open_door = _authorizer(users={})
    assert await open_door.authenticate("anyone", b"x") == mq.ReasonCode.SUCCESS
    assert await _authorizer(users={}, allow_anonymous=False).authenticate("x", b"") == (
        mq.ReasonCode.BAD_USER_NAME_OR_PASSWORD
    )


async def test_a_verified_password_is_remembered_per_user(monkeypatch: pytest.MonkeyPatch) -> None:
    from mqproxy.mqtt import auth as auth_module

    calls: list[bytes] = []
    real = auth_module.verify_password

    def counting(password: bytes, parsed: Any) -> bool:
        calls.append(password)
        return real(password, parsed)

    monkeypatch.setattr(auth_module, "verify_password", counting)
    auth = _authorizer()
    for _ in range(3):
        assert await auth.authenticate("alice", b"wonderland") == mq.ReasonCode.SUCCESS
    assert calls == [b"wonderland"]
    assert await auth.authenticate("alice", b"wonderlan") == mq.ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert calls == [b"wonderland", b"wonderlan"]


def test_acl_substitution_and_wildcard_ids() -> None:
    auth = _authorizer()
    assert auth.can_publish("dev1", None, "devices/dev1/temp")
    assert not auth.can_publish("dev1", None, "devices/dev2/temp")
    assert auth.can_subscribe("dev1", "alice", "users/alice/#")
    assert auth.can_subscribe("dev1", "alice", "$share/g/devices/dev1/+")
    assert not auth.can_subscribe("dev1", None, "users/alice/#")  # %u without a user name matches nothing
    assert not auth.can_subscribe("+", None, "devices/+/x")  # an id must not widen its own grant
    assert not auth.can_subscribe("a/b", None, "devices/a/b/x")
    assert _authorizer(acl={}).can_publish("x", None, "anything/at/all")


# --- settings ---------------------------------------------------------------------------------


def test_mqtt_tables_load_from_toml(tmp_path: Path) -> None:
    line = hash_password("pw", 1000)
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        "[mqtt]\nallow_anonymous = false\nmax_packet_size = 4096\nmax_keep_alive = 60\n"
        'deny_subscribe = ["test/nosubscribe"]\n'
        f'[mqtt.users]\nalice = "{line}"\n'
        '[mqtt.acl]\nalice = { publish = ["a/#"] }\n"*" = { subscribe = ["b/%c"] }\n'
    )
    settings = load_settings(cfg)
    mqtt = settings.mqtt
    assert mqtt.users == {"alice": line}
    assert mqtt.acl == {"alice": {"publish": ("a/#",)}, "*": {"subscribe": ("b/%c",)}}
    config = config_from_settings(mqtt)
    assert (config.max_packet_size, config.max_keep_alive) == (4096, 60)
    assert config.deny_subscribe == ("test/nosubscribe",)
    assert config_from_settings(MqttSettings()).max_keep_alive is None
    assert settings.as_dict()["mqtt"]["users"] == {"alice": "<redacted>"}


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"users": {"alice": "plain"}}, r"mqtt\.users\.alice: expected pbkdf2_sha256"),
        ({"users": ["alice"]}, r"mqtt\.users: expected a table"),
        ({"users": {"alice": 3}}, r"mqtt\.users\.alice: expected str"),
        ({"acl": {"bob": {"read": ["a"]}}}, r"mqtt\.acl\.bob: unknown key 'read'"),
        ({"acl": {"bob": {"publish": ["a/#/b"]}}}, r"mqtt\.acl\.bob: publish: invalid topic filter"),
        ({"acl": {"bob": {"publish": "a"}}}, r"mqtt\.acl\.bob\.publish: expected an array"),
        ({"maximum_qos": 3}, r"mqtt\.maximum_qos.*out of range"),
        ({"passwords": {}}, r"unknown setting 'mqtt\.passwords'"),
    ],
)
def test_bad_mqtt_settings_are_named(values: dict[str, Any], match: str) -> None:
    with pytest.raises(SettingsError, match=match):
        build_settings({"mqtt": values})


def test_tables_cannot_come_from_the_environment() -> None:
    with pytest.raises(SettingsError, match=r"mqtt\.users: a table or array cannot be set"):
        load_settings(None, {"MQPROXY_MQTT_USERS": "alice=x"})
    assert load_settings(None, {"MQPROXY_MQTT_ALLOW_ANONYMOUS": "false"}).mqtt.allow_anonymous is False


# --- loopback ---------------------------------------------------------------------------------

ACL = {
    "*": {"publish": ["devices/%c/#"], "subscribe": ["devices/%c/#"]},
    "admin": {"publish": ["#"], "subscribe": ["#"]},
}


def _settings(**mqtt: Any) -> Settings:
    values: dict[str, Any] = {
        "users": {"alice": hash_password("wonderland", 1000), "admin": hash_password("root", 1000)},
        "acl": ACL,
    }
    values.update(mqtt)
    return Settings.for_tests(mqtt=values)


@pytest.mark.parametrize("level", [4, 5])
async def test_connect_credentials(log_sink: Any, level: int) -> None:
    async with running_server(_settings(allow_anonymous=False)) as handle:
        address = handle.address
        assert gateway_of(handle).auth.allow_anonymous is False
        ok, connack = await connect(address, "c1", level, username="alice", password=b"wonderland")
        assert connack.reason_code == mq.ReasonCode.SUCCESS
        await ok.aclose()
        cases = [
            ({"username": "alice", "password": b"nope"}, mq.ReasonCode.BAD_USER_NAME_OR_PASSWORD),
            ({"username": "mallory", "password": b"wonderland"}, mq.ReasonCode.BAD_USER_NAME_OR_PASSWORD),
            ({}, mq.ReasonCode.NOT_AUTHORIZED),
        ]
        for kw, code in cases:
            refused, connack = await connect(address, "c2", level, **kw)
            assert connack.reason_code == code
            assert await refused.expect_eof() == []
        # a will to a topic the client may not publish to is refused at CONNECT
        will = mq.Will("elsewhere/x", b"bye", Q1)
        refused, connack = await connect(
            address, "c3", level, username="alice", password=b"wonderland", will=will
        )
        assert connack.reason_code == mq.ReasonCode.NOT_AUTHORIZED
    errors = [e["error"] for e in log_sink.named("conn.closed")]
    assert errors.count("auth_failed") == 4


async def test_v311_refusal_return_codes_on_the_wire() -> None:
    async with running_server(_settings(allow_anonymous=False)) as handle:
        for kw, wire in [
            ({"username": "alice", "password": b"x"}, b"\x20\x02\x00\x04"),
            ({}, b"\x20\x02\x00\x05"),
        ]:
            stream = await trio.open_tcp_stream(*handle.address)
            await stream.send_all(mq.encode(mq.Connect("w", 4, **kw), 4))
            with trio.fail_after(5):
                assert await stream.receive_some(64) == wire
            await stream.aclose()


@pytest.mark.parametrize("level", [4, 5])
async def test_acl_refusals(log_sink: Any, level: int) -> None:
    v5 = level == 5
    async with running_server(_settings()) as handle:
        address = handle.address
        admin, _ = await connect(address, "admin-1", 5, username="admin", password=b"root")
        await admin.send(mq.Subscribe(1, (mq.SubscribeTopic("#", Q1),)))
        assert isinstance(await admin.receive(), mq.SubAck)
        dev, connack = await connect(address, "dev1", level, username="alice", password=b"wonderland")
        assert connack.reason_code == mq.ReasonCode.SUCCESS
        wanted = (mq.SubscribeTopic("devices/dev1/cmd", Q1), mq.SubscribeTopic("devices/+", Q1))
        await dev.send(mq.Subscribe(1, wanted))
        suback = await dev.receive()
        assert isinstance(suback, mq.SubAck)
        refused = mq.ReasonCode.NOT_AUTHORIZED if v5 else mq.ReasonCode.UNSPECIFIED_ERROR  # 0x87 / 0x80
        assert suback.reason_codes == (mq.ReasonCode.GRANTED_QOS_1, refused)
        await dev.send(mq.Publish("devices/dev2/t", b"forbidden", Q1, packet_id=1))
        await dev.send(mq.Publish("devices/dev2/t", b"forbidden", Q2, packet_id=2))
        await dev.send(mq.Publish("devices/dev2/t", b"forbidden", Q0))
        await dev.send(mq.Publish("devices/dev1/t", b"allowed", Q1, packet_id=3))
        puback, pubrec, allowed_ack = [await dev.receive() for _ in range(3)]
        expected = mq.ReasonCode.NOT_AUTHORIZED if v5 else mq.ReasonCode.SUCCESS  # 3.1.1: acked, dropped
        assert puback == mq.PubAck(1, expected)
        assert pubrec == mq.PubRec(2, expected)
        assert allowed_ack == mq.PubAck(3, mq.ReasonCode.SUCCESS)
        delivered = await admin.receive()
        assert isinstance(delivered, mq.Publish)
        assert delivered.payload == b"allowed"
        assert await arrivals(admin) == []
    statuses = [e["status"] for e in log_sink.requests() if e.get("op") == "PUBLISH"]
    assert statuses.count("NOT_AUTHORIZED") == 3
