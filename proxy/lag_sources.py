"""
mqproxy.lag_sources
~~~~~~~~~~~~~~~~~~~

Where the consumer-lag readings of :mod:`mqproxy.lag` come from, and how often they are taken.

Contracts:

* :func:`read_progress`: with the cluster backend (a facade that has ``consume_stats()``), the brokers'
  own GET_CONSUME_STATS answers (real broker names and queue ids, as ``mqadmin consumerProgress`` against
  the cluster prints them). Otherwise the facade is asked as mqproxy's own GET_CONSUME_STATS answers it:
  per group with committed offsets, its topics (only those its live members subscribe to, when it has
  live members), every readable queue of each: max offset and committed offset (0 when none). The
  broker services' internal groups are left out. With several backends (a routing facade, which has
  ``backends``), each backend is read as above and the readings are joined.
* :class:`LagRefresher.refresh` takes a new reading when the last one is older than
  ``metrics.lag_refresh_s`` (concurrent scrapes share one reading); while the backend cannot answer
  the last view stays. It logs ``metrics.lag_capped`` when the number of capped pairs changes to non-zero.
* :func:`log_lag_readings`: with ``metrics.lag_log_interval_s`` > 0, the server's task that takes a
  reading that often (through the same refresher, so ``/metrics`` and the console share it) and logs each
  new one as ``metrics.lag`` events, one per group/topic pair, at most :data:`MAX_LAG_EVENTS` per reading
  (largest lag first). A reading that did not change (the backend could not answer) is not logged again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import structlog
import trio

from mqproxy.lag import LagCollector, QueueProgress, QueueReading, lag_events, summarize
from mqproxy.model.errors import BackendError
from mqproxy.model.properties import PROXY_BROKER_NAME, REVIVE_GROUP, SCHEDULE_GROUP, TRANSACTION_GROUP

if TYPE_CHECKING:
    from mqproxy.facade.api import BrokerFacade
    from mqproxy.settings import MetricsSettings

__all__ = ["INTERNAL_GROUPS", "MAX_LAG_EVENTS", "LagRefresher", "log_lag_readings", "read_progress"]

_log = structlog.get_logger("mqproxy.metrics")

#: ``metrics.lag`` events per reading at most (group/topic pairs with the most lag first).
MAX_LAG_EVENTS = 1000
#: Groups the broker services use for their own progress; not consumer lag anyone acts on.
INTERNAL_GROUPS = frozenset({SCHEDULE_GROUP, REVIVE_GROUP, TRANSACTION_GROUP})


async def _subscribed(broker: BrokerFacade, group: str) -> set[str]:
    topics: set[str] = set()
    for client_id in await broker.consumer_ids(group):
        info = await broker.consumer_info(group, client_id)
        if info is not None:
            topics.update(s.topic for s in info.subscriptions)
    return topics


async def _facade_progress(broker: BrokerFacade) -> list[QueueProgress]:
    by_group: dict[str, set[str]] = {}
    for row in await broker.consumer_offsets():
        if row.group not in INTERNAL_GROUPS:
            by_group.setdefault(row.group, set()).add(row.topic)
    found: list[QueueProgress] = []
    for group, topics in sorted(by_group.items()):
        subscribed = await _subscribed(broker, group)
        for topic in sorted(topics & subscribed if subscribed else topics):
            config = await broker.get_topic(topic)
            if config is None:
                continue
            for queue_id in range(config.read_queues):
                try:
                    end = await broker.max_offset(topic, queue_id)
                except BackendError:
                    continue  # the queue went away meanwhile
                committed = max(await broker.query_consumer_offset(group, topic, queue_id) or 0, 0)
                found.append(QueueProgress(group, topic, PROXY_BROKER_NAME, queue_id, max(end, 0), committed))
    return found


async def read_progress(broker: BrokerFacade) -> Sequence[QueueReading]:
    """One reading of every group's per-queue progress (see the module contract)."""
    routed: Any = getattr(broker, "backends", None)
    if isinstance(routed, dict):  # several backends: each read its own way (topics are never on two)
        return [reading for backend in routed.values() for reading in await read_progress(backend)]
    cluster_stats: Any = getattr(broker, "consume_stats", None)
    if cluster_stats is not None:
        readings: list[QueueReading] = [
            s for s in await cluster_stats() if s.group not in INTERNAL_GROUPS
        ]
        return readings
    return await _facade_progress(broker)


class LagRefresher:
    """Keeps ``collector.view`` at most ``settings.lag_refresh_s`` old, read on demand."""

    def __init__(self, collector: LagCollector, settings: MetricsSettings) -> None:
        self.collector = collector
        self.settings = settings
        self._taken_at: float | None = None
        self._lock = trio.Lock()

    def _fresh(self) -> bool:
        taken = self._taken_at
        return taken is not None and trio.current_time() - taken < self.settings.lag_refresh_s

    async def refresh(self, broker: BrokerFacade) -> None:
        if self._fresh():
            return
        async with self._lock:
            if self._fresh():
                return  # another scrape read meanwhile
            try:
                readings = await read_progress(broker)
            except BackendError:
                return
            before = self.collector.view.capped_pairs
            view = summarize(readings, self.settings.max_lag_series, updated_unix_s=time.time())
            self.collector.view = view
            self._taken_at = trio.current_time()
            if view.capped_pairs and view.capped_pairs != before:
                _log.warning(
                    "metrics.lag_capped",
                    capped_pairs=view.capped_pairs,
                    lag_series=len(view.queues),
                    max_lag_series=self.settings.max_lag_series,
                )


async def log_lag_readings(refresher: LagRefresher, broker: BrokerFacade, interval_s: float) -> None:
    """Every ``interval_s``: refresh the reading and log a new one as ``metrics.lag`` events (runs until
    cancelled)."""
    logged: float | None = None
    while True:
        await trio.sleep(interval_s)
        await refresher.refresh(broker)
        view = refresher.collector.view
        if view.updated_unix_s is None or view.updated_unix_s == logged:
            continue
        logged = view.updated_unix_s
        for fields in lag_events(view, MAX_LAG_EVENTS):
            _log.info("metrics.lag", **fields)
