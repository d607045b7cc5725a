"""Message trace end to end in one process: with ``[trace] enabled`` a remoting send, an MQTT publish and
delivery and a gRPC send, receive and ack each leave RocketMQ trace records in the trace topic, found by
the message id as ``mqadmin queryMsgTraceById`` finds them (a key query on the trace topic) and decoded
back; ``mqproxy_trace_records_total`` counts them. Each record is also logged as a ``trace.record`` event
naming the connection it came from (the producer's, the consumer's), for every protocol and for the MQTT
push hub's deliveries, which run outside the connection's task."""

from __future__ import annotations

import json
import struct

import trio

from mqproxy.codecs import mqtt as mq
from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.codecs.remoting import FrameDecoder, RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.codecs.rocketmq_trace import (
    PubRecord,
    SubAfterRecord,
    SubBeforeRecord,
    TraceRecord,
    decode,
)
from mqproxy.facade.api import MessageQuery, PullRequest
from mqproxy.metrics import render_metrics
from mqproxy.server import ServerHandle
from mqproxy.settings import Settings
from tests.conftest import EventSink, wait_until
from tests.grpc_service.conftest import GrpcTestClient
from tests.mqtt.conftest import connect, receive_publish, subscribe
from tests.proxy.conftest import running_server

TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"


async def remoting_send(address: tuple[str, int], uniq_key: str) -> RemotingCommand:
    """One SEND_MESSAGE_V2 as a Java producer of group ``PG`` frames it (tag A, key ``order-1``)."""
    props = f"TAGS\x01A\x02KEYS\x01order-1\x02UNIQ_KEY\x01{uniq_key}\x02"
    ext = {"a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1700000000001",
           "h": "0", "i": props}  # fmt: skip
    header = json.dumps(
        {"code": int(RequestCode.SEND_MESSAGE_V2), "language": "JAVA", "version": 401, "opaque": 9,
         "flag": 0, "extFields": ext}
    ).encode()  # fmt: skip
    body = b"remoting body"
    frame = struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body
    stream = await trio.open_tcp_stream(*address)
    decoder = FrameDecoder()
    try:
        await stream.send_all(frame)
        with trio.fail_after(5):
            while True:
                got = decoder.receive_data(await stream.receive_some(65536))
                if got:
                    return got[0]
    finally:
        await stream.aclose()


async def traces(server: ServerHandle, msg_id: str) -> list[TraceRecord]:
    """The trace records of ``msg_id``: the trace messages a key query finds, decoded, kept if theirs."""
    broker = server.state.broker
    assert broker is not None
    found = await broker.query_messages(MessageQuery(TRACE_TOPIC, msg_id))
    return [r for m in found for r in decode(m.body) if r.msg_id == msg_id]


def kinds(records: list[TraceRecord]) -> list[str]:
    return sorted(type(r).__name__ for r in records)


def conn_of(log_sink: EventSink, **fields: object) -> str:
    """The ``conn_id`` of the one connection whose ``request`` events include one with ``fields``."""
    found = {
        e["conn_id"]
        for e in log_sink.requests()
        if all(e.get(name) == value for name, value in fields.items())
    }
    assert len(found) == 1, (fields, found)
    return found.pop()


def logged(log_sink: EventSink, msg_id: str) -> dict[str, list[dict[str, object]]]:
    """The ``trace.record`` events of ``msg_id`` by trace type."""
    out: dict[str, list[dict[str, object]]] = {}
    for event in log_sink.named("trace.record"):
        if event["msg_id"] == msg_id:
            out.setdefault(str(event["trace_type"]), []).append(event)
    return out


async def test_every_protocol_leaves_trace_records(log_sink: EventSink) -> None:
    settings = Settings.for_tests(trace={"enabled": True})
    async with running_server(settings) as server:
        # --- remoting: a Java producer's send -----------------------------------------------------
        sent = await remoting_send(server.address, "AC1000010000000000000000000REM01")
        assert sent.code == ResponseCode.SUCCESS, sent.remark

        async def remoting_traced() -> bool:
            return bool(await traces(server, "AC1000010000000000000000000REM01"))

        await wait_until(remoting_traced)
        (pub,) = await traces(server, "AC1000010000000000000000000REM01")
        assert isinstance(pub, PubRecord)
        assert (pub.group, pub.topic, pub.tags, pub.keys, pub.body_length, pub.success) == (
            "PG", "T", "A", "order-1", len(b"remoting body"), True
        )  # fmt: skip
        assert pub.offset_msg_id  # where it was stored
        assert server.state.broker is not None
        by_key = await server.state.broker.query_messages(MessageQuery(TRACE_TOPIC, "order-1"))
        assert by_key  # the message keys index the trace message too
        (pub_event,) = logged(log_sink, "AC1000010000000000000000000REM01")["Pub"]
        assert pub_event["conn_id"] == conn_of(log_sink, op="SEND_MESSAGE_V2", topic="T")
        assert (pub_event["protocol"], pub_event["group"], pub_event["topic"], pub_event["keys"]) == (
            "remoting", "PG", "T", "order-1"
        )  # fmt: skip
        assert pub_event["timestamp_ms"] == pub.timestamp_ms
        assert pub_event["success"] is True

        # --- MQTT: a publish and its QoS 1 delivery ----------------------------------------------
        subscriber, _ = await connect(server.address, "sub-1", level=mq.MQTT_5)
        await subscribe(subscriber, ("home/+/temp", mq.QoS.AT_LEAST_ONCE))
        # QoS 0 to a caught-up reader: delivered by the LMQ's push hub, a task of no connection
        quiet, _ = await connect(server.address, "sub-0", level=mq.MQTT_5)
        await subscribe(quiet, ("home/#", mq.QoS.AT_MOST_ONCE))
        publisher, _ = await connect(server.address, "pub-1", level=mq.MQTT_5)
        await publisher.send(mq.Publish("home/kitchen/temp", b"21.5", mq.QoS.AT_LEAST_ONCE, packet_id=7))
        assert isinstance(await publisher.receive(), mq.PubAck)
        got = await receive_publish(subscriber)  # PUBACKed
        assert got.payload == b"21.5"
        assert (await receive_publish(quiet)).payload == b"21.5"

        async def mqtt_traced() -> bool:
            records = await all_trace_records(server)
            acked = {r.group for r in records if isinstance(r, SubAfterRecord)}
            return {"sub-1", "sub-0"} <= acked

        await wait_until(mqtt_traced)
        # the MQTT publish came without a UNIQ_KEY: it was given one, the id its delivery is traced by
        records = await all_trace_records(server)
        mqtt_pubs = [r for r in records if isinstance(r, PubRecord) and r.group == "pub-1"]
        assert len(mqtt_pubs) == 1
        mqtt_id = mqtt_pubs[0].msg_id
        assert mqtt_pubs[0].topic == "home"  # the MQTT topic's parent RocketMQ topic
        mine = await traces(server, mqtt_id)
        assert kinds(mine) == ["PubRecord", *["SubAfterRecord"] * 2, *["SubBeforeRecord"] * 2]
        before = next(r for r in mine if isinstance(r, SubBeforeRecord) and r.group == "sub-1")
        after = next(r for r in mine if isinstance(r, SubAfterRecord) and r.group == "sub-1")
        assert after.success
        assert after.request_id == before.request_id
        events = logged(log_sink, mqtt_id)
        sub_conn, quiet_conn = conn_of(log_sink, client_id="sub-1"), conn_of(log_sink, client_id="sub-0")
        assert [(e["conn_id"], e["protocol"]) for e in events["Pub"]] == [
            (conn_of(log_sink, client_id="pub-1", op="PUBLISH"), "mqtt")
        ]
        assert {(e["group"], e["conn_id"], e["protocol"]) for e in events["SubBefore"]} == {
            ("sub-1", sub_conn, "mqtt"), ("sub-0", quiet_conn, "mqtt")
        }  # fmt: skip
        assert {(e["group"], e["conn_id"]) for e in events["SubAfter"]} == {
            ("sub-1", sub_conn), ("sub-0", quiet_conn)
        }  # fmt: skip
        by_group = {e["group"]: e for e in events["SubBefore"] + events["SubAfter"]}
        assert by_group["sub-1"]["request_id"] == before.request_id
        await quiet.aclose()
        await subscriber.aclose()
        await publisher.aclose()

        # --- gRPC: send, receive, ack --------------------------------------------------------------
        async with trio.open_nursery() as nursery:
            grpc = GrpcTestClient(await trio.open_tcp_stream(*server.address), "g@1@0")
            await grpc.start(nursery)
            sp = pb.SystemProperties(
                message_id="GRPC-MSG-1", tag="B", keys=["gk"], body_encoding=pb.Encoding.IDENTITY
            )
            message = pb.RmqMessage(topic=pb.Resource(name="G_T"), system_properties=sp, body=b"grpc")
            sent_grpc = await grpc.unary("SendMessage", pb.SendMessageRequest(messages=[message]))
            assert sent_grpc.status.code == pb.Code.OK, sent_grpc.status.message
            request = pb.ReceiveMessageRequest(
                group=pb.Resource(name="GG"),
                message_queue=pb.MessageQueue(topic=pb.Resource(name="G_T")),
                filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
                batch_size=4,
                invisible_duration=pb.Duration(seconds=30),
                long_polling_timeout=pb.Duration(seconds=1),
            )
            sid = await grpc.open("ReceiveMessage", [request.SerializeToString()], grpc_timeout="10S")
            result = await grpc.wait(sid, limit_s=10)
            received = [pb.ReceiveMessageResponse.FromString(m) for m in result.messages()]
            msgs = [r.message for r in received if r.WhichOneof("content") == "message"]
            assert [m.system_properties.message_id for m in msgs] == ["GRPC-MSG-1"]
            entry = pb.AckMessageEntry(
                message_id="GRPC-MSG-1", receipt_handle=msgs[0].system_properties.receipt_handle
            )
            acked = await grpc.unary(
                "AckMessage",
                pb.AckMessageRequest(
                    group=pb.Resource(name="GG"), topic=pb.Resource(name="G_T"), entries=[entry]
                ),
            )
            assert acked.status.code == pb.Code.OK, acked.status.message
            nursery.cancel_scope.cancel()

        async def grpc_traced() -> bool:
            return len(await traces(server, "GRPC-MSG-1")) == 3

        await wait_until(grpc_traced)
        mine = await traces(server, "GRPC-MSG-1")
        assert kinds(mine) == ["PubRecord", "SubAfterRecord", "SubBeforeRecord"]
        pub = next(r for r in mine if isinstance(r, PubRecord))
        assert (pub.topic, pub.tags, pub.keys) == ("G_T", "B", "gk")
        after = next(r for r in mine if isinstance(r, SubAfterRecord))
        assert (after.group, after.success) == ("GG", True)
        grpc_conn = conn_of(log_sink, op="SendMessage")
        events = logged(log_sink, "GRPC-MSG-1")
        assert sorted(events) == ["Pub", "SubAfter", "SubBefore"]
        assert {(e["conn_id"], e["protocol"]) for found in events.values() for e in found} == {
            (grpc_conn, "grpc")
        }
        assert events["SubAfter"][0]["cost_ms"] == after.cost_ms
        # the trace topic's own messages are never traced; every record is counted as written
        records = await all_trace_records(server)
        assert all(r.msg_id for r in records)
        assert len(log_sink.named("trace.record")) == len(records)  # every record logged once
        exposition = render_metrics(server.state)[0].decode()
        assert f'mqproxy_trace_records_total{{result="written"}} {float(len(records))}' in exposition
        assert 'mqproxy_trace_records_total{result="dropped"} 0.0' in exposition


async def all_trace_records(server: ServerHandle) -> list[TraceRecord]:
    broker = server.state.broker
    assert broker is not None
    out: list[TraceRecord] = []
    offset = 0
    while True:
        pulled = await broker.pull(PullRequest("", TRACE_TOPIC, 0, offset, 32))
        if not pulled.messages:
            return out
        for m in pulled.messages:
            out.extend(decode(m.body))
        offset = pulled.next_offset
