"""The load of ``bench/kill9.py``: remoting producers and MQTT QoS 1 publishers that record every
acknowledged message with the time its acknowledgement arrived, and the read-back of a topic's queues.

Every message carries a key unique in the run: remoting sends it as ``UNIQ_KEY``, MQTT as the first
bytes of the payload (``<key>|``), so a read-back record names the send it came from.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import trio
from _mqtt_load import LoadError, connect
from _remoting_client import ConnectionLost, RemotingClient, open_client

from mqproxy.codecs import mqtt
from mqproxy.codecs.remoting_codes import ResponseCode

__all__ = ["Acked", "LoadConfig", "read_keys", "run_load"]

#: Queues the remoting topic is created with.
QUEUES = 4
_MQTT_LEVEL = 4


@dataclass(slots=True)
class Acked:
    """Acknowledged messages of one iteration: key -> monotonic time the ack was read."""

    remoting: dict[str, float] = field(default_factory=dict)
    mqtt: dict[str, float] = field(default_factory=dict)
    attempted: int = 0
    first_ack: trio.Event = field(default_factory=trio.Event)


@dataclass(frozen=True, slots=True)
class LoadConfig:
    remoting_topic: str
    mqtt_topic: str
    connections: int = 4
    pipeline: int = 8
    mqtt_clients: int = 4
    mqtt_window: int = 16
    body: int = 128


def _body(key: str, size: int) -> bytes:
    unit = (key + "|").encode()
    return (unit * (size // len(unit) + 1))[:size]


async def _remoting_sender(client: RemotingClient, cfg: LoadConfig, acked: Acked, index: int) -> None:
    for seq in itertools.count():
        key = client.new_uniq_key()
        acked.attempted += 1
        try:
            ack = await client.send(cfg.remoting_topic, _body(key, cfg.body), queue_id=(index + seq) % QUEUES,
                                    uniq_key=key, queue_nums=QUEUES)
        except ConnectionLost:
            return
        if ack.ok:
            acked.remoting[key] = time.monotonic()
            acked.first_ack.set()


async def _remoting_connection(port: int, cfg: LoadConfig, acked: Acked, index: int) -> None:
    try:
        async with open_client(port, group="kill9") as client, trio.open_nursery() as nursery:
            for slot in range(cfg.pipeline):
                nursery.start_soon(_remoting_sender, client, cfg, acked, index * cfg.pipeline + slot)
    except OSError:
        pass  # refused: the proxy is already gone


async def _mqtt_publisher(port: int, cfg: LoadConfig, acked: Acked, index: int, run_id: str) -> None:
    try:
        client = await connect(port, f"kill9-{run_id}-{index}")
    except (OSError, LoadError):
        return
    window = trio.Semaphore(cfg.mqtt_window)
    waiting: dict[int, str] = {}

    async def reader(scope: trio.CancelScope) -> None:
        try:
            while True:
                for packet in await client.receive_packets():
                    if isinstance(packet, mqtt.PubAck) and packet.packet_id in waiting:
                        key = waiting.pop(packet.packet_id)
                        if packet.reason_code < 0x80:
                            acked.mqtt[key] = time.monotonic()
                            acked.first_ack.set()
                        window.release()
        except LoadError:
            scope.cancel()  # the proxy is gone: stop publishing too

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader, nursery.cancel_scope)
            for seq in itertools.count():
                await window.acquire()
                pid = client.next_packet_id()
                key = f"{run_id}-{index}-{seq}"
                waiting[pid] = key
                acked.attempted += 1
                publish = mqtt.Publish(cfg.mqtt_topic, _body(key, cfg.body), mqtt.QoS.AT_LEAST_ONCE,
                                       packet_id=pid)
                try:
                    await client.send(mqtt.encode(publish, _MQTT_LEVEL))
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    nursery.cancel_scope.cancel()
                    return
    finally:
        await client.aclose()


async def run_load(port: int, cfg: LoadConfig, acked: Acked, run_id: str) -> None:
    """Drive every producer until its connection ends (the proxy is killed); returns when all ended."""
    async with trio.open_nursery() as nursery:
        for index in range(cfg.connections):
            nursery.start_soon(_remoting_connection, port, cfg, acked, index)
        for index in range(cfg.mqtt_clients):
            nursery.start_soon(_mqtt_publisher, port, cfg, acked, index, run_id)


async def read_keys(port: int, topic: str, *, mqtt_payload: bool) -> set[str]:
    """The key of every stored message of ``topic`` (UNIQ_KEY, or the payload prefix of MQTT messages),
    over queues 0..15 (a queue that does not exist answers something other than SUCCESS)."""
    keys: set[str] = set()
    async with open_client(port, group="kill9-check") as client:
        for queue_id in range(16):
            offset = 0
            while True:
                reply = await client.pull(topic, queue_id, offset, max_nums=32)
                if reply.code == ResponseCode.SUCCESS:
                    for record in reply.records:
                        if mqtt_payload:
                            keys.add(record.body.split(b"|", 1)[0].decode())
                        else:
                            keys.add(record.properties.get("UNIQ_KEY", ""))
                    offset = reply.next_offset
                elif reply.code == ResponseCode.PULL_RETRY_IMMEDIATELY or (
                    reply.code == ResponseCode.PULL_OFFSET_MOVED and reply.next_offset > offset
                ):
                    offset = reply.next_offset
                else:
                    break
    return keys
