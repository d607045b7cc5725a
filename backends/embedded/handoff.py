"""Hand-off of just-written messages to the readers waiting for them.

A reader parked on a queue (an MQTT push hub, a long-polling pull) is woken by a write and at once pulls
the messages that write appended. :class:`Handoff` keeps those messages, built from what the write
already had in hand, by commit-log offset, so that pull serves them without reading the commit log back
and decoding the records. Only messages of queues a reader waits on (or was woken on within the last
second: a push hub busy delivering the previous batch) are kept, and only the latest ``max_messages`` /
``max_bytes`` (oldest dropped first); a pull of anything else reads the log as before.

Contracts: :meth:`Handoff.put` only after the message is durably appended and indexed (a write that
fails puts nothing), so an offset found here always names that very record; the message is the one a
decode of the record would give (``StoredMessage`` is frozen; readers share it, as they share the MQTT
read cache's).
"""

from __future__ import annotations

from collections import OrderedDict

from mqproxy.model.types import StoredMessage

__all__ = ["Handoff"]


class Handoff:
    """The latest written messages that had readers waiting, by commit-log offset (bounded, FIFO)."""

    def __init__(self, max_messages: int = 4096, max_bytes: int = 8 * 1024 * 1024) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        # an OrderedDict: popping a plain dict's first key again and again makes each next(iter()) walk
        # the dead slots left in front (2.8 against 0.3 µs per put at 4096 kept)
        self._messages: OrderedDict[int, StoredMessage] = OrderedDict()
        self._bytes = 0
        #: Pulls served from here (the reads and decodes saved).
        self.served = 0

    def __len__(self) -> int:
        return len(self._messages)

    def put(self, message: StoredMessage) -> None:
        """Keep ``message`` (just appended and indexed), dropping the oldest beyond the bounds."""
        if message.store_size > self.max_bytes:
            return
        messages = self._messages
        old = messages.pop(message.commitlog_offset, None)
        if old is not None:
            self._bytes -= old.store_size
        while messages and (
            len(messages) >= self.max_messages or self._bytes + message.store_size > self.max_bytes
        ):
            self._bytes -= messages.popitem(last=False)[1].store_size
        messages[message.commitlog_offset] = message
        self._bytes += message.store_size

    def put_many(self, batch: list[StoredMessage]) -> None:
        """:meth:`put` each of ``batch`` (one append's messages, in log order), evicting once for all."""
        messages = self._messages
        added = 0
        for message in batch:
            size = message.store_size
            if size > self.max_bytes:
                continue
            old = messages.pop(message.commitlog_offset, None)
            if old is not None:
                added -= old.store_size
            messages[message.commitlog_offset] = message
            added += size
        self._bytes += added
        # the oldest go first, as put drops them (never the last one kept: it fits on its own)
        while len(messages) > 1 and (len(messages) > self.max_messages or self._bytes > self.max_bytes):
            self._bytes -= messages.popitem(last=False)[1].store_size

    def get(self, commitlog_offset: int) -> StoredMessage | None:
        """The kept message at ``commitlog_offset``, or None (read the log)."""
        message = self._messages.get(commitlog_offset)
        if message is not None:
            self.served += 1
        return message

    def clear(self) -> None:
        self._messages.clear()
        self._bytes = 0
