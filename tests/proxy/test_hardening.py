"""Slow tier (issue 19, item 9): thousands of idle and slow-loris sockets do not starve other clients and
their memory comes back; publish floods are slowed by back-pressure with bounded memory; consumers that
never read do not grow memory without bound. Server memory is measured with tracemalloc (the sockets are
held by a helper process, so only the server's allocations are counted); the figures are printed (``-s``)
and quoted in the README's "Reliability" section."""

from __future__ import annotations

import gc
import io
import json
import resource
import struct
import sys
import textwrap
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from mqproxy.codecs import mqtt as mq
from mqproxy.codecs.remoting import FLAG_ONEWAY, FrameDecoder, RemotingCommand, encode_command
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.log import configure_logging
from mqproxy.server import ServerHandle
from mqproxy.settings import LogSettings, Settings

from ..conftest import wait_until  # type: ignore[import-not-found]
from .conftest import running_server  # type: ignore[import-not-found]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.usefixtures("log_sink")]

MAX_SOCKETS = 10_000
MB = 1 << 20

#: Openings a held socket sends (then nothing more): silence, half a remoting frame, half an HTTP request,
#: a CONNECT cut after its protocol level, the h2 preface without SETTINGS.
OPENINGS = [
    "",
    struct.pack(">ii", 200, 60).hex() + b'{"code":105,"flag":0,"opaque":1,'.hex(),
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nAcc".hex(),
    b"\x10\x20\x00\x04MQTT\x04".hex(),
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".hex(),
]

HOLDER = textwrap.dedent(
    """
    import json, resource, socket, sys
    host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    openings = [bytes.fromhex(o) for o in json.loads(sys.argv[4])]
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    held = []
    for i in range(count):
        s = socket.create_connection((host, port))
        if openings[i % len(openings)]:
            s.sendall(openings[i % len(openings)])
        held.append(s)
    print(len(held), flush=True)
    sys.stdin.read()  # hold them until the test closes stdin
    """
)


def _raise_fd_limit() -> int:
    """Raise this process's soft descriptor limit to the hard one; the sockets the test can afford."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return max(0, min(MAX_SOCKETS, hard - 1024))


def _traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


@asynccontextmanager
async def _traced_server(settings: Settings) -> AsyncIterator[ServerHandle]:
    tracemalloc.start()
    try:
        async with running_server(settings) as handle:
            yield handle
    finally:
        tracemalloc.stop()


class _Mqtt:
    def __init__(self, stream: trio.SocketStream, level: int = 4) -> None:
        self.stream, self.level = stream, level
        self.decoder = mq.MqttDecoder(1 << 24, protocol_level=level)
        self.pending: list[mq.Packet] = []

    @classmethod
    async def connect(cls, address: tuple[str, int], client_id: str) -> _Mqtt:
        client = cls(await trio.open_tcp_stream(*address))
        await client.send(mq.Connect(client_id, 4))
        assert isinstance(await client.receive(), mq.Connack)
        return client

    async def send(self, packet: mq.Packet) -> None:
        await self.stream.send_all(mq.encode(packet, self.level))

    async def receive(self) -> mq.Packet:
        while not self.pending:
            data = await self.stream.receive_some(65536)
            assert data, "closed"
            self.pending.extend(self.decoder.receive_data(data))
        return self.pending.pop(0)


class _Remoting:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream, self.decoder = stream, FrameDecoder()
        self.ready: list[RemotingCommand] = []

    async def request(self, command: RemotingCommand) -> RemotingCommand:
        await self.stream.send_all(encode_command(command))
        while not self.ready:
            data = await self.stream.receive_some(65536)
            assert data, "closed"
            self.ready.extend(self.decoder.receive_data(data))
        return self.ready.pop(0)


def _send(opaque: int, topic: str, body: bytes, oneway: bool = False) -> RemotingCommand:
    ext = {"a": "PG", "b": topic, "e": "0", "f": "0", "g": "0", "h": "0", "i": ""}
    flag = FLAG_ONEWAY if oneway else 0
    return RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=opaque, flag=flag, ext_fields=ext, body=body)


def _pull(opaque: int, topic: str) -> RemotingCommand:
    ext = {"consumerGroup": "G", "topic": topic, "queueId": "0", "queueOffset": "0", "maxMsgNums": "32",
           "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*",
           "subVersion": "0"}  # fmt: skip
    return RemotingCommand(RequestCode.PULL_MESSAGE, opaque=opaque, ext_fields=ext)


async def _still_served(address: tuple[str, int]) -> None:
    """An MQTT client publishes to itself and a remoting client sends and pulls: both are answered."""
    with trio.fail_after(120):  # a hang guard, not a latency bound
        mqtt = await _Mqtt.connect(address, "probe")
        await mqtt.send(mq.Subscribe(1, (mq.SubscribeTopic("probe/t", mq.QoS.AT_LEAST_ONCE),)))
        assert isinstance(await mqtt.receive(), mq.SubAck)
        await mqtt.send(mq.Publish("probe/t", b"hello", mq.QoS.AT_LEAST_ONCE, False, False, 7))
        kinds = {type(await mqtt.receive()) for _ in range(2)}
        assert kinds == {mq.PubAck, mq.Publish}
        await mqtt.stream.aclose()
        remoting = _Remoting(await trio.open_tcp_stream(*address))
        assert (await remoting.request(_send(1, "Probe", b"hi"))).code == ResponseCode.SUCCESS
        assert (await remoting.request(_pull(2, "Probe"))).code == ResponseCode.SUCCESS
        await remoting.stream.aclose()


async def test_ten_thousand_idle_and_slow_loris_sockets_do_not_starve_others(tmp_path: Path) -> None:
    count = _raise_fd_limit()
    assert count >= 1000, "the descriptor hard limit is too low for this test"
    patient = {"sniff_timeout_s": 300.0, "frame_timeout_s": 300.0, "idle_timeout_s": 300.0}
    settings = Settings.for_tests(tmp_path, server=patient, mqtt={"connect_timeout_s": 300.0})
    # 20,000 connection events kept by the test's log capture would count as server memory: drop them
    configure_logging(LogSettings(level="warning"), stream=io.BytesIO(), cache=False)
    async with _traced_server(settings) as handle:
        await _still_served(handle.address)  # warm up: topics, sessions, caches exist before measuring
        await wait_until(lambda: handle.state.open_connections == 0)
        baseline = _traced()
        host, port = handle.address
        holder = await trio.lowlevel.open_process(
            [sys.executable, "-c", HOLDER, host, str(port), str(count), json.dumps(OPENINGS)],
            stdin=-1,
            stdout=-1,
        )
        try:
            assert holder.stdout is not None
            assert holder.stdin is not None
            with trio.fail_after(300):
                line = await holder.stdout.receive_some(64)
            assert int(line) == count
            await wait_until(lambda: handle.state.open_connections >= count, 300)
            held = _traced() - baseline
            await _still_served(handle.address)
        finally:
            if holder.stdin is not None:
                await holder.stdin.aclose()
            with trio.fail_after(60):
                await holder.wait()
        await wait_until(lambda: handle.state.open_connections == 0, 120)
        after = _traced() - baseline
    per_socket = held / count
    print(
        f"\n{count} held sockets: {held / MB:.1f} MB traced, {per_socket:.0f} B per socket; "
        f"{after / MB:.2f} MB after they closed"
    )
    # A held socket costs its tasks, cancel scopes and protocol state (an HTTP/2 one ~8 KB of h2 settings
    # and HPACK tables), ~17 KB measured; never a read buffer per socket.
    assert per_socket < 32 * 1024
    assert after < held / 20  # what the held sockets took came back (trio keeps a few grown arrays)


async def _flood_mqtt(address: tuple[str, int], messages: int, size: int = 64) -> float:
    """QoS 0 PUBLISHes of ``size`` bytes, as fast as the server takes them; the seconds it took."""
    client = await _Mqtt.connect(address, "flooder")
    publishes = (mq.Publish(f"flood/{i % 16}", bytes(size), mq.QoS.AT_MOST_ONCE) for i in range(500))
    batch = b"".join(mq.encode(publish, 4) for publish in publishes)
    started = trio.current_time()
    for _ in range(messages // 500):
        await client.stream.send_all(batch)  # waits whenever the server stops reading: back-pressure
    await client.send(mq.PingReq())
    assert isinstance(await client.receive(), mq.PingResp)  # everything before it was handled
    await client.stream.aclose()
    return trio.current_time() - started


async def test_publish_floods_are_slowed_by_back_pressure_with_bounded_memory(tmp_path: Path) -> None:
    """An MQTT QoS 0 flood (with a subscriber that reads it all) and a remoting oneway flood: the server
    reads only as fast as it stores, so the flooder waits in send_all; the memory they take stays bounded
    (the read cache's cap plus buffers), not proportional to what was sent."""
    quiet = {"request_sample_rate": 0.0}
    settings = Settings.for_tests(tmp_path, mqtt={"read_cache_bytes": 8 * MB}, log=quiet)
    messages = 30_000
    async with _traced_server(settings) as handle:
        await _still_served(handle.address)
        baseline = _traced()
        reader = await _Mqtt.connect(handle.address, "reader")
        await reader.send(mq.Subscribe(1, (mq.SubscribeTopic("flood/#", mq.QoS.AT_MOST_ONCE),)))
        assert isinstance(await reader.receive(), mq.SubAck)
        received = 0

        async def read_all() -> None:
            nonlocal received
            while data := await reader.stream.receive_some(1 << 20):
                received += len(data)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all)
            mqtt_s = await _flood_mqtt(handle.address, messages)
            await wait_until(lambda: received >= messages * 70, 120)
            nursery.cancel_scope.cancel()
        mqtt_peak = tracemalloc.get_traced_memory()[1] - baseline
        await reader.stream.aclose()

        tracemalloc.reset_peak()
        stream = await trio.open_tcp_stream(*handle.address)
        remoting = _Remoting(stream)
        frames = b"".join(encode_command(_send(n, "Flood", bytes(64), oneway=True)) for n in range(500))
        started = trio.current_time()
        for _ in range(messages // 500):
            await stream.send_all(frames)
        assert (await remoting.request(_send(0, "Flood", b"last"))).code == ResponseCode.SUCCESS
        oneway_s = trio.current_time() - started
        remoting_peak = tracemalloc.get_traced_memory()[1] - baseline
        await stream.aclose()
        store = handle.store
        assert store is not None
        stored = sum([(await store.pull("Flood", q, 0, 1)).max_offset for q in range(4)])
    print(
        f"\nMQTT QoS 0 flood: {messages} x 64 B in {mqtt_s:.1f} s, peak +{mqtt_peak / MB:.1f} MB traced; "
        f"remoting oneway flood: {messages} in {oneway_s:.1f} s, peak +{remoting_peak / MB:.1f} MB traced"
    )
    assert stored == messages + 1  # oneway requests beyond the in-flight limit waited, none was dropped
    assert mqtt_peak < 48 * MB
    assert remoting_peak < 48 * MB


async def test_consumers_that_never_read_do_not_grow_memory_without_bound(tmp_path: Path) -> None:
    """An MQTT subscriber and a remoting pull client that never read what they are sent: what waits for
    them is bounded (send_buffer_packets, the remoting outbox and in-flight limit), and the subscriber is
    disconnected after write_timeout_s."""
    settings = Settings.for_tests(
        tmp_path,
        mqtt={"write_timeout_s": 3.0, "send_buffer_packets": 256, "read_cache_bytes": 8 * MB},
        log={"request_sample_rate": 0.0},
    )
    async with _traced_server(settings) as handle:
        await _still_served(handle.address)
        baseline = _traced()
        deaf = await _Mqtt.connect(handle.address, "deaf")
        await deaf.send(mq.Subscribe(1, (mq.SubscribeTopic("flood/#", mq.QoS.AT_MOST_ONCE),)))
        assert isinstance(await deaf.receive(), mq.SubAck)
        await _flood_mqtt(handle.address, 30_000, 1024)  # 30 MB for a reader that takes none
        mqtt_peak = tracemalloc.get_traced_memory()[1] - baseline
        await wait_until(lambda: handle.state.open_connections == 0, 60)  # the deaf subscriber was cut
        await deaf.stream.aclose()

        tracemalloc.reset_peak()
        stream = await trio.open_tcp_stream(*handle.address)
        pulls = b"".join(encode_command(_pull(n, "Flood")) for n in range(200))
        sender = _Remoting(stream)
        for n in range(10):  # a topic with enough to fill every pull answer
            batch = b"".join(
                encode_command(_send(n * 100 + i, "Flood", bytes(256), True)) for i in range(100)
            )
            await stream.send_all(batch)
        assert (await sender.request(_send(0, "Flood", b"sync"))).code == ResponseCode.SUCCESS
        sent, last_taken = 0, trio.current_time()
        with trio.move_on_after(20):
            while trio.current_time() - last_taken < 3:  # else the server kept reading: fails below
                with trio.move_on_after(3):
                    await stream.send_all(pulls)
                    sent += 200
                    last_taken = trio.current_time()
        assert trio.current_time() - last_taken >= 3, "the server never stopped reading the pulls"
        remoting_peak = tracemalloc.get_traced_memory()[1] - baseline
        await stream.aclose()
    print(
        f"\nnon-reading MQTT subscriber: peak +{mqtt_peak / MB:.1f} MB traced; non-reading remoting pull "
        f"client: {sent} pulls sent before the server stopped reading, peak +{remoting_peak / MB:.1f} MB"
    )
    assert mqtt_peak < 32 * MB
    assert remoting_peak < 64 * MB  # in-flight pull answers (1024 x ~15 KB here) and the 4 MiB outbox
