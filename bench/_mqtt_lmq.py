"""The light-message-queue case of the MQTT benchmark (mqproxy only): remoting SEND_MESSAGE_V2 with
``INNER_MULTI_DISPATCH`` naming ``LMQS_PER_MESSAGE`` ``%LMQ%`` queues per message; dispatch rate, memory
and store bytes per LMQ, against plain sends in the same process."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import trio
from _mqtt_brokers import Broker, CpuMeter, rss_bytes, wait_quiet
from _mqtt_ladder import PAYLOAD
from _remoting_client import RemotingClient, open_client

LMQS_PER_MESSAGE = 100


async def _send(client: RemotingClient, topic: str, body: bytes, lmqs: list[str]) -> None:
    extra = {"INNER_MULTI_DISPATCH": ",".join(lmqs)} if lmqs else None
    ack = await client.send(topic, body, queue_id=0, properties=extra)
    if not ack.ok:
        raise RuntimeError(f"send failed: {ack.code} {ack.remark}")


async def _send_many(port: int, messages: int, lmqs_for: Callable[[int], list[str]], producers: int) -> float:
    """Send ``messages`` over ``producers`` connections (one send in flight each); return elapsed s."""
    body = bytes(PAYLOAD)
    todo = iter(range(messages))

    async def producer() -> None:
        async with open_client(port) as client:
            for i in todo:
                await _send(client, "LmqBench", body, lmqs_for(i))

    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        for _ in range(producers):
            nursery.start_soon(producer)
    return time.monotonic() - started


def _dir_bytes(path: Path) -> int:
    total = 0
    for entry in path.rglob("*"):
        if entry.is_file():
            total += entry.stat().st_blocks * 512
    return total


async def lmq_case(broker: Broker, data_dir: Path, args: argparse.Namespace) -> None:
    count = args.lmqs
    messages = max(1, count // LMQS_PER_MESSAGE)

    def new_lmqs(i: int) -> list[str]:
        return [f"%LMQ%bench{i * LMQS_PER_MESSAGE + k}" for k in range(LMQS_PER_MESSAGE)]

    def no_lmqs(i: int) -> list[str]:
        return []

    def old_lmqs(i: int) -> list[str]:
        return new_lmqs(i % messages)

    baseline_n = min(messages, args.lmq_baseline)
    await _send_many(broker.port, 50, no_lmqs, 4)  # warm-up: creates the topic
    cpu = CpuMeter(broker.pid)
    plain_s = await _send_many(broker.port, baseline_n, no_lmqs, args.lmq_producers)
    _, _, plain_cpu = cpu.read()
    print(
        f"{'lmq baseline':22} {broker.name:9} plain send (no dispatch): {baseline_n / plain_s:7.0f} msgs/s"
        f"  broker cpu {plain_cpu:.0%} = {plain_cpu * plain_s / baseline_n * 1e6:.0f} us/msg",
        flush=True,
    )
    await wait_quiet(broker.pid)
    rss0, disk0, index0 = rss_bytes(broker.pid), _dir_bytes(data_dir), _dir_bytes(data_dir / "index")
    log0 = _dir_bytes(data_dir / "commitlog")
    cpu.mark()
    create_s = await _send_many(broker.port, messages, new_lmqs, args.lmq_producers)
    _, _, create_cpu = cpu.read()
    await trio.sleep(1.0)  # let async flush land before measuring the store
    rss1, disk1, index1 = rss_bytes(broker.pid), _dir_bytes(data_dir), _dir_bytes(data_dir / "index")
    log1 = _dir_bytes(data_dir / "commitlog")
    created = messages * LMQS_PER_MESSAGE
    print(
        f"{'lmq create ' + str(created):22} {broker.name:9} {messages} msgs x {LMQS_PER_MESSAGE} new LMQs:"
        f" {messages / create_s:7.0f} msgs/s = {created / create_s:8.0f} LMQ dispatches/s"
        f" (broker cpu {create_cpu:.0%} = {create_cpu * create_s / messages * 1e6:.0f} us/msg)",
        flush=True,
    )
    print(
        f"{'lmq memory ' + str(created):22} {broker.name:9} RSS {rss0 / 2**20:.1f} → {rss1 / 2**20:.1f} MiB ="
        f" {(rss1 - rss0) / created:6.1f} B/LMQ; store {disk0 / 2**20:.1f} → {disk1 / 2**20:.1f} MiB ="
        f" {(disk1 - disk0) / created:6.1f} B/LMQ (LMDB index {(index1 - index0) / created:.1f} B/LMQ;"
        f" commit log +{(log1 - log0) / 2**20:.1f} MiB for the {messages} messages and their dispatch lists)",
        flush=True,
    )
    again = min(messages, args.lmq_baseline)
    await wait_quiet(broker.pid)
    cpu.mark()
    again_s = await _send_many(broker.port, again, old_lmqs, args.lmq_producers)
    _, _, again_cpu = cpu.read()
    print(
        f"{'lmq dispatch existing':22} {broker.name:9} {again} msgs x {LMQS_PER_MESSAGE} existing LMQs:"
        f" {again / again_s:7.0f} msgs/s = {again * LMQS_PER_MESSAGE / again_s:8.0f} LMQ dispatches/s"
        f" (broker cpu {again_cpu:.0%} = {again_cpu * again_s / again * 1e6:.0f} us/msg)",
        flush=True,
    )
