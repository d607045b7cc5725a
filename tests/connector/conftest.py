"""Fixtures for the connector tests: mqproxy nodes as child processes (port 0), a producer and a reader
over the connector's own cluster client, and the connector in-process or as ``mqproxy connect``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from mqproxy.connector.client import ClusterClient
from mqproxy.connector.rules import ClusterSpec, ConnectorConfig, parse_rules
from mqproxy.connector.runner import run_connector
from mqproxy.model.types import Message, StoredMessage
from mqproxy.remoting_client import ClientConfig, open_pool

from ..conftest import log_events, serve_proxy, wait_proxy_started, wait_until_sync  # type: ignore[import-not-found]


@dataclass
class Node:
    proc: subprocess.Popen[bytes]
    log: Path
    addr: str


@pytest.fixture
def node_factory(tmp_path: Path) -> Iterator[Any]:
    started: list[Node] = []

    def start(name: str, env: dict[str, str] | None = None) -> Node:
        log = tmp_path / f"{name}.log"
        with open(log, "wb") as out:
            proc = serve_proxy(tmp_path / name, "--log-format", "json", stdout=out, env=env)
        host, port = wait_proxy_started(proc, log)
        node = Node(proc, log, f"{host}:{port}")
        started.append(node)
        return node

    yield start
    for node in started:
        node.proc.kill()
        node.proc.wait()
        if node.proc.stderr:
            node.proc.stderr.close()


@pytest.fixture
def two_nodes(node_factory: Any) -> tuple[Node, Node]:
    return node_factory("a"), node_factory("b")


@asynccontextmanager
async def cluster(addr: str) -> AsyncIterator[ClusterClient]:
    async with open_pool(ClientConfig()) as pool:
        yield ClusterClient(ClusterSpec("x", (addr,), addr), pool, 5.0)


async def produce(
    addr: str,
    topic: str,
    count: int,
    *,
    queues: int = 4,
    tag: str = "TagA",
    props: dict[str, str] | None = None,
    body: bytes | None = None,
    start: int = 0,
) -> None:
    """``count`` messages round-robin over the topic's queues (created with ``queues`` if missing)."""
    async with cluster(addr) as c:
        if topic not in await c.topics():
            await c.create_topic(topic, queues)
        route = await c.route(topic)
        assert route is not None
        share = next(iter(route.brokers.values()))
        for n in range(start, start + count):
            properties = {
                "TAGS": tag,
                "KEYS": f"k{n}",
                "UNIQ_KEY": f"U{n:08d}",
                "seq": str(n),
                **(props or {}),
            }
            message = Message(topic, body if body is not None else f"m{n}".encode(), properties=properties)
            await c.send(share.broker, n % share.write_queues, [message], "test-producer")


async def read_all(addr: str, topic: str) -> list[StoredMessage]:
    """Every message of every queue of ``topic`` (none if it does not exist)."""
    out: list[StoredMessage] = []
    async with cluster(addr) as c:
        route = await c.route(topic) if topic in await c.topics() else None  # a route lookup creates it
        if route is None:
            return []
        for share in route.brokers.values():
            for q in range(share.read_queues):
                offset = await c.min_offset(topic, share.broker, q)
                while True:
                    pulled = await c.pull("reader", topic, share.broker, q, offset, 32)
                    if not pulled.messages:
                        break
                    out.extend(pulled.messages)
                    offset = pulled.next_offset
    return out


def rules_text(a: str, b: str, rules: str, connector: str = "") -> str:
    return (
        '[connector]\nname = "c1"\nrefresh_s = 0.3\nlag_interval_s = 0.5\nrequest_timeout_s = 2.0\n'
        f"{connector}\n"
        f'[clusters.a]\nnamesrv = "{a}"\n[clusters.b]\nnamesrv = "{b}"\n{rules}'
    )


@asynccontextmanager
async def running(config: ConnectorConfig) -> AsyncIterator[trio.Event]:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: run_connector(config, None, stop=stop, task_status=task_status)
        )
        yield stop
        stop.set()


def config(text: str) -> ConnectorConfig:
    return parse_rules(text, "rules.toml")


class ConnectProcess:
    """``mqproxy connect`` as a child; its JSON events are read from its stdout file."""

    def __init__(self, rules: Path, log: Path, *extra: str) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mqproxy", "connect", "--config", str(rules), *extra],
                stdout=out,
                stderr=subprocess.PIPE,
                env=dict(os.environ),
            )

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in log_events(self.log) if e.get("event") == name]

    def wait_started(self) -> dict[str, Any]:
        def started() -> bool:
            assert self.proc.poll() is None, self.proc.stderr.read() if self.proc.stderr else ""
            return bool(self.events("connector.started"))

        wait_until_sync(started)
        return self.events("connector.started")[-1]

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        if self.proc.stderr:
            self.proc.stderr.close()


def parse_json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
