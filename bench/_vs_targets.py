"""The two sides of ``bench/vs_rocketmq.py``: an mqproxy process and a stock RocketMQ broker, each as a
:class:`Target` that names its addresses, its server processes and how it creates a topic; plus the
remoting look-ups the benchmark makes of either (routes, stored message counts)."""

from __future__ import annotations

import re
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import stock_rocketmq as rmq
from _remoting_client import ProxyProcess, start_proxy

from mqproxy.codecs.remoting import FrameDecoder, RemotingCommand, encode_command
from mqproxy.codecs.remoting_codes import RequestCode


@dataclass
class Target:
    """One side of the comparison: where clients are pointed and which processes serve them."""

    name: str  # "mqproxy/async", "rocketmq/sync", ...
    kind: str  # "mqproxy" or "rocketmq"
    flush: str
    namesrv: str
    broker: str  # address that answers GET_MAX_OFFSET for this target's topics
    grpc: str
    pids: Callable[[str], list[int]]  # server processes serving a case
    create_topic: Callable[[str, bool], None]

    def topic(self, case: str) -> str:
        return f"Vs{case.capitalize()}_{self.flush}"


def remoting_request(addr: str, code: int, ext: dict[str, str], timeout: float = 10.0) -> RemotingCommand:
    """One remoting request to ``addr`` (JSON header) and its response."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(encode_command(RemotingCommand(code=code, opaque=1, ext_fields=ext)))
        decoder = FrameDecoder()
        while True:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError(f"{addr} closed the connection")
            for command in decoder.receive_data(data):
                if command.is_response:
                    return command


def route_queue_counts(addr: str, topic: str) -> list[int]:
    """Write-queue counts per broker in the route of ``topic`` (via the name server at ``addr``)."""
    reply = remoting_request(addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    if reply.code != 0:
        raise RuntimeError(f"route of {topic} at {addr}: code {reply.code} {reply.remark}")
    return [int(n) for n in re.findall(rb'"writeQueueNums":(\d+)', reply.body)]


def produced(addr: str, topic: str, queues: int) -> int:
    """Messages stored in ``topic`` on the broker at ``addr``: the sum of its queues' max offsets, read
    until two reads 0.3 s apart agree (the stock broker dispatches to its consume queues asynchronously)."""
    last = -1
    for _ in range(50):
        total = 0
        for queue in range(queues):
            reply = remoting_request(
                addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(queue)}
            )
            if reply.code != 0:
                raise RuntimeError(f"GET_MAX_OFFSET {topic}/{queue} at {addr}: {reply.code} {reply.remark}")
            total += int(reply.ext_fields["offset"])
        if total == last:
            return total
        last = total
        time.sleep(0.3)
    return last


def mqproxy_target(
    flush: str, root: Path, queues: int, *, label: str = "mqproxy", python: str = sys.executable
) -> tuple[Target, ProxyProcess]:
    """An mqproxy target run by ``python`` (another checkout's venv for a same-run build comparison),
    named ``<label>/<flush>``."""
    proxy = start_proxy(
        root / f"{label}-{flush}",
        root / f"{label}-{flush}.log",
        flush=flush,
        extra_env={"MQPROXY_STORE_DEFAULT_QUEUE_COUNT": str(queues)},
        python=python,
        own_session=True,  # a CPU-share group of its own, like the stock JVMs (jvm_processes.popen_in_group)
    )
    addr = f"127.0.0.1:{proxy.port}"

    def create(topic: str, grpc: bool) -> None:
        # the first route look-up creates the topic with store.default_queue_count queues
        # (auto_create_topics, on by default)
        counts = route_queue_counts(addr, topic)
        if counts != [queues]:
            raise RuntimeError(f"mqproxy created {topic} with queues {counts}, not [{queues}]")

    return Target(
        f"{label}/{flush}", "mqproxy", flush, addr, addr, addr, lambda case: [proxy.pid], create
    ), proxy


def rocketmq_target(flush: str, cluster: rmq.StockCluster, broker: rmq.Broker, queues: int) -> Target:
    def create(topic: str, grpc: bool) -> None:
        args = ["updateTopic", "-b", broker.addr, "-t", topic, "-r", str(queues), "-w", str(queues)]
        if grpc:
            args += ["-a", "+message.type=NORMAL"]
        for _ in range(3):  # idempotent; on a loaded machine the broker may miss mqadmin's 3 s timeout
            done = cluster.mqadmin(*args, timeout=120)
            if done.returncode == 0 and "success" in done.stdout:
                break
        else:
            raise RuntimeError(
                f"mqadmin updateTopic {topic}: rc {done.returncode}\n{done.stdout}\n{done.stderr}"
            )
        cluster.wait_route(topic)
        counts = route_queue_counts(cluster.namesrv_addr, topic)
        if counts != [queues]:
            raise RuntimeError(f"stock route of {topic} has queues {counts}, not [{queues}]")

    def pids(case: str) -> list[int]:
        # RocketMQ's proxy serves only the gRPC case; the remoting clients talk to the broker directly
        procs = [cluster.namesrv_process, broker.process, cluster.proxy_process if case == "grpc" else None]
        return [p.proc.pid for p in procs if p is not None and p.proc is not None]

    return Target(
        f"rocketmq/{flush}",
        "rocketmq",
        flush,
        cluster.namesrv_addr,
        broker.addr,
        cluster.proxy_grpc_addr if cluster.proxy else "",
        pids,
        create,
    )
