"""The typed interface between protocol handlers and storage.

Remoting, MQTT and gRPC handlers depend on :class:`Backend` only. The embedded store
(:mod:`mqproxy.broker.embedded`), the in-memory reference (:mod:`mqproxy.broker.memory`) and the
cluster backend implement it; handlers never know which one they hold.

Contract shared by all implementations:

* Every method may raise :class:`~mqproxy.broker.errors.BackendError` subclasses; nothing else on
  purpose.
* ``send`` returns only once the message is durable per the flush policy (sync flush: after fsync).
* Offsets are per (topic, queue): min offset is the first readable, max offset is one past the last.
* ``wait_for_message`` is the long-polling primitive: it returns as soon as the queue's max offset
  exceeds ``offset`` (True) or when ``timeout_s`` elapses (False). Cancellation is honoured.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from mqproxy.broker.types import (
    ConsumerInfo,
    ConsumerOffset,
    Message,
    PullResult,
    SendResult,
    StoredMessage,
    TagFilter,
    TopicConfig,
)


@runtime_checkable
class Backend(Protocol):
    # --- produce -------------------------------------------------------------------------------
    async def send(self, message: Message) -> SendResult:
        """Store one message (auto-creating its topic if allowed) and return where it went."""
        ...

    async def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        """Store messages of one topic and queue atomically: all or none become visible."""
        ...

    # --- consume -------------------------------------------------------------------------------
    async def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        *,
        tag_filter: TagFilter | None = None,
        max_bytes: int = 4 * 1024 * 1024,
    ) -> PullResult:
        """Read up to ``max_count`` messages from ``offset``, skipping ones the filter rejects."""
        ...

    async def get_message(self, commitlog_offset: int) -> StoredMessage | None:
        """The stored record at ``commitlog_offset`` (as in message ids), or None if there is none."""
        ...

    async def wait_for_message(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        """Block until the queue holds a message at or after ``offset``, or the timeout elapses."""
        ...

    # --- offsets -------------------------------------------------------------------------------
    async def min_offset(self, topic: str, queue_id: int) -> int: ...

    async def max_offset(self, topic: str, queue_id: int) -> int: ...

    async def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first offset whose store time is >= ``timestamp_ms`` (max offset if none)."""
        ...

    async def earliest_store_time(self, topic: str, queue_id: int) -> int:
        """Store time (ms) of the message at the min offset; -1 when the queue is empty."""
        ...

    async def query_consumer_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        """The committed offset of ``group`` on the queue, or None if it never committed."""
        ...

    async def commit_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None: ...

    async def consumer_offsets(self) -> list[ConsumerOffset]:
        """Every committed offset (for lag metrics); light message queues excluded."""
        ...

    # --- accounting ----------------------------------------------------------------------------
    async def store_bytes(self) -> int:
        """Bytes of message data held (commit-log size for the embedded store)."""
        ...

    # --- metadata ------------------------------------------------------------------------------
    async def get_topic(self, topic: str) -> TopicConfig | None:
        """The topic's config, or None if it does not exist (no auto-creation here)."""
        ...

    async def create_topic(self, topic: str, queue_count: int | None = None) -> TopicConfig:
        """Create the topic if missing (idempotent); ``None`` means the configured default count."""
        ...

    # --- consumer groups -----------------------------------------------------------------------
    async def register_consumer(self, info: ConsumerInfo) -> bool:
        """Add or refresh a group member; True if the group's membership changed."""
        ...

    async def unregister_consumer(self, group: str, client_id: str) -> bool:
        """Remove a group member; True if it was a member."""
        ...

    async def consumer_ids(self, group: str) -> list[str]:
        """Client ids of the live members of ``group``, sorted."""
        ...

    async def consumer_info(self, group: str, client_id: str) -> ConsumerInfo | None: ...
