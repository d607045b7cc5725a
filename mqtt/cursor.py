"""A reader's position on one queue of an LMQ: :class:`Cursor` (the next offset to read, the un-acked offsets
behind it and the committed offset it stores for a persistent session or shared group). An LMQ has one
queue in the embedded store and one per broker on a cluster (:func:`~mqproxy.mqtt.store.queue_ids`); a
subscription has a cursor per queue."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mqproxy.model.topics import LMQ_QUEUE_ID

if TYPE_CHECKING:
    from mqproxy.mqtt.store import LightStore

__all__ = ["Cursor"]


class Cursor:
    """Read position of one reader on queue ``queue_id`` of an LMQ plus its un-acked offsets.

    ``next_offset`` -1: not positioned yet (its broker did not answer when the subscription was made);
    the reader positions it with :meth:`place`: at the committed offset if one is stored and
    :attr:`resume` is set, else at the first message stored at or after :attr:`since_ms` if that is set
    (the subscription's creation time: what its broker stored since then is for the subscription), else
    at the queue's end.

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
        "queue_id",
        "restored",
        "resume",
        "since_ms",
        "stored",
    )

    def __init__(self, lmq: str, offset: int, group: str = "", queue_id: int = LMQ_QUEUE_ID) -> None:
        self.lmq = lmq
        self.queue_id = queue_id
        self.resume = False  # place() takes the committed offset first
        self.since_ms = 0  # place() without a committed offset: 0 the end, else the first message since
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

    def complete_all(self, offsets: Sequence[int]) -> None:
        """:meth:`complete` each of ``offsets``, in order (one step while nothing awaits an ack)."""
        if self._order:
            for offset in offsets:
                self.complete(offset)
        elif offsets:
            self.committed = max(self.committed, max(offsets) + 1)

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
            await backend.commit_consumer_offset(self.group, self.lmq, self.queue_id, value)
            self.stored = value

    @property
    def positioned(self) -> bool:
        return self.next_offset >= 0

    async def place(self, backend: LightStore) -> None:
        """Position a cursor that is not (see the class docstring); a durable cursor that had no committed
        offset commits where it starts, so that a restart starts there too.

        ``search_offset`` answers the first offset stored at or after ``since_ms``, or the queue's end when
        nothing was (a stock broker's SEARCH_OFFSET_BY_TIMESTAMP with the default lower boundary, clamped
        to the queue's min and max offsets; 0 for an empty queue, which is its end); so nothing stored
        before the subscription is read and nothing stored after it is skipped.
        """
        offset: int | None = None
        if self.resume:
            offset = await backend.query_consumer_offset(self.group, self.lmq, self.queue_id)
        if offset is None:
            if self.since_ms > 0:
                offset = await backend.search_offset(self.lmq, self.queue_id, self.since_ms)
            else:
                offset = await backend.max_offset(self.lmq, self.queue_id)
            if self.durable:
                await backend.commit_consumer_offset(self.group, self.lmq, self.queue_id, offset)
        self.position(offset)

    def position(self, offset: int) -> None:
        """Start reading at ``offset`` (a cursor that was not positioned; nothing is tracked yet)."""
        self.next_offset = self.committed = self.stored = offset

    def rewind(self) -> None:
        """Forget un-acked offsets and read again from ``committed`` (after a restart of delivery)."""
        self._order.clear()
        self._done.clear()
        self.next_offset = self.committed
