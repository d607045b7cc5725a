"""The driver-side data of the traffic report: the small aggregate tables of a batch (or streaming) run,
collected from Parquet with timestamps in UTC.

:func:`load_report_data` raises ``FileNotFoundError`` when both ``rollup_minute`` and
``replication_minute`` are missing or empty (the logs of a ``mqproxy connect`` process alone have only
the latter); any other table that is missing or empty becomes an empty list (its report section is left
out).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import TimestampType

from mqproxy.spark_etl.batch import SUMMARY_FILE

__all__ = ["ReportData", "Row", "load_report_data"]

Row = dict[str, Any]

_EPOCH: Final = datetime(1970, 1, 1)


@dataclass(slots=True)
class ReportData:
    """Driver-side rows of the tables the report shows (each a list of plain dicts)."""

    rollup: list[Row]
    top_clients: list[Row] = field(default_factory=list)
    negotiation_failures: list[Row] = field(default_factory=list)
    ops: list[Row] = field(default_factory=list)
    tenants: list[Row] = field(default_factory=list)
    replication: list[Row] = field(default_factory=list)
    """``replication_minute`` rows, by minute, connector and rule."""
    consumer_lag: list[Row] = field(default_factory=list)
    """``consumer_lag_minute`` rows, by minute, group and topic."""
    message_paths: list[Row] = field(default_factory=list)
    """``message_paths`` summed per producer protocol and consumer protocol (see :func:`_path_rows`)."""
    summary: dict[str, Any] | None = None

    @property
    def protocols(self) -> list[str]:
        """Protocols by descending request count."""
        totals: dict[str, int] = defaultdict(int)
        for row in self.rollup:
            totals[row["protocol"]] += row["requests"] + row["connections_opened"]
        return sorted(totals, key=lambda p: (-totals[p], p))

    @property
    def rules(self) -> list[tuple[str, str]]:
        """``(connector, rule)`` pairs that copied messages, by descending message count."""
        totals: dict[tuple[str, str], int] = defaultdict(int)
        for row in self.replication:
            if row["batches"]:
                totals[(row["connector"], row["rule"])] += row["messages"]
        return sorted(totals, key=lambda k: (-totals[k], k))


def _rows(spark: SparkSession, path: str, order: Sequence[Any], limit: int | None = None) -> list[Row]:
    try:
        df = spark.read.parquet(path)
    except AnalysisException:
        return []
    df = df.orderBy(*order)
    if limit is not None:
        df = df.limit(limit)
    # Collect timestamps as epoch microseconds: PySpark would convert them to the Python process's
    # local zone, and the report is in UTC.
    stamps = {f.name for f in df.schema.fields if isinstance(f.dataType, TimestampType)}
    df = df.select(*[F.unix_micros(c).alias(c) if c in stamps else F.col(c) for c in df.columns])
    rows = []
    for row in df.collect():
        values = row.asDict()
        for name in stamps:
            if values[name] is not None:
                values[name] = _EPOCH + timedelta(microseconds=values[name])
        rows.append(values)
    return rows


def _path_rows(spark: SparkSession, path: str) -> list[Row]:
    """``message_paths`` per ``(producer_protocol, consumer_protocol)``: distinct messages, and the p50 and
    max of their first-delivery delay (ms); a message nobody was handed counts under consumer ``(none)``,
    one without a Pub in the logs under producer ``(unknown)``. By descending messages."""
    try:
        df = spark.read.parquet(path)
    except AnalysisException:
        return []
    pairs = df.select(
        "msg_id",
        F.coalesce("producer_protocol", F.lit("(unknown)")).alias("producer_protocol"),
        F.explode_outer(F.transform("consumers", lambda c: c["protocol"])).alias("consumer_protocol"),
        "first_delivery_ms",
    )
    rolled = pairs.groupBy(
        "producer_protocol", F.coalesce("consumer_protocol", F.lit("(none)")).alias("consumer_protocol")
    ).agg(
        F.countDistinct("msg_id").alias("messages"),
        F.percentile_approx("first_delivery_ms", 0.5, 10_000).alias("first_delivery_p50"),
        F.max("first_delivery_ms").alias("first_delivery_max"),
    )
    ordered = rolled.orderBy(F.col("messages").desc(), "producer_protocol", "consumer_protocol")
    return [row.asDict() for row in ordered.collect()]


def _read_summary(tables_dir: str) -> dict[str, Any] | None:
    path = Path(tables_dir.removeprefix("file:")) / SUMMARY_FILE
    if "://" in tables_dir and not tables_dir.startswith("file:"):
        return None
    try:
        summary: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return summary


def load_report_data(spark: SparkSession, tables_dir: str, *, top: int = 10) -> ReportData:
    """Collect what the report needs from the Parquet tables under ``tables_dir``.

    Raises ``FileNotFoundError`` when neither ``rollup_minute`` nor ``replication_minute`` has rows.
    """
    rollup = _rows(spark, f"{tables_dir}/rollup_minute", ["minute", "protocol"])
    replication = _rows(spark, f"{tables_dir}/replication_minute", ["minute", "connector", "rule"])
    if not rollup and not replication:
        raise FileNotFoundError(f"no rollup_minute or replication_minute table with rows under {tables_dir}")
    return ReportData(
        rollup=rollup,
        top_clients=_rows(spark, f"{tables_dir}/top_clients", ["date", "rank"]),
        negotiation_failures=_rows(
            spark, f"{tables_dir}/negotiation_failures", [F.col("failures").desc(), "reason"]
        ),
        ops=_rows(spark, f"{tables_dir}/ops", [F.col("latency_p99").desc_nulls_last(), "op"]),
        tenants=_rows(spark, f"{tables_dir}/tenants", [F.col("bytes").desc(), "tenant"], top * 5),
        replication=replication,
        consumer_lag=_rows(spark, f"{tables_dir}/consumer_lag_minute", ["minute", "group", "topic"]),
        message_paths=_path_rows(spark, f"{tables_dir}/message_paths"),
        summary=_read_summary(tables_dir),
    )
