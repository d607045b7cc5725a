"""Sans-IO: message translation and origin properties, loop prevention, recovery from a target tail,
queue mapping, allocation and filters."""

from __future__ import annotations

from mqproxy.connector.origin import (
    ORIGIN_CLUSTER,
    ORIGIN_DELIVER_MS,
    ORIGIN_OFFSET,
    PATH,
    SourceQueue,
    loops_back,
    origin_of,
    translate,
)
from mqproxy.connector.progress import allocate, copies, newest_origin, resume_offset, target_queue_for
from mqproxy.connector.rules import parse_rules

from ..conftest import stored_message  # type: ignore[import-not-found]

A = SourceQueue("edge", "Orders", "broker-a", 2)


def test_translate_keeps_content_drops_control_properties_and_adds_origin() -> None:
    message = stored_message(
        topic="Orders",
        queue_id=2,
        queue_offset=41,
        body=b"hi",
        flag=3,
        sys_flag=0x1 | 0x4 | 0x300,
        store_timestamp_ms=1234,
        born_timestamp_ms=1000,
        properties={
            "TAGS": "t",
            "KEYS": "k",
            "UNIQ_KEY": "U1",
            "user": "v",
            "TRAN_MSG": "true",
            "DELAY": "3",
            "TIMER_DELIVER_MS": "999",
            "INNER_MULTI_DISPATCH": "%LMQ%x",
            "MAX_OFFSET": "7",
        },
    )
    copy = translate(message, A, "Copy", 1)
    assert (copy.topic, copy.queue_id, copy.body, copy.flag) == ("Copy", 1, b"hi", 3)
    assert copy.sys_flag == 0x1 | 0x300  # compression kept, transaction bits dropped
    props = copy.properties
    assert {k: props[k] for k in ("TAGS", "KEYS", "UNIQ_KEY", "user")} == {
        "TAGS": "t",
        "KEYS": "k",
        "UNIQ_KEY": "U1",
        "user": "v",
    }
    assert not {"TRAN_MSG", "DELAY", "TIMER_DELIVER_MS", "INNER_MULTI_DISPATCH", "MAX_OFFSET"} & set(props)
    assert props[ORIGIN_DELIVER_MS] == "999"
    assert props[PATH] == "edge"
    origin = origin_of(props)
    assert origin is not None
    assert origin.queue == A
    assert origin.offset == 41
    assert origin.msg_id == "U1"
    assert origin.store_ms == 1234


def test_path_grows_hop_by_hop_and_stops_loops() -> None:
    first = translate(stored_message(queue_offset=1), A, "Orders", 0)
    assert not loops_back(first.properties, "central")
    assert loops_back(first.properties, "edge")
    on_central = stored_message(queue_offset=5, properties=first.properties)
    second = translate(on_central, SourceQueue("central", "Orders", "b", 0), "Orders", 0)
    assert second.properties[PATH] == "edge,central"
    assert second.properties[ORIGIN_CLUSTER] == "central"
    assert second.properties[ORIGIN_OFFSET] == "5"
    assert loops_back(second.properties, "edge")
    assert not loops_back(second.properties, "dr")


def test_newest_origin_reads_the_tail_for_one_source_queue() -> None:
    other = SourceQueue("edge", "Orders", "broker-a", 3)

    def copy(queue: SourceQueue, offset: int) -> object:
        return stored_message(
            properties=translate(stored_message(queue_offset=offset), queue, "O", 0).properties
        )

    tail = [copy(A, 7), copy(other, 9), copy(A, 8), copy(other, 10), stored_message(properties={"x": "1"})]
    assert newest_origin(reversed(tail), A) == 8  # type: ignore[arg-type]
    assert newest_origin(reversed(tail), other) == 10  # type: ignore[arg-type]
    assert newest_origin(reversed(tail), SourceQueue("dr", "Orders", "broker-a", 2)) is None  # type: ignore[arg-type]
    assert origin_of({ORIGIN_CLUSTER: "x"}) is None


def test_resume_offset_takes_the_furthest_known_point() -> None:
    assert resume_offset(8, None) == 9
    assert resume_offset(None, 5) == 5
    assert resume_offset(8, 20) == 20  # a filtered run or a dead letter moved the hint further
    assert resume_offset(30, 20) == 31
    assert resume_offset(None, None) is None


def test_queue_mapping_is_index_modulo_target_count() -> None:
    targets = [("b", 0), ("b", 1), ("c", 0)]
    assert [target_queue_for(i, targets) for i in range(5)] == [
        ("b", 0),
        ("b", 1),
        ("c", 0),
        ("b", 0),
        ("b", 1),
    ]


def test_allocation_splits_evenly_and_covers_everything() -> None:
    queues = list(range(10))
    members = ["p1", "p2", "p3"]
    shares = [allocate(queues, members, m) for m in members]
    assert sorted(q for s in shares for q in s) == queues
    assert [len(s) for s in shares] == [4, 3, 3]
    assert allocate(queues, [], "solo") == queues  # not yet listed by the broker: counts itself


def test_copies_applies_tags_sql_and_the_loop_check() -> None:
    text = """
[connector]
name = "c"
[clusters.a]
namesrv = "h:1"
[clusters.b]
namesrv = "h:2"
[[rules]]
source = "a"
target = "b"
topic = "T"
filter = "x || y"
[[rules]]
source = "a"
target = "b"
topic = "U"
sql = "n > 5 AND TAGS = 'x'"
"""
    tags, sql = parse_rules(text).rules
    assert copies(tags, stored_message(properties={"TAGS": "y"}), "h:2")
    assert not copies(tags, stored_message(properties={"TAGS": "z"}), "h:2")
    assert not copies(tags, stored_message(properties={"TAGS": "x", PATH: "h:2"}), "h:2")
    assert copies(sql, stored_message(properties={"TAGS": "x", "n": "6"}), "h:2")
    assert not copies(sql, stored_message(properties={"TAGS": "x", "n": "5"}), "h:2")
