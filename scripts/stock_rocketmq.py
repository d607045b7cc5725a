#!/usr/bin/env python3
"""Stock Apache RocketMQ for tests and benchmarks: fetched from Maven Central, run on loopback.

Nothing here is committed but these scripts: the jars come from Maven Central at test time
(:mod:`java_toolchain`), the JVMs run as :class:`jvm_processes.JavaProcess`. Standard library only, so
tests, benchmarks and a shell can all use it; it re-exports the names its callers need from both modules.

Contracts:

* :class:`StockCluster` starts a name server, N brokers of one cluster (LMQ and multi-dispatch on, SQL92
  filtering on, small commit-log files, free ports, 127.0.0.1) and optionally RocketMQ's own proxy in
  ``local`` or ``cluster`` mode. ``start()`` returns once every process is ready; ``stop()`` kills by pid
  (process group) and is safe to call twice; every JVM also dies with the Python process that started it.
  Logs land under the cluster's work directory.
* :func:`mqadmin` runs Apache RocketMQ's admin tool; :func:`remoting_call` sends one remoting request.
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
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from java_toolchain import (
    ARTIFACT_SETS,
    CACHE,
    ROCKETMQ_VERSION,
    LauncherError,
    classpath,
    compile_java,
    fetch,
    java_executable,
    jvm_argv,
)
from jvm_processes import START_TIMEOUT, JavaProcess, PortTaken, free_port, popen_in_group
from remoting_wire import GET_BROKER_CLUSTER_INFO, GET_ROUTEINFO_BY_TOPIC, remoting_call

__all__ = [
    "ARTIFACT_SETS",
    "CACHE",
    "ROCKETMQ_VERSION",
    "Broker",
    "JavaProcess",
    "LauncherError",
    "StockCluster",
    "classpath",
    "compile_java",
    "fetch",
    "free_port",
    "java_executable",
    "jvm_argv",
    "mqadmin",
    "namesrv_jvm",
    "popen_in_group",
    "remoting_call",
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


def namesrv_jvm(cp: str, home: Path, port: int) -> JavaProcess:
    """A name server JVM (not started) listening on 127.0.0.1:``port``, its config and log in ``home``."""
    conf = home / "namesrv.conf"
    conf.write_text(f"listenPort={port}\nbindAddress=127.0.0.1\n")
    argv = jvm_argv(
        cp, "org.apache.rocketmq.namesrv.NamesrvStartup", ["-c", str(conf)], heap_mb=128, home=home
    )
    return JavaProcess("name server", argv, home / "namesrv.log", "boot success", port, home)


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
            proc = namesrv_jvm(cp, home, port)
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
    argv = mqadmin_argv([*args, "-n", namesrv], home)
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, cwd=home)
    except subprocess.TimeoutExpired as exc:
        raise LauncherError(f"mqadmin {' '.join(args[:1])} did not finish within {timeout:.0f} s") from exc


def mqadmin_argv(args: Sequence[str], home: Path) -> list[str]:
    """The command line of ``mqadmin ARGS`` (a short-lived JVM: small heap, quick JIT); logs in ``home``."""
    main = "org.apache.rocketmq.tools.command.MQAdminStartup"
    return jvm_argv(
        classpath("server"), main, args, heap_mb=128, home=home, extra=("-XX:TieredStopAtLevel=1",)
    )


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
            home = Path(tempfile.mkdtemp(prefix="mqadmin-"))
            return subprocess.run(mqadmin_argv(args, home), check=False).returncode
    except LauncherError as exc:
        print(f"stock_rocketmq: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
