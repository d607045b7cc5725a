"""Rate ladders of the MQTT benchmark: offer a rate, measure deliveries, stop at the first step a broker
does not sustain (the criteria are in ``bench/mqtt.py``'s module text and :attr:`Step.sustained`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import trio
from _mqtt_brokers import Broker, CpuMeter, pct, poll_until, wait_quiet
from _mqtt_load import (
    ByteCountingSubscriber,
    LoadError,
    MqttClient,
    ParsingSubscriber,
    Publisher,
    connect,
    publish_size,
)
from _mqtt_pool import SubscriberPool

PAYLOAD = 64
FAN_IN_PUBLISHERS = 10
#: Publishes/s of the QoS 1 fan-in ladder (all publishers together).
RATES_QOS1 = (100, 200, 500, 1000, 1500, 2000, 2500, 3000, 4000, 5000, 10000, 20000, 30000, 50000)


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
) -> Step | None:
    """Climb ``rates`` until a step is not sustained; print the case's line and return the last
    sustained step (None when even the first was not)."""
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
    return best
