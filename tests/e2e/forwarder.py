"""A port forward for the advertised-address tests: a trio TCP forwarder on its own thread.

Contract: :class:`Forwarder` binds 127.0.0.1 on a free port at construction (``address`` is known before
the proxy starts, so the proxy can advertise it); :meth:`Forwarder.forward_to` starts relaying every
connection to the target in both directions (half-closes passed on). ``upstream_locals`` holds the local
``host:port`` of every connection the forwarder opened to the target, so a test can tell the target's
peers that came through the forwarder from the ones that did not. :meth:`close` stops it all.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import trio


class Forwarder:
    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._sock.getsockname()[1]}"
        self.upstream_locals: set[str] = set()
        self.connections = 0
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._cancel: trio.CancelScope | None = None
        self._started = threading.Event()

    def forward_to(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._thread = threading.Thread(target=trio.run, args=(self._main, (host, int(port))), daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("forwarder did not start")

    async def _main(self, target: tuple[str, int]) -> None:
        self._sock.listen(64)
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(self._sock))
        self._token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as self._cancel:
            async with trio.open_nursery() as nursery:
                self._started.set()
                while True:
                    inbound = await listener.accept()
                    nursery.start_soon(self._relay, inbound, target)

    async def _relay(self, inbound: trio.SocketStream, target: tuple[str, int]) -> None:
        try:
            outbound = await trio.open_tcp_stream(*target)
        except OSError:
            await inbound.aclose()
            return
        local = outbound.socket.getsockname()
        self.upstream_locals.add(f"{local[0]}:{local[1]}")
        self.connections += 1
        async with inbound, outbound, trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, inbound, outbound)
            nursery.start_soon(self._pump, outbound, inbound)

    @staticmethod
    async def _pump(source: trio.SocketStream, sink: trio.SocketStream) -> None:
        try:
            while data := await source.receive_some(65536):
                await sink.send_all(data)
            await sink.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass

    def close(self) -> None:
        if self._token is not None and self._cancel is not None:
            cancel: Any = self._cancel
            try:
                trio.from_thread.run_sync(cancel.cancel, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        if self._thread is not None:
            self._thread.join(10)
        self._sock.close()
