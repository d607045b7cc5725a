"""v2 Message <-> broker Message/StoredMessage mapping, settings merge and the client registry."""

from __future__ import annotations

import gzip
import hashlib
import zlib
from typing import Any

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.grpc_service.convert import (
    ConvertError,
    message_type_of,
    to_broker_message,
    to_rmq_message,
)
from mqproxy.grpc_service.telemetry import ClientRegistry, ServerSettings, SettingsError, settings_reply
from mqproxy.model.types import StoredMessage

from ..conftest import stored_message  # type: ignore[import-not-found]

HOST = ("10.1.2.3", 5555)
LIMIT = 1024


def v2(body: bytes = b"body", **sp: Any) -> Any:
    props = sp.pop("user_properties", {})
    system = pb.SystemProperties(message_id=sp.pop("message_id", "MID"), **sp)
    return pb.RmqMessage(
        topic=pb.Resource(name="T"), user_properties=props, system_properties=system, body=body
    )


def stored(properties: dict[str, str], body: bytes = b"x", **kw: Any) -> StoredMessage:
    fields: dict[str, Any] = dict(
        queue_id=2,
        queue_offset=7,
        commitlog_offset=4096,
        store_size=100,
        body=body,
        properties=properties,
        born_timestamp_ms=1_000,
        born_host=("10.0.0.9", 1234),
        store_timestamp_ms=2_000,
        store_host=("10.0.0.1", 10911),
    )
    return stored_message(**(fields | kw))


def test_send_mapping_golden() -> None:
    msg = v2(
        b"hello",
        tag="TagA",
        keys=["k1", "k2"],
        message_group="g",
        trace_context="tc",
        user_properties={"p": "v"},
        born_timestamp=pb.Timestamp(seconds=5, nanos=6_000_000),
    )
    msg.system_properties.delivery_timestamp.FromMilliseconds(1_700_000_000_123)
    out = to_broker_message(msg, born_host=HOST, max_body_bytes=LIMIT)
    assert out.topic == "T"
    assert out.body == b"hello"
    assert out.queue_id == -1
    assert out.properties == {
        "p": "v",
        "TAGS": "TagA",
        "KEYS": "k1 k2",
        "UNIQ_KEY": "MID",
        "__SHARDINGKEY": "g",
        "TIMER_DELIVER_MS": "1700000000123",
        "TRACE_CONTEXT": "tc",
    }
    assert out.born_timestamp_ms == 5006
    assert out.born_host == HOST
    assert out.sys_flag == 0


def test_the_declared_born_host_is_kept_and_delivered() -> None:
    """RocketMQ's proxy stores the client's ``born_host`` as ``__BORNHOST`` and delivers it (the record's
    born host is the connection's peer); without one, delivery shows the peer's address."""
    sent = to_broker_message(v2(born_host="producer-7"), born_host=HOST, max_body_bytes=LIMIT)
    assert sent.properties["__BORNHOST"] == "producer-7"
    assert sent.born_host == HOST
    back = to_rmq_message(stored(sent.properties), max_body_bytes=LIMIT)
    assert back.system_properties.born_host == "producer-7"
    assert "__BORNHOST" not in back.user_properties
    anonymous = to_broker_message(v2(born_host=" "), born_host=HOST, max_body_bytes=LIMIT)
    assert "__BORNHOST" not in anonymous.properties
    assert to_rmq_message(stored(anonymous.properties), max_body_bytes=LIMIT).system_properties.born_host == (
        "10.0.0.9"
    )


def test_transaction_and_gzip() -> None:
    msg = v2(
        gzip.compress(b"inflated"),
        message_type=pb.MessageType.TRANSACTION,
        body_encoding=pb.Encoding.GZIP,
        orphaned_transaction_recovery_duration=pb.Duration(seconds=30),
    )
    out = to_broker_message(msg, born_host=HOST, max_body_bytes=LIMIT)
    assert out.body == b"inflated"
    assert out.sys_flag == 0x4
    assert out.properties["TRAN_MSG"] == "true"
    assert out.properties["CHECK_IMMUNITY_TIME_IN_SECONDS"] == "30"
    bomb = v2(gzip.compress(b"\0" * (LIMIT + 1)), body_encoding=pb.Encoding.GZIP)
    with pytest.raises(ConvertError) as info:
        to_broker_message(bomb, born_host=HOST, max_body_bytes=LIMIT)
    assert info.value.code == pb.Code.MESSAGE_CORRUPTED


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"message_id": ""}, pb.Code.ILLEGAL_MESSAGE_ID),
        ({"tag": " "}, pb.Code.ILLEGAL_MESSAGE_TAG),
        ({"tag": "a\x01b"}, pb.Code.ILLEGAL_MESSAGE_TAG),
        ({"keys": ["a b"]}, pb.Code.ILLEGAL_MESSAGE_KEY),
        ({"message_group": ""}, pb.Code.ILLEGAL_MESSAGE_GROUP),
        ({"user_properties": {"TAGS": "x"}}, pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
        ({"user_properties": {"k": "v\x02"}}, pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
        ({"user_properties": {"k": "v" * 40_000}}, pb.Code.MESSAGE_PROPERTIES_TOO_LARGE),
    ],
)
def test_send_validation(change: dict[str, Any], code: pb.Code) -> None:
    with pytest.raises(ConvertError) as info:
        to_broker_message(v2(**change), born_host=HOST, max_body_bytes=10**6)
    assert info.value.code == code


def test_body_and_topic_checks() -> None:
    for body, code in (
        (b"", pb.Code.MESSAGE_BODY_EMPTY),
        (b"x" * (LIMIT + 1), pb.Code.MESSAGE_BODY_TOO_LARGE),
    ):
        with pytest.raises(ConvertError) as info:
            to_broker_message(v2(body), born_host=HOST, max_body_bytes=LIMIT)
        assert info.value.code == code
    for topic, code in (("a b", pb.Code.ILLEGAL_TOPIC), ("RMQ_SYS_TRANS_HALF_TOPIC", pb.Code.FORBIDDEN)):
        msg = v2()
        msg.topic.name = topic
        with pytest.raises(ConvertError) as info:
            to_broker_message(msg, born_host=HOST, max_body_bytes=LIMIT)
        assert info.value.code == code


def test_delivery_mapping_golden() -> None:
    props = {
        "TAGS": "TagA",
        "KEYS": "k1 k2",
        "UNIQ_KEY": "U1",
        "__SHARDINGKEY": "g",
        "p": "v",
        "WAIT": "true",
        "TIMER_DELIVER_MS": "3000",
    }
    out = to_rmq_message(
        stored(props, b"abc"), max_body_bytes=LIMIT, receipt_handle="rh", invisible_duration_ms=1500
    )
    sp = out.system_properties
    assert out.topic.name == "T"
    assert out.body == b"abc"
    assert dict(out.user_properties) == {"p": "v"}
    assert (sp.tag, list(sp.keys), sp.message_id, sp.message_group) == ("TagA", ["k1", "k2"], "U1", "g")
    assert sp.body_digest.checksum == hashlib.md5(b"abc").hexdigest().upper()
    assert sp.body_encoding == pb.Encoding.IDENTITY
    assert sp.message_type == pb.MessageType.DELAY  # a delivery time outranks the group, as in Apache's proxy
    assert (sp.queue_id, sp.queue_offset, sp.delivery_attempt) == (2, 7, 1)
    assert sp.receipt_handle == "rh"
    assert sp.invisible_duration.ToMilliseconds() == 1500
    assert sp.born_host == "10.0.0.9"
    assert sp.store_host == "10.0.0.1:10911"
    assert sp.delivery_timestamp.ToMilliseconds() == 3000
    assert sp.born_timestamp.ToMilliseconds() == 1000
    assert sp.store_timestamp.ToMilliseconds() == 2000


def test_delivery_without_uniq_key_uses_the_offset_id_and_inflates() -> None:
    out = to_rmq_message(stored({}, zlib.compress(b"plain"), sys_flag=0x1), max_body_bytes=LIMIT)
    assert out.body == b"plain"
    assert out.system_properties.message_id == "0A00000100002A9F0000000000001000"
    assert not out.system_properties.HasField("tag")


def test_retry_copies_show_the_original_topic() -> None:
    out = to_rmq_message(
        stored({"RETRY_TOPIC": "Orig"}, topic="%RETRY%G", reconsume_times=2), max_body_bytes=LIMIT
    )
    assert out.topic.name == "Orig"
    assert out.system_properties.delivery_attempt == 3


def test_round_trip_preserves_what_clients_see() -> None:
    msg = v2(b"payload", tag="T1", keys=["a"], user_properties={"x": "y"})
    sent = to_broker_message(msg, born_host=HOST, max_body_bytes=LIMIT)
    back = to_rmq_message(stored(sent.properties, sent.body), max_body_bytes=LIMIT)
    assert back.body == msg.body
    assert dict(back.user_properties) == dict(msg.user_properties)
    assert back.system_properties.tag == "T1"
    assert list(back.system_properties.keys) == ["a"]
    assert back.system_properties.message_id == "MID"
    assert message_type_of(sent.properties) == pb.MessageType.NORMAL


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_send_conversion_only_raises_convert_error(data: bytes) -> None:
    try:
        msg = pb.RmqMessage.FromString(data)
    except DecodeError:
        return
    try:
        out = to_broker_message(msg, born_host=HOST, max_body_bytes=LIMIT)
    except ConvertError as err:
        code = err.code
    else:
        assert out.body
        assert out.properties["UNIQ_KEY"]
        return
    assert isinstance(code, pb.Code)


# ------------------------------------------------------------------------------ telemetry


def test_producer_settings_reply_is_complete() -> None:
    client = pb.Settings(
        client_type=pb.ClientType.PRODUCER,
        publishing=pb.Publishing(topics=[pb.Resource(name="T")], validate_message_type=True),
    )
    reply = settings_reply(client, ServerSettings(max_body_bytes=4 * 1024 * 1024))
    assert reply.publishing.max_body_size == 4 * 1024 * 1024
    assert reply.publishing.validate_message_type
    assert [t.name for t in reply.publishing.topics] == ["T"]
    backoff = reply.backoff_policy
    assert backoff.max_attempts == 3
    assert backoff.WhichOneof("strategy") == "exponential_backoff"
    assert backoff.exponential_backoff.multiplier == 2.0
    assert reply.request_timeout.ToMilliseconds() == 3000
    assert reply.HasField("metric")


def test_consumer_settings_reply_fills_subscription() -> None:
    client = pb.Settings(
        client_type=pb.ClientType.SIMPLE_CONSUMER,
        request_timeout=pb.Duration(seconds=5),
        subscription=pb.Subscription(
            group=pb.Resource(name="G"), long_polling_timeout=pb.Duration(seconds=7)
        ),
    )
    reply = settings_reply(client, ServerSettings())
    sub = reply.subscription
    assert (sub.receive_batch_size, sub.fifo, sub.long_polling_timeout.ToSeconds()) == (32, False, 7)
    assert reply.request_timeout.ToSeconds() == 5
    assert reply.backoff_policy.max_attempts == 17  # the first delivery and 16 redeliveries
    assert reply.backoff_policy.exponential_backoff.initial.ToSeconds() == 1
    with pytest.raises(SettingsError):
        settings_reply(pb.Settings(client_type=pb.ClientType.PRODUCER), ServerSettings())


def test_client_registry() -> None:
    registry = ClientRegistry()
    registry.update_settings(
        "p1",
        pb.Settings(
            client_type=pb.ClientType.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="T")])
        ),
    )
    registry.update_settings(
        "c1",
        pb.Settings(
            client_type=pb.ClientType.SIMPLE_CONSUMER,
            subscription=pb.Subscription(
                group=pb.Resource(name="G"), subscriptions=[pb.SubscriptionEntry(topic=pb.Resource(name="T"))]
            ),
        ),
    )
    assert registry.get("c1").group == "G"
    assert registry.get("c1").topics == frozenset({"T"})
    assert registry.producers_of("T") == []  # no telemetry stream open yet

    async def sender(command: Any) -> None:
        return None

    registry.get("p1").telemetry = sender
    assert [r.client_id for r in registry.producers_of("T")] == ["p1"]
    registry.detach("p1", sender)
    assert registry.producers_of("T") == []
    registry.remove("p1")
    assert registry.get("p1") is None
    assert len(registry) == 1
