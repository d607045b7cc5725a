"""Retention of the embedded commit log, sans-IO: which segments may go, when writes must stop, and
which queues hold live state whose records are moved to the head before their segment is deleted.

Semantics follow Apache RocketMQ's ``DefaultMessageStore.CleanCommitLogService``:

* A sealed segment (never the one being written) is *expired* once ``file_reserved_ms`` passed since it
  was last modified (``fileReservedTime``, hours). Expired segments are deleted only at the hours of
  ``delete_hours`` (``deleteWhen``, default ``04``) or at any hour while the disk holding the log is more
  than ``max_used_ratio`` used (``diskMaxUsedSpaceRatio``, 75 %).
* Above ``clean_forcibly_ratio`` (``diskSpaceCleanForciblyRatio``, 0.85) the oldest segments go whether
  expired or not (reason ``disk_ratio``). RocketMQ then deletes up to ten files per run; we delete only as
  many as bring the disk back to that ratio.
* Above ``warning_ratio`` (``diskSpaceWarningLevelRatio``, 0.90) new writes are refused until it drops.
* Segments are deleted oldest first and never out of order (a younger expired segment behind an
  unexpired one waits), at most ``batch_max`` per run.

Live state is everything a broker service or the MQTT layer still needs from the log: every entry of a
compacted state queue (:data:`STATE_TOPICS`: retained messages, MQTT session snapshots, broker metadata)
and, in the queues a service consumes with an internal group (:data:`PROGRESS_GROUPS`: delayed and timer
messages, transaction half and op records, pop checkpoints), every entry at or above that group's
committed offset. Ordinary topics and light queues expire as in RocketMQ, read or not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from mqproxy.model.properties import (
    HALF_TOPIC,
    OP_HALF_TOPIC,
    REVIVE_GROUP,
    REVIVE_TOPIC,
    SCHEDULE_GROUP,
    SCHEDULE_TOPIC,
    TRANSACTION_GROUP,
)

#: State queues: every entry is live. Compacted ones (``mqproxy.mqtt.mapping`` SESSION_STATE_TOPIC and
#: RETAINED_LMQ, ``.metadata`` METADATA_TOPIC) and small ones replayed whole at start (``.assignment``
#: REQUEST_MODE_TOPIC: consume modes; ``.schedule`` RECALL_TOPIC: recalled timer messages). A test
#: keeps the names in step.
STATE_TOPICS: frozenset[str] = frozenset(
    {
        "MQTT_SESSION_STATE",
        "%LMQ%|RETAINED",
        "rmq_sys_BROKER_METADATA",
        "rmq_sys_REQUEST_MODE",
        "rmq_sys_SCHEDULE_RECALL",
    }
)

#: Queues a service consumes with an internal group: entries at or above its committed offset are live.
PROGRESS_GROUPS: Mapping[str, str] = {
    SCHEDULE_TOPIC: SCHEDULE_GROUP,
    HALF_TOPIC: TRANSACTION_GROUP,
    OP_HALF_TOPIC: TRANSACTION_GROUP,
    REVIVE_TOPIC: REVIVE_GROUP,
}

Reason = Literal["expired", "disk_ratio"]
HOUR_MS = 3_600_000


def parse_delete_when(text: str) -> frozenset[int] | None:
    """``deleteWhen``: hours of the day separated by ``;`` (``"04"``, ``"04;16"``); ``"*"`` means every hour
    (None). Raises ValueError on anything else."""
    text = text.strip()
    if text == "*":
        return None
    hours = set()
    for part in text.split(";"):
        hour = int(part.strip())  # ValueError for junk
        if not 0 <= hour <= 23:
            raise ValueError(f"hour {hour} is not in 0..23")
        hours.add(hour)
    if not hours:
        raise ValueError("no hour given")
    return frozenset(hours)


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Retention settings (``[store]`` in the configuration; defaults are RocketMQ's)."""

    file_reserved_ms: int = 72 * HOUR_MS
    #: Hours of the day expired segments may be deleted at; None: any hour.
    delete_hours: frozenset[int] | None = field(default_factory=lambda: frozenset({4}))
    max_used_ratio: float = 0.75
    clean_forcibly_ratio: float = 0.85
    warning_ratio: float = 0.90
    batch_max: int = 10


@dataclass(frozen=True, slots=True)
class Segment:
    """A commit-log segment: its base offset, size in bytes and last modification (ms)."""

    base: int
    size: int
    modified_ms: int


@dataclass(frozen=True, slots=True)
class DiskUsage:
    """The file system holding the commit log (``statvfs``): total and free bytes."""

    total: int
    free: int

    @property
    def used_ratio(self) -> float:
        """Used share of the partition, as RocketMQ's ``getDiskPartitionSpaceUsedPercent``."""
        return (self.total - self.free) / self.total if self.total > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Deletion:
    segment: Segment
    reason: Reason


def plan_deletions(
    segments: Sequence[Segment], now_ms: int, hour: int, disk: DiskUsage, policy: RetentionPolicy
) -> list[Deletion]:
    """The segments one retention run deletes, oldest first (``segments`` in log order, the last one
    being written and never deleted)."""
    ratio = disk.used_ratio
    time_up = policy.delete_hours is None or hour in policy.delete_hours
    forced = ratio > policy.clean_forcibly_ratio
    if not (time_up or forced or ratio > policy.max_used_ratio):
        return []
    need = (disk.total - disk.free) - policy.clean_forcibly_ratio * disk.total if forced else 0.0
    freed = 0
    out: list[Deletion] = []
    for segment in segments[:-1]:
        if len(out) >= policy.batch_max:
            break
        if now_ms >= segment.modified_ms + policy.file_reserved_ms:
            out.append(Deletion(segment, "expired"))
        elif forced and freed < need:
            out.append(Deletion(segment, "disk_ratio"))
        else:
            break  # never delete out of order
        freed += segment.size
    return out


def refuse_writes(disk: DiskUsage, policy: RetentionPolicy) -> bool:
    """True while the disk is too full to accept new messages (``diskSpaceWarningLevelRatio``)."""
    return disk.used_ratio > policy.warning_ratio


def live_from(topic: str, queue_id: int, committed: Mapping[tuple[str, str, int], int]) -> int | None:
    """The queue offset from which ``topic``/``queue_id`` holds live state (0: all of it), or None when
    the queue is ordinary and expires. ``committed`` maps (group, topic, queue id) to committed offsets;
    a progress queue whose group never committed is live from its start."""
    if topic in STATE_TOPICS:
        return 0
    group = PROGRESS_GROUPS.get(topic)
    if group is None:
        return None
    return committed.get((group, topic, queue_id), 0)


#: An index entry: queue id, queue offset, commit-log offset, frame size, tag hash, store time.
Entry = tuple[int, int, int, int, int, int]


def records_to_move(entries: Iterable[Entry], below: int) -> dict[int, list[Entry]]:
    """Live entries grouped by the commit-log offset of the record they point at, for records below
    ``below`` (the first offset that survives), in log order. One record can be live in several queues
    (a retained message's parent queue and the retained LMQ); it is moved once."""
    moves: dict[int, list[Entry]] = {}
    for entry in entries:
        if entry[2] < below:
            moves.setdefault(entry[2], []).append(entry)
    return dict(sorted(moves.items()))
