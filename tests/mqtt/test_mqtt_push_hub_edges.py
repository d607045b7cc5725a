"""Edge cases of push-hub writes straight to the socket: mixed batches, takeover, slow consumers,
byte counts, ordering against the writer task."""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any

import trio
import trio.testing

from mqproxy.codecs import mqtt as mq
from mqproxy.mqtt.gateway import Gateway
from mqproxy.settings import Settings

from ..conftest import wait_until  # type: ignore[import-not-found]
from .conftest import (  # type: ignore[import-not-found]
    all_parked,
    arrivals,
    drain,
    gateway_of,
    receive_publish,  # type: ignore[import-not-found]
    running_server,
)
from .conftest import connect as connect_to  # type: ignore[import-not-found]
from .conftest import subscribe as subscribe_to  # type: ignore[import-not-found]

Q0, Q1, Q2 = mq.QoS.AT_MOST_ONCE, mq.QoS.AT_LEAST_ONCE, mq.QoS.EXACTLY_ONCE


# --- push hubs: a batch only partly handled by the hub ---------------------------------------------
async def test_one_burst_batch_with_every_kind_of_decline_reaches_each_subscriber_once_in_order(
    server: Any,
) -> None:
    """Checked, correct: 25 PUBLISHes arrive in ONE read (one store batch, one hub batch) mixing QoS 0,
    QoS 1, an expiring message, a packet too big for one subscriber and the no-local publisher's own
    messages. Every subscriber gets exactly its messages, once, in order, whether the hub or its reader
    handled them, and the hub handled some."""

    def kind(n: int) -> str:
        return ("plain", "q1", "expiring", "big", "plain")[n % 5]

    def payload(n: int) -> bytes:
        return b"%d:" % n + (bytes(3000) if kind(n) == "big" else b"")

    plain, _ = await connect_to(server.address, "plain")
    await subscribe_to(plain, ("burst/t", Q0))
    q1, _ = await connect_to(server.address, "q1")
    await subscribe_to(q1, ("burst/t", Q1))
    small, _ = await connect_to(
        server.address, "small", 5, properties=mq.Properties(maximum_packet_size=1000)
    )
    await subscribe_to(small, ("burst/t", Q0))
    aliased, _ = await connect_to(
        server.address, "aliased", 5, properties=mq.Properties(topic_alias_maximum=4)
    )
    await subscribe_to(aliased, ("burst/t", Q0))
    pub, _ = await connect_to(server.address, "pub", 5)
    await subscribe_to(pub, ("burst/t", Q0), no_local=True)
    await all_parked(server, 5)
    hubs = gateway_of(server).push_hubs
    pushed = hubs.pushed
    burst = b""
    count = 25
    for n in range(count):
        qos = Q1 if kind(n) == "q1" else Q0
        props = mq.Properties(message_expiry_interval=600) if kind(n) == "expiring" else mq.Properties()
        burst += mq.encode(
            mq.Publish("burst/t", payload(n), qos, packet_id=n + 1 if qos else None, properties=props), 5
        )
    await pub.send_raw(burst)
    expected = [payload(n) for n in range(count)]
    got = [(await receive_publish(plain)).payload for _ in range(count)]
    assert got == expected
    q1_got = [await receive_publish(q1) for _ in range(count)]
    assert [p.payload for p in q1_got] == expected
    assert [p.qos for p in q1_got] == [Q1 if kind(n) == "q1" else Q0 for n in range(count)]
    small_expected = [payload(n) for n in range(count) if kind(n) != "big"]
    assert [(await receive_publish(small)).payload for _ in small_expected] == small_expected
    assert [(await receive_publish(aliased)).payload for _ in range(count)] == expected
    acks = [await pub.receive() for _ in range(count // 5)]
    assert all(isinstance(a, mq.PubAck) for a in acks)
    for client in (plain, q1, small, aliased, pub):
        assert await arrivals(client) == []
    assert hubs.pushed > pushed
    for client in (plain, q1, small, aliased, pub):
        await client.aclose()


async def test_takeover_during_a_backed_up_burst_keeps_the_old_stream_whole(server: Any) -> None:
    """Checked, correct: a slow-reading MQTT 5 subscriber is taken over while hub writes straight to its
    socket, some in part, with the rest and the writer's queue backed up behind. Its byte stream stays
    parseable: a gap-free, in-order run of the burst, then DISCONNECT (Session taken over) last; the new
    connection continues after it with no message twice."""
    count, blob = 50, bytes(64 * 1024)
    props = mq.Properties(session_expiry_interval=60)
    old, _ = await connect_to(server.address, "victim", 5, clean_start=False, properties=props)
    await subscribe_to(old, ("tk/t", Q0))
    pub, _ = await connect_to(server.address, "tk-pub")
    await all_parked(server, 1)
    victim = gateway_of(server).sessions["victim"].connection
    old_packets: list[Any] = []
    published_in, published = trio.open_memory_channel[None](count)

    async def read_slowly() -> None:  # 16 KiB per 64 KiB message published, then the rest
        try:
            while True:
                with contextlib.suppress(trio.EndOfChannel):
                    await published.receive()
                data = await old.stream.receive_some(16384)
                if not data:
                    return
                old_packets.extend(old.decoder.receive_data(data))  # raises on a corrupt stream
        except trio.BrokenResourceError:
            return

    async def publish_all() -> None:
        async with published_in:
            for n in range(count):
                await pub.send(mq.Publish("tk/t", b"%d:" % n + blob, Q0))
                published_in.send_nowait(None)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_slowly)
        nursery.start_soon(publish_all)
        await wait_until(lambda: old_packets and victim._queued)  # mid-burst, backed up behind the socket
        new, connack = await connect_to(server.address, "victim", 5, clean_start=False, properties=props)
        assert connack.session_present
    assert old_packets
    assert isinstance(old_packets[-1], mq.Disconnect)
    assert old_packets[-1].reason_code == mq.ReasonCode.SESSION_TAKEN_OVER
    numbers = [int(p.payload.split(b":")[0]) for p in old_packets[:-1]]
    assert all(isinstance(p, mq.Publish) for p in old_packets[:-1])
    assert numbers == list(range(len(numbers)))
    rest = await drain(new)
    assert all(isinstance(p, mq.Publish) for p in rest)
    later = [int(p.payload.split(b":")[0]) for p in rest]
    assert later == sorted(later)
    assert not later or later[0] >= len(numbers), (len(numbers), later[:3])  # none twice
    for client in (old, new, pub):
        await client.aclose()


async def test_a_peer_that_reads_nothing_is_still_disconnected_when_only_the_hub_writes(
    log_sink: Any,
) -> None:
    """Checked, correct: hub writes straight to the socket until it is full, then queue; the writer's
    ``send_all`` of the remainder times out and the connection ends as ``slow_consumer``."""
    settings = Settings.for_tests(mqtt={"write_timeout_s": 0.3})
    async with running_server(settings) as server:
        sleepy, _ = await connect_to(server.address, "sleepy")
        await subscribe_to(sleepy, ("slow/t", Q0))
        pub, _ = await connect_to(server.address, "slow-pub")
        await all_parked(server, 1)
        for n in range(40):
            await pub.send(mq.Publish("slow/t", b"%d:" % n + bytes(128 * 1024), Q0))
        await wait_until(  # while it reads nothing
            lambda: any(e.get("error") == "slow_consumer" for e in log_sink.named("conn.closed"))
        )
        received = await sleepy.expect_eof(wait_s=5.0)  # fails (hangs) unless the server closed it
        assert len(received) < 40
        closed = [e for e in log_sink.named("conn.closed") if e.get("error") == "slow_consumer"]
        assert len(closed) == 1
        assert gateway_of(server).push_hubs.pushed > 0
        await pub.aclose()
        await sleepy.aclose()


# --- push hubs: direct writes after the writer gave up --------------------------------------------
async def test_no_direct_write_after_the_writer_timed_out_mid_packet(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The writer's ``send_all`` times out (slow consumer) with part of a packet on the wire; until the
    connection's ``run`` tears down, a push hub may still call ``_write_nowait``. Nothing may be
    written after the cut packet: the peer would parse the new bytes as the rest of the old packet."""
    from mqproxy.backends.embedded.memory import InMemoryBackend
    from mqproxy.mqtt.config import MqttConfig
    from mqproxy.mqtt.connection import MqttConnection
    from mqproxy.runtime.context import ConnectionContext

    near, far = trio.socket.socketpair()  # a Unix socket pair: what is sent is at the peer at once
    near.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_SNDBUF, 4096)
    far.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
    peer = socket.socket(fileno=os.dup(far.fileno()))
    peer.setblocking(False)

    def readable_now() -> bytes:
        got = bytearray()
        with contextlib.suppress(BlockingIOError):
            while chunk := peer.recv(65536):
                got += chunk
        return bytes(got)

    gateway = Gateway(InMemoryBackend(), MqttConfig(write_timeout_s=0.2))
    ctx = ConnectionContext("c1", ("memory", 0), ("memory", 0))
    conn = MqttConnection(trio.SocketStream(near), ctx, gateway)
    assert conn._direct is not None  # plain socket: the direct path is on
    cut = mq.encode(mq.Publish("a/b", bytes(1 << 20), Q0), 4)
    async with trio.open_nursery() as nursery:
        conn._nursery = nursery  # the writer task starts there when the socket does not take it all
        await conn._send_bytes(cut)
        await conn._flushed()  # timed out (the autojump clock): kicked as a slow consumer
    assert conn._kicked is not None
    assert conn._kicked.error == "slow_consumer"
    got = readable_now()  # the peer wakes up and drains what the cut left
    assert 0 < len(got) < len(cut)
    later = mq.encode(mq.Publish("a/b", b"hub", Q0), 4)
    conn._write_nowait(later)  # the hub's delivery, before run() closes the connection
    extra = readable_now()
    assert extra == b"", f"{len(extra)} bytes written behind a truncated packet"
    peer.close()
    near.close()
    far.close()


async def test_bytes_written_by_the_hub_are_counted_in_conn_closed(log_sink: Any) -> None:
    """Checked, correct: ``conn.closed`` ``bytes_out`` of a subscriber served by the hub equals the bytes
    its peer read (CONNACK, SUBACK and the PUBLISHes, whether written straight or by the writer)."""
    async with running_server(Settings.for_tests()) as server:
        sub, _ = await connect_to(server.address, "counted")
        await subscribe_to(sub, ("count/t", Q0))
        pub, _ = await connect_to(server.address, "count-pub")
        await all_parked(server, 1)
        pushed = gateway_of(server).push_hubs.pushed
        for n in range(10):
            await pub.send(mq.Publish("count/t", b"%d" % n + bytes(n * 100), Q0))
        received = [await receive_publish(sub) for _ in range(10)]
        assert [p.payload[:1] for p in received] == [b"%d" % n for n in range(10)]
        assert gateway_of(server).push_hubs.pushed >= pushed + 10
        await sub.send(mq.Disconnect())
        await sub.expect_eof()
        await wait_until(lambda: len(log_sink.named("conn.closed")) == 1)  # the subscriber's
        payload_bytes = sum(len(mq.encode(p, 4)) for p in received)
        connack_suback = 4 + 5
        closed = [
            e for e in log_sink.named("conn.closed") if e["bytes_out"] == payload_bytes + connack_suback
        ]
        assert len(closed) == 1, [e["bytes_out"] for e in log_sink.named("conn.closed")]
        await pub.aclose()
        await sub.aclose()


async def _queue_race_once() -> tuple[bytes, bool]:
    """Three tasks block in ``_send_bytes`` on a full 1-packet queue behind a large write; when the
    writer drains, the last of them queues ``d`` and then calls ``_write_nowait(e)`` without a
    schedule point (what the packet reader does when it sends an ack and then ``_final_packet``).
    Returns what the peer got after the large write and what ``_write_nowait`` answered."""
    from mqproxy.backends.embedded.memory import InMemoryBackend
    from mqproxy.mqtt.config import MqttConfig
    from mqproxy.mqtt.connection import MqttConnection
    from mqproxy.runtime.context import ConnectionContext

    near, far = trio.socket.socketpair()
    gateway = Gateway(InMemoryBackend(), MqttConfig(send_buffer_packets=1))
    ctx = ConnectionContext("c1", ("memory", 0), ("memory", 0))
    conn = MqttConnection(trio.SocketStream(near), ctx, gateway)
    big = bytes(1 << 20)
    got = bytearray()
    accepted: list[bool] = []

    async def blocked(data: bytes) -> None:
        await conn._send_bytes(data)

    async def blocked_then_direct() -> None:
        await conn._send_bytes(b"2")
        await conn._send_bytes(b"d")
        accepted.append(conn._write_nowait(b"e"))

    async with trio.open_nursery() as nursery:
        conn._nursery = nursery
        await conn._send_bytes(big)
        await trio.testing.wait_all_tasks_blocked()  # the writer is in send_all(big): the peer reads nothing
        await conn._send_bytes(b"b")  # fills the queue
        for task in (lambda: blocked(b"1"), lambda: blocked(b"3"), blocked_then_direct):
            nursery.start_soon(task)
            await trio.testing.wait_all_tasks_blocked()  # it waits in _send_bytes, after the ones before
        while not accepted or len(got) < len(big) + 5 + accepted[0]:
            got.extend(await far.recv(1 << 20))
        nursery.cancel_scope.cancel()
    near.close()
    far.close()
    return bytes(got[len(big) :]), accepted[0]


async def test_write_nowait_never_overtakes_bytes_queued_before_it() -> None:
    """``_queued`` must count every byte string the writer has not sent yet."""
    overtaken = 0
    for _ in range(30):
        tail, accepted = await _queue_race_once()
        assert tail.startswith(b"b")
        assert b"d" in tail
        if accepted and tail.index(b"e") < tail.index(b"d"):
            overtaken += 1
    assert overtaken == 0, f"e overtook d in {overtaken} of 30 tries"
