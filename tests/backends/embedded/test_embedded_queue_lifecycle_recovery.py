"""Queue lifecycle (rewrites, LMQ deletion) across restarts and crashes of the embedded store."""

from __future__ import annotations

import os
import shutil
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from mqproxy.backends.embedded import embedded_queues
from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.backends.embedded.index import Index
from mqproxy.model.types import PROPERTY_INNER_MULTI_DISPATCH, Message

from .recovery_helpers import (  # type: ignore[import-not-found]
    async_flush_store,
    bodies,
    count_fdatasyncs,
    fill,
    recovered_event,
    segments,
)

# --- queue lifecycle across restarts and crashes ---------------------------------------------------


async def lmq_layout(store: Any, name: str) -> tuple[int, int, list[tuple[int, bytes]]]:
    """(min offset, max offset, [(commit-log offset, body)] from the min offset) of a light queue."""
    lo, hi = await store.min_offset(name, 0), await store.max_offset(name, 0)
    result = await store.pull(name, 0, lo, 1000)
    return lo, hi, [(m.commitlog_offset, m.body) for m in result.messages]


async def test_rewrite_and_floor_survive_restart(tmp_path: Path) -> None:
    await fill(tmp_path, 12)
    async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
        assert await store.rewrite_queue("T", 0, [2, 9], 10) == 10
        kept = await store.pull("T", 0, 10, 100)
        assert [m.queue_offset for m in kept.messages] == [10, 11, 12, 13]
        assert await store.rewrite_queue("%LMQ%room", 0, [], 4) == 4
    async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
        again = await store.pull("T", 0, 10, 100)
        assert [m.body for m in again.messages] == [b"m10" * 20, b"m11" * 20, b"m2" * 20, b"m9" * 20]
        assert [m.queue_offset for m in again.messages] == [10, 11, 12, 13]
        assert (await store.min_offset("T", 0), await store.max_offset("T", 0)) == (10, 14)
        assert await lmq_layout(store, "%LMQ%room") == (4, 4, []), "the floor is persisted"
        assert (await store.send(Message("T", b"x", 0, dispatch=("%LMQ%room",)))).lmq_offsets == {
            "%LMQ%room": 4
        }


async def test_redispatch_after_a_rewrite_is_exact(tmp_path: Path) -> None:
    await fill(tmp_path, 9)
    async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
        await store.rewrite_queue("%LMQ%room", 0, [1, 0], 3)
        later = [
            await store.send(Message("T", f"n{i}".encode(), 0, dispatch=("%LMQ%room",))) for i in range(3)
        ]
        assert [r.lmq_offsets["%LMQ%room"] for r in later] == [5, 6, 7]
        expected = await lmq_layout(store, "%LMQ%room")
    index = Index(tmp_path / "index")  # the index lost the transactions of the last three sends
    index.commit([], [], index.next_qid(), later[0].commitlog_offset, index.checkpoint()[1])
    index.close()
    with capture_logs() as logs:
        async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
            assert await lmq_layout(store, "%LMQ%room") == expected
            assert (await store.send(Message("T", b"z", 0, dispatch=("%LMQ%room",)))).lmq_offsets == {
                "%LMQ%room": 8
            }
    assert recovered_event(logs)["rebuilt_entries"] == 3 * 2


async def test_index_rolled_back_before_a_rewrite_shows_the_old_layout(tmp_path: Path) -> None:
    offsets = await fill(tmp_path, 9)  # %LMQ%room holds records 0, 3, 6 at offsets 0..2
    shutil.copytree(tmp_path / "index", tmp_path / "index-before")
    async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
        await store.rewrite_queue("%LMQ%room", 0, [2], 3)
        late = await store.send(Message("T", b"late", 0, dispatch=("%LMQ%room",)))
        assert late.lmq_offsets == {"%LMQ%room": 4}
    shutil.rmtree(tmp_path / "index")
    (tmp_path / "index-before").rename(tmp_path / "index")  # an OS crash rolled the index back
    async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
        lo, hi, entries = await lmq_layout(store, "%LMQ%room")
        assert (lo, hi) == (0, 5)
        old = [(offsets[i], f"m{i}".encode() * 20) for i in (0, 3, 6)]
        assert entries == [*old, (late.commitlog_offset, b"late")], "old layout; the later record keeps 4"
        assert (await store.send(Message("T", b"z", 0, dispatch=("%LMQ%room",)))).lmq_offsets == {
            "%LMQ%room": 5
        }


async def _delete_and_recreate(tmp_path: Path) -> int:
    """Fill, let %LMQ%room be read and deleted, then re-create it with one record; return its offset."""
    await fill(tmp_path, 9)
    async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
        await store.commit_consumer_offset("G", "%LMQ%room", 0, 3)
    shutil.copytree(tmp_path / "index", tmp_path / "index-before")
    async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
        assert await store.delete_idle_lmqs(0, set()) == ["%LMQ%room"]
        assert await store.query_consumer_offset("G", "%LMQ%room", 0) is None
        fresh = await store.send(Message("T", b"fresh", 0, dispatch=("%LMQ%room",)))
        assert fresh.lmq_offsets == {"%LMQ%room": 0}
        assert await store.max_offset("%LMQ%room", 0) == 1
    async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
        assert await lmq_layout(store, "%LMQ%room") == (0, 1, [(fresh.commitlog_offset, b"fresh")])
    return fresh.commitlog_offset


async def test_a_lost_deletion_is_detected_when_the_queue_restarts_at_zero(tmp_path: Path) -> None:
    fresh = await _delete_and_recreate(tmp_path)
    shutil.rmtree(tmp_path / "index")
    (tmp_path / "index-before").rename(tmp_path / "index")  # the deletion never reached the disk
    async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
        assert await lmq_layout(store, "%LMQ%room") == (0, 1, [(fresh, b"fresh")]), "only the new generation"
        assert await store.query_consumer_offset("G", "%LMQ%room", 0) is None, "old readers' offsets dropped"
        assert await store.query_consumer_offset("G", "T", 0) == 5
        assert (await store.send(Message("T", b"x", 0, dispatch=("%LMQ%room",)))).lmq_offsets == {
            "%LMQ%room": 1
        }
        assert len(await bodies(store)) == 11


async def test_full_rebuild_after_delete_and_recreate(tmp_path: Path) -> None:
    fresh = await _delete_and_recreate(tmp_path)
    shutil.rmtree(tmp_path / "index")
    for _ in range(2):  # the second open reads the queue from the index alone (no cached next offset)
        async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
            assert await lmq_layout(store, "%LMQ%room") == (0, 1, [(fresh, b"fresh")])
            assert len(await bodies(store)) == 10


async def test_torn_tail_after_a_rewrite_rebuilds_a_consistent_queue(tmp_path: Path) -> None:
    offsets = await fill(tmp_path, 9)
    async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
        await store.rewrite_queue("%LMQ%room", 0, [0], 3)
        await store.send(Message("T", b"kept", 0, dispatch=("%LMQ%room",)))
        await store.send(Message("T", b"torn", 0, dispatch=("%LMQ%room",)))
    last = segments(tmp_path)[-1]
    os.truncate(last, last.stat().st_size - 3)
    async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
        lo, hi, entries = await lmq_layout(store, "%LMQ%room")
        # The log lost a record the index had seen: every queue is rebuilt from the log, which knows
        # nothing of the rewrite (old layout) but keeps the surviving later record at its offset.
        assert [body for _, body in entries] == [b"m0" * 20, b"m3" * 20, b"m6" * 20, b"kept"]
        assert (lo, hi) == (0, 5)
        assert entries[0][0] == offsets[0]
        assert (await store.pull("T", 0, 0, 100)).max_offset == 10


async def test_rewrite_waits_until_the_kept_records_are_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    async with async_flush_store(tmp_path) as store:
        calls = count_fdatasyncs(monkeypatch)
        await store.create_topic("S", 1)
        for i in range(3):
            await store.send(Message("S", bytes([i]), 0))
        assert calls == []
        start = trio.current_time()
        assert await store.rewrite_queue("S", 0, [0], 2) == 2
        assert calls, "the rewrite was committed before its records were fdatasync'ed"
        assert trio.current_time() - start <= 0.25
        assert [m.body for m in (await store.pull("S", 0, 2, 10)).messages] == [b"\x02", b"\x00"]
        before = len(calls)
        await store.rewrite_queue("S", 0, [3], 4)
        assert len(calls) == before, "already durable: no extra wait"


async def test_lmq_offsets_from_an_older_store_are_indexed_on_open(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        await store.send(Message("T", b"x", 0, dispatch=("%LMQ%a", "%LMQ%b")))
        await store.commit_consumer_offset("G", "%LMQ%a", 0, 0)
    index = Index(tmp_path / "index")
    with index._env.begin(write=True) as txn:  # what a store written before the reverse index holds
        txn.drop(index._lmq_offsets, delete=False)
        txn.delete(b"lmqoffs", db=index._meta)
    index.close()
    async with open_embedded_store(tmp_path) as store:
        assert await store.delete_idle_lmqs(0, set()) == ["%LMQ%b"], (
            "the unread offset on %LMQ%a still counts"
        )


async def test_the_sweep_yields_between_chunks_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded_queues, "SWEEP_CHUNK", 1)  # one deletion per event-loop turn
    monkeypatch.setattr(embedded_queues, "SWEEP_SLICE_S", 60.0)  # slices end by count, not by time
    names = [f"%LMQ%n{i}" for i in range(9)]
    async with open_embedded_store(tmp_path) as store:
        await store.send(Message("T", b"x", 0, dispatch=tuple(names)))
        ticks = 0

        async def probe() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe)
            await trio.lowlevel.checkpoint()
            ticks = 0
            first = await store.delete_idle_lmqs(0, {"%LMQ%n0"}, limit=3)
            assert ticks >= 3, "the sweep let other tasks run between chunks"
            nursery.cancel_scope.cancel()
        assert first == ["%LMQ%n1", "%LMQ%n2", "%LMQ%n3"]
        second = await store.delete_idle_lmqs(0, {"%LMQ%n0"}, limit=3)
        assert second == ["%LMQ%n4", "%LMQ%n5", "%LMQ%n6"], "resumes where the last call stopped"
        assert await store.delete_idle_lmqs(0, set(), limit=10) == ["%LMQ%n7", "%LMQ%n8", "%LMQ%n0"], "wraps"


async def test_a_call_stops_after_its_time_budget_and_the_next_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded_queues, "SWEEP_CHUNK", 1)
    monkeypatch.setattr(embedded_queues, "SWEEP_SLICE_S", 60.0)  # slices end by count, not by time
    monkeypatch.setattr(embedded_queues, "SWEEP_CALL_BUDGET_S", 1e-9)  # one slice per call
    names = [f"%LMQ%n{i}" for i in range(3)]
    async with open_embedded_store(tmp_path) as store:
        await store.send(Message("T", b"x", 0, dispatch=tuple(names)))
        assert [await store.delete_idle_lmqs(0, set()) for _ in range(4)] == [[n] for n in names] + [[]]


_LMQS = ["%LMQ%a", "%LMQ%b", "%LMQ%c"]
_crash_op = st.one_of(
    st.tuples(st.just("send"), st.lists(st.sampled_from(_LMQS), min_size=1, max_size=3, unique=True)),
    st.tuples(
        st.just("rewrite"), st.sampled_from(_LMQS), st.lists(st.integers(0, 4), max_size=2, unique=True)
    ),
    st.tuples(st.just("sweep"), st.sampled_from([set(), {"%LMQ%a"}])),
    st.tuples(st.just("read"), st.sampled_from(_LMQS)),  # a reader commits its offset at the end
    st.tuples(st.just("snapshot")),  # the index as an OS crash right now would leave it
    st.tuples(st.just("crash")),  # reopen with the last snapshot of the index and the whole log
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_crash_op, max_size=30))
def test_rewrites_and_deletions_survive_index_rollbacks(
    tmp_path_factory: pytest.TempPathFactory, ops: list[Any]
) -> None:
    """After any rollback of the index to an earlier state, every light queue is a consistent queue: its
    messages are readable and belong to it, no message sits in it twice, and the next send lands at its
    max offset. The parent topic (never rewritten) keeps every record of the log."""
    data_dir = tmp_path_factory.mktemp("crash")
    snapshot = data_dir.parent / f"{data_dir.name}-index"

    async def check(store: Any, sent: int) -> None:
        assert (await store.pull("T", 0, 0, 1000)).max_offset == sent
        for name in _LMQS:
            lo, hi = await store.min_offset(name, 0), await store.max_offset(name, 0)
            assert lo <= hi
            got = await store.pull(name, 0, lo, 1000)
            clos = [m.commitlog_offset for m in got.messages]
            assert len(clos) == len(set(clos)), f"{name} holds a message twice"
            for m in got.messages:
                assert name in m.properties[PROPERTY_INNER_MULTI_DISPATCH].split(",")
            committed = await store.query_consumer_offset("G", name, 0)
            assert committed is None or committed <= hi, "no reader is left past the end"

    async def run() -> None:
        sent = 0
        async with AsyncExitStack() as stack:
            store = await stack.enter_async_context(open_embedded_store(data_dir))
            await store.create_topic("T", 1)
            store._index.sync()
            shutil.copytree(data_dir / "index", snapshot)
            for op in ops:
                if op[0] == "send":
                    await store.send(Message("T", b"x", 0, dispatch=tuple(op[1])))
                    sent += 1
                elif op[0] == "rewrite":
                    lo, hi = await store.min_offset(op[1], 0), await store.max_offset(op[1], 0)
                    keep = [lo + k for k in op[2] if lo + k < hi]
                    await store.rewrite_queue(op[1], 0, keep, hi)
                elif op[0] == "sweep":
                    await store.delete_idle_lmqs(0, op[1])
                elif op[0] == "read":
                    await store.commit_consumer_offset("G", op[1], 0, await store.max_offset(op[1], 0))
                elif op[0] == "snapshot":
                    store._index.sync()
                    shutil.rmtree(snapshot)
                    shutil.copytree(data_dir / "index", snapshot)
                else:
                    await stack.aclose()
                    shutil.rmtree(data_dir / "index")
                    shutil.copytree(snapshot, data_dir / "index")
                    store = await stack.enter_async_context(open_embedded_store(data_dir))
                    await check(store, sent)
                    for name in _LMQS:
                        before = await store.max_offset(name, 0)
                        result = await store.send(Message("T", b"x", 0, dispatch=(name,)))
                        sent += 1
                        assert result.lmq_offsets[name] == before
            await check(store, sent)
        shutil.rmtree(snapshot)

    trio.run(run)
