"""EmbeddedStore durability: restart, torn tails, corruption, index rebuild, fsync policy, kill -9."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import MutableMapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from mqproxy.backends.embedded import embedded_queues
from mqproxy.backends.embedded.commitlog import segment_name
from mqproxy.backends.embedded.embedded import EmbeddedStore, open_embedded_store
from mqproxy.backends.embedded.index import Index
from mqproxy.model.errors import StoreUnavailable
from mqproxy.model.types import PROPERTY_INNER_MULTI_DISPATCH, Message, PullStatus


def _count_fdatasyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, every ``os.fdatasync`` still syncs and appends its fd to the returned list."""
    calls: list[int] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    return calls


def _async_flush_store(tmp_path: Path) -> AbstractAsyncContextManager[EmbeddedStore]:
    """A store that fdatasyncs every 200 ms, on the event loop (so a mock clock drives it)."""
    return open_embedded_store(tmp_path, flush="async", flush_interval_ms=200, fsync_in_thread=False)


_SCHEMA = json.loads((files("mqproxy.config") / "log_event.schema.json").read_text(encoding="utf-8"))


def recovered_event(logs: list[MutableMapping[str, Any]]) -> MutableMapping[str, Any]:
    """The one store.recovered event, checked against the log-event schema."""
    (event,) = [e for e in logs if e["event"] == "store.recovered"]
    line = {k: v for k, v in event.items() if k != "log_level"}
    line |= {"ts": "2026-11-22T00:00:00Z", "level": event["log_level"]}
    jsonschema.validate(line, _SCHEMA)
    return event


async def fill(data_dir: Path, n: int = 20, **kwargs: Any) -> list[int]:
    """Store n messages in T/0 (every third also into %LMQ%room); return their commit-log offsets."""
    async with open_embedded_store(data_dir, segment_bytes=8192, **kwargs) as store:
        await store.create_topic("T", 2)
        await store.commit_consumer_offset("G", "T", 0, 5)
        offsets = []
        for i in range(n):
            dispatch = ("%LMQ%room",) if i % 3 == 0 else ()
            result = await store.send(Message("T", f"m{i}".encode() * 20, queue_id=0, dispatch=dispatch))
            offsets.append(result.commitlog_offset)
        return offsets


async def bodies(store: Any, topic: str = "T", queue_id: int = 0) -> list[bytes]:
    result = await store.pull(topic, queue_id, 0, 1000)
    return [m.body for m in result.messages]


def segments(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "commitlog").iterdir())


async def test_restart_loses_nothing(tmp_path: Path) -> None:
    offsets = await fill(tmp_path, 30)
    with capture_logs() as logs:
        async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
            assert await bodies(store) == [f"m{i}".encode() * 20 for i in range(30)]
            assert [m.commitlog_offset for m in (await store.pull("T", 0, 0, 100)).messages] == offsets
            assert await store.max_offset("%LMQ%room", 0) == 10
            assert (await store.get_topic("T")).write_queues == 2  # type: ignore[union-attr]
            assert await store.query_consumer_offset("G", "T", 0) == 5
            nxt = await store.send(Message("T", b"after", queue_id=0, dispatch=("%LMQ%room",)))
            assert (nxt.queue_offset, nxt.lmq_offsets) == (30, {"%LMQ%room": 10})
            assert nxt.commitlog_offset > offsets[-1]
    event = recovered_event(logs)
    assert event["log_level"] == "info"
    assert (event["truncated_bytes"], event["rebuilt_entries"]) == (0, 0)
    assert event["data_dir"] == str(tmp_path)
    assert event["records"] > 0


async def test_torn_tail_garbage_is_truncated(tmp_path: Path) -> None:
    await fill(tmp_path, 10)
    last = segments(tmp_path)[-1]
    last.write_bytes(last.read_bytes() + b"\x00\x00\x01\x00garbage-half-record")
    with capture_logs() as logs:
        async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
            assert len(await bodies(store)) == 10
            await store.send(Message("T", b"new", queue_id=0))
            assert (await bodies(store))[-1] == b"new"
    event = recovered_event(logs)
    assert event["truncated_bytes"] == 23
    assert event["log_level"] == "warning"


async def test_record_cut_in_half_rebuilds_the_index(tmp_path: Path) -> None:
    await fill(tmp_path, 10)
    last = segments(tmp_path)[-1]
    size = last.stat().st_size
    os.truncate(last, size - 30)
    with capture_logs() as logs:
        async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
            assert await bodies(store) == [f"m{i}".encode() * 20 for i in range(9)]
            assert await store.max_offset("T", 0) == 9
            assert await store.max_offset("%LMQ%room", 0) == 3, "message 9 was also in the LMQ; it is gone"
            assert (await store.send(Message("T", b"x", queue_id=0))).queue_offset == 9
    event = recovered_event(logs)
    assert event["truncated_bytes"] > 0
    assert event["rebuilt_entries"] == 9 + 3


async def test_crc_corruption_in_the_tail(tmp_path: Path) -> None:
    offsets = await fill(tmp_path, 10)
    last = segments(tmp_path)[-1]
    base = int(last.name)
    in_last = [i for i, o in enumerate(offsets) if o >= base]
    assert len(in_last) >= 3
    victim = in_last[len(in_last) // 2]  # a record in the middle of the last segment
    data = bytearray(last.read_bytes())
    data[offsets[victim] - base + 40] ^= 0x55
    last.write_bytes(bytes(data))
    with capture_logs() as logs:
        async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
            assert await bodies(store) == [f"m{i}".encode() * 20 for i in range(victim)]
    event = recovered_event(logs)
    assert event["truncated_bytes"] == len(data) - (offsets[victim] - base)


async def test_index_behind_the_log_is_redispatched(tmp_path: Path) -> None:
    offsets = await fill(tmp_path, 12)
    index = Index(tmp_path / "index")
    index.reset_queues()
    index.close()
    with capture_logs() as logs:
        async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
            assert await bodies(store) == [f"m{i}".encode() * 20 for i in range(12)]
            lmq = await store.pull("%LMQ%room", 0, 0, 100)
            assert [m.commitlog_offset for m in lmq.messages] == offsets[::3]
            assert await store.query_consumer_offset("G", "T", 0) == 5, "offsets are not part of the rebuild"
    assert recovered_event(logs)["rebuilt_entries"] == 12 + 4


async def test_deleted_index_is_rebuilt_from_the_log(tmp_path: Path) -> None:
    await fill(tmp_path, 12, default_queue_count=3)
    shutil.rmtree(tmp_path / "index")
    async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
        assert await bodies(store) == [f"m{i}".encode() * 20 for i in range(12)]
        topic = await store.get_topic("T")
        assert topic is not None
        assert topic.write_queues == 4, "default count (4) covers queue 0"
        assert await store.max_offset("%LMQ%room", 0) == 4
        assert await store.query_consumer_offset("G", "T", 0) is None


async def test_rewound_checkpoint_redispatch_is_idempotent(tmp_path: Path) -> None:
    offsets = await fill(tmp_path, 12)
    index = Index(tmp_path / "index")
    index.commit([], [], index.next_qid(), offsets[6], index.checkpoint()[1])
    index.close()
    with capture_logs() as logs:
        async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
            assert len(await bodies(store)) == 12
            assert await store.max_offset("%LMQ%room", 0) == 4
    assert recovered_event(logs)["rebuilt_entries"] == 6 + 2


async def test_store_time_never_goes_back_across_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_embedded_store(tmp_path) as store:
        first = await store.send(Message("T", b"a", queue_id=0))
    monkeypatch.setattr(time, "time_ns", lambda: 1_000_000_000)  # the wall clock stepped back to 1970
    async with open_embedded_store(tmp_path) as store:
        second = await store.send(Message("T", b"b", queue_id=0))
        assert second.store_timestamp_ms == first.store_timestamp_ms
        assert await store.search_offset("T", 0, first.store_timestamp_ms) == 0


async def test_sync_flush_acks_only_after_fdatasync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fdatasync

    def counting(fd: int) -> None:
        real(fd)
        synced.append(os.fstat(fd).st_size)

    async with open_embedded_store(tmp_path, flush="sync", segment_bytes=1 << 20) as store:
        monkeypatch.setattr(os, "fdatasync", counting)
        for i in range(5):
            result = await store.send(Message("T", b"x" * 100, queue_id=0))
            assert synced, "send returned before any fdatasync"
            assert synced[-1] >= result.commitlog_offset + 1, "the fsync covered the record"
            assert len(synced) == i + 1


async def test_concurrent_sync_sends_share_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with open_embedded_store(tmp_path, flush="sync") as store:
        await store.create_topic("T", 4)
        calls = _count_fdatasyncs(monkeypatch)
        acked: list[int] = []

        async def sender(i: int) -> None:
            acked.append((await store.send(Message("T", bytes(64), queue_id=i % 4))).commitlog_offset)

        async with trio.open_nursery() as nursery:
            for i in range(64):
                nursery.start_soon(sender, i)
        assert len(acked) == 64
        assert 1 <= len(calls) <= 4, f"64 concurrent sends took {len(calls)} fsyncs"


async def test_async_flush_syncs_periodically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    async with _async_flush_store(tmp_path) as store:
        calls = _count_fdatasyncs(monkeypatch)
        await store.send(Message("T", b"x"))
        assert calls == [], "async flush acknowledges before fsync"
        await trio.sleep(0.25)
        assert len(calls) == 1
        await trio.sleep(1)
        assert len(calls) == 1, "nothing new, no fsync"


async def test_failed_fsync_makes_the_store_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    async with open_embedded_store(tmp_path, flush="sync") as store:
        monkeypatch.setattr(os, "fdatasync", failing)
        with pytest.raises(StoreUnavailable, match="fsync"):
            await store.send(Message("T", b"x"))
        with pytest.raises(StoreUnavailable):
            await store.send(Message("T", b"y"))
        monkeypatch.undo()


async def test_failed_index_write_rolls_the_append_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_embedded_store(tmp_path) as store:
        await store.send(Message("T", b"kept", queue_id=0))
        end_before = store._log.end

        def broken(*args: object) -> None:
            raise StoreUnavailable("index write failed: disk full")

        monkeypatch.setattr(store._index, "commit", broken)
        with pytest.raises(StoreUnavailable, match="disk full"):
            await store.send(Message("T", b"lost", queue_id=0, dispatch=("%LMQ%fresh",)))
        assert store._log.end == end_before, "the unacknowledged record was cut off"
        monkeypatch.undo()
        retry = await store.send(Message("T", b"retry", queue_id=0, dispatch=("%LMQ%fresh",)))
        assert (retry.queue_offset, retry.lmq_offsets) == (1, {"%LMQ%fresh": 0})
    async with open_embedded_store(tmp_path) as store:
        assert await bodies(store) == [b"kept", b"retry"]
        assert [m.body for m in (await store.pull("%LMQ%fresh", 0, 0, 10)).messages] == [b"retry"]


async def test_closed_store_and_second_opener(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        with pytest.raises(StoreUnavailable, match="another process"):
            async with open_embedded_store(tmp_path):
                pass
    with pytest.raises(StoreUnavailable):
        await store.send(Message("T", b"x"))
    with pytest.raises(StoreUnavailable):
        await store.pull("T", 0, 0, 1)


async def test_caller_exception_is_not_wrapped(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        async with open_embedded_store(tmp_path):
            raise KeyError("mine")


async def test_long_poll_ends_when_store_closes(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        await store.create_topic("T", 1)
        outcome: list[str] = []

        async def waiter() -> None:
            try:
                await store.wait_for_message("T", 0, 0, 30)
            except StoreUnavailable:
                outcome.append("unavailable")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()  # the waiter waits
            store._close()
    assert outcome == ["unavailable"]


_WRITER = textwrap.dedent(
    """
    import sys, trio
    from pathlib import Path
    from mqproxy.backends.embedded.embedded import open_embedded_store
    from mqproxy.model.types import Message

    async def main():
        async with open_embedded_store(Path(sys.argv[1]), flush="sync", segment_bytes=256 * 1024) as store:
            async def writer(w):
                i = 0
                while True:
                    body = f"{w}-{i}".encode() * 8
                    r = await store.send(Message("K", body, queue_id=w % 4, dispatch=(f"%LMQ%w{w}",)))
                    print(w, r.queue_id, r.queue_offset, r.commitlog_offset, body.decode(), "ok", flush=True)
                    i += 1
            async with trio.open_nursery() as n:
                for w in range(8):
                    n.start_soon(writer, w)

    trio.run(main)
    """
)


@pytest.mark.slow
def test_sigkill_mid_load_keeps_every_acked_message(tmp_path: Path) -> None:
    """Sync test: it drives a subprocess with blocking calls, then checks the store under trio.run."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert proc.stdout is not None
    lines: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(lines) < 400 and time.monotonic() < deadline:  # let it run under load, then kill mid-write
        lines.append(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    lines += proc.stdout.read().splitlines(keepends=True)
    proc.wait()
    # A line cut by the kill lacks the trailing "ok" and does not count as acknowledged.
    acked = [line.split()[:5] for line in b"".join(lines).decode().splitlines() if line.endswith(" ok")]
    assert len(acked) >= 300, f"only {len(acked)} acked"  # the first line is the store.recovered log
    trio.run(_check_acked, tmp_path, acked)


async def _check_acked(tmp_path: Path, acked: list[list[str]]) -> None:
    async with open_embedded_store(tmp_path, segment_bytes=256 * 1024) as store:
        for queue_id in range(4):
            pulled = await store.pull("K", queue_id, 0, 100_000, max_bytes=1 << 30)
            by_offset = {m.queue_offset: m for m in pulled.messages}
            assert sorted(by_offset) == list(range(len(by_offset))), "offsets are contiguous"
            for _, q, qoff, clo, body in acked:
                if int(q) == queue_id:
                    m = by_offset[int(qoff)]
                    assert (m.commitlog_offset, m.body) == (int(clo), body.encode())
        for w in range(8):
            lmq = await store.pull(f"%LMQ%w{w}", 0, 0, 100_000, max_bytes=1 << 30)
            mine = [body for ww, _, _, _, body in acked if int(ww) == w]
            assert [m.body.decode() for m in lmq.messages][: len(mine)] == mine
            assert lmq.status in (PullStatus.FOUND, PullStatus.NO_NEW_MSG)
    assert segment_name(0) in os.listdir(tmp_path / "commitlog")


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
    async with _async_flush_store(tmp_path) as store:
        calls = _count_fdatasyncs(monkeypatch)
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
