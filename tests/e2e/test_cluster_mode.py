"""Cluster mode end to end: two mqproxy nodes (A and B, ``MQPROXY_BACKEND_KIND=rocketmq``) in front of a
stock Apache RocketMQ 5.3 cluster (a name server and two brokers, no RocketMQ proxy), driven by the Java
remoting clients (4.9.8 and 5.3.3).

Each client is one JVM running a ``mqtest.ClusterLoads`` command (``tests/e2e/java/remoting``) that
prints JSON events; the tests assert on what producers had acknowledged and consumers received, and on
what the brokers themselves hold. Clients refresh routes every second (``--poll-ms``), so a route that
changed (a broker added or gone, a node killed) is seen within a second instead of the default 30 s.

The tests share the cluster and run in file order; adding a broker (``test_adding_a_broker...``) leaves
the third broker running for the tests after it, which create their topics on every live broker.
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from itertools import pairwise
from typing import Any

import pytest

from .cluster_harness import (
    SERVICE_NOT_AVAILABLE,
    ClusterMode,
    Loads,
    TcpRelay,
    create_topic,
    finish,
    healthz,
    max_offsets,
    received,
    received_bodies,
    route,
    sent,
    served,
    started,
    wait_for,
    write_queues,
)
from .conftest import Client, stock_rocketmq
from .harness import ClientRun

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

#: Failure deadline of one wait (they end on conditions, usually within seconds).
LIMIT_S = 60.0
QUEUES = 4  # per broker
SENDS = ("SEND_MESSAGE", "SEND_MESSAGE_V2", "SEND_BATCH_MESSAGE")


@pytest.fixture(autouse=True)
def _node_logs(rmq: ClusterMode, request: pytest.FixtureRequest) -> None:
    """A failed test's report gets the log tails of the nodes (conftest's pytest_runtest_makereport)."""
    request.node._e2e_proxies = list(rmq.nodes.values())


@pytest.fixture
def loads_of(java_driver: Callable[..., Client]) -> Iterator[Callable[[str], Loads]]:
    """``loads_of("client4")``: ClusterLoads with that client version; every run is killed at teardown."""
    made: list[Loads] = []

    def make(version: str) -> Loads:
        made.append(Loads(java_driver("remoting", "mqtest.ClusterLoads", (version,))))
        return made[-1]

    yield make
    for loads in made:
        loads.kill_all()


@pytest.fixture
def loads(loads_of: Callable[[str], Loads]) -> Loads:
    return loads_of("client4")


def names(label: str) -> tuple[str, str]:
    """A fresh topic and group for one test."""
    uid = uuid.uuid4().hex[:8]
    return f"{label}_{uid}", f"{label}_cg_{uid}"


def count_at_least(run: ClientRun, event: str, n: int) -> Callable[[], bool]:
    return lambda: len(run.of(event)) >= n


def covers(consumers: tuple[ClientRun, ...], producers: tuple[ClientRun, ...]) -> Callable[[], bool]:
    """Whether the consumers got every message the producers had acknowledged so far."""
    return lambda: set().union(*(sent(p) for p in producers)) <= received_bodies(*consumers)


# --- produce through one node, consume through the other --------------------------------------------------


@pytest.mark.parametrize("version", ["client4", "client5"])
def test_produce_through_node_a_and_consume_through_node_b(
    rmq: ClusterMode, loads_of: Callable[[str], Loads], version: str
) -> None:
    loads = loads_of(version)
    topic, group = names(f"xn{version[-1]}")
    create_topic(rmq, topic, QUEUES, brokers=[b.addr for b in rmq.stock.broker_list[:2]])
    # every node numbers the topic's queues alike: one broker (itself), 8 virtual queues
    for node in ("A", "B"):
        answer = route(rmq.addr(node), topic)
        assert answer is not None
        assert [d["brokerAddrs"]["0"] for d in answer["brokerDatas"]] == [rmq.addr(node)]
        assert sum(q["writeQueueNums"] for q in answer["queueDatas"]) == 2 * QUEUES
    consumer = loads.consume(rmq.addr("B"), topic, group)
    producer = loads.produce(rmq.addr("A"), topic, f"{group}_pg", count=40)
    producer.wait(LIMIT_S)
    acked = sent(producer)
    assert len(acked) == 40, producer.describe()
    assert {e["result"]["queueId"] for e in acked.values()} == set(range(2 * QUEUES))
    wait_for(
        "B's consumer got every message sent through A", covers((consumer,), (producer,)), LIMIT_S, consumer
    )
    finish(consumer)
    got = received(consumer)
    assert Counter(m["body"] for m in got) == Counter(list(acked))  # each once
    assert {m["msgId"] for m in got} == {e["result"]["msgId"] for e in acked.values()}
    for m in got:
        assert (m["topic"], m["tags"], m["keys"]) == (topic, "TagL", m["body"])
        assert m["queueId"] == acked[m["body"]]["result"]["queueId"]
        assert m["queueOffset"] == acked[m["body"]]["result"]["queueOffset"]
    # A served the sends, B the pulls
    assert served(rmq.nodes["A"], started(producer)["clientId"], *SENDS) >= 40
    assert served(rmq.nodes["B"], started(consumer)["clientId"], "PULL_MESSAGE") > 0
    # the messages are on both real brokers, 20 each (round robin over the virtual queues)
    stored = [sum(max_offsets(b.addr, topic, QUEUES)) for b in rmq.stock.broker_list[:2]]
    assert stored == [20, 20]


def test_mqproxy_and_plain_clients_see_each_others_messages(rmq: ClusterMode, loads: Loads) -> None:
    topic, group = names("mix")
    create_topic(rmq, topic, QUEUES)
    stock = rmq.stock.namesrv_addr
    through_node = loads.consume(rmq.addr("B"), topic, f"{group}_node", label="c-node")
    plain = loads.consume(stock, topic, f"{group}_plain", label="c-plain")
    producers = (
        loads.produce(rmq.addr("A"), topic, f"{group}_pg1", count=20, label="via-node"),
        loads.produce(stock, topic, f"{group}_pg2", count=20, label="direct"),
    )
    for producer in producers:
        producer.wait(LIMIT_S)
        assert len(sent(producer)) == 20, producer.describe()
    for consumer in (through_node, plain):
        wait_for(
            f"{consumer.name} got both producers' messages",
            covers((consumer,), producers),
            LIMIT_S,
            consumer,
            *producers,
        )
        finish(consumer)
    acked = {**sent(producers[0]), **sent(producers[1])}
    by_body = {c.name: {m["body"]: m for m in received(c)} for c in (through_node, plain)}
    for body, event in acked.items():
        seen = [views[body] for views in by_body.values()]
        assert {m["msgId"] for m in seen} == {event["result"]["msgId"]}
        assert {(m["keys"], m["tags"], m["reconsumeTimes"]) for m in seen} == {(body, "TagL", 0)}
        assert {m["props"].get("CLUSTER") for m in seen} == {rmq.stock.cluster_name}
    # the plain client sees the real brokers' queue numbers, and a mqproxy client the virtual ones
    assert {m["queueId"] for m in received(plain)} <= set(range(QUEUES))
    assert max(m["queueId"] for m in received(through_node)) >= QUEUES


# --- orderly consumption with locks across nodes ----------------------------------------------------------


def test_orderly_consumers_on_two_nodes_share_the_queues_and_keep_order(
    rmq: ClusterMode, loads: Loads
) -> None:
    """Two orderly consumers of one group, one per node, split the queues (each sees the other: consumer
    lists are the brokers'); one leaves mid-load and the other takes its queues over once their broker
    locks are free. A queue is never consumed by both at once, and each key's messages keep their order."""
    topic, group = names("ord")
    create_topic(rmq, topic, QUEUES, brokers=[b.addr for b in rmq.stock.broker_list[:2]])
    queues = 2 * QUEUES
    c_a = loads.consume(rmq.addr("A"), topic, group, label="ord-a", orderly=True, work_ms=5)
    c_b = loads.consume(rmq.addr("B"), topic, group, label="ord-b", orderly=True, work_ms=5)

    def share(run: ClientRun) -> dict[str, Any] | None:
        allocations = [e for e in run.of("allocated") if e["topic"] == topic]
        return allocations[-1] if allocations else None

    def split() -> bool:
        a, b = share(c_a), share(c_b)
        return (
            a is not None
            and b is not None
            and len(a["cids"]) == len(b["cids"]) == 2
            and not set(a["queues"]) & set(b["queues"])
            and set(a["queues"]) | set(b["queues"]) == set(range(queues))
        )

    wait_for("the two consumers split the queues", split, LIMIT_S, c_a, c_b)
    producer = loads.produce(rmq.addr("A"), topic, f"{group}_pg", keys=queues, interval_ms=10)
    wait_for(
        "both consumers got messages",
        lambda: min(len(c_a.of("batch")), len(c_b.of("batch"))) >= 10,
        LIMIT_S,
        c_a,
        c_b,
        producer,
    )
    b_queues = set(share(c_b)["queues"])  # type: ignore[index]
    finish(c_b)  # graceful: unlocks its queues, commits its offsets, unregisters
    b_last: dict[int, int] = defaultdict(lambda: -1)
    for m in received(c_b):
        b_last[m["queueId"]] = max(b_last[m["queueId"]], m["queueOffset"])

    def took_over() -> bool:
        return b_queues <= {m["queueId"] for m in received(c_a) if m["queueOffset"] > b_last[m["queueId"]]}

    wait_for("A's consumer took B's queues over", took_over, LIMIT_S, c_a, producer)
    finish(producer)
    wait_for("every acknowledged message consumed", covers((c_a, c_b), (producer,)), LIMIT_S, c_a, producer)
    finish(c_a)

    acked = sent(producer)
    for event in acked.values():  # the selector put each key on its own queue
        assert event["result"]["queueId"] == event["key"]
    batches = sorted((e for run in (c_a, c_b) for e in run.of("batch")), key=lambda e: (e["start"], e["end"]))
    for queue in range(queues):
        mine = [e for e in batches if e["queueId"] == queue]
        # never both at once: batches of different consumers on one queue do not overlap in time
        for first, second in pairwise(mine):
            if first["label"] != second["label"]:
                assert first["end"] <= second["start"], (queue, first, second)
        # in order: each step is the next message or a redelivery of an earlier one, never a skip
        steps = [acked[body]["seq"] for e in mine for body in e["bodies"]]
        assert sorted(set(steps)) == sorted(e["seq"] for e in acked.values() if e["key"] == queue)
        assert all(b <= a + 1 for a, b in pairwise(steps)), (queue, steps)
        assert steps[0] == 0
    assert {e["label"] for e in batches} == {"ord-a", "ord-b"}


# --- transactions -----------------------------------------------------------------------------------------


def test_transaction_check_back_reaches_a_producer_on_the_other_node(rmq: ClusterMode, loads: Loads) -> None:
    """Half messages sent through A by a producer that then dies (its local transactions UNKNOW); the
    brokers' check-backs reach the group's other producer, connected to B, which commits them."""
    topic, group = names("txx")
    create_topic(rmq, topic, 2, brokers=[b.addr for b in rmq.stock.broker_list[:2]])
    checker = loads.tx_check(rmq.addr("B"), topic, f"{group}_pg", label="checker")
    consumer = loads.consume(rmq.addr("A"), topic, group)
    started(checker)
    sender = loads.tx_send(rmq.addr("A"), topic, f"{group}_pg", count=4, label="sender")
    wait_for("four half messages", count_at_least(sender, "tx.sent", 4), LIMIT_S, sender)
    sender.proc.kill()  # kill -9: only the producer on B is left in the group
    sender.wait(10)
    halves = {e["body"]: e for e in sender.of("tx.sent")}
    assert {(e["local"], e["result"]["status"]) for e in halves.values()} == {("UNKNOW", "SEND_OK")}
    assert len({e["result"]["queueId"] for e in halves.values()}) == 4  # on both brokers
    wait_for(
        "the committed messages consumed",
        lambda: set(halves) <= received_bodies(consumer),
        LIMIT_S,
        consumer,
        checker,
    )
    finish(checker)
    finish(consumer)
    checked = {e["transactionId"] for e in checker.of("tx.check")}
    assert {e["result"]["transactionId"] for e in halves.values()} <= checked
    for m in received(consumer):
        assert m["sysFlag"] & 0xC == 0x8  # TRANSACTION_COMMIT_TYPE
        assert m["msgId"] == halves[m["body"]]["result"]["msgId"]
    # at least once: a stock broker may commit a checked message twice (see test_java_remoting.py)
    assert set(Counter(m["body"] for m in received(consumer))) == set(halves)


# --- adding a broker while clients run --------------------------------------------------------------------


def test_adding_a_broker_while_clients_run(rmq: ClusterMode, loads: Loads) -> None:
    topic, group = names("grow")
    create_topic(rmq, topic, QUEUES, brokers=[b.addr for b in rmq.stock.broker_list[:2]])
    consumer = loads.consume(rmq.addr("B"), topic, group)
    producer = loads.produce(rmq.addr("A"), topic, f"{group}_pg", interval_ms=20)
    wait_for(
        "30 messages consumed", lambda: len(received_bodies(consumer)) >= 30, LIMIT_S, consumer, producer
    )
    before = route(rmq.addr("A"), topic)

    broker = rmq.stock.add_broker()
    result = rmq.stock.mqadmin(
        "updateTopic", "-b", broker.addr, "-t", topic, "-r", str(QUEUES), "-w", str(QUEUES)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    grown = 3 * QUEUES
    wait_for("A routes the new broker's queues", lambda: write_queues(rmq.addr("A"), topic) == grown, LIMIT_S)
    wait_for("B routes them too", lambda: write_queues(rmq.addr("B"), topic) == grown, LIMIT_S)
    new_ids = set(range(2 * QUEUES, grown))

    def on_new_queues() -> bool:
        return {e["result"]["queueId"] for e in sent(producer).values()} >= new_ids

    wait_for("sends to the new queues", on_new_queues, LIMIT_S, producer)
    wait_for(
        "the new queues consumed",
        lambda: {m["queueId"] for m in received(consumer)} >= new_ids,
        LIMIT_S,
        consumer,
    )
    finish(producer)
    wait_for("every acknowledged message consumed", covers((consumer,), (producer,)), LIMIT_S, consumer)
    finish(consumer)

    assert before is not None
    assert sum(q["writeQueueNums"] for q in before["queueDatas"]) == 2 * QUEUES
    acked = sent(producer)
    # earlier queue ids kept their meaning: each virtual queue's offsets run on without a gap or restart
    offsets: dict[int, list[int]] = defaultdict(list)
    for event in acked.values():
        offsets[event["result"]["queueId"]].append(event["result"]["queueOffset"])
    assert set(offsets) == set(range(grown))
    for queue, seen in offsets.items():
        assert sorted(seen) == list(range(len(seen))), queue
    # and the new broker holds exactly what went to the new queues
    to_new = sum(1 for e in acked.values() if e["result"]["queueId"] in new_ids)
    assert sum(max_offsets(broker.addr, topic, QUEUES)) == to_new
    assert Counter(m["body"] for m in received(consumer)).keys() == acked.keys()


# --- faults -----------------------------------------------------------------------------------------------


def test_a_broker_stopped_mid_load(rmq: ClusterMode, loads: Loads) -> None:
    """Sends move to the brokers left, the consumer keeps receiving from them, and once the broker is back
    every acknowledged message has been consumed (also those it held while it was down)."""
    topic, group = names("bstop")
    create_topic(rmq, topic, QUEUES)
    consumer = loads.consume(rmq.addr("B"), topic, group)
    producer = loads.produce(rmq.addr("A"), topic, f"{group}_pg", interval_ms=20, send_timeout_ms=5000)
    wait_for(
        "30 messages consumed", lambda: len(received_bodies(consumer)) >= 30, LIMIT_S, consumer, producer
    )

    rmq.stock.stop_broker("broker-b")
    stopped_at = len(producer.of("sent")) + len(producer.of("send.failed"))

    def after_stop() -> set[str]:
        return {body for body, e in sent(producer).items() if e["i"] > stopped_at}

    wait_for("30 sends acknowledged after the stop", lambda: len(after_stop()) >= 30, LIMIT_S, producer)
    wait_for(
        "30 of them consumed",
        lambda: len(after_stop() & received_bodies(consumer)) >= 30,
        LIMIT_S,
        consumer,
        producer,
    )
    # sends continue: the last 20 attempts all succeeded
    attempts = sorted(producer.of("sent") + producer.of("send.failed"), key=lambda e: e["i"])
    assert all(e["event"] == "sent" for e in attempts[-20:]), attempts[-20:]

    rmq.stock.restart_broker("broker-b")
    finish(producer)
    wait_for("every acknowledged message consumed", covers((consumer,), (producer,)), LIMIT_S, consumer)
    finish(consumer)
    failed = producer.of("send.failed")
    assert len(failed) <= 10, failed  # only around the stop itself


def test_a_node_killed_mid_load(rmq: ClusterMode, loads: Loads, request: pytest.FixtureRequest) -> None:
    """Clients given two nodes continue through the second when the first is killed with kill -9.

    The second node is reached through a relay that refuses connections until the clients have started,
    so both clients deterministically start on node C (a Java client picks a random name server of its
    list); the relay then forwards to node B, and C is killed."""
    topic, group = names("nkill")
    create_topic(rmq, topic, QUEUES)
    node_c = rmq.start_node("C")
    request.node._e2e_proxies.append(node_c)
    relay = TcpRelay()
    try:
        namesrv = f"{node_c.address};{relay.address}"
        consumer = loads.consume(namesrv, topic, group)
        producer = loads.produce(namesrv, topic, f"{group}_pg", interval_ms=20, send_timeout_ms=5000)
        wait_for(
            "30 messages consumed", lambda: len(received_bodies(consumer)) >= 30, LIMIT_S, consumer, producer
        )
        relay.open(rmq.addr("B"))
        node_c.kill()
        killed_at = len(producer.of("sent")) + len(producer.of("send.failed"))

        def after_kill() -> set[str]:
            return {body for body, e in sent(producer).items() if e["i"] > killed_at}

        wait_for("30 sends acknowledged after the kill", lambda: len(after_kill()) >= 30, LIMIT_S, producer)
        wait_for(
            "30 of them consumed",
            lambda: len(after_kill() & received_bodies(consumer)) >= 30,
            LIMIT_S,
            consumer,
            producer,
        )
        finish(producer)
        wait_for("every acknowledged message consumed", covers((consumer,), (producer,)), LIMIT_S, consumer)
        finish(consumer)
    finally:
        relay.close()
    assert node_c.returncodes == [-9]
    # the clients were on C, and then on B
    for run, ops in ((producer, SENDS), (consumer, ("PULL_MESSAGE",))):
        client_id = started(run)["clientId"]
        assert served(node_c, client_id, *ops) > 0
        assert served(rmq.nodes["B"], client_id, *ops) > 0


def test_a_node_started_while_the_cluster_is_unreachable(
    rmq: ClusterMode, loads: Loads, request: pytest.FixtureRequest
) -> None:
    """The node starts, says 503 with a reason and refuses requests with a clear remark; once its name
    server address answers (a relay to the stock name server opens), it becomes ready and serves."""
    topic, group = names("late")
    create_topic(rmq, topic, QUEUES)
    relay = TcpRelay()
    try:
        node = rmq.start_node("U", namesrv=relay.address)
        request.node._e2e_proxies.append(node)
        status, body = healthz(str(node.address))
        assert status == 503, body
        assert body["status"] == "unavailable", body
        assert relay.address in str(body.get("reason")), body  # the reason names what is unreachable
        reply_code, remark = stock_rocketmq.remoting_call(str(node.address), 105, {"topic": topic})[:2]
        assert reply_code == SERVICE_NOT_AVAILABLE, remark
        assert relay.address in remark, remark

        relay.open(rmq.stock.namesrv_addr)
        wait_for("the node is ready", lambda: healthz(str(node.address))[0] == 200, LIMIT_S)
        producer = loads.produce(str(node.address), topic, f"{group}_pg", count=5)
        producer.wait(LIMIT_S)
        assert len(sent(producer)) == 5, producer.describe()
        assert sum(sum(max_offsets(b, topic, QUEUES)) for b in rmq.live_brokers()) == 5
        assert node.stop() == 0
    finally:
        relay.close()
