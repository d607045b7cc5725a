"""``mqproxy-etl``: batch, stream and report commands over mqproxy's JSON-lines logs.

Examples::

    mqproxy-etl batch  --input /var/log/mqproxy --output /data/mqproxy-etl
    mqproxy-etl batch  --input /var/log/mqproxy --output /data/mqproxy-etl --cache-dir /data/etl-cache
    mqproxy-etl stream --input /var/log/mqproxy --output /data/etl-live --checkpoint /data/etl-ckpt
    mqproxy-etl report --input /data/mqproxy-etl --output report.html

Every command accepts ``--master`` (default ``local[*]``; any Spark master URL). Paths may be local
or any Hadoop-compatible URI (the report's HTML is written locally). Exit status: 0 on success,
2 on bad arguments, 1 when the job fails (the error is printed on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from mqproxy.spark_etl.session import DEFAULT_MASTER

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``mqproxy-etl``."""
    parser = argparse.ArgumentParser(prog="mqproxy-etl", description="Spark ETL over mqproxy's JSON logs.")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--master", default=DEFAULT_MASTER, help="Spark master URL (default: %(default)s)")
        p.add_argument("--driver-memory", default="1g", help="spark.driver.memory (default: %(default)s)")

    batch = sub.add_parser("batch", help="logs -> Parquet tables partitioned by date")
    batch.add_argument("--input", required=True, help="log file or directory (local path or Hadoop URI)")
    batch.add_argument("--output", required=True, help="directory for the tables")
    batch.add_argument(
        "--top-clients", type=int, default=50, help="clients kept per day (default: %(default)s)"
    )
    batch.add_argument(
        "--cache-dir",
        default=None,
        help="local directory where each log file is kept parsed (Parquet); later runs reuse it "
        "for files unchanged since (local inputs only)",
    )
    common(batch)

    stream = sub.add_parser("stream", help="per-protocol/minute rollup over a growing log directory")
    stream.add_argument("--input", required=True, help="directory new log files are renamed into")
    stream.add_argument("--output", required=True, help="directory for rollup_minute/ and quarantine/")
    stream.add_argument("--checkpoint", required=True, help="checkpoint directory (keep it across restarts)")
    stream.add_argument("--watermark", default="2 minutes", help="lateness accepted (default: %(default)s)")
    stream.add_argument("--trigger-seconds", type=float, default=5.0, help="micro-batch interval")
    stream.add_argument("--max-files-per-trigger", type=int, default=None)
    stream.add_argument(
        "--available-now", action="store_true", help="process the files present now, then exit"
    )
    common(stream)

    report = sub.add_parser("report", help="HTML report with PNG charts from the tables")
    report.add_argument("--input", required=True, help="directory written by `batch` or `stream`")
    report.add_argument("--output", required=True, type=Path, help="HTML file to write")
    common(report)
    return parser


def _run(args: argparse.Namespace) -> int:
    from pyspark.sql import SparkSession

    from mqproxy.spark_etl.session import build_session

    # Stop the session at the end only if this call created it (an embedding process keeps its own).
    owned = SparkSession.getActiveSession() is None
    spark = build_session(args.master, driver_memory=args.driver_memory)
    try:
        if args.command == "batch":
            from mqproxy.spark_etl.batch import run_batch

            summary = run_batch(
                spark, args.input, args.output, top_clients=args.top_clients, cache_dir=args.cache_dir
            )
            print(json.dumps(asdict(summary), indent=2, ensure_ascii=False))
        elif args.command == "stream":
            from mqproxy.spark_etl.stream import start_stream

            queries = start_stream(
                spark,
                args.input,
                args.output,
                args.checkpoint,
                watermark=args.watermark,
                trigger_seconds=args.trigger_seconds,
                available_now=args.available_now,
                max_files_per_trigger=args.max_files_per_trigger,
            )
            try:
                queries.await_termination()
            except KeyboardInterrupt:
                queries.stop()
        else:
            from mqproxy.spark_etl.report import load_report_data, write_report

            pngs = write_report(load_report_data(spark, args.input), args.output)
            print(f"wrote {args.output} and {len(pngs)} charts in {pngs[0].parent}")
    finally:
        if owned:
            spark.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mqproxy-etl`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    if getattr(args, "top_clients", 1) < 1:
        print("mqproxy-etl: --top-clients must be >= 1", file=sys.stderr)
        return 2
    try:
        return _run(args)
    except Exception as exc:  # a failed job: one line on stderr, not a Py4J stack dump
        first_line = next(iter(str(exc).splitlines()), "")
        print(f"mqproxy-etl {args.command}: {type(exc).__name__}: {first_line}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
