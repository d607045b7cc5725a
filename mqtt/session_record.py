"""The session record: what the session-state log (:mod:`mqproxy.mqtt.state`) holds for one client.

A :class:`SessionSnapshot` is a client's whole session as one JSON record: its expiry, its subscriptions
(:class:`SubscriptionSpec`), and, once the session ends, ``"deleted": true``. QoS 2 state rides in the same
record, so that exactly-once survives a crash: the inbound packet ids awaiting PUBREL (``awaiting_rel``, see
:class:`InboundQos2`) and the outbound QoS 2 deliveries (``outbound``, see :class:`OutboundQos2`). Records
written before these fields existed load with both empty. In cluster mode a record also names the node
that wrote it, carries the connected client's Will (:class:`WillRecord`) and a ``version`` that orders
the records of one client across the log's queues.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from mqproxy.codecs.mqtt import QoS, Will
from mqproxy.codecs.mqtt.encoding import Reader
from mqproxy.codecs.mqtt.properties import PropertyContext, decode_properties, encode_properties

__all__ = [
    "COMPLETE",
    "RELEASED",
    "SENT",
    "InboundQos2",
    "OutboundQos2",
    "SessionSnapshot",
    "SubscriptionSpec",
    "WillRecord",
]


@dataclass(frozen=True, slots=True)
class SubscriptionSpec:
    """One subscription as the client asked for it (``topic_filter`` includes any ``$share/g/``).

    ``since_ms``: when the subscription was made (ms since the epoch; 0 in records written before it was
    kept, and ignored by ``==``). A queue of its LMQ that has no committed offset yet (its broker did not
    answer then) starts at the first message stored at or after it, on any node; 0: at the queue's end.
    """

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int | None = None
    since_ms: int = field(default=0, compare=False)

    def made_at(self, since_ms: int) -> SubscriptionSpec:
        """This spec with ``since_ms`` (``dataclasses.replace`` without its field introspection: a
        SUBSCRIBE makes one each)."""
        return SubscriptionSpec(
            self.topic_filter,
            self.qos,
            self.no_local,
            self.retain_as_published,
            self.retain_handling,
            self.subscription_id,
            since_ms,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the spec (``since_ms`` only when set, as records before it had none)."""
        raw = asdict(self)
        if not self.since_ms:
            del raw["since_ms"]
        return raw


#: Phases of an outbound QoS 2 delivery, as recorded in :attr:`OutboundQos2.phase`.
SENT, RELEASED, COMPLETE = 0, 1, 2


class InboundQos2(NamedTuple):
    """An inbound QoS 2 packet id awaiting PUBREL, and where its message was going to be stored.

    The id is recorded before the message is stored, so after a crash it is not known whether the store
    got the message: ``lmq`` (the LMQ of the PUBLISH's topic) held ``offset`` messages just before, and
    the re-sent PUBLISH is looked for from there (see ``Session.confirm_stored``). ``lmq`` empty: the
    message is known to be stored. On a cluster the LMQ has a queue per broker and the message may go to
    any live one: ``sizes`` then lists ``(queue id, size)`` of every queue whose broker answered, the
    message is looked for in each, and ``offset`` repeats queue 0's size (0 if its broker did not answer).
    On the wire: ``[packet_id, lmq, offset]`` for queue 0 alone (as records of earlier versions, which are
    queue 0), else ``[packet_id, lmq, offset, [[queue_id, size], ...]]``.
    """

    packet_id: int
    lmq: str = ""
    offset: int = 0
    sizes: tuple[tuple[int, int], ...] = ()

    @classmethod
    def mark(cls, packet_id: int, lmq: str, sizes: Sequence[tuple[int, int]]) -> InboundQos2:
        """The mark of ``packet_id``: ``lmq``'s queues held these sizes (``(queue id, size)``)."""
        found = tuple(sizes)
        offset = dict(found).get(0, 0)
        return cls(packet_id, lmq, offset, () if found == ((0, offset),) else found)

    @property
    def queues(self) -> tuple[tuple[int, int], ...]:
        """``(queue id, size)`` of every queue the message is looked for in."""
        return self.sizes or ((0, self.offset),)

    def to_list(self) -> list[Any]:
        head: list[Any] = [self.packet_id, self.lmq, self.offset]
        return [*head, [list(size) for size in self.sizes]] if self.sizes else head

    @classmethod
    def from_list(cls, raw: Any) -> InboundQos2:
        """Raises ValueError unless ``raw`` is ``[id 1..65535, str, offset >= 0]``, optionally with a fourth
        item, a non-empty list of ``[queue id >= 0, size >= 0]``."""
        if not isinstance(raw, list) or len(raw) not in (3, 4):
            raise ValueError(f"awaiting_rel entry: expected 3 or 4 items, got {raw!r}")
        packet_id, lmq, offset = raw[:3]
        if (
            type(packet_id) is not int
            or not 0 < packet_id <= 0xFFFF
            or not isinstance(lmq, str)
            or type(offset) is not int
            or offset < 0
        ):
            raise ValueError(f"awaiting_rel entry: bad values {raw!r}")
        listed = raw[3] if len(raw) == 4 else []
        if len(raw) == 4 and (
            not isinstance(listed, list)
            or not listed
            or any(
                not isinstance(size, list) or len(size) != 2 or any(type(n) is not int or n < 0 for n in size)
                for size in listed
            )
        ):
            raise ValueError(f"awaiting_rel entry: bad queue sizes {raw!r}")
        sizes = tuple((queue_id, size) for queue_id, size in listed)
        return cls(packet_id, lmq, offset, sizes)


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
            "subscriptions": [s.to_dict() for s in self.subscriptions],
            "disconnected_at_ms": self.disconnected_at_ms,
            "deleted": self.deleted,
        }
        if self.awaiting_rel:
            raw["awaiting_rel"] = [entry.to_list() for entry in self.awaiting_rel]
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
