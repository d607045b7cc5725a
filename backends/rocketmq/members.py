"""
mqproxy.backends.rocketmq.members
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

Consumer-group membership, queue locks and producer registration against a RocketMQ cluster.

Contracts:

* Each consumer client of this node gets its own connections to every master broker (a
  :class:`~mqproxy.remoting_client.RemotingPool` of its own): a broker keys group members by connection,
  so this is what makes ``GET_CONSUMER_LIST_BY_GROUP`` through any node list the clients of every node,
  and what makes a broker drop a client whose node died (its connections close).
* Membership is forwarded on every heartbeat the client sends (clients heartbeat every 30 s; brokers
  expire members after 120 s without one); leaving closes the client's connections.
* Locks are the brokers' (keyed by client id, so any node may renew them); this node remembers what its
  clients hold only to release it when their connection ends.
* The node itself registers the producer groups that sent transactional messages through it, on its
  shared connections, so the brokers' check-backs for those groups come to a node that has such a
  producer (the check is then handed to the producer by the protocol that registered a check-back).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

import orjson
import structlog
import trio

from mqproxy.backends.rocketmq import wire
from mqproxy.backends.rocketmq.cluster import Cluster
from mqproxy.backends.rocketmq.topology import loads_java_json
from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.facade.api import QueueAssignment
from mqproxy.facade.types import QueueRef, RequestMode
from mqproxy.model.errors import BackendError, ClusterUnavailable
from mqproxy.model.types import ConsumerInfo
from mqproxy.remoting_client import ClientConfig, RemotingClientError, RemotingPool

__all__ = ["Members"]

_log = structlog.get_logger("mqproxy.backends.rocketmq")
#: How often the node re-registers its producer groups (the broker expires them after 120 s).
PRODUCER_HEARTBEAT_S: Final = 20.0
#: Within this long, repeated change notices of one group are one notice.
NOTIFY_DEBOUNCE_S: Final = 0.2


@dataclass
class _Client:
    pool: RemotingPool
    groups: dict[str, ConsumerInfo] = field(default_factory=dict)


class Members:
    def __init__(
        self, cluster: Cluster, nursery: trio.Nursery, client_config: ClientConfig, node_id: str
    ) -> None:
        self.cluster = cluster
        self._nursery = nursery
        self._config = client_config
        self.node_id = node_id
        self._clients: dict[str, _Client] = {}
        self._producer_groups: set[str] = set()
        self._locks: dict[tuple[str, str], set[QueueRef]] = defaultdict(set)
        self._listeners: list[Callable[[str], None]] = []
        self._notified: dict[str, float] = {}

    # --- producers ------------------------------------------------------------------------------

    async def add_producer_group(self, group: str) -> None:
        if group not in self._producer_groups:
            self._producer_groups.add(group)
            await self._producer_heartbeat()

    def announce_producer(self, group: str, present: bool = True) -> None:
        """Register ``group`` with the brokers soon (in the background) unless it already is; with
        ``present`` False, withdraw it (this node's last producer of the group left), so the brokers
        send its check-backs to nodes that still have one."""
        if present and group not in self._producer_groups:
            self._producer_groups.add(group)
            self._nursery.start_soon(self._producer_heartbeat)
        elif not present and group in self._producer_groups:
            self._producer_groups.discard(group)
            self._nursery.start_soon(self._withdraw_producer, group)

    async def _withdraw_producer(self, group: str) -> None:
        request = wire.command(
            RequestCode.UNREGISTER_CLIENT, {"clientID": self.node_id, "producerGroup": group}
        )
        for broker in self.cluster.masters():
            try:
                await self.cluster.broker_call(broker, request)
            except BackendError as exc:
                _log.warning("cluster.heartbeat_failed", broker=broker, reason=str(exc))

    async def _producer_heartbeat(self) -> None:
        body = wire.heartbeat_body(self.node_id, (), sorted(self._producer_groups))
        for broker in self.cluster.masters():
            try:
                await self.cluster.broker_call(broker, wire.command(RequestCode.HEART_BEAT, body=body))
            except BackendError as exc:
                _log.warning("cluster.heartbeat_failed", broker=broker, reason=str(exc))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(PRODUCER_HEARTBEAT_S)
            if self._producer_groups and self.cluster.health is None:
                await self._producer_heartbeat()

    # --- consumers ------------------------------------------------------------------------------

    def _client(self, client_id: str) -> _Client:
        client = self._clients.get(client_id)
        if client is None:
            pool = RemotingPool(self._nursery, self._config, on_request=self._on_client_request(client_id))
            client = self._clients[client_id] = _Client(pool)
        return client

    def _on_client_request(self, client_id: str):  # type: ignore[no-untyped-def]
        async def handle(request: RemotingCommand) -> RemotingCommand | None:
            if request.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
                self._group_changed(request.ext_fields.get("consumerGroup", ""))
                return None
            return RemotingCommand.response_to(
                request, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "not supported by an mqproxy node"
            )

        return handle

    def watch(self, listener: Callable[[str], None]) -> None:
        self._listeners.append(listener)

    def _group_changed(self, group: str) -> None:
        """A broker says ``group`` changed; tell the listeners once per group per
        :data:`NOTIFY_DEBOUNCE_S` (each client link of the group hears the same news)."""
        now = trio.current_time()
        if not group or now - self._notified.get(group, -1e9) < NOTIFY_DEBOUNCE_S:
            return
        self._notified[group] = now
        _log.debug("cluster.group_changed", group=group)
        for listener in self._listeners:
            listener(group)

    async def _heartbeat(self, client_id: str, client: _Client) -> None:
        body = wire.heartbeat_body(client_id, client.groups.values(), ())
        failures = []
        for broker, addr in self.cluster.masters().items():
            try:
                response = await client.pool.request(addr, wire.command(RequestCode.HEART_BEAT, body=body))
                wire.check(response)
            except RemotingClientError as exc:
                failures.append(f"{broker}: {exc.reason}")
        if failures and len(failures) == len(self.cluster.masters()):
            raise ClusterUnavailable("no broker took the heartbeat: " + "; ".join(failures))

    async def register_consumer(self, info: ConsumerInfo) -> bool:
        client = self._client(info.client_id)
        changed = client.groups.get(info.group) != info
        client.groups[info.group] = info
        await self._heartbeat(info.client_id, client)
        return changed

    async def unregister_consumer(self, group: str, client_id: str) -> bool:
        client = self._clients.get(client_id)
        if client is None or group not in client.groups:
            return False
        del client.groups[group]
        request = wire.command(RequestCode.UNREGISTER_CLIENT, {"clientID": client_id, "consumerGroup": group})
        for addr in self.cluster.masters().values():
            try:
                await client.pool.request(addr, request)
            except RemotingClientError:
                pass
        if not client.groups:
            del self._clients[client_id]
            await client.pool.aclose()
        return True

    async def consumer_ids(self, group: str) -> list[str]:
        request = wire.command(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
        for broker in self.cluster.masters():
            try:
                response = await self.cluster.broker_call(broker, request)
            except ClusterUnavailable:
                continue
            if response.code == ResponseCode.SUCCESS and response.body:
                ids = orjson.loads(response.body).get("consumerIdList") or []
                return sorted(str(i) for i in ids)
            return []
        raise ClusterUnavailable(f"no broker answers for the members of {group}")

    def consumer_groups(self) -> list[str]:
        return sorted({g for client in self._clients.values() for g in client.groups})

    def consumer_info(self, group: str, client_id: str) -> ConsumerInfo | None:
        client = self._clients.get(client_id)
        return client.groups.get(group) if client else None

    async def query_assignment(
        self, topic: str, group: str, client_id: str, *, strategy: str = "", broadcasting: bool = False
    ) -> QueueAssignment | None:
        view = await self.cluster.view(topic)
        if view is None:
            return None
        body = orjson.dumps(
            {
                "topic": topic,
                "consumerGroup": group,
                "clientId": client_id,
                "strategyName": strategy or "AVG",
                "messageModel": "BROADCASTING" if broadcasting else "CLUSTERING",
            }
        )
        ids: set[int] = set()
        mode = "PULL"
        for broker in self.cluster.masters():
            response = await self.cluster.broker_call(
                broker, wire.command(RequestCode.QUERY_ASSIGNMENT, body=body)
            )
            if response.code != ResponseCode.SUCCESS or not response.body:
                continue
            for item in loads_java_json(response.body).get("messageQueueAssignments") or []:
                queue = item.get("messageQueue") or {}
                mode = str(item.get("mode") or mode)
                qid = int(queue.get("queueId", -1))
                if qid < 0:
                    ids.update(view.queues.of_broker(str(queue.get("brokerName"))))
                    continue
                virtual = view.queues.virtual(str(queue.get("brokerName")), qid)
                if virtual is not None:
                    ids.add(virtual)
        return QueueAssignment(RequestMode(mode), tuple(sorted(ids)))

    # --- locks ----------------------------------------------------------------------------------

    async def _by_broker(self, queues: Iterable[QueueRef]) -> dict[str, list[tuple[QueueRef, int]]]:
        grouped: dict[str, list[tuple[QueueRef, int]]] = defaultdict(list)
        for ref in queues:
            view = await self.cluster.view(ref.topic)
            entry = view.real(ref.queue_id) if view is not None else None
            if entry is not None:
                grouped[entry.broker].append((ref, entry.queue_id))
        return grouped

    async def lock_batch(self, group: str, client_id: str, queues: Iterable[QueueRef]) -> set[QueueRef]:
        held: set[QueueRef] = set()
        for broker, refs in (await self._by_broker(queues)).items():
            body = wire.lock_body(group, client_id, [(r.topic, broker, q) for r, q in refs])
            try:
                response = await self.cluster.broker_call(
                    broker, wire.command(RequestCode.LOCK_BATCH_MQ, body=body)
                )
            except ClusterUnavailable:
                continue
            if response.code != ResponseCode.SUCCESS or not response.body:
                continue
            locked = {
                (q.get("topic"), int(q.get("queueId", -1)))
                for q in orjson.loads(response.body).get("lockOKMQSet") or []
            }
            held.update(ref for ref, real in refs if (ref.topic, real) in locked)
        self._locks[(group, client_id)].update(held)
        return held

    async def unlock(self, group: str, client_id: str, queues: Iterable[QueueRef]) -> None:
        wanted = list(queues)
        for broker, refs in (await self._by_broker(wanted)).items():
            body = wire.lock_body(group, client_id, [(r.topic, broker, q) for r, q in refs])
            try:
                await self.cluster.broker_call(broker, wire.command(RequestCode.UNLOCK_BATCH_MQ, body=body))
            except ClusterUnavailable:
                continue
        self._locks[(group, client_id)].difference_update(wanted)

    async def release_client(self, group: str, client_id: str) -> int:
        held = self._locks.pop((group, client_id), set())
        if held:
            await self.unlock(group, client_id, held)
            self._locks.pop((group, client_id), None)
        return len(held)

    def lock_holder(self, group: str, queue: QueueRef) -> str | None:
        for (g, client_id), held in self._locks.items():
            if g == group and queue in held:
                return client_id
        return None

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.pool.aclose()
        self._clients.clear()


def node_client_id(advertised: tuple[str, int]) -> str:
    """This node's client id with the brokers (unique per process)."""
    return f"{advertised[0]}@mqproxy-{advertised[1]}-{os.getpid()}"
