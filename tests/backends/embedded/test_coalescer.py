"""WriteCoalescer: concurrent submits share one write, keep their order, get their own outcomes; a
cancelled follower is withdrawn; leaders stop yielding while alone and resume once company shows up."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio

from mqproxy.backends.embedded.coalescer import PROBE_EVERY, SOLO_WRITES, WriteCoalescer


class Recorder:
    """A write that doubles each request, records every call, and can refuse chosen requests."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.refuse: set[int] = set()
        self.broken: BaseException | None = None

    def __call__(self, requests: Sequence[int]) -> list[int | BaseException]:
        self.calls.append(list(requests))
        if self.broken is not None:
            raise self.broken
        return [ValueError(f"refused {r}") if r in self.refuse else r * 2 for r in requests]


async def test_concurrent_submits_share_one_write_in_order() -> None:
    write = Recorder()
    coalescer: WriteCoalescer[int, int] = WriteCoalescer(write)
    results: dict[int, int] = {}
    submitted: list[int] = []

    async def one(n: int) -> None:
        submitted.append(n)
        results[n] = await coalescer.submit(n)

    async with trio.open_nursery() as nursery:
        for n in range(10):
            nursery.start_soon(one, n)
    assert write.calls == [submitted]  # one write, in submission order
    assert sorted(submitted) == list(range(10))
    assert results == {n: n * 2 for n in range(10)}
    assert (coalescer.writes, coalescer.requests) == (1, 10)


async def test_a_refused_request_fails_alone() -> None:
    write = Recorder()
    write.refuse = {3}
    coalescer: WriteCoalescer[int, int] = WriteCoalescer(write)
    outcomes: dict[int, object] = {}

    async def one(n: int) -> None:
        try:
            outcomes[n] = await coalescer.submit(n)
        except ValueError as exc:
            outcomes[n] = str(exc)

    async with trio.open_nursery() as nursery:
        for n in range(5):
            nursery.start_soon(one, n)
    assert outcomes == {0: 0, 1: 2, 2: 4, 3: "refused 3", 4: 8}
    assert len(write.calls) == 1


async def test_a_failing_write_fails_every_request_of_it_then_recovers() -> None:
    write = Recorder()
    write.broken = OSError("disk gone")
    coalescer: WriteCoalescer[int, int] = WriteCoalescer(write)
    errors: list[str] = []

    async def one(n: int) -> None:
        with pytest.raises(OSError, match="disk gone") as info:
            await coalescer.submit(n)
        errors.append(str(info.value))

    async with trio.open_nursery() as nursery:
        for n in range(3):
            nursery.start_soon(one, n)
    assert errors == ["disk gone"] * 3
    write.broken = None
    assert await coalescer.submit(7) == 14


async def test_wrong_outcome_count_is_an_error_for_everyone() -> None:
    coalescer: WriteCoalescer[int, int] = WriteCoalescer(lambda requests: [])
    with pytest.raises(RuntimeError, match="0 outcomes for 1 requests"):
        await coalescer.submit(1)


async def test_cancelled_follower_is_withdrawn_before_the_write() -> None:
    write = Recorder()
    coalescer: WriteCoalescer[int, int] = WriteCoalescer(write)
    coalescer._leading = True  # a leader is in its yield (task order inside a turn is not ours to pick)
    with trio.CancelScope() as follower_scope:
        follower_scope.cancel()  # cancelled before the leader wrote
        await coalescer.submit(2)
    assert follower_scope.cancelled_caught
    assert coalescer._pending == []  # withdrawn: the leader will not write it
    coalescer._leading = False
    assert await coalescer.submit(1) == 2
    assert write.calls == [[1]]


async def test_leader_is_not_cancelled_mid_write() -> None:
    write = Recorder()
    coalescer: WriteCoalescer[int, int] = WriteCoalescer(write)
    with trio.CancelScope() as scope:
        scope.cancel()
        assert await coalescer.submit(5) == 10  # the leader's yield is shielded: it always writes
    assert write.calls == [[5]]


async def test_solo_leaders_stop_yielding_and_probes_find_company() -> None:
    write = Recorder()
    coalescer: WriteCoalescer[int, int] = WriteCoalescer(write)
    for n in range(SOLO_WRITES + PROBE_EVERY):
        assert await coalescer.submit(n) == 2 * n
    assert all(len(call) == 1 for call in write.calls)
    write.calls.clear()

    async def burst(base: int) -> None:
        async with trio.open_nursery() as nursery:
            for n in range(10):
                nursery.start_soon(coalescer.submit, base + n)

    # Not yielding, leaders write alone; a probing leader (one in PROBE_EVERY) groups what is queued.
    for round_ in range(50):
        await burst(100 * round_)
        if any(len(call) > 1 for call in write.calls):
            break
    assert len(write.calls[0]) == 1  # the first burst began with a leader that did not yield
    assert any(len(call) > 1 for call in write.calls)
    assert sum(len(call) for call in write.calls) == 10 * (round_ + 1)
    write.calls.clear()
    await burst(5000)  # once company was found, leaders yield again: the next burst is one write
    assert len(write.calls) == 1
    assert sorted(write.calls[0]) == list(range(5000, 5010))
