"""Batch job: a file or directory of mqproxy JSON-lines logs -> Parquet tables partitioned by date.

Output layout under ``output`` (each table a Parquet dataset partitioned by ``date``)::

    connections/ requests/ rollup_minute/ ops/ tenants/ top_clients/ negotiation_failures/
    replication/ replication_minute/   the message connector's batches and per-rule minutes
                                       (empty when the logs hold no connector events)
    consumer_lag/ consumer_lag_minute/ the proxy's metrics.lag readings and per group/topic minutes
    message_trace/ message_paths/      the proxy's trace.record events joined to their connections, and
                                       one row per message id (empty when tracing was off)
    quarantine/      malformed lines as JSON lines {"line": ..., "reason": ...}
    _summary.json    counts: input rows, valid events, malformed by reason, rows per table

Re-running over a new day of logs replaces only the partitions (days) present in the new input
(dynamic partition overwrite); other days stay.

The JSON lines are parsed once: :func:`stage_events` narrows the parsed rows to the fields the tables
read plus the quarantine columns, and that frame is cached for every table. With an input cache
directory (:mod:`mqproxy.spark_etl.input_cache`) the staged rows of each file are kept as Parquet
across runs instead, and every table reads its columns from there (no in-memory copy). The first
action (the quarantine write) builds the cache and counts rows and malformed lines by reason in the same pass
(an ``Observation``); each table's row count is an observation on its own write. Each action runs
under a job description ``mqproxy-etl batch: NAME`` (Spark UI, event log).

The writes run as concurrent Spark jobs (:func:`_writers` pool threads; Spark schedules their tasks
on the same cores): one action alone leaves cores idle in its single-task stages and while the
driver plans and commits it. Without an input cache the tables wait for the quarantine write, which
builds the in-memory copy they scan; from the input cache the core tables run beside it. The
optional tables always wait for its counts. Which tables are written, their files and row counts do
not depend on the order the jobs finish in.

The same pass counts the events the optional tables start from (:data:`TABLE_EVENTS`): a table
whose events are absent (no connector, lag or trace events: the common case) is built from an
empty frame of the same schema, so its write scans nothing and runs no shuffle, yet writes exactly
what the full plan would (an empty table of the same schema).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from mqproxy.spark_etl import consumer_lag, input_cache, message_trace, replication, request_runs, transforms
from mqproxy.spark_etl.schema import CORRUPT_COLUMN, READ_SCHEMA, USED_FIELDS

__all__ = [
    "QUARANTINE",
    "SUMMARY_FILE",
    "TABLES",
    "TABLE_EVENTS",
    "BatchSummary",
    "build_tables",
    "read_raw",
    "run_batch",
    "stage_events",
]

QUARANTINE: Final = "quarantine"
SUMMARY_FILE: Final = "_summary.json"

TABLES: Final = (
    "connections",
    "requests",
    "rollup_minute",
    "ops",
    "tenants",
    "top_clients",
    "negotiation_failures",
    "replication",
    "replication_minute",
    "consumer_lag",
    "consumer_lag_minute",
    "message_trace",
    "message_paths",
)
"""Output tables, in the order they are written."""
_LARGE: Final = frozenset(
    {"connections", "requests", "replication", "consumer_lag", "message_trace", "message_paths"}
)
_CONNECTOR_EVENTS: Final = (replication.BATCH, replication.LAG, replication.DEAD_LETTER, replication.ERROR)
TABLE_EVENTS: Final[dict[str, tuple[str, ...]]] = {
    "replication": (replication.BATCH,),
    "replication_minute": _CONNECTOR_EVENTS,
    "consumer_lag": (consumer_lag.LAG,),
    "consumer_lag_minute": (consumer_lag.LAG,),
    "message_trace": (message_trace.TRACE_RECORD,),
    "message_paths": (message_trace.TRACE_RECORD,),
}
"""Optional tables and the events each is built from: every row of the table stems from one of
them, so without any the table is empty (and is built from an empty frame, see the module doc)."""


def build_tables(
    events: DataFrame, *, top_clients: int = 50, absent: frozenset[str] = frozenset()
) -> dict[str, DataFrame]:
    """Every output table (name -> DataFrame) from valid events; nothing is computed yet. Each
    ``request.run`` event is read as the ``request`` events it stands for (:mod:`.request_runs`).

    Tables named in ``absent`` (keys of :data:`TABLE_EVENTS` whose events are known to be missing)
    are built from an empty frame of ``events``' schema instead: the same schema, no rows, no scan.
    """
    tables = _tables(events, top_clients)
    if absent:
        empty = events.sparkSession.createDataFrame([], events.schema)
        for name, table in _tables(empty, top_clients).items():
            if name in absent:
                tables[name] = table
    return tables


def _tables(events: DataFrame, top_clients: int) -> dict[str, DataFrame]:
    events = request_runs.expand(events)  # a request.run row is the requests it stands for
    return {
        "connections": transforms.connections(events),
        "requests": transforms.requests(events),
        "rollup_minute": transforms.protocol_minute_rollup(events),
        "ops": transforms.op_rollup(events),
        "tenants": transforms.tenant_traffic(events),
        "top_clients": transforms.top_clients(events, top_clients),
        "negotiation_failures": transforms.negotiation_failures(events),
        "replication": replication.replication(events),
        "replication_minute": replication.replication_minute_rollup(events),
        "consumer_lag": consumer_lag.consumer_lag(events),
        "consumer_lag_minute": consumer_lag.consumer_lag_minute(events),
        "message_trace": message_trace.message_trace(events),
        "message_paths": message_trace.message_paths(events),
    }


@dataclass(frozen=True, slots=True)
class BatchSummary:
    """What one batch run read and wrote (also written as ``_summary.json``)."""

    input: str
    output: str
    input_rows: int
    valid_events: int
    malformed: int
    malformed_by_reason: dict[str, int] = field(default_factory=dict)
    table_rows: dict[str, int] = field(default_factory=dict)
    input_cache: dict[str, int] | None = None
    """With a cache directory: input files ``reused`` from it, files ``staged`` now and their rows."""


def read_raw(spark: SparkSession, path: str) -> DataFrame:
    """Read JSON lines PERMISSIVEly with the explicit schema; bad lines land in ``_corrupt_record``.

    ``path`` is a file or directory, local or any Hadoop-compatible URI; directories are read
    recursively. Blank lines are skipped by Spark and not counted.
    """
    return (
        spark.read.schema(READ_SCHEMA)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
        .option("recursiveFileLookup", "true")
        .json(path)
    )


_REASON: Final = "_quarantine_reason"
_LINE: Final = "_quarantine_line"


def stage_events(raw: DataFrame) -> DataFrame:
    """What the batch caches: the fields the tables read (``USED_FIELDS``) and, on malformed rows
    only, the quarantine reason and line (null on valid rows).

    Far narrower than ``raw`` (every schema field), so the cache is cheaper to build and to scan.
    The line re-encodes every schema field, so Spark still parses (and type-checks) all of them:
    what counts as malformed is the same as on ``raw``.
    """
    invalid = ~transforms.is_valid()
    return raw.select(
        *USED_FIELDS,
        F.when(invalid, transforms.quarantine_reason()).alias(_REASON),
        F.when(invalid, transforms.quarantine_line()).alias(_LINE),
    )


def _event_in(names: tuple[str, ...]) -> Column:
    return F.col("event").isin(*names)


def _valid(staged: DataFrame) -> DataFrame:
    return staged.where(F.col(_REASON).isNull()).drop(_REASON, _LINE)


def _write_summary(spark: SparkSession, output: str, summary: BatchSummary) -> None:
    text = json.dumps(asdict(summary), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    if "://" not in output or output.startswith("file:"):
        Path(output.removeprefix("file:")).joinpath(SUMMARY_FILE).write_text(text, encoding="utf-8")
        return
    # Remote filesystem: write through Hadoop so any supported URI works.
    jvm: Any = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(f"{output.rstrip('/')}/{SUMMARY_FILE}")
    fs = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())  # type: ignore[attr-defined]
    stream = fs.create(hadoop_path, True)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()


def _stage_file(spark: SparkSession, path: str) -> DataFrame:
    return stage_events(read_raw(spark, path))


def _staged_schema(spark: SparkSession) -> DataFrame:
    return stage_events(spark.createDataFrame([], READ_SCHEMA))


def _writers(spark: SparkSession) -> int:
    """Actions run at once: the default parallelism (local: the core count), at least 2.

    One action alone leaves cores idle (single-task stages, driver-side planning and commits), so
    the tables' writes overlap; Spark schedules the tasks of concurrent jobs on the same cores."""
    return max(2, spark.sparkContext.defaultParallelism)


def _write_quarantine(staged: DataFrame, output: str) -> dict[str, Any]:
    """Write the malformed lines; return the pass's counts: ``rows``, each quarantine reason, and
    ``events_TABLE`` for every optional table. Runs on a pool thread, with its own job description."""
    staged.sparkSession.sparkContext.setJobDescription(f"mqproxy-etl batch: {QUARANTINE}")
    seen = Observation(QUARANTINE)
    reason = F.col(_REASON)
    counted = staged.observe(
        seen,
        F.count(F.lit(1)).alias("rows"),
        *(F.count_if(reason == name).alias(name) for name in transforms.QUARANTINE_REASONS),
        # Counted over every row (a malformed one may name the event): zero means none is valid.
        *(F.count_if(_event_in(names)).alias(f"events_{table}") for table, names in TABLE_EVENTS.items()),
    )
    malformed = counted.where(reason.isNotNull()).select(F.col(_LINE).alias("line"), reason.alias("reason"))
    # repartition, not coalesce: this action also builds the cache, at the scan's parallelism.
    malformed.repartition(1).write.mode("overwrite").json(f"{output}/{QUARANTINE}")
    return dict(seen.get)


def _write_table(table: DataFrame, name: str, output: str) -> int:
    """Write one table partitioned by date; return its row count (an observation on the write
    itself: no second pass). Runs on a pool thread, with its own job description."""
    table.sparkSession.sparkContext.setJobDescription(f"mqproxy-etl batch: {name}")
    observation = Observation(name)
    observed = table.observe(observation, F.count(F.lit(1)).alias("rows"))
    # Small aggregates go to one file per day; large tables keep the input's parallelism.
    out = observed if name in _LARGE else observed.coalesce(1)
    out.write.mode("overwrite").partitionBy("date").parquet(f"{output}/{name}")
    return int(observation.get["rows"])


def run_batch(
    spark: SparkSession,
    input_path: str,
    output: str,
    *,
    top_clients: int = 50,
    cache_dir: str | None = None,
) -> BatchSummary:
    """Run the batch job; return (and write to ``output/_summary.json``) its summary.

    With ``cache_dir`` (local inputs only), each input file is parsed and staged once into a
    Parquet entry there, and later runs over unchanged files read those entries instead of the JSON
    (:mod:`mqproxy.spark_etl.input_cache`; a changed or grown file is staged again). The tables and
    counts are the same either way.
    """
    cache_stats: input_cache.CacheStats | None = None
    if cache_dir is not None and input_cache.cacheable(input_path):
        source, cache_stats = input_cache.staged_input(
            spark, input_path, cache_dir, _stage_file, _staged_schema
        )
    else:
        source = stage_events(read_raw(spark, input_path))
    # From the input cache the staged rows are already columnar: each table reads only its columns
    # from Parquet, which costs less than building an in-memory copy of all of them first.
    cached = cache_stats is None
    staged = source.cache() if cached else source
    try:
        with ThreadPoolExecutor(max_workers=_writers(spark)) as pool:
            seen = pool.submit(_write_quarantine, staged, output)
            if cached:
                # Every table scans the in-memory copy the quarantine write builds: wait for it.
                seen.result()
            # The core tables do not depend on the quarantine pass's counts: they run beside it.
            core = build_tables(_valid(staged), top_clients=top_clients)
            futures = {
                name: pool.submit(_write_table, table, name, output)
                for name, table in core.items()
                if name not in TABLE_EVENTS
            }
            metrics = seen.result()
            absent = frozenset(table for table in TABLE_EVENTS if not metrics[f"events_{table}"])
            optional = build_tables(_valid(staged), top_clients=top_clients, absent=absent)
            futures |= {
                name: pool.submit(_write_table, optional[name], name, output) for name in TABLE_EVENTS
            }
            table_rows = {name: futures[name].result() for name in TABLES}
    finally:
        staged.unpersist()
    input_rows = int(metrics["rows"])
    counts = {name: int(metrics[name]) for name in transforms.QUARANTINE_REASONS if metrics[name]}
    valid = input_rows - sum(counts.values())
    summary = BatchSummary(
        input=input_path,
        output=output,
        input_rows=input_rows,
        valid_events=valid,
        malformed=sum(counts.values()),
        malformed_by_reason=dict(sorted(counts.items())),
        table_rows=table_rows,
        input_cache=None if cache_stats is None else asdict(cache_stats),
    )
    _write_summary(spark, output, summary)
    return summary
