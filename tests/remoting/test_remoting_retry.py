"""CONSUMER_SEND_MSG_BACK and delayed SENDs through RemotingSession with the broker services running."""

from __future__ import annotations

import functools

import pytest
import trio

from mqproxy.backends.embedded.internal_topics import trio_clock_ms
from mqproxy.codecs.message_record import DecodedRecord, decode_records, encode_record
from mqproxy.codecs.remoting import SERIALIZE_ROCKETMQ, RemotingCommand, encode_command
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.model.ids import offset_msg_id, parse_offset_msg_id
from mqproxy.model.properties import SCHEDULE_TOPIC
from mqproxy.remoting.context import ServerContext
from mqproxy.remoting.session import RemotingSession

from .conftest import pull  # type: ignore[import-not-found]
from .conftest import send as send_v2  # type: ignore[import-not-found]

#: Sends here create one-queue topics and may be refused.
send = functools.partial(send_v2, queues=1, ok=False)

ADVERTISED = ("10.0.0.8", 8080)


def send_back_ext(record: DecodedRecord, delay: int = 0, max_times: int = 2, **extra: str) -> dict[str, str]:
    ext = {
        "offset": str(record.commitlog_offset),
        "group": "G",
        "delayLevel": str(delay),
        # a Java client sends MessageExt.getMsgId(), the UNIQ_KEY; the broker records the offset id anyway
        "originMsgId": record.properties.get("UNIQ_KEY")
        or offset_msg_id(ADVERTISED, record.commitlog_offset),
        "originTopic": "T",
        "unitMode": "false",
        "maxReconsumeTimes": str(max_times),
    }
    ext.update(extra)
    return ext


async def test_failed_message_comes_back_with_growing_count_then_lands_in_dlq(
    wire, session, autojump_clock
) -> None:
    session = session
    sent = await send(wire, session, b"fragile", UNIQ_KEY="AB" * 16)
    assert sent.code == ResponseCode.SUCCESS
    (first,) = await pull(wire, session, "T")
    assert parse_offset_msg_id(sent.ext_fields["msgId"])[1] == first.commitlog_offset

    seen = [first]
    # delay level 3 + reconsumeTimes: 10 s, then 30 s
    for expected_delay_s, retry_offset in ((10, 0), (30, 1)):
        response = await session.handle(wire(RequestCode.CONSUMER_SEND_MSG_BACK, send_back_ext(seen[-1])))
        assert response is not None
        assert response.code == ResponseCode.SUCCESS
        assert response.remark == f"retry at delay level {3 + len(seen) - 1}"
        await trio.sleep(expected_delay_s - 0.5)
        assert await pull(wire, session, "%RETRY%G", retry_offset) == []
        await trio.sleep(1)
        (again,) = await pull(wire, session, "%RETRY%G", retry_offset)
        assert again.body == b"fragile"
        assert again.reconsume_times == len(seen)
        assert again.properties["RETRY_TOPIC"] == "T"
        assert again.properties["ORIGIN_MESSAGE_ID"] == offset_msg_id(ADVERTISED, first.commitlog_offset)
        assert again.properties["UNIQ_KEY"] == "AB" * 16
        assert again.born_timestamp_ms == first.born_timestamp_ms
        seen.append(again)

    # reconsumeTimes 2 >= maxReconsumeTimes 2: dead letter, at once
    response = await session.handle(wire(RequestCode.CONSUMER_SEND_MSG_BACK, send_back_ext(seen[-1])))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert response.remark == "sent to %DLQ%G after 2 reconsumes"
    (dead,) = await pull(wire, session, "%DLQ%G")
    assert dead.body == b"fragile"
    assert dead.reconsume_times == 3
    assert dead.properties["RETRY_TOPIC"] == "T"
    assert "DELAY" not in dead.properties
    assert await session.broker.services.scheduler.pending() == 0  # nothing else was queued for retry
    assert len(await pull(wire, session, "%RETRY%G")) == 2


async def test_delay_level_0_and_99_and_negative(wire, session, autojump_clock) -> None:
    await send(wire, session, b"x")
    (record,) = await pull(wire, session, "T")
    level0 = await session.handle(wire(RequestCode.CONSUMER_SEND_MSG_BACK, send_back_ext(record, delay=0)))
    assert (level0.code, level0.remark) == (ResponseCode.SUCCESS, "retry at delay level 3")
    level99 = await session.handle(wire(RequestCode.CONSUMER_SEND_MSG_BACK, send_back_ext(record, delay=99)))
    assert (level99.code, level99.remark) == (ResponseCode.SUCCESS, "delay level 99 clamped to 18")
    assert await session.broker.max_offset(SCHEDULE_TOPIC, 2) == 1  # level 3 queue
    assert await session.broker.max_offset(SCHEDULE_TOPIC, 17) == 1  # level 18 queue
    negative = await session.handle(wire(RequestCode.CONSUMER_SEND_MSG_BACK, send_back_ext(record, delay=-1)))
    assert (negative.code, negative.remark) == (ResponseCode.SUCCESS, "sent to %DLQ%G after 0 reconsumes")
    assert len(await pull(wire, session, "%DLQ%G")) == 1


@pytest.mark.parametrize(
    ("override", "code", "remark"),
    [
        ({"offset": "999999"}, ResponseCode.SYSTEM_ERROR, "look message by offset failed, 999999"),
        ({"offset": "-3"}, ResponseCode.SYSTEM_ERROR, "look message by offset failed, -3"),
        ({"offset": "x"}, ResponseCode.INVALID_PARAMETER, "header field 'offset' is not an integer: 'x'"),
        ({"group": ""}, ResponseCode.INVALID_PARAMETER, "header field 'group' is empty"),
    ],
)
async def test_bad_send_back_changes_nothing(override, code, remark, wire, session, autojump_clock) -> None:
    await send(wire, session, b"x")
    (record,) = await pull(wire, session, "T")
    response = await session.handle(
        wire(RequestCode.CONSUMER_SEND_MSG_BACK, send_back_ext(record, **override))
    )
    assert response is not None
    assert (response.code, response.remark) == (code, remark)
    assert await session.broker.get_topic("%RETRY%G") is None
    assert await session.broker.get_topic("%DLQ%G") is None


async def test_send_back_of_an_internal_record_is_refused(wire, session, autojump_clock) -> None:
    await send(wire, session, b"later", DELAY="1")  # parked in SCHEDULE_TOPIC_XXXX at offset 0
    parked = await session.broker.get_message(0)
    assert parked is not None
    assert parked.topic == SCHEDULE_TOPIC
    record = decode_records(encode_record(parked))[0]
    response = await session.handle(wire(RequestCode.CONSUMER_SEND_MSG_BACK, send_back_ext(record)))
    assert (response.code, response.remark) == (ResponseCode.SYSTEM_ERROR, "look message by offset failed, 0")


async def test_send_back_with_a_binary_header(wire, binary, session, autojump_clock) -> None:
    await send(wire, session, b"x")
    (record,) = await pull(wire, session, "T")
    response = await session.handle(binary(RequestCode.CONSUMER_SEND_MSG_BACK, send_back_ext(record)))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert response.serialize_type == SERIALIZE_ROCKETMQ
    assert encode_command(response)[4] == SERIALIZE_ROCKETMQ
    await trio.sleep(10.5)
    assert [r.reconsume_times for r in await pull(wire, session, "%RETRY%G")] == [1]


# --- delayed SEND --------------------------------------------------------------------------------------


async def test_delayed_send_is_not_pullable_before_its_level(wire, session, autojump_clock) -> None:
    response = await send(wire, session, b"in five seconds", DELAY="2")
    assert response.code == ResponseCode.SUCCESS
    assert response.remark is None
    assert await pull(wire, session, "T") == []
    await trio.sleep(4.9)
    assert await pull(wire, session, "T") == []
    await trio.sleep(0.2)
    (record,) = await pull(wire, session, "T")
    assert record.body == b"in five seconds"
    assert "DELAY" not in record.properties
    # the send response's msgId addressed the parked copy; the delivered record is a new one
    assert parse_offset_msg_id(response.ext_fields["msgId"])[1] != record.commitlog_offset


async def test_delay_0_is_immediate(wire, session, autojump_clock) -> None:
    response = await send(wire, session, b"d", DELAY="0")
    assert (response.code, response.remark) == (ResponseCode.SUCCESS, "delay level 0: not delayed")
    assert [r.body for r in await pull(wire, session, "T")] == [b"d"]


async def test_delay_99_is_clamped_to_the_highest_level(wire, session, autojump_clock) -> None:
    sent_ms = trio_clock_ms()()
    response = await send(wire, session, b"d", DELAY="99")
    assert (response.code, response.remark) == (ResponseCode.SUCCESS, "delay level 99 clamped to 18")
    parked = await session.broker.get_message(parse_offset_msg_id(response.ext_fields["msgId"])[1])
    assert (parked.topic, parked.queue_id) == (SCHEDULE_TOPIC, 17)
    assert int(parked.properties["SCHEDULE_DUE_MS"]) - sent_ms == 2 * 3600 * 1000
    await trio.sleep(600)
    assert await pull(wire, session, "T") == []


async def test_non_numeric_delay_is_refused_and_nothing_is_stored(wire, session, autojump_clock) -> None:
    response = await send(wire, session, b"d", DELAY="soon")
    assert response.code == ResponseCode.MESSAGE_ILLEGAL
    assert response.remark == "InvalidDelay: DELAY='soon' is not an integer"
    assert await session.broker.max_offset(SCHEDULE_TOPIC, 0) == 0
    assert await pull(wire, session, "T") == []


async def test_client_side_resend_to_the_retry_topic_is_delayed_or_dead_lettered(
    wire, session, autojump_clock
) -> None:
    """What a Java consumer does when send-back fails: SEND to %RETRY%G with DELAY = 3 + reconsumeTimes."""

    async def resend(reconsume: int, body: bytes) -> RemotingCommand:
        props = f"RETRY_TOPIC\x01T\x02RECONSUME_TIME\x01{reconsume}\x02DELAY\x01{3 + reconsume}\x02"
        ext = {"a": "G", "b": "%RETRY%G", "c": "TBW102", "d": "1", "e": "0", "f": "0", "g": "1", "h": "0",
               "i": props, "j": str(reconsume), "l": "16"}  # fmt: skip
        response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, ext, body))
        assert response is not None
        assert response.code == ResponseCode.SUCCESS
        return response

    await session.broker.create_topic("%RETRY%G", 1)
    await resend(1, b"again")  # level 4: 30 s
    await resend(17, b"dead")  # 17 > 16: %DLQ%G, undelayed
    assert [r.body for r in await pull(wire, session, "%DLQ%G")] == [b"dead"]
    await trio.sleep(29.5)
    assert await pull(wire, session, "%RETRY%G") == []
    await trio.sleep(1)
    assert [r.body for r in await pull(wire, session, "%RETRY%G")] == [b"again"]


async def test_delayed_send_answers_and_reaches_the_real_queue(wire, session, autojump_clock) -> None:
    await session.broker.create_topic("T", 4)
    ext = {"a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": "-1", "f": "0", "g": "1", "h": "0",
           "i": "DELAY\x011\x02"}  # fmt: skip
    response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, ext, b"picked"))
    assert response.code == ResponseCode.SUCCESS
    queue_id = int(response.ext_fields["queueId"])
    assert 0 <= queue_id < 4
    await trio.sleep(1.5)
    result = await session.broker.store.pull("T", queue_id, 0, 32)
    assert [m.body for m in result.messages] == [b"picked"]


@pytest.mark.parametrize(
    ("topic", "queue", "code"),
    [("Missing", "0", ResponseCode.TOPIC_NOT_EXIST), ("T", "9", ResponseCode.INVALID_PARAMETER)],
)
async def test_delayed_send_to_a_missing_topic_or_queue_is_refused_up_front(
    topic, queue, code, wire, backend, services, autojump_clock, broker
) -> None:
    await backend.create_topic("T", 4)
    ctx = ServerContext(*ADVERTISED, auto_create_topics=False)
    session = RemotingSession(broker, ctx)
    ext = {"a": "PG", "b": topic, "c": "TBW102", "d": "4", "e": queue, "f": "0", "g": "1", "h": "0",
           "i": "DELAY\x011\x02"}  # fmt: skip
    response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, ext, b"x"))
    assert response.code == code
    assert response.remark
    assert await services.scheduler.pending() == 0
