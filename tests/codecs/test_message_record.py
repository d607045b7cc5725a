from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqproxy.codecs.message_record import (
    MAGIC_V1,
    MAGIC_V2,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    BatchEntry,
    RecordError,
    body_crc,
    decode_batch_body,
    decode_properties,
    decode_records,
    decompress_body,
    encode_batch_body,
    encode_properties,
    encode_record,
    encode_records,
)
from mqproxy.codecs.remoting import RemotingCodecError
from mqproxy.model.types import StoredMessage

from ..conftest import stored_message  # type: ignore[import-not-found]


def _msg(**overrides: object) -> StoredMessage:
    fields: dict[str, object] = dict(
        topic="TopicTest",
        queue_id=3,
        queue_offset=17,
        commitlog_offset=4096,
        body=b"hello",
        properties={"TAGS": "TagA", "UNIQ_KEY": "AB"},
        born_timestamp_ms=1_700_000_000_000,
        born_host=("192.0.2.2", 54321),
        store_timestamp_ms=1_700_000_001_000,
        store_host=("127.0.0.1", 10911),
    )
    return stored_message(**(fields | overrides))


#: Hand-assembled V1 / IPv4 record for _msg() (remoting.md §4.1).
GOLDEN_V1_RECORD = bytes.fromhex(
    "0000007f"  # TOTALSIZE 127 = 88 + 5 + 1 + 9 + 2 + 22
    "daa320a7"  # MAGIC V1
    "3610a686"  # BODYCRC crc32(b"hello") & 0x7fffffff
    "00000003"  # QUEUEID
    "00000000"  # FLAG
    "0000000000000011"  # QUEUEOFFSET 17
    "0000000000001000"  # PHYSICALOFFSET 4096
    "00000000"  # SYSFLAG
    "0000018bcfe56800"  # BORNTIMESTAMP 1700000000000
    "c0000202"
    "0000d431"  # BORNHOST 192.0.2.2:54321
    "0000018bcfe56be8"  # STORETIMESTAMP 1700000001000
    "7f000001"
    "00002a9f"  # STOREHOST 127.0.0.1:10911
    "00000000"  # RECONSUMETIMES
    "0000000000000000"  # PREPARED_TRANSACTION_OFFSET
    "00000005"
    + b"hello".hex()  # BODY
    + "09"
    + b"TopicTest".hex()  # TOPIC (1-byte length)
    + "0016"
    + b"TAGS\x01TagA\x02UNIQ_KEY\x01AB\x02".hex()  # PROPERTIES
)


def test_golden_v1_ipv4_record() -> None:
    assert encode_record(_msg()) == GOLDEN_V1_RECORD
    (record,) = decode_records(GOLDEN_V1_RECORD)
    assert record.store_size == 127
    assert record.magic == MAGIC_V1
    assert record.body_crc == zlib.crc32(b"hello") & 0x7FFFFFFF
    assert (record.topic, record.queue_id, record.queue_offset, record.commitlog_offset) == (
        "TopicTest",
        3,
        17,
        4096,
    )
    assert record.born_host == ("192.0.2.2", 54321)
    assert record.store_host == ("127.0.0.1", 10911)
    assert record.properties == {"TAGS": "TagA", "UNIQ_KEY": "AB"}
    assert record.body == b"hello"
    assert record.prepared_transaction_offset == 0


def test_v2_record_has_two_byte_topic_length() -> None:
    data = encode_record(_msg(), magic=MAGIC_V2)
    assert len(data) == len(GOLDEN_V1_RECORD) + 1
    assert struct.unpack_from(">I", data, 4)[0] == 0xDAA320AB
    assert data[88 + 5 : 88 + 5 + 2] == b"\x00\x09"  # after the fixed part and the 5-byte body
    (record,) = decode_records(data)
    assert (record.magic, record.topic) == (MAGIC_V2, "TopicTest")


def test_long_topic_forces_v2() -> None:
    topic = "%RETRY%" + "g" * 200
    (record,) = decode_records(encode_record(_msg(topic=topic)))
    assert record.magic == MAGIC_V2
    assert record.topic == topic


@pytest.mark.parametrize("magic", [MAGIC_V1, MAGIC_V2])
@pytest.mark.parametrize(
    ("born", "store"),
    [
        (("192.0.2.2", 1), ("127.0.0.1", 10911)),
        (("2001:db8::1", 65535), ("127.0.0.1", 8080)),
        (("10.0.0.1", 0), ("fd00::2", 8080)),
        (("fe80::1%eth0", 5), ("::1", 9876)),
    ],
)
def test_record_round_trip(magic: int, born: tuple[str, int], store: tuple[str, int]) -> None:
    msgs = [
        _msg(born_host=born, store_host=store, sys_flag=0x1 | 0x8, flag=-7, reconsume_times=2),
        _msg(body=b"", properties={}, queue_offset=18, commitlog_offset=2**40, topic="主题"),
        _msg(body=bytes(range(256)) * 10, properties={"KEYS": "a b c", "ключ": "значение"}, body_crc=12345),
    ]
    data = encode_records(msgs, magic=magic, legacy=False)
    decoded = decode_records(data)
    assert [len(encode_record(m, magic=magic, legacy=False)) for m in msgs] == [r.store_size for r in decoded]
    assert sum(r.store_size for r in decoded) == len(data)
    for msg, record in zip(msgs, decoded, strict=True):
        assert record.magic == magic
        assert record.topic == msg.topic
        assert record.body == msg.body
        assert record.properties == dict(msg.properties)
        assert (record.queue_id, record.queue_offset, record.commitlog_offset) == (
            msg.queue_id,
            msg.queue_offset,
            msg.commitlog_offset,
        )
        assert record.flag == msg.flag
        assert record.reconsume_times == msg.reconsume_times
        assert record.born_timestamp_ms == msg.born_timestamp_ms
        assert record.store_timestamp_ms == msg.store_timestamp_ms
        assert record.born_host == (msg.born_host[0].split("%")[0], msg.born_host[1])
        assert record.store_host == msg.store_host
        assert record.body_crc == (msg.body_crc or body_crc(msg.body))
        assert bool(record.sys_flag & SYSFLAG_BORNHOST_V6) == (":" in msg.born_host[0])
        assert bool(record.sys_flag & SYSFLAG_STOREHOST_V6) == (":" in msg.store_host[0])
        assert record.sys_flag & ~0x30 == msg.sys_flag & ~0x30
    round_tripped = decode_records(
        encode_records([r.to_stored_message() for r in decoded], magic=magic, legacy=False)
    )
    assert round_tripped == decoded


def test_stale_v6_bits_are_corrected() -> None:
    flags = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6
    (record,) = decode_records(encode_record(_msg(sys_flag=flags), legacy=False))
    assert record.sys_flag == 0
    assert record.born_host == ("192.0.2.2", 54321)


def test_default_writes_ipv4_hosts_only() -> None:
    msg = _msg(born_host=("::ffff:192.0.2.9", 7), store_host=("2001:db8::5", 8080), topic="T")
    (record,) = decode_records(encode_record(msg))
    assert record.magic == MAGIC_V1
    assert record.sys_flag & 0x30 == 0
    assert record.born_host == ("192.0.2.9", 7)
    assert record.store_host == ("0.0.0.0", 8080)


def test_encode_records_empty() -> None:
    assert encode_records([]) == b""
    assert decode_records(b"") == []


def test_encode_rejects_bad_fields() -> None:
    with pytest.raises(RecordError) as info:
        encode_record(_msg(born_host=("not-an-ip", 1)))
    assert info.value.reason == "bad_host"
    with pytest.raises(RecordError) as info:
        encode_record(_msg(queue_id=2**31))
    assert info.value.reason == "bad_record_field"
    with pytest.raises(RecordError) as info:
        encode_record(_msg(properties={"K": "v" * 40000}))
    assert info.value.reason == "properties_too_long"
    with pytest.raises(ValueError, match="magic"):
        encode_record(_msg(), magic=0x12345678)


def test_separators_inside_stored_properties_go_out_as_replacement_characters() -> None:
    # an MQTT topic or client id may hold \x01 or \x02; the record keeps its pairs apart, nothing smuggled
    props = {"MQTT_TOPIC": "a\x01b", "MQTT_CLIENT_ID": "c\x02TAGS\x01evil", "k\x02": "v", "": "no key"}
    for record in (encode_record(_msg(properties=props)), encode_records([_msg(properties=props)])):
        (decoded,) = decode_records(record)
        assert decoded.properties == {
            "MQTT_TOPIC": "a\ufffdb",
            "MQTT_CLIENT_ID": "c\ufffdTAGS\ufffdevil",
            "k\ufffd": "v",
        }
    with pytest.raises(RecordError, match="bad_property"):  # what a client sends is still refused
        encode_properties(props)


def test_record_error_is_a_codec_error() -> None:
    assert issubclass(RecordError, RemotingCodecError)


# --- decoding bad records ----------------------------------------------------------------------------


def test_truncated_at_every_offset() -> None:
    data = GOLDEN_V1_RECORD + encode_record(_msg(born_host=("2001:db8::1", 1), topic="X"), legacy=False)
    boundary = len(GOLDEN_V1_RECORD)
    for cut in range(1, len(data)):
        if cut == boundary:
            assert len(decode_records(data[:cut])) == 1
            continue
        with pytest.raises(RecordError) as info:
            decode_records(data[:cut])
        assert info.value.reason in ("truncated_record", "bad_record_size")


def test_bad_magic() -> None:
    data = bytearray(GOLDEN_V1_RECORD)
    data[4:8] = bytes.fromhex("cbd43194")  # the commit-log blank marker
    with pytest.raises(RecordError) as info:
        decode_records(bytes(data))
    assert info.value.reason == "bad_magic"


@pytest.mark.parametrize(
    ("offset", "value", "reason"),
    [
        (0, b"\x00\x00\x00\x10", "bad_record_size"),  # TOTALSIZE smaller than the fixed part
        (0, b"\x7f\xff\xff\xff", "truncated_record"),  # TOTALSIZE past the data
        (84, b"\x00\x00\x01\x00", "bad_record_size"),  # BODYLEN past the record
        (84, b"\xff\xff\xff\xff", "bad_record_size"),  # negative BODYLEN
        (93, b"\x7f", "bad_record_size"),  # TOPICLEN past the record
        (103, b"\x00\x05", "bad_record_size"),  # PROPERTIESLEN short of the record end
        (103, b"\xff\xff", "bad_record_size"),  # negative PROPERTIESLEN
        (94, b"\xff", "bad_record_field"),  # topic not UTF-8
        (105, b"\xc3", "bad_record_field"),  # properties not UTF-8
    ],
)
def test_bad_record_fields(offset: int, value: bytes, reason: str) -> None:
    data = bytearray(GOLDEN_V1_RECORD)
    data[offset : offset + len(value)] = value
    with pytest.raises(RecordError) as info:
        decode_records(bytes(data))
    assert info.value.reason == reason


DECODE_REASONS = {"truncated_record", "bad_record_size", "bad_magic", "bad_record_field"}


def _decode_reason(data: bytes) -> str | None:
    try:
        decode_records(data)
    except RecordError as exc:
        return exc.reason
    return None


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_random_record_bytes_raise_only_record_error(data: bytes) -> None:
    assert _decode_reason(data) in DECODE_REASONS | {None}


@settings(max_examples=150, deadline=None)
@given(st.integers(0, len(GOLDEN_V1_RECORD) - 1), st.integers(0, 255))
def test_mutated_record_raises_only_record_error(index: int, byte: int) -> None:
    data = bytearray(GOLDEN_V1_RECORD)
    data[index] = byte
    assert _decode_reason(bytes(data)) in DECODE_REASONS | {None}


# --- properties --------------------------------------------------------------------------------------


def test_properties_encoding() -> None:
    assert encode_properties({}) == ""
    assert encode_properties({"TAGS": "A", "KEYS": "k1 k2"}) == "TAGS\x01A\x02KEYS\x01k1 k2\x02"
    assert encode_properties({"TAGS": "A", "EMPTY": ""}) == "TAGS\x01A\x02"


@pytest.mark.parametrize(
    "props",
    [{"K": "a\x02DELAY\x011"}, {"K\x01": "v"}, {"": "v"}, {"K": "\x01"}, {"a\x02b": "c\x01d"}],
)
def test_properties_with_separators_are_rejected(props: dict[str, str]) -> None:
    with pytest.raises(RecordError) as info:
        encode_properties(props)
    assert info.value.reason == "bad_property"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        ("TAGS\x01A\x02", {"TAGS": "A"}),
        ("TAGS\x01A", {"TAGS": "A"}),  # trailing separator optional (Java 5 clients omit it)
        ("TAGS\x01A\x02KEYS\x01k\x02", {"TAGS": "A", "KEYS": "k"}),
        ("\x02\x02TAGS\x01A\x02\x02", {"TAGS": "A"}),
        ("EMPTY\x01\x02TAGS\x01A", {"TAGS": "A"}),  # empty value dropped
        ("\x01v\x02TAGS\x01A", {"TAGS": "A"}),  # empty key dropped
        ("NOSEP\x02TAGS\x01A", {"TAGS": "A"}),
        ("K\x01a\x01b", {"K": "a\x01b"}),  # value keeps later \x01
        ("K\x011\x02K\x012", {"K": "2"}),
    ],
)
def test_properties_decoding(text: str, expected: dict[str, str]) -> None:
    assert decode_properties(text) == expected


_property_text = st.text(st.characters(exclude_characters="\x01\x02"), min_size=1, max_size=10)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(_property_text, _property_text, max_size=8))
def test_properties_round_trip(props: dict[str, str]) -> None:
    assert decode_properties(encode_properties(props)) == props


# --- batch bodies ------------------------------------------------------------------------------------

#: Two inner messages as the Java client encodes a MessageBatch (remoting.md §4.6).
GOLDEN_BATCH = bytes.fromhex(
    "00000020"  # TOTALSIZE 32 = 20 + 3 + 2 + 7
    "00000000"  # MAGIC
    "00000000"  # BODYCRC
    "00000001"  # FLAG
    "00000003" + b"one".hex() + "0007" + b"TAGS\x01A\x02".hex() + "00000016"  # TOTALSIZE 22 = 20 + 0 + 2 + 0
    "00000000"
    "00000000"
    "00000000"
    "00000000"
    "0000"
)


def test_golden_batch() -> None:
    entries = [BatchEntry(b"one", 1, {"TAGS": "A"}), BatchEntry(b"", 0, {})]
    assert decode_batch_body(GOLDEN_BATCH) == entries
    assert encode_batch_body(entries) == GOLDEN_BATCH
    assert decode_batch_body(b"") == []


def test_batch_round_trip() -> None:
    entries = [
        BatchEntry(bytes([i]) * i, i, {"UNIQ_KEY": f"U{i}", "WAIT": "true", "KEYS": "k ключ"})
        for i in range(50)
    ]
    assert decode_batch_body(encode_batch_body(entries)) == entries


def test_batch_shorter_than_declared() -> None:
    for cut in range(1, len(GOLDEN_BATCH)):
        if cut == 32:
            assert len(decode_batch_body(GOLDEN_BATCH[:cut])) == 1
            continue
        with pytest.raises(RecordError) as info:
            decode_batch_body(GOLDEN_BATCH[:cut])
        assert info.value.reason == "truncated_batch"


def test_batch_negative_lengths() -> None:
    bad_body = bytearray(GOLDEN_BATCH)
    bad_body[16:20] = b"\xff\xff\xff\xff"
    with pytest.raises(RecordError) as info:
        decode_batch_body(bytes(bad_body))
    assert info.value.reason == "truncated_batch"
    bad_props = bytearray(GOLDEN_BATCH)
    bad_props[23:25] = b"\x80\x00"
    with pytest.raises(RecordError) as info:
        decode_batch_body(bytes(bad_props))
    assert info.value.reason == "truncated_batch"


def test_batch_invalid_utf8_properties() -> None:
    data = bytearray(GOLDEN_BATCH)
    data[25] = 0xFF
    with pytest.raises(RecordError) as info:
        decode_batch_body(bytes(data))
    assert info.value.reason == "bad_properties"


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_batch_bytes_raise_only_record_error(data: bytes) -> None:
    reason: str | None = None
    try:
        decode_batch_body(data)
    except RecordError as exc:
        reason = exc.reason
    assert reason in (None, "truncated_batch", "bad_properties")


# --- compression -------------------------------------------------------------------------------------


def test_decompress_zlib_legacy_and_typed() -> None:
    raw = b"payload " * 1000
    packed = zlib.compress(raw, 5)
    assert decompress_body(packed, 0x1) == raw
    assert decompress_body(packed, 0x1 | 0x300) == raw
    assert decompress_body(raw, 0x0) is raw
    assert decompress_body(raw, 0x300) is raw  # type bits without COMPRESSED: stored as is


@pytest.mark.parametrize(("sys_flag", "name"), [(0x101, "lz4"), (0x201, "zstd"), (0x401, "type 4")])
def test_decompress_unsupported(sys_flag: int, name: str) -> None:
    with pytest.raises(RecordError, match=name) as info:
        decompress_body(b"\x00", sys_flag)
    assert info.value.reason == "unsupported_compression"


def test_decompress_corrupt_and_truncated() -> None:
    with pytest.raises(RecordError) as info:
        decompress_body(b"not zlib", 0x1)
    assert info.value.reason == "bad_compressed_body"
    with pytest.raises(RecordError) as info:
        decompress_body(zlib.compress(b"x" * 1000)[:-6], 0x1)
    assert info.value.reason == "bad_compressed_body"


def test_decompress_bomb_is_capped() -> None:
    bomb = zlib.compress(b"\x00" * (8 * 1024 * 1024))
    with pytest.raises(RecordError) as info:
        decompress_body(bomb, 0x1, max_bytes=1024 * 1024)
    assert info.value.reason == "decompressed_too_large"
