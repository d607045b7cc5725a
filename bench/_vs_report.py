"""What ``bench/vs_rocketmq.py`` prints: case titles, one line per row, mqproxy/RocketMQ ratios, the
servers' CPU at rest, the machine, and the closing markdown table."""

from __future__ import annotations

import contextlib
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import stock_rocketmq as rmq
from _remoting_client import cpu_seconds
from _vs_cases import Row
from _vs_targets import Target

REPO = Path(__file__).resolve().parents[1]


TITLES = {
    "producer": "benchmark Producer (-w {threads} -s {size}, sync send): its own reports, mean of the 9 s "
    "windows after the warm-up; max RT over its whole run",
    "drain": "benchmark Consumer (new group, 20 threads) draining the producer case's backlog: its own "
    "counter read every 10 ms; TPS over the first N messages, N the smallest backlog of the targets",
    "latency": "remoting DefaultMQProducer (client 5.5.0), {threads} threads, {size} B, sync send: per-send "
    "latencies (bench/java/remoting/RemotingSend.java)",
    "grpc": "gRPC rocketmq-client-java 5.2.0 Producer, {grpc_threads} threads, {size} B, sync send: per-send "
    "latencies (bench/java/grpc/GrpcSend.java); rocketmq = through RocketMQ's proxy (cluster mode)",
}


def _fmt(value: float, digits: int = 2) -> str:
    return "nan" if value != value else f"{value:.{digits}f}"


def format_row(row: Row) -> str:
    f = row.figures
    name = f"{row.case:8} {row.target.name:15}"
    early = ""
    if row.early_failed:
        early = (
            f" (+{row.early_failed} {'in its first 10 s' if row.case == 'producer' else 'in the warm-up'})"
        )
    per_msg = _fmt(row.cpu_per_message_us, 0)
    tail = (
        f"  failed {row.failed}{early}  server {row.server_cores:.2f} cores, {per_msg} us/msg"
        f"  client {row.client_cores:.2f} cores  load {row.load:.2f}"
    )
    if not row.ok and not f.get("tps"):
        return f"{name} FAILED {row.note}"
    if row.case == "producer":
        body = (
            f"TPS {f['tps']:8.0f} msgs/s  RT avg {_fmt(f['avg_rt_ms'])} ms  max {f['max_rt_ms']:.0f} ms"
            f"  reports {f['reports']:.0f}"
        )
    elif row.case == "drain":
        if "counted" in f:  # timed over the first N messages (bench/vs_rocketmq.py)
            body = (
                f"TPS {f['tps']:8.0f} msgs/s  produced {f['produced']:.0f}  counted {f['counted']:.0f}"
                f"  consumed {f['consumed']:.0f}  first {f['counted']:.0f} in {f['drain_s']:.2f} s"
                f"  first after {f['first_s']:.2f} s"
            )
        else:  # the whole backlog (bench/cluster.py)
            body = (
                f"TPS {f['tps']:8.0f} msgs/s  produced {f['produced']:.0f}  consumed {f['consumed']:.0f}"
                f"  drained in {f['drain_s']:.2f} s  first after {f['first_s']:.2f} s"
            )
    else:
        body = (
            f"TPS {f['tps']:8.0f} msgs/s  p50 {_fmt(f['p50_ms'])} ms  p99 {_fmt(f['p99_ms'])} ms"
            f"  max {_fmt(f['max_ms'], 1)} ms  sent {f['sent']:.0f}"
        )
    extra = f"  ({row.note})" if row.note else ""
    waits = f"\n         server threads (run-queue waits): {row.waits}" if row.waits else ""
    return f"{name} {body}{tail}{extra}{waits}"


def ratio_line(case: str, flush: str, ours: Row, theirs: Row) -> str:
    def ratio(key: str) -> str:
        a, b = ours.figures.get(key, math.nan), theirs.figures.get(key, math.nan)
        return f"{a / b:.2f}" if b and a == a and b == b else "nan"

    a, b = ours.cpu_per_message_us, theirs.cpu_per_message_us
    cpu = f"  server CPU/msg {a / b:.2f}" if a == a and b == b and b else ""

    if case == "producer":
        parts = f"TPS {ratio('tps')}  RT avg {ratio('avg_rt_ms')}"
    elif case == "drain":
        parts = f"TPS {ratio('tps')}"
    else:
        parts = f"TPS {ratio('tps')}  p50 {ratio('p50_ms')}  p99 {ratio('p99_ms')}"
    return f"ratio    {case} {flush:6} mqproxy/rocketmq  {parts}{cpu}"


IDLE_S = 3.0


def idle_cpu(targets: list[Target]) -> str:
    """Each target's server CPU with no client at all (the stock JVMs' background threads, mostly)."""
    before = {t.name: sum(cpu_seconds(p) for p in t.pids("grpc")) for t in targets}
    time.sleep(IDLE_S)
    parts = []
    for t in targets:
        cores = (sum(cpu_seconds(p) for p in t.pids("grpc")) - before[t.name]) / IDLE_S
        parts.append(f"{t.name} {cores:.3f} cores")
    return ", ".join(parts)


def machine() -> list[str]:
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with contextlib.suppress(OSError, ValueError, IndexError):
        kib = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
        mem = f"{kib / 1024 / 1024:.1f} GiB"
    java = subprocess.run([rmq.java_executable(), "-version"], capture_output=True, text=True, check=False)
    java_line = (java.stderr.strip().splitlines() or ["?"])[0]
    commit = (
        subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        or "?"
    )
    return [
        f"machine: {os.cpu_count()} cores ({model}), {mem} RAM, {platform.system()} {platform.release()}",
        f"software: {java_line}; Python {sys.version.split()[0]}; mqproxy {commit}; Apache RocketMQ "
        f"{rmq.ROCKETMQ_VERSION} (name server, broker, proxy); benchmark tools rocketmq-example 5.5.0; "
        f"gRPC client rocketmq-client-java 5.2.0",
    ]


def summary_cell(row: Row) -> str:
    """One target's figures of one case, for the markdown table."""
    f = row.figures
    if not f.get("tps"):
        return "FAILED"
    tps = f"{f['tps']:,.0f} msgs/s"
    if row.case == "producer":
        text = f"{tps}, RT avg {_fmt(f['avg_rt_ms'])} ms, max {f['max_rt_ms']:.0f} ms"
    elif row.case == "drain":
        if "counted" in f:
            text = f"{tps} (first {f['counted']:,.0f} of {f['produced']:,.0f})"
        else:
            text = f"{tps} ({f['consumed']:,.0f} of {f['produced']:,.0f})"
    else:
        text = f"{tps}, p50 {_fmt(f['p50_ms'])} ms, p99 {_fmt(f['p99_ms'])} ms"
    if row.failed or row.early_failed:
        text += f", {row.failed} failed" + (f" (+{row.early_failed} early)" if row.early_failed else "")
    if row.messages:
        text += f"; server {row.cpu_per_message_us:,.0f} µs CPU/msg"
    return text


def summary_table(rows: list[Row], flushes: list[str], cases: list[str]) -> list[str]:
    """The figures as a markdown table (one column per target, plus the TPS ratio)."""
    out: list[str] = []
    for flush in flushes:
        if out:
            out.append("")
        out.append(
            f"| case ({flush} flush) | mqproxy | RocketMQ {rmq.ROCKETMQ_VERSION} | TPS mqproxy / RocketMQ |"
        )
        out.append("|---|---|---|---|")
        for case in cases:
            by_kind = {r.target.kind: r for r in rows if r.case == case and r.target.flush == flush}
            ours, theirs = by_kind.get("mqproxy"), by_kind.get("rocketmq")
            if ours is None or theirs is None:
                continue
            a, b = ours.figures.get("tps"), theirs.figures.get("tps")
            ratio = f"{a / b:.2f}" if a and b else "-"
            out.append(f"| {case} | {summary_cell(ours)} | {summary_cell(theirs)} | {ratio} |")
    return out
