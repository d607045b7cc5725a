"""The cases of ``bench/cluster.py``: each runs two client JVMs at once along one :class:`~_cluster_paths.Via`
and returns one :class:`~_vs_cases.Row` for the pair, with the server and client CPU used meanwhile; and
the MQTT QoS 1 fan-in row (embedded mqproxy beside the cluster node). The two JVMs are held at a start
gate (``bench/java/remoting/Gate.java``) until both are up, so their loads begin within milliseconds of
each other whatever their start-up took.

``producer``
    Two benchmark Producers (:func:`_vs_cases.run_producer`, ``-w THREADS -s SIZE`` each), one per address
    of the path, started together. TPS is the sum of their own figures (each the mean of its reports
    whose 9 s window starts after the warm-up); average RT is their TPS-weighted mean, max RT the larger,
    failures the sum.
``drain``
    Two benchmark Consumers (``bench/java/remoting/ConsumerProbe.java``) in one new group, one per address,
    draining what the producer case stored in the path's topic. Each prints its received count whenever it
    grew (at most every 10 ms). The pair is stopped once the brokers hold the group's committed offsets at
    the backlog (read on the brokers themselves every :data:`COMMIT_POLL_S` after the counts add up to
    it; clients commit every 5 s): so nothing was left unconsumed. TPS = backlog / (last count increase -
    first message), both on this process's clock as the lines arrive; "first after" is from the gate's
    opening. Messages counted beyond the backlog are shown as duplicates: redeliveries of what one
    consumer had taken but not yet committed when the group rebalanced as the other joined (they come at
    the start, so they do not move the end). The note gives each consumer's count and when its first
    message came: a consumer that got its queues only at the client's next periodic rebalance (20 s)
    shows there.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import trio
from _cluster_paths import ClusterBed, Via, drain_group
from _mqtt_brokers import Broker, start_mqproxy
from _mqtt_ladder import FAN_IN_PUBLISHERS, Step, ladder
from _mqtt_load import LoadError, connect
from _vs_cases import (
    PROBE_MAIN,
    Row,
    measuring,
    probe_args,
    producer_args,
    producer_figures,
    run_producer,
)
from _vs_clients import GATE_TIMEOUT_S, Clients, JavaRun, StartGate

__all__ = ["MQTT_CASE", "MqttFigures", "drain_row", "mqtt_rows", "producer_row"]

#: How often the drain reads the group's committed offsets once the consumers' counts reach the backlog.
COMMIT_POLL_S = 0.5
PROBE_REPORT_MS = 10
NEVER = 1 << 62
MQTT_CASE = f"fan-in QoS 1 ({FAN_IN_PUBLISHERS}→1)"


def _together(
    clients: Clients, label: str, jobs: list[Callable[[list[str]], JavaRun]]
) -> tuple[list[JavaRun], float]:
    """Run the client JVMs ``jobs`` (each given its gate arguments) at once, their loads begun together
    through one :class:`~_vs_clients.StartGate` once every JVM is up; the runs, and when the gate opened
    (monotonic; NaN if it never did)."""
    gate = StartGate(clients.home / f"gate-{label}-{time.monotonic_ns()}", len(jobs))
    with ThreadPoolExecutor(max_workers=len(jobs) + 1) as pool:
        pool.submit(gate.open_when_ready)
        futures = [pool.submit(job, gate.args(i)) for i, job in enumerate(jobs)]
        runs = [f.result() for f in futures]
    return runs, gate.opened_at if gate.opened_at is not None else math.nan


def producer_row(clients: Clients, bed: ClusterBed, via: Via, opts: argparse.Namespace) -> Row:
    row = Row("producer", via.target)

    def job(index: int, addr: str) -> Callable[[list[str]], JavaRun]:
        args = producer_args(addr, via.topic, opts)
        return lambda gate: run_producer(clients, f"producer-{via.key}-{index}", args, opts, gate)

    with measuring(row, list(via.pids), lambda: bed.stored(via.topic)):
        runs, _ = _together(clients, f"producer-{via.key}", [job(i, a) for i, a in enumerate(via.endpoints)])
    parts = [producer_figures(Row("producer", via.target), run, opts) for run in runs]
    bad = [p for p in parts if not p.ok]
    row.failed = sum(p.failed for p in parts)
    row.early_failed = sum(p.early_failed for p in parts)
    if bad:
        row.ok = False
        row.note = "; ".join(f"producer {parts.index(p)}: {p.note}" for p in bad)
        return row
    tps = [p.figures["tps"] for p in parts]
    rts = [
        (p.figures["avg_rt_ms"], t)
        for p, t in zip(parts, tps, strict=True)
        if not math.isnan(p.figures["avg_rt_ms"])
    ]
    weight = sum(t for _, t in rts)
    row.figures = {
        "tps": sum(tps),
        "avg_rt_ms": sum(rt * t for rt, t in rts) / weight if weight else math.nan,
        "max_rt_ms": max(p.figures["max_rt_ms"] for p in parts),
        "reports": min(p.figures["reports"] for p in parts),
    }
    row.note = f"{len(parts)} producers: " + " + ".join(f"{t:.0f}" for t in tps) + " msgs/s"
    # a sender thread whose route look-up throws (the client's 3 s budget, on a loaded machine) dies
    died = sum(line.startswith("Exception in thread") for run in runs for _, line in run.lines)
    if died:
        row.note += f"; {died} of {opts.threads * len(runs)} sender threads died"
    return row


def _counts(run: JavaRun) -> list[tuple[float, int, int]]:
    """(arrival time, consumed, failed) of each progress or done line of one ConsumerProbe that shows a
    new count: so the last one is when its count last grew."""
    out: list[tuple[float, int, int]] = []
    for at, line in run.lines:
        if line.startswith(('{"event":"progress"', '{"event":"done"')):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            consumed = int(event["consumed"])
            if not out or consumed != out[-1][1]:
                out.append((at, consumed, int(event.get("failed", 0))))
    return out


def _last_count(run: JavaRun) -> int:
    for _, line in reversed(run.lines):
        if line.startswith(('{"event":"progress"', '{"event":"done"')):
            try:
                return int(json.loads(line)["consumed"])
            except (ValueError, KeyError):
                continue
    return 0


def drain_row(clients: Clients, bed: ClusterBed, via: Via, opts: argparse.Namespace) -> Row:
    row = Row("drain", via.target)
    backlog = bed.stored(via.topic)
    group = drain_group(via)
    n = len(via.endpoints)
    seen: dict[int, JavaRun] = {}
    lock = threading.Lock()
    state = {"complete": math.nan, "checked": 0.0}

    def drained() -> float | None:
        """When the brokers hold the group's offsets at the backlog (checked every COMMIT_POLL_S once
        the consumers' counts add up to it); None before."""
        with lock:
            now = time.monotonic()
            if (
                math.isnan(state["complete"])
                and len(seen) == n
                and now - state["checked"] >= COMMIT_POLL_S
                and sum(_last_count(r) for r in seen.values()) >= backlog
            ):
                state["checked"] = now
                if bed.committed(group, via.topic) >= backlog:
                    state["complete"] = now
            return None if math.isnan(state["complete"]) else state["complete"]

    def stop_when_drained(index: int) -> Callable[[JavaRun], float | None]:
        def check(run: JavaRun) -> float | None:
            seen[index] = run
            return drained()

        return check

    def job(index: int, addr: str) -> Callable[[list[str]], JavaRun]:
        # a count no consumer reaches alone: neither leaves the group before the pair is stopped
        args = probe_args(group, NEVER, addr, via.topic, opts.drain_timeout, PROBE_REPORT_MS)
        return lambda gate: clients.run(
            f"drain-{via.key}-{index}",
            clients.argv(clients.remoting_cp, PROBE_MAIN, args, gate),
            timeout=opts.drain_timeout + 60 + GATE_TIMEOUT_S,
            stop_after=stop_when_drained(index),
        )

    with measuring(row, list(via.pids)):
        runs, opened = _together(
            clients, f"drain-{via.key}", [job(i, a) for i, a in enumerate(via.endpoints)]
        )
    committed = bed.committed(group, via.topic)
    counts = [_counts(run) for run in runs]
    latest = [c[-1][1] if c else 0 for c in counts]
    consumed = sum(latest)
    # first message and last increase of either consumer, as their lines arrived (every 10 ms at most)
    firsts = [next((at for at, count, _ in c if count), math.nan) for c in counts]
    first_at = min((f for f in firsts if not math.isnan(f)), default=math.nan)
    end_at = max((c[-1][0] for c in counts if c and c[-1][1]), default=math.nan)
    row.failed = sum(c[-1][2] for c in counts if c)
    row.messages = consumed
    row.figures = {"produced": float(backlog), "consumed": float(consumed), "first_s": first_at - opened}
    split = " + ".join(str(c) for c in latest)
    starts = " / ".join("-" if math.isnan(f) else f"+{f - first_at:.2f}" for f in firsts)
    row.note = f"{n} consumers: {split}, first messages at {starts} s" + (
        f"; {consumed - backlog} duplicates" if consumed > backlog else ""
    )
    if backlog == 0 or committed < backlog or math.isnan(end_at):
        row.ok = False
        row.note = (
            f"group offsets committed on the brokers {committed} of {backlog} within "
            f"{opts.drain_timeout:g} s; counted {consumed} ({split})"
        )
        return row
    span = max(end_at - first_at, 1e-3)
    row.figures.update(tps=backlog / span, drain_s=span)
    return row


@dataclass
class MqttFigures:
    """The MQTT row: embedded mqproxy's sustained QoS 1 fan-in and what the cluster node gave."""

    embedded: Step | None = None
    cluster: Step | None = None
    cluster_note: str = ""  # why there is no cluster figure

    @property
    def ok(self) -> bool:
        return self.embedded is not None and (self.cluster is not None or bool(self.cluster_note))


async def _cluster_accepts_mqtt(port: int) -> str:
    """'' when the node at ``port`` accepts an MQTT CONNECT, else why not (the CONNACK's reason code)."""
    try:
        client = await connect(port, f"cluster-bench-probe-{time.monotonic_ns()}")
    except (LoadError, OSError) as exc:
        code = re.search(r"ReasonCode\.(\w+): (\d+)", str(exc))
        if code:
            return f"CONNACK {code.group(1).replace('_', ' ').lower()} (0x{int(code.group(2)):02x})"
        return str(exc)
    await client.aclose()
    return ""


def mqtt_rows(bed: ClusterBed, opts: argparse.Namespace) -> MqttFigures:
    """QoS 1 fan-in (``bench/mqtt.py``'s ladder: 10 publishers → 1 subscriber, one topic) on an embedded
    mqproxy started for it, and on node A of the cluster when that node accepts MQTT."""
    figures = MqttFigures()
    ladder_args = argparse.Namespace(
        warmup=opts.mqtt_warmup, seconds=opts.mqtt_seconds, drain=opts.mqtt_drain, verbose=False
    )

    async def climb(broker: Broker) -> Step | None:
        return await ladder(
            broker,
            ladder_args,
            MQTT_CASE,
            qos=1,
            publishers=FAN_IN_PUBLISHERS,
            subscribers=1,
            rates=list(opts.mqtt_rates),
            unit="msgs/s",
        )

    embedded = start_mqproxy(bed.root, "mqproxy-embedded")
    try:
        figures.embedded = trio.run(climb, embedded)
    finally:
        embedded.stop()
    node = bed.nodes[0]
    refused = trio.run(_cluster_accepts_mqtt, node.port)
    if refused:
        figures.cluster_note = f"n/a: node A refused CONNECT: {refused}"
    else:
        figures.cluster = trio.run(climb, Broker("mqproxy x1", node.port, node.pid, lambda: None))
        if figures.cluster is None:
            figures.cluster_note = "lowest step not sustained"
    return figures
