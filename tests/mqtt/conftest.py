"""The MQTT test harness: an in-process server, a raw async MQTT client over loopback and the client steps
every test takes (:func:`connect`, :func:`subscribe`, :func:`receive_publish`).

Waiting without a clock: :func:`all_parked` (every reader caught up), :func:`arrivals` (what the server
sends until it has nothing more to send; ``== []`` checks that nothing arrives) and :func:`drain`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from mqproxy.codecs import mqtt as mq
from mqproxy.mqtt.gateway import Gateway
from mqproxy.server import ServerHandle
from mqproxy.settings import Settings

from ..conftest import wait_until  # type: ignore[import-not-found]
from ..proxy.conftest import running_server  # type: ignore[import-not-found]


def gateway_of(server: ServerHandle) -> Gateway:
    """The MQTT gateway of a running server (its MQTT service's)."""
    assert server.state.protocols is not None
    gateway = server.state.protocols.mqtt.gateway  # type: ignore[attr-defined]
    assert isinstance(gateway, Gateway)
    return gateway


def set_gateway(server: ServerHandle, gateway: Gateway) -> None:
    """Serve the next MQTT connections of a running server with ``gateway``."""
    assert server.state.protocols is not None
    server.state.protocols.mqtt.gateway = gateway  # type: ignore[attr-defined]


class RawClient:
    """A bare MQTT client: send packets, receive decoded packets, observe EOF."""

    def __init__(self, stream: trio.SocketStream, level: int) -> None:
        self.stream = stream
        self.level = level
        self.decoder = mq.MqttDecoder(1 << 24, protocol_level=level)
        self.pending: list[mq.Packet] = []

    async def send(self, packet: mq.Packet) -> None:
        await self.stream.send_all(mq.encode(packet, self.level))

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def receive(self, wait_s: float = 5.0) -> mq.Packet:
        with trio.fail_after(wait_s):
            while not self.pending:
                data = await self.stream.receive_some(65536)
                if not data:
                    raise EOFError("server closed the connection")
                self.pending.extend(self.decoder.receive_data(data))
        return self.pending.pop(0)

    async def expect_eof(self, wait_s: float = 5.0) -> list[mq.Packet]:
        """Read until the server closes; return what arrived before."""
        got: list[mq.Packet] = list(self.pending)
        self.pending.clear()
        with trio.fail_after(wait_s):
            while True:
                try:
                    data = await self.stream.receive_some(65536)
                except trio.BrokenResourceError:
                    return got
                if not data:
                    return got
                got.extend(self.decoder.receive_data(data))

    async def aclose(self) -> None:
        await self.stream.aclose()


@asynccontextmanager
async def raw_client(address: tuple[str, int], connect: mq.Connect | None = None) -> AsyncIterator[RawClient]:
    stream = await trio.open_tcp_stream(*address)
    level = connect.protocol_level if connect is not None else 4
    client = RawClient(stream, level)
    try:
        if connect is not None:
            await client.send(connect)
        yield client
    finally:
        await client.aclose()


async def connect(
    address: tuple[str, int], client_id: str, level: int = 4, **kw: Any
) -> tuple[RawClient, mq.Connack]:
    """A client that sent ``Connect(client_id, level, **kw)``, and the CONNACK it got."""
    stream = await trio.open_tcp_stream(*address)
    client = RawClient(stream, level)
    await client.send(mq.Connect(client_id, level, **kw))
    connack = await client.receive()
    assert isinstance(connack, mq.Connack)
    return client, connack


async def subscribe(
    client: RawClient, *filters: tuple[str, mq.QoS], packet_id: int = 1, **kw: Any
) -> mq.SubAck:
    """SUBSCRIBE to ``(filter, qos)`` pairs (options ``kw`` on each); the SUBACK."""
    await client.send(mq.Subscribe(packet_id, tuple(mq.SubscribeTopic(f, q, **kw) for f, q in filters)))
    ack = await client.receive()
    assert isinstance(ack, mq.SubAck)
    assert ack.packet_id == packet_id
    return ack


async def receive_publish(client: RawClient, ack: bool = True) -> mq.Publish:
    """The next packet, a PUBLISH; with ``ack`` its QoS 1/2 flow is completed (packets that overtake
    the PUBREL stay pending)."""
    packet = await client.receive()
    assert isinstance(packet, mq.Publish), packet
    if ack and packet.qos == mq.QoS.AT_LEAST_ONCE:
        assert packet.packet_id is not None
        await client.send(mq.PubAck(packet.packet_id))
    elif ack and packet.qos == mq.QoS.EXACTLY_ONCE:
        assert packet.packet_id is not None
        await client.send(mq.PubRec(packet.packet_id))
        others: list[Any] = []
        while (rel := await client.receive()) != mq.PubRel(packet.packet_id):
            others.append(rel)  # other deliveries may overtake the PUBREL
        client.pending[0:0] = others
        await client.send(mq.PubComp(packet.packet_id))
    return packet


async def arrivals(client: RawClient) -> list[mq.Packet]:
    """Every packet the in-process server sends ``client`` until it has nothing more to send now (answering
    none of them). No timeout decides it: a PINGREQ round trip (the server has read everything the client
    sent before), then a wait until every task in the process is blocked (the server has done all it can
    do now), then another PINGREQ, whose PINGRESP comes after anything the server wrote before it.
    """
    got: list[mq.Packet] = []
    for settle in (False, True):
        if settle:
            await trio.testing.wait_all_tasks_blocked()
        await client.send(mq.PingReq())
        while (packet := await client.receive()) != mq.PingResp():
            got.append(packet)
    return got


async def drain(client: RawClient) -> list[mq.Packet]:
    """Like :func:`arrivals`, but complete every QoS 1/2 flow the server starts and go on until it sends
    nothing more; returns all the packets received."""
    got: list[mq.Packet] = []
    while batch := await arrivals(client):
        for packet in batch:
            if isinstance(packet, mq.Publish) and packet.packet_id is not None:
                ack = mq.PubAck if packet.qos == mq.QoS.AT_LEAST_ONCE else mq.PubRec
                await client.send(ack(packet.packet_id))
            elif isinstance(packet, mq.PubRel):
                await client.send(mq.PubComp(packet.packet_id))
        got += batch
    return got


async def all_parked(server: ServerHandle, readers: int) -> None:
    """Wait until ``readers`` subscription readers have read their LMQs to the end and parked in hubs."""
    hubs = gateway_of(server).push_hubs
    await wait_until(lambda: sum(len(hub.parked) for hub in hubs._hubs.values()) >= readers)


@pytest.fixture
async def server(log_sink: Any) -> AsyncIterator[ServerHandle]:
    async with running_server(Settings.for_tests()) as handle:
        yield handle
