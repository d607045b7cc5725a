"""The Go RocketMQ clients, against mqproxy and against the stock Apache RocketMQ in the same module.

* ``github.com/apache/rocketmq-client-go/v2`` (remoting, driver ``tests/e2e/go/remoting``): sync send with
  tags, keys and user properties; push consumers with TAG selectors (each group gets exactly its tags);
  a transaction producer whose local transactions commit, roll back and stay unknown, the unknown one
  resolved to commit by the broker's check-back.
* ``github.com/apache/rocketmq-clients/golang/v5`` (gRPC, driver ``tests/e2e/go/grpc5``): send (normal,
  FIFO with a message group, delayed to a timestamp with a recall handle) and SimpleConsumer
  receive/ack, and ChangeInvisibleDuration with the redelivery it causes.

Every test runs once per ``target`` (mqproxy's one port, or the stock name server / RocketMQ's proxy),
with the same assertions, so a divergence fails the comparison. Where the stock side behaves
differently on its own account, the test says so explicitly (``STOCK:`` comments). The drivers are built
with ``go build`` at test time (``go_driver`` fixture, ``scripts/go_drivers.py``).

Stock set-up the clients cannot do themselves: RocketMQ's proxy answers QueryRoute of an unknown topic
with TOPIC_NOT_FOUND and checks the topic's ``message.type`` against what is sent, so the gRPC topics are
created with mqadmin (one JVM for all) before the first client; mqproxy creates topics on first use and
accepts every message type on any topic. Remoting topics are auto-created by both on first send.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from .conftest import Client, ClientRun, Target  # type: ignore[import-not-found]

pytestmark = pytest.mark.e2e

#: Failure deadlines (seconds) for one driver run; nothing waits for them to pass.
RUN_TIMEOUT = 90.0
OFFSET_MSG_ID = re.compile(r"[0-9A-F]{32}")


@dataclass(frozen=True)
class Topics:
    """The gRPC topics of one target (created with their message type on the stock side)."""

    normal: str
    fifo: str
    delay: str


@pytest.fixture(scope="module")
def remoting(go_driver: Callable[[str], Client]) -> Client:
    return go_driver("remoting")


@pytest.fixture(scope="module")
def grpc5(go_driver: Callable[[str], Client]) -> Client:
    return go_driver("grpc5")


def unique(prefix: str, target: Target) -> str:
    return f"{prefix}_{target.name}_{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def grpc_topics(target: Target, tmp_path_factory: pytest.TempPathFactory) -> Topics:
    topics = Topics(unique("GoGrpc", target), unique("GoFifo", target), unique("GoDelay", target))
    if target.cluster is not None:
        # STOCK: RocketMQ's proxy neither creates topics on QueryRoute nor sends a FIFO/DELAY message to
        # a topic of another message.type, so the topics exist, typed, before any client asks for them.
        kinds = ((topics.normal, "NORMAL"), (topics.fifo, "FIFO"), (topics.delay, "DELAY"))
        configs = [{"topicName": name, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6,
                    "attributes": {"+message.type": kind}} for name, kind in kinds]
        path = tmp_path_factory.mktemp("go-topics") / "topics.json"
        path.write_text(json.dumps(configs))
        done = target.mqadmin("updateTopicList", "-c", target.cluster.cluster_name, "-f", str(path))
        assert "success" in done.stdout, f"mqadmin updateTopicList failed:\n{done.stdout}\n{done.stderr}"
        for name in (topics.normal, topics.fifo, topics.delay):
            target.cluster.wait_route(name)
    return topics


def finished(run: ClientRun, timeout: float = RUN_TIMEOUT) -> ClientRun:
    """Wait for a driver and require its final ``done`` event to say ok."""
    run.wait(timeout)
    done = run.done()
    assert done is not None, run.describe()
    assert done.get("ok") is True, run.describe()
    assert run.returncode == 0, run.describe()
    return run


def by_body(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["body"]: e for e in events}


# ---------------------------------------------------------------------------------------- remoting (v2)


def test_remoting_send_and_tag_filtered_push_consumers(target: Target, remoting: Client) -> None:
    topic = unique("GoTags", target)
    count, tags = 9, ("TagA", "TagB", "TagC")
    producer = finished(remoting.spawn(
        "produce", "--namesrv", target.namesrv, "--group", unique("GoPG", target), "--topic", topic,
        "--count", str(count), "--tags", ",".join(tags), "--key", "gokey", "--body", "gobody",
        "--prop", "color=red", "--prop", "shape=round"))
    sent = producer.of("sent")
    assert [e["i"] for e in sent] == list(range(count)), producer.describe()
    for e in sent:
        assert e["status"] == "SEND_OK"
        assert e["topic"] == topic
        assert OFFSET_MSG_ID.fullmatch(e["offsetMsgId"]), e
        assert e["transactionId"] == e["msgId"]  # the UNIQ_KEY
        assert (e["region"], e["traceOn"]) == ("DefaultRegion", True)
    assert len({e["msgId"] for e in sent}) == count
    assert len({e["offsetMsgId"] for e in sent}) == count
    per_queue = Counter(e["queue"] for e in sent)
    assert sorted((e["queue"], e["offset"]) for e in sent) == sorted(
        (q, o) for q, n in per_queue.items() for o in range(n)), "queue offsets are not 0..n-1 per queue"

    # two groups, each with its own selector, read the same topic at the same time
    def consumer(group: str, selector: str, expect: int) -> ClientRun:
        return remoting.spawn("consume", "--namesrv", target.namesrv, "--group", unique(group, target),
                              "--topic", topic, "--selector", selector, "--expect", str(expect),
                              "--timeout", "60s")

    a_or_c, only_b = consumer("GoAC", "TagA || TagC", 6), consumer("GoB", "TagB", 3)
    finished(a_or_c)
    finished(only_b)

    sent_by_body = by_body(sent)
    for run, wanted in ((a_or_c, {"TagA", "TagC"}), (only_b, {"TagB"})):
        got = run.of("received")
        bodies = [e["body"] for e in got]
        expected = {f"gobody-{i}" for i in range(count) if tags[i % 3] in wanted}
        assert sorted(bodies) == sorted(expected), f"{wanted}: {bodies}"  # each once, no other tag
        for e in got:
            i = int(e["body"].rsplit("-", 1)[1])
            s = sent_by_body[e["body"]]
            assert e["topic"] == topic
            assert e["tags"] == tags[i % 3]
            assert e["keys"] == [f"gokey-{i}", "gokey"]
            assert (e["msgId"], e["offsetMsgId"]) == (s["msgId"], s["offsetMsgId"])
            assert (e["queue"], e["offset"]) == (s["queue"], s["offset"])
            assert e["reconsumeTimes"] == 0
            assert e["sysFlag"] == 0
            assert e["bornHost"].startswith("127.0.0.1:")
            props = e["props"]
            # the client adds MIN/MAX_OFFSET and CONSUME_START_TIME; the broker's send path stamps its
            # cluster, region and trace switch (mqproxy as the stock broker does)
            cluster = target.cluster.cluster_name if target.cluster is not None else "DefaultCluster"
            stamped = {"CLUSTER": cluster, "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
            expected_keys = {"color", "shape", "TAGS", "KEYS", "UNIQ_KEY", "MIN_OFFSET", "MAX_OFFSET",
                             "CONSUME_START_TIME"} | stamped.keys()
            assert {k: props[k] for k in stamped} == stamped
            assert set(props) == expected_keys
            assert (props["color"], props["shape"]) == ("red", "round")
            assert props["TAGS"] == tags[i % 3]
            assert (props["KEYS"], props["UNIQ_KEY"]) == (f"gokey-{i} gokey", s["msgId"])


def test_remoting_transaction_commit_rollback_and_check_back(target: Target, remoting: Client) -> None:
    topic, group = unique("GoTx", target), unique("GoTxPG", target)
    run = finished(remoting.spawn("transaction", "--namesrv", target.namesrv, "--group", group,
                                  "--topic", topic, "--timeout", "75s"), timeout=RUN_TIMEOUT)
    sent = by_body(run.of("sent"))
    assert {b: (e["status"], e["state"]) for b, e in sent.items()} == {
        "tx-commit": ("SEND_OK", "COMMIT"), "tx-rollback": ("SEND_OK", "ROLLBACK"),
        "tx-unknown": ("SEND_OK", "UNKNOWN")}, run.describe()
    assert {e["queue"] for e in sent.values()} == {0}  # the driver sends to the lowest queue id

    checked = run.of("checked")
    unknown_checks = [e for e in checked if e["body"] == "tx-unknown"]
    assert unknown_checks, run.describe()
    check = unknown_checks[0]
    assert check["state"] == "COMMIT"
    assert check["topic"] == topic  # the real topic, not the half topic
    assert check["transactionId"] == check["msgId"] == sent["tx-unknown"]["msgId"]
    assert (check["tags"], check["keys"]) == ("TagTx", ["tx-unknown-key"])
    assert check["props"]["scenario"] == "transaction"
    assert (check["props"]["PGROUP"], check["props"]["TRAN_MSG"]) == (group, "true")

    received = run.of("received")
    delivered = [e["body"] for e in received]
    assert "tx-rollback" not in delivered, run.describe()
    if target.name == "mqproxy":
        # only the open transaction is checked, and each committed message is delivered once
        assert [e["body"] for e in checked] == ["tx-unknown"], run.describe()
        assert sorted(delivered) == ["tx-commit", "tx-unknown"], run.describe()
    else:
        # STOCK: the broker writes the op record of an END_TRANSACTION in batches (transactionOpBatchInterval,
        # 3 s) while this session's broker checks every 2 s after 1 s (transactionTimeOut=1000), so it may
        # check transactions that are already resolved; the producer answers COMMIT again and the broker
        # stores the committed message a second time (seen: tx-commit delivered twice, tx-commit and
        # tx-rollback checked). The same can happen to a commit the check-back itself caused.
        assert set(delivered) == {"tx-commit", "tx-unknown"}, run.describe()
    for e in received:
        props = e["props"]
        assert e["sysFlag"] & 0xC == 0x8  # TRANSACTION_COMMIT_TYPE
        # TRAN_MSG stays on the committed message: consumers take the transaction id from UNIQ_KEY
        assert props["TRAN_MSG"] == "true"
        assert e["transactionId"] == e["msgId"] == sent[e["body"]]["msgId"]
        assert (props["PGROUP"], props["scenario"], props["TAGS"]) == (group, "transaction", "TagTx")
        # TRAN_PREPARED_QUEUE_OFFSET is not compared: mqproxy stores it on every committed message, the
        # stock broker only on half messages it put back while checking them
        if target.name == "stock":
            # STOCK: the broker means to drop REAL_TOPIC/REAL_QID from the committed message but removes
            # them only after serialising its properties, so they are still stored.
            assert (props["REAL_TOPIC"], props["REAL_QID"]) == (topic, "0")
        else:
            assert "REAL_TOPIC" not in props
            assert "REAL_QID" not in props


# ------------------------------------------------------------------------------------------- gRPC (v5)


def test_grpc_send_receive_ack_and_change_invisible_duration(
    target: Target, grpc5: Client, grpc_topics: Topics
) -> None:
    topic = grpc_topics.normal
    sender = finished(grpc5.spawn("send", "--endpoint", target.grpc, "--topic", topic, "--count", "3",
                                  "--tag", "TagG", "--key", "gk", "--body", "gb", "--prop", "color=blue"))
    sent = by_body(sender.of("sent"))
    assert sorted(sent) == ["gb-0", "gb-1", "gb-2"], sender.describe()
    assert all(e["transactionId"] == e["msgId"] and e["recallHandle"] == "" for e in sent.values())

    plain = grpc5.spawn("receive", "--endpoint", target.grpc, "--group", unique("GoSimple", target),
                        "--topic", topic, "--expect", "3", "--timeout", "60s")
    changing = grpc5.spawn("receive", "--endpoint", target.grpc, "--group", unique("GoInvisible", target),
                           "--topic", topic, "--expect", "3", "--change-invisible", "1s", "--timeout", "75s")
    finished(plain)
    finished(changing)

    got = plain.of("received")
    assert sorted(e["body"] for e in got) == ["gb-0", "gb-1", "gb-2"], plain.describe()
    for e in got:
        i = e["body"][-1]
        assert e["msgId"] == sent[e["body"]]["msgId"]
        assert (e["topic"], e["tag"], e["keys"]) == (topic, "TagG", [f"gk-{i}", "gk"])
        assert e["props"] == {"color": "blue"}  # user properties only
        assert (e["deliveryAttempt"], e["messageGroup"], e["deliveryTimestamp"]) == (1, None, None)
        assert e["bornHost"] == socket.gethostname()  # what the producer declared, not its address
    assert [a["ok"] for a in plain.of("acked")] == [True] * 3

    # every first delivery has its invisible duration changed instead of an ack; it comes again, acked
    changed = changing.of("changed")
    sent_ids = sorted(e["msgId"] for e in sent.values())
    assert sorted(c["msgId"] for c in changed) == sent_ids, changing.describe()
    assert all(c["ok"] for c in changed), changing.describe()
    attempts = Counter((e["msgId"], e["deliveryAttempt"]) for e in changing.of("received"))
    for e in sent.values():
        assert attempts[(e["msgId"], 1)] == 1, attempts
        assert attempts[(e["msgId"], 2)] == 1, attempts
    acked = changing.of("acked")
    assert sorted(a["msgId"] for a in acked) == sent_ids
    assert all(a["ok"] for a in acked)


def decode_recall_handle(handle: str) -> list[str]:
    return base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)).decode().split(" ")


def test_grpc_fifo_and_delayed_messages(target: Target, grpc5: Client, grpc_topics: Topics) -> None:
    fifo = finished(grpc5.spawn("send", "--endpoint", target.grpc, "--topic", grpc_topics.fifo,
                                "--count", "4", "--tag", "TagF", "--key", "fk", "--body", "fb",
                                "--message-group", "orders-1"))
    delayed = finished(grpc5.spawn("send", "--endpoint", target.grpc, "--topic", grpc_topics.delay,
                                   "--count", "1", "--tag", "TagD", "--key", "dk", "--body", "db",
                                   "--delay", "2s"))
    fifo_rx = grpc5.spawn("receive", "--endpoint", target.grpc, "--group", unique("GoFifoG", target),
                          "--topic", grpc_topics.fifo, "--expect", "4", "--timeout", "60s")
    delay_rx = grpc5.spawn("receive", "--endpoint", target.grpc, "--group", unique("GoDelayG", target),
                           "--topic", grpc_topics.delay, "--expect", "1", "--timeout", "60s")
    finished(fifo_rx)
    finished(delay_rx)

    # FIFO: one message group hashes to one queue, so the queue offsets are consecutive in send order
    sent = fifo.of("sent")
    assert [e["body"] for e in sent] == ["fb-0", "fb-1", "fb-2", "fb-3"], fifo.describe()
    offsets = [e["offset"] for e in sent]
    assert offsets == list(range(offsets[0], offsets[0] + 4)), offsets
    got = by_body(fifo_rx.of("received"))
    assert sorted(got) == ["fb-0", "fb-1", "fb-2", "fb-3"], fifo_rx.describe()
    for e in sent:
        r = got[e["body"]]
        assert (r["msgId"], r["offset"]) == (e["msgId"], e["offset"])
        assert (r["messageGroup"], r["tag"]) == ("orders-1", "TagF")
        if target.name == "stock":
            # STOCK: RocketMQ's proxy hands its internal sharding-key property to the client as a user
            # property
            assert r["props"] == {"__SHARDINGKEY": "orders-1"}
        else:
            assert not r["props"]

    # delay: delivered with the delivery timestamp it was sent with; the recall handle is RocketMQ's v1
    (d,) = delayed.of("sent")
    (r,) = delay_rx.of("received")
    assert (r["msgId"], r["body"], r["tag"]) == (d["msgId"], "db-0", "TagD")
    assert r["deliveryTimestamp"] == d["deliverAt"]
    assert r["messageGroup"] is None
    version, topic, broker, at_ms, msg_id = decode_recall_handle(d["recallHandle"])
    assert (version, topic, broker, msg_id) == ("v1", grpc_topics.delay, "broker-a", d["msgId"])
    assert at_ms.isdigit()
