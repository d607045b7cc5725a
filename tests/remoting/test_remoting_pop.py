"""POP_MESSAGE, ACK/BATCH_ACK, CHANGE_MESSAGE_INVISIBLETIME, PEEK, NOTIFICATION and POLLING_INFO through
RemotingSession with the broker services running (in memory, and the embedded store for restarts)."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import orjson
import pytest
import structlog.testing
import trio

from mqproxy.backends.embedded.broker import open_embedded_broker
from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.backends.embedded.internal_topics import trio_clock_ms
from mqproxy.codecs.message_record import DecodedRecord, decode_records
from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.model.ids import parse_offset_msg_id
from mqproxy.model.types import Message
from mqproxy.remoting.context import HeldPolls, ServerContext
from mqproxy.remoting.session import RemotingSession

from .conftest import send  # type: ignore[import-not-found]

ADVERTISED = ("10.0.0.8", 8080)


def pop_ext(**overrides: object) -> dict[str, str]:
    """Java 5 PopMessageRequestHeader: strings only."""
    ext = {
        "consumerGroup": "G",
        "topic": "T",
        "queueId": "0",
        "maxMsgNums": "32",
        "invisibleTime": "60000",
        "pollTime": "0",
        "bornTime": str(time.time_ns() // 1_000_000),
        "initMode": "0",
        "expType": "TAG",
        "exp": "*",
        "order": "false",
    }
    ext.update({k: str(v) for k, v in overrides.items()})
    return ext


async def pop(wire, session, **overrides: object) -> tuple[RemotingCommand, list[DecodedRecord]]:
    response = await session.handle(wire(RequestCode.POP_MESSAGE, pop_ext(**overrides)))
    assert response is not None
    records = decode_records(response.body) if response.code == ResponseCode.SUCCESS else []
    return response, records


def ack_ext(record: DecodedRecord, **overrides: object) -> dict[str, str]:
    ext = {
        "consumerGroup": "G",
        "topic": "T",
        "queueId": str(record.queue_id),
        "offset": str(record.queue_offset),
        "extraInfo": record.properties["POP_CK"],
    }
    ext.update({k: str(v) for k, v in overrides.items()})
    return ext


async def ack(wire, session, record: DecodedRecord, **overrides: object) -> RemotingCommand:
    response = await session.handle(wire(RequestCode.ACK_MESSAGE, ack_ext(record, **overrides)))
    assert response is not None
    return response


@pytest.fixture
async def topic(backend) -> str:
    await backend.create_topic("T", 2)
    return "T"


async def test_pop_then_ack(wire, session, topic, autojump_clock) -> None:
    for i in range(3):
        await send(wire, session, b"m%d" % i)
    response, records = await pop(wire, session)
    assert response.code == ResponseCode.SUCCESS
    ext = response.ext_fields
    pop_time, rq = ext["popTime"], ext["reviveQid"]
    assert (ext["invisibleTime"], ext["restNum"]) == ("60000", "0")
    assert ext["startOffsetInfo"] == "0 0 0"
    assert ext["msgOffsetInfo"] == "0 0 0,1,2"
    assert "orderCountInfo" not in ext
    assert [r.body for r in records] == [b"m0", b"m1", b"m2"]
    assert [r.properties["POP_CK"] for r in records] == [
        f"0 {pop_time} 60000 {rq} 0 broker-a 0 {o}" for o in range(3)
    ]
    assert {r.topic for r in records} == {"T"}
    for record in records:
        answer = await ack(wire, session, record)
        assert (answer.code, answer.remark) == (ResponseCode.SUCCESS, None)
    twice = await ack(wire, session, records[0])
    assert (twice.code, twice.remark) == (ResponseCode.SUCCESS, "already acked")
    await trio.sleep(61)
    empty, _ = await pop(wire, session, queueId=-1)
    assert empty.code == ResponseCode.PULL_NOT_FOUND
    assert session.broker.services.pop.revived == 0


async def test_a_message_with_a_separator_in_a_property_is_popped_and_pulled(
    wire, session, backend, topic, autojump_clock
) -> None:
    # stored by another protocol (an MQTT topic may hold \x01): a remoting consumer still gets it
    await backend.send(Message("T", b"odd", queue_id=0, properties={"MQTT_TOPIC": "a/\x01/b", "TAGS": "A"}))
    response, (record,) = await pop(wire, session, queueId=0)
    assert response.code == ResponseCode.SUCCESS
    assert (record.body, record.properties["MQTT_TOPIC"]) == (b"odd", "a/\ufffd/b")
    ext = {"consumerGroup": "G2", "topic": "T", "queueId": "0", "queueOffset": "0", "maxMsgNums": "32",
           "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*"}  # fmt: skip
    pulled = await session.handle(wire(RequestCode.PULL_MESSAGE, ext))
    assert pulled is not None
    assert pulled.code == ResponseCode.SUCCESS
    assert [r.properties["MQTT_TOPIC"] for r in decode_records(pulled.body)] == ["a/\ufffd/b"]


async def test_a_message_with_over_long_properties_is_popped_peeked_and_pulled(
    wire, session, backend, topic, autojump_clock
) -> None:
    # an MQTT topic of ~32.7 KB passes the store's 32,767-byte check, then the LMQ dispatch properties the
    # store adds take the stored properties past what a record's 2-byte properties length can carry
    props = {"MQTT_TOPIC": "t/" + "x" * 32_680, "UNIQ_KEY": "ID1", "TAGS": "A"}
    await backend.send(Message("T", b"m0", queue_id=0, properties={"UNIQ_KEY": "ID0", "TAGS": "A"}))
    await backend.send(
        Message("T", b"long", queue_id=0, properties=props, dispatch=("%LMQ%t%2Fx", "%LMQ%t%2F%23"))
    )
    await backend.send(Message("T", b"m2", queue_id=0, properties={"UNIQ_KEY": "ID2", "TAGS": "A"}))
    ext = {"consumerGroup": "G2", "topic": "T", "queueId": "0", "queueOffset": "0", "maxMsgNums": "32",
           "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*"}  # fmt: skip
    with structlog.testing.capture_logs() as logs:
        peek = {"consumerGroup": "G", "topic": "T", "queueId": "0", "maxMsgNums": "32"}
        peeked = await session.handle(wire(RequestCode.PEEK_MESSAGE, peek))
        popped, records = await pop(wire, session, queueId=0)
        pulled = await session.handle(wire(RequestCode.PULL_MESSAGE, ext))
    assert peeked is not None
    assert pulled is not None
    for response in (peeked, popped, pulled):
        assert response.code == ResponseCode.SUCCESS
        got = decode_records(response.body)
        assert [(r.body, r.properties["UNIQ_KEY"], r.properties["TAGS"]) for r in got] == [
            (b"m0", "ID0", "A"), (b"long", "ID1", "A"), (b"m2", "ID2", "A")
        ]  # fmt: skip
        assert "MQTT_TOPIC" not in got[1].properties
    assert "POP_CK" in records[1].properties
    dropped = [e for e in logs if e["event"] == "remoting.properties_dropped"]
    assert [(e["op"], e["offset"], e["msg_id"], e["dropped_properties"]) for e in dropped] == [
        ("PEEK_MESSAGE", 1, "ID1", ["MQTT_TOPIC"]),
        ("POP_MESSAGE", 1, "ID1", ["MQTT_TOPIC"]),
        ("PULL_MESSAGE", 1, "ID1", ["MQTT_TOPIC"]),
    ]
    assert all(e["log_level"] == "warning" and e["properties_bytes"] > 32_767 for e in dropped)


async def test_sent_and_popped_record_are_the_same(wire, session, topic, autojump_clock) -> None:
    sent = await send(wire, session, b"same", 1, UNIQ_KEY="AB" * 16, KEYS="k")
    _, (record,) = await pop(wire, session, queueId=1)
    assert record.commitlog_offset == parse_offset_msg_id(sent.ext_fields["msgId"])[1]
    assert (record.queue_id, str(record.queue_offset)) == (1, sent.ext_fields["queueOffset"])
    assert record.properties["UNIQ_KEY"] == sent.ext_fields["transactionId"] == "AB" * 16
    assert (record.body, record.properties["KEYS"], record.born_host) == (b"same", "k", ("192.0.2.2", 50000))
    stored = await session.broker.get_message(record.commitlog_offset)
    assert stored.body == record.body


async def test_unacked_message_reappears_with_a_grown_count(wire, session, topic, autojump_clock) -> None:
    await send(wire, session, b"flaky")
    _, (first,) = await pop(wire, session, invisibleTime=10000)
    await trio.sleep(9)
    assert (await pop(wire, session, queueId=-1))[0].code == ResponseCode.PULL_NOT_FOUND
    await trio.sleep(2)
    response, (again,) = await pop(wire, session, queueId=-1, invisibleTime=10000)
    assert again.body == b"flaky"
    assert again.reconsume_times == first.reconsume_times + 1 == 1
    assert again.topic == "%RETRY%G_T"  # the stored topic: clients key the header strings by it
    assert response.ext_fields["startOffsetInfo"] == "1 0 0"
    assert response.ext_fields["msgOffsetInfo"] == "1 0 0"
    assert again.properties["POP_CK"].split(" ")[4] == "1"
    assert again.properties["UNIQ_KEY"] == first.properties["UNIQ_KEY"]
    assert (await ack(wire, session, again)).code == ResponseCode.SUCCESS
    stale = await ack(wire, session, first)  # the first receipt's checkpoint was revived
    assert stale.code == ResponseCode.NO_MESSAGE
    assert stale.remark.startswith("ReceiptExpired:")
    await trio.sleep(11)
    assert (await pop(wire, session, queueId=-1))[0].code == ResponseCode.PULL_NOT_FOUND


async def test_ordered_pop_keeps_order(wire, session, topic, autojump_clock) -> None:
    for i in range(3):
        await send(wire, session, b"o%d" % i)
    response, (first,) = await pop(wire, session, order="true", maxMsgNums=1, invisibleTime=10000)
    assert response.ext_fields["reviveQid"] == "999"
    assert response.ext_fields["orderCountInfo"] == "0 qo0%0 0;0 0 0"
    assert first.body == b"o0"
    assert (await pop(wire, session, order="true"))[0].code == ResponseCode.PULL_NOT_FOUND  # queue blocked
    assert (await ack(wire, session, first)).code == ResponseCode.SUCCESS
    _, (second,) = await pop(wire, session, order="true", maxMsgNums=1, invisibleTime=10000)
    assert second.body == b"o1"
    await trio.sleep(11)  # not acked: the same message again, attempt count 1
    response, (retried,) = await pop(wire, session, order="true", maxMsgNums=1, invisibleTime=10000)
    assert (retried.body, retried.queue_offset) == (b"o1", 1)
    assert response.ext_fields["orderCountInfo"] == "0 qo0%1 1;0 0 1"
    assert (await ack(wire, session, retried)).code == ResponseCode.SUCCESS
    _, rest = await pop(wire, session, order="true")
    assert [r.body for r in rest] == [b"o2"]


async def test_change_invisible_time(wire, session, topic, autojump_clock) -> None:
    await send(wire, session, b"slow")
    _, (record,) = await pop(wire, session, invisibleTime=10000)
    ext = ack_ext(record, invisibleTime=60000)
    response = await session.handle(wire(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, ext))
    assert response.code == ResponseCode.SUCCESS
    changed = response.ext_fields
    assert changed["invisibleTime"] == "60000"
    await trio.sleep(30)
    assert (await pop(wire, session, queueId=-1))[0].code == ResponseCode.PULL_NOT_FOUND
    # the handle as the Java client rebuilds it from the response
    handle = f"0 {changed['popTime']} 60000 {changed['reviveQid']} 0 broker-a 0 0"
    assert (await ack(wire, session, record, extraInfo=handle)).code == ResponseCode.SUCCESS
    old = await ack(wire, session, record)
    assert old.code == ResponseCode.NO_MESSAGE
    again = await session.handle(
        wire(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, ack_ext(record, extraInfo=handle, invisibleTime=5000))
    )
    assert again.code == ResponseCode.NO_MESSAGE
    assert again.remark.startswith("MessageAlreadyAcked:")
    await trio.sleep(60)
    assert session.broker.services.pop.revived == 0


@pytest.mark.parametrize(
    ("override", "code", "remark_start"),
    [
        (
            {"extraInfo": "garbage"},
            ResponseCode.MESSAGE_ILLEGAL,
            "MalformedReceipt: receipt handle has 1 fields",
        ),
        (
            {"extraInfo": "0 1 2 3 0 broker-a 0 x"},
            ResponseCode.MESSAGE_ILLEGAL,
            "MalformedReceipt: receipt handle has a non-numeric",
        ),
        ({"offset": "1"}, ResponseCode.MESSAGE_ILLEGAL, "MalformedReceipt: extraInfo names queue 0 offset 0"),
        (
            {"extraInfo": "0 1 2 3 0 broker-a 0 7", "offset": "7"},
            ResponseCode.NO_MESSAGE,
            "OffsetOutOfRange:",
        ),
        (
            {"extraInfo": "0 1 2 3 0 broker-a 9 0", "queueId": "9"},
            ResponseCode.MESSAGE_ILLEGAL,
            "QueueNotFound:",
        ),
        ({"extraInfo": "0 1 60000 3 0 broker-a 0 0"}, ResponseCode.NO_MESSAGE, "ReceiptExpired:"),
        ({"topic": "NOPE"}, ResponseCode.TOPIC_NOT_EXIST, "TopicNotFound:"),
        ({"extraInfo": None}, ResponseCode.INVALID_PARAMETER, "header field 'extraInfo' is missing"),
    ],
)
async def test_bad_acks_change_nothing(
    override, code, remark_start, wire, session, topic, autojump_clock
) -> None:
    await send(wire, session, b"x")
    _, (record,) = await pop(wire, session, invisibleTime=10000)
    ext = ack_ext(record, **{k: v for k, v in override.items() if v is not None})
    if override.get("extraInfo", "") is None:
        del ext["extraInfo"]
    response = await session.handle(wire(RequestCode.ACK_MESSAGE, ext))
    assert response.code == code
    assert response.remark.startswith(remark_start), response.remark
    await trio.sleep(11)  # the real receipt was not acked: the message is revived
    _, (again,) = await pop(wire, session, queueId=-1)
    assert (again.body, again.reconsume_times) == (b"x", 1)


@pytest.mark.parametrize(
    ("override", "code", "remark_start"),
    [
        ({"maxMsgNums": 33}, ResponseCode.INVALID_PARAMETER, "the broker option max message number 33"),
        ({"maxMsgNums": 0}, ResponseCode.INVALID_PARAMETER, "the broker option max message number 0"),
        ({"invisibleTime": 0}, ResponseCode.INVALID_PARAMETER, "invisibleTime 0 is not positive"),
        ({"initMode": 3}, ResponseCode.INVALID_PARAMETER, "initMode 3 is not 0 or 1"),
        ({"queueId": 2}, ResponseCode.INVALID_PARAMETER, "QueueNotFound:"),
        ({"topic": "NOPE"}, ResponseCode.TOPIC_NOT_EXIST, "TopicNotFound:"),
        (
            {"expType": "SQL92", "exp": "a > 1"},
            ResponseCode.SUBSCRIPTION_PARSE_FAILED,
            "expression type 'SQL92'",
        ),
        ({"pollTime": 1000, "bornTime": 1}, ResponseCode.POLLING_TIMEOUT, "the pop request arrived"),
    ],
)
async def test_bad_pops_change_nothing(
    override, code, remark_start, wire, session, topic, autojump_clock
) -> None:
    await send(wire, session, b"x")
    response, _ = await pop(wire, session, **override)
    assert response.code == code
    assert response.remark.startswith(remark_start), response.remark
    _, records = await pop(wire, session)
    assert [r.body for r in records] == [b"x"]


async def test_long_polling_pop(wire, session, topic, autojump_clock) -> None:
    polls = session.ctx.polls

    async def late_send() -> None:
        await trio.sleep(2)
        info = await session.handle(
            wire(RequestCode.POLLING_INFO, {"consumerGroup": "G", "topic": "T", "queueId": "0"})
        )
        assert info.ext_fields["pollingNum"] == "1"
        await send(wire, session, b"late")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(late_send)
        started = trio.current_time()
        response, records = await pop(wire, session, pollTime=15000)
    assert trio.current_time() - started == pytest.approx(2, abs=0.05)
    assert response.code == ResponseCode.SUCCESS
    assert [r.body for r in records] == [b"late"]
    started = trio.current_time()
    response, _ = await pop(wire, session, pollTime=5000)
    assert (response.code, trio.current_time() - started) == (
        ResponseCode.POLLING_TIMEOUT,
        pytest.approx(5, abs=0.05),
    )
    assert polls.count(("T", "G", 0)) == 0


async def test_polling_full(wire, backend, topic, services, autojump_clock, broker) -> None:
    ctx = ServerContext(*ADVERTISED, polls=HeldPolls(per_key=1))
    session = RemotingSession(broker, ctx)

    async def held() -> None:
        response, _ = await pop(wire, session, pollTime=5000)
        assert response.code == ResponseCode.POLLING_TIMEOUT

    async with trio.open_nursery() as nursery:
        nursery.start_soon(held)
        await trio.sleep(1)
        response, _ = await pop(wire, session, pollTime=5000)
        assert (response.code, response.remark) == (
            ResponseCode.POLLING_FULL,
            "too many pop requests are held for this queue",
        )
        note = await session.handle(
            wire(
                RequestCode.NOTIFICATION,
                {"consumerGroup": "G", "topic": "T", "queueId": "0", "pollTime": "5000", "bornTime": "0"},
            )
        )
        assert note.ext_fields["pollingFull"] == "true"


async def test_batch_ack(wire, session, topic, autojump_clock) -> None:
    for i in range(3):
        await send(wire, session, b"b%d" % i)
    response, _ = await pop(wire, session, invisibleTime=10000)
    ext = response.ext_fields
    bits = base64.b64encode(bytes([0b101])).decode()  # offsets 0 and 2
    body = orjson.dumps(
        {
            "brokerName": "broker-a",
            "acks": [
                {
                    "c": "G",
                    "t": "T",
                    "r": "0",
                    "so": 0,
                    "q": 0,
                    "rq": int(ext["reviveQid"]),
                    "pt": int(ext["popTime"]),
                    "it": 10000,
                    "b": bits,
                }
            ],
        }
    )
    answer = await session.handle(wire(RequestCode.BATCH_ACK_MESSAGE, None, body))
    assert (answer.code, answer.remark) == (ResponseCode.SUCCESS, None)
    await trio.sleep(11)
    _, again = await pop(wire, session, queueId=-1)
    assert [r.body for r in again] == [b"b1"]
    # an entry with a stale popTime is counted as failed
    stale = orjson.dumps(
        {
            "acks": [
                {
                    "consumerGroup": "G",
                    "topic": "T",
                    "retry": "0",
                    "startOffset": 0,
                    "queueId": 0,
                    "reviveQueueId": 0,
                    "popTime": 5,
                    "invisibleTime": 1,
                    "bitSet": bits,
                }
            ]
        }
    )
    answer = await session.handle(wire(RequestCode.BATCH_ACK_MESSAGE, None, stale))
    assert answer.code == ResponseCode.SUCCESS
    assert answer.remark.startswith("2 of 2 acks failed, first: ReceiptExpired")


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[]",
        b'{"acks": {}}',
        b'{"acks": [1]}',
        b'{"acks": [{"t": "T", "r": 0, "so": 0, "q": 0, "rq": 0, "pt": 0, "it": 0, "b": ""}]}',
        b'{"acks": [{"c": "G", "t": "T", "r": 5, "so": 0, "q": 0, "rq": 0, "pt": 0, "it": 0, "b": ""}]}',
        b'{"acks": [{"c": "G", "t": "T", "r": 0, "so": -1, "q": 0, "rq": 0, "pt": 0, "it": 0, "b": ""}]}',
        b'{"acks": [{"c": "G", "t": "T", "r": 0, "so": 0, "q": 0, "rq": 0, "pt": 0, "it": 0, "b": "!!"}]}',
    ],
)
async def test_malformed_batch_ack(body, wire, session, autojump_clock) -> None:
    response = await session.handle(wire(RequestCode.BATCH_ACK_MESSAGE, None, body))
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert response.remark.startswith("batch ack body")


async def test_peek_does_not_pop(wire, session, topic, autojump_clock) -> None:
    ext = {"consumerGroup": "G", "topic": "T", "queueId": "-1", "maxMsgNums": "32"}
    empty = await session.handle(wire(RequestCode.PEEK_MESSAGE, ext))
    assert empty.code == ResponseCode.PULL_NOT_FOUND
    await send(wire, session, b"p0")
    await send(wire, session, b"p1", 1)
    peeked = await session.handle(wire(RequestCode.PEEK_MESSAGE, ext))
    assert peeked.code == ResponseCode.SUCCESS
    assert sorted(r.body for r in decode_records(peeked.body)) == [b"p0", b"p1"]
    assert peeked.ext_fields["restNum"] == "0"
    _, records = await pop(wire, session, queueId=-1)
    assert sorted(r.body for r in records) == [b"p0", b"p1"]


async def test_notification(wire, session, topic, autojump_clock) -> None:
    ext = {"consumerGroup": "G", "topic": "T", "queueId": "-1", "pollTime": "0", "bornTime": "0"}
    response = await session.handle(wire(RequestCode.NOTIFICATION, ext))
    assert (response.code, response.ext_fields["hasMsg"], response.ext_fields["pollingFull"]) == (
        ResponseCode.SUCCESS,
        "false",
        "false",
    )

    async def late_send() -> None:
        await trio.sleep(3)
        await send(wire, session, b"n", 1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(late_send)
        started = trio.current_time()
        response = await session.handle(wire(RequestCode.NOTIFICATION, dict(ext, pollTime="20000")))
    assert trio.current_time() - started == pytest.approx(3, abs=0.05)
    assert response.ext_fields["hasMsg"] == "true"
    unknown = await session.handle(wire(RequestCode.NOTIFICATION, dict(ext, topic="NOPE")))
    assert unknown.code == ResponseCode.TOPIC_NOT_EXIST


async def test_pop_revival_survives_a_restart(wire, tmp_path: Path, autojump_clock) -> None:
    path = tmp_path / "store"
    clock = trio_clock_ms()
    async with (
        open_embedded_store(path, segment_bytes=1 << 20) as store,
        open_embedded_broker(store, now_ms=clock) as broker,
    ):
        session = RemotingSession(broker, ServerContext(*ADVERTISED), peer=("192.0.2.2", 50000))
        await store.create_topic("T", 1)
        await send(wire, session, b"acked")
        await send(wire, session, b"lost")
        _, records = await pop(wire, session, invisibleTime=30000)
        assert [r.body for r in records] == [b"acked", b"lost"]
        assert (await ack(wire, session, records[0])).code == ResponseCode.SUCCESS
    await trio.sleep(31)  # the deadline passes while the server is down
    async with (
        open_embedded_store(path, segment_bytes=1 << 20) as store,
        open_embedded_broker(store, now_ms=clock) as broker,
    ):
        session = RemotingSession(broker, ServerContext(*ADVERTISED), peer=("192.0.2.2", 50000))
        await trio.sleep(1)
        _, again = await pop(wire, session, queueId=-1)
        assert [(r.body, r.reconsume_times) for r in again] == [(b"lost", 1)]
        assert (await ack(wire, session, again[0])).code == ResponseCode.SUCCESS
        stale = await ack(wire, session, records[1])
        assert stale.code == ResponseCode.NO_MESSAGE
