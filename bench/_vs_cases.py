"""The cases of ``bench/vs_rocketmq.py`` (benchmark Producer, drain, remoting and gRPC latency): each runs
one client JVM against one :class:`~_vs_targets.Target` and returns a :class:`Row` of figures, with the
server and client CPU used meanwhile."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from _remoting_client import cpu_seconds
from _schedstat import format_waits, sample, since
from _vs_clients import GATE_TIMEOUT_S, Clients, JavaRun
from _vs_targets import Target, produced

PRODUCER_MAIN = "org.apache.rocketmq.example.benchmark.Producer"
PROBE_MAIN = "mqbench.ConsumerProbe"
#: The benchmark Producer's report: a window over its last 10 one-second snapshots (9 s), from 10 s on.
PRODUCER_WINDOW_S = 9
PRODUCER_REPORT = re.compile(
    r"Send TPS: (\d+) \| Max RT\(ms\): (\d+) \| Average RT\(ms\): +([0-9.]+|NaN) \| "
    r"Send Failed: (\d+) \| Response Failed: (\d+)"
)
CASES = ("producer", "drain", "latency", "grpc")


@dataclass
class Row:
    case: str
    target: Target
    figures: dict[str, float] = field(default_factory=dict)
    failed: int = 0  # after the warm-up: counts against the run (exit status 1)
    early_failed: int = 0  # in the warm-up (the benchmark Producer: in its first 10 s): shown only
    note: str = ""
    ok: bool = True
    server_cores: float = 0.0
    client_cores: float = 0.0
    load: float = 0.0
    server_cpu_s: float = 0.0  # CPU seconds of the server processes over the whole case
    messages: int = 0  # messages they stored (send cases) or delivered (drain) over the whole case
    waits: str = ""  # drain: the server threads' run-queue waits (:mod:`_schedstat`), printed under the row

    @property
    def cpu_per_message_us(self) -> float:
        return self.server_cpu_s / self.messages * 1e6 if self.messages else math.nan


@contextlib.contextmanager
def measuring(row: Row, pids: list[int], stored: Callable[[], int] | None = None) -> Iterator[None]:
    """CPU of the server processes ``pids`` and of the client JVMs (waited-for children) over the block,
    into ``row``; with ``stored`` (a count of messages stored so far) also the messages stored meanwhile
    (warm-up included, like the CPU), for the servers' CPU per message, which a loaded machine moves far
    less than msgs/s."""
    row.load = os.getloadavg()[0]
    before = stored() if stored else 0
    server0 = sum(cpu_seconds(p) for p in pids)
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    try:
        yield
    finally:
        wall = max(time.monotonic() - t0, 1e-9)
        children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        with contextlib.suppress(OSError):
            row.server_cpu_s = sum(cpu_seconds(p) for p in pids) - server0
            row.server_cores = row.server_cpu_s / wall
        row.client_cores = (
            children1.ru_utime + children1.ru_stime - children0.ru_utime - children0.ru_stime
        ) / wall
    if stored:
        row.messages = stored() - before


def measured(row: Row, stored_in: tuple[str, int] | None = None) -> contextlib.AbstractContextManager[None]:
    """:func:`measuring` for ``row.target``'s server processes; ``stored_in=(topic, queues)`` counts the
    messages stored in that topic on the target's broker."""
    broker = row.target.broker
    stored = (lambda: produced(broker, *stored_in)) if stored_in else None
    return measuring(row, row.target.pids(row.case), stored)


def producer_args(namesrv: str, topic: str, opts: argparse.Namespace) -> list[str]:
    """The benchmark Producer's arguments: ``opts.threads`` sync senders of ``opts.size`` B bodies."""
    return ["-n", namesrv, "-t", topic, "-w", str(opts.threads), "-s", str(opts.size), "-ri", "1000"]


def run_producer(
    clients: Clients, label: str, args: list[str], opts: argparse.Namespace, gate: Sequence[str] = ()
) -> JavaRun:
    """One benchmark Producer JVM (held by ``gate``, :meth:`_vs_clients.Clients.argv`), stopped once its
    report for warm-up + ``opts.producer_seconds`` came (the banner line comes just before its timers
    start: reports are timed from it)."""
    run_s = opts.warmup + opts.producer_seconds + 0.7

    def stop_after(run: JavaRun) -> float | None:
        if not run.lines:
            return None
        banner = run.lines[0][0]
        if any(PRODUCER_REPORT.search(line) for at, line in run.lines if at - banner >= run_s - 1.5):
            return banner + run_s
        # a loaded machine delays its timer thread: wait up to 10 s more for the last report
        return banner + run_s + 10

    return clients.run(
        label,
        clients.argv(clients.remoting_cp, PRODUCER_MAIN, args, gate),
        timeout=run_s + 60 + (GATE_TIMEOUT_S if gate else 0),
        stop_after=stop_after,
    )


def case_producer(clients: Clients, target: Target, opts: argparse.Namespace) -> Row:
    row = Row("producer", target)
    args = producer_args(target.namesrv, target.topic("producer"), opts)
    with measured(row, (target.topic("producer"), opts.queues)):
        run = run_producer(clients, f"producer-{target.name}", args, opts)
    return producer_figures(row, run, opts)


def producer_figures(row: Row, run: JavaRun, opts: argparse.Namespace) -> Row:
    """Fill ``row`` from one benchmark Producer's reports: mean TPS and RT of the windows after the
    warm-up, max RT and failures from its last report (``ok`` False, with a note, when there is none)."""
    reports = []
    if run.lines:
        banner = run.lines[0][0]
        for at, line in run.lines:
            match = PRODUCER_REPORT.search(line)
            if match:
                reports.append((at - banner, match))
    if not reports:
        row.ok = False
        row.note = f"no report from the benchmark Producer (rc {run.returncode}):\n{run.tail()}"
        return row
    last = reports[-1][1]

    def failures(m: re.Match[str]) -> int:
        return int(m.group(4)) + int(m.group(5))

    # its counters are cumulative; its first report comes at 10 s, the earliest split it allows
    row.early_failed = failures(reports[0][1])
    row.failed = failures(last) - row.early_failed
    # a report at k s covers [k - 9, k]; keep those whose window starts after the warm-up
    window = [m for at, m in reports if at - PRODUCER_WINDOW_S >= opts.warmup - 0.5]
    if not window:
        row.ok = False
        row.note = f"no report after the warm-up; reports at {[round(at, 1) for at, _ in reports]} s"
        return row
    rts = [float(m.group(3)) for m in window if m.group(3) != "NaN"]
    row.figures = {
        "tps": sum(int(m.group(1)) for m in window) / len(window),
        "avg_rt_ms": sum(rts) / len(rts) if rts else math.nan,
        "max_rt_ms": float(last.group(2)),
        "reports": float(len(window)),
    }
    return row


def probe_args(
    group: str,
    expect: int,
    namesrv: str,
    topic: str,
    timeout: float,
    report_ms: int | None = None,
    trace: Path | None = None,
) -> list[str]:
    """Arguments of ``bench/java/remoting/ConsumerProbe.java``: the benchmark Consumer in a new ``group``
    on ``topic``, until it counted ``expect`` messages or ``timeout`` s passed; with ``report_ms`` it
    prints its count that often (default 1 s); with ``trace`` it times every pull into that file."""
    probe = ["--group", group, "--expect", str(expect), "--timeout", str(timeout)]
    if report_ms is not None:
        probe += ["--report-ms", str(report_ms)]
    if trace is not None:
        probe += ["--trace-pulls", str(trace)]
    return [*probe, "--", "-n", namesrv, "-t", topic, "-g", group]


def py_spy(target: Target, folder: Path | None, name: str) -> subprocess.Popen[bytes] | None:
    """With ``folder``, py-spy sampling an mqproxy ``target`` into ``folder/<name>.txt`` (collapsed stacks,
    idle frames included) until SIGINT; None for a stock target or without ``folder``."""
    if folder is None or target.kind != "mqproxy":
        return None
    folder.mkdir(parents=True, exist_ok=True)
    binary = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    out = folder / f"{name.replace('/', '-')}.txt"
    pid = target.pids("drain")[0]
    argv = [binary, "record", "--pid", str(pid), "--format", "raw", "--rate", "500", "--idle"]
    argv += ["--nonblocking", "-o", str(out)]
    spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # py-spy attaches
    return spy


def drain_counts(targets: Sequence[Target], opts: argparse.Namespace) -> dict[str, int]:
    """Messages each target of a flush mode drains in the drain case: the smallest backlog among them."""
    counts: dict[str, int] = {}
    for target in targets:
        backlog = produced(target.broker, target.topic("producer"), opts.queues)
        counts[target.flush] = min(backlog, counts.get(target.flush, backlog))
    return counts


def case_drain(clients: Clients, target: Target, opts: argparse.Namespace) -> Row:
    row = Row("drain", target)
    topic = target.topic("producer")
    backlog = produced(target.broker, topic, opts.queues)
    # every target of a flush mode drains the same number of messages (the smallest backlog): the client
    # JVM's warm-up (JIT) weighs on a short drain, so unequal counts would not compare
    expect = min(backlog, getattr(opts, "drain_counts", {}).get(target.flush, backlog))
    group = f"vs_drain_{target.flush}_{os.getpid()}"
    folder: Path | None = opts.profile.resolve() if getattr(opts, "profile", None) else None
    trace = folder / f"pulls-{target.name.replace('/', '-')}.txt" if folder else None
    args = probe_args(group, expect, target.namesrv, topic, opts.drain_timeout, trace=trace)
    spy = py_spy(target, folder, f"drain-{target.name}")
    threads0 = sample(target.pids("drain"))
    try:
        with measured(row):
            run = clients.run(
                f"drain-{target.name}",
                clients.argv(clients.remoting_cp, PROBE_MAIN, args),
                timeout=opts.drain_timeout + 60,
            )
        row.waits = format_waits(since(threads0, sample(target.pids("drain"))), top=6)
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
    done = run.events("done")
    if not done:
        row.ok = False
        row.note = (
            f"the benchmark Consumer wrapper ended without a result (rc {run.returncode}):\n{run.tail()}"
        )
        return row
    result = done[-1]
    consumed, first_ms, done_ms = int(result["consumed"]), float(result["first_ms"]), float(result["done_ms"])
    row.failed = int(result["failed"])
    row.messages = consumed
    row.figures = {
        "produced": float(backlog),
        "counted": float(expect),
        "consumed": float(consumed),
        "first_s": first_ms / 1e3,
    }
    if done_ms < 0 or expect == 0:
        row.ok = False
        row.note = f"consumed {consumed} of {expect} within {opts.drain_timeout:g} s"
        return row
    span = max(done_ms - first_ms, 1.0) / 1e3
    row.figures.update(tps=expect / span, drain_s=span)
    return row


def _latency_row(row: Row, run: JavaRun) -> Row:
    done = run.events("done")
    if not done:
        row.ok = False
        row.note = f"the driver ended without a result (rc {run.returncode}):\n{run.tail()}"
        return row
    summary = done[-1]["summary"]
    row.failed, row.early_failed = int(summary["failed"]), int(summary["warmup_failed"])
    row.figures = {k: float(summary[k]) for k in ("tps", "p50_ms", "p99_ms", "max_ms", "mean_ms", "sent")}
    if summary.get("first_error"):
        row.note = f"first error: {summary['first_error']}"
    if not summary["sent"]:
        row.ok = False
    return row


def _send_driver_case(
    clients: Clients,
    target: Target,
    opts: argparse.Namespace,
    case: str,
    driver: tuple[str, str],
    address: tuple[str, str],
    threads: int,
) -> Row:
    """Run one per-send latency driver (``driver`` = (class path, main class)) against ``target``
    (``address`` = (flag, value)) for warm-up + ``--seconds``; its ``done`` event holds the figures."""
    topic = target.topic(case)
    args = [*address, "--topic", topic, "--threads", str(threads), "--size", str(opts.size)]
    args += ["--warmup", str(opts.warmup), "--seconds", str(opts.seconds)]
    row = Row(case, target)
    with measured(row, (topic, opts.queues)):
        run = clients.run(
            f"{case}-{target.name}",
            clients.argv(*driver, args),
            timeout=opts.warmup + opts.seconds + 90,
        )
    return _latency_row(row, run)


def case_latency(clients: Clients, target: Target, opts: argparse.Namespace) -> Row:
    driver = (clients.remoting_cp, "mqbench.RemotingSend")
    address = ("--namesrv", target.namesrv)
    return _send_driver_case(clients, target, opts, "latency", driver, address, opts.threads)


def case_grpc(clients: Clients, target: Target, opts: argparse.Namespace) -> Row:
    driver = (clients.grpc_driver_cp, "mqbench.GrpcSend")
    address = ("--endpoints", target.grpc)
    return _send_driver_case(clients, target, opts, "grpc", driver, address, opts.grpc_threads)


RUNNERS: dict[str, Callable[[Clients, Target, argparse.Namespace], Row]] = {
    "producer": case_producer,
    "drain": case_drain,
    "latency": case_latency,
    "grpc": case_grpc,
}
