"""MQTT session state that outlives a network connection (in memory; durable parts in :mod:`.state`).

A :class:`Session` holds the subscriptions, one :class:`Cursor` per subscription (its read position on the
filter's LMQ and the un-acked offsets behind it), the outbound in-flight window and the inbound QoS 2
packet ids awaiting PUBREL. A connection attaches to it, delivers from it and detaches; nothing here does
I/O except :meth:`Session.commit_offsets`, which stores the cursors' offsets for persistent sessions.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from mqproxy.broker.topics import LMQ_QUEUE_ID
from mqproxy.codecs.mqtt import Publish
from mqproxy.mqtt.mapping import SESSION_GROUP_PREFIX
from mqproxy.mqtt.state import SessionSnapshot, SubscriptionSpec

if TYPE_CHECKING:
    from mqproxy.broker.backend import Backend

NEVER_EXPIRES = 0xFFFFFFFF


class Cursor:
    """Read position of one reader on an LMQ plus its un-acked offsets.

    ``next_offset`` is the next offset to read; ``committed`` the first offset not yet completed (every
    offset below it was delivered and, for QoS 1/2, acknowledged). Completion may happen out of order;
    ``committed`` advances over the completed prefix.
    """

    __slots__ = ("_done", "_order", "committed", "durable", "group", "lmq", "next_offset", "stored")

    def __init__(self, lmq: str, offset: int, group: str = "") -> None:
        self.lmq = lmq
        self.group = group  # consumer group its offset is committed under
        self.durable = False  # commit offsets to the store
        self.next_offset = offset
        self.committed = offset
        self.stored = offset  # last value written to the backend
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

    def _advance(self) -> None:
        order, done = self._order, self._done
        while order and done[order[0]]:
            first = order.popleft()
            del done[first]
            self.committed = first + 1

    async def commit(self, backend: Backend) -> None:
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


@dataclass(slots=True)
class InFlight:
    """One outbound QoS 1/2 message awaiting PUBACK / PUBREC / PUBCOMP."""

    packet_id: int
    publish: Publish
    cursor: Cursor | None  # None for retained messages sent at SUBSCRIBE
    offset: int
    released: bool = False  # QoS 2: PUBREC received, PUBREL sent
    shared: Any = None  # (SharedGroup, StoredMessage) for a shared-subscription delivery


class Session:
    def __init__(self, client_id: str, expiry_interval: int, send_quota: int) -> None:
        self.client_id = client_id
        self.expiry_interval = expiry_interval
        self.send_quota = send_quota
        self.subscriptions: dict[str, SubscriptionSpec] = {}
        self.cursors: dict[str, Cursor] = {}
        self.shared: dict[str, Any] = {}  # topic filter -> SharedGroup
        self.inflight: dict[int, InFlight] = {}
        self.awaiting_rel: set[int] = set()
        self.connection: Any = None
        self.epoch = 0  # bumped on every attach: timers of an older disconnect do nothing
        self.ended = False
        self._next_packet_id = 1
        self._slots = trio.lowlevel.ParkingLot()

    @property
    def persistent(self) -> bool:
        return self.expiry_interval > 0

    @property
    def group(self) -> str:
        return SESSION_GROUP_PREFIX + self.client_id

    def snapshot(self, disconnected_at_ms: int | None = None) -> SessionSnapshot:
        return SessionSnapshot(
            self.client_id, self.expiry_interval, list(self.subscriptions.values()), disconnected_at_ms
        )

    # --- outbound window ----------------------------------------------------------------------
    async def acquire_slot(self) -> None:
        """Wait until the in-flight window has room for one more QoS 1/2 PUBLISH."""
        while len(self.inflight) >= self.send_quota:
            await self._slots.park()

    def add_inflight(
        self, publish_factory: Any, cursor: Cursor | None, offset: int, shared: Any = None
    ) -> InFlight:
        """Allocate a packet id and record the message built by ``publish_factory(packet_id)``."""
        packet_id = self._next_packet_id
        while packet_id in self.inflight:
            packet_id = packet_id % 65535 + 1
        self._next_packet_id = packet_id % 65535 + 1
        entry = InFlight(packet_id, publish_factory(packet_id), cursor, offset, shared=shared)
        self.inflight[packet_id] = entry
        if cursor is not None:
            cursor.track(offset)
        return entry

    def finish(self, packet_id: int) -> InFlight | None:
        """Drop a completed in-flight message and complete its offset; None if the id was unknown."""
        entry = self.inflight.pop(packet_id, None)
        if entry is None:
            return None
        if entry.cursor is not None:
            entry.cursor.complete(entry.offset)
        self._slots.unpark()
        return entry

    def give_back_shared(self) -> None:
        """Return un-acked shared-subscription messages to their groups (the session is ending)."""
        for packet_id, entry in list(self.inflight.items()):
            if entry.shared is not None and not entry.released:
                group, message = entry.shared
                del self.inflight[packet_id]
                group.give_back(message, entry.offset)

    def wake_all(self) -> None:
        self._slots.unpark_all()

    async def commit_offsets(self, backend: Backend) -> None:
        """Store every cursor's committed offset that changed (persistent sessions only)."""
        for cursor in list(self.cursors.values()):
            cursor.durable = self.persistent
            await cursor.commit(backend)
