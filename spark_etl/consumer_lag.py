"""Pure DataFrame -> DataFrame transforms over the proxy's ``metrics.lag`` events (consumer lag).

Input is valid events (see :func:`mqproxy.spark_etl.transforms.valid_events`). A ``metrics.lag`` event is one
consumer group/topic pair of one lag reading (every ``metrics.lag_log_interval_s``): the queues' broker
offsets and the group's committed offsets summed, and ``lag`` their difference (``mqadmin consumerProgress``'s
#Diff). As in ``transforms``, nothing here does I/O, every table carries the UTC ``date`` of its event time,
and minutes are tumbling one-minute event-time windows. Logs without lag events give empty tables.

* ``consumer_lag``: one row per event (per reading and pair).
* ``consumer_lag_minute``: per minute, group and topic: how many readings, the lag's max, min and last value
  (of the latest reading in the minute), and how far the committed offsets (``consumed``) and the broker
  offsets (``produced``) moved between the minute's first and last reading.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

__all__ = ["LAG", "LAG_METRICS", "consumer_lag", "consumer_lag_minute"]

LAG: Final = "metrics.lag"

#: The metric columns of :func:`consumer_lag_minute`, in table order (after date, minute, group, topic).
LAG_METRICS: Final = ("readings", "lag_max", "lag_min", "lag_last", "consumed", "produced")


def consumer_lag(events: DataFrame) -> DataFrame:
    """One row per ``metrics.lag`` event.

    Columns: ``date, ts, reading_at (the reading's time), group, topic, queues, broker_offset,
    consumer_offset, lag``.
    """
    return events.where(F.col("event") == LAG).select(
        F.to_date("ts").alias("date"),
        "ts",
        F.timestamp_millis(F.col("reading_ms")).alias("reading_at"),
        "group",
        "topic",
        "queues",
        "broker_offset",
        "consumer_offset",
        "lag",
    )


def consumer_lag_minute(events: DataFrame) -> DataFrame:
    """Per one-minute event-time window, group and topic.

    Columns: ``date, minute, group, topic, readings, lag_max, lag_min, lag_last, consumed, produced``
    (``consumed``/``produced``: max minus min of the summed consumer/broker offsets within the minute; 0
    with one reading).
    """
    rolled = (
        events.where(F.col("event") == LAG)
        .groupBy(F.window("ts", "1 minute").alias("window"), "group", "topic")
        .agg(
            F.count(F.lit(1)).alias("readings"),
            F.max("lag").alias("lag_max"),
            F.min("lag").alias("lag_min"),
            F.max_by("lag", F.struct("reading_ms", "ts")).alias("lag_last"),
            (F.max("consumer_offset") - F.min("consumer_offset")).alias("consumed"),
            (F.max("broker_offset") - F.min("broker_offset")).alias("produced"),
        )
    )
    return rolled.select(
        F.to_date(F.col("window.start")).alias("date"),
        F.col("window.start").alias("minute"),
        "group",
        "topic",
        *LAG_METRICS,
    )
