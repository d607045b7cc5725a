"""The I/O of ``bench/connector.py``: a paced producer, a read-back of a topic, and the baseline copier
(plain pull + send over the connector's own cluster client, :mod:`mqproxy.connector.client`, which is
:mod:`mqproxy.remoting_client` underneath), all trio.

The baseline runs as a child process, like the connector: ``python bench/_connector_io.py baseline SRC DST
TOPIC [TOPIC...]`` copies every queue of each topic from the earliest offset, source queue n to target
queue n, until SIGTERM. Per message it only adds the source store time (:data:`SRC_STORE_MS`, so its delay
can be measured); no origin properties, filters, locks, progress commits or events.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from mqproxy.connector.client import ClusterClient
from mqproxy.connector.rules import ClusterSpec
from mqproxy.model.types import Message, StoredMessage
from mqproxy.remoting_client import ClientConfig, open_pool

__all__ = ["SRC_STORE_MS", "baseline", "cluster", "produce", "read_back", "stored"]

SRC_STORE_MS = "BENCH_SRC_STORE_MS"
BATCH = 32


@asynccontextmanager
async def cluster(addr: str) -> AsyncIterator[ClusterClient]:
    async with open_pool(ClientConfig(request_timeout_s=10.0)) as pool:
        yield ClusterClient(ClusterSpec("bench", (addr,), addr), pool, 10.0)


async def _queues(c: ClusterClient, topic: str, queues: int) -> tuple[str, int]:
    """The topic's (broker, write queue count), created with ``queues`` per master when missing."""
    if topic not in await c.topics():
        await c.create_topic(topic, queues)
    for _ in range(100):
        route = await c.route(topic)
        if route is not None:
            share = min(route.brokers.values(), key=lambda s: s.broker)
            return share.broker, share.write_queues
        await trio.sleep(0.1)
    raise SystemExit(f"{topic} has no route on {c.spec.namesrv}")


async def produce(addr: str, topic: str, queues: int, count: int, size: int, rate: float | None) -> float:
    """Send ``count`` messages of ``size`` bytes round-robin over the queues in batches of :data:`BATCH`,
    paced to ``rate`` msg/s when given; returns the seconds it took."""
    body = b"x" * size
    async with cluster(addr) as c:
        broker, nqueues = await _queues(c, topic, queues)
        started = trio.current_time()
        sent, turn = 0, 0
        while sent < count:
            n = min(BATCH, count - sent)
            batch = [Message(topic, body, properties={"seq": str(sent + i)}) for i in range(n)]
            await c.send(broker, turn % nqueues, batch, "bench-producer")
            sent, turn = sent + n, turn + 1
            if rate:
                ahead = started + sent / rate - trio.current_time()
                if ahead > 0:
                    await trio.sleep(ahead)
        return trio.current_time() - started


async def stored(addr: str, topic: str) -> int:
    """Messages in the topic (sum of max - min offsets over its readable queues; 0 when it is missing)."""
    async with cluster(addr) as c:
        if topic not in await c.topics():
            return 0
        route = await c.route(topic)
        if route is None:
            return 0
        total = 0
        for share in route.brokers.values():
            for q in range(share.read_queues):
                high = await c.max_offset(topic, share.broker, q)
                total += high - await c.min_offset(topic, share.broker, q)
        return total


async def read_back(addr: str, topic: str) -> list[StoredMessage]:
    """Every message of the topic, queue by queue."""
    out: list[StoredMessage] = []
    async with cluster(addr) as c:
        route = await c.route(topic)
        if route is None:
            return out
        for share in route.brokers.values():
            for q in range(share.read_queues):
                offset = await c.min_offset(topic, share.broker, q)
                while True:
                    pulled = await c.pull("bench-reader", topic, share.broker, q, offset, BATCH)
                    if not pulled.messages:
                        break
                    out.extend(pulled.messages)
                    offset = pulled.next_offset
    return out


async def _copy_queue(src: ClusterClient, dst: ClusterClient, topic: str, sb: str, tb: str, q: int) -> None:
    offset = await src.min_offset(topic, sb, q)
    while True:
        pulled = await src.pull("bench-baseline", topic, sb, q, offset, 128, 1.0)
        if not pulled.messages:
            offset = max(offset, pulled.next_offset)
            continue
        copies = [
            Message(
                topic,
                m.body,
                q,
                flag=m.flag,
                properties={**m.properties, SRC_STORE_MS: str(m.store_timestamp_ms)},
                born_timestamp_ms=m.born_timestamp_ms,
            )
            for m in pulled.messages
        ]
        await dst.send(tb, q, copies, "bench-baseline")
        offset = pulled.next_offset


async def baseline(src_addr: str, dst_addr: str, topics: list[str]) -> None:
    """Copy the topics until cancelled (module docstring)."""
    async with cluster(src_addr) as src, cluster(dst_addr) as dst, trio.open_nursery() as nursery:
        for topic in topics:
            sb, queues = await _queues(src, topic, 4)
            tb, _ = await _queues(dst, topic, queues)
            for q in range(queues):
                nursery.start_soon(_copy_queue, src, dst, topic, sb, tb, q)
        print("baseline.started", flush=True)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                nursery.cancel_scope.cancel()
                return


if __name__ == "__main__":
    if len(sys.argv) < 5 or sys.argv[1] != "baseline":
        raise SystemExit("usage: _connector_io.py baseline SRC DST TOPIC [TOPIC...]")
    trio.run(baseline, sys.argv[2], sys.argv[3], sys.argv[4:])
