"""Streaming job: the per-protocol/minute rollup over a growing directory of JSON-lines logs.

Two Structured Streaming queries share one file source:

* ``rollup_minute`` — :func:`mqproxy.spark_etl.transforms.protocol_minute_rollup` with a watermark on
  ``ts``, appended to ``output/rollup_minute`` (Parquet, partitioned by ``date``, same columns as the
  batch table). A minute is written once, when the watermark (the greatest event time seen minus
  ``watermark``) passes its end; events older than the watermark are dropped, not counted twice.
* ``quarantine`` — malformed lines, appended to ``output/quarantine`` as JSON lines.

Each query keeps its offsets and state under ``checkpoint/<query>``; the Parquet sink commits
through its ``_spark_metadata`` log, so a restart with the same checkpoint neither loses nor
double-counts. Read the output with Spark (``spark.read.parquet``), which honours that log.

Log files must appear atomically (write elsewhere, then rename into the directory); the source is
not recursive.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from mqproxy.spark_etl import request_runs, transforms
from mqproxy.spark_etl.batch import QUARANTINE
from mqproxy.spark_etl.schema import CORRUPT_COLUMN, READ_SCHEMA

__all__ = ["ROLLUP", "StreamQueries", "read_stream", "start_stream"]

ROLLUP = "rollup_minute"


@dataclass(frozen=True, slots=True)
class StreamQueries:
    """The running queries of one streaming job."""

    rollup: StreamingQuery
    quarantine: StreamingQuery

    def await_termination(self, timeout: int | None = None) -> None:
        """Block until both queries stop (``available_now``), or each for ``timeout`` seconds."""
        for query in (self.rollup, self.quarantine):
            if timeout is None:
                query.awaitTermination()
            else:
                query.awaitTermination(int(timeout))

    def stop(self) -> None:
        """Stop both queries; committed output and checkpoints stay consistent."""
        for query in (self.rollup, self.quarantine):
            query.stop()


def read_stream(
    spark: SparkSession, input_path: str, *, max_files_per_trigger: int | None = None
) -> DataFrame:
    """Streaming DataFrame over a directory of JSON-lines files (or one local file's directory,
    filtered to that file's name), read PERMISSIVEly with the explicit schema."""
    reader = (
        spark.readStream.schema(READ_SCHEMA)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
    )
    if max_files_per_trigger is not None:
        reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
    local = Path(input_path)
    if "://" not in input_path and local.is_file():
        reader = reader.option("pathGlobFilter", local.name)
        input_path = str(local.parent)
    return reader.json(input_path)


def _trigger(writer: DataStreamWriter, trigger_seconds: float, available_now: bool) -> DataStreamWriter:
    if available_now:
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=f"{int(trigger_seconds * 1000)} milliseconds")


def start_stream(
    spark: SparkSession,
    input_path: str,
    output: str,
    checkpoint: str,
    *,
    watermark: str = "2 minutes",
    trigger_seconds: float = 5.0,
    available_now: bool = False,
    max_files_per_trigger: int | None = None,
) -> StreamQueries:
    """Start the rollup and quarantine queries and return them (they run in the background).

    ``available_now=True`` processes the files present now, in batches of
    ``max_files_per_trigger``, then stops: a cron-style incremental run.
    """
    if trigger_seconds <= 0:
        raise ValueError(f"trigger_seconds must be > 0, got {trigger_seconds}")
    raw = read_stream(spark, input_path, max_files_per_trigger=max_files_per_trigger)
    events = request_runs.expand(transforms.valid_events(raw)).withWatermark("ts", watermark)
    rollup_writer = (
        transforms.protocol_minute_rollup(events)
        .writeStream.queryName(ROLLUP)
        .format("parquet")
        .outputMode("append")
        .partitionBy("date")
        .option("path", f"{output}/{ROLLUP}")
        .option("checkpointLocation", f"{checkpoint}/{ROLLUP}")
    )
    quarantine_writer = (
        transforms.quarantine(raw)
        .writeStream.queryName(QUARANTINE)
        .format("json")
        .outputMode("append")
        .option("path", f"{output}/{QUARANTINE}")
        .option("checkpointLocation", f"{checkpoint}/{QUARANTINE}")
    )
    rollup = _trigger(rollup_writer, trigger_seconds, available_now).start()
    try:
        quarantine = _trigger(quarantine_writer, trigger_seconds, available_now).start()
    except Exception:
        rollup.stop()
        raise
    return StreamQueries(rollup=rollup, quarantine=quarantine)
