"""mqproxy.backends.embedded.record_wire: a stored compact record straight to its V1 pull-body record."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from mqproxy.backends.embedded.embedded_read import EmbeddedReading
from mqproxy.backends.embedded.record_compact import encode_message
from mqproxy.backends.embedded.record_wire import compact_to_v1, ipv4_bytes
from mqproxy.backends.embedded.records import decode_stored
from mqproxy.codecs.message_record import encode_record

STORE = ("127.0.0.1", 10911)
STORE_IP = bytes((127, 0, 0, 1))


def _fields(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "topic": "T",
        "queue_id": 3,
        "queue_offset": 41,
        "flag": 0,
        "sys_flag": 0,
        "born_timestamp_ms": 1_795_878_883_886,
        "store_timestamp_ms": 1_795_878_883_910,
        "reconsume_times": 0,
        "born_host": ("10.1.2.3", 51234),
        "lmqs": (),
        "properties": {"UNIQ_KEY": "FD00AB", "WAIT": "true", "CLUSTER": "DefaultCluster", "TAGS": "a"},
        "body": b"x" * 128,
    }
    fields.update(overrides)
    return fields


def _general(payload: bytes, offset: int, queue_offset: int | None = None) -> bytes:
    """What a pull answered before: decode, the stored message, encode (legacy hosts)."""
    record, named = decode_stored(payload, offset)
    stored = EmbeddedReading._stored(_Host(), record, named, len(payload))  # type: ignore[arg-type]
    if queue_offset is not None:
        stored = dataclasses.replace(stored, queue_offset=queue_offset)
    return encode_record(stored, legacy=True)


class _Host:
    _store_host = STORE


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"flag": 7, "sys_flag": 0x30 | 0x4, "reconsume_times": 2},  # EXT; stored V6 bits are dropped
        {"born_timestamp_ms": 5, "store_timestamp_ms": 1_795_878_883_910},  # BORN_ABS
        {"queue_id": 70_000, "queue_offset": 1 << 40},  # WIDE
        {"properties": {"MY_KEY": "v\u00e9", "EMPTY": "", "TAGS": "a"}},  # stored key, UTF-8, empty value
        {"properties": {}},
        {"body": b""},
        {"body": bytes(range(256)) * 20, "properties": {"K" * 200: "v" * 300}},  # long varints
        {"topic": "t" * 127},
    ],
)
def test_the_fast_path_gives_what_the_general_path_gives(overrides: dict[str, Any]) -> None:
    payload = encode_message(**_fields(**overrides))
    assert compact_to_v1(payload, 9_876_543, STORE_IP, STORE[1]) == _general(payload, 9_876_543)


def test_a_moved_entry_of_the_pulled_topic_gets_its_new_queue_offset() -> None:
    payload = encode_message(**_fields())
    moved = compact_to_v1(payload, 100, STORE_IP, STORE[1], queue_offset=7, topic=b"T")
    assert moved == _general(payload, 100, 7)
    # an entry of another topic's queue keeps the record's own queue offset
    other = compact_to_v1(payload, 100, STORE_IP, STORE[1], queue_offset=7, topic=b"U")
    assert other == _general(payload, 100)


def test_ipv4_bytes_takes_only_dotted_quads_that_read_back() -> None:
    assert ipv4_bytes("10.1.2.3") == bytes((10, 1, 2, 3))
    assert ipv4_bytes("::1") is None
    assert ipv4_bytes("10.1") is None  # inet_aton would take it, but it does not read back
    assert ipv4_bytes("host") is None


@pytest.mark.parametrize(
    "overrides",
    [
        {"born_host": ("::1", 5)},  # not an IPv4 born host
        {"born_host": ("broker-a", 5)},
        {"topic": "t" * 128},  # V2 record
        {"lmqs": (("%LMQ%a", 1),)},
        {"properties": {"K": "a\x01b"}},  # would smuggle a property: the general path refuses it
        {"properties": {"": "x"}},  # an empty key: refused too
    ],
)
def test_other_records_take_the_general_path(overrides: dict[str, Any]) -> None:
    payload = encode_message(**_fields(**overrides))
    assert compact_to_v1(payload, 0, STORE_IP, STORE[1]) is None


def test_other_kinds_a_malformed_record_and_an_ipv6_store_host_take_the_general_path() -> None:
    payload = encode_message(**_fields())
    assert compact_to_v1(b"\x01" + payload[1:], 0, STORE_IP, 1) is None
    assert compact_to_v1(payload[:-1], 0, STORE_IP, 1) is None
    assert compact_to_v1(payload[:20], 0, STORE_IP, 1) is None
    assert compact_to_v1(payload, 0, bytes(16), 1) is None
    assert compact_to_v1(b"", 0, STORE_IP, 1) is None


def test_properties_over_a_records_limit_take_the_general_path() -> None:
    # 32,768 bytes of properties: the general path cuts them down and logs it (remoting.records)
    payload = encode_message(**_fields(properties={"MQTT_TOPIC": "x" * 32_744, "UNIQ_KEY": "AB"}))
    assert compact_to_v1(payload, 0, STORE_IP, STORE[1]) is None
    fits = encode_message(**_fields(properties={"MQTT_TOPIC": "x" * 32_743, "UNIQ_KEY": "AB"}))
    assert compact_to_v1(fits, 0, STORE_IP, STORE[1]) == _general(fits, 0)
