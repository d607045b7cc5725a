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
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _remoting_client import (
    CLIENT_VERSION,
    ConnectionLost,
    ProxyProcess,
    RemotingClient,
    cpu_seconds,
    start_proxy,
)

from mqproxy.codecs.message_record import (
    BatchEntry,
    decode_records,
    encode_batch_body,
    encode_properties,
)
from mqproxy.codecs.remoting import FLAG_ONEWAY, RemotingCommand, encode_command
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode

QUEUES = 4
BATCH = 32
BODY = b"x" * 128
#: Outstanding sends while preloading (spread over ``SEND_CONNECTIONS`` connections).
SEND_WINDOW = 64
SEND_CONNECTIONS = 4
POP_INVISIBLE_MS = 60_000
HIGHEST_DEFAULT_LEVEL = 18
SYSFLAG_TRANSACTION_PREPARED = 0x4
COMMIT = 8


# --- a client that also takes requests from the server ---------------------------------------------


class ServicesClient(RemotingClient):
    """:class:`RemotingClient` plus oneway sends (server requests such as CHECK_TRANSACTION_STATE go to
    ``on_request``)."""

    async def oneway(self, command: RemotingCommand) -> None:
        command.flag |= FLAG_ONEWAY
        command.opaque = next(self._opaques) & 0x7FFFFFFF
        async with self._send_lock:
            await self._stream.send_all(encode_command(command))


@asynccontextmanager
async def connect(
    port: int, group: str = "bench", on_request: Callable[[RemotingCommand], None] | None = None
) -> AsyncIterator[ServicesClient]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    client = ServicesClient(stream, group, on_request)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._read_loop)
            try:
                yield client
            finally:
                nursery.cancel_scope.cancel()
    finally:
        await trio.aclose_forcefully(stream)


# --- requests ----------------------------------------------------------------------------------------


def send_command(
    group: str, topic: str, queue_id: int, properties: dict[str, str], sys_flag: int = 0
) -> RemotingCommand:
    ext = {
        "a": group,
        "b": topic,
        "c": "TBW102",
        "d": str(QUEUES),
        "e": str(queue_id),
        "f": str(sys_flag),
        "g": str(time.time_ns() // 1_000_000),
        "h": "0",
        "i": encode_properties(properties),
        "j": "0",
        "k": "false",
        "m": "false",
    }
    return RemotingCommand(
        code=RequestCode.SEND_MESSAGE_V2, version=CLIENT_VERSION, ext_fields=ext, body=BODY
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
    clients: list[ServicesClient],
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


async def send_batches(clients: list[ServicesClient], topic: str, count: int) -> float:
    """``count`` plain messages in SEND_BATCH_MESSAGE requests of ``BATCH``; returns seconds taken."""
    starts = iter(range(0, count, BATCH))
    prefix = os.urandom(8).hex().upper()

    async def worker(client: ServicesClient) -> None:
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
        clients = [await stack.enter_async_context(connect(port)) for _ in range(SEND_CONNECTIONS)]
        return await send_many(clients, topic, count)


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


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def out(line: str) -> None:
    print(line, flush=True)


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
        async with connect(port, group=f"GPull{consumers}") as client:
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

    async def ack(client: ServicesClient, queue_id: int, offset: int, receipt: str) -> None:
        t0 = time.perf_counter()
        response = await client.request(ack_command(group, topic, queue_id, offset, receipt))
        drain.acks.append(time.perf_counter() - t0)
        if response.code == ResponseCode.SUCCESS:
            drain.messages += 1
        else:
            drain.failed_acks += 1

    async def consumer() -> None:
        async with connect(port, group=group) as client:
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
                    await stack.enter_async_context(connect(proxy.port)) for _ in range(SEND_CONNECTIONS)
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
            async with connect(proxy.port) as client:
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


# --- transaction check-back -------------------------------------------------------------------------


def end_command(group: str, check: RemotingCommand) -> RemotingCommand:
    ext = check.ext_fields
    fields = {
        "producerGroup": group,
        "tranStateTableOffset": ext.get("tranStateTableOffset", "0"),
        "commitLogOffset": ext.get("commitLogOffset", "0"),
        "commitOrRollback": str(COMMIT),
        "fromTransactionCheck": "true",
        "msgId": ext.get("msgId", ""),
        "transactionId": ext.get("transactionId", ""),
    }
    return RemotingCommand(code=RequestCode.END_TRANSACTION, version=CLIENT_VERSION, ext_fields=fields)


async def check_back(args: argparse.Namespace, tmp: Path) -> None:
    env = {
        "MQPROXY_BROKER_TRANSACTION_TIMEOUT_S": "0",
        "MQPROXY_BROKER_TRANSACTION_CHECK_INTERVAL_S": "60",
    }
    proxy = start_proxy(tmp / "txn-data", tmp / "txn.log", flush="async", extra_env=env)
    group, topic = "PGTxnBench", "BTxn"
    checks: dict[str, float] = {}
    all_checked = trio.Event()
    repeated = 0
    send_end, receive_end = trio.open_memory_channel[RemotingCommand](math.inf)

    def on_request(command: RemotingCommand) -> None:
        nonlocal repeated
        if command.code != RequestCode.CHECK_TRANSACTION_STATE:
            return
        uniq = command.ext_fields.get("msgId", "")
        if uniq in checks:
            repeated += 1
        checks.setdefault(uniq, time.perf_counter())
        if len(checks) >= args.checks:
            all_checked.set()
        send_end.send_nowait(command)

    try:
        async with connect(proxy.port, group=group, on_request=on_request) as producer:
            body = json.dumps(
                {
                    "clientID": "127.0.0.1@bench",
                    "producerDataSet": [{"groupName": group}],
                    "consumerDataSet": [],
                }
            ).encode()
            beat = await producer.request(
                RemotingCommand(code=RequestCode.HEART_BEAT, version=CLIENT_VERSION, body=body)
            )
            if beat.code != ResponseCode.SUCCESS:
                raise SystemExit(f"heartbeat refused: {beat.code} {beat.remark}")

            async def answer() -> None:
                async for command in receive_end:
                    await producer.oneway(end_command(group, command))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(answer)
                plain = await send_many([producer], "BTxnBaseline", args.checks)
                # every half message becomes due in the same second, after the sends (estimated from the
                # plain sends, x3): per-message CHECK_IMMUNITY_TIME_IN_SECONDS, transaction timeout 0
                due = time.perf_counter() + 3 * plain.elapsed + args.check_delay

                def half_props() -> dict[str, str]:
                    immunity = math.ceil(due - time.perf_counter())
                    return {
                        "TRAN_MSG": "true",
                        "PGROUP": group,
                        "CHECK_IMMUNITY_TIME_IN_SECONDS": str(immunity),
                    }

                halves = await send_many(
                    [producer], topic, args.checks, extra=half_props, sys_flag=SYSFLAG_TRANSACTION_PREPARED
                )
                sent_done = time.perf_counter()
                with trio.move_on_at(trio.current_time() + (due - sent_done) + 120):
                    await all_checked.wait()
                deadline = time.perf_counter() + 60
                visible = 0
                while visible < len(halves.acked_at) and time.perf_counter() < deadline:
                    visible = 0
                    for q in range(QUEUES):
                        reply = await producer.pull(topic, q, 0, max_nums=1, decode=False)
                        if reply.code == ResponseCode.SUCCESS:
                            visible += reply.max_offset
                    if visible < len(halves.acked_at):
                        await trio.sleep(0.02)
                all_visible = time.perf_counter()
                nursery.cancel_scope.cancel()
    except ConnectionLost as exc:
        raise SystemExit(f"producer connection lost: {exc}") from None
    finally:
        proxy.stop()
    times = sorted(checks.values())
    span = times[-1] - times[0] if len(times) > 1 else float("nan")
    out(
        f"txn   send plain {args.checks} msgs {args.checks / plain.elapsed:.0f} msgs/s;"
        f" send half {args.checks} msgs {args.checks / halves.elapsed:.0f} msgs/s"
    )
    out(
        f"txn   check-back {len(checks)} checks in {span:.2f} s {len(checks) / span:.0f} checks/s"
        f"  first {times[0] - due:+.2f} s last {times[-1] - due:+.2f} s from the due time"
        f"  repeated {repeated}  all {visible} committed visible {all_visible - due:+.2f} s"
        f"  (sends ended {sent_done - due:+.2f} s)"
    )
    if len(checks) != args.checks or visible != args.checks:
        raise SystemExit(f"txn: {len(checks)} checked, {visible} committed of {args.checks}")


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
