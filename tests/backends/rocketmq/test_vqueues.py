"""Virtual queue numbering and the broker index: append-only, deterministic, round-trip through KV text."""

from __future__ import annotations

import pytest

from mqproxy.backends.rocketmq.topology import BrokerQueues, TopicRoute
from mqproxy.backends.rocketmq.vqueues import (
    BrokerIndex,
    MapError,
    QueueMap,
    RealQueue,
    extend,
    merge,
    pack_offset,
    unpack_offset,
)


def _route(**counts: int) -> TopicRoute:
    return TopicRoute(
        "T", {b: BrokerQueues(b, n, n, 6, f"127.0.0.1:{i}") for i, (b, n) in enumerate(counts.items())}
    )


def test_a_new_topic_is_numbered_broker_by_broker_in_name_order() -> None:
    numbered = extend(QueueMap(), _route(**{"broker-b": 2, "broker-a": 2}))
    assert numbered.entries == (
        RealQueue("broker-a", 0),
        RealQueue("broker-a", 1),
        RealQueue("broker-b", 0),
        RealQueue("broker-b", 1),
    )
    assert numbered.virtual("broker-b", 1) == 3
    assert numbered.real(2) == RealQueue("broker-b", 0)
    assert numbered.real(4) is None
    assert numbered.real(-1) is None


def test_a_broker_added_later_is_appended_even_when_its_name_sorts_first() -> None:
    before = extend(QueueMap(), _route(**{"broker-b": 2}))
    after = extend(before, _route(**{"broker-a": 1, "broker-b": 2}))
    assert after.covers(before)
    assert after.real(2) == RealQueue("broker-a", 0)


def test_more_queues_on_a_broker_are_appended_and_a_departed_broker_keeps_its_numbers() -> None:
    first = extend(QueueMap(), _route(**{"broker-a": 1, "broker-b": 1}))
    grown = extend(first, _route(**{"broker-a": 2}))  # broker-b left, broker-a grew
    assert grown.entries == (RealQueue("broker-a", 0), RealQueue("broker-b", 0), RealQueue("broker-a", 1))


def test_two_nodes_extending_the_same_map_agree() -> None:
    stored = extend(QueueMap(), _route(**{"broker-a": 2}))
    route = _route(**{"broker-a": 2, "broker-c": 1, "broker-b": 3})
    assert extend(stored, route) == extend(QueueMap.decode(stored.encode()), route)


def test_merge_keeps_the_first_map_and_appends_what_the_second_adds() -> None:
    ours = QueueMap((RealQueue("a", 0), RealQueue("b", 0)))
    theirs = QueueMap((RealQueue("a", 0), RealQueue("c", 0), RealQueue("b", 0)))
    assert merge(ours, theirs).entries == (RealQueue("a", 0), RealQueue("b", 0), RealQueue("c", 0))
    assert merge(ours, ours) is ours


def test_the_stored_form_is_run_length_and_round_trips() -> None:
    numbered = extend(QueueMap(), _route(**{"broker-a": 8, "broker-b": 8}))
    text = numbered.encode()
    assert text == '[["broker-a",0,8],["broker-b",0,8]]'
    assert QueueMap.decode(text) == numbered


@pytest.mark.parametrize(
    "text",
    ["not json", '{"a": 1}', '[["a", 0]]', '[["a", -1, 2]]', "[[1, 0, 2]]", '[["a", 0, 2], ["a", 1, 1]]'],
)
def test_a_malformed_stored_map_is_refused(text: str) -> None:
    with pytest.raises(MapError):
        QueueMap.decode(text)


def test_broker_indexes_start_at_one_and_are_append_only() -> None:
    index = BrokerIndex().with_brokers(["broker-b", "broker-a"])
    assert index.index("broker-a") == 1
    assert index.index("broker-b") == 2
    later = index.with_brokers(["broker-0"])
    assert later.index("broker-a") == 1
    assert later.index("broker-0") == 3
    assert later.name(3) == "broker-0"
    assert later.name(0) is None
    assert later.name(4) is None
    assert BrokerIndex.decode(later.encode()) == later
    assert index.merged(later) == later
    with pytest.raises(MapError):
        BrokerIndex.decode('["x", "x"]')


def test_packed_offsets_name_their_broker() -> None:
    packed = pack_offset(3, 123_456_789)
    assert unpack_offset(packed) == (3, 123_456_789)
    assert unpack_offset(42) == (0, 42)
    assert packed < 2**63
    with pytest.raises(ValueError, match="does not fit"):
        pack_offset(1, 2**48)
