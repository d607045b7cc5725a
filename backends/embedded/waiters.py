"""Long-poll wake-ups: one lazily created :class:`trio.Event` per queue that currently has waiters.

Idle queues cost nothing; an event is dropped as soon as it fires or its last waiter leaves, so a million
light queues with no pending pulls hold no objects here. A waiter may also be a callback instead of a task
(:meth:`QueueWaiters.watch`: called once, at the queue's next notify), e.g. the MQTT push hub of a queue
nobody writes yet; a watched queue counts as waited on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable

import trio

#: Keys remembered as recently woken, at most (older ones are forgotten first when pruned).
_MAX_WOKEN = 4096


class QueueWaiters:
    """``recent_s``: how long after a wake-up a queue still counts as :meth:`awaited`."""

    def __init__(self, recent_s: float = 1.0) -> None:
        self._events: dict[Hashable, trio.Event] = {}
        self._watches: dict[Hashable, list[Callable[[], None]]] = {}
        self._recent_s = recent_s
        self._woken: dict[Hashable, float] = {}  # key -> monotonic time its waiters were last woken

    def waiting(self, key: Hashable) -> bool:
        """True while some task is parked on ``key`` (or a callback watches it)."""
        return key in self._events or key in self._watches

    def awaited(self, key: Hashable, now: float) -> bool:
        """True while some task is parked on ``key``, or was woken on it less than ``recent_s`` before
        ``now`` (``time.monotonic()``): a reader still busy with what woke it comes back for more."""
        if key in self._events or key in self._watches:
            return True
        woken = self._woken.get(key)
        return woken is not None and now - woken < self._recent_s

    def notify(self, key: Hashable) -> None:
        """Wake every task waiting on ``key`` and call its watchers (call after the queue's max offset
        grew)."""
        event = self._events.pop(key, None)
        callbacks = self._watches.pop(key, None) if self._watches else None
        if event is None and callbacks is None:
            return
        if event is not None:
            event.set()
        woken = self._woken
        woken.pop(key, None)  # re-inserted last: the dict stays in wake-up order
        woken[key] = time.monotonic()
        if len(woken) > _MAX_WOKEN:
            for old in list(woken)[: len(woken) // 2]:
                del woken[old]
        for callback in callbacks or ():
            callback()

    def notify_all(self) -> None:
        events, self._events = self._events, {}
        for event in events.values():
            event.set()
        watches, self._watches = self._watches, {}
        for callbacks in watches.values():
            for callback in callbacks:
                callback()

    def watch(self, key: Hashable, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, synchronously, at the next :meth:`notify` of ``key`` (or
        :meth:`notify_all`): a waiter without a task. It must not raise and must not write to the store;
        it may read it (a write's notify comes once the write is complete: the MQTT push hubs deliver it
        from there)."""
        callbacks = self._watches.get(key)
        if callbacks is None:
            self._watches[key] = [callback]
        else:
            callbacks.append(callback)

    def unwatch(self, key: Hashable, callback: Callable[[], None]) -> None:
        """Forget ``callback`` (a no-op once it was called)."""
        callbacks = self._watches.get(key)
        if callbacks is not None and callback in callbacks:
            callbacks.remove(callback)
            if not callbacks:
                del self._watches[key]

    async def wait(self, key: Hashable, ready: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until ``ready()`` is true (re-checked after each notify) or ``timeout_s`` passes.

        Returns ``ready()``'s final answer; honours cancellation. A non-positive or NaN timeout
        checks once without waiting.
        """
        if ready():
            return True
        if not timeout_s > 0:  # also catches NaN
            return False
        deadline = trio.current_time() + timeout_s if math.isfinite(timeout_s) else math.inf
        while True:
            event = self._events.get(key)
            if event is None:
                event = self._events[key] = trio.Event()
            try:
                with trio.move_on_at(deadline):
                    await event.wait()
            finally:
                # A timed-out or cancelled last waiter must not leave the event behind.
                if self._events.get(key) is event and event.statistics().tasks_waiting == 0:
                    del self._events[key]
            if ready():
                return True
            if trio.current_time() >= deadline:
                return False
