"""The MQTT gateway over loopback with a raw client: handshake, subscriptions, retained messages, bad
input and refused CONNECTs."""

from __future__ import annotations

import random
from typing import Any

import trio
import trio.testing

from mqproxy.codecs import mqtt as mq
from mqproxy.mqtt.config import MqttConfig
from mqproxy.mqtt.gateway import Gateway
from mqproxy.mqtt.store import FacadeStore
from mqproxy.settings import Settings

from ..proxy.conftest import running_server  # type: ignore[import-not-found]
from . import conftest as h  # type: ignore[import-not-found]

Q0, Q1, Q2 = mq.QoS.AT_MOST_ONCE, mq.QoS.AT_LEAST_ONCE, mq.QoS.EXACTLY_ONCE


async def test_connect_publish_subscribe_all_qos(server: Any) -> None:
    sub, connack = await h.connect(server.address, "sub")
    assert connack == mq.Connack(False, mq.ReasonCode.SUCCESS)
    ack = await h.subscribe(sub, ("a/b", Q2), ("a/#", Q1))
    assert ack.reason_codes == (mq.ReasonCode.GRANTED_QOS_2, mq.ReasonCode.GRANTED_QOS_1)
    pub, _ = await h.connect(server.address, "pub")
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
    got = [await h.receive_publish(sub) for _ in range(6)]  # one copy per matching subscription
    by_payload = sorted((p.payload, p.qos) for p in got)
    assert by_payload == [(b"q0", Q0), (b"q0", Q0), (b"q1", Q1), (b"q1", Q1), (b"q2", Q1), (b"q2", Q2)]
    assert all(p.topic == "a/b" and not p.retain and not p.dup for p in got)
    await pub.send(mq.PingReq())
    assert await pub.receive() == mq.PingResp()
    await sub.send(mq.Unsubscribe(2, ("a/#", "nope")))
    assert await sub.receive() == mq.UnsubAck(2)
    await pub.send(mq.Publish("a/b", b"after", Q1, packet_id=9))
    assert await pub.receive() == mq.PubAck(9)
    only = await h.receive_publish(sub)
    assert only.payload == b"after"
    assert only.qos == Q1
    assert await h.arrivals(sub) == []
    await pub.send(mq.Disconnect())
    assert await pub.expect_eof() == []
    await sub.aclose()


async def test_mqtt5_unsubscribe_reason_codes_and_connack_properties(server: Any) -> None:
    client, connack = await h.connect(server.address, "v5", 5)
    assert connack.reason_code == mq.ReasonCode.SUCCESS
    assert connack.properties.receive_maximum == 64
    assert connack.properties.topic_alias_maximum == 16
    assert connack.properties.maximum_packet_size == 1024 * 1024
    await h.subscribe(client, ("x/+", Q1))
    await client.send(mq.Unsubscribe(2, ("x/+", "y")))
    assert await client.receive() == mq.UnsubAck(
        2, (mq.ReasonCode.SUCCESS, mq.ReasonCode.NO_SUBSCRIPTION_EXISTED)
    )
    await client.aclose()


async def test_wildcards_and_dollar_topics(server: Any) -> None:
    sub, _ = await h.connect(server.address, "wild")
    await h.subscribe(sub, ("+/+", Q0), ("$SYS/#", Q0))
    pub, _ = await h.connect(server.address, "p")
    await pub.send(mq.Publish("$SYS/x", b"sys"))
    await pub.send(mq.Publish("a/b", b"ab"))
    await pub.send(mq.Publish("a/b/c", b"abc"))  # matches neither
    got = [await h.receive_publish(sub) for _ in range(2)]
    assert sorted((p.topic, p.payload) for p in got) == [("$SYS/x", b"sys"), ("a/b", b"ab")]
    assert await h.arrivals(sub) == []


async def test_retained_store_replace_clear(server: Any) -> None:
    pub, _ = await h.connect(server.address, "p")
    await pub.send(mq.Publish("r/1", b"first", Q1, retain=True, packet_id=1))
    await pub.receive()
    await pub.send(mq.Publish("r/1", b"second", Q1, retain=True, packet_id=2))
    await pub.receive()
    await pub.send(mq.Publish("r/2", b"two", Q0, retain=True))
    await pub.send(mq.Publish("r/3", b"three", Q0, retain=True))
    await pub.send(mq.Publish("r/3", b"", Q0, retain=True))  # clears
    await pub.send(mq.PingReq())
    await pub.receive()
    sub, _ = await h.connect(server.address, "s")
    await h.subscribe(sub, ("r/+", Q1))
    got = sorted(
        [(p.topic, p.payload, p.retain, p.qos) for p in [await h.receive_publish(sub) for _ in range(2)]]
    )
    assert got == [("r/1", b"second", True, Q1), ("r/2", b"two", True, Q0)]
    assert await h.arrivals(sub) == []
    # A live publish with RETAIN reaches existing subscribers with RETAIN cleared (3.1.1).
    await pub.send(mq.Publish("r/2", b"live", Q0, retain=True))
    live = await h.receive_publish(sub)
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
        async with h.raw_client(server.address) as client:
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
        async with h.raw_client(server.address) as client:
            client.level = 5
            client.decoder = type(client.decoder)(1 << 24, protocol_level=5)
            await client.send_raw(connect5)
            assert isinstance(await client.receive(), mq.Connack)
            await client.send_raw(bytes.fromhex(tail))
            got = await client.expect_eof()
            assert [type(p) for p in got] == [mq.Disconnect], tail
            assert got[0].reason_code == code, tail


async def test_connect_refusals_get_connack(server: Any) -> None:
    client, connack = await h.connect(server.address, "", 4, clean_start=False)
    assert connack.reason_code == mq.ReasonCode.CLIENT_IDENTIFIER_NOT_VALID  # 3.1.1 return code 2 on the wire
    assert await client.expect_eof() == []
    client, connack = await h.connect(server.address, "", 5)
    assert connack.reason_code == mq.ReasonCode.SUCCESS
    assert connack.properties.assigned_client_identifier
    client, connack = await h.connect(
        server.address, "q", 5, will=mq.Will("w", b"", mq.QoS.EXACTLY_ONCE), keep_alive=0
    )
    assert connack.reason_code == mq.ReasonCode.SUCCESS


async def test_server_maximum_qos_and_refused_filters(server: Any) -> None:
    state = server.state
    h.set_gateway(
        server,
        Gateway(
            FacadeStore(state.broker), MqttConfig(maximum_qos=1, deny_subscribe=("secret/#",)), state.draining
        ),
    )
    client, connack = await h.connect(server.address, "mq", 5)
    assert connack.properties.maximum_qos == 1
    ack = await h.subscribe(client, ("ok/+", Q2), ("secret/#", Q0))
    assert ack.reason_codes == (mq.ReasonCode.GRANTED_QOS_1, mq.ReasonCode.NOT_AUTHORIZED)
    await client.send(mq.Publish("ok/x", b"too high", Q2, packet_id=1))
    (disconnect,) = await client.expect_eof()
    assert isinstance(disconnect, mq.Disconnect)
    assert disconnect.reason_code == mq.ReasonCode.QOS_NOT_SUPPORTED
    old, _ = await h.connect(server.address, "mq3", 4)
    ack = await h.subscribe(old, ("secret/#", Q0))
    assert ack.reason_codes == (mq.ReasonCode.UNSPECIFIED_ERROR,)  # 0x80 on the 3.1.1 wire


async def test_garbage_after_connect_never_crashes(server: Any, log_sink: Any) -> None:
    rng = random.Random(1234)
    heads = [0x30, 0x32, 0x34, 0x3B, 0x40, 0x50, 0x62, 0x70, 0x82, 0xA2, 0xC0, 0xE0, 0xF0, 0x10, 0x00]
    for level in (4, 5):
        for _ in range(20):
            body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
            data = bytes([rng.choice(heads), len(body)]) + body
            client, _ = await h.connect(server.address, "fuzz", level)
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


async def test_a_client_over_the_receive_maximum_is_disconnected(log_sink: Any) -> None:
    """More QoS 2 PUBLISHes awaiting PUBREL than ``mqtt.receive_maximum`` (announced in CONNACK): MQTT 5 gets
    DISCONNECT 0x93 (Receive Maximum exceeded), 3.1.1 (which has no such code) a plain close."""
    async with running_server(Settings.for_tests(mqtt={"receive_maximum": 2})) as server:
        for level in (5, 4):
            client, connack = await h.connect(server.address, f"greedy{level}", level)
            if level == 5:
                assert connack.properties.receive_maximum == 2
            for packet_id in (1, 2, 3):  # never released
                await client.send(mq.Publish("t", b"x", mq.QoS.EXACTLY_ONCE, False, False, packet_id))
            got = await client.expect_eof()
            assert [type(p) for p in got[:2]] == [mq.PubRec, mq.PubRec]
            if level == 5:
                assert [type(p) for p in got[2:]] == [mq.Disconnect]
                assert got[2].reason_code == mq.ReasonCode.RECEIVE_MAXIMUM_EXCEEDED
            else:
                assert got[2:] == []
            await client.aclose()
    closed = [e for e in log_sink.named("conn.closed") if e["protocol"] == "mqtt"]
    assert [e["error"] for e in closed[:2]] == ["receive_maximum_exceeded"] * 2
