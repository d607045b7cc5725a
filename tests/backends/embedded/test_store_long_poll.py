"""The MessageStore contract, run against every store kind: long polling, consumer membership and light
message queues (LMQ multi-dispatch)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from mqproxy.model.errors import IllegalTopic
from mqproxy.model.types import (
    PROPERTY_INNER_MULTI_DISPATCH,
    PROPERTY_INNER_MULTI_QUEUE_OFFSET,
    ConsumerInfo,
    Subscription,
)

from .conftest import MakeStore, long_poll_result, msg  # type: ignore[import-not-found]


async def test_long_poll_wakes_on_send(make_store: MakeStore) -> None:
    async with make_store() as backend:
        await backend.create_topic("T", 1)
        assert await long_poll_result(backend, "T", 0, lambda: backend.send(msg(queue_id=0))) == [True]
        assert await backend.wait_for_message("T", 0, 0, 0) is True
        assert await backend.wait_for_message("T", 0, 1, 0) is False


async def test_long_poll_ignores_other_queues_then_times_out(
    make_store: MakeStore, autojump_clock: trio.testing.MockClock
) -> None:
    async with make_store() as backend:
        await backend.create_topic("T", 2)
        async with trio.open_nursery() as nursery:
            result: list[tuple[bool, float]] = []

            async def waiter() -> None:
                start = trio.current_time()
                woke = await backend.wait_for_message("T", 0, 0, 15)
                result.append((woke, trio.current_time() - start))

            nursery.start_soon(waiter)
            await trio.sleep(1)
            await backend.send(msg(queue_id=1))
        ((woke, waited),) = result
        assert woke is False
        assert waited == pytest.approx(15, abs=0.01)


async def test_concurrent_producers_and_long_polling_consumers(make_store: MakeStore) -> None:
    """No lost wake-ups: consumers that long-poll each queue see every message, in offset order."""
    async with make_store() as backend:
        await backend.create_topic("T", 2)
        received: dict[int, list[bytes]] = {0: [], 1: []}

        async def producer(p: int) -> None:
            for i in range(25):
                await backend.send(msg(queue_id=(p + i) % 2, body=f"{p}:{i}".encode()))
                if i % 5 == 0:
                    await trio.testing.wait_all_tasks_blocked()  # the consumers caught up and long-poll

        async def consumer(queue_id: int) -> None:
            offset = 0
            while len(received[queue_id]) < 100:
                if not await backend.wait_for_message("T", queue_id, offset, 5):
                    continue
                result = await backend.pull("T", queue_id, offset, 7)
                assert [m.queue_offset for m in result.messages] == list(range(offset, result.next_offset))
                received[queue_id] += [m.body for m in result.messages]
                offset = result.next_offset

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for queue_id in (0, 1):
                    nursery.start_soon(consumer, queue_id)
                for p in range(8):
                    nursery.start_soon(producer, p)
        everything = sorted(received[0] + received[1])
        assert everything == sorted(f"{p}:{i}".encode() for p in range(8) for i in range(25))
        for p in range(8):  # each producer's messages keep their order within a queue
            for queue_id in (0, 1):
                mine = [b for b in received[queue_id] if b.startswith(f"{p}:".encode())]
                assert mine == sorted(mine, key=lambda b: int(b.split(b":")[1]))


async def test_long_poll_is_cancellable(
    make_store: MakeStore, autojump_clock: trio.testing.MockClock
) -> None:
    async with make_store() as backend:
        await backend.create_topic("T", 1)
        with trio.move_on_after(0.02) as scope:
            await backend.wait_for_message("T", 0, 0, 30)
        assert scope.cancelled_caught


async def test_consumer_membership(make_store: MakeStore) -> None:
    async with make_store() as backend:
        info = ConsumerInfo("c2@host", "G", (Subscription("T", "A||B"),))
        assert await backend.register_consumer(info) is True
        assert await backend.register_consumer(info) is False
        assert await backend.register_consumer(ConsumerInfo("c1@host", "G")) is True
        assert await backend.consumer_ids("G") == ["c1@host", "c2@host"]
        assert await backend.consumer_info("G", "c2@host") == info
        assert await backend.unregister_consumer("G", "c2@host") is True
        assert await backend.unregister_consumer("G", "c2@host") is False
        assert await backend.consumer_ids("G") == ["c1@host"]
        assert await backend.consumer_ids("Other") == []
        assert await backend.consumer_info("G", "c2@host") is None


async def test_lmq_multi_dispatch(make_store: MakeStore) -> None:
    async with make_store() as backend:
        first = await backend.send(msg("Parent", body=b"one", queue_id=1, dispatch=("%LMQ%a", "%LMQ%b")))
        assert first.lmq_offsets == {"%LMQ%a": 0, "%LMQ%b": 0}
        second = await backend.send(msg("Parent", body=b"two", dispatch=("%LMQ%b",)))
        assert second.lmq_offsets == {"%LMQ%b": 1}
        assert await backend.max_offset("%LMQ%a", 0) == 1
        assert await backend.max_offset("%LMQ%b", 0) == 2
        assert await backend.max_offset("%LMQ%never", 0) == 0
        got = await backend.pull("%LMQ%b", 0, 0, 32)
        assert [m.body for m in got.messages] == [b"one", b"two"]
        record = got.messages[0]
        assert (record.topic, record.queue_id, record.queue_offset) == ("Parent", 1, 0)
        assert record.commitlog_offset == first.commitlog_offset
        assert record.properties[PROPERTY_INNER_MULTI_DISPATCH] == "%LMQ%a,%LMQ%b"
        assert record.properties[PROPERTY_INNER_MULTI_QUEUE_OFFSET] == "0,0"
        assert got.messages[1].properties[PROPERTY_INNER_MULTI_QUEUE_OFFSET] == "1"
        assert (await backend.pull("Parent", 1, 0, 32)).messages[0].body == b"one"


async def test_lmq_wakes_long_poll(make_store: MakeStore) -> None:
    async with make_store() as backend:

        async def send() -> None:
            await backend.send(msg("Parent", dispatch=("%LMQ%w",)))

        assert await long_poll_result(backend, "%LMQ%w", 0, send) == [True]


@pytest.mark.parametrize(
    ("topic", "dispatch"),
    [("Parent", ("notlmq",)), ("Parent", ("%LMQ%",)), ("Parent", ("%LMQ%a/b",)), ("%RETRY%g", ("%LMQ%a",))],
)
async def test_lmq_dispatch_rejected(make_store: MakeStore, topic: str, dispatch: tuple[str, ...]) -> None:
    async with make_store() as backend:
        with pytest.raises(IllegalTopic):
            await backend.send(msg(topic, dispatch=dispatch))
        assert await backend.get_topic(topic) is None, "nothing is created for a refused message"


async def test_a_queue_read_before_its_first_write_then_written_reads_right(make_store: MakeStore) -> None:
    """Reads of a queue never written (its absence is cached by the embedded store) then a send that
    creates it: bounds, pulls and long polls see the new queue."""
    async with make_store() as backend:
        assert await backend.max_offset("%LMQ%late", 0) == 0
        assert await backend.wait_for_message("%LMQ%late", 0, 0, 0) is False
        assert await long_poll_result(
            backend, "%LMQ%late", 0, lambda: backend.send(msg("Parent", body=b"x", dispatch=("%LMQ%late",)))
        ) == [True]
        assert await backend.max_offset("%LMQ%late", 0) == 1
        got = await backend.pull("%LMQ%late", 0, 0, 32)
        assert [m.body for m in got.messages] == [b"x"]
