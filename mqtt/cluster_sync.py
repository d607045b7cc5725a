"""Keeping one node's MQTT gateway in step with the other nodes in front of the same cluster.

With the ``rocketmq`` backend several mqproxy nodes serve MQTT over one RocketMQ cluster. Everything a
client relies on is in the cluster (see :mod:`mqproxy.mqtt.state` and :mod:`mqproxy.mqtt.retained`):
messages and their light queues on the brokers, read positions as broker consumer offsets of
``%MQTT%<client id>``, and two append-only logs every node writes and every node tails:

* the **session-state log** (:data:`~mqproxy.mqtt.mapping.SESSION_STATE_TOPIC`): in cluster mode every
  session, persistent or not, writes a snapshot when a connection takes it, when its subscriptions change,
  when it disconnects, and a tombstone when it ends. Each record names the node that wrote it;
* the **retained queue** (:data:`~mqproxy.mqtt.mapping.RETAINED_LMQ`): every retained PUBLISH.

:class:`ClusterSync` follows both logs with the backend's long poll and applies what other nodes wrote:

* a record saying another node's connection holds a session this node has a connection for is a
  **takeover**: the local connection is closed with Session taken over (0x8E) and the local copy of the
  session is dropped without writing anything (the other node owns it now). A local *offline* copy is
  dropped the same way, silently;
* every other node's live snapshot is remembered (:meth:`ClusterSync.adopt` hands it to a CONNECT that
  resumes the session here) and its wildcard filters go into :attr:`ClusterSync.filters`, so a PUBLISH
  on this node is dispatched into the light queues of subscriptions held on other nodes;
* retained records update this node's retained tree (its own records too, in log order);
* the shared subscriptions of other nodes' connected sessions say which nodes hold members of each shared
  group: one node reads a group at a time, the live one with the smallest id among them
  (:meth:`ClusterSync.reads_share`; :mod:`mqproxy.mqtt.shared`), so each message goes to one member
  cluster-wide. When the reader changes, the next one resumes from the group's committed offset (at least
  once: what the last reader handed out but had not committed yet comes again).

A CONNECT first reads both logs up to their current ends (:meth:`ClusterSync.catch_up`), so it sees
every record and retained message written before it, whichever node wrote it. A PUBLISH on one node may
miss a wildcard subscription made on another node during the follow lag (one long-poll round trip).

**Nodes that die.** Each node registers itself with the brokers as a member of the consumer group
:data:`NODES_GROUP` (client id = node id), on connections of its own, so a broker forgets a node as soon as
its process dies (its connections close) and at the latest when its registration lapses. Every
:data:`SWEEP_S` each node lists the live nodes; the live node with the smallest id takes over the sessions
whose newest record says a node that is no longer live holds them: it publishes their Will (the record
carries it; after its delay, unless the client came back first) and writes their disconnect record (a
tombstone for a session with expiry 0), so they expire as if their connection had closed.

**Nothing live ages out.** The brokers delete commit-log files after ``fileReservedTime`` (72 h by
default), and with them the oldest records of both logs. So every :data:`REFRESH_EVERY_S` each node
appends again the records of its connected sessions stored more than :data:`REFRESH_AGE_S` ago, and the
leading node (the live one with the smallest id) those of offline sessions and the retained messages (into
topic :data:`RETAINED_REFRESH_TOPIC`, dispatched only into the retained queue; a Message Expiry Interval
is shortened by the time already spent). A refresh never overwrites a newer record of the same session;
a retained message replaced on another node in the very moment it is refreshed may come back (the last
record in the retained queue wins).

Offline sessions another node left expire here too: each node that knows one writes its tombstone when
its expiry passes unless a newer record came first (duplicate tombstones are harmless).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Protocol

import structlog
import trio

from mqproxy.codecs.mqtt import MqttCodecError, ReasonCode, parse_topic_filter
from mqproxy.model.errors import BackendError
from mqproxy.model.types import ConsumerInfo, Message
from mqproxy.mqtt.config import NEVER_EXPIRES
from mqproxy.mqtt.mapping import RETAINED_LMQ, SESSION_STATE_TOPIC, encode_properties
from mqproxy.mqtt.retained import RetainedMessage
from mqproxy.mqtt.session_record import SessionSnapshot
from mqproxy.mqtt.store import queue_ids
from mqproxy.mqtt.subscriptions import SubscriptionIndex

if TYPE_CHECKING:
    from mqproxy.mqtt.gateway import Gateway

__all__ = [
    "NODES_GROUP",
    "REFRESH_AGE_S",
    "REFRESH_EVERY_S",
    "RETAINED_REFRESH_TOPIC",
    "SWEEP_S",
    "ClusterSync",
    "NodeDirectory",
]

#: The consumer group every node registers in, so that the brokers tell who is alive.
NODES_GROUP = "MQPROXY_MQTT_NODES"
#: Seconds between two looks for dead nodes (and two registrations of this node).
SWEEP_S = 2.0
#: Records and retained messages stored longer ago than this are appended again.
REFRESH_AGE_S = 24 * 3600.0
#: Seconds between two looks for records to refresh.
REFRESH_EVERY_S = 60.0
#: Where refreshed retained messages are stored (dispatched only into the retained queue).
RETAINED_REFRESH_TOPIC = "MQTT_RETAINED_REFRESH"


class NodeDirectory(Protocol):
    """Where nodes register and are listed (the brokers' consumer-group membership)."""

    async def register_consumer(self, info: ConsumerInfo) -> bool: ...

    async def consumer_ids(self, group: str) -> list[str]: ...


_log = structlog.get_logger("mqproxy.mqtt")
_BATCH = 64
#: Longest single long poll of a log (a wait ends earlier when a record arrives).
_POLL_S = 10.0
#: Back-off after a failed read of a log.
_RETRY_S = 1.0
#: The topic of each log ClusterSync follows.
_TOPICS = {"state": SESSION_STATE_TOPIC, "retained": RETAINED_LMQ}


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _shares(snapshot: SessionSnapshot) -> set[tuple[str, str]]:
    """The ``(group, filter)`` of each shared subscription of ``snapshot``."""
    found = set()
    for spec in snapshot.subscriptions:
        try:
            parsed = parse_topic_filter(spec.topic_filter)
        except MqttCodecError:
            continue
        if parsed.share_group is not None:
            found.add((parsed.share_group, parsed.filter))
    return found


def _wildcards(snapshot: SessionSnapshot) -> list[str]:
    """The wildcard filters ``snapshot``'s subscriptions read (``$share/g/f`` reads ``f``)."""
    found = []
    for spec in snapshot.subscriptions:
        try:
            inner = parse_topic_filter(spec.topic_filter).filter
        except MqttCodecError:
            continue
        if "+" in inner or "#" in inner:
            found.append(inner)
    return found


class ClusterSync:
    """Follows the session-state log and the retained queue for ``gateway`` (see the module docstring).

    ``node`` is this node's id, written into every record it appends. Offsets start where the gateway's
    load stopped reading (:meth:`start`).
    """

    def __init__(self, gateway: Gateway, node: str, directory: NodeDirectory | None = None) -> None:
        self.gateway = gateway
        self.node = node
        #: None: no look for dead nodes (their sessions wait for their clients to come back).
        self.directory = directory
        self.refresh_age_s = REFRESH_AGE_S
        #: Live snapshots other nodes wrote for sessions this node does not hold, by client id.
        self.known: dict[str, SessionSnapshot] = {}
        #: Wildcard filters of :attr:`known` sessions (reference-counted per subscription).
        self.filters = SubscriptionIndex()
        self.takeovers = 0
        #: Live node ids as the last look found them (None: not looked yet, every node counts as live).
        self.live: set[str] | None = None
        #: Nodes holding connected members of each shared group, by (group, filter), with member counts.
        self._share_nodes: dict[tuple[str, str], dict[str, int]] = {}
        #: Next offset to read per log ("state", "retained") and queue (a cluster has one per broker).
        self._offsets: dict[tuple[str, int], int] = {}
        self._locks = {"state": trio.Lock(), "retained": trio.Lock()}

    # --- start-up -------------------------------------------------------------------------------
    def start(
        self, snapshots: dict[str, SessionSnapshot], state_ends: dict[int, int], retained_ends: dict[int, int]
    ) -> None:
        """Take the snapshots the gateway's load replayed and follow both logs from where it stopped (per
        queue; a queue the load did not reach is read from its start)."""
        self._offsets.update({("state", q): end for q, end in state_ends.items()})
        self._offsets.update({("retained", q): end for q, end in retained_ends.items()})
        for snapshot in snapshots.values():
            self._learn(snapshot)

    # --- what CONNECT and PUBLISH ask -----------------------------------------------------------
    def match(self, topic: str) -> list[str]:
        """Wildcard filters of sessions held by other nodes that match ``topic``."""
        return self.filters.match(topic)

    def adopt(self, client_id: str) -> SessionSnapshot | None:
        """The newest snapshot another node wrote for ``client_id`` if the session can resume here (not
        ended; a session with expiry 0 ended with the connection that held it); forgets it either way."""
        snapshot = self._forget(client_id)
        if snapshot is None or snapshot.expiry_interval == 0:
            return None
        return snapshot

    def reads_share(self, group: str, topic_filter: str) -> bool:
        """Whether this node reads shared group ``$share/group/topic_filter`` now: it does unless a live
        node with a smaller id has members of it connected (this node has members, or it would not ask)."""
        nodes = self._share_nodes.get((group, topic_filter), {})
        live = self.live
        return all(node > self.node for node in nodes if live is None or node in live)

    async def catch_up(self) -> None:
        """Apply every session record and retained message appended before this call (whichever node
        wrote it), on every queue whose broker answers."""
        for log in ("state", "retained"):
            async with self._locks[log]:
                for queue in await queue_ids(self.gateway.backend, _TOPICS[log]):
                    try:
                        high = await self.gateway.backend.max_offset(_TOPICS[log], queue)
                        while self._offsets.get((log, queue), 0) < high and await self._read(log, queue):
                            pass
                    except BackendError as exc:
                        _log.warning("mqtt.cluster_sync_failed", log=log, queue_id=queue, detail=str(exc))

    # --- following ------------------------------------------------------------------------------
    async def serve(self) -> None:
        """Load the gateway (retrying every second while the cluster is unreachable), then follow the
        other nodes' writes and look for dead nodes until cancelled."""
        while True:
            try:
                await self.gateway.ready()
                break
            except BackendError as exc:
                _log.warning("mqtt.cluster_sync_failed", log="load", detail=str(exc))
                await trio.sleep(_RETRY_S)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.run)
            if self.directory is not None:
                nursery.start_soon(self._sweep_dead_nodes)

    async def join(self) -> None:
        """Register this node as alive (the gateway's load does it before any record is written)."""
        if self.directory is not None:
            await self.directory.register_consumer(ConsumerInfo(self.node, NODES_GROUP))

    async def _sweep_dead_nodes(self) -> None:
        next_refresh = trio.current_time() + REFRESH_EVERY_S
        while True:
            await trio.sleep(SWEEP_S)
            try:
                await self.join()
                await self.sweep()
                if trio.current_time() >= next_refresh:
                    next_refresh = trio.current_time() + REFRESH_EVERY_S
                    await self.refresh()
            except BackendError as exc:
                _log.warning("mqtt.cluster_sync_failed", log="nodes", detail=str(exc))

    async def _leading(self) -> bool:
        """True if this is the live node with the smallest id (or no directory tells otherwise)."""
        if self.directory is None:
            return True
        live = set(await self.directory.consumer_ids(NODES_GROUP))
        return min(live | {self.node}) == self.node

    async def refresh(self) -> int:
        """Append again what is live but stored more than :attr:`refresh_age_s` ago (see the module
        docstring); returns how many records it wrote."""
        gateway = self.gateway
        state = gateway.state_log
        now = _now_ms()
        cutoff = now - int(self.refresh_age_s * 1000)
        done = 0
        for session in list(gateway.sessions.values()):
            stored = state.stored_ms(session.client_id)
            if session.connection is not None and stored is not None and stored < cutoff:
                await gateway.persist(session)
                done += 1
        if not await self._leading():
            return done
        for snapshot in state.offline_before(cutoff):
            await state.rewrite(snapshot)
            done += 1
        for kept in gateway.retained.stored_before(cutoff):
            done += await self._rewrite_retained(kept, now)
        return done

    async def _rewrite_retained(self, kept: RetainedMessage, now: int) -> int:
        props = kept.properties
        expiry = props.message_expiry_interval
        if expiry is not None:
            left = expiry - (now - kept.store_timestamp_ms) // 1000
            if left <= 0:
                return 0  # expired: it goes with its record
            props = dataclasses.replace(props, message_expiry_interval=left)
        message = Message(
            topic=RETAINED_REFRESH_TOPIC,
            body=kept.payload,
            properties=encode_properties(kept.topic, kept.qos, "", True, props),
            born_timestamp_ms=now,
            dispatch=(RETAINED_LMQ,),
        )
        result = await self.gateway.backend.send(message)
        self.gateway.retained.set(
            kept.topic, kept.payload, kept.qos, props, result.store_timestamp_ms, result.commitlog_offset
        )
        return 1

    async def sweep(self) -> int:
        """If this is the live node with the smallest id, take over the sessions of nodes that are not
        live (see the module docstring); returns how many it took."""
        assert self.directory is not None
        live = set(await self.directory.consumer_ids(NODES_GROUP))
        self.live = live | {self.node}
        if not live or min(live | {self.node}) != self.node:
            return 0
        orphans = [s for s in self.known.values() if s.connected and s.node not in live]
        for snapshot in orphans:
            await self._orphaned(snapshot)
        return len(orphans)

    async def _orphaned(self, snapshot: SessionSnapshot) -> None:
        """``snapshot``'s node died holding its connection: disconnect it as that node would have."""
        gateway = self.gateway
        client_id = snapshot.client_id
        _log.info(
            "mqtt.session_orphaned", client_id=client_id, node=snapshot.node, will=snapshot.will is not None
        )
        now = _now_ms()
        if snapshot.expiry_interval == 0:
            record = SessionSnapshot(client_id, 0, deleted=True)
        else:
            record = dataclasses.replace(snapshot, disconnected_at_ms=now, will=None)
        await gateway.write_record(record)
        self._forget(client_id)
        if not record.deleted:
            self._learn(record)
        will = snapshot.will
        if will is None:
            return
        delay = will.delay_s if snapshot.expiry_interval > 0 else 0
        if snapshot.expiry_interval not in (0, NEVER_EXPIRES):
            delay = min(delay, snapshot.expiry_interval)

        async def publish() -> None:
            if delay and (self.known.get(client_id) is not record or client_id in gateway.sessions):
                return  # the client came back (here or elsewhere) before the delay passed
            try:
                message = will.will()
            except MqttCodecError:
                return
            await gateway.publisher.publish(
                message.topic,
                message.payload,
                int(message.qos),
                message.retain,
                message.properties,
                client_id,
            )

        if delay:
            gateway.call_later(delay, publish)
        else:
            await publish()

    async def run(self) -> None:
        """Follow both logs, every queue of each, until cancelled (read errors are logged and retried;
        a queue added by a new broker is followed from the next look, every :data:`_POLL_S`)."""
        async with trio.open_nursery() as nursery:
            followed: set[tuple[str, int]] = set()
            while True:
                for log in ("state", "retained"):
                    try:
                        queues = await queue_ids(self.gateway.backend, _TOPICS[log])
                    except BackendError as exc:
                        _log.warning("mqtt.cluster_sync_failed", log=log, detail=str(exc))
                        continue
                    for queue in queues:
                        if (log, queue) not in followed:
                            followed.add((log, queue))
                            nursery.start_soon(self._follow, log, queue)
                await trio.sleep(_POLL_S)

    async def _follow(self, log: str, queue_id: int) -> None:
        backend = self.gateway.backend
        topic = _TOPICS[log]
        while True:
            try:
                offset = self._offsets.get((log, queue_id), 0)
                await backend.wait_for_message(topic, queue_id, offset, _POLL_S)
                async with self._locks[log]:
                    while await self._read(log, queue_id):
                        pass
            except BackendError as exc:
                _log.warning("mqtt.cluster_sync_failed", log=log, queue_id=queue_id, detail=str(exc))
                await trio.sleep(_RETRY_S)

    async def _read(self, log: str, queue_id: int) -> bool:
        """Apply the next batch of ``log``'s records on ``queue_id``; False when none was there."""
        key = (log, queue_id)
        offset = self._offsets.get(key, 0)
        result = await self.gateway.backend.pull(_TOPICS[log], queue_id, offset, _BATCH)
        for message in result.messages:
            if log == "retained":
                self.gateway.retained.apply_newest(message)
                continue
            try:
                snapshot = SessionSnapshot.from_json(message.body)
            except (ValueError, TypeError, KeyError):
                continue  # not a snapshot (someone else wrote to the topic)
            if snapshot.node != self.node and self.gateway.state_log.newer(snapshot):
                await self._apply(snapshot, message.store_timestamp_ms)
        moved = result.next_offset > offset
        self._offsets[key] = max(offset, result.next_offset)
        return moved and bool(result.messages)

    async def _apply(self, snapshot: SessionSnapshot, stored_ms: int) -> None:
        """Another node wrote ``snapshot``: it is the newest state of its session."""
        gateway = self.gateway
        client_id = snapshot.client_id
        local = gateway.sessions.get(client_id)
        if local is not None:
            if local.connection is not None and not snapshot.connected:
                # A late write of a node that lost the session to a connection here: the log must end
                # with this node's state again.
                await gateway.persist(local)
                return
            if local.connection is not None:
                self.takeovers += 1
                _log.info("mqtt.session_moved", client_id=client_id, node=snapshot.node)
                local.connection.kick(
                    ReasonCode.SESSION_TAKEN_OVER,
                    "session_taken_over",
                    f"client id connected to node {snapshot.node}",
                )
            gateway.release(local)
        gateway.state_log.noted(snapshot, stored_ms)
        self._forget(client_id)
        if not snapshot.deleted:
            self._learn(snapshot)

    def _learn(self, snapshot: SessionSnapshot) -> None:
        self.known[snapshot.client_id] = snapshot
        for topic_filter in _wildcards(snapshot):
            self.filters.add(topic_filter)
        if snapshot.connected and snapshot.node is not None:
            for share in _shares(snapshot):
                nodes = self._share_nodes.setdefault(share, {})
                nodes[snapshot.node] = nodes.get(snapshot.node, 0) + 1
        if snapshot.disconnected_at_ms is not None and snapshot.expiry_interval != NEVER_EXPIRES:
            due = snapshot.disconnected_at_ms + snapshot.expiry_interval * 1000
            self.gateway.call_later(max(0.0, (due - _now_ms()) / 1000), lambda: self._expire(snapshot))

    def _forget(self, client_id: str) -> SessionSnapshot | None:
        snapshot = self.known.pop(client_id, None)
        if snapshot is not None:
            for topic_filter in _wildcards(snapshot):
                self.filters.remove(topic_filter)
            if snapshot.connected and snapshot.node is not None:
                for share in _shares(snapshot):
                    nodes = self._share_nodes[share]
                    nodes[snapshot.node] -= 1
                    if not nodes[snapshot.node]:
                        del nodes[snapshot.node]
                    if not nodes:
                        del self._share_nodes[share]
        return snapshot

    async def _expire(self, snapshot: SessionSnapshot) -> None:
        """An offline session of another node reached its expiry: end it unless a newer record came."""
        client_id = snapshot.client_id
        if self.known.get(client_id) is not snapshot:
            return
        self._forget(client_id)
        await self.gateway.write_record(SessionSnapshot(client_id, 0, deleted=True))
