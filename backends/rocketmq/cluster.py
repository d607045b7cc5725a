"""
mqproxy.backends.rocketmq.cluster
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

What one node knows of the RocketMQ cluster behind it, and how it reaches it: name servers, brokers'
master addresses, topic routes with their virtual queue maps (:mod:`.vqueues`), the broker index, and the
LMQ broker (:mod:`.lmq`).

Contracts:

* :meth:`Cluster.view` answers from a cache refreshed every ``refresh_s``; a topic the cache lacks is
  looked up at once. A route that grew (a broker added, more queues) extends the topic's queue map in the
  name servers' KV configuration before the new queues are used, so every node numbers them alike.
* Shared numbering is written with read-merge-write-verify: a node uses a map only after reading back a
  stored map that starts with it (:func:`.vqueues.QueueMap.covers`).
* :meth:`Cluster.broker_call` sends to a broker's master; connection failures, timeouts and an unknown
  broker become :class:`~mqproxy.model.errors.ClusterUnavailable` with a remark naming the broker.
* Light message queues exist on every broker: a broker fills an LMQ with what it stored itself. An
  LMQ's queue id ``q`` is the broker at index ``q + 1`` of the :class:`~.vqueues.BrokerIndex`
  (:meth:`Cluster.lmq_queue_broker`, :meth:`Cluster.lmq_queue_count`), so every node numbers them alike
  and a broker added later only appends a queue id.
* :meth:`Cluster.lmq_broker` is the preferred broker for dispatching sends, named in the name servers' KV
  (namespace ``mqproxy``, key ``mqtt/broker``). A node reads the key on first use; if no name server
  holds it, the node writes the first master broker name in sorted order and then uses what it reads
  back, so all nodes agree. The KV has no compare-and-set: two nodes that saw different masters when the
  key was first written may pick differently until the next refresh, which re-reads the key.
  :meth:`Cluster.lmq_send_order` is that broker (when its master is live) followed by every other live
  master in name order: a dispatching send that fails on one goes to the next.
* :meth:`Cluster.broker_hold` is :meth:`Cluster.broker_call` for a broker long poll: no answer within the
  hold is None, not an error.
* :attr:`Cluster.health` is None while the name servers answer and a reason otherwise; it is refreshed by
  :meth:`Cluster.run` (every second while unhealthy).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import structlog
import trio

from mqproxy.backends.rocketmq import wire
from mqproxy.backends.rocketmq.topology import (
    ClusterInfo,
    TopicRoute,
    TopologyError,
    parse_cluster,
    parse_route,
)
from mqproxy.backends.rocketmq.vqueues import BrokerIndex, MapError, QueueMap, RealQueue, extend, merge
from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.model.errors import BrokerRefused, ClusterUnavailable
from mqproxy.remoting_client import RemotingClientError, RemotingPool, RemotingTimeout

__all__ = ["Cluster", "ClusterConfig", "TopicView"]

_log = structlog.get_logger("mqproxy.backends.rocketmq")
_BROKERS_KEY: Final = "brokers"
#: The name-server KV key naming the LMQ broker (namespace :data:`.wire.KV_NAMESPACE`).
LMQ_BROKER_KEY: Final = "mqtt/broker"
_UNHEALTHY_RETRY_S: Final = 1.0


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Where the cluster is and how to talk to it (``[backend]`` settings)."""

    namesrv: tuple[str, ...]
    access_key: str | None = None
    secret_key: str | None = None
    refresh_s: float = 30.0
    request_timeout_s: float = 3.0
    default_queue_count: int = 4
    auto_create_topics: bool = True


@dataclass(frozen=True, slots=True)
class TopicView:
    """A topic as clients of this node see it: its route and its virtual queues."""

    route: TopicRoute
    queues: QueueMap

    def real(self, virtual: int) -> RealQueue | None:
        return self.queues.real(virtual)

    def writable(self, virtual: int) -> bool:
        entry = self.queues.real(virtual)
        share = self.route.brokers.get(entry.broker) if entry else None
        return bool(entry and share and share.writable(entry.queue_id))

    def writable_queues(self) -> list[int]:
        return [v for v in range(len(self.queues)) if self.writable(v)]


@dataclass
class Cluster:
    config: ClusterConfig
    pool: RemotingPool
    info: ClusterInfo = field(default_factory=lambda: ClusterInfo({}, {}))
    index: BrokerIndex = field(default_factory=BrokerIndex)
    health: str | None = "the cluster has not been reached yet"
    _views: dict[str, TopicView] = field(default_factory=dict)
    _loading: dict[str, trio.Lock] = field(default_factory=dict)
    _next_namesrv: int = 0
    _lmq_broker: str | None = None
    _lmq_recheck_at: float = 0.0
    refreshed: trio.Event = field(default_factory=trio.Event)

    # --- name servers ---------------------------------------------------------------------------

    async def namesrv_call(
        self, request: RemotingCommand, *, timeout_s: float | None = None
    ) -> RemotingCommand:
        """``request`` to the first name server that answers (starting from the last one that did)."""
        errors: list[str] = []
        count = len(self.config.namesrv)
        for step in range(count):
            n = (self._next_namesrv + step) % count
            addr = self.config.namesrv[n]
            try:
                response = await self.pool.request(addr, request, timeout_s=timeout_s)
            except RemotingClientError as exc:
                errors.append(f"name server {addr} unreachable: {exc.reason}")
                continue
            self._next_namesrv = n
            return response
        reason = "; ".join(errors)
        self._unhealthy(reason)
        raise ClusterUnavailable(reason)

    async def _kv_get(self, key: str) -> list[str]:
        """The stored values of ``key`` on every name server that answers (they are not replicated)."""
        values: list[str] = []
        reached = 0
        for addr in self.config.namesrv:
            request = wire.command(wire.GET_KV_CONFIG, {"namespace": wire.KV_NAMESPACE, "key": key})
            try:
                response = await self.pool.request(addr, request)
            except RemotingClientError:
                continue
            reached += 1
            if response.code == ResponseCode.SUCCESS and response.ext_fields.get("value"):
                values.append(response.ext_fields["value"])
        if not reached:
            raise ClusterUnavailable("no name server answers " + ", ".join(self.config.namesrv))
        return values

    async def _kv_put(self, key: str, value: str) -> None:
        request = {"namespace": wire.KV_NAMESPACE, "key": key, "value": value}
        written = 0
        for addr in self.config.namesrv:
            try:
                response = await self.pool.request(addr, wire.command(wire.PUT_KV_CONFIG, request))
            except RemotingClientError:
                continue
            wire.check(response)
            written += 1
        if not written:
            raise ClusterUnavailable(f"no name server took the KV key {key}")

    # --- brokers --------------------------------------------------------------------------------

    def master(self, broker: str) -> str | None:
        return self.info.masters.get(broker)

    def masters(self) -> dict[str, str]:
        return {name: addr for name, addr in sorted(self.info.masters.items()) if addr}

    async def broker_call(
        self,
        broker: str,
        request: RemotingCommand,
        *,
        timeout_s: float | None = None,
        addr: str | None = None,
    ) -> RemotingCommand:
        """``request`` to ``broker``'s master (see the module contracts)."""
        target = addr or self.master(broker)
        if target is None:
            await self.refresh_cluster()
            target = self.master(broker)
        if target is None:
            raise ClusterUnavailable(f"broker {broker} has no live master")
        try:
            return await self.pool.request(target, request, timeout_s=timeout_s)
        except RemotingClientError as exc:
            raise ClusterUnavailable(f"broker {broker} ({target}): {exc.reason}") from None

    async def broker_hold(
        self, broker: str, request: RemotingCommand, hold_s: float
    ) -> RemotingCommand | None:
        """``request`` (a long poll the broker may hold) to ``broker``'s master; None when no answer came
        within ``hold_s`` (a late answer is dropped by the connection)."""
        target = self.master(broker)
        if target is None:
            raise ClusterUnavailable(f"broker {broker} has no live master")
        try:
            return await self.pool.request(target, request, timeout_s=hold_s)
        except RemotingTimeout:
            return None
        except RemotingClientError as exc:
            raise ClusterUnavailable(f"broker {broker} ({target}): {exc.reason}") from None

    async def broker_oneway(self, broker: str, request: RemotingCommand) -> None:
        target = self.master(broker)
        if target is None:
            raise ClusterUnavailable(f"broker {broker} has no live master")
        try:
            await self.pool.oneway(target, request)
        except RemotingClientError as exc:
            raise ClusterUnavailable(f"broker {broker} ({target}): {exc.reason}") from None

    def broker_named_by(self, packed_index: int) -> str:
        name = self.index.name(packed_index)
        if name is None:
            raise ClusterUnavailable(f"no broker has index {packed_index} (offset from another cluster?)")
        return name

    async def broker_index(self, broker: str) -> int:
        found = self.index.index(broker)
        if found is None:
            await self._extend_index([broker])
            found = self.index.index(broker)
        assert found is not None
        return found

    # --- light message queues ------------------------------------------------------------------

    @property
    def lmq_broker_name(self) -> str | None:
        """The preferred LMQ broker as last read (None: not used yet by this node)."""
        return self._lmq_broker

    async def lmq_broker(self) -> str:
        """The preferred broker of dispatching sends (see the module contracts); its master is live."""
        name = await self._preferred_lmq_broker()
        if self.master(name) is None:
            raise ClusterUnavailable(
                f"the LMQ broker {name} (name-server KV {wire.KV_NAMESPACE}/{LMQ_BROKER_KEY}) "
                "has no live master"
            )
        return name

    async def _preferred_lmq_broker(self) -> str:
        name = self._lmq_broker
        if name is None:
            name = await self._read_lmq_broker()
        if self.master(name) is None and trio.current_time() >= self._lmq_recheck_at:
            self._lmq_recheck_at = trio.current_time() + _UNHEALTHY_RETRY_S  # not once per request
            await self.refresh_cluster()
        return name

    async def lmq_send_order(self) -> list[str]:
        """The brokers a dispatching send tries, in order: the preferred one if its master is live, then
        the other live masters by name; raises :class:`ClusterUnavailable` when there is none."""
        preferred = await self._preferred_lmq_broker()
        live = list(self.masters())
        order = ([preferred] if preferred in live else []) + [b for b in live if b != preferred]
        if not order:
            raise ClusterUnavailable("no live master broker to store light-queue messages")
        return order

    async def lmq_queue_count(self) -> int:
        """How many queue ids an LMQ has: one per broker of the index (live or not)."""
        if not self.index.names:
            await self.refresh_cluster()
        if not self.index.names:
            raise ClusterUnavailable("no broker is known yet")
        return len(self.index.names)

    async def lmq_queue_broker(self, queue_id: int) -> str | None:
        """The broker an LMQ's ``queue_id`` reads (None: no such broker in the index)."""
        name = self.index.name(queue_id + 1)
        if name is None and queue_id >= 0:
            await self.refresh_cluster()  # a broker another node has indexed already
            name = self.index.name(queue_id + 1)
        return name

    def lmq_queue_of(self, broker: str) -> int | None:
        """The LMQ queue id of ``broker`` (None: not indexed)."""
        index = self.index.index(broker)
        return index - 1 if index is not None else None

    async def _read_lmq_broker(self) -> str:
        stored = await self._kv_get(LMQ_BROKER_KEY)
        if not stored:
            masters = sorted(self.masters())
            if not masters:
                await self.refresh_cluster()
                masters = sorted(self.masters())
            if not masters:
                raise ClusterUnavailable("no master broker to hold the light message queues")
            await self._kv_put(LMQ_BROKER_KEY, masters[0])
            stored = await self._kv_get(LMQ_BROKER_KEY)
            if not stored:
                raise ClusterUnavailable(f"no name server kept the KV key {LMQ_BROKER_KEY}")
        name = stored[0]  # the first name server that holds it, in configuration order
        if any(value != name for value in stored):
            _log.warning("cluster.kv_disagrees", key=LMQ_BROKER_KEY, values=",".join(stored), chosen=name)
            await self._kv_put(LMQ_BROKER_KEY, name)
        if name != self._lmq_broker:
            _log.info("cluster.lmq_broker", broker=name, previous=self._lmq_broker or "")
        self._lmq_broker = name
        return name

    # --- refresh ------------------------------------------------------------------------------

    def _unhealthy(self, reason: str) -> None:
        if self.health != reason:
            _log.warning("cluster.unavailable", reason=reason)
        self.health = reason

    async def refresh_cluster(self) -> None:
        response = wire.check(await self.namesrv_call(wire.command(RequestCode.GET_BROKER_CLUSTER_INFO)))
        try:
            info = parse_cluster(response.body)
        except TopologyError as exc:
            raise BrokerRefused(ResponseCode.SYSTEM_ERROR, f"unreadable cluster info: {exc}") from None
        if self.health is not None:
            _log.info(
                "cluster.available",
                brokers=",".join(sorted(info.masters)),
                namesrv=";".join(self.config.namesrv),
            )
        self.info, self.health = info, None
        if set(info.masters) - set(self.index.names):
            await self._extend_index(info.masters)
        if self._lmq_broker is not None:
            await self._read_lmq_broker()

    async def _extend_index(self, brokers: Mapping[str, object] | list[str]) -> None:
        stored = BrokerIndex()
        for text in await self._kv_get(_BROKERS_KEY):
            try:
                stored = stored.merged(BrokerIndex.decode(text))
            except MapError as exc:
                _log.warning("cluster.kv_unreadable", key=_BROKERS_KEY, reason=str(exc))
        wanted = stored.merged(self.index).with_brokers(list(brokers))
        for _ in range(3):
            if wanted != stored:
                await self._kv_put(_BROKERS_KEY, wanted.encode())
            back = BrokerIndex()
            for text in await self._kv_get(_BROKERS_KEY):
                back = back.merged(BrokerIndex.decode(text))
            if back.names[: len(wanted.names)] == wanted.names:
                self.index = back
                return
            stored, wanted = back, back.merged(wanted)
        raise ClusterUnavailable("the broker index kept changing under concurrent writers")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the cluster view fresh until cancelled."""
        task_status.started()
        while True:
            try:
                await self.refresh_cluster()
                for topic in list(self._views):
                    await self._load(topic)
                self.refreshed.set()
            except (ClusterUnavailable, BrokerRefused) as exc:
                self._unhealthy(str(exc))
            await trio.sleep(self.config.refresh_s if self.health is None else _UNHEALTHY_RETRY_S)

    # --- topics ---------------------------------------------------------------------------------

    def cached(self, topic: str) -> TopicView | None:
        return self._views.get(topic)

    def forget(self, topic: str) -> None:
        self._views.pop(topic, None)

    async def view(self, topic: str, *, fresh: bool = False) -> TopicView | None:
        """The topic's view (None: the name servers know no route for it)."""
        if not fresh and topic in self._views:
            return self._views[topic]
        return await self._load(topic)

    async def _load(self, topic: str) -> TopicView | None:
        lock = self._loading.setdefault(topic, trio.Lock())
        async with lock:
            request = wire.command(
                RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic, "acceptStandardJsonOnly": True}
            )
            response = await self.namesrv_call(request)
            if response.code == ResponseCode.TOPIC_NOT_EXIST:
                old = self._views.get(topic)
                if old is None:
                    return None
                # every broker dropped the topic: keep the numbering, nothing is reachable
                view = TopicView(TopicRoute(topic, {}, old.route.sys_flag), old.queues)
                self._views[topic] = view
                return view
            wire.check(response)
            try:
                route = parse_route(topic, response.body)
            except TopologyError as exc:
                raise BrokerRefused(
                    ResponseCode.SYSTEM_ERROR, f"unreadable route of {topic}: {exc}"
                ) from None
            old_view = self._views.get(topic)
            queues = old_view.queues if old_view else QueueMap()
            if old_view is None or len(extend(queues, route)) != len(queues):
                queues = await self._numbering(topic, route, queues)
            view = TopicView(route, queues)
            self._views[topic] = view
            return view

    async def _numbering(self, topic: str, route: TopicRoute, known: QueueMap) -> QueueMap:
        key = "queues/" + topic
        stored = known
        for text in await self._kv_get(key):
            try:
                stored = merge(stored, QueueMap.decode(text))
            except MapError as exc:
                _log.warning("cluster.kv_unreadable", key=key, reason=str(exc))
        for _ in range(3):
            wanted = extend(stored, route)
            if len(wanted) != len(stored):
                await self._kv_put(key, wanted.encode())
            back = QueueMap()
            for text in await self._kv_get(key):
                back = merge(back, QueueMap.decode(text))
            if back.covers(wanted):
                if len(back) != len(known):
                    _log.info(
                        "cluster.queues_numbered", topic=topic, queues=len(back), added=len(back) - len(known)
                    )
                return back
            stored = merge(back, wanted)
        raise ClusterUnavailable(f"the queue numbering of {topic} kept changing under concurrent writers")
