from __future__ import annotations

import ssl

import pytest
import trio
import trio.testing

from mqproxy.runtime.streams import (
    CountingStream,
    PrefixedStream,
    direct_sender,
    plain_layers,
    read_nowait,
    receive_now,
    receive_plain,
)


async def _prefixed_pair() -> tuple[PrefixedStream, PrefixedStream]:
    a, b = trio.testing.memory_stream_pair()
    return PrefixedStream(a), PrefixedStream(b)


async def _counting_pair() -> tuple[CountingStream, CountingStream]:
    a, b = trio.testing.memory_stream_pair()
    return CountingStream(a), CountingStream(b)


async def test_prefixed_stream_is_a_conforming_two_way_stream() -> None:
    await trio.testing.check_two_way_stream(_prefixed_pair, None)


async def test_counting_stream_is_a_conforming_two_way_stream() -> None:
    await trio.testing.check_two_way_stream(_counting_pair, None)


async def test_prefix_is_replayed_first_respecting_max_bytes() -> None:
    a, b = trio.testing.memory_stream_pair()
    stream = PrefixedStream(a, b"hello")
    await b.send_all(b" world")
    assert await stream.receive_some(3) == b"hel"
    assert stream.pending == b"lo"
    assert await stream.receive_some() == b"lo"
    assert await stream.receive_some() == b" world"


async def test_counting_stream_counts_both_directions() -> None:
    a, b = trio.testing.memory_stream_pair()
    counted = CountingStream(a)
    await counted.send_all(b"12345")
    assert await b.receive_some() == b"12345"
    await b.send_all(b"abc")
    assert await counted.receive_some() == b"abc"
    assert (counted.bytes_in, counted.bytes_out) == (3, 5)


async def _tcp_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        accepted: list[trio.SocketStream] = []

        async def accept() -> None:
            accepted.append(await listener.accept())

        nursery.start_soon(accept)
        client = await trio.open_tcp_stream("127.0.0.1", port)
    await listener.aclose()
    return accepted[0], client


async def test_direct_sender_writes_counts_and_reports_a_full_buffer() -> None:
    server, client = await _tcp_pair()
    counted = CountingStream(server)
    send = direct_sender(PrefixedStream(counted, b"sniffed"))
    assert send is not None
    assert send(b"hello") == 5
    assert counted.bytes_out == 5
    assert await client.receive_some() == b"hello"
    total = 0
    for chunk in (bytes(1 << 20), b"x"):  # the peer reads nothing: the buffers fill
        while written := send(chunk):
            total += written
    assert send(b"more") == 0
    assert counted.bytes_out == 5 + total
    received = 0
    while received < total:
        received += len(await client.receive_some(1 << 20))
    assert received == total
    await client.aclose()
    await server.aclose()


async def test_direct_sender_raises_broken_once_closed() -> None:
    server, client = await _tcp_pair()
    send = direct_sender(server)
    assert send is not None
    await server.aclose()
    with pytest.raises(trio.BrokenResourceError):
        send(b"late")
    await client.aclose()


async def test_direct_sender_is_only_for_plain_tcp() -> None:
    a, _ = trio.testing.memory_stream_pair()
    assert direct_sender(CountingStream(a)) is None
    server, client = await _tcp_pair()
    tls = trio.SSLStream(server, ssl.create_default_context(ssl.Purpose.CLIENT_AUTH), server_side=True)
    assert direct_sender(PrefixedStream(tls)) is None
    await client.aclose()
    await server.aclose()


async def test_plain_layers_unwraps_plain_tcp_only() -> None:
    a, b = trio.socket.socketpair()
    sock, peer = trio.SocketStream(a), trio.SocketStream(b)
    counting = CountingStream(sock)
    prefixed = PrefixedStream(counting, b"hi")
    assert plain_layers(prefixed) == (sock, counting, (prefixed,))
    assert prefixed.replaying
    assert await prefixed.receive_some() == b"hi"
    assert not prefixed.replaying
    assert plain_layers(CountingStream(CountingStream(sock))) is None, "two counters: not unwrapped"
    memory, _ = trio.testing.memory_stream_pair()
    assert plain_layers(PrefixedStream(memory)) is None
    await sock.aclose()
    await peer.aclose()


async def test_receive_now_reads_what_is_there_counts_it_and_never_waits() -> None:
    server, client = await _tcp_pair()
    counted = CountingStream(server)
    assert receive_now(counted, 100) is None  # nothing yet: the caller awaits receive_some
    await client.send_all(b"CONNECT")
    with trio.fail_after(5):
        await trio.lowlevel.wait_readable(server.socket)
    assert receive_now(counted, 4) == b"CONN"
    assert receive_now(counted, 100) == b"ECT"
    assert counted.bytes_in == 7
    await client.aclose()
    with trio.fail_after(5):
        await trio.lowlevel.wait_readable(server.socket)
    assert receive_now(counted, 100) == b""  # the peer closed
    a, _ = trio.testing.memory_stream_pair()
    assert receive_now(CountingStream(a), 100) is None  # not plain TCP
    await server.aclose()
    assert receive_now(counted, 100) is None  # closed locally


async def test_receive_plain_waits_reads_and_reports_like_receive_some() -> None:
    server, client = await _tcp_pair()
    got: list[bytes] = []
    async with trio.open_nursery() as nursery:

        async def read() -> None:
            got.append(await receive_plain(server, 3))

        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # it waits for data
        await client.send_all(b"hello")
    assert got == [b"hel"]
    assert await receive_plain(server, 100) == b"lo"
    with trio.CancelScope() as scope:  # a cancelled reader is cancelled even when data is there
        await client.send_all(b"x")
        scope.cancel()
        await receive_plain(server, 100)
    assert scope.cancelled_caught
    assert await receive_plain(server, 100) == b"x"
    await client.aclose()
    assert await receive_plain(server, 100) == b""  # the peer closed
    await server.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await receive_plain(server, 100)


async def test_read_nowait_reads_what_is_there_without_waiting() -> None:
    server, client = await _tcp_pair()
    assert read_nowait(server.socket, 100) is None  # nothing yet: no wait, no exception
    await client.send_all(b"abc")
    await trio.testing.wait_all_tasks_blocked()
    await trio.lowlevel.wait_readable(server.socket)
    assert read_nowait(server.socket, 2) == b"ab"
    assert read_nowait(server.socket, 100) == b"c"
    await client.aclose()
    await trio.lowlevel.wait_readable(server.socket)
    assert read_nowait(server.socket, 100) == b""  # the peer closed
    await server.aclose()
    with pytest.raises(trio.ClosedResourceError):
        read_nowait(server.socket, 100)


class _Steps(trio.abc.Instrument):
    """Counts the steps of one task."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1


async def test_receive_plain_returns_in_the_step_its_wait_woke_and_yields_when_it_did_not_wait() -> None:
    server, client = await _tcp_pair()
    got: list[bytes] = []
    async with trio.open_nursery() as nursery:
        task: list[trio.lowlevel.Task] = []

        async def read() -> None:
            task.append(trio.lowlevel.current_task())
            got.append(await receive_plain(server, 100))

        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        steps = _Steps(task[0])
        trio.lowlevel.add_instrument(steps)
        await client.send_all(b"woke")
        await trio.testing.wait_all_tasks_blocked()
    trio.lowlevel.remove_instrument(steps)
    assert got == [b"woke"]
    assert steps.steps == 1  # woken by the data: read and returned in that step, no extra loop turn
    await client.send_all(b"there")
    await trio.lowlevel.wait_readable(server.socket)
    steps = _Steps(trio.lowlevel.current_task())
    trio.lowlevel.add_instrument(steps)
    data = await receive_plain(server, 100)  # there at once: one schedule point, as trio's reads
    trio.lowlevel.remove_instrument(steps)
    assert (data, steps.steps) == (b"there", 1)
    await client.aclose()
    await server.aclose()

async def test_take_replay_returns_the_prefix_at_once_then_nothing() -> None:
    a, b = trio.testing.memory_stream_pair()
    stream = PrefixedStream(a, b"hello")
    assert stream.take_replay(3) == b"hel"
    assert stream.replaying
    assert stream.take_replay(100) == b"lo"
    assert not stream.replaying
    assert stream.take_replay(100) == b""
    await b.send_all(b"inner")
    assert await stream.receive_some(100) == b"inner"  # then the inner stream, as receive_some
