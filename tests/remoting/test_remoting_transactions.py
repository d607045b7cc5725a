"""Transactional SEND, END_TRANSACTION and the CHECK_TRANSACTION_STATE check-back over remoting."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing

from mqproxy.backends.embedded.broker import open_embedded_broker
from mqproxy.backends.embedded.internal_topics import trio_clock_ms
from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.backends.embedded.services import ServiceSettings
from mqproxy.codecs.message_record import SYSFLAG_TRANSACTION_COMMIT, SYSFLAG_TRANSACTION_MASK, decode_records
from mqproxy.codecs.remoting import SERIALIZE_ROCKETMQ, RemotingCommand, encode_command
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.facade.types import TransactionCheck
from mqproxy.model.ids import parse_offset_msg_id
from mqproxy.model.properties import HALF_TOPIC
from mqproxy.model.types import Message
from mqproxy.negotiation import Detected, Protocol
from mqproxy.remoting.context import ServerContext
from mqproxy.remoting.registry import ConnectionRegistry
from mqproxy.remoting.service import RemotingService
from mqproxy.remoting.session import RemotingSession
from mqproxy.runtime.context import ConnectionContext

from .conftest import ADVERTISED, Peer, pull  # type: ignore[import-not-found]

UNIQ = "C0A80005" + "AB" * 12


def half_ext(group: str = "PG", uniq: str = UNIQ) -> dict[str, str]:
    """Java 4.9.4 transactional SEND_MESSAGE_V2: sysFlag PREPARED, TRAN_MSG and PGROUP set."""
    props = f"TAGS\x01A\x02UNIQ_KEY\x01{uniq}\x02TRAN_MSG\x01true\x02PGROUP\x01{group}\x02WAIT\x01true\x02"
    return {
        "a": group,
        "b": "T",
        "c": "TBW102",
        "d": "4",
        "e": "0",
        "f": "4",
        "g": "1700000000001",
        "h": "0",
        "i": props,
        "j": "0",
        "k": "false",
        "m": "false",
    }


def end_ext(sent: RemotingCommand, resolution: int, group: str = "PG", **extra: str) -> dict[str, str]:
    """What the Java producer derives from the send response (offset decoded from ``msgId``)."""
    ext = {
        "producerGroup": group,
        "tranStateTableOffset": sent.ext_fields["queueOffset"],
        "commitLogOffset": str(parse_offset_msg_id(sent.ext_fields["msgId"])[1]),
        "commitOrRollback": str(resolution),
        "fromTransactionCheck": "false",
        "msgId": sent.ext_fields["transactionId"],
        "transactionId": sent.ext_fields["transactionId"],
        "topic": "T",
    }
    ext.update(extra)
    return ext


async def send_half(wire, session, body: bytes = b"order #1", **kwargs: str) -> RemotingCommand:
    response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, half_ext(**kwargs), body))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS, response.remark
    return response


async def test_half_message_is_invisible_until_commit(wire, session, backend, autojump_clock) -> None:
    sent = await send_half(wire, session)
    assert sent.ext_fields["transactionId"] == UNIQ
    half = await backend.get_message(parse_offset_msg_id(sent.ext_fields["msgId"])[1])
    assert half is not None
    assert (half.topic, str(half.queue_offset)) == (HALF_TOPIC, sent.ext_fields["queueOffset"])
    assert half.properties["REAL_TOPIC"] == "T"
    await trio.sleep(1)
    assert [r.body for r in await pull(wire, session)] == []
    commit = wire(RequestCode.END_TRANSACTION, end_ext(sent, 8), flag=2)  # oneway, as producers send it
    assert await session.handle(commit) is None
    ext = {
        "consumerGroup": "G",
        "topic": "T",
        "queueId": "0",
        "queueOffset": "0",
        "maxMsgNums": "32",
        "sysFlag": "4",
        "commitOffset": "0",
        "suspendTimeoutMillis": "0",
        "subscription": "*",
    }
    (record,) = decode_records((await session.handle(wire(RequestCode.PULL_MESSAGE, ext))).body)
    assert record.body == b"order #1"
    assert record.properties["UNIQ_KEY"] == UNIQ
    assert record.properties["TRAN_MSG"] == "true"  # kept, as the Java broker keeps it
    assert "REAL_TOPIC" not in record.properties
    assert "REAL_QID" not in record.properties
    assert record.sys_flag & SYSFLAG_TRANSACTION_MASK == SYSFLAG_TRANSACTION_COMMIT
    # ending it again is an error and changes nothing
    again = await session.handle(wire(RequestCode.END_TRANSACTION, end_ext(sent, 8)))
    assert again.code == ResponseCode.SYSTEM_ERROR
    assert again.remark.startswith("TransactionAlreadyResolved:")
    assert [r.body for r in await pull(wire, session)] == [b"order #1"]


async def test_rollback_is_never_visible(wire, session, autojump_clock) -> None:
    sent = await send_half(wire, session)
    response = await session.handle(wire(RequestCode.END_TRANSACTION, end_ext(sent, 12)))
    assert (response.code, response.remark) == (ResponseCode.SUCCESS, "rollback")
    await trio.sleep(120)  # past every check-back time
    assert [r.body for r in await pull(wire, session)] == []
    assert session.broker.unresolved_transactions() == 0


async def test_unknown_state_leaves_it_pending(wire, session, autojump_clock) -> None:
    sent = await send_half(wire, session)
    response = await session.handle(wire(RequestCode.END_TRANSACTION, end_ext(sent, 0)))
    assert response.code == ResponseCode.SUCCESS
    assert session.broker.unresolved_transactions() == 1
    assert [r.body for r in await pull(wire, session)] == []


@pytest.mark.parametrize(
    ("override", "code", "remark_start"),
    [
        ({"commitLogOffset": "987654"}, ResponseCode.SYSTEM_ERROR, "TransactionNotFound: no half message"),
        ({"commitLogOffset": "-1"}, ResponseCode.SYSTEM_ERROR, "TransactionNotFound: bad commit-log offset"),
        (
            {"producerGroup": "OTHER"},
            ResponseCode.SYSTEM_ERROR,
            "TransactionGroupMismatch: the producer group wrong",
        ),
        ({"commitOrRollback": "5"}, ResponseCode.INVALID_PARAMETER, "commitOrRollback 5 is not 0"),
        ({"commitLogOffset": "abc"}, ResponseCode.INVALID_PARAMETER, "header field 'commitLogOffset' is not"),
    ],
)
async def test_bad_end_transaction_changes_nothing(
    override, code, remark_start, wire, session, autojump_clock
) -> None:
    sent = await send_half(wire, session)
    response = await session.handle(wire(RequestCode.END_TRANSACTION, end_ext(sent, 8, **override)))
    assert response is not None
    assert response.code == code
    assert response.remark.startswith(remark_start), response.remark
    assert session.broker.unresolved_transactions() == 1
    assert [r.body for r in await pull(wire, session)] == []


async def test_commit_of_a_plain_message_offset_is_refused(wire, session, autojump_clock) -> None:
    ext = {"a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1", "h": "0", "i": ""}
    plain = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, ext, b"plain"))
    response = await session.handle(wire(RequestCode.END_TRANSACTION, end_ext(plain, 8)))
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert response.remark.startswith("TransactionNotFound:")
    assert [r.body for r in await pull(wire, session)] == [b"plain"]


async def test_end_transaction_with_a_binary_header(wire, binary, session, autojump_clock) -> None:
    sent = await send_half(wire, session)
    response = await session.handle(binary(RequestCode.END_TRANSACTION, end_ext(sent, 8)))
    assert response.code == ResponseCode.SUCCESS
    assert encode_command(response)[4] == SERIALIZE_ROCKETMQ
    assert [r.body for r in await pull(wire, session)] == [b"order #1"]


# --- check-back over a connection -------------------------------------------------------------------


def producer_heartbeat(opaque: int, client_id: str, group: str) -> RemotingCommand:
    body = json.dumps(
        {
            "clientID": client_id,
            "consumerDataSet": [],
            "producerDataSet": [{"groupName": "CLIENT_INNER_PRODUCER"}, {"groupName": group}],
        }
    ).encode()
    return RemotingCommand(RequestCode.HEART_BEAT, opaque=opaque, body=body)


async def test_check_back_reaches_a_live_producer_and_its_answer_commits(autojump_clock) -> None:
    backend = InMemoryBackend(store_host=("10.0.0.8", 8080))
    settings = ServiceSettings(transaction_timeout_s=6, transaction_check_interval_s=30)
    async with (
        open_embedded_broker(backend, settings, now_ms=trio_clock_ms()) as broker,
        trio.open_nursery() as nursery,
    ):
        service = RemotingService(broker, ServerContext(*ADVERTISED))
        await nursery.start(service.run)  # registers the service's check-back sender with the broker
        clients = []
        for client_id, group in (("p@1", "PG"), ("q@2", "OTHER")):
            client_stream, server_stream = trio.testing.memory_stream_pair()
            conn = ConnectionContext(client_id, ("192.0.2.2", 50000), ADVERTISED)
            nursery.start_soon(service.serve, server_stream, conn, Detected(Protocol.REMOTING))
            client = Peer(client_stream)
            await client.send(producer_heartbeat(1, client_id, group))
            assert (await client.receive()).code == ResponseCode.SUCCESS
            clients.append(client)
        producer, bystander = clients
        await producer.send(
            RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=2, ext_fields=half_ext(), body=b"tx")
        )
        sent = await producer.receive()
        assert sent.code == ResponseCode.SUCCESS
        started = trio.current_time()

        check = await producer.receive()
        assert trio.current_time() - started == pytest.approx(6, abs=0.1)
        assert check.code == RequestCode.CHECK_TRANSACTION_STATE
        assert check.is_oneway
        assert check.ext_fields["commitLogOffset"] == str(parse_offset_msg_id(sent.ext_fields["msgId"])[1])
        assert check.ext_fields["tranStateTableOffset"] == sent.ext_fields["queueOffset"]
        assert check.ext_fields["msgId"] == check.ext_fields["transactionId"] == UNIQ
        assert check.ext_fields["offsetMsgId"] == sent.ext_fields["msgId"]
        assert check.ext_fields["topic"] == "T"
        (record,) = decode_records(check.body)
        assert (record.topic, record.body) == ("T", b"tx")
        assert record.properties["PGROUP"] == "PG"
        assert record.properties["UNIQ_KEY"] == UNIQ
        assert str(record.commitlog_offset) == check.ext_fields["commitLogOffset"]

        answer = end_ext(sent, 8, fromTransactionCheck="true")
        await producer.send(RemotingCommand(RequestCode.END_TRANSACTION, opaque=3, flag=2, ext_fields=answer))
        await trio.sleep(0.1)
        assert broker.unresolved_transactions() == 0
        result = await backend.pull("T", 0, 0, 32)
        assert [m.body for m in result.messages] == [b"tx"]
        with trio.move_on_after(60) as quiet:
            await bystander.receive()  # the other group's producer never hears of it
        assert quiet.cancelled_caught
        nursery.cancel_scope.cancel()


async def test_check_back_without_a_live_producer_reports_false(autojump_clock) -> None:
    registry = ConnectionRegistry()
    backend = InMemoryBackend()
    async with open_embedded_broker(backend, now_ms=trio_clock_ms()) as broker:
        await broker.services.send(
            Message("T", b"x", properties={"TRAN_MSG": "true", "PGROUP": "PG", "UNIQ_KEY": UNIQ})
        )
        half = (await backend.pull(HALF_TOPIC, 0, 0, 1)).messages[0]
        assert await registry.check_transaction(TransactionCheck("PG", UNIQ, 1, half, half)) is False


class FakePeer:
    def __init__(self, alive: bool = True) -> None:
        self.alive = alive
        self.checks: list[TransactionCheck] = []

    def notify_consumer_ids_changed(self, group: str) -> None:
        return None

    def check_transaction_state(self, check: TransactionCheck) -> bool:
        if self.alive:
            self.checks.append(check)
        return self.alive


async def test_registry_prefers_the_newest_live_producer(backend, session, autojump_clock) -> None:
    registry = ConnectionRegistry()
    old, new, dead, elsewhere = FakePeer(), FakePeer(), FakePeer(alive=False), FakePeer()
    for peer in (old, new, dead):
        registry.join_producer("PG", peer)
    registry.join_producer("OTHER", elsewhere)
    await session.broker.services.send(Message("T", b"x", properties={"TRAN_MSG": "true", "PGROUP": "PG"}))
    half = (await backend.pull(HALF_TOPIC, 0, 0, 1)).messages[0]
    check = TransactionCheck("PG", UNIQ, 1, half, half)
    assert await registry.check_transaction(check) is True  # dead is newest but gone: new gets it
    assert (len(old.checks), len(new.checks), len(elsewhere.checks)) == (0, 1, 0)
    assert registry.leave_producer("PG", new) is False  # others remain
    assert registry.leave_producer("PG", new) is False  # idempotent
    assert await registry.check_transaction(check) is True
    assert len(old.checks) == 1
    assert registry.leave_producer("PG", old) is False
    assert registry.leave_producer("PG", dead) is True  # the group's last producer left
    assert registry.leave_producer("PG", dead) is False
    assert registry.producers("PG") == []
    assert await registry.check_transaction(check) is False


async def test_heartbeat_unregister_and_close_track_producer_groups(backend, autojump_clock, broker) -> None:
    registry = ConnectionRegistry()
    ctx = ServerContext("10.0.0.8", 8080, groups=registry)
    session = RemotingSession(broker, ctx)
    await session.handle(producer_heartbeat(1, "p@1", "PG"))
    assert registry.producers("PG") == [session]
    assert registry.producers("CLIENT_INNER_PRODUCER") == []
    await session.handle(producer_heartbeat(2, "p@1", "PG2"))  # PG no longer announced
    assert (registry.producers("PG"), registry.producers("PG2")) == ([], [session])
    unregister = RemotingCommand(
        RequestCode.UNREGISTER_CLIENT,
        opaque=3,
        ext_fields={"clientID": "p@1", "producerGroup": "PG2", "consumerGroup": ""},
    )
    assert (await session.handle(unregister)).code == ResponseCode.SUCCESS
    assert registry.producers("PG2") == []
    await session.handle(producer_heartbeat(4, "p@1", "PG3"))
    await session.close()
    assert registry.producers("PG3") == []
