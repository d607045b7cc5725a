"""
mqproxy.mqtt.writer
~~~~~~~~~~~~~~~~~~~

The write side of one MQTT connection's trio adapter (:class:`PacketWriter`, a base of
:class:`~mqproxy.mqtt.connection.MqttConnection`): a bounded queue of encoded packets drained by one writer
task that coalesces what is queued into one ``send_all``. A peer that takes nothing for ``write_timeout_s``
is a slow consumer and is kicked. On plain TCP, :meth:`PacketWriter._write_nowait` writes straight to the
socket when nothing is queued before it (the push hubs' path); once a write was cut short nothing more
goes to the socket.
"""

from __future__ import annotations

import trio

from mqproxy.codecs.mqtt import Packet, ReasonCode
from mqproxy.mqtt.config import MqttConfig
from mqproxy.mqtt.protocol import MqttProtocol
from mqproxy.runtime.streams import direct_sender

__all__ = ["PacketWriter"]

#: Most queued byte strings one ``send_all`` joins.
_COALESCE = 256


class PacketWriter:
    """The write queue of a connection; :meth:`kick` is the connection's."""

    stream: trio.abc.Stream
    config: MqttConfig
    proto: MqttProtocol

    def _open_writer(self, stream: trio.abc.Stream, config: MqttConfig) -> None:
        self._send, self._receive = trio.open_memory_channel[bytes](config.send_buffer_packets)
        self._direct = direct_sender(stream)
        self._queued = 0  # byte strings handed to the writer and not yet sent
        self._writer_done = trio.Event()

    def kick(self, reason_code: ReasonCode | None, error: str | None, detail: str | None = None) -> None:
        raise NotImplementedError

    async def _writer(self) -> None:
        receive = self._receive
        try:
            async for first in receive:
                chunks = [first]
                while len(chunks) < _COALESCE:
                    try:
                        chunks.append(receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                with trio.move_on_after(self.config.write_timeout_s) as scope:
                    await self.stream.send_all(b"".join(chunks) if len(chunks) > 1 else first)
                if scope.cancelled_caught:
                    self.kick(None, "slow_consumer", f"peer took no data for {self.config.write_timeout_s}s")
                    return
                self._queued -= len(chunks)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.kick(None, "connection_reset", str(exc) or type(exc).__name__)
        finally:
            self._direct = None  # a packet may be cut short: nothing more goes to this socket
            receive.close()
            self._writer_done.set()

    async def send(self, packet: Packet) -> None:
        await self._send_bytes(self.proto.encode(packet))

    async def _send_bytes(self, data: bytes) -> None:
        """Queue bytes for the writer. No schedule point while the queue has room, so the packets of one
        read (e.g. a burst of PUBACKs) reach the writer together and leave in one ``send_all``."""
        self._queued += 1  # counted before any wait: the writer may send it before we resume
        try:
            try:
                self._send.send_nowait(data)
            except trio.WouldBlock:
                await self._send.send(data)
        except BaseException:
            self._queued -= 1
            raise

    def _write_nowait(self, data: bytes) -> bool:
        """Send ``data`` after everything queued before it, without a schedule point: straight to the
        socket if nothing is queued and the socket takes it (what it does not take is queued), else
        queued for the writer. False, with nothing written, if the queue is full or closed."""
        if not self._queued and self._direct is not None:
            try:
                written = self._direct(data)
            except trio.BrokenResourceError:
                self._direct = None  # the writer's send_all reports it and closes the connection
                written = 0
            if written == len(data):
                return True
            data = data[written:]  # the queue is empty, so the rest fits
        try:
            self._send.send_nowait(data)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            return False
        self._queued += 1
        return True
