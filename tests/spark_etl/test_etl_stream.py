"""Streaming rollup: watermark drops late events, a restart on the same checkpoint neither loses
nor double-counts, and the emitted minutes equal the batch reference for the same events."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from mqproxy.spark_etl import synthetic
from mqproxy.spark_etl.stream import start_stream
from mqproxy.spark_etl.transforms import ROLLUP_METRICS

pytestmark = pytest.mark.spark

START = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
#: The rollup metrics these tests compare with the batch reference.
METRICS = tuple(m for m in ROLLUP_METRICS if m not in ("error_rate", "conn_bytes_in", "conn_bytes_out"))


def _request(ts: datetime, latency: float) -> dict[str, Any]:
    return {
        "ts": ts,
        "level": "info",
        "event": "request",
        "conn_id": "late",
        "protocol": "mqtt",
        "op": "PUBLISH",
        "code": 3,
        "status": "SUCCESS",
        "outcome": "ok",
        "latency_ms": latency,
        "req_bytes": 100,
        "resp_bytes": 4,
        "client_id": "late-ü",
        "client_version": "5.0",
        "group": None,
        "topic": "t",
    }


def _drop_in(
    inbox: Path, staging: Path, name: str, events: list[dict[str, Any]], malformed: tuple[str, ...] = ()
) -> None:
    """Write then rename: the file source needs files to appear atomically."""
    synthetic.write_jsonl(staging / name, events, malformed)
    (staging / name).rename(inbox / name)


def _run(spark: Any, inbox: Path, out: Path, ckpt: Path) -> None:
    queries = start_stream(
        spark,
        str(inbox),
        str(out),
        str(ckpt),
        watermark="2 minutes",
        available_now=True,
        max_files_per_trigger=1,
    )
    queries.await_termination(timeout=120)
    assert not queries.rollup.isActive
    assert queries.rollup.exception() is None


def _rollup(spark: Any, out: Path) -> list[Any]:
    return spark.read.parquet(str(out / "rollup_minute")).collect()


def test_restart_late_events_and_exactly_once(spark: Any, tmp_path: Path) -> None:
    opts = synthetic.CorpusOptions(
        start=START, span=timedelta(minutes=6), seed=11, skew_ratio=0.05, unicode_ratio=0.5
    )
    events = sorted(synthetic.iter_events(120, opts), key=lambda e: e["ts"])
    first = [e for e in events if e["ts"] < START + timedelta(minutes=3)]
    second = [e for e in events if e["ts"] >= START + timedelta(minutes=3)]
    inbox, staging, out, ckpt = (tmp_path / d for d in ("inbox", "staging", "out", "ckpt"))
    inbox.mkdir()
    staging.mkdir()

    _drop_in(inbox, staging, "1.log", first, synthetic.MALFORMED_LINES)
    _run(spark, inbox, out, ckpt)
    _drop_in(inbox, staging, "2.log", second)
    _run(spark, inbox, out, ckpt)  # a restart: offsets and window state come from the checkpoint
    expected = synthetic.expected_minute_rollup(events)
    partial = {(r.minute, r.protocol): {m: r[m] for m in METRICS} for r in _rollup(spark, out)}
    assert partial, "minutes older than the watermark are emitted before the restart"
    assert {k: {m: expected[k][m] for m in METRICS} for k in partial} == partial
    last_minute = max(e["ts"] for e in events).replace(second=0, microsecond=0, tzinfo=None)
    assert max(k[0] for k in partial) < last_minute, "the newest minutes wait for the watermark"

    # Restart on the same checkpoint with: one event far behind the watermark (dropped), one late but
    # within it (counted), and one 20 minutes ahead that moves the watermark past every window above.
    too_late = _request(START + timedelta(seconds=30), 1.0)
    slightly_late = _request(max(e["ts"] for e in events) - timedelta(seconds=50), 2.0)
    # ... and a run of two more requests in that minute, logged as one request.run (expanded by the stream)
    run_of = [
        slightly_late | {"status": "SUCCESS"},
        slightly_late | {"status": "QUOTA_EXCEEDED", "outcome": "error"},
    ]
    run = slightly_late | {
        "event": "request.run",
        "status": None,
        "outcome": None,
        "topic": None,
        "count": 2,
        "errors": 1,
        "statuses": [e["status"] for e in run_of],
        "outcomes": [e["outcome"] for e in run_of],
        "topics": [e["topic"] for e in run_of],
    }
    run = {k: v for k, v in run.items() if v is not None}
    flush = _request(START + timedelta(minutes=20), 3.0)
    _drop_in(inbox, staging, "3.log", [too_late, slightly_late, run, flush])
    _run(spark, inbox, out, ckpt)
    _run(spark, inbox, out, ckpt)  # nothing new: must not write anything again

    rows = _rollup(spark, out)
    keys = Counter((r.minute, r.protocol) for r in rows)
    assert max(keys.values()) == 1, "no minute is written twice"
    got = {(r.minute, r.protocol): {m: r[m] for m in METRICS} for r in rows}
    want = synthetic.expected_minute_rollup([*events, slightly_late, *run_of])
    want = {k: {m: v[m] for m in METRICS} for k, v in want.items()}
    assert got == want
    with_too_late = synthetic.expected_minute_rollup([*events, slightly_late, *run_of, too_late])
    assert (START.replace(tzinfo=None), "mqtt") in with_too_late
    assert got != {k: {m: v[m] for m in METRICS} for k, v in with_too_late.items()}

    quarantined = spark.read.json(str(out / "quarantine")).collect()
    assert Counter(r.reason for r in quarantined) == {"unparseable": 5, "missing_ts": 1, "missing_event": 1}
