"""EmbeddedStore write coalescing: concurrent sends from many tasks share one pwrite and one index
transaction, get dense offsets (LMQs included), fail alone when only their records are bad, all fail and
leave nothing behind when the write fails, and still return only once durable under sync flush."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from mqproxy.backends.embedded import embedded_write
from mqproxy.backends.embedded.embedded import EmbeddedStore, open_embedded_store
from mqproxy.model.errors import StoreUnavailable
from mqproxy.model.topics import LMQ_QUEUE_ID
from mqproxy.model.types import Message, SendResult

LMQ = "%LMQ%shared"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    async with open_embedded_store(tmp_path / "data", default_queue_count=1) as opened:
        yield opened


def _count_calls(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    calls: list[int] = []
    real = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


async def _send_all(
    store: EmbeddedStore, messages: list[Message], expected: type[Exception] = StoreUnavailable
) -> list[SendResult | BaseException]:
    """Send each message from its own task (all in one scheduler turn); outcomes in list order, an
    ``expected`` error standing for its send's result."""
    outcomes: list[SendResult | BaseException] = [StoreUnavailable("not run")] * len(messages)

    async def one(i: int) -> None:
        try:
            outcomes[i] = await store.send(messages[i])
        except expected as exc:
            outcomes[i] = exc

    async with trio.open_nursery() as nursery:
        for i in range(len(messages)):
            nursery.start_soon(one, i)
    return outcomes


async def test_concurrent_sends_share_one_append(
    store: EmbeddedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.send(Message("warm", b"x"))  # the first write of a store decides nothing here
    appends = _count_calls(monkeypatch, store._log, "append")
    commits = _count_calls(monkeypatch, store._index, "commit")
    topics = ["a", "b", "a", "c", "a", "b", "a", "c", "a", "b"]
    messages = [Message(t, f"{t}{i}".encode(), dispatch=(LMQ,)) for i, t in enumerate(topics)]
    outcomes = await _send_all(store, messages)
    assert (len(appends), len(commits)) == (1, 1)
    results = [o for o in outcomes if isinstance(o, SendResult)]
    assert len(results) == 10
    # Dense queue offsets per topic and in the shared LMQ, one store time for the whole write.
    for topic in ("a", "b", "c"):
        offsets = sorted(r.queue_offset for r in results if r.topic == topic)
        assert offsets == list(range(topics.count(topic)))
    assert sorted(r.lmq_offsets[LMQ] for r in results) == list(range(10))
    assert len({r.store_timestamp_ms for r in results}) == 1
    assert len({r.commitlog_offset for r in results}) == 10
    # Each LMQ entry points at the record of the send that got that offset.
    pulled = await store.pull(LMQ, LMQ_QUEUE_ID, 0, 32)
    by_lmq_offset = {r.lmq_offsets[LMQ]: r for r in results}
    assert [m.commitlog_offset for m in pulled.messages] == [
        by_lmq_offset[i].commitlog_offset for i in range(10)
    ]
    for i, message in enumerate(pulled.messages):
        sent = messages[outcomes.index(by_lmq_offset[i])]
        assert (message.topic, message.body) == (sent.topic, sent.body)


async def test_a_send_that_cannot_be_encoded_fails_alone(
    store: EmbeddedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = embedded_write.encode_message

    def encode(**fields: Any) -> bytes:
        if fields["body"] == b"poison":
            raise ValueError("cannot encode")
        return real(**fields)

    monkeypatch.setattr(embedded_write, "encode_message", encode)
    messages = [Message("t", b"poison" if i == 2 else b"ok%d" % i, dispatch=(LMQ,)) for i in range(6)]
    outcomes = await _send_all(store, messages, ValueError)
    assert isinstance(outcomes[2], ValueError)
    good = [o for o in outcomes if isinstance(o, SendResult)]
    assert len(good) == 5
    # The refused send left no hole in the topic queue or the LMQ it shared with the others.
    assert sorted(r.queue_offset for r in good) == list(range(5))
    assert sorted(r.lmq_offsets[LMQ] for r in good) == list(range(5))
    assert await store.max_offset(LMQ, LMQ_QUEUE_ID) == 5
    pulled = await store.pull(LMQ, LMQ_QUEUE_ID, 0, 32)
    assert b"poison" not in [m.body for m in pulled.messages]


async def test_a_failed_write_fails_every_send_and_leaves_nothing(
    store: EmbeddedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.send(Message("t", b"before", dispatch=(LMQ,)))
    end = store._log.end
    real_commit = store._index.commit

    def broken_commit(*args: Any, **kwargs: Any) -> None:
        raise StoreUnavailable("index write failed: injected")

    monkeypatch.setattr(store._index, "commit", broken_commit)
    outcomes = await _send_all(
        store, [Message("t", b"lost%d" % i, dispatch=(LMQ, "%LMQ%new")) for i in range(4)]
    )
    assert all(isinstance(o, StoreUnavailable) for o in outcomes)
    assert store._log.end == end  # the records were cut off again
    monkeypatch.setattr(store._index, "commit", real_commit)
    assert await store.max_offset("t", 0) == 1
    assert await store.max_offset(LMQ, LMQ_QUEUE_ID) == 1
    assert await store.max_offset("%LMQ%new", LMQ_QUEUE_ID) == 0
    after = await store.send(Message("t", b"after", dispatch=(LMQ, "%LMQ%new")))
    assert (after.queue_offset, after.lmq_offsets) == (1, {LMQ: 1, "%LMQ%new": 0})


async def test_waiters_wake_once_per_write(store: EmbeddedStore) -> None:
    woken: list[bool] = []

    async def waiter() -> None:
        woken.append(await store.wait_for_message(LMQ, LMQ_QUEUE_ID, 0, 5.0))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        await _send_all(store, [Message("t", b"%d" % i, dispatch=(LMQ,)) for i in range(3)])
    assert woken == [True]
    assert store._waiters._events == {}


async def test_sync_flush_concurrent_sends_return_durable(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path / "sync", flush="sync") as store:
        outcomes = await _send_all(store, [Message("t", b"%d" % i) for i in range(8)])
        for outcome in outcomes:
            assert isinstance(outcome, SendResult)
            assert store._durable > outcome.commitlog_offset  # acknowledged only once fdatasync'ed
        assert store._writes.writes < 8  # the sends shared appends
        assert store.fsync_count <= store._writes.writes
