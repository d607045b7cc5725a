"""mqproxy in cluster mode vs RocketMQ's own proxy vs direct, same run: Apache RocketMQ's benchmark Producer
and Consumer through one and two mqproxy nodes, through RocketMQ's proxy (cluster mode), and directly to
the brokers, all in front of one stock Apache RocketMQ 5.3.3 cluster; plus MQTT QoS 1 fan-in.

One invocation starts, on 127.0.0.1 with free ports (``bench/_cluster_paths.py``): a name server, two
brokers (``ASYNC_FLUSH``) and RocketMQ's proxy in cluster mode (``scripts/stock_rocketmq.py``, jars from
Maven Central), and two ``mqproxy serve`` nodes with ``MQPROXY_BACKEND_KIND=rocketmq`` and
``MQPROXY_BACKEND_NAMESRV`` = that name server. Each path has its own topic with ``--queues`` queues on
each broker. Paths (what each of the two client processes is given as ``-n``):

* ``direct``: the stock name server (the clients talk to the brokers);
* ``RocketMQ proxy``: RocketMQ's proxy's remoting port, for both;
* ``mqproxy x1``: mqproxy node A, for both;
* ``mqproxy x2``: node A for the first client process, node B for the second.

**Every row runs two client JVMs at once** (the same load on every path; only the addresses differ), one
row at a time, for each case and each path in turn:

``producer``
    Two Apache RocketMQ benchmark Producers (``org.apache.rocketmq.example.benchmark.Producer`` from
    ``rocketmq-example`` 5.5.0, ``-w THREADS -s SIZE`` each, sync send), run for warm-up + ``--seconds``
    (at least its 9 s report window). TPS = the sum of their own reports' means (reports whose window
    starts after the warm-up); RT avg weighted by their TPS; max RT over both runs.
``drain``
    Two benchmark Consumers (same jar, push consumer, 20 threads each) in one new group drain what the
    producer row stored in that path's topic, until the brokers hold the group's committed offsets at the
    backlog (nothing left). Timed on their own received counters, printed whenever they grow (at most every
    10 ms; ``bench/java/remoting/ConsumerProbe.java``): backlog / (last count increase - first message).
    Redeliveries (one consumer's uncommitted messages when the group rebalanced as the other joined) are
    shown as duplicates, and when each consumer got its first message.

Each row gives the CPU of the server processes on its path (name server and both brokers; plus RocketMQ's
proxy, or the mqproxy node(s) the clients use) and of the client JVMs, in cores, the servers' CPU per
message stored (producer: max offsets before and after) or delivered (drain), and the 1-minute load
average when it started. Ratios: each path's TPS over RocketMQ proxy's and over direct's; the issue's
targets are mqproxy >= 1.0x RocketMQ's proxy and >= 0.5x direct (printed as met or below; they do not set
the exit status).

``mqtt``
    ``bench/mqtt.py``'s QoS 1 fan-in ladder (10 publishers → 1 subscriber, one topic, 64 B) on an embedded
    mqproxy started for it, beside the same on mqproxy node A (MQTT on the cluster: each message stored once
    on the cluster's LMQ broker and dispatched by it into the light queues); "n/a" with the CONNACK's reason
    if the node refuses MQTT.

Exit status 1 (and a ``FAILED`` line) if the set-up failed, a send failed after the warm-up, a drain fell
short, or a row has no figures.

    python bench/cluster.py [--seconds 20] [--warmup 5] [--threads 16] [--size 128] [--queues 4]
    python bench/cluster.py --quick     # the smoke test's sizes: a few seconds per row
    python bench/cluster.py --paths direct,proxy,mq1 --no-mqtt    # some paths only (e.g. to profile a node)

Needs Java 17 and Maven (jars fetched once into ``$MQTEST_CACHE``, default ``.cache``).
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "scripts"))
import stock_rocketmq as rmq  # noqa: E402  (scripts/ is not a package; the launcher is stdlib-only)
from _cluster_cases import MQTT_CASE, MqttFigures, drain_row, mqtt_rows, producer_row  # noqa: E402
from _cluster_paths import BROKERS, VIA_NAMES, ClusterBed, Via  # noqa: E402
from _figures import uptime  # noqa: E402
from _mqtt_ladder import RATES_QOS1, Step  # noqa: E402
from _vs_cases import PRODUCER_WINDOW_S, Row  # noqa: E402
from _vs_clients import Clients  # noqa: E402
from _vs_report import format_row, machine, summary_cell  # noqa: E402

CASES = ("producer", "drain")
TITLES = {
    "producer": "2 benchmark Producers at once (-w {threads} -s {size} each, sync send): sum of their own "
    "reports' TPS (9 s windows after the warm-up); max RT over their whole runs",
    "drain": "2 benchmark Consumers at once (one new group, 20 threads each) draining the producer row's "
    "backlog until the brokers hold the group's offsets at it: backlog / (last count increase - first "
    "message)",
}
#: (ratio label, denominator path key, target), in print order.
RATIOS = (("RocketMQ proxy", "proxy", 1.0), ("direct", "direct", 0.5))
IDLE_S = 3.0


def ratio(rows: dict[str, Row], key: str, over: str) -> float:
    a, b = rows[key].figures.get("tps", math.nan), rows[over].figures.get("tps", math.nan)
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def ratio_lines(case: str, rows: dict[str, Row]) -> list[str]:
    """Each path's TPS over RocketMQ proxy's and over direct's; mqproxy's against the issue's targets."""
    out = []
    for key in ("proxy", "mq1", "mq2"):
        if key not in rows:
            continue
        parts = []
        for label, over, target in RATIOS:
            if over == key or over not in rows:
                continue
            r = ratio(rows, key, over)
            verdict = ""
            if key.startswith("mq"):
                verdict = f" (target >= {target:.1f}: {'met' if r >= target else 'below'})" if r == r else ""
            parts.append(f"/ {label} {r:.2f}{verdict}")
        out.append(f"ratio    {case:8} {rows[key].target.name:15} TPS " + "  ".join(parts))
    return out


def summary_table(by_case: dict[str, dict[str, Row]], mqtt: MqttFigures | None) -> list[str]:
    names = {key: row.target.name for key, row in next(iter(by_case.values()), {}).items()}
    out = [
        "| case | " + " | ".join(names.values()) + " | x1 / proxy | x2 / proxy | x1 / direct | x2 / direct |",
        "|---" * (len(names) + 5) + "|",
    ]
    for case, rows in by_case.items():
        cells = [summary_cell(rows[key]) for key in names]
        ratios = [
            ratio(rows, mq, over) if mq in rows and over in rows else math.nan
            for over in ("proxy", "direct")
            for mq in ("mq1", "mq2")
        ]
        out.append(f"| {case} | " + " | ".join(cells) + " | " + " | ".join(f"{r:.2f}" for r in ratios) + " |")
    if mqtt is not None:
        out += ["", "| MQTT | embedded mqproxy | cluster (mqproxy node) |", "|---|---|---|"]
        out.append(
            f"| {MQTT_CASE} | {mqtt_cell(mqtt.embedded, '')} | {mqtt_cell(mqtt.cluster, mqtt.cluster_note)} |"
        )
    return out


def mqtt_cell(step: Step | None, note: str) -> str:
    """A sustained fan-in figure (the ladder's last passing step), or why there is none."""
    if step is None:
        return note or "lowest step not sustained"
    return f"{step.delivered:,.0f} msgs/s (step {step.offered:,.0f} pub/s)"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per producer row")
    parser.add_argument(
        "--warmup", type=float, default=5.0, help="unmeasured seconds before each producer row"
    )
    parser.add_argument("--threads", type=int, default=16, help="sending threads per benchmark Producer (-w)")
    parser.add_argument("--size", type=int, default=128, help="message body bytes (benchmark Producer -s)")
    parser.add_argument(
        "--queues", type=int, default=4, help=f"queues per broker ({BROKERS} brokers) of every topic"
    )
    parser.add_argument("--drain-timeout", type=float, default=120.0, help="seconds a drain may take at most")
    parser.add_argument(
        "--paths",
        default=",".join(VIA_NAMES),
        help=f"comma-separated paths to run, in their fixed order (default all: {','.join(VIA_NAMES)})",
    )
    parser.add_argument("--no-mqtt", dest="mqtt", action="store_false", help="skip the MQTT fan-in row")
    parser.add_argument("--quick", action="store_true", help="a few seconds per row (the smoke test)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    opts = parser.parse_args()
    opts.paths = {key.strip() for key in opts.paths.split(",") if key.strip()}
    if not opts.paths or opts.paths - set(VIA_NAMES):
        parser.error(f"--paths: choose among {', '.join(VIA_NAMES)}")
    opts.mqtt_warmup, opts.mqtt_seconds, opts.mqtt_drain, opts.mqtt_rates = 0.5, 1.5, 3.0, RATES_QOS1
    if opts.quick:
        opts.seconds, opts.warmup, opts.drain_timeout = 2.0, 1.0, 60.0
        opts.mqtt_warmup, opts.mqtt_seconds, opts.mqtt_rates = 0.3, 0.7, (20, 100)
    # the benchmark Producer reports only from its 10th second on, each report covering 9 s
    opts.producer_seconds = max(opts.seconds, PRODUCER_WINDOW_S)
    return opts


def main() -> int:
    opts = parse_args()
    for line in machine():
        print(line, flush=True)
    print(
        f"cluster: stock RocketMQ {rmq.ROCKETMQ_VERSION} (name server, {BROKERS} brokers, RocketMQ's proxy "
        f"in cluster mode) + 2 mqproxy nodes (backend rocketmq); per producer row {opts.warmup:g} s warm-up "
        f"+ {opts.producer_seconds:g} s measured; 2 client JVMs per row, {opts.threads} threads each; "
        f"{opts.size} B bodies; {opts.queues} queues per broker; one row at a time",
        flush=True,
    )
    print(f"uptime before: {uptime()}", flush=True)
    by_case: dict[str, dict[str, Row]] = {}
    mqtt: MqttFigures | None = None
    setup_failed = False
    tmp = Path(tempfile.mkdtemp(prefix="mqproxy-bench-cluster-"))
    bed = ClusterBed(tmp, opts.queues)
    try:
        started = time.monotonic()
        clients = Clients(tmp / "clients")
        bed.start()
        vias: list[Via] = [via for via in bed.vias() if via.key in opts.paths]
        for via in vias:
            bed.create_topic(via.topic)
        routes = {via.name: bed.check_route(via) for via in vias}
        print(
            f"set-up: {time.monotonic() - started:.1f} s (name server {bed.stock.namesrv_addr}, "
            f"RocketMQ proxy {bed.stock.proxy_remoting_addr}, mqproxy {bed.node_addr(0)} and "
            f"{bed.node_addr(1)}); write queues per broker in each path's route: "
            + ", ".join(f"{name} {counts}" for name, counts in routes.items()),
            flush=True,
        )
        print(f"server CPU at rest over {IDLE_S:g} s, cores: {bed.idle_cpu(IDLE_S)}", flush=True)
        runners = {"producer": producer_row, "drain": drain_row}
        for case in CASES:
            print(f"\n== {case}: {TITLES[case].format(**vars(opts))}", flush=True)
            rows = by_case.setdefault(case, {})
            for via in vias:
                rows[via.key] = runners[case](clients, bed, via, opts)
                print(format_row(rows[via.key]), flush=True)
            for line in ratio_lines(case, rows):
                print(line, flush=True)
        if opts.mqtt:
            print(
                f"\n== mqtt: {MQTT_CASE}, bench/mqtt.py's ladder; embedded mqproxy beside the cluster",
                flush=True,
            )
            mqtt = mqtt_rows(bed, opts)
            print(
                f"mqtt     {MQTT_CASE}  embedded mqproxy {mqtt_cell(mqtt.embedded, '')}  |  cluster "
                f"(mqproxy node) {mqtt_cell(mqtt.cluster, mqtt.cluster_note)}",
                flush=True,
            )
    except (rmq.LauncherError, RuntimeError, OSError) as exc:
        print(f"FAILED: {exc}", flush=True)
        setup_failed = True
    finally:
        bed.stop()
        rows_all = [row for rows in by_case.values() for row in rows.values()]
        failed = [r for r in rows_all if not r.ok or r.failed]
        mqtt_failed = mqtt is not None and not mqtt.ok
        if opts.keep or failed or setup_failed or mqtt_failed:
            print(f"work directory kept: {tmp}", flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if setup_failed:
        return 1
    print(f"uptime after: {uptime()}", flush=True)
    print("\n" + "\n".join(summary_table(by_case, mqtt)), flush=True)
    for row in failed:
        print(f"FAILED {row.case} {row.target.name}: {row.failed} failed; {row.note}", flush=True)
    if mqtt_failed:
        print("FAILED mqtt: embedded mqproxy sustained no step of the ladder", flush=True)
    return 1 if failed or mqtt_failed else 0


if __name__ == "__main__":
    sys.exit(main())
