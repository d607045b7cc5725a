"""Fixtures for the remoting tests: an in-memory store with the embedded broker facade over it, a session
on that facade, and a builder that turns client-shaped JSON headers into decoded commands exactly as the
frame codec delivers them."""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from mqproxy.backends.embedded.broker import EmbeddedBroker, open_embedded_broker
from mqproxy.backends.embedded.internal_topics import trio_clock_ms
from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.backends.embedded.services import BrokerServices
from mqproxy.codecs.remoting import SERIALIZE_ROCKETMQ, FrameDecoder, RemotingCommand, encode_command
from mqproxy.remoting.context import RequestEvent, ServerContext
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
