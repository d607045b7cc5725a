"""The sans-IO retention decisions: which segments go, when writes stop, which queues hold live state."""

from __future__ import annotations

import pytest

from mqproxy.backends.embedded.assignment import REQUEST_MODE_TOPIC
from mqproxy.backends.embedded.metadata import METADATA_TOPIC
from mqproxy.backends.embedded.records import (
    decode_message,
    decode_moved,
    decode_stored,
    encode_message,
    encode_moved,
)
from mqproxy.backends.embedded.retention import (
    HOUR_MS,
    STATE_TOPICS,
    Deletion,
    DiskUsage,
    RetentionPolicy,
    Segment,
    live_from,
    parse_delete_when,
    plan_deletions,
    records_to_move,
    refuse_writes,
)
from mqproxy.backends.embedded.schedule import RECALL_TOPIC
from mqproxy.model.properties import HALF_TOPIC, SCHEDULE_GROUP, SCHEDULE_TOPIC, TRANSACTION_GROUP
from mqproxy.mqtt.mapping import RETAINED_LMQ, SESSION_STATE_TOPIC

NOW = 1_800_000_000_000
ROOMY = DiskUsage(total=1000, free=900)
POLICY = RetentionPolicy()  # 72 h, 04:00, 0.75 / 0.85 / 0.90


def seg(base: int, age_h: float, size: int = 100) -> Segment:
    return Segment(base, size, NOW - int(age_h * HOUR_MS))


def test_state_topics_name_the_real_queues() -> None:
    assert {
        SESSION_STATE_TOPIC,
        RETAINED_LMQ,
        METADATA_TOPIC,
        REQUEST_MODE_TOPIC,
        RECALL_TOPIC,
    } == STATE_TOPICS


def test_expired_segments_go_at_the_delete_hour_only() -> None:
    segments = [seg(0, 80), seg(100, 73), seg(200, 10), seg(300, 0)]
    assert plan_deletions(segments, NOW, 3, ROOMY, POLICY) == []
    assert plan_deletions(segments, NOW, 4, ROOMY, POLICY) == [
        Deletion(segments[0], "expired"),
        Deletion(segments[1], "expired"),
    ]


def test_the_segment_being_written_never_goes() -> None:
    segments = [seg(0, 100), seg(100, 100)]
    assert [d.segment.base for d in plan_deletions(segments, NOW, 4, ROOMY, POLICY)] == [0]


def test_never_out_of_order() -> None:
    segments = [seg(0, 10), seg(100, 80), seg(200, 0)]
    assert plan_deletions(segments, NOW, 4, ROOMY, POLICY) == []


def test_above_the_max_used_ratio_expired_ones_go_at_any_hour() -> None:
    segments = [seg(0, 80), seg(100, 10), seg(200, 0)]
    disk = DiskUsage(total=1000, free=200)  # 0.80
    assert plan_deletions(segments, NOW, 13, disk, POLICY) == [Deletion(segments[0], "expired")]


def test_above_the_forced_ratio_the_oldest_go_until_it_is_met() -> None:
    segments = [seg(0, 1), seg(100, 1), seg(200, 1), seg(300, 0)]
    disk = DiskUsage(total=1000, free=20)  # 0.98: 130 bytes over 0.85
    plan = plan_deletions(segments, NOW, 13, disk, POLICY)
    assert plan == [Deletion(segments[0], "disk_ratio"), Deletion(segments[1], "disk_ratio")]


def test_batch_limit() -> None:
    segments = [seg(i * 100, 100) for i in range(15)]
    assert len(plan_deletions(segments, NOW, 4, ROOMY, POLICY)) == POLICY.batch_max


def test_writes_refused_above_the_warning_ratio() -> None:
    assert not refuse_writes(DiskUsage(1000, 100), POLICY)
    assert refuse_writes(DiskUsage(1000, 99), POLICY)
    assert not refuse_writes(DiskUsage(1000, 0), RetentionPolicy(warning_ratio=1.0))


@pytest.mark.parametrize(
    ("text", "hours"), [("04", frozenset({4})), ("04;16", frozenset({4, 16})), (" * ", None)]
)
def test_parse_delete_when(text: str, hours: frozenset[int] | None) -> None:
    assert parse_delete_when(text) == hours


@pytest.mark.parametrize("text", ["", "24", "4am", "04;"])
def test_parse_delete_when_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        parse_delete_when(text)


def test_live_from() -> None:
    committed = {(SCHEDULE_GROUP, SCHEDULE_TOPIC, 2): 17, (TRANSACTION_GROUP, HALF_TOPIC, 0): 5}
    assert live_from(SESSION_STATE_TOPIC, 0, committed) == 0
    assert live_from(SCHEDULE_TOPIC, 2, committed) == 17
    assert live_from(SCHEDULE_TOPIC, 3, committed) == 0  # never committed: all of it
    assert live_from(HALF_TOPIC, 0, committed) == 5
    assert live_from("orders", 0, committed) is None


def test_records_to_move_groups_entries_of_one_record() -> None:
    entries = [(1, 4, 500, 60, 0, 1), (2, 0, 500, 60, 0, 1), (1, 5, 100, 60, 0, 1), (1, 6, 9000, 60, 0, 1)]
    moves = records_to_move(entries, below=1000)
    assert list(moves) == [100, 500]
    assert [e[0] for e in moves[500]] == [1, 2]


def test_a_moved_record_reads_as_the_original() -> None:
    payload = encode_message(
        topic="T",
        queue_id=1,
        queue_offset=7,
        flag=0,
        sys_flag=0,
        born_timestamp_ms=1,
        store_timestamp_ms=2,
        reconsume_times=0,
        born_host=("h", 1),
        lmqs=[],
        properties={"a": "b"},
        body=b"body",
    )
    moved = encode_moved(4096, [(b"T\x00\x00\x00\x00\x01", 9)], payload)
    assert decode_message(moved) == decode_message(payload)
    wrapper = decode_moved(moved)
    assert wrapper is not None
    assert (wrapper.original, wrapper.moved_from) == (4096, 4096)
    assert wrapper.targets == ((b"T\x00\x00\x00\x00\x01", 9),)
    again = decode_moved(encode_moved(8192, [(b"k", 1)], moved))  # moved twice: one wrapper
    assert again is not None
    assert (again.original, again.moved_from, again.payload) == (4096, 8192, payload)
    assert decode_stored(moved, 9999) == (decode_message(payload), 4096)
    assert decode_stored(payload, 9999) == (decode_message(payload), 9999)
    assert decode_moved(payload) is None
