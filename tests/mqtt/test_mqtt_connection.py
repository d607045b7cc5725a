"""The MQTT gateway over loopback with a raw client: handshake, QoS flows, bad input, sessions."""

from __future__ import annotations

import random
from typing import Any

import trio
import trio.testing

from mqproxy.codecs import mqtt as mq
from mqproxy.model.topics import LMQ_QUEUE_ID
from mqproxy.model.types import Message
from mqproxy.mqtt import delivery
from mqproxy.mqtt.config import MqttConfig
from mqproxy.mqtt.gateway import Gateway
from mqproxy.mqtt.mapping import lmq_name
from mqproxy.mqtt.store import FacadeStore
from mqproxy.settings import Settings

from ..conftest import wait_until  # type: ignore[import-not-found]
from .conftest import (  # type: ignore[import-not-found]
    RawClient,
    arrivals,
    connect,
    gateway_of,
    raw_client,
    receive_publish,
    running_server,
    set_gateway,
    subscribe,
)

Q0, Q1, Q2 = mq.QoS.AT_MOST_ONCE, mq.QoS.AT_LEAST_ONCE, mq.QoS.EXACTLY_ONCE


async def test_connect_publish_subscribe_all_qos(server: Any) -> None:
    sub, connack = await connect(server.address, "sub")
    assert connack == mq.Connack(False, mq.ReasonCode.SUCCESS)
    ack = await subscribe(sub, ("a/b", Q2), ("a/#", Q1))
    assert ack.reason_codes == (mq.ReasonCode.GRANTED_QOS_2, mq.ReasonCode.GRANTED_QOS_1)
    pub, _ = await connect(server.address, "pub")
    await pub.send(mq.Publish("a/b", b"q0"))
    await pub.send(mq.Publish("a/b", b"q1", Q1, packet_id=7))
    assert await pub.receive() == mq.PubAck(7)
    await pub.send(mq.Publish("a/b", b"q2", Q2, packet_id=8))
    assert await pub.receive() == mq.PubRec(8)
    await pub.send(
        mq.Publish("a/b", b"q2", Q2, packet_id=8, dup=True)
    )  # duplicate before PUBREL: not stored twice
    assert await pub.receive() == mq.PubRec(8)
    await pub.send(mq.PubRel(8))
    assert await pub.receive() == mq.PubComp(8)
    got = [await receive_publish(sub) for _ in range(6)]  # one copy per matching subscription
    by_payload = sorted((p.payload, p.qos) for p in got)
    assert by_payload == [(b"q0", Q0), (b"q0", Q0), (b"q1", Q1), (b"q1", Q1), (b"q2", Q1), (b"q2", Q2)]
    assert all(p.topic == "a/b" and not p.retain and not p.dup for p in got)
    await pub.send(mq.PingReq())
    assert await pub.receive() == mq.PingResp()
    await sub.send(mq.Unsubscribe(2, ("a/#", "nope")))
    assert await sub.receive() == mq.UnsubAck(2)
    await pub.send(mq.Publish("a/b", b"after", Q1, packet_id=9))
    assert await pub.receive() == mq.PubAck(9)
    only = await receive_publish(sub)
    assert only.payload == b"after"
    assert only.qos == Q1
    assert await arrivals(sub) == []
    await pub.send(mq.Disconnect())
    assert await pub.expect_eof() == []
    await sub.aclose()


async def test_mqtt5_unsubscribe_reason_codes_and_connack_properties(server: Any) -> None:
    client, connack = await connect(server.address, "v5", 5)
    assert connack.reason_code == mq.ReasonCode.SUCCESS
    assert connack.properties.receive_maximum == 64
    assert connack.properties.topic_alias_maximum == 16
    assert connack.properties.maximum_packet_size == 1024 * 1024
    await subscribe(client, ("x/+", Q1))
    await client.send(mq.Unsubscribe(2, ("x/+", "y")))
    assert await client.receive() == mq.UnsubAck(
        2, (mq.ReasonCode.SUCCESS, mq.ReasonCode.NO_SUBSCRIPTION_EXISTED)
    )
    await client.aclose()


async def test_wildcards_and_dollar_topics(server: Any) -> None:
    sub, _ = await connect(server.address, "wild")
    await subscribe(sub, ("+/+", Q0), ("$SYS/#", Q0))
    pub, _ = await connect(server.address, "p")
    await pub.send(mq.Publish("$SYS/x", b"sys"))
    await pub.send(mq.Publish("a/b", b"ab"))
    await pub.send(mq.Publish("a/b/c", b"abc"))  # matches neither
    got = [await receive_publish(sub) for _ in range(2)]
    assert sorted((p.topic, p.payload) for p in got) == [("$SYS/x", b"sys"), ("a/b", b"ab")]
    assert await arrivals(sub) == []


async def test_retained_store_replace_clear(server: Any) -> None:
    pub, _ = await connect(server.address, "p")
    await pub.send(mq.Publish("r/1", b"first", Q1, retain=True, packet_id=1))
    await pub.receive()
    await pub.send(mq.Publish("r/1", b"second", Q1, retain=True, packet_id=2))
    await pub.receive()
    await pub.send(mq.Publish("r/2", b"two", Q0, retain=True))
    await pub.send(mq.Publish("r/3", b"three", Q0, retain=True))
    await pub.send(mq.Publish("r/3", b"", Q0, retain=True))  # clears
    await pub.send(mq.PingReq())
    await pub.receive()
    sub, _ = await connect(server.address, "s")
    await subscribe(sub, ("r/+", Q1))
    got = sorted(
        [(p.topic, p.payload, p.retain, p.qos) for p in [await receive_publish(sub) for _ in range(2)]]
    )
    assert got == [("r/1", b"second", True, Q1), ("r/2", b"two", True, Q0)]
    assert await arrivals(sub) == []
    # A live publish with RETAIN reaches existing subscribers with RETAIN cleared (3.1.1).
    await pub.send(mq.Publish("r/2", b"live", Q0, retain=True))
    live = await receive_publish(sub)
    assert (live.payload, live.retain) == (b"live", False)


async def test_bad_input_closes_mqtt311(server: Any) -> None:
    cases: list[bytes] = [
        # (a PUBLISH before any CONNECT is not even sniffed as MQTT: the sniffer rejects it)
        bytes.fromhex("100d00044d51545404020000000163") * 2,  # second CONNECT
        bytes.fromhex("100d00044d51545404020000000163") + bytes.fromhex("36050001610001"),  # QoS 3
        bytes.fromhex("100d00044d51545404020000000163") + bytes.fromhex("32ffffffff01"),  # length > 4 bytes
        bytes.fromhex("100d00044d51545404020000000163") + bytes.fromhex("32050001610000"),  # packet id 0
        bytes.fromhex("100d00044d51545404020000000163") + bytes.fromhex("30040002612b"),  # wildcard in topic
        bytes.fromhex("100d00044d51545404020000000163") + bytes.fromhex("30040002ff61"),  # invalid UTF-8
        bytes.fromhex("100d00044d51545404020000000163") + bytes.fromhex("300400026100"),  # U+0000
        bytes.fromhex("100d00044d51545404020000000163") + bytes.fromhex("82020001"),  # SUBSCRIBE, no filter
    ]
    for data in cases:
        async with raw_client(server.address) as client:
            await client.send_raw(data)
            got = await client.expect_eof()
            assert all(isinstance(p, mq.Connack) and p.reason_code == mq.ReasonCode.SUCCESS for p in got), (
                data,
                got,
            )


async def test_bad_input_mqtt5_gets_disconnect_reason(server: Any) -> None:
    connect5 = bytes.fromhex("100e00044d5154540502000000000163")
    cases = {
        "32ffffffff01": mq.ReasonCode.MALFORMED_PACKET,
        "30050002612b00": mq.ReasonCode.TOPIC_NAME_INVALID,
        "36050001610001": mq.ReasonCode.MALFORMED_PACKET,
        # PUBLISH with remaining length 2 MiB: over the server's maximum packet size
        "3080808001": mq.ReasonCode.PACKET_TOO_LARGE,
    }
    for tail, code in cases.items():
        async with raw_client(server.address) as client:
            client.level = 5
            client.decoder = type(client.decoder)(1 << 24, protocol_level=5)
            await client.send_raw(connect5)
            assert isinstance(await client.receive(), mq.Connack)
            await client.send_raw(bytes.fromhex(tail))
            got = await client.expect_eof()
            assert [type(p) for p in got] == [mq.Disconnect], tail
            assert got[0].reason_code == code, tail


async def test_keepalive_timeout_publishes_will(
    server: Any, log_sink: Any, steered_clock: trio.testing.MockClock
) -> None:
    watcher, _ = await connect(server.address, "watcher")
    await subscribe(watcher, ("will/#", Q1))
    dying, _ = await connect(server.address, "dying", keep_alive=1, will=mq.Will("will/dying", b"gone", Q1))
    await trio.testing.wait_all_tasks_blocked()  # the server waits for the next packet from "dying"
    steered_clock.jump(1.5)  # 1.5 x the keep alive, and nothing came
    assert await dying.expect_eof() == []
    will = await receive_publish(watcher)
    assert (will.topic, will.payload, will.qos) == ("will/dying", b"gone", Q1)
    closed = [e for e in log_sink.named("conn.closed") if e.get("error") == "keepalive_timeout"]
    assert closed


async def test_normal_disconnect_discards_will_abrupt_close_publishes(server: Any) -> None:
    watcher, _ = await connect(server.address, "w")
    await subscribe(watcher, ("will/+", Q0))
    polite, _ = await connect(server.address, "polite", will=mq.Will("will/polite", b"x"))
    await polite.send(mq.Disconnect())
    await polite.expect_eof()
    rude, _ = await connect(server.address, "rude", will=mq.Will("will/rude", b"y", retain=True))
    await rude.aclose()
    will = await receive_publish(watcher)
    assert will.topic == "will/rude"
    assert await arrivals(watcher) == []
    late, _ = await connect(server.address, "late")
    await subscribe(late, ("will/rude", Q0))
    retained = await receive_publish(late)
    assert (retained.payload, retained.retain) == (b"y", True)


async def test_takeover_mqtt5_disconnects_old_with_0x8e(server: Any, log_sink: Any) -> None:
    old, _ = await connect(server.address, "same", 5)
    new, connack = await connect(server.address, "same", 5)
    assert connack.reason_code == mq.ReasonCode.SUCCESS
    (disconnect,) = await old.expect_eof()
    assert isinstance(disconnect, mq.Disconnect)
    assert disconnect.reason_code == mq.ReasonCode.SESSION_TAKEN_OVER
    assert disconnect.properties.reason_string
    await new.send(mq.PingReq())
    assert await new.receive() == mq.PingResp()
    assert any(e.get("error") == "session_taken_over" for e in log_sink.named("conn.closed"))


async def test_persistent_session_offline_messages_and_redelivery(server: Any) -> None:
    sub, connack = await connect(server.address, "durable", clean_start=False)
    assert not connack.session_present
    await subscribe(sub, ("d/#", Q2), ("d/x", Q1), packet_id=3)
    await sub.send(mq.Disconnect())
    await sub.expect_eof()
    pub, _ = await connect(server.address, "p")
    for i in range(3):
        await pub.send(mq.Publish("d/x", b"m%d" % i, Q1, packet_id=i + 1))
        await pub.receive()
    await pub.send(mq.Publish("d/y", b"q0", Q0))
    await pub.send(mq.PingReq())
    await pub.receive()
    sub, connack = await connect(server.address, "durable", clean_start=False)
    assert connack.session_present
    first = [await receive_publish(sub, ack=False) for _ in range(7)]
    assert sorted(p.payload for p in first) == sorted([b"m0", b"m1", b"m2"] * 2 + [b"q0"])
    await sub.aclose()  # nothing acked: everything QoS 1/2 comes again with DUP
    sub, connack = await connect(server.address, "durable", clean_start=False)
    assert connack.session_present
    again = [await receive_publish(sub) for _ in range(6)]
    assert all(p.dup for p in again)
    assert sorted(p.payload for p in again) == sorted([b"m0", b"m1", b"m2"] * 2)
    await sub.send(mq.Disconnect())
    await sub.expect_eof()
    sub, connack = await connect(server.address, "durable", clean_start=True)
    assert not connack.session_present
    assert await arrivals(sub) == []


async def test_qos2_pubrel_is_resent_after_reconnect(server: Any) -> None:
    sub, _ = await connect(server.address, "q2", clean_start=False)
    await subscribe(sub, ("q2/t", Q2))
    pub, _ = await connect(server.address, "p")
    await pub.send(mq.Publish("q2/t", b"once", Q2, packet_id=1))
    assert await pub.receive() == mq.PubRec(1)
    await pub.send(mq.PubRel(1))
    await pub.receive()
    publish = await receive_publish(sub, ack=False)
    assert publish.packet_id is not None
    await sub.send(mq.PubRec(publish.packet_id))
    assert await sub.receive() == mq.PubRel(publish.packet_id)
    await sub.aclose()
    sub, connack = await connect(server.address, "q2", clean_start=False)
    assert connack.session_present
    assert await sub.receive() == mq.PubRel(publish.packet_id)  # not the PUBLISH again
    await sub.send(mq.PubComp(publish.packet_id))
    assert await arrivals(sub) == []


async def test_receive_maximum_limits_inflight(server: Any) -> None:
    sub, _ = await connect(server.address, "rm", 5, properties=mq.Properties(receive_maximum=2))
    await subscribe(sub, ("rm", Q1))
    pub, _ = await connect(server.address, "p")
    for i in range(5):
        await pub.send(mq.Publish("rm", b"%d" % i, Q1, packet_id=i + 1))
        await pub.receive()
    first = [await receive_publish(sub, ack=False) for _ in range(2)]
    assert await arrivals(sub) == []
    await sub.send(mq.PubAck(first[0].packet_id or 0))
    third = await receive_publish(sub, ack=False)
    assert [p.payload for p in [*first, third]] == [b"0", b"1", b"2"]


async def test_mqtt5_topic_alias_expiry_user_properties_no_local(server: Any) -> None:
    sub, _ = await connect(server.address, "s5", 5)
    await client_subscribe_v5(sub)
    pub, _ = await connect(server.address, "p5", 5)
    props = mq.Properties(
        topic_alias=3, user_properties=(("a", "1"), ("a", "2")), content_type="t", message_expiry_interval=60
    )
    await pub.send(mq.Publish("v5/t", b"aliased", Q1, packet_id=1, properties=props))
    assert (await pub.receive()) == mq.PubAck(1)
    await pub.send(mq.Publish("", b"by-alias", Q1, packet_id=2, properties=mq.Properties(topic_alias=3)))
    assert (await pub.receive()) == mq.PubAck(2)
    got = [await receive_publish(sub) for _ in range(2)]
    assert [(p.topic, p.payload) for p in got] == [("v5/t", b"aliased"), ("v5/t", b"by-alias")]
    assert got[0].properties.user_properties == (("a", "1"), ("a", "2"))
    assert got[0].properties.content_type == "t"
    assert got[0].properties.message_expiry_interval in (59, 60)
    assert got[0].properties.subscription_identifiers == (9,)
    assert got[0].properties.topic_alias is None
    # no-local: the subscriber's own publish does not come back
    await sub.send(mq.Publish("v5/t", b"mine", Q0))
    assert await arrivals(sub) == []
    await pub.send(mq.Publish("", b"x", Q0, properties=mq.Properties(topic_alias=99)))
    (disconnect,) = await pub.expect_eof()
    assert isinstance(disconnect, mq.Disconnect)
    assert disconnect.reason_code == mq.ReasonCode.TOPIC_ALIAS_INVALID


async def client_subscribe_v5(client: RawClient) -> None:
    await client.send(
        mq.Subscribe(
            1, (mq.SubscribeTopic("v5/+", Q1, no_local=True),), mq.Properties(subscription_identifiers=(9,))
        )
    )
    ack = await client.receive()
    assert ack == mq.SubAck(1, (mq.ReasonCode.GRANTED_QOS_1,))


async def test_retain_handling_and_retain_as_published(server: Any) -> None:
    pub, _ = await connect(server.address, "p", 5)
    await pub.send(mq.Publish("rh/t", b"kept", Q0, retain=True))
    await pub.send(mq.PingReq())
    await pub.receive()
    sub, _ = await connect(server.address, "s", 5)
    await subscribe(
        sub, ("rh/t", Q0), retain_handling=mq.RetainHandling.DO_NOT_SEND, retain_as_published=True
    )
    await pub.send(mq.Publish("rh/t", b"live", Q0, retain=True))
    live = await receive_publish(sub)
    assert (live.payload, live.retain) == (b"live", True)
    await subscribe(
        sub, ("rh/t", Q0), packet_id=2, retain_handling=mq.RetainHandling.SEND_IF_NEW_SUBSCRIPTION
    )
    assert await arrivals(sub) == []
    await subscribe(sub, ("rh/t", Q0), packet_id=3)
    again = await receive_publish(sub)
    assert (again.payload, again.retain) == (b"live", True)


async def test_message_expiry_drops_stale_offline_messages(server: Any, monkeypatch: Any) -> None:
    sub, _ = await connect(
        server.address, "exp", 5, clean_start=False, properties=mq.Properties(session_expiry_interval=60)
    )
    await subscribe(sub, ("exp", Q1))
    await sub.send(mq.Disconnect())
    await sub.expect_eof()
    pub, _ = await connect(server.address, "p", 5)
    await pub.send(
        mq.Publish("exp", b"short", Q1, packet_id=1, properties=mq.Properties(message_expiry_interval=1))
    )
    await pub.send(
        mq.Publish("exp", b"long", Q1, packet_id=2, properties=mq.Properties(message_expiry_interval=100))
    )
    await pub.receive()
    await pub.receive()
    real_now_ms = delivery.now_ms
    monkeypatch.setattr(delivery, "now_ms", lambda: real_now_ms() + 1100)  # delivered 1.1 s later
    sub, connack = await connect(
        server.address, "exp", 5, clean_start=False, properties=mq.Properties(session_expiry_interval=60)
    )
    assert connack.session_present
    got = await receive_publish(sub)
    assert got.payload == b"long"
    assert got.properties.message_expiry_interval in (98, 99)


async def test_session_expiry_interval_ends_session(
    server: Any, steered_clock: trio.testing.MockClock
) -> None:
    sub, _ = await connect(
        server.address, "short", 5, clean_start=False, properties=mq.Properties(session_expiry_interval=1)
    )
    await subscribe(sub, ("se/+", Q1))
    await sub.send(mq.Disconnect())
    await sub.expect_eof()
    gateway = gateway_of(server)
    assert "short" in gateway.sessions
    assert "se/+" in gateway.index
    steered_clock.jump(1)  # the session expiry interval
    await wait_until(lambda: "short" not in gateway.sessions)  # the server's timer task ends it
    assert "se/+" not in gateway.index
    _, connack = await connect(server.address, "short", 5, clean_start=False)
    assert not connack.session_present


async def test_will_delay_cancelled_by_reconnect(server: Any, steered_clock: trio.testing.MockClock) -> None:
    watcher, _ = await connect(server.address, "w", 5)
    await subscribe(watcher, ("wd/#", Q0))
    will = mq.Will("wd/x", b"late", properties=mq.Properties(will_delay_interval=1))
    kw: dict[str, Any] = dict(
        clean_start=False, properties=mq.Properties(session_expiry_interval=30), will=will
    )
    first, _ = await connect(server.address, "wd", 5, **kw)
    await first.aclose()
    second, connack = await connect(server.address, "wd", 5, **kw)
    assert connack.session_present
    await trio.testing.wait_all_tasks_blocked()  # the first connection has ended and scheduled its will
    steered_clock.jump(1)  # the will delay is over
    assert await arrivals(watcher) == []
    await second.aclose()
    await trio.testing.wait_all_tasks_blocked()  # the second's will is scheduled
    steered_clock.jump(1)
    got = await receive_publish(watcher)
    assert got.payload == b"late"


async def test_rocketmq_interop_both_directions(server: Any) -> None:
    backend = server.store
    sub, _ = await connect(server.address, "iot")
    await subscribe(sub, ("plant/+/temp", Q1), ("plant/7/temp", Q0))
    # RocketMQ producer → MQTT: send to the first-level topic, name the MQTT topic and its LMQs.
    properties = {"MQTT_TOPIC": "plant/7/temp"}
    targets = gateway_of(server).rocketmq_dispatch(properties)
    assert targets == (lmq_name("plant/7/temp"), lmq_name("plant/+/temp"))
    await backend.send(Message("plant", b"from-rocketmq", properties=properties, dispatch=targets))
    got = [await receive_publish(sub) for _ in range(2)]
    assert sorted((p.payload, p.qos) for p in got) == [(b"from-rocketmq", Q0), (b"from-rocketmq", Q1)]
    # MQTT → RocketMQ: the publish is one record in topic "plant", also indexed in the LMQs.
    pub, _ = await connect(server.address, "pub")
    await pub.send(mq.Publish("plant/9/temp", b"21.5", Q1, packet_id=1))
    await pub.receive()
    found = []
    for queue_id in range(4):
        result = await backend.pull("plant", queue_id, 0, 32)
        found += [m for m in result.messages if m.body == b"21.5"]
    assert len(found) == 1
    assert found[0].properties["MQTT_TOPIC"] == "plant/9/temp"
    lmq = await backend.pull(lmq_name("plant/9/temp"), LMQ_QUEUE_ID, 0, 32)
    assert [m.commitlog_offset for m in lmq.messages] == [found[0].commitlog_offset]


async def test_persistent_session_survives_restart(tmp_path: Any, log_sink: Any) -> None:
    settings = Settings.for_tests(tmp_path)
    async with running_server(settings) as handle:
        sub, _ = await connect(handle.address, "dev", clean_start=False)
        await subscribe(sub, ("home/+/temp", Q1), ("home/k/temp", Q2))
        await sub.send(mq.Disconnect())
        await sub.expect_eof()
        pub, _ = await connect(handle.address, "p")
        await pub.send(mq.Publish("home/k/temp", b"offline", Q1, packet_id=1))
        await pub.receive()
        await pub.send(mq.Publish("home/r", b"kept", Q0, retain=True))
        await pub.send(mq.PingReq())
        await pub.receive()
        await pub.aclose()
    async with running_server(settings) as handle:
        sub, connack = await connect(handle.address, "dev", clean_start=False)
        assert connack.session_present
        got = [await receive_publish(sub) for _ in range(2)]
        assert sorted((p.payload, p.qos) for p in got) == [(b"offline", Q1), (b"offline", Q1)]
        late, _ = await connect(handle.address, "late")
        await subscribe(late, ("home/#", Q0))
        retained = await receive_publish(late)
        assert (retained.topic, retained.payload, retained.retain) == ("home/r", b"kept", True)
        # the acked offsets were committed: a third start delivers nothing old
        await sub.send(mq.Disconnect())
        await sub.expect_eof()
    async with running_server(settings) as handle:
        sub, connack = await connect(handle.address, "dev", clean_start=False)
        assert connack.session_present
        assert await arrivals(sub) == []


async def test_drain_sends_server_shutting_down(log_sink: Any) -> None:
    async with running_server(Settings.for_tests()) as handle:
        client, _ = await connect(handle.address, "d", 5)
        handle.stop("test")
        (disconnect,) = await client.expect_eof()
        assert isinstance(disconnect, mq.Disconnect)
        assert disconnect.reason_code == mq.ReasonCode.SERVER_SHUTTING_DOWN


async def test_shared_subscription_splits_and_gives_back(server: Any, log_sink: Any) -> None:
    a, _ = await connect(server.address, "a", 5)
    b, _ = await connect(server.address, "b", 5, properties=mq.Properties(receive_maximum=1))
    plain, _ = await connect(server.address, "plain", 5)
    await subscribe(a, ("$share/g/sh/+", Q1))
    await subscribe(b, ("$share/g/sh/+", Q1))
    await subscribe(plain, ("sh/+", Q0))
    pub, _ = await connect(server.address, "p", 5)
    for i in range(10):
        await pub.send(mq.Publish("sh/x", b"%d" % i, Q1, packet_id=i + 1))
        await pub.receive()
    assert sorted([(await receive_publish(plain)).payload for _ in range(10)]) == sorted(
        b"%d" % i for i in range(10)
    )
    # b holds one message un-acked (receive maximum 1) and then disconnects: it goes to a.
    held = await receive_publish(b, ack=False)
    got_a = [await receive_publish(a) for _ in range(9)]
    await b.aclose()
    got_a.append(await receive_publish(a))
    assert sorted(p.payload for p in got_a) == sorted(b"%d" % i for i in range(10))
    assert held.payload in [p.payload for p in got_a]
    assert await arrivals(a) == []
    assert not log_sink.named("internal.error")


async def test_slow_consumer_is_disconnected_and_loses_nothing_stored(log_sink: Any) -> None:
    settings = Settings.for_tests(mqtt={"write_timeout_s": 0.5, "send_buffer_packets": 4})
    async with running_server(settings) as handle:
        slow, _ = await connect(handle.address, "slow", clean_start=False)
        await subscribe(slow, ("big", Q1))
        pub, _ = await connect(handle.address, "p")
        payload = b"x" * 60_000
        for _i in range(200):  # ~12 MB: far more than the socket buffers hold
            await pub.send(mq.Publish("big", payload, Q0))
        await pub.send(mq.PingReq())
        await pub.receive(wait_s=20)
        await wait_until(
            lambda: any(e.get("error") == "slow_consumer" for e in log_sink.named("conn.closed"))
        )
        await slow.aclose()
        again, connack = await connect(handle.address, "slow", clean_start=False)
        assert connack.session_present
        first = await receive_publish(again)
        assert first.payload == payload  # the backlog is still in the LMQ


async def test_connect_refusals_get_connack(server: Any) -> None:
    client, connack = await connect(server.address, "", 4, clean_start=False)
    assert connack.reason_code == mq.ReasonCode.CLIENT_IDENTIFIER_NOT_VALID  # 3.1.1 return code 2 on the wire
    assert await client.expect_eof() == []
    client, connack = await connect(server.address, "", 5)
    assert connack.reason_code == mq.ReasonCode.SUCCESS
    assert connack.properties.assigned_client_identifier
    client, connack = await connect(
        server.address, "q", 5, will=mq.Will("w", b"", mq.QoS.EXACTLY_ONCE), keep_alive=0
    )
    assert connack.reason_code == mq.ReasonCode.SUCCESS


async def test_server_maximum_qos_and_refused_filters(server: Any) -> None:
    state = server.state
    set_gateway(
        server,
        Gateway(
            FacadeStore(state.broker), MqttConfig(maximum_qos=1, deny_subscribe=("secret/#",)), state.draining
        ),
    )
    client, connack = await connect(server.address, "mq", 5)
    assert connack.properties.maximum_qos == 1
    ack = await subscribe(client, ("ok/+", Q2), ("secret/#", Q0))
    assert ack.reason_codes == (mq.ReasonCode.GRANTED_QOS_1, mq.ReasonCode.NOT_AUTHORIZED)
    await client.send(mq.Publish("ok/x", b"too high", Q2, packet_id=1))
    (disconnect,) = await client.expect_eof()
    assert isinstance(disconnect, mq.Disconnect)
    assert disconnect.reason_code == mq.ReasonCode.QOS_NOT_SUPPORTED
    old, _ = await connect(server.address, "mq3", 4)
    ack = await subscribe(old, ("secret/#", Q0))
    assert ack.reason_codes == (mq.ReasonCode.UNSPECIFIED_ERROR,)  # 0x80 on the 3.1.1 wire


async def test_garbage_after_connect_never_crashes(server: Any, log_sink: Any) -> None:
    rng = random.Random(1234)
    heads = [0x30, 0x32, 0x34, 0x3B, 0x40, 0x50, 0x62, 0x70, 0x82, 0xA2, 0xC0, 0xE0, 0xF0, 0x10, 0x00]
    for level in (4, 5):
        for _ in range(20):
            body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
            data = bytes([rng.choice(heads), len(body)]) + body
            client, _ = await connect(server.address, "fuzz", level)
            await client.send_raw(data)
            await client.send(mq.PingReq())
            try:
                while True:  # the server either answers the PINGREQ or closes; it never hangs or crashes
                    packet = await client.receive(wait_s=2)
                    if isinstance(packet, mq.PingResp):
                        break
            except (EOFError, trio.BrokenResourceError):
                pass
            await client.aclose()
    assert not log_sink.named("internal.error")


async def test_server_to_client_topic_aliases(server: Any) -> None:
    sub, _ = await connect(server.address, "ta", 5, properties=mq.Properties(topic_alias_maximum=1))
    await subscribe(sub, ("ta/+", Q1))
    pub, _ = await connect(server.address, "p", 5)
    for topic in ("ta/a", "ta/a", "ta/b"):
        await pub.send(mq.Publish(topic, b"x", Q0))
    got = [await receive_publish(sub) for _ in range(3)]
    assert [(p.topic, p.properties.topic_alias) for p in got] == [("ta/a", 1), ("", 1), ("ta/b", None)]


async def test_client_maximum_packet_size_drops_oversized(server: Any) -> None:
    sub, _ = await connect(server.address, "small", 5, properties=mq.Properties(maximum_packet_size=64))
    await subscribe(sub, ("mp", Q1))
    pub, _ = await connect(server.address, "p", 5)
    await pub.send(mq.Publish("mp", b"x" * 100, Q1, packet_id=1))
    await pub.send(mq.Publish("mp", b"fits", Q1, packet_id=2))
    assert await pub.receive() == mq.PubAck(1)
    assert await pub.receive() == mq.PubAck(2)
    got = await receive_publish(sub)
    assert got.payload == b"fits"
    assert await arrivals(sub) == []


async def test_publish_run_in_one_read_is_batched_and_deduplicated(server: Any, log_sink: Any) -> None:
    sub, _ = await connect(server.address, "s")
    await subscribe(sub, ("run/#", Q2))
    pub, _ = await connect(server.address, "p")
    burst = [mq.Publish("run/a", b"%d" % i, Q1, packet_id=i + 1) for i in range(100)]
    burst += [
        mq.Publish("run/b", b"q2", Q2, packet_id=500),
        mq.Publish("run/b", b"q2", Q2, packet_id=500, dup=True),
    ]
    burst += [mq.Publish("other/x", b"elsewhere", Q0), mq.Publish("run/c", b"last", Q1, packet_id=501)]
    await pub.send_raw(b"".join(mq.encode(p, 4) for p in burst))
    acks = [await pub.receive() for _ in range(103)]
    assert acks == [mq.PubAck(i + 1) for i in range(100)] + [mq.PubRec(500), mq.PubRec(500), mq.PubAck(501)]
    await pub.send(mq.PubRel(500))
    assert await pub.receive() == mq.PubComp(500)
    got = [await receive_publish(sub) for _ in range(102)]
    assert [p.payload for p in got if p.topic == "run/a"] == [b"%d" % i for i in range(100)]
    assert [p.payload for p in got if p.topic != "run/a"] == [b"q2", b"last"]
    assert await arrivals(sub) == []
    publishes = [e for e in log_sink.named("request") if e["op"] == "PUBLISH" and e["client_id"] == "p"]
    assert len(publishes) == 104
    assert [e["status"] for e in publishes].count("DUPLICATE") == 1
