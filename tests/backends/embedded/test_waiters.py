"""QueueWaiters' task-less waiters (``watch``): called once at the queue's next notify, never after
``unwatch``, and counted as waiting on the queue while registered."""

from __future__ import annotations

import time

import trio
import trio.testing

from mqproxy.backends.embedded.waiters import QueueWaiters


def test_a_watch_is_called_once_at_the_next_notify_of_its_key() -> None:
    waiters = QueueWaiters()
    calls: list[str] = []
    waiters.watch("q", lambda: calls.append("a"))
    waiters.watch("q", lambda: calls.append("b"))
    assert waiters.waiting("q")
    assert waiters.awaited("q", time.monotonic())
    waiters.notify("other")
    assert calls == []
    waiters.notify("q")
    assert calls == ["a", "b"]
    assert not waiters.waiting("q")
    assert waiters.awaited("q", time.monotonic()), "just woken: still counts as awaited"
    waiters.notify("q")
    assert calls == ["a", "b"], "a watch is called once"


def test_unwatch_forgets_one_callback_and_the_key_with_its_last() -> None:
    waiters = QueueWaiters()
    calls: list[str] = []

    def first() -> None:
        calls.append("first")

    def second() -> None:
        calls.append("second")

    waiters.watch("q", first)
    waiters.watch("q", second)
    waiters.unwatch("q", first)
    assert waiters.waiting("q")
    waiters.unwatch("q", second)
    assert not waiters.waiting("q")
    waiters.unwatch("q", second)  # not registered: nothing happens
    waiters.notify("q")
    assert calls == []


async def test_notify_all_calls_every_watch_and_wakes_tasks() -> None:
    waiters = QueueWaiters()
    calls: list[str] = []
    waiters.watch("a", lambda: calls.append("a"))
    waiters.watch("b", lambda: calls.append("b"))
    woke: list[bool] = []
    async with trio.open_nursery() as nursery:

        async def waiter() -> None:
            woke.append(await waiters.wait("c", lambda: bool(calls), 10))

        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        waiters.notify_all()
    assert sorted(calls) == ["a", "b"]
    assert woke == [True]
    assert not waiters.waiting("a")
