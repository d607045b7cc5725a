"""A reader's position on one LMQ: :class:`Cursor` (the next offset to read, the un-acked offsets behind it
and the committed offset it stores for a persistent session or shared group)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from mqproxy.model.topics import LMQ_QUEUE_ID

if TYPE_CHECKING:
    from mqproxy.mqtt.store import LightStore

__all__ = ["Cursor"]


class Cursor:
    """Read position of one reader on an LMQ plus its un-acked offsets.

    ``next_offset`` is the next offset to read; ``committed`` the first offset not yet completed (every
    offset below it was delivered and, for QoS 1/2, acknowledged). Completion may happen out of order;
    ``committed`` advances over the completed prefix. ``restored`` maps offsets of QoS 2 deliveries
    restored after a restart to whether they are done; the reader hands each to :meth:`reached` instead
    of delivering it again.
    """

    __slots__ = (
        "_done",
        "_order",
        "committed",
        "durable",
        "group",
        "lmq",
        "next_offset",
        "restored",
        "stored",
    )

    def __init__(self, lmq: str, offset: int, group: str = "") -> None:
        self.lmq = lmq
        self.group = group  # consumer group its offset is committed under
        self.durable = False  # commit offsets to the store
        self.next_offset = offset
        self.committed = offset
        self.stored = offset  # last value written to the backend
        self.restored: dict[int, bool] = {}
        self._order: deque[int] = deque()
        self._done: dict[int, bool] = {}

    def track(self, offset: int) -> None:
        """``offset`` was sent and awaits its acknowledgement (again, if it was handed back)."""
        if offset not in self._done:
            self._order.append(offset)
        self._done[offset] = False

    def complete(self, offset: int) -> None:
        """``offset`` needs nothing more (acknowledged, sent at QoS 0, or skipped)."""
        if offset not in self._done:
            if not self._order:
                self.committed = max(self.committed, offset + 1)
            else:
                self._order.append(offset)
                self._done[offset] = True
                self._advance()
            return
        self._done[offset] = True
        self._advance()

    def reached(self, offset: int) -> bool:
        """The reader is at ``offset``: True if it was restored (then it must not be delivered again).

        A restored delivery still in flight is tracked here, in offset order, like a fresh one; a
        completed one is completed.
        """
        done = self.restored.pop(offset, None)
        if done is None:
            return False
        if done:
            self.complete(offset)
        else:
            self.track(offset)
        return True

    @property
    def pending(self) -> bool:
        """True while some offset handed out is not completed (``committed`` waits for it)."""
        return bool(self._order)

    def acknowledged(self, offset: int) -> None:
        """An in-flight ``offset`` was acknowledged (PUBACK / PUBCOMP / refused PUBREC)."""
        if offset in self.restored:  # the reader has not reached it yet: it completes it then
            self.restored[offset] = True
        else:
            self.complete(offset)

    def _advance(self) -> None:
        order, done = self._order, self._done
        while order and done[order[0]]:
            first = order.popleft()
            del done[first]
            self.committed = first + 1

    async def commit(self, backend: LightStore) -> None:
        """Store ``committed`` if it changed and the cursor is durable."""
        if self.durable and self.committed != self.stored:
            value = self.committed
            await backend.commit_consumer_offset(self.group, self.lmq, LMQ_QUEUE_ID, value)
            self.stored = value

    def rewind(self) -> None:
        """Forget un-acked offsets and read again from ``committed`` (after a restart of delivery)."""
        self._order.clear()
        self._done.clear()
        self.next_offset = self.committed
