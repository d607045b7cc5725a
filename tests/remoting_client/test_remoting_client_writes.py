"""The remoting client's write side: concurrent requests share writes and all get their answer; a caller's
cancellation never cuts a write, and a write the peer does not take gives the connection up and fails every
pending request; a server that stops reading cannot hold a caller beyond its request or write timeout."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import trio
import trio.testing

from mqproxy.codecs.remoting import FLAG_ONEWAY, FrameDecoder, RemotingCommand, encode_command
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.remoting_client import ConnectionClosed, RemotingConnection, RemotingTimeout

from ..conftest import CountingStream, wait_until  # type: ignore[import-not-found]


def _request(caller: int, seq: int) -> RemotingCommand:
    return RemotingCommand(code=RequestCode.HEART_BEAT, ext_fields={"caller": str(caller), "seq": str(seq)})


async def test_concurrent_requests_share_writes_in_order_and_all_get_their_answer() -> None:
    a, b = trio.socket.socketpair()
    client_stream, server_stream = CountingStream(trio.SocketStream(a)), trio.SocketStream(b)
    connection = RemotingConnection(client_stream, "pair:1")
    callers, per_caller = 40, 5
    seen: list[tuple[int, int]] = []
    answers: dict[tuple[int, int], str | None] = {}

    async def server() -> None:
        decoder = FrameDecoder()
        while len(seen) < callers * per_caller:
            replies = []
            for request in decoder.receive_data(await server_stream.receive_some(65536)):
                key = (int(request.ext_fields["caller"]), int(request.ext_fields["seq"]))
                seen.append(key)
                if not request.is_oneway:
                    replies.append(
                        encode_command(RemotingCommand.response_to(request, ResponseCode.SUCCESS, str(key)))
                    )
            await server_stream.send_all(b"".join(replies))

    async def caller(n: int) -> None:
        for seq in range(per_caller):
            if seq % 2:  # a oneway is only queued: order shows whether frames were kept in order
                await connection.oneway(_request(n, seq))
            else:
                answers[n, seq] = (await connection.request(_request(n, seq), 5)).remark

    async with trio.open_nursery() as nursery:
        await nursery.start(connection.run)
        nursery.start_soon(server)
        async with trio.open_nursery() as callers_nursery:
            for n in range(callers):
                callers_nursery.start_soon(caller, n)
        await wait_until(lambda: len(seen) == callers * per_caller)
        await connection.aclose()
        nursery.cancel_scope.cancel()
    assert answers == {(n, s): str((n, s)) for n in range(callers) for s in range(0, per_caller, 2)}
    for n in range(callers):
        assert [s for c, s in seen if c == n] == list(range(per_caller))
    assert client_stream.writes < callers * per_caller  # frames went out together
    await server_stream.aclose()


async def test_a_cancelled_caller_does_not_cut_a_write_and_a_write_not_taken_gives_the_connection_up() -> (
    None
):
    """The connection is shared: a caller that goes away mid-write leaves the write running; a write the
    peer does not take within the write timeout ends the connection and fails every pending request."""
    client_side, server_side = trio.testing.memory_stream_pair()
    stream = CountingStream(client_side)
    connection = RemotingConnection(stream, "scripted:1", write_timeout_s=0.5)
    received = bytearray()
    outcomes: list[str] = []
    eof = trio.Event()

    async def server() -> None:
        while data := await server_side.receive_some(65536):
            received.extend(data)
        eof.set()  # the client closed the stream it gave up

    async def pending(n: int) -> None:
        try:
            await connection.request(_request(n, 0), 30)
        except ConnectionClosed:
            outcomes.append("closed")

    async def writer(scope: trio.CancelScope) -> None:
        with scope, contextlib.suppress(ConnectionClosed):  # its write ends by the timeout, not by it
            await connection.request(_request(0, 0), 30)

    async with trio.open_nursery() as nursery:
        await nursery.start(connection.run)
        nursery.start_soon(server)
        stream.cut = True
        scope = trio.CancelScope()
        nursery.start_soon(writer, scope)
        await wait_until(lambda: stream.writes == 1)
        for n in range(1, 5):
            nursery.start_soon(pending, n)
        await wait_until(lambda: connection.outstanding == 5)
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert not connection.closed.is_set(), "a caller's cancellation does not cut the write"
        await wait_until(lambda: len(outcomes) == 4)
        assert connection.closed.is_set()
        assert connection.close_reason.startswith("write failed: write_timeout")
        with pytest.raises(ConnectionClosed):
            await connection.request(_request(9, 0), 30)
        await eof.wait()
        nursery.cancel_scope.cancel()
    sent = _request(0, 0)
    sent.opaque = 1  # the connection's first request
    first = encode_command(sent)
    assert bytes(received) == first[: len(first) // 2]  # the cut frame, and nothing after it
    assert stream.writes == 1


async def test_a_server_that_stops_reading_fails_requests_within_their_timeout(autojump_clock: Any) -> None:
    client_side, server_side = trio.testing.lockstep_stream_pair()  # a write waits for the peer to read
    connection = RemotingConnection(client_side, "deaf:1", max_outbox_bytes=64, write_timeout_s=3.0)
    errors: list[type[Exception]] = []

    async def caller(n: int) -> None:
        try:
            await connection.request(_request(n, 0), 3)
        except (ConnectionClosed, RemotingTimeout) as exc:
            errors.append(type(exc))

    async with trio.open_nursery() as nursery:
        await nursery.start(connection.run)
        async with trio.open_nursery() as callers_nursery:
            for n in range(6):  # one writes, some queue behind it, the rest wait for room
                callers_nursery.start_soon(caller, n)
        assert trio.current_time() == pytest.approx(3.0)
        nursery.cancel_scope.cancel()
    assert len(errors) == 6
    assert set(errors) <= {ConnectionClosed, RemotingTimeout}
    assert connection.closed.is_set()  # the write that timed out was cut: the connection is given up
    await server_side.aclose()


async def test_a_oneway_to_a_server_that_stops_reading_ends_after_the_write_timeout(
    autojump_clock: Any,
) -> None:
    client_side, server_side = trio.testing.lockstep_stream_pair()
    connection = RemotingConnection(client_side, "deaf:1", write_timeout_s=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(connection.run)
        with pytest.raises(ConnectionClosed, match="write_timeout"):
            await connection.oneway(RemotingCommand(code=RequestCode.HEART_BEAT, flag=FLAG_ONEWAY))
        assert trio.current_time() == pytest.approx(5.0)
        nursery.cancel_scope.cancel()
    await server_side.aclose()


async def test_close_writes_the_oneways_already_sent_first() -> None:
    a, b = trio.socket.socketpair()
    client_stream, server_stream = CountingStream(trio.SocketStream(a)), trio.SocketStream(b)
    gate = trio.Event()
    inner_send = client_stream.send_all

    async def gated_send_all(data: bytes | bytearray | memoryview) -> None:
        with trio.CancelScope(shield=True):  # as if the bytes were on their way
            await gate.wait()
        await inner_send(data)

    client_stream.send_all = gated_send_all  # type: ignore[method-assign]
    connection = RemotingConnection(client_stream, "pair:1")
    closed = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(connection.run)
        nursery.start_soon(connection.oneway, _request(0, 0))  # the writer, held at the gate
        await wait_until(lambda: client_stream.writes == 0 and connection._outbox._writing)
        for seq in range(1, 50):
            await connection.oneway(_request(0, seq))  # only queued: returns before the frame left

        async def close() -> None:
            await connection.aclose()
            closed.set()

        nursery.start_soon(close)
        await trio.testing.wait_all_tasks_blocked()
        assert not closed.is_set(), "the close waits for the queued frames"
        gate.set()
        await closed.wait()
        nursery.cancel_scope.cancel()
    received = bytearray()
    while data := await server_stream.receive_some(65536):
        received += data
    got = [int(c.ext_fields["seq"]) for c in FrameDecoder().receive_data(bytes(received))]
    assert got == list(range(50)), "every oneway sent before the close reached the peer"
    await server_stream.aclose()
