"""The processes of the end-to-end tests: ``mqproxy serve`` as a real subprocess (:class:`ProxyProcess`),
third-party client drivers (:class:`Client` / :class:`ClientRun`), and the JSON-line reader both use.

Contracts: ``ProxyProcess.start()`` returns once the proxy logged ``proxy.started`` (the test fails
otherwise, with the log tail); ``stop()`` sends SIGTERM and returns the exit status. A :class:`ClientRun`
reads its driver's stdout JSON lines as they come; ``discover_clients`` finds the installed remoting
clients (``scripts/setup-clients.sh``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ..conftest import wait_until_sync  # type: ignore[import-not-found]

REPO = Path(__file__).resolve().parents[2]
DRIVERS = Path(__file__).resolve().parent / "clients"
CLIENT_ENVS = REPO / ".clients"
START_TIMEOUT = 20.0
STOP_TIMEOUT = 15.0


def proxy_executable() -> str | None:
    configured = os.environ.get("E2E_MQPROXY_BIN")
    if configured:
        return configured
    beside = Path(sys.executable).parent / "mqproxy"
    if beside.exists():
        return str(beside)
    return shutil.which("mqproxy")


class JsonLineReader:
    """Drain a child's stdout on a thread, keeping every line and the ones that parse as JSON objects."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[str] = []
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self._thread.start()

    def _run(self, stream: Any) -> None:
        for raw in stream:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            with self._cond:
                self.lines.append(line)
                if isinstance(obj, dict):
                    self.events.append(obj)
                self._cond.notify_all()
        stream.close()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any] | None:
        """Return the first event matching ``predicate``; None on timeout or end of stream."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for event in self.events:
                    if predicate(event):
                        return event
                remaining = deadline - time.monotonic()
                if self._closed or remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def tail(self, n: int = 40) -> str:
        with self._cond:
            return "\n".join(self.lines[-n:])


def _bindable(host: str, port: int) -> bool:
    """Whether a listener could bind ``host:port`` now (as the proxy binds: SO_REUSEADDR)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


class ProxyProcess:
    """One ``mqproxy serve`` child. ``address`` is ``"127.0.0.1:PORT"`` once started."""

    def __init__(
        self,
        executable: str,
        data_dir: Path,
        log_dir: Path,
        env: dict[str, str] | None = None,
        args: Sequence[str] = (),
    ) -> None:
        self.executable = executable
        #: Extra ``serve`` arguments (e.g. ``--config FILE``).
        self.args = tuple(args)
        #: Extra environment for the child (e.g. ``MQPROXY_BROKER_*`` settings); None: inherit only.
        self.env = env
        self.data_dir = data_dir
        self.log_dir = log_dir
        self.address: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.reader: JsonLineReader | None = None
        self.returncodes: list[int] = []
        self._runs = 0

    def start(self, listen: str = "127.0.0.1:0", *, attempts: int = 1) -> str:
        """Start the proxy; with ``attempts`` > 1 a failed start (e.g. the fixed port was taken by
        another process's ephemeral connection meanwhile) is retried once the port is free again."""
        host, port = listen.rsplit(":", 1)
        for attempt in range(1, attempts + 1):
            address = self._start_once(listen, last=attempt == attempts)
            if address is not None:
                return address
            wait_until_sync(lambda: _bindable(host, int(port)))
        raise AssertionError("unreachable")

    def _start_once(self, listen: str, *, last: bool) -> str | None:
        assert self.proc is None, "proxy already running"
        self._runs += 1
        cmd = [self.executable, "serve", "--listen", listen, "--data-dir", str(self.data_dir),
               "--log-format", "json", *self.args]
        with open(self.log_dir / f"proxy-{self._runs}.stderr", "wb") as stderr:
            env = dict(os.environ, **self.env) if self.env else None
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL,
                                         env=env)
        self.reader = JsonLineReader(self.proc.stdout)
        started = self.reader.wait_for(lambda e: e.get("event") == "proxy.started", START_TIMEOUT)
        if started is None:
            self.kill()
            if not last:
                return None
            pytest.fail(f"proxy did not report proxy.started within {START_TIMEOUT} s (exit status "
                        f"{self.returncodes[-1]}):\n{self.diagnostics()}")
        self.address = str(started["listen"])
        return self.address

    @property
    def port(self) -> int:
        assert self.address is not None
        return int(self.address.rsplit(":", 1)[1])

    def stop(self) -> int:
        """SIGTERM and wait; fails the test if the proxy does not exit in time."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"proxy ignored SIGTERM for {STOP_TIMEOUT} s:\n{self.diagnostics()}")
        self._finish(rc)
        return rc

    def restart(self) -> str:
        """Graceful stop, then start again on the same data dir and port."""
        port = self.port
        rc = self.stop()
        assert rc == 0, f"proxy exited with {rc} on SIGTERM:\n{self.diagnostics()}"
        return self.start(f"127.0.0.1:{port}", attempts=10)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self._finish(self.proc.wait())

    def _finish(self, rc: int) -> None:
        self.returncodes.append(rc)
        if self.reader is not None:
            self.reader.join(5)
        self.proc = None

    def diagnostics(self) -> str:
        stderr = ""
        for path in sorted(self.log_dir.glob("proxy-*.stderr")):
            stderr += path.read_text(errors="replace")[-4000:]
        stdout = self.reader.tail() if self.reader is not None else ""
        return f"--- proxy stdout (tail) ---\n{stdout}\n--- proxy stderr (tail) ---\n{stderr}"


@dataclass
class ClientRun:
    """A running client driver; ``events`` fills in as the child prints JSON lines."""

    name: str
    proc: subprocess.Popen[bytes]
    reader: JsonLineReader
    stderr_path: Path
    returncode: int | None = None
    elapsed: float = 0.0
    _t0: float = field(default_factory=time.monotonic)

    def wait(self, timeout: float) -> ClientRun:
        try:
            self.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.returncode = self.proc.wait()
        self.reader.join(5)
        self.elapsed = time.monotonic() - self._t0
        return self

    def release(self) -> None:
        """Close the driver's stdin: a driver that stays up until then (``produce-txn``) finishes."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()

    def of(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.reader.events if e.get("event") == event]

    def done(self) -> dict[str, Any] | None:
        found = self.of("done")
        return found[-1] if found else None

    def describe(self) -> str:
        stderr = self.stderr_path.read_text(errors="replace")[-3000:] if self.stderr_path.exists() else ""
        return (f"{self.name}: rc={self.returncode} after {self.elapsed:.1f} s\n--- stdout (tail) ---\n"
                f"{self.reader.tail()}\n--- stderr (tail) ---\n{stderr}")


@dataclass
class Client:
    """One installed remoting client: ``argv`` runs its driver (see tests/e2e/clients/)."""

    name: str
    argv: list[str]
    home: Path
    workdir: Path
    segfaults_on_exit: bool = False
    _runs: int = 0

    def spawn(self, *args: str, hold: bool = False) -> ClientRun:
        """Start the driver; with ``hold`` its stdin stays open until :meth:`ClientRun.release`."""
        self._runs += 1
        stderr_path = self.workdir / f"{self.name}-{self._runs}.stderr"
        env = dict(os.environ, HOME=str(self.home), PYTHONUNBUFFERED="1")
        with open(stderr_path, "wb") as stderr:
            proc = subprocess.Popen([*self.argv, *args], stdout=subprocess.PIPE, stderr=stderr,
                                    stdin=subprocess.PIPE if hold else subprocess.DEVNULL, env=env,
                                    cwd=self.workdir)
        return ClientRun(f"{self.name} {args[0]}", proc, JsonLineReader(proc.stdout), stderr_path)

    def run(self, *args: str, timeout: float = 60.0) -> ClientRun:
        """Spawn and wait (the run is killed after ``timeout`` seconds)."""
        return self.spawn(*args).wait(timeout)

    def produce(self, namesrv: str, topic: str, count: int, *, start: int = 0, tag: str = "TagA",
                key: str = "key", body: str = "body", props: dict[str, str] | None = None,
                timeout: float = 30.0) -> ClientRun:
        args = ["produce", "--namesrv", namesrv, "--topic", topic, "--count", str(count),
                "--start", str(start), "--tag", tag, "--key", key, "--body", body]
        for k, v in (props or {}).items():
            args += ["--prop", f"{k}={v}"]
        return self.spawn(*args).wait(timeout)

    def consume(self, namesrv: str, topic: str, group: str, expect: int, *, timeout: float = 30.0,
                linger: float = 0.0, prop_keys: tuple[str, ...] = ()) -> ClientRun:
        """Start a push consumer in the background; call ``.wait()`` on the result."""
        args = ["consume", "--namesrv", namesrv, "--topic", topic, "--group", group, "--expect", str(expect),
                "--timeout", str(timeout), "--linger", str(linger)]
        for k in prop_keys:
            args += ["--prop-key", k]
        return self.spawn(*args)


def discover_clients(home: Path, workdir: Path) -> dict[str, Client]:
    found: dict[str, Client] = {}
    cpp_driver = str(DRIVERS / "cpp_client.py")
    for name, crashes in (("py044", False), ("pycvs", True)):
        python = CLIENT_ENVS / name / "bin" / "python"
        if python.exists():
            found[name] = Client(name, [str(python), cpp_driver], home, workdir, segfaults_on_exit=crashes)
    node = shutil.which("node")
    if node and (DRIVERS / "node_modules" / "ali-ons" / "package.json").exists():
        found["alions"] = Client("alions", [node, str(DRIVERS / "alions.js")], home, workdir)
    return found
