"""Message trace with Apache RocketMQ's ``mqadmin queryMsgTraceById`` (5.3.3) against mqproxy (embedded,
``[trace] enabled``): the proxy writes the trace records, no client has tracing switched on.

* A Java 5.x remoting producer sends and a lite pull consumer consumes and commits (the ``admin-fixture``
  scenario): the first message's trace shows its ``Pub`` row (producer group) and a ``Sub`` row for the
  consumer group (SubAfter: the committed offset passed it).
* A Java 5.x gRPC producer sends and a simple consumer receives and acks (the ``normal`` scenario of
  ``tests/e2e/java/grpc5``): a ``Pub`` row (gRPC has no producer group: empty) and a ``Sub`` row for the
  consumer group.
* The remoting and MQTT paths again against a stock RocketMQ 5.3 (name server + one broker with
  ``traceTopicEnable``) behind an mqproxy node (``backend.kind = "rocketmq"``): the node writes to the
  cluster's ``RMQ_SYS_TRACE_TOPIC`` and ``mqadmin`` asks the stock name server and broker.
* A paho MQTT client publishes at QoS 1 and another, subscribed, gets and acknowledges it: the trace of the
  stored message (its id from ``mqadmin printMsg``: the proxy gave the publish a message id) shows the
  publisher's client id as the ``Pub`` group and the subscriber's as a ``Sub`` group.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator

import pytest

from .cluster_harness import node_env
from .conftest import STOCK_BROKER_CONF, Client, ProxyProcess, stock_rocketmq
from .paho_driver import V311, PahoClient
from .test_java_grpc import UPDATE_AND_CREATE_TOPIC, remoting_request
from .test_java_remoting_admin import split_outputs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

PROXY_ENV = {"MQPROXY_TRACE_ENABLED": "true"}


def rows(output: str, kind: str) -> list[list[str]]:
    """The table rows of ``queryMsgTraceById`` of one type (``Pub`` or ``Sub``): type, group, client
    host, date, time, cost, status."""
    return [line.split() for line in output.splitlines() if line.startswith(f"{kind} ")]


def java_and_mqtt_traffic(
    node: ProxyProcess, java_driver: Callable[..., Client], tag: str
) -> tuple[str, str]:
    """The admin-fixture scenario and one MQTT publish + QoS 1 delivery through ``node``; (run id, the Java
    message id)."""
    run_id = f"tr{tag}"
    fixture = java_driver("remoting", "mqtest.Remoting", ("client5",)).run(
        str(node.address), run_id, "120", "admin-fixture", timeout=180
    )
    assert (fixture.done() or {}).get("ok"), fixture.describe()
    subscriber = PahoClient(node.port, f"trsub-{tag}", V311)
    assert subscriber.rc == 0
    assert subscriber.subscribe((f"tr{tag}/+", 1)) == [1]
    publisher = PahoClient(node.port, f"trpub-{tag}", V311)
    publisher.publish(f"tr{tag}/temp", b"21.5", qos=1)
    assert bytes(subscriber.get(timeout=30).payload) == b"21.5"  # paho PUBACKs it
    publisher.close()
    subscriber.close()
    return run_id, fixture.of("sent")[0]["result"]["msgId"]


def mqtt_message_id(listing: str) -> str:
    """The one message id ``mqadmin printMsg -d false`` lists."""
    ids = re.findall(r"^MSGID: (\S+)", listing, re.MULTILINE)
    assert len(ids) == 1, listing
    return ids[0]


def assert_traces(java_trace: str, mqtt_trace: str, run_id: str, tag: str) -> None:
    (pub,) = rows(java_trace, "Pub")
    assert (pub[1], pub[-1]) == (f"admin_pg_{run_id}", "success"), java_trace
    assert [(s[1], s[-1]) for s in rows(java_trace, "Sub")] == [(f"admin_cg_{run_id}", "success")], java_trace
    (pub,) = rows(mqtt_trace, "Pub")
    assert (pub[1], pub[-1]) == (f"trpub-{tag}", "success"), mqtt_trace
    assert [(s[1], s[-1]) for s in rows(mqtt_trace, "Sub")] == [(f"trsub-{tag}", "success")], mqtt_trace


def test_query_msg_trace_by_id_shows_remoting_and_mqtt_paths(
    proxy: ProxyProcess, java_driver: Callable[..., Client]
) -> None:
    address, tag = str(proxy.address), uuid.uuid4().hex[:8]
    run_id, java_msg_id = java_and_mqtt_traffic(proxy, java_driver, tag)
    mqadmin = java_driver("mqadmin", "mqtest.MqadminBatch", ("server",))
    printed = mqadmin.run("printMsg", "-n", address, "-t", f"tr{tag}", "-d", "false", ";;", timeout=300)
    assert printed.done() is not None, printed.describe()
    mqtt_msg_id = mqtt_message_id(split_outputs(printed, 1)[0])
    traced = mqadmin.run(
        "queryMsgTraceById", "-n", address, "-i", java_msg_id, ";;",
        "queryMsgTraceById", "-n", address, "-i", mqtt_msg_id, ";;",
        timeout=300,
    )  # fmt: skip
    assert traced.done() is not None, traced.describe()
    java_trace, mqtt_trace = split_outputs(traced, 2)
    assert "#ConsumerGroup" in java_trace
    assert_traces(java_trace, mqtt_trace, run_id, tag)


def test_query_msg_trace_by_id_shows_the_grpc_path(
    proxy: ProxyProcess, java_driver: Callable[..., Client]
) -> None:
    address, prefix = str(proxy.address), f"Tr{uuid.uuid4().hex[:6]}"
    ext = {"topic": f"{prefix}Normal", "defaultTopic": "TBW102", "readQueueNums": "4", "writeQueueNums": "4",
           "perm": "6", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false",
           "attributes": "+message.type=NORMAL"}  # fmt: skip
    assert remoting_request(address, UPDATE_AND_CREATE_TOPIC, ext)[0] == 0
    grpc5 = java_driver("grpc5", "mqtest.Grpc5", ("grpc-java",))
    run = grpc5.run(address, "h2c", prefix, "normal", timeout=180)
    assert (run.done() or {}).get("ok"), run.describe()
    sent = [e["id"] for e in run.of("sent")]
    assert len(sent) == 3, run.describe()
    mqadmin = java_driver("mqadmin", "mqtest.MqadminBatch", ("server",))
    traced = mqadmin.run("queryMsgTraceById", "-n", address, "-i", sent[0], ";;", timeout=300)
    assert traced.done() is not None, traced.describe()
    (output,) = split_outputs(traced, 1)
    pubs = [line for line in output.splitlines() if line.startswith("Pub ")]
    assert len(pubs) == 1, output
    assert pubs[0].split()[-1] == "success", output
    assert [(s[1], s[-1]) for s in rows(output, "Sub")] == [(f"{prefix}NormalGroup", "success")], output


@pytest.fixture(scope="module")
def stock_and_node(
    proxy_bin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[stock_rocketmq.StockCluster, ProxyProcess]]:
    workdir = tmp_path_factory.mktemp("trace-cluster")
    conf = {**STOCK_BROKER_CONF, "traceTopicEnable": "true"}
    stock = stock_rocketmq.StockCluster(workdir / "stock", brokers=1, broker_conf=conf)
    try:
        stock.start()
    except stock_rocketmq.LauncherError as exc:
        pytest.fail(f"stock RocketMQ did not start: {exc}", pytrace=False)
    (workdir / "node" / "data").mkdir(parents=True)
    node = ProxyProcess(
        proxy_bin, workdir / "node" / "data", workdir / "node", {**node_env(stock.namesrv_addr), **PROXY_ENV}
    )
    try:
        node.start()
        yield stock, node
    finally:
        rc = node.stop() if node.proc is not None else 0
        stock.stop()
    assert rc == 0, node.diagnostics()


def test_cluster_trace_is_written_to_the_clusters_trace_topic(
    stock_and_node: tuple[stock_rocketmq.StockCluster, ProxyProcess], java_driver: Callable[..., Client]
) -> None:
    stock, node = stock_and_node
    tag = uuid.uuid4().hex[:8]
    run_id, java_msg_id = java_and_mqtt_traffic(node, java_driver, tag)
    printed = stock.mqadmin("printMsg", "-t", f"tr{tag}", "-d", "false", timeout=120)
    assert printed.returncode == 0, f"{printed.stdout}\n{printed.stderr}"
    mqtt_msg_id = mqtt_message_id(printed.stdout)
    outputs = []
    for msg_id in (java_msg_id, mqtt_msg_id):
        done = stock.mqadmin("queryMsgTraceById", "-i", msg_id, timeout=120)
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    assert_traces(outputs[0], outputs[1], run_id, tag)
