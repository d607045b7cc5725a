"""Admin requests relayed to a consumer client (GET_CONSUMER_RUNNING_INFO 307, CONSUME_MESSAGE_DIRECTLY 309)
over in-memory connections sharing one server-side registry."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import trio
import trio.testing

from mqproxy.backends.embedded.broker import EmbeddedBroker
from mqproxy.codecs.message_record import decode_records
from mqproxy.codecs.remoting import FLAG_ONEWAY, RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.model.ids import offset_msg_id
from mqproxy.model.types import Message
from mqproxy.remoting.admin import CALL_TIMEOUT_S
from mqproxy.remoting.context import ServerContext
from mqproxy.remoting.registry import ConnectionRegistry

from .conftest import ADVERTISED, Peer, open_peer  # type: ignore[import-not-found]

DIRECT_RESULT = (
    b'{"order":false,"autoCommit":true,"consumeResult":"CR_SUCCESS","remark":null,"spentTimeMills":12}'
)


@pytest.fixture
def ctx(registry: ConnectionRegistry) -> ServerContext:
    return ServerContext(*ADVERTISED, groups=registry)


async def connect(nursery: trio.Nursery, broker: EmbeddedBroker, ctx: ServerContext) -> Peer:
    return (await open_peer(nursery, broker, ctx, skip_notify=True))[0]


async def join(peer: Peer, client_id: str, group: str = "G") -> None:
    body = json.dumps({"clientID": client_id, "consumerDataSet": [
        {"groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
         "subscriptionDataSet": [{"topic": "T", "subString": "*"}]}]}).encode()  # fmt: skip
    response = await peer.request(RemotingCommand(RequestCode.HEART_BEAT, opaque=1, body=body))
    assert response.code == ResponseCode.SUCCESS


Answer = Callable[[RemotingCommand], RemotingCommand | None]


async def serve_consumer(peer: Peer, answer: Answer, seen: list[RemotingCommand]) -> None:
    """Answer every server->client request with ``answer(request)`` (None: stay silent)."""
    while True:
        request = await peer.receive()
        if request.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            continue
        seen.append(request)
        response = answer(request)
        if response is not None:
            response.opaque, response.flag = request.opaque, 1
            await peer.send(response)


def running_info(group: str = "G", client_id: str = "c@1", opaque: int = 50) -> RemotingCommand:
    ext = {"consumerGroup": group, "clientId": client_id, "jstackEnable": "false"}
    return RemotingCommand(RequestCode.GET_CONSUMER_RUNNING_INFO, opaque=opaque, ext_fields=ext)


def direct(msg_id: str, client_id: str = "c@1", opaque: int = 60) -> RemotingCommand:
    ext = {"consumerGroup": "G", "clientId": client_id, "msgId": msg_id, "topic": "T"}
    return RemotingCommand(RequestCode.CONSUME_MESSAGE_DIRECTLY, opaque=opaque, ext_fields=ext)


def max_offset(opaque: int) -> RemotingCommand:
    ext = {"topic": "T", "queueId": "0"}
    return RemotingCommand(RequestCode.GET_MAX_OFFSET, opaque=opaque, ext_fields=ext)


async def test_running_info_is_relayed_and_answered(backend, ctx, broker) -> None:
    seen: list[RemotingCommand] = []
    info = b'{"properties":{"consumeType":"CONSUME_PASSIVELY"},"subscriptionSet":[]}'

    def answer(request: RemotingCommand) -> RemotingCommand:
        return RemotingCommand(ResponseCode.SUCCESS, remark="fine", body=info)

    async with trio.open_nursery() as nursery:
        consumer, admin = await connect(nursery, broker, ctx), await connect(nursery, broker, ctx)
        await join(consumer, "c@1")
        nursery.start_soon(serve_consumer, consumer, answer, seen)
        with trio.fail_after(1):
            response = await admin.request(running_info(opaque=777))
        assert (response.code, response.opaque, response.remark, response.body) == (0, 777, "fine", info)
        assert response.is_response
        (relayed,) = seen
        assert relayed.code == RequestCode.GET_CONSUMER_RUNNING_INFO
        assert relayed.opaque != 777
        assert not relayed.is_response
        assert not relayed.is_oneway
        assert relayed.ext_fields == {"consumerGroup": "G", "clientId": "c@1", "jstackEnable": "false"}
        nursery.cancel_scope.cancel()


async def test_consume_message_directly_sends_the_stored_record(backend, ctx, broker) -> None:
    stored = await backend.send(Message("T", b"hello", queue_id=1, properties={"TAGS": "A"}))
    msg_id = offset_msg_id(ADVERTISED, stored.commitlog_offset)
    seen: list[RemotingCommand] = []

    def answer(request: RemotingCommand) -> RemotingCommand:
        return RemotingCommand(ResponseCode.SUCCESS, body=DIRECT_RESULT)

    async with trio.open_nursery() as nursery:
        consumer, admin = await connect(nursery, broker, ctx), await connect(nursery, broker, ctx)
        await join(consumer, "c@1")
        nursery.start_soon(serve_consumer, consumer, answer, seen)
        with trio.fail_after(1):
            response = await admin.request(direct(msg_id.lower(), opaque=61))
        assert (response.code, response.opaque, response.body) == (ResponseCode.SUCCESS, 61, DIRECT_RESULT)
        (relayed,) = seen
        assert relayed.code == RequestCode.CONSUME_MESSAGE_DIRECTLY
        assert relayed.ext_fields["msgId"] == msg_id.lower()
        assert relayed.ext_fields["clientId"] == "c@1"
        assert relayed.ext_fields["brokerName"] == "broker-a"
        (record,) = decode_records(relayed.body)
        assert (record.topic, record.body, record.queue_id) == ("T", b"hello", 1)
        assert record.commitlog_offset == stored.commitlog_offset
        assert record.properties["TAGS"] == "A"
        nursery.cancel_scope.cancel()


async def test_silent_consumer_times_out_and_blocks_nobody(backend, ctx, autojump_clock, broker) -> None:
    seen: list[RemotingCommand] = []
    async with trio.open_nursery() as nursery:
        consumer, admin = await connect(nursery, broker, ctx), await connect(nursery, broker, ctx)
        other = await connect(nursery, broker, ctx)
        await join(consumer, "c@1")
        nursery.start_soon(serve_consumer, consumer, lambda request: None, seen)
        started = trio.current_time()
        await admin.send(running_info(opaque=5))
        await trio.sleep(1.0)
        # meanwhile the admin's own connection and a third one are served
        during = await other.request(max_offset(8))
        assert during.opaque == 8
        assert trio.current_time() - started < CALL_TIMEOUT_S
        mine = await admin.request(max_offset(9))
        assert mine.opaque == 9
        assert trio.current_time() - started < CALL_TIMEOUT_S
        timed_out = await admin.receive()
        waited = trio.current_time() - started
        assert timed_out.opaque == 5
        assert timed_out.code == ResponseCode.CONSUME_MSG_TIMEOUT
        assert "consumer <G> <c@1> Timeout" in (timed_out.remark or "")
        assert CALL_TIMEOUT_S <= waited < CALL_TIMEOUT_S + 0.5
        assert len(seen) == 1
        # a late answer is dropped; the consumer's connection still works
        await consumer.send(RemotingCommand(ResponseCode.SUCCESS, opaque=seen[0].opaque, flag=1))
        nursery.cancel_scope.cancel()


async def test_consumer_dying_mid_call_fails_at_once(backend, ctx, autojump_clock, broker) -> None:
    async with trio.open_nursery() as nursery:
        consumer, admin = await connect(nursery, broker, ctx), await connect(nursery, broker, ctx)
        await join(consumer, "c@1")
        started = trio.current_time()
        await admin.send(running_info(opaque=5))
        relayed = await consumer.receive()
        assert relayed.code == RequestCode.GET_CONSUMER_RUNNING_INFO
        await consumer.stream.aclose()
        response = await admin.receive()
        assert response.opaque == 5
        assert response.code == ResponseCode.SYSTEM_ERROR
        assert "Exception: connection closed" in (response.remark or "")
        assert trio.current_time() - started < 0.5
        # now it is gone from the registry
        again = await admin.request(running_info(opaque=6))
        assert (again.code, again.remark) == (ResponseCode.SYSTEM_ERROR, "The Consumer <G> <c@1> not online")
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("group", "client_id"), [("G", "nobody@1"), ("OTHER", "c@1")], ids=["unknown-client", "other-group"]
)
async def test_consumer_not_online(group, client_id, backend, ctx, broker) -> None:
    async with trio.open_nursery() as nursery:
        consumer, admin = await connect(nursery, broker, ctx), await connect(nursery, broker, ctx)
        await join(consumer, "c@1")
        response = await admin.request(running_info(group, client_id, opaque=3))
        assert response.opaque == 3
        assert response.code == ResponseCode.SYSTEM_ERROR
        assert response.remark == f"The Consumer <{group}> <{client_id}> not online"
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "msg_id", ["0A00000800001F900000000000ABCDEF", "not-a-msg-id"], ids=["unknown", "garbage"]
)
async def test_consume_directly_unknown_message(msg_id, backend, ctx, broker) -> None:
    seen: list[RemotingCommand] = []
    async with trio.open_nursery() as nursery:
        consumer, admin = await connect(nursery, broker, ctx), await connect(nursery, broker, ctx)
        await join(consumer, "c@1")
        nursery.start_soon(serve_consumer, consumer, lambda request: None, seen)
        response = await admin.request(direct(msg_id, opaque=4))
        assert response.opaque == 4
        assert response.code == ResponseCode.SYSTEM_ERROR
        assert "msgId" in (response.remark or "")
        assert seen == []
        nursery.cancel_scope.cancel()


async def test_missing_client_id_is_invalid(backend, ctx, broker) -> None:
    async with trio.open_nursery() as nursery:
        admin = await connect(nursery, broker, ctx)
        command = RemotingCommand(
            RequestCode.GET_CONSUMER_RUNNING_INFO, opaque=2, ext_fields={"consumerGroup": "G"}
        )
        response = await admin.request(command)
        assert (response.code, response.opaque) == (ResponseCode.INVALID_PARAMETER, 2)
        assert "clientId" in (response.remark or "")
        nursery.cancel_scope.cancel()


async def test_oneway_running_info_is_relayed_but_not_answered(backend, ctx, broker) -> None:
    seen: list[RemotingCommand] = []
    relayed = trio.Event()

    def answer(request: RemotingCommand) -> RemotingCommand:
        relayed.set()
        return RemotingCommand(ResponseCode.SUCCESS, body=b"{}")

    async with trio.open_nursery() as nursery:
        consumer, admin = await connect(nursery, broker, ctx), await connect(nursery, broker, ctx)
        await join(consumer, "c@1")
        nursery.start_soon(serve_consumer, consumer, answer, seen)
        oneway = running_info(opaque=11)
        oneway.flag = FLAG_ONEWAY
        await admin.send(oneway)
        with trio.fail_after(1):
            await relayed.wait()
        await trio.testing.wait_all_tasks_blocked()  # the consumer's answer has reached the server
        # the next answer the admin gets is for its next request, not the oneway one
        response = await admin.request(max_offset(12))
        assert response.opaque == 12
        assert admin.ready == []
        nursery.cancel_scope.cancel()
