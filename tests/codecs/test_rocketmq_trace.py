"""RocketMQ message-trace records: exact byte layout per type (field order of the Java client's
TraceDataEncoder), keys, packing into trace messages, and decoding back."""

from __future__ import annotations

import pytest

from mqproxy.codecs.rocketmq_trace import (
    EndTransactionRecord,
    MessageType,
    PubRecord,
    SubAfterRecord,
    SubBeforeRecord,
    decode,
    encode,
    message_id,
    pack,
    record_keys,
)
from mqproxy.model.ids import offset_msg_id

PUB = PubRecord(
    timestamp_ms=1700000000123, group="PG", topic="T", msg_id="MSGID1", tags="TagA", keys="k1 k2",
    store_host="10.0.0.1:10911", body_length=42, cost_ms=3, msg_type=MessageType.NORMAL,
    offset_msg_id="OFFSETID", success=True,
)  # fmt: skip
SUB_BEFORE = SubBeforeRecord(
    timestamp_ms=1700000000200, group="CG", request_id="REQ1", msg_id="MSGID1", retry_times=2, keys="k1 k2"
)
SUB_AFTER = SubAfterRecord(
    request_id="REQ1", msg_id="MSGID1", cost_ms=17, success=False, keys="k1 k2", context_code=4,
    timestamp_ms=1700000000300, group="CG",
)  # fmt: skip
END = EndTransactionRecord(
    timestamp_ms=1700000000400, group="PG", topic="T", msg_id="MSGID1", transaction_id="TX1",
    state="COMMIT_MESSAGE", from_check=True, tags="TagA", keys="k1", store_host="10.0.0.1:10911",
)  # fmt: skip


def test_pub_layout() -> None:
    assert encode(PUB) == (
        "Pub\x011700000000123\x01DefaultRegion\x01PG\x01T\x01MSGID1\x01TagA\x01k1 k2\x0110.0.0.1:10911"
        "\x0142\x013\x010\x01OFFSETID\x01true\x02"
    )


def test_sub_before_layout() -> None:
    assert encode(SUB_BEFORE) == (
        "SubBefore\x011700000000200\x01DefaultRegion\x01CG\x01REQ1\x01MSGID1\x012\x01k1 k2\x02"
    )


def test_sub_after_layout() -> None:
    # requestId, msgId, costTime, success, keys, contextCode, then (non-cloud) timestamp and group
    assert encode(SUB_AFTER) == (
        "SubAfter\x01REQ1\x01MSGID1\x0117\x01false\x01k1 k2\x014\x011700000000300\x01CG\x02"
    )


def test_end_transaction_layout() -> None:
    assert encode(END) == (
        "EndTransaction\x011700000000400\x01DefaultRegion\x01PG\x01T\x01MSGID1\x01TagA\x01k1\x01"
        "10.0.0.1:10911\x011\x01TX1\x01COMMIT_MESSAGE\x01true\x02"
    )


def test_absent_tags_and_keys_are_written_null_so_no_field_is_a_trailing_empty_one() -> None:
    bare = SubBeforeRecord(timestamp_ms=1, group="G", request_id="R", msg_id="M")
    fields = encode(bare).rstrip("\x02").split("\x01")
    assert fields[-1] == "null"
    assert len(fields) == 8
    assert encode(PubRecord(timestamp_ms=1, group="G", topic="T", msg_id="M")).split("\x01")[6:8] == [
        "null",
        "null",
    ]
    assert decode(encode(bare)) == [bare]  # "null" reads back as absent


def test_separators_in_client_values_cannot_split_a_record() -> None:
    evil = SubBeforeRecord(timestamp_ms=1, group="G\x02x", request_id="R", msg_id="M", keys="a\x01b")
    data = encode(evil)
    assert data.count("\x02") == 1
    assert data.count("\x01") == 7
    assert decode(data)[0].group == "Gx"


@pytest.mark.parametrize("record", [PUB, SUB_BEFORE, SUB_AFTER, END])
def test_round_trip(record: object) -> None:
    assert decode(encode(record).encode()) == [record]  # type: ignore[arg-type]


def test_keys_are_the_msg_id_then_the_message_keys() -> None:
    assert record_keys(PUB) == ["MSGID1", "k1", "k2"]
    assert record_keys(SubBeforeRecord(timestamp_ms=1, group="G", request_id="R", msg_id="M")) == ["M"]


def test_pack_bounds_bodies_and_deduplicates_keys() -> None:
    records = [PUB, SUB_BEFORE, SUB_AFTER]
    one = pack(records, 10_000)
    assert len(one) == 1
    body, keys = one[0]
    assert body == "".join(encode(r) for r in records).encode()
    assert keys == "MSGID1 k1 k2"
    assert decode(body) == records
    small = pack(records, len(encode(PUB)) + 1)
    assert [decode(b) for b, _ in small] == [[PUB], [SUB_BEFORE], [SUB_AFTER]]
    assert pack([], 100) == []


def test_unknown_and_short_records_are_skipped() -> None:
    assert decode("Recall\x011\x02Pub\x011\x02" + encode(SUB_BEFORE)) == [SUB_BEFORE]


def test_message_id_is_the_uniq_key_else_the_offset_id() -> None:
    assert message_id({"UNIQ_KEY": "U1"}, ("127.0.0.1", 9876), 5) == "U1"
    assert message_id({}, ("127.0.0.1", 9876), 5) == offset_msg_id(("127.0.0.1", 9876), 5)
    assert message_id({}, ("127.0.0.1", 9876), -1) == ""
