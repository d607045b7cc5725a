"""A small trio MQTT 3.1.1 load generator over raw sockets, the same for every broker under test.

Packets are built with :func:`mqproxy.codecs.mqtt.encode` and parsed with
:class:`~mqproxy.codecs.mqtt.MqttDecoder` (client side, ``protocol_level=4``); hot paths encode one
template with the codec and patch only the packet id / timestamp bytes, so the generator stays cheap.

* :func:`connect` opens one client (optionally from a given 127.0.0.x source address).
* :class:`Publisher` paces an open-loop rate (QoS 0, or QoS 1 with a bounded in-flight window); a
  publisher held back by TCP back-pressure or its window falls behind, which shows as the achieved rate.
* :class:`ByteCountingSubscriber` counts QoS 0 deliveries of fixed-size PUBLISH packets by bytes (no
  parse), pausing 5 ms after each read so one read drains many packets.
* :class:`SubscriberPool` runs many such byte-counting QoS 0 subscribers in a child process (plain
  sockets, one epoll loop), so a large fan-out is counted on the other core than the publishers.
* :class:`ParsingSubscriber` parses every packet, PUBACKs QoS 1 and records publish→deliver latency
  from the ``CLOCK_MONOTONIC`` nanoseconds a :class:`Publisher` puts in the first 8 payload bytes.

    client = await connect(port, "pub-1")
    pub = Publisher(client, "bench/in", qos=0, rate=1000.0)
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import multiprocessing
import os
import resource
import select
import socket as _socket
import struct
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import trio

from mqproxy.codecs.mqtt import (
    Connack,
    Connect,
    MqttCodecError,
    MqttDecoder,
    PingReq,
    PingResp,
    PubAck,
    Publish,
    QoS,
    ReasonCode,
    SubAck,
    Subscribe,
    SubscribeTopic,
    encode,
)

__all__ = [
    "ByteCountingSubscriber",
    "MqttClient",
    "ParsingSubscriber",
    "Publisher",
    "SubscriberPool",
    "connect",
    "publish_size",
]

LEVEL = 4  # MQTT 3.1.1: every peer (amqtt included) speaks it
MAX_PACKET = 1 << 20
_READ = 256 * 1024
_TICK_S = 0.002
_IP_BIND_ADDRESS_NO_PORT = getattr(_socket, "IP_BIND_ADDRESS_NO_PORT", 24)
_STAMP = struct.Struct(">Q")


class LoadError(Exception):
    """The broker refused or broke a connection the load generator needed."""


class MqttClient:
    """One MQTT 3.1.1 connection after CONNACK; create with :func:`connect`."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = MqttDecoder(MAX_PACKET, protocol_level=LEVEL)
        self._ids = itertools.count(1)

    def next_packet_id(self) -> int:
        return next(self._ids) % 65535 + 1

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def receive_packets(self) -> list[object]:
        """At least one decoded packet; LoadError when the broker closes."""
        while True:
            try:
                data = await self.stream.receive_some(_READ)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise LoadError(f"connection lost: {exc}") from None
            if not data:
                raise LoadError("broker closed the connection")
            packets = self.decoder.receive_data(data)
            if packets:
                return packets

    async def subscribe(self, topic_filter: str, qos: int) -> None:
        pid = self.next_packet_id()
        await self.send(encode(Subscribe(pid, (SubscribeTopic(topic_filter, QoS(qos)),)), LEVEL))
        while True:
            for packet in await self.receive_packets():
                if isinstance(packet, SubAck) and packet.packet_id == pid:
                    if packet.reason_codes[0] >= 0x80:
                        raise LoadError(f"SUBSCRIBE {topic_filter!r} refused: {packet.reason_codes[0]!r}")
                    return

    async def ping(self) -> bool:
        """PINGREQ → PINGRESP (True when it came back)."""
        await self.send(encode(PingReq(), LEVEL))
        for packet in await self.receive_packets():
            if isinstance(packet, PingResp):
                return True
        return False

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


async def connect(
    port: int,
    client_id: str,
    *,
    host: str = "127.0.0.1",
    source: str | None = None,
    keep_alive: int = 60,
) -> MqttClient:
    """TCP connect (from ``source`` when given; port chosen by the kernel), CONNECT clean, await CONNACK."""
    sock = trio.socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        if source is not None:
            sock.setsockopt(_socket.IPPROTO_IP, _IP_BIND_ADDRESS_NO_PORT, 1)
            await sock.bind((source, 0))
        await sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    client = MqttClient(trio.SocketStream(sock))
    try:
        await client.send(encode(Connect(client_id, protocol_level=LEVEL, keep_alive=keep_alive), LEVEL))
        packets = await client.receive_packets()
        ack = packets[0]
        if not isinstance(ack, Connack) or ack.reason_code != ReasonCode.SUCCESS:
            raise LoadError(f"CONNECT {client_id!r} refused: {ack!r}")
    except BaseException:
        await client.aclose()
        raise
    return client


def publish_size(topic: str, payload_size: int, qos: int) -> int:
    """Bytes of one PUBLISH on the wire (what a byte-counting subscriber divides by)."""
    pid = 1 if qos else None
    return len(encode(Publish(topic, bytes(payload_size), QoS(qos), packet_id=pid), LEVEL))


class Publisher:
    """Open-loop publisher: ``rate`` msgs/s on ``topic``, 8-byte monotonic-ns stamp + padding payload.

    QoS 1 keeps at most ``window`` PUBLISHes unacknowledged (a reader task must run :meth:`read_acks`).
    ``sent`` counts PUBLISHes written, ``acked`` PUBACKs received.
    """

    def __init__(
        self,
        client: MqttClient,
        topic: str,
        *,
        qos: int,
        rate: float,
        payload_size: int = 64,
        window: int = 64,
        stamp: bool = False,
    ) -> None:
        self.client, self.qos, self.rate, self.window, self.stamp = client, qos, rate, window, stamp
        self.sent = 0
        self.acked = 0
        pid = 1 if qos else None
        self._template = encode(Publish(topic, bytes(payload_size), QoS(qos), packet_id=pid), LEVEL)
        self._payload_at = len(self._template) - payload_size
        self._pid_at = self._payload_at - 2
        self._acked_event = trio.Event()

    def _packets(self, n: int) -> bytes:
        if not self.stamp and not self.qos:
            return self._template * n
        out = bytearray(self._template * n)
        size = len(self._template)
        now = time.monotonic_ns()
        for i in range(n):
            base = i * size
            if self.qos:
                pid = (self.sent + i) % 65535 + 1
                out[base + self._pid_at] = pid >> 8
                out[base + self._pid_at + 1] = pid & 0xFF
            if self.stamp:
                _STAMP.pack_into(out, base + self._payload_at, now)
        return bytes(out)

    async def run(self, seconds: float) -> None:
        """Publish at ``rate`` for ``seconds`` (catching up on a late tick, never ahead of schedule)."""
        start = time.monotonic()
        end = start + seconds
        sent_at_start = self.sent
        while True:
            now = time.monotonic()
            if now >= end:
                break
            due = int((now - start) * self.rate) - (self.sent - sent_at_start)
            if self.qos:
                due = min(due, self.window - (self.sent - self.acked))
            if due > 0:
                await self.client.send(self._packets(due))
                self.sent += due
            await trio.sleep(_TICK_S)

    async def read_acks(self) -> None:
        """Count PUBACKs until cancelled (QoS 1 only)."""
        while True:
            for packet in await self.client.receive_packets():
                if isinstance(packet, PubAck):
                    self.acked += 1


@dataclass(slots=True)
class ByteCountingSubscriber:
    """QoS 0 subscriber counting deliveries as received bytes / ``packet_size`` (every PUBLISH equal)."""

    client: MqttClient
    packet_size: int
    bytes_in: int = 0
    first_at: float = 0.0
    last_at: float = 0.0

    @property
    def received(self) -> int:
        return self.bytes_in // self.packet_size

    @property
    def aligned(self) -> bool:
        return self.bytes_in % self.packet_size == 0

    async def run(self) -> None:
        stream = self.client.stream
        while True:
            try:
                data = await stream.receive_some(_READ)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            now = time.monotonic()
            if not self.bytes_in:
                self.first_at = now
            self.last_at = now
            self.bytes_in += len(data)
            await trio.sleep(0.005)


@dataclass(slots=True)
class ParsingSubscriber:
    """Parses every packet, PUBACKs QoS 1, records latency (s) of stamped payloads in ``latencies``."""

    client: MqttClient
    received: int = 0
    latencies: list[float] = field(default_factory=list)
    record: bool = False

    async def run(self) -> None:
        client = self.client
        while True:
            try:
                packets = await client.receive_packets()
            except LoadError:
                return
            now = time.monotonic_ns()
            acks = []
            for packet in packets:
                if not isinstance(packet, Publish):
                    continue
                self.received += 1
                if self.record:
                    self.latencies.append((now - _STAMP.unpack_from(packet.payload)[0]) / 1e9)
                if packet.qos == QoS.AT_LEAST_ONCE and packet.packet_id is not None:
                    acks.append(encode(PubAck(packet.packet_id), LEVEL))
            if acks:
                try:
                    await client.send(b"".join(acks))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return


# --- QoS 0 subscriber pool (child process) --------------------------------------------------------

_POOL_IN_FLIGHT = 256  # handshakes (TCP connect → CONNACK → SUBACK) under way at once
_POOL_PAUSE_S = 0.005  # after each read batch, so one read drains many packets (as ByteCountingSubscriber)
_POOL_KEEP_ALIVE = 600  # the pool never pings; longer than any ladder step
_POOL_FD_RESERVE = 64  # descriptors the child needs besides its sockets
_STOP, _BYTES, _CLOSED = 0, 1, 2  # slots of the shared int64 array


class SubscriberPool:
    """``count`` clean-session QoS 0 subscribers of ``topic`` in one child process, counting deliveries
    of ``packet_size``-byte PUBLISHes by received bytes (no parse), like :class:`ByteCountingSubscriber`.

    The child (``spawn``, so it holds none of this process's descriptors) opens the connections from
    127.0.0.1 only (one process holds at most its open-files limit, below the ~28k ephemeral ports of one
    source address; loopback TIME_WAIT ports are reused by default), ``_POOL_IN_FLIGHT`` handshakes at a
    time (CONNECT → CONNACK → SUBSCRIBE → SUBACK with the project codec), then reads every socket from
    one epoll loop and stores its byte total in shared memory after each batch. :meth:`start` returns once
    every subscriber holds its SUBACK (LoadError otherwise). :attr:`received` is readable at any time
    (total bytes // ``packet_size``), as are :attr:`received_bytes` and :attr:`disconnected`; after
    :meth:`aclose` (stop the child, close its sockets, reap it) :attr:`received` is exact, the sum of
    whole packets per subscriber, and :attr:`aligned` and :attr:`disconnected` are final. The child's CPU
    is ``cpu_seconds(pool.pid)``.
    As for any ``spawn`` child, the main module must be safe to import (``if __name__ == "__main__"``).

        async with SubscriberPool(port, "bench/t", 10_000, publish_size("bench/t", 64, 0), "t-s") as pool:
            ...  # publish, read pool.received
    """

    def __init__(
        self,
        port: int,
        topic: str,
        count: int,
        packet_size: int,
        client_prefix: str,
        *,
        host: str = "127.0.0.1",
        timeout_s: float | None = None,
    ) -> None:
        self.port, self.topic, self.count, self.packet_size = port, topic, count, packet_size
        self.client_prefix, self.host = client_prefix, host
        self.timeout_s = 30.0 + count * 0.005 if timeout_s is None else timeout_s
        self.setup_s = 0.0  # seconds from the child's first connect to the last SUBACK
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self._shared: ctypes.Array[ctypes.c_longlong] | None = None
        self._final: tuple[int, int, int] | None = None  # whole packets, misaligned, disconnected

    @property
    def pid(self) -> int:
        if self._process is None or self._process.pid is None:
            raise LoadError("subscriber pool not running")
        return self._process.pid

    @property
    def received(self) -> int:
        if self._final is not None:
            return self._final[0]
        return self.received_bytes // self.packet_size

    @property
    def received_bytes(self) -> int:
        """Bytes read from all subscribers so far (while the child runs)."""
        return self._shared[_BYTES] if self._shared is not None else 0

    @property
    def aligned(self) -> bool:
        """Every subscriber's byte count is a multiple of ``packet_size`` (known after :meth:`aclose`)."""
        return self._final is not None and self._final[1] == 0

    @property
    def disconnected(self) -> int:
        """Subscribers the broker closed while counting (so far; final after :meth:`aclose`)."""
        if self._final is not None:
            return self._final[2]
        return self._shared[_CLOSED] if self._shared is not None else 0

    async def start(self) -> None:
        """Spawn the child and wait until every subscriber is subscribed; LoadError when one is not."""
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if self.count + _POOL_FD_RESERVE > soft:
            raise LoadError(f"{self.count} subscribers do not fit the open-files limit {soft}")
        context = multiprocessing.get_context("spawn")
        receiver, sender = context.Pipe(duplex=False)
        self._conn = receiver
        self._shared = context.RawArray("q", 3)
        self._process = context.Process(
            target=_pool_main,
            args=(self.host, self.port, self.topic, self.count, self.packet_size, self.client_prefix,
                  self.timeout_s, self._shared, sender),
            name=f"mqtt-subscriber-pool-{self.client_prefix}",
            daemon=True,
        )  # fmt: skip
        try:
            try:
                self._process.start()
            finally:
                sender.close()
            kind, value = await self._receive(self.timeout_s + 30.0)
            if kind != "ready":
                raise LoadError(value)
            self.setup_s = value
        except BaseException:
            self._reap()
            raise

    async def aclose(self) -> None:
        """Stop the child (it reports the exact counts and closes its sockets) and reap it; idempotent.

        LoadError when the child had died or did not report (it is reaped all the same)."""
        if self._process is None or self._shared is None:
            return
        try:
            self._shared[_STOP] = 1
            kind, *counts = await self._receive(10.0)
            if kind != "done":
                raise LoadError(f"subscriber pool: unexpected report {kind!r}")
            self._final = (counts[0], counts[1], counts[2])
            deadline = time.monotonic() + 10.0
            while self._process.is_alive() and time.monotonic() < deadline:  # noqa: ASYNC110
                await trio.sleep(0.01)
        finally:
            self._reap()

    def _reap(self) -> None:
        """Kill the child if it still runs, wait for it, release the pipe."""
        process, self._process = self._process, None
        if process is not None and process.pid is not None:
            if process.is_alive():
                process.kill()
            process.join()
            process.close()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def _receive(self, timeout_s: float) -> tuple[Any, ...]:
        """The child's next report; LoadError when it exits without one or stays silent ``timeout_s``."""
        conn = self._conn
        if conn is None:
            raise LoadError("subscriber pool not started")
        deadline = time.monotonic() + timeout_s
        while not conn.poll():
            if time.monotonic() >= deadline:
                raise LoadError(f"subscriber pool silent for {timeout_s:g} s")
            await trio.sleep(0.02)
        try:
            return conn.recv()
        except EOFError:
            raise LoadError("subscriber pool exited without a report") from None

    async def __aenter__(self) -> SubscriberPool:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _pool_main(
    host: str,
    port: int,
    topic: str,
    count: int,
    packet_size: int,
    client_prefix: str,
    timeout_s: float,
    shared: ctypes.Array[ctypes.c_longlong],
    conn: Connection,
) -> None:
    """Child entry point of :class:`SubscriberPool`: subscribe all, report, count until told to stop
    (or the parent is gone), report the exact counts, close every socket."""
    parent = os.getppid()
    socks: dict[int, _socket.socket] = {}
    try:
        started = time.monotonic()
        try:
            _pool_subscribe(socks, host, port, topic, count, client_prefix, started + timeout_s)
        except (LoadError, OSError, MqttCodecError) as exc:
            conn.send(("error", f"subscriber pool: {type(exc).__name__}: {exc}"))
            return
        conn.send(("ready", time.monotonic() - started))
        conn.send(("done", *_pool_count(socks, packet_size, shared, parent)))
    finally:
        for sock in socks.values():
            sock.close()
        conn.close()


def _pool_subscribe(
    socks: dict[int, _socket.socket],
    host: str,
    port: int,
    topic: str,
    count: int,
    client_prefix: str,
    deadline: float,
) -> None:
    """Open ``count`` subscribers into ``socks`` (fd → socket); LoadError / OSError / MqttCodecError."""
    subscribe = encode(Subscribe(1, (SubscribeTopic(topic, QoS.AT_MOST_ONCE),)), LEVEL)
    decoders: dict[int, MqttDecoder | None] = {}  # None while the TCP connect is under way
    ids: dict[int, int] = {}  # fd → client number, until its CONNECT is sent
    opened = ready = 0
    with select.epoll() as epoll:
        while ready < count:
            while opened < count and opened - ready < _POOL_IN_FLIGHT:
                sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
                socks[sock.fileno()] = sock
                sock.setblocking(False)
                sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
                code = sock.connect_ex((host, port))
                if code not in (0, errno.EINPROGRESS):
                    raise OSError(code, f"connect: {os.strerror(code)}")
                decoders[sock.fileno()] = None
                ids[sock.fileno()] = opened
                epoll.register(sock.fileno(), select.EPOLLOUT)
                opened += 1
            left = deadline - time.monotonic()
            if left <= 0:
                raise LoadError(f"{ready}/{count} subscribed when the handshake deadline passed")
            for fd, _ in epoll.poll(min(left, 1.0)):
                sock, decoder = socks[fd], decoders[fd]
                if decoder is None:
                    code = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_ERROR)
                    if code:
                        raise OSError(code, f"connect: {os.strerror(code)}")
                    connect = Connect(
                        f"{client_prefix}{ids.pop(fd)}", protocol_level=LEVEL, keep_alive=_POOL_KEEP_ALIVE
                    )
                    sock.sendall(encode(connect, LEVEL))
                    decoders[fd] = MqttDecoder(MAX_PACKET, protocol_level=LEVEL)
                    epoll.modify(fd, select.EPOLLIN)
                    continue
                data = sock.recv(_READ)
                if not data:
                    raise LoadError("broker closed a subscriber during CONNECT/SUBSCRIBE")
                for packet in decoder.receive_data(data):
                    if isinstance(packet, Connack):
                        if packet.reason_code != ReasonCode.SUCCESS:
                            raise LoadError(f"CONNECT refused: {packet.reason_code!r}")
                        sock.sendall(subscribe)
                    elif isinstance(packet, SubAck):
                        if packet.reason_codes[0] >= 0x80:
                            raise LoadError(f"SUBSCRIBE {topic!r} refused: {packet.reason_codes[0]!r}")
                        epoll.unregister(fd)
                        del decoders[fd]
                        ready += 1


def _pool_count(
    socks: dict[int, _socket.socket],
    packet_size: int,
    shared: ctypes.Array[ctypes.c_longlong],
    parent: int,
) -> tuple[int, int, int]:
    """Read every socket until ``shared[_STOP]`` (or the parent exits), publishing the byte total in
    ``shared[_BYTES]`` and the disconnected count in ``shared[_CLOSED]`` after each batch; return (whole
    packets, misaligned subscribers, disconnected)."""
    counts = [0] * (max(socks, default=0) + 1)
    buffers = [bytearray(_READ)]
    readv = os.readv
    total = disconnected = 0
    with select.epoll(len(socks)) as epoll:
        for fd in socks:
            epoll.register(fd, select.EPOLLIN)
        poll, maxevents = epoll.poll, max(len(socks), 1)
        while not shared[_STOP] and os.getppid() == parent:
            events = poll(0.1, maxevents)
            for fd, _ in events:
                try:
                    n = readv(fd, buffers)
                except BlockingIOError:
                    continue
                except OSError:
                    n = 0
                if n:
                    counts[fd] += n
                    total += n
                else:
                    epoll.unregister(fd)
                    disconnected += 1
            if events:
                shared[_BYTES], shared[_CLOSED] = total, disconnected
                time.sleep(_POOL_PAUSE_S)
    whole = sum(c // packet_size for c in counts)
    misaligned = sum(1 for c in counts if c % packet_size)
    return whole, misaligned, disconnected
