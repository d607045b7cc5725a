"""What the cluster-mode end-to-end tests run: mqproxy nodes in front of a stock RocketMQ cluster, the
long-running Java clients of ``tests/e2e/java/remoting/ClusterLoads.java``, and a relay port.

Contracts:

* :class:`ClusterMode` is a stock cluster (name server + brokers, no RocketMQ proxy) and mqproxy nodes
  started in cluster mode against its name server (``MQPROXY_BACKEND_KIND=rocketmq``); ``start_node``
  starts one more (``namesrv=`` another address), ``stop()`` stops them all and returns their exit codes.
* :func:`create_topic` creates a topic (optionally typed) on brokers directly (UPDATE_AND_CREATE_TOPIC, no
  admin JVM) and waits for the name server's route; :func:`create_group` creates a consumer group on them;
  :func:`route` is a route as a name server or a node answers it;
  :func:`max_offsets` reads a broker's queue ends (GET_MAX_OFFSET).
* :class:`Loads` starts ClusterLoads commands; each run is held (stdin open) until :func:`finish` closes
  its stdin, and every run still alive at the end of a test is killed (:meth:`Loads.kill_all`).
* :class:`TcpRelay` holds a port that refuses connections until :meth:`TcpRelay.open` forwards them to a
  target: "nobody listens here yet", then "it came up", without a second cluster.
* Waits end on conditions (:func:`wait_for`); their limit is a failure deadline, never a timing check.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# scripts/ is put on sys.path by conftest
from remoting_wire import remoting_exchange  # type: ignore[import-not-found]
from stock_rocketmq import StockCluster  # type: ignore[import-not-found]

from ..conftest import wait_until_sync  # type: ignore[import-not-found]
from .harness import Client, ClientRun, ProxyProcess

UPDATE_AND_CREATE_TOPIC = 17
GET_MAX_OFFSET = 30
GET_ROUTEINFO_BY_TOPIC = 105
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
SERVICE_NOT_AVAILABLE = 14


#: How often a node refreshes the routes it caches (default 30 s): a broker added or gone is seen at once.
NODE_REFRESH_S = "1"


def node_env(namesrv: str) -> dict[str, str]:
    """The settings of an mqproxy node in front of the cluster whose name servers are ``namesrv``."""
    return {
        "MQPROXY_BACKEND_KIND": "rocketmq",
        "MQPROXY_BACKEND_NAMESRV": namesrv,
        "MQPROXY_BACKEND_REFRESH_S": NODE_REFRESH_S,
    }


@dataclass
class ClusterMode:
    """A stock cluster and the mqproxy nodes in front of it (``nodes["A"]``, ``nodes["B"]``, ...)."""

    stock: StockCluster
    proxy_bin: str
    workdir: Path
    nodes: dict[str, ProxyProcess] = field(default_factory=dict)

    def start_node(self, name: str, *, namesrv: str | None = None) -> ProxyProcess:
        """Start node ``name`` against ``namesrv`` (default: the stock name server); returns once it runs."""
        base = self.workdir / f"node-{name}"
        (base / "data").mkdir(parents=True, exist_ok=True)
        node = ProxyProcess(self.proxy_bin, base / "data", base, node_env(namesrv or self.stock.namesrv_addr))
        node.start()
        self.nodes[name] = node
        return node

    def addr(self, *names: str) -> str:
        """A name server list of nodes, as remoting clients take it: ``"127.0.0.1:p1;127.0.0.1:p2"``."""
        return ";".join(str(self.nodes[n].address) for n in names)

    def live_brokers(self) -> list[str]:
        """Addresses of the brokers whose JVM runs."""
        return [b.addr for b in self.stock.broker_list if b.process.proc is not None]

    def stop(self) -> dict[str, int]:
        """SIGTERM every running node; their exit codes by name. Each node's whole log is kept beside its
        stderr (``node-NAME/proxy.stdout`` under the work directory) for a look after a failure."""
        codes = {name: node.stop() for name, node in self.nodes.items() if node.proc is not None}
        for node in self.nodes.values():
            if node.reader is not None:
                (node.log_dir / "proxy.stdout").write_text("\n".join(node.reader.lines) + "\n")
        return codes


# ----------------------------------------------------------------------------------------------- wire


def parse_fastjson(body: bytes) -> Any:
    """RocketMQ's JSON (fastjson writes integer map keys unquoted: ``{0:"127.0.0.1:10911"}``)."""
    return json.loads(re.sub(r"([{,])\s*(-?\d+)\s*:", r'\1"\2":', body.decode()))


def route(addr: str, topic: str) -> dict[str, Any] | None:
    """The route of ``topic`` as the name server (or node) at ``addr`` answers it; None if it has none."""
    reply, body = remoting_exchange(addr, GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    if reply["code"] != 0:
        return None
    answer = parse_fastjson(body)
    assert isinstance(answer, dict)
    return answer


def write_queues(addr: str, topic: str) -> int:
    """How many write queues a client of ``addr`` sees for ``topic`` (0 when there is no route)."""
    found = route(addr, topic)
    return sum(int(q["writeQueueNums"]) for q in found["queueDatas"]) if found else 0


def create_topic(
    cluster: ClusterMode,
    topic: str,
    queues: int,
    *,
    brokers: Iterable[str] | None = None,
    message_type: str | None = None,
) -> None:
    """Create ``topic`` with ``queues`` read/write queues on each broker (default: every live one) and wait
    until the name server routes it on all of them. ``message_type`` (``NORMAL``, ``FIFO``, ``DELAY``,
    ``TRANSACTION``) types it, as ``mqadmin updateTopic -a +message.type=...`` does."""
    targets = list(brokers) if brokers is not None else cluster.live_brokers()
    for broker in targets:
        reply, _ = remoting_exchange(
            broker,
            UPDATE_AND_CREATE_TOPIC,
            {
                "topic": topic,
                "defaultTopic": "TBW102",
                "readQueueNums": str(queues),
                "writeQueueNums": str(queues),
                "perm": "6",
                "topicFilterType": "SINGLE_TAG",
                "topicSysFlag": "0",
                "order": "false",
                **({"attributes": f"+message.type={message_type}"} if message_type else {}),
            },
            timeout=10.0,
        )
        assert reply["code"] == 0, f"creating {topic} on {broker}: {reply}"
    wait_until_sync(lambda: write_queues(cluster.stock.namesrv_addr, topic) == queues * len(targets), 30.0)


def create_group(cluster: ClusterMode, group: str, *, orderly: bool = False) -> None:
    """Create consumer group ``group`` on every live broker (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, what
    ``mqadmin updateSubGroup -b`` sends); ``orderly``: ``consumeMessageOrderly`` (a FIFO group)."""
    config = {
        "groupName": group,
        "consumeEnable": True,
        "consumeFromMinEnable": True,
        "consumeBroadcastEnable": False,
        "consumeMessageOrderly": orderly,
        "retryQueueNums": 1,
        "retryMaxTimes": 16,
        "brokerId": 0,
        "whichBrokerWhenConsumeSlowly": 1,
        "notifyConsumerIdsChangedEnable": True,
    }
    for broker in cluster.live_brokers():
        reply, _ = remoting_exchange(
            broker, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body=json.dumps(config).encode(), timeout=10.0
        )
        assert reply["code"] == 0, f"creating group {group} on {broker}: {reply}"


def max_offsets(broker: str, topic: str, queues: int) -> list[int]:
    """The end offset of each of ``topic``'s queues ``0..queues-1`` on ``broker``."""
    ends = []
    for queue in range(queues):
        reply, _ = remoting_exchange(broker, GET_MAX_OFFSET, {"topic": topic, "queueId": str(queue)})
        assert reply["code"] == 0, f"max offset of {topic}/{queue} on {broker}: {reply}"
        ends.append(int(reply["extFields"]["offset"]))
    return ends


def served(node: ProxyProcess, client_id: str, *ops: str) -> int:
    """How many requests of ``ops`` (e.g. ``SEND_MESSAGE_V2``) the node's log shows on the connections of
    client ``client_id`` (known from any request on them that names it: requests before a client's first
    heartbeat name no client)."""
    assert node.reader is not None
    requests = [e for e in list(node.reader.events) if e.get("event") == "request"]
    conns = {e.get("conn_id") for e in requests if e.get("client_id") == client_id}
    return sum(1 for e in requests if e.get("conn_id") in conns and e.get("op") in ops)


def healthz(addr: str) -> tuple[int, dict[str, Any]]:
    """``GET /healthz`` on a node: (status, JSON body)."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5.0) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body) if body else {}


# ----------------------------------------------------------------------------------------------- clients


@dataclass
class Loads:
    """Starts ``mqtest.ClusterLoads`` commands (one client per JVM, held until :func:`finish`)."""

    client: Client
    runs: list[ClientRun] = field(default_factory=list)

    def _spawn(
        self, command: str, namesrv: str, topic: str, group: str, label: str, **opts: object
    ) -> ClientRun:
        args = [command, "--namesrv", namesrv, "--topic", topic, "--group", group, "--label", label]
        for key, value in opts.items():
            args += [
                f"--{key.replace('_', '-')}",
                str(value).lower() if isinstance(value, bool) else str(value),
            ]
        run = self.client.spawn(*args, hold=True)
        run.name = f"{label} ({command} via {namesrv})"
        self.runs.append(run)
        return run

    def produce(self, namesrv: str, topic: str, group: str, *, label: str = "p", **opts: object) -> ClientRun:
        """``count=0`` (the default): produce until :func:`finish`."""
        return self._spawn("produce", namesrv, topic, group, label, **opts)

    def consume(self, namesrv: str, topic: str, group: str, *, label: str = "c", **opts: object) -> ClientRun:
        return self._spawn("consume", namesrv, topic, group, label, **opts)

    def tx_send(
        self, namesrv: str, topic: str, group: str, *, label: str = "txs", **opts: object
    ) -> ClientRun:
        return self._spawn("tx-send", namesrv, topic, group, label, **opts)

    def tx_check(
        self, namesrv: str, topic: str, group: str, *, label: str = "txc", **opts: object
    ) -> ClientRun:
        return self._spawn("tx-check", namesrv, topic, group, label, **opts)

    def kill_all(self) -> None:
        for run in self.runs:
            if run.proc.poll() is None:
                run.proc.kill()
                run.wait(10)

    def describe(self) -> str:
        return "\n\n".join(run.describe() for run in self.runs)


def wait_for(what: str, predicate: Callable[[], bool], limit_s: float, *runs: ClientRun) -> None:
    """Wait until ``predicate()``; on the deadline fail saying ``what`` with the runs' output tails."""
    try:
        wait_until_sync(predicate, limit_s, poll_s=0.05)
    except AssertionError:
        tails = "\n\n".join(run.describe() for run in runs)
        raise AssertionError(f"{what}: still not so after {limit_s:.0f} s\n{tails}") from None


def started(run: ClientRun, limit_s: float = 60.0) -> dict[str, Any]:
    """Wait for a ClusterLoads run's "started" event (its client is up)."""
    wait_for(
        f"{run.name} started", lambda: bool(run.of("started")) or run.proc.poll() is not None, limit_s, run
    )
    assert run.of("started"), run.describe()
    return run.of("started")[0]


def finish(run: ClientRun, limit_s: float = 60.0) -> ClientRun:
    """Close the run's stdin (its stop signal), wait for it to end, and check it ended well."""
    run.release()
    run.wait(limit_s)
    done = run.done()
    assert done is not None, run.describe()
    assert done["ok"], run.describe()
    return run


def sent(run: ClientRun) -> dict[str, dict[str, Any]]:
    """A producer's acknowledged sends by body (SEND_OK only)."""
    return {e["body"]: e for e in run.of("sent") if e["result"]["status"] == "SEND_OK"}


def received(*runs: ClientRun) -> list[dict[str, Any]]:
    """Every message the consumer runs got (message views), duplicates included."""
    return [e["msg"] for run in runs for e in run.of("received")]


def received_bodies(*runs: ClientRun) -> set[str]:
    return {m["body"] for m in received(*runs)}


# ----------------------------------------------------------------------------------------------- relay


class TcpRelay:
    """A 127.0.0.1 port that refuses connections (bound, not listening) until :meth:`open`; then every
    connection is forwarded to the target address. :meth:`close` ends the listener and every connection."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._open: list[socket.socket] = []
        self._closed = threading.Event()

    def open(self, target: str) -> None:
        self._listener.listen(64)
        self._listener.settimeout(0.2)
        host, port = target.rsplit(":", 1)
        threading.Thread(target=self._accept, args=((host, int(port)),), daemon=True).start()

    def _accept(self, target: tuple[str, int]) -> None:
        while not self._closed.is_set():
            try:
                inbound, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                outbound = socket.create_connection(target, timeout=5.0)
            except OSError:
                inbound.close()
                continue
            for conn in (inbound, outbound):
                conn.settimeout(None)
                self._open.append(conn)
            threading.Thread(target=self._pump, args=(inbound, outbound), daemon=True).start()
            threading.Thread(target=self._pump, args=(outbound, inbound), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self._closed.set()
        for conn in [self._listener, *self._open]:
            try:
                conn.close()
            except OSError:
                pass
