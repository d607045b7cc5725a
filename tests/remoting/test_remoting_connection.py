"""serve_remoting over in-memory streams: concurrency, ordering, NOTIFY, server->client calls, closing."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing

from mqproxy.codecs.message_record import decode_records
from mqproxy.codecs.remoting import RemotingCommand, encode_command
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.remoting.connection import ConnectionLimits, ConnectionStats, serve_remoting
from mqproxy.remoting.context import RequestEvent, ServerContext
from mqproxy.remoting.registry import ConnectionRegistry

from ..conftest import CountingStream  # type: ignore[import-not-found]
from .conftest import ADVERTISED, Peer, open_peer  # type: ignore[import-not-found]


def pull(opaque: int, queue: int = 0, suspend_ms: str = "15000") -> RemotingCommand:
    ext = {"consumerGroup": "G", "topic": "T", "queueId": str(queue), "queueOffset": "0", "maxMsgNums": "32",
           "sysFlag": "6", "commitOffset": "0", "suspendTimeoutMillis": suspend_ms, "subscription": "*",
           "subVersion": "0"}  # fmt: skip
    return RemotingCommand(RequestCode.PULL_MESSAGE, opaque=opaque, ext_fields=ext)


def send(opaque: int, queue: int, body: bytes) -> RemotingCommand:
    ext = {"a": "PG", "b": "T", "e": str(queue), "f": "0", "g": "0", "h": "0", "i": "TAGS\x01A\x02"}
    return RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=opaque, ext_fields=ext, body=body)


def heartbeat(opaque: int, client_id: str) -> RemotingCommand:
    body = json.dumps({"clientID": client_id, "consumerDataSet": [
        {"groupName": "G", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
         "subscriptionDataSet": [{"topic": "T", "subString": "*"}]}]}).encode()  # fmt: skip
    return RemotingCommand(RequestCode.HEART_BEAT, opaque=opaque, body=body)


@pytest.fixture
def ctx(registry: ConnectionRegistry) -> ServerContext:
    return ServerContext(*ADVERTISED, groups=registry)


async def test_long_poll_does_not_block_and_responses_go_out_of_order(
    backend, ctx, autojump_clock, broker
) -> None:
    await backend.create_topic("T", 4)
    events: list[RequestEvent] = []
    async with trio.open_nursery() as nursery:
        client, stats = await open_peer(nursery, broker, ctx, on_request=events.append)
        await client.send(pull(1))  # held: queue 0 is empty
        await client.send(send(2, 1, b"elsewhere"))  # queue 1 does not wake the poll
        first = await client.receive()
        assert (first.opaque, first.code) == (2, ResponseCode.SUCCESS)
        await trio.sleep(3)
        await client.send(send(3, 0, b"wake up"))
        answers = {(await client.receive()).opaque: None for _ in range(2)}
        assert set(answers) == {1, 3}
        await client.stream.aclose()
    assert stats.requests == 3
    assert stats.error is None
    assert stats.bytes_in > 0
    assert stats.bytes_out > 0
    by_op = {e.op: e for e in events}
    assert by_op["PULL_MESSAGE"].latency_ms == pytest.approx(3000, abs=5)
    assert by_op["PULL_MESSAGE"].resp_bytes > 0
    assert by_op["PULL_MESSAGE"].req_bytes > 0


async def test_pull_response_over_the_wire(backend, ctx, autojump_clock, broker) -> None:
    await backend.create_topic("T", 4)
    async with trio.open_nursery() as nursery:
        client, _ = await open_peer(nursery, broker, ctx)
        await client.send(send(1, 0, b"body bytes"))
        assert (await client.receive()).code == ResponseCode.SUCCESS
        await client.send(pull(2))
        response = await client.receive()
        assert response.code == ResponseCode.SUCCESS
        assert [r.body for r in decode_records(response.body)] == [b"body bytes"]
        await client.stream.aclose()


@pytest.mark.parametrize(
    ("garbage", "reason"),
    [
        (b"\x00\x00\x00\x02xx", "bad_frame_length"),
        (b"\x7f\xff\xff\xff", "frame_too_large"),
        (b"\x00\x00\x00\x08\x00\x00\x00\x04{{{{", "bad_json_header"),
        (b"\x00\x00\x00\x08\x05\x00\x00\x04abcd", "bad_serialize_type"),
    ],
)
async def test_garbage_closes_cleanly(garbage, reason, backend, ctx, registry, broker) -> None:
    client_stream, server_stream = trio.testing.memory_stream_pair()
    client = Peer(client_stream)
    async with trio.open_nursery() as nursery:
        result: list[ConnectionStats] = []

        async def run() -> None:
            result.append(await serve_remoting(server_stream, broker, ctx))

        nursery.start_soon(run)
        await client.send(heartbeat(1, "c@1"))
        assert (await client.receive()).code == ResponseCode.SUCCESS
        assert await backend.consumer_ids("G") == ["c@1"]
        await client.stream.send_all(garbage)
    (stats,) = result
    assert stats.error == reason
    assert stats.requests == 1
    assert await backend.consumer_ids("G") == []  # its consumers were unregistered
    assert registry.connections("G") == []


async def test_initial_bytes_from_the_sniffer(backend, ctx, broker) -> None:
    frame = encode_command(send(5, 0, b"sniffed"))
    async with trio.open_nursery() as nursery:
        client, stats = await open_peer(nursery, broker, ctx, initial=frame[:6])
        await client.stream.send_all(frame[6:])
        response = await client.receive()
        assert (response.opaque, response.code) == (5, ResponseCode.SUCCESS)
        await client.stream.aclose()
    assert stats.bytes_in == len(frame)


async def test_notify_consumer_ids_changed_and_disconnect(backend, ctx, broker) -> None:
    async with trio.open_nursery() as nursery:
        a, _ = await open_peer(nursery, broker, ctx)
        b, stats_b = await open_peer(nursery, broker, ctx)
        await a.send(heartbeat(1, "a@1"))
        assert (await a.receive()).opaque == 1
        own = await a.receive()  # the joining member is told too, as a Java broker does
        assert own.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
        await b.send(heartbeat(1, "b@1"))
        assert (await b.receive()).opaque == 1
        assert (await b.receive()).code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
        notify = await a.receive()
        assert notify.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
        assert notify.flag == 2
        assert notify.ext_fields == {"consumerGroup": "G"}
        assert notify.opaque != own.opaque
        await b.stream.aclose()  # b disconnects: a is told, b is gone from the group
        again = await a.receive()
        assert again.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
        assert again.opaque != notify.opaque
        assert await backend.consumer_ids("G") == ["a@1"]
        await a.stream.aclose()
    assert stats_b.error is None


async def test_server_to_client_call_and_unmatched_responses(backend, ctx, registry, broker) -> None:
    async with trio.open_nursery() as nursery:
        client, _ = await open_peer(nursery, broker, ctx)
        await client.send(heartbeat(1, "c@1"))
        await client.receive()
        assert (await client.receive()).code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED  # it joined G
        # a response nobody asked for is dropped, the connection stays up
        await client.send(RemotingCommand(ResponseCode.SUCCESS, opaque=4242, flag=1))
        (connection,) = registry.connections("G")
        answer: list[RemotingCommand | None] = []
        answered = trio.Event()

        async def ask() -> None:
            command = RemotingCommand(
                RequestCode.GET_CONSUMER_RUNNING_INFO, ext_fields={"consumerGroup": "G"}
            )
            answer.append(await connection.call(command, 5.0))  # type: ignore[attr-defined]
            answered.set()

        nursery.start_soon(ask)
        request = await client.receive()
        assert request.code == RequestCode.GET_CONSUMER_RUNNING_INFO
        assert not request.is_response
        await client.send(RemotingCommand(ResponseCode.SUCCESS, opaque=request.opaque, flag=1, body=b"{}"))
        with trio.fail_after(5):
            await answered.wait()
        assert answer[0] is not None
        assert answer[0].body == b"{}"
        await client.send(send(9, 0, b"still alive"))
        assert (await client.receive()).opaque == 9
        await client.stream.aclose()


async def test_idle_connection_is_closed(backend, ctx, autojump_clock, broker) -> None:
    async with trio.open_nursery() as nursery:
        _, stats = await open_peer(nursery, broker, ctx, limits=ConnectionLimits(idle_timeout_s=120))
    assert stats.error == "idle_timeout"
    assert trio.current_time() == pytest.approx(120, abs=0.1)


async def test_too_many_requests_in_flight(backend, ctx, autojump_clock, broker) -> None:
    await backend.create_topic("T", 4)
    async with trio.open_nursery() as nursery:
        client, _ = await open_peer(nursery, broker, ctx, limits=ConnectionLimits(max_in_flight=1))
        await client.send(pull(1, suspend_ms="1000"))
        await client.send(pull(2, queue=1, suspend_ms="1000"))
        busy = await client.receive()
        assert (busy.opaque, busy.code) == (2, ResponseCode.SYSTEM_BUSY)
        assert (busy.remark or "").startswith("[OVERLOAD]")
        held = await client.receive()
        assert (held.opaque, held.code) == (1, ResponseCode.PULL_NOT_FOUND)
        await client.stream.aclose()


async def test_oneway_requests_get_no_answer(backend, ctx, broker) -> None:
    async with trio.open_nursery() as nursery:
        client, stats = await open_peer(nursery, broker, ctx)
        oneway = send(1, 0, b"x")
        oneway.flag = 2
        await client.send(oneway)
        await client.send(send(2, 0, b"y"))
        response = await client.receive()
        assert response.opaque == 2
        assert response.code == ResponseCode.SUCCESS
        await trio.testing.wait_all_tasks_blocked()
        stored = (await backend.pull("T", 0, 0, 32)).messages
        assert sorted(m.body for m in stored) == [b"x", b"y"]  # requests run concurrently: any order
        await client.stream.aclose()
    assert stats.requests == 2


async def test_frames_split_across_reads_are_measured_exactly(backend, ctx, broker) -> None:
    events: list[RequestEvent] = []
    first, second = encode_command(send(1, 0, b"one")), encode_command(send(2, 1, b"two" * 50))
    async with trio.open_nursery() as nursery:
        client, stats = await open_peer(nursery, broker, ctx, on_request=events.append)
        for byte in first + second:  # one byte per read
            await client.stream.send_all(bytes([byte]))
        responses = {(await client.receive()).opaque for _ in range(2)}
        await client.stream.aclose()
    assert responses == {1, 2}
    assert sorted(e.req_bytes for e in events) == sorted([len(first), len(second)])
    assert stats.bytes_in == len(first) + len(second)
    assert stats.bytes_out == sum(e.resp_bytes for e in events)


async def test_drain_answers_a_held_pull_at_once(backend, ctx, autojump_clock, broker) -> None:
    """A pull held when the server drains is answered PULL_NOT_FOUND at once (not when its hold ends, nor
    cut at the grace), with the offsets of the queue as it is; then the connection ends."""
    await backend.create_topic("T", 4)
    draining = trio.Event()
    returned_at: list[float] = []
    client_stream, server_stream = trio.testing.memory_stream_pair()
    client = Peer(client_stream)

    async def serve() -> None:
        await serve_remoting(server_stream, broker, ctx, draining=draining)
        returned_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        await client.send(pull(1))  # held: queue 0 is empty
        await trio.sleep(1)
        draining.set()
        response = await client.receive()
        assert (response.opaque, response.code) == (1, ResponseCode.PULL_NOT_FOUND)
        assert response.ext_fields["nextBeginOffset"] == "0"
        assert trio.current_time() == pytest.approx(1.0, abs=0.01)
    assert returned_at == [pytest.approx(1.0, abs=0.01)]


async def test_responses_of_concurrent_requests_leave_together(backend, ctx, broker) -> None:
    client_stream, server_stream = trio.testing.memory_stream_pair()
    counted = CountingStream(server_stream)
    stats = ConnectionStats()
    client = Peer(client_stream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: serve_remoting(counted, broker, ctx, stats=stats))
        frames = b"".join(encode_command(send(n, n % 4, b"m%d" % n)) for n in range(1, 51))
        await client.stream.send_all(frames)  # 50 requests in one read: handled concurrently
        responses = [await client.receive() for _ in range(50)]
        await client.stream.aclose()
    assert sorted(r.opaque for r in responses) == list(range(1, 51))
    assert {r.code for r in responses} == {ResponseCode.SUCCESS}
    assert counted.writes < 50
    assert stats.bytes_out == sum(len(encode_command(r)) for r in responses)


async def test_a_client_that_stops_reading_is_closed_after_the_write_timeout(
    backend, ctx, autojump_clock, broker
) -> None:
    client_stream, server_stream = trio.testing.lockstep_stream_pair()  # a write waits for the peer
    client = Peer(client_stream)
    limits = ConnectionLimits(write_timeout_s=10, max_outbox_bytes=256)
    async with trio.open_nursery() as nursery:
        stats = ConnectionStats()
        nursery.start_soon(lambda: serve_remoting(server_stream, broker, ctx, stats=stats, limits=limits))
        for n in range(1, 21):  # read by the server, never answered: the client does not read
            await client.send(send(n, 0, b"x" * 64))
    assert stats.error == "write_timeout"
    assert trio.current_time() == pytest.approx(10.0, abs=0.1)
    await client.stream.aclose()


async def test_a_oneway_sent_just_before_the_peer_closes_still_completes(backend, ctx, broker) -> None:
    await backend.create_topic("T", 4)
    gate = trio.Event()
    real_send = broker.send

    async def slow_send(request):  # type: ignore[no-untyped-def]
        await gate.wait()  # as a broker round trip in cluster mode
        return await real_send(request)

    broker.send = slow_send
    client_stream, server_stream = trio.testing.memory_stream_pair()
    client = Peer(client_stream)
    served = trio.Event()

    async def serve() -> None:
        await serve_remoting(server_stream, broker, ctx)
        served.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        oneway = send(1, 0, b"last words")
        oneway.flag = 2
        await client.send(oneway)
        await trio.testing.wait_all_tasks_blocked()
        await client.stream.aclose()  # the client leaves while its oneway is in flight
        await trio.testing.wait_all_tasks_blocked()
        assert not served.is_set(), "the connection waits for its oneway"
        gate.set()
    stored = (await backend.pull("T", 0, 0, 32)).messages
    assert [m.body for m in stored] == [b"last words"]


async def test_a_lone_inline_request_runs_in_the_read_loop_pipelined_ones_in_tasks(
    backend, ctx, broker, monkeypatch
) -> None:
    from mqproxy.remoting.service import INLINE_ON_EMBEDDED, INLINE_SENDS
    from mqproxy.remoting.session import HANDLERS

    await backend.create_topic("T", 4)
    original = HANDLERS[RequestCode.SEND_MESSAGE_V2]
    ran_in: dict[int, str] = {}

    async def recording(session, request, note):  # type: ignore[no-untyped-def]
        ran_in[request.opaque] = trio.lowlevel.current_task().name
        return await original(session, request, note)

    monkeypatch.setitem(HANDLERS, RequestCode.SEND_MESSAGE_V2, recording)
    limits = ConnectionLimits(inline_codes=INLINE_ON_EMBEDDED | INLINE_SENDS)
    async with trio.open_nursery() as nursery:
        client, stats = await open_peer(nursery, broker, ctx, limits=limits)
        await client.send(pull(1, queue=3))  # held: never inline, must not block what follows
        await trio.testing.wait_all_tasks_blocked()  # read alone, not with the next frame
        await client.send(send(2, 0, b"alone"))
        assert (await client.receive()).opaque == 2
        await client.stream.send_all(encode_command(send(3, 0, b"a")) + encode_command(send(4, 0, b"b")))
        assert {(await client.receive()).opaque for _ in range(2)} == {3, 4}
        await client.stream.aclose()
    assert "serve_request" not in ran_in[2]
    assert "serve_request" in ran_in[3]
    assert "serve_request" in ran_in[4]
    assert stats.requests == 4
    messages = await backend.pull("T", 0, 0, 32)
    assert sorted(m.body for m in messages.messages) == [b"a", b"alone", b"b"]


async def test_a_oneway_over_the_in_flight_limit_waits_for_a_slot(
    backend, ctx, autojump_clock, broker
) -> None:
    """Beyond ``max_in_flight`` a oneway request is not dropped (it has no answer to carry SYSTEM_BUSY): the
    reader waits for a slot, so the client is slowed by back-pressure, and it runs once one is free."""
    await backend.create_topic("T", 4)
    async with trio.open_nursery() as nursery:
        client, _ = await open_peer(nursery, broker, ctx, limits=ConnectionLimits(max_in_flight=1))
        await client.send(pull(1, suspend_ms="1000"))  # holds the one slot for 1 s
        oneway = send(2, 1, b"waits")
        oneway.flag = 2
        await client.send(oneway)
        await trio.sleep(0.5)
        assert not (await backend.pull("T", 1, 0, 32)).messages
        held = await client.receive()
        assert (held.opaque, held.code) == (1, ResponseCode.PULL_NOT_FOUND)
        assert trio.current_time() == pytest.approx(1.0, abs=0.01)
        await client.stream.aclose()
    stored = (await backend.pull("T", 1, 0, 32)).messages
    assert [m.body for m in stored] == [b"waits"]


def _gate_sends(broker) -> trio.Event:  # type: ignore[no-untyped-def]
    gate = trio.Event()
    real_send = broker.send

    async def slow_send(request):  # type: ignore[no-untyped-def]
        await gate.wait()
        return await real_send(request)

    broker.send = slow_send
    return gate


def _route(opaque: int, version: int) -> RemotingCommand:
    return RemotingCommand(
        RequestCode.GET_ROUTEINFO_BY_TOPIC, opaque=opaque, ext_fields={"topic": "T"}, version=version
    )


async def test_draining_answers_new_requests_go_away_for_clients_that_understand_it(
    backend, ctx, broker
) -> None:
    """A client newer than 5.3.1 gets GO_AWAY (1500) for a request sent while the server drains (it reconnects
    and sends it again, as from a stock broker shutting down); what was in flight still completes."""
    await backend.create_topic("T", 4)
    gate = _gate_sends(broker)
    draining = trio.Event()
    client_stream, server_stream = trio.testing.memory_stream_pair()
    client = Peer(client_stream)
    served = trio.Event()

    async def serve() -> None:
        await serve_remoting(server_stream, broker, ctx, draining=draining)
        served.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        await client.send(send(1, 0, b"in flight"))  # version 479 (5.3.3)
        await trio.testing.wait_all_tasks_blocked()
        draining.set()
        await client.send(_route(2, 479))
        away = await client.receive()
        assert (away.opaque, away.code, away.remark) == (2, ResponseCode.GO_AWAY, "please go away")
        gate.set()
        done = await client.receive()
        assert (done.opaque, done.code) == (1, ResponseCode.SUCCESS)
        await served.wait()  # then the connection ends


async def test_draining_stops_reading_older_clients(backend, ctx, broker) -> None:
    """A client of 5.3.1 or older has no GO_AWAY: nothing more is read once the server drains; what was in
    flight completes, then the connection ends."""
    await backend.create_topic("T", 4)
    gate = _gate_sends(broker)
    draining = trio.Event()
    client_stream, server_stream = trio.testing.memory_stream_pair()
    client = Peer(client_stream)
    old = send(1, 0, b"in flight")
    old.version = 475
    served = trio.Event()

    async def serve() -> None:
        await serve_remoting(server_stream, broker, ctx, draining=draining)
        served.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        await client.send(old)
        await trio.testing.wait_all_tasks_blocked()
        draining.set()
        await client.send(_route(2, 475))
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
        done = await client.receive()
        assert (done.opaque, done.code) == (1, ResponseCode.SUCCESS)
        await served.wait()
        assert not client.ready
        with trio.move_on_after(0.1):
            assert not await client.stream.receive_some(65536), "the route request was never answered"
