"""The ``[acl] file`` on MQTT through the real server over loopback: access keys as CONNECT credentials,
the account's topic permissions on PUBLISH and SUBSCRIBE (3.1.1 and 5), the [mqtt] users file as a second
source, a reload taking effect for new connections, ``auth.denied`` and ``mqproxy_auth_denied_total``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mqproxy.codecs import mqtt as mq
from mqproxy.mqtt.auth import hash_password
from mqproxy.settings import Settings

from .conftest import (  # type: ignore[import-not-found]
    arrivals,
    connect,
    receive_publish,
    running_server,
    wait_until,
)

Q1 = mq.QoS.AT_LEAST_ONCE
ACL = """
accounts:
  - accessKey: device
    secretKey: device-secret
    defaultTopicPerm: DENY
    topicPerms: ["sensors=PUB|SUB", "alerts=SUB", "cmd=PUB"]
  - accessKey: ops
    secretKey: ops-secret
    defaultTopicPerm: PUB|SUB
"""


def settings(tmp_path: Path, acl: str = ACL) -> Settings:
    path = tmp_path / "plain_acl.yml"
    path.write_text(acl, encoding="utf-8")
    return Settings.for_tests(
        acl={"file": str(path), "reload_interval_s": 0.05},
        mqtt={"users": {"legacy": hash_password("old-password", 1000)}},
    )


@pytest.mark.parametrize("level", [4, 5])
async def test_credentials_from_the_account_file(tmp_path: Path, log_sink: Any, level: int) -> None:
    async with running_server(settings(tmp_path)) as handle:
        address = handle.address
        ok, connack = await connect(address, "d1", level, username="device", password=b"device-secret")
        assert connack.reason_code == mq.ReasonCode.SUCCESS
        legacy, connack = await connect(address, "l1", level, username="legacy", password=b"old-password")
        assert connack.reason_code == mq.ReasonCode.SUCCESS  # the [mqtt] users file still accepts
        for username, password, refused in (
            ("device", b"wrong", mq.ReasonCode.BAD_USER_NAME_OR_PASSWORD),  # 0x86; 3.1.1 return code 4
            ("stranger", b"x", mq.ReasonCode.BAD_USER_NAME_OR_PASSWORD),
            (None, None, mq.ReasonCode.NOT_AUTHORIZED),  # 0x87; 3.1.1 return code 5
        ):
            client, connack = await connect(address, "x1", level, username=username, password=password)
            assert connack.reason_code == refused, (username, connack)
            assert await client.expect_eof() == []
            await client.aclose()
        await ok.aclose()
        await legacy.aclose()
    events = log_sink.named("auth.denied")
    assert [(e["protocol"], e["access_key"], e["reason"]) for e in events] == [
        ("mqtt", "device", "bad_signature"),
        ("mqtt", "stranger", "unknown_access_key"),
        ("mqtt", None, "no_access_key"),
    ]
    assert all(b"device-secret" not in line for line in log_sink.lines)


@pytest.mark.parametrize("level", [4, 5])
async def test_account_topic_permissions(tmp_path: Path, log_sink: Any, level: int) -> None:
    v5 = level == 5
    async with running_server(settings(tmp_path)) as handle:
        address = handle.address
        ops, _ = await connect(address, "ops-1", 5, username="ops", password=b"ops-secret")
        await ops.send(mq.Subscribe(1, (mq.SubscribeTopic("#", Q1),)))
        assert isinstance(await ops.receive(), mq.SubAck)
        dev, _ = await connect(address, "dev-1", level, username="device", password=b"device-secret")
        await dev.send(mq.Subscribe(1, (
            mq.SubscribeTopic("alerts/#", Q1),  # SUB
            mq.SubscribeTopic("cmd/dev-1", Q1),  # PUB only
            mq.SubscribeTopic("+/dev-1", Q1),  # reaches topics the account may not read
        )))
        suback = await dev.receive()
        assert isinstance(suback, mq.SubAck)
        refused = mq.ReasonCode.NOT_AUTHORIZED if v5 else mq.ReasonCode.UNSPECIFIED_ERROR  # 0x87 / 0x80
        assert suback.reason_codes == (mq.ReasonCode.GRANTED_QOS_1, refused, refused)
        await dev.send(mq.Publish("alerts/fire", b"no", Q1, packet_id=1))  # SUB only
        await dev.send(mq.Publish("sensors/dev-1/t", b"yes", Q1, packet_id=2))
        first, second = await dev.receive(), await dev.receive()
        assert first == mq.PubAck(1, mq.ReasonCode.NOT_AUTHORIZED if v5 else mq.ReasonCode.SUCCESS)
        assert second == mq.PubAck(2, mq.ReasonCode.SUCCESS)
        delivered = await receive_publish(ops)
        assert (delivered.topic, delivered.payload) == ("sensors/dev-1/t", b"yes")
        assert await arrivals(ops) == []
        counter = handle.state.metrics.auth_denied.labels("mqtt", "no_permission")
        assert counter._value.get() == 3
    details = [e["detail"] for e in log_sink.named("auth.denied")]
    assert details[0].startswith("SUBSCRIBE cmd/dev-1: No SUB permission for topic cmd")
    assert details[2].startswith("PUBLISH alerts/fire: No PUB permission for topic alerts")


async def test_a_reloaded_file_applies_to_new_connections(tmp_path: Path, log_sink: Any) -> None:
    async with running_server(settings(tmp_path)) as handle:
        address = handle.address
        rotated = ACL.replace("device-secret", "rotated-secret")
        (tmp_path / "plain_acl.yml").write_text(rotated, encoding="utf-8")
        await wait_until(lambda: log_sink.named("acl.reloaded"))
        old, connack = await connect(address, "d1", 4, username="device", password=b"device-secret")
        assert connack.reason_code == mq.ReasonCode.BAD_USER_NAME_OR_PASSWORD
        await old.aclose()
        new, connack = await connect(address, "d2", 4, username="device", password=b"rotated-secret")
        assert connack.reason_code == mq.ReasonCode.SUCCESS
        await new.aclose()


@pytest.mark.parametrize("level", [4, 5])
async def test_a_guessing_address_is_refused_unseen(tmp_path: Path, log_sink: Any, level: int) -> None:
    async with running_server(settings(tmp_path)) as handle:
        address = handle.address
        throttle = handle.state.acl.throttle
        for i in range(throttle.free_failures + 1):
            client, connack = await connect(address, f"g{i}", level, username="device", password=b"guess")
            assert connack.reason_code == mq.ReasonCode.BAD_USER_NAME_OR_PASSWORD
            await client.aclose()
        client, connack = await connect(address, "g-ok", level, username="device", password=b"device-secret")
        # Connection rate exceeded (0x9F); 3.1.1 has no such code: Server unavailable (3), "retry later"
        expected = mq.ReasonCode.CONNECTION_RATE_EXCEEDED if level == 5 else mq.ReasonCode.SERVER_UNAVAILABLE
        assert connack.reason_code == expected
        await client.aclose()
        assert handle.state.metrics.auth_denied.labels("mqtt", "throttled")._value.get() == 1
    assert len(log_sink.named("auth.denied")) == throttle.free_failures + 1  # throttled ones are not logged
