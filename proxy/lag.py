"""
mqproxy.lag
~~~~~~~~~~~

Consumer lag on ``/metrics``: the figures ``mqadmin consumerProgress`` prints, as bounded Prometheus series.
Sans-IO: :func:`summarize` turns per-queue readings into a :class:`LagView`; :class:`LagCollector` exports the
last view at scrape time. Reading the backend is :mod:`mqproxy.lag_sources`.

Contracts:

* A reading is one :class:`QueueProgress` per (group, topic, broker, queue): the broker's max offset and the
  group's committed offset, each as the broker reports them (GET_CONSUME_STATS: negative values read 0),
  and ``lag = broker_offset - consumer_offset`` (mqadmin's ``#Diff``, not clamped).
* Series:

  - ``mqproxy_consumer_queue_broker_offset`` / ``..._consumer_offset`` /
    ``mqproxy_consumer_queue_lag_messages`` ``{group, topic, broker, queue}``: one per queue, for at most
    ``max_series`` queues. Group/topic pairs are taken whole in (group, topic) order; a pair whose queues
    do not fit any more is exported only as its sums, and ``mqproxy_consumer_lag_capped_pairs`` counts
    those pairs.
  - ``mqproxy_consumer_lag_messages{group, topic}``: the sum over the pair's queues (every pair).
  - ``mqproxy_consumer_group_lag_messages{group}``: mqadmin's "Consume Diff Total" of the group.
  - LMQ queues (``%LMQ%...``, one per MQTT topic or session) are never per-queue series: a group's LMQ
    queues are summed into the one pair ``topic="%LMQ%"``.
  - ``mqproxy_consumer_lag_updated_seconds``: Unix time of the reading (absent before the first one).

* Per-client detail (which client holds which queue) is never a label.
* :func:`lag_events`: a reading as ``metrics.lag`` log events, one per group/topic pair (largest lag first,
  at most ``limit``), all carrying the reading's time as ``reading_ms`` (the Spark job's lag table).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final, Protocol

from prometheus_client.core import GaugeMetricFamily, Metric

__all__ = [
    "LMQ_TOPIC",
    "LagCollector",
    "LagView",
    "QueueProgress",
    "QueueReading",
    "lag_events",
    "summarize",
]

#: The one topic label all LMQ queues of a group are summed under.
LMQ_TOPIC: Final = "%LMQ%"
_LMQ_PREFIX: Final = "%LMQ%"


class QueueReading(Protocol):
    """What a backend reading of one queue carries (:class:`QueueProgress` or the cluster's ConsumeStat)."""

    @property
    def group(self) -> str: ...
    @property
    def topic(self) -> str: ...
    @property
    def broker(self) -> str: ...
    @property
    def queue_id(self) -> int: ...
    @property
    def broker_offset(self) -> int: ...
    @property
    def consumer_offset(self) -> int: ...


@dataclass(frozen=True, slots=True)
class QueueProgress:
    group: str
    topic: str
    broker: str
    queue_id: int
    broker_offset: int
    consumer_offset: int

    @property
    def lag(self) -> int:
        return self.broker_offset - self.consumer_offset


@dataclass(frozen=True, slots=True)
class PairSum:
    """A group/topic pair summed over its queues."""

    broker_offset: int = 0
    consumer_offset: int = 0
    queues: int = 0

    @property
    def lag(self) -> int:
        return self.broker_offset - self.consumer_offset

    def plus(self, queue: QueueProgress) -> PairSum:
        return PairSum(
            self.broker_offset + queue.broker_offset,
            self.consumer_offset + queue.consumer_offset,
            self.queues + 1,
        )


@dataclass(frozen=True, slots=True)
class LagView:
    """One reading, ready to export."""

    queues: tuple[QueueProgress, ...] = ()
    pairs: dict[tuple[str, str], PairSum] = field(default_factory=dict)
    capped_pairs: int = 0
    updated_unix_s: float | None = None

    def group_totals(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for (group, _), pair in self.pairs.items():
            totals[group] = totals.get(group, 0) + pair.lag
        return totals


def lag_events(view: LagView, limit: int) -> list[dict[str, object]]:
    """The fields of the ``metrics.lag`` events of ``view``: one per group/topic pair, largest lag first,
    at most ``limit``; empty before the first reading."""
    if view.updated_unix_s is None:
        return []
    reading_ms = round(view.updated_unix_s * 1000)
    ranked = sorted(view.pairs.items(), key=lambda item: (-item[1].lag, item[0]))
    return [
        {
            "group": group,
            "topic": topic,
            "queues": pair.queues,
            "broker_offset": pair.broker_offset,
            "consumer_offset": pair.consumer_offset,
            "lag": pair.lag,
            "reading_ms": reading_ms,
        }
        for (group, topic), pair in ranked[:limit]
    ]


def summarize(
    readings: Iterable[QueueReading], max_series: int, *, updated_unix_s: float | None = None
) -> LagView:
    """Bounded series of ``readings`` (see the module contract)."""
    by_pair: dict[tuple[str, str], list[QueueProgress]] = {}
    for r in readings:
        lmq = r.topic.startswith(_LMQ_PREFIX)
        queue = QueueProgress(
            r.group,
            LMQ_TOPIC if lmq else r.topic,
            r.broker,
            r.queue_id,
            max(r.broker_offset, 0),
            max(r.consumer_offset, 0),
        )
        by_pair.setdefault((queue.group, queue.topic), []).append(queue)
    kept: list[QueueProgress] = []
    pairs: dict[tuple[str, str], PairSum] = {}
    capped = 0
    for key in sorted(by_pair):
        queues = sorted(by_pair[key], key=lambda q: (q.broker, q.queue_id))
        total = PairSum()
        for queue in queues:
            total = total.plus(queue)
        pairs[key] = total
        if key[1] == LMQ_TOPIC:
            continue
        if len(kept) + len(queues) <= max_series:
            kept.extend(queues)
        else:
            capped += 1
    return LagView(tuple(kept), pairs, capped, updated_unix_s)


_QUEUE_LABELS: Final = ["group", "topic", "broker", "queue"]


class LagCollector:
    """A Prometheus collector of the last :class:`LagView` (``view`` is replaced whole per reading)."""

    def __init__(self) -> None:
        self.view = LagView()

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        view = self.view
        broker = GaugeMetricFamily(
            "mqproxy_consumer_queue_broker_offset",
            "Max offset of a consumed queue, as in mqadmin consumerProgress",
            labels=_QUEUE_LABELS,
        )
        consumer = GaugeMetricFamily(
            "mqproxy_consumer_queue_consumer_offset",
            "Committed offset of a consumer group on a queue, as in mqadmin consumerProgress",
            labels=_QUEUE_LABELS,
        )
        lag = GaugeMetricFamily(
            "mqproxy_consumer_queue_lag_messages",
            "Broker offset minus consumer offset of a queue (mqadmin consumerProgress #Diff)",
            labels=_QUEUE_LABELS,
        )
        for q in view.queues:
            labels = [q.group, q.topic, q.broker, str(q.queue_id)]
            broker.add_metric(labels, q.broker_offset)
            consumer.add_metric(labels, q.consumer_offset)
            lag.add_metric(labels, q.lag)
        yield from (broker, consumer, lag)
        pairs = GaugeMetricFamily(
            "mqproxy_consumer_lag_messages",
            "Messages not yet consumed, by consumer group and topic (LMQ queues summed as %LMQ%)",
            labels=["group", "topic"],
        )
        for (group, topic), pair in view.pairs.items():
            pairs.add_metric([group, topic], pair.lag)
        yield pairs
        groups = GaugeMetricFamily(
            "mqproxy_consumer_group_lag_messages",
            "Messages not yet consumed by a group over all its topics (mqadmin Consume Diff Total)",
            labels=["group"],
        )
        for group, total in sorted(view.group_totals().items()):
            groups.add_metric([group], total)
        yield groups
        yield GaugeMetricFamily(
            "mqproxy_consumer_lag_capped_pairs",
            "Group/topic pairs exported only as sums because metrics.max_lag_series was reached",
            value=view.capped_pairs,
        )
        if view.updated_unix_s is not None:
            yield GaugeMetricFamily(
                "mqproxy_consumer_lag_updated_seconds",
                "Unix time of the consumer-lag reading",
                value=view.updated_unix_s,
            )
