"""Durable snapshots of persistent MQTT sessions, kept in the store itself.

Each change (subscribe, unsubscribe, connect, disconnect, expiry) appends the client's whole snapshot as a
JSON record to the internal topic :data:`~mqproxy.mqtt.mapping.SESSION_STATE_TOPIC` (queue 0); a record
with ``"deleted": true`` ends the session. :meth:`SessionStateStore.load` replays the topic at start-up,
the last record per client wins. Keeping the state in the store (not in side files) means it has the same
flush policy and crash recovery as the messages and offsets it refers to, and works with any LightStore.
Consumer offsets per subscription live beside it as consumer offsets of group ``%MQTT%<client id>``.
The log is compacted to the newest record per live client (:mod:`mqproxy.facade.compaction`) at start-up
and by the gateway's housekeeping timer, so replay reads about one record per persistent session.

What a record holds (subscriptions, QoS 2 state, ...) is :mod:`mqproxy.mqtt.session_record`.
Writes of one client go through :meth:`SessionStateStore.write`, which serializes them (the last record
in the topic is the newest state) and lets concurrent callers share one append.

Cluster mode (``node`` set): the topic has one queue per broker and a record goes to queue 0 or, when
its broker fails, to another broker's queue; readers read every queue. Each record then carries a
``version`` (microseconds since the epoch, above every version this node has seen for the client), and
the highest version of a client is its newest state whichever queue holds it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import structlog
import trio

from mqproxy.facade.compaction import Replay, compact_if_worth, replay, worth_compacting
from mqproxy.model.errors import BackendError
from mqproxy.model.types import Message, PullStatus, StoredMessage
from mqproxy.mqtt.mapping import SESSION_STATE_TOPIC
from mqproxy.mqtt.session_record import SessionSnapshot
from mqproxy.mqtt.store import LightStore, queue_ids

_log = structlog.get_logger("mqproxy.mqtt")

_QUEUE = 0
_BATCH = 64
#: Longest wait for a record written in cluster mode to become readable by the other nodes.
_VISIBLE_S = 5.0


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
