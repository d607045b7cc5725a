"""The MessageStore contract, run against every store kind: queue lifecycle (rewrite_queue,
delete_idle_lmqs)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio
import trio.testing

from mqproxy.model.errors import BackendError, TopicNotFound
from mqproxy.model.types import (
    PullStatus,
)

from .conftest import MakeStore, fill_queue, long_poll_result, msg  # type: ignore[import-not-found]

# --- queue lifecycle: rewrite_queue ---------------------------------------------------------------


async def test_rewrite_queue_moves_kept_messages_to_the_end(make_store: MakeStore) -> None:
    async with make_store() as backend:
        await backend.create_topic("S", 1)
        sent = await fill_queue(backend, "S", 6, properties={"KEYS": "k"})
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


async def test_rewrite_queue_to_empty_keeps_the_max_offset(make_store: MakeStore) -> None:
    async with make_store() as backend:
        await backend.create_topic("S", 1)
        await fill_queue(backend, "S", 4)
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


async def test_rewrite_of_a_light_queue(make_store: MakeStore) -> None:
    async with make_store() as backend:
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


async def test_rewrite_wakes_long_polling_readers(make_store: MakeStore) -> None:
    async with make_store() as backend:
        await backend.create_topic("S", 1)
        await fill_queue(backend, "S", 2)
        rewrite = lambda: backend.rewrite_queue("S", 0, [1], 2)  # noqa: E731
        assert await long_poll_result(backend, "S", 2, rewrite) == [True]


@pytest.mark.parametrize(
    ("keep", "below"),
    [([], 5), ([0], 1), ([2, 2], 3), ([3], 3), ([1], 5)],
    ids=["below-past-max", "keep-below-min", "duplicate", "keep-at-below", "below-past-max-keep"],
)
async def test_rewrite_rejects_bad_arguments_and_changes_nothing(
    make_store: MakeStore, keep: list[int], below: int
) -> None:
    async with make_store() as backend:
        await backend.create_topic("S", 1)
        await fill_queue(backend, "S", 4)
        await backend.rewrite_queue("S", 0, [], 1)
        with pytest.raises(BackendError):
            await backend.rewrite_queue("S", 0, keep, below)
        got = await backend.pull("S", 0, 1, 32)
        assert ([m.body for m in got.messages], got.min_offset, got.max_offset) == (
            [b"m1", b"m2", b"m3"],
            1,
            4,
        )


async def test_rewrite_of_a_missing_topic(make_store: MakeStore) -> None:
    async with make_store() as backend:
        with pytest.raises(TopicNotFound):
            await backend.rewrite_queue("Nope", 0, [], 0)
        assert await backend.rewrite_queue("%LMQ%never", 0, [], 0) == 0


# --- queue lifecycle: delete_idle_lmqs ------------------------------------------------------------


async def test_delete_idle_lmqs_honours_every_protection(make_store: MakeStore) -> None:
    async with make_store() as backend:
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
    make_store: MakeStore, wall_clock: Callable[[float], None]
) -> None:
    async with make_store() as backend:
        await backend.send(msg("Parent", queue_id=0, dispatch=("%LMQ%x",)))
        assert await backend.delete_idle_lmqs(150, set()) == []
        wall_clock(0.2)
        await backend.send(msg("Parent", queue_id=0, dispatch=("%LMQ%y",)))
        assert await backend.delete_idle_lmqs(150, set()) == ["%LMQ%x"]


async def test_a_rewrite_counts_as_activity(
    make_store: MakeStore, wall_clock: Callable[[float], None]
) -> None:
    async with make_store() as backend:
        await backend.send(msg("Parent", queue_id=0, dispatch=("%LMQ%x",)))
        wall_clock(0.2)
        await backend.rewrite_queue("%LMQ%x", 0, [], 1)
        assert await backend.delete_idle_lmqs(150, set()) == []
        await backend.commit_consumer_offset("G", "%LMQ%x", 0, 0)
        assert await backend.delete_idle_lmqs(0, set()) == [], "offset 0 is below the floor (1)"
        await backend.commit_consumer_offset("G", "%LMQ%x", 0, 1)
        assert await backend.delete_idle_lmqs(0, set()) == ["%LMQ%x"]
        assert await backend.max_offset("%LMQ%x", 0) == 0, "the floor went with the queue"


async def test_delete_idle_lmqs_limit_then_resume(make_store: MakeStore) -> None:
    async with make_store() as backend:
        names = [f"%LMQ%n{i}" for i in range(7)]
        await backend.send(msg("Parent", queue_id=0, dispatch=tuple(names)))
        first = await backend.delete_idle_lmqs(0, set(), limit=3)
        assert len(first) == 3
        rest = await backend.delete_idle_lmqs(0, set(), limit=10)
        assert sorted(first + rest) == sorted(names)
        assert await backend.delete_idle_lmqs(0, set()) == []
