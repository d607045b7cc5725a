"""MQTT session state that outlives a network connection (in memory; durable parts in :mod:`.state`).

A :class:`Session` holds the subscriptions, one :class:`~mqproxy.mqtt.cursor.Cursor` per subscription and
queue of its LMQ (its read position on the filter's LMQ and the un-acked offsets behind it; an LMQ has one
queue per broker on a cluster, see :func:`~mqproxy.mqtt.store.queue_ids`), the outbound in-flight window and
the inbound QoS 2 packet ids awaiting PUBREL. A connection attaches to it, delivers from it and detaches;
nothing here does I/O except :meth:`Session.commit_offsets`, which stores the cursors' offsets for
persistent sessions, and :meth:`Session.restore_inflight`, which re-reads restored QoS 2 deliveries from
their LMQs.

Exactly-once across a crash (persistent sessions): :meth:`Session.snapshot` carries the inbound ids awaiting
PUBREL and the outbound QoS 2 deliveries (``InFlight.durable``) plus completed ones the committed offset
has not passed yet. After a restart :meth:`Session.load_qos2` puts them back: the ids at once, the
deliveries on the cursor (``Cursor.restored``: the reader skips those offsets) and, at the next attach,
as in-flight entries under their original packet ids (:meth:`Session.restore_inflight`). A shared
subscription's deliveries are marked on its group's cursor, so no other member gets them; retained
messages sent at SUBSCRIBE are recorded by commit-log offset and read back with ``get_message``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from mqproxy.codecs.mqtt import Publish, QoS
from mqproxy.model.errors import BackendError
from mqproxy.model.topics import LMQ_QUEUE_ID
from mqproxy.model.types import PullStatus, StoredMessage
from mqproxy.mqtt.cursor import Cursor
from mqproxy.mqtt.mapping import SESSION_GROUP_PREFIX, decode_properties
from mqproxy.mqtt.session_record import (
    COMPLETE,
    RELEASED,
    SENT,
    InboundQos2,
    OutboundQos2,
    SessionSnapshot,
    SubscriptionSpec,
    WillRecord,
)

if TYPE_CHECKING:
    from mqproxy.mqtt.store import LightStore

#: Builds the PUBLISH of a restored delivery for the attaching connection (None: cannot, e.g. expired);
#: the flag says it is a retained message sent at SUBSCRIBE.
PublishBuilder = Callable[[SubscriptionSpec, StoredMessage, bool], "Publish | None"]

#: Completed QoS 2 deliveries a snapshot keeps at most (see ``Session._prune_settled``).
_SETTLED_MAX = 1024


@dataclass(slots=True)
class InFlight:
    """One outbound QoS 1/2 message awaiting PUBACK / PUBREC / PUBCOMP."""

    packet_id: int
    publish: Publish
    cursor: Cursor | None  # None for retained messages sent at SUBSCRIBE
    offset: int  # in the cursor's LMQ; for a retained message, its commit-log offset
    released: bool = False  # QoS 2: PUBREC received, PUBREL sent
    shared: Any = None  # (SharedGroup, StoredMessage) for a shared-subscription delivery
    durable: bool = False  # QoS 2 of a persistent session: in the snapshot; sent once that is written
    retained_for: str | None = None  # a retained message sent at SUBSCRIBE: the subscription's filter


class _NoIds(set[int]):
    """The one empty id set every session starts with (most never hold an id: 216 B saved per session).
    Read-only: growing it is a bug (:meth:`Session.expect_rel` replaces it first); ``discard`` is a no-op."""

    def add(self, element: int) -> None:
        raise TypeError("the shared empty id set is read-only")

    def update(self, *others: Any) -> None:
        raise TypeError("the shared empty id set is read-only")


_NO_IDS = _NoIds()


class Session:
    __slots__ = (  # one per session: no attribute dict
        "_next_packet_id",
        "_slots",
        "awaiting_rel",
        "client_id",
        "connection",
        "cursors",
        "ended",
        "epoch",
        "expiry_interval",
        "held",
        "inflight",
        "lanes",
        "rel_marks",
        "restarted_at_ms",
        "restored",
        "send_quota",
        "settled",
        "shared",
        "subscriptions",
        "unconfirmed",
        "will",
    )

    def __init__(self, client_id: str, expiry_interval: int, send_quota: int) -> None:
        self.client_id = client_id
        self.expiry_interval = expiry_interval
        self.send_quota = send_quota
        self.subscriptions: dict[str, SubscriptionSpec] = {}
        #: The cursor of each subscription on the first queue of its LMQ (its only one, embedded).
        self.cursors: dict[str, Cursor] = {}
        #: Every cursor of each subscription read on several queues, the first being in :attr:`cursors`
        #: (see :meth:`lanes_of`).
        self.lanes: dict[str, tuple[Cursor, ...]] = {}
        self.shared: dict[str, Any] = {}  # topic filter -> SharedGroup
        #: Shared filters no longer subscribed whose groups still wait for QoS 2 deliveries of ours.
        self.held: dict[str, Any] = {}
        self.inflight: dict[int, InFlight] = {}
        self.awaiting_rel: set[int] = _NO_IDS  # a set of its own from the first id (expect_rel)
        #: Persistent sessions: the LMQ and its queues' sizes just before the message of an id in
        #: ``awaiting_rel`` was stored, until the store accepted it (see
        #: :class:`~mqproxy.mqtt.session_record.InboundQos2`).
        self.rel_marks: dict[int, InboundQos2] = {}
        #: Ids restored after a restart whose message may or may not be stored (:meth:`confirm_stored`).
        self.unconfirmed: set[int] = _NO_IDS  # a set of its own only after a restart (load_qos2)
        self.restarted_at_ms = 0
        #: Completed durable QoS 2 deliveries whose offset the stored committed offset has not passed.
        self.settled: list[tuple[Cursor, int]] = []
        #: Outbound QoS 2 records loaded at start-up, waiting for the next attach.
        self.restored: list[OutboundQos2] = []
        self.connection: Any = None
        self.epoch = 0  # bumped on every attach: timers of an older disconnect do nothing
        #: Cluster mode: the Will of the connection holding the session, kept in its records.
        self.will: WillRecord | None = None
        self.ended = False
        self._next_packet_id = 1
        self._slots: trio.lowlevel.ParkingLot | None = None  # made by the first wait for a slot

    @property
    def persistent(self) -> bool:
        return self.expiry_interval > 0

    @property
    def group(self) -> str:
        return SESSION_GROUP_PREFIX + self.client_id

    def snapshot(self, disconnected_at_ms: int | None = None) -> SessionSnapshot:
        """The durable view of this session, QoS 2 state included."""
        return SessionSnapshot(
            self.client_id,
            self.expiry_interval,
            list(self.subscriptions.values()),
            disconnected_at_ms,
            awaiting_rel=[self.rel_marks.get(i) or InboundQos2(i) for i in sorted(self.awaiting_rel)],
            outbound=self._outbound_records(),
            will=self.will if disconnected_at_ms is None else None,
        )

    def group_for(self, topic_filter: str) -> Any:
        """The shared group of ``topic_filter``, subscribed or only ``held``; None if not shared."""
        return self.shared.get(topic_filter) or self.held.get(topic_filter)

    def cursor_for(self, topic_filter: str, queue_id: int = LMQ_QUEUE_ID) -> Cursor | None:
        """The read position of a subscription on ``queue_id``: its own, or its shared group's."""
        for cursor in self.lanes_of(topic_filter):
            if cursor.queue_id == queue_id:
                return cursor
        group = self.group_for(topic_filter)
        return group.lane(queue_id) if group is not None else None

    def lanes_of(self, topic_filter: str) -> tuple[Cursor, ...]:
        """The cursors of a (non-shared) subscription, one per queue of its LMQ (none if not subscribed)."""
        lanes = self.lanes.get(topic_filter)
        if lanes is not None:
            return lanes
        cursor = self.cursors.get(topic_filter)
        return (cursor,) if cursor is not None else ()

    def _filters_by_cursor(self) -> dict[int, str]:
        filters = {id(c): topic_filter for topic_filter in self.cursors for c in self.lanes_of(topic_filter)}
        for groups in (self.held, self.shared):
            for topic_filter, group in groups.items():
                filters.update((id(cursor), topic_filter) for cursor in group.lanes)
        return filters

    def _outbound_records(self) -> list[OutboundQos2]:
        if not (self.settled or self.restored or any(e.durable for e in self.inflight.values())):
            return []
        filters = self._filters_by_cursor()
        records = list(self.restored)
        for entry in self.inflight.values():
            if not entry.durable:
                continue
            phase = RELEASED if entry.released else SENT
            if entry.retained_for is not None:
                records.append(OutboundQos2(entry.packet_id, entry.retained_for, entry.offset, phase, True))
                continue
            topic_filter = filters.get(id(entry.cursor))
            if topic_filter is not None and entry.cursor is not None:
                queue = entry.cursor.queue_id
                records.append(OutboundQos2(entry.packet_id, topic_filter, entry.offset, phase, False, queue))
        self._prune_settled()
        for cursor, offset in self.settled:
            topic_filter = filters.get(id(cursor))
            if topic_filter is not None:
                records.append(OutboundQos2(0, topic_filter, offset, COMPLETE, False, cursor.queue_id))
        return records

    def _prune_settled(self) -> None:
        """Forget settled offsets that are committed or whose subscription is gone, and all but the
        newest ``2 x send_quota`` (at most ``_SETTLED_MAX``): a shared group's offset can be held back by
        another member for good, and the snapshot is rewritten on every QoS 2 delivery. Past that bound
        a crash may deliver an old completed message again (at least once)."""
        live = self._filters_by_cursor()
        kept = [(c, o) for c, o in self.settled if o >= c.stored and id(c) in live]
        limit = min(2 * self.send_quota, _SETTLED_MAX)
        self.settled = kept[-limit:] if len(kept) > limit else kept

    # --- restart ------------------------------------------------------------------------------
    def load_qos2(self, snapshot: SessionSnapshot, now_ms: int) -> None:
        """Put back the QoS 2 state of ``snapshot`` (after the subscriptions and their cursors).

        Inbound ids whose message may not have been stored become ``unconfirmed``. Deliveries of gone
        subscriptions or below the committed offset are dropped; the rest is marked on the cursors now
        and becomes in-flight at the next attach (:meth:`restore_inflight`).
        """
        self.awaiting_rel = {entry.packet_id for entry in snapshot.awaiting_rel}
        self.rel_marks = {e.packet_id: e for e in snapshot.awaiting_rel if e.lmq}
        self.unconfirmed = set(self.rel_marks)
        self.restarted_at_ms = now_ms
        seen: set[int] = set()
        for record in sorted(snapshot.outbound, key=lambda r: (r.queue_id, r.offset)):
            if record.retained:
                if record.packet_id not in seen:
                    seen.add(record.packet_id)
                    self.restored.append(record)
                continue
            cursor = self.cursor_for(record.topic_filter, record.queue_id)
            if cursor is None or record.offset < cursor.committed or record.offset in cursor.restored:
                continue
            if record.phase == COMPLETE:
                cursor.restored[record.offset] = True
                self.settled.append((cursor, record.offset))
                continue
            if record.packet_id == 0 or record.packet_id in seen:
                continue
            seen.add(record.packet_id)
            cursor.restored[record.offset] = False
            self.restored.append(record)

    # --- inbound QoS 2 -------------------------------------------------------------------------
    def expect_rel(self, packet_ids: list[int]) -> None:
        """Add QoS 2 ids that now await their PUBREL."""
        if self.awaiting_rel is _NO_IDS:
            self.awaiting_rel = set()
        self.awaiting_rel.update(packet_ids)

    def release(self, packet_id: int) -> bool:
        """PUBREL: forget ``packet_id``; False if it was not awaiting one."""
        if packet_id not in self.awaiting_rel:
            return False
        self.awaiting_rel.discard(packet_id)
        self.rel_marks.pop(packet_id, None)
        self.unconfirmed.discard(packet_id)
        return True

    async def confirm_stored(
        self, backend: LightStore, packet_id: int, client_id: str, topic: str, payload: bytes
    ) -> bool:
        """An ``unconfirmed`` id came again in a PUBLISH: True if its message was stored before the
        restart (the PUBLISH is a duplicate; the id keeps awaiting PUBREL), False if not (the id is
        forgotten: store the PUBLISH as new). Looks for a message of ``client_id`` with this payload (and
        ``topic``, unless empty) stored in the recorded LMQ after the recorded size and before the restart,
        in every queue the mark names (a cluster's brokers: the message went to one of them). A queue
        whose broker fails is passed over when the mark names others (if the message is there, the PUBLISH
        is stored again); a single queue's failure raises."""
        self.unconfirmed.discard(packet_id)
        mark = self.rel_marks.pop(packet_id, None)
        if mark is None:
            return packet_id in self.awaiting_rel
        queues = mark.queues
        for queue_id, size in queues:
            try:
                if await self._stored_since(backend, mark.lmq, queue_id, size, client_id, topic, payload):
                    return True
            except BackendError:
                if len(queues) == 1:
                    raise
        self.awaiting_rel.discard(packet_id)
        return False

    async def _stored_since(
        self,
        backend: LightStore,
        lmq: str,
        queue_id: int,
        offset: int,
        client_id: str,
        topic: str,
        payload: bytes,
    ) -> bool:
        """Whether queue ``queue_id`` of ``lmq`` holds, from ``offset`` on, the message
        :meth:`confirm_stored` looks for (stored before the restart)."""
        while True:
            result = await backend.pull(lmq, queue_id, offset, 64)
            if not result.messages:
                if result.status is PullStatus.OFFSET_ILLEGAL and result.next_offset > offset:
                    offset = result.next_offset
                    continue
                return False
            for message in result.messages:
                if message.store_timestamp_ms >= self.restarted_at_ms:
                    return False
                attrs = decode_properties(message.properties)
                if (
                    attrs is not None
                    and attrs.client_id == client_id
                    and message.body == payload
                    and (not topic or attrs.topic == topic)
                ):
                    return True
            if result.next_offset <= offset:
                return False
            offset = result.next_offset

    # --- outbound QoS 2 after a restart ---------------------------------------------------------
    async def restore_inflight(self, backend: LightStore, build: PublishBuilder) -> None:
        """Turn the records loaded by :meth:`load_qos2` into in-flight entries under their packet ids.

        A ``SENT`` delivery gets its PUBLISH back from the store via ``build``; if the message is gone
        (or ``build`` declines) the entry is marked released instead, so the peer gets a PUBREL for the
        id: that releases a copy it may hold and frees the id for reuse. Call before anything else
        allocates packet ids on this session.
        """
        while self.restored:  # each record stays listed until its entry exists: snapshots never miss it
            record = self.restored[0]
            spec = self.subscriptions.get(record.topic_filter)
            cursor: Cursor | None = None
            group: Any = None
            message: StoredMessage | None = None
            if record.retained:
                if record.phase == SENT:
                    message = await backend.get_message(record.offset)
            else:
                cursor = self.cursor_for(record.topic_filter, record.queue_id)
                group = self.group_for(record.topic_filter)
                if spec is None and group is not None:  # unsubscribed meanwhile: still completed
                    spec = SubscriptionSpec(record.topic_filter, QoS.EXACTLY_ONCE)
                # (another member's reader may be past a shared delivery: the group does not mark it)
                if cursor is None or spec is None or not (group or record.offset in cursor.restored):
                    del self.restored[0]
                    continue
                if record.phase == SENT:
                    result = await backend.pull(cursor.lmq, cursor.queue_id, record.offset, 1)
                    if result.status is PullStatus.FOUND and result.next_offset == record.offset + 1:
                        message = result.messages[0]
            publish = None
            if message is not None and spec is not None:
                publish = build(spec, message, record.retained)
            released = publish is None
            if publish is None:  # only the id matters once released
                publish = Publish(record.topic_filter, b"", QoS.EXACTLY_ONCE, packet_id=record.packet_id)
            else:
                publish = dataclasses.replace(publish, qos=QoS.EXACTLY_ONCE, packet_id=record.packet_id)
            self.inflight[record.packet_id] = InFlight(
                record.packet_id,
                publish,
                cursor,
                record.offset,
                released,
                shared=(group, None if released else message) if group is not None else None,
                durable=True,
                retained_for=record.topic_filter if record.retained else None,
            )
            del self.restored[0]

    # --- outbound window ----------------------------------------------------------------------
    async def acquire_slot(self) -> None:
        """Wait until the in-flight window has room for one more QoS 1/2 PUBLISH."""
        while len(self.inflight) >= self.send_quota:
            if self._slots is None:
                self._slots = trio.lowlevel.ParkingLot()
            await self._slots.park()

    def add_inflight(
        self,
        publish_factory: Any,
        cursor: Cursor | None,
        offset: int,
        shared: Any = None,
        retained_for: str | None = None,
    ) -> InFlight:
        """Allocate a packet id and record the message built by ``publish_factory(packet_id)``.

        ``retained_for``: a retained message sent at SUBSCRIBE to that filter (no cursor; ``offset`` is
        its commit-log offset). QoS 2 entries of a persistent session are ``durable``."""
        packet_id = self._next_packet_id
        while packet_id in self.inflight:
            packet_id = packet_id % 65535 + 1
        self._next_packet_id = packet_id % 65535 + 1
        publish = publish_factory(packet_id)
        durable = (
            publish.qos == QoS.EXACTLY_ONCE
            and (cursor is not None or retained_for is not None)
            and self.persistent
        )
        entry = InFlight(
            packet_id, publish, cursor, offset, shared=shared, durable=durable, retained_for=retained_for
        )
        self.inflight[packet_id] = entry
        if cursor is not None:
            cursor.track(offset)
        return entry

    def finish(self, packet_id: int) -> InFlight | None:
        """Drop a completed in-flight message and complete its offset; None if the id was unknown.

        A durable QoS 2 delivery is remembered in ``settled`` until its offset is committed.
        """
        entry = self.inflight.pop(packet_id, None)
        if entry is None:
            return None
        cursor = entry.cursor
        if cursor is not None:
            cursor.acknowledged(entry.offset)
            if entry.durable:
                self.settled.append((cursor, entry.offset))
                if len(self.settled) > 2 * self.send_quota:
                    self._prune_settled()
        if self._slots is not None:
            self._slots.unpark()
        return entry

    async def give_back_shared(self, backend: LightStore) -> None:
        """The session is ending: return the shared-subscription messages the peer has not received
        for sure (no PUBREC yet) to their groups, so another member gets them, and complete the rest.
        Deliveries restored after a restart but never re-sent (no attach since) count the same."""
        for packet_id, entry in list(self.inflight.items()):
            if entry.shared is None:  # (a shared entry keeps its group after UNSUBSCRIBE)
                continue
            group, message = entry.shared
            del self.inflight[packet_id]
            if entry.cursor is None:
                continue
            if entry.released or message is None:
                entry.cursor.acknowledged(entry.offset)
            else:
                group.give_back(message, entry.cursor, entry.offset)
        for record in self.restored:
            group = self.group_for(record.topic_filter)
            if group is None or record.retained:
                continue
            cursor = group.lane(record.queue_id)
            if cursor is None:
                continue
            if record.phase != SENT:
                cursor.acknowledged(record.offset)
            elif cursor.restored.pop(record.offset, None) is None:  # the group read past it already
                result = await backend.pull(cursor.lmq, cursor.queue_id, record.offset, 1)
                if result.status is PullStatus.FOUND and result.next_offset == record.offset + 1:
                    group.give_back(result.messages[0], cursor, record.offset)
                else:
                    cursor.complete(record.offset)  # gone from the store
        self.restored.clear()

    def wake_all(self) -> None:
        if self._slots is not None:
            self._slots.unpark_all()

    async def commit_offsets(self, backend: LightStore) -> None:
        """Store every cursor's committed offset that changed (persistent sessions only). A subscription
        read on several queues (a cluster's brokers) skips a queue whose broker fails: its offset is
        stored by a later commit; a single queue's failure raises."""
        for topic_filter in list(self.cursors):
            lanes = self.lanes_of(topic_filter)
            for cursor in lanes:
                cursor.durable = self.persistent
                try:
                    await cursor.commit(backend)
                except BackendError:
                    if len(lanes) == 1:
                        raise
