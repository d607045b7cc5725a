"""The store's slot-filling constructors build exactly what the model's dataclass constructors build."""

from __future__ import annotations

import dataclasses

import pytest

from mqproxy.backends.embedded import built
from mqproxy.model.types import SendResult, StoredMessage

STORED_ARGS = (
    "bench", 3, 17, 123456, 120, b"body", 1, {"A": "1", "B": "2"}, 4, 1795865770125, ("10.0.0.1", 5),
    1795865770126, ("127.0.0.1", 10911), 2, 99,
)  # fmt: skip


def test_the_fast_path_is_in_use() -> None:
    # fails when the model's field lists change: update built.py's lists (the fallback is correct but slow)
    assert built.FAST
    assert tuple(f.name for f in dataclasses.fields(StoredMessage)) == StoredMessage.__slots__
    assert tuple(f.name for f in dataclasses.fields(SendResult)) == SendResult.__slots__


def test_stored_message_equals_the_dataclass_constructor() -> None:
    fast = built.stored_message(*STORED_ARGS)
    plain = StoredMessage(*STORED_ARGS)
    assert type(fast) is StoredMessage
    assert fast == plain
    assert dataclasses.astuple(fast) == dataclasses.astuple(plain)
    assert fast.tags is None


def test_send_result_equals_the_dataclass_constructor() -> None:
    fast = built.send_result("T", 1, 2, 3, 4, {"%LMQ%a": 5})
    assert type(fast) is SendResult
    assert fast == SendResult("T", 1, 2, 3, 4, {"%LMQ%a": 5})
    assert built.send_result("T", 1, 2, 3, 4, {}) == SendResult("T", 1, 2, 3, 4)


def test_built_objects_stay_frozen() -> None:
    fast = built.stored_message(*STORED_ARGS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.topic = "other"  # type: ignore[misc]
    assert fast.topic == "bench"
