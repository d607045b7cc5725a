"""A read cache shared by every subscription reader of the gateway, in front of ``LightStore.pull``.

RIP-33 fan-out: all subscribers of a topic read the same light message queue, so a 1-to-N broadcast would
cost N store reads per message. :class:`ReadCache` keeps aligned *segments* of ``segment_size``
consecutive queue offsets (segment ``k`` holds offsets ``[k*size, (k+1)*size)``) and serves every reader
of a segment from one store read.

Contract of :meth:`ReadCache.pull` (same answer as ``LightStore.pull`` without a tag filter):

* A cached answer holds the messages of ``[offset, offset + n)``; it may run on into the next cached
  segments. Its ``min_offset``/``max_offset`` are those of the store read that loaded the data.
* Only offsets below the end of what the store returned are served from memory. An offset at or past a
  cached segment's end always reads the store (extending the segment from its end), so a partial tail
  segment never hides later messages.
* Concurrent misses on one segment share one store read: the first caller fetches, the others wait for
  its result. If the fetching task is cancelled (or fails with anything but a ``BackendError``), a waiter
  fetches again; a ``BackendError`` reaches every waiter.
* At most ``max_segments`` segments and ``max_bytes`` of messages are kept, each message charged its
  in-memory cost (:func:`message_charge`: its store size plus :data:`MESSAGE_OVERHEAD_BYTES`, so that
  ``max_bytes`` bounds the memory held, small messages included); the least recently used segment goes
  first. ``max_segments == 0`` or ``max_bytes == 0`` disables caching (every
  call is a direct pull).

:meth:`ReadCache.delivery` memoizes, per stored message, what every subscriber derives from it alike: its MQTT
attributes and its QoS 0 PUBLISH bytes per protocol level and retain flag. At most ``max_deliveries``
messages and about ``max_bytes / 4`` (body plus one encoding each) are kept, oldest first out; a message
bigger than 1/64 of that is not kept (nothing is when ``max_bytes`` is 0). An entry is reused only for the
very object it was made from, so a message read again from the store is decoded again, never confused
with another record.

Counters (plain attributes, never reset): ``hits`` (answered from a cached segment), ``coalesced``
(answered by another caller's in-flight read), ``misses`` (segment reads from the store), ``bypasses``
(direct store reads: cache disabled, or an offset a segment read could not serve), ``evictions``.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from typing import TYPE_CHECKING

import trio

from mqproxy.codecs.mqtt import MQTT_5, NO_PROPERTIES, Publish, QoS, encode
from mqproxy.codecs.mqtt.encoding import encode_utf8, encode_varint
from mqproxy.codecs.mqtt.topics import validate_topic_name
from mqproxy.model.errors import BackendError
from mqproxy.model.types import PullResult, PullStatus, StoredMessage
from mqproxy.mqtt.mapping import MqttAttributes, decode_properties

if TYPE_CHECKING:
    from mqproxy.mqtt.store import LightStore

#: Offsets per segment (rocketmq-mqtt's ``pullBatchSize``).
SEGMENT_SIZE = 32
DEFAULT_MAX_SEGMENTS = 4096
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
#: What one cached message costs in memory beyond its store size (the StoredMessage, its properties dict
#: and their strings). Measured with tracemalloc (tests/mqtt/test_mqtt_read_cache.py): a 64-byte MQTT
#: message of store size ~320 B holds ~1,180 B. Charging only the store size let 4096 segments of such
#: messages hold ~160 MB under a 64 MiB cap (issue 19's QoS 0 flood).
MESSAGE_OVERHEAD_BYTES = 896
#: Messages whose per-subscriber-independent delivery work is memoized.
DEFAULT_MAX_DELIVERIES = 4096

_Key = tuple[str, int, int]  # (topic, queue id, segment start offset)


class _Segment:
    """Messages of offsets ``[start, start + len(messages))``; ``start`` is segment-aligned."""

    __slots__ = ("max_offset", "messages", "min_offset", "size", "start")

    def __init__(self, start: int) -> None:
        self.start = start
        self.messages: tuple[StoredMessage, ...] = ()
        self.size = 0
        self.min_offset = 0
        self.max_offset = 0

    @property
    def end(self) -> int:
        return self.start + len(self.messages)


class _Fetch:
    """One in-flight store read of a segment from ``start``; ``result`` stays None if it did not finish."""

    __slots__ = ("done", "error", "result", "start")

    def __init__(self, start: int) -> None:
        self.start = start
        self.done = trio.Event()
        self.result: PullResult | None = None
        self.error: BackendError | None = None


class Delivery:
    """What every subscriber derives alike from one stored message (see :meth:`ReadCache.delivery`)."""

    __slots__ = ("_qos0", "attributes", "message", "size")

    def __init__(self, message: StoredMessage) -> None:
        self.message = message
        #: The MQTT view of the message; None if it is not meant for MQTT.
        self.attributes: MqttAttributes | None = decode_properties(message.properties)
        self._qos0: dict[tuple[int, bool], bytes] = {}
        self.size = 2 * len(message.body) + 256  # what the memo charges for it: body and ~one encoding

    def qos0_publish(self, level: int, retain: bool) -> bytes:
        """The QoS 0 PUBLISH of this message at protocol ``level`` (its MQTT 5 properties included at
        level 5; no subscription identifier, no topic alias, expiry not adjusted). Only for MQTT messages.
        """
        key = (level, retain)
        data = self._qos0.get(key)
        if data is None:
            attrs = self.attributes
            assert attrs is not None
            props = attrs.properties if level == MQTT_5 else NO_PROPERTIES
            if props is NO_PROPERTIES or props == NO_PROPERTIES:
                # encode()'s bytes without a Publish: the checked topic string, no packet id, and at
                # level 5 an empty property list
                body = _topic_string(attrs.topic) + (b"\x00" if level == MQTT_5 else b"") + self.message.body
                data = (_QOS0_RETAIN if retain else _QOS0) + encode_varint(len(body)) + body
            else:
                publish = Publish(
                    attrs.topic, self.message.body, QoS.AT_MOST_ONCE, retain, False, None, props
                )
                data = encode(publish, level)
            self._qos0[key] = data
        return data


_QOS0 = b"\x30"  # PUBLISH, QoS 0, no DUP, no RETAIN
_QOS0_RETAIN = b"\x31"


@functools.lru_cache(maxsize=4096)
def _topic_string(topic: str) -> bytes:
    """A PUBLISH's topic name as the encoder writes it (checked the same way: a bad one raises, and is
    not remembered)."""
    validate_topic_name(topic)
    return encode_utf8(topic)


def message_charge(message: StoredMessage) -> int:
    """What one cached message counts against ``max_bytes``: about the memory it holds."""
    return MESSAGE_OVERHEAD_BYTES + max(message.store_size, len(message.body))


def _bytes(messages: tuple[StoredMessage, ...]) -> int:
    return sum(map(message_charge, messages))


class ReadCache:
    """Bounded LRU of LMQ segments with coalesced misses (see the module docstring for the contract)."""

    def __init__(
        self,
        backend: LightStore,
        *,
        segment_size: int = SEGMENT_SIZE,
        max_segments: int = DEFAULT_MAX_SEGMENTS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_deliveries: int = DEFAULT_MAX_DELIVERIES,
    ) -> None:
        if segment_size < 1:
            raise ValueError("segment_size must be at least 1")
        if max_segments < 0 or max_bytes < 0:
            raise ValueError("max_segments and max_bytes must not be negative")
        self.backend = backend
        self.segment_size = segment_size
        self.max_segments = max_segments
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.coalesced = 0
        self.misses = 0
        self.bypasses = 0
        self.evictions = 0
        self._segments: OrderedDict[_Key, _Segment] = OrderedDict()
        self._inflight: dict[_Key, _Fetch] = {}
        self.max_deliveries = max_deliveries
        # by commit-log offset, oldest first (an OrderedDict: see backends/embedded/handoff.py)
        self._deliveries: OrderedDict[int, Delivery] = OrderedDict()
        self._delivery_budget = max_bytes // 4
        self.delivery_bytes = 0

    @property
    def enabled(self) -> bool:
        return self.max_segments > 0 and self.max_bytes > 0

    @property
    def backend_pulls(self) -> int:
        """Store reads made through this cache."""
        return self.misses + self.bypasses

    def cached_topics(self) -> set[str]:
        """Queues with a cached or in-flight segment: while a queue is here it must not be deleted and
        recreated, or its stale segments would answer for the new queue's offsets."""
        return {key[0] for key in self._segments} | {key[0] for key in self._inflight}

    def __len__(self) -> int:
        """Number of cached segments."""
        return len(self._segments)

    def delivery(self, message: StoredMessage) -> Delivery:
        """The memoized :class:`Delivery` of ``message`` (made from this very object, else made now)."""
        memo = self._deliveries.get(message.commitlog_offset)
        if memo is not None and memo.message is message:
            return memo
        memo = Delivery(message)
        if self.max_deliveries > 0 and memo.size <= self._delivery_budget // 64:
            deliveries = self._deliveries
            stale = deliveries.pop(message.commitlog_offset, None)
            if stale is not None:
                self.delivery_bytes -= stale.size
            while deliveries and (
                len(deliveries) >= self.max_deliveries
                or self.delivery_bytes + memo.size > self._delivery_budget
            ):
                self.delivery_bytes -= deliveries.popitem(last=False)[1].size
            deliveries[message.commitlog_offset] = memo
            self.delivery_bytes += memo.size
        return memo

    async def pull(self, topic: str, queue_id: int, offset: int, max_count: int) -> PullResult:
        """Up to ``max_count`` messages of (``topic``, ``queue_id``) from ``offset``, as ``LightStore.pull``
        does."""
        if not self.enabled or max_count < 1 or offset < 0:
            self.bypasses += 1
            return await self.backend.pull(topic, queue_id, offset, max_count)
        key = (topic, queue_id, offset - offset % self.segment_size)
        while True:
            segment = self._segments.get(key)
            if segment is not None and offset < segment.end:
                self.hits += 1
                return self._serve(key, segment, offset, max_count)
            fetch = self._inflight.get(key)
            if fetch is None:
                fetch = await self._fetch(key, segment)
                shared = False
            else:
                await fetch.done.wait()
                if fetch.error is not None:
                    raise fetch.error
                if fetch.result is None:
                    continue  # the fetching task was cancelled: fetch again (or wait for who does)
                shared = True
            if offset < fetch.start:
                continue  # the segment was evicted during a read from its old end: read it from its start
            assert fetch.result is not None  # a finished read
            answer = self._answer(fetch.result, fetch.start, offset, max_count)
            if answer is not None:
                if shared:
                    self.coalesced += 1
                return answer
            self.bypasses += 1
            return await self.backend.pull(topic, queue_id, offset, max_count)

    def pull_now(self, topic: str, queue_id: int, offset: int, max_count: int) -> PullResult | None:
        """:meth:`pull` as a plain call, for a caller inside the store's notify of a write (the push hubs'
        hand-off): the same answer, from a cached segment or a segment read through the store's
        ``pull_now``; None (nothing read) when the store has no such call, or another caller is reading
        the segment now (pull as usual then)."""
        pull_now = getattr(self.backend, "pull_now", None)
        if pull_now is None or max_count < 1 or offset < 0:
            return None
        if not self.enabled:
            result: PullResult | None = pull_now(topic, queue_id, offset, max_count)
            if result is not None:
                self.bypasses += 1
            return result
        key = (topic, queue_id, offset - offset % self.segment_size)
        segment = self._segments.get(key)
        if segment is not None and offset < segment.end:
            self.hits += 1
            return self._serve(key, segment, offset, max_count)
        if key in self._inflight:
            return None
        base = key[2]
        start = segment.end if segment is not None else base
        result = pull_now(topic, queue_id, start, base + self.segment_size - start)
        if result is None:
            return None
        self.misses += 1
        self._store(key, start, result)
        answer = self._answer(result, start, offset, max_count)
        if answer is not None:
            return answer
        self.bypasses += 1
        direct: PullResult | None = pull_now(topic, queue_id, offset, max_count)
        return direct

    async def _fetch(self, key: _Key, segment: _Segment | None) -> _Fetch:
        """Read the rest of the segment from the store (from its cached end, else its start)."""
        topic, queue_id, base = key
        start = segment.end if segment is not None else base
        fetch = self._inflight[key] = _Fetch(start)
        self.misses += 1
        try:
            fetch.result = await self.backend.pull(topic, queue_id, start, base + self.segment_size - start)
        except BackendError as exc:
            fetch.error = exc
            raise
        finally:
            if self._inflight.get(key) is fetch:
                del self._inflight[key]
            fetch.done.set()
        self._store(key, fetch.start, fetch.result)
        return fetch

    def _store(self, key: _Key, start: int, result: PullResult) -> None:
        messages = result.messages
        if not messages or result.next_offset != start + len(messages):
            return  # nothing read, or not one message per offset (a filter): not cacheable
        segment = self._segments.get(key)
        if segment is None or segment.end != start:
            if start != key[2]:
                return  # the cached head is gone: the segment is re-read from its start when needed
            if segment is not None:
                self._drop(key)
            segment = self._segments[key] = _Segment(start)
        added = _bytes(messages)
        segment.messages += messages
        segment.size += added
        segment.min_offset = result.min_offset
        segment.max_offset = result.max_offset
        self.bytes += added
        self._segments.move_to_end(key)
        while self._segments and (len(self._segments) > self.max_segments or self.bytes > self.max_bytes):
            self._drop(next(iter(self._segments)))
            self.evictions += 1

    def _drop(self, key: _Key) -> None:
        segment = self._segments.pop(key)
        self.bytes -= segment.size

    def _serve(self, key: _Key, segment: _Segment, offset: int, max_count: int) -> PullResult:
        """Messages from ``offset`` in ``segment``, continued through the following cached segments."""
        self._segments.move_to_end(key)
        at = offset - segment.start
        found = segment.messages[at : at + max_count]
        topic, queue_id, base = key
        last = segment
        while len(found) < max_count and len(last.messages) == self.segment_size:
            base += self.segment_size
            following = self._segments.get((topic, queue_id, base))
            if following is None:
                break
            self._segments.move_to_end((topic, queue_id, base))
            found += following.messages[: max_count - len(found)]
            last = following
        return PullResult(PullStatus.FOUND, found, offset + len(found), last.min_offset, last.max_offset)

    @staticmethod
    def _answer(result: PullResult, start: int, offset: int, max_count: int) -> PullResult | None:
        """The answer a segment read from ``start`` gives for ``offset`` (>= ``start``), or None if it does
        not cover it."""
        at = offset - start
        if at < len(result.messages) and result.next_offset == start + len(result.messages):
            found = result.messages[at : at + max_count]
            return PullResult(
                PullStatus.FOUND, found, offset + len(found), result.min_offset, result.max_offset
            )
        if at == 0:
            return result if len(result.messages) <= max_count else None
        return None
