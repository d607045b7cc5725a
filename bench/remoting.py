"""Remoting benchmark: SEND_MESSAGE_V2 throughput and latency, backlog drain by PULL_MESSAGE, peak RSS.

Four servers run in the same invocation, each in its own process, driven by the same load generator in
this process:

* ``baseline``: a trio server that decodes frames with the project's ``FrameDecoder`` and answers each
  SEND with a minimal SUCCESS (and each PULL with canned records up to the number of sends it counted);
  no storage. It bounds what the load generator and framing alone can reach.
* ``mqproxy async``: ``mqproxy serve``, embedded store in a temp dir, ``store.flush=async``.
* ``mqproxy async-nolog``: ``mqproxy async`` with ``log.request_sample_rate=0``: the difference from
  ``mqproxy async`` is the cost of per-request observability (connection events stay on).
* ``mqproxy sync``: the same with ``store.flush=sync`` (acknowledged after fdatasync, group commit).

Send cases: N producers (one connection each, one outstanding send at a time, so latency is the round
trip) for N in ``--producers`` and bodies in ``--bodies``; each case stops after ``--messages`` sends or
``--seconds``, whichever comes first. Drain: ``--backlog`` messages are produced into a 4-queue topic,
then pulled (maxMsgNums 32, no suspend) by 1 and by 4 consumers (queues split between them; records are
counted from ``nextBeginOffset``, not decoded). CPU columns are the share of one core used by the client
(this process) and the server during the case (a client near 100 % means the figure is client-bound),
and the server's CPU time per message, which depends far less than msgs/s on what else the machine runs.

    python bench/remoting.py [--messages 20000] [--seconds 4] [--backlog 20000]
                             [--only baseline,async,async-nolog,sync]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import percentile
from _peer import start_peer
from _remoting_client import CpuMeter, RemotingClient, open_client, peak_rss_kib, start_proxy

from mqproxy.codecs.remoting_codes import ResponseCode

QUEUES = 4

BASELINE_SERVER = r"""
import sys, trio
from mqproxy.model.types import StoredMessage
from mqproxy.codecs.message_record import decode_properties, encode_record
from mqproxy.codecs.remoting import FrameDecoder, RemotingCommand, encode_command

SEND_V2, PULL = 310, 11
counts = {}      # (topic, queue) -> messages acknowledged
templates = {}   # (topic, queue) -> one encoded record like the last one sent

def record_for(key, body, props):
    msg = StoredMessage(topic=key[0], queue_id=key[1], queue_offset=0, commitlog_offset=0,
                        store_size=0, body=body, flag=0, properties=props, sys_flag=0,
                        born_timestamp_ms=0, born_host=("127.0.0.1", 1), store_timestamp_ms=0,
                        store_host=("127.0.0.1", 1), reconsume_times=0, body_crc=0)
    return encode_record(msg)

def answer(cmd):
    ext = cmd.ext_fields
    if cmd.code == SEND_V2:
        key = (ext["b"], int(ext["e"]))
        offset = counts.get(key, 0)
        counts[key] = offset + 1
        if key not in templates:
            templates[key] = record_for(key, cmd.body, decode_properties(ext.get("i", "")))
        fields = {"msgId": "7F00000100002A9F%016X" % offset, "queueId": ext["e"],
                  "queueOffset": str(offset), "transactionId": ""}
        return RemotingCommand.response_to(cmd, 0, ext_fields=fields)
    if cmd.code == PULL:
        key = (ext["topic"], int(ext["queueId"]))
        start, have = int(ext["queueOffset"]), counts.get(key, 0)
        n = max(0, min(int(ext["maxMsgNums"]), have - start))
        fields = {"suggestWhichBrokerId": "0", "nextBeginOffset": str(start + n), "minOffset": "0",
                  "maxOffset": str(have)}
        if n == 0:
            return RemotingCommand.response_to(cmd, 19, "NO_NEW_MESSAGE", fields)
        return RemotingCommand.response_to(cmd, 0, "FOUND", fields, templates[key] * n)
    return RemotingCommand.response_to(cmd, 25, "not supported")

async def handler(stream):
    decoder = FrameDecoder()
    try:
        while data := await stream.receive_some(262144):
            frames = [encode_command(answer(c)) for c in decoder.receive_data(data)]
            if frames:
                await stream.send_all(b"".join(frames))
    except trio.BrokenResourceError:
        pass
"""


@dataclass(slots=True)
class Target:
    name: str
    port: int
    pid: int
    stop: Callable[[], None]


@dataclass(slots=True)
class SendCase:
    target: str
    body: int
    producers: int
    acked: int
    failed: int
    elapsed: float
    latencies: list[float]
    client_cpu: float
    server_cpu: float


@dataclass(slots=True)
class DrainCase:
    target: str
    consumers: int
    messages: int
    elapsed: float
    client_cpu: float
    server_cpu: float


async def _send_case(
    target: Target, body_size: int, producers: int, messages: int, seconds: float
) -> SendCase:
    topic = f"Bench{body_size}"
    body = os.urandom(body_size)
    per_producer = max(1, messages // producers)
    latencies: list[float] = []
    acked = failed = 0

    async def producer(client: RemotingClient, index: int) -> None:
        nonlocal acked, failed
        deadline = started + seconds
        for i in range(per_producer):
            t0 = time.perf_counter()
            if t0 > deadline:
                break
            ack = await client.send(topic, body, queue_id=(index + i) % QUEUES)
            latencies.append(time.perf_counter() - t0)
            if ack.ok:
                acked += 1
            else:
                failed += 1

    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(open_client(target.port)) for _ in range(producers)]
        with CpuMeter(target.pid) as cpu:
            started = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for index, client in enumerate(clients):
                    nursery.start_soon(producer, client, index)
            elapsed = time.perf_counter() - started
    return SendCase(
        target.name, body_size, producers, acked, failed, elapsed, latencies, cpu.client, cpu.server
    )


async def _fill(port: int, topic: str, body: bytes, count: int, producers: int = 16) -> None:
    """Produce ``count`` messages into ``topic`` spread over its queues (not measured)."""
    remaining = iter(range(count))

    async def producer() -> None:
        async with open_client(port) as client:
            for i in remaining:
                ack = await client.send(topic, body, queue_id=i % QUEUES)
                if not ack.ok:
                    raise RuntimeError(f"fill send failed: {ack.code} {ack.remark}")

    async with trio.open_nursery() as nursery:
        for _ in range(producers):
            nursery.start_soon(producer)


async def _drain_case(target: Target, topic: str, total: int, consumers: int) -> DrainCase:
    pulled = 0

    async def consumer(client: RemotingClient, queues: list[int]) -> None:
        nonlocal pulled
        offsets = dict.fromkeys(queues, 0)
        live = list(queues)
        while live:
            for queue in list(live):
                reply = await client.pull(topic, queue, offsets[queue], max_nums=32, decode=False)
                if reply.code == ResponseCode.SUCCESS:
                    pulled += reply.next_offset - offsets[queue]
                    offsets[queue] = reply.next_offset
                elif reply.code == ResponseCode.PULL_RETRY_IMMEDIATELY:
                    offsets[queue] = reply.next_offset
                else:
                    live.remove(queue)

    async with AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(open_client(target.port, group=f"drain{consumers}"))
            for _ in range(consumers)
        ]
        with CpuMeter(target.pid) as cpu:
            started = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for index, client in enumerate(clients):
                    nursery.start_soon(consumer, client, [q for q in range(QUEUES) if q % consumers == index])
            elapsed = time.perf_counter() - started
    if pulled != total:
        raise RuntimeError(f"{target.name}: drained {pulled} messages, expected {total}")
    return DrainCase(target.name, consumers, pulled, elapsed, cpu.client, cpu.server)


async def _bench_target(target: Target, args: argparse.Namespace) -> tuple[list[SendCase], list[DrainCase]]:
    for body_size in args.bodies:  # warm-up: creates the topics, fills caches
        await _fill(target.port, f"Bench{body_size}", os.urandom(body_size), args.warmup, producers=4)
    sends = []
    for body_size in args.bodies:
        for producers in args.producers:
            case = await _send_case(target, body_size, producers, args.messages, args.seconds)
            _print_send(case)
            sends.append(case)
    drains = []
    body = os.urandom(args.drain_body)
    await _fill(target.port, "Drain", body, args.backlog)
    for consumers in (1, 4):
        drain = await _drain_case(target, "Drain", args.backlog, consumers)
        _print_drain(drain, args.drain_body)
        drains.append(drain)
    return sends, drains


def _per_msg(share: float, elapsed: float, count: int) -> float:
    """Server CPU microseconds per message (independent of how much CPU the shared machine left us)."""
    return share * elapsed / count * 1e6 if count else float("nan")


def _print_send(case: SendCase) -> None:
    rate = case.acked / case.elapsed
    mb = rate * case.body / 1e6
    failed = f"  FAILED {case.failed}" if case.failed else ""
    print(
        f"send  {case.target:15} {case.body:6d} B {case.producers:4d} prod  {rate:9.0f} msgs/s {mb:8.2f} MB/s"
        f"  p50 {percentile(case.latencies, 50) * 1e3:7.2f} ms"
        f"  p99 {percentile(case.latencies, 99) * 1e3:7.2f} ms"
        f"  n={case.acked:<6d} cpu client {case.client_cpu:4.0%} server {case.server_cpu:4.0%}"
        f"  server {_per_msg(case.server_cpu, case.elapsed, case.acked):6.0f} us/msg{failed}",
        flush=True,
    )


def _print_drain(case: DrainCase, body: int) -> None:
    print(
        f"drain {case.target:15} {body:6d} B {case.consumers:4d} cons"
        f"  {case.messages / case.elapsed:9.0f} msgs/s"
        f" {case.messages * body / case.elapsed / 1e6:8.2f} MB/s  n={case.messages:<6d}"
        f" cpu client {case.client_cpu:4.0%} server {case.server_cpu:4.0%}"
        f"  server {_per_msg(case.server_cpu, case.elapsed, case.messages):6.0f} us/msg",
        flush=True,
    )


def _int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20000, help="sends per case at most")
    parser.add_argument("--seconds", type=float, default=4.0, help="duration per send case at most")
    parser.add_argument("--producers", type=_int_list, default=[1, 16, 64], help="comma list")
    parser.add_argument("--bodies", type=_int_list, default=[128, 4096], help="body sizes, comma list")
    parser.add_argument("--backlog", type=int, default=20000, help="messages drained per drain case")
    parser.add_argument("--drain-body", type=int, default=128, help="body size of the drained backlog")
    parser.add_argument("--warmup", type=int, default=400, help="unmeasured sends per body size first")
    parser.add_argument(
        "--only",
        default="baseline,async,async-nolog,sync",
        help="targets to run, comma list (async-nolog: async with request events off)",
    )
    parser.add_argument("--sample-rate", default="1.0", help="proxy log.request_sample_rate (default 1.0)")
    parser.add_argument("--rounds", type=int, default=1, help="repeat the whole run")
    args = parser.parse_args()
    only = [name.strip() for name in args.only.split(",") if name.strip()]

    load = os.getloadavg()
    print(
        f"remoting benchmark: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; per send case <= {args.messages} msgs or "
        f"<= {args.seconds:g} s; backlog {args.backlog} x {args.drain_body} B; "
        f"proxy log.request_sample_rate={args.sample_rate}",
        flush=True,
    )
    for _round in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="mqproxy-bench-") as tmp:
            root = Path(tmp)
            for name in only:
                if name == "baseline":
                    proc, port = start_peer(BASELINE_SERVER)
                    target = Target("baseline", port, proc.pid, proc.kill)
                elif name in ("async", "sync", "async-nolog"):
                    # async-nolog: the same proxy with per-request events off, i.e. the cost of
                    # observability is the difference between the "async" and "async-nolog" rows.
                    rate = "0.0" if name == "async-nolog" else args.sample_rate
                    proxy = start_proxy(
                        root / f"data-{name}",
                        root / f"proxy-{name}.log",
                        flush=name.split("-")[0],
                        extra_env={"MQPROXY_LOG_REQUEST_SAMPLE_RATE": rate},
                    )
                    target = Target(f"mqproxy {name}", proxy.port, proxy.pid, proxy.stop)
                else:
                    raise SystemExit(f"unknown target {name!r}")
                try:
                    trio.run(_bench_target, target, args)
                    print(
                        f"peak RSS {target.name:15} {peak_rss_kib(target.pid) / 1024:8.1f} MiB (VmHWM)",
                        flush=True,
                    )
                finally:
                    target.stop()
    load = os.getloadavg()
    print(f"load average at end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
