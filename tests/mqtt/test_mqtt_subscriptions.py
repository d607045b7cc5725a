from __future__ import annotations

import random
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqproxy.codecs.mqtt import topic_matches
from mqproxy.mqtt.subscriptions import SubscriptionIndex


def _index(*filters: str) -> SubscriptionIndex:
    index = SubscriptionIndex()
    for f in filters:
        index.add(f)
    return index


def test_match_semantics() -> None:
    index = _index("a/+", "a/#", "#", "+/+", "a/b", "+/b/#", "a/+/c")
    assert sorted(index.match("a/b")) == sorted(["a/+", "a/#", "#", "+/+", "a/b", "+/b/#"])
    assert sorted(index.match("a")) == ["#", "a/#"]  # a/# matches its parent level
    assert sorted(index.match("a/x/c")) == ["#", "a/#", "a/+/c"]
    assert index.match("$SYS/b") == []  # [MQTT-4.7.2-1]
    assert _index("$SYS/#", "$SYS/+").match("$SYS/b") in (["$SYS/#", "$SYS/+"], ["$SYS/+", "$SYS/#"])
    assert sorted(_index("+/+", "/+").match("/x")) == ["+/+", "/+"]


def test_refcount_and_remove_prunes() -> None:
    index = _index("a/+", "a/+", "a/b/#")
    assert len(index) == 2
    assert "a/+" in index
    assert index.remove("a/+")
    assert "a/+" in index
    assert index.remove("a/+")
    assert "a/+" not in index
    assert not index.remove("a/+")
    assert not index.remove("never/there")
    assert index.match("a/b") == ["a/b/#"]
    assert index.remove("a/b/#")
    assert len(index) == 0
    assert index._root.empty()


_level = st.sampled_from(["a", "b", "c", "$x", ""])
_topic = st.lists(_level, min_size=1, max_size=4).map("/".join).filter(bool)
_filter_level = st.sampled_from(["a", "b", "c", "$x", "", "+"])
_filter = st.builds(
    lambda levels, tail: "/".join(levels + (["#"] if tail else [])),
    st.lists(_filter_level, min_size=0, max_size=4),
    st.booleans(),
).filter(bool)


@given(st.lists(_filter, max_size=20), _topic)
def test_match_equals_brute_force(filters: list[str], topic: str) -> None:
    index = _index(*filters)
    expected = sorted({f for f in filters if topic_matches(f, topic)})
    assert sorted(index.match(topic)) == expected


@pytest.mark.slow
def test_100k_filters_match_fast() -> None:
    rng = random.Random(7)
    index = SubscriptionIndex()
    for i in range(100_000):
        device = f"dev{i}"
        choice = i % 4
        if choice == 0:
            index.add(f"factory/{i % 50}/{device}/+")
        elif choice == 1:
            index.add(f"factory/+/{device}/#")
        elif choice == 2:
            index.add(f"fleet/{device}/+/temp")
        else:
            index.add(f"fleet/{device}/#")
    assert len(index) == 100_000
    topics = [f"factory/{rng.randrange(50)}/dev{rng.randrange(100_000)}/temp" for _ in range(20_000)]
    started = time.perf_counter()
    matched = sum(len(index.match(t)) for t in topics)
    per_match_us = (time.perf_counter() - started) / len(topics) * 1e6
    assert matched > 0
    print(f"100k filters: {per_match_us:.2f} us per match")
    assert per_match_us < 200  # generous bound for a shared 2-core machine; measured ~3 us


@pytest.mark.parametrize("bad", ["x/y", "+", "#"])
def test_contains_unknown(bad: str) -> None:
    assert bad not in _index("a/+")


def test_version_changes_with_the_set_of_filters_only() -> None:
    idx = SubscriptionIndex()
    versions = [idx.version]
    idx.add("a/+")
    versions.append(idx.version)
    idx.add("a/+")  # a second reference: same set of filters
    versions.append(idx.version)
    idx.remove("a/+")
    versions.append(idx.version)
    idx.remove("a/+")  # the last reference
    versions.append(idx.version)
    idx.remove("a/+")  # absent: nothing changes
    versions.append(idx.version)
    assert versions == [0, 1, 1, 1, 2, 2]
