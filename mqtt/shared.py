"""Shared subscriptions (``$share/<group>/<filter>``): one read position per (group, filter).

All members read the filter's LMQ through one :class:`SharedGroup`; :meth:`SharedGroup.claim` hands out
one message at a time, so each message goes to exactly one member and ready members share the load.
The group's offset is committed as consumer group ``%MQTT_SHARE%<group>`` on the LMQ (a new group commits
its start at once). A message a member took but did not get acknowledged before its session ended goes
back to the group (``give_back``) and is delivered to another member. A QoS 2 delivery of a persistent
member is in that member's snapshot; after a restart it is marked on the group's cursor, which then
skips it for every other member until its owner completes it (see ``Session.load_qos2``).

Across the nodes of a cluster (``may_read`` set): one node reads a group at a time, the node the predicate
names (the live node with the smallest id among those holding members; see
:meth:`~mqproxy.mqtt.cluster_sync.ClusterSync.reads_share`). A node that is not the reader hands out only
returned messages; when it becomes the reader it resumes from the offset the group committed last.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import trio

from mqproxy.model.topics import LMQ_QUEUE_ID
from mqproxy.model.types import PullStatus, StoredMessage
from mqproxy.mqtt.cursor import Cursor
from mqproxy.mqtt.mapping import SHARED_GROUP_PREFIX, lmq_name
from mqproxy.mqtt.store import LightStore

#: Seconds between two looks whether this node became a group's reader (cluster mode).
_ROLE_CHECK_S = 1.0


class SharedGroup:
    def __init__(self, name: str, topic_filter: str, cursor: Cursor) -> None:
        self.name = name
        self.topic_filter = topic_filter
        self.cursor = cursor
        self.members = 0
        self._buffer: deque[tuple[StoredMessage, int]] = deque()
        self._returned: deque[tuple[StoredMessage, int]] = deque()
        self._fetching = False
        self._fetched = trio.Event()
        #: Cluster mode: whether this node reads the group now (None: always).
        self.may_read: Callable[[], bool] | None = None
        self._reading = True

    @property
    def consumer_group(self) -> str:
        return SHARED_GROUP_PREFIX + self.name

    @classmethod
    async def open(cls, backend: LightStore, name: str, topic_filter: str) -> SharedGroup:
        lmq = lmq_name(topic_filter)
        group = SHARED_GROUP_PREFIX + name
        offset = await backend.query_consumer_offset(group, lmq, LMQ_QUEUE_ID)
        if offset is None:  # a new group starts at the end, and after a restart from there
            offset = await backend.max_offset(lmq, LMQ_QUEUE_ID)
            await backend.commit_consumer_offset(group, lmq, LMQ_QUEUE_ID, offset)
        cursor = Cursor(lmq, offset, group)
        cursor.durable = True
        return cls(name, topic_filter, cursor)

    async def _may_read(self, backend: LightStore) -> bool:
        """Whether this node reads the group now; on becoming the reader, take the committed offset."""
        assert self.may_read is not None
        if not self.may_read():
            self._reading = False
            return False
        if not self._reading:
            self._reading = True
            cursor = self.cursor
            committed = await backend.query_consumer_offset(cursor.group, cursor.lmq, LMQ_QUEUE_ID)
            if committed is not None and not cursor.pending and committed > cursor.next_offset:
                cursor.next_offset = cursor.committed = cursor.stored = committed
        return True

    def give_back(self, message: StoredMessage, offset: int) -> None:
        """Return an un-acknowledged message so another member gets it."""
        self._returned.append((message, offset))
        self._wake()

    def _wake(self) -> None:
        event, self._fetched = self._fetched, trio.Event()
        event.set()

    async def claim(self, backend: LightStore, poll_s: float) -> tuple[StoredMessage, int]:
        """The next message for a member (waits for one)."""
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
        cursor = self.cursor
        if self.may_read is not None and not await self._may_read(backend):
            with trio.move_on_after(min(poll_s, _ROLE_CHECK_S)):  # until a message comes back, or a look
                while not self._returned:
                    await self._fetched.wait()
            return
        start = cursor.next_offset
        result = await backend.pull(cursor.lmq, LMQ_QUEUE_ID, start, 32)
        if result.messages:
            for i, message in enumerate(result.messages):
                self._buffer.append((message, start + i))
                cursor.track(start + i)  # claimed or not: the group's offset waits for it
            cursor.next_offset = start + len(result.messages)
            return
        if result.status is PullStatus.OFFSET_ILLEGAL and result.next_offset != start:
            cursor.next_offset = result.next_offset
            if result.next_offset > start:
                cursor.complete(result.next_offset - 1)
            return
        with trio.move_on_after(poll_s):
            async with trio.open_nursery() as nursery:
                # Returned messages wake the waiters as well as new ones in the LMQ.
                async def returned() -> None:
                    while not self._returned:
                        await self._fetched.wait()
                    nursery.cancel_scope.cancel()

                async def stored() -> None:
                    await backend.wait_for_message(cursor.lmq, LMQ_QUEUE_ID, start, poll_s)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(returned)
                nursery.start_soon(stored)
