"""Fuzz tier, socket level: a few thousand mutated byte streams (remoting, MQTT, h2, PROXY and sniffer seeds
through the campaign's mutator) thrown at a running ``mqproxy serve`` on its one port. The server must stay
up, log no ``internal.error``, give back every file descriptor, and then serve normal clients.

``MQFUZZ_STREAMS`` sets the number of streams (default 5000).
"""

from __future__ import annotations

import os
import random
import socket
import struct
from pathlib import Path

import pytest
import trio

from mqproxy.codecs import mqtt as mq
from mqproxy.codecs.remoting import FLAG_RESPONSE, FrameDecoder, RemotingCommand, encode_command
from mqproxy.fuzz.mutator import Mutator
from mqproxy.fuzz.targets import TARGETS

from ..conftest import log_events, serve_proxy, wait_proxy_started, wait_until_sync  # type: ignore[import-not-found]

pytestmark = pytest.mark.fuzz

STREAMS = int(os.environ.get("MQFUZZ_STREAMS", "5000"))
_TARGETS = ("remoting", "mqtt311", "mqtt_session", "h2", "proxy", "sniff")


def _streams(count: int, seed: int = 19) -> list[bytes]:
    rng = random.Random(seed)
    mutators = [Mutator(rng, TARGETS[name].seeds(), 4096) for name in _TARGETS]
    return [mutators[i % len(mutators)].mutate() for i in range(count)]


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _accepted(log: Path) -> int:
    return sum(1 for e in log_events(log) if e["event"] == "conn.accepted")


def _ended(log: Path) -> int:
    return sum(1 for e in log_events(log) if e["event"] in ("conn.closed", "conn.rejected"))


async def _throw(port: int, data: bytes, rst: bool) -> None:
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        return
    try:
        if data:
            await stream.send_all(data)
        with trio.move_on_after(0.2):
            while await stream.receive_some(65536):
                pass
    except trio.BrokenResourceError:
        pass
    finally:
        if rst:
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await stream.aclose()


async def _storm(port: int, streams: list[bytes]) -> None:
    limiter = trio.CapacityLimiter(48)

    async def one(index: int, data: bytes) -> None:
        async with limiter:
            await _throw(port, data, rst=index % 2 == 0)

    async with trio.open_nursery() as nursery:
        for index, data in enumerate(streams):
            nursery.start_soon(one, index, data)


async def _normal_clients(port: int) -> None:
    with trio.fail_after(10):
        # remoting: a heartbeat is answered with the same opaque
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        body = b'{"clientID":"fuzz@1","consumerDataSet":[],"producerDataSet":[{"groupName":"PG"}]}'
        await stream.send_all(encode_command(RemotingCommand(34, opaque=77, body=body)))
        decoder, replies = FrameDecoder(), list[RemotingCommand]()
        while not replies:
            replies = decoder.receive_data(await stream.receive_some(65536))
        assert replies[0].opaque == 77
        assert replies[0].flag & FLAG_RESPONSE
        await stream.aclose()
        # MQTT 3.1.1: CONNECT gets a successful CONNACK
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(mq.encode(mq.Connect("fuzz-after", 4), 4))
        mqtt = mq.MqttDecoder(1 << 20, protocol_level=4)
        packets: list[mq.Packet] = []
        while not packets:
            packets = mqtt.receive_data(await stream.receive_some(65536))
        assert packets[0] == mq.Connack(False, mq.ReasonCode.SUCCESS)
        await stream.aclose()
        # HTTP: /healthz answers 200
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await stream.receive_some(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:80]
        await stream.aclose()


@pytest.mark.timeout(900)
def test_mutated_streams_leave_the_server_up_and_serving(tmp_path: Path) -> None:
    log = tmp_path / "proxy.log"
    with log.open("wb") as out:
        proc = serve_proxy(tmp_path / "data", "--log-format", "json", stdout=out,
                           env={"MQPROXY_LOG_REQUEST_SAMPLE_RATE": "0"})
    try:
        _, port = wait_proxy_started(proc, log)
        trio.run(_normal_clients, port)
        before = _fds(proc.pid)
        streams = _streams(STREAMS)
        trio.run(_storm, port, streams)
        assert proc.poll() is None
        wait_until_sync(lambda: _fds(proc.pid) <= before, limit_s=60)
        trio.run(_normal_clients, port)
        # every stream was accepted and its connection ended (the log line may trail the close a little)
        wait_until_sync(lambda: _ended(log) == _accepted(log) >= STREAMS + 3, limit_s=30)
        assert [e for e in log_events(log) if e["event"] == "internal.error"] == []
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(20)
        if proc.stderr is not None:
            proc.stderr.close()
