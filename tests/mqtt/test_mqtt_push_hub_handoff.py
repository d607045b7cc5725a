"""The push hubs' hand-off: a write's notify delivers what it stored to the parked readers at once, from
inside the store's call (no hub task, no wake-up), where the store can be read as a plain call; else, and
for durable cursors, the hub's task does it as before."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

import structlog

from mqproxy.backends.embedded.broker import open_embedded_broker
from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.model.types import Message, StoredMessage
from mqproxy.mqtt.cursor import Cursor
from mqproxy.mqtt.push_hub import PushHubs
from mqproxy.mqtt.read_cache import ReadCache
from mqproxy.mqtt.store import FacadeStore

from ..conftest import wait_until  # type: ignore[import-not-found]

TOPIC = "hub-handoff"


class Sink:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.contexts: list[dict[str, object]] = []

    def deliver_now(
        self, topic_filter: str, cursor: Cursor, messages: Sequence[StoredMessage], offset: int
    ) -> int:
        self.bodies += [m.body for m in messages]
        self.contexts.append(structlog.contextvars.get_contextvars())
        cursor.complete_all(range(offset, offset + len(messages)))  # sent at QoS 0
        cursor.next_offset = offset + len(messages)
        return len(messages)


@contextlib.asynccontextmanager
async def _store() -> AsyncIterator[tuple[InMemoryBackend, FacadeStore]]:
    """The gateway's store: a facade over the embedded broker (which can watch and read as a plain call)."""
    backend = InMemoryBackend()
    await backend.create_topic(TOPIC, 1)
    async with open_embedded_broker(backend) as broker:
        yield backend, FacadeStore(broker)


async def test_a_write_is_delivered_inside_its_notify_without_a_task() -> None:
    async with _store() as (backend, store):
        cache = ReadCache(store)
        await _delivered_inside(backend, PushHubs(store, cache, 4, 30.0), cache)


async def _delivered_inside(backend: InMemoryBackend, hubs: PushHubs, cache: ReadCache) -> None:
    sink = Sink()
    cursor = Cursor(TOPIC, 0, queue_id=0)
    parking = hubs.park_idle("t", cursor, sink.deliver_now, lambda: None)
    assert parking is not None
    structlog.contextvars.bind_contextvars(conn_id="publisher")
    try:
        await backend.send_batch([Message(topic=TOPIC, body=b"m%d" % i, queue_id=0) for i in range(10)])
        # delivered before the send returned to us: no task ran in between
        assert sink.bodies == [b"m%d" % i for i in range(10)]
        assert hubs._running == 0
        assert (hubs.pushed, hubs.woken, hubs.rounds) == (10, 0, 3)  # batches of 4: 4 + 4 + 2
        assert cursor.next_offset == 10
        assert all("conn_id" not in c for c in sink.contexts)  # not the writer's context
        assert cache.misses >= 1  # read through the read cache: later readers of the segment hit it
        await backend.send(Message(topic=TOPIC, body=b"again", queue_id=0))  # the hub watches again
        assert sink.bodies[-1] == b"again"
    finally:
        structlog.contextvars.clear_contextvars()
    parking.cancel()
    assert len(hubs) == 0


async def test_a_durable_cursor_is_left_to_the_hubs_task() -> None:
    async with _store() as (backend, store):
        await _left_to_the_task(backend, PushHubs(store, ReadCache(store), 32, 30.0))


async def _left_to_the_task(backend: InMemoryBackend, hubs: PushHubs) -> None:
    sink = Sink()
    cursor = Cursor(TOPIC, 0, queue_id=0)
    cursor.durable = True
    cursor.group = "g"
    parking = hubs.park_idle("t", cursor, sink.deliver_now, lambda: None)
    assert parking is not None
    await backend.send(Message(topic=TOPIC, body=b"d", queue_id=0))
    assert sink.bodies == []  # not inside the notify: its offset commit awaits the store
    await wait_until(lambda: sink.bodies == [b"d"])
    await wait_until(lambda: cursor.stored == 1)  # committed by the task, as the reader would
    parking.cancel()
    await wait_until(lambda: len(hubs) == 0)


class _NoPlainReads(ReadCache):
    def pull_now(self, topic: str, queue_id: int, offset: int, max_count: int) -> None:
        return None


async def test_a_store_without_plain_reads_keeps_the_hubs_task() -> None:
    async with _store() as (backend, store):
        await _with_task(backend, PushHubs(store, _NoPlainReads(store), 32, 30.0))


async def _with_task(backend: InMemoryBackend, hubs: PushHubs) -> None:
    sink = Sink()
    parking = hubs.park_idle("t", Cursor(TOPIC, 0, queue_id=0), sink.deliver_now, lambda: None)
    assert parking is not None
    await backend.send(Message(topic=TOPIC, body=b"x", queue_id=0))
    assert sink.bodies == []
    await wait_until(lambda: sink.bodies == [b"x"])
    parking.cancel()
    await wait_until(lambda: len(hubs) == 0)
