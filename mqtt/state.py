"""Durable snapshots of persistent MQTT sessions, kept in the store itself.

Each change (subscribe, unsubscribe, connect, disconnect, expiry) appends the client's whole snapshot as a
JSON record to the internal topic :data:`~mqproxy.mqtt.mapping.SESSION_STATE_TOPIC` (queue 0); a record
with ``"deleted": true`` ends the session. :meth:`SessionStateStore.load` replays the topic at start-up,
the last record per client wins. Keeping the state in the store (not in side files) means it has the same
flush policy and crash recovery as the messages and offsets it refers to, and works with any Backend.
Consumer offsets per subscription live beside it as consumer offsets of group ``%MQTT%<client id>``.
(Not compacted yet: replay time grows with the number of session changes.)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from mqproxy.broker.backend import Backend
from mqproxy.broker.types import Message, PullStatus
from mqproxy.mqtt.mapping import SESSION_STATE_TOPIC

_QUEUE = 0


@dataclass(frozen=True, slots=True)
class SubscriptionSpec:
    """One subscription as the client asked for it (``topic_filter`` includes any ``$share/g/``)."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int | None = None


@dataclass(slots=True)
class SessionSnapshot:
    client_id: str
    expiry_interval: int  # seconds; 0xFFFFFFFF never expires
    subscriptions: list[SubscriptionSpec] = field(default_factory=list)
    disconnected_at_ms: int | None = None  # None while connected
    deleted: bool = False

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> SessionSnapshot:
        raw: dict[str, Any] = json.loads(data)
        subs = [SubscriptionSpec(**s) for s in raw.get("subscriptions", ())]
        return cls(
            client_id=str(raw["client_id"]),
            expiry_interval=int(raw.get("expiry_interval", 0)),
            subscriptions=subs,
            disconnected_at_ms=raw.get("disconnected_at_ms"),
            deleted=bool(raw.get("deleted", False)),
        )


class SessionStateStore:
    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    async def load(self) -> dict[str, SessionSnapshot]:
        """The live snapshot of every persistent session (creates the internal topic if missing)."""
        backend = self._backend
        await backend.create_topic(SESSION_STATE_TOPIC, 1)
        latest: dict[str, SessionSnapshot] = {}
        offset = await backend.min_offset(SESSION_STATE_TOPIC, _QUEUE)
        while True:
            result = await backend.pull(SESSION_STATE_TOPIC, _QUEUE, offset, 256)
            if result.status is PullStatus.OFFSET_ILLEGAL and result.next_offset != offset:
                offset = result.next_offset
                continue
            for message in result.messages:
                try:
                    snapshot = SessionSnapshot.from_json(message.body)
                except (ValueError, TypeError, KeyError):
                    continue  # not ours (someone else wrote to the topic)
                if snapshot.deleted:
                    latest.pop(snapshot.client_id, None)
                else:
                    latest[snapshot.client_id] = snapshot
            if not result.messages or result.next_offset <= offset:
                return latest
            offset = result.next_offset

    async def save(self, snapshot: SessionSnapshot) -> None:
        await self._backend.send(Message(topic=SESSION_STATE_TOPIC, body=snapshot.to_json(), queue_id=_QUEUE))
