"""Fixtures for the gRPC service tests: a real h2 client over trio memory streams, wired to the driver.

* ``grpc_env``: a :class:`GrpcEnv` with an in-memory backend, the embedded broker facade over it and a
  running :class:`GrpcService` (``env.service`` is its :class:`MessagingService`); ``await env.connect()``
  opens a connection served by :class:`GrpcConnectionDriver` and returns a :class:`GrpcTestClient`.

Everything runs in memory, so tests that wait for a delay, an invisible time or a timeout take the
``autojump_clock``; the broker services then run on ``env.now_ms``, which follows trio's clock.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
import structlog
import trio
import trio.testing

from mqproxy.backends.embedded.broker import EmbeddedBroker, open_embedded_broker
from mqproxy.backends.embedded.internal_topics import trio_clock_ms
from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.codecs.grpc_framing import encode_message
from mqproxy.context import ServerState
from mqproxy.grpc_service.connection import GrpcConnectionDriver
from mqproxy.grpc_service.protocol import GrpcService
from mqproxy.grpc_service.service import MessagingService
from mqproxy.grpc_service.settings import ConnectionLimits, GrpcSettings
from mqproxy.runtime.context import ConnectionContext
from mqproxy.settings import Settings

PREFIX = f"/{pb.SERVICE}/"


def with_overrides(headers: dict[str, str], overrides: Mapping[str, str | None]) -> list[tuple[str, str]]:
    """``headers`` with ``overrides`` applied (``_`` in a name stands for ``-``; None drops the header)."""
    for name, value in overrides.items():
        key = name.replace("_", "-")
        if value is None:
            headers.pop(key, None)
        else:
            headers[key] = value
    return list(headers.items())


@dataclass
class StreamResult:
    """Everything the server sent on one stream."""

    headers: dict[str, str] = field(default_factory=dict)
    data: bytearray = field(default_factory=bytearray)
    trailers: dict[str, str] = field(default_factory=dict)
    reset: int | None = None
    ended: bool = False
    done: trio.Event = field(default_factory=trio.Event)

    @property
    def grpc_status(self) -> int | None:
        value = self.trailers.get("grpc-status", self.headers.get("grpc-status"))
        return None if value is None else int(value)

    @property
    def grpc_message(self) -> str:
        return self.trailers.get("grpc-message", self.headers.get("grpc-message", ""))

    def messages(self) -> list[bytes]:
        out, pos, raw = [], 0, bytes(self.data)
        while pos + 5 <= len(raw):
            _, length = struct.unpack_from(">BI", raw, pos)
            out.append(raw[pos + 5 : pos + 5 + length])
            pos += 5 + length
        return out


class _ClientH2(h2.connection.H2Connection):
    """Stock h2 closes the connection on a GOAWAY (python-hyper/h2 #1181) and then fails on the answers
    of in-flight streams; real gRPC clients keep reading them. Report the GOAWAY, keep the state."""

    def _receive_goaway_frame(self, frame: Any) -> tuple[list[Any], list[h2.events.Event]]:
        event = h2.events.ConnectionTerminated()
        event.error_code = frame.error_code
        event.last_stream_id = frame.last_stream_id
        return [], [event]


class GrpcTestClient:
    """A real ``h2`` client over a trio stream; one reader task collects what the server sends."""

    def __init__(self, stream: trio.abc.Stream, client_id: str = "test@1@0") -> None:
        self.stream = stream
        self.client_id = client_id
        self.h2 = _ClientH2(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.results: dict[int, StreamResult] = {}
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.closed = trio.Event()
        self.changed = trio.Event()
        self._lock = trio.Lock()

    async def start(self, nursery: trio.Nursery) -> None:
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(16 * 1024 * 1024)
        await self.flush()
        nursery.start_soon(self._reader)

    async def flush(self) -> None:
        async with self._lock:
            data = self.h2.data_to_send()
            if data:
                await self.stream.send_all(data)

    async def send_raw(self, data: bytes) -> None:
        async with self._lock:
            await self.stream.send_all(data)

    async def _reader(self) -> None:
        try:
            while True:
                data = await self.stream.receive_some(65536)
                if not data:
                    break
                for ev in self.h2.receive_data(data):
                    self._on_event(ev)
                await self.flush()
                self.changed.set()
                self.changed = trio.Event()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.closed.set()
            for result in self.results.values():
                result.done.set()

    def _on_event(self, ev: h2.events.Event) -> None:
        sid = getattr(ev, "stream_id", 0)
        result = self.results.setdefault(sid, StreamResult()) if sid else None
        if isinstance(ev, h2.events.ResponseReceived):
            result.headers = dict(ev.headers)
        elif isinstance(ev, h2.events.TrailersReceived):
            result.trailers = dict(ev.headers)
        elif isinstance(ev, h2.events.DataReceived):
            result.data += ev.data
            self.h2.acknowledge_received_data(ev.flow_controlled_length, sid)
        elif isinstance(ev, h2.events.StreamEnded):
            result.ended = True
            result.done.set()
        elif isinstance(ev, h2.events.StreamReset):
            result.reset = int(ev.error_code)
            result.done.set()
        elif isinstance(ev, h2.events.ConnectionTerminated):
            self.goaway = ev

    def headers(self, method: str, **overrides: str | None) -> list[tuple[str, str]]:
        base = {
            ":method": "POST",
            ":scheme": "http",
            ":path": PREFIX + method,
            ":authority": "proxy",
            "content-type": "application/grpc",
            "te": "trailers",
            "x-mq-client-id": self.client_id,
        }
        return with_overrides(base, overrides)

    async def open(
        self,
        method: str,
        payloads: list[bytes] = (),
        *,
        end: bool = True,  # type: ignore[assignment]
        **headers: str | None,
    ) -> int:
        """Start a call with raw message payloads; returns its stream id."""
        sid = self.h2.get_next_available_stream_id()
        self.results[sid] = StreamResult()
        self.h2.send_headers(sid, self.headers(method, **headers), end_stream=end and not payloads)
        await self.flush()
        for i, payload in enumerate(payloads):
            await self.send_message(sid, payload, end=end and i == len(payloads) - 1)
        return sid

    async def send_message(self, sid: int, payload: bytes, *, end: bool = False) -> None:
        """Send one length-prefixed message as flow control allows."""
        data = memoryview(encode_message(payload))
        while True:
            size = min(len(data), self.h2.local_flow_control_window(sid), self.h2.max_outbound_frame_size)
            if size <= 0 and data:
                await self.changed.wait()
                continue
            last = size == len(data)
            self.h2.send_data(sid, bytes(data[:size]), end_stream=end and last)
            await self.flush()
            data = data[size:]
            if last:
                return

    async def end(self, sid: int) -> None:
        self.h2.end_stream(sid)
        await self.flush()

    async def wait(self, sid: int, limit_s: float = 5.0) -> StreamResult:
        result = self.results[sid]
        with trio.fail_after(limit_s):
            await result.done.wait()
        return result

    async def unary(self, method: str, request: Any, limit_s: float = 5.0, **headers: str | None) -> Any:
        """Call a unary RPC; returns the decoded response (asserts grpc-status 0)."""
        sid = await self.open(method, [request.SerializeToString()], **headers)
        result = await self.wait(sid, limit_s)
        assert result.grpc_status == 0, (result.grpc_status, result.grpc_message)
        info = pb.METHODS[PREFIX + method]
        (payload,) = result.messages()
        return info.response.FromString(payload)


@dataclass
class GrpcEnv:
    backend: InMemoryBackend
    broker: EmbeddedBroker
    services: Any
    server: ServerState
    service: MessagingService
    nursery: trio.Nursery
    limits: ConnectionLimits = field(default_factory=lambda: ConnectionLimits(idle_timeout_s=60.0))
    contexts: list[ConnectionContext] = field(default_factory=list)
    #: The broker services' clock (ms, following trio's clock): deliver-at times are on it.
    now_ms: Callable[[], int] = field(default_factory=trio_clock_ms)

    async def connect(
        self, client_id: str = "test@1@0", *, raw: bool = False, limits: ConnectionLimits | None = None
    ) -> Any:
        """A started :class:`GrpcTestClient`, or with ``raw`` the bare client stream."""
        client_stream, server_stream = trio.testing.memory_stream_pair()
        ctx = ConnectionContext(
            conn_id=f"c{len(self.contexts)}",
            peer=("127.0.0.1", 40000 + len(self.contexts)),
            local=("127.0.0.1", 9876),
            draining=self.server.draining,
            recorder=self.server.recorder,
            acl=self.server.acl,
            protocol="grpc",
        )
        self.contexts.append(ctx)
        driver = GrpcConnectionDriver(server_stream, ctx, self.service, limits or self.limits)

        async def run() -> None:
            structlog.contextvars.bind_contextvars(conn_id=ctx.conn_id)  # as handle_connection does
            try:
                await driver.run()
            finally:
                await trio.aclose_forcefully(server_stream)

        self.nursery.start_soon(run)
        if raw:
            return client_stream
        client = GrpcTestClient(client_stream, client_id)
        await client.start(self.nursery)
        return client


@pytest.fixture
async def grpc_env(nursery: trio.Nursery) -> AsyncIterator[GrpcEnv]:
    backend = InMemoryBackend(default_queue_count=4, store_host=("127.0.0.1", 9876))
    settings = Settings.for_tests()
    server = ServerState(
        settings=settings, backend_name="memory", advertised=("127.0.0.1", 9876)
    )
    now_ms = trio_clock_ms()
    async with open_embedded_broker(backend, now_ms=now_ms) as broker:
        grpc = GrpcService(broker, GrpcSettings(server.advertised, settings_timeout_s=0.5))
        await nursery.start(grpc.run)
        yield GrpcEnv(backend, broker, broker.services, server, grpc.messaging, nursery, now_ms=now_ms)
        nursery.cancel_scope.cancel()


@pytest.fixture
def grpc_client_cls() -> type[GrpcTestClient]:
    """The :class:`GrpcTestClient` class, for tests that bring their own stream (e.g. real TCP/TLS)."""
    return GrpcTestClient
