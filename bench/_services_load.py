"""Requests and preloads of the broker-services benchmark (``bench/remoting_services.py``): SEND,
SEND_BATCH, POP and ACK requests built for :class:`_remoting_client.RemotingClient`, and senders that keep
``SEND_WINDOW`` requests outstanding."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass

import trio
from _remoting_client import CLIENT_VERSION, RemotingClient, open_client, send_message_command

from mqproxy.codecs.message_record import BatchEntry, encode_batch_body
from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode

QUEUES = 4
BATCH = 32
BODY = b"x" * 128
#: Outstanding sends while preloading (spread over ``SEND_CONNECTIONS`` connections).
SEND_WINDOW = 64
SEND_CONNECTIONS = 4
POP_INVISIBLE_MS = 60_000


def out(line: str) -> None:
    print(line, flush=True)


def send_command(
    group: str, topic: str, queue_id: int, properties: dict[str, str], sys_flag: int = 0
) -> RemotingCommand:
    """SEND_MESSAGE_V2 of ``BODY`` into a ``QUEUES``-queue topic."""
    return send_message_command(
        group, topic, BODY, queue_id=queue_id, properties=properties, queue_nums=QUEUES, sys_flag=sys_flag
    )


def pop_command(group: str, topic: str) -> RemotingCommand:
    ext = {
        "consumerGroup": group,
        "topic": topic,
        "queueId": "-1",
        "maxMsgNums": str(BATCH),
        "invisibleTime": str(POP_INVISIBLE_MS),
        "pollTime": "0",
        "bornTime": str(time.time_ns() // 1_000_000),
        "initMode": "0",
        "expType": "TAG",
        "exp": "*",
        "order": "false",
    }
    return RemotingCommand(code=RequestCode.POP_MESSAGE, version=CLIENT_VERSION, ext_fields=ext)


def ack_command(group: str, topic: str, queue_id: int, offset: int, receipt: str) -> RemotingCommand:
    ext = {
        "consumerGroup": group,
        "topic": topic,
        "queueId": str(queue_id),
        "offset": str(offset),
        "extraInfo": receipt,
    }
    return RemotingCommand(code=RequestCode.ACK_MESSAGE, version=CLIENT_VERSION, ext_fields=ext)


@dataclass
class Sent:
    """Preload outcome: per-queue message counts, per-UNIQ_KEY ack time, elapsed seconds."""

    per_queue: list[int]
    acked_at: dict[str, float]
    elapsed: float
    failed: int = 0


async def send_many(
    clients: list[RemotingClient],
    topic: str,
    count: int,
    *,
    extra: dict[str, str] | Callable[[], dict[str, str]] | None = None,
    sys_flag: int = 0,
    key_prefix: str = "",
) -> Sent:
    """``count`` sends, ``SEND_WINDOW`` outstanding, round-robin over queues and connections; ``extra``
    properties are added to each (a callable is called per message)."""
    per_queue = [0] * QUEUES
    acked_at: dict[str, float] = {}
    failed = 0
    indexes = iter(range(count))
    prefix = key_prefix or os.urandom(8).hex().upper()

    async def worker() -> None:
        nonlocal failed
        for i in indexes:
            client = clients[i % len(clients)]
            uniq = f"{prefix}{i:016X}"
            more = extra() if callable(extra) else extra or {}
            props = {"UNIQ_KEY": uniq, "WAIT": "true", "TAGS": "bench", **more}
            response = await client.request(send_command("PGBench", topic, i % QUEUES, props, sys_flag))
            if response.code != ResponseCode.SUCCESS:
                failed += 1
                continue
            acked_at[uniq] = time.perf_counter()
            per_queue[int(response.ext_fields.get("queueId", i % QUEUES))] += 1

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(SEND_WINDOW):
            nursery.start_soon(worker)
    return Sent(per_queue, acked_at, time.perf_counter() - start, failed)


async def send_batches(clients: list[RemotingClient], topic: str, count: int) -> float:
    """``count`` plain messages in SEND_BATCH_MESSAGE requests of ``BATCH``; returns seconds taken."""
    starts = iter(range(0, count, BATCH))
    prefix = os.urandom(8).hex().upper()

    async def worker(client: RemotingClient) -> None:
        for first in starts:
            entries = [
                BatchEntry(BODY, 0, {"UNIQ_KEY": f"{prefix}{i:016X}", "WAIT": "true", "TAGS": "bench"})
                for i in range(first, min(first + BATCH, count))
            ]
            command = send_command("PGBench", topic, (first // BATCH) % QUEUES, {"WAIT": "true"})
            command.code, command.body = RequestCode.SEND_BATCH_MESSAGE, encode_batch_body(entries)
            response = await client.request(command)
            if response.code != ResponseCode.SUCCESS:
                raise SystemExit(f"batch send refused: {response.code} {response.remark}")

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(SEND_WINDOW // 4):
            nursery.start_soon(worker, clients[i % len(clients)])
    return time.perf_counter() - start


async def preload(port: int, topic: str, count: int) -> Sent:
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(open_client(port)) for _ in range(SEND_CONNECTIONS)]
        return await send_many(clients, topic, count)
