"""Cluster mode with the other remoting clients: PyPI ``rocketmq`` 0.4.4 (C++ core 1.x, ``py044``),
``rocketmq-python-cvs`` (C++ core 2.1, ``pycvs``), npm ``ali-ons`` (``alions``) and the Go
``rocketmq-client-go/v2``, through two mqproxy nodes (A and B) in front of a stock Apache RocketMQ 5.3
cluster of two brokers (this module's own).

Each client produces 20 messages with a tag, keys and user properties through node A, and a push consumer
of a new group reads them through node B: every message arrives once and unchanged, and the brokers hold
them on both brokers' queues (a topic's virtual queues span both). The C++ and ali-ons clients then send a
second batch through B, and the group's next consumer, on A, reads that batch only: offsets committed
through one node live on the brokers and are honoured through the other. Drivers and content checks are
those of ``test_remoting_clients.py`` (C++, ali-ons) and of the Go driver ``tests/e2e/go/remoting``.
A new group of the C++ cores and ali-ons starts at offset 0 because the stock broker, as mqproxy, answers
QUERY_CONSUMER_OFFSET of an unknown group on a queue that still holds offset 0 with ``offset=0``.

Message ids: the C++ cores and the Go client show UNIQ_KEY, the same through any node. ali-ons shows (and
Go reports as ``offsetMsgId``) the offset message id, which names the node that served the message
(README, Cluster mode): the producer's names A, the consumer's names B, with the same commit-log offset.

Client quirks: the C++ cores commit offsets on a 5 s timer only and the drivers never shut them down (the
2.1 core segfaults in shutdown; exit status -11/139 is accepted for it), so their first consumer stays
6.5 s. The Go consumer is not checked for resuming: it leaves without committing its last offsets (its
offset timer first runs after 10 s, and no UPDATE_CONSUMER_OFFSET reaches even the embedded proxy when it
shuts down), so its group's next consumer re-reads part of the batch on any server.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from . import test_remoting_clients as embedded
from .cluster_harness import ClusterMode, create_topic, max_offsets
from .conftest import Client
from .harness import ClientRun

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

QUEUES = 4  # per broker: a topic has 8 virtual queues, half on each broker
COUNT = embedded.COUNT
#: Failure deadline of one driver run (they end on conditions, usually within seconds).
LIMIT_S = 60.0


@pytest.fixture(autouse=True)
def _node_logs(rmq: ClusterMode, request: pytest.FixtureRequest) -> None:
    """A failed test's report gets the log tails of the nodes (conftest's pytest_runtest_makereport)."""
    request.node._e2e_proxies = list(rmq.nodes.values())


def new_topic(rmq: ClusterMode, label: str) -> tuple[str, str]:
    """A topic with ``QUEUES`` queues on each broker, and a consumer group nobody used."""
    uid = uuid.uuid4().hex[:8]
    topic = f"{label}_{uid}"
    create_topic(rmq, topic, QUEUES)
    return topic, f"{label}_cg_{uid}"


def offset_msg_id(msg_id: str) -> tuple[str, int]:
    """An offset message id (store host + commit-log offset, 32 hex digits) as ``("ip:port", offset)``."""
    assert len(msg_id) == 32, msg_id
    ip = ".".join(str(int(msg_id[i : i + 2], 16)) for i in range(0, 8, 2))
    return f"{ip}:{int(msg_id[8:16], 16)}", int(msg_id[16:], 16)


def assert_on_both_brokers(rmq: ClusterMode, topic: str) -> None:
    """The brokers hold ``COUNT`` messages of ``topic``, some on each."""
    stored = [sum(max_offsets(b.addr, topic, QUEUES)) for b in rmq.stock.broker_list]
    assert sum(stored) == COUNT, stored
    assert min(stored) > 0, stored


@pytest.mark.parametrize("name", embedded.CLIENTS)
def test_produce_through_a_consume_through_b_and_resume_through_a(
    rmq: ClusterMode, client: Callable[[str], Client], name: str
) -> None:
    """Then a second batch sent through B is read through A by the group's next consumer, which starts
    where the first one's offsets (committed through B, kept by the brokers) say."""
    cli = client(name)
    topic, group = new_topic(rmq, f"cc_{name}")
    # the C++ cores commit offsets on a 5 s timer only: their first consumer stays that long
    linger = embedded.CPP_COMMIT_WAIT if name in embedded.CPP else 1.0

    acks = embedded.send_batch(cli, rmq.addr("A"), topic)
    assert_on_both_brokers(rmq, topic)
    run = cli.consume(rmq.addr("B"), topic, group, COUNT, timeout=LIMIT_S, linger=linger,
                      prop_keys=embedded.PROP_KEYS)
    received = embedded.finished(cli, run, timeout=LIMIT_S + 15)

    assert len(received) == COUNT, f"redelivered within one consumer:\n{run.describe()}"
    embedded.assert_content(received, embedded.expected_messages(topic, name, 0, COUNT))
    if name in embedded.CPP:  # the C++ cores' ids are UNIQ_KEY, the same whichever node serves them
        assert {e["msg_id"] for e in received} == {a["msg_id"] for a in acks}
    else:  # ali-ons shows offset ids, which name the node that served the message (README, Cluster mode)
        assert_same_messages_named_by_node(rmq, [a["msg_id"] for a in acks], [e["msg_id"] for e in received])
    assert len({(e["queue_id"], e["queue_offset"]) for e in received}) == COUNT, "two messages share a slot"
    assert {e["queue_id"] for e in received} <= set(range(2 * QUEUES))

    embedded.send_batch(cli, rmq.addr("B"), topic, start=COUNT)
    run = cli.consume(rmq.addr("A"), topic, group, COUNT, timeout=LIMIT_S, linger=1.5,
                      prop_keys=embedded.PROP_KEYS)
    second = embedded.finished(cli, run, timeout=LIMIT_S + 15)
    assert embedded.seqs_of(second) == list(range(COUNT, 2 * COUNT)), "the next consumer re-read batch 1"
    embedded.assert_content(second, embedded.expected_messages(topic, name, COUNT, COUNT))


def assert_same_messages_named_by_node(rmq: ClusterMode, sent: list[str], received: list[str]) -> None:
    """The offset ids a producer was given through A and its consumer saw through B: the same commit-log
    offsets (packed with the broker's index), with the store host of the node that served each side."""
    acked, seen = [offset_msg_id(i) for i in sent], [offset_msg_id(i) for i in received]
    assert sorted(o for _, o in acked) == sorted(o for _, o in seen)
    assert {h for h, _ in acked} == {rmq.addr("A")}
    assert {h for h, _ in seen} == {rmq.addr("B")}


# ------------------------------------------------------------------------------------------------- Go


@pytest.fixture(scope="module")
def go_remoting(go_driver: Callable[[str], Client]) -> Client:
    return go_driver("remoting")


def go_finished(run: ClientRun, timeout: float = LIMIT_S + 15) -> ClientRun:
    """Wait for a Go driver and require its final ``done`` event to say ok."""
    run.wait(timeout)
    done = run.done()
    assert done is not None, run.describe()
    assert done.get("ok") is True, run.describe()
    assert run.returncode == 0, run.describe()
    return run


def test_go_produces_through_a_and_consumes_through_b(rmq: ClusterMode, go_remoting: Client) -> None:
    topic, group = new_topic(rmq, "cc_go")
    tags = ("TagA", "TagB")
    producer = go_finished(go_remoting.spawn(
        "produce", "--namesrv", rmq.addr("A"), "--group", f"{group}_pg", "--topic", topic,
        "--count", str(COUNT), "--tags", ",".join(tags), "--key", "gokey", "--body", "körper",
        "--prop", "color=rot-grün", "--prop", "origin=go"))
    sent: dict[str, dict[str, Any]] = {e["body"]: e for e in producer.of("sent")}
    assert len(sent) == COUNT, producer.describe()
    assert {e["status"] for e in sent.values()} == {"SEND_OK"}
    assert {e["queue"] for e in sent.values()} <= set(range(2 * QUEUES))
    assert_on_both_brokers(rmq, topic)

    consumer = go_finished(go_remoting.spawn(
        "consume", "--namesrv", rmq.addr("B"), "--group", group, "--topic", topic, "--selector", "*",
        "--expect", str(COUNT), "--timeout", f"{LIMIT_S:.0f}s"))
    got = consumer.of("received")
    assert sorted(e["body"] for e in got) == sorted(sent), consumer.describe()  # each once
    assert_same_messages_named_by_node(
        rmq, [sent[e["body"]]["offsetMsgId"] for e in got], [e["offsetMsgId"] for e in got]
    )
    for e in got:
        i = int(e["body"].rsplit("-", 1)[1])
        s = sent[e["body"]]
        assert e["topic"] == topic
        assert e["tags"] == tags[i % len(tags)]
        assert e["keys"] == [f"gokey-{i}", "gokey"]
        assert e["msgId"] == s["msgId"]  # UNIQ_KEY
        assert (e["queue"], e["offset"]) == (s["queue"], s["offset"])
        assert e["reconsumeTimes"] == 0
        props = e["props"]
        # the client adds MIN/MAX_OFFSET and CONSUME_START_TIME, the broker its cluster, region and trace
        # switch; nothing else (nothing of the node's) is added
        stamped = {"CLUSTER": rmq.stock.cluster_name, "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
        assert {k: props.get(k) for k in stamped} == stamped
        assert set(props) == {"color", "origin", "TAGS", "KEYS", "UNIQ_KEY", "MIN_OFFSET", "MAX_OFFSET",
                              "CONSUME_START_TIME"} | stamped.keys()
        assert (props["color"], props["origin"]) == ("rot-grün", "go")
        assert (props["TAGS"], props["KEYS"]) == (e["tags"], f"gokey-{i} gokey")
        assert props["UNIQ_KEY"] == s["msgId"]
