"""Pure DataFrame -> DataFrame transforms over the message connector's ``connector.*`` events.

Input is valid events (see :func:`mqproxy.spark_etl.transforms.valid_events`). As in ``transforms``,
nothing here does I/O, every output table carries the UTC ``date`` of its event time, and minutes
are tumbling one-minute event-time windows, so :func:`replication_minute_rollup` also runs in
Structured Streaming (with a watermark on ``ts``). Logs without connector events give empty tables.

* **Delay** of a batch is ``delay_ms_max`` of its ``connector.batch`` event: the ack time at the
  connector minus the oldest source store time in the batch, i.e. the batch's worst message.
  Minute percentiles are over batches (not messages), nearest-rank like the latency percentiles.
* **Rule** is the event's ``rule``; a ``connector.error`` not tied to one rule (``rule`` null) is
  counted under ``"(unknown)"``, as are events that lack the connector name.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from mqproxy.spark_etl.transforms import PERCENTILE_ACCURACY, PERCENTILES, UNKNOWN

__all__ = [
    "BATCH",
    "DEAD_LETTER",
    "ERROR",
    "LAG",
    "REPLICATION_METRICS",
    "replication",
    "replication_minute_rollup",
]

BATCH: Final = "connector.batch"
LAG: Final = "connector.lag"
DEAD_LETTER: Final = "connector.dead_letter"
ERROR: Final = "connector.error"

#: The metric columns of :func:`replication_minute_rollup`, in table order (after date, minute,
#: connector, rule).
REPLICATION_METRICS: Final = (
    "batches",
    "messages",
    "bytes",
    *(f"delay_p{round(q * 100)}" for q in PERCENTILES),
    "delay_max",
    "dead_letters",
    "errors",
    "lag_max",
    "last_copied_at",
)


def _on(event: str, column: str) -> Column:
    """``column`` on rows of ``event``, null elsewhere (for conditional aggregates)."""
    return F.when(F.col("event") == event, F.col(column))


def _known(column: str) -> Column:
    return F.coalesce(F.col(column), F.lit(UNKNOWN))


def replication(events: DataFrame) -> DataFrame:
    """One row per ``connector.batch`` event (a batch written to the target and acknowledged).

    Columns: ``date, ts, connector, rule, source, target, topic, target_topic, source_queue,
    target_queue, messages, bytes, first_offset, last_offset, delay_ms_max, delay_ms_min``.
    """
    return events.where(F.col("event") == BATCH).select(
        F.to_date("ts").alias("date"),
        "ts",
        _known("connector").alias("connector"),
        _known("rule").alias("rule"),
        "source",
        "target",
        "topic",
        "target_topic",
        "source_queue",
        "target_queue",
        "messages",
        "bytes",
        "first_offset",
        "last_offset",
        "delay_ms_max",
        "delay_ms_min",
    )


def replication_minute_rollup(events: DataFrame) -> DataFrame:
    """Per connector, rule and one-minute event-time window: what was copied, how late, what failed.

    Columns: ``date, minute, connector, rule, batches, messages, bytes, delay_p50/p95/p99 (ms, over
    the batches' delay_ms_max), delay_max (ms), dead_letters (connector.dead_letter events),
    errors (connector.error events), lag_max (the largest lag one source queue reported in
    connector.lag), last_copied_at (the latest last_copied_ms reported, as a timestamp)``.

    A minute where a rule only reported lag (copying stalled) has ``batches = 0`` and null delays.
    """
    relevant = events.where(F.col("event").isin(BATCH, LAG, DEAD_LETTER, ERROR))
    delays = F.percentile_approx(_on(BATCH, "delay_ms_max"), list(PERCENTILES), PERCENTILE_ACCURACY)
    rolled = relevant.groupBy(
        F.window("ts", "1 minute").alias("window"),
        _known("connector").alias("connector"),
        _known("rule").alias("rule"),
    ).agg(
        F.count(_on(BATCH, "event")).alias("batches"),
        F.coalesce(F.sum(_on(BATCH, "messages")), F.lit(0)).alias("messages"),
        F.coalesce(F.sum(_on(BATCH, "bytes")), F.lit(0)).alias("bytes"),
        *(delays[i].alias(f"delay_p{round(q * 100)}") for i, q in enumerate(PERCENTILES)),
        F.max(_on(BATCH, "delay_ms_max")).alias("delay_max"),
        F.count(_on(DEAD_LETTER, "event")).alias("dead_letters"),
        F.count(_on(ERROR, "event")).alias("errors"),
        F.max(_on(LAG, "lag")).alias("lag_max"),
        F.timestamp_millis(F.max(_on(LAG, "last_copied_ms"))).alias("last_copied_at"),
    )
    return rolled.select(
        F.to_date(F.col("window.start")).alias("date"),
        F.col("window.start").alias("minute"),
        "connector",
        "rule",
        *REPLICATION_METRICS,
    )
