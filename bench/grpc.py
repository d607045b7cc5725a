"""gRPC benchmark: SendMessage and ReceiveMessage+AckMessage throughput and latency against ``mqproxy
serve``, next to the same load over remoting (SEND_MESSAGE_V2 and PULL_MESSAGE) to the same proxy.

One proxy runs for the whole invocation (embedded store in a temp dir, ``store.flush`` from ``--flush``).
For each client count N in ``--clients``:

* ``send grpc``: N h2c connections, each with one outstanding unary ``SendMessage`` (one message) at a
  time, so latency is the round trip; ``send remoting``: the same over N remoting connections.
  Each case stops after ``--messages`` sends or ``--seconds``, whichever comes first.
* ``recv grpc``: the messages the gRPC send case stored are consumed by N connections, each looping one
  ``ReceiveMessage`` (batch ``--batch``, 30 s invisible, 0 s long poll) then one ``AckMessage`` with all
  the receipt handles it got; latency is that receive+ack round. ``recv remoting``: the remoting send
  case's messages drained by ``PULL_MESSAGE`` (maxMsgNums ``--batch``, queues split between the N
  connections; PULL has no per-message ack, so it does less work than pop + ack).

The gRPC load loop is written here over ``h2`` and the project's protobuf classes
(``mqproxy.codecs.rocketmq_v2``); remoting uses ``bench/_remoting_client.py``. CPU columns are the share of
one core used by this process (client) and by the proxy during the case. The machine's load average is
printed before and after.

    python bench/grpc.py [--clients 1,8] [--messages 20000] [--seconds 8] [--body 128] [--batch 16]
"""

from __future__ import annotations

import argparse
import itertools
import os
import struct
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import percentile, uptime
from _remoting_client import CpuMeter, RemotingClient, open_client, peak_rss_kib, start_proxy

from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.codecs.grpc_framing import encode_message
from mqproxy.codecs.remoting_codes import ResponseCode

PATH_PREFIX = f"/{pb.SERVICE}/"
_MESSAGE_PREFIX = struct.Struct(">BI")  # reading the responses
REMOTING_QUEUES = 4
_RECEIVE_BYTES = 256 * 1024


class CallFailed(Exception):
    """A gRPC call ended with a non-zero grpc-status, a reset, or a lost connection."""


# ------------------------------------------------------------------------------ h2 gRPC client


class GrpcClient:
    """One h2c connection, one call at a time (no reader task: the caller reads until its stream ends)."""

    def __init__(self, stream: trio.SocketStream, client_id: str) -> None:
        self._stream = stream
        self._h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self._client_id = client_id

    @classmethod
    async def connect(cls, port: int, client_id: str) -> GrpcClient:
        client = cls(await trio.open_tcp_stream("127.0.0.1", port), client_id)
        client._h2.initiate_connection()
        client._h2.increment_flow_control_window(16 * 1024 * 1024)
        await client._flush()
        return client

    async def aclose(self) -> None:
        self._h2.close_connection()
        try:
            await self._flush()
        except trio.BrokenResourceError:
            pass
        await self._stream.aclose()

    async def _flush(self) -> None:
        data = self._h2.data_to_send()
        if data:
            await self._stream.send_all(data)

    async def call(self, method: str, request: Any) -> list[bytes]:
        """Send one request message and return the response messages (raw payloads)."""
        sid = self._h2.get_next_available_stream_id()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", PATH_PREFIX + method),
            (":authority", "127.0.0.1"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("grpc-timeout", "10S"),
            ("x-mq-client-id", self._client_id),
            ("x-mq-language", "PYTHON"),
            ("x-mq-protocol", "GRPC_V2"),
        ]
        payload = request.SerializeToString()
        framed = encode_message(payload)
        self._h2.send_headers(sid, headers)
        body = bytearray()
        status: str | None = None
        pending = memoryview(framed)
        ended = False
        while True:
            if pending:
                size = min(
                    len(pending), self._h2.local_flow_control_window(sid), self._h2.max_outbound_frame_size
                )
                if size > 0:
                    self._h2.send_data(sid, bytes(pending[:size]), end_stream=size == len(pending))
                    pending = pending[size:]
            await self._flush()
            if ended:
                break
            if pending and self._h2.local_flow_control_window(sid) > 0:
                continue
            data = await self._stream.receive_some(_RECEIVE_BYTES)
            if not data:
                raise CallFailed(f"{method}: connection closed")
            for event in self._h2.receive_data(data):
                if getattr(event, "stream_id", sid) != sid:
                    continue
                if isinstance(event, h2.events.DataReceived):
                    body += event.data
                    self._h2.acknowledge_received_data(event.flow_controlled_length, sid)
                elif isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    for name, value in event.headers or ():
                        if name in ("grpc-status", b"grpc-status"):
                            status = value.decode() if isinstance(value, bytes) else value
                elif isinstance(event, h2.events.StreamEnded):
                    ended = True
                elif isinstance(event, h2.events.StreamReset):
                    raise CallFailed(f"{method}: stream reset {event.error_code}")
                elif isinstance(event, h2.events.ConnectionTerminated):
                    raise CallFailed(f"{method}: GOAWAY {event.error_code}")
        if status != "0":
            raise CallFailed(f"{method}: grpc-status {status}")
        out, pos = [], 0
        while pos + 5 <= len(body):
            _, length = _MESSAGE_PREFIX.unpack_from(body, pos)
            out.append(bytes(body[pos + 5 : pos + 5 + length]))
            pos += 5 + length
        return out


# ------------------------------------------------------------------------------ cases


@dataclass(slots=True)
class Case:
    kind: str  # "send" or "recv"
    protocol: str
    clients: int
    messages: int
    failed: int
    elapsed: float
    latencies: list[float]
    client_cpu: float = 0.0
    server_cpu: float = 0.0


async def _run_workers(case: Case, pid: int, workers: list[Callable[[], Awaitable[None]]]) -> Case:
    with CpuMeter(pid) as cpu:
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for worker in workers:
                nursery.start_soon(worker)
        case.elapsed = time.perf_counter() - started
    case.client_cpu, case.server_cpu = cpu.client, cpu.server
    return case


_ids = itertools.count()
_ID_PREFIX = os.urandom(6).hex().upper()


def _grpc_message(topic: str, body: bytes) -> Any:
    sp = pb.SystemProperties(
        message_id=f"{_ID_PREFIX}{next(_ids):020X}",
        tag="bench",
        message_type=pb.MessageType.NORMAL,
        body_encoding=pb.Encoding.IDENTITY,
    )
    return pb.SendMessageRequest(
        messages=[pb.RmqMessage(topic=pb.Resource(name=topic), system_properties=sp, body=body)]
    )


async def grpc_send(
    port: int, pid: int, topic: str, body: bytes, n: int, messages: int, seconds: float
) -> Case:
    case = Case("send", "grpc", n, 0, 0, 0.0, [])
    per_client = max(1, messages // n)
    async with AsyncExitStack() as stack:
        clients = []
        for i in range(n):
            client = await GrpcClient.connect(port, f"bench-send@{os.getpid()}@{i}")
            stack.push_async_callback(client.aclose)
            clients.append(client)

        def worker(client: GrpcClient) -> Callable[[], Awaitable[None]]:
            async def run() -> None:
                for _ in range(per_client):
                    request = _grpc_message(topic, body)
                    t0 = time.perf_counter()
                    if t0 > deadline:
                        break
                    (raw,) = await client.call("SendMessage", request)
                    case.latencies.append(time.perf_counter() - t0)
                    if pb.SendMessageResponse.FromString(raw).status.code == pb.Code.OK:
                        case.messages += 1
                    else:
                        case.failed += 1

            return run

        deadline = time.perf_counter() + seconds
        return await _run_workers(case, pid, [worker(c) for c in clients])


async def grpc_receive_ack(port: int, pid: int, topic: str, n: int, total: int, batch: int) -> Case:
    case = Case("recv", "grpc", n, 0, 0, 0.0, [])
    group = pb.Resource(name=f"BenchGroup{n}")
    receive = pb.ReceiveMessageRequest(
        group=group,
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
        filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
        batch_size=batch,
        invisible_duration=pb.Duration(seconds=30),
        long_polling_timeout=pb.Duration(seconds=0),
    )
    async with AsyncExitStack() as stack:
        clients = []
        for i in range(n):
            client = await GrpcClient.connect(port, f"bench-recv@{os.getpid()}@{i}")
            stack.push_async_callback(client.aclose)
            clients.append(client)

        def worker(client: GrpcClient) -> Callable[[], Awaitable[None]]:
            async def run() -> None:
                while case.messages < total:
                    t0 = time.perf_counter()
                    entries = []
                    for raw in await client.call("ReceiveMessage", receive):
                        response = pb.ReceiveMessageResponse.FromString(raw)
                        if response.WhichOneof("content") == "message":
                            sp = response.message.system_properties
                            entries.append(
                                pb.AckMessageEntry(message_id=sp.message_id, receipt_handle=sp.receipt_handle)
                            )
                    if not entries:
                        break  # backlog exhausted (or taken by the other clients)
                    ack = pb.AckMessageRequest(group=group, topic=pb.Resource(name=topic), entries=entries)
                    (raw,) = await client.call("AckMessage", ack)
                    case.latencies.append(time.perf_counter() - t0)
                    for result in pb.AckMessageResponse.FromString(raw).entries:
                        if result.status.code == pb.Code.OK:
                            case.messages += 1
                        else:
                            case.failed += 1

            return run

        return await _run_workers(case, pid, [worker(c) for c in clients])


async def remoting_send(
    port: int, pid: int, topic: str, body: bytes, n: int, messages: int, seconds: float
) -> Case:
    case = Case("send", "remoting", n, 0, 0, 0.0, [])
    per_client = max(1, messages // n)
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(open_client(port)) for _ in range(n)]

        def worker(client: RemotingClient, index: int) -> Callable[[], Awaitable[None]]:
            async def run() -> None:
                for i in range(per_client):
                    t0 = time.perf_counter()
                    if t0 > deadline:
                        break
                    ack = await client.send(
                        topic, body, queue_id=(index + i) % REMOTING_QUEUES, queue_nums=REMOTING_QUEUES
                    )
                    case.latencies.append(time.perf_counter() - t0)
                    if ack.ok:
                        case.messages += 1
                    else:
                        case.failed += 1

            return run

        deadline = time.perf_counter() + seconds
        return await _run_workers(case, pid, [worker(c, i) for i, c in enumerate(clients)])


async def remoting_pull(port: int, pid: int, topic: str, n: int, total: int, batch: int) -> Case:
    case = Case("recv", "remoting", n, 0, 0, 0.0, [])
    async with AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(open_client(port, group=f"BenchPull{n}")) for _ in range(n)
        ]

        def worker(client: RemotingClient, queues: list[int]) -> Callable[[], Awaitable[None]]:
            async def run() -> None:
                offsets = dict.fromkeys(queues, 0)
                live = list(queues)
                while live:
                    for queue in list(live):
                        t0 = time.perf_counter()
                        reply = await client.pull(topic, queue, offsets[queue], max_nums=batch, decode=False)
                        if reply.code == ResponseCode.SUCCESS:
                            case.latencies.append(time.perf_counter() - t0)
                            case.messages += reply.next_offset - offsets[queue]
                            offsets[queue] = reply.next_offset
                        elif reply.code == ResponseCode.PULL_RETRY_IMMEDIATELY:
                            offsets[queue] = reply.next_offset
                        else:
                            live.remove(queue)

            return run

        workers = [
            worker(c, [q for q in range(REMOTING_QUEUES) if q % n == i]) for i, c in enumerate(clients)
        ]
        result = await _run_workers(case, pid, workers)
    if result.messages != total:
        result.failed += abs(total - result.messages)
    return result


def _print(case: Case, body: int) -> None:
    rate = case.messages / case.elapsed if case.elapsed else 0.0
    unit = "send" if case.kind == "send" else ("receive+ack" if case.protocol == "grpc" else "pull")
    failed = f"  FAILED {case.failed}" if case.failed else ""
    print(
        f"{case.kind:4} {case.protocol:8} {body:5d} B {case.clients:2d} cli  {rate:8.0f} msgs/s"
        f"  p50 {percentile(case.latencies, 50) * 1e3:7.2f} ms"
        f"  p99 {percentile(case.latencies, 99) * 1e3:7.2f} ms"
        f" per {unit:11}  n={case.messages:<6d}"
        f" cpu client {case.client_cpu:4.0%} server {case.server_cpu:4.0%}"
        f"{failed}",
        flush=True,
    )


async def _bench(port: int, pid: int, args: argparse.Namespace) -> list[Case]:
    body = os.urandom(args.body)
    cases: list[Case] = []
    # warm-up (unmeasured): creates the topics' code paths, imports, caches
    await grpc_send(port, pid, "BenchWarm", body, 2, args.warmup, 10)
    await remoting_send(port, pid, "BenchWarmR", body, 2, args.warmup, 10)
    for n in args.clients:
        grpc_topic, remoting_topic = f"BenchGrpc{n}", f"BenchRemoting{n}"
        sent_grpc = await grpc_send(port, pid, grpc_topic, body, n, args.messages, args.seconds)
        sent_remoting = await remoting_send(port, pid, remoting_topic, body, n, args.messages, args.seconds)
        recv_grpc = await grpc_receive_ack(port, pid, grpc_topic, n, sent_grpc.messages, args.batch)
        recv_remoting = await remoting_pull(port, pid, remoting_topic, n, sent_remoting.messages, args.batch)
        for case in (sent_grpc, sent_remoting, recv_grpc, recv_remoting):
            _print(case, args.body)
            cases.append(case)
        if recv_grpc.messages != sent_grpc.messages:
            print(f"FAILED grpc received {recv_grpc.messages} of {sent_grpc.messages}", flush=True)
    return cases


def _int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--clients", type=_int_list, default=[1, 8], help="concurrent clients, comma list")
    parser.add_argument("--messages", type=int, default=20000, help="sends per case at most")
    parser.add_argument("--seconds", type=float, default=8.0, help="duration per send case at most")
    parser.add_argument("--body", type=int, default=128, help="body size in bytes")
    parser.add_argument("--batch", type=int, default=16, help="messages per ReceiveMessage / PULL")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured sends per protocol first")
    parser.add_argument("--flush", choices=("async", "sync"), default="async", help="proxy store.flush")
    args = parser.parse_args()

    print(
        f"grpc benchmark: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; per send case <= "
        f"{args.messages} msgs or <= {args.seconds:g} s; body {args.body} B; batch {args.batch}; "
        f"store.flush={args.flush}",
        flush=True,
    )
    print(f"uptime before: {uptime()}", flush=True)
    failed = False
    with tempfile.TemporaryDirectory(prefix="mqproxy-bench-grpc-") as tmp:
        root = Path(tmp)
        proxy = start_proxy(root / "data", root / "proxy.log", flush=args.flush)
        try:
            cases = trio.run(_bench, proxy.port, proxy.pid, args)
            failed = any(case.failed for case in cases)
            print(f"peak RSS mqproxy {peak_rss_kib(proxy.pid) / 1024:.1f} MiB (VmHWM)", flush=True)
        finally:
            proxy.stop()
    print(f"uptime after: {uptime()}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
