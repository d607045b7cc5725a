"""
mqproxy.mqtt.writer
~~~~~~~~~~~~~~~~~~~

The write side of one MQTT connection's trio adapter (:class:`PacketWriter`, a base of
:class:`~mqproxy.mqtt.connection.MqttConnection`): a bounded outbox of encoded packets.

On plain TCP a packet goes straight to the socket when nothing is queued before it (what the socket does
not take is queued). Whatever is queued is drained by a writer task that exists only while there is
something to send: it is started in the connection's nursery when the outbox gets its first byte string,
coalesces what is queued into one ``send_all`` and ends when the outbox is empty, so an idle connection
has no writer task. A peer that takes nothing for ``write_timeout_s`` is a slow consumer and is kicked;
once a write was cut short or failed nothing more goes to the socket.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from mqproxy.codecs.mqtt import Packet, ReasonCode
from mqproxy.mqtt.config import MqttConfig
from mqproxy.mqtt.protocol import MqttProtocol
from mqproxy.runtime.streams import direct_sender
from mqproxy.runtime.tasks import TaskHost

__all__ = ["PacketWriter"]

#: Most queued byte strings one ``send_all`` joins.
_COALESCE = 256


class PacketWriter:
    """The outbox of a connection; :meth:`kick` and ``_nursery`` are the connection's, and so are the slots
    of the attributes set by :meth:`_open_writer` (a mixin of a slotted class declares none itself)."""

    if not TYPE_CHECKING:  # no slots of its own: the connection declares them (unseen by mypy, which would
        __slots__ = ()  # check this mixin's assignments against an empty list)

    stream: trio.abc.Stream
    config: MqttConfig
    proto: MqttProtocol
    _nursery: TaskHost | None
    #: The socket the connection's reader waits on without a cancel scope (see :meth:`_write_nowait`).
    _waiting_on: trio.socket.SocketType | None

    def _open_writer(self, stream: trio.abc.Stream, config: MqttConfig) -> None:
        self._outbox: list[bytes] = []
        self._direct = direct_sender(stream)
        self._queued = 0  # byte strings accepted and not yet sent (the outbox and the writer's send_all)
        self._limit = config.send_buffer_packets  # byte strings the outbox holds (not the one being sent)
        self._writing = False  # a writer task runs
        self._closed = False  # no more packets are accepted (the connection ends)
        self._broken = False  # a write failed or was cut short: nothing more goes to the socket
        self._room: trio.Event | None = None  # waited on by senders while the outbox is full

    def kick(self, reason_code: ReasonCode | None, error: str | None, detail: str | None = None) -> None:
        raise NotImplementedError

    async def _writer(self) -> None:
        """Drain the outbox, then end (started by :meth:`_write_nowait`)."""
        outbox = self._outbox
        try:
            while outbox:
                chunks = outbox[:_COALESCE]
                del outbox[:_COALESCE]
                with trio.move_on_after(self.config.write_timeout_s) as scope:
                    await self.stream.send_all(b"".join(chunks) if len(chunks) > 1 else chunks[0])
                if scope.cancelled_caught:
                    self._broken = True
                    self.kick(None, "slow_consumer", f"peer took no data for {self.config.write_timeout_s}s")
                    return
                self._queued -= len(chunks)
                self._wake()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._broken = True
            self.kick(None, "connection_reset", str(exc) or type(exc).__name__)
        except BaseException:
            self._broken = True
            raise
        finally:
            self._writing = False
            if self._broken:
                self._direct = None  # a packet may be cut short: nothing more goes to this socket
                outbox.clear()
                self._queued = 0
            self._wake()

    def _wake(self) -> None:
        room, self._room = self._room, None
        if room is not None:
            room.set()

    async def _flushed(self) -> None:
        """Wait until the writer task (if any) has drained the outbox or failed."""
        while self._writing:
            if self._room is None:
                self._room = trio.Event()
            await self._room.wait()

    async def send(self, packet: Packet) -> None:
        await self._send_bytes(self.proto.encode(packet))

    async def _send_bytes(self, data: bytes) -> None:
        """Send ``data`` after everything queued before it. No schedule point while the outbox has room,
        so the packets of one read (e.g. a burst of PUBACKs) leave together. Raises
        ``trio.ClosedResourceError`` once the connection ends, ``trio.BrokenResourceError`` once a
        write failed."""
        while len(self._outbox) >= self._limit and not (self._closed or self._broken):
            if self._room is None:
                self._room = trio.Event()
            await self._room.wait()
        if not self._write_nowait(data):
            if self._closed:
                raise trio.ClosedResourceError("connection closed")
            raise trio.BrokenResourceError("an earlier write failed")

    def _can_write_now(self) -> bool:
        """Whether :meth:`_write_nowait` of any bytes would take them now (not closed, not broken, room
        in the outbox)."""
        return (
            not (self._closed or self._broken)
            and len(self._outbox) < self._limit
            and self._nursery is not None
        )

    def _write_nowait(self, data: bytes) -> bool:
        """Send ``data`` after everything queued before it, without a schedule point: straight to the
        socket if nothing is queued and the socket takes it (what it does not take is queued), else
        queued for the writer. False, with nothing written, if the outbox is full or closed."""
        if self._closed or self._broken:
            return False
        if not self._queued and self._direct is not None:
            try:
                written = self._direct(data)
            except trio.BrokenResourceError:
                self._direct = None  # the writer's send_all reports it and closes the connection
                written = 0
            if written == len(data):
                return True
            data = data[written:]  # the outbox is empty, so the rest fits
        elif len(self._outbox) >= self._limit:
            return False
        self._outbox.append(data)
        self._queued += 1
        if not self._writing:
            nursery = self._nursery
            if nursery is None:
                self._outbox.pop()
                self._queued -= 1
                return False
            self._writing = True
            if self._waiting_on is not None:
                # The reader waits on the socket without a cancel scope, to be woken by notify_closing, which
                # would wake this writer's wait too: wake it now, before the writer waits, so that it waits
                # under a cancel scope while a writer task runs (the connection's _read_packets).
                sock, self._waiting_on = self._waiting_on, None
                trio.lowlevel.notify_closing(sock)
            nursery.start_soon(self._writer)
        return True

    async def _close_writer(self, final: bytes | None, timeout_s: float) -> None:
        """Queue ``final`` (if any), accept nothing more and wait up to ``timeout_s`` for the outbox to
        drain."""
        if final is not None:
            self._write_nowait(final)
        self._closed = True
        self._wake()
        with trio.move_on_after(timeout_s):
            await self._flushed()
        self._direct = None
