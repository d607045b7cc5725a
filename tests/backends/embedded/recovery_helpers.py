"""Helpers for the embedded store's recovery tests: fill a data directory and read it back, count
fdatasyncs, open an async-flushing store, check the store.recovered event."""

from __future__ import annotations

import json
import os
from collections.abc import MutableMapping
from contextlib import AbstractAsyncContextManager
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from mqproxy.backends.embedded.embedded import EmbeddedStore, open_embedded_store
from mqproxy.model.types import Message


def count_fdatasyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, every ``os.fdatasync`` still syncs and appends its fd to the returned list."""
    calls: list[int] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    return calls


def async_flush_store(tmp_path: Path) -> AbstractAsyncContextManager[EmbeddedStore]:
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
