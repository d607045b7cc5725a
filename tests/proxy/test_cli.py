"""The ``mqproxy serve`` command as a newcomer runs it: a real process, real signals."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import log_events, serve_proxy, wait_proxy_started  # type: ignore[import-not-found]


def _start(
    tmp_path: Path, *extra: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / "stdout.jsonl"
    return serve_proxy(tmp_path / "data", *extra, stdout=log.open("wb"), env=env), log


def _get(addr: tuple[str, int], path: str) -> bytes:
    with socket.create_connection(addr, timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_answers_healthz_and_stops_gracefully_on_signal(tmp_path: Path, sig: signal.Signals) -> None:
    proc, log = _start(tmp_path)
    try:
        addr = wait_proxy_started(proc, log)
        assert addr[0] == "127.0.0.1"
        assert addr[1] > 0
        assert _get(addr, "/healthz").startswith(b"HTTP/1.1 200 OK")
        proc.send_signal(sig)
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
    names = [e["event"] for e in log_events(log)]
    assert names.index("store.recovered") < names.index("proxy.started") < names.index("proxy.stopping")
    assert names[-1] == "proxy.stopped"
    assert next(e for e in log_events(log) if e["event"] == "proxy.stopping")["reason"] == sig.name
    assert (tmp_path / "data").is_dir()


def test_unknown_config_key_is_a_clear_startup_error(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[store]\nflsh = 'sync'\n")
    proc = subprocess.run(
        [sys.executable, "-m", "mqproxy", "serve", "--config", str(cfg)], capture_output=True, timeout=30
    )
    assert proc.returncode == 2
    assert b"store.flsh" in proc.stderr


def test_env_override_out_of_range_names_the_key(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mqproxy", "serve", "--listen", "127.0.0.1:0"],
        capture_output=True,
        timeout=30,
        env={**os.environ, "MQPROXY_SERVER_SNIFF_TIMEOUT_S": "0"},
    )
    assert proc.returncode == 2
    assert b"server.sniff_timeout_s" in proc.stderr


def test_rocketmq_backend_without_a_name_server_names_the_key(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mqproxy", "serve", "--listen", "127.0.0.1:0"],
        capture_output=True,
        timeout=30,
        env={**os.environ, "MQPROXY_BACKEND_KIND": "rocketmq", "MQPROXY_BACKEND_NAMESRV": "ns1:9876;ns2"},
    )
    assert proc.returncode == 2
    assert b"backend.namesrv" in proc.stderr


def test_busy_port_fails_with_a_message(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "mqproxy",
                "serve",
                "--listen",
                f"127.0.0.1:{port}",
                "--data-dir",
                str(tmp_path / "d"),
            ],
            capture_output=True,
            timeout=30,
        )
    assert proc.returncode == 1
    assert b"cannot start" in proc.stderr


def test_bad_trace_topic_stops_startup_with_status_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mqproxy", "serve", "--listen", "127.0.0.1:0"],
        capture_output=True,
        timeout=30,
        env={**os.environ, "MQPROXY_TRACE_ENABLED": "true", "MQPROXY_TRACE_TOPIC": "no/slash"},
    )
    assert proc.returncode == 2
    assert b"trace.topic" in proc.stderr
