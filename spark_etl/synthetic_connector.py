"""Deterministic synthetic ``connector.*`` events: one message connector copying rules between two clusters.

The events follow ``log_event.schema.json`` (``connector.started``, ``connector.queues``,
``connector.batch``, ``connector.lag``, ``connector.dead_letter``, ``connector.error``,
``connector.stopped``). :func:`mqproxy.spark_etl.synthetic.iter_events` appends them to a corpus when
``CorpusOptions.connector_rules`` is set; its ``expected_replication_minute`` is the reference answer.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, Final

__all__ = ["CONNECTOR", "connector_events"]

Event = dict[str, Any]

CONNECTOR: Final = "edge-to-central"
_RULE_TOPICS: Final = ("Orders", "Payments", "Audit", "Telemetry")
_QUEUES: Final = tuple(f"edge-broker-{q % 2}:{q}" for q in range(4))
_UTC_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_LAG_EVERY: Final = timedelta(seconds=10)


def _epoch_ms(ts: datetime) -> int:
    return (ts - _UTC_EPOCH) // timedelta(milliseconds=1)


def _event(ts: datetime, name: str, level: str = "info", **fields: Any) -> Event:
    return {"ts": ts, "level": level, "event": name, "connector": CONNECTOR, **fields}


def _rule_events(
    rng: random.Random, index: int, start: datetime, span: timedelta, error_ratio: float
) -> Iterator[Event]:
    """One rule's events: its queues, a batch every 0.2-3 s, a lag report per queue every 10 s, and
    per batch an ``error_ratio`` chance each of a dead letter and of a retried send error."""
    topic = _RULE_TOPICS[index % len(_RULE_TOPICS)] + (str(index) if index >= len(_RULE_TOPICS) else "")
    rule = f"edge->central:{topic}"
    yield _event(
        start, "connector.queues", rule=rule, owned=len(_QUEUES), acquired=list(_QUEUES), released=[]
    )
    end = start + span
    next_offset = dict.fromkeys(_QUEUES, 0)
    last_copied: dict[str, datetime] = {}
    now = next_lag = start
    while now < end:
        now += timedelta(milliseconds=rng.uniform(200, 3000))
        while next_lag < min(now, end):
            for queue in _QUEUES:
                copied = last_copied.get(queue)
                yield _event(
                    next_lag,
                    "connector.lag",
                    rule=rule,
                    topic=topic,
                    source_queue=queue,
                    lag=rng.randrange(200),
                    last_copied_ms=_epoch_ms(copied) if copied else None,
                )
            next_lag += _LAG_EVERY
        if now >= end:
            break
        queue = rng.choice(_QUEUES)
        messages = rng.randrange(1, 33)
        first = next_offset[queue]
        next_offset[queue] += messages
        last_copied[queue] = now
        delay_min = round(rng.lognormvariate(3.5, 0.6))
        yield _event(
            now,
            "connector.batch",
            rule=rule,
            source="edge",
            target="central",
            topic=topic,
            target_topic=topic,
            source_queue=queue,
            target_queue=queue.replace("edge-", "central-"),
            messages=messages,
            bytes=messages * rng.randrange(100, 2048),
            first_offset=first,
            last_offset=first + messages - 1,
            delay_ms_max=delay_min + rng.randrange(40 * messages),
            delay_ms_min=delay_min,
        )
        if rng.random() < error_ratio:
            yield _event(
                now,
                "connector.dead_letter",
                "warning",
                rule=rule,
                topic=topic,
                source_queue=queue,
                offset=first,
                msg_id=f"{rng.getrandbits(64):016X}",
                reason="13 the message body size over max value",
                dlq_topic=f"%DLQ%{CONNECTOR}",
            )
        if rng.random() < error_ratio:
            yield _event(
                now,
                "connector.error",
                "warning",
                rule=rule,
                cluster="central",
                op="send",
                detail="timeout after 3000 ms",
                retry_in_s=0.5,
            )


def connector_events(
    rules: int, *, start: datetime, span: timedelta, seed: int = 0, error_ratio: float = 0.05
) -> Iterator[Event]:
    """A connector's life over ``[start, start + span]``: started, each rule's events (rule by rule,
    each in time order), one error without a rule (the source's name server), stopped.

    ``ts`` values are aware UTC datetimes, as in :func:`mqproxy.spark_etl.synthetic.iter_events`.
    """
    rng = random.Random(f"connector-{seed}")
    yield _event(start, "connector.started", rules=rules)
    for index in range(rules):
        yield from _rule_events(rng, index, start, span, error_ratio)
    yield _event(
        start + span / 2,
        "connector.error",
        "warning",
        rule=None,
        cluster="edge",
        op="route",
        detail="name server unreachable",
        retry_in_s=2.0,
    )
    yield _event(start + span, "connector.stopped", rules=rules, reason="signal")
