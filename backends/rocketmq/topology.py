"""
mqproxy.backends.rocketmq.topology
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

Sans-IO reading of what a name server says about a topic (``TopicRouteData``) and the cluster
(``ClusterInfo``).

Contracts:

* :func:`parse_route` accepts standard JSON and the Java broker's fastjson dialect (bare integer map
  keys such as ``{0:"127.0.0.1:10911"}``); anything else raises :class:`TopologyError`.
* A broker's address is its master's (``brokerId`` 0); a broker without a live master is listed with
  ``addr`` None (its queues exist but cannot be reached).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

import orjson

from mqproxy.model.types import PERM_READ, PERM_WRITE

__all__ = [
    "BrokerQueues",
    "ClusterInfo",
    "TopicRoute",
    "TopologyError",
    "loads_java_json",
    "parse_cluster",
    "parse_route",
]

_BARE_INT_KEY: Final = re.compile(rb"([{,])\s*(-?\d+)\s*:")


class TopologyError(ValueError):
    """A name server answer that cannot be read."""


def loads_java_json(data: bytes) -> Any:
    """JSON as a Java broker or name server writes it (fastjson may leave integer map keys bare)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        return orjson.loads(_BARE_INT_KEY.sub(rb'\1"\2":', data))
    except orjson.JSONDecodeError as exc:
        raise TopologyError(f"not JSON: {exc}") from None


@dataclass(frozen=True, slots=True)
class BrokerQueues:
    """One broker's share of a topic: its queue counts and permission, and its master's address."""

    broker: str
    read_queues: int
    write_queues: int
    perm: int
    addr: str | None

    @property
    def queue_count(self) -> int:
        return max(self.read_queues, self.write_queues)

    def writable(self, queue_id: int) -> bool:
        return bool(self.perm & PERM_WRITE) and queue_id < self.write_queues and self.addr is not None

    def readable(self, queue_id: int) -> bool:
        return bool(self.perm & PERM_READ) and queue_id < self.read_queues and self.addr is not None


@dataclass(frozen=True, slots=True)
class TopicRoute:
    topic: str
    brokers: dict[str, BrokerQueues]
    sys_flag: int = 0


def _masters(datas: Any) -> dict[str, str | None]:
    masters: dict[str, str | None] = {}
    if not isinstance(datas, list):
        raise TopologyError("brokerDatas is not a list")
    for data in datas:
        if not isinstance(data, dict) or not isinstance(data.get("brokerName"), str):
            raise TopologyError("a brokerData has no brokerName")
        addrs = data.get("brokerAddrs") or {}
        if not isinstance(addrs, dict):
            raise TopologyError("brokerAddrs is not a map")
        master = addrs.get("0")
        masters[data["brokerName"]] = master if isinstance(master, str) and master else None
    return masters


def parse_route(topic: str, body: bytes) -> TopicRoute:
    """The route of ``topic`` from a GET_ROUTEINFO_BY_TOPIC body."""
    data = loads_java_json(body)
    if not isinstance(data, dict):
        raise TopologyError("route is not a JSON object")
    masters = _masters(data.get("brokerDatas") or [])
    brokers: dict[str, BrokerQueues] = {}
    sys_flag = 0
    queue_datas = data.get("queueDatas") or []
    if not isinstance(queue_datas, list):
        raise TopologyError("queueDatas is not a list")
    for qd in queue_datas:
        if not isinstance(qd, dict) or not isinstance(qd.get("brokerName"), str):
            raise TopologyError("a queueData has no brokerName")
        try:
            name = qd["brokerName"]
            brokers[name] = BrokerQueues(
                name,
                int(qd.get("readQueueNums", 0)),
                int(qd.get("writeQueueNums", 0)),
                int(qd.get("perm", PERM_READ | PERM_WRITE)),
                masters.get(name),
            )
            sys_flag = int(qd.get("topicSysFlag", 0) or 0)
        except (TypeError, ValueError):
            raise TopologyError("a queueData has a non-numeric count") from None
    return TopicRoute(topic, brokers, sys_flag)


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """Every broker the name server knows: name → master address (None: no live master), and clusters."""

    masters: dict[str, str | None]
    clusters: dict[str, tuple[str, ...]]


def parse_cluster(body: bytes) -> ClusterInfo:
    """A GET_BROKER_CLUSTER_INFO body."""
    data = loads_java_json(body)
    if not isinstance(data, dict):
        raise TopologyError("cluster info is not a JSON object")
    table = data.get("brokerAddrTable") or {}
    if not isinstance(table, dict):
        raise TopologyError("brokerAddrTable is not a map")
    masters = _masters(list(table.values()))
    clusters_raw = data.get("clusterAddrTable") or {}
    clusters = {
        str(name): tuple(sorted(str(b) for b in members))
        for name, members in (clusters_raw.items() if isinstance(clusters_raw, dict) else ())
        if isinstance(members, list)
    }
    return ClusterInfo(masters, clusters)
