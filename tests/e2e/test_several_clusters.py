"""Several clusters behind one node: two stock Apache RocketMQ 5.3 clusters (one broker each, their own
name servers; this module's own and the only one with two) and one mqproxy node routing ``east_*`` topics
to one and ``west_*`` topics to the other, with no default backend.

The Java 4.x remoting client (``ClusterLoads``) produces to one topic of each cluster through the node and
push-consumes both through it. Then each cluster's own name server and broker are asked: each topic's
messages are on its cluster only, each group is a member there and its offsets are committed there; the
node routes a topic no rule covers to nobody and says so with the rules.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from remoting_wire import remoting_exchange  # type: ignore[import-not-found]

from .cluster_harness import (
    ClusterMode,
    Loads,
    create_topic,
    finish,
    max_offsets,
    received,
    route,
    sent,
    started,
    wait_for,
)
from .conftest import Client, stock_rocketmq
from .harness import ProxyProcess
from .two_clusters import DESCRIBED, broker, committed, consumer_ids, other, routing_node, two_clusters

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

QUEUES = 2
COUNT = 20
LIMIT_S = 90.0
GET_ROUTEINFO_BY_TOPIC = 105
TOPIC_NOT_EXIST = 17


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, stock_rocketmq.StockCluster]]:
    with two_clusters(tmp_path_factory) as out:
        yield out


@pytest.fixture(scope="module")
def node(
    clusters: dict[str, stock_rocketmq.StockCluster], proxy_bin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    with routing_node(clusters, proxy_bin, tmp_path_factory.mktemp("node")) as proc:
        yield proc


@pytest.fixture
def loads(
    java_driver: Callable[..., Client], node: ProxyProcess, request: pytest.FixtureRequest
) -> Iterator[Loads]:
    request.node._e2e_proxies = [node]  # a failure's report gets the node's log tail
    made = Loads(java_driver("remoting", "mqtest.ClusterLoads", ("client4",)))
    yield made
    made.kill_all()


def test_two_topics_on_two_clusters_through_one_node(
    clusters: dict[str, stock_rocketmq.StockCluster], node: ProxyProcess, loads: Loads, tmp_path: Path
) -> None:
    uid = uuid.uuid4().hex[:8]
    topics = {"east": f"east_{uid}", "west": f"west_{uid}"}
    for name, topic in topics.items():
        create_topic(ClusterMode(clusters[name], "", tmp_path), topic, QUEUES)
    address = str(node.address)
    # each route comes from the topic's own cluster; the node still advertises itself as the broker
    for topic in topics.values():
        answer = route(address, topic)
        assert answer is not None
        assert [d["brokerAddrs"]["0"] for d in answer["brokerDatas"]] == [address]
        assert sum(int(q["writeQueueNums"]) for q in answer["queueDatas"]) == QUEUES

    groups = {name: f"{topic}_cg" for name, topic in topics.items()}
    consumers = {
        name: loads.consume(address, topics[name], groups[name], label=f"c-{name}") for name in topics
    }
    for run in consumers.values():
        started(run, LIMIT_S)
    producers = {
        name: loads.produce(address, topic, f"{topic}_pg", count=COUNT, label=f"p-{name}")
        for name, topic in topics.items()
    }
    acked = {}
    for name, run in producers.items():
        run.wait(LIMIT_S)
        acked[name] = sent(run)
        assert len(acked[name]) == COUNT, run.describe()
    for name, run in consumers.items():
        wait_for(
            f"the {name} consumer got every message",
            lambda run=run, name=name: set(acked[name]) <= {m["body"] for m in received(run)},
            LIMIT_S,
            run,
        )
    # consumer groups follow their topics: each is a member of its topic's cluster only
    for name, group in groups.items():
        assert consumer_ids(broker(clusters[name]), group), f"{group} not a member on {name}"
        assert consumer_ids(broker(clusters[other(name)]), group) == [], f"{group} a member on {other(name)}"
    for run in consumers.values():
        finish(run, LIMIT_S)  # shutdown commits the consumers' offsets
    for name, run in consumers.items():
        got = received(run)
        assert {m["body"] for m in got} == set(acked[name])
        assert {m["topic"] for m in got} == {topics[name]}

    # ask each cluster itself: its name server routes its topic only, its broker holds the messages and
    # the group's offsets
    for name, topic in topics.items():
        assert route(clusters[name].namesrv_addr, topic) is not None
        assert route(clusters[other(name)].namesrv_addr, topic) is None
        assert sum(max_offsets(broker(clusters[name]), topic, QUEUES)) == COUNT
        assert sum(committed(broker(clusters[name]), groups[name], topic, QUEUES)) == COUNT
        assert max(committed(broker(clusters[other(name)]), groups[name], topic, QUEUES)) <= 0

    # a topic no rule covers (and no default): refused with the rules named
    reply, _ = remoting_exchange(address, GET_ROUTEINFO_BY_TOPIC, {"topic": f"north_{uid}"})
    assert reply["code"] == TOPIC_NOT_EXIST, reply
    assert DESCRIBED in str(reply["remark"])
    reader = node.reader
    assert reader is not None
    wait_for(  # the node's log is read by another thread
        "the node logged backend.unrouted",
        lambda: any(
            e.get("event") == "backend.unrouted" and e.get("topic") == f"north_{uid}"
            for e in list(reader.events)
        ),
        10.0,
    )
