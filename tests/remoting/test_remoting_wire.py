"""mqproxy.remoting.wire: direct socket reads and writes of a plain TCP remoting connection."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from mqproxy.backends.embedded.broker import EmbeddedBroker
from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.codecs.remoting import FrameDecoder, RemotingCommand, encode_command
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.remoting.connection import ConnectionLimits, ConnectionStats, serve_remoting
from mqproxy.remoting.context import ServerContext
from mqproxy.remoting.registry import ConnectionRegistry
from mqproxy.remoting.wire import SocketWire
from mqproxy.runtime.streams import CountingStream, PrefixedStream

from .conftest import ADVERTISED  # type: ignore[import-not-found]
from .test_remoting_connection import send  # type: ignore[import-not-found]


class _Counting(CountingStream):
    """Also counts the writes that went through ``send_all`` (not straight to the socket)."""

    send_alls = 0

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.send_alls += 1
        await super().send_all(data)


def _plain_pair(prefix: bytes = b"") -> tuple[trio.SocketStream, PrefixedStream, _Counting]:
    a, b = trio.socket.socketpair()
    counting = _Counting(trio.SocketStream(b))
    return trio.SocketStream(a), PrefixedStream(counting, prefix), counting


async def test_reads_replay_then_the_socket_and_count_what_they_read() -> None:
    peer, stream, counting = _plain_pair(b"sniffed")
    wire = SocketWire(stream)
    assert await wire.receive_some(1024) == b"sniffed"  # the replay first, through the stream
    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer.send_all, b"hello")  # the read below waits for it
        assert await wire.receive_some(1024) == b"hello"
    await peer.send_all(b"again")
    assert await wire.receive_some(1024) == b"again"  # there at once: read without waiting
    assert counting.bytes_in == len(b"helloagain")  # the replay was counted when it was sniffed
    await peer.aclose()
    assert await wire.receive_some(1024) == b""


async def test_a_cancelled_read_loses_nothing() -> None:
    peer, stream, _ = _plain_pair()
    wire = SocketWire(stream)
    with trio.move_on_after(0.05) as scope:
        await wire.receive_some(1024)
    assert scope.cancelled_caught
    await peer.send_all(b"late")
    assert await wire.receive_some(1024) == b"late"


async def test_send_now_writes_at_once_and_counts() -> None:
    peer, stream, counting = _plain_pair()
    wire = SocketWire(stream)
    assert wire.send_now(b"frame") == 5
    assert counting.bytes_out == 5
    assert await peer.receive_some(1024) == b"frame"


async def test_a_reset_socket_is_a_broken_stream() -> None:
    peer, stream, _ = _plain_pair()
    wire = SocketWire(stream)
    peer.socket.close()
    with pytest.raises(trio.BrokenResourceError):
        wire.send_now(b"x")  # the peer's end is gone: EPIPE at once on a socket pair
    await stream.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await wire.receive_some(1024)


async def test_other_streams_are_read_through_and_never_written_directly() -> None:
    left, right = trio.testing.memory_stream_pair()
    wire = SocketWire(right)
    assert wire.send_now(b"frame") == 0
    await left.send_all(b"data")
    assert await wire.receive_some(1024) == b"data"


async def test_an_inline_request_is_answered_straight_on_the_socket(
    backend: InMemoryBackend, broker: EmbeddedBroker
) -> None:
    await backend.create_topic("T", 4)
    peer, stream, counting = _plain_pair()
    ctx = ServerContext(*ADVERTISED, groups=ConnectionRegistry())
    limits = ConnectionLimits(inline_codes=frozenset({RequestCode.SEND_MESSAGE_V2}))
    stats = ConnectionStats()
    decoder = FrameDecoder()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: serve_remoting(stream, broker, ctx, stats=stats, limits=limits))
        responses: list[RemotingCommand] = []
        for n in range(1, 4):  # one request per read: each handled inline
            await peer.send_all(encode_command(send(n, 0, b"m%d" % n)))
            while len(responses) < n:
                responses += decoder.receive_data(await peer.receive_some(65536))
        await peer.aclose()
    assert [(r.opaque, r.code) for r in responses] == [(n, ResponseCode.SUCCESS) for n in range(1, 4)]
    assert [r.ext_fields["queueOffset"] for r in responses] == ["0", "1", "2"]
    assert stats.bytes_out == counting.bytes_out == sum(len(encode_command(r)) for r in responses)
    assert stats.requests == 3
    assert stats.error is None
    assert counting.send_alls == 0  # every answer went straight to the socket
