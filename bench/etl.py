"""Benchmarks of mqproxy.spark_etl (needs the ``etl`` extra and Java).

* batch: events per second of ``run_batch`` (all eleven tables plus quarantine) over N synthetic
  events in 8 JSON-lines files, on ``--master`` (default ``local[2]``). The session is started and
  warmed up with a 2,000-event run first, so the figure is the steady-state job, not JVM start-up.
  Each run also prints the driver JVM's CPU seconds (``/proc``), GC and JIT time, CPU seconds by
  thread kind (task threads, JIT compiler threads, GC/VM threads, other) and the load average.
  ``--peer`` then times a bare read of the same files (same schema), a count and one Parquet write:
  the floor for any job over them. ``--cache`` gives the job an input cache directory: a filling
  run (``batch-cache-fill``) parses and stages every file, then the warm run(s) (``batch``; ``--repeat
  N`` of them) reuse it. ``--profile`` turns on Spark's event log and prints, per action
  (the batch labels each with a job description), wall time, summed task run and CPU time, and stages.
* stream: end-to-end delay from a log file being renamed into the input directory to the minute it
  closes appearing in the Parquet rollup (its ``_spark_metadata`` commit, i.e. visible to readers).
  Each file holds one minute of events; with ``--watermark 0 seconds`` file k closes minute k-1.
  The delay a production deployment sees adds the event-time wait (window end + watermark).

Usage::

    .venv/bin/python bench/etl.py --events 1000000 --events 10000000
    .venv/bin/python bench/etl.py --events 1000000 --stream-files 10
    .venv/bin/python bench/etl.py --events 1000000 --stream-files 0 --peer --profile
    .venv/bin/python bench/etl.py --events 1000000 --stream-files 0 --peer --cache --repeat 3
    .venv/bin/python bench/etl.py --stream-files 0 --java-opts=-XX:+UseParallelGC --conf spark.x=y

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

from _etl_profile import summarize

from mqproxy.spark_etl import synthetic
from mqproxy.spark_etl.batch import run_batch
from mqproxy.spark_etl.schema import READ_SCHEMA
from mqproxy.spark_etl.session import build_session, log4j_config_path
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


def jvm_cpu_s(spark: Any) -> float:
    """CPU seconds (user + system) the Spark driver JVM has used so far, from ``/proc``."""
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_THREAD_KINDS = (
    ("tasks", ("Executor task",)),
    ("jit", ("C1 CompilerThre", "C2 CompilerThre")),
    ("gc", ("GC Thread", "G1 ", "VM Thread", "VM Periodic")),
)


def jvm_thread_cpu_s(spark: Any) -> dict[str, float]:
    """The driver JVM's CPU seconds so far by thread kind (task threads, JIT compilers, GC and VM
    threads, the rest), from ``/proc/PID/task``. Threads that have ended are no longer counted, so
    only differences over a span without thread exits are exact (the JVM reuses these threads)."""
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    ticks = os.sysconf("SC_CLK_TCK")
    totals = {kind: 0.0 for kind, _ in _THREAD_KINDS} | {"other": 0.0}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / ticks
        kind = next((k for k, prefixes in _THREAD_KINDS if comm.startswith(prefixes)), "other")
        totals[kind] += cpu
    return totals


def jvm_gc_jit_s(spark: Any) -> tuple[float, float]:
    """Seconds the driver JVM has spent in garbage collection (all collectors) and JIT compilation."""
    management = spark.sparkContext._jvm.java.lang.management.ManagementFactory
    gc_ms = sum(max(0, bean.getCollectionTime()) for bean in management.getGarbageCollectorMXBeans())
    return gc_ms / 1000, management.getCompilationMXBean().getTotalCompilationTime() / 1000


def _timed(
    spark: Any,
    n: int,
    started: float,
    cpu_before: float,
    gc_jit: tuple[float, float],
    threads_before: dict[str, float],
) -> dict[str, Any]:
    wall = time.perf_counter() - started
    cpu = jvm_cpu_s(spark) - cpu_before
    gc, jit = jvm_gc_jit_s(spark)
    threads = jvm_thread_cpu_s(spark)
    return {
        "job_s": round(wall, 1),
        "events_per_s": round(n / wall),
        "jvm_cpu_s": round(cpu, 1),
        "events_per_cpu_s": round(n / cpu),
        "gc_s": round(gc - gc_jit[0], 1),
        "jit_s": round(jit - gc_jit[1], 1),
        "thread_cpu_s": {k: round(v - threads_before.get(k, 0.0), 1) for k, v in threads.items()},
        "loadavg": os.getloadavg(),
    }


def bench_peer(spark: Any, logs: Path, out: Path, n: int) -> dict[str, Any]:
    """The floor: a bare read of the same JSON lines (same schema), a count, and one Parquet write."""
    started, cpu, gc_jit = time.perf_counter(), jvm_cpu_s(spark), jvm_gc_jit_s(spark)
    threads = jvm_thread_cpu_s(spark)
    raw = spark.read.schema(READ_SCHEMA).json(str(logs))
    rows = raw.count()
    raw.write.mode("overwrite").parquet(str(out))
    if rows != n:
        raise RuntimeError(f"expected {n} rows, the peer counted {rows}")
    return {"bench": "batch-peer", "events": n} | _timed(spark, n, started, cpu, gc_jit, threads)


def _one_batch(spark: Any, logs: Path, out: Path, n: int, cache_dir: Path | None) -> dict[str, Any]:
    started, cpu, gc_jit = time.perf_counter(), jvm_cpu_s(spark), jvm_gc_jit_s(spark)
    threads = jvm_thread_cpu_s(spark)
    summary = run_batch(spark, str(logs), str(out), cache_dir=None if cache_dir is None else str(cache_dir))
    timed = _timed(spark, n, started, cpu, gc_jit, threads)
    if summary.valid_events != n:
        raise RuntimeError(f"expected {n} events, the job counted {summary.valid_events}")
    return timed | {"table_rows": summary.table_rows, "input_cache": summary.input_cache}


def bench_batch(
    spark: Any, work: Path, n: int, *, peer: bool = False, cache: bool = False, repeat: int = 1
) -> list[dict[str, Any]]:
    """The batch job over ``n`` events; with ``peer``, then :func:`bench_peer` over the same files.

    With ``cache``, the job runs with an input cache directory twice: first with an empty cache
    (``batch-cache-fill``: parses and stages every file), then again over the same files (``batch``:
    the warm run, reading the staged entries). ``repeat`` runs the (warm) batch that many times."""
    logs = work / f"logs-{n}"
    gen_s = write_corpus(logs, n)
    size = sum(p.stat().st_size for p in logs.iterdir())
    head = {"events": n, "input_mb": round(size / 1e6, 1), "generate_s": round(gen_s, 1)}
    cache_dir = work / f"cache-{n}" if cache else None
    results = []
    if cache_dir is not None:
        fill = _one_batch(spark, logs, work / f"tables-{n}", n, cache_dir)
        results.append({"bench": "batch-cache-fill"} | head | fill)
    for _ in range(repeat):
        warm = _one_batch(spark, logs, work / f"tables-{n}", n, cache_dir)
        results.append({"bench": "batch"} | head | warm)
    if peer:
        results.append(bench_peer(spark, logs, work / f"peer-{n}", n))
    shutil.rmtree(logs)
    if cache_dir is not None:
        shutil.rmtree(cache_dir)
    return results


def print_profile(log_dir: Path, after_ms: float) -> None:
    """One JSON line per Spark action since ``after_ms``: wall, task run and CPU time, stages."""
    (log,) = (p for p in log_dir.iterdir() if p.is_file() and not p.name.startswith("."))
    for ex in summarize(log, after_ms=after_ms):
        stages = [
            {
                "stage": s.name.split(" at ")[0],
                "tasks": s.tasks,
                "wall_ms": s.wall_ms,
                "run_ms": s.run_ms,
                "cpu_ms": s.cpu_ms,
                "in_mb": round(s.input_mb, 1),
                "shuffle_w_mb": round(s.shuffle_write_mb, 1),
            }
            for s in ex.stages
        ]
        line = {"bench": "profile", "action": ex.description, "wall_ms": ex.wall_ms}
        print(json.dumps(line | {"run_ms": ex.run_ms, "cpu_ms": ex.cpu_ms, "stages": stages}), flush=True)


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
    parser.add_argument("--peer", action="store_true", help="also time a bare read + count + Parquet write")
    parser.add_argument(
        "--cache", action="store_true", help="batch with an input cache: a filling run, then the warm run"
    )
    parser.add_argument("--repeat", type=int, default=1, help="warm batch runs per size (default: 1)")
    parser.add_argument(
        "--profile", action="store_true", help="Spark event log: print each action's time and stages"
    )
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting (repeatable)"
    )
    parser.add_argument(
        "--java-opts",
        default="",
        help="driver JVM options instead of the session's default GC/JIT flags (the log4j one is kept)",
    )
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="mqproxy-etl-bench-"))
    started = time.perf_counter()
    conf: dict[str, str] = {}
    if args.profile:
        (work / "eventlog").mkdir(parents=True, exist_ok=True)
        conf = {
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": f"file:{work / 'eventlog'}",
            "spark.eventLog.compress": "false",
            "spark.eventLog.rolling.enabled": "false",
        }
    for item in args.conf:
        key, _, value = item.partition("=")
        conf[key] = value
    if args.java_opts:
        log4j = f"-Dlog4j.configurationFile=file:{log4j_config_path()}"
        conf["spark.driver.extraJavaOptions"] = f"{log4j} {args.java_opts}"
    spark = build_session(args.master, driver_memory=args.driver_memory, conf=conf)
    try:
        print(
            json.dumps({"bench": "session", "start_s": round(time.perf_counter() - started, 1)}), flush=True
        )
        for warm in bench_batch(spark, work / "warmup", 2000, cache=args.cache):
            print(json.dumps(warm | {"bench": f"{warm['bench']}-warmup"}), flush=True)
        for n in args.events or [1_000_000]:
            measured_after = time.time() * 1000
            for result in bench_batch(spark, work, n, peer=args.peer, cache=args.cache, repeat=args.repeat):
                print(json.dumps(result), flush=True)
            if args.profile:
                print_profile(work / "eventlog", measured_after)
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
