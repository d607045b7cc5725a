"""serve_remoting with ``ConnectionLimits.batch_codes``: the pulls of one read served in the read loop, their
answers in one write; a pull that would be held runs in its own task."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from mqproxy.codecs.message_record import decode_records
from mqproxy.codecs.remoting import RemotingCommand, encode_command
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.model.types import Message
from mqproxy.remoting.connection import ConnectionLimits, ConnectionStats, serve_remoting
from mqproxy.remoting.context import RequestEvent, ServerContext
from mqproxy.remoting.registry import ConnectionRegistry
from mqproxy.remoting.service import BATCH_ON_EMBEDDED
from mqproxy.remoting.session import HANDLERS

from ..conftest import CountingStream, wait_until  # type: ignore[import-not-found]
from .conftest import ADVERTISED, Peer  # type: ignore[import-not-found]


def pull(
    opaque: int, queue: int, suspend_ms: str = "15000", code: int = RequestCode.PULL_MESSAGE
) -> RemotingCommand:
    ext = {"consumerGroup": "G", "topic": "T", "queueId": str(queue), "queueOffset": "0", "maxMsgNums": "32",
           "sysFlag": "6", "commitOffset": "0", "suspendTimeoutMillis": suspend_ms, "subscription": "*",
           "subVersion": "0"}  # fmt: skip
    return RemotingCommand(code, opaque=opaque, ext_fields=ext)


@pytest.fixture
def ctx(registry: ConnectionRegistry) -> ServerContext:
    return ServerContext(*ADVERTISED, groups=registry)


@pytest.fixture
def ran_in(monkeypatch: pytest.MonkeyPatch) -> dict[int, str]:
    """Opaque -> name of the task each PULL_MESSAGE's handler ran in."""
    names: dict[int, str] = {}
    original = HANDLERS[RequestCode.PULL_MESSAGE]

    async def recording(session, request, note):  # type: ignore[no-untyped-def]
        names[request.opaque] = trio.lowlevel.current_task().name
        return await original(session, request, note)

    monkeypatch.setitem(HANDLERS, RequestCode.PULL_MESSAGE, recording)
    return names


async def test_the_pulls_of_one_read_are_answered_in_the_read_loop_in_one_write(
    backend, ctx, broker, ran_in, autojump_clock
) -> None:
    await backend.create_topic("T", 4)
    for queue in range(3):
        await backend.send(Message("T", b"q%d" % queue, queue_id=queue))
    client_stream, server_stream = trio.testing.memory_stream_pair()
    counted = CountingStream(server_stream)
    stats, events = ConnectionStats(), list[RequestEvent]()
    limits = ConnectionLimits(batch_codes=BATCH_ON_EMBEDDED)
    client = Peer(client_stream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: serve_remoting(counted, broker, ctx, stats=stats, limits=limits, on_request=events.append)
        )
        # queue 3 is empty: that pull is held in a task of its own, the other three answer together
        await client.stream.send_all(b"".join(encode_command(pull(n + 1, n)) for n in range(4)))
        answers = [await client.receive() for _ in range(3)]
        assert counted.writes == 1
        assert [(a.opaque, a.code) for a in answers] == [(n, ResponseCode.SUCCESS) for n in (1, 2, 3)]
        assert [[r.body for r in decode_records(a.body)] for a in answers] == [[b"q0"], [b"q1"], [b"q2"]]
        await wait_until(lambda: 4 in ran_in and "serve_request" in ran_in[4])
        await trio.sleep(1)
        await backend.send(Message("T", b"late", queue_id=3))
        held = await client.receive()
        assert (held.opaque, held.code) == (4, ResponseCode.SUCCESS)
        assert [r.body for r in decode_records(held.body)] == [b"late"]
        await client.stream.aclose()
    assert not any("serve_request" in ran_in[n] for n in (1, 2, 3))
    assert stats.requests == 4
    assert [(e.op, e.status) for e in events] == [("PULL_MESSAGE", "SUCCESS")] * 4


async def test_a_pull_without_a_hold_that_finds_nothing_is_answered_inline(
    backend, ctx, broker, ran_in
) -> None:
    await backend.create_topic("T", 4)
    client_stream, server_stream = trio.testing.memory_stream_pair()
    limits = ConnectionLimits(batch_codes=BATCH_ON_EMBEDDED)
    client = Peer(client_stream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: serve_remoting(server_stream, broker, ctx, limits=limits))
        answer = await client.request(pull(7, 0, suspend_ms="0", code=RequestCode.LITE_PULL_MESSAGE))
        await client.stream.aclose()
    assert (answer.opaque, answer.code) == (7, ResponseCode.PULL_NOT_FOUND)
    assert 7 not in ran_in  # LITE_PULL_MESSAGE has its own entry in the handler table, not wrapped here


async def test_answers_beyond_the_batch_bytes_are_written_before_the_next_pull(
    backend, ctx, broker, autojump_clock
) -> None:
    await backend.create_topic("T", 4)
    for queue in range(4):
        await backend.send(Message("T", b"x" * 1000, queue_id=queue))
    client_stream, server_stream = trio.testing.memory_stream_pair()
    counted = CountingStream(server_stream)
    limits = ConnectionLimits(batch_codes=BATCH_ON_EMBEDDED, batch_bytes=2000)
    client = Peer(client_stream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: serve_remoting(counted, broker, ctx, limits=limits))
        await client.stream.send_all(b"".join(encode_command(pull(n + 1, n)) for n in range(4)))
        answers = [await client.receive() for _ in range(4)]
        await client.stream.aclose()
    assert sorted(a.opaque for a in answers) == [1, 2, 3, 4]
    assert counted.writes == 2  # each answer is over 1,000 bytes: two per write
