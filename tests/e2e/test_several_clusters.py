"""Several clusters behind one node: two stock Apache RocketMQ 5.3 clusters of one broker each, with their
own name servers (``two_clusters``, started once for this module), and mqproxy nodes routing ``east_*``
topics to one and ``west_<hex>`` topics to the other.

* **Remoting**: the Java 4.x client (``ClusterLoads``) produces to a topic of each cluster through a node
  with no default backend and push-consumes both through it.
* **gRPC**: the Java 5.x client (``tests/e2e/java/grpc5/TwoClustersGrpc5.java``): one Producer sends to a
  topic of each cluster; one SimpleConsumer of one group subscribed to both receives and acks every message
  (each topic's first message only when it comes again, its invisible duration changed to 1 s at its first
  delivery). The Go 5.x client (``tests/e2e/go/grpc5``) sends to and receives from a topic of each cluster.
* **MQTT** (paho 3.1.1 and 5.0) on a second node with ``routing.default = "west"``: MQTT does not follow
  the routing rules; every MQTT message, its light queues, retained messages and session state live on
  the default backend (README "Several clusters" says why). Publishes to ``west_<hex>/...`` and
  ``east_<uid>/...`` both land in cluster west, each in the RocketMQ topic of its first level, and reach
  their subscribers (a ``+/+/temp`` one too); a retained message reaches a later subscriber. Without a
  default, MQTT is refused at CONNECT with a reason naming the rules.

Afterwards each cluster's own name server and broker are asked: each topic is routed and stored on its
cluster only, and each group is a member and has its offsets committed there only. A topic no rule covers
is refused (remoting TOPIC_NOT_EXIST, gRPC TOPIC_NOT_FOUND) naming the rules, and the node logs
``backend.unrouted``. The remoting test runs in the e2e tier; the gRPC and MQTT tests are also slow.
"""

from __future__ import annotations

import queue
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from remoting_wire import remoting_exchange  # type: ignore[import-not-found]

from mqproxy.codecs import rocketmq_v2 as pb

from ..grpc_service.conftest import GrpcTestClient  # type: ignore[import-not-found]
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
from .conftest import Client, ClientRun, stock_rocketmq
from .harness import ProxyProcess
from .paho_driver import V5, V311, PahoClient
from .two_clusters import DESCRIBED, broker, committed, consumer_ids, other, routing_node, two_clusters

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

QUEUES = 2
GET_ROUTEINFO_BY_TOPIC = 105
TOPIC_NOT_EXIST = 17
REMOTING_COUNT = 20
REMOTING_LIMIT_S = 90.0
GRPC_COUNT = 10
GO_COUNT = 3
RUN_TIMEOUT_S = 240.0
MQTT_COUNT = 5
MQTT_LIMIT_S = 60.0
#: CONNACK Unspecified error (MQTT 5).
UNSPECIFIED_ERROR = 0x80


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, stock_rocketmq.StockCluster]]:
    with two_clusters(tmp_path_factory) as out:
        yield out


@pytest.fixture(scope="module")
def node(
    clusters: dict[str, stock_rocketmq.StockCluster], proxy_bin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    """The node with no default backend."""
    with routing_node(clusters, proxy_bin, tmp_path_factory.mktemp("node")) as proc:
        yield proc


@pytest.fixture(scope="module")
def west_node(
    clusters: dict[str, stock_rocketmq.StockCluster], proxy_bin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    """The node whose default backend (MQTT's) is cluster west."""
    with routing_node(clusters, proxy_bin, tmp_path_factory.mktemp("westnode"), default="west") as proc:
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
        started(run, REMOTING_LIMIT_S)
    producers = {
        name: loads.produce(address, topic, f"{topic}_pg", count=REMOTING_COUNT, label=f"p-{name}")
        for name, topic in topics.items()
    }
    acked = {}
    for name, run in producers.items():
        run.wait(REMOTING_LIMIT_S)
        acked[name] = sent(run)
        assert len(acked[name]) == REMOTING_COUNT, run.describe()
    for name, run in consumers.items():
        wait_for(
            f"the {name} consumer got every message",
            lambda run=run, name=name: set(acked[name]) <= {m["body"] for m in received(run)},
            REMOTING_LIMIT_S,
            run,
        )
    # consumer groups follow their topics: each is a member of its topic's cluster only
    for name, group in groups.items():
        assert consumer_ids(broker(clusters[name]), group), f"{group} not a member on {name}"
        assert consumer_ids(broker(clusters[other(name)]), group) == [], f"{group} a member on {other(name)}"
    for run in consumers.values():
        finish(run, REMOTING_LIMIT_S)  # shutdown commits the consumers' offsets
    for name, run in consumers.items():
        got = received(run)
        assert {m["body"] for m in got} == set(acked[name])
        assert {m["topic"] for m in got} == {topics[name]}

    # ask each cluster itself: its name server routes its topic only, its broker holds the messages and
    # the group's offsets
    for name, topic in topics.items():
        assert route(clusters[name].namesrv_addr, topic) is not None
        assert route(clusters[other(name)].namesrv_addr, topic) is None
        assert sum(max_offsets(broker(clusters[name]), topic, QUEUES)) == REMOTING_COUNT
        assert sum(committed(broker(clusters[name]), groups[name], topic, QUEUES)) == REMOTING_COUNT
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


def _events(run: ClientRun, event: str, scenario: str) -> list[dict[str, Any]]:
    return [e for e in run.reader.events if e.get("event") == event and e.get("scenario") == scenario]


@pytest.mark.slow
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
    run = driver.spawn(str(node.address), group, str(GRPC_COUNT), unrouted, topics["east"], topics["west"])
    run.name = "TwoClustersGrpc5"
    run.wait(RUN_TIMEOUT_S)

    done = {e["scenario"]: e for e in run.of("scenario.done")}
    assert done.get("routed", {}).get("ok"), run.describe()
    sent = {e["id"]: e["topic"] for e in _events(run, "sent", "routed")}
    assert sorted(sent.values()) == sorted([topics["east"], topics["west"]] * GRPC_COUNT)
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
        assert sum(max_offsets(broker(here), topic, QUEUES)) == GRPC_COUNT
        wait_for(
            f"{group}'s offsets on {topic} committed on {name}",
            lambda here=here, topic=topic: sum(committed(broker(here), group, topic, QUEUES)) == GRPC_COUNT,
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.fixture
def clients(west_node: ProxyProcess, request: pytest.FixtureRequest) -> Iterator[list[PahoClient]]:
    """Every client a test opens (``opened.append``) is closed at teardown."""
    request.node._e2e_proxies = [west_node]  # a failure's report gets the node's log tail
    opened: list[PahoClient] = []
    yield opened
    for client in opened:
        client.paho.loop_stop()
        client.paho.disconnect()


def _port(node: ProxyProcess) -> int:
    return int(str(node.address).rsplit(":", 1)[1])


def _drain(client: PahoClient, count: int) -> list[tuple[str, bytes]]:
    got: list[tuple[str, bytes]] = []
    for _ in range(count):
        try:
            message = client.get(timeout=MQTT_LIMIT_S)
        except queue.Empty:
            raise AssertionError(f"{client.client_id}: {len(got)} of {count} messages arrived") from None
        got.append((message.topic, bytes(message.payload)))
    return got


def _stored(cluster: stock_rocketmq.StockCluster, topic: str) -> int:
    """How many messages the cluster's broker holds in ``topic`` (0 when its name server has no route)."""
    found = route(cluster.namesrv_addr, topic)
    if found is None:
        return 0
    queues = sum(int(q["writeQueueNums"]) for q in found["queueDatas"])
    return sum(max_offsets(broker(cluster), topic, queues))


@pytest.mark.slow
@pytest.mark.parametrize("protocol", [V311, V5], ids=["v311", "v5"])
def test_mqtt_messages_land_on_the_default_cluster_whatever_the_rules(
    clusters: dict[str, stock_rocketmq.StockCluster],
    west_node: ProxyProcess,
    clients: list[PahoClient],
    protocol: int,
) -> None:
    uid = uuid.uuid4().hex[:8]
    parents = {"west": f"west_{uid}", "east": f"east_{uid}"}  # the rules send "east_*" to cluster east
    port = _port(west_node)
    subscriber = PahoClient(port, f"sub-{uid}", protocol)
    clients.append(subscriber)
    assert subscriber.rc == 0
    assert subscriber.subscribe((f"{parents['west']}/#", 1), (f"{parents['east']}/+/temp", 1)) == [1, 1]
    anywhere = PahoClient(port, f"any-{uid}", protocol)  # a filter whose first level is a wildcard
    clients.append(anywhere)
    assert anywhere.subscribe(("+/+/temp", 1)) == [1]
    publisher = PahoClient(port, f"pub-{uid}", protocol)
    clients.append(publisher)
    assert publisher.rc == 0
    sent = []
    for i in range(MQTT_COUNT):
        for name, parent in parents.items():
            topic = f"{parent}/{i}/temp"
            publisher.publish(topic, f"{name}-{i}".encode(), qos=1)
            sent.append((topic, f"{name}-{i}".encode()))
    assert sorted(_drain(subscriber, len(sent))) == sorted(sent)
    assert sorted(_drain(anywhere, len(sent))) == sorted(sent)
    # a retained message of a first level the rules send east is kept (on west) for later subscribers
    publisher.publish(f"{parents['east']}/state", b"kept", qos=1, retain=True)
    late = PahoClient(port, f"late-{uid}", protocol)
    clients.append(late)
    assert late.subscribe((f"{parents['east']}/state", 1)) == [1]
    retained = late.get(timeout=MQTT_LIMIT_S)
    assert (retained.topic, bytes(retained.payload), retained.retain) == (
        f"{parents['east']}/state",
        b"kept",
        True,
    )

    # each first level is a RocketMQ topic of cluster west (the default), holding its messages;
    # cluster east has neither, though the rules route "east_*" topics of the other protocols there
    west, east = clusters["west"], clusters["east"]
    for parent in parents.values():
        stored = MQTT_COUNT + (parent == parents["east"])  # and the retained one
        wait_for(
            f"{parent} holds {stored} messages on west",
            lambda p=parent, n=stored: _stored(west, p) == n,
            30.0,
        )
        assert route(east.namesrv_addr, parent) is None


@pytest.mark.slow
def test_mqtt_is_refused_without_a_default_backend(node: ProxyProcess) -> None:
    client = PahoClient(_port(node), f"lost-{uuid.uuid4().hex[:8]}", V5, reconnect=False)
    try:
        assert int(getattr(client.rc, "value", client.rc)) == UNSPECIFIED_ERROR
        reason = client.connack_properties.ReasonString
        assert f"MQTT uses routing.default; {DESCRIBED}" in reason
    finally:
        client.paho.loop_stop()
        client.paho.disconnect()
