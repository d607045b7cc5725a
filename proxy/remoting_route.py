"""Route entry for RocketMQ remoting connections: hands the stream to the remoting session driver."""

from __future__ import annotations

import trio

from mqproxy.context import ConnectionContext
from mqproxy.negotiation import Detected


async def serve_remoting_connection(stream: trio.abc.Stream, ctx: ConnectionContext, detected: Detected) -> None:
    from mqproxy.remoting.connection import serve_remoting

    await serve_remoting(stream, ctx)
