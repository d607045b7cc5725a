"""
mqproxy.backends.rocketmq.groups
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

:class:`GroupConfigs`: the node's cache of the cluster's subscription-group configs, which
:meth:`~mqproxy.facade.api.Admin.group_config` reads (a FIFO group is one whose config says
``consumeMessageOrderly``; the gRPC protocol tells its clients so and pops their messages in order).

Contracts:

* The cache is the union of the master brokers' subscription-group tables
  (``GET_ALL_SUBSCRIPTIONGROUP_CONFIG``); a group on several brokers takes the config of the first broker by
  name. :meth:`GroupConfigs.run` reloads it every ``refresh_s``, and at once (at most every
  :data:`MIN_RELOAD_S`) after :meth:`GroupConfigs.get` was asked for a group it lacks. So a group an
  administrator creates on the brokers is seen within ``refresh_s``, or about one round trip after its
  first use, whose answer is the defaults (None).
* A broker that does not answer, or answers something unreadable, keeps its table of the last load.
* Writes through this node (:meth:`GroupConfigs.put`, :meth:`GroupConfigs.forget`) change the cache at once.
"""

from __future__ import annotations

from typing import Final

import trio

from mqproxy.backends.rocketmq import wire
from mqproxy.backends.rocketmq.cluster import Cluster
from mqproxy.backends.rocketmq.topology import TopologyError, loads_java_json
from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.facade.types import GroupConfig
from mqproxy.model.errors import BrokerRefused, ClusterUnavailable

__all__ = ["GET_ALL_SUBSCRIPTIONGROUP_CONFIG", "MIN_RELOAD_S", "GroupConfigs", "parse_group_table"]

#: RocketMQ ``RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG`` (a broker's whole table).
GET_ALL_SUBSCRIPTIONGROUP_CONFIG: Final = 201
#: Shortest time between two loads, however many unknown groups are asked for.
MIN_RELOAD_S: Final = 1.0


def parse_group_table(body: bytes) -> dict[str, GroupConfig]:
    """The configs in a broker's ``SubscriptionGroupWrapper`` JSON; raises :class:`TopologyError`."""
    data = loads_java_json(body)
    table = data.get("subscriptionGroupTable") if isinstance(data, dict) else None
    if not isinstance(table, dict):
        raise TopologyError("no subscriptionGroupTable")
    found: dict[str, GroupConfig] = {}
    for name, entry in table.items():
        if not isinstance(entry, dict):
            continue
        retry = entry.get("retryMaxTimes", 16)
        found[str(name)] = GroupConfig(
            str(name),
            consume_orderly=entry.get("consumeMessageOrderly") is True,
            retry_max_times=retry if isinstance(retry, int) else 16,
        )
    return found


class GroupConfigs:
    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self._tables: dict[str, dict[str, GroupConfig]] = {}
        self._missed: set[str] = set()
        self._wake = trio.Event()

    def get(self, group: str) -> GroupConfig | None:
        """The group's config, from the cache (see the module contracts)."""
        for broker in sorted(self._tables):
            found = self._tables[broker].get(group)
            if found is not None:
                return found
        if group not in self._missed:
            self._missed.add(group)
            self._wake.set()
        return None

    def put(self, config: GroupConfig) -> None:
        """``config`` was written to every master broker."""
        for broker in self._cluster.masters():
            self._tables.setdefault(broker, {})[config.name] = config

    def forget(self, group: str) -> None:
        for table in self._tables.values():
            table.pop(group, None)

    async def reload(self) -> None:
        """Load every master broker's table (those that answer)."""
        self._missed.clear()
        masters = self._cluster.masters()
        for broker in list(self._tables):
            if broker not in masters:
                del self._tables[broker]
        for broker in masters:
            try:
                response = await self._cluster.broker_call(
                    broker, wire.command(GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
                )
                if response.code == ResponseCode.SUCCESS and response.body:
                    self._tables[broker] = parse_group_table(response.body)
            except (ClusterUnavailable, BrokerRefused, TopologyError):
                continue

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the cache fresh until cancelled."""
        task_status.started()
        last = trio.current_time() - MIN_RELOAD_S
        while True:
            await trio.sleep_until(last + MIN_RELOAD_S)
            last = trio.current_time()
            self._wake = trio.Event()  # before the load: a miss during it wakes the next one
            if self._cluster.health is None:
                await self.reload()
            healthy = self._cluster.health is None
            with trio.move_on_after(self._cluster.config.refresh_s if healthy else MIN_RELOAD_S):
                await self._wake.wait()
