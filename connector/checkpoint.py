"""
mqproxy.connector.checkpoint
~~~~~~~~~~~~~~~~~~~~~~~~~~~~

Consumer-offset translation (Kafka MirrorMaker 2's checkpoints): where a group that committed source
offset ``S`` on a source queue stands in the target queue the copies went to. Sans-IO.

The copies of one source queue sit in their target queue in source order (:mod:`.progress`), so the group
resumes on the target at the **first copy whose origin offset is >= S**. Messages the rule filtered out have
no copy and do not count: a committed offset pointing at one resumes at the next copy after it.

Contracts:

* :class:`TailScan` is fed a target queue's messages newest first (:func:`.tail.windows_newest_first`) and
  is decided as soon as it meets a copy of the source queue with origin offset < S: everything older is
  below S too. It remembers the oldest copy with origin >= S seen so far.
* :func:`translate_offset` is the target offset, or None when it cannot be known yet:

  - a copy with origin >= S was seen and the scan was decided (or read the whole queue): that copy's offset;
  - no copy with origin >= S, and the connector has copied everything below S (its committed offset on the
    source is >= S): the offset after the newest copy of the source queue (the whole queue read and no copy
    of it at all: the queue's max offset at the scan's start);
  - otherwise (the copy lags behind the group, or the scan hit its limit first): None, try again later.

* :func:`merge_target` is the offset of a target queue fed by several source queues: the smallest of their
  translations (a group never skips; it may re-read), None if any is unknown.
* :func:`advances` is true only when the new offset is ahead of the target group's: a checkpoint never
  moves a target group backwards (its consumers may have gone further on the target already).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mqproxy.connector.origin import SourceQueue, origin_of
from mqproxy.model.types import StoredMessage

__all__ = ["TailScan", "advances", "merge_target", "translate_offset"]


@dataclass
class TailScan:
    """What a backwards scan of a target queue found about one source queue's committed offset."""

    source: SourceQueue
    committed: int
    #: target offset of the oldest copy seen whose origin offset is >= committed
    first_at: int | None = None
    #: target offset of the newest copy whose origin offset is < committed (the scan stops there)
    below_at: int | None = None
    #: messages read so far
    scanned: int = 0

    @property
    def decided(self) -> bool:
        return self.below_at is not None

    def feed(self, newest_first: Iterable[StoredMessage]) -> bool:
        """Read messages newest first; True once decided (the rest of the queue is not needed)."""
        for message in newest_first:
            self.scanned += 1
            origin = origin_of(message.properties)
            if origin is None or origin.queue != self.source:
                continue
            if origin.offset >= self.committed:
                self.first_at = message.queue_offset
            else:
                self.below_at = message.queue_offset
                return True
        return False


def translate_offset(
    scan: TailScan, *, whole_queue: bool, copied_through: int | None, high: int
) -> int | None:
    """The target offset for ``scan.committed`` (module contracts); ``whole_queue``: the scan reached the
    queue's minimum offset; ``copied_through``: the connector's committed source offset; ``high``: the
    target queue's max offset when the scan started."""
    if scan.first_at is not None:
        return scan.first_at if scan.decided or whole_queue else None
    if copied_through is None or copied_through < scan.committed:
        return None
    if scan.below_at is not None:
        return scan.below_at + 1
    return high if whole_queue else None


def merge_target(translations: Iterable[int | None]) -> int | None:
    """One target queue's offset from the translations of every source queue feeding it."""
    found = list(translations)
    if not found or any(t is None for t in found):
        return None
    return min(t for t in found if t is not None)


def advances(new: int, current: int | None) -> bool:
    """True when writing ``new`` moves the target group forward (or it has no offset there yet)."""
    return current is None or new > current
