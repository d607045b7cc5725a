"""The client JVMs of ``bench/vs_rocketmq.py``: class paths, compiled drivers, and one run of a client to
its end (own process group, output lines timed as they arrive, killed after a timeout)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import stock_rocketmq as rmq

REPO = Path(__file__).resolve().parents[1]
JAVA = REPO / "bench" / "java"
EVENTS_JAVA = REPO / "tests" / "e2e" / "java" / "common"
CLIENT_HEAP_MB = 512
GATE_MAIN = "mqbench.Gate"
#: Seconds a gated client JVM waits at most for the others to be up.
GATE_TIMEOUT_S = 120.0


@dataclass
class JavaRun:
    """A client JVM's output lines, each with its arrival time (monotonic seconds)."""

    lines: list[tuple[float, str]] = field(default_factory=list)
    returncode: int | None = None
    started: float = 0.0
    elapsed: float = 0.0

    def events(self, name: str) -> list[dict[str, Any]]:
        out = []
        for _, line in self.lines:
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    obj = json.loads(line)
                    if isinstance(obj, dict) and obj.get("event") == name:
                        out.append(obj)
        return out

    def tail(self, n: int = 15) -> str:
        return "\n".join(line for _, line in self.lines[-n:])


class Clients:
    """Class paths, compiled drivers and the JVM command lines of the client side."""

    def __init__(self, home: Path, jfr: Path | None = None) -> None:
        self.home = home
        #: with a folder, every client JVM records a Java Flight Recording ``<run name>.jfr`` into it
        self.jfr = jfr
        home.mkdir(parents=True, exist_ok=True)
        self.bench_cp = rmq.classpath("bench")
        self.grpc_cp = rmq.classpath("grpc-java")
        remoting = rmq.compile_java(
            [JAVA / "remoting", JAVA / "common", EVENTS_JAVA], self.bench_cp, name="vs-rocketmq-remoting"
        )
        grpc = rmq.compile_java(
            [JAVA / "grpc", JAVA / "common", EVENTS_JAVA], self.grpc_cp, name="vs-rocketmq-grpc"
        )
        self.remoting_cp = f"{remoting}{os.pathsep}{self.bench_cp}"
        self.grpc_driver_cp = f"{grpc}{os.pathsep}{self.grpc_cp}"

    def argv(self, cp: str, main: str, args: Sequence[str], gate: Sequence[str] = ()) -> list[str]:
        """The JVM running ``main ARGS``; with ``gate`` (:meth:`StartGate.args`) held until the gate opens."""
        if gate:
            main, args = GATE_MAIN, [*gate, "--", main, *args]
        # the same JVM for every target; client logs under home (user.home)
        return rmq.jvm_argv(
            cp,
            main,
            args,
            heap_mb=CLIENT_HEAP_MB,
            home=self.home,
            extra=(f"-Xms{CLIENT_HEAP_MB}m", f"-Drocketmq.client.logRoot={self.home / 'logs'}"),
        )

    def run(
        self,
        name: str,
        argv: list[str],
        *,
        timeout: float,
        stop_after: Callable[[JavaRun], float | None] | None = None,
    ) -> JavaRun:
        """Run one client JVM (own process group) to its end, or until ``stop_after(run)`` returns a
        monotonic deadline that has passed (then SIGTERM); killed after ``timeout`` seconds."""
        if self.jfr is not None:
            self.jfr.mkdir(parents=True, exist_ok=True)
            recording = self.jfr / f"{name.replace('/', '-')}.jfr"
            jfr = f"-XX:StartFlightRecording=settings=profile,dumponexit=true,filename={recording}"
            argv = [argv[0], jfr, *argv[1:]]
        run = JavaRun(started=time.monotonic())
        # own process group, and killed with this process if it dies (the launcher's way for its JVMs)
        proc = rmq.popen_in_group(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.home
        )
        assert proc.stdout is not None

        def read() -> None:
            for raw in proc.stdout:  # type: ignore[union-attr]
                run.lines.append((time.monotonic(), raw.decode("utf-8", "replace").rstrip("\n")))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        hard = run.started + timeout
        try:
            while proc.poll() is None:
                deadline = stop_after(run) if stop_after else None
                now = time.monotonic()
                if now > hard or (deadline is not None and now >= deadline):
                    _stop_group(proc)
                    break
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                _stop_group(proc, kill=True)
            run.returncode = proc.wait()
            reader.join(5)
        run.elapsed = time.monotonic() - run.started
        # its output stays in the work directory (kept with --keep or when something failed)
        log = self.home / f"{name.replace('/', '-')}.out"
        log.write_text("".join(f"{at - run.started:9.3f} {line}\n" for at, line in run.lines))
        return run


class StartGate:
    """Lets ``parties`` client JVMs (started through ``bench/java/remoting/Gate.java``) begin at once:
    each creates ``<path>.<id>.ready`` when loaded; :meth:`open_when_ready` then creates ``path``."""

    def __init__(self, path: Path, parties: int, timeout_s: float = GATE_TIMEOUT_S) -> None:
        self.path, self.parties, self.timeout_s = path, parties, timeout_s
        self.opened_at: float | None = None  # monotonic

    def args(self, index: int) -> list[str]:
        """Arguments for :meth:`Clients.argv`'s ``gate`` of party ``index``."""
        return ["--file", str(self.path), "--id", str(index), "--timeout", str(self.timeout_s)]

    def open_when_ready(self) -> bool:
        """Block until every party is ready, then open; False (still shut) after the timeout."""
        deadline = time.monotonic() + self.timeout_s
        ready = [self.path.with_name(f"{self.path.name}.{i}.ready") for i in range(self.parties)]
        while not all(r.exists() for r in ready):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        self.path.touch()
        self.opened_at = time.monotonic()
        return True


def _stop_group(proc: subprocess.Popen[bytes], *, kill: bool = False) -> None:
    """SIGTERM (or SIGKILL) the process group we started for one client, SIGKILL after 10 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
