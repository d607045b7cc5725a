"""Several clusters behind one node, over MQTT: paho clients (3.1.1 and 5.0) on an mqproxy node in front of
two stock Apache RocketMQ 5.3 clusters (``two_clusters``: ``east_*`` topics to one, ``west_<hex>`` to the
other) with ``routing.default = "west"``, and on a second node with no default.

MQTT does not follow the routing rules: every MQTT message, its light queues, retained messages and session
state live on the default backend (README "Several clusters" says why). So publishes to ``west_<hex>/...``
and to ``east_<uid>/...`` both land in cluster west, each in the RocketMQ topic of its first level, and the
subscribers of both get them, a subscriber of ``+/+/temp`` (a wildcard first level) too; a retained message
of ``east_<uid>/state`` reaches a later subscriber; cluster east has neither topic. Without a default, MQTT is
refused at CONNECT with a reason naming the rules.
"""

from __future__ import annotations

import queue
import uuid
from collections.abc import Iterator

import pytest

from .cluster_harness import max_offsets, route, wait_for
from .conftest import stock_rocketmq
from .harness import ProxyProcess
from .paho_driver import V5, V311, PahoClient
from .two_clusters import DESCRIBED, broker, routing_node, two_clusters

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

COUNT = 5
LIMIT_S = 60.0
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
    """The node whose default backend (MQTT's) is cluster west."""
    with routing_node(clusters, proxy_bin, tmp_path_factory.mktemp("node"), default="west") as proc:
        yield proc


@pytest.fixture
def clients(node: ProxyProcess, request: pytest.FixtureRequest) -> Iterator[list[PahoClient]]:
    """Every client a test opens (``opened.append``) is closed at teardown."""
    request.node._e2e_proxies = [node]  # a failure's report gets the node's log tail
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
            message = client.get(timeout=LIMIT_S)
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


@pytest.mark.parametrize("protocol", [V311, V5], ids=["v311", "v5"])
def test_mqtt_messages_land_on_the_default_cluster_whatever_the_rules(
    clusters: dict[str, stock_rocketmq.StockCluster],
    node: ProxyProcess,
    clients: list[PahoClient],
    protocol: int,
) -> None:
    uid = uuid.uuid4().hex[:8]
    parents = {"west": f"west_{uid}", "east": f"east_{uid}"}  # the rules send "east_*" to cluster east
    port = _port(node)
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
    for i in range(COUNT):
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
    retained = late.get(timeout=LIMIT_S)
    assert (retained.topic, bytes(retained.payload), retained.retain) == (
        f"{parents['east']}/state",
        b"kept",
        True,
    )

    # each first level is a RocketMQ topic of cluster west (the default), holding its messages;
    # cluster east has neither, though the rules route "east_*" topics of the other protocols there
    west, east = clusters["west"], clusters["east"]
    for parent in parents.values():
        stored = COUNT + (parent == parents["east"])  # and the retained one
        wait_for(
            f"{parent} holds {stored} messages on west",
            lambda p=parent, n=stored: _stored(west, p) == n,
            30.0,
        )
        assert route(east.namesrv_addr, parent) is None


@pytest.fixture(scope="module")
def node_without_default(
    clusters: dict[str, stock_rocketmq.StockCluster], proxy_bin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    with routing_node(clusters, proxy_bin, tmp_path_factory.mktemp("nodefault")) as proc:
        yield proc


def test_mqtt_is_refused_without_a_default_backend(node_without_default: ProxyProcess) -> None:
    client = PahoClient(_port(node_without_default), f"lost-{uuid.uuid4().hex[:8]}", V5, reconnect=False)
    try:
        assert int(getattr(client.rc, "value", client.rc)) == UNSPECIFIED_ERROR
        reason = client.connack_properties.ReasonString
        assert f"MQTT uses routing.default; {DESCRIBED}" in reason
    finally:
        client.paho.loop_stop()
        client.paho.disconnect()
