"""The accept loop: every connection waiting in the listen backlog taken in one step.

:class:`Acceptor` owns the listening socket (taken over from a ``trio.SocketListener``) and accepts on it
without trio's per-socket ``accept`` (a checkpoint and a scheduling yield per connection): while the
backlog holds connections it accepts them one after another, starting each one's handler, and yields to
the scheduler every ``ACCEPT_BATCH`` connections and whenever the backlog is empty (then it waits for the
listener to be readable). The peer's address is the one ``accept`` returns (no ``getpeername`` per
connection) and, for a listener bound to one address, the local address is the listener's (no
``getsockname``); a wildcard listener asks each socket.

Errors: the errors trio's ``SocketListener.accept`` ignores (a connection reset or refused before it was
accepted) are skipped; resource exhaustion (``ACCEPT_CAPACITY_ERRNOS``) is logged as
``proxy.accept_failed`` and retried after ``ACCEPT_RETRY_S``; any other error ends the loop (raised).
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Awaitable, Callable

import structlog
import trio

__all__ = ["ACCEPT_BATCH", "ACCEPT_CAPACITY_ERRNOS", "ACCEPT_RETRY_S", "Acceptor", "Addresses"]

_log = structlog.get_logger("mqproxy.server")

#: accept() errors that mean "overloaded", not "broken" (trio's serve_listeners treats them the same way).
ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
ACCEPT_RETRY_S = 0.1
#: Connections accepted in a row before the loop lets other tasks run.
ACCEPT_BATCH = 16
#: accept() errors about one connection that went away before it was accepted (trio's list).
_SKIPPED_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "EPERM", "ECONNABORTED", "EPROTO", "ENETDOWN", "ENOPROTOOPT", "EHOSTDOWN", "ENONET", "EHOSTUNREACH",
        "EOPNOTSUPP", "ENETUNREACH", "ENOSR", "ESOCKTNOSUPPORT", "EPROTONOSUPPORT", "ETIMEDOUT", "ECONNRESET",
    )
    if hasattr(errno, name)
)  # fmt: skip

#: (peer, local) of an accepted connection.
Addresses = tuple[tuple[str, int], tuple[str, int]]
#: What the loop starts per connection, in the connection nursery: ``handler(stream, *args, addresses)``
#: (called directly, no wrapper coroutine: one frame fewer per idle connection).
Handler = Callable[..., Awaitable[object]]


class Acceptor:
    """Accepts on ``listener``'s socket (the acceptor owns it from now on; ``listener`` must not be used
    again): :meth:`run` until cancelled, :meth:`aclose` to close the socket."""

    def __init__(self, listener: trio.SocketListener) -> None:
        self._raw = socket.socket(fileno=listener.socket.detach())
        self.socket = trio.socket.from_stdlib_socket(self._raw)  # non-blocking from now on
        name = self._raw.getsockname()
        #: The local address of every accepted connection when the listener is bound to one address.
        self.local: tuple[str, int] | None = None
        if name[0] not in ("0.0.0.0", "::"):
            self.local = (name[0], name[1])

    async def run(self, nursery: trio.Nursery, handler: Handler, *args: object) -> None:
        """Accept until cancelled, starting ``handler(stream, *args, addresses)`` for each connection in
        ``nursery``."""
        accept = self._raw.accept
        while True:
            await trio.lowlevel.checkpoint()
            for _ in range(ACCEPT_BATCH):
                try:
                    sock, peer = accept()
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(self._raw)
                    break
                except OSError as exc:
                    if exc.errno in _SKIPPED_ERRNOS:
                        continue
                    if exc.errno in ACCEPT_CAPACITY_ERRNOS:
                        _log.error(
                            "proxy.accept_failed",
                            detail=f"{os.strerror(exc.errno)}; retrying in {ACCEPT_RETRY_S}s",
                        )
                        await trio.sleep(ACCEPT_RETRY_S)
                        break
                    raise
                stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
                addresses = ((peer[0], peer[1]), self._local_of(sock))
                nursery.start_soon(handler, stream, *args, addresses)  # type: ignore[arg-type]  # mypy: varargs

    def _local_of(self, sock: socket.socket) -> tuple[str, int]:
        if self.local is not None:
            return self.local
        try:
            name = sock.getsockname()
        except OSError:
            return ("?", 0)
        return (name[0], name[1])

    async def aclose(self) -> None:
        """Close the listening socket."""
        self.socket.close()
        await trio.lowlevel.checkpoint()
