"""CPU per message, A/B in one run: broker CPU seconds (``/proc/PID/stat``) per delivered message.

Throughput on a shared machine moves with whatever else runs; the CPU a broker spends per message at a
fixed offered rate moves much less. This script starts every server at once and offers each the same
fixed load below saturation *at the same time* (so they share whatever else the machine runs), a fresh
set of servers per round, ``--rounds`` times, then prints the median per server and its ratio to the
first one (the peers run alone, after the first round):

* ``qos0``: MQTT fan-in 10→1, QoS 0, 64 B, ``--rate-qos0`` publishes/s (the issue's fan-in case);
* ``qos1``: the same at QoS 1, ``--rate-qos1`` publishes/s;
* ``remoting``: 16 producers, SEND_MESSAGE_V2 128 B, one outstanding send each, ``--messages`` sends.

Servers: ``--server NAME=PYTHON`` (repeatable) runs ``PYTHON -m mqproxy serve`` (embedded store, async
flush, JSON log to a file), so another checkout's venv is the "before" of a change (default: this
interpreter only). Peers, same run: mosquitto for the MQTT cases (when installed:
``scripts/setup-bench-peers.sh``) and ``bench/_mqtt_baseline.py``'s floor (trio and mqproxy's MQTT codec, no
store), ``bench/remoting.py``'s no-storage trio baseline for ``remoting``.
``--profile DIR`` adds a first, unmeasured round that samples every server with py-spy (``pip install
py-spy``) into ``DIR/<server>-<case>.txt`` (collapsed stacks) and prints where the time goes
(``bench/_profile.py``).

    python bench/cpu.py [--server before=../main/.venv/bin/python --server after=.venv/bin/python]
                        [--cases qos0,qos1,remoting] [--rounds 3] [--profile /tmp/prof]
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import uptime
from _mqtt_brokers import Broker, start_mosquitto, start_trio_floor
from _mqtt_ladder import FAN_IN_PUBLISHERS, _ladder_step
from _peer import start_peer
from _profile import summarize
from _remoting_client import start_proxy

from remoting import BASELINE_SERVER, Target, _fill, _send_case

MOSQUITTO = "mosquitto"
#: A case: the same load offered to every broker of the list at once; broker CPU us per message, each.
Case = Callable[[list[Broker], argparse.Namespace], Awaitable[list[float]]]
BASELINE = "trio-baseline"
#: The MQTT floor: trio + mqproxy's codec, no store (``bench/_mqtt_baseline.py``).
MQTT_BASELINE = "trio-mqtt"


def _mqtt_case(qos: int) -> Case:
    async def run(brokers: list[Broker], args: argparse.Namespace) -> list[float]:
        rate = args.rate_qos0 if qos == 0 else args.rate_qos1
        values = [math.nan] * len(brokers)

        async def one(index: int, broker: Broker) -> None:
            step = await _ladder_step(
                broker,
                args,
                qos=qos,
                publishers=FAN_IN_PUBLISHERS,
                subscribers=1,
                rate=rate,
                tag=f"cpu{qos}-{time.monotonic_ns()}",
            )
            if not step.sustained:
                print(f"    ({broker.name} qos{qos}: not sustained at {rate:.0f}/s {step.note})", flush=True)
            values[index] = step.server_us_per_delivery

        async with trio.open_nursery() as nursery:
            for index, broker in enumerate(brokers):
                nursery.start_soon(one, index, broker)
        return values

    return run


async def _remoting_case(brokers: list[Broker], args: argparse.Namespace) -> list[float]:
    values = [math.nan] * len(brokers)

    async def one(index: int, broker: Broker) -> None:
        target = Target(broker.name, broker.port, broker.pid, broker.stop)
        await _fill(broker.port, "Bench128", os.urandom(128), 400, producers=4)  # creates the topic
        case = await _send_case(target, 128, 16, args.messages, 30.0)
        values[index] = case.server_cpu * case.elapsed / max(case.acked, 1) * 1e6

    async with trio.open_nursery() as nursery:
        for index, broker in enumerate(brokers):
            nursery.start_soon(one, index, broker)
    return values


CASES: dict[str, Case] = {
    "qos0": _mqtt_case(0),
    "qos1": _mqtt_case(1),
    "remoting": _remoting_case,
}


def _start(name: str, python: str, tmp: Path) -> Broker:
    if name == MOSQUITTO:
        return start_mosquitto(tmp)
    if name == MQTT_BASELINE:
        return start_trio_floor(tmp)
    if name == BASELINE:
        proc, port = start_peer(BASELINE_SERVER)
        return Broker(BASELINE, port, proc.pid, proc.kill)
    proxy = start_proxy(tmp / f"data-{name}", tmp / f"{name}.log", flush="async", python=python)
    return Broker(name, proxy.port, proxy.pid, proxy.stop)


def _py_spy(brokers: list[Broker], folder: Path, case: str) -> list[subprocess.Popen[bytes]]:
    """py-spy sampling each broker into ``folder/<name>-<case>.txt`` (collapsed stacks) until SIGINT."""
    folder.mkdir(parents=True, exist_ok=True)
    binary = "py-spy" if _on_path("py-spy") else str(Path(sys.executable).with_name("py-spy"))
    spies = [
        subprocess.Popen(
            [
                binary,
                "record",
                "--pid",
                str(b.pid),
                "--format",
                "raw",
                "--rate",
                "250",
                "--nonblocking",
                "-o",
                str(folder / f"{b.name}-{case}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for b in brokers
    ]
    time.sleep(1.0)  # py-spy attaches
    return spies


def _on_path(binary: str) -> bool:
    return any(os.access(Path(d) / binary, os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", action="append", default=[], help="NAME=PYTHON, repeatable")
    parser.add_argument("--cases", default="qos0,qos1,remoting", help="comma list")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate-qos0", type=float, default=5000.0, help="publishes/s, all publishers")
    parser.add_argument("--rate-qos1", type=float, default=3000.0, help="publishes/s, all publishers")
    parser.add_argument("--messages", type=int, default=20000, help="remoting sends per round")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per MQTT case")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds first")
    parser.add_argument("--drain", type=float, default=3.0, help="seconds to wait for stragglers")
    parser.add_argument("--no-peers", action="store_true", help="skip mosquitto and the trio baselines")
    parser.add_argument("--profile", type=Path, help="py-spy each mqproxy case into this folder")
    args = parser.parse_args()
    servers = [tuple(spec.split("=", 1)) for spec in args.server] or [("mqproxy", sys.executable)]
    cases = [c for c in args.cases.split(",") if c]
    print(f"CPU per message: {os.cpu_count()} CPUs, {uptime()}", flush=True)
    results: dict[tuple[str, str], list[float]] = defaultdict(list)
    profile_round = args.profile is not None
    for round_no in range(-1 if profile_round else 0, args.rounds):
        with tempfile.TemporaryDirectory(prefix="mqproxy-cpu-") as tmp:
            brokers: list[Broker] = []
            try:
                for name, python in servers:
                    brokers.append(_start(name, python, Path(tmp)))
                for case in cases:
                    spies = _py_spy(brokers, args.profile, case) if round_no < 0 else []
                    try:
                        values = trio.run(CASES[case], brokers, args)
                    finally:
                        for spy in spies:
                            spy.send_signal(signal.SIGINT)  # py-spy writes its file and exits
                            spy.wait(30)
                    label = "profiled" if round_no < 0 else f"round {round_no + 1}"
                    for broker, value in zip(brokers, values, strict=True):
                        if round_no >= 0:
                            results[(broker.name, case)].append(value)
                        print(f"  {label:8} {broker.name:12} {case:9} {value:8.1f} us CPU/msg", flush=True)
            finally:
                for broker in brokers:
                    broker.stop()
            if not args.no_peers and round_no == 0:
                _peers(cases, args, Path(tmp), results)
    _report(servers, cases, results)
    if args.profile is not None:
        for name, _python in servers:
            for case in cases:
                out = args.profile / f"{name}-{case}.txt"
                if out.exists():
                    print(f"\nprofile {name} {case} ({out}):\n{summarize(out)}")
    print(f"\n{uptime()}")
    return 0


def _peers(
    cases: list[str], args: argparse.Namespace, tmp: Path, results: dict[tuple[str, str], list[float]]
) -> None:
    mqtt = ("qos0", "qos1")
    for peer, peer_cases in ((MOSQUITTO, mqtt), (MQTT_BASELINE, mqtt), (BASELINE, ("remoting",))):
        wanted = [c for c in cases if c in peer_cases]
        if not wanted:
            continue
        try:
            broker = _start(peer, "", tmp)
        except FileNotFoundError as exc:
            print(f"  ({peer} skipped: {exc})", flush=True)
            continue
        try:
            for case in wanted:
                (value,) = trio.run(CASES[case], [broker], args)
                results[(peer, case)].append(value)
                print(f"  peer    {peer:14} {case:9} {value:8.1f} us CPU/msg", flush=True)
        finally:
            broker.stop()


def _report(
    servers: list[tuple[str, ...]], cases: list[str], results: dict[tuple[str, str], list[float]]
) -> None:
    first = servers[0][0]
    print("\nmedian broker CPU per delivered message (us), ratio to the first server, peer beside:")
    for case in cases:
        base = statistics.median(results[(first, case)])
        cells = []
        for name, *_ in servers:
            med = statistics.median(results[(name, case)])
            cells.append(f"{name} {med:7.1f} us ({med / base:4.2f}x)")
        for peer in (MOSQUITTO, MQTT_BASELINE) if case != "remoting" else (BASELINE,):
            if results.get((peer, case)):
                cells.append(f"peer {peer} {statistics.median(results[(peer, case)]):6.1f} us")
        print(f"  {case:9} " + "  ".join(cells))


if __name__ == "__main__":
    sys.exit(main())
