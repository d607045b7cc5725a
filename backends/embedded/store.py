"""The storage seam of the embedded broker: :class:`MessageStore`.

The broker services and :class:`~mqproxy.backends.embedded.broker.EmbeddedBroker` reach storage through
:class:`MessageStore` only. The embedded store (:mod:`mqproxy.backends.embedded.embedded`) and the
in-memory reference (:mod:`mqproxy.backends.embedded.memory`) implement it; both build on
:class:`~mqproxy.backends.embedded.store_base.StoreBase`.

Contract shared by all implementations:

* Every method may raise :class:`~mqproxy.model.errors.BackendError` subclasses; nothing else on
  purpose.
* ``send`` returns only once the message is durable per the flush policy (sync flush: after fsync).
* Offsets are per (topic, queue): min offset is the first readable, max offset is one past the last.
* ``wait_for_message`` is the long-polling primitive: it returns as soon as the queue's max offset
  exceeds ``offset`` (True) or when ``timeout_s`` elapses (False). Cancellation is honoured.
* Queue lifecycle: ``rewrite_queue`` compacts a queue (min offset rises, max offset never falls);
  ``delete_idle_lmqs`` removes idle, empty, fully read light queues (a later send recreates them at 0).
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Protocol, runtime_checkable

from mqproxy.model.errors import BackendError
from mqproxy.model.types import (
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
class MessageStore(Protocol):
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
        wire: bool = False,
    ) -> PullResult:
        """Read up to ``max_count`` messages from ``offset``, skipping ones the filter rejects. With
        ``wire`` (and no filter) the result may keep them as a remoting pull body
        (:meth:`~mqproxy.model.types.PullResult.of_records`)."""
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

    # --- queue lifecycle -----------------------------------------------------------------------
    async def rewrite_queue(self, topic: str, queue_id: int, keep: Sequence[int], below: int) -> int:
        """Compact a queue in one atomic step: re-append the entries at queue offsets ``keep`` (each must be
        in [min_offset, below); given order is kept) at the queue's end, pointing at the same stored
        messages (no new commit-log record), then delete every entry below ``below``. Returns the new
        min offset. Offsets never go backwards. After a crash either the old or the new layout is visible.
        Readers then see the kept messages at their new offsets (same body, properties, msg id,
        store timestamp).

        ``below`` must be <= the max offset and ``keep`` free of duplicates, else BackendError (nothing
        changes). A kept message pulled from its own topic reports its new queue offset; pulled from a
        light queue it reports its parent topic's offset, as any LMQ read does. A moved entry's index
        time (``search_offset``, ``earliest_store_time``) is the rewrite's, so a queue's times stay sorted.
        """
        ...

    async def delete_idle_lmqs(self, idle_ms: int, in_use: Container[str], limit: int = 10_000) -> list[str]:
        """Delete up to ``limit`` light queues that are idle and empty and return their names. A queue
        qualifies when it is an LMQ, its name is not in ``in_use``, nothing was appended to it for
        ``idle_ms``, no long-poll waiter is parked on it, and every consumer group with an offset on it has
        read to its end. Deleting removes its entries, its name→id row and those consumer offsets; a later
        message to the same name starts a fresh queue at offset 0.

        "Empty" means nobody has anything left to read: the queue's entries are deleted with it. A
        rewrite counts as an append for idleness. One call visits each light queue at most once, in
        chunks, yielding to trio between them, and resumes where the previous call stopped.
        """
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

    async def update_topic(self, config: TopicConfig) -> TopicConfig:
        """Create the topic or replace its queue counts, permission and flags (an admin's
        UPDATE_AND_CREATE_TOPIC). Shrinking a count hides the queues above it; their messages stay."""
        ...

    async def topic_names(self) -> list[str]:
        """Every ordinary topic's name, sorted (light message queues are not topics here)."""
        ...

    # --- lookup --------------------------------------------------------------------------------
    async def query_messages(
        self, topic: str, key: str, max_count: int, begin_ms: int, end_ms: int
    ) -> list[StoredMessage]:
        """Up to ``max_count`` messages of ``topic`` stored within [``begin_ms``, ``end_ms``] that one of
        their ``KEYS`` or their ``UNIQ_KEY`` names (:func:`~mqproxy.backends.embedded.sending.index_keys`),
        newest first."""
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

    async def consumer_groups(self) -> list[str]:
        """Groups with at least one live member, sorted."""
        ...

    async def consumer_info(self, group: str, client_id: str) -> ConsumerInfo | None: ...


def check_rewrite(keep: Sequence[int], below: int, min_offset: int, max_offset: int) -> None:
    """Raise BackendError unless ``rewrite_queue(keep, below)`` is valid for a queue spanning
    [``min_offset``, ``max_offset``)."""
    if below > max_offset:
        raise BackendError(f"rewrite below {below} is past the max offset {max_offset}")
    if len(set(keep)) != len(keep):
        raise BackendError("rewrite keeps an offset twice")
    for offset in keep:
        if not min_offset <= offset < below:
            raise BackendError(f"kept offset {offset} is outside [{min_offset}, {below})")
