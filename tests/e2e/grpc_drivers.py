"""Harness of the gRPC client tests: the client drivers (PyPI rocketmq-python-client 5 through
``grpc_py5_client.py`` in its own venv, npm rocketmq-client-nodejs through ``grpc_node/client.js``) and
their JSON-line events, a test CA with a 127.0.0.1 certificate, and ``mqproxy serve`` with TLS as a
subprocess whose log the tests read."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme

from ..conftest import wait_until_sync  # type: ignore[import-not-found]

REPO = Path(__file__).resolve().parents[2]
PY5 = REPO / ".clients" / "py5" / "bin" / "python"
DRIVER = Path(__file__).resolve().parent / "grpc_py5_client.py"
NODE_DIR = Path(__file__).resolve().parent / "grpc_node"


@dataclass
class Tls:
    ca_file: Path
    cert_file: Path
    key_file: Path


def make_tls(base: Path) -> Tls:
    """A test CA and a certificate for 127.0.0.1 / localhost, written under ``base``."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    files = Tls(base / "ca.pem", base / "cert.pem", base / "key.pem")
    ca.cert_pem.write_to_path(str(files.ca_file))
    cert.cert_chain_pems[0].write_to_path(str(files.cert_file))
    cert.private_key_pem.write_to_path(str(files.key_file))
    return files


def client_env(home: Path, tls: Tls) -> dict[str, str]:
    return dict(
        os.environ, HOME=str(home), PYTHONUNBUFFERED="1", GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=str(tls.ca_file)
    )


def parse_events(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


@dataclass
class Run:
    returncode: int
    events: list[dict[str, Any]]
    stderr: str

    def of(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == name]


def run_py5(
    env: dict[str, str],
    command: str,
    endpoint: str,
    topic: str,
    group: str | None = None,
    *,
    limit_s: float = 90,
    **options: object,
) -> Run:
    """Run the py5 driver's ``command`` against ``endpoint`` / ``topic`` (/ ``group``), then each option as
    ``--name value`` (``name_x`` becomes ``--name-x``; ``True`` is a bare flag)."""
    argv = [command, "--endpoint", endpoint, "--topic", topic]
    if group is not None:
        argv += ["--group", group]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return run_driver([str(PY5), str(DRIVER), *argv], env, limit_s)


def run_node(node: str, env: dict[str, str], *args: str, limit_s: float = 90) -> Run:
    """Run the Node.js driver (``grpc_node/client.js``) with ``args``."""
    return run_driver([node, "client.js", *args], env, limit_s, cwd=NODE_DIR)


def run_driver(argv: list[str], env: dict[str, str], limit_s: float, cwd: Path | None = None) -> Run:
    """Run one driver process to its end; its stdout JSON lines become :attr:`Run.events`."""
    done = subprocess.run(
        argv, cwd=cwd, capture_output=True, env=env, timeout=limit_s, stdin=subprocess.DEVNULL, check=False
    )
    return Run(
        done.returncode,
        parse_events(done.stdout.decode("utf-8", "replace")),
        done.stderr.decode("utf-8", "replace")[-3000:],
    )


async def arun_py5(
    env: dict[str, str], command: str, endpoint: str, topic: str, group: str | None = None, **options: object
) -> Run:
    return await trio.to_thread.run_sync(lambda: run_py5(env, command, endpoint, topic, group, **options))


class SubprocessProxy:
    """``mqproxy serve`` with TLS on the shared port; stdout goes to a file (never a pipe)."""

    def __init__(self, executable: str, base: Path, tls: Tls) -> None:
        self.log_path = base / "proxy.jsonl"
        env = dict(
            os.environ, MQPROXY_TLS_CERT_FILE=str(tls.cert_file), MQPROXY_TLS_KEY_FILE=str(tls.key_file)
        )
        (base / "data").mkdir()
        with open(self.log_path, "wb") as out, open(base / "proxy.stderr", "wb") as err:
            self.proc = subprocess.Popen(
                [
                    executable,
                    "serve",
                    "--listen",
                    "127.0.0.1:0",
                    "--data-dir",
                    str(base / "data"),
                    "--log-format",
                    "json",
                ],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env,
            )

        def started() -> list[dict[str, Any]]:
            return [e for e in self.events() if e.get("event") == "proxy.started"]

        with contextlib.suppress(AssertionError):
            wait_until_sync(lambda: started() or self.proc.poll() is not None)
        if not started():
            self.proc.kill()
            pytest.fail(f"proxy did not start:\n{(base / 'proxy.stderr').read_text()[-3000:]}")
        self.address = str(started()[0]["listen"])

    def events(self) -> list[dict[str, Any]]:
        return parse_events(self.log_path.read_text(errors="replace"))

    def requests(self, op: str) -> list[dict[str, Any]]:
        return [e for e in self.events() if e.get("event") == "request" and e.get("op") == op]

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(20)


def produce(env: dict[str, str], ep: str, topic: str, count: int) -> list[str]:
    """Send ``count`` messages with the py5 driver; their message ids."""
    run = run_py5(env, "produce", ep, topic, count=count)
    assert run.returncode == 0, run.stderr
    return [e["message_id"] for e in run.of("sent")]
