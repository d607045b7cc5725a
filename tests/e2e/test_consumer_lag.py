"""Consumer lag on ``/metrics`` equals what Apache RocketMQ's ``mqadmin consumerProgress`` (5.3.3) reports,
per queue (broker offset, consumer offset, diff) and as the group's "Consume Diff Total".

The group and its backlog come from the Java 5.x remoting client's ``admin-fixture`` scenario (5 messages
sent, 3 committed, 2 pulled but not committed). Two set-ups, one at a time:

* embedded: mqproxy with its own store; mqadmin is pointed at mqproxy.
* cluster: an mqproxy node (``backend.kind = "rocketmq"``) in front of a stock RocketMQ 5.3 (name server and
  one broker, no RocketMQ proxy); the client goes through the node, mqadmin asks the stock name server and
  broker directly, and the node's figures (which it asks the broker for: GET_CONSUME_STATS) must match.

``metrics.lag_refresh_s = 0`` so a scrape reads the current figures. In cluster mode an MQTT session's
backlog on its light message queues shows as one ``%LMQ%`` series of its group.
"""

from __future__ import annotations

import re
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ..conftest import wait_until_sync  # type: ignore[import-not-found,misc]
from .cluster_harness import node_env
from .conftest import STOCK_BROKER_CONF, Client, ProxyProcess, stock_rocketmq
from .paho_driver import V311, PahoClient

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

PROXY_ENV = {"MQPROXY_METRICS_LAG_REFRESH_S": "0"}
NUMBER = re.compile(r"-?\d+")
QueueKey = tuple[str, str, int]  # topic, broker, queue id
LMQ = "%LMQ%"


@dataclass
class Progress:
    """One group's figures: per queue (broker offset, consumer offset, diff), and the total diff."""

    queues: dict[QueueKey, tuple[int, int, int]]
    total: int


def mqadmin_progress(output: str) -> Progress:
    """The rows of ``mqadmin consumerProgress -g G`` (no -s: topic, broker, qid, broker offset, consumer
    offset, diff, ...) and its "Consume Diff Total"."""
    queues: dict[QueueKey, tuple[int, int, int]] = {}
    for line in output.splitlines():
        cells = line.split()
        if len(cells) >= 6 and not cells[0].startswith("#") and all(NUMBER.fullmatch(c) for c in cells[2:6]):
            broker_offset, consumer_offset, diff = int(cells[3]), int(cells[4]), int(cells[5])
            queues[(cells[0], cells[1], int(cells[2]))] = (broker_offset, consumer_offset, diff)
    found = re.search(r"^Consume Diff Total:\s*(-?\d+)", output, re.MULTILINE)
    assert found is not None, output
    return Progress(queues, int(found.group(1)))


def metrics_progress(address: str, group: str) -> Progress:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as response:
        text = response.read().decode()
    values: dict[str, dict[QueueKey, int]] = {}
    total = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if labels.get("group") != group:
                continue
            if sample.name == "mqproxy_consumer_group_lag_messages":
                total = int(sample.value)
            elif sample.name.startswith("mqproxy_consumer_queue_"):
                key = (labels["topic"], labels["broker"], int(labels["queue"]))
                values.setdefault(sample.name, {})[key] = int(sample.value)
    assert total is not None, f"no mqproxy_consumer_group_lag_messages for {group}:\n{text}"
    broker = values.get("mqproxy_consumer_queue_broker_offset", {})
    consumer = values.get("mqproxy_consumer_queue_consumer_offset", {})
    lag = values.get("mqproxy_consumer_queue_lag_messages", {})
    assert broker.keys() == consumer.keys() == lag.keys()
    return Progress({k: (broker[k], consumer[k], lag[k]) for k in broker}, total)


def admin_fixture(java_driver: Callable[..., Client], namesrv: str) -> tuple[str, str]:
    """Run the fixture scenario through ``namesrv``; (topic, group) with the backlog."""
    run_id = f"lag{uuid.uuid4().hex[:8]}"
    driver = java_driver("remoting", "mqtest.Remoting", ("client5",))
    run = driver.run(namesrv, run_id, "120", "admin-fixture", timeout=180)
    assert (run.done() or {}).get("ok"), run.describe()
    assert len(run.of("sent")) == 5, run.describe()
    return f"admin_{run_id}", f"admin_cg_{run_id}"


def assert_equal_with_backlog(ours: Progress, theirs: Progress, topic: str) -> None:
    assert theirs.queues, "mqadmin printed no queue"
    assert ours.queues == theirs.queues
    assert ours.total == theirs.total
    assert theirs.queues[next(k for k in theirs.queues if k[0] == topic)][2] > 0  # a real backlog
    assert theirs.total >= 2


def test_embedded_lag_equals_mqadmin_consumer_progress(
    proxy: ProxyProcess, java_driver: Callable[..., Client]
) -> None:
    address = str(proxy.address)
    topic, group = admin_fixture(java_driver, address)
    run = java_driver("mqadmin", "mqtest.MqadminBatch", ("server",)).run(
        "consumerProgress", "-n", address, "-g", group, ";;", timeout=300)
    assert run.done() is not None, run.describe()
    theirs = mqadmin_progress("\n".join(run.reader.lines))
    assert_equal_with_backlog(metrics_progress(address, group), theirs, topic)
    assert theirs.queues[(topic, "broker-a", 0)] == (5, 3, 2)


@pytest.fixture(scope="module")
def stock_and_node(
    proxy_bin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[stock_rocketmq.StockCluster, ProxyProcess]]:
    workdir = tmp_path_factory.mktemp("lag-cluster")
    stock = stock_rocketmq.StockCluster(workdir / "stock", brokers=1, broker_conf=STOCK_BROKER_CONF)
    try:
        stock.start()
    except stock_rocketmq.LauncherError as exc:
        pytest.fail(f"stock RocketMQ did not start: {exc}", pytrace=False)
    (workdir / "node" / "data").mkdir(parents=True)
    node = ProxyProcess(proxy_bin, workdir / "node" / "data", workdir / "node",
                        {**node_env(stock.namesrv_addr), **PROXY_ENV})
    try:
        node.start()
        yield stock, node
    finally:
        rc = node.stop() if node.proc is not None else 0
        stock.stop()
    assert rc == 0, node.diagnostics()


def test_cluster_lag_equals_mqadmin_against_the_brokers(
    stock_and_node: tuple[stock_rocketmq.StockCluster, ProxyProcess], java_driver: Callable[..., Client]
) -> None:
    stock, node = stock_and_node
    topic, group = admin_fixture(java_driver, str(node.address))
    done = stock.mqadmin("consumerProgress", "-g", group, timeout=120)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    theirs = mqadmin_progress(done.stdout)
    ours = metrics_progress(str(node.address), group)
    assert_equal_with_backlog(ours, theirs, topic)
    assert {broker for _, broker, _ in theirs.queues} <= {b.name for b in stock.broker_list}


def test_cluster_lmq_queues_are_summed_never_one_series_each(
    stock_and_node: tuple[stock_rocketmq.StockCluster, ProxyProcess],
) -> None:
    """MQTT sessions consume light message queues (one per MQTT topic): whatever the brokers report of them
    is summed per group under ``topic="%LMQ%"``; no series names an LMQ."""
    _, node = stock_and_node
    port, tag = node.port, uuid.uuid4().hex[:8]
    device = PahoClient(port, f"lagdev-{tag}", V311, clean=False)
    assert device.rc == 0
    assert device.subscribe((f"lag/{tag}/+", 1)) == [1]
    publisher = PahoClient(port, f"lagpub-{tag}", V311)
    publisher.publish(f"lag/{tag}/0", b"first", qos=1)
    assert bytes(device.get(timeout=30).payload) == b"first"
    device.close()  # offline with a persistent session: what follows is its backlog
    for i in range(6):
        publisher.publish(f"lag/{tag}/{i % 3}", f"m{i}".encode(), qos=1)
    publisher.close()
    seen: list[dict[tuple[str, str | None], float]] = []

    def settled() -> bool:
        with urllib.request.urlopen(f"http://{node.address}/metrics", timeout=30) as response:
            samples = [s for f in text_string_to_metric_families(response.read().decode()) for s in f.samples]
        named = [s for s in samples if s.labels.get("topic", "").startswith(LMQ) and s.labels["topic"] != LMQ]
        assert not named, named
        seen.append({(s.name, s.labels.get("topic")): s.value for s in samples
                     if s.labels.get("group", "").endswith(f"lagdev-{tag}")})
        return seen[-1] == expected

    # the session acknowledged 1 of the 7 messages on its light queues (one per MQTT topic, 3 of them)
    expected = {
        ("mqproxy_consumer_lag_messages", LMQ): 6.0,
        ("mqproxy_consumer_group_lag_messages", None): 6.0,
    }
    try:
        wait_until_sync(settled, 30, poll_s=0.5)
    except AssertionError:
        pytest.fail(f"lag of the session's group: {seen[-1]}, expected {expected}")
