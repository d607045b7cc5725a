"""Orderly-consumption queue locks (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ, spec §3.15).

One client per (group, topic, queue): a lock lives ``ttl_s`` (60 s) unless renewed by locking again;
a live lock of another client is never taken over (the queue is simply left out of the answer).
In memory, like the Java broker's: clients re-lock every 20 s, so a restart heals within one period.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import trio

from mqproxy.facade.types import QueueRef
from mqproxy.model.errors import InvalidArgument

#: ``rocketmq.broker.rebalance.lockMaxLiveTime``.
DEFAULT_LOCK_TTL_S = 60.0


@dataclass(slots=True)
class _Lock:
    client_id: str
    expires_at: float


class QueueLocks:
    """(group, queue) -> holder. ``now`` is a monotonic clock in seconds (trio's by default)."""

    def __init__(
        self, ttl_s: float = DEFAULT_LOCK_TTL_S, now: Callable[[], float] = trio.current_time
    ) -> None:
        if not ttl_s > 0:
            raise ValueError("ttl_s must be positive")
        self.ttl_s = ttl_s
        self._now = now
        self._locks: dict[tuple[str, QueueRef], _Lock] = {}

    def lock_batch(self, group: str, client_id: str, queues: Iterable[QueueRef]) -> set[QueueRef]:
        """Lock or renew each queue that is free, expired or already ``client_id``'s; return those held."""
        _check(group, client_id)
        now = self._now()
        held: set[QueueRef] = set()
        for queue in queues:
            key = (group, queue)
            current = self._locks.get(key)
            if current is None or current.client_id == client_id or current.expires_at <= now:
                self._locks[key] = _Lock(client_id, now + self.ttl_s)
                held.add(queue)
        return held

    def unlock(self, group: str, client_id: str, queues: Iterable[QueueRef]) -> None:
        """Release the queues ``client_id`` holds; others' locks are untouched."""
        _check(group, client_id)
        for queue in queues:
            key = (group, queue)
            current = self._locks.get(key)
            if current is not None and current.client_id == client_id:
                del self._locks[key]

    def release_client(self, group: str, client_id: str) -> int:
        """Drop every lock of ``client_id`` in ``group`` (it disconnected); returns how many."""
        keys = [k for k, v in self._locks.items() if k[0] == group and v.client_id == client_id]
        for key in keys:
            del self._locks[key]
        return len(keys)

    def holder(self, group: str, queue: QueueRef) -> str | None:
        """The client holding a live lock on ``queue`` for ``group``, or None."""
        current = self._locks.get((group, queue))
        if current is None or current.expires_at <= self._now():
            return None
        return current.client_id

    def is_locked_by(self, group: str, client_id: str, queue: QueueRef) -> bool:
        return self.holder(group, queue) == client_id

    def group_holds_locks(self, group: str) -> bool:
        """True if any client of ``group`` holds a live lock (send-back then goes to the DLQ, spec §7.2)."""
        now = self._now()
        return any(k[0] == group and v.expires_at > now for k, v in self._locks.items())

    def expire(self) -> int:
        """Forget expired locks (memory only; expiry is already enforced on read); returns how many."""
        now = self._now()
        dead = [k for k, v in self._locks.items() if v.expires_at <= now]
        for key in dead:
            del self._locks[key]
        return len(dead)


def _check(group: str, client_id: str) -> None:
    if not group:
        raise InvalidArgument("consumer group is empty")
    if not client_id:
        raise InvalidArgument("client id is empty")
