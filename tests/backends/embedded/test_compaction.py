"""Key-based compaction of state queues over both backends, including reopen and racing writers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from mqproxy.backends.embedded.compaction import compact, replay
from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.backends.embedded.store import MessageStore
from mqproxy.model.types import Message, StoredMessage

TOPIC = "STATE_LOG"


def _key(message: StoredMessage) -> tuple[str, bool] | None:
    key, _, value = message.body.partition(b"=")
    if not key:
        return None
    return key.decode(), value != b""


async def _write(backend: MessageStore, *records: str) -> None:
    for record in records:
        await backend.send(Message(topic=TOPIC, body=record.encode(), queue_id=0))


def _state(found: object) -> dict[str, bytes]:
    return {m.body.split(b"=")[0].decode(): m.body for m in found.live()}  # type: ignore[attr-defined]


@pytest.fixture(params=["memory", "embedded"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@asynccontextmanager
async def _open(kind: str, path: Path, memory: InMemoryBackend | None = None) -> AsyncIterator[MessageStore]:
    if kind == "memory":
        yield memory if memory is not None else InMemoryBackend()
        return
    async with open_embedded_store(path, flush="async", segment_bytes=64 * 1024) as store:
        yield store


async def test_compaction_keeps_the_newest_live_record_per_key(kind: str, tmp_path: Path) -> None:
    memory = InMemoryBackend() if kind == "memory" else None
    async with _open(kind, tmp_path / "s", memory) as backend:
        await backend.create_topic(TOPIC, 1)
        await _write(backend, "a=1", "b=1", "a=2", "garbage", "c=1", "b=", "a=3", "c=2")
        found = await replay(backend, TOPIC, 0, _key)
        assert (found.records, found.garbage, found.end) == (8, 6, 8)
        assert _state(found) == {"a": b"a=3", "c": b"c=2"}
        assert found.worth_compacting(min_garbage=1)
        assert not found.worth_compacting(min_garbage=7)
        new_min = await compact(backend, TOPIC, 0, found)
        assert new_min == 8
        assert await backend.max_offset(TOPIC, 0) == 10
        again = await replay(backend, TOPIC, 0, _key)
        assert (again.records, again.garbage) == (2, 0)
        assert _state(again) == {"a": b"a=3", "c": b"c=2"}
        ids = {m.commitlog_offset for m in again.live()}
        assert ids == {m.commitlog_offset for m in found.live()}  # same stored records, not copies
        await _write(backend, "d=1")
    async with _open(kind, tmp_path / "s", memory) as backend:  # the compacted layout survives reopening
        after = await replay(backend, TOPIC, 0, _key)
        assert _state(after) == {"a": b"a=3", "c": b"c=2", "d": b"d=1"}
        assert after.records == 3


async def test_a_write_racing_the_compaction_still_wins(kind: str, tmp_path: Path) -> None:
    async with _open(kind, tmp_path / "s") as backend:
        await backend.create_topic(TOPIC, 1)
        await _write(backend, "a=old", "a=older-is-gone", "b=1")
        found = await replay(backend, TOPIC, 0, _key)
        await _write(backend, "a=new", "b=")  # lands after the pass, before the rewrite
        await compact(backend, TOPIC, 0, found)
        # The kept "a=older-is-gone" and "b=1" are now behind "a=new" and the tombstone in the queue,
        # but the newest record per key is chosen by commit-log offset, so the racing writes win.
        after = await replay(backend, TOPIC, 0, _key)
        assert _state(after) == {"a": b"a=new"}


async def test_compacting_everything_away_keeps_offsets_moving_forward(kind: str, tmp_path: Path) -> None:
    async with _open(kind, tmp_path / "s") as backend:
        await backend.create_topic(TOPIC, 1)
        await _write(backend, "a=1", "a=")
        found = await replay(backend, TOPIC, 0, _key)
        assert found.live() == []
        assert await compact(backend, TOPIC, 0, found) == 2
        assert (await backend.min_offset(TOPIC, 0), await backend.max_offset(TOPIC, 0)) == (2, 2)
        await _write(backend, "z=1")
        assert await backend.max_offset(TOPIC, 0) == 3
        assert _state(await replay(backend, TOPIC, 0, _key)) == {"z": b"z=1"}
