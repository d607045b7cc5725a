"""The test bed of ``bench/cluster.py`` and the four ways its clients reach it.

:class:`ClusterBed` runs, on 127.0.0.1 with free ports, a stock Apache RocketMQ cluster
(``scripts/stock_rocketmq.py``: name server, two brokers, RocketMQ's proxy in cluster mode) and two
``mqproxy serve`` nodes in cluster mode in front of it (``MQPROXY_BACKEND_KIND=rocketmq``,
``MQPROXY_BACKEND_NAMESRV`` = the stock name server; no data directory).

Each :class:`Via` is one path through it, with the address each of the case's client processes is given as
its name server (``-n``) and the server processes that serve it (for CPU accounting):

* ``direct``: the stock name server; clients talk to the brokers themselves;
* ``proxy``: RocketMQ's proxy (its remoting port), which answers routes with itself as the broker;
* ``mq1``: mqproxy node A for every client process;
* ``mq2``: node A for the first client process, node B for the second.

Every path has its own topic, created on every broker with ``mqadmin updateTopic -c CLUSTER`` (``queues``
queues per broker), and each of its addresses is checked to answer a route with all of them (the stock
name server and RocketMQ's proxy: ``queues`` per broker; an mqproxy node: one broker, itself, with
``2 x queues`` virtual queues). Messages stored, and the offsets a consumer group committed, are read on
the brokers themselves (sums over their queues), whichever path the clients took.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import stock_rocketmq as rmq
from _remoting_client import ProxyProcess, cpu_seconds, start_proxy
from _vs_targets import Target, produced, remoting_request, route_queue_counts

from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode

__all__ = ["BROKERS", "NODES", "VIA_NAMES", "ClusterBed", "Via"]

BROKERS = 2
NODES = 2
CLIENT_PROCESSES = 2
#: Path keys in the order their rows run and print, with their names.
VIA_NAMES = {
    "direct": "direct",
    "proxy": "RocketMQ proxy",
    "mq1": "mqproxy x1",
    "mq2": "mqproxy x2",
}


@dataclass(frozen=True)
class Via:
    """One path: ``endpoints`` holds one address per client process; ``target`` names it in rows."""

    key: str
    target: Target
    endpoints: tuple[str, ...]
    pids: tuple[int, ...]

    @property
    def name(self) -> str:
        return self.target.name

    @property
    def topic(self) -> str:
        return f"Cluster_{self.key}"


@dataclass
class ClusterBed:
    """The stock cluster and the mqproxy nodes; :meth:`start` once, :meth:`stop` always (idempotent)."""

    root: Path
    queues: int
    cluster: rmq.StockCluster | None = None
    nodes: list[ProxyProcess] = field(default_factory=list)

    def start(self) -> None:
        self.cluster = rmq.StockCluster(self.root / "stock", brokers=BROKERS, proxy="cluster")
        self.cluster.start()
        env = {"MQPROXY_BACKEND_KIND": "rocketmq", "MQPROXY_BACKEND_NAMESRV": self.cluster.namesrv_addr}
        for letter in "ab"[:NODES]:
            log = self.root / f"mqproxy-{letter}.log"
            self.nodes.append(start_proxy(None, log, flush="async", extra_env=env))

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        if self.cluster is not None:
            self.cluster.stop()

    # -- addresses and processes

    @property
    def stock(self) -> rmq.StockCluster:
        if self.cluster is None:
            raise RuntimeError("the cluster bed is not started")
        return self.cluster

    def node_addr(self, index: int) -> str:
        return f"127.0.0.1:{self.nodes[index].port}"

    def processes(self) -> dict[str, int]:
        """Every server process by name: name server, brokers, RocketMQ's proxy, mqproxy nodes."""
        stock = self.stock
        procs = {"name server": stock.namesrv_process}
        procs.update({b.name: b.process for b in stock.broker_list})
        procs["RocketMQ proxy"] = stock.proxy_process
        out = {name: p.proc.pid for name, p in procs.items() if p is not None and p.proc is not None}
        out.update({f"mqproxy {'ab'[i]}": node.pid for i, node in enumerate(self.nodes)})
        return out

    def vias(self) -> list[Via]:
        stock = self.stock
        procs = self.processes()
        base = [procs["name server"], *(procs[b.name] for b in stock.broker_list)]
        a, b = self.node_addr(0), self.node_addr(1)
        plan: dict[str, tuple[tuple[str, ...], list[int]]] = {
            "direct": ((stock.namesrv_addr,) * CLIENT_PROCESSES, base),
            "proxy": ((stock.proxy_remoting_addr,) * CLIENT_PROCESSES, [*base, procs["RocketMQ proxy"]]),
            "mq1": ((a,) * CLIENT_PROCESSES, [*base, procs["mqproxy a"]]),
            "mq2": ((a, b), [*base, procs["mqproxy a"], procs["mqproxy b"]]),
        }
        return [self._via(key, endpoints, pids) for key, (endpoints, pids) in plan.items()]

    def _via(self, key: str, endpoints: tuple[str, ...], pids: list[int]) -> Via:
        def serving(case: str) -> list[int]:
            return list(pids)

        def create(topic: str, grpc: bool) -> None:
            self.create_topic(topic)

        kind = "mqproxy" if key.startswith("mq") else "rocketmq"
        broker = self.stock.broker_list[0].addr
        target = Target(VIA_NAMES[key], kind, "async", endpoints[0], broker, "", serving, create)
        return Via(key, target, endpoints, tuple(pids))

    # -- topics and stored messages

    def create_topic(self, topic: str) -> None:
        """``topic`` with ``queues`` queues on every broker of the cluster (idempotent)."""
        stock = self.stock
        args = ["updateTopic", "-c", stock.cluster_name, "-t", topic, "-r", str(self.queues)]
        args += ["-w", str(self.queues)]
        for _ in range(3):  # on a loaded machine a broker may miss mqadmin's 3 s timeout
            done = stock.mqadmin(*args, timeout=120)
            if done.returncode == 0 and done.stdout.count("success") >= BROKERS:
                break
        else:
            raise RuntimeError(
                f"mqadmin updateTopic {topic}: rc {done.returncode}\n{done.stdout}\n{done.stderr}"
            )
        stock.wait_route(topic)

    def check_route(self, via: Via, timeout: float = 30.0) -> list[int]:
        """Wait until every address of ``via`` answers ``via.topic``'s route with all the cluster's queues;
        returns the write-queue counts per broker the first address gave."""
        want = BROKERS * self.queues
        deadline = time.monotonic() + timeout
        for addr in dict.fromkeys(via.endpoints):
            while True:
                counts = route_queue_counts(addr, via.topic)
                if sum(counts) == want:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"route of {via.topic} at {addr} ({via.name}): queues {counts}, not {want}"
                    )
                time.sleep(0.2)
        return route_queue_counts(via.endpoints[0], via.topic)

    def stored(self, topic: str) -> int:
        """Messages stored in ``topic`` on all brokers (sum of their queues' max offsets)."""
        return sum(produced(b.addr, topic, self.queues) for b in self.stock.broker_list)

    def committed(self, group: str, topic: str) -> int:
        """Offsets ``group`` committed on ``topic`` on all brokers, summed (0 for a queue with none): equal
        to :meth:`stored` once the group consumed everything and its clients committed (every 5 s)."""
        total = 0
        for broker in self.stock.broker_list:
            for queue in range(self.queues):
                ext = {"consumerGroup": group, "topic": topic, "queueId": str(queue)}
                reply = remoting_request(broker.addr, RequestCode.QUERY_CONSUMER_OFFSET, ext)
                if reply.code == ResponseCode.SUCCESS:
                    total += int(reply.ext_fields["offset"])
                elif reply.code != ResponseCode.QUERY_NOT_FOUND:
                    raise RuntimeError(
                        f"QUERY_CONSUMER_OFFSET {topic}/{queue} at {broker.addr}: {reply.code}"
                    )
        return total

    def idle_cpu(self, seconds: float) -> str:
        """Each server process's CPU over ``seconds`` with no client at all, in cores."""
        procs = self.processes()
        before = {name: cpu_seconds(pid) for name, pid in procs.items()}
        time.sleep(seconds)
        return ", ".join(
            f"{name} {(cpu_seconds(pid) - before[name]) / seconds:.3f}" for name, pid in procs.items()
        )


def drain_group(via: Via) -> str:
    """A consumer group no earlier run used (the drain starts a new group at the queues' start)."""
    return f"cluster_drain_{via.key}_{os.getpid()}_{int(time.time())}"
