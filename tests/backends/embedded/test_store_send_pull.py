"""The MessageStore contract, run against every store kind: send and pull, offsets, tag filters, topic
creation and validation, batches, consumer offsets and time search."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from mqproxy.backends.embedded.store import MessageStore
from mqproxy.model.errors import BackendError, IllegalTopic, MessageTooLarge, QueueNotFound, TopicNotFound
from mqproxy.model.types import (
    Message,
    PullStatus,
    TagFilter,
)

from .conftest import MakeStore, msg  # type: ignore[import-not-found]


async def test_is_a_backend(make_store: MakeStore) -> None:
    async with make_store() as backend:
        assert isinstance(backend, MessageStore)


async def test_send_then_pull_round_trips_every_field(make_store: MakeStore) -> None:
    async with make_store(store_host=("10.0.0.9", 10911)) as backend:
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


async def test_offsets_are_per_queue_and_commitlog_offsets_unique(make_store: MakeStore) -> None:
    async with make_store() as backend:
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


async def test_get_message_by_commitlog_offset(make_store: MakeStore) -> None:
    async with make_store() as backend:
        sent = [await backend.send(msg(body=bytes([i]) * 10, queue_id=i % 2)) for i in range(5)]
        for i, result in enumerate(sent):
            stored = await backend.get_message(result.commitlog_offset)  # type: ignore[attr-defined]
            assert stored is not None
            assert (stored.body, stored.queue_id, stored.queue_offset) == (bytes([i]) * 10, i % 2, i // 2)
            assert stored.commitlog_offset == result.commitlog_offset
        assert await backend.get_message(sent[1].commitlog_offset + 1) is None  # type: ignore[attr-defined]
        assert await backend.get_message(-1) is None  # type: ignore[attr-defined]
        assert await backend.get_message(10**12) is None  # type: ignore[attr-defined]


async def test_queue_minus_one_spreads_over_queues(make_store: MakeStore) -> None:
    async with make_store() as backend:
        queues = {(await backend.send(msg())).queue_id for _ in range(8)}
        assert queues == {0, 1, 2, 3}


async def test_pull_status_table(make_store: MakeStore) -> None:
    async with make_store() as backend:
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


async def test_pull_honours_max_count_and_max_bytes(make_store: MakeStore) -> None:
    async with make_store() as backend:
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


async def test_tag_filter(make_store: MakeStore) -> None:
    async with make_store() as backend:
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


async def test_auto_create_and_queue_counts(make_store: MakeStore) -> None:
    async with make_store(default_queue_count=6) as backend:
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


async def test_no_auto_create(make_store: MakeStore) -> None:
    async with make_store(auto_create_topics=False) as backend:
        with pytest.raises(TopicNotFound):
            await backend.send(msg("Missing"))
        assert await backend.get_topic("Missing") is None
        await backend.create_topic("Made")
        assert (await backend.send(msg("Made"))).topic == "Made"


@pytest.mark.parametrize("name", ["", "a b", "topic/1", "ünï", "x" * 128, "a\x00"])
async def test_illegal_topics(make_store: MakeStore, name: str) -> None:
    async with make_store() as backend:
        with pytest.raises(IllegalTopic):
            await backend.send(msg(name))
        with pytest.raises(IllegalTopic):
            await backend.create_topic(name)


async def test_long_retry_topic_exists_but_cannot_be_written(make_store: MakeStore) -> None:
    async with make_store() as backend:
        name = "%RETRY%" + "g" * 200
        assert (await backend.create_topic(name)).write_queues == 1
        with pytest.raises(IllegalTopic):
            await backend.send(msg(name))
        with pytest.raises(IllegalTopic):
            await backend.create_topic("%RETRY%" + "g" * 249)


async def test_unknown_topic_and_queue(make_store: MakeStore) -> None:
    async with make_store() as backend:
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


async def test_too_large(make_store: MakeStore) -> None:
    async with make_store(max_message_bytes=1000) as backend:
        await backend.send(msg(body=bytes(1000)))
        with pytest.raises(MessageTooLarge):
            await backend.send(msg(body=bytes(1001)))
        with pytest.raises(MessageTooLarge):
            await backend.send(msg(properties={"K": "v" * 40000}))


@pytest.mark.parametrize("host", [("h", -1), ("h", 65536), ("x" * 256, 1)])
async def test_bad_born_host(make_store: MakeStore, host: tuple[str, int]) -> None:
    async with make_store() as backend:
        with pytest.raises(BackendError, match="born_host"):
            await backend.send(msg(born_host=host))


async def test_batch_is_atomic_and_consecutive(make_store: MakeStore) -> None:
    async with make_store(max_message_bytes=100) as backend:
        await backend.create_topic("T", 1)
        batch = [msg(queue_id=0, body=bytes([i])) for i in range(5)]
        results = await backend.send_batch(batch)
        assert [r.queue_offset for r in results] == [0, 1, 2, 3, 4]
        with pytest.raises(MessageTooLarge):
            await backend.send_batch([msg(queue_id=0), msg(queue_id=0, body=bytes(101))])
        assert await backend.max_offset("T", 0) == 5
        got = await backend.pull("T", 0, 0, 32)
        assert [m.body for m in got.messages] == [bytes([i]) for i in range(5)]


async def test_consumer_offsets(make_store: MakeStore) -> None:
    async with make_store() as backend:
        assert await backend.query_consumer_offset("G", "T", 0) is None
        await backend.commit_consumer_offset("G", "T", 0, 42)
        await backend.commit_consumer_offset("G", "T", 0, 43)
        assert await backend.query_consumer_offset("G", "T", 0) == 43
        assert await backend.query_consumer_offset("G", "T", 1) is None
        assert await backend.query_consumer_offset("H", "T", 0) is None


async def test_search_offset_and_earliest_time(
    make_store: MakeStore, wall_clock: Callable[[float], None]
) -> None:
    async with make_store() as backend:
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
