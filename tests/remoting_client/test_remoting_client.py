"""The remoting client: opaque matching, timeouts, server requests, back-off, ACL signing.

Most tests drive a :class:`RemotingConnection` against a scripted server over an in-memory stream; the
pool tests use real loopback sockets (a refused port, and an in-process mqproxy).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from mqproxy.codecs.remoting import FLAG_ONEWAY, FrameDecoder, RemotingCommand, encode_command
from mqproxy.codecs.remoting_acl import sign, signature_content, signature_of
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.remoting_client import (
    AddressUnreachable,
    ClientConfig,
    ConnectionClosed,
    RemotingConnection,
    RemotingTimeout,
    open_pool,
)
from mqproxy.server import serve
from mqproxy.settings import Settings

ServerScript = Callable[[trio.abc.Stream, FrameDecoder], Awaitable[None]]


async def _frames(stream: trio.abc.Stream, decoder: FrameDecoder, count: int) -> list[RemotingCommand]:
    got: list[RemotingCommand] = []
    while len(got) < count:
        data = await stream.receive_some(65536)
        if not data:
            break
        got += decoder.receive_data(data)
    return got


async def _with_connection(
    script: ServerScript, body: Callable[[RemotingConnection], Awaitable[Any]], *, on_request: Any = None
) -> Any:
    client_side, server_side = trio.testing.memory_stream_pair()
    connection = RemotingConnection(client_side, "scripted:1", on_request=on_request)
    result: list[Any] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(connection.run)
        nursery.start_soon(script, server_side, FrameDecoder())
        result.append(await body(connection))
        await connection.aclose()
        nursery.cancel_scope.cancel()
    return result[0]


def test_acl_signature_matches_the_java_client() -> None:
    # Computed with rocketmq-acl 4.9.8 AclUtils.combineRequestContent + calSignature
    ext = {"topic": "T1", "b": "x", "AccessKey": "rocketmq2", "queueId": "3"}
    body = "bodyé".encode()
    assert signature_content(ext, body) == "rocketmq2x3T1bodyé".encode()
    assert signature_of(ext, body, "12345678") == "QSfsKxV35GqECSSTU0VKPqrNIgU="
    signed = {"topic": "T1", "b": "x", "queueId": "3"}
    sign(signed, body, "rocketmq2", "12345678")
    assert signed["Signature"] == "QSfsKxV35GqECSSTU0VKPqrNIgU="
    # a verifier recomputes over the received fields; the signature itself is left out
    assert signature_of(signed, body, "12345678") == signed["Signature"]


def test_security_token_is_signed_too() -> None:
    ext: dict[str, str] = {"topic": "T"}
    sign(ext, b"", "ak", "sk", "tok")
    assert ext["SecurityToken"] == "tok"
    assert signature_content(ext) == b"aktokT"


async def test_responses_are_matched_by_opaque_even_out_of_order() -> None:
    async def server(stream: trio.abc.Stream, decoder: FrameDecoder) -> None:
        requests = await _frames(stream, decoder, 2)
        for request in reversed(requests):
            reply = RemotingCommand.response_to(request, ResponseCode.SUCCESS, request.ext_fields["n"])
            await stream.send_all(encode_command(reply))

    async def body(connection: RemotingConnection) -> list[str | None]:
        answers: dict[str, str | None] = {}

        async def ask(n: str) -> None:
            reply = await connection.request(
                RemotingCommand(code=RequestCode.HEART_BEAT, ext_fields={"n": n}), 5
            )
            answers[n] = reply.remark

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "first")
            nursery.start_soon(ask, "second")
        return [answers["first"], answers["second"]]

    assert await _with_connection(server, body) == ["first", "second"]


async def test_a_silent_server_times_out_and_a_late_answer_is_dropped(autojump_clock: Any) -> None:
    async def server(stream: trio.abc.Stream, decoder: FrameDecoder) -> None:
        (request,) = await _frames(stream, decoder, 1)
        await trio.sleep(10)  # answers after the client gave up
        await stream.send_all(encode_command(RemotingCommand.response_to(request, ResponseCode.SUCCESS)))
        (second,) = await _frames(stream, decoder, 1)
        await stream.send_all(encode_command(RemotingCommand.response_to(second, ResponseCode.SUCCESS, "2")))

    async def body(connection: RemotingConnection) -> str | None:
        with pytest.raises(RemotingTimeout, match="within 3 s"):
            await connection.request(RemotingCommand(code=RequestCode.HEART_BEAT), 3)
        await trio.sleep(10)
        reply = await connection.request(RemotingCommand(code=RequestCode.HEART_BEAT), 3)
        assert connection.outstanding == 0
        return reply.remark

    assert await _with_connection(server, body) == "2"


async def test_each_request_times_out_at_its_own_deadline_among_answered_ones(autojump_clock: Any) -> None:
    async def server(stream: trio.abc.Stream, decoder: FrameDecoder) -> None:
        while True:  # answers only the requests marked "answer", at once
            for request in await _frames(stream, decoder, 1):
                if request.ext_fields.get("answer"):
                    await stream.send_all(
                        encode_command(RemotingCommand.response_to(request, ResponseCode.SUCCESS))
                    )

    async def body(connection: RemotingConnection) -> dict[str, float]:
        ended: dict[str, float] = {}
        start = trio.current_time()

        async def ask(name: str, timeout_s: float, delay_s: float, answer: bool) -> None:
            await trio.sleep(delay_s)
            ext = {"answer": "1"} if answer else {}
            try:
                await connection.request(
                    RemotingCommand(code=RequestCode.HEART_BEAT, ext_fields=ext), timeout_s
                )
                ended[name] = -1.0
            except RemotingTimeout:
                ended[name] = trio.current_time() - start

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "long", 10.0, 0.0, False)
            for n in range(20):  # answered: their deadlines are dropped, none fires
                nursery.start_soon(ask, f"answered{n}", 2.0, n * 0.1, True)
            nursery.start_soon(ask, "short", 1.0, 0.5, False)  # due before the long one
            nursery.start_soon(ask, "later", 3.0, 4.0, False)
        assert connection.outstanding == 0
        return ended

    ended = await _with_connection(server, body)
    assert ended.pop("long") == pytest.approx(10.0)
    assert ended.pop("short") == pytest.approx(1.5)
    assert ended.pop("later") == pytest.approx(7.0)
    assert set(ended.values()) == {-1.0}


async def test_a_closed_connection_fails_pending_and_later_requests() -> None:
    async def server(stream: trio.abc.Stream, decoder: FrameDecoder) -> None:
        await _frames(stream, decoder, 1)
        await stream.aclose()

    async def body(connection: RemotingConnection) -> str:
        with pytest.raises(ConnectionClosed, match="before the response"):
            await connection.request(RemotingCommand(code=RequestCode.HEART_BEAT), 5)
        with pytest.raises(ConnectionClosed):
            await connection.request(RemotingCommand(code=RequestCode.HEART_BEAT), 5)
        return connection.close_reason

    assert await _with_connection(server, body) == "closed by peer"


async def test_a_malformed_frame_closes_the_connection() -> None:
    async def server(stream: trio.abc.Stream, decoder: FrameDecoder) -> None:
        await _frames(stream, decoder, 1)
        await stream.send_all(b"\x7f\xff\xff\xff garbage")

    async def body(connection: RemotingConnection) -> str:
        with pytest.raises(ConnectionClosed):
            await connection.request(RemotingCommand(code=RequestCode.HEART_BEAT), 5)
        return connection.close_reason

    assert (await _with_connection(server, body)).startswith("malformed frame from server")


async def test_server_requests_reach_the_handler_and_its_answer_goes_back() -> None:
    answered = trio.Event()
    seen: list[RemotingCommand] = []

    async def handler(request: RemotingCommand) -> RemotingCommand | None:
        seen.append(request)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, "handled")

    async def server(stream: trio.abc.Stream, decoder: FrameDecoder) -> None:
        check = RemotingCommand(
            code=RequestCode.CHECK_TRANSACTION_STATE, opaque=77, ext_fields={"msgId": "m"}
        )
        notify = RemotingCommand(code=RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, opaque=78, flag=FLAG_ONEWAY)
        await stream.send_all(encode_command(notify) + encode_command(check))
        (reply,) = await _frames(stream, decoder, 1)
        assert (reply.is_response, reply.opaque, reply.remark) == (True, 77, "handled")
        answered.set()

    async def body(connection: RemotingConnection) -> list[int]:
        await answered.wait()
        return [r.code for r in seen]

    codes = await _with_connection(server, body, on_request=handler)
    assert sorted(codes) == sorted(
        [RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, RequestCode.CHECK_TRANSACTION_STATE]
    )


async def test_without_a_handler_server_requests_are_refused() -> None:
    got: list[RemotingCommand] = []

    async def server(stream: trio.abc.Stream, decoder: FrameDecoder) -> None:
        request = RemotingCommand(code=RequestCode.GET_CONSUMER_RUNNING_INFO, opaque=5)
        await stream.send_all(encode_command(request))
        got.extend(await _frames(stream, decoder, 1))

    async def body(connection: RemotingConnection) -> None:
        while not got:
            await trio.testing.wait_all_tasks_blocked()

    await _with_connection(server, body)
    assert (got[0].opaque, got[0].code) == (5, ResponseCode.REQUEST_CODE_NOT_SUPPORTED)


def _refused_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed on exit: connecting is refused


async def test_pool_backs_off_after_a_refused_connect(autojump_clock: Any, log_sink: Any) -> None:
    addr = f"127.0.0.1:{_refused_port()}"
    config = ClientConfig(backoff_initial_s=1.0, backoff_max_s=4.0)
    async with open_pool(config) as pool:
        with pytest.raises(AddressUnreachable, match="connect failed"):
            await pool.request(addr, RemotingCommand(code=RequestCode.HEART_BEAT))
        with pytest.raises(AddressUnreachable, match="next attempt in"):
            await pool.request(addr, RemotingCommand(code=RequestCode.HEART_BEAT))
        await trio.sleep(1.01)
        with pytest.raises(AddressUnreachable, match="connect failed"):
            await pool.request(addr, RemotingCommand(code=RequestCode.HEART_BEAT))
    events = log_sink.named("remoting_client.unreachable")
    assert [(e["remote"], e["failures"], e["retry_in_s"]) for e in events] == [(addr, 1, 1.0), (addr, 2, 2.0)]


async def test_pool_talks_to_mqproxy_and_signs_every_request(nursery: trio.Nursery, log_sink: Any) -> None:
    seen: list[dict[str, str]] = []
    handle = await nursery.start(
        lambda task_status: serve(
            Settings.for_tests(), install_signal_handlers=False, task_status=task_status
        )
    )
    try:
        addr = f"127.0.0.1:{handle.address[1]}"
        config = ClientConfig(access_key="ak", secret_key="sk")
        async with open_pool(config) as pool:
            command = RemotingCommand(
                code=RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": "PoolTopic"}
            )
            reply = await pool.request(addr, command)
            seen.append(command.ext_fields)
            assert reply.code == ResponseCode.SUCCESS
            assert b'"queueDatas"' in reply.body
            assert pool.connected(addr)
            # a second request reuses the connection
            again = await pool.request(
                addr,
                RemotingCommand(code=RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": "PoolTopic"}),
            )
            assert again.code == ResponseCode.SUCCESS
    finally:
        handle.stop("test")
    assert seen[0]["AccessKey"] == "ak"
    assert seen[0]["Signature"] == signature_of(seen[0], b"", "sk")
    accepted = [e for e in log_sink.named("conn.accepted")]
    assert len(accepted) == 1
