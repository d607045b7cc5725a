"""Checks and derived fields every backend applies to a message before storing it."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from itertools import chain

from mqproxy.model.errors import BackendError, IllegalTopic, MessageTooLarge
from mqproxy.model.properties import MAX_PROPERTIES_BYTES, properties_size
from mqproxy.model.topics import RETRY_PREFIX, SYSTEM_TOPIC_PREFIX, validate_lmq, validate_send_topic
from mqproxy.model.types import (
    PROPERTY_INNER_MULTI_DISPATCH,
    PROPERTY_INNER_MULTI_QUEUE_OFFSET,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_KEY,
    Message,
)

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024


#: Dispatch lists already validated -> their targets (deduplicated); bounded, cleared when full. Fan-in
#: sends the same few lists again and again (one per subscribed topic), so one look-up replaces the
#: deduplication and a check per name.
_TARGETS: dict[tuple[str, ...], tuple[str, ...]] = {}
_MAX_TARGETS = 4096


def check_messages(messages: Sequence[Message], max_message_bytes: int) -> list[tuple[str, ...]]:
    """:func:`check_message` of each of a batch (:func:`check_batch`: one topic), the same errors: the
    topic is validated once, a born host once per run of equal ones."""
    out: list[tuple[str, ...]] = []
    host: object = None
    for message in messages:
        out.append(check_message(message, max_message_bytes, bool(out), message.born_host == host))
        host = message.born_host
    return out


def check_message(
    message: Message, max_message_bytes: int, topic_valid: bool = False, host_valid: bool = False
) -> tuple[str, ...]:
    """Validate ``message`` for storing; return its LMQ dispatch targets (deduplicated, in order).
    ``topic_valid``/``host_valid``: its topic/born host was validated already (skip those checks)."""
    if not topic_valid:
        validate_send_topic(message.topic)
    if not isinstance(message.body, bytes | bytearray | memoryview):
        raise BackendError("message body must be bytes")
    if not host_valid:
        host, port = message.born_host
        if not isinstance(host, str) or len(host.encode(errors="replace")) > 255 or not 0 <= port <= 65535:
            raise BackendError(f"born_host {message.born_host!r} is not a host (<= 255 bytes) and port")
    if len(message.body) > max_message_bytes:
        raise MessageTooLarge(f"body is {len(message.body)} bytes, limit {max_message_bytes}")
    properties = message.properties
    joined = "".join(chain.from_iterable(properties.items()))
    if joined.isascii():  # (O(1)) then characters are bytes: skip the encode properties_size does
        size = len(joined) + 2 * len(properties)
    else:
        try:
            size = properties_size(properties)
        except UnicodeEncodeError as exc:
            raise BackendError(f"property is not encodable as UTF-8: {exc.reason}") from None
    if size > MAX_PROPERTIES_BYTES:
        raise MessageTooLarge(f"properties are {size} bytes, limit {MAX_PROPERTIES_BYTES}")
    dispatch = message.dispatch
    if not dispatch:
        return ()
    if message.topic.startswith(RETRY_PREFIX) or message.topic.startswith(SYSTEM_TOPIC_PREFIX):
        raise IllegalTopic(f"multi-dispatch is not allowed from {message.topic}")
    targets = _TARGETS.get(dispatch) if type(dispatch) is tuple else None
    if targets is None:
        targets = tuple(dict.fromkeys(dispatch))
        for name in targets:
            validate_lmq(name)
        if type(dispatch) is tuple:  # only legal lists are remembered (a refusal raised above)
            if len(_TARGETS) >= _MAX_TARGETS:
                _TARGETS.clear()
            _TARGETS[dispatch] = targets
    return targets


def check_batch(messages: Sequence[Message]) -> None:
    """A batch is non-empty and targets one topic and one queue id."""
    if not messages:
        raise BackendError("empty batch")
    first = messages[0]
    for m in messages[1:]:
        if m.topic != first.topic:
            raise BackendError("a batch must target one topic")
        if m.queue_id != first.queue_id:
            raise BackendError("a batch must target one queue")


def stored_properties(
    properties: dict[str, str], targets: tuple[str, ...], offsets: list[int]
) -> dict[str, str]:
    """The properties to store: LMQ targets and their assigned offsets added (spec §9.3)."""
    if not targets:
        return dict(properties)
    out = stored_base(properties)
    out[PROPERTY_INNER_MULTI_DISPATCH] = ",".join(targets)
    out[PROPERTY_INNER_MULTI_QUEUE_OFFSET] = ",".join(map(str, offsets))
    return out


def stored_base(properties: Mapping[str, str]) -> dict[str, str]:
    """The properties of a multi-dispatched message before its LMQ properties are added: ``WAIT`` left out."""
    out = dict(properties)  # a copy and a pop: cheaper than a filtering comprehension, same order
    out.pop("WAIT", None)
    return out


#: A key longer than this (UTF-8 bytes) is not indexed (the index key must stay below LMDB's 511 bytes).
MAX_INDEXED_KEY_BYTES = 255


def index_keys(properties: Mapping[str, str]) -> tuple[str, ...]:
    """What a message can be found by (QUERY_MESSAGE): each space-separated ``KEYS`` entry and its
    ``UNIQ_KEY``, deduplicated; empty and over-long keys are left out (the broker's IndexService)."""
    if PROPERTY_KEYS not in properties and PROPERTY_UNIQ_KEY not in properties:
        return ()
    keys = properties.get(PROPERTY_KEYS, "").split(" ")
    keys.append(properties.get(PROPERTY_UNIQ_KEY, ""))
    return tuple(
        k for k in dict.fromkeys(keys) if k and "\x00" not in k and len(k.encode()) <= MAX_INDEXED_KEY_BYTES
    )


class StoreClock:
    """Store timestamps in ms, never decreasing (so per-queue store times are sorted)."""

    def __init__(self, floor_ms: int = 0) -> None:
        self._last = floor_ms

    def advance_to(self, floor_ms: int) -> None:
        self._last = max(self._last, floor_ms)

    def now_ms(self) -> int:
        now = time.time_ns() // 1_000_000
        if now < self._last:
            now = self._last
        self._last = now
        return now
