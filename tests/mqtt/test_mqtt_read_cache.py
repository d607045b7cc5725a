"""The LMQ read cache: coalesced misses, slices inside segments, tail growth, bounds, cancellation, and a
200-subscriber broadcast over loopback that reads the store about once."""

from __future__ import annotations

import dataclasses
import gc
import tracemalloc
from typing import Any, cast

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from mqproxy.backends.embedded.pulls import out_of_range
from mqproxy.backends.embedded.store import MessageStore
from mqproxy.codecs import mqtt as mq
from mqproxy.model.errors import StoreUnavailable
from mqproxy.model.topics import LMQ_QUEUE_ID
from mqproxy.model.types import PullResult, PullStatus, StoredMessage
from mqproxy.mqtt.mapping import PROPERTY_MQTT_QOS, PROPERTY_MQTT_TOPIC, encode_properties, lmq_name
from mqproxy.mqtt.read_cache import MESSAGE_OVERHEAD_BYTES, SEGMENT_SIZE, ReadCache
from mqproxy.settings import Settings

from ..conftest import stored_message  # type: ignore[import-not-found]
from ..proxy.conftest import running_server  # type: ignore[import-not-found]
from .conftest import RawClient, all_parked, gateway_of  # type: ignore[import-not-found]

Q = "%LMQ%t%"


def stored(topic: str, offset: int, size: int = 100) -> StoredMessage:
    return stored_message(
        topic="parent",
        queue_offset=offset,
        commitlog_offset=offset * 1000 + len(topic),
        store_size=size,
        body=f"{topic}#{offset}".encode(),
    )


class CountingBackend:
    """``pull`` over in-memory queues (``min_offset`` may be raised); counts calls; ``gate`` blocks them."""

    def __init__(self) -> None:
        self.queues: dict[tuple[str, int], list[StoredMessage]] = {}
        self.min_offsets: dict[tuple[str, int], int] = {}
        self.pulls: list[tuple[str, int, int, int]] = []
        self.gate: trio.Event | None = None
        self.fail: Exception | None = None

    def append(self, topic: str, count: int, size: int = 100, queue_id: int = LMQ_QUEUE_ID) -> None:
        queue = self.queues.setdefault((topic, queue_id), [])
        base = len(queue)
        queue.extend(stored(topic, base + i, size) for i in range(count))

    async def pull(self, topic: str, queue_id: int, offset: int, max_count: int, **_: Any) -> PullResult:
        self.pulls.append((topic, queue_id, offset, max_count))
        if self.gate is not None:
            await self.gate.wait()
        else:
            await trio.lowlevel.checkpoint()
        if self.fail is not None:
            raise self.fail
        queue = self.queues.get((topic, queue_id), [])
        low = self.min_offsets.get((topic, queue_id), 0)
        early = out_of_range(offset, low, len(queue))
        if early is not None:
            return early
        found = tuple(queue[offset : offset + max(max_count, 1)])
        return PullResult(PullStatus.FOUND, found, offset + len(found), low, len(queue))


def make(backend: CountingBackend, **kw: Any) -> ReadCache:
    return ReadCache(cast(MessageStore, backend), **kw)


def offsets(result: PullResult) -> list[int]:
    return [m.queue_offset for m in result.messages]


async def test_thousand_concurrent_readers_of_one_segment_make_one_pull() -> None:
    backend = CountingBackend()
    backend.append(Q, 40)
    backend.gate = trio.Event()
    cache = make(backend)
    results: list[PullResult] = []

    async def reader(offset: int) -> None:
        results.append(await cache.pull(Q, LMQ_QUEUE_ID, offset, 32))

    async with trio.open_nursery() as nursery:
        for i in range(1000):
            nursery.start_soon(reader, i % 8)
        await trio.testing.wait_all_tasks_blocked()
        assert len(backend.pulls) == 1
        backend.gate.set()
    assert backend.pulls == [(Q, LMQ_QUEUE_ID, 0, SEGMENT_SIZE)]
    assert len(results) == 1000
    for result in results:
        start = result.next_offset - len(result.messages)
        assert result.status is PullStatus.FOUND
        assert offsets(result) == list(range(start, SEGMENT_SIZE))  # up to the segment end
    assert (cache.misses, cache.coalesced, cache.hits, cache.bypasses) == (1, 999, 0, 0)


async def test_offsets_inside_a_segment_are_sliced_from_memory() -> None:
    backend = CountingBackend()
    backend.append(Q, 100)
    cache = make(backend)
    first = await cache.pull(Q, LMQ_QUEUE_ID, 5, 4)
    assert offsets(first) == [5, 6, 7, 8]
    assert first.next_offset == 9
    assert (first.min_offset, first.max_offset) == (0, 100)
    for offset in range(SEGMENT_SIZE):
        result = await cache.pull(Q, LMQ_QUEUE_ID, offset, 3)
        assert offsets(result) == [o for o in range(offset, offset + 3) if o < SEGMENT_SIZE]
        assert result.next_offset == offset + len(result.messages)
    assert len(backend.pulls) == 1
    assert cache.hits == SEGMENT_SIZE
    # Once the next segment is cached too, an answer runs on across the boundary.
    await cache.pull(Q, LMQ_QUEUE_ID, SEGMENT_SIZE, 1)
    across = await cache.pull(Q, LMQ_QUEUE_ID, 30, 32)
    assert offsets(across) == list(range(30, 62))
    assert across.next_offset == 62
    assert len(backend.pulls) == 2


async def test_a_partial_tail_never_hides_later_messages() -> None:
    backend = CountingBackend()
    backend.append(Q, 5)
    cache = make(backend)
    assert offsets(await cache.pull(Q, LMQ_QUEUE_ID, 0, 32)) == [0, 1, 2, 3, 4]
    caught_up = await cache.pull(Q, LMQ_QUEUE_ID, 5, 32)
    assert caught_up.status is PullStatus.NO_NEW_MSG
    assert caught_up.next_offset == 5
    backend.append(Q, 3)
    grown = await cache.pull(Q, LMQ_QUEUE_ID, 5, 32)
    assert offsets(grown) == [5, 6, 7]
    assert backend.pulls[-1] == (Q, LMQ_QUEUE_ID, 5, SEGMENT_SIZE - 5)  # the segment is extended from its end
    pulls = len(backend.pulls)
    assert offsets(await cache.pull(Q, LMQ_QUEUE_ID, 2, 32)) == list(range(2, 8))
    assert len(backend.pulls) == pulls
    backend.append(Q, 60)
    assert offsets(await cache.pull(Q, LMQ_QUEUE_ID, 8, 32)) == list(range(8, 32))
    assert offsets(await cache.pull(Q, LMQ_QUEUE_ID, 32, 32)) == list(range(32, 64))
    assert (await cache.pull(Q, LMQ_QUEUE_ID, 68, 32)).status is PullStatus.NO_NEW_MSG


async def test_eviction_by_bytes_is_least_recently_used() -> None:
    backend = CountingBackend()
    names = [f"%LMQ%q{i}%" for i in range(4)]
    for name in names:
        backend.append(name, SEGMENT_SIZE, size=1000)
    per_segment = SEGMENT_SIZE * (1000 + MESSAGE_OVERHEAD_BYTES)
    cache = make(backend, max_bytes=3 * per_segment)
    for name in names[:3]:
        await cache.pull(name, LMQ_QUEUE_ID, 0, 1)
    await cache.pull(names[0], LMQ_QUEUE_ID, 3, 1)  # q0 is now the most recently used
    await cache.pull(names[3], LMQ_QUEUE_ID, 0, 1)
    assert len(cache) == 3
    assert cache.bytes == 3 * per_segment
    assert cache.evictions == 1
    before = len(backend.pulls)
    await cache.pull(names[0], LMQ_QUEUE_ID, 0, 1)
    await cache.pull(names[2], LMQ_QUEUE_ID, 0, 1)
    assert len(backend.pulls) == before  # q0 and q2 stayed
    await cache.pull(names[1], LMQ_QUEUE_ID, 0, 1)
    assert len(backend.pulls) == before + 1  # q1 was evicted


async def test_eviction_by_segment_count_and_oversized_segments() -> None:
    backend = CountingBackend()
    backend.append(Q, 10 * SEGMENT_SIZE)
    cache = make(backend, max_segments=2)
    for segment in range(10):
        await cache.pull(Q, LMQ_QUEUE_ID, segment * SEGMENT_SIZE, 1)
    assert len(cache) == 2
    assert cache.evictions == 8
    # one message is already too big: nothing stays, answers are right
    tiny = make(backend, max_bytes=MESSAGE_OVERHEAD_BYTES)
    result = await tiny.pull(Q, LMQ_QUEUE_ID, 3, 2)
    assert offsets(result) == [3, 4]
    assert (len(tiny), tiny.bytes) == (0, 0)


async def test_cancelled_fetcher_hands_the_read_to_a_waiter() -> None:
    backend = CountingBackend()
    backend.append(Q, 10)
    backend.gate = trio.Event()
    cache = make(backend)
    got: list[PullResult] = []

    async def waiter() -> None:
        got.append(await cache.pull(Q, LMQ_QUEUE_ID, 2, 32))

    async with trio.open_nursery() as nursery:
        fetcher = trio.CancelScope()

        async def fetch() -> None:
            with fetcher:
                await cache.pull(Q, LMQ_QUEUE_ID, 0, 32)

        nursery.start_soon(fetch)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(waiter)
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert len(backend.pulls) == 1
        fetcher.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert len(backend.pulls) == 2  # one waiter took over; the other waits for it
        backend.gate.set()
    assert fetcher.cancelled_caught
    assert [offsets(r) for r in got] == [list(range(2, 10))] * 2
    assert not cache._inflight


async def test_a_store_error_reaches_every_waiter_and_is_not_cached() -> None:
    backend = CountingBackend()
    backend.append(Q, 10)
    backend.gate = trio.Event()
    backend.fail = StoreUnavailable("disk gone")
    cache = make(backend)
    errors: list[str] = []

    async def reader() -> None:
        try:
            await cache.pull(Q, LMQ_QUEUE_ID, 0, 32)
        except StoreUnavailable as exc:
            errors.append(str(exc))

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        backend.gate.set()
    assert errors == ["disk gone"] * 5
    assert len(backend.pulls) == 1
    backend.fail = None
    assert offsets(await cache.pull(Q, LMQ_QUEUE_ID, 0, 32)) == list(range(10))


async def test_a_trimmed_segment_head_falls_back_to_direct_reads() -> None:
    backend = CountingBackend()
    backend.append(Q, 40)
    backend.min_offsets[(Q, LMQ_QUEUE_ID)] = 10
    cache = make(backend)
    result = await cache.pull(Q, LMQ_QUEUE_ID, 12, 32)
    assert offsets(result) == list(range(12, 40))
    assert cache.bypasses == 1
    low = await cache.pull(Q, LMQ_QUEUE_ID, 3, 32)
    assert (low.status, low.next_offset) == (PullStatus.OFFSET_ILLEGAL, 10)


async def test_disabled_cache_passes_through() -> None:
    backend = CountingBackend()
    backend.append(Q, 5)
    cache = make(backend, max_segments=0)
    for _ in range(3):
        assert offsets(await cache.pull(Q, LMQ_QUEUE_ID, 1, 2)) == [1, 2]
    assert (len(backend.pulls), cache.bypasses, len(cache)) == (3, 3, 0)
    with pytest.raises(ValueError, match="segment_size"):
        make(backend, segment_size=0)


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 40)),
        st.tuples(st.just("pull"), st.integers(0, 130), st.integers(1, 70)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=_ops, segment_size=st.sampled_from([1, 3, 32]), max_segments=st.integers(1, 5))
def test_answers_agree_with_the_store(
    ops: list[tuple[Any, ...]], segment_size: int, max_segments: int
) -> None:
    async def run() -> None:
        backend = CountingBackend()
        direct = CountingBackend()
        direct.queues = backend.queues
        cache = make(backend, segment_size=segment_size, max_segments=max_segments)
        for op in ops:
            if op[0] == "append":
                backend.append(Q, op[1])
                continue
            _, offset, count = op
            want = await direct.pull(Q, LMQ_QUEUE_ID, offset, count)
            got = await cache.pull(Q, LMQ_QUEUE_ID, offset, count)
            if want.messages:
                assert got.status is PullStatus.FOUND
                assert got.messages  # never empty while the store has messages there
                assert got.messages == want.messages[: len(got.messages)]
                assert got.next_offset == offset + len(got.messages)
            else:
                assert (got.status, got.next_offset, got.messages) == (want.status, want.next_offset, ())

    trio.run(run)


async def test_broadcast_to_200_subscribers_reads_the_lmq_about_once(server: Any) -> None:
    backend = server.store
    lmq = lmq_name("bcast/one")
    counts = {"lmq": 0}
    original = backend.pull

    async def counting_pull(topic: str, *args: Any, **kw: Any) -> PullResult:
        if topic == lmq:
            counts["lmq"] += 1
        return await original(topic, *args, **kw)

    original_now = backend.pull_now

    def counting_pull_now(topic: str, *args: Any) -> PullResult:  # the hubs' hand-off in the store's notify
        if topic == lmq:
            counts["lmq"] += 1
        return original_now(topic, *args)  # type: ignore[no-any-return]

    backend.pull = counting_pull
    backend.pull_now = counting_pull_now
    clients: list[RawClient] = []
    try:

        async def join(i: int) -> None:
            client = RawClient(await trio.open_tcp_stream(*server.address), 4)
            await client.send(mq.Connect(f"sub{i}", 4))
            assert isinstance(await client.receive(), mq.Connack)
            await client.send(mq.Subscribe(1, (mq.SubscribeTopic("bcast/one", mq.QoS.AT_MOST_ONCE),)))
            assert isinstance(await client.receive(), mq.SubAck)
            clients.append(client)

        async with trio.open_nursery() as nursery:
            for i in range(200):
                nursery.start_soon(join, i)
        await all_parked(server, 200)  # every reader made its first (empty) pull and waits
        counts["lmq"] = 0
        gateway = gateway_of(server)
        served = gateway.read_cache.hits + gateway.read_cache.coalesced
        publisher = RawClient(await trio.open_tcp_stream(*server.address), 4)
        clients.append(publisher)
        await publisher.send(mq.Connect("pub", 4))
        assert isinstance(await publisher.receive(), mq.Connack)
        await publisher.send(mq.Publish("bcast/one", b"to all", mq.QoS.AT_MOST_ONCE))

        async def expect(client: RawClient) -> None:
            packet = await client.receive()
            assert isinstance(packet, mq.Publish)
            assert (packet.topic, packet.payload) == ("bcast/one", b"to all")

        async with trio.open_nursery() as nursery:
            for client in clients[:200]:
                nursery.start_soon(expect, client)
        assert 1 <= counts["lmq"] <= 3
        # Caught-up readers get it pushed by the LMQ's hub (one read for all); any other reader reads it
        # through the cache.
        from_cache = gateway.read_cache.hits + gateway.read_cache.coalesced - served
        assert gateway.push_hubs.pushed + from_cache >= 197
    finally:
        for client in clients:
            await client.aclose()


# --- per-message delivery memo ------------------------------------------------------------------------
def _mqtt_message(offset: int, properties: dict[str, str]) -> StoredMessage:
    return dataclasses.replace(stored("t", offset), properties=properties, body=b"payload")


def test_delivery_is_memoized_per_message_object() -> None:
    cache = ReadCache(cast(MessageStore, CountingBackend()))
    message = _mqtt_message(1, encode_properties("a/b", 1, "pub", True, mq.NO_PROPERTIES))
    first = cache.delivery(message)
    assert cache.delivery(message) is first
    assert first.attributes is not None
    assert (first.attributes.topic, first.attributes.qos, first.attributes.retain) == ("a/b", 1, True)
    # Same commit-log offset, another object (read again from the store): decoded afresh.
    again = _mqtt_message(1, encode_properties("a/c", 0, "pub", False, mq.NO_PROPERTIES))
    other = cache.delivery(again)
    assert other is not first
    assert other.attributes is not None
    assert other.attributes.topic == "a/c"
    assert cache.delivery(_mqtt_message(2, {})).attributes is None  # not an MQTT message


def test_delivery_qos0_bytes_match_the_codec() -> None:
    cache = ReadCache(cast(MessageStore, CountingBackend()))
    props = mq.Properties(user_properties=(("k", "v"),), content_type="text/plain")
    delivery = cache.delivery(_mqtt_message(3, encode_properties("a/b", 2, "pub", False, props)))
    for level in (3, 4):
        assert delivery.qos0_publish(level, False) == mq.encode(mq.Publish("a/b", b"payload"), level)
        assert delivery.qos0_publish(level, True) == mq.encode(
            mq.Publish("a/b", b"payload", retain=True), level
        )
    assert delivery.qos0_publish(5, False) == mq.encode(mq.Publish("a/b", b"payload", properties=props), 5)
    assert delivery.qos0_publish(4, False) is delivery.qos0_publish(4, False)  # encoded once


@pytest.mark.parametrize("topic", ["a/b", "ü/€/x", "$SYS/t", "t" * 300])
@pytest.mark.parametrize("size", [0, 100, 200, 20_000])
def test_delivery_qos0_bytes_without_properties_match_the_codec(topic: str, size: int) -> None:
    cache = ReadCache(cast(MessageStore, CountingBackend()))
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    message = dataclasses.replace(
        stored("t", 4), properties=encode_properties(topic, 0, "pub", False, mq.NO_PROPERTIES), body=body
    )
    delivery = cache.delivery(message)
    for level in (3, 4, 5):
        for retain in (False, True):
            expected = mq.encode(mq.Publish(topic, body, retain=retain), level)
            assert delivery.qos0_publish(level, retain) == expected


def test_delivery_qos0_refuses_a_topic_the_codec_refuses() -> None:
    cache = ReadCache(cast(MessageStore, CountingBackend()))
    bad = {PROPERTY_MQTT_TOPIC: "a/+", PROPERTY_MQTT_QOS: "0"}  # a foreign producer's, as stored
    delivery = cache.delivery(_mqtt_message(5, bad))
    with pytest.raises(mq.MqttCodecError):
        mq.encode(mq.Publish("a/+", b"payload"), 4)
    with pytest.raises(mq.MqttCodecError):
        delivery.qos0_publish(4, False)


def test_delivery_memo_is_bounded() -> None:
    cache = ReadCache(cast(MessageStore, CountingBackend()), max_deliveries=3)
    messages = [_mqtt_message(i, {}) for i in range(5)]
    memos = [cache.delivery(m) for m in messages]
    assert cache.delivery(messages[4]) is memos[4]
    assert cache.delivery(messages[0]) is not memos[0]  # evicted, oldest first
    assert len(cache._deliveries) == 3
    off = ReadCache(cast(MessageStore, CountingBackend()), max_deliveries=0)
    assert off.delivery(messages[0]) is not off.delivery(messages[0])


def test_delivery_memo_is_bounded_by_bytes() -> None:
    cache = ReadCache(cast(MessageStore, CountingBackend()), max_bytes=4 * 64_000)  # memo budget 64,000 B
    messages = [_mqtt_message(i, {}) for i in range(300)]
    for message in messages:
        cache.delivery(message)
    each = 2 * len(b"payload") + 256  # body and about one encoding
    assert len(cache._deliveries) == 64_000 // each
    assert cache.delivery_bytes == (64_000 // each) * each
    newest = cache.delivery(messages[-1])
    assert cache.delivery(messages[-1]) is newest  # the newest stay, the oldest went
    assert messages[0].commitlog_offset not in cache._deliveries
    big = dataclasses.replace(_mqtt_message(1000, {}), body=bytes(1000))  # over 1/64 of the budget
    assert cache.delivery(big) is not cache.delivery(big)
    disabled = ReadCache(cast(MessageStore, CountingBackend()), max_bytes=0)
    assert disabled.delivery(messages[0]) is not disabled.delivery(messages[0])


async def test_the_byte_cap_covers_the_memory_cached_messages_hold(tmp_path: Any, log_sink: Any) -> None:
    """``max_bytes`` bounds memory: what a segment of small MQTT messages read from the embedded store is
    charged covers what it holds (measured with tracemalloc; issue 19's flood held ~3.7x its charge)."""
    async with running_server(Settings.for_tests(tmp_path)) as server:
        publisher = RawClient(await trio.open_tcp_stream(*server.address), 4)
        await publisher.send(mq.Connect("pub", 4))
        assert isinstance(await publisher.receive(), mq.Connack)
        count = 20 * SEGMENT_SIZE
        for n in range(count):
            await publisher.send(mq.Publish("mem/t", n.to_bytes(2, "big") * 32, mq.QoS.AT_MOST_ONCE))
        store = server.store
        assert store is not None
        lmq = lmq_name("mem/t")

        async def stored_count() -> int:
            return (await store.pull(lmq, LMQ_QUEUE_ID, 0, 1)).max_offset

        with trio.fail_after(20):
            while await stored_count() < count:  # noqa: ASYNC110 (the store has no event for this)
                await trio.sleep(0.05)
        cache = ReadCache(store, max_segments=1000, max_bytes=1 << 30)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot()
            for start in range(0, count, SEGMENT_SIZE):
                result = await cache.pull(lmq, LMQ_QUEUE_ID, start, SEGMENT_SIZE)
                assert len(result.messages) == SEGMENT_SIZE
            gc.collect()
            full = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        held = sum(stat.size_diff for stat in full.compare_to(before, "filename"))
        await publisher.aclose()
    assert len(cache) == 20
    assert held / count > 600  # what a small message really costs (the store size alone is ~1/3 of it)
    assert held <= cache.bytes <= 2 * held
