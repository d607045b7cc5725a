"""MQTT benchmark: mqproxy against mosquitto and amqtt, same run, same load generator (issue 6).

Every broker runs in its own process on 127.0.0.1 and is driven by ``bench/_mqtt_load.py`` (raw trio
sockets, the project's sans-IO MQTT codec, MQTT 3.1.1, 64-byte payloads) in this process, except the
fan-out subscribers, which a child process counts (``SubscriberPool``, one epoll loop over plain sockets):

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
max_queued_messages 1000); amqtt with loopback listener and anonymous auth only.

    python bench/mqtt.py [--only mqproxy,mosquitto,amqtt] [--idle 2000] [--lmqs 100000]
                         [--seconds 1.5] [--idle 10000,100000 --lmqs 1000000 for the issue's sizes]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trio.lowlevel
from _mqtt_load import (
    ByteCountingSubscriber,
    LoadError,
    MqttClient,
    ParsingSubscriber,
    Publisher,
    SubscriberPool,
    connect,
    publish_size,
)
from _remoting_client import CLIENT_VERSION, RemotingClient, cpu_seconds, open_client, start_proxy

from mqproxy.codecs.message_record import encode_properties
from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode

ROOT = Path(__file__).resolve().parent.parent
AMQTT = ROOT / ".clients" / "amqtt" / "bin" / "amqtt"
PAYLOAD = 64
FAN_IN_PUBLISHERS = 10
FAN_OUT_SUBSCRIBERS = 100
LMQS_PER_MESSAGE = 100
CONNECTS_IN_FLIGHT = 100
CONNS_PER_SOURCE = 25_000  # below the ~28k ephemeral ports of one source address
FD_RESERVE = 256  # descriptors kept free for /proc reads, logs and the ladder clients


@dataclass(slots=True)
class Broker:
    name: str
    port: int
    pid: int
    stop: Callable[[], None]


def rss_bytes(pid: int) -> int:
    """Current resident set size (VmRSS) of ``pid`` in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return -1


class CpuMeter:
    """CPU share (1.0 = one core) of this process, of an optional generator child ``helper`` and of the
    broker ``pid`` between :meth:`mark` and :meth:`read`."""

    def __init__(self, pid: int, helper: int | None = None) -> None:
        self.pid, self.helper = pid, helper
        self.mark()

    def mark(self) -> None:
        self._wall, self._client = time.monotonic(), time.process_time()
        self._server, self._helper = cpu_seconds(self.pid), self._helper_seconds()

    def read(self) -> tuple[float, float, float]:
        """(this process, helper — 0.0 without one, broker)."""
        wall = max(time.monotonic() - self._wall, 1e-9)
        return (
            (time.process_time() - self._client) / wall,
            (self._helper_seconds() - self._helper) / wall,
            (cpu_seconds(self.pid) - self._server) / wall,
        )

    def _helper_seconds(self) -> float:
        return cpu_seconds(self.helper) if self.helper is not None else 0.0


async def wait_quiet(pid: int, limit_s: float = 5.0) -> None:
    """Wait until the broker's CPU over 0.25 s is below 5 % (at most ``limit_s``)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = cpu_seconds(pid)
        await trio.sleep(0.25)
        if cpu_seconds(pid) - before < 0.0125:
            return


async def poll_until(done: Callable[[], bool], timeout_s: float) -> None:
    """Return once ``done()`` holds or after ``timeout_s`` (counters are bumped per packet by many tasks;
    polling every 20 ms is cheaper than an event per packet)."""
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:  # noqa: ASYNC110
        await trio.sleep(0.02)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def free_port() -> int:
    """A loopback port free right now (for peers that cannot report the port they bound)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(proc: subprocess.Popen[bytes], port: int, name: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{name} did not listen on 127.0.0.1:{port}")


def _stopper(proc: subprocess.Popen[bytes]) -> Callable[[], None]:
    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    return stop


def find_mosquitto() -> str | None:
    return shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.access(p, os.X_OK)), None
    )


def start_mosquitto(tmp: Path) -> Broker:
    binary = find_mosquitto()
    if binary is None:
        raise FileNotFoundError("mosquitto not installed (scripts/setup-bench-peers.sh)")
    port = free_port()
    conf = tmp / "mosquitto_bench.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest none\n")
    log = (tmp / "mosquitto.log").open("wb")
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)
    wait_listening(proc, port, "mosquitto")
    return Broker("mosquitto", port, proc.pid, _stopper(proc))


def start_amqtt(tmp: Path) -> Broker:
    if not os.access(AMQTT, os.X_OK):
        raise FileNotFoundError("amqtt not installed in .clients/amqtt (scripts/setup-bench-peers.sh)")
    port = free_port()
    conf = tmp / "amqtt_bench.yaml"
    conf.write_text(
        "listeners:\n  default:\n    type: tcp\n"
        f"    bind: 127.0.0.1:{port}\n"
        "plugins:\n  amqtt.plugins.authentication.AnonymousAuthPlugin:\n    allow_anonymous: true\n"
    )
    log = (tmp / "amqtt.log").open("wb")
    proc = subprocess.Popen([str(AMQTT), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)
    wait_listening(proc, port, "amqtt")
    return Broker("amqtt", port, proc.pid, _stopper(proc))


def start_mqproxy(tmp: Path, name: str = "mqproxy") -> Broker:
    proxy = start_proxy(tmp / f"data-{name}", tmp / f"{name}.log", flush="async")
    return Broker(name, proxy.port, proxy.pid, proxy.stop)


# --- rate ladders ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Step:
    offered: float  # publishes/s, all publishers together
    publishers: int
    fan_out: int  # deliveries per publish
    seconds: float  # measured window
    published_n: int  # publishes in the measured window
    delivered_n: int  # deliveries in the measured window
    loss: float  # 1 - deliveries / (publishes x fan_out) after the drain: dropped or still queued
    client_cpu: float
    pool_cpu: float | None  # the subscriber pool process, None without one
    server_cpu: float
    latencies: list[float]
    note: str = ""
    setup_s: float = 0.0  # seconds the subscriber pool took to subscribe everyone

    @property
    def achieved(self) -> float:
        return self.published_n / self.seconds

    @property
    def delivered(self) -> float:
        return self.delivered_n / self.seconds

    @property
    def server_us_per_delivery(self) -> float:
        """Broker CPU per delivery: stable across machine load, unlike the rates."""
        return self.server_cpu * self.seconds / self.delivered_n * 1e6 if self.delivered_n else float("nan")

    @property
    def sustained(self) -> bool:
        """The criteria of the module text, with one message per publisher of rounding slack at low rates."""
        return (
            not self.note
            and self.published_n >= 0.95 * self.offered * self.seconds - self.publishers
            and self.delivered_n >= 0.95 * self.published_n * self.fan_out - self.publishers * self.fan_out
            and self.loss <= 0.01
        )


async def _ladder_step(
    broker: Broker,
    args: argparse.Namespace,
    *,
    qos: int,
    publishers: int,
    subscribers: int,
    rate: float,
    tag: str,
    pooled: bool = False,
) -> Step:
    """One step: fresh clients on a fresh topic, publish ``rate`` msgs/s in total, count deliveries.

    ``pooled`` (QoS 0 only): the subscribers live in a :class:`SubscriberPool` child process."""
    if pooled and qos:
        raise ValueError("the subscriber pool counts QoS 0 deliveries only")
    topic = f"bench/{tag}"
    await wait_quiet(broker.pid)
    clients: list[MqttClient] = []
    pool: SubscriberPool | None = None
    try:
        subs: list[ByteCountingSubscriber | ParsingSubscriber] = []
        if pooled:
            pool = SubscriberPool(
                broker.port, topic, subscribers, publish_size(topic, PAYLOAD, 0), f"{tag}-s"
            )
            await pool.start()
            await wait_quiet(broker.pid)  # thousands of fresh sessions: let the broker settle first
        else:
            for i in range(subscribers):
                client = await connect(broker.port, f"{tag}-s{i}")
                clients.append(client)
                await client.subscribe(topic, qos)
                if qos == 0:
                    subs.append(ByteCountingSubscriber(client, publish_size(topic, PAYLOAD, 0)))
                else:
                    subs.append(ParsingSubscriber(client, record=True))
        pubs = []
        for i in range(publishers):
            client = await connect(broker.port, f"{tag}-p{i}")
            clients.append(client)
            pubs.append(Publisher(client, topic, qos=qos, rate=rate / publishers, stamp=qos == 1))

        def delivered() -> int:
            return sum(s.received for s in subs) + (pool.received if pool is not None else 0)

        def published() -> int:
            return sum(p.sent for p in pubs)

        cpu = CpuMeter(broker.pid, pool.pid if pool is not None else None)
        window: dict[str, float] = {}
        notes: list[str] = []
        async with trio.open_nursery() as nursery:
            for sub in subs:
                nursery.start_soon(sub.run)
            if qos:
                for pub in pubs:
                    nursery.start_soon(pub.read_acks)
            async with trio.open_nursery() as publishing:
                for pub in pubs:
                    publishing.start_soon(pub.run, args.warmup + args.seconds)
                await trio.sleep(args.warmup)
                window["p0"], window["d0"] = published(), delivered()
                lat_start = [len(s.latencies) if isinstance(s, ParsingSubscriber) else 0 for s in subs]
                cpu.mark()
                await trio.sleep(args.seconds)
                window["p1"], window["d1"] = published(), delivered()
                client_cpu, pool_cpu, server_cpu = cpu.read()
            total = published() * subscribers
            await poll_until(lambda: delivered() >= total, args.drain)
            nursery.cancel_scope.cancel()
        if pool is not None:
            await pool.aclose()  # makes its counts exact
            if pool.disconnected:
                notes.append(f"{pool.disconnected} subscribers disconnected by the broker")
        counters = [s for s in subs if isinstance(s, ByteCountingSubscriber)]
        if not all(s.aligned for s in counters) or (pool is not None and not pool.aligned):
            notes.append("byte count not a multiple of the PUBLISH size")
        latencies: list[float] = []
        for sub, start in zip(subs, lat_start, strict=True):
            if isinstance(sub, ParsingSubscriber):
                latencies.extend(sub.latencies[start:])
        loss = 1 - delivered() / total if total else 1.0
        return Step(
            rate,
            publishers,
            subscribers,
            args.seconds,
            int(window["p1"] - window["p0"]),
            int(window["d1"] - window["d0"]),
            max(loss, 0.0),
            client_cpu,
            pool_cpu if pool is not None else None,
            server_cpu,
            latencies,
            "; ".join(notes),
            pool.setup_s if pool is not None else 0.0,
        )
    except LoadError as exc:
        return Step(
            rate, publishers, subscribers, args.seconds, 0, 0, 1.0, 0, None, 0, [], f"load error: {exc}"
        )
    finally:
        for client in clients:
            await client.aclose()
        if pool is not None:
            await pool.aclose()


def _gen_cpu(step: Step) -> str:
    """Generator CPU: this process, plus the subscriber pool process when the step had one."""
    pool = f" + pool {step.pool_cpu:4.0%}" if step.pool_cpu is not None else ""
    return f"{step.client_cpu:4.0%}{pool}"


def _print_step(broker: str, case: str, step: Step) -> None:
    lat = (
        f"  p50 {pct(step.latencies, 50) * 1e3:7.2f} ms p99 {pct(step.latencies, 99) * 1e3:7.2f} ms"
        if step.latencies
        else ""
    )
    verdict = "ok  " if step.sustained else "FAIL"
    setup = f"  (subscribed in {step.setup_s:.1f} s)" if step.setup_s else ""
    print(
        f"  step {broker:9} {case:21} offered {step.offered:8.0f} pub/s published {step.achieved:8.0f} pub/s"
        f" delivered {step.delivered:9.0f}/s"
        f" missing {step.loss:6.2%}{lat}  cpu gen {_gen_cpu(step)} broker {step.server_cpu:4.0%}"
        f"  {verdict}{setup}{'  ' + step.note if step.note else ''}",
        flush=True,
    )


async def ladder(
    broker: Broker,
    args: argparse.Namespace,
    case: str,
    *,
    qos: int,
    publishers: int,
    subscribers: int,
    rates: list[float],
    unit: str,
    pooled: bool = False,
) -> None:
    best: Step | None = None
    failed: Step | None = None
    for index, rate in enumerate(rates):
        step = await _ladder_step(
            broker,
            args,
            qos=qos,
            publishers=publishers,
            subscribers=subscribers,
            rate=rate,
            tag=f"{case.replace(' ', '')}{index}",
            pooled=pooled,
        )
        if args.verbose:
            _print_step(broker.name, case, step)
        if not step.sustained:
            failed = step
            break
        best = step
    if best is None:
        head = f"{'-':>10} {unit} (lowest step {rates[0]:.0f} pub/s not sustained)"
    else:
        lat = (
            f"  p50 {pct(best.latencies, 50) * 1e3:.2f} ms p99 {pct(best.latencies, 99) * 1e3:.2f} ms"
            if best.latencies
            else ""
        )
        head = (
            f"{best.delivered:10.0f} {unit} (step {best.offered:.0f} pub/s{lat}; broker cpu "
            f"{best.server_cpu:.0%} = {best.server_us_per_delivery:.0f} us/delivery, generator cpu "
            f"{_gen_cpu(best)})"
        )
    tail = (
        "; ladder top reached"
        if failed is None
        else f"; next step {failed.offered:.0f} pub/s offered → published {failed.achieved:.0f} pub/s,"
        f" delivered {failed.delivered:.0f}/s, missing after drain {failed.loss:.1%}"
        + (f", {failed.note}" if failed.note else "")
    )
    print(f"{case:22} {broker.name:9} max sustained {head}{tail}", flush=True)


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


# --- light message queues (mqproxy only) ------------------------------------------------------------


async def _send(client: RemotingClient, topic: str, body: bytes, lmqs: list[str]) -> None:
    properties = {"UNIQ_KEY": client.new_uniq_key(), "WAIT": "true", "TAGS": "bench"}
    if lmqs:
        properties["INNER_MULTI_DISPATCH"] = ",".join(lmqs)
    ext = {
        "a": "bench",
        "b": topic,
        "c": "TBW102",
        "d": "4",
        "e": "0",
        "f": "0",
        "g": str(time.time_ns() // 1_000_000),
        "h": "0",
        "i": encode_properties(properties),
        "j": "0",
        "k": "false",
        "m": "false",
    }
    command = RemotingCommand(
        code=RequestCode.SEND_MESSAGE_V2, version=CLIENT_VERSION, ext_fields=ext, body=body
    )
    response = await client.request(command)
    if response.code != ResponseCode.SUCCESS:
        raise RuntimeError(f"send failed: {response.code} {response.remark}")


async def _send_many(port: int, messages: int, lmqs_for: Callable[[int], list[str]], producers: int) -> float:
    """Send ``messages`` over ``producers`` connections (one send in flight each); return elapsed s."""
    body = bytes(PAYLOAD)
    todo = iter(range(messages))

    async def producer() -> None:
        async with open_client(port) as client:
            for i in todo:
                await _send(client, "LmqBench", body, lmqs_for(i))

    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        for _ in range(producers):
            nursery.start_soon(producer)
    return time.monotonic() - started


def _dir_bytes(path: Path) -> int:
    total = 0
    for entry in path.rglob("*"):
        if entry.is_file():
            total += entry.stat().st_blocks * 512
    return total


async def lmq_case(broker: Broker, data_dir: Path, args: argparse.Namespace) -> None:
    count = args.lmqs
    messages = max(1, count // LMQS_PER_MESSAGE)

    def new_lmqs(i: int) -> list[str]:
        return [f"%LMQ%bench{i * LMQS_PER_MESSAGE + k}" for k in range(LMQS_PER_MESSAGE)]

    def no_lmqs(i: int) -> list[str]:
        return []

    def old_lmqs(i: int) -> list[str]:
        return new_lmqs(i % messages)

    baseline_n = min(messages, args.lmq_baseline)
    await _send_many(broker.port, 50, no_lmqs, 4)  # warm-up: creates the topic
    cpu = CpuMeter(broker.pid)
    plain_s = await _send_many(broker.port, baseline_n, no_lmqs, args.lmq_producers)
    _, _, plain_cpu = cpu.read()
    print(
        f"{'lmq baseline':22} {broker.name:9} plain send (no dispatch): {baseline_n / plain_s:7.0f} msgs/s"
        f"  broker cpu {plain_cpu:.0%} = {plain_cpu * plain_s / baseline_n * 1e6:.0f} us/msg",
        flush=True,
    )
    await wait_quiet(broker.pid)
    rss0, disk0, index0 = rss_bytes(broker.pid), _dir_bytes(data_dir), _dir_bytes(data_dir / "index")
    log0 = _dir_bytes(data_dir / "commitlog")
    cpu.mark()
    create_s = await _send_many(broker.port, messages, new_lmqs, args.lmq_producers)
    _, _, create_cpu = cpu.read()
    await trio.sleep(1.0)  # let async flush land before measuring the store
    rss1, disk1, index1 = rss_bytes(broker.pid), _dir_bytes(data_dir), _dir_bytes(data_dir / "index")
    log1 = _dir_bytes(data_dir / "commitlog")
    created = messages * LMQS_PER_MESSAGE
    print(
        f"{'lmq create ' + str(created):22} {broker.name:9} {messages} msgs x {LMQS_PER_MESSAGE} new LMQs:"
        f" {messages / create_s:7.0f} msgs/s = {created / create_s:8.0f} LMQ dispatches/s"
        f" (broker cpu {create_cpu:.0%} = {create_cpu * create_s / messages * 1e6:.0f} us/msg)",
        flush=True,
    )
    print(
        f"{'lmq memory ' + str(created):22} {broker.name:9} RSS {rss0 / 2**20:.1f} → {rss1 / 2**20:.1f} MiB ="
        f" {(rss1 - rss0) / created:6.1f} B/LMQ; store {disk0 / 2**20:.1f} → {disk1 / 2**20:.1f} MiB ="
        f" {(disk1 - disk0) / created:6.1f} B/LMQ (LMDB index {(index1 - index0) / created:.1f} B/LMQ;"
        f" commit log +{(log1 - log0) / 2**20:.1f} MiB for the {messages} messages and their dispatch lists)",
        flush=True,
    )
    again = min(messages, args.lmq_baseline)
    await wait_quiet(broker.pid)
    cpu.mark()
    again_s = await _send_many(broker.port, again, old_lmqs, args.lmq_producers)
    _, _, again_cpu = cpu.read()
    print(
        f"{'lmq dispatch existing':22} {broker.name:9} {again} msgs x {LMQS_PER_MESSAGE} existing LMQs:"
        f" {again / again_s:7.0f} msgs/s = {again * LMQS_PER_MESSAGE / again_s:8.0f} LMQ dispatches/s"
        f" (broker cpu {again_cpu:.0%} = {again_cpu * again_s / again * 1e6:.0f} us/msg)",
        flush=True,
    )


async def read_cache_counts(broker: Broker) -> dict[str, float]:
    """mqproxy's ``mqproxy_mqtt_read_cache_requests_total`` by result, and ``pushed`` (push-hub
    deliveries, ``mqproxy_mqtt_pushed_deliveries_total``), scraped from ``/metrics``."""
    stream = await trio.open_tcp_stream("127.0.0.1", broker.port)
    async with stream:
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        chunks = []
        while data := await stream.receive_some(65536):
            chunks.append(data)
    counts = dict.fromkeys(("hit", "coalesced", "miss", "bypass", "pushed"), 0.0)
    for line in b"".join(chunks).decode().splitlines():
        if line.startswith("mqproxy_mqtt_read_cache_requests_total{"):
            result = line.split('result="', 1)[1].split('"', 1)[0]
            counts[result] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("mqproxy_mqtt_pushed_deliveries_total "):
            counts["pushed"] = float(line.rsplit(" ", 1)[1])
    return counts


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
        await ladder(
            broker,
            args,
            "fan-in QoS 0 (10→1)",
            qos=0,
            publishers=FAN_IN_PUBLISHERS,
            subscribers=1,
            rates=args.rates_qos0,
            unit="msgs/s",
        )
        await ladder(
            broker,
            args,
            "fan-in QoS 1 (10→1)",
            qos=1,
            publishers=FAN_IN_PUBLISHERS,
            subscribers=1,
            rates=args.rates_qos1,
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
        default=_floats("100,200,500,1000,1500,2000,2500,3000,4000,5000,10000,20000,30000,50000"),
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
    args = parser.parse_args()
    args.cases = {c.strip() for c in args.cases.split(",") if c.strip()}
    only = [name.strip() for name in args.only.split(",") if name.strip()]

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
            starters = {"mqproxy": start_mqproxy, "mosquitto": start_mosquitto, "amqtt": start_amqtt}
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
                    print(f"{'peak RSS':22} {broker.name:9} {_hwm(broker.pid) / 2**20:8.1f} MiB", flush=True)
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


def _hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return -1


if __name__ == "__main__":
    sys.exit(main())
