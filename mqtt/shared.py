"""Shared subscriptions (``$share/<group>/<filter>``): one read position per (group, filter) and queue.

All members read the filter's LMQ through one :class:`SharedGroup`; :meth:`SharedGroup.claim` hands out one
message at a time, so each message goes to exactly one member and ready members share the load. The group
reads every queue of the LMQ (one per broker on a cluster, :func:`~mqproxy.mqtt.store.queue_ids`) in turn,
each with its own cursor (:attr:`SharedGroup.lanes`), so what another broker stored during a failover reaches
the group too. Its offsets are committed as consumer group ``%MQTT_SHARE%<group>`` on each queue (a new group
commits its start at once; a queue whose broker is down when the group opens starts, once it answers, at the
first message stored since the opening member subscribed). A message a member took but did not get
acknowledged before its session ended goes back to the group (``give_back``) and is delivered to another
member. A QoS 2 delivery of a persistent member is in that member's snapshot; after a restart it is marked on
the cursor of its queue, which then skips it for every other member until its owner completes it (see
``Session.load_qos2``).

Across the nodes of a cluster (``may_read`` set): one node reads a group at a time, the node the predicate
names (the live node with the smallest id among those holding members; see
:meth:`~mqproxy.mqtt.cluster_sync.ClusterSync.reads_share`). A node that is not the reader hands out only
returned messages; when it becomes the reader it resumes from the offsets the group committed last.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import structlog
import trio

from mqproxy.model.errors import BackendError
from mqproxy.model.types import PullStatus, StoredMessage
from mqproxy.mqtt.cursor import Cursor
from mqproxy.mqtt.mapping import SHARED_GROUP_PREFIX, lmq_name
from mqproxy.mqtt.store import LightStore, queue_ids

_log = structlog.get_logger("mqproxy.mqtt")

#: Seconds between two looks whether this node became a group's reader (cluster mode).
_ROLE_CHECK_S = 1.0


#: A message handed out by a group: the message, the cursor of the queue it is in, its offset there.
Claimed = tuple[StoredMessage, Cursor, int]


class SharedGroup:
    """One shared group's read positions (see the module docstring): ``lanes`` has a cursor per queue of
    the LMQ (``cursor`` is the first); a lane whose broker did not answer is positioned when it does."""

    def __init__(self, name: str, topic_filter: str, lanes: tuple[Cursor, ...]) -> None:
        self.name = name
        self.topic_filter = topic_filter
        self.lanes = lanes
        self.members = 0
        self._buffer: deque[Claimed] = deque()
        self._returned: deque[Claimed] = deque()
        self._next_lane = 0
        self._fetching = False
        self._fetched = trio.Event()
        #: Cluster mode: whether this node reads the group now (None: always).
        self.may_read: Callable[[], bool] | None = None
        self._reading = True

    @property
    def consumer_group(self) -> str:
        return SHARED_GROUP_PREFIX + self.name

    @property
    def cursor(self) -> Cursor:
        """The cursor of the LMQ's first queue (the only one in the embedded store)."""
        return self.lanes[0]

    def lane(self, queue_id: int) -> Cursor | None:
        """The cursor of queue ``queue_id`` (None if the LMQ had no such queue when the group opened)."""
        return next((cursor for cursor in self.lanes if cursor.queue_id == queue_id), None)

    @property
    def pending(self) -> bool:
        """True while some message handed out on any queue is not completed."""
        return any(cursor.pending for cursor in self.lanes)

    @classmethod
    async def open(
        cls, backend: LightStore, name: str, topic_filter: str, since_ms: int = 0, *, restored: bool = False
    ) -> SharedGroup:
        """Open the group for a member subscribed since ``since_ms`` (0: unknown). Each lane starts at the
        group's committed offset; a lane without one starts at the queue's end for a new subscription,
        and at the first message stored since ``since_ms`` for one ``restored`` from a session record or
        whose broker does not answer now (positioned when it does: nothing it stores is missed)."""
        lmq = lmq_name(topic_filter)
        lanes = tuple(Cursor(lmq, -1, SHARED_GROUP_PREFIX + name, q) for q in await queue_ids(backend, lmq))
        for cursor in lanes:
            cursor.durable = cursor.resume = True
            cursor.since_ms = since_ms if restored else 0
            try:
                await cursor.place(backend)
            except BackendError:
                if len(lanes) == 1:
                    raise
                cursor.since_ms = since_ms
        return cls(name, topic_filter, lanes)

    async def commit(self, backend: LightStore) -> None:
        """Store every lane's committed offset that changed (a lane whose broker fails is stored later;
        a single queue's failure raises)."""
        for cursor in self.lanes:
            try:
                await cursor.commit(backend)
            except BackendError:
                if len(self.lanes) == 1:
                    raise

    async def _may_read(self, backend: LightStore) -> bool:
        """Whether this node reads the group now; on becoming the reader, take the committed offsets."""
        assert self.may_read is not None
        if not self.may_read():
            self._reading = False
            return False
        if not self._reading:
            self._reading = True
            for cursor in self.lanes:
                if not cursor.positioned:
                    continue
                committed = await backend.query_consumer_offset(cursor.group, cursor.lmq, cursor.queue_id)
                if committed is not None and not cursor.pending and committed > cursor.next_offset:
                    cursor.next_offset = cursor.committed = cursor.stored = committed
        return True

    def give_back(self, message: StoredMessage, cursor: Cursor, offset: int) -> None:
        """Return an un-acknowledged message (at ``offset`` of ``cursor``'s queue) so another member gets
        it."""
        self._returned.append((message, cursor, offset))
        self._wake()

    def _wake(self) -> None:
        event, self._fetched = self._fetched, trio.Event()
        event.set()

    async def claim(self, backend: LightStore, poll_s: float) -> Claimed:
        """The next message for a member (waits for one), with the cursor of its queue and its offset."""
        while True:
            if self._returned:
                return self._returned.popleft()
            if self._buffer:
                return self._buffer.popleft()
            if self._fetching:
                await self._fetched.wait()
                continue
            self._fetching = True
            try:
                await self._fetch(backend, poll_s)
            finally:
                self._fetching = False
                self._wake()

    async def _fetch(self, backend: LightStore, poll_s: float) -> None:
        if self.may_read is not None and not await self._may_read(backend):
            with trio.move_on_after(min(poll_s, _ROLE_CHECK_S)):  # until a message comes back, or a look
                while not self._returned:
                    await self._fetched.wait()
            return
        lanes = self.lanes
        readable = []
        for i in range(len(lanes)):  # each queue in turn, starting after the one read last
            cursor = lanes[(self._next_lane + i) % len(lanes)]
            try:
                if not cursor.positioned:
                    await cursor.place(backend)
                if await self._pull(backend, cursor):
                    self._next_lane = (self._next_lane + i + 1) % len(lanes)
                    return
            except BackendError as exc:
                if len(lanes) == 1:
                    raise
                _log.warning("mqtt.lane_failed", topic=cursor.lmq, queue_id=cursor.queue_id, detail=str(exc))
                continue
            readable.append(cursor)
        with trio.move_on_after(poll_s):
            async with trio.open_nursery() as nursery:
                # Returned messages wake the waiters as well as new ones in any queue of the LMQ.
                async def returned() -> None:
                    while not self._returned:
                        await self._fetched.wait()
                    nursery.cancel_scope.cancel()

                async def stored(cursor: Cursor) -> None:
                    try:
                        await backend.wait_for_message(
                            cursor.lmq, cursor.queue_id, cursor.next_offset, poll_s
                        )
                    except BackendError:
                        if len(lanes) == 1:
                            raise
                        await trio.sleep(poll_s)  # that broker is down: the next look tries it again
                        return
                    nursery.cancel_scope.cancel()

                nursery.start_soon(returned)
                for cursor in readable:
                    nursery.start_soon(stored, cursor)

    async def _pull(self, backend: LightStore, cursor: Cursor) -> bool:
        """Buffer the next messages of ``cursor``'s queue; False when there were none."""
        start = cursor.next_offset
        result = await backend.pull(cursor.lmq, cursor.queue_id, start, 32)
        if result.messages:
            for i, message in enumerate(result.messages):
                self._buffer.append((message, cursor, start + i))
                cursor.track(start + i)  # claimed or not: the group's offset waits for it
            cursor.next_offset = start + len(result.messages)
            return True
        if result.status is PullStatus.OFFSET_ILLEGAL and result.next_offset != start:
            cursor.next_offset = result.next_offset
            if result.next_offset > start:
                cursor.complete(result.next_offset - 1)
            return True  # moved: look again before waiting
        return False
