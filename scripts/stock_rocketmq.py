#!/usr/bin/env python3
"""Stock Apache RocketMQ for tests and benchmarks: fetched from Maven Central, run on loopback.

Nothing here is committed but this file: every jar comes from Maven Central at test time, through
``mvn dependency:copy-dependencies``, into a cache folder outside git (``$MQTEST_CACHE``, default
``<repo>/.cache``; not an ``MQPROXY_*`` name, which mqproxy would read as a setting).
Standard library only, so tests, benchmarks and a shell can all use it.

Contracts:

* :func:`classpath` returns the jars of one named artifact set (:data:`ARTIFACT_SETS`), fetching them once.
* :class:`StockCluster` starts a name server, N brokers of one cluster (LMQ and multi-dispatch on, SQL92
  filtering on, small commit-log files, free ports, 127.0.0.1) and optionally RocketMQ's own proxy in
  ``local`` or ``cluster`` mode. ``start()`` returns once every process is ready; ``stop()`` kills by pid
  (process group) and is safe to call twice; every JVM also dies with the Python process that started it.
  Logs land under the cluster's work directory.
* :func:`compile_java` compiles a folder of ``.java`` sources against a classpath once per source hash.
* Every failure raises :class:`LauncherError` whose message is one line saying what failed
  (Maven unreachable, Java missing, port taken, JVM error, not ready in time).

The stock broker's HA listener (``haListenPort``) and RocketMQ's proxy listeners bind the wildcard
address; RocketMQ 5.3 has no setting to bind them elsewhere. They get free ports like everything else.

Command line (for people)::

    python scripts/stock_rocketmq.py fetch [SET ...]            # warm the cache
    python scripts/stock_rocketmq.py run --brokers 2 --proxy cluster   # foreground until Ctrl-C
    python scripts/stock_rocketmq.py mqadmin -n 127.0.0.1:PORT clusterList
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("MQTEST_CACHE", REPO / ".cache"))
ROCKETMQ_VERSION = "5.3.3"

#: Named artifact sets: each is fetched with its transitive runtime dependencies into its own folder.
ARTIFACT_SETS: dict[str, tuple[str, ...]] = {
    # name server, broker, proxy and mqadmin (rocketmq-tools) of one release
    "server": tuple(
        f"org.apache.rocketmq:rocketmq-{a}:{ROCKETMQ_VERSION}"
        for a in ("namesrv", "broker", "proxy", "tools")
    ),
    # the 4.x remoting client, with the ACL 1.0 RPC hook
    "client4": ("org.apache.rocketmq:rocketmq-client:4.9.8", "org.apache.rocketmq:rocketmq-acl:4.9.8"),
    # the 5.x remoting client (pop consumption, ACL hook included since 5.3.3)
    "client5": (f"org.apache.rocketmq:rocketmq-client:{ROCKETMQ_VERSION}",),
    # the 5.x gRPC client
    "grpc-java": ("org.apache.rocketmq:rocketmq-client-java:5.2.0",),
    # Apache RocketMQ's own benchmark Producer/Consumer (org.apache.rocketmq.example.benchmark)
    "bench": ("org.apache.rocketmq:rocketmq-example:5.5.0",),
}

#: Java 17 needs these for RocketMQ's store and Netty (RocketMQ targets Java 8).
JAVA17_OPENS = (
    "--add-opens",
    "java.base/java.lang=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.nio=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.util=ALL-UNNAMED",
    "--add-opens",
    "java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-exports",
    "java.base/sun.nio.ch=ALL-UNNAMED",
)

START_TIMEOUT = 90.0
STOP_TIMEOUT = 15.0


class LauncherError(RuntimeError):
    """Something the launcher needs failed; the message is one line saying what."""


# ----------------------------------------------------------------------------------------------- fetch


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _pom(coords: Sequence[str]) -> str:
    deps = []
    for coord in coords:
        group, artifact, version = coord.split(":")
        deps.append(
            f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
            f"<version>{version}</version></dependency>"
        )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>mqproxy.tests</groupId><artifactId>deps</artifactId><version>1</version>"
        f"<packaging>pom</packaging><dependencies>{''.join(deps)}</dependencies></project>\n"
    )


def _maven_failure(output: str) -> str:
    lowered = output.lower()
    if any(
        s in lowered
        for s in (
            "unknownhost",
            "could not transfer",
            "connection refused",
            "connect timed out",
            "network is unreachable",
        )
    ):
        return "Maven Central unreachable"
    for line in output.splitlines():
        if "[ERROR]" in line and line.strip() != "[ERROR]":
            return line.replace("[ERROR]", "").strip()[:300]
    return output.strip().splitlines()[-1][:300] if output.strip() else "mvn failed without output"


def fetch(name: str) -> Path:
    """The folder of jars of artifact set ``name``, fetched from Maven Central on first use."""
    coords = ARTIFACT_SETS[name]
    digest = hashlib.sha256("\n".join(coords).encode()).hexdigest()[:12]
    home = CACHE / "maven" / f"{name}-{digest}"
    lib = home / "lib"
    stamp = home / "complete"
    if stamp.exists():
        return lib
    mvn = shutil.which("mvn")
    if mvn is None:
        raise LauncherError("Maven (mvn) not found: install it (Debian package maven) to fetch RocketMQ jars")
    with _locked(home / ".lock"):
        if stamp.exists():
            return lib
        home.mkdir(parents=True, exist_ok=True)
        (home / "pom.xml").write_text(_pom(coords))
        if lib.exists():
            shutil.rmtree(lib)
        cmd = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(home / "pom.xml"),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={lib}",
            "-DincludeScope=runtime",
        ]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        except subprocess.TimeoutExpired as exc:
            raise LauncherError(f"fetching {name} from Maven Central took over 900 s") from exc
        if done.returncode != 0 or not lib.is_dir():
            raise LauncherError(
                f"fetching {name} ({', '.join(coords)}): {_maven_failure(done.stdout + done.stderr)}"
            )
        stamp.write_text("\n".join(coords) + "\n")
    return lib


def classpath(*names: str) -> str:
    """A Java class path (``dir/*`` entries) for the given artifact sets, fetched on first use."""
    return os.pathsep.join(str(fetch(n) / "*") for n in names)


def java_executable() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise LauncherError("Java not found: install a JDK 17 (scripts/setup-system.sh does)")
    return found


def compile_java(sources: Path | Sequence[Path], cp: str, *, name: str | None = None) -> Path:
    """Compile every ``.java`` file under ``sources`` (one folder or several) against ``cp``.

    Returns the classes folder; compiled once per hash of the sources and the class path, in the cache.
    """
    roots = [sources] if isinstance(sources, Path) else list(sources)
    files = sorted(f for root in roots for f in root.rglob("*.java"))
    if not files:
        raise LauncherError(f"no .java files under {', '.join(map(str, roots))}")
    digest = hashlib.sha256(cp.encode())
    for f in files:
        digest.update(str(f.relative_to(f.parents[1])).encode())
        digest.update(f.read_bytes())
    out = CACHE / "classes" / f"{name or roots[0].name}-{digest.hexdigest()[:12]}"
    if (out / ".complete").exists():
        return out
    javac = shutil.which("javac") or str(Path(java_executable()).parent / "javac")
    if not Path(javac).exists():
        raise LauncherError(
            "javac not found: install a JDK 17, not only a JRE (scripts/setup-system.sh does)"
        )
    with _locked(out.with_suffix(".lock")):
        if (out / ".complete").exists():
            return out
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        done = subprocess.run(
            [javac, "-nowarn", "-encoding", "UTF-8", "-d", str(out), "-cp", cp, *map(str, files)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            first = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr.strip())
            raise LauncherError(f"javac failed: {first[:300]}")
        (out / ".complete").write_text("ok\n")
    return out


# --------------------------------------------------------------------------------------------- processes


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """New process group; and, when forked from the main thread, SIGKILL when the parent dies.

    (PR_SET_PDEATHSIG fires when the forking *thread* ends, so it is only safe from the main thread.)
    """
    os.setsid()
    if _FORKED_FROM_MAIN:
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


_FORKED_FROM_MAIN = True


def _popen(argv: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
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

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = _popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.cwd
            )
        _register(self)

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            assert self.proc is not None
            text = self.log.read_text(errors="replace") if self.log.exists() else ""
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


import atexit  # noqa: E402  (registered next to the function it calls)

atexit.register(stop_all)


def jvm_argv(
    cp: str, main: str, args: Sequence[str], *, heap_mb: int = 256, home: Path, extra: Sequence[str] = ()
) -> list[str]:
    """The command line of a RocketMQ JVM: Java 17 flags, a small heap, ``home`` for its logs."""
    return [
        java_executable(),
        f"-Xms{min(heap_mb, 128)}m",
        f"-Xmx{heap_mb}m",
        "-XX:+UseG1GC",
        "-XX:-UsePerfData",
        *JAVA17_OPENS,
        f"-Drocketmq.home.dir={home}",
        f"-Duser.home={home}",
        *extra,
        "-cp",
        cp,
        main,
        *args,
    ]


# ----------------------------------------------------------------------------------------------- cluster


def broker_defaults() -> dict[str, str]:
    """Broker settings the launcher applies before the caller's overrides."""
    return {
        "brokerId": "0",
        "brokerIP1": "127.0.0.1",
        "bindAddress": "127.0.0.1",
        "mappedFileSizeCommitLog": str(32 * 1024 * 1024),
        "mappedFileSizeConsumeQueue": str(30_000 * 20),
        "enableLmq": "true",
        "enableMultiDispatch": "true",
        "enablePropertyFilter": "true",
        "autoCreateTopicEnable": "true",
        "autoCreateSubscriptionGroup": "true",
        "flushDiskType": "ASYNC_FLUSH",
        "deleteWhen": "04",
        "fileReservedTime": "48",
        "transientStorePoolEnable": "false",
        "warmMapedFileEnable": "false",
        "diskMaxUsedSpaceRatio": "95",
    }


def remoting_call(
    addr: str, code: int, ext: dict[str, str] | None = None, *, timeout: float = 5.0, body: bytes = b""
) -> tuple[int, str, bytes]:
    """One RocketMQ remoting request (JSON header, optional body) to ``addr``; returns (code, remark, body)."""
    host, port = addr.rsplit(":", 1)
    header = json.dumps(
        {"code": code, "language": "JAVA", "version": 0, "opaque": 1, "flag": 0, "extFields": ext or {}}
    ).encode()
    frame = (4 + len(header) + len(body)).to_bytes(4, "big") + len(header).to_bytes(4, "big")
    frame += header + body
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(frame)
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError(f"{addr} closed the connection")
            buf += chunk
    length = int.from_bytes(buf[:4], "big")
    header_len = int.from_bytes(buf[4:8], "big") & 0xFFFFFF
    reply = json.loads(buf[8 : 8 + header_len])
    return int(reply["code"]), str(reply.get("remark") or ""), buf[8 + header_len : 4 + length]


GET_ROUTEINFO_BY_TOPIC = 105
GET_BROKER_CLUSTER_INFO = 106


@dataclass
class Broker:
    name: str
    port: int
    conf: Path
    process: JavaProcess

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class StockCluster:
    """A name server, ``brokers`` brokers of one cluster and optionally RocketMQ's proxy.

    ``broker_conf`` entries override :func:`broker_defaults` for every broker. ``proxy`` is ``None``,
    ``"cluster"`` (a proxy in front of the brokers) or ``"local"`` (a proxy with one embedded broker of its
    own, registered with the same name server, named ``<cluster>-proxy-broker``).
    """

    workdir: Path
    brokers: int = 1
    proxy: str | None = None
    cluster_name: str = "StockCluster"
    broker_conf: dict[str, str] = field(default_factory=dict)
    broker_heap_mb: int = 384
    namesrv_port: int = 0
    broker_list: list[Broker] = field(default_factory=list)
    namesrv_process: JavaProcess | None = None
    proxy_process: JavaProcess | None = None
    proxy_grpc_port: int = 0
    proxy_remoting_port: int = 0

    # -- lifecycle

    def start(self) -> StockCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cp = classpath("server")
        try:
            self._start_namesrv(cp)
            for _ in range(self.brokers):
                self.add_broker()
            if self.proxy is not None:
                self._start_proxy(cp)
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> StockCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Kill every process of the cluster (safe to call more than once)."""
        if self.proxy_process is not None:
            self.proxy_process.stop()
        for broker in self.broker_list:
            broker.process.stop()
        if self.namesrv_process is not None:
            self.namesrv_process.stop()

    # -- addresses

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    @property
    def proxy_grpc_addr(self) -> str:
        return f"127.0.0.1:{self.proxy_grpc_port}"

    @property
    def proxy_remoting_addr(self) -> str:
        return f"127.0.0.1:{self.proxy_remoting_port}"

    def broker(self, name: str) -> Broker:
        for broker in self.broker_list:
            if broker.name == name:
                return broker
        raise KeyError(name)

    # -- processes

    def _retrying(self, make: object, attempts: int = 3) -> object:
        for attempt in range(attempts):
            try:
                return make()  # type: ignore[operator]
            except PortTaken:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def _start_namesrv(self, cp: str) -> None:
        def make() -> None:
            port = free_port()
            home = self.workdir / "namesrv"
            home.mkdir(parents=True, exist_ok=True)
            conf = home / "namesrv.conf"
            conf.write_text(f"listenPort={port}\nbindAddress=127.0.0.1\n")
            proc = JavaProcess(
                "name server",
                jvm_argv(
                    cp,
                    "org.apache.rocketmq.namesrv.NamesrvStartup",
                    ["-c", str(conf)],
                    heap_mb=128,
                    home=home,
                ),
                home / "namesrv.log",
                "boot success",
                port,
                home,
            )
            proc.start()
            proc.wait_ready()
            self.namesrv_port, self.namesrv_process = port, proc

        self._retrying(make)

    def add_broker(self, name: str | None = None, **overrides: str) -> Broker:
        """Start one more broker in the cluster (``broker-a``, ``broker-b``, … by default)."""
        name = name or f"broker-{chr(ord('a') + len(self.broker_list))}"
        cp = classpath("server")

        def make() -> Broker:
            # RocketMQ binds listenPort, listenPort-2 (fast remoting) and listenPort+1 (HA)
            port = free_port(neighbours=(-2, 1))
            home = self.workdir / name
            home.mkdir(parents=True, exist_ok=True)
            conf = home / "broker.conf"
            self._write_broker_conf(conf, name, port, home / "store", overrides)
            proc = JavaProcess(
                f"broker {name}",
                self._broker_argv(cp, conf, home),
                home / "broker.log",
                "boot success",
                port,
                home,
            )
            proc.start()
            proc.wait_ready()
            self._wait_registered(proc, f"127.0.0.1:{port}")
            return Broker(name, port, conf, proc)

        broker = self._retrying(make)
        assert isinstance(broker, Broker)
        self.broker_list.append(broker)
        return broker

    def _broker_argv(self, cp: str, conf: Path, home: Path) -> list[str]:
        return jvm_argv(
            cp,
            "org.apache.rocketmq.broker.BrokerStartup",
            ["-c", str(conf)],
            heap_mb=self.broker_heap_mb,
            home=home,
            extra=("-XX:MaxDirectMemorySize=512m",),
        )

    def _write_broker_conf(
        self, conf: Path, name: str, port: int, store: Path, overrides: dict[str, str]
    ) -> None:
        settings = broker_defaults()
        settings.update(
            brokerClusterName=self.cluster_name,
            brokerName=name,
            listenPort=str(port),
            haListenPort=str(port + 1),
            namesrvAddr=self.namesrv_addr,
            storePathRootDir=str(store),
            storePathCommitLog=str(store / "commitlog"),
        )
        settings.update(self.broker_conf)
        settings.update(overrides)
        conf.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))

    def stop_broker(self, name: str, *, kill: bool = False) -> None:
        self.broker(name).process.stop(kill=kill)

    def restart_broker(self, name: str) -> Broker:
        """Start a stopped broker again on the same port and store."""
        broker = self.broker(name)
        broker.process.stop()
        proc = JavaProcess(
            broker.process.name,
            self._broker_argv(classpath("server"), broker.conf, broker.conf.parent),
            broker.process.log,
            "boot success",
            broker.port,
            broker.conf.parent,
        )
        # the old log already holds a ready line: wait for a fresh one in a fresh file
        broker.process.log.rename(broker.process.log.with_suffix(f".{int(time.time() * 1000)}.log"))
        proc.start()
        proc.wait_ready()
        self._wait_registered(proc, broker.addr)
        broker.process = proc
        return broker

    def _wait_registered(self, proc: JavaProcess, addr: str, timeout: float = START_TIMEOUT) -> None:
        """Wait until the name server lists the broker at ``addr`` (it registers after "boot success")."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                code, _, body = remoting_call(self.namesrv_addr, GET_BROKER_CLUSTER_INFO)
                if code == 0 and f'"{addr}"'.encode() in body:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                proc.stop()
                raise LauncherError(
                    f"{proc.name} did not register with the name server within {timeout:.0f} s"
                )
            time.sleep(0.1)

    def _start_proxy(self, cp: str) -> None:
        mode = self.proxy
        if mode not in ("local", "cluster"):
            raise LauncherError(f"proxy mode must be 'local' or 'cluster', not {mode!r}")

        def make() -> None:
            grpc_port, remoting_port = free_port(), free_port()
            home = self.workdir / f"proxy-{mode}"
            home.mkdir(parents=True, exist_ok=True)
            conf = home / "rmq-proxy.json"
            conf.write_text(
                json.dumps(
                    {
                        "rocketMQClusterName": self.cluster_name,
                        "namesrvAddr": self.namesrv_addr,
                        "grpcServerPort": grpc_port,
                        "remotingListenPort": remoting_port,
                        "proxyMode": mode,
                    }
                )
            )
            args = ["-pc", str(conf), "-pm", mode]
            if mode == "local":
                bport = free_port(neighbours=(-2, 1))
                bconf = home / "broker.conf"
                self._write_broker_conf(bconf, f"{self.cluster_name}-proxy-broker", bport, home / "store", {})
                args += ["-bc", str(bconf)]
            proc = JavaProcess(
                f"RocketMQ proxy ({mode})",
                jvm_argv(
                    cp,
                    "org.apache.rocketmq.proxy.ProxyStartup",
                    args,
                    heap_mb=self.broker_heap_mb if mode == "local" else 256,
                    home=home,
                    extra=("-XX:MaxDirectMemorySize=512m",),
                ),
                home / "proxy.log",
                "rocketmq-proxy startup successfully",
                grpc_port,
                home,
            )
            proc.start()
            proc.wait_ready()
            self.proxy_grpc_port, self.proxy_remoting_port, self.proxy_process = (
                grpc_port,
                remoting_port,
                proc,
            )

        self._retrying(make)

    # -- tools

    def mqadmin(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run ``mqadmin ARGS -n <this name server>`` and return its result (not checked)."""
        return mqadmin(self.namesrv_addr, *args, home=self.workdir / "mqadmin", timeout=timeout)

    def wait_route(self, topic: str, *, timeout: float = 30.0) -> None:
        """Wait until the name server has a route for ``topic`` (e.g. after updateTopic)."""
        deadline = time.monotonic() + timeout
        while True:
            code, remark, body = remoting_call(self.namesrv_addr, GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
            if code == 0 and b'"queueDatas"' in body:
                return
            if time.monotonic() > deadline:
                raise LauncherError(f"no route for topic {topic} within {timeout:.0f} s: {code} {remark}")
            time.sleep(0.1)


def mqadmin(
    namesrv: str, *args: str, home: Path | None = None, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run Apache RocketMQ's ``mqadmin`` (rocketmq-tools) against ``namesrv``."""
    home = home or Path(tempfile.mkdtemp(prefix="mqadmin-"))
    home.mkdir(parents=True, exist_ok=True)
    argv = jvm_argv(
        classpath("server"),
        "org.apache.rocketmq.tools.command.MQAdminStartup",
        [*args, "-n", namesrv],
        heap_mb=128,
        home=home,
        extra=("-XX:TieredStopAtLevel=1",),
    )
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, cwd=home)
    except subprocess.TimeoutExpired as exc:
        raise LauncherError(f"mqadmin {' '.join(args[:1])} did not finish within {timeout:.0f} s") from exc


# ----------------------------------------------------------------------------------------------- command


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_fetch = sub.add_parser("fetch", help="fetch artifact sets into the cache")
    p_fetch.add_argument("sets", nargs="*", default=sorted(ARTIFACT_SETS))
    p_run = sub.add_parser("run", help="run a stock cluster in the foreground")
    p_run.add_argument("--brokers", type=int, default=1)
    p_run.add_argument("--proxy", choices=("local", "cluster"))
    p_run.add_argument("--workdir", type=Path)
    p_admin = sub.add_parser("mqadmin", help="run mqadmin (pass -n ADDR yourself)")
    p_admin.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    try:
        if opts.cmd == "fetch":
            for name in opts.sets:
                print(f"{name}: {fetch(name)}")
        elif opts.cmd == "run":
            workdir = opts.workdir or Path(tempfile.mkdtemp(prefix="stock-rocketmq-"))
            with StockCluster(workdir, brokers=opts.brokers, proxy=opts.proxy) as cluster:
                print(
                    json.dumps(
                        {
                            "namesrv": cluster.namesrv_addr,
                            "brokers": {b.name: b.addr for b in cluster.broker_list},
                            "proxy_grpc": cluster.proxy_grpc_addr if opts.proxy else None,
                            "proxy_remoting": cluster.proxy_remoting_addr if opts.proxy else None,
                            "workdir": str(workdir),
                        }
                    ),
                    flush=True,
                )
                with contextlib.suppress(KeyboardInterrupt):
                    signal.pause()
        else:
            args = [a for a in opts.args if a != "--"]
            done = subprocess.run(
                jvm_argv(
                    classpath("server"),
                    "org.apache.rocketmq.tools.command.MQAdminStartup",
                    args,
                    heap_mb=128,
                    home=Path(tempfile.mkdtemp(prefix="mqadmin-")),
                ),
                check=False,
            )
            return done.returncode
    except LauncherError as exc:
        print(f"stock_rocketmq: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
