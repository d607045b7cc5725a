"""Messages written while a reader waits are handed to its pull without a read back, and are exactly what
a decode of their records gives."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.backends.embedded.handoff import Handoff
from mqproxy.model.types import Message, StoredMessage


def stored(clo: int, size: int) -> StoredMessage:
    return StoredMessage(
        topic="T", queue_id=0, queue_offset=clo, commitlog_offset=clo, store_size=size, body=b"x", flag=0,
        properties={}, sys_flag=0, born_timestamp_ms=0, born_host=("127.0.0.1", 1), store_timestamp_ms=0,
        store_host=("127.0.0.1", 2), reconsume_times=0, body_crc=0,
    )  # fmt: skip


def test_handoff_keeps_the_latest_within_its_bounds() -> None:
    handoff = Handoff(max_messages=3, max_bytes=100)
    for clo in range(5):
        handoff.put(stored(clo, 10))
    assert [handoff.get(clo) is not None for clo in range(5)] == [False, False, True, True, True]
    handoff.put(stored(5, 95))  # bytes: only room for it and nothing older
    assert len(handoff) == 1
    assert handoff.get(5) is not None
    handoff.put(stored(6, 101))  # larger than the whole budget: not kept
    assert handoff.get(6) is None
    assert handoff.served == 3 + 1


def test_handoff_evicts_oldest_first_over_many_puts_and_a_put_again_replaces() -> None:
    handoff = Handoff(max_messages=64, max_bytes=10_000)
    for clo in range(10_000):
        handoff.put(stored(clo, 10))
    assert len(handoff) == 64
    assert [clo for clo in range(10_000) if handoff.get(clo) is not None] == list(range(9_936, 10_000))
    handoff.put(stored(9_999, 40))  # the same offset again: replaced, its bytes counted once
    handoff.put(stored(10_000, 10))
    assert len(handoff) == 64
    assert handoff.get(9_936) is None
    assert handoff._bytes == 62 * 10 + 40 + 10


def test_put_many_keeps_what_one_put_each_keeps() -> None:
    sizes = [10, 95, 3, 40, 40, 101, 7, 7, 60, 1, 1, 1, 1, 30]
    for cut in range(0, len(sizes) + 1, 3):
        one, many = Handoff(max_messages=4, max_bytes=100), Handoff(max_messages=4, max_bytes=100)
        batch = [stored(clo % 9, size) for clo, size in enumerate(sizes)]  # offsets repeat: replaced
        for message in batch:
            one.put(message)
        many.put_many(batch[:cut])
        many.put_many(batch[cut:])
        assert list(many._messages.items()) == list(one._messages.items())
        assert many._bytes == one._bytes


async def test_a_message_written_for_a_waiting_reader_is_handed_off_equal_to_its_record(
    tmp_path: Path,
) -> None:
    async with open_embedded_store(tmp_path / "store") as store:
        await store.create_topic("T", 1)
        await store.send(Message("T", b"nobody waits", queue_id=0, properties={"KEYS": "k0"}))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.wait_for_message, "%LMQ%w", 0, 0, 30.0)
            await trio.testing.wait_all_tasks_blocked()
            await store.send(
                Message(
                    "T", b"awaited", queue_id=0, properties={"KEYS": "k1", "TAGS": "a"}, dispatch=("%LMQ%w",)
                )
            )
        assert len(store._handoff) == 1  # only the message someone waited for
        handed = (await store.pull("%LMQ%w", 0, 0, 32)).messages
        assert store._handoff.served == 1
        both = (await store.pull("T", 0, 0, 32)).messages  # the second one handed off again
        assert store._handoff.served == 2
        decoded = await store.get_message(handed[0].commitlog_offset)  # read back from the log
    assert list(handed) == [decoded]
    assert both[1] == decoded
    assert [m.body for m in both] == [b"nobody waits", b"awaited"]


async def test_a_queue_whose_reader_was_just_woken_still_gets_the_hand_off(tmp_path: Path) -> None:
    """A reader busy with the batch that woke it (a push hub delivering) is not parked when the next
    write lands; its queue still counts as awaited for a second."""
    async with open_embedded_store(tmp_path / "store") as store:
        await store.create_topic("T", 1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.wait_for_message, "T", 0, 0, 30.0)
            await trio.testing.wait_all_tasks_blocked()
            await store.send(Message("T", b"wakes", queue_id=0))
        await store.send(Message("T", b"while busy", queue_id=0))  # nobody parked now
        assert len(store._handoff) == 2
        await store.create_topic("U", 1)
        await store.send(Message("U", b"never awaited", queue_id=0))
        assert len(store._handoff) == 2
