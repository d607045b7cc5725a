"""Benchmarks of mqproxy.spark_etl (needs the ``etl`` extra and Java).

* batch: events per second of ``run_batch`` (all seven tables plus quarantine) over N synthetic
  events in 8 JSON-lines files, on ``--master`` (default ``local[2]``). The session is started and
  warmed up with a 2,000-event run first, so the figure is the steady-state job, not JVM start-up.
* stream: end-to-end delay from a log file being renamed into the input directory to the minute it
  closes appearing in the Parquet rollup (its ``_spark_metadata`` commit, i.e. visible to readers).
  Each file holds one minute of events; with ``--watermark 0 seconds`` file k closes minute k-1.
  The delay a production deployment sees adds the event-time wait (window end + watermark).

Usage::

    .venv/bin/python bench/etl.py --events 1000000 --events 10000000
    .venv/bin/python bench/etl.py --events 1000000 --stream-files 10

Prints one JSON object per measurement on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from mqproxy.spark_etl import synthetic
from mqproxy.spark_etl.batch import run_batch
from mqproxy.spark_etl.session import build_session
from mqproxy.spark_etl.stream import ROLLUP, start_stream

FILES = 8


def _events(n: int, seed: int) -> Iterator[dict[str, Any]]:
    """Exactly ``n`` events (the last connection is cut short), over a 60-minute span."""
    opts = synthetic.CorpusOptions(span=timedelta(minutes=60), seed=seed, skew_ratio=0.01, unicode_ratio=0.1)
    produced = 0
    for event in synthetic.iter_events(n, opts):  # n connections is always more than enough
        if produced == n:
            return
        produced += 1
        yield event


def write_corpus(directory: Path, n: int, seed: int = 1) -> float:
    """Write ``n`` events round-robin into ``FILES`` files; return seconds taken."""
    directory.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    outs = [(directory / f"proxy-{i}.log").open("wb", buffering=1 << 20) for i in range(FILES)]
    try:
        for i, event in enumerate(_events(n, seed)):
            outs[i % FILES].write(synthetic.encode(event))
    finally:
        for out in outs:
            out.close()
    return time.perf_counter() - started


def bench_batch(spark: Any, work: Path, n: int) -> dict[str, Any]:
    logs = work / f"logs-{n}"
    gen_s = write_corpus(logs, n)
    size = sum(p.stat().st_size for p in logs.iterdir())
    started = time.perf_counter()
    summary = run_batch(spark, str(logs), str(work / f"tables-{n}"))
    job_s = time.perf_counter() - started
    if summary.valid_events != n:
        raise RuntimeError(f"expected {n} events, the job counted {summary.valid_events}")
    shutil.rmtree(logs)
    return {
        "bench": "batch",
        "events": n,
        "input_mb": round(size / 1e6, 1),
        "generate_s": round(gen_s, 1),
        "job_s": round(job_s, 1),
        "events_per_s": round(n / job_s),
        "table_rows": summary.table_rows,
    }


def _committed_minutes(out: Path) -> int:
    """Number of ``_spark_metadata`` batch logs that list at least one written file."""
    meta = out / ROLLUP / "_spark_metadata"
    if not meta.is_dir():
        return 0
    count = 0
    for entry in meta.iterdir():
        if entry.name.isdigit() or entry.name.endswith(".compact"):
            try:
                lines = entry.read_text(encoding="utf-8").splitlines()
            except OSError:
                continue
            count += sum(1 for line in lines[1:] if line.startswith("{"))
    return count


def bench_stream(
    spark: Any, work: Path, files: int, events_per_file: int, trigger_s: float
) -> dict[str, Any]:
    inbox, staging, out, ckpt = (work / d for d in ("inbox", "staging", "stream-out", "ckpt"))
    for d in (inbox, staging):
        d.mkdir(parents=True)
    base = datetime(2026, 11, 22, 14, 0, tzinfo=UTC)
    queries = start_stream(
        spark, str(inbox), str(out), str(ckpt), watermark="0 seconds", trigger_seconds=trigger_s
    )
    delays: list[float] = []
    try:
        for k in range(files + 1):
            minute = base + timedelta(minutes=k)
            opts = synthetic.CorpusOptions(start=minute, span=timedelta(seconds=50), seed=k, max_requests=4)
            events = [
                e
                for e in synthetic.iter_events(events_per_file, opts)
                if e["ts"] < minute + timedelta(minutes=1)
            ]
            synthetic.write_jsonl(staging / f"{k}.log", events[:events_per_file])
            before = _committed_minutes(out)
            written = time.perf_counter()
            (staging / f"{k}.log").rename(inbox / f"{k}.log")
            if k == 0:
                time.sleep(max(3.0, 4 * trigger_s))  # let the first batch (JIT warm-up) pass
                continue
            deadline = written + 120
            while _committed_minutes(out) <= before:
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"minute {k - 1} never appeared in the rollup")
                time.sleep(0.01)
            delays.append(time.perf_counter() - written)
    finally:
        queries.stop()
    return {
        "bench": "stream",
        "files": files,
        "events_per_file": events_per_file,
        "trigger_s": trigger_s,
        "delay_s_median": round(statistics.median(delays), 2),
        "delay_s_min": round(min(delays), 2),
        "delay_s_max": round(max(delays), 2),
        "delays_s": [round(d, 2) for d in delays],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, action="append", help="batch sizes (default: 1000000)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--stream-files", type=int, default=8, help="0 skips the streaming bench")
    parser.add_argument("--stream-events-per-file", type=int, default=2000)
    parser.add_argument("--trigger-seconds", type=float, default=0.5)
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory")
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="mqproxy-etl-bench-"))
    started = time.perf_counter()
    spark = build_session(args.master, driver_memory=args.driver_memory)
    try:
        print(
            json.dumps({"bench": "session", "start_s": round(time.perf_counter() - started, 1)}), flush=True
        )
        warm = bench_batch(spark, work / "warmup", 2000)
        print(json.dumps(warm | {"bench": "batch-warmup"}), flush=True)
        for n in args.events or [1_000_000]:
            print(json.dumps(bench_batch(spark, work, n)), flush=True)
        if args.stream_files:
            result = bench_stream(
                spark, work, args.stream_files, args.stream_events_per_file, args.trigger_seconds
            )
            print(json.dumps(result), flush=True)
    finally:
        spark.stop()
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(
        json.dumps(
            {
                "bench": "total",
                "wall_s": round(time.perf_counter() - started, 1),
                "cpus": os.cpu_count(),
                "loadavg": os.getloadavg(),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
