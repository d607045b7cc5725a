"""
mqproxy.connector.tail
~~~~~~~~~~~~~~~~~~~~~~

Reading a target queue backwards from its tail: what progress recovery needs, and what consumer-offset
translation needs (which source offsets the copies in a target queue carry, at which target offsets).

Contracts:

* :func:`windows_newest_first` yields the queue's messages in windows of up to :data:`WINDOW` messages,
  newest window first and newest message first within it, until ``limit`` messages were read or the
  queue's minimum offset is reached. Each message keeps its own ``queue_offset`` (the target offset).
* :func:`newest_copy_of` is the origin offset of the newest copy of one source queue, or None.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Final

from mqproxy.connector.client import ClusterClient
from mqproxy.connector.origin import SourceQueue
from mqproxy.connector.progress import newest_origin
from mqproxy.model.types import StoredMessage

__all__ = ["WINDOW", "newest_copy_of", "windows_newest_first"]

#: Messages read per backwards step (a pull answers at most 32 on a stock broker and an mqproxy node).
WINDOW: Final = 32


async def windows_newest_first(
    client: ClusterClient, group: str, topic: str, broker: str, queue_id: int, limit: int
) -> AsyncIterator[list[StoredMessage]]:
    high = await client.max_offset(topic, broker, queue_id)
    low = await client.min_offset(topic, broker, queue_id)
    pos, scanned = high, 0
    while pos > low and scanned < limit:
        begin = max(low, pos - WINDOW)
        window: list[StoredMessage] = []
        offset = begin
        while offset < pos:
            pulled = await client.pull(group, topic, broker, queue_id, offset, pos - offset)
            if not pulled.messages:
                break
            window.extend(m for m in pulled.messages if m.queue_offset < pos)
            offset = pulled.next_offset
        window.reverse()
        yield window
        scanned += pos - begin
        pos = begin


async def newest_copy_of(
    client: ClusterClient, group: str, topic: str, broker: str, queue_id: int, source: SourceQueue, limit: int
) -> int | None:
    """The origin offset of the newest copy of ``source`` in the queue (within ``limit`` messages)."""
    async for window in windows_newest_first(client, group, topic, broker, queue_id, limit):
        found = newest_origin(window, source)
        if found is not None:
            return found
    return None
