#!/usr/bin/env python3
"""JVM processes of the stock-RocketMQ launcher: started in their own process group, watched until
ready, stopped by pid, and killed when the Python process that started them exits.

Contracts:

* :class:`JavaProcess` ``start()`` then ``wait_ready()`` returns once its log holds the ready line and its
  port accepts connections; a JVM that exits, is late or finds its port taken raises
  :class:`~java_toolchain.LauncherError` (:class:`PortTaken` for the last) with a one-line message, after
  stopping the JVM. ``stop()`` is safe to call twice.
* :func:`popen_in_group` starts any child in a new process group that dies with this process.
* :func:`free_port` finds a free 127.0.0.1 port whose neighbours are free too.
Standard library only.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from java_toolchain import LauncherError

START_TIMEOUT = 90.0
STOP_TIMEOUT = 15.0


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """New process group; and, when forked from the main thread, SIGKILL when the parent dies.

    (PR_SET_PDEATHSIG fires when the forking *thread* ends, so it is only safe from the main thread.)
    """
    os.setsid()
    if _FORKED_FROM_MAIN:
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


_FORKED_FROM_MAIN = True


def popen_in_group(argv: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
    """``subprocess.Popen`` in a new process group that is killed when this process dies."""
    global _FORKED_FROM_MAIN
    _FORKED_FROM_MAIN = threading.current_thread() is threading.main_thread()
    return subprocess.Popen(argv, preexec_fn=_die_with_parent, **kwargs)  # type: ignore[call-overload]


def free_port(*, neighbours: Sequence[int] = ()) -> int:
    """A free 127.0.0.1 TCP port P such that every P+d for d in ``neighbours`` is free too."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if all(_port_free(port + d) for d in neighbours):
            return port
    raise LauncherError("no free port group found on 127.0.0.1 after 200 tries")


def _port_free(port: int) -> bool:
    if not 1024 < port < 65536:
        return False
    for host in ("127.0.0.1", "0.0.0.0"):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class JavaProcess:
    """One JVM started by the launcher; ``log`` holds its stdout and stderr."""

    name: str
    argv: list[str]
    log: Path
    ready_line: str
    port: int
    cwd: Path
    proc: subprocess.Popen[bytes] | None = None
    #: Size of ``log`` when this start began: a retry appends to the same file, and only what this JVM
    #: wrote (after the offset) says whether it is ready or found its port taken.
    log_offset: int = 0

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log_offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.proc = popen_in_group(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.cwd
            )
        _register(self)

    def _own_log(self) -> str:
        """What this start of the JVM has written to ``log`` so far."""
        if not self.log.exists():
            return ""
        with open(self.log, "rb") as f:
            f.seek(self.log_offset)
            return f.read().decode(errors="replace")

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            assert self.proc is not None
            text = self._own_log()
            if self.proc.poll() is not None:
                rc = self.proc.returncode
                self.stop()
                raise LauncherError(
                    f"{self.name} exited with {rc} before it was ready: "
                    f"{_jvm_failure(text)} (log: {self.log})"
                )
            if "Address already in use" in text:
                self.stop()
                raise PortTaken(f"{self.name}: port {self.port} (or a neighbour) is taken (log: {self.log})")
            if self.ready_line in text and _port_open(self.port):
                return
            if time.monotonic() > deadline:
                self.stop()
                raise LauncherError(
                    f"{self.name} not ready within {timeout:.0f} s: {_jvm_failure(text)} (log: {self.log})"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, *, kill: bool = False) -> None:
        """Stop the JVM and its process group: SIGTERM (or SIGKILL), then SIGKILL after a grace."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        _unregister(self)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


class PortTaken(LauncherError):
    """A port chosen free was taken by someone else before the JVM bound it; the caller retries."""


def _jvm_failure(text: str) -> str:
    for line in text.splitlines():
        stripped = line.strip()
        if any(k in stripped for k in ("Exception", "Error:", "error:")):
            return stripped[:300]
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


_LIVE: dict[int, JavaProcess] = {}


def _register(proc: JavaProcess) -> None:
    _LIVE[id(proc)] = proc


def _unregister(proc: JavaProcess) -> None:
    _LIVE.pop(id(proc), None)


def stop_all() -> None:
    """Kill every JVM this Python process started and has not stopped (used at exit)."""
    for proc in list(_LIVE.values()):
        proc.stop(kill=True)


atexit.register(stop_all)
