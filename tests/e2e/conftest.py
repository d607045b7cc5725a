"""Fixtures for end-to-end tests: the proxy as a real subprocess and real third-party clients.

* ``proxy`` (module scope): a running ``mqproxy serve`` on 127.0.0.1 with a fresh data dir.
* ``new_proxy`` (factory): a private proxy for tests that stop/restart it.
* ``clients``: the installed remoting clients by name (``py044``, ``pycvs``, ``alions``);
  ``client(name)`` skips the test when that client is not installed (``scripts/setup-clients.sh``).

* ``target`` (module scope, parametrised ``mqproxy`` / ``stock``): the same test runs against mqproxy and
  against the stock RocketMQ; ``target.namesrv`` is the name-server address a remoting client is given,
  ``target.grpc`` the gRPC endpoint (mqproxy's one port, or RocketMQ's proxy).
* ``java_driver`` (factory): ``java_driver("remoting", "mqtest.Remoting", ("client4",))`` compiles
  ``tests/e2e/java/remoting`` (+ ``java/common``, + the suites named in ``also=``) against the named Maven
  artifact sets and returns a :class:`Client` whose ``spawn``/``run`` start that main class; drivers print
  JSON lines (``Events.java``).
* ``go_driver`` (factory): ``go_driver("grpc5")`` builds the Go driver ``tests/e2e/go/grpc5`` with
  ``go build`` (once per source hash, into the cache folder; ``scripts/go_drivers.py``) and returns a
  :class:`Client` that runs it; drivers print JSON lines (``tests/e2e/go/events``).
* ``stock`` (session scope): a stock Apache RocketMQ (name server, one broker, RocketMQ's proxy in cluster
  mode) from ``scripts/stock_rocketmq.py``; ``stock_rocketmq`` is that module (class paths, mqadmin,
  ``compile_java``, ``StockCluster`` for tests that need a cluster of their own).
* Cluster mode (mqproxy nodes in front of a stock cluster) has its harness in ``cluster_harness.py`` and
  its cluster fixture in ``test_cluster_mode.py``.

``E2E_MQPROXY_BIN`` overrides the proxy executable (default: ``mqproxy`` next to the running interpreter;
the name avoids the ``MQPROXY_`` prefix, which the proxy reads as configuration).
Each client process gets ``HOME`` pointing at a temp dir, because the C++ cores log under ``$HOME/logs``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import go_drivers  # noqa: E402  (builds tests/e2e/go with `go build`; stdlib-only, like the launcher)
import stock_rocketmq  # noqa: E402  (scripts/ is not a package; the launcher is stdlib-only)

from ..conftest import running_stock_cluster  # type: ignore[import-not-found]  # noqa: E402
from .cluster_harness import ClusterMode  # noqa: E402
from .harness import (  # noqa: E402
    Client,
    ClientRun,
    JsonLineReader,
    ProxyProcess,
    discover_clients,
    proxy_executable,
)

__all__ = ["Client", "ClientRun", "JsonLineReader", "ProxyProcess", "Target", "stock_rocketmq"]


@pytest.fixture(scope="session")
def clients(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Client]:
    home = tmp_path_factory.mktemp("client-home")
    workdir = tmp_path_factory.mktemp("client-runs")
    return discover_clients(home, workdir)


@pytest.fixture(scope="session")
def client(clients: dict[str, Client]) -> Callable[[str], Client]:
    def get(name: str) -> Client:
        if name not in clients:
            pytest.skip(f"remoting client {name!r} is not installed; run scripts/setup-clients.sh")
        return clients[name]

    return get


@pytest.fixture(scope="session")
def proxy_bin() -> str:
    exe = proxy_executable()
    if exe is None:
        pytest.skip("mqproxy executable not found (pip install -e . or set E2E_MQPROXY_BIN)")
    return exe


@pytest.fixture
def new_proxy(
    proxy_bin: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Callable[..., ProxyProcess]]:
    """Factory for private, started proxies; every one is stopped at teardown.

    ``new_proxy(env={"MQPROXY_BROKER_MAX_RECONSUME_TIMES": "2"})`` adds environment variables (settings).
    """
    started: list[ProxyProcess] = []
    request.node._e2e_proxies = started  # read by pytest_runtest_makereport

    def make(env: dict[str, str] | None = None) -> ProxyProcess:
        base = tmp_path_factory.mktemp("proxy")
        (base / "data").mkdir()
        proxy = ProxyProcess(proxy_bin, base / "data", base, env)
        proxy.start()
        started.append(proxy)
        return proxy

    yield make
    for proxy in started:
        if proxy.proc is not None:
            proxy.stop()


@pytest.fixture(scope="module")
def proxy(
    proxy_bin: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ProxyProcess]:
    """A proxy shared by the tests of one module (each test uses its own topics and groups).

    A module may set ``PROXY_ENV = {"MQPROXY_...": "..."}`` to start it with those settings.
    """
    base = tmp_path_factory.mktemp("proxy")
    (base / "data").mkdir()
    proc = ProxyProcess(proxy_bin, base / "data", base, getattr(request.module, "PROXY_ENV", None))
    proc.start()
    yield proc
    if proc.proc is not None:
        rc = proc.stop()
        assert rc == 0, f"proxy exited with {rc} on SIGTERM:\n{proc.diagnostics()}"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the tail of every proxy log the failed test used to its report."""
    report = yield
    if report.failed and call.when == "call":
        funcargs = getattr(item, "funcargs", {})
        proxies = [funcargs[name] for name in ("proxy",) if isinstance(funcargs.get(name), ProxyProcess)]
        proxies += getattr(item, "_e2e_proxies", [])
        for n, proc in enumerate(proxies):
            report.sections.append((f"mqproxy #{n} log", proc.diagnostics()))
    return report


#: Broker settings of the session's stock cluster: transaction check-backs come within seconds, not a minute;
#: sends are not refused as "broker busy" when the machine is merely slow.
STOCK_BROKER_CONF = {
    "transactionCheckInterval": "2000",
    "transactionTimeOut": "1000",
    # On a loaded 2-core machine a send can wait longer than the default 200 ms in the broker's queue;
    # the broker then refuses it with SYSTEM_BUSY [TIMEOUT_CLEAN_QUEUE], which 4.x clients do not retry.
    "waitTimeMillsInSendQueue": "3000",
}


@pytest.fixture(scope="session")
def stock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stock_rocketmq.StockCluster]:
    """A stock Apache RocketMQ 5.3 (name server + one broker + RocketMQ's proxy, cluster mode).

    Fails (not skips) with the launcher's one-line reason when Maven, Java or a JVM is not right:
    ``make test`` installs and fetches everything it needs.
    """
    yield from running_stock_cluster(
        tmp_path_factory.mktemp("stock"), brokers=1, proxy="cluster", broker_conf=STOCK_BROKER_CONF
    )


@pytest.fixture(scope="module")
def rmq(
    proxy_bin: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ClusterMode]:
    """Cluster mode, one per test module: a stock cluster of two brokers (no RocketMQ proxy) and mqproxy nodes
    A and B in front of it. The nodes must exit 0 on SIGTERM at the end."""
    workdir = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
    stock = stock_rocketmq.StockCluster(workdir / "stock", brokers=2, broker_conf=STOCK_BROKER_CONF)
    try:
        stock.start()
    except stock_rocketmq.LauncherError as exc:
        pytest.fail(f"stock RocketMQ did not start: {exc}", pytrace=False)
    cluster = ClusterMode(stock, proxy_bin, workdir)
    try:
        cluster.start_node("A")
        cluster.start_node("B")
        yield cluster
    finally:
        codes = cluster.stop()
        stock.stop()
    assert set(codes.values()) <= {0}, f"nodes exited with {codes} on SIGTERM"


JAVA_SOURCES = Path(__file__).resolve().parent / "java"


@dataclass
class Target:
    """Where a client is pointed: mqproxy (``proxy`` set) or the stock RocketMQ (``cluster`` set)."""

    name: str
    namesrv: str
    grpc: str
    proxy: ProxyProcess | None = None
    cluster: stock_rocketmq.StockCluster | None = None

    def mqadmin(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Apache RocketMQ's mqadmin against this target's name server."""
        return stock_rocketmq.mqadmin(self.namesrv, *args, timeout=timeout)

    @property
    def cluster_name(self) -> str:
        """The cluster routes name (``mqadmin ... -c``)."""
        return self.cluster.cluster_name if self.cluster is not None else "DefaultCluster"

    @property
    def broker_addr(self) -> str:
        """Where remoting clients send broker requests: the (first) stock broker, or mqproxy's one port."""
        return self.cluster.broker_list[0].addr if self.cluster is not None else self.namesrv


@pytest.fixture(scope="module", params=["mqproxy", "stock"])
def target(request: pytest.FixtureRequest) -> Target:
    if request.param == "mqproxy":
        proxy = request.getfixturevalue("proxy")
        return Target("mqproxy", proxy.address, proxy.address, proxy=proxy)
    cluster = request.getfixturevalue("stock")
    return Target("stock", cluster.namesrv_addr, cluster.proxy_grpc_addr, cluster=cluster)


@pytest.fixture(scope="session")
def java_driver(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Client]:
    home = tmp_path_factory.mktemp("java-home")
    workdir = tmp_path_factory.mktemp("java-runs")
    built: dict[tuple[str, str, tuple[str, ...], tuple[str, ...]], Client] = {}

    def make(suite: str, main: str, sets: tuple[str, ...], *, also: tuple[str, ...] = ()) -> Client:
        """``also``: more suite folders compiled with ``suite`` (e.g. shared helpers)."""
        key = (suite, main, sets, also)
        if key not in built:
            try:
                cp = stock_rocketmq.classpath(*sets)
                roots = [JAVA_SOURCES / s for s in (suite, *also)] + [JAVA_SOURCES / "common"]
                classes = stock_rocketmq.compile_java(roots, cp, name=suite)
                java = stock_rocketmq.java_executable()
            except stock_rocketmq.LauncherError as exc:
                pytest.fail(f"Java driver {suite}: {exc}", pytrace=False)
            argv = [
                java,
                "-Xms64m",
                "-Xmx256m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-XX:-UsePerfData",
                f"-Duser.home={home}",
                f"-Drocketmq.client.logRoot={home / 'logs'}",
                "-cp",
                f"{classes}{os.pathsep}{cp}",
                main,
            ]
            built[key] = Client(suite, argv, home, workdir)
        return built[key]

    return make


@pytest.fixture(scope="session")
def go_driver(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Client]:
    home = tmp_path_factory.mktemp("go-home")
    workdir = tmp_path_factory.mktemp("go-runs")
    built: dict[str, Client] = {}

    def make(name: str) -> Client:
        if name not in built:
            try:
                binary = go_drivers.build(name)
            except go_drivers.GoBuildError as exc:
                pytest.fail(f"Go driver {name}: {exc}", pytrace=False)
            built[name] = Client(f"go-{name}", [str(binary)], home, workdir)
        return built[name]

    return make
