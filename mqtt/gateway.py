"""The process-wide MQTT gateway: sessions by client id, the wildcard index, retained messages, timers.

One :class:`Gateway` per server, owned by its :class:`~mqproxy.mqtt.service.MqttService`. It is loaded
lazily by the first MQTT connection (or the idle-LMQ sweep): persistent sessions and retained messages
are replayed from the store.

Publishing is :attr:`Gateway.publisher` (:mod:`mqproxy.mqtt.publishing`): a message is stored once and
dispatched into the LMQ of every subscription that matches (RIP-28), readers are woken by the store's
long-poll (RIP-33 notify → pull → push).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
import trio

from mqproxy.codecs.mqtt import MqttCodecError, parse_topic_filter
from mqproxy.model.errors import BackendError
from mqproxy.mqtt.access import MqttAccess
from mqproxy.mqtt.auth import ALLOW_ALL, Authorizer
from mqproxy.mqtt.cluster_sync import ClusterSync, NodeDirectory
from mqproxy.mqtt.config import NEVER_EXPIRES, MqttConfig
from mqproxy.mqtt.cursor import Cursor
from mqproxy.mqtt.mapping import RETAINED_LMQ, lmq_name
from mqproxy.mqtt.publishing import Publisher
from mqproxy.mqtt.push_hub import PushHubs
from mqproxy.mqtt.read_cache import ReadCache
from mqproxy.mqtt.retained import RetainedStore
from mqproxy.mqtt.session import Session
from mqproxy.mqtt.session_record import SessionSnapshot, SubscriptionSpec, WillRecord
from mqproxy.mqtt.shared import SharedGroup
from mqproxy.mqtt.state import SessionStateStore
from mqproxy.mqtt.store import LightStore, queue_ids
from mqproxy.mqtt.subscriptions import SubscriptionIndex
from mqproxy.mqtt.timers import Timers
from mqproxy.mqtt.tracing import MqttTracer

_log = structlog.get_logger("mqproxy.mqtt")
#: Seconds between checks whether a state log is worth compacting.
HOUSEKEEPING_INTERVAL_S = 60.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def reader_filter(topic_filter: str) -> str:
    """The filter a subscription reads (``$share/g/f`` → ``f``)."""
    return parse_topic_filter(topic_filter).filter


class Gateway:
    def __init__(
        self,
        backend: LightStore,
        config: MqttConfig,
        draining: trio.Event | None = None,
        auth: Authorizer = ALLOW_ALL,
        *,
        node: str | None = None,
        directory: NodeDirectory | None = None,
        access: MqttAccess | None = None,
    ) -> None:
        self.backend = backend
        self.config = config
        #: Message trace of deliveries (its sink is set by the server when ``[trace] enabled``).
        self.tracer = MqttTracer()
        #: Shared by every subscription reader: one store read serves all subscribers of a segment.
        self.read_cache = ReadCache(
            backend, max_segments=config.read_cache_segments, max_bytes=config.read_cache_bytes
        )
        #: Delivers new messages to caught-up subscribers without waking each reader.
        self.push_hubs = PushHubs(backend, self.read_cache, config.pull_batch, config.poll_interval_s)
        self.auth = auth
        #: CONNECT and topic decisions: the ACL account file (if any) and ``auth`` (the [mqtt] tables).
        self.access = access if access is not None else MqttAccess(auth)
        self.index = SubscriptionIndex()
        clustered = node is not None
        self.retained = RetainedStore(config.compaction_min_records, compacts=not clustered)
        self.sessions: dict[str, Session] = {}
        self.shared_groups: dict[tuple[str, str], SharedGroup] = {}
        self._state = SessionStateStore(
            backend, config.compaction_min_records, node=node, compacts=not clustered
        )
        #: Cluster mode (``node`` set): follows what the other nodes write (see :mod:`.cluster_sync`).
        self.cluster = ClusterSync(self, node, directory) if node is not None else None
        self._draining = draining if draining is not None else trio.Event()
        self._loaded = False
        self._load_lock = trio.Lock()
        self.timers = Timers(self._draining)
        #: Live connections registered with :meth:`drains`.
        self.live: set[Any] = set()
        self._drain_watched = False
        self.publisher = Publisher(self)

    # --- start-up -----------------------------------------------------------------------------
    async def ready(self) -> None:
        """Load persisted state once (the first caller does it; others wait). A failed load raises to
        every caller waiting for it and is tried again by the next caller (the store may come back)."""
        if self._loaded:
            return
        async with self._load_lock:
            if self._loaded:
                return
            try:
                await self._load()
            except BaseException:
                self.retained = RetainedStore(
                    self.config.compaction_min_records, compacts=self.cluster is None
                )
                self.sessions.clear()
                self.index = SubscriptionIndex()
                self.shared_groups.clear()
                raise
            self._loaded = True

    async def _load(self) -> None:
        await self.retained.load(self.backend)
        snapshots = await self._state.load()
        if self.cluster is not None:  # sessions are taken up by the CONNECT that resumes them
            await self.cluster.join()
            self.cluster.start(snapshots, self._state.ends, self.retained.ends)
            self.call_later(HOUSEKEEPING_INTERVAL_S, self._housekeeping)
            return
        now = now_ms()
        for snapshot in snapshots.values():
            disconnected = snapshot.disconnected_at_ms if snapshot.disconnected_at_ms is not None else now
            if (
                snapshot.expiry_interval != NEVER_EXPIRES
                and disconnected + snapshot.expiry_interval * 1000 <= now
            ):
                await self._state.save(SessionSnapshot(snapshot.client_id, 0, deleted=True))
                continue
            session = await self._restore(snapshot, now)
            self._schedule_expiry(session, disconnected)
        self.call_later(HOUSEKEEPING_INTERVAL_S, self._housekeeping)

    async def _restore(self, snapshot: SessionSnapshot, now: int) -> Session:
        """The session ``snapshot`` describes, with its subscriptions read from their committed offsets."""
        session = Session(snapshot.client_id, snapshot.expiry_interval, self.config.default_send_quota)
        for spec in snapshot.subscriptions:
            await self._add_subscription(session, spec, resume=True)
        await self._hold_groups(session, snapshot)
        session.load_qos2(snapshot, now)
        self.sessions[session.client_id] = session
        return session

    async def _housekeeping(self) -> None:
        """Compact the state logs that became mostly dead records; runs every
        :data:`HOUSEKEEPING_INTERVAL_S` in the timer task."""
        try:
            if self.retained.compaction_due():
                await self.retained.compact(self.backend)
            if self._state.compaction_due():
                await self._state.compact()
        finally:
            self.call_later(HOUSEKEEPING_INTERVAL_S, self._housekeeping)

    # --- sessions -----------------------------------------------------------------------------
    async def open_session(
        self,
        client_id: str,
        clean_start: bool,
        expiry_interval: int,
        send_quota: int,
        will: WillRecord | None = None,
    ) -> tuple[Session, bool]:
        """The session for a CONNECT and whether one was present (False after a clean start). In cluster
        mode the session may come from the snapshot another node wrote last."""
        existing = self.sessions.get(client_id)
        if existing is None and self.cluster is not None:
            snapshot = self.cluster.adopt(client_id)
            if snapshot is not None:
                existing = await self._restore(snapshot, now_ms())
        if existing is not None and clean_start:
            # In cluster mode the new session's record replaces the old one: a tombstone first would
            # read to other nodes as a late write of a node that lost the session.
            await self.discard(existing, tombstone=self.cluster is None)
            existing = None
        if existing is not None:
            existing.expiry_interval = expiry_interval
            existing.send_quota = send_quota
            existing.epoch += 1
            existing.will = will if self.cluster is not None else None
            await self.persist(existing)
            return existing, True
        session = Session(client_id, expiry_interval, send_quota)
        session.epoch = 1
        session.will = will if self.cluster is not None else None
        self.sessions[client_id] = session
        await self.persist(session)
        return session, False

    async def discard(self, session: Session, *, tombstone: bool = True) -> None:
        """End a session: drop its subscriptions from the index and (``tombstone``) its durable snapshot."""
        if session.ended:
            return
        session.ended = True
        client_id = session.client_id
        if self.sessions.get(client_id) is session:
            del self.sessions[client_id]
        await session.give_back_shared(self.backend)
        for topic_filter in list(session.subscriptions):
            self._forget_subscription(session, topic_filter)
        session.wake_all()
        state = self._state

        def deletion() -> SessionSnapshot | None:  # a session never written needs no tombstone
            return SessionSnapshot(client_id, 0, deleted=True) if state.is_live(client_id) else None

        if tombstone:
            await state.write(client_id, deletion)

    async def detached(self, session: Session) -> None:
        """A connection left ``session``: end it (expiry 0) or persist it and start its expiry timer.
        Nothing for a session already ended (e.g. taken over by another node)."""
        if session.ended:
            return
        await session.commit_offsets(self.backend)
        if not session.persistent:
            await self.discard(session)
            return
        disconnected = now_ms()
        await self._state.write(session.client_id, functools.partial(_record, session, disconnected))
        self._schedule_expiry(session, disconnected)

    def _schedule_expiry(self, session: Session, disconnected_ms: int) -> None:
        if session.expiry_interval == NEVER_EXPIRES:
            return
        epoch = session.epoch
        delay = max(0.0, (disconnected_ms + session.expiry_interval * 1000 - now_ms()) / 1000)

        async def expire() -> None:
            if session.connection is None and session.epoch == epoch and not session.ended:
                await self.discard(session)

        self.call_later(delay, expire)

    def lmqs_in_use(self) -> set[str]:
        """Every LMQ some session (online or offline) or shared group reads, the retained queue, and every
        LMQ the read cache holds segments of: the store's idle-queue sweep must not delete these."""
        names = {RETAINED_LMQ}
        for session in self.sessions.values():
            names.update(cursor.lmq for cursor in session.cursors.values())  # (every lane: same LMQ)
        names.update(group.cursor.lmq for group in self.shared_groups.values())
        names |= self.read_cache.cached_topics()
        return names

    async def persist(self, session: Session) -> None:
        """Make ``session``'s current state durable (persistent sessions, and every session in cluster
        mode, where other nodes read it; concurrent calls share writes)."""
        if session.persistent or self.cluster is not None:
            await self._state.write(session.client_id, functools.partial(_record, session, None))

    # --- cluster mode ---------------------------------------------------------------------------
    async def catch_up(self) -> None:
        """Cluster mode: apply what other nodes wrote before now (a CONNECT calls it first)."""
        if self.cluster is not None:
            await self.cluster.catch_up()

    def release(self, session: Session) -> None:
        """Drop ``session`` from this node without writing anything: another node holds it now."""
        session.ended = True
        client_id = session.client_id
        if self.sessions.get(client_id) is session:
            del self.sessions[client_id]
        for topic_filter in list(session.subscriptions):
            self._forget_subscription(session, topic_filter)
        session.wake_all()

    @property
    def state_log(self) -> SessionStateStore:
        """The session-state log (cluster mode: :class:`ClusterSync` notes and refreshes its records)."""
        return self._state

    async def write_record(self, snapshot: SessionSnapshot) -> None:
        """Append a record for a session another node held (it died, or its session expired)."""
        if snapshot.client_id not in self.sessions:
            await self._state.write(snapshot.client_id, lambda: snapshot)

    # --- subscriptions ------------------------------------------------------------------------
    async def subscribe(self, session: Session, spec: SubscriptionSpec) -> bool:
        """Add or replace a subscription; True if it is new. Persists the session snapshot. The spec
        kept has ``since_ms``: now for a new subscription, the replaced one's otherwise."""
        old = session.subscriptions.get(spec.topic_filter)
        if old is None:
            await self._add_subscription(session, spec.made_at(now_ms()), resume=False)
        else:
            session.subscriptions[spec.topic_filter] = spec.made_at(old.since_ms)
        await self.persist(session)
        return old is None

    async def _add_subscription(self, session: Session, spec: SubscriptionSpec, *, resume: bool) -> None:
        parsed = parse_topic_filter(spec.topic_filter)
        inner = parsed.filter
        if "+" in inner or "#" in inner:
            self.index.add(inner)
        if parsed.share_group is not None:
            group = await self._shared_group(parsed.share_group, inner, spec.since_ms, resume=resume)
            session.held.pop(spec.topic_filter, None)
            group.members += 1
            session.subscriptions[spec.topic_filter] = spec
            session.shared[spec.topic_filter] = group
            return
        lmq = lmq_name(inner)
        queues = await queue_ids(self.backend, lmq)
        lanes = tuple(Cursor(lmq, -1, session.group, queue) for queue in queues)
        for cursor in lanes:
            cursor.durable = session.persistent
            cursor.resume = resume
            # A new subscription starts at the end; one resumed without a committed offset on a queue
            # (its broker was down when it was made) at what that broker stored since it was made.
            cursor.since_ms = spec.since_ms if resume else 0
            try:
                await self.position(cursor)
            except BackendError:
                if len(lanes) == 1:
                    raise
                # that broker is down: its reader positions the cursor when it answers again, at the
                # first message stored there since the subscription was made (nothing missed, on any
                # node: ``since_ms`` is in the session record)
                cursor.since_ms = spec.since_ms
        session.subscriptions[spec.topic_filter] = spec
        session.cursors[spec.topic_filter] = lanes[0]
        session.lanes[spec.topic_filter] = lanes

    async def position(self, cursor: Cursor) -> None:
        """Position a cursor that is not: at its committed offset (``resume``) if one is stored, else at
        the first message since ``since_ms`` if set, else at the queue's end (see :meth:`Cursor.place`)."""
        await cursor.place(self.backend)

    async def _hold_groups(self, session: Session, snapshot: SessionSnapshot) -> None:
        """Open the groups of shared QoS 2 deliveries whose filter the session no longer subscribes."""
        for record in snapshot.outbound:
            if record.retained or record.topic_filter in session.shared:
                continue
            try:
                parsed = parse_topic_filter(record.topic_filter)
            except MqttCodecError:
                continue
            if parsed.share_group is not None:
                group = await self._shared_group(parsed.share_group, parsed.filter)
                session.held[record.topic_filter] = group

    async def _shared_group(
        self, name: str, inner: str, since_ms: int = 0, *, resume: bool = True
    ) -> SharedGroup:
        """The group ``name`` of filter ``inner``, opened by a member subscribed since ``since_ms``
        (``resume``: a restored subscription) if it is not open here yet (see :meth:`SharedGroup.open`)."""
        group = self.shared_groups.get((name, inner))
        if group is None:
            opened = await SharedGroup.open(self.backend, name, inner, since_ms, restored=resume)
            group = self.shared_groups[(name, inner)] = opened
            if self.cluster is not None:
                group.may_read = functools.partial(self.cluster.reads_share, name, inner)
        return group

    async def unsubscribe(self, session: Session, topic_filter: str) -> bool:
        if topic_filter not in session.subscriptions:
            return False
        self._forget_subscription(session, topic_filter)
        await self.persist(session)
        return True

    def _forget_subscription(self, session: Session, topic_filter: str) -> None:
        session.subscriptions.pop(topic_filter, None)
        session.cursors.pop(topic_filter, None)
        session.lanes.pop(topic_filter, None)
        group = session.shared.pop(topic_filter, None)
        if group is not None:
            if any(e.shared is not None and e.shared[0] is group for e in session.inflight.values()):
                session.held[topic_filter] = group  # its QoS 2 deliveries are still completed
            group.members -= 1
            # A group with deliveries still in flight stays, so a new member resumes it, not its offset.
            if group.members <= 0 and not group.pending:
                self.shared_groups.pop((group.name, group.topic_filter), None)
        inner = reader_filter(topic_filter)
        if "+" in inner or "#" in inner:
            self.index.remove(inner)

    # --- figures ------------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        """Point-in-time figures for ``/metrics`` (cheap enough to compute per scrape)."""
        online = sum(1 for s in self.sessions.values() if s.connection is not None)
        cache = self.read_cache
        return {
            "sessions_online": online,
            "sessions_offline": len(self.sessions) - online,
            "subscriptions": sum(len(s.subscriptions) for s in self.sessions.values()),
            "wildcard_filters": len(self.index),
            "retained": len(self.retained),
            "read_cache_hit": cache.hits,
            "read_cache_coalesced": cache.coalesced,
            "read_cache_miss": cache.misses,
            "read_cache_bypass": cache.bypasses,
            "read_cache_bytes": cache.bytes,
            "pushed": self.push_hubs.pushed,
            "push_hubs": len(self.push_hubs),
        }

    # --- timers -------------------------------------------------------------------------------
    def call_later(self, delay_s: float, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``callback`` after ``delay_s`` in the gateway's timer task (see :class:`Timers`)."""
        self.timers.call_later(delay_s, callback)

    async def run_timers(self) -> None:
        """The timer task, run by the gateway's owner until the server drains (or it is cancelled)."""
        await self.timers.run()

    # --- live connections: one drain watcher for all of them -------------------------------------
    def drains(self, connection: Any) -> bool:
        """Register a live connection whose ``ctx.draining`` is the gateway's: :meth:`run_drain` calls its
        ``drain()`` when the server drains (at once if it already does). False, with nothing registered,
        for a connection on another draining event or while no :meth:`run_drain` runs: it watches its
        own. The connection removes itself from :attr:`live` when it ends."""
        if connection.ctx.draining is not self._draining or not self._drain_watched:
            return False
        self.live.add(connection)
        if self._draining.is_set():
            connection.drain()
        return True

    async def run_drain(self) -> None:
        """Wait for the server to drain, then tell every live connection (run by the gateway's owner)."""
        self._drain_watched = True
        try:
            await self._draining.wait()
        finally:
            if not self._draining.is_set():
                self._drain_watched = False
        for connection in list(self.live):
            connection.drain()


def _record(session: Session, disconnected_ms: int | None) -> SessionSnapshot | None:
    """``session``'s record, built when its write's turn comes: none once the session ended meanwhile (its
    tombstone is written apart; in cluster mode another node may hold it now, and a record written here
    would carry a higher version than that node's and take the session back from its connection)."""
    return None if session.ended else session.snapshot(disconnected_ms)


def config_from_settings(mqtt: Any) -> MqttConfig:
    """``MqttConfig`` from the ``[mqtt]`` settings section (``max_keep_alive = 0`` means no limit)."""
    fields = {f.name: getattr(mqtt, f.name) for f in dataclasses.fields(MqttConfig)}
    if fields.get("max_keep_alive") == 0:
        fields["max_keep_alive"] = None
    return MqttConfig(**fields)
