"""mqproxy vs Apache RocketMQ 5.3.3, same run: Apache RocketMQ's own benchmark Producer and Consumer,
and per-send latency drivers over remoting and gRPC, each pointed at mqproxy and at a stock RocketMQ.

One invocation starts, on 127.0.0.1 with free ports:

* ``mqproxy serve`` (embedded store in a temp dir, ``store.flush=async``; with ``--flush async,sync`` a
  second one with ``store.flush=sync``);
* a stock Apache RocketMQ 5.3.3 from Maven Central (``scripts/stock_rocketmq.py``): a name server, one
  broker (``ASYNC_FLUSH``; with ``--flush async,sync`` a second broker ``broker-sync`` with
  ``SYNC_FLUSH`` in the same cluster) and RocketMQ's proxy in cluster mode (the gRPC endpoint).

Topics are created up front with ``--queues`` queues on every target: on the stock broker with
``mqadmin updateTopic -b BROKER -r Q -w Q`` (the gRPC topic with ``+message.type=NORMAL``); on mqproxy by a
route look-up with ``store.default_queue_count=Q`` (its documented auto-create on first use), and the
route's queue count is checked on both.

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
    received-message counter every 10 ms: TPS = N / time from the first message to the N-th, N
    the smallest backlog of the targets (a short drain is mostly the client JVM's warm-up: unequal
    backlogs would not compare).
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

Profiling: ``--jfr DIR`` records every client JVM with Java Flight Recorder (``DIR/<case>-<target>.jfr``,
settings ``profile``; read them with ``jfr summary`` / ``jfr print``); ``--profile DIR`` samples mqproxy with
py-spy during each drain (``DIR/drain-<target>.txt``, collapsed stacks, idle frames included) and has the
Consumer wrapper time every PULL_MESSAGE as the client sees it (``bench/java/remoting/PullTrace.java``:
``DIR/pulls-<target>.txt``, one line per request written and per callback started, with queue, offset,
opaque and answer; the first FOUND answer's header and body apart, to compare targets byte for byte).

    python bench/vs_rocketmq.py [--seconds 20] [--warmup 5] [--threads 16] [--size 128] [--queues 8]
        [--grpc-threads 16] [--flush async[,sync]] [--cases producer,drain,latency,grpc] [--keep]
        [--jfr DIR] [--profile DIR] [--server NAME=PYTHON ...]
    python bench/vs_rocketmq.py --quick     # the smoke test's sizes: about a minute

Same-run build comparison: ``--server NAME=PYTHON`` (repeatable) adds an mqproxy run by another
checkout's interpreter (``before=/path/to/venv/bin/python``) as target ``NAME/async`` beside this build's
and the broker (async flush only): it runs every case first, then this build, then the broker, and gets
its own ``ratio`` line against the broker.

Needs Java 17 and Maven (jars fetched once into ``$MQTEST_CACHE``, default ``.cache``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "scripts"))
import stock_rocketmq as rmq  # noqa: E402  (scripts/ is not a package; the launcher is stdlib-only)
from _figures import uptime  # noqa: E402
from _remoting_client import ProxyProcess, peak_rss_kib  # noqa: E402
from _vs_cases import CASES, PRODUCER_WINDOW_S, RUNNERS, Row, drain_counts  # noqa: E402
from _vs_clients import Clients  # noqa: E402
from _vs_report import (  # noqa: E402
    IDLE_S,
    TITLES,
    format_row,
    idle_cpu,
    machine,
    ratio_line,
    summary_table,
)
from _vs_targets import Target, mqproxy_target, rocketmq_target  # noqa: E402


def _list(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [p for p in text.split(",") if p]
        bad = [p for p in items if p not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(allowed)}")
        return items

    return parse


def _server(text: str) -> tuple[str, str]:
    name, sep, python = text.partition("=")
    if not sep or not name or not python or name in ("mqproxy", "rocketmq") or "/" in name:
        raise argparse.ArgumentTypeError("NAME=PYTHON, NAME not mqproxy/rocketmq and without '/'")
    return name, python


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
    parser.add_argument("--jfr", type=Path, help="record every client JVM (JFR) into this folder")
    parser.add_argument(
        "--profile", type=Path, help="py-spy mqproxy and time every pull during each drain into this folder"
    )
    parser.add_argument(
        "--server",
        action="append",
        default=[],
        type=_server,
        metavar="NAME=PYTHON",
        help="also run an mqproxy of another checkout (its venv's python) as target NAME/async",
    )
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
    print(f"uptime before: {uptime()}", flush=True)
    rows: list[Row] = []
    setup_failed = False
    proxies: list[tuple[str, ProxyProcess]] = []
    cluster: rmq.StockCluster | None = None
    tmp = Path(tempfile.mkdtemp(prefix="mqproxy-vs-rocketmq-"))
    try:
        started = time.monotonic()
        clients = Clients(tmp / "clients", opts.jfr)
        cluster = rmq.StockCluster(
            tmp / "stock", brokers=1, proxy="cluster" if "grpc" in opts.cases else None
        )
        cluster.start()
        print(f"set-up: stock cluster up after {time.monotonic() - started:.1f} s", flush=True)
        targets: list[Target] = []
        for flush in opts.flush:
            if flush == "async":  # other builds first, so this build and the broker stay the last pair
                for label, python in opts.server:
                    other, proxy = mqproxy_target(flush, tmp, opts.queues, label=label, python=python)
                    proxies.append((other.name, proxy))
                    targets.append(other)
            ours, proxy = mqproxy_target(flush, tmp, opts.queues)
            proxies.append((ours.name, proxy))
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
            if case == "drain":
                opts.drain_counts = drain_counts(targets, opts)
            print(f"\n== {case}: {TITLES[case].format(**vars(opts))}", flush=True)
            for flush in opts.flush:
                pair = [t for t in targets if t.flush == flush]
                for target in pair:
                    row = RUNNERS[case](clients, target, opts)
                    rows.append(row)
                    print(format_row(row), flush=True)
                print(ratio_line(case, flush, rows[-2], rows[-1]), flush=True)
                for extra in rows[-len(pair) : -2]:  # the --server builds against the same broker row
                    line = ratio_line(case, flush, extra, rows[-1])
                    print(line.replace("mqproxy/", f"{extra.target.name.split('/')[0]}/", 1), flush=True)
        for name, proxy in proxies:
            print(f"peak RSS {name} {peak_rss_kib(proxy.pid) / 1024:.1f} MiB (VmHWM)", flush=True)
    except (rmq.LauncherError, RuntimeError) as exc:
        print(f"FAILED: {exc}", flush=True)
        setup_failed = True
    finally:
        for _, proxy in proxies:
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
    print(f"uptime after: {uptime()}", flush=True)
    print("\n" + "\n".join(summary_table(rows, opts.flush, opts.cases)), flush=True)
    for row in failed:
        print(f"FAILED {row.case} {row.target.name}: {row.failed} failed; {row.note}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
