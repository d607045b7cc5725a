"""Fixtures for the MQTT gateway: an in-process server and a raw async MQTT client over loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from mqproxy.codecs.mqtt import Connect, MqttDecoder, Packet, encode
from mqproxy.server import ServerHandle, serve
from mqproxy.settings import Settings


@asynccontextmanager
async def running_server(settings: Settings) -> AsyncIterator[ServerHandle]:
    """Start :func:`serve` in a nursery, yield its handle, stop it gracefully on exit."""
    async with trio.open_nursery() as nursery:
        handle: ServerHandle = await nursery.start(
            lambda task_status: serve(settings, install_signal_handlers=False, task_status=task_status)
        )
        try:
            yield handle
        finally:
            handle.stop("test")


class RawClient:
    """A bare MQTT client: send packets, receive decoded packets, observe EOF."""

    def __init__(self, stream: trio.SocketStream, level: int) -> None:
        self.stream = stream
        self.level = level
        self.decoder = MqttDecoder(1 << 24, protocol_level=level)
        self.pending: list[Packet] = []

    async def send(self, packet: Packet) -> None:
        await self.stream.send_all(encode(packet, self.level))

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def receive(self, wait_s: float = 5.0) -> Packet:
        with trio.fail_after(wait_s):
            while not self.pending:
                data = await self.stream.receive_some(65536)
                if not data:
                    raise EOFError("server closed the connection")
                self.pending.extend(self.decoder.receive_data(data))
        return self.pending.pop(0)

    async def expect_eof(self, wait_s: float = 5.0) -> list[Packet]:
        """Read until the server closes; return what arrived before."""
        got: list[Packet] = list(self.pending)
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
async def raw_client(address: tuple[str, int], connect: Connect | None = None) -> AsyncIterator[RawClient]:
    stream = await trio.open_tcp_stream(*address)
    level = connect.protocol_level if connect is not None else 4
    client = RawClient(stream, level)
    try:
        if connect is not None:
            await client.send(connect)
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def server(log_sink: Any) -> AsyncIterator[ServerHandle]:
    async with running_server(Settings.for_tests()) as handle:
        yield handle
