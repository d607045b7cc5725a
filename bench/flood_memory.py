"""QoS 0 flood memory probe (issue 19): RSS split of a real ``mqproxy serve`` process under a flood.

Starts the proxy on an embedded store in a temporary directory, reads ``/proc/PID/smaps_rollup`` (Rss,
anonymous, private dirty, file-backed), floods ``--rate`` MQTT QoS 0 PUBLISHes of ``--size`` bytes per second
for ``--seconds`` from one raw-socket client, and reads the split again right after the flood and after
``--settle`` seconds of quiet. Prints one JSON object. Usage::

    python -m bench.flood_memory --seconds 30 --rate 15000 --size 64
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def smaps(pid: int) -> dict[str, int]:
    """``smaps_rollup`` fields of interest in kB: Rss, Anonymous, Private_Dirty, file-backed (Rss - Anon)."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        match = re.match(r"(\w+):\s+(\d+) kB", line)
        if match:
            fields[match.group(1)] = int(match.group(2))
    return {
        "rss_kb": fields["Rss"],
        "anonymous_kb": fields["Anonymous"],
        "private_dirty_kb": fields["Private_Dirty"],
        "file_backed_kb": fields["Rss"] - fields["Anonymous"],
    }


def _remaining(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def publish_qos0(topic: str, payload: bytes) -> bytes:
    body = len(topic).to_bytes(2, "big") + topic.encode() + payload
    return b"\x30" + _remaining(len(body)) + body


def connect_packet(client_id: str) -> bytes:
    body = b"\x00\x04MQTT\x04\x02\x00\x3c" + len(client_id).to_bytes(2, "big") + client_id.encode()
    return b"\x10" + _remaining(len(body)) + body


def wait_started(log: Path, proc: subprocess.Popen[bytes]) -> tuple[str, int]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        if log.exists():
            for line in log.read_text().splitlines():
                event = json.loads(line)
                if event["event"] == "proxy.started":
                    host, port = event["listen"].rsplit(":", 1)
                    return host, int(port)
        time.sleep(0.1)
    raise TimeoutError("proxy did not start")


def subscribe_and_read(addr: tuple[str, int], stop: threading.Event, counts: list[int]) -> None:
    """A QoS 0 subscriber to ``flood/#`` that reads (and counts the bytes of) everything until ``stop``."""
    sock = socket.create_connection(addr)
    sock.sendall(connect_packet("reader"))
    assert sock.recv(4)[0] == 0x20
    body = b"\x00\x01" + len(b"flood/#").to_bytes(2, "big") + b"flood/#" + b"\x00"
    sock.sendall(b"\x82" + _remaining(len(body)) + body)
    sock.settimeout(0.5)
    while not stop.is_set():
        try:
            counts[0] += len(sock.recv(1 << 20))
        except TimeoutError:
            continue
    sock.close()


def flood(addr: tuple[str, int], seconds: float, rate: int, size: int) -> int:
    sock = socket.create_connection(addr)
    sock.sendall(connect_packet("flood"))
    assert sock.recv(4)[0] == 0x20
    batch_n = max(1, rate // 100)
    batch = b"".join(publish_qos0(f"flood/{i % 16}", os.urandom(size)) for i in range(batch_n))
    sent, start = 0, time.monotonic()
    while (now := time.monotonic()) - start < seconds:
        due = int((now - start) * rate)
        if sent < due:
            sock.sendall(batch)
            sent += batch_n
        else:
            time.sleep(0.002)
    sock.close()
    return sent


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=int, default=15000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the proxy")
    parser.add_argument("--subscriber", action="store_true", help="a flood/# subscriber reads meanwhile")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log.jsonl"
        env = {**os.environ, **dict(item.split("=", 1) for item in args.env)}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mqproxy",
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                f"{tmp}/data",
            ],
            stdout=log.open("wb"),
            stderr=subprocess.PIPE,
            env={**env, "MQPROXY_LOG_REQUEST_SAMPLE_RATE": "0"},
        )
        try:
            addr = wait_started(log, proc)
            before = smaps(proc.pid)
            stop, received = threading.Event(), [0]
            reader = threading.Thread(target=subscribe_and_read, args=(addr, stop, received))
            if args.subscriber:
                reader.start()
                time.sleep(0.5)
            started = time.monotonic()
            sent = flood(addr, args.seconds, args.rate, args.size)
            elapsed = time.monotonic() - started
            after = smaps(proc.pid)
            if args.subscriber:
                time.sleep(2.0)
                stop.set()
                reader.join()
            time.sleep(args.settle)
            settled = smaps(proc.pid)
            disk = sum(p.stat().st_size for p in Path(tmp, "data").rglob("*") if p.is_file())
        finally:
            proc.terminate()
            proc.wait(30)
    result = {
        "sent": sent,
        "rate_per_s": round(sent / elapsed),
        "before": before,
        "after_flood": after,
        "after_settle": settled,
        "disk_bytes": disk,
        "subscriber_bytes": received[0],
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
