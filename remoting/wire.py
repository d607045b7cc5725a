"""
mqproxy.remoting.wire
~~~~~~~~~~~~~~~~~~~~~

The socket side of one remoting connection without trio's stream layers, when the connection is plain
TCP (:func:`~mqproxy.runtime.streams.plain_layers`); any other stream (TLS, memory) goes through its own
``receive_some`` and is never written here.

Contracts:

* :meth:`SocketWire.receive_some` returns what the peer sent (``b""`` at EOF) as the stream would, counted
  in the counting layer's ``bytes_in``. While a prefixed layer still replays sniffed bytes it reads the
  stream. On plain TCP it reads the socket at once and, only when nothing was there, waits until it is
  readable: one schedule point per read (trio's own socket read has two when it has to wait) and no
  Python frame per wrapper. It checks for cancellation before reading and never loses bytes it read to a
  cancellation. A reset raises ``trio.BrokenResourceError``; a closed socket ``trio.ClosedResourceError``.
* :meth:`SocketWire.send_now` writes what the socket's send buffer takes at once, without a schedule point,
  and returns how many bytes that was (0 on a stream that is not plain TCP). Only for a caller that knows
  no ``send_all`` is under way on the stream (see :meth:`~mqproxy.remoting_client.outbox.FrameOutbox.idle`),
  which then queues the rest behind it.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

import trio

from mqproxy.runtime.streams import CountingStream, PrefixedStream, direct_sender, plain_layers

__all__ = ["SocketWire"]


def _never_sent(data: bytes) -> int:
    return 0


class SocketWire:
    """Direct reads and writes of ``stream``'s socket when it is plain TCP (see the module contracts)."""

    __slots__ = ("_counting", "_fileno", "_prefixed", "_stream", "send_now")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        layers = plain_layers(stream)
        sender = direct_sender(stream) if layers is not None else None
        self.send_now = _never_sent if sender is None else sender
        self._fileno: Callable[[], int] | None = None
        self._counting: CountingStream | None = None
        self._prefixed: tuple[PrefixedStream, ...] = ()
        if layers is not None:
            self._fileno = layers[0].socket.fileno
            self._counting = layers[1]
            self._prefixed = layers[2]

    async def receive_some(self, max_bytes: int) -> bytes | bytearray:
        fileno = self._fileno
        if fileno is None or any(p.replaying for p in self._prefixed):
            return await self._stream.receive_some(max_bytes)
        await trio.lowlevel.checkpoint_if_cancelled()
        waited = False
        while True:
            fd = fileno()
            if fd < 0:
                raise trio.ClosedResourceError("the socket was closed")
            try:
                data = os.read(fd, max_bytes)
                break
            except BlockingIOError:
                await trio.lowlevel.wait_readable(fd)
                waited = True
            except OSError as exc:
                if exc.errno == errno.EBADF:
                    raise trio.ClosedResourceError("the socket was closed") from None
                raise trio.BrokenResourceError(str(exc) or type(exc).__name__) from exc
        if self._counting is not None:
            self._counting.bytes_in += len(data)
        if not waited:  # let other tasks run, as every read does; what was read stays read
            await trio.lowlevel.cancel_shielded_checkpoint()
        return data
