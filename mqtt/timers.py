"""The gateway's timers: one task runs every delayed callback (session expiry, delayed Wills, housekeeping).

:class:`Timers` keeps a heap of ``(deadline, seq, callback)``; :meth:`Timers.run` sleeps until the first
deadline (or until a sooner one is added) and awaits due callbacks one at a time, until ``draining`` is set
or it is cancelled. A callback that raises is logged and does not stop the others. An owner that never
calls :meth:`Timers.run` gets it as a trio system task at the first :meth:`Timers.call_later`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Awaitable, Callable

import structlog
import trio

__all__ = ["Timers"]

_log = structlog.get_logger("mqproxy.mqtt")


class Timers:
    def __init__(self, draining: trio.Event) -> None:
        self.draining = draining
        self._heap: list[tuple[float, int, Callable[[], Awaitable[None]]]] = []
        self._seq = itertools.count()
        self._changed = trio.Event()
        self._started = False

    def call_later(self, delay_s: float, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``callback`` after ``delay_s`` in the timer task (until draining)."""
        heapq.heappush(self._heap, (trio.current_time() + delay_s, next(self._seq), callback))
        self._changed.set()
        if not self._started:
            self._started = True
            trio.lowlevel.spawn_system_task(self._run, name="mqtt-gateway-timers")

    async def run(self) -> None:
        """The timer task, run by the owner until draining (or cancelled); returns at once if it runs."""
        if self._started:
            return
        self._started = True
        await self._run()

    async def _run(self) -> None:
        while not self.draining.is_set():
            self._changed = trio.Event()
            deadline = self._heap[0][0] if self._heap else trio.current_time() + 3600
            async with trio.open_nursery() as nursery:

                async def stop_on(event: trio.Event) -> None:
                    await event.wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(stop_on, self._changed)
                nursery.start_soon(stop_on, self.draining)
                nursery.cancel_scope.deadline = deadline
            now = trio.current_time()
            while self._heap and self._heap[0][0] <= now and not self.draining.is_set():
                _, _, callback = heapq.heappop(self._heap)
                try:
                    await callback()
                except Exception:  # a store error or a bug must not kill the process via a system task
                    _log.exception("internal.error", detail="mqtt gateway timer failed")
