"""Fixtures for the remoting session tests: an in-memory backend, a session, and a builder that turns
client-shaped JSON headers into decoded commands exactly as the frame codec delivers them."""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from mqproxy.backends.embedded.internal_topics import trio_clock_ms
from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.backends.embedded.services import BrokerServices, open_services
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
def session(backend: InMemoryBackend, ctx: ServerContext, events: list[RequestEvent]) -> RemotingSession:
    return RemotingSession(backend, ctx, peer=("192.0.2.2", 50000), on_request=events.append)


@pytest.fixture
async def services(backend: InMemoryBackend) -> AsyncIterator[BrokerServices]:
    """Broker services over ``backend`` on a clock that follows trio's clock (tests using them must
    request ``autojump_clock`` themselves: pytest-trio only sees a test's own clock argument)."""
    async with open_services(backend, now_ms=trio_clock_ms()) as running:
        yield running


@pytest.fixture
def svc_ctx(services: BrokerServices) -> ServerContext:
    return ServerContext(advertised_host=ADVERTISED[0], advertised_port=ADVERTISED[1], services=services)


@pytest.fixture
def svc_session(
    backend: InMemoryBackend, svc_ctx: ServerContext, events: list[RequestEvent]
) -> RemotingSession:
    """A session whose server runs the broker services."""
    return RemotingSession(backend, svc_ctx, peer=("192.0.2.2", 50000), on_request=events.append)


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
