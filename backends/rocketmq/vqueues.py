"""
mqproxy.backends.rocketmq.vqueues
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

Sans-IO virtual queue numbering. Every mqproxy node presents itself as a topic's only broker, so a client
sees queue ids ``0..N-1``; :class:`QueueMap` says which real ``(broker, queue)`` each one is.

Contracts:

* A map is append-only: :func:`extend` keeps every existing entry at its index and appends the pairs a
  route adds (brokers in name order, queue ids ascending), so a virtual queue never changes meaning,
  also when a broker is added or a topic's queue count grows. Entries of a broker that left stay (their
  queues are answered as unreachable) so later indexes do not shift.
* :func:`extend` is deterministic: two nodes extending the same stored map with the same route get the
  same map. The stored form (:meth:`QueueMap.encode`) is run-length JSON kept in the name server's KV
  configuration; see :mod:`mqproxy.backends.rocketmq.registry` for how nodes agree on it.
* :class:`BrokerIndex` is the same append-only idea for broker names: a broker's index goes into the top
  bits of the commit-log offsets this backend hands out (:func:`pack_offset`), so a message id or
  transaction offset names its broker and any node can route it back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

import orjson

from mqproxy.backends.rocketmq.topology import TopicRoute

__all__ = [
    "OFFSET_BITS",
    "BrokerIndex",
    "QueueMap",
    "RealQueue",
    "extend",
    "pack_offset",
    "unpack_offset",
]

#: Bits of a packed offset that hold the real commit-log offset (256 TiB per broker).
OFFSET_BITS: Final = 48
_OFFSET_MASK: Final = (1 << OFFSET_BITS) - 1
#: Broker indexes fit below the sign bit of a Java long.
MAX_BROKERS: Final = (1 << (63 - OFFSET_BITS)) - 1


class MapError(ValueError):
    """A stored map that cannot be read."""


@dataclass(frozen=True, slots=True, order=True)
class RealQueue:
    broker: str
    queue_id: int


@dataclass(frozen=True, slots=True)
class QueueMap:
    """Virtual queue id (the index) → real queue."""

    entries: tuple[RealQueue, ...] = ()
    _index: dict[RealQueue, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._index.update({entry: i for i, entry in enumerate(self.entries)})

    def __len__(self) -> int:
        return len(self.entries)

    def real(self, virtual: int) -> RealQueue | None:
        return self.entries[virtual] if 0 <= virtual < len(self.entries) else None

    def virtual(self, broker: str, queue_id: int) -> int | None:
        return self._index.get(RealQueue(broker, queue_id))

    def of_broker(self, broker: str) -> list[int]:
        return [i for i, entry in enumerate(self.entries) if entry.broker == broker]

    def covers(self, other: QueueMap) -> bool:
        """Whether this map starts with every entry of ``other`` at the same index."""
        return self.entries[: len(other.entries)] == other.entries

    def encode(self) -> str:
        runs: list[list[object]] = []
        for entry in self.entries:
            last = runs[-1] if runs else None
            if last is not None and last[0] == entry.broker and last[1] + last[2] == entry.queue_id:  # type: ignore[operator]
                last[2] += 1  # type: ignore[operator]
            else:
                runs.append([entry.broker, entry.queue_id, 1])
        return orjson.dumps(runs).decode()

    @classmethod
    def decode(cls, text: str) -> QueueMap:
        try:
            runs = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise MapError(f"queue map is not JSON: {exc}") from None
        entries: list[RealQueue] = []
        if not isinstance(runs, list):
            raise MapError("queue map is not a list")
        for run in runs:
            if (
                not isinstance(run, list)
                or len(run) != 3
                or not isinstance(run[0], str)
                or not all(isinstance(n, int) and n >= 0 for n in run[1:])
            ):
                raise MapError(f"queue map run {str(run)[:64]} is not [broker, first, count]")
            entries.extend(RealQueue(run[0], run[1] + k) for k in range(run[2]))
        if len(set(entries)) != len(entries):
            raise MapError("queue map names a real queue twice")
        return cls(tuple(entries))


def extend(current: QueueMap, route: TopicRoute) -> QueueMap:
    """``current`` with the real queues of ``route`` it lacks appended (see the module contracts)."""
    added = [
        RealQueue(name, qid)
        for name in sorted(route.brokers)
        for qid in range(route.brokers[name].queue_count)
        if current.virtual(name, qid) is None
    ]
    return QueueMap(current.entries + tuple(added)) if added else current


def merge(first: QueueMap, second: QueueMap) -> QueueMap:
    """``first`` followed by the entries of ``second`` it lacks, in ``second``'s order."""
    added = [entry for entry in second.entries if first.virtual(entry.broker, entry.queue_id) is None]
    return QueueMap(first.entries + tuple(added)) if added else first


@dataclass(frozen=True, slots=True)
class BrokerIndex:
    """Broker name ↔ a small stable number, append-only (index 0 is never used: packed offsets of the
    first broker would otherwise look like plain ones)."""

    names: tuple[str, ...] = ()

    def index(self, broker: str) -> int | None:
        try:
            return self.names.index(broker) + 1
        except ValueError:
            return None

    def name(self, index: int) -> str | None:
        return self.names[index - 1] if 1 <= index <= len(self.names) else None

    def with_brokers(self, brokers: Iterable[str]) -> BrokerIndex:
        added = sorted(set(brokers) - set(self.names))
        if len(self.names) + len(added) > MAX_BROKERS:
            raise MapError(f"more than {MAX_BROKERS} brokers")
        return BrokerIndex(self.names + tuple(added)) if added else self

    def encode(self) -> str:
        return orjson.dumps(list(self.names)).decode()

    @classmethod
    def decode(cls, text: str) -> BrokerIndex:
        try:
            names = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise MapError(f"broker index is not JSON: {exc}") from None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise MapError("broker index is not a list of names")
        if len(set(names)) != len(names):
            raise MapError("broker index names a broker twice")
        return cls(tuple(names))

    def merged(self, other: BrokerIndex) -> BrokerIndex:
        added = [n for n in other.names if n not in self.names]
        return BrokerIndex(self.names + tuple(added)) if added else self


def pack_offset(broker_index: int, offset: int) -> int:
    """A commit-log offset that names its broker (``offset`` must be below 2**48)."""
    if not 0 <= offset <= _OFFSET_MASK:
        raise ValueError(f"commit-log offset {offset} does not fit {OFFSET_BITS} bits")
    return (broker_index << OFFSET_BITS) | offset


def unpack_offset(packed: int) -> tuple[int, int]:
    """``(broker index, real offset)``; index 0 means the offset named no broker."""
    return packed >> OFFSET_BITS, packed & _OFFSET_MASK


def names_of(entries: Sequence[RealQueue]) -> set[str]:
    return {entry.broker for entry in entries}
