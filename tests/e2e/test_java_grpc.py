"""The RocketMQ 5 Java gRPC client (``org.apache.rocketmq:rocketmq-client-java`` 5.2.0) against mqproxy and
against a stock Apache RocketMQ 5.3.3 (RocketMQ's own proxy in cluster mode), same assertions for both.

Driver: ``tests/e2e/java/grpc5/Grpc5.java`` (compiled at test time), one JVM per target and transport
running every scenario in its own thread and printing JSON events; the h2c and the TLS JVM of a target
run side by side. Covered: Producer normal, FIFO (message groups), delay (delivery timestamp) and
transactional sends (commit, rollback, and one left open that the server's check-back resolves);
SimpleConsumer receive, ack and changeInvisibleDuration; PushConsumer with a tag filter; a send that
does not match its topic's message type.

Both targets get the same set-up through the broker's remoting admin requests (what ``mqadmin
updateTopic -b`` / ``updateSubGroup -b`` send): topics typed with ``+message.type=...`` and one FIFO
consumer group (``consumeMessageOrderly``) — the stock proxy serves no topic it did not create and
tells a client ``fifo`` only through the group's config.

Transports: h2c and TLS on the one port. The Java client's TLS trusts any certificate
(``InsecureTrustManagerFactory`` in ``RpcClientImpl``), so mqproxy gets a trustme certificate and RocketMQ's
proxy its built-in self-signed one (``tlsTestModeEnable``, on by default; TLS mode "permissive" takes TLS
and plaintext on its one gRPC port). mqproxy's connection log proves which transport each of the JVM's
connections negotiated; the stock proxy has no such log, and there the client itself cannot connect
other than as configured (it wraps every channel in TLS when ``enableSsl`` is on).

Timestamps: the Java API exposes no store timestamp, so "delivered not before its delivery time" compares
the delivery time the producer asked for with the server's own clock reading when it answered the
receive (``ReceiveMessageResponse.delivery_timestamp``, what the client calls the transport delivery
timestamp); order is asserted on queue offsets and bodies. Nothing here asserts how long anything took.

Where the stock side misbehaves, the test says so and holds mqproxy to the right behaviour:

* the stock proxy hands internal properties (``__SHARDINGKEY``, ``__transactionId__``,
  ``TRANSACTION_CHECK_TIMES``) to clients as user properties; mqproxy shows the producer's properties only;
* the stock broker may check back a transaction the producer already committed and, answered COMMIT,
  deliver its message twice; mqproxy delivers each committed message once.

The divergences these tests found in mqproxy (FIFO groups, typed topics, assignments, born host, an
internal property in check-backs) are fixed and covered by unit tests in ``tests/grpc_service``.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import trustme

from .conftest import Client, ClientRun, ProxyProcess, Target  # type: ignore[import-not-found]

#: A target's first test also starts what it needs: the stock cluster (session-wide, 3 JVMs) and this
#: module's two client JVMs; on a shared 2-core machine that can pass the default 300 s.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

SCENARIOS = ("normal", "invisible", "fifo", "delay", "transaction", "push", "mismatch")
#: Topic (scenario name, capitalised) -> message type it is created with.
TOPIC_TYPES = {
    "Normal": "NORMAL",
    "Invisible": "NORMAL",
    "Fifo": "FIFO",
    "Delay": "DELAY",
    "Transaction": "TRANSACTION",
    "Push": "NORMAL",
    "Mismatch": "NORMAL",
}
TRANSPORTS = ("h2c", "tls")
RUN_TIMEOUT_S = 240.0
UPDATE_AND_CREATE_TOPIC = 17
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200


# ----------------------------------------------------------------------------------------------- targets


@pytest.fixture(scope="module")
def proxy(proxy_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """This module's mqproxy: TLS on its one port, and transaction check-backs as soon as the stock
    cluster's (``STOCK_BROKER_CONF``: first check after 1 s, then every 2 s)."""
    base = tmp_path_factory.mktemp("proxy")
    (base / "data").mkdir()
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.cert_chain_pems[0].write_to_path(str(base / "cert.pem"))
    cert.private_key_pem.write_to_path(str(base / "key.pem"))
    env = {
        "MQPROXY_TLS_CERT_FILE": str(base / "cert.pem"),
        "MQPROXY_TLS_KEY_FILE": str(base / "key.pem"),
        "MQPROXY_BROKER_TRANSACTION_TIMEOUT_S": "1",
        "MQPROXY_BROKER_TRANSACTION_CHECK_INTERVAL_S": "2",
    }
    proc = ProxyProcess(proxy_bin, base / "data", base, env)
    proc.start()
    yield proc
    if proc.proc is not None:
        rc = proc.stop()
        assert rc == 0, f"proxy exited with {rc} on SIGTERM:\n{proc.diagnostics()}"


def _broker_address(target: Target) -> str:
    if target.cluster is not None:
        return target.cluster.broker_list[0].addr
    assert target.proxy is not None
    return str(target.proxy.address)


def remoting_request(addr: str, code: int, ext: dict[str, str], body: bytes = b"") -> tuple[int, str]:
    """One remoting request (JSON header) to ``addr``; returns the response's (code, remark)."""
    host, port = addr.rsplit(":", 1)
    header = json.dumps({"code": code, "language": "JAVA", "version": 479, "opaque": 1, "flag": 0,
                         "extFields": ext}).encode()
    frame = (4 + len(header) + len(body)).to_bytes(4, "big") + len(header).to_bytes(4, "big") + header + body
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(frame)
        data = b""
        while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
            chunk = sock.recv(65536)
            assert chunk, f"{addr} closed the connection before answering request {code}"
            data += chunk
    header_len = int.from_bytes(data[4:8], "big") & 0xFFFFFF
    reply = json.loads(data[8:8 + header_len])
    return int(reply["code"]), str(reply.get("remark") or "")


def set_up(target: Target, prefix: str) -> None:
    """Typed topics and the FIFO group, through the broker's admin requests (both targets alike)."""
    broker = _broker_address(target)
    for name, message_type in TOPIC_TYPES.items():
        ext = {"topic": prefix + name, "defaultTopic": "TBW102", "readQueueNums": "4", "writeQueueNums": "4",
               "perm": "6", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false",
               "attributes": f"+message.type={message_type}"}
        assert remoting_request(broker, UPDATE_AND_CREATE_TOPIC, ext)[0] == 0, (target.name, name)
    group = {"groupName": prefix + "FifoGroup", "consumeEnable": True, "consumeFromMinEnable": True,
             "consumeBroadcastEnable": False, "consumeMessageOrderly": True, "retryQueueNums": 1,
             "retryMaxTimes": 16, "brokerId": 0, "whichBrokerWhenConsumeSlowly": 1,
             "notifyConsumerIdsChangedEnable": True}
    body = json.dumps(group).encode()
    code, remark = remoting_request(broker, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body)
    assert code == 0, (target.name, remark)
    if target.cluster is not None:
        for name in TOPIC_TYPES:
            target.cluster.wait_route(prefix + name)


# ----------------------------------------------------------------------------------------------- runs


@dataclass
class ScenarioRun:
    """One JVM's run: its events, grouped by scenario."""

    target: Target
    transport: str
    prefix: str
    run: ClientRun
    log_start: int  # first of the proxy's log events that may belong to this run (mqproxy only)

    def events(self, scenario: str, event: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.run.reader.events
                if e.get("scenario") == scenario and (event is None or e.get("event") == event)]

    def ok(self, scenario: str) -> list[dict[str, Any]]:
        """The scenario's events, after checking it finished without an exception."""
        done = self.events(scenario, "scenario.done")
        where = f"{self.target.name}/{self.transport} {scenario}"
        assert done, f"{where}: no scenario.done\n{self.run.describe()}"
        assert done[-1]["ok"], f"{where}: {done[-1]}\n{self.run.describe()}"
        return self.events(scenario)

    @property
    def host(self) -> str:
        return str(self.run.of("hello")[0]["host"])


@pytest.fixture(scope="module")
def grpc5(java_driver: Callable[[str, str, tuple[str, ...]], Client]) -> Client:
    return java_driver("grpc5", "mqtest.Grpc5", ("grpc-java",))


@pytest.fixture(scope="module")
def runs(target: Target, grpc5: Client) -> dict[str, ScenarioRun]:
    """Both transports' JVMs against ``target``, run side by side to their end."""
    started: dict[str, ScenarioRun] = {}
    log_start = len(target.proxy.reader.events) if target.proxy and target.proxy.reader else 0
    for transport in TRANSPORTS:
        prefix = f"J{transport.capitalize()}{uuid.uuid4().hex[:6]}"
        set_up(target, prefix)
        run = grpc5.spawn(target.grpc, transport, prefix, *SCENARIOS)
        started[transport] = ScenarioRun(target, transport, prefix, run, log_start)
    for scenario_run in started.values():
        scenario_run.run.wait(RUN_TIMEOUT_S)
    return started


@pytest.fixture(params=TRANSPORTS)
def jrun(request: pytest.FixtureRequest, runs: dict[str, ScenarioRun]) -> ScenarioRun:
    """One transport's run (function scope, so tests group by target and each target's JVMs run once)."""
    return runs[request.param]


def _by_id(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in events}


def _stock(jrun: ScenarioRun) -> bool:
    return jrun.target.cluster is not None


# ----------------------------------------------------------------------------------------------- tests


def test_normal_messages_are_received_and_acked(jrun: ScenarioRun) -> None:
    events = jrun.ok("normal")
    sent = {e["id"]: e["seq"] for e in events if e["event"] == "sent"}
    received = _by_id([e for e in events if e["event"] == "received"])
    assert set(received) == set(sent)
    for message_id, seq in sent.items():
        got = received[message_id]
        assert got["topic"] == jrun.prefix + "Normal"
        assert got["body"] == f"normal-{seq}"
        assert got["tag"] == "TagA"
        assert got["keys"] == [f"key-{seq}", "common"]
        assert got["properties"] == {"seq": str(seq), "origin": "java-grpc5"}
        assert (got["message_group"], got["delivery_timestamp"]) == (None, None)
        assert got["delivery_attempt"] == 1
        assert got["born_host"] == jrun.host  # the client's own name, not the connection's address
        assert got["accept_types"] == "[NORMAL]"
        assert got["corrupted"] is False
    assert {e["id"] for e in events if e["event"] == "acked"} == set(sent)


def test_change_invisible_duration_makes_the_message_reappear(jrun: ScenarioRun) -> None:
    events = jrun.ok("invisible")
    (sent,) = [e["id"] for e in events if e["event"] == "sent"]
    names = [e["event"] for e in events]
    received = [e for e in events if e["event"] == "received"]
    assert [e["id"] for e in received] == [sent, sent]
    assert [e["delivery_attempt"] for e in received] == [1, 2]
    changed = names.index("changed")
    assert names.index("received") < changed < len(names) - 1 - names[::-1].index("received")
    assert [e["id"] for e in events if e["event"] == "acked"] == [sent]


def test_fifo_groups_arrive_in_order_and_wait_for_acks(jrun: ScenarioRun) -> None:
    events = jrun.ok("fifo")
    sent = {e["id"]: (e["message_group"], e["seq"]) for e in events if e["event"] == "sent"}
    received = [e for e in events if e["event"] == "received"]
    assert sorted(e["id"] for e in received) == sorted(sent)  # each once
    per_group: dict[str, list[tuple[int, int]]] = {}
    for e in received:
        group, seq = sent[e["id"]]
        assert (e["message_group"], e["body"]) == (group, f"{group}-{seq}")
        assert e["accept_types"] == "[FIFO]"
        per_group.setdefault(group, []).append((seq, e["offset"]))
    for group, order in per_group.items():
        assert [seq for seq, _ in order] == [0, 1, 2, 3], group
        assert [offset for _, offset in order] == sorted(offset for _, offset in order), group
    # while the first message is not acked, nothing more of its group is delivered (its queue waits)
    head = received[0]
    meanwhile = [e for e in received if e.get("meanwhile")]
    assert meanwhile, "the other group's messages were not delivered while the head waited"
    assert all(e["message_group"] != head["message_group"] for e in meanwhile)
    for e in received:
        if _stock(jrun):
            # stock: the proxy's converter passes the internal sharding-key property on as a user property
            assert e["properties"] == {"seq": str(sent[e["id"]][1]), "__SHARDINGKEY": e["message_group"]}
        else:
            assert e["properties"] == {"seq": str(sent[e["id"]][1])}


def test_delayed_message_is_not_delivered_before_its_time(jrun: ScenarioRun) -> None:
    events = jrun.ok("delay")
    (sent,) = [e for e in events if e["event"] == "sent"]
    (got,) = [e for e in events if e["event"] == "received"]
    assert (got["id"], got["body"]) == (sent["id"], "delay-0")
    assert (got["tag"], got["keys"]) == ("TagD", ["delayed"])
    assert got["delivery_timestamp"] == sent["delivery_timestamp"]
    assert got["born_timestamp"] < got["delivery_timestamp"]
    # the server's clock when it answered the receive that delivered it
    assert got["transport_delivery_timestamp"] >= got["delivery_timestamp"]
    assert got["accept_types"] == "[DELAY]"


def test_transactions_commit_rollback_and_check_back(jrun: ScenarioRun) -> None:
    events = jrun.ok("transaction")
    sent = {e["outcome"]: e["id"] for e in events if e["event"] == "sent"}
    received = [e for e in events if e["event"] == "received"]
    assert {e["body"] for e in received} == {"tx-commit", "tx-unknown"}  # rolled back: never
    assert {e["id"] for e in received} == {sent["commit"], sent["unknown"]}
    checked = [e for e in events if e["event"] == "checked"]
    assert sent["unknown"] in {e["id"] for e in checked}  # RecoverOrphanedTransactionCommand reached it
    for e in checked:
        assert e["topic"] == jrun.prefix + "Transaction"
        assert e["body"].startswith("tx-")
    if _stock(jrun):
        # stock: a check-back may also reach a transaction the producer already committed (when nobody
        # answered the broker's first check, it stores the half message again and the producer's commit
        # names the old copy); answered COMMIT, that commits it a second time and the message is
        # delivered twice. Duplicates of committed messages are all this allows.
        ids = [e["id"] for e in received]
        assert {e["body"] for e in received if ids.count(e["id"]) > 1} <= {"tx-commit", "tx-unknown"}
    else:
        assert sorted(e["id"] for e in received) == sorted([sent["commit"], sent["unknown"]])  # once each
    for e in received + checked:
        if _stock(jrun):
            # stock: internal transaction properties reach the client as user properties
            assert e["properties"].get("__transactionId__") == e["id"]
        else:
            assert e["properties"] == {}
    assert all(e["accept_types"] == "[TRANSACTION]" for e in received)


def test_push_consumer_filters_by_tag(jrun: ScenarioRun) -> None:
    events = jrun.ok("push")
    sent = {e["id"]: e for e in events if e["event"] == "sent"}
    consumed = [e for e in events if e["event"] == "consumed"]
    wanted = {i for i, e in sent.items() if e["tag"] in ("TagA", "TagC")}
    assert {e["id"] for e in consumed} == wanted
    for e in consumed:
        assert (e["tag"], e["body"]) == (sent[e["id"]]["tag"], f"push-{sent[e['id']]['seq']}")
        # one broker-wide queue is assigned to a non-FIFO group (the Apache proxy's QueryAssignment)
        assert (e["receive_queue_id"], e["accept_types"]) == (-1, "[]")


def test_message_of_another_type_is_refused(jrun: ScenarioRun) -> None:
    events = jrun.ok("mismatch")
    assert [e["event"] for e in events if e["event"] in ("sent", "refused")] == ["refused"]
    (refused,) = jrun.events("mismatch", "refused")
    assert "actualMessageType=FIFO, acceptMessageTypes=[NORMAL]" in refused["message"]


def test_transport_is_the_one_configured(jrun: ScenarioRun) -> None:
    """Every scenario ran; on mqproxy, each connection of this JVM negotiated gRPC over the transport
    asked for (TLS with ALPN h2, or h2c) on the one port."""
    assert jrun.run.returncode == 0, jrun.run.describe()
    assert jrun.run.done() == {"event": "done", "ok": True}, jrun.run.describe()
    if jrun.target.proxy is None:
        return
    reader = jrun.target.proxy.reader
    assert reader is not None
    pid = str(jrun.run.proc.pid)
    log = reader.events[jrun.log_start:]
    mine = {e["conn_id"] for e in log
            if e.get("event") == "request" and str(e.get("client_id", "")).split("@")[1:2] == [pid]}
    negotiated = [e for e in log if e.get("event") == "conn.negotiated" and e["conn_id"] in mine]
    assert negotiated
    assert all(e["protocol"] == "grpc" for e in negotiated)
    tls = jrun.transport == "tls"
    assert {(e["tls"], e["alpn"] if tls else None) for e in negotiated} == {(tls, "h2" if tls else None)}

