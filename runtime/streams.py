"""Stream wrappers used by the connection pipeline.

* :class:`CountingStream` counts bytes on the wire (TLS included) for ``conn.closed``.
* :class:`PrefixedStream` replays bytes consumed while sniffing before reading the inner stream, so a
  protocol handler sees the connection from its first byte.
* :func:`direct_sender` writes to a plain TCP connection without a task switch (broadcast fast path).
* :func:`receive_now` reads what a plain TCP connection has received already, without waiting.
* :func:`receive_plain` is ``SocketStream.receive_some`` in one frame (a long-lived reader's wait);
  :func:`read_nowait` is its read, for a reader that inlines it.
* :func:`plain_layers` lets a reader of a plain TCP connection skip the wrappers once their replay is read.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import trio

#: ``send(data)``: write what the kernel takes of ``data`` now, never blocking; the count written.
DirectSend = Callable[[bytes], int]


class _DelegatingStream(trio.abc.HalfCloseableStream):
    """Delegates every call to ``inner``; ``send_eof`` closes an inner stream that cannot half-close."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        if isinstance(self.inner, trio.abc.HalfCloseableStream):
            await self.inner.send_eof()
        else:
            await self.inner.aclose()

    async def aclose(self) -> None:
        await self.inner.aclose()


class CountingStream(_DelegatingStream):
    """Delegates to ``inner`` and counts bytes received and sent."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        super().__init__(inner)
        self.bytes_in = 0
        self.bytes_out = 0

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.inner.receive_some(max_bytes)
        self.bytes_in += len(data)
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)
        self.bytes_out += len(data)


class PrefixedStream(_DelegatingStream):
    """A stream whose first reads return ``prefix``; everything else goes to ``inner``."""

    def __init__(self, inner: trio.abc.Stream, prefix: bytes = b"") -> None:
        super().__init__(inner)
        self._prefix = bytearray(prefix)

    @property
    def pending(self) -> bytes:
        """Replay bytes not yet read."""
        return bytes(self._prefix)

    @property
    def replaying(self) -> bool:
        """Whether replay bytes are left to read (:attr:`pending` without the copy)."""
        return bool(self._prefix)

    def take_replay(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` of the replay bytes not yet read, now (``b""`` when none are left): what
        :meth:`receive_some` would return, without its checkpoint, for a reader that reads the layers
        itself (see :func:`plain_layers`)."""
        data = bytes(self._prefix[:max_bytes])
        del self._prefix[:max_bytes]
        return data

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._prefix:
            await trio.lowlevel.checkpoint()
            n = len(self._prefix) if max_bytes is None else min(max_bytes, len(self._prefix))
            data = bytes(self._prefix[:n])
            del self._prefix[:n]
            return data
        return await self.inner.receive_some(max_bytes)


class _DirectSender:
    """What :func:`direct_sender` returns: a slotted object (~50 B; a closure and its cells took ~210 B per
    connection)."""

    __slots__ = ("counting", "sock")

    def __init__(self, sock: trio.socket.SocketType, counting: CountingStream | None) -> None:
        self.sock = sock
        self.counting = counting

    def __call__(self, data: bytes) -> int:
        try:
            n = os.write(self.sock.fileno(), data)  # asked each time: -1 once closed, never a reused number
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise trio.BrokenResourceError(str(exc)) from exc
        counting = self.counting
        if counting is not None:
            counting.bytes_out += n
        return n


def direct_sender(stream: trio.abc.Stream) -> DirectSend | None:
    """A synchronous, non-blocking writer for ``stream`` if it is plain TCP (a :class:`PrefixedStream`
    and/or :class:`CountingStream` over a ``trio.SocketStream``), else None (TLS, WebSocket, memory).

    The writer returns how many bytes the socket took (0 when its send buffer is full) and counts them
    like :meth:`CountingStream.send_all`; a reset or closed socket raises ``trio.BrokenResourceError``.
    Bytes written this way bypass trio's send lock, so the caller must not use it while a ``send_all``
    on the same stream may be in progress, and must queue whatever it did not take behind it in order.
    """
    counting: CountingStream | None = None
    inner = stream
    while isinstance(inner, (PrefixedStream, CountingStream)):
        if isinstance(inner, CountingStream):
            counting = inner
        inner = inner.inner
    if not isinstance(inner, trio.SocketStream):
        return None
    return _DirectSender(inner.socket, counting)


def receive_now(stream: CountingStream, max_bytes: int) -> bytes | None:
    """What a plain TCP ``stream`` (a :class:`CountingStream` over a ``trio.SocketStream``) has received
    already, up to ``max_bytes``, without waiting or a trio checkpoint: the bytes (``b""`` at the end of
    the stream), counted like :meth:`CountingStream.receive_some`. None when nothing is there yet, the
    stream is not plain TCP, or the read fails: the caller awaits ``receive_some`` then, which reports
    errors as usual. For a reader that usually finds its data there (a new connection's first bytes)."""
    inner = stream.inner
    if not isinstance(inner, trio.SocketStream):
        return None
    fileno = inner.socket.fileno()
    if fileno < 0:
        return None
    try:
        data = os.read(fileno, max_bytes)
    except OSError:  # BlockingIOError (nothing yet) included
        return None
    stream.bytes_in += len(data)
    return data


async def receive_plain(stream: trio.SocketStream, max_bytes: int) -> bytes:
    """``stream.receive_some(max_bytes)`` for a reader that waits long (an idle connection): the same
    bytes, errors and checkpoints as trio's socket read (a cancelled caller is cancelled before reading; a
    read that finds data without waiting yields once, shielded; after a wait, which was the schedule point,
    it returns at once), but the wait is one frame over trio's ``wait_readable`` instead of trio's four
    socket layers and their context manager (about 1.5 KB per waiting connection). The caller must be the
    stream's only reader."""
    await trio.lowlevel.checkpoint_if_cancelled()
    sock = stream.socket
    waited = False
    while True:
        data = read_nowait(sock, max_bytes)
        if data is None:
            await trio.lowlevel.wait_readable(sock)
            waited = True
            continue
        if not waited:  # the wait was the schedule point; a read that did not wait yields once
            await trio.lowlevel.cancel_shielded_checkpoint()
        return data


def read_nowait(sock: trio.socket.SocketType, max_bytes: int) -> bytes | None:
    """``os.read`` of a non-blocking trio socket: the bytes (``b""`` at its end), None when nothing is
    there yet; ``trio.ClosedResourceError`` once closed, ``trio.BrokenResourceError`` for a failed read.
    A reader that inlines :func:`receive_plain` (checkpoint, this, ``wait_readable`` until it gets bytes,
    shielded checkpoint) waits one coroutine lighter. Apart from the reader so that the ``BlockingIOError``
    of an empty socket has this short-lived frame in its traceback, not the reader's: a traceback makes a
    frame object for each frame it passes, which then lives as long as the frame (232 B per idle
    connection waiting in ``receive_plain``)."""
    fileno = sock.fileno()
    if fileno < 0:
        raise trio.ClosedResourceError("the socket was closed")
    try:
        return os.read(fileno, max_bytes)
    except BlockingIOError:
        return None
    except OSError as exc:
        raise trio.BrokenResourceError(str(exc)) from exc


def plain_layers(
    stream: trio.abc.Stream,
) -> tuple[trio.SocketStream, CountingStream | None, tuple[PrefixedStream, ...]] | None:
    """For plain TCP (:class:`PrefixedStream` and/or at most one :class:`CountingStream` over a
    ``trio.SocketStream``): the socket stream, the counting layer and the prefixed layers; else None.

    A reader may call the socket stream's ``receive_some`` itself, adding what it got to the counting
    layer's ``bytes_in``, once no prefixed layer is :attr:`~PrefixedStream.replaying` ( one awaited
    frame instead of one per layer, which an idle connection keeps for as long as it waits); before that,
    the replay of the first (outermost) layer that is replaying comes first
    (:meth:`PrefixedStream.take_replay`). The tuple lists the prefixed layers outermost first."""
    counting: CountingStream | None = None
    prefixed: list[PrefixedStream] = []
    inner = stream
    while isinstance(inner, (PrefixedStream, CountingStream)):
        if isinstance(inner, CountingStream):
            if counting is not None:
                return None
            counting = inner
        else:
            prefixed.append(inner)
        inner = inner.inner
    if not isinstance(inner, trio.SocketStream):
        return None
    return inner, counting, tuple(prefixed)
