"""Push hubs: caught-up subscribers get new messages without a reader wake-up, and every case the hub
declines (QoS 1, no-local, a full send queue) falls back to the reader with nothing lost or repeated."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from mqproxy.codecs.mqtt import Properties, PubAck, Publish, QoS
from mqproxy.settings import Settings

from . import conftest as h  # type: ignore[import-not-found]

Q0, Q1 = QoS.AT_MOST_ONCE, QoS.AT_LEAST_ONCE


async def test_mixed_subscribers_each_get_every_message_once_in_order(server: Any) -> None:
    subscribers: list[h.RawClient] = []
    for i in range(12):
        client, _ = await h.connect(server.address, f"fan{i}")
        await h.subscribe(client, ("hub/t", Q0))
        subscribers.append(client)
    qos1, _ = await h.connect(server.address, "fan-q1")
    await h.subscribe(qos1, ("hub/t", Q1))
    publisher, _ = await h.connect(server.address, "fan-pub", 5)
    await h.subscribe(publisher, ("hub/#", Q0), no_local=True)  # sees none of its own messages
    await h.all_parked(server, 12 + 1 + 1)
    gateway = h.gateway_of(server)
    for n in range(6):
        qos = Q1 if n % 2 else Q0
        await publisher.send(Publish("hub/t", f"m{n}".encode(), qos, packet_id=n + 1 if qos else None))
        if qos:
            assert await publisher.receive() == PubAck(n + 1)
    expected = [f"m{n}".encode() for n in range(6)]
    for client in subscribers:
        assert [(await h.receive_publish(client)).payload for _ in range(6)] == expected
    got = [await h.receive_publish(qos1) for _ in range(6)]
    assert [p.payload for p in got] == expected
    assert [p.qos for p in got] == [Q0, Q1, Q0, Q1, Q0, Q1]
    assert await h.arrivals(publisher) == [], "the no-local subscriber got its own messages"
    for client in [*subscribers, qos1]:
        assert await h.arrivals(client) == [], "a second copy arrived"
    assert gateway.push_hubs.pushed >= 12 * 3  # the QoS 0 publishes went out through the hub
    for client in [*subscribers, qos1, publisher]:
        await client.aclose()


async def test_a_full_send_queue_hands_delivery_back_to_the_reader(log_sink: Any) -> None:
    # 60 x 128 KiB outgrows any loopback socket buffer, so writes straight from the hub stop fitting
    # (some only in part, the rest queued) and then the 2-packet send queue fills up as well.
    settings = Settings.for_tests(mqtt={"send_buffer_packets": 2})
    count, blob = 60, bytes(128 * 1024)
    async with h.running_server(settings) as server:
        slow, _ = await h.connect(server.address, "slow")
        await h.subscribe(slow, ("hub/slow", Q0))
        fast, _ = await h.connect(server.address, "fast")
        await h.subscribe(fast, ("hub/slow", Q0))
        publisher, _ = await h.connect(server.address, "pub")
        await h.all_parked(server, 2)
        hubs = h.gateway_of(server).push_hubs
        for n in range(count):  # in one burst, while ``slow`` reads nothing
            await publisher.send(Publish("hub/slow", b"%d:" % n + blob, Q0))
        expected = [b"%d:" % n + blob for n in range(count)]
        assert [(await h.receive_publish(fast)).payload for _ in range(count)] == expected
        await trio.testing.wait_all_tasks_blocked()  # the server is backed up as far as it gets
        assert [(await h.receive_publish(slow)).payload for _ in range(count)] == expected
        assert await h.arrivals(slow) == [], "a second copy arrived"
        assert hubs.pushed > 0
        assert hubs.woken > 0  # some messages found the queue full and went back to the readers
        for client in (slow, fast, publisher):
            await client.aclose()


async def test_qos1_within_the_window_goes_out_through_the_hub_without_waking_the_reader(server: Any) -> None:
    subscriber, _ = await h.connect(server.address, "q1-sub")
    await h.subscribe(subscriber, ("hub/q1", Q1))
    publisher, _ = await h.connect(server.address, "q1-pub")
    await h.all_parked(server, 1)
    hubs = h.gateway_of(server).push_hubs
    pushed, woken = hubs.pushed, hubs.woken
    for n in range(5):
        await publisher.send(Publish("hub/q1", b"m%d" % n, Q1, packet_id=n + 1))
        assert await publisher.receive() == PubAck(n + 1)
        got = await h.receive_publish(subscriber)  # PUBACKs it
        assert (got.payload, got.qos) == (b"m%d" % n, Q1)
    assert hubs.pushed - pushed == 5
    assert hubs.woken == woken, "a QoS 1 delivery inside the window woke the reader"
    session = h.gateway_of(server).sessions["q1-sub"]
    await h.wait_until(lambda: not session.inflight)  # every PUBACK settled its hub delivery
    await publisher.send(Publish("hub/q1", b"after", Q1, packet_id=9))
    assert (await h.receive_publish(subscriber)).payload == b"after"
    assert await h.arrivals(subscriber) == [], "a second copy arrived"
    for client in (subscriber, publisher):
        await client.aclose()


async def test_a_full_inflight_window_hands_qos1_back_to_the_reader(server: Any) -> None:
    subscriber, _ = await h.connect(server.address, "win-sub", 5, properties=Properties(receive_maximum=2))
    await h.subscribe(subscriber, ("hub/win", Q1))
    publisher, _ = await h.connect(server.address, "win-pub")
    await h.all_parked(server, 1)
    hubs = h.gateway_of(server).push_hubs
    woken = hubs.woken
    for n in range(6):
        await publisher.send(Publish("hub/win", b"w%d" % n, Q1, packet_id=n + 1))
        assert await publisher.receive() == PubAck(n + 1)
    first = [await h.receive_publish(subscriber, ack=False) for _ in range(2)]
    assert [p.payload for p in first] == [b"w0", b"w1"]
    assert len({p.packet_id for p in first}) == 2
    assert await h.arrivals(subscriber) == [], "the window of 2 was overrun"
    for packet in first:
        await subscriber.send(PubAck(packet.packet_id))
    rest = [await h.receive_publish(subscriber) for _ in range(4)]
    assert [p.payload for p in rest] == [b"w2", b"w3", b"w4", b"w5"]
    assert hubs.woken > woken  # the hub declined what did not fit the window
    assert await h.arrivals(subscriber) == [], "a second copy arrived"
    for client in (subscriber, publisher):
        await client.aclose()


async def test_under_light_load_the_hub_delivers_a_stored_publish_before_its_puback(server: Any) -> None:
    subscriber, _ = await h.connect(server.address, "light-sub")
    await h.subscribe(subscriber, ("hub/light", Q0))
    publisher, _ = await h.connect(server.address, "light-pub")
    await h.all_parked(server, 1)
    hubs = h.gateway_of(server).push_hubs
    for n in range(5):
        pushed = hubs.pushed
        await trio.testing.wait_all_tasks_blocked()  # nothing else runnable: light load
        await publisher.send(Publish("hub/light", b"l%d" % n, Q1, packet_id=n + 1))
        assert await publisher.receive() == PubAck(n + 1)
        assert hubs.pushed == pushed + 1, "the PUBACK left before the hub delivered the message"
        assert (await h.receive_publish(subscriber)).payload == b"l%d" % n
    for client in (subscriber, publisher):
        await client.aclose()
