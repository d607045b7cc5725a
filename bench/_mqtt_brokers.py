"""The brokers of the MQTT benchmark (mqproxy, mosquitto, amqtt) as child processes on 127.0.0.1, and
what the benchmark reads about them: resident memory, CPU share, quiet periods.

Contracts: ``start_*`` return a :class:`Broker` once it accepts TCP connections, or raise
``FileNotFoundError`` when the peer is not installed (``scripts/setup-bench-peers.sh``) and
``RuntimeError`` when it exits or does not listen in time; ``Broker.stop()`` ends the process.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio
from _mqtt_baseline import MQTT_BASELINE_SERVER
from _peer import start_peer
from _remoting_client import cpu_seconds, start_proxy

ROOT = Path(__file__).resolve().parent.parent
AMQTT = ROOT / ".clients" / "amqtt" / "bin" / "amqtt"


@dataclass(slots=True)
class Broker:
    name: str
    port: int
    pid: int
    stop: Callable[[], None]


def _status_bytes(pid: int, key: str) -> int:
    """The ``key`` line of ``/proc/<pid>/status`` (a kB figure) in bytes; -1 when absent."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    return -1


def rss_bytes(pid: int) -> int:
    """Current resident set size (VmRSS) of ``pid`` in bytes."""
    return _status_bytes(pid, "VmRSS:")


def peak_rss_bytes(pid: int) -> int:
    """Peak resident set size (VmHWM) of ``pid`` in bytes."""
    return _status_bytes(pid, "VmHWM:")


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


def start_trio_floor(tmp: Path) -> Broker:
    """The MQTT floor of mqproxy's stack (``bench/_mqtt_baseline.py``: trio and its codec, no store)."""
    proc, port = start_peer(MQTT_BASELINE_SERVER)
    return Broker("trio-mqtt", port, proc.pid, proc.kill)


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


def start_mqproxy(tmp: Path, name: str = "mqproxy", python: str | None = None) -> Broker:
    """``mqproxy serve`` on the embedded store (async flush), run by ``python`` (default: this one)."""
    proxy = start_proxy(
        tmp / f"data-{name}", tmp / f"{name}.log", flush="async", python=python or sys.executable
    )
    return Broker(name, proxy.port, proxy.pid, proxy.stop)


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
