"""
mqproxy.backends.rocketmq.broker
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

:class:`RocketMQBroker`: the :class:`~mqproxy.facade.api.BrokerFacade` of a stateless mqproxy node in front
of a stock Apache RocketMQ cluster. The roles live in :mod:`.produce`, :mod:`.consume`, :mod:`.pop`,
:mod:`.members` and :mod:`.lmq`; this module holds topic and group administration, the light-queue role,
and the node's lifecycle (:func:`open_rocketmq_broker`).

Contracts:

* The node keeps nothing a client relies on: messages, offsets, pop state, locks, transactions, topic
  and group configuration live on the brokers; the virtual queue numbering and broker index live in the
  name servers' KV configuration. Caches (routes, topic types, group configs) are refreshed from there
  (group configs: :mod:`.groups`).
* :meth:`RocketMQBroker.health` is None while the cluster answers, else a one-line reason. The node
  starts without the cluster; requests then fail with :class:`~mqproxy.model.errors.ClusterUnavailable`.
* Light message queues (``%LMQ%`` names) exist on every broker (:mod:`.lmq`): their config has one queue
  per indexed broker, creating one is a no-op.
* Topic creation goes to every master broker of the cluster with the same queue count (as
  ``mqadmin updateTopic -c``); a topic's virtual queue count is the sum over its brokers.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import AsyncIterator, Callable, Container, Sequence
from contextlib import asynccontextmanager
from typing import Final, Protocol

import orjson
import structlog
import trio

from mqproxy.backends.rocketmq import wire
from mqproxy.backends.rocketmq.cluster import Cluster, ClusterConfig, TopicView
from mqproxy.backends.rocketmq.consume import ConsumingRole
from mqproxy.backends.rocketmq.groups import GroupConfigs
from mqproxy.backends.rocketmq.lmq import LmqSending
from mqproxy.backends.rocketmq.members import Members, node_client_id
from mqproxy.backends.rocketmq.pop import PoppingRole
from mqproxy.backends.rocketmq.produce import ProducingRole
from mqproxy.backends.rocketmq.stats import ConsumeStat, consume_stats
from mqproxy.backends.rocketmq.topology import loads_java_json
from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.facade.api import LmqDispatch, QueueAssignment
from mqproxy.facade.types import (
    MESSAGE_TYPE_ATTRIBUTE,
    CheckBack,
    GroupConfig,
    QueueRef,
    RequestMode,
    TopicMessageType,
)
from mqproxy.model.errors import ClusterUnavailable, ServiceError
from mqproxy.model.topics import default_queue_count, is_lmq, lmq_config
from mqproxy.model.types import PERM_READ, PERM_WRITE, ConsumerInfo, TopicConfig
from mqproxy.remoting_client import ClientConfig, RemotingPool

__all__ = ["RocketMQBroker", "ServiceTunables", "open_rocketmq_broker"]

_log = structlog.get_logger("mqproxy.backends.rocketmq")
#: How long a created topic may take to show in the name servers' routes.
_CREATE_WAIT_S: Final = 10.0


class ServiceTunables(Protocol):
    """The ``[broker]`` settings this backend reads (the brokers own the rest)."""

    @property
    def delay_levels(self) -> str: ...

    @property
    def max_reconsume_times(self) -> int: ...


class RocketMQBroker(ProducingRole, LmqSending, ConsumingRole, PoppingRole):
    def __init__(
        self, cluster: Cluster, members: Members, advertised: tuple[str, int], tunables: ServiceTunables
    ) -> None:
        self.cluster = cluster
        self.members = members
        self.advertised = advertised
        self.delay_level_count = len(tunables.delay_levels.split())
        self._max_reconsume_times = tunables.max_reconsume_times
        self._check_backs: list[CheckBack] = []
        self._lmq_dispatch: LmqDispatch | None = None
        self._round_robin = itertools.count()
        self._types: dict[str, TopicMessageType | None] = {}
        self.groups = GroupConfigs(cluster)
        self._modes: dict[tuple[str, str], RequestMode] = {}

    # --- figures --------------------------------------------------------------------------------

    def health(self) -> str | None:
        return self.cluster.health

    @property
    def max_reconsume_times(self) -> int:
        return self._max_reconsume_times

    def unresolved_transactions(self) -> int:
        return 0  # half messages live on the brokers

    def pops_in_flight(self) -> int:
        return 0  # pop checkpoints live on the brokers

    # --- topics ---------------------------------------------------------------------------------

    @staticmethod
    def _config(view: TopicView) -> TopicConfig:
        perm = 0
        for share in view.route.brokers.values():
            perm |= share.perm
        count = len(view.queues)
        return TopicConfig(
            view.route.topic, count, count, perm or PERM_READ | PERM_WRITE, view.route.sys_flag
        )

    async def _lmq_topic(self, topic: str) -> TopicConfig:
        """An LMQ's config: one queue per indexed broker (see :mod:`.lmq`)."""
        count = await self.cluster.lmq_queue_count()
        return dataclasses.replace(lmq_config(topic), read_queues=count, write_queues=count)

    async def get_topic(self, topic: str) -> TopicConfig | None:
        if is_lmq(topic):
            return await self._lmq_topic(topic)
        view = await self.cluster.view(topic)
        if view is None:
            return None
        if topic not in self._types:
            await self._load_type(topic, view)
        return self._config(view)

    async def _load_type(self, topic: str, view: TopicView) -> None:
        brokers = [b for b in sorted(view.route.brokers) if self.cluster.master(b)]
        if not brokers:
            return
        request = wire.command(RequestCode.GET_TOPIC_CONFIG, {"topic": topic, "bname": brokers[0]})
        try:
            response = await self.cluster.broker_call(brokers[0], request)
        except ClusterUnavailable:
            return
        found: TopicMessageType | None = None
        if response.code == ResponseCode.SUCCESS and response.body:
            data = loads_java_json(response.body)
            config = data.get("topicConfig", data) if isinstance(data, dict) else {}
            attributes = config.get("attributes") or {}
            value = attributes.get(MESSAGE_TYPE_ATTRIBUTE) if isinstance(attributes, dict) else None
            if isinstance(value, str):
                try:
                    found = TopicMessageType(value.upper())
                except ValueError:
                    found = None
        self._types[topic] = found

    async def _create_on_brokers(
        self,
        topic: str,
        per_broker: int,
        perm: int,
        attributes: str = "",
        brokers: Sequence[str] | None = None,
    ) -> None:
        masters = self.cluster.masters()
        if not masters:
            await self.cluster.refresh_cluster()
            masters = self.cluster.masters()
        if not masters:
            raise ClusterUnavailable("no master broker to create topics on")
        for broker in brokers or sorted(masters):
            request = wire.command(
                RequestCode.UPDATE_AND_CREATE_TOPIC,
                {
                    "topic": topic,
                    "defaultTopic": wire.DEFAULT_TOPIC,
                    "readQueueNums": per_broker,
                    "writeQueueNums": per_broker,
                    "perm": perm,
                    "topicFilterType": "SINGLE_TAG",
                    "topicSysFlag": 0,
                    "order": False,
                    "attributes": attributes or None,
                },
            )
            wire.check(await self.cluster.broker_call(broker, request))

    async def _await_route(self, topic: str, wanted: int) -> TopicView:
        with trio.move_on_after(_CREATE_WAIT_S):
            while True:
                view = await self.cluster.view(topic, fresh=True)
                if view is not None and len(view.queues) >= wanted:
                    return view
                await trio.sleep(0.1)
        raise ClusterUnavailable(
            f"topic {topic} was created but its route did not appear in {_CREATE_WAIT_S:.0f} s"
        )

    async def create_topic(self, topic: str, queue_count: int | None = None) -> TopicConfig:
        if is_lmq(topic):
            return await self._lmq_topic(topic)  # an LMQ exists once a message is dispatched to it
        view = await self.cluster.view(topic)
        if view is not None:
            return self._config(view)
        count = queue_count or default_queue_count(topic, self.cluster.config.default_queue_count)
        await self._create_on_brokers(topic, count, PERM_READ | PERM_WRITE)
        _log.info(
            "cluster.topic_created",
            topic=topic,
            queues_per_broker=count,
            broker_count=len(self.cluster.masters()),
        )
        return self._config(await self._await_route(topic, count))

    async def update_topic(self, config: TopicConfig) -> TopicConfig:
        brokers = max(1, len(self.cluster.masters()))
        per_broker = max(1, math.ceil(max(config.read_queues, config.write_queues) / brokers))
        await self._create_on_brokers(config.name, per_broker, config.perm)
        return self._config(await self._await_route(config.name, per_broker))

    async def topic_names(self) -> list[str]:
        response = wire.check(
            await self.cluster.namesrv_call(wire.command(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
        )
        names = loads_java_json(response.body).get("topicList") or [] if response.body else []
        return sorted(str(n) for n in names)

    def topic_type(self, topic: str) -> TopicMessageType | None:
        return self._types.get(topic)

    async def set_topic_type(self, topic: str, message_type: TopicMessageType | None) -> None:
        view = await self.cluster.view(topic)
        if view is None:
            raise ServiceError(f"topic {topic} does not exist")
        attributes = f"+{MESSAGE_TYPE_ATTRIBUTE}={(message_type or TopicMessageType.NORMAL).value}"
        for broker, share in sorted(view.route.brokers.items()):
            await self._create_on_brokers(topic, share.queue_count, share.perm, attributes, [broker])
        self._types[topic] = message_type

    # --- groups ---------------------------------------------------------------------------------

    def group_config(self, group: str) -> GroupConfig | None:
        return self.groups.get(group)

    async def put_group_config(self, config: GroupConfig) -> None:
        body = wire.group_body(
            config.name, orderly=config.consume_orderly, retry_max_times=config.retry_max_times
        )
        for broker in self.cluster.masters():
            request = wire.command(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)
            wire.check(await self.cluster.broker_call(broker, request))
        self.groups.put(config)

    async def delete_group_config(self, group: str) -> bool:
        deleted = False
        for broker in self.cluster.masters():
            request = wire.command(
                RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": group, "cleanOffset": False}
            )
            response = await self.cluster.broker_call(broker, request)
            deleted = deleted or response.code == ResponseCode.SUCCESS
        self.groups.forget(group)
        return deleted

    async def request_mode(self, topic: str, group: str) -> RequestMode | None:
        return self._modes.get((topic, group))

    async def set_request_mode(self, topic: str, group: str, mode: RequestMode) -> None:
        body = orjson.dumps(
            {
                "topic": topic,
                "consumerGroup": group,
                "mode": mode.mode,
                "popShareQueueNum": mode.pop_share_queue_num,
            }
        )
        for broker in self.cluster.masters():
            request = wire.command(RequestCode.SET_MESSAGE_REQUEST_MODE, body=body)
            wire.check(await self.cluster.broker_call(broker, request))
        self._modes[(topic, group)] = mode

    # --- membership and locks (delegated) -------------------------------------------------------

    async def register_consumer(self, info: ConsumerInfo) -> bool:
        return await self.members.register_consumer(info)

    async def unregister_consumer(self, group: str, client_id: str) -> bool:
        return await self.members.unregister_consumer(group, client_id)

    async def consumer_ids(self, group: str) -> list[str]:
        return await self.members.consumer_ids(group)

    async def consumer_groups(self) -> list[str]:
        return self.members.consumer_groups()

    async def consumer_info(self, group: str, client_id: str) -> ConsumerInfo | None:
        return self.members.consumer_info(group, client_id)

    def announce_producer(self, group: str, present: bool = True) -> None:
        self.members.announce_producer(group, present)

    def watch_groups(self, listener: Callable[[str], None]) -> None:
        self.members.watch(listener)

    async def query_assignment(
        self, topic: str, group: str, client_id: str, *, strategy: str = "", broadcasting: bool = False
    ) -> QueueAssignment | None:
        return await self.members.query_assignment(
            topic, group, client_id, strategy=strategy, broadcasting=broadcasting
        )

    async def lock_batch(self, group: str, client_id: str, queues: Sequence[QueueRef]) -> set[QueueRef]:  # type: ignore[override]
        return await self.members.lock_batch(group, client_id, queues)

    async def unlock(self, group: str, client_id: str, queues: Sequence[QueueRef]) -> None:  # type: ignore[override]
        await self.members.unlock(group, client_id, queues)

    async def release_client(self, group: str, client_id: str) -> int:
        return await self.members.release_client(group, client_id)

    async def lock_holder(self, group: str, queue: QueueRef) -> str | None:
        return self.members.lock_holder(group, queue)

    # --- light queues ---------------------------------------------------------------------------

    async def rewrite_queue(self, topic: str, queue_id: int, keep: Sequence[int], below: int) -> int:
        raise ServiceError("queue rewrites need the embedded store (the MQTT gateway's state logs)")

    async def delete_idle_lmqs(self, idle_ms: int, in_use: Container[str], limit: int = 10_000) -> list[str]:
        return []  # the brokers own LMQ retention

    async def consume_stats(self) -> list[ConsumeStat]:
        """Every group's per-queue progress as the brokers report it (lag metrics; read-only)."""
        return await consume_stats(self.cluster)

    async def store_bytes(self) -> int:
        return 0  # this node stores no messages

    # --- server requests ------------------------------------------------------------------------

    async def on_server_request(self, request: RemotingCommand) -> RemotingCommand | None:
        """Requests brokers send to the node's shared connections."""
        if request.code == RequestCode.CHECK_TRANSACTION_STATE:
            await self.on_check_transaction(request)
            return None
        if request.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            return None
        return RemotingCommand.response_to(
            request, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "not supported by an mqproxy node"
        )


@asynccontextmanager
async def open_rocketmq_broker(
    config: ClusterConfig, *, advertised: tuple[str, int], service: ServiceTunables
) -> AsyncIterator[RocketMQBroker]:
    """A :class:`RocketMQBroker` whose connections and refresh tasks live until the block exits. Starts
    whether or not the cluster answers (see :meth:`RocketMQBroker.health`)."""
    if not config.namesrv:
        raise ValueError("a rocketmq backend needs at least one name server")
    client_config = ClientConfig(
        request_timeout_s=config.request_timeout_s, access_key=config.access_key, secret_key=config.secret_key
    )
    async with trio.open_nursery() as nursery:
        holder: list[RocketMQBroker] = []

        async def on_request(request: RemotingCommand) -> RemotingCommand | None:
            return await holder[0].on_server_request(request) if holder else None

        pool = RemotingPool(nursery, client_config, on_request)
        cluster = Cluster(config, pool)
        members = Members(cluster, nursery, client_config, node_client_id(advertised))
        broker = RocketMQBroker(cluster, members, advertised, service)
        holder.append(broker)
        try:
            with trio.move_on_after(config.request_timeout_s * 2):
                await cluster.refresh_cluster()
        except ClusterUnavailable:
            pass
        await nursery.start(cluster.run)
        await nursery.start(members.run)
        await nursery.start(broker.groups.run)
        try:
            yield broker
        finally:
            await members.aclose()
            await pool.aclose()
            nursery.cancel_scope.cancel()
