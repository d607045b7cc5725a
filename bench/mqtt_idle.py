"""Idle MQTT connections, CONNECT cost and SUBSCRIBE cost, each server in the same run.

* **idle**: ``--conns`` clients (MQTT 3.1.1, clean, keep-alive 60) connect and stay idle; printed per
  connection: the server's RSS delta (``/proc/PID/status``), for mqproxy also the :mod:`tracemalloc` delta
  (a second server run under ``bench/_traced_serve.py``, signalled with SIGUSR1 before and after), and
  the server's CPU µs per CONNECT (``/proc/PID/stat`` over the connect phase, 100 connects in flight).
* **subscribe**: one client sends ``--subscribes`` SUBSCRIBEs (one filter each, distinct topics,
  pipelined 100 at a time) and waits for every SUBACK; printed: wall seconds and server CPU µs per
  SUBSCRIBE.

Servers: ``--server NAME=PYTHON`` (repeatable; default this interpreter as ``mqproxy``) runs
``PYTHON -m mqproxy serve`` (embedded store, async flush), so another checkout's venv is the "before";
mosquitto (persistence off) is the peer when installed (``scripts/setup-bench-peers.sh``).

``--profile DIR`` samples each mqproxy server with py-spy over the connect phase and the subscribe phase
of the first round (``DIR/<server>-connect.txt``, ``DIR/<server>-subscribe.txt``, collapsed stacks) and
prints where the time goes (:mod:`bench._profile`).

    python bench/mqtt_idle.py [--server before=../base/.venv/bin/python --server after=.venv/bin/python]
                              [--conns 2000] [--subscribes 10000] [--rounds 1] [--profile DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _mqtt_brokers import Broker, rss_bytes, start_mosquitto, start_mqproxy, wait_quiet
from _mqtt_load import LEVEL, LoadError, MqttClient, connect
from _profile import summarize
from _remoting_client import cpu_seconds

from mqproxy.codecs import mqtt

HERE = Path(__file__).resolve().parent
CONNECTS_IN_FLIGHT = 100
SUBSCRIBE_WINDOW = 100
SETTLE_S = 1.0


def _traced_python(tmp: Path, python: str, name: str) -> tuple[str, Path]:
    """An executable that runs ``python bench/_traced_serve.py "$@"``, and the file it reports to."""
    trace_file = tmp / f"{name}-traced.txt"
    wrapper = tmp / f"{name}-traced-python"
    wrapper.write_text(
        f'#!/bin/sh\nMQBENCH_TRACE_FILE="{trace_file}" exec "{python}" "{HERE / "_traced_serve.py"}" "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper), trace_file


@contextlib.contextmanager
def _spy(pid: int, out: Path | None) -> Iterator[None]:
    """py-spy sampling ``pid`` into ``out`` (collapsed stacks) over the block; nothing if ``out`` is None."""
    if out is None:
        yield
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    spy = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("py-spy")),
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--rate",
            "250",
            "--nonblocking",
            "-o",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its file and exits
        spy.wait(30)
        print(f"{out.name}:\n{summarize(out)}", flush=True)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def _traced_bytes(pid: int, trace_file: Path) -> int:
    lines = _lines(trace_file)
    os.kill(pid, signal.SIGUSR1)
    for _ in range(200):
        await trio.sleep(0.05)
        now = _lines(trace_file)
        if len(now) > len(lines):
            return int(now[-1])
    raise RuntimeError("the traced server did not report")


async def _open_idle(broker: Broker, count: int, tag: str) -> tuple[list[MqttClient], float, float]:
    """Connect ``count`` clients; returns them, wall seconds and server CPU seconds of the phase."""
    clients: list[MqttClient] = []
    limiter = trio.CapacityLimiter(CONNECTS_IN_FLIGHT)

    async def one(index: int) -> None:
        async with limiter:
            clients.append(await connect(broker.port, f"{tag}-{index}", keep_alive=60))

    cpu0, t0 = cpu_seconds(broker.pid), time.monotonic()
    async with trio.open_nursery() as nursery:
        for index in range(count):
            nursery.start_soon(one, index)
    return clients, time.monotonic() - t0, cpu_seconds(broker.pid) - cpu0


async def idle_case(
    broker: Broker, count: int, trace_file: Path | None, profile: Path | None = None
) -> dict[str, float]:
    await wait_quiet(broker.pid)
    traced0 = await _traced_bytes(broker.pid, trace_file) if trace_file else 0
    rss0 = rss_bytes(broker.pid)
    with _spy(broker.pid, profile):
        clients, wall, cpu = await _open_idle(broker, count, f"idle{time.monotonic_ns()}")
    await trio.sleep(SETTLE_S)
    rss1 = rss_bytes(broker.pid)
    traced1 = await _traced_bytes(broker.pid, trace_file) if trace_file else 0
    for client in clients:
        await client.aclose()
    out = {"rss_b": (rss1 - rss0) / count, "connect_us": cpu / count * 1e6, "conn_per_s": count / wall}
    if trace_file:
        out["traced_b"] = (traced1 - traced0) / count
    return out


async def subscribe_case(broker: Broker, count: int, profile: Path | None = None) -> dict[str, float]:
    await wait_quiet(broker.pid)
    client = await connect(broker.port, f"subs{time.monotonic_ns()}", keep_alive=60)
    with _spy(broker.pid, profile):
        return await _subscribe(broker, client, count)


async def _subscribe(broker: Broker, client: MqttClient, count: int) -> dict[str, float]:
    window = trio.Semaphore(SUBSCRIBE_WINDOW)
    acked = 0
    done = trio.Event()

    async def read_acks() -> None:
        nonlocal acked
        while acked < count:
            for packet in await client.receive_packets():
                if isinstance(packet, mqtt.SubAck):
                    if packet.reason_codes[0] >= 0x80:
                        raise LoadError(f"SUBSCRIBE refused: {packet.reason_codes[0]!r}")
                    acked += 1
                    window.release()
        done.set()

    cpu0, t0 = cpu_seconds(broker.pid), time.monotonic()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_acks)
        for index in range(count):
            await window.acquire()
            packet = mqtt.Subscribe(
                index % 65535 + 1, (mqtt.SubscribeTopic(f"bench/subs/{index}", mqtt.QoS(1)),)
            )
            await client.send(mqtt.encode(packet, LEVEL))
        await done.wait()
    wall, cpu = time.monotonic() - t0, cpu_seconds(broker.pid) - cpu0
    await client.aclose()
    return {"subscribe_s": wall, "subscribe_us": cpu / count * 1e6}


def _mkdir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


async def run_server(
    name: str, python: str | None, args: argparse.Namespace, tmp: Path, profile: Path | None
) -> dict[str, float]:
    figures: dict[str, float] = {}
    _mkdir(tmp)
    if name == "mosquitto":
        broker = start_mosquitto(tmp)
        try:
            figures.update(await idle_case(broker, args.conns, None))
            figures.update(await subscribe_case(broker, args.subscribes))
        finally:
            broker.stop()
        return figures
    _mkdir(tmp / "plain")
    broker = start_mqproxy(tmp / "plain", name, python)
    try:
        spy = {p: profile / f"{name}-{p}.txt" if profile else None for p in ("connect", "subscribe")}
        figures.update(await idle_case(broker, args.conns, None, spy["connect"]))
        figures.update(await subscribe_case(broker, args.subscribes, spy["subscribe"]))
    finally:
        broker.stop()
    _mkdir(tmp / "traced")
    wrapper, trace_file = _traced_python(tmp, python or sys.executable, name)
    broker = start_mqproxy(tmp / "traced", f"{name}-traced", wrapper)
    try:
        figures["traced_b"] = (await idle_case(broker, args.conns, trace_file))["traced_b"]
    finally:
        broker.stop()
    return figures


async def main(args: argparse.Namespace) -> None:
    servers: list[tuple[str, str | None]] = [
        (s.split("=", 1)[0], s.split("=", 1)[1]) for s in args.server
    ] or [("mqproxy", None)]
    if not args.no_peer:
        servers.append(("mosquitto", None))
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in servers}
    with tempfile.TemporaryDirectory(prefix="mqidle-") as tmp:
        for round_no in range(args.rounds):
            for name, python in servers:
                try:
                    results[name].append(
                        await run_server(
                            name,
                            python,
                            args,
                            Path(tmp) / f"r{round_no}-{name}",
                            args.profile if round_no == 0 else None,
                        )
                    )
                except FileNotFoundError as exc:
                    print(f"  ({name}: {exc})", flush=True)
    print(
        f"{args.conns} idle connections, {args.subscribes} SUBSCRIBEs; medians of {args.rounds} round(s)",
        flush=True,
    )
    header = f"{'server':12} {'tracemalloc B/conn':>19} {'RSS B/conn':>11} {'CONNECT µs CPU':>15}"
    print(header + f" {'conn/s':>8} {'SUBSCRIBEs s':>13} {'µs CPU/SUBSCRIBE':>17}")
    for name, rounds in results.items():
        if not rounds:
            continue

        def med(key: str, rounds: list[dict[str, float]] = rounds) -> str:
            values = [r[key] for r in rounds if key in r]
            return f"{statistics.median(values):.0f}" if values else "-"

        def med2(key: str, rounds: list[dict[str, float]] = rounds) -> str:
            values = [r[key] for r in rounds if key in r]
            return f"{statistics.median(values):.2f}" if values else "-"

        print(
            f"{name:12} {med('traced_b'):>19} {med('rss_b'):>11} {med('connect_us'):>15} "
            f"{med('conn_per_s'):>8} {med2('subscribe_s'):>13} "
            f"{med('subscribe_us'):>17}",
            flush=True,
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--server", action="append", default=[], help="NAME=PYTHON (repeatable)")
    parser.add_argument("--conns", type=int, default=2000)
    parser.add_argument("--subscribes", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--no-peer", action="store_true", help="skip mosquitto")
    parser.add_argument("--profile", type=Path, help="py-spy the first round's mqproxy phases into DIR")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    trio.run(main, parser.parse_args())
