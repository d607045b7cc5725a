"""mqproxy.codecs.record_properties: fitting a stored message's properties into a record's 2-byte
PROPERTIESLEN on the way out (sans-IO)."""

from __future__ import annotations

import pytest

from mqproxy.codecs.message_record import (
    MAX_PROPERTIES_BYTES,
    DroppedProperties,
    RecordError,
    decode_records,
    encode_record,
    encode_records,
)
from mqproxy.codecs.record_properties import fit_properties
from mqproxy.model.types import StoredMessage

from ..conftest import stored_message  # type: ignore[import-not-found]

LONG_TOPIC = "sensors/" + "x" * 40_000  # MQTT allows 65,535 bytes; a RocketMQ record's properties 32,767


def _msg(offset: int, properties: dict[str, str]) -> StoredMessage:
    return stored_message(
        topic="%LMQ%mqtt", queue_id=0, queue_offset=offset, commitlog_offset=100 * offset,
        body=b"b%d" % offset, properties=properties, born_host=("192.0.2.2", 1),
        store_host=("127.0.0.1", 10911),
    )  # fmt: skip


def test_properties_that_fit_go_out_whole() -> None:
    exact = {"K": "v" * (MAX_PROPERTIES_BYTES - 3)}  # K \x01 v... \x02 = 32,767 bytes
    text, dropped = fit_properties(exact)
    assert (len(text), dropped) == (MAX_PROPERTIES_BYTES, None)
    over = {"K": "v" * (MAX_PROPERTIES_BYTES - 2)}
    text, dropped = fit_properties(over)
    assert (text, dropped) == (b"", DroppedProperties(("K",), MAX_PROPERTIES_BYTES + 1, 0))


def test_the_largest_other_property_goes_first_and_the_rest_keeps_its_order() -> None:
    props = {"UNIQ_KEY": "AB01", "MQTT_TOPIC": LONG_TOPIC, "TAGS": "t", "small": "s", "big": "b" * 20_000}
    text, dropped = fit_properties(props)
    assert text == b"UNIQ_KEY\x01AB01\x02TAGS\x01t\x02small\x01s\x02big\x01" + b"b" * 20_000 + b"\x02"
    assert dropped is not None
    assert dropped.keys == ("MQTT_TOPIC",)
    assert (
        dropped.bytes_before
        == len("UNIQ_KEY\x01AB01\x02MQTT_TOPIC\x01\x02TAGS\x01t\x02small\x01s\x02big\x01\x02")
        + len(LONG_TOPIC)
        + 20_000
    )
    assert dropped.bytes_after == len(text)


def test_keys_clients_act_on_go_last() -> None:
    # a 20 KB user property and a 20 KB KEYS: the user property goes, though it is the smaller
    props = {"KEYS": "k" * 20_100, "user": "u" * 20_000, "UNIQ_KEY": "AB01"}
    text, dropped = fit_properties(props)
    assert dropped is not None
    assert dropped.keys == ("user",)
    assert text.startswith(b"KEYS\x01")
    assert text.endswith(b"UNIQ_KEY\x01AB01\x02")
    # a client key alone over the limit goes too (the record must still be written)
    text, dropped = fit_properties({"KEYS": "k" * 40_000, "UNIQ_KEY": "AB01"})
    assert (text, dropped and dropped.keys) == (b"UNIQ_KEY\x01AB01\x02", ("KEYS",))


def test_a_transaction_id_is_a_key_clients_act_on() -> None:
    # RocketMQ's transaction id property is ``__transactionId__`` (MessageConst.PROPERTY_TRANSACTION_ID)
    props = {"__transactionId__": "t" * 20_100, "user": "u" * 20_000}
    _, dropped = fit_properties(props)
    assert dropped is not None
    assert dropped.keys == ("user",)


def test_multibyte_values_count_in_utf8_bytes() -> None:
    props = {"MQTT_TOPIC": "\u00e9" * 16_383, "UNIQ_KEY": "A"}  # 32,766 bytes of value
    text, dropped = fit_properties(props)
    assert dropped is not None
    assert dropped.keys == ("MQTT_TOPIC",)
    assert text == b"UNIQ_KEY\x01A\x02"


def test_an_answer_carries_every_message_and_reports_the_cut_one() -> None:
    msgs = [
        _msg(0, {"UNIQ_KEY": "ID0", "MQTT_TOPIC": "a/b"}),
        _msg(1, {"UNIQ_KEY": "ID1", "MQTT_TOPIC": LONG_TOPIC, "TAGS": "T", "KEYS": "k1 k2"}),
        _msg(2, {"UNIQ_KEY": "ID2", "MQTT_TOPIC": "a/c"}),
    ]
    heard: list[tuple[int, DroppedProperties]] = []
    body = encode_records(msgs, on_dropped=lambda m, d: heard.append((m.queue_offset, d)))
    records = decode_records(body)
    assert [r.body for r in records] == [b"b0", b"b1", b"b2"]
    assert [r.topic for r in records] == ["%LMQ%mqtt"] * 3
    assert [r.properties for r in records] == [
        {"UNIQ_KEY": "ID0", "MQTT_TOPIC": "a/b"},
        {"UNIQ_KEY": "ID1", "TAGS": "T", "KEYS": "k1 k2"},
        {"UNIQ_KEY": "ID2", "MQTT_TOPIC": "a/c"},
    ]
    assert [(offset, d.keys) for offset, d in heard] == [(1, ("MQTT_TOPIC",))]
    single = encode_record(msgs[1], on_dropped=lambda m, d: None)
    assert decode_records(single)[0].properties == {"UNIQ_KEY": "ID1", "TAGS": "T", "KEYS": "k1 k2"}


def test_without_a_listener_over_long_properties_still_raise() -> None:
    # the embedded store's hand-off path relies on it to fall back to the path that logs
    with pytest.raises(RecordError) as info:
        encode_records([_msg(1, {"MQTT_TOPIC": LONG_TOPIC})])
    assert info.value.reason == "properties_too_long"


def test_separators_sent_as_replacement_characters_can_outgrow_the_limit() -> None:
    # 11,000 stored \x01 (11 KB, under the store's check) go out as U+FFFD, 3 bytes each
    text, dropped = fit_properties({"MQTT_TOPIC": "\x01" * 11_000, "UNIQ_KEY": "A"})
    assert (text, dropped and dropped.keys) == (b"UNIQ_KEY\x01A\x02", ("MQTT_TOPIC",))
