"""A small trio MQTT 3.1.1 load generator over raw sockets, the same for every broker under test.

Packets are built with :func:`mqproxy.codecs.mqtt.encode` and parsed with
:class:`~mqproxy.codecs.mqtt.MqttDecoder` (client side, ``protocol_level=4``); hot paths encode one
template with the codec and patch only the packet id / timestamp bytes, so the generator stays cheap.

* :func:`connect` opens one client (optionally from a given 127.0.0.x source address).
* :class:`Publisher` paces an open-loop rate (QoS 0, or QoS 1 with a bounded in-flight window); a
  publisher held back by TCP back-pressure or its window falls behind, which shows as the achieved rate.
* :class:`ByteCountingSubscriber` counts QoS 0 deliveries of fixed-size PUBLISH packets by bytes (no
  parse), pausing 5 ms after each read so one read drains many packets.
* :class:`ParsingSubscriber` parses every packet, PUBACKs QoS 1 and records publish→deliver latency
  from the ``CLOCK_MONOTONIC`` nanoseconds a :class:`Publisher` puts in the first 8 payload bytes.

    client = await connect(port, "pub-1")
    pub = Publisher(client, "bench/in", qos=0, rate=1000.0)
"""

from __future__ import annotations

import itertools
import socket as _socket
import struct
import time
from dataclasses import dataclass, field

import trio

from mqproxy.codecs import mqtt

__all__ = [
    "ByteCountingSubscriber",
    "LoadError",
    "MqttClient",
    "ParsingSubscriber",
    "Publisher",
    "connect",
    "publish_size",
]

LEVEL = 4  # MQTT 3.1.1: every peer (amqtt included) speaks it
MAX_PACKET = 1 << 20
READ_BYTES = 256 * 1024
_TICK_S = 0.002
_IP_BIND_ADDRESS_NO_PORT = getattr(_socket, "IP_BIND_ADDRESS_NO_PORT", 24)
_STAMP = struct.Struct(">Q")


class LoadError(Exception):
    """The broker refused or broke a connection the load generator needed."""


class MqttClient:
    """One MQTT 3.1.1 connection after CONNACK; create with :func:`connect`."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = mqtt.MqttDecoder(MAX_PACKET, protocol_level=LEVEL)
        self._ids = itertools.count(1)

    def next_packet_id(self) -> int:
        return next(self._ids) % 65535 + 1

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def receive_packets(self) -> list[object]:
        """At least one decoded packet; LoadError when the broker closes."""
        while True:
            try:
                data = await self.stream.receive_some(READ_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise LoadError(f"connection lost: {exc}") from None
            if not data:
                raise LoadError("broker closed the connection")
            packets = self.decoder.receive_data(data)
            if packets:
                return packets

    async def subscribe(self, topic_filter: str, qos: int) -> None:
        pid = self.next_packet_id()
        await self.send(
            mqtt.encode(mqtt.Subscribe(pid, (mqtt.SubscribeTopic(topic_filter, mqtt.QoS(qos)),)), LEVEL)
        )
        while True:
            for packet in await self.receive_packets():
                if isinstance(packet, mqtt.SubAck) and packet.packet_id == pid:
                    if packet.reason_codes[0] >= 0x80:
                        raise LoadError(f"SUBSCRIBE {topic_filter!r} refused: {packet.reason_codes[0]!r}")
                    return

    async def ping(self) -> bool:
        """PINGREQ → PINGRESP (True when it came back)."""
        await self.send(mqtt.encode(mqtt.PingReq(), LEVEL))
        for packet in await self.receive_packets():
            if isinstance(packet, mqtt.PingResp):
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
        await client.send(
            mqtt.encode(mqtt.Connect(client_id, protocol_level=LEVEL, keep_alive=keep_alive), LEVEL)
        )
        packets = await client.receive_packets()
        ack = packets[0]
        if not isinstance(ack, mqtt.Connack) or ack.reason_code != mqtt.ReasonCode.SUCCESS:
            raise LoadError(f"CONNECT {client_id!r} refused: {ack!r}")
    except BaseException:
        await client.aclose()
        raise
    return client


def publish_size(topic: str, payload_size: int, qos: int) -> int:
    """Bytes of one PUBLISH on the wire (what a byte-counting subscriber divides by)."""
    pid = 1 if qos else None
    return len(mqtt.encode(mqtt.Publish(topic, bytes(payload_size), mqtt.QoS(qos), packet_id=pid), LEVEL))


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
        self._template = mqtt.encode(
            mqtt.Publish(topic, bytes(payload_size), mqtt.QoS(qos), packet_id=pid), LEVEL
        )
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
                if isinstance(packet, mqtt.PubAck):
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
                data = await stream.receive_some(READ_BYTES)
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
                if not isinstance(packet, mqtt.Publish):
                    continue
                self.received += 1
                if self.record:
                    self.latencies.append((now - _STAMP.unpack_from(packet.payload)[0]) / 1e9)
                if packet.qos == mqtt.QoS.AT_LEAST_ONCE and packet.packet_id is not None:
                    acks.append(mqtt.encode(mqtt.PubAck(packet.packet_id), LEVEL))
            if acks:
                try:
                    await client.send(b"".join(acks))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
