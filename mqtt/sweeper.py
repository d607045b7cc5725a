"""The background task that deletes idle light message queues (``[store] lmq_idle_seconds``).

MQTT makes one LMQ per topic and per wildcard filter, so a busy node accumulates them without end;
:func:`run_lmq_sweeper` calls :meth:`~mqproxy.facade.api.LightQueues.delete_idle_lmqs` every
``interval_s`` and logs ``lmq.swept`` when a sweep deleted something. A store error is logged as
``internal.error`` and the next sweep runs on schedule: the loop ends only by cancellation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Container

import structlog
import trio

from mqproxy.facade.api import LightQueues

_log = structlog.get_logger("mqproxy.store")

#: Longest a snapshot of the queues in use is trusted while one sweep runs (it walks every light queue
#: in small steps, which takes seconds with a million of them; subscriptions made meanwhile must count).
IN_USE_REFRESH_S = 1.0


class _FreshInUse(Container[str]):
    """``in_use()``, taken at the first lookup and again when older than :data:`IN_USE_REFRESH_S`.

    Only queues that already qualify otherwise are looked up, so a sweep that finds nothing idle never
    calls ``in_use`` and the refreshes are rare.
    """

    def __init__(self, in_use: Callable[[], Container[str]]) -> None:
        self._in_use = in_use
        self._snapshot: Container[str] = ()
        self._taken = -math.inf

    def __contains__(self, name: object) -> bool:
        now = trio.current_time()
        if now - self._taken > IN_USE_REFRESH_S:
            self._snapshot, self._taken = self._in_use(), now
        return name in self._snapshot


async def sweep_once(
    backend: LightQueues, *, idle_ms: int, in_use: Callable[[], Container[str]], limit: int
) -> list[str]:
    """One sweep: delete idle light queues and log ``lmq.swept`` if any went (store errors propagate)."""
    started = time.perf_counter()
    deleted = await backend.delete_idle_lmqs(idle_ms, _FreshInUse(in_use), limit)
    if deleted:
        duration_ms = round((time.perf_counter() - started) * 1000, 3)
        _log.info("lmq.swept", deleted=len(deleted), duration_ms=duration_ms)
    return deleted


async def run_lmq_sweeper(
    backend: LightQueues,
    *,
    idle_ms: int,
    interval_s: float,
    in_use: Callable[[], Container[str]],
    limit: int,
) -> None:
    """Sweep every ``interval_s`` seconds, forever (cancel to stop).

    ``in_use`` is called at each sweep (and again during a long one) and names the queues some reader
    holds even if idle; ``limit`` bounds the queues deleted per sweep.
    """
    while True:
        await trio.sleep(interval_s)
        try:
            await sweep_once(backend, idle_ms=idle_ms, in_use=in_use, limit=limit)
        except Exception:  # a store error (BackendError) or a bug must not end the sweeps, nor the server
            _log.exception("internal.error", detail="idle LMQ sweep failed")
