"""Broker-services benchmark over the remoting protocol against ``mqproxy serve`` (embedded store, async
flush, default logging), each part compared in the same run with the plain send/pull path.

* ``pull`` / ``pop``: ``--messages`` messages are preloaded into a fresh 4-queue topic per case, then
  drained by N consumers (N in ``--consumers``, one connection each). ``pull`` (baseline): PULL_MESSAGE
  of 32-message blocks, no suspend, the blocks dealt out to the consumers, no offset commits. ``pop``:
  POP_MESSAGE (all queues, maxMsgNums 32, invisibleTime 60 s, pollTime 0, initMode MIN) until the proxy
  answers PULL_NOT_FOUND, and one ACK_MESSAGE per message (a batch's acks run concurrently). Figures:
  messages per second, the round trip of each pull / pop (a batch of up to 32) and of each ack (p50, p99),
  and the proxy's CPU time per message.
* ``sched``: ``--scheduled`` messages with delay level 18 (2 h), one SEND_MESSAGE_V2 each (the proxy, like
  RocketMQ, does not delay batch messages), are sent into a fresh proxy; its resident set (VmRSS) before
  and after, then a graceful restart: seconds from spawn to the ``proxy.started`` log event (includes
  interpreter start; the proxy log is polled every 50 ms). After the restart the real topic must still be
  empty (nothing delivered early). Baselines: the same number of plain messages into another fresh proxy
  (in SEND_BATCH_MESSAGE requests of 32 to keep the run short, so its send rate and RSS growth are those
  of batches), and the restart of an empty proxy. This part runs with ``log.request_sample_rate=0``:
  request logging would halve the preload rate and is not what is measured (``bench/remoting.py`` is).
* ``txn``: ``--checks`` transactional half messages (sysFlag PREPARED, ``TRAN_MSG``) from a producer that
  announced its group in a heartbeat and leaves them unresolved. Each carries a
  ``CHECK_IMMUNITY_TIME_IN_SECONDS`` that makes all of them due in the same second, after the sends (3x
  the plain sends' time + ``--check-delay``), so the checker meets a backlog; check interval 60 s, so each
  is checked once. The producer answers every CHECK_TRANSACTION_STATE with a oneway END_TRANSACTION
  commit. Figures: checks per second between the first and the last check, when the first and last
  check came relative to the due time, and when every message was visible in the real topic; baseline:
  plain sends of the same count on the same connection and concurrency.

``uptime`` is printed before and after (the machine is shared). Defaults fit in about 4 minutes on
2 cores.

    python bench/remoting_services.py [--messages 8000] [--consumers 1,16] [--scheduled 100000]
                                      [--checks 3000] [--check-delay 2] [--only pop,sched,txn]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import uptime
from _remoting_client import ProxyProcess, RemotingClient, cpu_seconds, open_client, start_proxy
from _services_load import (
    BATCH,
    BODY,
    QUEUES,
    SEND_CONNECTIONS,
    Sent,
    ack_command,
    out,
    pop_command,
    preload,
    send_batches,
    send_many,
)
from _services_txn import check_back

from mqproxy.codecs.message_record import decode_records
from mqproxy.codecs.remoting_codes import ResponseCode

HIGHEST_DEFAULT_LEVEL = 18


# --- figures -------------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(values: list[float], q: float) -> str:
    return f"{pct(values, q) * 1000:.2f}"


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


# --- pop vs pull ----------------------------------------------------------------------------------------


@dataclass
class Drain:
    messages: int = 0
    round_trips: list[float] = field(default_factory=list)
    acks: list[float] = field(default_factory=list)
    other_codes: int = 0
    failed_acks: int = 0


async def pull_case(port: int, topic: str, sent: Sent, consumers: int) -> tuple[Drain, float]:
    units = [(q, off) for q in range(QUEUES) for off in range(0, sent.per_queue[q], BATCH)]
    drain = Drain()

    async def consumer(mine: list[tuple[int, int]]) -> None:
        async with open_client(port, group=f"GPull{consumers}") as client:
            for queue_id, offset in mine:
                t0 = time.perf_counter()
                reply = await client.pull(topic, queue_id, offset, max_nums=BATCH, decode=False)
                drain.round_trips.append(time.perf_counter() - t0)
                if reply.code == ResponseCode.SUCCESS:
                    drain.messages += reply.next_offset - offset
                else:
                    drain.other_codes += 1

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(consumers):
            nursery.start_soon(consumer, units[i::consumers])
    return drain, time.perf_counter() - start


async def pop_case(port: int, topic: str, consumers: int) -> tuple[Drain, float]:
    group = f"GPop{consumers}_{topic}"
    drain = Drain()

    async def ack(client: RemotingClient, queue_id: int, offset: int, receipt: str) -> None:
        t0 = time.perf_counter()
        response = await client.request(ack_command(group, topic, queue_id, offset, receipt))
        drain.acks.append(time.perf_counter() - t0)
        if response.code == ResponseCode.SUCCESS:
            drain.messages += 1
        else:
            drain.failed_acks += 1

    async def consumer() -> None:
        async with open_client(port, group=group) as client:
            while True:
                t0 = time.perf_counter()
                response = await client.request(pop_command(group, topic))
                drain.round_trips.append(time.perf_counter() - t0)
                if response.code == ResponseCode.PULL_NOT_FOUND:
                    return
                if response.code != ResponseCode.SUCCESS:
                    drain.other_codes += 1
                    await trio.sleep(0.01)
                    continue
                async with trio.open_nursery() as acks:
                    for record in decode_records(response.body):
                        acks.start_soon(
                            ack, client, record.queue_id, record.queue_offset, record.properties["POP_CK"]
                        )

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(consumers):
            nursery.start_soon(consumer)
    return drain, time.perf_counter() - start


async def pop_versus_pull(args: argparse.Namespace, tmp: Path) -> None:
    proxy = start_proxy(tmp / "pop-data", tmp / "pop.log", flush="async")
    try:
        for consumers in args.consumers:
            for kind in ("pull", "pop"):
                topic = f"B{kind.title()}{consumers}"
                sent = await preload(proxy.port, topic, args.messages)
                cpu0 = cpu_seconds(proxy.pid)
                if kind == "pull":
                    drain, elapsed = await pull_case(proxy.port, topic, sent, consumers)
                    detail = f"pull p50 {ms(drain.round_trips, 0.5)} ms p99 {ms(drain.round_trips, 0.99)} ms"
                else:
                    drain, elapsed = await pop_case(proxy.port, topic, consumers)
                    detail = (
                        f"pop p50 {ms(drain.round_trips, 0.5)} ms p99 {ms(drain.round_trips, 0.99)} ms"
                        f"  ack p50 {ms(drain.acks, 0.5)} ms p99 {ms(drain.acks, 0.99)} ms"
                    )
                cpu = cpu_seconds(proxy.pid) - cpu0
                out(
                    f"{kind:<5} {consumers:>3} cons {drain.messages:>7} msgs"
                    f" {drain.messages / elapsed:>9.0f} msgs/s"
                    f"  {detail}  proxy cpu {cpu / max(drain.messages, 1) * 1e6:.0f} us/msg"
                    f"  (of {args.messages} preloaded at {args.messages / sent.elapsed:.0f} msgs/s;"
                    f" other codes {drain.other_codes}, failed acks {drain.failed_acks})"
                )
                if drain.messages != args.messages - sent.failed:
                    raise SystemExit(f"{kind}: drained {drain.messages} of {args.messages - sent.failed}")
    finally:
        proxy.stop()


# --- scheduled messages ---------------------------------------------------------------------------------


#: Request logging off while 2 x --scheduled messages are preloaded (see the module docstring).
QUIET = {"MQPROXY_LOG_REQUEST_SAMPLE_RATE": "0"}


def spawn_timed(data: Path, log: Path) -> tuple[ProxyProcess, float]:
    t0 = time.perf_counter()
    proxy = start_proxy(data, log, flush="async", extra_env=QUIET)
    return proxy, time.perf_counter() - t0


async def settle() -> None:
    await trio.sleep(1.0)


async def scheduled_case(args: argparse.Namespace, tmp: Path, kind: str) -> None:
    data, log = tmp / f"sched-{kind}", tmp / f"sched-{kind}.log"
    proxy, _ = spawn_timed(data, log)
    topic = f"BSched{kind.title()}"
    try:
        await settle()
        before = rss_mib(proxy.pid)
        extra = {"DELAY": str(HIGHEST_DEFAULT_LEVEL)} if kind == "delayed" else {}
        count = 0 if kind == "empty" else args.scheduled
        if count:
            async with AsyncExitStack() as stack:
                clients = [
                    await stack.enter_async_context(open_client(proxy.port)) for _ in range(SEND_CONNECTIONS)
                ]
                if kind == "delayed":
                    elapsed = (await send_many(clients, topic, count, extra=extra)).elapsed
                else:  # delayed messages cannot be batched; the baseline only needs them stored
                    elapsed = await send_batches(clients, topic, count)
            rate = f"{count / elapsed:.0f} msgs/s"
        else:
            rate = "-"
        await settle()
        after = rss_mib(proxy.pid)
        proxy.stop()
        proxy, restart_s = spawn_timed(data, log)
        await settle()
        restarted = rss_mib(proxy.pid)
        visible = 0
        if kind == "delayed" and count:
            async with open_client(proxy.port) as client:
                for q in range(QUEUES):
                    reply = await client.pull(topic, q, 0, max_nums=BATCH, decode=False)
                    if reply.code == ResponseCode.SUCCESS:
                        visible += reply.next_offset
        out(
            f"sched {kind:<7} {count:>7} msgs  send {rate:>12}"
            f"  rss {before:.1f} -> {after:.1f} MiB (+{after - before:.1f})"
            f"  restart {restart_s:.2f} s  rss after restart {restarted:.1f} MiB"
            + (f"  delivered early {visible}" if kind == "delayed" else "")
        )
        if visible:
            raise SystemExit(f"{visible} delayed messages were delivered before their time")
    finally:
        proxy.stop()


# --- main -------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=8_000, help="messages per pull / pop case")
    parser.add_argument(
        "--consumers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16], help="e.g. 1,16"
    )
    parser.add_argument("--scheduled", type=int, default=100_000, help="delayed (and plain) messages")
    parser.add_argument("--checks", type=int, default=3_000, help="transactional half messages")
    parser.add_argument(
        "--check-delay", type=float, default=2.0, help="seconds added to the estimated send time"
    )
    parser.add_argument("--only", default="pop,sched,txn", help="parts to run: pop,sched,txn")
    args = parser.parse_args(argv)
    args.only = set(args.only.split(","))
    return args


async def amain(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-services-") as tmp_name:
        tmp = Path(tmp_name)
        if "pop" in args.only:
            await pop_versus_pull(args, tmp)
        if "sched" in args.only:
            for kind in ("empty", "plain", "delayed"):
                await scheduled_case(args, tmp, kind)
        if "txn" in args.only:
            await check_back(args, tmp)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out(f"# load before: {uptime()}")
    out(f"# cpus {os.cpu_count()}, python {sys.version.split()[0]}, body {len(BODY)} B, batch {BATCH}")
    t0 = time.perf_counter()
    trio.run(amain, args)
    out(f"# load after:  {uptime()}  (run {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
