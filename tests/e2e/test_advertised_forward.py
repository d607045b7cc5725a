"""``[server] advertised_address`` behind a port forward, end to end (apache/rocketmq#8864: behind NAT, Docker
or Kubernetes a proxy that hands clients its internal address breaks every client that follows the route).

A trio forwarder (``forwarder.py``) listens on its own 127.0.0.1 port and relays to mqproxy; mqproxy is
started with ``MQPROXY_SERVER_ADVERTISED_ADDRESS`` = the forwarder's address; every client is given only
the forwarder's address. The Java 4.x remoting client, the Go v2 remoting client, the C++ client (the
Python binding of rocketmq-client-cpp) and the Go 5.x gRPC client send and consume end to end, and every
connection mqproxy accepted came through the forwarder (its ``conn.accepted`` peers are the forwarder's
upstream sockets): a client that could not reach the internal address would have worked too.

The same holds for a cluster-mode node (``backend.kind = "rocketmq"``) in front of a stock RocketMQ.

Without ``advertised_address``, the route answer through the same kind of forwarder names mqproxy's bound
address, and a client given the forwarder's address then connects to mqproxy directly, around the
forwarder: behind a real NAT that connection fails, which is the point of the setting.
"""

from __future__ import annotations

import json
import socket
import struct
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .cluster_harness import node_env
from .conftest import STOCK_BROKER_CONF, Client, ClientRun, ProxyProcess, stock_rocketmq
from .forwarder import Forwarder

pytestmark = pytest.mark.e2e

RUN_TIMEOUT = 120.0
GET_ROUTEINFO_BY_TOPIC = 105


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def remoting_route(address: str, topic: str) -> dict[str, Any]:
    """GET_ROUTEINFO_BY_TOPIC sent to ``address`` (a topic that exists: produce to it first)."""
    header = json.dumps({"code": GET_ROUTEINFO_BY_TOPIC, "language": "JAVA", "version": 401, "opaque": 1,
                         "flag": 0, "extFields": {"topic": topic}}).encode()
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(struct.pack(">ii", 4 + len(header), len(header)) + header)
        raw = b""
        while len(raw) < 4 or len(raw) < 4 + struct.unpack_from(">i", raw)[0]:
            chunk = sock.recv(65536)
            assert chunk, "connection closed before the answer"
            raw += chunk
    total, header_len = struct.unpack_from(">ii", raw)
    header_len &= 0xFFFFFF
    reply = json.loads(raw[8 : 8 + header_len])
    assert reply["code"] == 0, reply
    body: dict[str, Any] = json.loads(raw[8 + header_len : 4 + total])
    return body


def accepted_peers(proxy: ProxyProcess) -> set[str]:
    assert proxy.reader is not None
    return {str(e["peer"]) for e in proxy.reader.events if e.get("event") == "conn.accepted"}


def finished(run: ClientRun, timeout: float = RUN_TIMEOUT) -> ClientRun:
    run.wait(timeout)
    done = run.done()
    assert done is not None, run.describe()
    assert done.get("ok", True) is True, run.describe()
    return run


class Forwarded:
    """mqproxy advertising the forwarder in front of it."""

    def __init__(self, proxy: ProxyProcess, forwarder: Forwarder) -> None:
        self.proxy, self.forwarder = proxy, forwarder

    def assert_all_through_forwarder(self, before: set[str]) -> None:
        new = accepted_peers(self.proxy) - before
        assert new, "no connection reached mqproxy"
        bypassed = new - self.forwarder.upstream_locals
        assert not bypassed, f"connections around the forwarder: {sorted(bypassed)}"


@pytest.fixture(scope="module")
def forwarded(proxy_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forwarded]:
    forwarder = Forwarder()
    base = tmp_path_factory.mktemp("advertised")
    (base / "data").mkdir()
    env = {"MQPROXY_SERVER_ADVERTISED_ADDRESS": forwarder.address}
    proxy = ProxyProcess(proxy_bin, base / "data", base, env)
    proxy.start()
    forwarder.forward_to(str(proxy.address))
    yield Forwarded(proxy, forwarder)
    rc = proxy.stop()
    forwarder.close()
    assert rc == 0, proxy.diagnostics()


def test_routes_and_the_start_event_name_the_forwarder(forwarded: Forwarded) -> None:
    fwd = forwarded.forwarder.address
    assert forwarded.proxy.reader is not None
    started = forwarded.proxy.reader.wait_for(lambda e: e.get("event") == "proxy.started", 5)
    assert started is not None
    assert (started["advertised"], started["listen"]) == (fwd, forwarded.proxy.address)
    route = remoting_route(fwd, "TBW102")
    assert [b["brokerAddrs"] for b in route["brokerDatas"]] == [{"0": fwd}]


def test_java_4x_remoting_client_through_the_forward(
    forwarded: Forwarded, java_driver: Callable[..., Client]
) -> None:
    before = accepted_peers(forwarded.proxy)
    driver = java_driver("remoting", "mqtest.Remoting", ("client4",))
    run = driver.run(forwarded.forwarder.address, f"fw{uuid.uuid4().hex[:8]}", "120", "send", timeout=240)
    done = [e for e in run.of("scenario.done") if e.get("scenario") == "send"]
    assert done, run.describe()
    assert done[-1]["ok"], run.describe()
    read = [e for e in run.of("read") if e.get("scenario") == "send"]
    assert len(read) >= 6, run.describe()  # sync, async, oneway, batch x3 (+ ordered) read back
    forwarded.assert_all_through_forwarder(before)


def test_go_v2_remoting_client_through_the_forward(
    forwarded: Forwarded, go_driver: Callable[[str], Client]
) -> None:
    before = accepted_peers(forwarded.proxy)
    remoting, fwd, topic = go_driver("remoting"), forwarded.forwarder.address, unique("FwGo")
    producer = finished(remoting.spawn("produce", "--namesrv", fwd, "--group", unique("FwGoPG"),
                                       "--topic", topic, "--count", "4", "--body", "fwgo"))
    assert [e["status"] for e in producer.of("sent")] == ["SEND_OK"] * 4, producer.describe()
    # offset message ids carry the store host (a client's viewMessage connects to it): the forwarder
    fwd_port = int(fwd.rsplit(":", 1)[1])
    assert {e["offsetMsgId"][:16] for e in producer.of("sent")} == {f"7F000001{fwd_port:08X}"}
    consumer = finished(remoting.spawn("consume", "--namesrv", fwd, "--group", unique("FwGoCG"),
                                       "--topic", topic, "--expect", "4", "--timeout", "60s"))
    assert sorted(e["body"] for e in consumer.of("received")) == [f"fwgo-{i}" for i in range(4)]
    forwarded.assert_all_through_forwarder(before)


def test_cpp_client_through_the_forward(forwarded: Forwarded, client: Callable[[str], Client]) -> None:
    cpp = client("py044")
    before = accepted_peers(forwarded.proxy)
    fwd, topic = forwarded.forwarder.address, unique("FwCpp")
    produced = cpp.produce(fwd, topic, 3, body="fwcpp", timeout=60)
    assert len(produced.of("sent")) == 3, produced.describe()
    consumed = cpp.consume(fwd, topic, unique("FwCppCG"), 3, timeout=60).wait(90)
    assert len(consumed.of("received")) == 3, consumed.describe()
    forwarded.assert_all_through_forwarder(before)


def test_go_grpc_5x_client_through_the_forward(
    forwarded: Forwarded, go_driver: Callable[[str], Client]
) -> None:
    before = accepted_peers(forwarded.proxy)
    grpc5, fwd, topic = go_driver("grpc5"), forwarded.forwarder.address, unique("FwGrpc")
    sender = finished(grpc5.spawn("send", "--endpoint", fwd, "--topic", topic, "--count", "3", "--tag", "T",
                                  "--key", "k", "--body", "fwg"))
    assert sorted(e["body"] for e in sender.of("sent")) == ["fwg-0", "fwg-1", "fwg-2"], sender.describe()
    receiver = finished(grpc5.spawn("receive", "--endpoint", fwd, "--group", unique("FwGrpcG"),
                                    "--topic", topic, "--expect", "3", "--timeout", "60s"))
    assert sorted(e["body"] for e in receiver.of("received")) == ["fwg-0", "fwg-1", "fwg-2"]
    forwarded.assert_all_through_forwarder(before)


def test_without_advertised_address_clients_go_around_the_forward(
    new_proxy: Callable[..., ProxyProcess], go_driver: Callable[[str], Client]
) -> None:
    proxy = new_proxy()
    forwarder = Forwarder()
    try:
        forwarder.forward_to(str(proxy.address))
        remoting, fwd, topic = go_driver("remoting"), forwarder.address, unique("FwBypass")
        before = accepted_peers(proxy)
        finished(remoting.spawn("produce", "--namesrv", fwd, "--group", unique("FwBypassPG"),
                                "--topic", topic, "--count", "1", "--body", "bypass"))
        route = remoting_route(fwd, topic)
        assert [b["brokerAddrs"] for b in route["brokerDatas"]] == [{"0": proxy.address}]
        assert proxy.address != fwd
        bypassed = accepted_peers(proxy) - before - forwarder.upstream_locals
        assert bypassed, "the client should have connected to the internal address directly"
    finally:
        forwarder.close()


@pytest.fixture
def cluster_node_forwarded(
    proxy_bin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Forwarded]:
    """Cluster mode: an mqproxy node in front of a stock RocketMQ (name server and one broker), advertising
    the forwarder in front of it."""
    workdir = tmp_path_factory.mktemp("advertised-cluster")
    stock = stock_rocketmq.StockCluster(workdir / "stock", brokers=1, broker_conf=STOCK_BROKER_CONF)
    try:
        stock.start()
    except stock_rocketmq.LauncherError as exc:
        pytest.fail(f"stock RocketMQ did not start: {exc}", pytrace=False)
    forwarder = Forwarder()
    (workdir / "node" / "data").mkdir(parents=True)
    env = {**node_env(stock.namesrv_addr), "MQPROXY_SERVER_ADVERTISED_ADDRESS": forwarder.address}
    node = ProxyProcess(proxy_bin, workdir / "node" / "data", workdir / "node", env)
    try:
        node.start()
        forwarder.forward_to(str(node.address))
        yield Forwarded(node, forwarder)
    finally:
        rc = node.stop() if node.proc is not None else 0
        forwarder.close()
        stock.stop()
    assert rc == 0, node.diagnostics()


def test_cluster_node_behind_the_forward(
    cluster_node_forwarded: Forwarded, go_driver: Callable[[str], Client]
) -> None:
    """A cluster-mode node names the forwarder in routes and gRPC endpoints; remoting and gRPC clients
    given only the forwarder send and consume through it."""
    forwarded = cluster_node_forwarded
    before = accepted_peers(forwarded.proxy)
    remoting, grpc5, fwd = go_driver("remoting"), go_driver("grpc5"), forwarded.forwarder.address
    topic = unique("FwNode")
    producer = finished(remoting.spawn("produce", "--namesrv", fwd, "--group", unique("FwNodePG"),
                                       "--topic", topic, "--count", "4", "--body", "fwnode"))
    assert [e["status"] for e in producer.of("sent")] == ["SEND_OK"] * 4, producer.describe()
    route = remoting_route(fwd, topic)
    assert {addr for b in route["brokerDatas"] for addr in b["brokerAddrs"].values()} == {fwd}
    consumer = finished(remoting.spawn("consume", "--namesrv", fwd, "--group", unique("FwNodeCG"),
                                       "--topic", topic, "--expect", "4", "--timeout", "90s"))
    assert sorted(e["body"] for e in consumer.of("received")) == [f"fwnode-{i}" for i in range(4)]
    grpc_topic = unique("FwNodeG")
    sender = finished(grpc5.spawn("send", "--endpoint", fwd, "--topic", grpc_topic, "--count", "2",
                                  "--tag", "T", "--key", "k", "--body", "fwng"))
    assert sorted(e["body"] for e in sender.of("sent")) == ["fwng-0", "fwng-1"], sender.describe()
    receiver = finished(grpc5.spawn("receive", "--endpoint", fwd, "--group", unique("FwNodeGG"),
                                    "--topic", grpc_topic, "--expect", "2", "--timeout", "90s"))
    assert sorted(e["body"] for e in receiver.of("received")) == ["fwng-0", "fwng-1"]
    forwarded.assert_all_through_forwarder(before)


def test_a_host_name_advertised_address(
    new_proxy: Callable[..., ProxyProcess], go_driver: Callable[[str], Client]
) -> None:
    """``localhost:PORT``: routes name the host; message records and offset message ids, which can only carry
    an IP, carry its address (resolved at start-up), so pulls work and ids point at the forwarder."""
    forwarder = Forwarder()
    port = int(forwarder.address.rsplit(":", 1)[1])
    proxy = new_proxy(env={"MQPROXY_SERVER_ADVERTISED_ADDRESS": f"localhost:{port}"})
    try:
        forwarder.forward_to(str(proxy.address))
        forwarded = Forwarded(proxy, forwarder)
        before = accepted_peers(proxy)
        remoting, topic, fwd = go_driver("remoting"), unique("FwName"), forwarder.address
        producer = finished(remoting.spawn("produce", "--namesrv", fwd, "--group", unique("FwNamePG"),
                                           "--topic", topic, "--count", "3", "--body", "fwname"))
        assert {e["offsetMsgId"][:16] for e in producer.of("sent")} == {f"7F000001{port:08X}"}
        route = remoting_route(fwd, topic)
        assert [b["brokerAddrs"] for b in route["brokerDatas"]] == [{"0": f"localhost:{port}"}]
        consumer = finished(remoting.spawn("consume", "--namesrv", fwd, "--group", unique("FwNameCG"),
                                           "--topic", topic, "--expect", "3", "--timeout", "60s"))
        assert sorted(e["body"] for e in consumer.of("received")) == [f"fwname-{i}" for i in range(3)]
        sent_ids = {e["offsetMsgId"] for e in producer.of("sent")}
        assert {e["offsetMsgId"] for e in consumer.of("received")} == sent_ids
        grpc5, grpc_topic = go_driver("grpc5"), unique("FwNameG")  # endpoints with scheme DOMAIN_NAME
        finished(grpc5.spawn("send", "--endpoint", fwd, "--topic", grpc_topic, "--count", "2", "--tag", "T",
                             "--key", "k", "--body", "fwng"))
        receiver = finished(grpc5.spawn("receive", "--endpoint", fwd, "--group", unique("FwNameGG"),
                                        "--topic", grpc_topic, "--expect", "2", "--timeout", "60s"))
        assert sorted(e["body"] for e in receiver.of("received")) == ["fwng-0", "fwng-1"]
        forwarded.assert_all_through_forwarder(before)
    finally:
        forwarder.close()
