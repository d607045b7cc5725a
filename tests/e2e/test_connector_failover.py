"""Consumer-offset translation used by a real Java consumer that fails over: a RocketMQ 4.x push consumer
consumes part of a topic on an mqproxy node, stops; ``mqproxy connect`` copies the topic to a stock
RocketMQ 5.3 broker and translates the group's offsets; the same group then consumes on the stock broker
and gets exactly the rest (e2e tier: ``export MQTEST_CACHE=...``)."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from ..conftest import running_stock_cluster  # type: ignore[import-not-found]
from ..connector.conftest import ConnectProcess, cluster, produce, read_all
from .cluster_harness import Loads, finish, received, started, wait_for
from .conftest import Client, stock_rocketmq
from .harness import ProxyProcess

pytestmark = pytest.mark.e2e

TOPIC = "Failover"
GROUP = "GFailover"
QUEUES = 4


@pytest.fixture
def stock_target(tmp_path: Path) -> Iterator[stock_rocketmq.StockCluster]:
    yield from running_stock_cluster(tmp_path / "stock", brokers=1)


@pytest.fixture
def loads(java_driver: Callable[..., Client]) -> Iterator[Loads]:
    made = Loads(java_driver("remoting", "mqtest.ClusterLoads", ("client4",)))
    yield made
    made.kill_all()


async def _offsets(addr: str, topic: str, group: str) -> dict[int, int | None]:
    async with cluster(addr) as c:
        route = await c.route(topic) if topic in await c.topics() else None
        if route is None:
            return {}
        share = next(iter(route.brokers.values()))
        return {q: await c.query_offset(group, topic, share.broker, q) for q in range(share.read_queues)}


def offsets(addr: str, topic: str, group: str) -> dict[int, int | None]:
    return trio.run(_offsets, addr, topic, group)


def copied(addr: str, topic: str) -> int:
    return len(trio.run(read_all, addr, topic))


def test_a_java_consumer_fails_over_to_the_target(
    new_proxy: Callable[..., ProxyProcess],
    stock_target: stock_rocketmq.StockCluster,
    loads: Loads,
    tmp_path: Path,
) -> None:
    node = new_proxy()
    source, target = node.address, stock_target.namesrv_addr
    assert source is not None
    trio.run(functools.partial(produce, source, TOPIC, 40, queues=QUEUES))
    rules = tmp_path / "rules.toml"
    rules.write_text(
        '[connector]\nname = "failover"\nrefresh_s = 0.5\ncheckpoint_interval_s = 0.5\n'
        f'[clusters.edge]\nnamesrv = "{source}"\n[clusters.central]\nnamesrv = "{target}"\n'
        f'[[rules]]\nsource = "edge"\ntarget = "central"\ntopic = "{TOPIC}"\nstart = "earliest"\n'
        f'groups = ["{GROUP}"]\n'
    )
    connect = ConnectProcess(rules, tmp_path / "connect.log")
    try:
        connect.wait_started()
        # the group consumes everything there is on the source, then stops (offsets persisted on shutdown)
        first = loads.consume(source, TOPIC, GROUP, label="on-source")
        started(first)
        wait_for("40 received on the source", lambda: len(received(first)) >= 40, 90, first)
        finish(first)
        wait_for(
            "the group's source offsets committed",
            lambda: offsets(source, TOPIC, GROUP) == dict.fromkeys(range(QUEUES), 10),
            30,
            first,
        )
        # more arrive while it is away; the connector copies them and translates the group's offsets
        trio.run(functools.partial(produce, source, TOPIC, 20, queues=QUEUES, start=40))
        wait_for("60 copied to the stock broker", lambda: copied(target, TOPIC) >= 60, 120)
        wait_for(
            "the group's offsets translated on the stock broker",
            lambda: offsets(target, TOPIC, GROUP) == dict.fromkeys(range(QUEUES), 10),
            60,
        )

        def logged() -> set[tuple[str, int, int]]:
            return {
                (e["source_queue"].split(":")[1], e["source_offset"], e["target_offset"])
                for e in connect.events("connector.checkpoint")
            }

        # the connector's log lines are written in batches: its checkpoint events follow within the interval
        wait_for("the translations logged", lambda: logged() >= {(str(q), 10, 10) for q in range(QUEUES)}, 10)
        # the same group on the target carries on with exactly the rest
        second = loads.consume(target, TOPIC, GROUP, label="on-target")
        started(second)
        wait_for("20 received on the target", lambda: len(received(second)) >= 20, 90, second)
        finish(second)
        bodies: Counter[Any] = Counter(m["body"] for m in received(second))
        assert bodies == Counter(f"m{n}" for n in range(40, 60))
        assert all(m["props"].get("CONNECTOR_ORIGIN_TOPIC") == TOPIC for m in received(second))
        assert connect.terminate() == 0
    finally:
        connect.close()
