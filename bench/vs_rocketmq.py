"""mqproxy vs Apache RocketMQ 5.3.3, same run: Apache RocketMQ's own benchmark Producer and Consumer,
and per-send latency drivers over remoting and gRPC, each pointed at mqproxy and at a stock RocketMQ.

One invocation starts, on 127.0.0.1 with free ports:

* ``mqproxy serve`` (embedded store in a temp dir, ``store.flush=async``; with ``--flush async,sync`` a
  second one with ``store.flush=sync``);
* a stock Apache RocketMQ 5.3.3 from Maven Central (``scripts/stock_rocketmq.py``): a name server, one
  broker (``ASYNC_FLUSH``; with ``--flush async,sync`` a second broker ``broker-sync`` with
  ``SYNC_FLUSH`` in the same cluster) and RocketMQ's proxy in cluster mode (the gRPC endpoint).

Topics are created up front with ``--queues`` queues on every target: on the stock broker with
``mqadmin updateTopic -b BROKER -r Q -w Q`` (the gRPC topic with ``+message.type=NORMAL``); on mqproxy, which
has no UPDATE_AND_CREATE_TOPIC, by a route look-up with ``store.default_queue_count=Q`` (its documented
auto-create on first use), and the route's queue count is checked on both.

Then, one JVM at a time (never two loads at once; the project's machine has 2 cores), for each case and
each target in turn:

``producer``
    Apache RocketMQ's benchmark Producer (``org.apache.rocketmq.example.benchmark.Producer`` from
    ``rocketmq-example`` 5.5.0, remoting client 5.5.0) ``-n NAMESRV -t TOPIC -w THREADS -s SIZE``, sync
    send, run for warm-up + ``--seconds``, then stopped. Figures are its own: it prints, every second
    after its first 10 s, Send TPS and Average RT over a sliding window of 9 s, Max RT since its start, and
    cumulative Send/Response Failed. TPS and average RT here are the mean of the reports whose window
    starts after the warm-up; max RT and failures are its last report's. It offers no percentiles.
``drain``
    Apache RocketMQ's benchmark Consumer (same jar, push consumer, new group, default 20 threads) drains
    the backlog the producer case left (``produced`` = sum of the queues' max offsets on the broker).
    Its printed TPS is a 10 s window that a drain of a few seconds never fills, so a small wrapper
    (``bench/java/remoting/ConsumerProbe.java``) runs it unchanged in the same JVM and reads its own
    received-message counter every 10 ms: TPS = messages / time from the first to the last one.
``latency``
    ``bench/java/remoting/RemotingSend.java``: one DefaultMQProducer (client 5.5.0, as the benchmark
    Producer) shared by THREADS threads, each sending one SIZE-byte message at a time synchronously; every
    send's latency is recorded: TPS, p50, p99, max, failures (exceptions or a status other than SEND_OK).
    This is where the remoting p50/p99 come from.
``grpc``
    ``bench/java/grpc/GrpcSend.java``: the 5.x gRPC client (rocketmq-client-java 5.2.0), one Producer
    shared by ``--grpc-threads`` threads, synchronous ``send``, per-send latencies; through mqproxy's port
    vs through RocketMQ's proxy (cluster mode, in front of the same stock broker).

Every row also gives the CPU used meanwhile by the server processes (mqproxy; the stock name server and
broker, and RocketMQ's proxy in the gRPC case) and by the client JVM, in cores; the servers' CPU per message
stored (send cases: the topic's max offsets before and after) or delivered (drain), warm-up and background
work included (the servers' CPU at rest is printed once); and the 1-minute load average when the row
started. CPU per message moves far less than msgs/s when other jobs share the machine.
The machine (CPU, cores, memory, Java, Python, versions) and ``uptime`` before and after are printed;
a markdown summary table ends the output. Exit status 1 (and a ``FAILED`` line) if a send failed after
the warm-up, a drain fell short, or a case produced no figures; failures in the warm-up (for the benchmark
Producer, in its first 10 s, which its cumulative counters cannot split further) are shown as ``(+N ...)``:
on a loaded machine the clients' 3 s start-up timeouts (route look-ups of 16 threads at once) expire
against either target.

    python bench/vs_rocketmq.py [--seconds 20] [--warmup 5] [--threads 16] [--size 128] [--queues 8]
        [--grpc-threads 16] [--flush async[,sync]] [--cases producer,drain,latency,grpc] [--keep]
    python bench/vs_rocketmq.py --quick     # the smoke test's sizes: about a minute

Needs Java 17 and Maven (jars fetched once into ``$MQTEST_CACHE``, default ``.cache``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "scripts"))
import stock_rocketmq as rmq  # noqa: E402  (scripts/ is not a package; the launcher is stdlib-only)
from _remoting_client import ProxyProcess, cpu_seconds, peak_rss_kib, start_proxy  # noqa: E402

from mqproxy.codecs.remoting import FrameDecoder, RemotingCommand, encode_command  # noqa: E402
from mqproxy.codecs.remoting_codes import RequestCode  # noqa: E402

JAVA = REPO / "bench" / "java"
EVENTS_JAVA = REPO / "tests" / "e2e" / "java" / "common"
PRODUCER_MAIN = "org.apache.rocketmq.example.benchmark.Producer"
CONSUMER_MAIN = "org.apache.rocketmq.example.benchmark.Consumer"
#: The benchmark Producer's report: a window over its last 10 one-second snapshots (9 s), from 10 s on.
PRODUCER_WINDOW_S = 9
PRODUCER_REPORT = re.compile(
    r"Send TPS: (\d+) \| Max RT\(ms\): (\d+) \| Average RT\(ms\): +([0-9.]+|NaN) \| "
    r"Send Failed: (\d+) \| Response Failed: (\d+)"
)
CLIENT_HEAP_MB = 512
CASES = ("producer", "drain", "latency", "grpc")


# ------------------------------------------------------------------------------------------ targets


@dataclass
class Target:
    """One side of the comparison: where clients are pointed and which processes serve them."""

    name: str  # "mqproxy/async", "rocketmq/sync", ...
    kind: str  # "mqproxy" or "rocketmq"
    flush: str
    namesrv: str
    broker: str  # address that answers GET_MAX_OFFSET for this target's topics
    grpc: str
    pids: Callable[[str], list[int]]  # server processes serving a case
    create_topic: Callable[[str, bool], None]

    def topic(self, case: str) -> str:
        return f"Vs{case.capitalize()}_{self.flush}"


def remoting_request(addr: str, code: int, ext: dict[str, str], timeout: float = 10.0) -> RemotingCommand:
    """One remoting request to ``addr`` (JSON header) and its response."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(encode_command(RemotingCommand(code=code, opaque=1, ext_fields=ext)))
        decoder = FrameDecoder()
        while True:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError(f"{addr} closed the connection")
            for command in decoder.receive_data(data):
                if command.is_response:
                    return command


def route_queue_counts(addr: str, topic: str) -> list[int]:
    """Write-queue counts per broker in the route of ``topic`` (via the name server at ``addr``)."""
    reply = remoting_request(addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    if reply.code != 0:
        raise RuntimeError(f"route of {topic} at {addr}: code {reply.code} {reply.remark}")
    return [int(n) for n in re.findall(rb'"writeQueueNums":(\d+)', reply.body)]


def produced(addr: str, topic: str, queues: int) -> int:
    """Messages stored in ``topic`` on the broker at ``addr``: the sum of its queues' max offsets, read
    until two reads 0.3 s apart agree (the stock broker dispatches to its consume queues asynchronously)."""
    last = -1
    for _ in range(50):
        total = 0
        for queue in range(queues):
            reply = remoting_request(
                addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(queue)}
            )
            if reply.code != 0:
                raise RuntimeError(f"GET_MAX_OFFSET {topic}/{queue} at {addr}: {reply.code} {reply.remark}")
            total += int(reply.ext_fields["offset"])
        if total == last:
            return total
        last = total
        time.sleep(0.3)
    return last


def mqproxy_target(flush: str, root: Path, queues: int) -> tuple[Target, ProxyProcess]:
    proxy = start_proxy(
        root / f"mqproxy-{flush}",
        root / f"mqproxy-{flush}.log",
        flush=flush,
        extra_env={"MQPROXY_STORE_DEFAULT_QUEUE_COUNT": str(queues)},
    )
    addr = f"127.0.0.1:{proxy.port}"

    def create(topic: str, grpc: bool) -> None:
        # mqproxy answers no UPDATE_AND_CREATE_TOPIC; a route look-up creates the topic with
        # store.default_queue_count queues (auto_create_topics, on by default)
        counts = route_queue_counts(addr, topic)
        if counts != [queues]:
            raise RuntimeError(f"mqproxy created {topic} with queues {counts}, not [{queues}]")

    return Target(
        f"mqproxy/{flush}", "mqproxy", flush, addr, addr, addr, lambda case: [proxy.pid], create
    ), proxy


def rocketmq_target(flush: str, cluster: rmq.StockCluster, broker: rmq.Broker, queues: int) -> Target:
    def create(topic: str, grpc: bool) -> None:
        args = ["updateTopic", "-b", broker.addr, "-t", topic, "-r", str(queues), "-w", str(queues)]
        if grpc:
            args += ["-a", "+message.type=NORMAL"]
        for _ in range(3):  # idempotent; on a loaded machine the broker may miss mqadmin's 3 s timeout
            done = cluster.mqadmin(*args, timeout=120)
            if done.returncode == 0 and "success" in done.stdout:
                break
        else:
            raise RuntimeError(
                f"mqadmin updateTopic {topic}: rc {done.returncode}\n{done.stdout}\n{done.stderr}"
            )
        cluster.wait_route(topic)
        counts = route_queue_counts(cluster.namesrv_addr, topic)
        if counts != [queues]:
            raise RuntimeError(f"stock route of {topic} has queues {counts}, not [{queues}]")

    def pids(case: str) -> list[int]:
        # RocketMQ's proxy serves only the gRPC case; the remoting clients talk to the broker directly
        procs = [cluster.namesrv_process, broker.process, cluster.proxy_process if case == "grpc" else None]
        return [p.proc.pid for p in procs if p is not None and p.proc is not None]

    return Target(
        f"rocketmq/{flush}",
        "rocketmq",
        flush,
        cluster.namesrv_addr,
        broker.addr,
        cluster.proxy_grpc_addr if cluster.proxy else "",
        pids,
        create,
    )


# ------------------------------------------------------------------------------------- java clients


@dataclass
class JavaRun:
    """A client JVM's output lines, each with its arrival time (monotonic seconds)."""

    lines: list[tuple[float, str]] = field(default_factory=list)
    returncode: int | None = None
    started: float = 0.0
    elapsed: float = 0.0

    def events(self, name: str) -> list[dict[str, Any]]:
        out = []
        for _, line in self.lines:
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    obj = json.loads(line)
                    if isinstance(obj, dict) and obj.get("event") == name:
                        out.append(obj)
        return out

    def tail(self, n: int = 15) -> str:
        return "\n".join(line for _, line in self.lines[-n:])


class Clients:
    """Class paths, compiled drivers and the JVM command lines of the client side."""

    def __init__(self, home: Path) -> None:
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.bench_cp = rmq.classpath("bench")
        self.grpc_cp = rmq.classpath("grpc-java")
        remoting = rmq.compile_java(
            [JAVA / "remoting", JAVA / "common", EVENTS_JAVA], self.bench_cp, name="vs-rocketmq-remoting"
        )
        grpc = rmq.compile_java(
            [JAVA / "grpc", JAVA / "common", EVENTS_JAVA], self.grpc_cp, name="vs-rocketmq-grpc"
        )
        self.remoting_cp = f"{remoting}{os.pathsep}{self.bench_cp}"
        self.grpc_driver_cp = f"{grpc}{os.pathsep}{self.grpc_cp}"

    def argv(self, cp: str, main: str, args: Sequence[str]) -> list[str]:
        # the same JVM for every target; client logs under home (user.home)
        return rmq.jvm_argv(
            cp,
            main,
            args,
            heap_mb=CLIENT_HEAP_MB,
            home=self.home,
            extra=(f"-Xms{CLIENT_HEAP_MB}m", f"-Drocketmq.client.logRoot={self.home / 'logs'}"),
        )

    def run(
        self,
        name: str,
        argv: list[str],
        *,
        timeout: float,
        stop_after: Callable[[JavaRun], float | None] | None = None,
    ) -> JavaRun:
        """Run one client JVM (own process group) to its end, or until ``stop_after(run)`` returns a
        monotonic deadline that has passed (then SIGTERM); killed after ``timeout`` seconds."""
        run = JavaRun(started=time.monotonic())
        # own process group, and killed with this process if it dies (the launcher's way for its JVMs)
        proc = rmq._popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.home
        )
        assert proc.stdout is not None

        def read() -> None:
            for raw in proc.stdout:  # type: ignore[union-attr]
                run.lines.append((time.monotonic(), raw.decode("utf-8", "replace").rstrip("\n")))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        hard = run.started + timeout
        try:
            while proc.poll() is None:
                deadline = stop_after(run) if stop_after else None
                now = time.monotonic()
                if now > hard or (deadline is not None and now >= deadline):
                    _stop_group(proc)
                    break
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                _stop_group(proc, kill=True)
            run.returncode = proc.wait()
            reader.join(5)
        run.elapsed = time.monotonic() - run.started
        # its output stays in the work directory (kept with --keep or when something failed)
        log = self.home / f"{name.replace('/', '-')}.out"
        log.write_text("".join(f"{at - run.started:9.3f} {line}\n" for at, line in run.lines))
        return run


def _stop_group(proc: subprocess.Popen[bytes], *, kill: bool = False) -> None:
    """SIGTERM (or SIGKILL) the process group we started for one client, SIGKILL after 10 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


# ------------------------------------------------------------------------------------------- cases


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

    @property
    def cpu_per_message_us(self) -> float:
        return self.server_cpu_s / self.messages * 1e6 if self.messages else math.nan


@contextlib.contextmanager
def measured(row: Row, stored_in: tuple[str, int] | None = None) -> Iterator[None]:
    """CPU of the target's server processes and of the client JVM (a waited-for child) over the case;
    with ``stored_in=(topic, queues)`` also the messages stored in that topic meanwhile (warm-up
    included, like the CPU), for the server's CPU per message, which a loaded machine moves far less
    than msgs/s."""
    row.load = os.getloadavg()[0]
    pids = row.target.pids(row.case)
    before = produced(row.target.broker, *stored_in) if stored_in else 0
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
    if stored_in:
        row.messages = produced(row.target.broker, *stored_in) - before


def case_producer(clients: Clients, target: Target, opts: argparse.Namespace) -> Row:
    row = Row("producer", target)
    args = [
        "-n",
        target.namesrv,
        "-t",
        target.topic("producer"),
        "-w",
        str(opts.threads),
        "-s",
        str(opts.size),
        "-ri",
        "1000",
    ]
    # the banner line comes just before its timers start: reports are timed from it
    run_s = opts.warmup + opts.producer_seconds + 0.7

    def stop_after(run: JavaRun) -> float | None:
        if not run.lines:
            return None
        banner = run.lines[0][0]
        if any(PRODUCER_REPORT.search(line) for at, line in run.lines if at - banner >= run_s - 1.5):
            return banner + run_s
        # a loaded machine delays its timer thread: wait up to 10 s more for the last report
        return banner + run_s + 10

    with measured(row, (target.topic("producer"), opts.queues)):
        run = clients.run(
            f"producer-{target.name}",
            clients.argv(clients.remoting_cp, PRODUCER_MAIN, args),
            timeout=run_s + 60,
            stop_after=stop_after,
        )
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


def case_drain(clients: Clients, target: Target, opts: argparse.Namespace) -> Row:
    row = Row("drain", target)
    topic = target.topic("producer")
    backlog = produced(target.broker, topic, opts.queues)
    group = f"vs_drain_{target.flush}_{os.getpid()}"
    args = [
        "--group",
        group,
        "--expect",
        str(backlog),
        "--timeout",
        str(opts.drain_timeout),
        "--",
        "-n",
        target.namesrv,
        "-t",
        topic,
        "-g",
        group,
    ]
    with measured(row):
        run = clients.run(
            f"drain-{target.name}",
            clients.argv(clients.remoting_cp, "mqbench.ConsumerProbe", args),
            timeout=opts.drain_timeout + 60,
        )
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
    row.figures = {"produced": float(backlog), "consumed": float(consumed), "first_s": first_ms / 1e3}
    if done_ms < 0 or backlog == 0:
        row.ok = False
        row.note = f"consumed {consumed} of {backlog} within {opts.drain_timeout:g} s"
        return row
    span = max(done_ms - first_ms, 1.0) / 1e3
    row.figures.update(tps=backlog / span, drain_s=span)
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


def case_latency(clients: Clients, target: Target, opts: argparse.Namespace) -> Row:
    args = [
        "--namesrv",
        target.namesrv,
        "--topic",
        target.topic("latency"),
        "--threads",
        str(opts.threads),
        "--size",
        str(opts.size),
        "--warmup",
        str(opts.warmup),
        "--seconds",
        str(opts.seconds),
    ]
    row = Row("latency", target)
    with measured(row, (target.topic("latency"), opts.queues)):
        run = clients.run(
            f"latency-{target.name}",
            clients.argv(clients.remoting_cp, "mqbench.RemotingSend", args),
            timeout=opts.warmup + opts.seconds + 90,
        )
    return _latency_row(row, run)


def case_grpc(clients: Clients, target: Target, opts: argparse.Namespace) -> Row:
    args = [
        "--endpoints",
        target.grpc,
        "--topic",
        target.topic("grpc"),
        "--threads",
        str(opts.grpc_threads),
        "--size",
        str(opts.size),
        "--warmup",
        str(opts.warmup),
        "--seconds",
        str(opts.seconds),
    ]
    row = Row("grpc", target)
    with measured(row, (target.topic("grpc"), opts.queues)):
        run = clients.run(
            f"grpc-{target.name}",
            clients.argv(clients.grpc_driver_cp, "mqbench.GrpcSend", args),
            timeout=opts.warmup + opts.seconds + 90,
        )
    return _latency_row(row, run)


RUNNERS: dict[str, Callable[[Clients, Target, argparse.Namespace], Row]] = {
    "producer": case_producer,
    "drain": case_drain,
    "latency": case_latency,
    "grpc": case_grpc,
}

TITLES = {
    "producer": "benchmark Producer (-w {threads} -s {size}, sync send): its own reports, mean of the 9 s "
    "windows after the warm-up; max RT over its whole run",
    "drain": "benchmark Consumer (new group, 20 threads) draining the producer case's backlog: its own "
    "counter read every 10 ms",
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
    return f"{name} {body}{tail}{extra}"


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


# ----------------------------------------------------------------------------------------- machine


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        load = os.getloadavg()
        return f"load average: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}"


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


# -------------------------------------------------------------------------------------------- main


def _list(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [p for p in text.split(",") if p]
        bad = [p for p in items if p not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(allowed)}")
        return items

    return parse


def summary_cell(row: Row) -> str:
    """One target's figures of one case, for the markdown table."""
    f = row.figures
    if not f.get("tps"):
        return "FAILED"
    tps = f"{f['tps']:,.0f} msgs/s"
    if row.case == "producer":
        text = f"{tps}, RT avg {_fmt(f['avg_rt_ms'])} ms, max {f['max_rt_ms']:.0f} ms"
    elif row.case == "drain":
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


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per send case")
    parser.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds before each send case")
    parser.add_argument("--threads", type=int, default=16, help="sending threads (benchmark Producer -w)")
    parser.add_argument("--grpc-threads", type=int, default=16, help="sending threads of the gRPC driver")
    parser.add_argument("--size", type=int, default=128, help="message body bytes (benchmark Producer -s)")
    parser.add_argument("--queues", type=int, default=8, help="queues of every topic on every target")
    parser.add_argument(
        "--flush",
        type=_list(("async", "sync")),
        default=["async"],
        help="store flush modes compared: async and/or sync (comma list)",
    )
    parser.add_argument(
        "--cases", type=_list(CASES), default=list(CASES), help="comma list of " + ",".join(CASES)
    )
    parser.add_argument("--drain-timeout", type=float, default=120.0, help="seconds a drain may take at most")
    parser.add_argument("--quick", action="store_true", help="tiny durations for the smoke test")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, stores)")
    opts = parser.parse_args()
    if opts.quick:
        opts.seconds, opts.warmup, opts.drain_timeout = 2.0, 1.0, 60.0
    # the benchmark Producer reports only from its 10th second on, each report covering 9 s
    opts.producer_seconds = max(opts.seconds, PRODUCER_WINDOW_S)
    if "drain" in opts.cases and "producer" not in opts.cases:
        parser.error("the drain case drains the producer case's backlog: add producer to --cases")

    for line in machine():
        print(line, flush=True)
    print(
        f"vs_rocketmq: per send case {opts.warmup:g} s warm-up + {opts.seconds:g} s measured (benchmark "
        f"Producer: {opts.producer_seconds:g} s); {opts.threads} threads ({opts.grpc_threads} gRPC); "
        f"{opts.size} B bodies; {opts.queues} queues per topic; flush {','.join(opts.flush)}; "
        "one JVM load at a time",
        flush=True,
    )
    print(f"uptime before: {_uptime()}", flush=True)
    rows: list[Row] = []
    setup_failed = False
    proxies: list[ProxyProcess] = []
    cluster: rmq.StockCluster | None = None
    tmp = Path(tempfile.mkdtemp(prefix="mqproxy-vs-rocketmq-"))
    try:
        started = time.monotonic()
        clients = Clients(tmp / "clients")
        cluster = rmq.StockCluster(
            tmp / "stock", brokers=1, proxy="cluster" if "grpc" in opts.cases else None
        )
        cluster.start()
        print(f"set-up: stock cluster up after {time.monotonic() - started:.1f} s", flush=True)
        targets: list[Target] = []
        for flush in opts.flush:
            ours, proxy = mqproxy_target(flush, tmp, opts.queues)
            proxies.append(proxy)
            broker = (
                cluster.broker_list[0]
                if flush == "async"
                else cluster.add_broker("broker-sync", flushDiskType="SYNC_FLUSH")
            )
            targets += [ours, rocketmq_target(flush, cluster, broker, opts.queues)]
        # topics up front, on every target alike (mqadmin JVMs side by side: set-up, not measured)
        topic_cases = [c for c in ("producer", "latency", "grpc") if c in opts.cases]
        with ThreadPoolExecutor(max_workers=3) as pool:
            for future in [
                pool.submit(t.create_topic, t.topic(c), c == "grpc") for t in targets for c in topic_cases
            ]:
                future.result()
        print(
            f"set-up: {time.monotonic() - started:.1f} s (stock cluster {cluster.namesrv_addr}, "
            f"mqproxy {', '.join(t.namesrv for t in targets if t.kind == 'mqproxy')}; "
            f"topics with {opts.queues} queues on every target)",
            flush=True,
        )
        print(
            f"server CPU at rest over {IDLE_S:g} s (counted in every row's figures): {idle_cpu(targets)}",
            flush=True,
        )
        for case in opts.cases:
            print(f"\n== {case}: {TITLES[case].format(**vars(opts))}", flush=True)
            for flush in opts.flush:
                pair = [t for t in targets if t.flush == flush]
                for target in pair:
                    row = RUNNERS[case](clients, target, opts)
                    rows.append(row)
                    print(format_row(row), flush=True)
                print(ratio_line(case, flush, rows[-2], rows[-1]), flush=True)
        for flush, proxy in zip(opts.flush, proxies, strict=True):
            print(f"peak RSS mqproxy/{flush} {peak_rss_kib(proxy.pid) / 1024:.1f} MiB (VmHWM)", flush=True)
    except (rmq.LauncherError, RuntimeError) as exc:
        print(f"FAILED: {exc}", flush=True)
        setup_failed = True
    finally:
        for proxy in proxies:
            proxy.stop()
        if cluster is not None:
            cluster.stop()
        failed = [r for r in rows if not r.ok or r.failed]
        if opts.keep or failed or setup_failed:  # logs of every process and client are in there
            print(f"work directory kept: {tmp}", flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if setup_failed:
        return 1
    print(f"uptime after: {_uptime()}", flush=True)
    print("\n" + "\n".join(summary_table(rows, opts.flush, opts.cases)), flush=True)
    for row in failed:
        print(f"FAILED {row.case} {row.target.name}: {row.failed} failed; {row.note}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
