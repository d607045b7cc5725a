"""Durable snapshots of persistent MQTT sessions, kept in the store itself.

Each change (subscribe, unsubscribe, connect, disconnect, expiry) appends the client's whole snapshot as a
JSON record to the internal topic :data:`~mqproxy.mqtt.mapping.SESSION_STATE_TOPIC` (queue 0); a record
with ``"deleted": true`` ends the session. :meth:`SessionStateStore.load` replays the topic at start-up,
the last record per client wins. Keeping the state in the store (not in side files) means it has the same
flush policy and crash recovery as the messages and offsets it refers to, and works with any LightStore.
Consumer offsets per subscription live beside it as consumer offsets of group ``%MQTT%<client id>``.
The log is compacted to the newest record per live client (:mod:`mqproxy.facade.compaction`) at start-up
and by the gateway's housekeeping timer, so replay reads about one record per persistent session.

QoS 2 state rides in the same record, so that exactly-once survives a crash: the inbound packet ids
awaiting PUBREL (``awaiting_rel``, see :class:`InboundQos2`) and the outbound QoS 2 deliveries
(``outbound``, see :class:`OutboundQos2`). Records written before these fields existed load with both empty.
Writes of one client go through :meth:`SessionStateStore.write`, which serializes them (the last record
in the topic is the newest state) and lets concurrent callers share one append.

Cluster mode (``node`` set): the topic has one queue per broker and a record goes to queue 0 or, when
its broker fails, to another broker's queue; readers read every queue. Each record then carries a
``version`` (microseconds since the epoch, above every version this node has seen for the client), and
the highest version of a client is its newest state whichever queue holds it.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import structlog
import trio

from mqproxy.codecs.mqtt import QoS, Will
from mqproxy.codecs.mqtt.encoding import Reader
from mqproxy.codecs.mqtt.properties import PropertyContext, decode_properties, encode_properties
from mqproxy.facade.compaction import Replay, compact_if_worth, replay, worth_compacting
from mqproxy.model.errors import BackendError
from mqproxy.model.types import Message, PullStatus, StoredMessage
from mqproxy.mqtt.mapping import SESSION_STATE_TOPIC
from mqproxy.mqtt.store import LightStore, queue_ids

_log = structlog.get_logger("mqproxy.mqtt")

_QUEUE = 0
_BATCH = 64
#: Longest wait for a record written in cluster mode to become readable by the other nodes.
_VISIBLE_S = 5.0


@dataclass(frozen=True, slots=True)
class SubscriptionSpec:
    """One subscription as the client asked for it (``topic_filter`` includes any ``$share/g/``)."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int | None = None


#: Phases of an outbound QoS 2 delivery, as recorded in :attr:`OutboundQos2.phase`.
SENT, RELEASED, COMPLETE = 0, 1, 2


class InboundQos2(NamedTuple):
    """An inbound QoS 2 packet id awaiting PUBREL, and where its message was going to be stored.

    The id is recorded before the message is stored, so after a crash it is not known whether the store
    got the message: ``lmq`` (the LMQ of the PUBLISH's topic) held ``offset`` messages just before, and
    the re-sent PUBLISH is looked for from there (see ``Session.confirm_stored``). ``lmq`` empty: the
    message is known to be stored. On the wire: ``[packet_id, lmq, offset]``.
    """

    packet_id: int
    lmq: str = ""
    offset: int = 0

    @classmethod
    def from_list(cls, raw: Any) -> InboundQos2:
        """Raises ValueError unless ``raw`` is ``[id 1..65535, str, offset >= 0]``."""
        if not isinstance(raw, list) or len(raw) != 3:
            raise ValueError(f"awaiting_rel entry: expected 3 items, got {raw!r}")
        packet_id, lmq, offset = raw
        if (
            type(packet_id) is not int
            or not 0 < packet_id <= 0xFFFF
            or not isinstance(lmq, str)
            or type(offset) is not int
            or offset < 0
        ):
            raise ValueError(f"awaiting_rel entry: bad values {raw!r}")
        return cls(packet_id, lmq, offset)


class OutboundQos2(NamedTuple):
    """One outbound QoS 2 delivery of a persistent session, as recorded durably.

    ``SENT``: the PUBLISH went out under ``packet_id`` (re-send it with DUP=1 after a restart).
    ``RELEASED``: PUBREC came back and PUBREL went out (re-send the PUBREL, never the PUBLISH).
    ``COMPLETE``: PUBCOMP came back but the subscription's committed offset has not passed ``offset``
    yet (after a restart the reader must skip it, not deliver it again). ``offset`` is the position in the
    LMQ read by the subscription ``topic_filter`` (for a shared subscription, the group's LMQ). A
    ``retained`` delivery is a retained message sent at SUBSCRIBE to ``topic_filter``: ``offset`` is then
    its commit-log offset, and it is never ``COMPLETE`` (no read position waits for it). ``queue_id`` is
    the LMQ's queue the offset is in (a cluster has one per broker; always 0 in the embedded store). On
    the wire: ``[packet_id, topic_filter, offset, phase]``, plus a fifth item ``1`` when ``retained``,
    plus, only when ``queue_id`` is not 0, a fifth item ``0`` or ``1`` (retained) and a sixth,
    ``queue_id`` (records of earlier versions are queue 0).
    """

    packet_id: int
    topic_filter: str
    offset: int
    phase: int = SENT
    retained: bool = False
    queue_id: int = 0

    def to_list(self) -> list[Any]:
        head: list[Any] = [self.packet_id, self.topic_filter, self.offset, self.phase]
        if self.queue_id:
            return [*head, int(self.retained), self.queue_id]
        return [*head, 1] if self.retained else head

    @classmethod
    def from_list(cls, raw: Any) -> OutboundQos2:
        """Raises ValueError unless ``raw`` is ``[id 0..65535, str, offset >= 0, phase 0..2]`` with an
        optional fifth item ``1`` (retained), or a fifth ``0``/``1`` and a sixth queue id > 0."""
        if not isinstance(raw, list) or len(raw) not in (4, 5, 6):
            raise ValueError(f"outbound QoS 2 entry: expected 4 to 6 items, got {raw!r}")
        packet_id, topic_filter, offset, phase = raw[:4]
        queue_id = 0
        if len(raw) == 6:
            queue_id = raw[5]
            if type(queue_id) is not int or queue_id <= 0 or raw[4] not in (0, 1):
                raise ValueError(f"outbound QoS 2 entry: bad queue {raw!r}")
            retained = raw[4] == 1
        else:
            retained = len(raw) == 5
        if (
            type(packet_id) is not int
            or not 0 <= packet_id <= 0xFFFF
            or not isinstance(topic_filter, str)
            or type(offset) is not int
            or offset < 0
            or phase not in (SENT, RELEASED, COMPLETE)
            or (retained and (raw[4] != 1 or phase == COMPLETE))
        ):
            raise ValueError(f"outbound QoS 2 entry: bad values {raw!r}")
        return cls(packet_id, topic_filter, offset, phase, retained, queue_id)


class WillRecord(NamedTuple):
    """A connected client's Will, kept in its session record in cluster mode so that another node can
    publish it if the node holding the connection dies. On the wire: ``[topic, payload (base64), qos,
    retain, delay_s, properties (base64 of the MQTT 5 Will Properties)]``."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    delay_s: int
    properties: bytes = b"\x00"

    @classmethod
    def of(cls, will: Will, delay_s: int) -> WillRecord:
        props = encode_properties(will.properties, PropertyContext.WILL)
        return cls(will.topic, will.payload, int(will.qos), will.retain, delay_s, props)

    def will(self) -> Will:
        """The Will as the CONNECT carried it (raises MqttCodecError for a corrupt record)."""
        props = decode_properties(Reader(self.properties), PropertyContext.WILL)
        return Will(self.topic, self.payload, QoS(self.qos), self.retain, props)

    def to_list(self) -> list[Any]:
        return [
            self.topic,
            base64.b64encode(self.payload).decode(),
            self.qos,
            self.retain,
            self.delay_s,
            base64.b64encode(self.properties).decode(),
        ]

    @classmethod
    def from_list(cls, raw: Any) -> WillRecord:
        """Raises ValueError unless ``raw`` is a well-formed will entry."""
        if not isinstance(raw, list) or len(raw) != 6:
            raise ValueError(f"will: expected 6 items, got {raw!r}")
        topic, payload, qos, retain, delay, props = raw
        if (
            not isinstance(topic, str)
            or qos not in (0, 1, 2)
            or type(retain) is not bool
            or type(delay) is not int
            or delay < 0
        ):
            raise ValueError(f"will: bad values {raw!r}")
        try:
            return cls(topic, base64.b64decode(payload), qos, retain, delay, base64.b64decode(props))
        except (TypeError, binascii.Error) as exc:
            raise ValueError(f"will: bad base64 in {raw!r}") from exc


@dataclass(slots=True)
class SessionSnapshot:
    client_id: str
    expiry_interval: int  # seconds; 0xFFFFFFFF never expires
    subscriptions: list[SubscriptionSpec] = field(default_factory=list)
    disconnected_at_ms: int | None = None  # None while connected
    deleted: bool = False
    awaiting_rel: list[InboundQos2] = field(default_factory=list)  # inbound QoS 2, PUBREL not yet seen
    outbound: list[OutboundQos2] = field(default_factory=list)
    node: str | None = None  # cluster mode: the node that wrote the record (None: single server)
    will: WillRecord | None = None  # cluster mode, while connected: the client's Will
    #: Cluster mode: orders the records of one client across the log's queues (one per broker): a higher
    #: version is newer. 0: written without one (a single queue's log order decides).
    version: int = 0

    def to_json(self) -> bytes:
        raw: dict[str, Any] = {
            "client_id": self.client_id,
            "expiry_interval": self.expiry_interval,
            "subscriptions": [asdict(s) for s in self.subscriptions],
            "disconnected_at_ms": self.disconnected_at_ms,
            "deleted": self.deleted,
        }
        if self.awaiting_rel:
            raw["awaiting_rel"] = self.awaiting_rel  # named tuples: JSON arrays
        if self.outbound:
            raw["outbound"] = [entry.to_list() for entry in self.outbound]
        if self.node is not None:
            raw["node"] = self.node
        if self.will is not None:
            raw["will"] = self.will.to_list()
        if self.version:
            raw["version"] = self.version
        return json.dumps(raw, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> SessionSnapshot:
        """Raises ValueError, TypeError or KeyError for a record that is not a valid snapshot."""
        raw = json.loads(data)
        if not isinstance(raw, dict):
            raise ValueError(f"session snapshot: expected an object, got {type(raw).__name__}")
        subs = [SubscriptionSpec(**s) for s in raw.get("subscriptions", ())]
        awaiting = raw.get("awaiting_rel", [])
        if not isinstance(awaiting, list):
            raise ValueError(f"awaiting_rel: expected a list, got {awaiting!r}")
        outbound = raw.get("outbound", [])
        if not isinstance(outbound, list):
            raise ValueError(f"outbound: expected a list, got {outbound!r}")
        return cls(
            client_id=str(raw["client_id"]),
            expiry_interval=int(raw.get("expiry_interval", 0)),
            subscriptions=subs,
            disconnected_at_ms=raw.get("disconnected_at_ms"),
            deleted=bool(raw.get("deleted", False)),
            awaiting_rel=[InboundQos2.from_list(entry) for entry in awaiting],
            outbound=[OutboundQos2.from_list(entry) for entry in outbound],
            node=str(raw["node"]) if raw.get("node") is not None else None,
            will=WillRecord.from_list(raw["will"]) if raw.get("will") is not None else None,
            version=int(raw.get("version", 0)),
        )

    @property
    def connected(self) -> bool:
        """True for the record of a session some connection holds (not ended, not disconnected)."""
        return not self.deleted and self.disconnected_at_ms is None


class _Writes:
    """Serializes one client's snapshot writes; ``wanted``/``done`` count requests for group commit."""

    __slots__ = ("done", "lock", "wanted")

    def __init__(self) -> None:
        self.lock = trio.Lock()
        self.wanted = 0
        self.done = 0


def _snapshot_key(message: StoredMessage) -> tuple[str, bool] | None:
    try:
        snapshot = SessionSnapshot.from_json(message.body)
    except (ValueError, TypeError, KeyError):
        return None  # not ours (someone else wrote to the topic)
    return snapshot.client_id, not snapshot.deleted


async def _highest_versions(
    backend: LightStore, queue: int
) -> tuple[int, dict[str, tuple[SessionSnapshot, int]]]:
    """One pass over ``queue`` of the cluster-mode log: the offset one past its last record and, per client,
    the record with the highest version (the later of equal ones) and its store time. Not the last record
    by log order: a record stored after the newest one may carry a lower version (a write of a node that
    lost the session, stored just after the takeover), and the follower (:meth:`SessionStateStore.newer`)
    ignores it; so must a node that loads the log."""
    offset = await backend.min_offset(SESSION_STATE_TOPIC, queue)
    found: dict[str, tuple[SessionSnapshot, int]] = {}
    while True:
        result = await backend.pull(SESSION_STATE_TOPIC, queue, offset, _BATCH)
        if result.status is PullStatus.OFFSET_ILLEGAL and result.next_offset != offset:
            offset = result.next_offset
            continue
        if not result.messages or result.next_offset <= offset:
            return offset, found
        for message in result.messages:
            try:
                snapshot = SessionSnapshot.from_json(message.body)
            except (ValueError, TypeError, KeyError):
                continue  # not ours (someone else wrote to the topic)
            known = found.get(snapshot.client_id)
            if known is None or known[0].version <= snapshot.version:
                found[snapshot.client_id] = (snapshot, message.store_timestamp_ms)
        offset = result.next_offset


class SessionStateStore:
    """The session-state log: appends snapshots, replays the newest per client, compacts itself.

    ``min_garbage``: superseded records the log must hold, and outnumber live ones, before
    :meth:`compaction_due` says so (see :mod:`mqproxy.facade.compaction`). ``node`` set (cluster mode):
    every record written carries it, so other nodes tell their own records from this node's, and the log
    is never compacted (``compacts`` False: a backend that cannot rewrite a queue; the brokers' retention
    bounds it instead). :attr:`end` is the offset one past the last record :meth:`load` read.
    """

    def __init__(
        self,
        backend: LightStore,
        min_garbage: int = 10_000,
        *,
        node: str | None = None,
        compacts: bool = True,
    ) -> None:
        self._backend = backend
        self._writes: dict[str, _Writes] = {}
        self._min_garbage = min_garbage
        self._records = 0  # records in the log (between compactions: counted on append)
        self._live: set[str] = set()
        self.node = node
        self.compacts = compacts
        #: Cluster mode: the newest live record of each client and when it was stored.
        self._newest: dict[str, tuple[SessionSnapshot, int]] = {}
        #: Cluster mode: the highest record version seen per client (tombstones included).
        self._versions: dict[str, int] = {}
        self.end = 0
        #: Cluster mode: per queue of the log, the offset one past the last record :meth:`load` read.
        self.ends: dict[int, int] = {}

    async def load(self) -> dict[str, SessionSnapshot]:
        """The live snapshot of every persistent session (creates the internal topic if missing);
        compacts the log first if it is mostly superseded records."""
        backend = self._backend
        await backend.create_topic(SESSION_STATE_TOPIC, 1)
        if self.node is not None:
            return await self._load_queues()
        found = await replay(backend, SESSION_STATE_TOPIC, _QUEUE, _snapshot_key)
        self.end = found.end
        latest = {}
        for message in found.live():
            snapshot = SessionSnapshot.from_json(message.body)
            latest[snapshot.client_id] = snapshot
        self._live = set(latest)
        await self._compact(found)
        return latest

    async def _load_queues(self) -> dict[str, SessionSnapshot]:
        """Cluster mode: the newest record per client over every queue of the log (highest version). A
        queue whose broker does not answer is skipped; the follower reads it from its start later."""
        newest: dict[str, tuple[SessionSnapshot, int]] = {}
        for queue in await queue_ids(self._backend, SESSION_STATE_TOPIC):
            try:
                self.ends[queue], found = await _highest_versions(self._backend, queue)
            except BackendError as exc:
                _log.warning("mqtt.state_queue_unreadable", queue_id=queue, detail=str(exc))
                self.ends[queue] = 0
                continue
            for client_id, (snapshot, stored_ms) in found.items():
                known = newest.get(client_id)
                if known is None or known[0].version < snapshot.version:
                    newest[client_id] = (snapshot, stored_ms)
        latest = {}
        for client_id, (snapshot, stored_ms) in newest.items():
            self._versions[client_id] = snapshot.version
            if not snapshot.deleted:
                latest[client_id] = snapshot
                self._newest[client_id] = (snapshot, stored_ms)
        self._live = set(latest)
        return latest

    def newer(self, snapshot: SessionSnapshot) -> bool:
        """Cluster mode: whether another node's ``snapshot`` is newer than every record of its client seen
        so far (a record without a version counts as newer: log order)."""
        return not snapshot.version or snapshot.version > self._versions.get(snapshot.client_id, 0)

    def compaction_due(self) -> bool:
        return self.compacts and worth_compacting(self._records, len(self._live), self._min_garbage)

    async def compact(self) -> None:
        """Drop superseded snapshots from the log (safe while sessions keep writing)."""
        await self._compact(None)

    async def _compact(self, found: Replay | None) -> None:
        backend = self._backend
        if self.compacts:
            await compact_if_worth(
                backend, SESSION_STATE_TOPIC, _QUEUE, _snapshot_key, self._min_garbage, found
            )
        low = await backend.min_offset(SESSION_STATE_TOPIC, _QUEUE)
        self._records = await backend.max_offset(SESSION_STATE_TOPIC, _QUEUE) - low

    async def save(self, snapshot: SessionSnapshot) -> None:
        if self.node is not None:
            snapshot.node = self.node
            client_id = snapshot.client_id
            snapshot.version = max(time.time_ns() // 1000, self._versions.get(client_id, 0) + 1)
        message = Message(topic=SESSION_STATE_TOPIC, body=snapshot.to_json(), queue_id=_QUEUE)
        result = await self._backend.send(message)
        if self.node is not None:
            # Acknowledged only once other nodes can read it (a broker indexes a stored message shortly
            # after it answers the send). Another broker's queue than 0 is fine: readers read every one.
            await self._backend.wait_for_message(
                SESSION_STATE_TOPIC, result.queue_id, result.queue_offset, _VISIBLE_S
            )
        self._note(snapshot, result.store_timestamp_ms)

    def noted(self, snapshot: SessionSnapshot, stored_ms: int) -> None:
        """Another node wrote ``snapshot`` (stored at ``stored_ms``): the newest record of its client."""
        self._note(snapshot, stored_ms)

    def _note(self, snapshot: SessionSnapshot, stored_ms: int) -> None:
        self._records += 1
        client_id = snapshot.client_id
        if snapshot.version:
            self._versions[client_id] = max(self._versions.get(client_id, 0), snapshot.version)
        if snapshot.deleted:
            self._live.discard(client_id)
            self._newest.pop(client_id, None)
        else:
            self._live.add(client_id)
            if self.node is not None:
                self._newest[client_id] = (snapshot, stored_ms)

    def stored_ms(self, client_id: str) -> int | None:
        """Cluster mode: when the newest record of ``client_id`` was stored (None: no live record)."""
        newest = self._newest.get(client_id)
        return newest[1] if newest is not None else None

    def offline_before(self, cutoff_ms: int) -> list[SessionSnapshot]:
        """Cluster mode: the newest records, stored before ``cutoff_ms``, of sessions no connection holds."""
        return [
            snapshot
            for snapshot, stored in self._newest.values()
            if stored < cutoff_ms and snapshot.disconnected_at_ms is not None
        ]

    async def rewrite(self, snapshot: SessionSnapshot) -> None:
        """Append ``snapshot`` again (as this node's) unless a newer record of its client came meanwhile,
        so that the brokers' retention never drops the record of a session that is still live."""
        client_id = snapshot.client_id

        def again() -> SessionSnapshot | None:
            newest = self._newest.get(client_id)
            return dataclasses.replace(snapshot) if newest is not None and newest[0] is snapshot else None

        await self.write(client_id, again)

    def is_live(self, client_id: str) -> bool:
        """True if the newest record written for ``client_id`` is a live snapshot (not a deletion)."""
        return client_id in self._live

    async def write(self, client_id: str, build: Callable[[], SessionSnapshot | None]) -> None:
        """Append the snapshot ``build()`` returns (nothing if None), built when this write's turn comes.

        Writes of one client are serialized, so the last record is always the newest state. A caller
        that finds its change already covered by a write that started after it asked returns without
        writing again (group commit): when this returns, every change made before the call is durable.
        """
        writes = self._writes.get(client_id)
        if writes is None:
            writes = self._writes[client_id] = _Writes()
        writes.wanted += 1
        ticket = writes.wanted
        try:
            async with writes.lock:
                if writes.done >= ticket:
                    return
                target = writes.wanted
                snapshot = build()
                if snapshot is not None:
                    await self.save(snapshot)
                writes.done = target
        finally:
            if not writes.lock.locked() and writes.lock.statistics().tasks_waiting == 0:
                if self._writes.get(client_id) is writes:
                    del self._writes[client_id]
