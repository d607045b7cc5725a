"""The keep-alive timer: the sans-IO wheel (no sockets, times passed in) and its trio task."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from mqproxy.mqtt.keepalive import DeadlineWheel, KeepAliveTimer

INF = math.inf


class Item:
    def __init__(self, name: str) -> None:
        self.name = name
        self.read_deadline = INF
        self.wheel_due = INF
        self.wheel_slot = -1
        self.expired = 0

    def expire(self) -> None:
        self.expired += 1

    def __repr__(self) -> str:
        return self.name


def test_an_item_expires_at_the_first_tick_at_or_after_its_deadline_never_before() -> None:
    wheel = DeadlineWheel(0.0, tick_s=0.1, slots=8)
    item = Item("a")
    wheel.add(item, 0.25)
    assert wheel.next_due() == pytest.approx(0.3)
    assert wheel.advance(0.2) == []
    assert wheel.advance(0.2999) == []
    assert wheel.advance(0.3) == [item]
    assert (item.wheel_slot, wheel.count, wheel.next_due()) == (-1, 0, INF)


def test_a_later_deadline_is_read_lazily_and_moves_the_item_at_its_old_slot() -> None:
    wheel = DeadlineWheel(0.0, tick_s=0.1, slots=8)
    item = Item("a")
    wheel.add(item, 0.5)
    slot = item.wheel_slot
    assert wheel.schedule(item, 0.9) is False  # later: only stored
    assert item.wheel_slot == slot
    assert wheel.advance(0.5) == []  # the old slot's visit moves it
    assert item.wheel_due == pytest.approx(0.9)
    assert wheel.advance(0.89) == []
    assert wheel.advance(0.9) == [item]


def test_a_sooner_deadline_moves_the_item_at_once_and_asks_for_an_earlier_wake_up() -> None:
    wheel = DeadlineWheel(0.0, tick_s=0.1, slots=8)
    item = Item("a")
    wheel.add(item, 0.7)  # the CONNECT timeout
    wheel.wake_at = wheel.next_due()
    assert wheel.schedule(item, 0.2) is True  # a keep alive shorter than the CONNECT timeout
    assert wheel.wake_at == pytest.approx(0.2)
    assert wheel.advance(0.2) == [item]


def test_no_deadline_while_busy_then_a_deadline_sooner_than_the_next_visit() -> None:
    wheel = DeadlineWheel(0.0, tick_s=0.1, slots=8)
    item = Item("a")
    wheel.add(item, 0.2)
    wheel.schedule(item, INF)  # handling a packet: no deadline
    assert wheel.advance(0.3) == []  # visited: stays in, looked at once per revolution
    assert item.wheel_due > 0.3
    wheel.wake_at = wheel.next_due()
    assert item.wheel_due > 0.5
    assert wheel.schedule(item, 0.5) is True  # sooner than its next visit: moved at once
    assert wheel.advance(0.49) == []
    assert wheel.advance(0.5) == [item]


def test_deadlines_beyond_one_revolution_are_visited_until_due() -> None:
    wheel = DeadlineWheel(0.0, tick_s=0.1, slots=4)  # one revolution: 0.4 s
    item = Item("a")
    wheel.add(item, 1.55)
    now = 0.0
    while now < 1.5:
        now = round(now + 0.1, 1)
        assert wheel.advance(now) == [], now
    assert wheel.advance(1.6) == [item]


def test_discard_takes_the_item_out_and_a_long_sleep_visits_every_slot_once() -> None:
    wheel = DeadlineWheel(0.0, tick_s=0.1, slots=4)
    kept, dropped = Item("kept"), Item("dropped")
    wheel.add(kept, 0.1)
    wheel.add(dropped, 0.2)
    wheel.discard(dropped)
    wheel.discard(dropped)  # twice: nothing
    assert wheel.count == 1
    assert wheel.advance(100.0) == [kept]
    assert wheel.count == 0


def test_many_items_expire_in_deadline_order_of_their_ticks() -> None:
    wheel = DeadlineWheel(0.0, tick_s=0.1, slots=16)
    items = [Item(str(n)) for n in range(20)]
    for n, item in enumerate(items):
        wheel.add(item, 0.1 * (n + 1))
    seen: list[Item] = []
    now = 0.0
    while wheel.count:
        now = wheel.next_due()
        seen += wheel.advance(now)
    assert seen == items


class EventItem(Item):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.done = trio.Event()

    def expire(self) -> None:
        super().expire()
        self.done.set()


async def test_the_timer_task_expires_an_item_after_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    timer = KeepAliveTimer(tick_s=0.01, slots=64)
    early, late = EventItem("early"), EventItem("late")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(timer.run)
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        timer.add(late, start + 0.3)
        timer.add(early, start + 0.05)  # sooner than the task's planned wake-up
        await early.done.wait()
        assert start + 0.05 <= trio.current_time() <= start + 0.07
        assert late.expired == 0
        timer.schedule(late, INF)  # busy: not expired while so (virtual time)
        await trio.sleep(1.0)
        assert late.expired == 0
        deadline = trio.current_time() + 0.02
        timer.schedule(late, deadline)
        await late.done.wait()
        assert deadline <= trio.current_time() <= deadline + 0.02
        assert (early.expired, late.expired, timer.wheel.count) == (1, 1, 0)
        nursery.cancel_scope.cancel()
