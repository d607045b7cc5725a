"""The message connector's copy rate and replication delay, mqproxy node → stock RocketMQ broker, beside a
same-run baseline of plain pull + send with the same remoting client.

One invocation starts, on 127.0.0.1 with free ports: an ``mqproxy serve`` node (embedded store, async
flush) as the source and a stock Apache RocketMQ 5.3 cluster (name server, one broker;
``scripts/stock_rocketmq.py``) as the target. Two copiers run in turn, each as its own child process over
the same source topics (4 queues, ``--size`` byte bodies, default 1 KB):

``connector``
    ``mqproxy connect`` with one rule per topic (``start = "earliest"``): origin properties, queue locks,
    progress commits, ``connector.batch`` events, everything it does in production.
``baseline``
    ``bench/_connector_io.py baseline``: per source queue, pull (long poll, up to 128) and send the batch
    to the same target queue with the same cluster client (``mqproxy.connector.client`` over
    ``mqproxy.remoting_client``); nothing else.

First ``--warmup`` messages (default 20,000) are copied by the baseline, unmeasured: whichever copier ran
first would otherwise meet a cold target JVM. Then rows, for each copier:

``backlog``
    ``--backlog`` messages are stored in the source before the copier starts; copy rate = copies / (last
    copy's target store time - first copy's), read back from the target (msg/s and MB/s).
``live``
    While the copier runs, a producer sends ``--rate`` msg/s for ``--seconds`` to the source; delay = the
    copy's target store time - the message's source store time, read back from the target (ms, p50 / p99 /
    max), and the rate the copies were stored at.

Every row also gives the copier process's CPU time per message copied (user + system, from /proc, from
its start-up done to the row's end; µs/msg): on a machine shared with other jobs the rates follow the
load, the CPU per message much less.

Ratios: connector / baseline (backlog rate; live delay p99). The issue's targets, printed as met or below
(they do not set the exit status): copy rate >= 5,000 msg/s and delay p99 <= 1 s. The 1-minute load average
is printed with every row. Exit status 1 (and a ``FAILED`` line) if the set-up failed or a copier did not
copy everything within ``--timeout``.

    python bench/connector.py [--backlog 50000] [--rate 5000] [--seconds 10] [--size 1024] [--warmup 20000]
    python bench/connector.py --quick       # the smoke test's sizes: a few seconds per row

Needs Java 17 and Maven for the stock cluster (jars fetched once into ``$MQTEST_CACHE``, default ``.cache``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "scripts"))
import stock_rocketmq as rmq  # noqa: E402  (scripts/ is not a package; the launcher is stdlib-only)
from _connector_io import SRC_STORE_MS, produce, read_back, stored  # noqa: E402
from _figures import percentile, uptime  # noqa: E402
from _remoting_client import cpu_seconds, start_proxy  # noqa: E402

from mqproxy.connector.origin import ORIGIN_STORE_MS  # noqa: E402

QUEUES = 4
TARGET_RATE = 5000.0
TARGET_P99_MS = 1000.0


@dataclass
class Figures:
    copier: str
    row: str
    copies: int
    expected: int
    rate: float
    delays_ms: list[float]
    load: float
    cpu_s: float

    def line(self, size: int) -> str:
        mb = self.rate * size / 1e6
        head = (
            f"{self.row:8} {self.copier:10} copied {self.copies}/{self.expected}  rate {self.rate:,.0f} msg/s"
        )
        head += f" ({mb:.1f} MB/s)"
        if self.delays_ms:
            p50, p99 = percentile(self.delays_ms, 50), percentile(self.delays_ms, 99)
            head += f"  delay p50 {p50:.0f} ms  p99 {p99:.0f} ms  max {max(self.delays_ms):.0f} ms"
        per = self.cpu_s / self.copies * 1e6 if self.copies else float("nan")
        return head + f"  copier CPU {per:.0f} us/msg  load {self.load:.2f}"


def store_rate(stamps: list[int]) -> float:
    """Copies per second between the first and last target store time."""
    if len(stamps) < 2:
        return float("nan")
    span = (max(stamps) - min(stamps)) / 1000
    return (len(stamps) - 1) / span if span > 0 else float("inf")


class Copier:
    """A copier child process (the connector or the baseline) over the given topics."""

    def __init__(self, kind: str, src: str, dst: str, topics: list[str], work: Path, name: str = "") -> None:
        self.kind = kind
        log = work / f"{name or kind}.log"
        if kind == "connector":
            rules = work / "rules.toml"
            text = f'[connector]\nname = "bench"\n[clusters.src]\nnamesrv = "{src}"\n'
            text += f'[clusters.dst]\nnamesrv = "{dst}"\n'
            for topic in topics:
                text += f'[[rules]]\nsource = "src"\ntarget = "dst"\ntopic = "{topic}"\nstart = "earliest"\n'
            rules.write_text(text)
            argv = [sys.executable, "-m", "mqproxy", "connect", "--config", str(rules)]
        else:
            argv = [sys.executable, str(REPO / "bench" / "_connector_io.py"), "baseline", src, dst, *topics]
        with log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        self.log = log
        self.marker = "connector.started" if kind == "connector" else "baseline.started"

    def wait_ready(self, timeout: float) -> None:
        """Until the copier has started (imports done), so its CPU time counts copying only."""
        deadline = time.monotonic() + timeout
        while self.marker not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise CopyFailed(f"{self.kind} did not start (log {self.log})")
            time.sleep(0.05)

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_copied(dst: str, topic: str, expected: int, timeout: float, copier: Copier) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if copier.proc.poll() is not None:
            print(f"{copier.kind} exited {copier.proc.returncode}; log {copier.log}", flush=True)
            return False
        if trio.run(stored, dst, topic) >= expected:
            return True
        time.sleep(0.2)
    return False


def run_copier(kind: str, src: str, dst: str, opts: argparse.Namespace, work: Path) -> list[Figures]:
    backlog_topic, live_topic = f"Backlog_{kind}", f"Live_{kind}"
    trio.run(produce, src, backlog_topic, QUEUES, opts.backlog, opts.size, None)
    trio.run(produce, src, live_topic, QUEUES, 0, opts.size, None)  # created, empty
    rows: list[Figures] = []
    copier = Copier(kind, src, dst, [backlog_topic, live_topic], work)
    ok = True
    try:
        copier.wait_ready(60)
        load, cpu = os.getloadavg()[0], copier.cpu()
        ok = wait_copied(dst, backlog_topic, opts.backlog, opts.timeout, copier)
        cpu_s = copier.cpu() - cpu
        copies = trio.run(read_back, dst, backlog_topic)
        stamps = [m.store_timestamp_ms for m in copies]
        rows.append(Figures(kind, "backlog", len(copies), opts.backlog, store_rate(stamps), [], load, cpu_s))
        live = int(opts.rate * opts.seconds)
        load, cpu = os.getloadavg()[0], copier.cpu()
        if ok:
            trio.run(produce, src, live_topic, QUEUES, live, opts.size, opts.rate)
            ok = wait_copied(dst, live_topic, live, opts.timeout, copier)
        cpu_s = copier.cpu() - cpu
        copies = trio.run(read_back, dst, live_topic)
        key = ORIGIN_STORE_MS if kind == "connector" else SRC_STORE_MS
        delays = [float(m.store_timestamp_ms - int(m.properties[key])) for m in copies if key in m.properties]
        stamps = [m.store_timestamp_ms for m in copies]
        rows.append(Figures(kind, "live", len(copies), live, store_rate(stamps), delays, load, cpu_s))
    finally:
        copier.stop()
    if not ok:
        raise CopyFailed(f"{kind} did not copy everything within {opts.timeout:g} s (log {copier.log})")
    return rows


class CopyFailed(Exception):
    pass


def warm_up(src: str, dst: str, opts: argparse.Namespace, work: Path) -> float:
    """Copy ``--warmup`` messages with the baseline, unmeasured, so that neither copier meets a cold target
    JVM (JIT) or cold caches; returns the seconds it took."""
    started = time.monotonic()
    trio.run(produce, src, "Warmup", QUEUES, opts.warmup, opts.size, None)
    copier = Copier("baseline", src, dst, ["Warmup"], work, "warmup")
    try:
        if not wait_copied(dst, "Warmup", opts.warmup, opts.timeout, copier):
            raise CopyFailed(f"the warm-up copy did not finish within {opts.timeout:g} s (log {copier.log})")
    finally:
        copier.stop()
    return time.monotonic() - started


def verdict(value: float, target: float, higher: bool) -> str:
    good = value >= target if higher else value <= target
    return "met" if good else "below"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backlog", type=int, default=50000, help="messages stored before a copier starts")
    parser.add_argument("--rate", type=float, default=5000.0, help="live producer rate, msg/s")
    parser.add_argument("--seconds", type=float, default=10.0, help="live producer duration")
    parser.add_argument("--size", type=int, default=1024, help="message body bytes")
    parser.add_argument("--warmup", type=int, default=20000, help="messages copied unmeasured first")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a copy may take at most")
    parser.add_argument("--quick", action="store_true", help="a few seconds per row (the smoke test)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    opts = parser.parse_args()
    if opts.quick:
        opts.backlog, opts.rate, opts.seconds, opts.timeout, opts.warmup = 2000, 500.0, 2.0, 120.0, 500
    return opts


def main() -> int:
    opts = parse_args()
    print(
        f"connector bench: mqproxy node (embedded, async flush) -> stock RocketMQ {rmq.ROCKETMQ_VERSION} "
        f"(name server + 1 broker); {QUEUES} queues; {opts.size} B bodies; backlog {opts.backlog} msgs; "
        f"live {opts.rate:g} msg/s for {opts.seconds:g} s; one copier at a time; {os.cpu_count()} CPUs",
        flush=True,
    )
    print(f"uptime before: {uptime()}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="mqproxy-bench-connector-"))
    stock = rmq.StockCluster(work / "stock", brokers=1)
    node = None
    failed = False
    results: dict[str, list[Figures]] = {}
    try:
        started = time.monotonic()
        (work / "node").mkdir()
        node = start_proxy(work / "node", work / "node.log", flush="async")
        stock.start()
        src, dst = f"127.0.0.1:{node.port}", stock.namesrv_addr
        print(
            f"set-up: {time.monotonic() - started:.1f} s (source {src}, target name server {dst})", flush=True
        )
        print(
            f"warm-up: {opts.warmup} msgs copied by the baseline in {warm_up(src, dst, opts, work):.1f} s "
            "(unmeasured)",
            flush=True,
        )
        for kind in ("baseline", "connector"):
            results[kind] = run_copier(kind, src, dst, opts, work)
            for row in results[kind]:
                print(row.line(opts.size), flush=True)
    except (rmq.LauncherError, CopyFailed, OSError) as exc:
        print(f"FAILED: {exc}", flush=True)
        failed = True
    finally:
        if node is not None:
            node.stop()
        stock.stop()
        if opts.keep or failed:
            print(f"work directory kept: {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if len(results) == 2:
        conn, base = results["connector"], results["baseline"]
        rate_ratio = conn[0].rate / base[0].rate if base[0].rate else float("nan")
        p99 = percentile(conn[1].delays_ms, 99)
        base_p99 = percentile(base[1].delays_ms, 99)
        print(
            f"ratio    connector / baseline: backlog rate {rate_ratio:.2f}x  live delay p99 "
            f"{p99:.0f} ms vs {base_p99:.0f} ms",
            flush=True,
        )
        print(
            f"target   copy rate >= {TARGET_RATE:,.0f} msg/s: {conn[0].rate:,.0f} "
            f"({verdict(conn[0].rate, TARGET_RATE, True)}); delay p99 <= {TARGET_P99_MS:.0f} ms: "
            f"{p99:.0f} ({verdict(p99, TARGET_P99_MS, False)})",
            flush=True,
        )
    print(f"uptime after: {uptime()}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
