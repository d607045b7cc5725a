"""gRPC in cluster mode: the RocketMQ 5 Java gRPC client (``rocketmq-client-java`` 5.2.0) against two mqproxy
nodes (A and B, ``MQPROXY_BACKEND_KIND=rocketmq``) in front of one stock Apache RocketMQ 5.3 cluster (a name
server and two brokers, no RocketMQ proxy).

One JVM (``tests/e2e/java/grpc5/ClusterGrpc5.java``) runs every scenario in its own thread: producers are
given node A's endpoint, consumers node B's, so every message crosses nodes and lives on the brokers only.
Topics (four queues on each broker, typed as ``mqadmin updateTopic -a +message.type=...`` types them) and
the FIFO consumer groups are created on the brokers directly, as an administrator of the cluster would:
the nodes learn them from the cluster.

What is asserted, per scenario: every message arrives (normal, push, delay, transactions); acks through B
of messages popped through A are taken and those messages are not delivered again; each message group's
order holds across the two brokers (FIFO, simple and push consumers); the check-back of an open
transaction reaches its producer on A and the committed message reaches B; delayed messages are not
delivered before their time. Routes and assignments asked of either node name that node, never a broker
(raw ``QueryRoute`` / ``QueryAssignment`` over h2c).
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import trio

from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.model.properties import PROXY_BROKER_NAME

from ..grpc_service.conftest import GrpcTestClient  # type: ignore[import-not-found]
from .cluster_harness import ClusterMode, create_group, create_topic, max_offsets
from .conftest import Client, ClientRun

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

QUEUES = 4  # per broker
#: Scenario (topic suffix) -> the message type its topic is created with.
TOPIC_TYPES = {
    "Normal": "NORMAL",
    "Crossack": "NORMAL",
    "Invisible": "NORMAL",
    "Push": "NORMAL",
    "Fifo": "FIFO",
    "Fifopush": "FIFO",
    "Transaction": "TRANSACTION",
    "Txother": "TRANSACTION",
    "Delay": "DELAY",
}
FIFO_GROUPS = ("FifoGroup", "FifopushGroup")
RUN_TIMEOUT_S = 240.0


@pytest.fixture(autouse=True)
def _node_logs(rmq: ClusterMode, request: pytest.FixtureRequest) -> None:
    """A failed test's report gets the log tails of the nodes (conftest's pytest_runtest_makereport)."""
    request.node._e2e_proxies = list(rmq.nodes.values())


@dataclass
class Scenarios:
    """The driver's run: its events by scenario."""

    prefix: str
    run: ClientRun

    def events(self, scenario: str, event: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.run.reader.events
            if e.get("scenario") == scenario and (event is None or e.get("event") == event)
        ]

    def ok(self, scenario: str) -> list[dict[str, Any]]:
        """The scenario's events, after checking that it finished without an exception."""
        done = self.events(scenario, "scenario.done")
        assert done, f"{scenario}: no scenario.done\n{self.run.describe()}"
        assert done[-1]["ok"], f"{scenario}: {done[-1]}\n{self.run.describe()}"
        return self.events(scenario)

    def topic(self, scenario: str) -> str:
        return self.prefix + scenario.capitalize()


@pytest.fixture(scope="module")
def scenarios(rmq: ClusterMode, java_driver: Callable[..., Client]) -> Scenarios:
    prefix = f"Cg{uuid.uuid4().hex[:6]}"
    for name, message_type in TOPIC_TYPES.items():
        create_topic(rmq, prefix + name, QUEUES, message_type=message_type)
    for group in FIFO_GROUPS:
        create_group(rmq, prefix + group, orderly=True)
    driver = java_driver("grpc5", "mqtest.ClusterGrpc5", ("grpc-java",))
    names = [n.lower() for n in TOPIC_TYPES]
    run = driver.spawn(str(rmq.nodes["A"].address), str(rmq.nodes["B"].address), prefix, *names)
    run.name = "ClusterGrpc5"
    run.wait(RUN_TIMEOUT_S)
    return Scenarios(prefix, run)


def requests_of(rmq: ClusterMode, node: str, op: str) -> list[dict[str, Any]]:
    reader = rmq.nodes[node].reader
    assert reader is not None
    return [e for e in list(reader.events) if e.get("event") == "request" and e.get("op") == op]


def sent_ids(events: list[dict[str, Any]]) -> set[str]:
    return {e["id"] for e in events if e["event"] == "sent"}


# ----------------------------------------------------------------------------------------------- tests


def test_normal_messages_sent_through_a_are_received_and_acked_through_b(
    rmq: ClusterMode, scenarios: Scenarios
) -> None:
    events = scenarios.ok("normal")
    sent = {e["id"]: e["seq"] for e in events if e["event"] == "sent"}
    received = [e for e in events if e["event"] == "received"]
    assert Counter(e["id"] for e in received) == Counter(list(sent))  # each once
    for e in received:
        assert (e["body"], e["tag"]) == (f"normal-{sent[e['id']]}", "TagA")
        assert e["properties"] == {"seq": str(sent[e["id"]])}
        assert e["delivery_attempt"] == 1
        assert e["endpoints"].endswith(str(rmq.nodes["B"].address))
    assert {e["id"] for e in events if e["event"] == "acked"} == set(sent)
    # sent through A, received and acked through B; the messages are on both brokers
    topic = scenarios.topic("normal")
    assert any(e.get("topic") == topic for e in requests_of(rmq, "A", "SendMessage"))
    assert not any(e.get("topic") == topic for e in requests_of(rmq, "B", "SendMessage"))
    for op in ("ReceiveMessage", "AckMessage"):
        assert any(e.get("topic") == topic for e in requests_of(rmq, "B", op)), op
        assert not any(e.get("topic") == topic for e in requests_of(rmq, "A", op)), op
    stored = [sum(max_offsets(b.addr, topic, QUEUES)) for b in rmq.stock.broker_list]
    assert sum(stored) == 16, stored
    assert min(stored) > 0, stored


def test_acks_through_b_of_messages_popped_through_a(rmq: ClusterMode, scenarios: Scenarios) -> None:
    events = scenarios.ok("crossack")
    sent = sent_ids(events)
    first = [e for e in events if e["event"] == "received" and e["phase"] == "first"]
    again = [e for e in events if e["event"] == "received" and e["phase"] == "again"]
    (control,) = [e["id"] for e in events if e["event"] == "control"]
    assert {e["id"] for e in first} == sent
    assert all(e["endpoints"].endswith(str(rmq.nodes["A"].address)) for e in first)
    acked_through_b = {
        e["id"] for e in events if e["event"] == "acked" and e["via"].endswith(str(rmq.nodes["B"].address))
    }
    assert acked_through_b >= sent - {control}
    # the message left alone came back once its invisible time was over; the acked ones never did
    assert control in {e["id"] for e in again}
    assert {e["id"] for e in again} == {control}, again
    assert {e["delivery_attempt"] for e in again} == {2}
    topic = scenarios.topic("crossack")
    assert any(e.get("topic") == topic for e in requests_of(rmq, "B", "AckMessage"))


def test_invisible_time_changed_through_a_of_a_message_received_through_b(
    rmq: ClusterMode, scenarios: Scenarios
) -> None:
    events = scenarios.ok("invisible")
    (sent,) = sent_ids(events)
    received = [e for e in events if e["event"] == "received"]
    assert [(e["id"], e["delivery_attempt"]) for e in received] == [(sent, 1), (sent, 2)]
    names = [e["event"] for e in events]
    assert names.index("received") < names.index("changed") < len(names) - 1 - names[::-1].index("received")
    (changed,) = [e for e in events if e["event"] == "changed"]
    assert changed["via"].endswith(str(rmq.nodes["A"].address))
    assert [e["id"] for e in events if e["event"] == "acked"] == [sent]
    topic = scenarios.topic("invisible")
    assert any(e.get("topic") == topic for e in requests_of(rmq, "A", "ChangeInvisibleDuration"))


def test_push_consumer_on_b_gets_every_message(rmq: ClusterMode, scenarios: Scenarios) -> None:
    events = scenarios.ok("push")
    consumed = [e for e in events if e["event"] == "consumed"]
    assert {e["id"] for e in consumed} == sent_ids(events)
    assert all(e["endpoints"].endswith(str(rmq.nodes["B"].address)) for e in consumed)
    assert all(e["delivery_attempt"] == 1 for e in consumed)  # acked, never redelivered


@pytest.mark.parametrize("scenario", ["fifo", "fifopush"])
def test_fifo_message_groups_keep_their_order_across_both_brokers(
    rmq: ClusterMode, scenarios: Scenarios, scenario: str
) -> None:
    events = scenarios.ok(scenario)
    sent = {e["id"]: (e["message_group"], e["seq"]) for e in events if e["event"] == "sent"}
    got = [e for e in events if e["event"] in ("received", "consumed")]
    assert set(e["id"] for e in got) == set(sent)
    per_group: dict[str, list[int]] = defaultdict(list)
    for e in got:
        group, seq = sent[e["id"]]
        assert (e["message_group"], e["body"]) == (group, f"{group}-{seq}")
        per_group[group].append(seq)
    for group, seqs in per_group.items():
        assert seqs == list(range(5)), (group, seqs)  # in order, each once
    if scenario == "fifo":
        # while the first message was not acked, nothing more of its group was delivered (its queue waited)
        head = got[0]
        meanwhile = [e for e in got if e.get("meanwhile")]
        assert meanwhile, "the other groups' messages were not delivered while the head waited"
        assert all(e["message_group"] != head["message_group"] for e in meanwhile)
    else:
        # one message of a group at a time: the client was told the group is FIFO
        assert not [e for e in got if e["overlap"]]
    assert all(e["delivery_attempt"] == 1 for e in got)
    # the groups' queues are on both brokers
    stored = [sum(max_offsets(b.addr, scenarios.topic(scenario), QUEUES)) for b in rmq.stock.broker_list]
    assert sum(stored) == 30, stored
    assert min(stored) > 0, stored


def test_transaction_check_back_reaches_the_producer_on_a(rmq: ClusterMode, scenarios: Scenarios) -> None:
    events = scenarios.ok("transaction")
    sent = {e["outcome"]: e["id"] for e in events if e["event"] == "sent"}
    received = [e for e in events if e["event"] == "received"]
    assert {e["body"] for e in received} == {"tx-commit", "tx-unknown"}  # rolled back: never
    assert {e["id"] for e in received} == {sent["commit"], sent["unknown"]}
    checked = [e for e in events if e["event"] == "checked"]
    assert sent["unknown"] in {e["id"] for e in checked}
    for e in received + checked:
        assert e["properties"] == {}, e
    # at least once: a stock broker may commit a checked message twice (see test_java_grpc.py)
    assert set(Counter(e["id"] for e in received)) == {sent["commit"], sent["unknown"]}
    topic = scenarios.topic("transaction")
    assert any(e.get("topic") == topic for e in requests_of(rmq, "A", "EndTransaction"))


def test_check_back_reaches_a_producer_on_the_other_node(rmq: ClusterMode, scenarios: Scenarios) -> None:
    """The producer that sent the half message through A is gone; the topic's producer on B (whose node
    announced the topic's transaction group to the brokers) gets the check and commits."""
    events = scenarios.ok("txother")
    (sent,) = sent_ids(events)
    closed = [n for n, e in enumerate(events) if e["event"] == "closed"]
    checked_by_b = [n for n, e in enumerate(events) if e["event"] == "checked" and e["by"] == "B"]
    assert checked_by_b
    assert closed
    assert checked_by_b[-1] > closed[0]
    assert {events[n]["id"] for n in checked_by_b} == {sent}
    received = [e for e in events if e["event"] == "received"]
    assert {e["id"] for e in received} == {sent}
    assert received[0]["body"] == "txother-0"
    topic = scenarios.topic("txother")
    assert any(e.get("topic") == topic for e in requests_of(rmq, "B", "EndTransaction"))


def test_delayed_messages_arrive_after_their_delivery_time(rmq: ClusterMode, scenarios: Scenarios) -> None:
    events = scenarios.ok("delay")
    sent = {e["id"]: e for e in events if e["event"] == "sent"}
    received = [e for e in events if e["event"] == "received"]
    assert {e["id"] for e in received} == set(sent)
    for e in received:
        assert e["delivery_timestamp"] == sent[e["id"]]["delivery_timestamp"]
        assert e["born_timestamp"] < e["delivery_timestamp"]
        # the node's clock when it answered the receive that delivered it
        assert e["transport_delivery_timestamp"] >= e["delivery_timestamp"], e
    stored = [sum(max_offsets(b.addr, scenarios.topic("delay"), QUEUES)) for b in rmq.stock.broker_list]
    assert sum(stored) == 4, stored  # the real topic's queues hold them once due (timers are the broker's)


# ----------------------------------------------------------------------------------------------- routes


async def _client(address: str, nursery: trio.Nursery) -> GrpcTestClient:
    host, port = address.rsplit(":", 1)
    client = GrpcTestClient(await trio.open_tcp_stream(host, int(port)), f"routes@{uuid.uuid4().hex[:6]}@0")
    await client.start(nursery)
    return client


@pytest.mark.parametrize("node", ["A", "B"])
async def test_routes_and_assignments_name_the_node(
    rmq: ClusterMode, scenarios: Scenarios, node: str, nursery: trio.Nursery
) -> None:
    address = str(rmq.nodes[node].address)
    host, port = address.rsplit(":", 1)
    client = await _client(address, nursery)
    for scenario, message_type in TOPIC_TYPES.items():
        topic = pb.Resource(name=scenarios.prefix + scenario)
        route = await client.unary("QueryRoute", pb.QueryRouteRequest(topic=topic))
        assert route.status.code == pb.Code.OK, route.status
        queues = route.message_queues
        assert [q.id for q in queues] == list(range(2 * QUEUES))  # both brokers' queues, numbered by the node
        for q in queues:
            assert q.broker.name == PROXY_BROKER_NAME
            assert [(a.host, a.port) for a in q.broker.endpoints.addresses] == [(host, int(port))]
            assert q.permission == pb.Permission.READ_WRITE
            assert list(q.accept_message_types) == [pb.MessageType[message_type]]
    for group, topic, fifo in (
        ("NormalGroup", "Normal", False),
        ("PushGroup", "Push", False),
        ("FifoGroup", "Fifo", True),
        ("FifopushGroup", "Fifopush", True),
    ):
        request = pb.QueryAssignmentRequest(
            topic=pb.Resource(name=scenarios.prefix + topic), group=pb.Resource(name=scenarios.prefix + group)
        )
        answer = await client.unary("QueryAssignment", request)
        assert answer.status.code == pb.Code.OK, answer.status
        ids = [a.message_queue.id for a in answer.assignments]
        assert ids == (list(range(2 * QUEUES)) if fifo else [-1]), (group, ids)
        for a in answer.assignments:
            broker = a.message_queue.broker
            assert broker.name == PROXY_BROKER_NAME
            assert [(x.host, x.port) for x in broker.endpoints.addresses] == [(host, int(port))]


async def test_a_transaction_sent_through_a_is_committed_through_b(
    rmq: ClusterMode, scenarios: Scenarios, nursery: trio.Nursery
) -> None:
    """The transaction id a node returns names the half message's broker, so another node ends it."""
    on_a = await _client(str(rmq.nodes["A"].address), nursery)
    on_b = await _client(str(rmq.nodes["B"].address), nursery)
    topic = pb.Resource(name=scenarios.topic("transaction"))
    message_id = f"RAWTX{uuid.uuid4().hex[:16].upper()}"
    sp = pb.SystemProperties(
        message_id=message_id, tag="TagRaw", body_encoding=pb.Encoding.IDENTITY,
        message_type=pb.MessageType.TRANSACTION,
    )
    sent = await on_a.unary(
        "SendMessage",
        pb.SendMessageRequest(messages=[pb.RmqMessage(topic=topic, system_properties=sp, body=b"raw-tx")]),
    )
    assert sent.status.code == pb.Code.OK, sent.status
    (entry,) = sent.entries
    assert entry.transaction_id.endswith(f":{message_id}")  # packed offset : half-queue offset : id
    ended = await on_b.unary(
        "EndTransaction",
        pb.EndTransactionRequest(
            topic=topic,
            message_id=message_id,
            transaction_id=entry.transaction_id,
            resolution=pb.TransactionResolution.COMMIT,
            source=pb.TransactionSource.SOURCE_CLIENT,
        ),
    )
    assert ended.status.code == pb.Code.OK, ended.status
    bodies: list[bytes] = []
    with trio.fail_after(60):
        while b"raw-tx" not in bodies:
            request = pb.ReceiveMessageRequest(
                group=pb.Resource(name=scenarios.prefix + "RawTxGroup"),
                message_queue=pb.MessageQueue(topic=topic),
                batch_size=16,
                invisible_duration=pb.Duration(seconds=30),
                long_polling_timeout=pb.Duration(seconds=2),
            )
            sid = await on_b.open("ReceiveMessage", [request.SerializeToString()], grpc_timeout="10S")
            result = await on_b.wait(sid, 15)
            for payload in result.messages():
                answer = pb.ReceiveMessageResponse.FromString(payload)
                if answer.WhichOneof("content") == "message":
                    bodies.append(answer.message.body)
                    if answer.message.body == b"raw-tx":
                        assert answer.message.system_properties.message_id == message_id
    assert any(e.get("topic") == topic.name for e in requests_of(rmq, "B", "EndTransaction"))


def test_the_nodes_logged_no_errors(rmq: ClusterMode, scenarios: Scenarios) -> None:
    """Everything above was served without a server-side error or internal exception (runs last: the
    module's tests share the nodes)."""
    for name, node in rmq.nodes.items():
        assert node.reader is not None
        events = list(node.reader.events)
        errors = [e for e in events if e.get("level") in ("error", "critical")]
        assert not errors, (name, errors[:5])
