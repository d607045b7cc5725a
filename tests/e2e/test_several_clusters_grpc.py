"""Several clusters behind one node, over gRPC: the RocketMQ 5 Java gRPC client (``rocketmq-client-java``
5.2.0, ``tests/e2e/java/grpc5/TwoClustersGrpc5.java``) against one mqproxy node in front of two stock Apache
RocketMQ 5.3 clusters (``two_clusters``: ``east_*`` topics to one, ``west_<hex>`` to the other, no default).

One Producer sends to a topic of each cluster; one SimpleConsumer of one group, subscribed to both, receives
and acks every message (each topic's first message only when it comes again, its invisible duration changed
to 1 s at its first delivery). Then each cluster's own name server and broker are asked: each topic is
routed and stored on its cluster only, and the group's offsets are committed on its cluster only (a group
whose topics live on two clusters is a member of both). A send to a topic no rule covers is refused with
TOPIC_NOT_FOUND naming the rules, and the node logs ``backend.unrouted``. The Go 5.x client
(``tests/e2e/go/grpc5``) sends to and receives from a topic of each cluster too, each with its own group.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from mqproxy.codecs import rocketmq_v2 as pb

from ..grpc_service.conftest import GrpcTestClient  # type: ignore[import-not-found]
from .cluster_harness import ClusterMode, create_topic, max_offsets, route, wait_for
from .conftest import Client, ClientRun, stock_rocketmq
from .harness import ProxyProcess
from .two_clusters import DESCRIBED, broker, committed, consumer_ids, other, routing_node, two_clusters

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

QUEUES = 2
COUNT = 10
RUN_TIMEOUT_S = 240.0
GO_COUNT = 3


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


def _events(run: ClientRun, event: str, scenario: str) -> list[dict[str, Any]]:
    return [e for e in run.reader.events if e.get("event") == event and e.get("scenario") == scenario]


def test_java_grpc_client_through_one_node_to_two_clusters(
    clusters: dict[str, stock_rocketmq.StockCluster],
    node: ProxyProcess,
    java_driver: Callable[..., Client],
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    request.node._e2e_proxies = [node]  # a failure's report gets the node's log tail
    uid = uuid.uuid4().hex[:8]
    topics = {"east": f"east_{uid}", "west": f"west_{uid}"}
    for name, topic in topics.items():
        create_topic(ClusterMode(clusters[name], "", tmp_path), topic, QUEUES)
    group = f"grpc_{uid}_cg"
    unrouted = f"north_{uid}"
    driver = java_driver("grpc5", "mqtest.TwoClustersGrpc5", ("grpc-java",))
    run = driver.spawn(str(node.address), group, str(COUNT), unrouted, topics["east"], topics["west"])
    run.name = "TwoClustersGrpc5"
    run.wait(RUN_TIMEOUT_S)

    done = {e["scenario"]: e for e in run.of("scenario.done")}
    assert done.get("routed", {}).get("ok"), run.describe()
    sent = {e["id"]: e["topic"] for e in _events(run, "sent", "routed")}
    assert sorted(sent.values()) == sorted([topics["east"], topics["west"]] * COUNT)
    received = {e["id"]: e["topic"] for e in _events(run, "received", "routed")}
    assert received == sent  # every message, from its own topic
    assert {e["id"] for e in _events(run, "acked", "routed")} == set(sent)
    # each topic's first message, not acked, was revived by its own cluster's broker and acked there
    changed = {e["id"]: e["topic"] for e in _events(run, "changed", "routed")}
    assert sorted(changed.values()) == sorted(topics.values())
    again = {e["id"] for e in _events(run, "received", "routed") if e["delivery_attempt"] == 2}
    assert set(changed) <= again

    # ask each cluster itself: its topic is routed and stored there only, the group's offsets are there
    for name, topic in topics.items():
        here, there = clusters[name], clusters[other(name)]
        assert route(here.namesrv_addr, topic) is not None
        assert route(there.namesrv_addr, topic) is None
        assert sum(max_offsets(broker(here), topic, QUEUES)) == COUNT
        wait_for(
            f"{group}'s offsets on {topic} committed on {name}",
            lambda here=here, topic=topic: sum(committed(broker(here), group, topic, QUEUES)) == COUNT,
            30.0,
            run,
        )
        assert max(committed(broker(there), group, topic, QUEUES)) <= 0
        assert consumer_ids(broker(there), group) == [], f"{group} a member on {other(name)}"

    # a topic no rule covers: refused with TOPIC_NOT_FOUND naming the rules
    assert not _events(run, "sent", "unrouted"), run.describe()
    (refused,) = _events(run, "refused", "unrouted")
    assert "40402" in refused["message"] or "NotFound" in refused["type"], refused
    assert DESCRIBED in refused["message"], refused
    reader = node.reader
    assert reader is not None
    wait_for(  # the node's log is read by another thread
        "the node logged backend.unrouted",
        lambda: any(
            e.get("event") == "backend.unrouted" and e.get("topic") == unrouted for e in list(reader.events)
        ),
        10.0,
    )


async def test_raw_grpc_requests_for_an_unrouted_topic_get_topic_not_found_naming_the_rules(
    node: ProxyProcess, nursery: trio.Nursery
) -> None:
    host, port = str(node.address).rsplit(":", 1)
    client = GrpcTestClient(await trio.open_tcp_stream(host, int(port)), f"unrouted@{uuid.uuid4().hex[:6]}@0")
    await client.start(nursery)
    topic = pb.Resource(name=f"north_{uuid.uuid4().hex[:8]}")
    answer = await client.unary("QueryRoute", pb.QueryRouteRequest(topic=topic))
    assert answer.status.code == pb.Code.TOPIC_NOT_FOUND, answer.status
    assert DESCRIBED in answer.status.message
    system = pb.SystemProperties(message_id="01")
    message = pb.RmqMessage(topic=topic, body=b"nowhere", system_properties=system)
    sent = await client.unary("SendMessage", pb.SendMessageRequest(messages=[message]))
    assert sent.status.code == pb.Code.TOPIC_NOT_FOUND, sent.status
    assert DESCRIBED in sent.status.message


def test_go_grpc_client_through_one_node_to_two_clusters(
    clusters: dict[str, stock_rocketmq.StockCluster],
    node: ProxyProcess,
    go_driver: Callable[[str], Client],
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    request.node._e2e_proxies = [node]
    grpc5 = go_driver("grpc5")
    uid = uuid.uuid4().hex[:8]
    endpoint = str(node.address)
    for name, topic in {"east": f"east_go{uid}", "west": f"west_{uid}"}.items():
        create_topic(ClusterMode(clusters[name], "", tmp_path), topic, QUEUES)
        sender = grpc5.spawn("send", "--endpoint", endpoint, "--topic", topic, "--count", str(GO_COUNT))
        sender.wait(RUN_TIMEOUT_S)
        assert (sender.done() or {}).get("ok") is True, sender.describe()
        sent = {e["msgId"] for e in sender.of("sent")}
        assert len(sent) == GO_COUNT, sender.describe()
        group = f"{topic}_gocg"
        receiver = grpc5.spawn(
            "receive", "--endpoint", endpoint, "--group", group, "--topic", topic,
            "--expect", str(GO_COUNT), "--timeout", "60s",
        )  # fmt: skip
        receiver.wait(RUN_TIMEOUT_S)
        assert (receiver.done() or {}).get("ok") is True, receiver.describe()
        assert {e["msgId"] for e in receiver.of("received")} == sent
        assert {a["msgId"] for a in receiver.of("acked") if a["ok"]} == sent
        here, there = clusters[name], clusters[other(name)]
        assert sum(max_offsets(broker(here), topic, QUEUES)) == GO_COUNT
        assert route(there.namesrv_addr, topic) is None
        wait_for(
            f"{group}'s offsets committed on {name}",
            lambda here=here, topic=topic, group=group: (
                sum(committed(broker(here), group, topic, QUEUES)) == GO_COUNT
            ),
            30.0,
            receiver,
        )
        assert max(committed(broker(there), group, topic, QUEUES)) <= 0
