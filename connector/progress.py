"""
mqproxy.connector.progress
~~~~~~~~~~~~~~~~~~~~~~~~~~

Where a source queue's copying stands, decided from what the target holds; which target queue a source
queue goes to; which messages a rule copies; how queues are shared between connector processes. Sans-IO.

The commit protocol (README, "Message Connector"): the target queue itself is the record of progress.
Every copy carries its origin (:mod:`.origin`), one source queue always goes to the same target queue, and
a target queue has at most one batch in flight, so the copies of a source queue sit in the target queue in
source order. The newest copy of a source queue found at the target queue's tail therefore says exactly how
far it got: resume at its origin offset + 1. The consumer offset the connector commits on the source after
every acknowledged batch (and when a run of messages was filtered out) is a lower bound used when the tail
holds no copy of that queue within the scan.

Contracts:

* :func:`newest_origin` scans messages newest first and returns the first origin offset of ``source``.
* :func:`resume_offset` is ``max(found + 1, hint)`` when either is known, else None (use the rule's start).
* :func:`target_queue_for` maps the n-th source queue (sorted by broker name, queue id) to target queue
  n modulo the target's queue count: a fixed choice that needs no record anywhere.
* :func:`allocate` gives each live member a contiguous share of the sorted queues (RocketMQ's average
  allocation); every member computes the same split from the same member list.
* :func:`copies` is the rule's filter and the loop check together.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

from mqproxy.connector.origin import SourceQueue, loops_back, origin_of
from mqproxy.connector.rules import Rule
from mqproxy.model.types import StoredMessage

__all__ = ["allocate", "copies", "newest_origin", "resume_offset", "target_queue_for"]

T = TypeVar("T")


def newest_origin(newest_first: Iterable[StoredMessage], source: SourceQueue) -> int | None:
    """The origin offset of the newest copy of ``source`` among ``newest_first``, or None."""
    for message in newest_first:
        origin = origin_of(message.properties)
        if origin is not None and origin.queue == source:
            return origin.offset
    return None


def resume_offset(found: int | None, hint: int | None) -> int | None:
    """The next source offset to copy, from the tail scan's ``found`` and the committed ``hint``."""
    candidates = [o for o in (None if found is None else found + 1, hint) if o is not None]
    return max(candidates) if candidates else None


def target_queue_for(index: int, target_queues: Sequence[T]) -> T:
    if not target_queues:
        raise ValueError("the target topic has no writable queue")
    return target_queues[index % len(target_queues)]


def allocate(queues: Sequence[T], members: Sequence[str], me: str) -> list[T]:
    """``me``'s share of ``queues`` among ``members`` (sorted here; ``me`` counts even if missing)."""
    everyone = sorted(set(members) | {me})
    n, k = len(queues), len(everyone)
    i = everyone.index(me)
    size = n // k + (1 if i < n % k else 0)
    start = i * (n // k) + min(i, n % k)
    return list(queues[start : start + size])


def copies(rule: Rule, message: StoredMessage, target_cluster: str) -> bool:
    """True when ``rule`` copies ``message`` to ``target_cluster``."""
    if loops_back(message.properties, target_cluster):
        return False
    if rule.tags is not None and not rule.tags.matches(message.tags):
        return False
    return rule.sql is None or rule.sql.matches(message.properties)
