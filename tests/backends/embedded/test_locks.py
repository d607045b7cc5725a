"""Orderly-consumption queue locks: one client per (group, queue), TTL expiry, no stealing."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from mqproxy.backends.embedded.locks import QueueLocks
from mqproxy.facade.types import QueueRef
from mqproxy.model.errors import InvalidArgument


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


Q0, Q1, Q2 = QueueRef("T", 0), QueueRef("T", 1), QueueRef("T", 2)


def test_lock_is_exclusive_per_group_and_queue() -> None:
    locks = QueueLocks(now=FakeClock())
    assert locks.lock_batch("G", "c1", [Q0, Q1]) == {Q0, Q1}
    assert locks.lock_batch("G", "c2", [Q0, Q1, Q2]) == {Q2}  # cannot steal live locks
    assert locks.lock_batch("Other", "c2", [Q0]) == {Q0}  # another group is independent
    assert locks.holder("G", Q0) == "c1"
    assert locks.is_locked_by("G", "c2", Q2)
    assert locks.lock_batch("G", "c1", [Q0, Q2]) == {Q0}  # re-lock renews own, not others'


def test_locks_expire_after_ttl_unless_renewed() -> None:
    clock = FakeClock()
    locks = QueueLocks(ttl_s=60, now=clock)
    locks.lock_batch("G", "c1", [Q0, Q1])
    clock.now += 40
    locks.lock_batch("G", "c1", [Q0])  # renew Q0 only
    clock.now += 25  # Q1 is 65 s old, Q0 25 s
    assert locks.holder("G", Q1) is None
    assert locks.lock_batch("G", "c2", [Q0, Q1]) == {Q1}
    assert locks.expire() == 0
    clock.now += 61
    assert locks.expire() == 2
    assert not locks.group_holds_locks("G")


def test_unlock_only_releases_own_locks() -> None:
    locks = QueueLocks(now=FakeClock())
    locks.lock_batch("G", "c1", [Q0, Q1])
    locks.unlock("G", "c2", [Q0])
    assert locks.holder("G", Q0) == "c1"
    locks.unlock("G", "c1", [Q0])
    assert locks.holder("G", Q0) is None
    assert locks.group_holds_locks("G")
    assert locks.release_client("G", "c1") == 1
    assert locks.lock_batch("G", "c2", [Q0, Q1]) == {Q0, Q1}


@pytest.mark.parametrize(("group", "client"), [("", "c"), ("G", "")])
def test_empty_names_are_invalid(group: str, client: str) -> None:
    locks = QueueLocks(now=FakeClock())
    with pytest.raises(InvalidArgument):
        locks.lock_batch(group, client, [Q0])
    with pytest.raises(InvalidArgument):
        locks.unlock(group, client, [Q0])


def test_ttl_must_be_positive() -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        QueueLocks(ttl_s=0)


async def test_default_clock_is_trio_time(autojump_clock: trio.testing.MockClock) -> None:
    locks = QueueLocks()
    locks.lock_batch("G", "c1", [Q0])
    await trio.sleep(59.9)
    assert locks.lock_batch("G", "c2", [Q0]) == set()
    await trio.sleep(0.2)
    assert locks.lock_batch("G", "c2", [Q0]) == {Q0}
