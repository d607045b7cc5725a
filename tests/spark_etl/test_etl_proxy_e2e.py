"""End to end: run the real proxy, drive its protocols, then run the batch job on its own log file and
check the tables count exactly what was sent."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.e2e]

SENDS = 5
HEALTH_CHECKS = 3
GARBAGE_CONNECTIONS = 2


def _frame(header: dict[str, Any], body: bytes = b"") -> bytes:
    h = json.dumps(header).encode()
    return struct.pack(">ii", 4 + len(h) + len(body), len(h)) + h + body


def _read_frame(sock: socket.socket) -> dict[str, Any]:
    buf = b""
    while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">i", buf)[0]:
        chunk = sock.recv(65536)
        assert chunk, "proxy closed the remoting connection"
        buf += chunk
    header_len = struct.unpack_from(">i", buf, 4)[0] & 0xFFFFFF
    return json.loads(buf[8 : 8 + header_len])


def _start_proxy(tmp: Path) -> tuple[subprocess.Popen[bytes], tuple[str, int], Path]:
    log = tmp / "logs" / "mqproxy.log"
    env = {**os.environ, "MQPROXY_LOG_FILE": str(log)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mqproxy",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            str(tmp / "data"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if log.exists():
            for line in log.read_text().splitlines():
                event = json.loads(line)
                if event["event"] == "proxy.started":
                    host, port = event["listen"].rsplit(":", 1)
                    return proc, (host, int(port)), log
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("proxy did not start")


def _drive(addr: tuple[str, int]) -> None:
    for _ in range(HEALTH_CHECKS):
        with socket.create_connection(addr, timeout=10) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
    for _ in range(GARBAGE_CONNECTIONS):
        with socket.create_connection(addr, timeout=10) as s:
            s.sendall(b"\xffgarbage\xfe")
            assert s.recv(65536) == b""
    with socket.create_connection(addr, timeout=10) as s:
        s.sendall(_frame({"code": 105, "opaque": 1, "flag": 0, "extFields": {"topic": "EtlTopic"}}))
        assert _read_frame(s)["code"] == 0
        for i in range(SENDS):
            ext = {
                "a": "EtlProducers",
                "b": "EtlTopic",
                "c": "TBW102",
                "d": "4",
                "e": "0",
                "f": "0",
                "g": str(int(time.time() * 1000)),
                "h": "0",
                "i": "TAGS\x01t\x02",
                "j": "0",
                "k": "false",
            }
            s.sendall(_frame({"code": 310, "opaque": 10 + i, "flag": 0, "extFields": ext}, b"body-%d" % i))
            assert _read_frame(s)["code"] == 0


def test_batch_job_counts_what_the_proxy_served(spark: Any, tmp_path: Path) -> None:
    from mqproxy.spark_etl.batch import run_batch

    proc, addr, log = _start_proxy(tmp_path)
    try:
        _drive(addr)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    out = tmp_path / "tables"
    summary = run_batch(spark, str(log.parent), str(out))
    assert summary.malformed == 0
    assert summary.valid_events == len(log.read_text().splitlines())

    connections = spark.read.parquet(str(out / "connections"))
    by_protocol = {r["protocol"]: r["count"] for r in connections.groupBy("protocol").count().collect()}
    assert by_protocol.get("http") == HEALTH_CHECKS
    assert by_protocol.get("remoting") == 1

    failures = spark.read.parquet(str(out / "negotiation_failures")).collect()
    assert sum(r["failures"] for r in failures) == GARBAGE_CONNECTIONS
    assert {r["reason"] for r in failures} == {"unknown_protocol"}

    requests = spark.read.parquet(str(out / "requests"))
    sends = requests.where((requests.protocol == "remoting") & (requests.op == "SEND_MESSAGE_V2")).collect()
    assert len(sends) == SENDS
    assert all(
        r["outcome"] == "ok" and r["topic"] == "EtlTopic" and r["group"] == "EtlProducers" for r in sends
    )
    health = requests.where(requests.protocol == "http").count()
    assert health == HEALTH_CHECKS
