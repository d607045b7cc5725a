"""Sans-IO: consumer-offset translation (checkpoints) from a target queue read newest first, and the
``groups`` rule option."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from mqproxy.connector.checkpoint import TailScan, advances, merge_target, translate_offset
from mqproxy.connector.checkpointer import Checkpointer
from mqproxy.connector.origin import SourceQueue, translate
from mqproxy.connector.rules import RulesError, parse_rules
from mqproxy.model.types import StoredMessage

from ..conftest import stored_message  # type: ignore[import-not-found]

Q = SourceQueue("edge", "Orders", "broker-a", 0)
OTHER = SourceQueue("edge", "Orders", "broker-a", 1)


def queue(*entries: tuple[SourceQueue | None, int]) -> list[StoredMessage]:
    """A target queue, oldest first: entry n is at target offset n, a copy of (source, origin offset) or a
    plain message (source None)."""
    out = []
    for target_offset, (source, origin) in enumerate(entries):
        props = (
            {}
            if source is None
            else translate(stored_message(queue_offset=origin), source, "O", 0).properties
        )
        out.append(stored_message(queue_offset=target_offset, properties=props))
    return out


def scan(messages: list[StoredMessage], committed: int, source: SourceQueue = Q) -> TailScan:
    s = TailScan(source, committed)
    s.feed(reversed(messages))
    return s


def test_first_copy_at_or_after_the_committed_offset() -> None:
    # origins 0..9 of Q, origin 3 and 4 filtered out (never copied)
    tq = queue(*((Q, o) for o in (0, 1, 2, 5, 6, 7, 8, 9)))
    s = scan(tq, 6)
    assert s.decided
    assert s.first_at == 4
    assert s.below_at == 3
    assert translate_offset(s, whole_queue=False, copied_through=None, high=8) == 4
    # the committed offset points at a filtered-out message: resume at the next copy
    assert translate_offset(scan(tq, 3), whole_queue=False, copied_through=None, high=8) == 3
    # nothing was consumed: the first copy, known once the whole queue was read
    s0 = scan(tq, 0)
    assert not s0.decided
    assert s0.first_at == 0
    assert translate_offset(s0, whole_queue=True, copied_through=None, high=8) == 0
    assert translate_offset(s0, whole_queue=False, copied_through=None, high=8) is None


def test_everything_consumed_needs_everything_below_copied() -> None:
    tq = queue((Q, 0), (Q, 1), (None, 0), (Q, 2))
    s = scan(tq, 3)
    assert s.first_at is None
    assert s.below_at == 3
    assert translate_offset(s, whole_queue=False, copied_through=3, high=4) == 4
    # the copy lags behind the group: the copies of 3.. are still to come below where it would point
    s5 = scan(tq, 5)
    assert translate_offset(s5, whole_queue=False, copied_through=3, high=4) is None
    assert translate_offset(s5, whole_queue=False, copied_through=None, high=4) is None
    # messages written after the newest copy (by others) are not skipped
    tq2 = queue((Q, 0), (Q, 1), (None, 0), (None, 0))
    assert translate_offset(scan(tq2, 2), whole_queue=False, copied_through=2, high=4) == 2


def test_no_copy_of_the_queue_at_all() -> None:
    tq = queue((OTHER, 0), (OTHER, 1))
    s = scan(tq, 4)
    assert s.first_at is None
    assert s.below_at is None
    assert s.scanned == 2
    assert translate_offset(s, whole_queue=True, copied_through=4, high=2) == 2
    assert translate_offset(s, whole_queue=False, copied_through=4, high=2) is None  # scan limit hit
    assert translate_offset(s, whole_queue=True, copied_through=3, high=2) is None


def test_shared_target_queue_takes_the_smallest_and_never_goes_back() -> None:
    tq = queue((Q, 0), (OTHER, 0), (Q, 1), (OTHER, 1), (Q, 2), (OTHER, 2))
    mine = translate_offset(scan(tq, 2), whole_queue=False, copied_through=2, high=6)
    theirs = translate_offset(scan(tq, 1, OTHER), whole_queue=False, copied_through=3, high=6)
    assert (mine, theirs) == (4, 3)
    assert merge_target([mine, theirs]) == 3
    assert merge_target([mine, None]) is None
    assert merge_target([]) is None
    assert advances(3, None)
    assert advances(3, 2)
    assert not advances(3, 3)
    assert not advances(3, 7)


def test_feed_stops_at_the_first_copy_below() -> None:
    tq = queue(*((Q, o) for o in range(100)))
    s = TailScan(Q, 90)
    assert s.feed(reversed(tq))
    assert s.scanned == 11
    assert s.first_at == 90


RULES = """
[connector]
name = "c"
checkpoint_interval_s = 0.5
[clusters.a]
namesrv = "127.0.0.1:1"
[clusters.b]
namesrv = "127.0.0.1:2"
[[rules]]
source = "a"
target = "b"
topic = "T"
{groups}
"""


def test_groups_option() -> None:
    config = parse_rules(RULES.format(groups='groups = ["G1", "re:app-.*"]'))
    rule = config.rules[0]
    assert config.checkpoint_interval_s == 0.5
    assert rule.matches_group("G1")
    assert rule.matches_group("app-x")
    assert not rule.matches_group("G2")
    assert not rule.matches_group("xapp-x")
    assert parse_rules(RULES.format(groups="")).rules[0].groups == ()
    with pytest.raises(RulesError, match=r"rules.toml:13: rules\[0\].groups: bad regular expression"):
        parse_rules(RULES.format(groups='groups = ["re:("]'), "rules.toml")
    with pytest.raises(RulesError, match=r"rules\[0\].groups: expected a list"):
        parse_rules(RULES.format(groups="groups = [1]"), "rules.toml")


class _Source:
    async def groups_of(self, topic: str) -> list[str]:
        return ["app-1", "c", "other", "app-2"]


async def test_checkpointer_handles_target_queues_of_its_first_sources_and_picks_groups() -> None:
    config = parse_rules(RULES.format(groups='groups = ["G1", "re:app-.*", "re:c"]'))
    rt: Any = SimpleNamespace(config=config, clusters={"a": _Source()})
    a0, a1, a2 = (SourceQueue("a", "T", "broker-a", q) for q in range(3))
    layout = {a0: ("T", "b", 0), a1: ("T", "b", 0), a2: ("T", "b", 1)}
    owned = {a1, a2}
    cp = Checkpointer(rt, config.rules[0], lambda: layout, lambda: owned)
    # target queue 0 is fed by a0 and a1: the owner of a0 translates it; a2 alone feeds queue 1
    assert cp._mine() == {("T", "b", 1): [a2]}
    owned.add(a0)
    assert cp._mine() == {("T", "b", 0): [a0, a1], ("T", "b", 1): [a2]}
    # exact names as given, regex entries against the listed groups, never the connector's own group ("c")
    assert await cp._groups("T") == ["G1", "app-1", "app-2"]
