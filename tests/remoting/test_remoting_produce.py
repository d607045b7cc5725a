"""SEND_MESSAGE / SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE through RemotingSession against InMemoryBackend."""

from __future__ import annotations

import re
import struct

import pytest

from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.codecs.message_record import BatchEntry, encode_batch_body
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.model.types import PullStatus
from mqproxy.remoting.context import RequestEvent

CPP_UNIQ = "0100007F000C3B6B00000000001B0000"
CPP_PROPS = f"KEYS\x01k1 k2\x02TAGS\x01TagA\x02UNIQ_KEY\x01{CPP_UNIQ}\x02WAIT\x01true\x02color\x01blue\x02"

#: What every stored message gets, as from a Java broker.
STAMPED = {"CLUSTER": "DefaultCluster", "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}


def cpp_send_v1(**overrides: object) -> dict[str, object]:
    """rocketmq 0.4.4 (C++ core) SEND_MESSAGE ext: ints for some fields, ACL keys always present."""
    ext: dict[str, object] = {
        "AccessKey": "",
        "OnsChannel": "ALIYUN",
        "Signature": "mA2/s7dQ8HhEG0w8c2bWkH4oUe8=",
        "batch": False,
        "bornTimestamp": "1700000000000",
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 4,
        "flag": 0,
        "producerGroup": "PG",
        "properties": CPP_PROPS,
        "queueId": 1,
        "reconsumeTimes": 0,
        "sysFlag": 0,
        "topic": "T",
        "unitMode": False,
    }
    ext.update(overrides)
    return ext


def alions_send_v2(**overrides: object) -> dict[str, object]:
    """ali-ons 3.12 SEND_MESSAGE_V2 ext: keys a..k, JSON numbers and booleans, no UNIQ_KEY."""
    ext: dict[str, object] = {
        "a": "PG",
        "b": "T",
        "c": "TBW102",
        "d": 4,
        "e": 2,
        "f": 0,
        "g": 1700000000123,
        "h": 3,
        "i": "TAGS\x01TagB\x02KEYS\x01order-1\x02",
        "j": 0,
        "k": False,
    }
    ext.update(overrides)
    return ext


def java_send_v2(**overrides: object) -> dict[str, str]:
    ext = {
        "a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1700000000456", "h": "0",
        "i": "UNIQ_KEY\x01FD00000000000000000000000000000200001C5E3F1A2B3C0000\x02TAGS\x01TagC\x02",
        "j": "0", "k": "false", "m": "false", "n": "broker-a",
    }  # fmt: skip
    ext.update(overrides)  # type: ignore[arg-type]
    return ext


async def test_cpp_send_message_v1_with_int_ext_fields(wire, session, backend, events) -> None:
    request = wire(RequestCode.SEND_MESSAGE, cpp_send_v1(), b"hello from python-cpp", language="CPP",
                   version=63, remark="", opaque=0)  # fmt: skip
    response = await session.handle(request, req_bytes=321)
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert response.opaque == 0
    assert response.flag == 1
    assert response.ext_fields == {
        # 10.0.0.8 : 8080 : commit-log offset 0
        "msgId": "0A00000800001F900000000000000000",
        "queueId": "1",
        "queueOffset": "0",
        "transactionId": CPP_UNIQ,
        "MSG_REGION": "DefaultRegion",
        "TRACE_ON": "true",
    }
    assert all(isinstance(v, str) for v in response.ext_fields.values())
    result = await backend.pull("T", 1, 0, 32)
    (stored,) = result.messages
    assert stored.body == b"hello from python-cpp"
    assert stored.born_timestamp_ms == 1700000000000
    assert stored.born_host == ("192.0.2.2", 50000)
    assert dict(stored.properties) == {
        "KEYS": "k1 k2", "TAGS": "TagA", "UNIQ_KEY": CPP_UNIQ, "WAIT": "true", "color": "blue", **STAMPED,
    }  # fmt: skip
    (event,) = events
    assert (event.op, event.code, event.status, event.outcome) == ("SEND_MESSAGE", 10, "SUCCESS", "ok")
    assert (event.group, event.topic, event.req_bytes, event.client_version) == ("PG", "T", 321, "CPP/63")
    assert event.resp_bytes > 0
    assert event.latency_ms >= 0


async def test_alions_send_v2_gets_a_generated_uniq_key(wire, session, backend) -> None:
    request = wire(RequestCode.SEND_MESSAGE_V2, alions_send_v2(), b"ons body", version=121)
    response = await session.handle(request)
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    transaction_id = response.ext_fields["transactionId"]
    assert re.fullmatch(r"[0-9A-F]{32}", transaction_id)
    assert transaction_id.startswith("0A000008")  # the advertised IP, like a Java client's own IP
    assert response.ext_fields["queueId"] == "2"
    (stored,) = (await backend.pull("T", 2, 0, 32)).messages
    assert dict(stored.properties) == {
        "TAGS": "TagB",
        "KEYS": "order-1",
        "UNIQ_KEY": transaction_id,
        **STAMPED,
    }
    assert stored.flag == 3
    assert stored.born_timestamp_ms == 1700000000123
    # a second send gets a different key
    again = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, alions_send_v2(), b"x", version=121))
    assert again is not None
    assert again.ext_fields["transactionId"] != transaction_id
    assert again.ext_fields["queueOffset"] == "1"
    assert again.ext_fields["msgId"] != response.ext_fields["msgId"]


async def test_java_send_v2_keeps_its_uniq_key_and_sys_flag(wire, session, backend) -> None:
    response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, java_send_v2(f="1"), b"x\x9c"))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert response.ext_fields["transactionId"] == "FD00000000000000000000000000000200001C5E3F1A2B3C0000"
    (stored,) = (await backend.pull("T", 0, 0, 1)).messages
    assert stored.sys_flag == 1
    assert stored.body == b"x\x9c"


async def test_negative_queue_id_lets_the_backend_choose(wire, session) -> None:
    response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, java_send_v2(e="-1")))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert 0 <= int(response.ext_fields["queueId"]) < 4


async def test_auto_created_topic_uses_default_topic_queue_nums(wire, session, backend) -> None:
    response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, java_send_v2(b="Fresh", d="2")))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    config = await backend.get_topic("Fresh")
    assert config is not None
    assert config.write_queues == 2


async def test_batch_send(wire, session, backend) -> None:
    entries = [
        BatchEntry(b"one", 0, {"TAGS": "A", "UNIQ_KEY": "AA" * 16}),
        BatchEntry(b"two", 5, {"TAGS": "B", "KEYS": "k"}),
        BatchEntry(b"three", 0, {}),
    ]
    ext = java_send_v2(e="3", i="UNIQ_KEY\x01" + "EE" * 16 + "\x02WAIT\x01true\x02", m="true")
    response = await session.handle(wire(RequestCode.SEND_BATCH_MESSAGE, ext, encode_batch_body(entries)))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS, response.remark
    msg_ids = response.ext_fields["msgId"].split(",")
    assert len(msg_ids) == 3
    assert len(set(msg_ids)) == 3
    assert response.ext_fields["queueId"] == "3"
    assert response.ext_fields["queueOffset"] == "0"
    assert response.ext_fields["transactionId"] == "EE" * 16
    stored = (await backend.pull("T", 3, 0, 32)).messages
    assert [m.body for m in stored] == [b"one", b"two", b"three"]
    assert [m.queue_offset for m in stored] == [0, 1, 2]
    assert stored[0].properties["UNIQ_KEY"] == "AA" * 16
    assert stored[1].flag == 5
    assert stored[1].properties["KEYS"] == "k"
    assert all(re.fullmatch(r"[0-9A-F]{32}", m.properties["UNIQ_KEY"]) for m in stored)


async def test_send_to_retry_topic_past_max_reconsume_goes_to_dlq(wire, session, backend) -> None:
    ext = java_send_v2(b="%RETRY%G", e="0", j="17", l="16")
    response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, ext, b"poison"))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    (stored,) = (await backend.pull("%DLQ%G", 0, 0, 1)).messages
    assert stored.body == b"poison"
    assert stored.reconsume_times == 17


async def test_lmq_dispatch_property_indexes_the_message(wire, session, backend) -> None:
    ext = java_send_v2(i="INNER_MULTI_DISPATCH\x01%LMQ%a,%LMQ%b\x02")
    response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, ext, b"fan-out"))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    for lmq in ("%LMQ%a", "%LMQ%b"):
        (stored,) = (await backend.pull(lmq, 0, 0, 1)).messages
        assert stored.body == b"fan-out"


# --- bad input -----------------------------------------------------------------------------------------

V1_REQUIRED = ["producerGroup", "topic", "queueId", "sysFlag", "bornTimestamp", "flag"]
V2_REQUIRED = ["a", "b", "e", "f", "g", "h"]


async def _assert_untouched(backend: InMemoryBackend) -> None:
    """The message stored by ``stored_first`` is still the only one, unchanged."""
    result = await backend.pull("T", 0, 0, 32)
    assert [m.body for m in result.messages] == [b"keep me"]
    assert result.messages[0].properties["TAGS"] == "TagC"
    for queue in (1, 2, 3):
        assert (await backend.pull("T", queue, 0, 32)).status is PullStatus.NO_NEW_MSG


@pytest.fixture
async def stored_first(wire, session) -> None:
    response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, java_send_v2(), b"keep me"))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS


@pytest.mark.parametrize("key", V1_REQUIRED)
async def test_v1_missing_required_key(key, wire, session, backend, stored_first) -> None:
    ext = cpp_send_v1(queueId=0)
    del ext[key]
    response = await session.handle(wire(RequestCode.SEND_MESSAGE, ext, b"never"))
    assert response is not None
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert response.remark == f"header field {key!r} is missing"
    assert response.ext_fields == {"MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
    await _assert_untouched(backend)


@pytest.mark.parametrize("key", V2_REQUIRED)
async def test_v2_missing_required_key(key, wire, session, backend, stored_first, events) -> None:
    ext = java_send_v2()
    del ext[key]
    response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, ext, b"never"))
    assert response is not None
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert key in (response.remark or "")
    assert events[-1].outcome == "error"
    assert events[-1].status == "INVALID_PARAMETER"
    await _assert_untouched(backend)


async def test_send_without_ext_fields_at_all(wire, session, backend, stored_first) -> None:
    response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, None, b"never"))
    assert response is not None
    assert response.code == ResponseCode.INVALID_PARAMETER
    await _assert_untouched(backend)


@pytest.mark.parametrize(
    ("override", "key", "problem"),
    [
        ({"e": "one"}, "e", "is not an integer"),
        ({"e": "1.5"}, "e", "is not an integer"),
        ({"e": 2**31}, "e", "is out of range"),
        ({"g": "12:00"}, "g", "is not an integer"),
        ({"g": 2**64}, "g", "is out of range"),
        ({"f": True}, "f", "is not an integer"),
        ({"h": [1, 2]}, "h", "is not an integer"),
        ({"j": {"x": 1}}, "j", "is not an integer"),
    ],
)
async def test_ill_typed_numbers(override, key, problem, wire, session, backend, stored_first) -> None:
    response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, alions_send_v2(**override), b"never"))
    assert response is not None
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert (response.remark or "").startswith(f"header field {key!r} {problem}")
    await _assert_untouched(backend)


async def test_number_where_a_string_is_expected_is_coerced(wire, session, backend) -> None:
    # fastjson-style leniency: a numeric topic is the topic "123"
    response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, alions_send_v2(b=123, a=7)))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert (await backend.max_offset("123", 2)) == 1


@pytest.mark.parametrize(
    ("topic", "code"),
    [
        ("bad topic!", ResponseCode.INVALID_PARAMETER),
        ("caf\u00e9", ResponseCode.INVALID_PARAMETER),
        ("", ResponseCode.INVALID_PARAMETER),
        ("T" * 128, ResponseCode.MESSAGE_ILLEGAL),
        ("%RETRY%" + "g" * 200, ResponseCode.MESSAGE_ILLEGAL),
        ("SCHEDULE_TOPIC_XXXX", ResponseCode.NO_PERMISSION),
        ("RMQ_SYS_TRANS_HALF_TOPIC", ResponseCode.NO_PERMISSION),
    ],
)
async def test_illegal_topics(topic, code, wire, session, backend, stored_first) -> None:
    response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, java_send_v2(b=topic), b"never"))
    assert response is not None
    assert response.code == code
    assert response.remark
    assert await backend.get_topic(topic) is None or topic in (
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRANS_HALF_TOPIC",
    )
    await _assert_untouched(backend)


async def test_queue_out_of_range(wire, session, backend, stored_first) -> None:
    response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, java_send_v2(e="9"), b"never"))
    assert response is not None
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert "9" in (response.remark or "")
    await _assert_untouched(backend)


async def test_properties_too_long(wire, session, backend, stored_first) -> None:
    ext = java_send_v2(i="big\x01" + "v" * 40000 + "\x02")
    response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, ext, b"never"))
    assert response is not None
    assert response.code == ResponseCode.MESSAGE_ILLEGAL
    assert "properties" in (response.remark or "")
    await _assert_untouched(backend)


async def test_body_too_large(wire, backend, ctx, stored_first, session) -> None:
    response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, java_send_v2(), b"x" * (4 * 2**20 + 1)))
    assert response is not None
    assert response.code == ResponseCode.MESSAGE_ILLEGAL
    assert "MessageTooLarge" in (response.remark or "")
    await _assert_untouched(backend)


async def test_unknown_topic_without_auto_create(wire, manual_session) -> None:
    session = manual_session
    response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, java_send_v2(b="Nope"), b"never"))
    assert response is not None
    assert response.code == ResponseCode.TOPIC_NOT_EXIST
    assert "Nope" in (response.remark or "")
    assert await session.broker.get_topic("Nope") is None


def _batch_entry(body: bytes, props: bytes) -> bytes:
    return struct.pack(">iiiii", 20 + len(body) + 2 + len(props), 0, 0, 0, len(body)) + body + \
        struct.pack(">h", len(props)) + props  # fmt: skip


@pytest.mark.parametrize(
    "body",
    [
        _batch_entry(b"ok", b"TAGS\x01A\x02") + _batch_entry(b"cut short", b"")[:-5],  # body past the end
        _batch_entry(b"ok", b"")[:10],  # header cut
        struct.pack(">iiiii", 30, 0, 0, 0, 5) + b"abcde" + struct.pack(">h", 40) + b"x",  # props past end
        struct.pack(">iiiii", 30, 0, 0, 0, -1),  # negative body length
        _batch_entry(b"ok", b"TAGS\x01\xff\xfe\x02"),  # invalid UTF-8 in properties
        b"",  # no messages
    ],
    ids=["body-truncated", "header-truncated", "props-truncated", "negative-length", "bad-utf8", "empty"],
)
async def test_malformed_batch_body(body, wire, session, backend, stored_first) -> None:
    response = await session.handle(wire(RequestCode.SEND_BATCH_MESSAGE, java_send_v2(e="0", m="true"), body))
    assert response is not None
    assert response.code == ResponseCode.MESSAGE_ILLEGAL
    assert (response.remark or "").startswith("bad batch body")
    await _assert_untouched(backend)


async def test_batch_to_retry_topic_is_refused(wire, session, backend) -> None:
    body = encode_batch_body([BatchEntry(b"x", 0, {})])
    response = await session.handle(wire(RequestCode.SEND_BATCH_MESSAGE, java_send_v2(b="%RETRY%G"), body))
    assert response is not None
    assert response.code == ResponseCode.MESSAGE_ILLEGAL


async def test_oneway_send_is_stored_but_not_answered(wire, session, backend, events) -> None:
    response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, java_send_v2(), b"fire", flag=2))
    assert response is None
    assert (await backend.max_offset("T", 0)) == 1
    assert events[-1].outcome == "oneway"
    assert events[-1].resp_bytes == 0


def test_request_event_fields_are_in_the_log_schema() -> None:
    import dataclasses
    import json
    from importlib.resources import files

    schema = json.loads((files("mqproxy.config") / "log_event.schema.json").read_text(encoding="utf-8"))
    names = {f.name for f in dataclasses.fields(RequestEvent)}
    assert names <= set(schema["properties"])
    assert set(schema["x-events"]["request"]["required"]) - {"conn_id", "protocol"} <= names
