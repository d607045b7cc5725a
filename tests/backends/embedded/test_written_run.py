"""Inside a write's notify, ``pull_now`` of an LMQ answers from the messages that write handed off (no
index entries read back), with the same answer a pull gives; anything it does not hold reads as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqproxy.backends.embedded.embedded import EmbeddedStore, open_embedded_store
from mqproxy.model.topics import LMQ_QUEUE_ID
from mqproxy.model.types import Message, PullResult

LMQ = "%LMQ%run"
OTHER = "%LMQ%other"


def _message(i: int, dispatch: tuple[str, ...] = (LMQ,)) -> Message:
    return Message("T", b"m%d" % i, queue_id=0, properties={"TAGS": "a"}, dispatch=dispatch)


class _Reader:
    """A watch callback that pulls the LMQ from ``offset`` as a push hub's hand-off does, counting the
    index reads its pull made."""

    def __init__(self, store: EmbeddedStore, offset: int, max_count: int = 32) -> None:
        self.store = store
        self.offset = offset
        self.max_count = max_count
        self.answers: list[PullResult] = []
        self.entry_reads = 0

    def watch(self, at: int | None = None) -> None:
        at = self.offset if at is None else at
        assert self.store.watch_queue(LMQ, LMQ_QUEUE_ID, at, self.called)

    def called(self) -> None:
        index = self.store._index
        entries = index.entries

        def counted(*args: int) -> list[tuple[int, int, int, int, int]]:
            self.entry_reads += 1
            return entries(*args)

        index.entries = counted  # type: ignore[method-assign]
        try:
            self.answers.append(self.store.pull_now(LMQ, LMQ_QUEUE_ID, self.offset, self.max_count))
        finally:
            del index.entries


async def test_a_pull_inside_the_notify_is_answered_from_the_write(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path / "store") as store:
        await store.create_topic("T", 1)
        await store.send(_message(0))  # before anyone waits: read from the log later
        reader = _Reader(store, 1, max_count=3)
        reader.watch()
        served = store._handoff.served
        await store.send_batch([_message(i, (LMQ, OTHER)) for i in range(1, 6)])
        [answer] = reader.answers
        assert reader.entry_reads == 0  # no index entries read back
        assert store._handoff.served == served + 3
        again = await store.pull(LMQ, LMQ_QUEUE_ID, 1, 3)  # outside the notify: through the index
        assert answer == again
        assert [m.body for m in answer.messages] == [b"m1", b"m2", b"m3"]
        assert (answer.next_offset, answer.min_offset, answer.max_offset) == (4, 0, 6)
        assert store._written == {}  # only while the write notifies


async def test_what_the_write_does_not_hold_is_read_from_the_index(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path / "store") as store:
        await store.create_topic("T", 1)
        await store.send(_message(0))
        early = _Reader(store, 0)  # wants offset 0, written before: not in the write's run
        early.watch(at=1)
        await store.send(_message(1))
        assert early.entry_reads == 1
        assert [m.body for m in early.answers[0].messages] == [b"m0", b"m1"]
        assert early.answers[0] == await store.pull(LMQ, LMQ_QUEUE_ID, 0, 32)


@pytest.mark.parametrize("max_bytes", [1, 10_000_000])
def test_within_stops_at_the_byte_limit_but_keeps_one(max_bytes: int) -> None:
    from mqproxy.backends.embedded.embedded_read import _within

    class Sized:
        store_size = 100

    messages = [Sized(), Sized(), Sized()]
    found = _within(messages, 1, 5, max_bytes)  # type: ignore[arg-type]
    assert len(found) == (1 if max_bytes == 1 else 2)
