"""Key-based compaction of append-only state queues (retained messages, MQTT session snapshots, broker
metadata), over any :class:`QueueLog`: the embedded store, or a protocol's view of the broker facade.

Such a queue holds one record per change; the newest record per key is the state and a record marked
not-live (a tombstone) deletes its key. "Newest" means the highest commit-log offset, never the queue
position: :func:`compact` re-appends kept records at the queue's end
(:meth:`QueueLog.rewrite_queue`, one atomic step, no message copied), and a
record appended by a writer while compaction ran may then sit *before* an older kept record for the same
key. Ranking by commit-log offset makes that harmless, so writers never wait for a compaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from mqproxy.model.types import PullResult, PullStatus, StoredMessage

__all__ = ["KeyOf", "QueueLog", "Replay", "compact", "compact_if_worth", "replay", "worth_compacting"]


class QueueLog(Protocol):
    """What compaction reads and rewrites: one queue's span, its records, and the atomic rewrite."""

    async def min_offset(self, topic: str, queue_id: int) -> int: ...

    async def pull(self, topic: str, queue_id: int, offset: int, max_count: int) -> PullResult: ...

    async def rewrite_queue(self, topic: str, queue_id: int, keep: Sequence[int], below: int) -> int:
        """Keep only the records at queue offsets ``keep`` among those below ``below``, re-appended at the
        queue's end in one atomic step; returns the new min offset."""
        ...


#: ``(key, live)`` for a record, or None for a record that belongs to nobody (dropped by compaction).
KeyOf = Callable[[StoredMessage], "tuple[str, bool] | None"]

_BATCH = 256
_log = structlog.get_logger("mqproxy.store")


@dataclass(slots=True)
class Replay:
    """What one pass over a state queue found: the newest record per key and the queue span read."""

    end: int = 0  # offset one past the last record read
    records: int = 0
    #: key -> (queue offset, live, record) of the record with the highest commit-log offset
    newest: dict[str, tuple[int, bool, StoredMessage]] = field(default_factory=dict)

    def live(self) -> list[StoredMessage]:
        """The newest record of every live key, oldest first."""
        found = [message for _, alive, message in self.newest.values() if alive]
        found.sort(key=lambda m: m.commitlog_offset)
        return found

    @property
    def garbage(self) -> int:
        """Records a compaction would drop."""
        return self.records - sum(1 for _, alive, _ in self.newest.values() if alive)

    def worth_compacting(self, min_garbage: int) -> bool:
        """:func:`worth_compacting` for what this replay found."""
        return worth_compacting(self.records, self.records - self.garbage, min_garbage)


def worth_compacting(records: int, live: int, min_garbage: int) -> bool:
    """True once the dead records of a log (``records - live``) reach ``min_garbage`` and outnumber the
    live ones."""
    garbage = records - live
    return garbage >= min_garbage and garbage > live


async def replay(backend: QueueLog, topic: str, queue_id: int, key_of: KeyOf) -> Replay:
    """Read every record of the queue once; see :class:`Replay`."""
    offset = await backend.min_offset(topic, queue_id)
    found = Replay(end=offset)
    newest = found.newest
    while True:
        result = await backend.pull(topic, queue_id, offset, _BATCH)
        if result.status is PullStatus.OFFSET_ILLEGAL and result.next_offset != offset:
            offset = result.next_offset
            continue
        if not result.messages or result.next_offset <= offset:
            found.end = offset
            return found
        if result.next_offset - offset != len(result.messages):
            raise ValueError(f"queue {topic!r} has holes: it cannot be compacted by position")
        for position, message in enumerate(result.messages, offset):
            found.records += 1
            keyed = key_of(message)
            if keyed is None:
                continue
            key, alive = keyed
            previous = newest.get(key)
            if previous is None or previous[2].commitlog_offset < message.commitlog_offset:
                newest[key] = (position, alive, message)
        offset = result.next_offset


async def compact(backend: QueueLog, topic: str, queue_id: int, found: Replay) -> int:
    """Keep only the newest live record per key among those ``found`` read; returns the new min offset."""
    keep = sorted(position for position, alive, _ in found.newest.values() if alive)
    return await backend.rewrite_queue(topic, queue_id, keep, found.end)


async def compact_if_worth(
    backend: QueueLog, topic: str, queue_id: int, key_of: KeyOf, min_garbage: int, found: Replay | None = None
) -> Replay:
    """Replay the queue (unless ``found`` is a fresh replay of it) and compact it when
    :meth:`Replay.worth_compacting`, logging ``store.compacted``; returns the replay."""
    started = time.monotonic()
    if found is None:
        found = await replay(backend, topic, queue_id, key_of)
    if found.worth_compacting(min_garbage):
        await compact(backend, topic, queue_id, found)
        _log.info(
            "store.compacted",
            topic=topic,
            records=found.records,
            kept=found.records - found.garbage,
            duration_ms=round((time.monotonic() - started) * 1000, 3),
        )
    return found
