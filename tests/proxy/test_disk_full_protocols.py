"""A full disk through the real server: every protocol (remoting, MQTT 5 and 3.1.1, gRPC) refuses new
messages with its own error naming the cause, the store logs one ``store.write_refused``, and publishing
works again once space is back."""

from __future__ import annotations

import errno
import json
import struct
from pathlib import Path
from typing import Any

import pytest
import trio

from mqproxy.backends.embedded import commitlog
from mqproxy.codecs import mqtt as mq
from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.codecs.remoting import FrameDecoder, RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.metrics import render_metrics
from mqproxy.settings import Settings
from tests.conftest import EventSink, wait_until
from tests.grpc_service.conftest import GrpcTestClient
from tests.mqtt.conftest import connect
from tests.proxy.conftest import running_server


def _no_space(fd: int, data: bytes, offset: int) -> int:
    raise OSError(errno.ENOSPC, "No space left on device")


async def _remoting_send(address: tuple[str, int], body: bytes) -> RemotingCommand:
    """One SEND_MESSAGE_V2 as a Java producer frames it, over TCP; the response."""
    ext = {"a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1700000000001",
           "h": "0", "i": "TAGS\x01A\x02"}  # fmt: skip
    header = json.dumps(
        {
            "code": int(RequestCode.SEND_MESSAGE_V2),
            "language": "JAVA",
            "version": 401,
            "opaque": 9,
            "flag": 0,
            "extFields": ext,
        }
    ).encode()
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


async def test_disk_full_through_mqtt_and_remoting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log_sink: EventSink
) -> None:
    async with running_server(Settings.for_tests(tmp_path / "data")) as server:
        ok = await _remoting_send(server.address, b"before")
        assert ok.code == ResponseCode.SUCCESS, ok.remark
        v5, _ = await connect(server.address, "c5", level=mq.MQTT_5)
        v3, _ = await connect(server.address, "c3", level=4)
        monkeypatch.setattr(commitlog.os, "pwrite", _no_space)

        refused = await _remoting_send(server.address, b"refused")
        assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert "the broker's disk is full" in (refused.remark or "")

        await v5.send(mq.Publish("a/b", b"x", mq.QoS.AT_LEAST_ONCE, packet_id=1))
        ack = await v5.receive()
        assert isinstance(ack, mq.PubAck)
        assert ack.reason_code == mq.ReasonCode.QUOTA_EXCEEDED  # 0x97, no longer 0x83
        assert "disk is full" in (ack.properties.reason_string or "")

        await v3.send(mq.Publish("a/b", b"x", mq.QoS.AT_LEAST_ONCE, packet_id=1))
        assert await v3.expect_eof() == []  # 3.1.1 cannot refuse one PUBLISH: the connection closes

        async with trio.open_nursery() as nursery:  # gRPC, as the Apache proxy answers a full broker
            grpc = GrpcTestClient(await trio.open_tcp_stream(*server.address), "full@1@0")
            await grpc.start(nursery)
            sp = pb.SystemProperties(message_id="FULL-1", body_encoding=pb.Encoding.IDENTITY)
            message = pb.RmqMessage(topic=pb.Resource(name="T"), system_properties=sp, body=b"x")
            sent = await grpc.unary("SendMessage", pb.SendMessageRequest(messages=[message]))
            assert sent.status.code == pb.Code.INTERNAL_SERVER_ERROR
            assert "the broker's disk is full" in sent.status.message
            nursery.cancel_scope.cancel()

        exposition = render_metrics(server.state)[0].decode()
        assert "mqproxy_store_writable 0.0" in exposition
        assert "mqproxy_store_disk_free_bytes" in exposition
        refused_events: list[dict[str, Any]] = log_sink.named("store.write_refused")
        assert len(refused_events) == 1
        assert refused_events[0]["cause"] == "disk_full"

        monkeypatch.undo()  # space is back (the real disk has plenty)
        await wait_until(lambda: bool(log_sink.named("store.write_resumed")))
        await v5.send(mq.Publish("a/b", b"y", mq.QoS.AT_LEAST_ONCE, packet_id=2))
        ack = await v5.receive()
        assert isinstance(ack, mq.PubAck)
        assert ack.reason_code == mq.ReasonCode.SUCCESS
        again = await _remoting_send(server.address, b"after")
        assert again.code == ResponseCode.SUCCESS, again.remark
        assert "mqproxy_store_writable 1.0" in render_metrics(server.state)[0].decode()
        await v5.aclose()
        await v3.aclose()


def test_grpc_answers_a_full_disk_as_the_apache_proxy_does() -> None:
    from mqproxy.grpc_service.errors import code_for
    from mqproxy.model.errors import StoreFull

    # the proxy maps the broker's SERVICE_NOT_AVAILABLE to INTERNAL_SERVER_ERROR, remark as message
    full = StoreFull("disk_full", "CL:  0.95")
    assert code_for(full) == pb.Code.INTERNAL_SERVER_ERROR
    assert "disk is full [CL:  0.95]" in str(full)
