"""A pool of QoS 0 subscribers in a child process for the MQTT benchmark's fan-out: plain sockets, one
epoll loop, deliveries counted by bytes, so a large fan-out is counted on the other core than the
publishers of ``_mqtt_load``. The contract is :class:`SubscriberPool`'s docstring."""

from __future__ import annotations

import ctypes
import errno
import multiprocessing
import os
import resource
import select
import socket as _socket
import time
from multiprocessing.connection import Connection
from typing import Any

import trio
from _mqtt_load import LEVEL, MAX_PACKET, READ_BYTES, LoadError

from mqproxy.codecs import mqtt

__all__ = ["SubscriberPool"]

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
        except (LoadError, OSError, mqtt.MqttCodecError) as exc:
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
    """Open ``count`` subscribers into ``socks`` (fd → socket); LoadError / OSError / mqtt.MqttCodecError."""
    subscribe = mqtt.encode(mqtt.Subscribe(1, (mqtt.SubscribeTopic(topic, mqtt.QoS.AT_MOST_ONCE),)), LEVEL)
    decoders: dict[int, mqtt.MqttDecoder | None] = {}  # None while the TCP connect is under way
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
                    connect = mqtt.Connect(
                        f"{client_prefix}{ids.pop(fd)}", protocol_level=LEVEL, keep_alive=_POOL_KEEP_ALIVE
                    )
                    sock.sendall(mqtt.encode(connect, LEVEL))
                    decoders[fd] = mqtt.MqttDecoder(MAX_PACKET, protocol_level=LEVEL)
                    epoll.modify(fd, select.EPOLLIN)
                    continue
                data = sock.recv(READ_BYTES)
                if not data:
                    raise LoadError("broker closed a subscriber during CONNECT/SUBSCRIBE")
                for packet in decoder.receive_data(data):
                    if isinstance(packet, mqtt.Connack):
                        if packet.reason_code != mqtt.ReasonCode.SUCCESS:
                            raise LoadError(f"CONNECT refused: {packet.reason_code!r}")
                        sock.sendall(subscribe)
                    elif isinstance(packet, mqtt.SubAck):
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
    buffers = [bytearray(READ_BYTES)]
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
