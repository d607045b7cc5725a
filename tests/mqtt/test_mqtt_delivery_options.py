"""MQTT delivery over loopback with a raw client: receive maximum, MQTT 5 delivery options (aliases,
retain handling, message expiry, packet size), RocketMQ interop, shared and slow subscribers, batching."""

from __future__ import annotations

from typing import Any

from mqproxy.codecs import mqtt as mq
from mqproxy.model.topics import LMQ_QUEUE_ID
from mqproxy.model.types import Message
from mqproxy.mqtt import delivery
from mqproxy.mqtt.mapping import lmq_name
from mqproxy.settings import Settings

from ..conftest import wait_until  # type: ignore[import-not-found]
from . import conftest as h  # type: ignore[import-not-found]

Q0, Q1, Q2 = mq.QoS.AT_MOST_ONCE, mq.QoS.AT_LEAST_ONCE, mq.QoS.EXACTLY_ONCE


async def test_receive_maximum_limits_inflight(server: Any) -> None:
    sub, _ = await h.connect(server.address, "rm", 5, properties=mq.Properties(receive_maximum=2))
    await h.subscribe(sub, ("rm", Q1))
    pub, _ = await h.connect(server.address, "p")
    for i in range(5):
        await pub.send(mq.Publish("rm", b"%d" % i, Q1, packet_id=i + 1))
        await pub.receive()
    first = [await h.receive_publish(sub, ack=False) for _ in range(2)]
    assert await h.arrivals(sub) == []
    await sub.send(mq.PubAck(first[0].packet_id or 0))
    third = await h.receive_publish(sub, ack=False)
    assert [p.payload for p in [*first, third]] == [b"0", b"1", b"2"]


async def test_mqtt5_topic_alias_expiry_user_properties_no_local(server: Any) -> None:
    sub, _ = await h.connect(server.address, "s5", 5)
    await client_subscribe_v5(sub)
    pub, _ = await h.connect(server.address, "p5", 5)
    props = mq.Properties(
        topic_alias=3, user_properties=(("a", "1"), ("a", "2")), content_type="t", message_expiry_interval=60
    )
    await pub.send(mq.Publish("v5/t", b"aliased", Q1, packet_id=1, properties=props))
    assert (await pub.receive()) == mq.PubAck(1)
    await pub.send(mq.Publish("", b"by-alias", Q1, packet_id=2, properties=mq.Properties(topic_alias=3)))
    assert (await pub.receive()) == mq.PubAck(2)
    got = [await h.receive_publish(sub) for _ in range(2)]
    assert [(p.topic, p.payload) for p in got] == [("v5/t", b"aliased"), ("v5/t", b"by-alias")]
    assert got[0].properties.user_properties == (("a", "1"), ("a", "2"))
    assert got[0].properties.content_type == "t"
    assert got[0].properties.message_expiry_interval in (59, 60)
    assert got[0].properties.subscription_identifiers == (9,)
    assert got[0].properties.topic_alias is None
    # no-local: the subscriber's own publish does not come back
    await sub.send(mq.Publish("v5/t", b"mine", Q0))
    assert await h.arrivals(sub) == []
    await pub.send(mq.Publish("", b"x", Q0, properties=mq.Properties(topic_alias=99)))
    (disconnect,) = await pub.expect_eof()
    assert isinstance(disconnect, mq.Disconnect)
    assert disconnect.reason_code == mq.ReasonCode.TOPIC_ALIAS_INVALID


async def client_subscribe_v5(client: h.RawClient) -> None:
    await client.send(
        mq.Subscribe(
            1, (mq.SubscribeTopic("v5/+", Q1, no_local=True),), mq.Properties(subscription_identifiers=(9,))
        )
    )
    ack = await client.receive()
    assert ack == mq.SubAck(1, (mq.ReasonCode.GRANTED_QOS_1,))


async def test_retain_handling_and_retain_as_published(server: Any) -> None:
    pub, _ = await h.connect(server.address, "p", 5)
    await pub.send(mq.Publish("rh/t", b"kept", Q0, retain=True))
    await pub.send(mq.PingReq())
    await pub.receive()
    sub, _ = await h.connect(server.address, "s", 5)
    await h.subscribe(
        sub, ("rh/t", Q0), retain_handling=mq.RetainHandling.DO_NOT_SEND, retain_as_published=True
    )
    await pub.send(mq.Publish("rh/t", b"live", Q0, retain=True))
    live = await h.receive_publish(sub)
    assert (live.payload, live.retain) == (b"live", True)
    await h.subscribe(
        sub, ("rh/t", Q0), packet_id=2, retain_handling=mq.RetainHandling.SEND_IF_NEW_SUBSCRIPTION
    )
    assert await h.arrivals(sub) == []
    await h.subscribe(sub, ("rh/t", Q0), packet_id=3)
    again = await h.receive_publish(sub)
    assert (again.payload, again.retain) == (b"live", True)


async def test_message_expiry_drops_stale_offline_messages(server: Any, monkeypatch: Any) -> None:
    sub, _ = await h.connect(
        server.address, "exp", 5, clean_start=False, properties=mq.Properties(session_expiry_interval=60)
    )
    await h.subscribe(sub, ("exp", Q1))
    await sub.send(mq.Disconnect())
    await sub.expect_eof()
    pub, _ = await h.connect(server.address, "p", 5)
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
    sub, connack = await h.connect(
        server.address, "exp", 5, clean_start=False, properties=mq.Properties(session_expiry_interval=60)
    )
    assert connack.session_present
    got = await h.receive_publish(sub)
    assert got.payload == b"long"
    assert got.properties.message_expiry_interval in (98, 99)


async def test_rocketmq_interop_both_directions(server: Any) -> None:
    backend = server.store
    sub, _ = await h.connect(server.address, "iot")
    await h.subscribe(sub, ("plant/+/temp", Q1), ("plant/7/temp", Q0))
    # RocketMQ producer → MQTT: send to the first-level topic, name the MQTT topic and its LMQs.
    properties = {"MQTT_TOPIC": "plant/7/temp"}
    targets = h.gateway_of(server).publisher.rocketmq_dispatch(properties)
    assert targets == (lmq_name("plant/7/temp"), lmq_name("plant/+/temp"))
    await backend.send(Message("plant", b"from-rocketmq", properties=properties, dispatch=targets))
    got = [await h.receive_publish(sub) for _ in range(2)]
    assert sorted((p.payload, p.qos) for p in got) == [(b"from-rocketmq", Q0), (b"from-rocketmq", Q1)]
    # MQTT → RocketMQ: the publish is one record in topic "plant", also indexed in the LMQs.
    pub, _ = await h.connect(server.address, "pub")
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


async def test_shared_subscription_splits_and_gives_back(server: Any, log_sink: Any) -> None:
    a, _ = await h.connect(server.address, "a", 5)
    b, _ = await h.connect(server.address, "b", 5, properties=mq.Properties(receive_maximum=1))
    plain, _ = await h.connect(server.address, "plain", 5)
    await h.subscribe(a, ("$share/g/sh/+", Q1))
    await h.subscribe(b, ("$share/g/sh/+", Q1))
    await h.subscribe(plain, ("sh/+", Q0))
    pub, _ = await h.connect(server.address, "p", 5)
    for i in range(10):
        await pub.send(mq.Publish("sh/x", b"%d" % i, Q1, packet_id=i + 1))
        await pub.receive()
    assert sorted([(await h.receive_publish(plain)).payload for _ in range(10)]) == sorted(
        b"%d" % i for i in range(10)
    )
    # b holds one message un-acked (receive maximum 1) and then disconnects: it goes to a.
    held = await h.receive_publish(b, ack=False)
    got_a = [await h.receive_publish(a) for _ in range(9)]
    await b.aclose()
    got_a.append(await h.receive_publish(a))
    assert sorted(p.payload for p in got_a) == sorted(b"%d" % i for i in range(10))
    assert held.payload in [p.payload for p in got_a]
    assert await h.arrivals(a) == []
    assert not log_sink.named("internal.error")


async def test_slow_consumer_is_disconnected_and_loses_nothing_stored(log_sink: Any) -> None:
    settings = Settings.for_tests(mqtt={"write_timeout_s": 0.5, "send_buffer_packets": 4})
    async with h.running_server(settings) as handle:
        slow, _ = await h.connect(handle.address, "slow", clean_start=False)
        await h.subscribe(slow, ("big", Q1))
        pub, _ = await h.connect(handle.address, "p")
        payload = b"x" * 60_000
        for _i in range(200):  # ~12 MB: far more than the socket buffers hold
            await pub.send(mq.Publish("big", payload, Q0))
        await pub.send(mq.PingReq())
        await pub.receive(wait_s=20)
        await wait_until(
            lambda: any(e.get("error") == "slow_consumer" for e in log_sink.named("conn.closed"))
        )
        await slow.aclose()
        again, connack = await h.connect(handle.address, "slow", clean_start=False)
        assert connack.session_present
        first = await h.receive_publish(again)
        assert first.payload == payload  # the backlog is still in the LMQ


async def test_server_to_client_topic_aliases(server: Any) -> None:
    sub, _ = await h.connect(server.address, "ta", 5, properties=mq.Properties(topic_alias_maximum=1))
    await h.subscribe(sub, ("ta/+", Q1))
    pub, _ = await h.connect(server.address, "p", 5)
    for topic in ("ta/a", "ta/a", "ta/b"):
        await pub.send(mq.Publish(topic, b"x", Q0))
    got = [await h.receive_publish(sub) for _ in range(3)]
    assert [(p.topic, p.properties.topic_alias) for p in got] == [("ta/a", 1), ("", 1), ("ta/b", None)]


async def test_client_maximum_packet_size_drops_oversized(server: Any) -> None:
    sub, _ = await h.connect(server.address, "small", 5, properties=mq.Properties(maximum_packet_size=64))
    await h.subscribe(sub, ("mp", Q1))
    pub, _ = await h.connect(server.address, "p", 5)
    await pub.send(mq.Publish("mp", b"x" * 100, Q1, packet_id=1))
    await pub.send(mq.Publish("mp", b"fits", Q1, packet_id=2))
    assert await pub.receive() == mq.PubAck(1)
    assert await pub.receive() == mq.PubAck(2)
    got = await h.receive_publish(sub)
    assert got.payload == b"fits"
    assert await h.arrivals(sub) == []


async def test_publish_run_in_one_read_is_batched_and_deduplicated(server: Any, log_sink: Any) -> None:
    sub, _ = await h.connect(server.address, "s")
    await h.subscribe(sub, ("run/#", Q2))
    pub, _ = await h.connect(server.address, "p")
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
    got = [await h.receive_publish(sub) for _ in range(102)]
    assert [p.payload for p in got if p.topic == "run/a"] == [b"%d" % i for i in range(100)]
    assert [p.payload for p in got if p.topic != "run/a"] == [b"q2", b"last"]
    assert await h.arrivals(sub) == []
    publishes = [e for e in log_sink.requests() if e["op"] == "PUBLISH" and e["client_id"] == "p"]
    assert len(publishes) == 104
    assert [e["status"] for e in publishes].count("DUPLICATE") == 1


async def test_pubacks_in_one_read_are_one_request_run(server: Any, log_sink: Any) -> None:
    sub, _ = await h.connect(server.address, "acker", 5)
    await h.subscribe(sub, ("acks", Q1))
    pub, _ = await h.connect(server.address, "p")
    for i in range(5):
        await pub.send(mq.Publish("acks", b"%d" % i, Q1, packet_id=i + 1))
        await pub.receive()
    got = [await h.receive_publish(sub, ack=False) for _ in range(5)]
    ids = [p.packet_id or 0 for p in got] + [999]  # the last one was never sent
    await sub.send_raw(b"".join(mq.encode(mq.PubAck(i), 5) for i in ids))
    await wait_until(lambda: any(e["op"] == "PUBACK" for e in log_sink.named("request.run")))
    (run,) = [e for e in log_sink.named("request.run") if e["op"] == "PUBACK"]
    assert (run["count"], run["errors"], run["code"], run["client_id"]) == (6, 1, 4, "acker")
    assert run["statuses"] == ["SUCCESS"] * 5 + ["PACKET_IDENTIFIER_NOT_FOUND"]
    assert run["topics"] == [None] * 6
    assert [e["status"] for e in log_sink.requests() if e["op"] == "PUBACK"] == run["statuses"]
    await sub.send(mq.PingReq())
    assert isinstance(await sub.receive(), mq.PingResp)  # acknowledged: nothing is sent again
