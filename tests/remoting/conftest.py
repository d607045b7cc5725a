"""Fixtures for the remoting tests: an in-memory store with the embedded broker facade over it, a session
on that facade, and a builder that turns client-shaped JSON headers into decoded commands exactly as the
frame codec delivers them."""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio
import trio.testing

from mqproxy.backends.embedded.broker import EmbeddedBroker, open_embedded_broker
from mqproxy.backends.embedded.internal_topics import trio_clock_ms
from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.backends.embedded.services import BrokerServices
from mqproxy.codecs.message_record import DecodedRecord, decode_records
from mqproxy.codecs.remoting import SERIALIZE_ROCKETMQ, FrameDecoder, RemotingCommand, encode_command
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.remoting.connection import ConnectionStats, serve_remoting
from mqproxy.remoting.context import RequestEvent, ServerContext
from mqproxy.remoting.registry import ConnectionRegistry
from mqproxy.remoting.session import RemotingSession

ADVERTISED = ("10.0.0.8", 8080)

WireFactory = Callable[..., RemotingCommand]


def wire_frame(header: dict[str, Any], body: bytes = b"") -> bytes:
    """A frame with a JSON header as the given client would write it (values keep their JSON types)."""
    raw = json.dumps(header).encode()
    return struct.pack(">ii", 4 + len(raw) + len(body), len(raw)) + raw + body


@pytest.fixture
def wire() -> WireFactory:
    """``wire(code, ext, body=b"", **header)`` -> the command the codec decodes from that frame."""

    def build(code: int, ext: dict[str, Any] | None, body: bytes = b"", **header: Any) -> RemotingCommand:
        fields: dict[str, Any] = {"code": code, "language": "JAVA", "version": 401, "opaque": 7, "flag": 0}
        fields.update(header)
        if ext is not None:
            fields["extFields"] = ext
        (command,) = FrameDecoder().receive_data(wire_frame(fields, body))
        return command

    return build


@pytest.fixture
def backend() -> InMemoryBackend:
    return InMemoryBackend(default_queue_count=4, auto_create_topics=True, store_host=ADVERTISED)


@pytest.fixture
def events() -> list[RequestEvent]:
    return []


@pytest.fixture
def ctx() -> ServerContext:
    return ServerContext(advertised_host=ADVERTISED[0], advertised_port=ADVERTISED[1])


@pytest.fixture
async def broker(backend: InMemoryBackend) -> AsyncIterator[EmbeddedBroker]:
    """The broker facade over ``backend``, its services on a clock that follows trio's clock (tests that
    let time pass request ``autojump_clock`` themselves: pytest-trio only sees a test's own clock)."""
    async with open_embedded_broker(backend, now_ms=trio_clock_ms()) as running:
        yield running


@pytest.fixture
def services(broker: EmbeddedBroker) -> BrokerServices:
    """The broker services behind ``broker`` (for tests that look at their state)."""
    return broker.services


@pytest.fixture
def session(broker: EmbeddedBroker, ctx: ServerContext, events: list[RequestEvent]) -> RemotingSession:
    return RemotingSession(broker, ctx, peer=("192.0.2.2", 50000), on_request=events.append)


@pytest.fixture
async def manual_session(events: list[RequestEvent]) -> AsyncIterator[RemotingSession]:
    """A session on a broker that never auto-creates topics (routes and sends need created topics)."""
    backend = InMemoryBackend(auto_create_topics=False, store_host=ADVERTISED)
    async with open_embedded_broker(backend, auto_create_topics=False, now_ms=trio_clock_ms()) as broker:
        ctx = ServerContext(*ADVERTISED, auto_create_topics=False)
        yield RemotingSession(broker, ctx, peer=("192.0.2.2", 50000), on_request=events.append)


async def send(
    wire: WireFactory,
    session: RemotingSession,
    body: bytes,
    queue: int = 0,
    *,
    topic: str = "T",
    tags: str = "A",
    queues: int = 2,
    ok: bool = True,
    **props: str,
) -> RemotingCommand:
    """SEND_MESSAGE_V2 as a Java producer writes it (``props`` added to the properties; ``queues``: the
    auto-created topic's queue count); with ``ok`` the answer must be SUCCESS."""
    properties = f"TAGS\x01{tags}\x02" + "".join(f"{k}\x01{v}\x02" for k, v in props.items())
    ext = {"a": "PG", "b": topic, "c": "TBW102", "d": str(queues), "e": str(queue), "f": "0",
           "g": "1700000000001", "h": "0", "i": properties}  # fmt: skip
    response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, ext, body))
    assert response is not None
    if ok:
        assert response.code == ResponseCode.SUCCESS, response.remark
    return response


async def pull(
    wire: WireFactory, session: RemotingSession, topic: str = "T", offset: int = 0
) -> list[DecodedRecord]:
    """The records a PULL_MESSAGE of queue 0 from ``offset`` answers (none for an unknown topic)."""
    ext = {"consumerGroup": "G", "topic": topic, "queueId": "0", "queueOffset": str(offset),
           "maxMsgNums": "32", "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0",
           "subscription": "*"}  # fmt: skip
    response = await session.handle(wire(RequestCode.PULL_MESSAGE, ext))
    assert response is not None
    if response.code == ResponseCode.TOPIC_NOT_EXIST:
        return []
    assert response.code in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND), response.remark
    return decode_records(response.body) if response.code == ResponseCode.SUCCESS else []


def binary_request(code: int, ext: dict[str, str], body: bytes = b"", **fields: Any) -> RemotingCommand:
    """A request as a Java client with ``-Drocketmq.serialize.type=ROCKETMQ`` writes it, decoded."""
    command = RemotingCommand(
        code, opaque=11, ext_fields=ext, body=body, serialize_type=SERIALIZE_ROCKETMQ, **fields
    )
    frame = encode_command(command)
    assert frame[4] == SERIALIZE_ROCKETMQ
    (decoded,) = FrameDecoder().receive_data(frame)
    assert decoded.serialize_type == SERIALIZE_ROCKETMQ
    return decoded


@pytest.fixture
def binary() -> Callable[..., RemotingCommand]:
    return binary_request


# --- connections over in-memory streams -------------------------------------------------------------


@pytest.fixture
def registry() -> ConnectionRegistry:
    return ConnectionRegistry()


class Peer:
    """The client end of one in-memory remoting connection, speaking frames. With ``skip_notify``,
    :meth:`receive` passes over NOTIFY_CONSUMER_IDS_CHANGED (sent to a consumer at every join)."""

    def __init__(self, stream: trio.abc.Stream, *, skip_notify: bool = False) -> None:
        self.stream = stream
        self.skip_notify = skip_notify
        self.decoder = FrameDecoder()
        self.ready: list[RemotingCommand] = []

    async def send(self, command: RemotingCommand) -> None:
        await self.stream.send_all(encode_command(command))

    async def receive(self) -> RemotingCommand:
        while True:
            while not self.ready:
                data = await self.stream.receive_some(65536)
                assert data, "server closed the stream"
                self.ready.extend(self.decoder.receive_data(data))
            command = self.ready.pop(0)
            notify = command.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED and not command.is_response
            if not (self.skip_notify and notify):
                return command

    async def request(self, command: RemotingCommand) -> RemotingCommand:
        await self.send(command)
        return await self.receive()


async def open_peer(
    nursery: trio.Nursery,
    broker: EmbeddedBroker,
    ctx: ServerContext,
    *,
    skip_notify: bool = False,
    **serve: Any,
) -> tuple[Peer, ConnectionStats]:
    """A connection served by ``serve_remoting`` (``serve``: its keyword arguments) in ``nursery``."""
    client_stream, server_stream = trio.testing.memory_stream_pair()
    stats = ConnectionStats()
    nursery.start_soon(lambda: serve_remoting(server_stream, broker, ctx, stats=stats, **serve))
    return Peer(client_stream, skip_notify=skip_notify), stats
