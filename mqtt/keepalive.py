"""Read deadlines (CONNECT timeout, 1.5 x keep alive) of every MQTT connection, checked by one timer.

A connection used to bound each read with the deadline of its own cancel scope: trio keeps such a
deadline in a heap entry per change (two per read, plus stale ones) and re-sorts it on every change,
about 15 % of a CONNECT's CPU and ~200 B per idle connection. Here a connection only stores its deadline
(:meth:`KeepAliveTimer.schedule`, a float and a comparison on the common path); one timer per trio run
checks the deadlines and calls :meth:`Expiring.expire` on a connection whose deadline has passed.

* :class:`DeadlineWheel` is the sans-IO core: a hashed timing wheel of ``slots`` slots of ``tick_s``
  seconds. An item sits in one slot; a visit of that slot expires it if its deadline has passed and
  otherwise moves it to the slot of its (later) deadline. Deadlines are read lazily, so pushing a
  deadline later (every read) costs nothing; only a deadline *sooner* than the item's next visit (the
  CONNECT timeout becoming a shorter keep-alive, a read after a busy spell) moves it at once.
  Contract: an item is never expired before its deadline and is expired at the first visit of a tick
  at or after it, i.e. at most ``tick_s`` late (plus the timer task's scheduling).
* :class:`KeepAliveTimer` is the trio layer: one task (a trio system task, started by the first
  :func:`keepalive_timer` of a run) that sleeps until the next non-empty slot is due, visits it and
  calls ``expire()`` on what expired.
"""

from __future__ import annotations

import math
from typing import Protocol

import trio

__all__ = ["DeadlineWheel", "Expiring", "KeepAliveTimer", "keepalive_timer"]

#: Resolution of the deadlines: a connection is closed at most this late (1.5 x keep alive is >= 1.5 s).
TICK_S = 0.05
#: Slots of the wheel (one revolution: ``SLOTS * TICK_S`` = 25.6 s); a later deadline is moved per visit.
SLOTS = 512
_INF = math.inf
#: Slack in tick units against float rounding (0.3 / 0.1 is 2.9999999999999996): a visit may then find an
#: item a hair before its deadline, which only moves it to the next tick (never expired early).
_EPS = 1e-6


class Expiring(Protocol):
    """What the wheel holds: an object with these attributes, which only the wheel sets (besides
    ``read_deadline`` through :meth:`DeadlineWheel.schedule`)."""

    #: When the item expires (``inf``: not while it stays so).
    read_deadline: float
    #: When the wheel visits the item's slot next (``inf`` while not in the wheel).
    wheel_due: float
    #: The item's slot, ``-1`` while not in the wheel.
    wheel_slot: int

    def expire(self) -> None:
        """Called (by the trio layer) once the deadline has passed; the item is no longer in the wheel."""


class DeadlineWheel:
    """The deadlines of many items, visited a slot at a time (sans-IO: the caller passes the time)."""

    __slots__ = ("_cursor", "_slots", "count", "slots", "tick_s", "wake_at")

    def __init__(self, now: float, tick_s: float = TICK_S, slots: int = SLOTS) -> None:
        self.tick_s = tick_s
        self.slots = slots
        self._slots: list[set[Expiring] | None] = [None] * slots
        self._cursor = math.ceil(now / tick_s - _EPS)  # the next tick to visit
        self.count = 0
        #: When the owner plans to call :meth:`advance` next (it sets this; :meth:`schedule` lowers it).
        self.wake_at = _INF

    def add(self, item: Expiring, deadline: float) -> None:
        """Put ``item`` (not in the wheel yet) in with ``deadline``."""
        item.read_deadline = deadline
        self.count += 1
        self._place(item, deadline)

    def schedule(self, item: Expiring, deadline: float) -> bool:
        """Set ``item``'s deadline (``inf``: none for now). True when the owner must call :meth:`advance`
        sooner than it planned: at :attr:`wake_at`, which this lowered."""
        item.read_deadline = deadline
        if deadline >= item.wheel_due or item.wheel_slot < 0:
            return False  # its slot is visited before the deadline: checked then
        self._slots[item.wheel_slot].discard(item)  # type: ignore[union-attr]
        self._place(item, deadline)
        if item.wheel_due < self.wake_at:
            self.wake_at = item.wheel_due
            return True
        return False

    def discard(self, item: Expiring) -> None:
        """Take ``item`` out (nothing if it is not in the wheel)."""
        if item.wheel_slot >= 0:
            self._slots[item.wheel_slot].discard(item)  # type: ignore[union-attr]
            item.wheel_slot = -1
            item.wheel_due = _INF
            self.count -= 1

    def next_due(self) -> float:
        """When the next non-empty slot is due (``inf`` when the wheel is empty)."""
        if not self.count:
            return _INF
        for step in range(self.slots):
            if self._slots[(self._cursor + step) % self.slots]:
                return (self._cursor + step) * self.tick_s
        return _INF  # pragma: no cover - count > 0 means a slot holds something

    def advance(self, now: float) -> list[Expiring]:
        """Visit every tick due at ``now``: the items whose deadline has passed, taken out."""
        expired: list[Expiring] = []
        tick_s, slots = self.tick_s, self._slots
        last = math.floor(now / tick_s + _EPS)
        if last - self._cursor >= self.slots:  # asleep for more than a revolution: one visit of each
            self._cursor = last - self.slots + 1
        while self._cursor <= last:
            tick = self._cursor
            self._cursor += 1
            slot = slots[tick % self.slots]
            if not slot:
                continue
            for item in list(slot):
                if item.read_deadline <= now:
                    slot.discard(item)
                    item.wheel_slot = -1
                    item.wheel_due = _INF
                    self.count -= 1
                    expired.append(item)
                else:
                    slot.discard(item)
                    self._place(item, item.read_deadline)
        return expired

    def _place(self, item: Expiring, deadline: float) -> None:
        """Put ``item`` in the slot visited first at or after ``deadline`` (within one revolution)."""
        cursor = self._cursor
        if deadline == _INF:
            tick = cursor + self.slots - 1  # looked at once per revolution
        else:
            tick = max(math.ceil(deadline / self.tick_s - _EPS), cursor)
            if tick - cursor >= self.slots:
                tick = cursor + (tick - cursor) % self.slots
        index = tick % self.slots
        slot = self._slots[index]
        if slot is None:
            slot = self._slots[index] = set()
        slot.add(item)
        item.wheel_slot = index
        item.wheel_due = tick * self.tick_s


class KeepAliveTimer:
    """The trio layer: one task visits the wheel when its next slot is due and expires what is due."""

    def __init__(self, tick_s: float = TICK_S, slots: int = SLOTS) -> None:
        self.wheel = DeadlineWheel(trio.current_time(), tick_s, slots)
        self._sleep: trio.CancelScope | None = None

    def add(self, item: Expiring, deadline: float) -> None:
        """Start checking ``item``'s deadline (see :meth:`DeadlineWheel.add`)."""
        self.wheel.add(item, deadline)
        if item.wheel_due < self.wheel.wake_at:
            self._wake(item.wheel_due)

    def schedule(self, item: Expiring, deadline: float) -> None:
        """Set ``item``'s deadline (``inf``: none for now); the common case stores a float."""
        if self.wheel.schedule(item, deadline):
            self._wake(self.wheel.wake_at)

    def discard(self, item: Expiring) -> None:
        """Stop checking ``item`` (at its end)."""
        self.wheel.discard(item)

    def _wake(self, at: float) -> None:
        self.wheel.wake_at = at
        if self._sleep is not None:
            self._sleep.deadline = at

    async def run(self) -> None:
        """Visit the wheel whenever a slot is due, until cancelled; ``expire()`` errors propagate."""
        wheel = self.wheel
        while True:
            wheel.wake_at = wheel.next_due()
            with trio.CancelScope(deadline=wheel.wake_at) as self._sleep:
                await trio.sleep_forever()
            self._sleep = None
            for item in wheel.advance(trio.current_time()):
                item.expire()


_TIMER: trio.lowlevel.RunVar[KeepAliveTimer] = trio.lowlevel.RunVar("mqproxy_mqtt_keepalive")


def keepalive_timer() -> KeepAliveTimer:
    """This trio run's timer, its task started (as a system task) by the first call."""
    try:
        return _TIMER.get()
    except LookupError:
        timer = KeepAliveTimer()
        _TIMER.set(timer)
        trio.lowlevel.spawn_system_task(timer.run, name="mqtt-keepalive")
        return timer
