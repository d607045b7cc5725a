"""MQTT benchmark: mqproxy against mosquitto and amqtt, same run, same load generator (issue 6).

Every broker runs in its own process on 127.0.0.1 and is driven by ``bench/_mqtt_load.py`` (raw trio
sockets, the project's sans-IO MQTT codec, MQTT 3.1.1, 64-byte payloads) in this process, except the
fan-out subscribers, which a child process counts (``SubscriberPool``, ``bench/_mqtt_pool.py``: one
epoll loop over plain sockets). Brokers: ``bench/_mqtt_brokers.py``; ladders: ``bench/_mqtt_ladder.py``;
the LMQ case: ``bench/_mqtt_lmq.py``.

* ``fan-in``: 10 publishers → 1 subscriber on one topic, QoS 0 and QoS 1, rate ladder (below).
* ``fan-out``: 1 publisher → ``--fan-out`` (100) QoS 0 subscribers of one topic, rate ladder; figure =
  deliveries/s. Fresh subscribers for every step, all in one pool process (so at most its open-files
  limit, less a few dozen).
* ``latency``: 1 → 1 at ``--latency-rate`` msgs/s, QoS 0 and QoS 1, publish→deliver p50/p90/p99/max.
* ``idle``: ``--idle`` connections (keepalive 60, 100 connects in flight): connect rate, broker RSS
  delta per connection (user-space RSS, kernel socket buffers not counted), then one PINGREQ each.
* ``lmq`` (mqproxy only; the peers have no light message queues): a fresh mqproxy receives remoting
  SEND_MESSAGE_V2 with ``INNER_MULTI_DISPATCH`` naming 100 new ``%LMQ%`` queues per message until
  ``--lmqs`` queues exist; figures: dispatch rate (messages/s and LMQ entries/s) against plain sends
  without dispatch in the same process, mqproxy RSS and store bytes per LMQ, and dispatch into the
  now-existing queues.

Rate ladder: each step offers a rate for ``--warmup`` s (not measured) then ``--seconds`` s (measured), then
waits up to ``--drain`` s for stragglers. A step is *sustained* when deliveries in the measured window are ≥
95 % of what was published in it, at most 1 % is missing after the drain (dropped, or still queued in a
broker that fell behind), and publishers reached ≥ 95 % of the offered rate. The ladder stops at the first
failing step; ``max sustained`` is the delivered rate of the last passing step. Before each step the script
waits (≤ 5 s) for broker CPU < 5 %. CPU columns are the share of one core used by this process (the
generator), by the fan-out subscriber pool (``pool``, also generator) and by the broker; either generator
process near 100 % means the figure is generator-bound.

The generator shares the 2 cores with the broker: when a generator cpu column nears 100 %, or publishers
fall short of the offered rate, the step measured the generator, not the broker (for fan-in that is
mosquitto above about 30-50k msgs/s). ``--idle`` counts above this process's open-files limit
(raised to the hard limit at start; beyond it only with CAP_SYS_RESOURCE) are capped, with a note; past
25,000 connections the clients bind 127.0.0.2, 127.0.0.3, … as source addresses.

The peers come from ``scripts/setup-bench-peers.sh`` (Debian mosquitto; amqtt 0.12.1 in
``.clients/amqtt``); a missing peer is skipped with a note. mosquitto runs with a generated config
(loopback listener, anonymous, persistence off, everything else default: max_inflight_messages 20,
max_queued_messages 1000); amqtt with loopback listener and anonymous auth only. ``trio-mqtt`` (not in the
default list) is the floor of mqproxy's own stack: trio and mqproxy's MQTT codec relaying with no store
(``bench/_mqtt_baseline.py``).

    python bench/mqtt.py [--only mqproxy,mosquitto,amqtt] [--idle 2000] [--lmqs 100000]
                         [--seconds 1.5] [--idle 10000,100000 --lmqs 1000000 for the issue's sizes]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trio.lowlevel
from _mqtt_brokers import (
    Broker,
    pct,
    peak_rss_bytes,
    poll_until,
    read_cache_counts,
    rss_bytes,
    start_amqtt,
    start_mosquitto,
    start_mqproxy,
    start_trio_floor,
    wait_quiet,
)
from _mqtt_ladder import FAN_IN_PUBLISHERS, PAYLOAD, RATES_QOS1, ladder
from _mqtt_lmq import lmq_case
from _mqtt_load import LoadError, MqttClient, ParsingSubscriber, Publisher, connect

FAN_OUT_SUBSCRIBERS = 100
CONNECTS_IN_FLIGHT = 100
CONNS_PER_SOURCE = 25_000  # below the ~28k ephemeral ports of one source address
FD_RESERVE = 256  # descriptors kept free for /proc reads, logs and the ladder clients


# --- latency ---------------------------------------------------------------------------------------


async def latency(broker: Broker, args: argparse.Namespace, qos: int) -> None:
    topic = f"bench/lat{qos}"
    await wait_quiet(broker.pid)
    sub_client = await connect(broker.port, f"lat{qos}-s")
    pub_client = await connect(broker.port, f"lat{qos}-p")
    try:
        await sub_client.subscribe(topic, qos)
        sub = ParsingSubscriber(sub_client, record=True)
        pub = Publisher(pub_client, topic, qos=qos, rate=args.latency_rate, stamp=True)
        seconds = args.warmup + args.latency_seconds
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sub.run)
            if qos:
                nursery.start_soon(pub.read_acks)
            await pub.run(seconds)
            await poll_until(lambda: sub.received >= pub.sent, args.drain)
            nursery.cancel_scope.cancel()
    finally:
        await sub_client.aclose()
        await pub_client.aclose()
    skip = int(args.warmup * args.latency_rate)
    values = sub.latencies[skip:] or sub.latencies
    ms = [v * 1e3 for v in values]
    print(
        f"{'latency 1→1 QoS ' + str(qos):22} {broker.name:9} @{args.latency_rate:.0f} msgs/s"
        f"  p50 {pct(ms, 50):7.3f} ms  p90 {pct(ms, 90):7.3f} ms  p99 {pct(ms, 99):7.3f} ms"
        f"  max {max(ms, default=float('nan')):7.2f} ms  n={len(ms)} (published {pub.sent},"
        f" delivered {sub.received})",
        flush=True,
    )


# --- idle connections ------------------------------------------------------------------------------


def source_address(index: int) -> str | None:
    """Client source address for connection ``index``: 127.0.0.1 for the first CONNS_PER_SOURCE, then
    127.0.0.2, 127.0.0.3, … (each source address has its own ~28k ephemeral ports)."""
    block = index // CONNS_PER_SOURCE
    return None if block == 0 else f"127.0.0.{block + 1}"


async def idle(broker: Broker, args: argparse.Namespace, count: int) -> None:
    requested = count
    fd_soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    count = min(count, fd_soft - FD_RESERVE)
    capped = (
        f"; capped from {requested} by this process's open-files limit {fd_soft} (raise the hard limit)"
        if count < requested
        else ""
    )
    await wait_quiet(broker.pid)
    clients: list[MqttClient] = []
    errors: list[str] = []
    rss_limit = _mem_available() // 2 + rss_bytes(broker.pid)
    stopped = ""
    rss_before = rss_bytes(broker.pid)
    limiter = trio.CapacityLimiter(CONNECTS_IN_FLIGHT)

    async def one(index: int) -> None:
        async with limiter:
            if stopped:
                return
            try:
                clients.append(
                    await connect(broker.port, f"idle-{index}", source=source_address(index), keep_alive=60)
                )
            except (OSError, LoadError, trio.BrokenResourceError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        for index in range(count):
            if index % 1000 == 999 and rss_bytes(broker.pid) > rss_limit:
                stopped = f"stopped at {index}: broker RSS over half the machine's free memory"
                break
            nursery.start_soon(one, index)
            if index % CONNECTS_IN_FLIGHT == 0:
                await trio.lowlevel.checkpoint()
    elapsed = time.monotonic() - started
    await trio.sleep(args.idle_hold)
    rss_after = rss_bytes(broker.pid)
    pongs = 0

    async def ping(client: MqttClient) -> None:
        nonlocal pongs
        async with limiter:
            try:
                with trio.move_on_after(10):
                    if await client.ping():
                        pongs += 1
            except (LoadError, trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    async with trio.open_nursery() as nursery:
        for client in clients:
            nursery.start_soon(ping, client)
    for client in clients:
        await client.aclose()
    per_conn = (rss_after - rss_before) / len(clients) if clients else float("nan")
    first_error = f"; {len(errors)} failed, first: {errors[0]}" if errors else ""
    print(
        f"{'idle ' + str(count):22} {broker.name:9} {len(clients)}/{count} connected in {elapsed:6.2f} s"
        f" = {len(clients) / elapsed:7.0f} conn/s; broker RSS {rss_before / 2**20:6.1f} → "
        f"{rss_after / 2**20:7.1f} MiB = {per_conn:8.0f} B/conn; PINGRESP {pongs}/{len(clients)} after "
        f"{args.idle_hold:g} s{first_error}{'; ' + stopped if stopped else ''}{capped}",
        flush=True,
    )


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 1 << 34


# --- driver ----------------------------------------------------------------------------------------


def raise_fd_limit(wanted: int) -> int:
    """Raise RLIMIT_NOFILE (soft, and hard with CAP_SYS_RESOURCE) towards ``wanted``; return the soft limit.

    Brokers started afterwards inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if wanted > hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
            return wanted
        except (ValueError, OSError):
            pass
    target = min(max(soft, wanted), hard)
    if target != soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def bench_broker(broker: Broker, args: argparse.Namespace) -> None:
    if "fan-in" in args.cases:
        for qos, rates in ((0, args.rates_qos0), (1, args.rates_qos1)):
            await ladder(
                broker,
                args,
                f"fan-in QoS {qos} (10→1)",
                qos=qos,
                publishers=FAN_IN_PUBLISHERS,
                subscribers=1,
                rates=rates,
                unit="msgs/s",
            )
    if "fan-out" in args.cases:
        before = await read_cache_counts(broker) if broker.name == "mqproxy" else None
        await ladder(
            broker,
            args,
            f"fan-out QoS 0 (1→{args.fan_out})",
            qos=0,
            publishers=1,
            subscribers=args.fan_out,
            rates=args.rates_fan_out,
            unit="deliveries/s",
            pooled=True,
        )
        if before is not None:
            after = await read_cache_counts(broker)
            store = sum(after[r] - before[r] for r in ("miss", "bypass"))
            cached = sum(after[r] - before[r] for r in ("hit", "coalesced"))
            reads = store + cached
            pushed = after["pushed"] - before["pushed"]
            print(
                f"  {broker.name}: over the fan-out ladder {pushed:,.0f} deliveries went out through push "
                f"hubs (no reader woken); {store:,.0f} store reads in all, for {reads:,.0f} reads by "
                f"hubs and subscribers ({cached / max(reads, 1):.1%} from the shared read cache)",
                flush=True,
            )
    if "latency" in args.cases:
        await latency(broker, args, 0)
        await latency(broker, args, 1)
    if "idle" in args.cases:
        for count in args.idle:
            await idle(broker, args, count)


def _floats(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part]


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="mqproxy,mosquitto,amqtt", help="brokers, comma list")
    parser.add_argument("--cases", default="fan-in,fan-out,latency,idle,lmq", help="comma list")
    parser.add_argument("--seconds", type=float, default=1.5, help="measured seconds per ladder step")
    parser.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds before each step")
    parser.add_argument("--drain", type=float, default=3.0, help="seconds a step waits for stragglers")
    parser.add_argument(
        "--rates-qos0",
        type=_floats,
        default=_floats(
            "100,200,500,1000,2000,3000,4000,5000,7500,10000,20000,30000,50000,75000,100000,150000,200000"
        ),
    )
    parser.add_argument(
        "--rates-qos1",
        type=_floats,
        default=[float(rate) for rate in RATES_QOS1],
    )
    parser.add_argument(
        "--rates-fan-out",
        type=_floats,
        default=_floats("1,2,5,10,20,50,100,200,300,500,700,1000,1500,2000,2500,3000,4000,5000"),
        help="publishes/s of the fan-out ladder (deliveries = x subscribers)",
    )
    parser.add_argument("--fan-out", type=int, default=FAN_OUT_SUBSCRIBERS, help="fan-out subscribers")
    parser.add_argument("--latency-rate", type=float, default=1000.0, help="msgs/s of the latency case")
    parser.add_argument("--latency-seconds", type=float, default=3.0)
    parser.add_argument("--idle", type=_ints, default=[2000], help="idle connection counts, comma list")
    parser.add_argument("--idle-hold", type=float, default=2.0, help="seconds idle before PINGREQ")
    parser.add_argument("--lmqs", type=int, default=100_000, help="LMQs created (100 per message)")
    parser.add_argument("--lmq-producers", type=int, default=16)
    parser.add_argument("--lmq-baseline", type=int, default=500, help="messages of the comparison sends")
    parser.add_argument("--verbose", action="store_true", help="print every ladder step")
    parser.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="NAME=PYTHON",
        help="also bench mqproxy run by PYTHON (e.g. another checkout's venv) as NAME; repeatable",
    )
    args = parser.parse_args()
    args.cases = {c.strip() for c in args.cases.split(",") if c.strip()}
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    servers = dict(spec.split("=", 1) for spec in args.server)
    only += [name for name in servers if name not in only]

    limit = raise_fd_limit(max(args.idle, default=0) + 4096)
    load = os.getloadavg()
    print(
        f"mqtt benchmark: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; MQTT 3.1.1, {PAYLOAD} B payloads, one trio load"
        f" generator process for every broker; ladder steps {args.warmup:g} s warm-up + {args.seconds:g} s"
        f" measured; idle {','.join(map(str, args.idle))}; {args.lmqs} LMQs; open files limit {limit}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="mqproxy-bench-mqtt-") as tmp:
        root = Path(tmp)
        for name in only:
            starters = {
                "mqproxy": start_mqproxy,
                "mosquitto": start_mosquitto,
                "amqtt": start_amqtt,
                "trio-mqtt": start_trio_floor,
            }
            for server, python in servers.items():
                starters[server] = partial(start_mqproxy, name=server, python=python)
            if name not in starters:
                raise SystemExit(f"unknown broker {name!r}")
            if args.cases - {"lmq"}:
                try:
                    broker = starters[name](root)
                except FileNotFoundError as exc:
                    print(f"skipped {name}: {exc}", flush=True)
                    continue
                try:
                    trio.run(bench_broker, broker, args)
                    print(
                        f"{'peak RSS':22} {broker.name:9} {peak_rss_bytes(broker.pid) / 2**20:8.1f} MiB",
                        flush=True,
                    )
                finally:
                    broker.stop()
            if name == "mqproxy" and "lmq" in args.cases:
                broker = start_mqproxy(root, "mqproxy-lmq")
                try:
                    trio.run(lmq_case, broker, root / "data-mqproxy-lmq", args)
                finally:
                    broker.stop()
    load = os.getloadavg()
    print(f"load average at end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
