"""The embedded store's flushing: sync sends ack only after fdatasync and share it, async flushing syncs
periodically, a failed fsync or index write leaves the store consistent."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import trio
import trio.testing

from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.model.errors import StoreUnavailable
from mqproxy.model.types import Message

from .recovery_helpers import (  # type: ignore[import-not-found]
    async_flush_store,
    bodies,
    count_fdatasyncs,
)


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
        calls = count_fdatasyncs(monkeypatch)
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
    async with async_flush_store(tmp_path) as store:
        calls = count_fdatasyncs(monkeypatch)
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
