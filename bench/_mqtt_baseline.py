"""The floor of an MQTT broker on mqproxy's stack: a trio server with mqproxy's MQTT codec and nothing else.

``MQTT_BASELINE_SERVER`` is the source of a child-process server for :func:`_peer.start_peer`. Per connection
it decodes packets with :class:`mqproxy.codecs.mqtt.decoder.MqttDecoder`, answers CONNECT, SUBSCRIBE and
PINGREQ, acknowledges a QoS 1 PUBLISH and forwards every PUBLISH to each subscriber whose filter matches, at
the lower of the two QoS, encoded with mqproxy's encoder; a connection's writer task sends whatever was queued
for it while it last wrote in one write. There is no store, no session, no log, no metrics, no keep-alive and
no access control: what one message costs here is what trio, the sockets and the codec alone cost on this
machine, the part of mqproxy's figure that no change to its store, logging or delivery can remove.
"""

from __future__ import annotations

__all__ = ["MQTT_BASELINE_SERVER"]

MQTT_BASELINE_SERVER = r"""
import trio
from mqproxy.codecs.mqtt import packets as p
from mqproxy.codecs.mqtt.decoder import MqttDecoder
from mqproxy.codecs.mqtt.encoder import encode
from mqproxy.codecs.mqtt.errors import MqttCodecError
from mqproxy.codecs.mqtt.reason_codes import ReasonCode
from mqproxy.codecs.mqtt.topics import topic_matches

subscribers = []   # (filter, qos, connection)


class Connection:
    # a connection's writes: whatever is queued while a write is under way goes out in the next one

    def __init__(self, stream):
        self.stream = stream
        self.level = 4
        self.next_id = 0
        self.pending = []
        self.wake = trio.Event()

    def queue(self, data):
        self.pending.append(data)
        self.wake.set()

    async def writer(self):
        try:
            while True:
                await self.wake.wait()
                self.wake = trio.Event()
                data, self.pending = b"".join(self.pending), []
                await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
            return


async def handler(stream):
    conn = Connection(stream)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.writer)
            try:
                await reader(conn)
            except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError, MqttCodecError):
                pass
            nursery.cancel_scope.cancel()
    finally:
        subscribers[:] = [s for s in subscribers if s[2] is not conn]
        await trio.aclose_forcefully(stream)


async def reader(conn):
    decoder = MqttDecoder(1 << 20)
    while True:
        data = await conn.stream.receive_some(65536)
        if not data:
            return
        for packet in decoder.receive_data(data):
            kind = type(packet)
            if kind is p.Publish:
                if packet.qos:
                    conn.queue(encode(p.PubAck(packet.packet_id), conn.level))
                for topic_filter, qos, sub in subscribers:
                    if topic_matches(topic_filter, packet.topic):
                        level = min(qos, packet.qos)
                        packet_id = None
                        if level:
                            sub.next_id = sub.next_id % 65535 + 1
                            packet_id = sub.next_id
                        fwd = p.Publish(packet.topic, packet.payload, p.QoS(level), packet_id=packet_id)
                        sub.queue(encode(fwd, sub.level))
            elif kind is p.Connect:
                conn.level = packet.protocol_level
                conn.queue(encode(p.Connack(), conn.level))
            elif kind is p.Subscribe:
                for wanted in packet.topics:
                    subscribers.append((wanted.topic_filter, int(wanted.qos), conn))
                codes = tuple(ReasonCode(int(t.qos)) for t in packet.topics)
                conn.queue(encode(p.SubAck(packet.packet_id, codes), conn.level))
            elif kind is p.PingReq:
                conn.queue(encode(p.PingResp(), conn.level))
            elif kind is p.Disconnect:
                return
"""
