"""
mqproxy.runtime.handlers
~~~~~~~~~~~~~~~~~~~~~~~~

:class:`ProtocolService`: the shape of a protocol behind the one port. The server core builds one instance
per protocol at start-up (with the broker facade and the protocol's own settings), runs its background
work, and hands it every connection the sniffer attributes to it.
"""

from __future__ import annotations

from typing import Protocol

import trio

from mqproxy.negotiation import Detected
from mqproxy.runtime.context import ConnectionContext

__all__ = ["ProtocolService"]


class ProtocolService(Protocol):
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The protocol's background work (state recovery, timers) until cancelled; ``task_status.started()``
        once connections may be served. A protocol without background work starts and returns."""
        ...

    async def serve(self, stream: trio.abc.Stream, ctx: ConnectionContext, detected: Detected) -> None:
        """Serve one connection until it ends; the core then closes the stream and logs ``conn.closed``."""
        ...
