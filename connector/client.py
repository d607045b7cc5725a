"""
mqproxy.connector.client
~~~~~~~~~~~~~~~~~~~~~~~~

One cluster as the connector sees it: name servers and master brokers reached through a
:class:`~mqproxy.remoting_client.RemotingPool`, with the requests of :mod:`mqproxy.backends.rocketmq.wire`.
The same code talks to an mqproxy node (its own name server, one broker ``broker-a``) and to a stock
Apache RocketMQ cluster.

Contracts:

* Queues are real ``(broker name, queue id)`` pairs from the routes; requests carry ``bname``.
* A name server or broker that cannot be reached raises :class:`~mqproxy.model.errors.ClusterUnavailable`;
  an error answer raises :class:`~mqproxy.model.errors.BrokerRefused` with the broker's code and remark.
* :meth:`ClusterClient.send` raises :class:`SendUnknown` when the request may have been stored (timeout,
  connection lost after writing): the caller must find out from the target queue's tail.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import orjson

from mqproxy.backends.rocketmq import wire
from mqproxy.backends.rocketmq.topology import (
    TopicRoute,
    TopologyError,
    loads_java_json,
    parse_cluster,
    parse_route,
)
from mqproxy.codecs.message_record import BatchEntry, encode_batch_body
from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.connector.rules import ClusterSpec
from mqproxy.model.errors import BrokerRefused, ClusterUnavailable
from mqproxy.model.types import PERM_READ, PERM_WRITE, ConsumerInfo, Message, StoredMessage, Subscription
from mqproxy.remoting_client import AddressUnreachable, RemotingClientError, RemotingPool

__all__ = ["ClusterClient", "Pulled", "SendUnknown"]

_FLAG_SUSPEND = 0x2
_FLAG_SUBSCRIPTION = 0x4
_STORED = (
    ResponseCode.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE,
)


class SendUnknown(Exception):
    """A send whose outcome is unknown (it may or may not have been stored)."""


@dataclass(frozen=True, slots=True)
class Pulled:
    messages: list[StoredMessage]
    next_offset: int
    max_offset: int
    moved: bool = False


class ClusterClient:
    """Requests to one cluster (see the module contracts)."""

    def __init__(self, spec: ClusterSpec, pool: RemotingPool, timeout_s: float) -> None:
        self.spec = spec
        self.pool = pool
        self.timeout_s = timeout_s
        self._masters: dict[str, str] = {}
        self._next = 0

    @property
    def name(self) -> str:
        return self.spec.name

    # --- name servers ---------------------------------------------------------------------------

    async def namesrv(self, request: RemotingCommand) -> RemotingCommand:
        errors = []
        addrs = self.spec.namesrv
        for step in range(len(addrs)):
            n = (self._next + step) % len(addrs)
            try:
                response = await self.pool.request(addrs[n], request, timeout_s=self.timeout_s)
            except RemotingClientError as exc:
                errors.append(f"name server {addrs[n]}: {exc.reason}")
                continue
            self._next = n
            return response
        raise ClusterUnavailable(f"{self.name}: " + "; ".join(errors))

    async def route(self, topic: str) -> TopicRoute | None:
        """The topic's route (None: no broker has it)."""
        request = wire.command(
            RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic, "acceptStandardJsonOnly": True}
        )
        response = await self.namesrv(request)
        if response.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        wire.check(response)
        try:
            route = parse_route(topic, response.body)
        except TopologyError as exc:
            raise BrokerRefused(ResponseCode.SYSTEM_ERROR, f"unreadable route of {topic}: {exc}") from None
        for share in route.brokers.values():
            if share.addr:
                self._masters[share.broker] = share.addr
        return route if route.brokers else None

    async def topics(self) -> list[str]:
        """Every topic the name servers know (GET_ALL_TOPIC_LIST_FROM_NAMESERVER)."""
        response = wire.check(
            await self.namesrv(wire.command(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
        )
        data = loads_java_json(response.body) if response.body else {}
        listed = data.get("topicList") if isinstance(data, dict) else None
        return sorted(str(t) for t in listed or ())

    async def masters(self) -> dict[str, str]:
        """Master broker name → address (GET_BROKER_CLUSTER_INFO)."""
        response = wire.check(await self.namesrv(wire.command(RequestCode.GET_BROKER_CLUSTER_INFO)))
        try:
            info = parse_cluster(response.body)
        except TopologyError as exc:
            raise BrokerRefused(ResponseCode.SYSTEM_ERROR, f"unreadable cluster info: {exc}") from None
        found = {name: addr for name, addr in info.masters.items() if addr}
        self._masters.update(found)
        return dict(sorted(found.items()))

    # --- brokers --------------------------------------------------------------------------------

    async def _master(self, broker: str) -> str:
        """The address of ``broker``'s master, asking the name servers again when it is not known."""
        addr = self._masters.get(broker)
        if addr is None:
            await self.masters()
            addr = self._masters.get(broker)
        if addr is None:
            raise ClusterUnavailable(f"{self.name}: broker {broker} has no live master")
        return addr

    async def call(
        self, broker: str, request: RemotingCommand, timeout_s: float | None = None
    ) -> RemotingCommand:
        addr = await self._master(broker)
        try:
            return await self.pool.request(addr, request, timeout_s=timeout_s or self.timeout_s)
        except RemotingClientError as exc:
            raise ClusterUnavailable(f"{self.name}: broker {broker} ({addr}): {exc.reason}") from None

    async def create_topic(self, topic: str, queues_per_broker: int) -> None:
        """UPDATE_AND_CREATE_TOPIC on every master broker."""
        masters = await self.masters()
        if not masters:
            raise ClusterUnavailable(f"{self.name}: no master broker to create {topic} on")
        for broker in masters:
            request = wire.command(
                RequestCode.UPDATE_AND_CREATE_TOPIC,
                {
                    "topic": topic,
                    "defaultTopic": wire.DEFAULT_TOPIC,
                    "readQueueNums": queues_per_broker,
                    "writeQueueNums": queues_per_broker,
                    "perm": PERM_READ | PERM_WRITE,
                    "topicFilterType": "SINGLE_TAG",
                    "topicSysFlag": 0,
                    "order": False,
                },
            )
            wire.check(await self.call(broker, request))

    async def pull(
        self, group: str, topic: str, broker: str, queue_id: int, offset: int, count: int, hold_s: float = 0.0
    ) -> Pulled:
        """Up to ``count`` messages from ``offset`` (no filter, no commit; ``hold_s`` > 0: long poll)."""
        flags = _FLAG_SUBSCRIPTION | (_FLAG_SUSPEND if hold_s > 0 else 0)
        request = wire.command(
            RequestCode.PULL_MESSAGE,
            {
                "consumerGroup": group,
                "topic": topic,
                "queueId": queue_id,
                "queueOffset": offset,
                "maxMsgNums": count,
                "sysFlag": flags,
                "commitOffset": 0,
                "suspendTimeoutMillis": int(hold_s * 1000),
                "subscription": "*",
                "subVersion": int(time.time() * 1000),
                "expressionType": "TAG",
                "bname": broker,
            },
        )
        response = await self.call(broker, request, timeout_s=self.timeout_s + hold_s)
        ext = response.ext_fields
        nxt, high = int(ext.get("nextBeginOffset", offset)), int(ext.get("maxOffset", 0) or 0)
        if response.code == ResponseCode.SUCCESS:
            return Pulled(wire.records(response.body), nxt, high)
        if response.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY):
            return Pulled([], nxt, high)
        if response.code == ResponseCode.PULL_OFFSET_MOVED:
            return Pulled([], nxt, high, moved=True)
        wire.check(response)
        return Pulled([], offset, high)

    async def _number(self, code: int, broker: str, fields: dict[str, object], key: str = "offset") -> int:
        response = wire.check(await self.call(broker, wire.command(code, {**fields, "bname": broker})))
        return int(response.ext_fields.get(key, "0") or 0)

    async def max_offset(self, topic: str, broker: str, queue_id: int) -> int:
        return await self._number(RequestCode.GET_MAX_OFFSET, broker, {"topic": topic, "queueId": queue_id})

    async def min_offset(self, topic: str, broker: str, queue_id: int) -> int:
        return await self._number(RequestCode.GET_MIN_OFFSET, broker, {"topic": topic, "queueId": queue_id})

    async def search_offset(self, topic: str, broker: str, queue_id: int, timestamp_ms: int) -> int:
        fields = {"topic": topic, "queueId": queue_id, "timestamp": timestamp_ms}
        return await self._number(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, broker, fields)

    async def send(self, broker: str, queue_id: int, messages: Sequence[Message], group: str) -> None:
        """Store ``messages`` in order in ``queue_id`` of ``broker`` (one request: a batch when more than
        one). BrokerRefused: not stored; :class:`SendUnknown`: maybe stored."""
        first = messages[0]
        if len(messages) == 1:
            request = wire.send_request(first, broker, queue_id, group, None, 4)
        else:
            body = encode_batch_body(BatchEntry(m.body, m.flag, dict(m.properties)) for m in messages)
            batch = Message(first.topic, body, queue_id, born_timestamp_ms=first.born_timestamp_ms)
            request = wire.send_request(batch, broker, queue_id, group, None, 4)
            request.code = RequestCode.SEND_BATCH_MESSAGE
            request.ext_fields["m"] = "true"
        addr = await self._master(broker)
        try:
            response = await self.pool.request(addr, request, timeout_s=self.timeout_s)
        except AddressUnreachable as exc:  # never connected: nothing was written
            raise ClusterUnavailable(f"{self.name}: broker {broker} ({addr}): {exc.reason}") from None
        except RemotingClientError as exc:
            await self.pool.close_address(addr)  # late answers on this connection must not count
            raise SendUnknown(f"{self.name}: broker {broker} ({addr}): {exc.reason}") from None
        wire.check(response, *_STORED)

    # --- consumer group -------------------------------------------------------------------------

    async def heartbeat(self, client_id: str, group: str, topics: Iterable[str]) -> None:
        info = ConsumerInfo(
            client_id,
            group,
            tuple(Subscription(t) for t in sorted(set(topics))),
            consume_type="CONSUME_ACTIVELY",
            consume_from_where="CONSUME_FROM_FIRST_OFFSET",
        )
        body = wire.heartbeat_body(client_id, [info], [])
        for broker in await self.masters():
            wire.check(await self.call(broker, wire.command(RequestCode.HEART_BEAT, body=body)))

    async def members(self, group: str) -> list[str]:
        """The client ids of ``group`` as the first master broker knows them."""
        masters = await self.masters()
        for broker in masters:
            request = wire.command(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
            response = await self.call(broker, request)
            if response.code != ResponseCode.SUCCESS:
                return []
            data = orjson.loads(response.body) if response.body else {}
            return sorted(str(c) for c in data.get("consumerIdList") or ())
        return []

    async def lock(
        self, group: str, client_id: str, queues: Iterable[tuple[str, str, int]]
    ) -> set[tuple[str, str, int]]:
        """LOCK_BATCH_MQ per broker; the (topic, broker, queue id) triples now held by ``client_id``."""
        held: set[tuple[str, str, int]] = set()
        by_broker: dict[str, list[tuple[str, str, int]]] = {}
        for q in queues:
            by_broker.setdefault(q[1], []).append(q)
        for broker, wanted in sorted(by_broker.items()):
            body = wire.lock_body(group, client_id, wanted)
            response = wire.check(await self.call(broker, wire.command(RequestCode.LOCK_BATCH_MQ, body=body)))
            data = orjson.loads(response.body) if response.body else {}
            for item in data.get("lockOKMQSet") or ():
                held.add((str(item["topic"]), str(item["brokerName"]), int(item["queueId"])))
        return held

    async def unlock(self, group: str, client_id: str, queues: Iterable[tuple[str, str, int]]) -> None:
        by_broker: dict[str, list[tuple[str, str, int]]] = {}
        for q in queues:
            by_broker.setdefault(q[1], []).append(q)
        for broker, wanted in sorted(by_broker.items()):
            body = wire.lock_body(group, client_id, wanted)
            wire.check(await self.call(broker, wire.command(RequestCode.UNLOCK_BATCH_MQ, body=body)))

    async def groups_of(self, topic: str) -> list[str]:
        """Groups consuming ``topic`` or with offsets on it, on any master (QUERY_TOPIC_CONSUME_BY_WHO)."""
        found: set[str] = set()
        for broker in await self.masters():
            request = wire.command(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": topic})
            response = await self.call(broker, request)
            if response.code != ResponseCode.SUCCESS:
                continue
            data = loads_java_json(response.body) if response.body else {}
            listed = data.get("groupList") if isinstance(data, dict) else None
            found.update(str(g) for g in listed or ())
        return sorted(found)

    async def query_offset(self, group: str, topic: str, broker: str, queue_id: int) -> int | None:
        fields = {"consumerGroup": group, "topic": topic, "queueId": queue_id, "setZeroIfNotFound": False}
        request = wire.command(RequestCode.QUERY_CONSUMER_OFFSET, {**fields, "bname": broker})
        response = await self.call(broker, request)
        if response.code in (ResponseCode.QUERY_NOT_FOUND, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST):
            return None
        wire.check(response)
        return int(response.ext_fields.get("offset", "0") or 0)

    async def commit_offset(self, group: str, topic: str, broker: str, queue_id: int, offset: int) -> None:
        fields = {"consumerGroup": group, "topic": topic, "queueId": queue_id, "commitOffset": offset}
        request = wire.command(RequestCode.UPDATE_CONSUMER_OFFSET, {**fields, "bname": broker})
        response = await self.call(broker, request)
        if response.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST:
            create = wire.command(
                RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=wire.group_body(group)
            )
            wire.check(await self.call(broker, create))
            response = await self.call(broker, request)
        wire.check(response)
