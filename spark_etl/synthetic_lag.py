"""Deterministic synthetic ``metrics.lag`` events and the reference answer of ``consumer_lag_minute``.

:func:`mqproxy.spark_etl.synthetic.iter_events` appends :func:`lag_events` to a corpus when
``CorpusOptions.lag_groups`` is set: every :data:`READING_EVERY` a reading of each group's pairs, in which
producers move the broker offsets ahead and the groups consume some of it.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, Final

__all__ = ["READING_EVERY", "expected_consumer_lag_minute", "lag_events"]

Event = dict[str, Any]

READING_EVERY: Final = timedelta(seconds=15)
_TOPICS: Final = ("Orders", "Payments", "%LMQ%")
_UTC_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def lag_events(groups: int, *, start: datetime, span: timedelta, seed: int = 0) -> Iterator[Event]:
    """Readings over ``[start, start + span)``, each group subscribed to two of the topics; a reading's
    events share ``reading_ms`` (its time) and are logged just after it."""
    rng = random.Random(f"lag-{seed}")
    pairs = [(f"GID_lag_{g}", _TOPICS[(g + i) % len(_TOPICS)]) for g in range(groups) for i in range(2)]
    offsets = {pair: [rng.randrange(1000), 0] for pair in pairs}  # broker, consumer
    now = start
    while now < start + span:
        reading_ms = (now - _UTC_EPOCH) // timedelta(milliseconds=1)
        for pair in pairs:
            broker, consumer = offsets[pair]
            broker += rng.randrange(50)
            consumer = min(broker, consumer + rng.randrange(60))
            offsets[pair] = [broker, consumer]
            yield {
                "ts": now + timedelta(milliseconds=3),
                "level": "info",
                "event": "metrics.lag",
                "group": pair[0],
                "topic": pair[1],
                "queues": 4,
                "broker_offset": broker,
                "consumer_offset": consumer,
                "lag": broker - consumer,
                "reading_ms": reading_ms,
            }
        now += READING_EVERY


def expected_consumer_lag_minute(events: Iterable[Event]) -> dict[tuple[datetime, str, str], dict[str, Any]]:
    """``consumer_lag_minute`` recomputed: key ``(naive UTC minute, group, topic)``."""
    rows: dict[tuple[datetime, str, str], list[Event]] = defaultdict(list)
    for e in events:
        if e["event"] == "metrics.lag":
            ts: datetime = e["ts"].astimezone(UTC).replace(tzinfo=None)
            rows[(ts.replace(second=0, microsecond=0), e["group"], e["topic"])].append(e)
    result = {}
    for key, found in rows.items():
        lags = [e["lag"] for e in found]
        consumer = [e["consumer_offset"] for e in found]
        broker = [e["broker_offset"] for e in found]
        last = max(found, key=lambda e: (e["reading_ms"], e["ts"]))
        result[key] = {
            "readings": len(found),
            "lag_max": max(lags),
            "lag_min": min(lags),
            "lag_last": last["lag"],
            "consumed": max(consumer) - min(consumer),
            "produced": max(broker) - min(broker),
        }
    return result
