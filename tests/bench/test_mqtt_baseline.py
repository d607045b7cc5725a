"""``bench/_mqtt_baseline.py``: the MQTT floor peer of ``bench/cpu.py`` is a working broker for what the
fan-in cases do: CONNECT, SUBSCRIBE, QoS 0 and QoS 1 PUBLISH relayed to every matching subscriber at the
lower QoS (QoS 1 ones acknowledged), PINGREQ, and garbage closing only that connection."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from mqproxy.codecs.mqtt import PubAck, Publish, QoS, encode

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from _mqtt_baseline import MQTT_BASELINE_SERVER  # type: ignore[import-not-found]
from _mqtt_load import LEVEL, MqttClient, connect  # type: ignore[import-not-found]
from _peer import start_peer  # type: ignore[import-not-found]


@pytest.fixture
def port() -> Iterator[int]:
    proc, port = start_peer(MQTT_BASELINE_SERVER)
    try:
        yield port
    finally:
        proc.kill()
        proc.wait()


async def _publishes(client: MqttClient, count: int) -> list[Publish]:
    got: list[Publish] = []
    with trio.fail_after(10):
        while len(got) < count:
            got += [p for p in await client.receive_packets() if isinstance(p, Publish)]
    return got


async def test_relays_publishes_at_the_lower_qos_and_acks_qos1(port: int) -> None:
    qos0_sub = await connect(port, "s0")
    await qos0_sub.subscribe("fan/+", 0)
    qos1_sub = await connect(port, "s1")
    await qos1_sub.subscribe("fan/#", 1)
    other = await connect(port, "s2")
    await other.subscribe("elsewhere", 1)
    publisher = await connect(port, "p")
    await publisher.send(encode(Publish("fan/a", b"zero"), LEVEL))
    await publisher.send(encode(Publish("fan/b", b"one", QoS.AT_LEAST_ONCE, packet_id=7), LEVEL))
    with trio.fail_after(10):
        assert [p for p in await publisher.receive_packets() if isinstance(p, PubAck)] == [PubAck(7)]
    got0 = await _publishes(qos0_sub, 2)
    assert [(p.topic, p.payload, p.qos, p.packet_id) for p in got0] == [
        ("fan/a", b"zero", QoS.AT_MOST_ONCE, None),
        ("fan/b", b"one", QoS.AT_MOST_ONCE, None),
    ]
    got1 = await _publishes(qos1_sub, 2)
    assert [(p.topic, p.qos) for p in got1] == [("fan/a", QoS.AT_MOST_ONCE), ("fan/b", QoS.AT_LEAST_ONCE)]
    assert got1[1].packet_id is not None
    assert await other.ping()  # nothing was relayed to a filter that does not match; the PINGRESP comes first
    for client in (qos0_sub, qos1_sub, other, publisher):
        await client.aclose()


async def test_garbage_closes_that_connection_only(port: int) -> None:
    bystander = await connect(port, "b")
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"\xff\x00garbage")
    with trio.fail_after(10):
        while await stream.receive_some(100):
            pass
    assert await bystander.ping()
    await bystander.aclose()
    fresh = await connect(port, "c")  # and the server still takes new ones
    assert await fresh.ping()
    await fresh.aclose()
