"""Spark fixtures: ONE local SparkSession per pytest process, and a batch run shared by tests."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] session with the fast test JVM flags; skipped when Java is missing."""
    if shutil.which("java") is None:
        pytest.skip("Spark tests need a Java runtime on PATH")
    pytest.importorskip("pyspark", reason="the etl extra is not installed")
    from mqproxy.spark_etl.session import build_session

    # PySpark turns TimestampType values into naive datetimes in the process's local zone: pin it
    # to UTC so collected values compare with the corpus' UTC times.
    os.environ["TZ"] = "UTC"
    time.tzset()
    session = build_session("local[2]", app_name="mqproxy-etl-tests", fast_jvm=True, shuffle_partitions=2)
    yield session
    session.stop()


@dataclass(frozen=True)
class BatchRun:
    """A generated corpus, where its logs are, and the batch job's output and summary."""

    events: list[dict[str, Any]]
    logs: Path
    output: Path
    summary: Any


@pytest.fixture(scope="session")
def batch_run(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> BatchRun:
    """Batch job over a corpus that crosses midnight (two date partitions), spreads over a nested
    directory, carries a gRPC incident at 23:57, clock skew, non-ASCII client ids, a message
    connector copying two rules, lag readings, traced messages, a blank line and the seven MALFORMED_LINES."""
    from mqproxy.spark_etl import synthetic
    from mqproxy.spark_etl.batch import run_batch

    opts = synthetic.CorpusOptions(
        start=datetime(2026, 11, 22, 23, 52, tzinfo=UTC),
        span=timedelta(minutes=12),
        seed=7,
        reject_ratio=0.1,
        skew_ratio=0.05,
        unicode_ratio=0.5,
        incident_after=timedelta(minutes=5),
        connector_rules=2,
        lag_groups=2,
        trace_messages=120,
    )
    events = list(synthetic.iter_events(400, opts))
    root = tmp_path_factory.mktemp("batch")
    logs = root / "logs"
    (logs / "older").mkdir(parents=True)
    half = len(events) // 2
    synthetic.write_jsonl(logs / "proxy-1.log", events[:half], synthetic.MALFORMED_LINES)
    synthetic.write_jsonl(logs / "older" / "proxy-2.log", events[half:])
    with (logs / "older" / "proxy-2.log").open("ab") as out:
        out.write(b"\n")
    (logs / "empty.log").write_bytes(b"")
    output = root / "tables"
    summary = run_batch(spark, str(logs), str(output), top_clients=5)
    return BatchRun(events=events, logs=logs, output=output, summary=summary)
