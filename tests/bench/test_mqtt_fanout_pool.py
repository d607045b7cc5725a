"""The MQTT bench's QoS 0 subscriber pool (bench/_mqtt_pool.py ``SubscriberPool``) against a scripted
in-test broker: it subscribes everyone with the project codec, counts whole deliveries per subscriber in
its own process, flags byte counts that are not whole packets and broker disconnects, turns refusals
into LoadError, and leaves no process or socket behind."""

from __future__ import annotations

import os
import resource
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
import trio

from mqproxy.codecs.mqtt import (
    Connack,
    Connect,
    MqttDecoder,
    Publish,
    QoS,
    ReasonCode,
    SubAck,
    Subscribe,
    encode,
)

from ..conftest import wait_until  # type: ignore[import-not-found]

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))  # bench scripts import their helpers as top-level modules; so does the child
from _mqtt_load import LoadError, publish_size  # noqa: E402
from _mqtt_pool import SubscriberPool  # noqa: E402
from _remoting_client import cpu_seconds  # noqa: E402

TOPIC = "bench/pool"
SIZE = publish_size(TOPIC, 64, 0)
PUBLISH = encode(Publish(TOPIC, bytes(64), QoS.AT_MOST_ONCE), 4)


@dataclass
class ScriptedBroker:
    """Accepts MQTT 3.1.1 clients on 127.0.0.1: CONNACK (or ``refuse``), SUBACK QoS 0, then only reads."""

    port: int = 0
    refuse: ReasonCode | None = None
    subscribed: list[trio.SocketStream] = field(default_factory=list)
    client_ids: list[str] = field(default_factory=list)
    ended: int = 0  # connections that reached EOF or reset

    async def serve(self, stream: trio.SocketStream) -> None:
        decoder = MqttDecoder(1 << 20)
        try:
            while data := await stream.receive_some(4096):
                for packet in decoder.receive_data(data):
                    if isinstance(packet, Connect):
                        self.client_ids.append(packet.client_id)
                        await stream.send_all(
                            encode(Connack(reason_code=self.refuse or ReasonCode.SUCCESS), 4)
                        )
                    elif isinstance(packet, Subscribe):
                        self.subscribed.append(stream)  # before the SUBACK: the pool may report ready at once
                        await stream.send_all(encode(SubAck(packet.packet_id, (ReasonCode.SUCCESS,)), 4))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.ended += 1


@asynccontextmanager
async def scripted_broker(refuse: ReasonCode | None = None) -> AsyncIterator[ScriptedBroker]:
    broker = ScriptedBroker(refuse=refuse)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, broker.serve, 0, host="127.0.0.1"))
        broker.port = listeners[0].socket.getsockname()[1]
        yield broker
        nursery.cancel_scope.cancel()


def _reaped(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


async def test_pool_counts_whole_deliveries_in_a_child_and_closes_everything() -> None:
    async with scripted_broker() as broker:
        pool = SubscriberPool(broker.port, TOPIC, 40, SIZE, "t-s")
        await pool.start()
        pid = pool.pid
        assert pid != os.getpid()
        assert len(broker.subscribed) == 40
        assert sorted(broker.client_ids) == sorted(f"t-s{i}" for i in range(40))
        for stream in broker.subscribed:
            await stream.send_all(PUBLISH * 7)
        await wait_until(lambda: pool.received == 280)
        assert cpu_seconds(pid) > 0  # the child's own CPU, what the bench reports as "pool"
        await pool.aclose()
        assert pool.received == 280
        assert pool.aligned
        assert pool.disconnected == 0
        assert _reaped(pid)
        await wait_until(lambda: broker.ended == 40)  # every subscriber socket closed
        await pool.aclose()  # idempotent


async def test_pool_flags_a_partial_packet_and_counts_only_whole_ones() -> None:
    async with scripted_broker() as broker, SubscriberPool(broker.port, TOPIC, 3, SIZE, "t-s") as pool:
        for stream in broker.subscribed:
            await stream.send_all(PUBLISH * 2)
        await broker.subscribed[1].send_all(PUBLISH[:5])
        await wait_until(lambda: pool.received_bytes == 6 * SIZE + 5)  # the 5 stray bytes too
    assert pool.received == 6
    assert not pool.aligned


async def test_pool_reports_subscribers_the_broker_closed() -> None:
    async with scripted_broker() as broker, SubscriberPool(broker.port, TOPIC, 6, SIZE, "t-s") as pool:
        for stream in broker.subscribed[:2]:
            await stream.send_all(PUBLISH)
            await stream.aclose()
        await wait_until(lambda: pool.received == 2 and pool.disconnected == 2)  # the EOFs follow the data
    assert pool.disconnected == 2
    assert pool.aligned


async def test_refused_connect_is_a_load_error_and_reaps_the_child() -> None:
    async with scripted_broker(refuse=ReasonCode.NOT_AUTHORIZED) as broker:
        pool = SubscriberPool(broker.port, TOPIC, 5, SIZE, "t-s")
        with pytest.raises(LoadError, match="CONNECT refused"):
            await pool.start()
        with pytest.raises(LoadError, match="not running"):
            _ = pool.pid
        await wait_until(lambda: broker.ended == len(broker.client_ids) > 0)


async def test_no_listener_is_a_load_error() -> None:
    with trio.socket.socket() as probe:
        await probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: connects are refused
        with pytest.raises(LoadError, match="Connection refused"):
            await SubscriberPool(port, TOPIC, 3, SIZE, "t-s").start()


async def test_more_subscribers_than_descriptors_is_refused_up_front() -> None:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    with pytest.raises(LoadError, match="open-files limit"):
        await SubscriberPool(1, TOPIC, soft, SIZE, "t-s").start()


async def test_a_child_that_died_is_a_load_error_on_close() -> None:
    async with scripted_broker() as broker:
        pool = SubscriberPool(broker.port, TOPIC, 4, SIZE, "t-s")
        await pool.start()
        pid = pool.pid
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(LoadError, match="exited without a report"):
            await pool.aclose()
        assert _reaped(pid)
        await wait_until(lambda: broker.ended == 4)  # the kernel closed its sockets
        await pool.aclose()  # already reaped: nothing left to do
