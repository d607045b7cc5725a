"""Stream wrappers used by the connection pipeline.

* :class:`CountingStream` counts bytes on the wire (TLS included) for ``conn.closed``.
* :class:`PrefixedStream` replays bytes consumed while sniffing before reading the inner stream, so a
  protocol handler sees the connection from its first byte.
"""

from __future__ import annotations

import trio


class CountingStream(trio.abc.HalfCloseableStream):
    """Delegates to ``inner`` and counts bytes received and sent."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.bytes_in = 0
        self.bytes_out = 0

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await self.inner.receive_some(max_bytes)
        self.bytes_in += len(data)
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)
        self.bytes_out += len(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        if isinstance(self.inner, trio.abc.HalfCloseableStream):
            await self.inner.send_eof()
        else:
            await self.inner.aclose()

    async def aclose(self) -> None:
        await self.inner.aclose()


class PrefixedStream(trio.abc.HalfCloseableStream):
    """A stream whose first reads return ``prefix``; everything else goes to ``inner``."""

    def __init__(self, inner: trio.abc.Stream, prefix: bytes = b"") -> None:
        self.inner = inner
        self._prefix = bytearray(prefix)

    @property
    def pending(self) -> bytes:
        """Replay bytes not yet read."""
        return bytes(self._prefix)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            await trio.lowlevel.checkpoint()
            n = len(self._prefix) if max_bytes is None else min(max_bytes, len(self._prefix))
            data = bytes(self._prefix[:n])
            del self._prefix[:n]
            return data
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
