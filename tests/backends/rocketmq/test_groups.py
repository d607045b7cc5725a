"""The node's cache of the brokers' subscription-group configs (:mod:`mqproxy.backends.rocketmq.groups`),
over a fake cluster: no sockets, trio's autojump clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from mqproxy.backends.rocketmq.groups import (
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
    GroupConfigs,
    parse_group_table,
)
from mqproxy.backends.rocketmq.topology import TopologyError
from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.facade.types import GroupConfig
from mqproxy.model.errors import ClusterUnavailable

from ...conftest import wait_until  # type: ignore[import-not-found]


def table(**groups: dict[str, Any]) -> bytes:
    """A ``SubscriptionGroupWrapper`` as a broker answers it (fastjson: dataVersion, forbiddenTable)."""
    body = {
        "subscriptionGroupTable": {name: {"groupName": name, **cfg} for name, cfg in groups.items()},
        "forbiddenTable": {},
        "dataVersion": {"counter": 3, "timestamp": 1},
    }
    return orjson.dumps(body)


@dataclass
class FakeConfig:
    refresh_s: float = 30.0


@dataclass
class FakeCluster:
    """What :class:`GroupConfigs` uses of a cluster: masters, broker calls, health, refresh period."""

    tables: dict[str, bytes | None]
    health: str | None = None
    config: FakeConfig = field(default_factory=FakeConfig)
    calls: list[str] = field(default_factory=list)

    def masters(self) -> dict[str, str]:
        return {name: f"127.0.0.1:{n}" for n, name in enumerate(sorted(self.tables))}

    async def broker_call(self, broker: str, request: RemotingCommand) -> RemotingCommand:
        assert request.code == GET_ALL_SUBSCRIPTIONGROUP_CONFIG
        self.calls.append(broker)
        body = self.tables[broker]
        if body is None:
            raise ClusterUnavailable(f"broker {broker}: connection refused")
        return RemotingCommand(code=ResponseCode.SUCCESS, body=body)


def test_a_broker_table_reads_orderly_and_retry_settings() -> None:
    found = parse_group_table(
        table(Fifo={"consumeMessageOrderly": True, "retryMaxTimes": 3}, Plain={"consumeEnable": True})
    )
    assert found == {
        "Fifo": GroupConfig("Fifo", consume_orderly=True, retry_max_times=3),
        "Plain": GroupConfig("Plain", consume_orderly=False, retry_max_times=16),
    }
    # fastjson may leave integer keys bare elsewhere in the answer
    assert parse_group_table(b'{"subscriptionGroupTable":{},"x":{0:1}}') == {}


@pytest.mark.parametrize("body", [b"", b"[]", b"{not json", b'{"subscriptionGroupTable": 3}'])
def test_an_unreadable_table_is_a_topology_error(body: bytes) -> None:
    with pytest.raises(TopologyError):
        parse_group_table(body)


async def test_the_union_of_brokers_first_broker_by_name_wins() -> None:
    cluster = FakeCluster(
        {
            "broker-b": table(G={"consumeMessageOrderly": False}, OnlyB={"consumeMessageOrderly": True}),
            "broker-a": table(G={"consumeMessageOrderly": True}),
        }
    )
    groups = GroupConfigs(cluster)  # type: ignore[arg-type]
    await groups.reload()
    assert groups.get("G") == GroupConfig("G", consume_orderly=True)
    assert groups.get("OnlyB") == GroupConfig("OnlyB", consume_orderly=True)
    assert groups.get("Nowhere") is None


async def test_a_broker_that_does_not_answer_keeps_its_last_table() -> None:
    cluster = FakeCluster({"broker-a": table(G={"consumeMessageOrderly": True})})
    groups = GroupConfigs(cluster)  # type: ignore[arg-type]
    await groups.reload()
    cluster.tables["broker-a"] = None
    await groups.reload()
    assert groups.get("G") == GroupConfig("G", consume_orderly=True)


async def test_writes_through_the_node_show_at_once() -> None:
    groups = GroupConfigs(FakeCluster({"broker-a": table(), "broker-b": table()}))  # type: ignore[arg-type]
    groups.put(GroupConfig("New", consume_orderly=True, retry_max_times=2))
    assert groups.get("New") == GroupConfig("New", consume_orderly=True, retry_max_times=2)
    groups.forget("New")
    assert groups.get("New") is None


async def test_a_group_asked_for_and_missing_is_loaded_at_once(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    """With a 30 s refresh, a group created on the brokers after the last load is seen about one
    :data:`MIN_RELOAD_S` after it is first asked for; a group that does not exist is not asked again and
    again (one wake per load)."""
    cluster = FakeCluster({"broker-a": table()})
    groups = GroupConfigs(cluster)  # type: ignore[arg-type]
    await nursery.start(groups.run)
    await wait_until(lambda: len(cluster.calls) == 1)
    cluster.tables["broker-a"] = table(Late={"consumeMessageOrderly": True})
    start = trio.current_time()
    assert groups.get("Late") is None  # the first answer: the defaults
    await wait_until(lambda: groups.get("Late") is not None)
    assert trio.current_time() - start <= 1.5
    assert len(cluster.calls) == 2
    for _ in range(5):
        assert groups.get("Nowhere") is None
    await wait_until(lambda: len(cluster.calls) == 3)
    await trio.sleep(10)
    assert len(cluster.calls) == 3  # no more until the refresh period ends
    await trio.sleep(25)
    assert len(cluster.calls) == 4


async def test_nothing_is_asked_while_the_cluster_is_unavailable(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    cluster = FakeCluster({"broker-a": table(G={})}, health="no name server answers")
    groups = GroupConfigs(cluster)  # type: ignore[arg-type]
    await nursery.start(groups.run)
    await trio.sleep(5)
    assert cluster.calls == []
    cluster.health = None
    await wait_until(lambda: groups.get("G") is not None, 3.0)  # within a retry, not a refresh period
