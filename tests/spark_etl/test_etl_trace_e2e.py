"""End to end: a real proxy with ``[trace] enabled``, a paho MQTT publisher and subscriber and a remoting
client (the project's own) that sends and pulls; then the batch job over that proxy's log file must name,
for each message, the producer's socket address and every consumer that was handed it."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from mqproxy.backends.rocketmq import wire
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.model.types import PROPERTY_UNIQ_KEY, Message
from mqproxy.remoting_client import RemotingConnection
from tests.conftest import log_events, serve_proxy, wait_proxy_started
from tests.e2e.paho_driver import V311, PahoClient

pytestmark = [pytest.mark.spark, pytest.mark.e2e]

REMOTING_CLIENT = "127.0.0.1@etl-trace"
PRODUCERS, CONSUMERS = "EtlTraceProducers", "EtlTraceConsumers"
REMOTING_MSG = "7F00000100002A9F00000000000E7101"
#: PULL_MESSAGE flags: commit offset, subscription in the request.
COMMIT, SUBSCRIPTION = 0x1, 0x4


def _address(sockname: Any) -> str:
    return f"{sockname[0]}:{sockname[1]}"


def _local(client: PahoClient) -> str:
    """The address of ``client``'s socket, host:port, as the proxy sees its peer."""
    sock: Any = client.paho.socket()
    return _address(sock.getsockname())


async def _pull_all(conn: RemotingConnection, topic: str) -> int:
    """Pull every queue of ``topic`` from offset 0 as ``CONSUMERS``, then commit what was found (the
    commit is what makes the proxy trace the acknowledgement); how many queues had messages."""
    found = 0
    for queue_id in range(64):
        ext: dict[str, object] = {
            "consumerGroup": CONSUMERS, "topic": topic, "queueId": queue_id, "queueOffset": 0,
            "maxMsgNums": 32, "sysFlag": SUBSCRIPTION, "commitOffset": 0, "suspendTimeoutMillis": 0,
            "subscription": "*", "expressionType": "TAG", "subVersion": 0,
        }  # fmt: skip
        answer = await conn.request(wire.command(RequestCode.PULL_MESSAGE, ext), 10)
        if answer.code == ResponseCode.INVALID_PARAMETER:  # no such queue: all were read
            return found
        if answer.code != ResponseCode.SUCCESS:
            continue
        found += 1
        next_offset = int(answer.ext_fields["nextBeginOffset"])
        ext.update(queueOffset=next_offset, commitOffset=next_offset, sysFlag=SUBSCRIPTION | COMMIT)
        await conn.request(wire.command(RequestCode.PULL_MESSAGE, ext), 10)
    return found


async def _remoting(address: tuple[str, int]) -> str:
    """Send one message as ``PRODUCERS``, pull it and the MQTT publish back as ``CONSUMERS``; the client's
    socket address."""
    stream = await trio.open_tcp_stream(*address)
    local = _address(stream.socket.getsockname())
    conn = RemotingConnection(stream, _address(address))
    async with trio.open_nursery() as nursery:
        await nursery.start(conn.run)
        beat = wire.command(
            RequestCode.HEART_BEAT, None, wire.heartbeat_body(REMOTING_CLIENT, [], [PRODUCERS])
        )
        assert (await conn.request(beat, 10)).code == ResponseCode.SUCCESS
        message = Message(topic="EtlTrace", body=b"remoting", properties={PROPERTY_UNIQ_KEY: REMOTING_MSG})
        sent = await conn.request(wire.send_request(message, "broker-a", 0, PRODUCERS, None, 4), 10)
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        assert await _pull_all(conn, "EtlTrace") == 1
        assert await _pull_all(conn, "etl") == 1  # the MQTT publish, stored under its parent topic
        await conn.aclose()
        nursery.cancel_scope.cancel()
    return local


def test_message_paths_name_the_real_producer_and_consumers(spark: Any, tmp_path: Path) -> None:
    from mqproxy.spark_etl.batch import run_batch

    log = tmp_path / "logs" / "mqproxy.log"
    env = {"MQPROXY_LOG_FILE": str(log), "MQPROXY_TRACE_ENABLED": "true"}
    proc = serve_proxy(tmp_path / "data", stdout=subprocess.DEVNULL, env=env)
    try:
        address = wait_proxy_started(proc, log)
        subscriber = PahoClient(address[1], "etl-sub", V311)
        assert subscriber.subscribe(("etl/trace/#", 1)) == [1]
        publisher = PahoClient(address[1], "etl-pub", V311)
        pub_addr, sub_addr = _local(publisher), _local(subscriber)
        publisher.publish("etl/trace/1", b"mqtt", qos=1)
        assert bytes(subscriber.get(timeout=10).payload) == b"mqtt"
        remoting_addr = trio.run(_remoting, address)
        publisher.close()
        subscriber.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    records = [e for e in log_events(log) if e["event"] == "trace.record"]
    (mqtt_pub,) = [e for e in records if e["trace_type"] == "Pub" and e["group"] == "etl-pub"]

    out = tmp_path / "tables"
    summary = run_batch(spark, str(log.parent), str(out))
    assert summary.malformed == 0
    assert summary.table_rows["message_trace"] == len(records)
    paths = {
        r.msg_id: r.asDict(recursive=True) for r in spark.read.parquet(str(out / "message_paths")).collect()
    }

    mqtt_path = paths[mqtt_pub["msg_id"]]
    assert (mqtt_path["producer_protocol"], mqtt_path["producer_peer"], mqtt_path["producer_client_id"]) == (
        "mqtt", pub_addr, "etl-pub"
    )  # fmt: skip
    assert mqtt_path["topic"] == "etl"
    consumers = {(c["protocol"], c["peer"], c["group"], c["client_id"]) for c in mqtt_path["consumers"]}
    assert consumers == {
        ("mqtt", sub_addr, "etl-sub", "etl-sub"), ("remoting", remoting_addr, CONSUMERS, REMOTING_CLIENT)
    }  # fmt: skip
    assert mqtt_path["consumer_count"] == 2
    assert mqtt_path["acks"] == 2  # the MQTT PUBACK and the remoting consumer's committed offset
    assert mqtt_path["first_delivery_ms"] is not None
    assert mqtt_path["published_at"] is not None

    remoting_path = paths[REMOTING_MSG]
    producer = ("producer_protocol", "producer_peer", "producer_client_id", "producer_group")
    assert tuple(remoting_path[c] for c in producer) == (
        "remoting",
        remoting_addr,
        REMOTING_CLIENT,
        PRODUCERS,
    )
    assert [(c["protocol"], c["group"]) for c in remoting_path["consumers"]] == [("remoting", CONSUMERS)]
    assert (remoting_path["deliveries"], remoting_path["acks"]) == (1, 1)
