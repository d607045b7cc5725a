"""One behavioural suite run against every MessageStore implementation."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.backends.embedded.store import MessageStore
from mqproxy.model.errors import BackendError, IllegalTopic, MessageTooLarge, QueueNotFound, TopicNotFound
from mqproxy.model.types import (
    PROPERTY_INNER_MULTI_DISPATCH,
    PROPERTY_INNER_MULTI_QUEUE_OFFSET,
    ConsumerInfo,
    Message,
    PullResult,
    PullStatus,
    Subscription,
    TagFilter,
)

MakeBackend = Callable[..., AbstractAsyncContextManager[MessageStore]]


@pytest.fixture(params=["memory", "embedded-async", "embedded-sync"])
def make_backend(request: pytest.FixtureRequest, tmp_path: Path) -> MakeBackend:
    counter = iter(range(1000))

    @asynccontextmanager
    async def make(**kwargs: Any) -> AsyncIterator[MessageStore]:
        if request.param == "memory":
            yield InMemoryBackend(**kwargs)
            return
        flush = request.param.removeprefix("embedded-")
        async with open_embedded_store(
            tmp_path / f"store{next(counter)}", flush=flush, segment_bytes=64 * 1024, **kwargs
        ) as store:
            yield store

    return make


@pytest.fixture
def wall_clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """Stop the wall clock the stores read (store times, idleness: ``time.time_ns``); the test moves it
    on by the seconds it passes to the returned function."""
    now = [time.time_ns()]
    monkeypatch.setattr(time, "time_ns", lambda: now[0])

    def advance(seconds: float) -> None:
        now[0] += int(seconds * 1e9)

    return advance


def msg(topic: str = "T", body: bytes = b"hello", **kw: Any) -> Message:
    return Message(topic=topic, body=body, **kw)


async def _long_poll_result(
    backend: MessageStore, topic: str, offset: int, then: Callable[[], Awaitable[object]]
) -> list[bool]:
    """Park a 30 s long poll on queue 0 of ``topic`` past ``offset``, run ``then`` once it waits;
    returns what the poll answered (one value)."""
    woke: list[bool] = []
    async with trio.open_nursery() as nursery:

        async def waiter() -> None:
            woke.append(await backend.wait_for_message(topic, 0, offset, 30))

        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()  # the waiter waits
        assert woke == []
        await then()
    return woke


async def test_is_a_backend(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        assert isinstance(backend, MessageStore)


async def test_send_then_pull_round_trips_every_field(make_backend: MakeBackend) -> None:
    async with make_backend(store_host=("10.0.0.9", 10911)) as backend:
        sent = await backend.send(
            Message(
                topic="Orders",
                body=b"\x00payload\xff",
                queue_id=2,
                flag=7,
                properties={"TAGS": "A", "KEYS": "k1 k2", "UNIQ_KEY": "ABC"},
                sys_flag=0x4,
                born_timestamp_ms=1_700_000_000_123,
                born_host=("192.168.1.5", 40000),
                reconsume_times=3,
            )
        )
        assert (sent.topic, sent.queue_id, sent.queue_offset) == ("Orders", 2, 0)
        assert sent.lmq_offsets == {}
        result = await backend.pull("Orders", 2, 0, 32)
        assert result.status is PullStatus.FOUND
        assert (result.next_offset, result.min_offset, result.max_offset) == (1, 0, 1)
        (m,) = result.messages
        assert m.body == b"\x00payload\xff"
        assert (m.topic, m.queue_id, m.queue_offset, m.commitlog_offset) == (
            "Orders",
            2,
            0,
            sent.commitlog_offset,
        )
        assert m.flag == 7
        assert m.sys_flag == 0x4
        assert m.reconsume_times == 3
        assert dict(m.properties) == {"TAGS": "A", "KEYS": "k1 k2", "UNIQ_KEY": "ABC"}
        assert m.born_timestamp_ms == 1_700_000_000_123
        assert m.born_host == ("192.168.1.5", 40000)
        assert m.store_host == ("10.0.0.9", 10911)
        assert m.store_timestamp_ms == sent.store_timestamp_ms
        assert m.body_crc == 0x7FFFFFFF & __import__("zlib").crc32(b"\x00payload\xff")
        assert m.store_size > len(m.body)
        assert m.tags == "A"


async def test_offsets_are_per_queue_and_commitlog_offsets_unique(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        results = [await backend.send(msg(queue_id=i % 2, body=bytes([i]))) for i in range(6)]
        assert [r.queue_offset for r in results] == [0, 0, 1, 1, 2, 2]
        clos = [r.commitlog_offset for r in results]
        assert clos == sorted(clos)
        assert len(set(clos)) == 6
        assert await backend.max_offset("T", 0) == 3
        assert await backend.max_offset("T", 1) == 3
        assert await backend.min_offset("T", 0) == 0
        assert await backend.max_offset("T", 3) == 0
        got = await backend.pull("T", 1, 0, 32)
        assert [m.body for m in got.messages] == [b"\x01", b"\x03", b"\x05"]


async def test_get_message_by_commitlog_offset(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        sent = [await backend.send(msg(body=bytes([i]) * 10, queue_id=i % 2)) for i in range(5)]
        for i, result in enumerate(sent):
            stored = await backend.get_message(result.commitlog_offset)  # type: ignore[attr-defined]
            assert stored is not None
            assert (stored.body, stored.queue_id, stored.queue_offset) == (bytes([i]) * 10, i % 2, i // 2)
            assert stored.commitlog_offset == result.commitlog_offset
        assert await backend.get_message(sent[1].commitlog_offset + 1) is None  # type: ignore[attr-defined]
        assert await backend.get_message(-1) is None  # type: ignore[attr-defined]
        assert await backend.get_message(10**12) is None  # type: ignore[attr-defined]


async def test_queue_minus_one_spreads_over_queues(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        queues = {(await backend.send(msg())).queue_id for _ in range(8)}
        assert queues == {0, 1, 2, 3}


async def test_pull_status_table(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        await backend.create_topic("T")
        empty = await backend.pull("T", 0, 0, 32)
        assert (empty.status, empty.next_offset, empty.max_offset) == (PullStatus.NO_NEW_MSG, 0, 0)
        moved = await backend.pull("T", 0, 5, 32)
        assert (moved.status, moved.next_offset) == (PullStatus.OFFSET_ILLEGAL, 0)
        for _ in range(3):
            await backend.send(msg(queue_id=0))
        at_end = await backend.pull("T", 0, 3, 32)
        assert (at_end.status, at_end.next_offset, at_end.messages) == (PullStatus.NO_NEW_MSG, 3, ())
        beyond = await backend.pull("T", 0, 9, 32)
        assert (beyond.status, beyond.next_offset) == (PullStatus.OFFSET_ILLEGAL, 3)
        middle = await backend.pull("T", 0, 1, 32)
        assert [m.queue_offset for m in middle.messages] == [1, 2]
        assert middle.next_offset == 3


async def test_pull_honours_max_count_and_max_bytes(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        for i in range(10):
            await backend.send(msg(queue_id=0, body=bytes(1000) + bytes([i])))
        two = await backend.pull("T", 0, 0, 2)
        assert [m.queue_offset for m in two.messages] == [0, 1]
        assert two.next_offset == 2
        one_size = two.messages[0].store_size
        capped = await backend.pull("T", 0, 0, 32, max_bytes=3 * one_size + 10)
        assert [m.queue_offset for m in capped.messages] == [0, 1, 2]
        assert capped.next_offset == 3
        tiny = await backend.pull("T", 0, 4, 32, max_bytes=1)
        assert [m.queue_offset for m in tiny.messages] == [4], "at least one message is always returned"


async def test_tag_filter(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        tags = ["A", "B", None, "C", "A"]
        for t in tags:
            await backend.send(msg(queue_id=0, properties={"TAGS": t} if t else {}))
        ab = await backend.pull("T", 0, 0, 32, tag_filter=TagFilter.parse("A || C"))
        assert [m.queue_offset for m in ab.messages] == [0, 3, 4]
        assert ab.next_offset == 5
        everything = await backend.pull("T", 0, 0, 32, tag_filter=TagFilter.parse("*"))
        assert len(everything.messages) == 5
        none = await backend.pull("T", 0, 0, 32, tag_filter=TagFilter.parse("Z"))
        assert (none.status, none.next_offset, none.messages) == (PullStatus.NO_MATCHED_MSG, 5, ())
        first_b = await backend.pull("T", 0, 0, 1, tag_filter=TagFilter.parse("B"))
        assert [m.queue_offset for m in first_b.messages] == [1]
        assert first_b.next_offset == 2


async def test_auto_create_and_queue_counts(make_backend: MakeBackend) -> None:
    async with make_backend(default_queue_count=6) as backend:
        assert await backend.get_topic("New") is None
        await backend.send(msg("New"))
        new = await backend.get_topic("New")
        assert new is not None
        assert (new.read_queues, new.write_queues) == (6, 6)
        for name in ("%RETRY%g1", "%DLQ%g1"):
            await backend.send(msg(name))
            config = await backend.get_topic(name)
            assert config is not None
            assert config.write_queues == 1
        explicit = await backend.create_topic("Eight", 8)
        assert explicit.write_queues == 8
        again = await backend.create_topic("Eight", 2)
        assert again.write_queues == 8, "create_topic is idempotent"
        lmq = await backend.get_topic("%LMQ%x")
        assert lmq is not None
        assert lmq.read_queues == 1


async def test_no_auto_create(make_backend: MakeBackend) -> None:
    async with make_backend(auto_create_topics=False) as backend:
        with pytest.raises(TopicNotFound):
            await backend.send(msg("Missing"))
        assert await backend.get_topic("Missing") is None
        await backend.create_topic("Made")
        assert (await backend.send(msg("Made"))).topic == "Made"


@pytest.mark.parametrize("name", ["", "a b", "topic/1", "ünï", "x" * 128, "a\x00"])
async def test_illegal_topics(make_backend: MakeBackend, name: str) -> None:
    async with make_backend() as backend:
        with pytest.raises(IllegalTopic):
            await backend.send(msg(name))
        with pytest.raises(IllegalTopic):
            await backend.create_topic(name)


async def test_long_retry_topic_exists_but_cannot_be_written(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        name = "%RETRY%" + "g" * 200
        assert (await backend.create_topic(name)).write_queues == 1
        with pytest.raises(IllegalTopic):
            await backend.send(msg(name))
        with pytest.raises(IllegalTopic):
            await backend.create_topic("%RETRY%" + "g" * 249)


async def test_unknown_topic_and_queue(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        with pytest.raises(TopicNotFound):
            await backend.pull("Nope", 0, 0, 1)
        with pytest.raises(TopicNotFound):
            await backend.max_offset("Nope", 0)
        await backend.create_topic("T", 2)
        with pytest.raises(QueueNotFound):
            await backend.send(msg(queue_id=2))
        with pytest.raises(QueueNotFound):
            await backend.pull("T", 5, 0, 1)
        with pytest.raises(QueueNotFound):
            await backend.pull("T", -1, 0, 1)


async def test_too_large(make_backend: MakeBackend) -> None:
    async with make_backend(max_message_bytes=1000) as backend:
        await backend.send(msg(body=bytes(1000)))
        with pytest.raises(MessageTooLarge):
            await backend.send(msg(body=bytes(1001)))
        with pytest.raises(MessageTooLarge):
            await backend.send(msg(properties={"K": "v" * 40000}))


@pytest.mark.parametrize("host", [("h", -1), ("h", 65536), ("x" * 256, 1)])
async def test_bad_born_host(make_backend: MakeBackend, host: tuple[str, int]) -> None:
    async with make_backend() as backend:
        with pytest.raises(BackendError, match="born_host"):
            await backend.send(msg(born_host=host))


async def test_batch_is_atomic_and_consecutive(make_backend: MakeBackend) -> None:
    async with make_backend(max_message_bytes=100) as backend:
        await backend.create_topic("T", 1)
        batch = [msg(queue_id=0, body=bytes([i])) for i in range(5)]
        results = await backend.send_batch(batch)
        assert [r.queue_offset for r in results] == [0, 1, 2, 3, 4]
        with pytest.raises(MessageTooLarge):
            await backend.send_batch([msg(queue_id=0), msg(queue_id=0, body=bytes(101))])
        assert await backend.max_offset("T", 0) == 5
        got = await backend.pull("T", 0, 0, 32)
        assert [m.body for m in got.messages] == [bytes([i]) for i in range(5)]


async def test_consumer_offsets(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        assert await backend.query_consumer_offset("G", "T", 0) is None
        await backend.commit_consumer_offset("G", "T", 0, 42)
        await backend.commit_consumer_offset("G", "T", 0, 43)
        assert await backend.query_consumer_offset("G", "T", 0) == 43
        assert await backend.query_consumer_offset("G", "T", 1) is None
        assert await backend.query_consumer_offset("H", "T", 0) is None


async def test_search_offset_and_earliest_time(
    make_backend: MakeBackend, wall_clock: Callable[[float], None]
) -> None:
    async with make_backend() as backend:
        await backend.create_topic("T", 1)
        assert await backend.earliest_store_time("T", 0) == -1
        assert await backend.search_offset("T", 0, 0) == 0
        times = []
        for _ in range(3):
            times.append((await backend.send(msg(queue_id=0))).store_timestamp_ms)
            wall_clock(0.003)
        assert await backend.earliest_store_time("T", 0) == times[0]
        assert await backend.search_offset("T", 0, 0) == 0
        assert await backend.search_offset("T", 0, times[1]) == 1
        assert await backend.search_offset("T", 0, times[2] + 1) == 3


async def test_long_poll_wakes_on_send(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        await backend.create_topic("T", 1)
        assert await _long_poll_result(backend, "T", 0, lambda: backend.send(msg(queue_id=0))) == [True]
        assert await backend.wait_for_message("T", 0, 0, 0) is True
        assert await backend.wait_for_message("T", 0, 1, 0) is False


async def test_long_poll_ignores_other_queues_then_times_out(
    make_backend: MakeBackend, autojump_clock: trio.testing.MockClock
) -> None:
    async with make_backend() as backend:
        await backend.create_topic("T", 2)
        async with trio.open_nursery() as nursery:
            result: list[tuple[bool, float]] = []

            async def waiter() -> None:
                start = trio.current_time()
                woke = await backend.wait_for_message("T", 0, 0, 15)
                result.append((woke, trio.current_time() - start))

            nursery.start_soon(waiter)
            await trio.sleep(1)
            await backend.send(msg(queue_id=1))
        ((woke, waited),) = result
        assert woke is False
        assert waited == pytest.approx(15, abs=0.01)


async def test_concurrent_producers_and_long_polling_consumers(make_backend: MakeBackend) -> None:
    """No lost wake-ups: consumers that long-poll each queue see every message, in offset order."""
    async with make_backend() as backend:
        await backend.create_topic("T", 2)
        received: dict[int, list[bytes]] = {0: [], 1: []}

        async def producer(p: int) -> None:
            for i in range(25):
                await backend.send(msg(queue_id=(p + i) % 2, body=f"{p}:{i}".encode()))
                if i % 5 == 0:
                    await trio.testing.wait_all_tasks_blocked()  # the consumers caught up and long-poll

        async def consumer(queue_id: int) -> None:
            offset = 0
            while len(received[queue_id]) < 100:
                if not await backend.wait_for_message("T", queue_id, offset, 5):
                    continue
                result = await backend.pull("T", queue_id, offset, 7)
                assert [m.queue_offset for m in result.messages] == list(range(offset, result.next_offset))
                received[queue_id] += [m.body for m in result.messages]
                offset = result.next_offset

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for queue_id in (0, 1):
                    nursery.start_soon(consumer, queue_id)
                for p in range(8):
                    nursery.start_soon(producer, p)
        everything = sorted(received[0] + received[1])
        assert everything == sorted(f"{p}:{i}".encode() for p in range(8) for i in range(25))
        for p in range(8):  # each producer's messages keep their order within a queue
            for queue_id in (0, 1):
                mine = [b for b in received[queue_id] if b.startswith(f"{p}:".encode())]
                assert mine == sorted(mine, key=lambda b: int(b.split(b":")[1]))


async def test_long_poll_is_cancellable(
    make_backend: MakeBackend, autojump_clock: trio.testing.MockClock
) -> None:
    async with make_backend() as backend:
        await backend.create_topic("T", 1)
        with trio.move_on_after(0.02) as scope:
            await backend.wait_for_message("T", 0, 0, 30)
        assert scope.cancelled_caught


async def test_consumer_membership(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        info = ConsumerInfo("c2@host", "G", (Subscription("T", "A||B"),))
        assert await backend.register_consumer(info) is True
        assert await backend.register_consumer(info) is False
        assert await backend.register_consumer(ConsumerInfo("c1@host", "G")) is True
        assert await backend.consumer_ids("G") == ["c1@host", "c2@host"]
        assert await backend.consumer_info("G", "c2@host") == info
        assert await backend.unregister_consumer("G", "c2@host") is True
        assert await backend.unregister_consumer("G", "c2@host") is False
        assert await backend.consumer_ids("G") == ["c1@host"]
        assert await backend.consumer_ids("Other") == []
        assert await backend.consumer_info("G", "c2@host") is None


async def test_lmq_multi_dispatch(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        first = await backend.send(msg("Parent", body=b"one", queue_id=1, dispatch=("%LMQ%a", "%LMQ%b")))
        assert first.lmq_offsets == {"%LMQ%a": 0, "%LMQ%b": 0}
        second = await backend.send(msg("Parent", body=b"two", dispatch=("%LMQ%b",)))
        assert second.lmq_offsets == {"%LMQ%b": 1}
        assert await backend.max_offset("%LMQ%a", 0) == 1
        assert await backend.max_offset("%LMQ%b", 0) == 2
        assert await backend.max_offset("%LMQ%never", 0) == 0
        got = await backend.pull("%LMQ%b", 0, 0, 32)
        assert [m.body for m in got.messages] == [b"one", b"two"]
        record = got.messages[0]
        assert (record.topic, record.queue_id, record.queue_offset) == ("Parent", 1, 0)
        assert record.commitlog_offset == first.commitlog_offset
        assert record.properties[PROPERTY_INNER_MULTI_DISPATCH] == "%LMQ%a,%LMQ%b"
        assert record.properties[PROPERTY_INNER_MULTI_QUEUE_OFFSET] == "0,0"
        assert got.messages[1].properties[PROPERTY_INNER_MULTI_QUEUE_OFFSET] == "1"
        assert (await backend.pull("Parent", 1, 0, 32)).messages[0].body == b"one"


async def test_lmq_wakes_long_poll(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:

        async def send() -> None:
            await backend.send(msg("Parent", dispatch=("%LMQ%w",)))

        assert await _long_poll_result(backend, "%LMQ%w", 0, send) == [True]


@pytest.mark.parametrize(
    ("topic", "dispatch"),
    [("Parent", ("notlmq",)), ("Parent", ("%LMQ%",)), ("Parent", ("%LMQ%a/b",)), ("%RETRY%g", ("%LMQ%a",))],
)
async def test_lmq_dispatch_rejected(
    make_backend: MakeBackend, topic: str, dispatch: tuple[str, ...]
) -> None:
    async with make_backend() as backend:
        with pytest.raises(IllegalTopic):
            await backend.send(msg(topic, dispatch=dispatch))
        assert await backend.get_topic(topic) is None, "nothing is created for a refused message"


_op = st.one_of(
    st.tuples(
        st.just("send"),
        st.sampled_from(["A", "B"]),
        st.integers(-1, 1),
        st.sampled_from([None, "x", "y"]),
        st.lists(st.sampled_from(["%LMQ%p", "%LMQ%q"]), max_size=2),
        st.integers(1, 3),
    ),
    st.tuples(
        st.just("pull"),
        st.sampled_from(["A", "B", "%LMQ%p", "%LMQ%q"]),
        st.integers(0, 1),
        st.integers(0, 6),
        st.sampled_from([None, "x", "y || x", "*"]),
        st.integers(1, 4),
    ),
    st.tuples(st.just("restart"), st.none(), st.none(), st.none(), st.none(), st.none()),
    st.tuples(
        st.just("rewrite"),
        st.sampled_from(["A", "B", "%LMQ%p", "%LMQ%q"]),
        st.integers(0, 1),
        st.lists(st.integers(0, 5), max_size=3, unique=True),
        st.integers(0, 6),
        st.none(),
    ),
    st.tuples(st.just("sweep"), st.none(), st.none(), st.none(), st.none(), st.none()),
)


def _view(result: PullResult) -> tuple[object, ...]:
    """A pull result without the store-specific fields (commit-log offset, size, timestamps)."""
    return (
        result.status,
        result.next_offset,
        result.min_offset,
        result.max_offset,
        tuple((m.topic, m.queue_id, m.queue_offset, m.body, dict(m.properties)) for m in result.messages),
    )


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_op, max_size=25))
def test_embedded_store_matches_the_memory_model_across_restarts(
    tmp_path_factory: pytest.TempPathFactory, ops: list[Any]
) -> None:
    data_dir = tmp_path_factory.mktemp("model")

    async def run() -> None:
        model = InMemoryBackend(default_queue_count=2)
        async with AsyncExitStack() as stack:
            store = await stack.enter_async_context(
                open_embedded_store(data_dir, default_queue_count=2, segment_bytes=4096)
            )
            for n, (kind, topic, queue_id, a, b, c) in enumerate(ops):
                if kind == "restart":
                    await stack.aclose()
                    store = await stack.enter_async_context(
                        open_embedded_store(data_dir, default_queue_count=2, segment_bytes=4096)
                    )
                elif kind == "send":
                    body, properties = f"{n}".encode() * c, {"TAGS": a} if a else {}
                    got = await store.send(
                        Message(topic, body, queue_id, properties=dict(properties), dispatch=tuple(b))
                    )
                    # The model follows the store's queue choice (round-robin restarts with the process).
                    expected = await model.send(
                        Message(topic, body, got.queue_id, properties=dict(properties), dispatch=tuple(b))
                    )
                    assert (got.queue_offset, got.lmq_offsets) == (
                        expected.queue_offset,
                        expected.lmq_offsets,
                    )
                elif kind == "sweep":
                    swept = [sorted(await be.delete_idle_lmqs(0, set())) for be in (model, store)]
                    assert swept[0] == swept[1]
                elif kind == "rewrite":
                    try:
                        lo, hi = (
                            await model.min_offset(topic, queue_id),
                            await model.max_offset(topic, queue_id),
                        )
                    except (TopicNotFound, QueueNotFound):
                        lo = hi = 0
                    below = lo + min(b, hi - lo)
                    keep = [lo + k for k in a if lo + k < below]
                    outcomes = []
                    for backend in (model, store):
                        try:
                            outcomes.append(await backend.rewrite_queue(topic, queue_id, keep, below))
                        except (TopicNotFound, QueueNotFound) as exc:
                            outcomes.append(type(exc))
                    assert outcomes[0] == outcomes[1]
                else:
                    tag_filter = TagFilter.parse(b) if b else None
                    outcomes: list[object] = []
                    for backend in (model, store):
                        try:
                            outcomes.append(
                                _view(await backend.pull(topic, queue_id, a, c, tag_filter=tag_filter))
                            )
                        except (TopicNotFound, QueueNotFound) as exc:
                            outcomes.append(type(exc))
                    assert outcomes[0] == outcomes[1]

    trio.run(run)


# --- queue lifecycle: rewrite_queue ---------------------------------------------------------------


async def _fill_queue(backend: MessageStore, topic: str, n: int, **kw: Any) -> list[Any]:
    return [await backend.send(msg(topic, body=f"m{i}".encode(), queue_id=0, **kw)) for i in range(n)]


async def test_rewrite_queue_moves_kept_messages_to_the_end(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        await backend.create_topic("S", 1)
        sent = await _fill_queue(backend, "S", 6, properties={"KEYS": "k"})
        before = {m.body: m for m in (await backend.pull("S", 0, 0, 32)).messages}
        assert await backend.rewrite_queue("S", 0, [1, 4, 3], 5) == 5
        assert (await backend.min_offset("S", 0), await backend.max_offset("S", 0)) == (5, 9)
        got = await backend.pull("S", 0, 5, 32)
        assert (got.status, got.min_offset, got.max_offset, got.next_offset) == (PullStatus.FOUND, 5, 9, 9)
        assert [m.body for m in got.messages] == [b"m5", b"m1", b"m4", b"m3"], "kept order, after the rest"
        assert [m.queue_offset for m in got.messages] == [5, 6, 7, 8]
        for m in got.messages:
            old = before[m.body]
            assert (m.commitlog_offset, m.store_timestamp_ms, dict(m.properties), m.body_crc) == (
                old.commitlog_offset,
                old.store_timestamp_ms,
                dict(old.properties),
                old.body_crc,
            ), "same stored message, no new record"
        assert await backend.get_message(sent[1].commitlog_offset) is not None
        below_min = await backend.pull("S", 0, 2, 32)
        assert (below_min.status, below_min.next_offset) == (PullStatus.OFFSET_ILLEGAL, 5)
        assert (await backend.pull("S", 0, 9, 32)).status is PullStatus.NO_NEW_MSG
        across = await backend.pull("S", 0, 5, 2)
        assert [m.body for m in across.messages] == [b"m5", b"m1"]
        assert (await backend.send(msg("S", body=b"after", queue_id=0))).queue_offset == 9
        assert await backend.search_offset("S", 0, 0) == 5
        assert await backend.search_offset("S", 0, 2**62) == 10


async def test_rewrite_queue_to_empty_keeps_the_max_offset(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        await backend.create_topic("S", 1)
        await _fill_queue(backend, "S", 4)
        assert await backend.rewrite_queue("S", 0, [], 4) == 4
        assert (await backend.min_offset("S", 0), await backend.max_offset("S", 0)) == (4, 4)
        assert await backend.earliest_store_time("S", 0) == -1
        empty = await backend.pull("S", 0, 4, 32)
        assert (empty.status, empty.next_offset, empty.max_offset) == (PullStatus.NO_NEW_MSG, 4, 4)
        stale = await backend.pull("S", 0, 0, 32)
        assert (stale.status, stale.next_offset) == (PullStatus.OFFSET_ILLEGAL, 4)
        assert await backend.rewrite_queue("S", 0, [], 4) == 4, "idempotent"
        assert (await backend.send(msg("S", queue_id=0))).queue_offset == 4
        assert await backend.rewrite_queue("S", 0, [4], 5) == 5, "compacting again"
        assert await backend.max_offset("S", 0) == 6


async def test_rewrite_of_a_light_queue(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        for i in range(5):
            await backend.send(msg("Parent", body=f"r{i}".encode(), queue_id=0, dispatch=("%LMQ%ret",)))
        assert await backend.rewrite_queue("%LMQ%ret", 0, [3, 0], 4) == 4
        got = await backend.pull("%LMQ%ret", 0, 4, 32)
        assert [m.body for m in got.messages] == [b"r4", b"r3", b"r0"]
        assert [m.queue_offset for m in got.messages] == [4, 3, 0], "LMQ reads report the parent's offsets"
        assert got.max_offset == 7
        waiting = await backend.wait_for_message("%LMQ%ret", 0, 6, 0)
        assert waiting is True
        parent = await backend.pull("Parent", 0, 0, 32)
        assert len(parent.messages) == 5, "the parent queue is untouched"
        nxt = await backend.send(msg("Parent", queue_id=0, dispatch=("%LMQ%ret",)))
        assert nxt.lmq_offsets == {"%LMQ%ret": 7}


async def test_rewrite_wakes_long_polling_readers(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        await backend.create_topic("S", 1)
        await _fill_queue(backend, "S", 2)
        rewrite = lambda: backend.rewrite_queue("S", 0, [1], 2)  # noqa: E731
        assert await _long_poll_result(backend, "S", 2, rewrite) == [True]


@pytest.mark.parametrize(
    ("keep", "below"),
    [([], 5), ([0], 1), ([2, 2], 3), ([3], 3), ([1], 5)],
    ids=["below-past-max", "keep-below-min", "duplicate", "keep-at-below", "below-past-max-keep"],
)
async def test_rewrite_rejects_bad_arguments_and_changes_nothing(
    make_backend: MakeBackend, keep: list[int], below: int
) -> None:
    async with make_backend() as backend:
        await backend.create_topic("S", 1)
        await _fill_queue(backend, "S", 4)
        await backend.rewrite_queue("S", 0, [], 1)
        with pytest.raises(BackendError):
            await backend.rewrite_queue("S", 0, keep, below)
        got = await backend.pull("S", 0, 1, 32)
        assert ([m.body for m in got.messages], got.min_offset, got.max_offset) == (
            [b"m1", b"m2", b"m3"],
            1,
            4,
        )


async def test_rewrite_of_a_missing_topic(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        with pytest.raises(TopicNotFound):
            await backend.rewrite_queue("Nope", 0, [], 0)
        assert await backend.rewrite_queue("%LMQ%never", 0, [], 0) == 0


# --- queue lifecycle: delete_idle_lmqs ------------------------------------------------------------


async def test_delete_idle_lmqs_honours_every_protection(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        names = [f"%LMQ%{c}" for c in "abcdef"]
        await backend.send(msg("Parent", queue_id=0, dispatch=tuple(names)))
        await backend.commit_consumer_offset("G", "%LMQ%c", 0, 1)  # read to the end
        await backend.commit_consumer_offset("G", "%LMQ%d", 0, 0)  # unread
        await backend.commit_consumer_offset("H", "%LMQ%f", 0, 1)
        await backend.commit_consumer_offset("G", "Parent", 0, 0)
        assert await backend.delete_idle_lmqs(3_600_000, set()) == [], "nothing is idle for an hour"
        async with trio.open_nursery() as nursery:

            async def waiter() -> None:
                await backend.wait_for_message("%LMQ%e", 0, 1, 30)

            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()  # the waiter waits
            deleted = await backend.delete_idle_lmqs(0, {"%LMQ%b"})
            nursery.cancel_scope.cancel()
        assert sorted(deleted) == ["%LMQ%a", "%LMQ%c", "%LMQ%f"]
        assert await backend.query_consumer_offset("G", "%LMQ%c", 0) is None
        assert await backend.query_consumer_offset("H", "%LMQ%f", 0) is None
        assert await backend.query_consumer_offset("G", "%LMQ%d", 0) == 0
        assert await backend.query_consumer_offset("G", "Parent", 0) == 0
        for name in ("%LMQ%b", "%LMQ%d", "%LMQ%e"):
            assert await backend.max_offset(name, 0) == 1, name
        assert await backend.max_offset("Parent", 0) == 1, "ordinary topics are never deleted"
        assert await backend.max_offset("%LMQ%a", 0) == 0
        assert (await backend.pull("%LMQ%a", 0, 0, 32)).status is PullStatus.NO_NEW_MSG
        again = await backend.send(msg("Parent", body=b"fresh", queue_id=0, dispatch=("%LMQ%a", "%LMQ%b")))
        assert again.lmq_offsets == {"%LMQ%a": 0, "%LMQ%b": 1}, "a deleted queue starts again at 0"
        assert [m.body for m in (await backend.pull("%LMQ%a", 0, 0, 32)).messages] == [b"fresh"]
        assert await backend.delete_idle_lmqs(0, set(), limit=0) == []


async def test_delete_idle_lmqs_waits_for_the_idle_time(
    make_backend: MakeBackend, wall_clock: Callable[[float], None]
) -> None:
    async with make_backend() as backend:
        await backend.send(msg("Parent", queue_id=0, dispatch=("%LMQ%x",)))
        assert await backend.delete_idle_lmqs(150, set()) == []
        wall_clock(0.2)
        await backend.send(msg("Parent", queue_id=0, dispatch=("%LMQ%y",)))
        assert await backend.delete_idle_lmqs(150, set()) == ["%LMQ%x"]


async def test_a_rewrite_counts_as_activity(
    make_backend: MakeBackend, wall_clock: Callable[[float], None]
) -> None:
    async with make_backend() as backend:
        await backend.send(msg("Parent", queue_id=0, dispatch=("%LMQ%x",)))
        wall_clock(0.2)
        await backend.rewrite_queue("%LMQ%x", 0, [], 1)
        assert await backend.delete_idle_lmqs(150, set()) == []
        await backend.commit_consumer_offset("G", "%LMQ%x", 0, 0)
        assert await backend.delete_idle_lmqs(0, set()) == [], "offset 0 is below the floor (1)"
        await backend.commit_consumer_offset("G", "%LMQ%x", 0, 1)
        assert await backend.delete_idle_lmqs(0, set()) == ["%LMQ%x"]
        assert await backend.max_offset("%LMQ%x", 0) == 0, "the floor went with the queue"


async def test_delete_idle_lmqs_limit_then_resume(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        names = [f"%LMQ%n{i}" for i in range(7)]
        await backend.send(msg("Parent", queue_id=0, dispatch=tuple(names)))
        first = await backend.delete_idle_lmqs(0, set(), limit=3)
        assert len(first) == 3
        rest = await backend.delete_idle_lmqs(0, set(), limit=10)
        assert sorted(first + rest) == sorted(names)
        assert await backend.delete_idle_lmqs(0, set()) == []


# --- admin: topic configs, topic list, lookup by key -------------------------------------------------


async def test_update_topic_creates_then_replaces_a_config(make_backend: MakeBackend) -> None:
    from mqproxy.model.types import TopicConfig

    async with make_backend() as backend:
        created = await backend.update_topic(TopicConfig("Adm", read_queues=3, write_queues=3, perm=6))
        assert await backend.get_topic("Adm") == created
        await backend.send(msg("Adm", queue_id=2))
        changed = await backend.update_topic(TopicConfig("Adm", read_queues=8, write_queues=2, perm=4))
        assert await backend.get_topic("Adm") == changed
        assert (await backend.pull("Adm", 2, 0, 1)).messages[0].body == b"hello"
        with pytest.raises(IllegalTopic):
            await backend.update_topic(TopicConfig("bad name", read_queues=1, write_queues=1))
        with pytest.raises(IllegalTopic):
            await backend.update_topic(TopicConfig("Adm", read_queues=0, write_queues=0))
        with pytest.raises(IllegalTopic):
            await backend.update_topic(TopicConfig("%LMQ%x", read_queues=1, write_queues=1))
        assert "Adm" in await backend.topic_names()
        assert await backend.topic_names() == sorted(await backend.topic_names())


async def test_updated_topic_config_survives_reopen(tmp_path: Path) -> None:
    from mqproxy.model.types import TopicConfig

    async with open_embedded_store(tmp_path) as store:
        await store.update_topic(TopicConfig("Kept", read_queues=5, write_queues=3, perm=6))
    async with open_embedded_store(tmp_path) as store:
        assert await store.get_topic("Kept") == TopicConfig("Kept", read_queues=5, write_queues=3, perm=6)


async def test_query_messages_finds_keys_and_unique_keys_newest_first(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        first = await backend.send(msg("Q", b"1", properties={"KEYS": "order-7 user-1", "UNIQ_KEY": "U1"}))
        await backend.send(msg("Q", b"2", properties={"KEYS": "order-8", "UNIQ_KEY": "U2"}))
        third = await backend.send(msg("Q", b"3", properties={"KEYS": "order-7", "UNIQ_KEY": "U3"}))
        await backend.send(msg("Other", b"4", properties={"KEYS": "order-7"}))
        found = await backend.query_messages("Q", "order-7", 32, 0, 2**62)
        assert [m.body for m in found] == [b"3", b"1"]
        assert [m.commitlog_offset for m in found] == [third.commitlog_offset, first.commitlog_offset]
        assert [m.body for m in await backend.query_messages("Q", "order-7", 1, 0, 2**62)] == [b"3"]
        assert [m.body for m in await backend.query_messages("Q", "U2", 32, 0, 2**62)] == [b"2"]
        assert [m.body for m in await backend.query_messages("Q", "user-1", 32, 0, 2**62)] == [b"1"]
        assert await backend.query_messages("Q", "order", 32, 0, 2**62) == []
        assert await backend.query_messages("Q", "order-7", 32, 0, first.store_timestamp_ms - 1) == []
        later = await backend.query_messages("Q", "order-7", 32, third.store_timestamp_ms, 2**62)
        assert b"3" in [m.body for m in later]


async def test_query_messages_after_reopen_and_after_a_lost_index(tmp_path: Path) -> None:
    import shutil

    async with open_embedded_store(tmp_path) as store:
        await store.send(msg("Q", b"kept", properties={"KEYS": "k1", "UNIQ_KEY": "U1"}))
    async with open_embedded_store(tmp_path) as store:
        assert [m.body for m in await store.query_messages("Q", "k1", 32, 0, 2**62)] == [b"kept"]
    shutil.rmtree(tmp_path / "index")  # recovery rebuilds the index from the commit log
    async with open_embedded_store(tmp_path) as store:
        assert [m.body for m in await store.query_messages("Q", "U1", 32, 0, 2**62)] == [b"kept"]
