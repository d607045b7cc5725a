"""InMemoryBackend specifics and the shared topic rules it relies on."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.backends.embedded.waiters import QueueWaiters
from mqproxy.model.errors import BackendError, IllegalTopic
from mqproxy.model.topics import (
    default_queue_count,
    is_send_forbidden,
    validate_lmq,
    validate_send_topic,
    validate_topic,
)
from mqproxy.model.types import Message


@pytest.mark.parametrize(
    "name", ["T", "TopicTest", "a|b", "%RETRY%group-1", "%DLQ%g_2", "%LMQ%x", "TBW102", "x" * 127]
)
def test_legal_names(name: str) -> None:
    validate_topic(name)
    validate_send_topic(name)


def test_length_limits() -> None:
    validate_topic("%DLQ%" + "g" * 250)
    with pytest.raises(IllegalTopic):
        validate_topic("%DLQ%" + "g" * 251)
    with pytest.raises(IllegalTopic):
        validate_send_topic("%DLQ%" + "g" * 123)


@given(st.text(max_size=300))
def test_validate_topic_only_raises_illegal_topic(name: str) -> None:
    try:
        validate_topic(name)
    except IllegalTopic:
        return
    assert name
    assert len(name.encode()) <= 255
    assert set(name) <= set("%|-_0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def test_lmq_names() -> None:
    validate_lmq("%LMQ%room-1")
    for bad in ("%LMQ%", "room", "%LMQ%a,b", "%lmq%a"):
        with pytest.raises(IllegalTopic):
            validate_lmq(bad)


def test_defaults_and_forbidden() -> None:
    assert default_queue_count("%RETRY%g", 8) == 1
    assert default_queue_count("%DLQ%g", 8) == 1
    assert default_queue_count("Orders", 8) == 8
    assert is_send_forbidden("SCHEDULE_TOPIC_XXXX")
    assert is_send_forbidden("RMQ_SYS_TRANS_HALF_TOPIC")
    assert not is_send_forbidden("TBW102")


def test_bad_default_queue_count() -> None:
    with pytest.raises(ValueError, match="default_queue_count"):
        InMemoryBackend(default_queue_count=0)


async def test_reserved_topics_are_storable() -> None:
    """Handlers park half/delayed messages in system topics; the backend must accept them."""
    backend = InMemoryBackend()
    result = await backend.send(Message("RMQ_SYS_TRANS_HALF_TOPIC", b"half", queue_id=0))
    assert result.queue_offset == 0


async def test_mixed_batch_rejected() -> None:
    backend = InMemoryBackend()
    with pytest.raises(BackendError, match="one topic"):
        await backend.send_batch([Message("A", b"1"), Message("B", b"2")])
    with pytest.raises(BackendError, match="one queue"):
        await backend.send_batch([Message("A", b"1", queue_id=0), Message("A", b"2", queue_id=1)])
    with pytest.raises(BackendError, match="empty"):
        await backend.send_batch([])
    assert await backend.get_topic("A") is None


async def test_duplicate_dispatch_targets_collapse() -> None:
    backend = InMemoryBackend()
    result = await backend.send(Message("P", b"x", dispatch=("%LMQ%a", "%LMQ%a")))
    assert result.lmq_offsets == {"%LMQ%a": 0}
    assert await backend.max_offset("%LMQ%a", 0) == 1


async def test_waiters_leave_nothing_behind(autojump_clock: trio.testing.MockClock) -> None:
    waiters = QueueWaiters()
    assert await waiters.wait("k", lambda: False, 5) is False
    with trio.move_on_after(1):
        await waiters.wait("k2", lambda: False, 30)
    assert waiters._events == {}
    async with trio.open_nursery() as nursery:
        results: list[bool] = []
        state = {"ready": False}

        async def one() -> None:
            results.append(await waiters.wait("k", lambda: state["ready"], 30))

        nursery.start_soon(one)
        nursery.start_soon(one)
        await trio.sleep(1)
        state["ready"] = True
        waiters.notify("k")
    assert results == [True, True]
    assert waiters._events == {}
