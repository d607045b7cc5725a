"""Building the store's frozen result objects per message without the dataclass ``__init__``.

``StoredMessage`` and ``SendResult`` are frozen slotted dataclasses: their generated ``__init__`` sets every
field through ``object.__setattr__`` (a global look-up and a call per field) and takes keywords, about
twice the cost of setting the slots directly. The embedded store builds one ``StoredMessage`` per message
handed off or read back and one ``SendResult`` per message sent, so these two functions fill a new
instance through its slot descriptors instead.

Contract: the object returned equals (``==``, same type, same fields) the one the dataclass constructor
would build from the same arguments. The field lists are checked when this module is imported; if the
model's classes ever gain, lose or reorder a field, the functions fall back to the plain constructors
(``tests/backends/embedded/test_built.py`` then fails, so the fast path is fixed rather than lost).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mqproxy.model.types import SendResult, StoredMessage

__all__ = ["FAST", "send_result", "stored_message"]

_STORED_FIELDS = (
    "topic",
    "queue_id",
    "queue_offset",
    "commitlog_offset",
    "store_size",
    "body",
    "flag",
    "properties",
    "sys_flag",
    "born_timestamp_ms",
    "born_host",
    "store_timestamp_ms",
    "store_host",
    "reconsume_times",
    "body_crc",
)
_RESULT_FIELDS = (
    "topic",
    "queue_id",
    "queue_offset",
    "commitlog_offset",
    "store_timestamp_ms",
    "lmq_offsets",
)

#: Whether the slot-setting path is in use (the model's field lists are the ones this module knows).
FAST = (
    getattr(StoredMessage, "__slots__", None) == _STORED_FIELDS
    and getattr(SendResult, "__slots__", None) == _RESULT_FIELDS
)

_new = object.__new__


def _setters(cls: type, names: tuple[str, ...]) -> list[Any]:
    """The slot descriptors' ``__set__`` of ``names`` (Nones when the fast path is off)."""
    return [getattr(cls, name).__set__ for name in names] if FAST else [None] * len(names)


(
    _s_topic,
    _s_queue_id,
    _s_queue_offset,
    _s_clo,
    _s_size,
    _s_body,
    _s_flag,
    _s_properties,
    _s_sys_flag,
    _s_born_ms,
    _s_born_host,
    _s_store_ms,
    _s_store_host,
    _s_reconsume,
    _s_crc,
) = _setters(StoredMessage, _STORED_FIELDS)
(_r_topic, _r_queue_id, _r_queue_offset, _r_clo, _r_store_ms, _r_lmq) = _setters(SendResult, _RESULT_FIELDS)


def stored_message(
    topic: str,
    queue_id: int,
    queue_offset: int,
    commitlog_offset: int,
    store_size: int,
    body: bytes,
    flag: int,
    properties: Mapping[str, str],
    sys_flag: int,
    born_timestamp_ms: int,
    born_host: tuple[str, int],
    store_timestamp_ms: int,
    store_host: tuple[str, int],
    reconsume_times: int,
    body_crc: int,
) -> StoredMessage:
    """``StoredMessage(...)`` with the fields in declaration order, positionally."""
    if not FAST:
        return StoredMessage(
            topic,
            queue_id,
            queue_offset,
            commitlog_offset,
            store_size,
            body,
            flag,
            properties,
            sys_flag,
            born_timestamp_ms,
            born_host,
            store_timestamp_ms,
            store_host,
            reconsume_times,
            body_crc,
        )
    m = _new(StoredMessage)
    _s_topic(m, topic)
    _s_queue_id(m, queue_id)
    _s_queue_offset(m, queue_offset)
    _s_clo(m, commitlog_offset)
    _s_size(m, store_size)
    _s_body(m, body)
    _s_flag(m, flag)
    _s_properties(m, properties)
    _s_sys_flag(m, sys_flag)
    _s_born_ms(m, born_timestamp_ms)
    _s_born_host(m, born_host)
    _s_store_ms(m, store_timestamp_ms)
    _s_store_host(m, store_host)
    _s_reconsume(m, reconsume_times)
    _s_crc(m, body_crc)
    return m


def send_result(
    topic: str, queue_id: int, queue_offset: int, commitlog_offset: int, store_ms: int, lmq: Mapping[str, int]
) -> SendResult:
    """``SendResult(...)`` with the fields in declaration order, positionally."""
    if not FAST:
        return SendResult(topic, queue_id, queue_offset, commitlog_offset, store_ms, lmq)
    r = _new(SendResult)
    _r_topic(r, topic)
    _r_queue_id(r, queue_id)
    _r_queue_offset(r, queue_offset)
    _r_clo(r, commitlog_offset)
    _r_store_ms(r, store_ms)
    _r_lmq(r, lmq)
    return r
