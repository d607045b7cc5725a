"""The official RocketMQ 5 clients (PyPI rocketmq-python-client 5.1.2, npm rocketmq-client-nodejs 1.0.8)
against the proxy's gRPC service, over h2c and TLS on the same port, and messages crossing between gRPC and
remoting.

* Most tests run against one ``mqproxy serve`` subprocess per module (TLS configured through
  ``MQPROXY_TLS_*``; the clients trust the test CA through ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``); each test
  uses its own topics and groups, so they share it safely.
* Covered: producers (normal, FIFO, delay, transactional with commit, rollback and check-back), SimpleConsumer
  receive/ack and ChangeInvisibleDuration, PushConsumer through QueryAssignment (with a redelivery after
  FAILURE), RecallMessage, 3 MiB bodies, and gRPC <-> remoting interop.

Drivers: ``tests/e2e/grpc_py5_client.py`` and ``tests/e2e/grpc_node/client.js``. Install the clients with
``scripts/setup-grpc-clients.sh`` (tests skip without it); the remoting side uses the C++-core client from
``scripts/setup-clients.sh``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from mqproxy.server import ServerHandle, serve
from mqproxy.settings import Settings

from .grpc_drivers import (
    NODE_DIR,
    PY5,
    Run,
    SubprocessProxy,
    Tls,
    arun_py5,
    client_env,
    make_tls,
    produce,
    run_node,
    run_py5,
)

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def py5() -> Path:
    if not PY5.exists():
        pytest.skip("rocketmq-python-client is not installed; run scripts/setup-grpc-clients.sh")
    return PY5


@pytest.fixture(scope="module")
def grpc_proxy(
    proxy_bin: str, tls: Tls, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SubprocessProxy]:
    proxy = SubprocessProxy(proxy_bin, tmp_path_factory.mktemp("grpc-proxy"), tls)
    yield proxy
    assert proxy.stop() == 0


@pytest.fixture
def env(tmp_path: Path, tls: Tls) -> dict[str, str]:
    return client_env(tmp_path, tls)


def test_producer_sends_over_h2c_and_tls(py5: Path, grpc_proxy: SubprocessProxy, env: dict[str, str]) -> None:
    plain = run_py5(env, "produce", grpc_proxy.address, "GrpcPlain", count=5)
    assert plain.returncode == 0, plain.stderr
    secure = run_py5(env, "produce", grpc_proxy.address, "GrpcTls", count=5, tls=True)
    assert secure.returncode == 0, secure.stderr
    ids = [e["message_id"] for e in plain.of("sent") + secure.of("sent")]
    assert len(ids) == len(set(ids)) == 10
    sends = grpc_proxy.requests("SendMessage")
    assert {e["topic"] for e in sends if e["status"] == "OK"} >= {"GrpcPlain", "GrpcTls"}
    negotiated = [
        e for e in grpc_proxy.events() if e.get("event") == "conn.negotiated" and e["protocol"] == "grpc"
    ]
    assert {e["tls"] for e in negotiated} == {True, False}
    assert any(e["alpn"] == "h2" for e in negotiated if e["tls"])


def test_three_mib_body_over_tls(py5: Path, grpc_proxy: SubprocessProxy, env: dict[str, str]) -> None:
    run = run_py5(env, "produce", grpc_proxy.address, "GrpcBig", count=1, body_bytes=str(3 * MIB), tls=True)
    assert run.returncode == 0, run.stderr
    (sent,) = run.of("sent")
    assert sent["size"] == 3 * MIB
    (request,) = [e for e in grpc_proxy.requests("SendMessage") if e["topic"] == "GrpcBig"]
    assert request["status"] == "OK"
    assert request["req_bytes"] > 3 * MIB


def test_grpc_fifo_messages_reach_a_remoting_consumer_intact(
    py5: Path, grpc_proxy: SubprocessProxy, env: dict[str, str], client: Callable[[str], Any]
) -> None:
    """gRPC -> remoting: tag, keys, user properties and message id (UNIQ_KEY) preserved; a FIFO message
    group lands on one queue, in order."""
    remoting = client("py044")
    consumer = remoting.consume(
        grpc_proxy.address, "GrpcToRemoting", "GrpcToRemotingGroup", 6, timeout=40, prop_keys=("p1",)
    )
    produced = run_py5(
        env,
        "produce",
        grpc_proxy.address,
        "GrpcToRemoting",
        "order-1",
        count=6,
        tag="TagX",
        key="kx",
        prop="p1=v1",
    )
    assert produced.returncode == 0, produced.stderr
    consumer.wait(60)
    received = consumer.of("received")
    assert len(received) == 6, consumer.describe()
    sent_ids = [e["message_id"] for e in produced.of("sent")]
    assert sorted(e["msg_id"] for e in received) == sorted(sent_ids)
    for event in received:
        assert event["tags"] == "TagX"
        assert event["properties"]["p1"] == "v1"
        assert event["keys"].startswith("kx")
        assert event["body"].startswith("body-")
    assert len({e["queue_id"] for e in received}) == 1
    ordered = sorted(received, key=lambda e: e["queue_offset"])
    assert [e["body"] for e in ordered] == [f"body-{i}" for i in range(6)]


# ------------------------------------------------------------------------------ in-process server


@pytest.fixture
async def grpc_server(tls: Tls, tmp_path: Path) -> AsyncIterator[ServerHandle]:
    """The real server in-process (embedded store, TLS on, first transaction check 1 s after prepare),
    with transaction check-backs routed to the gRPC service (``proxy/server.py`` does not route them to
    gRPC yet)."""
    (tmp_path / "data").mkdir()
    settings = Settings.for_tests(
        tmp_path / "data",
        tls={"cert_file": str(tls.cert_file), "key_file": str(tls.key_file)},
        broker={"transaction_timeout_s": 1.0},
    )
    async with trio.open_nursery() as nursery:
        handle: ServerHandle = await nursery.start(
            lambda task_status: serve(settings, install_signal_handlers=False, task_status=task_status)
        )
        yield handle
        handle.stop()


def endpoint(handle: ServerHandle) -> str:
    return f"{handle.address[0]}:{handle.address[1]}"


def test_simple_consumer_receives_and_acks(
    py5: Path, grpc_proxy: SubprocessProxy, env: dict[str, str]
) -> None:
    ep = grpc_proxy.address
    produced = run_py5(env, "produce", ep, "RecvTopic", count=4, prop="color=red", key="rk")
    assert produced.returncode == 0, produced.stderr
    consumed = run_py5(env, "consume", ep, "RecvTopic", "RecvGroup", expect=4, timeout=30)
    assert consumed.returncode == 0, consumed.stderr
    received = consumed.of("received")
    assert sorted(e["message_id"] for e in received) == sorted(e["message_id"] for e in produced.of("sent"))
    assert {e["md5"] for e in received} == {e["md5"] for e in produced.of("sent")}
    for event in received:
        assert event["tag"] == "TagA"
        assert event["properties"] == {"color": "red"}
        assert event["keys"][0].startswith("rk")
        assert not event["corrupted"]
    # everything was acked: a second consumer of the group finds nothing
    again = run_py5(env, "consume", ep, "RecvTopic", "RecvGroup", expect=1, timeout=4)
    assert again.of("received") == []


def test_fifo_and_three_mib_round_trip_over_tls(
    py5: Path, grpc_proxy: SubprocessProxy, env: dict[str, str]
) -> None:
    ep = grpc_proxy.address
    produced = run_py5(env, "produce", ep, "BigTopic", "g1", count=2, body_bytes=str(3 * MIB), tls=True)
    assert produced.returncode == 0, produced.stderr
    consumed = run_py5(env, "consume", ep, "BigTopic", "BigGroup", expect=2, timeout=30, tls=True)
    assert consumed.returncode == 0, consumed.stderr
    received = consumed.of("received")
    assert [e["size"] for e in received] == [3 * MIB, 3 * MIB]
    assert sorted(e["md5"] for e in received) == sorted(e["md5"] for e in produced.of("sent"))
    assert {e["group"] for e in received} == {"g1"}


def test_remoting_messages_reach_a_grpc_consumer_intact(
    py5: Path, grpc_proxy: SubprocessProxy, env: dict[str, str], client: Callable[[str], Any]
) -> None:
    """remoting -> gRPC: tag, keys, properties and the message id the producer got back are preserved."""
    ep = grpc_proxy.address
    remoting = client("py044")
    produced = remoting.produce(
        ep, "RemotingToGrpc", 3, tag="TagR", key="rkey", body="hello", props={"origin": "remoting"}
    )
    assert produced.returncode == 0, produced.describe()
    consumed = run_py5(env, "consume", ep, "RemotingToGrpc", "RemotingToGrpcGroup", expect=3, timeout=30)
    assert consumed.returncode == 0, consumed.stderr
    received = consumed.of("received")
    assert sorted(e["message_id"] for e in received) == sorted(e["msg_id"] for e in produced.of("sent"))
    for event in received:
        assert event["tag"] == "TagR"
        assert event["keys"][0].startswith("rkey-")
        assert event["properties"]["origin"] == "remoting"
        assert "seq" in event["properties"]
    bodies = sorted(e["md5"] for e in received)
    assert bodies == sorted(hashlib.md5(f"hello-{i}".encode()).hexdigest() for i in range(3))


async def test_transactions_commit_rollback_and_check_back(
    py5: Path, grpc_server: ServerHandle, env: dict[str, str]
) -> None:
    """Half messages are invisible; commit publishes, rollback drops, and an open one is resolved by the
    server's check-back (RecoverOrphanedTransactionCommand on Telemetry) answered by the client's checker."""
    ep = endpoint(grpc_server)
    produced = await arun_py5(env, "transact", ep, "TxTopic", count=3, linger=4)
    assert produced.returncode == 0, produced.stderr
    sent = {e["outcome"]: e["message_id"] for e in produced.of("sent")}
    assert [e["message_id"] for e in produced.of("checked")][:1] == [sent["open"]]
    consumed = await arun_py5(env, "consume", ep, "TxTopic", "TxGroup", expect=2, timeout=20)
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(e["message_id"] for e in consumed.of("received")) == sorted([sent["commit"], sent["open"]])


# ------------------------------------------------------------------------------ Node.js client


@pytest.fixture(scope="module")
def node() -> str:
    exe = shutil.which("node")
    if exe is None or not (NODE_DIR / "node_modules" / "rocketmq-client-nodejs" / "package.json").exists():
        pytest.skip("rocketmq-client-nodejs is not installed; run scripts/setup-grpc-clients.sh")
    return exe


def test_node_client_h2c_produce_tls_consume_three_mib(
    node: str, grpc_proxy: SubprocessProxy, env: dict[str, str]
) -> None:
    """The Node client: FIFO 3 MiB messages sent over h2c, received and acked over TLS (same port)."""
    ep = grpc_proxy.address
    produced = run_node(node, env, "produce", ep, "NodeTopic", "2", str(3 * MIB), "ng")
    assert produced.returncode == 0, produced.stderr
    assert len(produced.of("sent")) == 2
    consumed = run_node(node, env, "consume", ep, "NodeTopic", "NodeGroup", "2", "30", "--tls")
    assert consumed.returncode == 0, consumed.stderr
    received = consumed.of("received")
    assert sorted(e["md5"] for e in received) == sorted(e["md5"] for e in produced.of("sent"))
    assert sorted(e["message_id"] for e in received) == sorted(e["message_id"] for e in produced.of("sent"))
    for event in received:
        assert (event["size"], event["tag"], event["group"]) == (3 * MIB, "TagN", "ng")
        assert event["properties"] == {"lang": "node"}
        assert not event.get("corrupted")


def test_node_producer_python_consumer(
    node: str, py5: Path, grpc_proxy: SubprocessProxy, env: dict[str, str]
) -> None:
    ep = grpc_proxy.address
    produced = run_node(node, env, "produce", ep, "CrossClient", "3")
    assert produced.returncode == 0, produced.stderr
    consumed = run_py5(env, "consume", ep, "CrossClient", "CrossGroup", expect=3, timeout=30)
    assert consumed.returncode == 0, consumed.stderr
    received = consumed.of("received")
    assert sorted(e["message_id"] for e in received) == sorted(e["message_id"] for e in produced.of("sent"))
    assert all(e["properties"] == {"lang": "node"} and e["tag"] == "TagN" for e in received)


# ------------------------------------------------------------------ PushConsumer, delay, invisibility, recall


def test_push_consumer_consumes_through_query_assignment_and_redelivers_failures(
    py5: Path, grpc_proxy: SubprocessProxy, env: dict[str, str]
) -> None:
    """The PushConsumer finds its queues only through QueryAssignment; every message is delivered, the
    first delivery answered FAILURE comes back (delivery attempt 2) and is then acked for good."""
    ep = grpc_proxy.address
    sent = produce(env, ep, "PushTopic", 4)
    pushed = run_py5(
        env, "push", ep, "PushTopic", "PushGroup", expect=4, timeout=60, fail_first=True, limit_s=120
    )
    assert pushed.returncode == 0, pushed.stderr + json.dumps(pushed.events)
    received = pushed.of("received")
    assert sorted({e["message_id"] for e in received}) == sorted(sent)
    for message_id in sent:
        attempts = [e for e in received if e["message_id"] == message_id]
        assert [e["attempt"] for e in attempts][:2] == [1, 2]
        assert attempts[1]["delivery_attempt"] > attempts[0]["delivery_attempt"]
    assignments = [e for e in grpc_proxy.requests("QueryAssignment") if e.get("topic") == "PushTopic"]
    assert assignments
    assert all(e["status"] == "OK" for e in assignments)
    # acked for good: a second push consumer of the group gets nothing new
    again = run_py5(env, "push", ep, "PushTopic", "PushGroup", expect=1, timeout=6)
    assert again.of("received") == []


def test_delayed_message_arrives_at_its_delivery_time_not_before(
    py5: Path, grpc_proxy: SubprocessProxy, env: dict[str, str]
) -> None:
    run = run_py5(env, "delay", grpc_proxy.address, "DelayTopic", "DelayGroup", delay_ms=3000, timeout=20)
    assert run.returncode == 0, run.stderr
    (sent,) = run.of("sent")
    (received,) = run.of("received")
    assert received["message_id"] == sent["message_id"]
    assert received["at_ms"] >= sent["due_ms"]
    assert received["at_ms"] - sent["due_ms"] < 5000
    assert received["delivery_timestamp"] == sent["due_ms"]
    # the consumer polled before the due time and got nothing
    assert [e for e in run.of("empty") if e["at_ms"] < sent["due_ms"]]


def invisible_after_one_send(
    env: dict[str, str], ep: str, name: str, mode: str, extend: int
) -> tuple[str, Run]:
    """One message sent to ``<name>Topic``, then the py5 ``invisible`` command (``mode``, ``extend`` s) as
    ``<name>Group``; the message id and the run."""
    (message_id,) = produce(env, ep, f"{name}Topic", 1)
    run = run_py5(env, "invisible", ep, f"{name}Topic", f"{name}Group", mode=mode, extend=extend, timeout=25)
    assert run.returncode == 0, run.stderr
    return message_id, run


def test_change_invisible_duration_makes_the_message_reappear_after_the_new_duration(
    py5: Path, grpc_proxy: SubprocessProxy, env: dict[str, str]
) -> None:
    message_id, run = invisible_after_one_send(env, grpc_proxy.address, "Invis", "reappear", 2)
    first, second = run.of("received")
    (changed,) = run.of("changed")
    assert first["message_id"] == second["message_id"] == message_id
    assert changed["handle_changed"]
    # back after ~2 s, long before the original 30 s invisible duration
    assert 1500 <= second["at_ms"] - changed["at_ms"] < 10_000
    assert second["attempt"] == first["attempt"] + 1
    assert run.of("done")[-1]["again"] == 0


def test_ack_with_the_changed_receipt_handle(
    py5: Path, grpc_proxy: SubprocessProxy, env: dict[str, str]
) -> None:
    message_id, run = invisible_after_one_send(env, grpc_proxy.address, "InvisAck", "ack", 1)
    (acked,) = run.of("acked")
    assert acked["message_id"] == message_id
    assert run.of("changed")[0]["handle_changed"]
    # acked with the new handle: not redelivered after the 1 s invisible duration
    assert run.of("done")[-1]["again"] == 0
    acks = [e for e in grpc_proxy.requests("AckMessage") if e.get("topic") == "InvisAckTopic"]
    assert acks
    assert all(e["status"] == "OK" for e in acks)


def test_transactional_producer_commit_and_rollback_over_tls(
    py5: Path, grpc_proxy: SubprocessProxy, env: dict[str, str]
) -> None:
    ep = grpc_proxy.address
    produced = run_py5(env, "transact-tls", ep, "TxTlsTopic", count=4, tls=True)
    assert produced.returncode == 0, produced.stderr
    sent = produced.of("sent")
    committed = sorted(e["message_id"] for e in sent if e["outcome"] == "commit")
    assert len(committed) == 2
    ends = [e for e in grpc_proxy.requests("EndTransaction") if e.get("topic") == "TxTlsTopic"]
    assert [e["status"] for e in ends] == ["OK"] * 4
    negotiated = [
        e for e in grpc_proxy.events() if e.get("event") == "conn.negotiated" and e["protocol"] == "grpc"
    ]
    assert any(e["tls"] for e in negotiated)
    consumed = run_py5(env, "consume", ep, "TxTlsTopic", "TxTlsGroup", expect=2, timeout=20, tls=True)
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(e["message_id"] for e in consumed.of("received")) == committed
    # the rolled-back ones never show up
    again = run_py5(env, "consume", ep, "TxTlsTopic", "TxTlsGroup", expect=1, timeout=4, tls=True)
    assert again.of("received") == []


def test_recall_of_a_delayed_message_with_the_python_client(
    py5: Path, grpc_proxy: SubprocessProxy, env: dict[str, str]
) -> None:
    """Producer.recall_message with the handle from the SendReceipt cancels a delayed message; the other
    one is delivered; recalling after the delivery time is answered MESSAGE_NOT_FOUND."""
    run = run_py5(env, "recall", grpc_proxy.address, "RecallTopic", "RecallGroup", delay_ms=2000, timeout=6)
    assert run.returncode == 0, run.stderr
    recalled_sent, kept_sent = run.of("sent")
    assert recalled_sent["recall_handle"]
    assert kept_sent["recall_handle"]
    (recalled,) = run.of("recalled")
    assert recalled["message_id"] == recalled_sent["message_id"]
    assert [e["message_id"] for e in run.of("received")] == [kept_sent["message_id"]]
    # Too late once delivered: the proxy answers MESSAGE_NOT_FOUND, which the 5.1.2 client does not raise
    # (its result checker lets 40401 pass) but reports as an empty message id.
    (late,) = run.of("late_recall")
    assert (late["ok"], late["message_id"]) == (True, "")
    recalls = [e for e in grpc_proxy.requests("RecallMessage") if e.get("topic") == "RecallTopic"]
    assert [e["status"] for e in recalls] == ["OK", "MESSAGE_NOT_FOUND"]
