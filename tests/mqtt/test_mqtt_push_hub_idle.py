"""Readers parked in a push hub without a task (:meth:`PushHubs.park_idle`): the hub delivers for them,
wakes each once through its callback when it declines, and a cancelled entry is never woken."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.model.types import Message, StoredMessage
from mqproxy.mqtt.cursor import Cursor
from mqproxy.mqtt.push_hub import Parking, PushHubs
from mqproxy.mqtt.read_cache import ReadCache

from ..conftest import wait_until  # type: ignore[import-not-found]

TOPIC = "hub-idle"


class Sink:
    """A ``deliver_now`` that takes up to ``take`` messages per batch, moving the cursor past them."""

    def __init__(self, take: int) -> None:
        self.take = take
        self.bodies: list[bytes] = []
        self.wakes = 0

    def deliver_now(
        self, topic_filter: str, cursor: Cursor, messages: Sequence[StoredMessage], offset: int
    ) -> int:
        handled = min(self.take, len(messages))
        self.bodies += [m.body for m in messages[:handled]]
        cursor.next_offset = offset + handled
        return handled

    def wake(self) -> None:
        self.wakes += 1


async def _hubs() -> tuple[InMemoryBackend, PushHubs]:
    backend = InMemoryBackend()
    await backend.create_topic(TOPIC, 1)
    return backend, PushHubs(backend, ReadCache(backend), 32, 30.0)  # type: ignore[arg-type]


async def _send(backend: InMemoryBackend, body: bytes) -> None:
    await backend.send(Message(topic=TOPIC, body=body, queue_id=0))


async def test_an_idle_entry_gets_what_the_hub_delivers_and_is_not_woken() -> None:
    backend, hubs = await _hubs()
    sink = Sink(take=10)
    parking = hubs.park_idle("t", Cursor(TOPIC, 0, queue_id=0), sink.deliver_now, sink.wake)
    assert isinstance(parking, Parking)
    assert len(hubs) == 1
    await _send(backend, b"a")
    await _send(backend, b"b")
    await wait_until(lambda: sink.bodies == [b"a", b"b"])
    assert sink.wakes == 0
    assert hubs.pushed == 2
    parking.cancel()  # the last entry: the hub ends
    await wait_until(lambda: len(hubs) == 0)


async def test_a_declined_message_wakes_the_entry_once_and_leaves_it_to_its_reader() -> None:
    backend, hubs = await _hubs()
    sink = Sink(take=0)
    cursor = Cursor(TOPIC, 0, queue_id=0)
    parking = hubs.park_idle("t", cursor, sink.deliver_now, sink.wake)
    assert parking is not None
    await _send(backend, b"q1")
    await wait_until(lambda: sink.wakes == 1)
    assert cursor.next_offset == 0, "the reader pulls what the hub declined"
    assert hubs.woken == 1
    parking.cancel()  # after the wake-up: nothing happens
    await _send(backend, b"more")
    await wait_until(lambda: len(hubs) == 0)
    assert sink.wakes == 1


async def test_a_cancelled_entry_is_never_woken_and_others_still_are() -> None:
    backend, hubs = await _hubs()
    gone, kept = Sink(take=0), Sink(take=0)
    first = hubs.park_idle("t", Cursor(TOPIC, 0, queue_id=0), gone.deliver_now, gone.wake)
    second = hubs.park_idle("t", Cursor(TOPIC, 0, queue_id=0), kept.deliver_now, kept.wake)
    assert first is not None
    assert second is not None
    first.cancel()
    assert len(hubs) == 1, "one entry is left: the hub keeps running"
    await _send(backend, b"x")
    await wait_until(lambda: kept.wakes == 1)
    assert gone.wakes == 0


async def test_a_cursor_away_from_the_hubs_offset_is_not_parked() -> None:
    backend, hubs = await _hubs()
    await _send(backend, b"old")
    sink = Sink(take=10)
    parking = hubs.park_idle("t", Cursor(TOPIC, 1, queue_id=0), sink.deliver_now, sink.wake)
    assert parking is not None
    behind = hubs.park_idle("u", Cursor(TOPIC, 0, queue_id=0), sink.deliver_now, sink.wake)
    assert behind is None, "the caller runs its reader instead"
    parking.cancel()


class Watching:
    """The backend as :class:`~mqproxy.mqtt.store.FacadeStore` shows it: ``watch`` / ``unwatch``."""

    def __init__(self, backend: InMemoryBackend) -> None:
        self.backend = backend
        self.pull = backend.pull
        self.wait_for_message = backend.wait_for_message

    def watch(self, topic: str, queue_id: int, offset: int, callback: Callable[[], None]) -> bool | None:
        return self.backend.watch_queue(topic, queue_id, offset, callback)

    def unwatch(self, topic: str, queue_id: int, callback: Callable[[], None]) -> None:
        self.backend.unwatch_queue(topic, queue_id, callback)


async def _watching_hubs() -> tuple[InMemoryBackend, PushHubs]:
    backend = InMemoryBackend()
    await backend.create_topic(TOPIC, 1)
    store = Watching(backend)
    return backend, PushHubs(store, ReadCache(store), 32, 30.0)  # type: ignore[arg-type]


def _hub(hubs: PushHubs) -> Any:
    (hub,) = hubs._hubs.values()
    return hub


async def test_a_hub_waits_without_a_task_where_the_store_can_call_it() -> None:
    backend, hubs = await _watching_hubs()
    sink = Sink(take=10)
    parking = hubs.park_idle("t", Cursor(TOPIC, 0, queue_id=0), sink.deliver_now, sink.wake)
    assert parking is not None
    hub = _hub(hubs)
    assert hub.scope is None, "no task while nothing is there"
    assert backend._waiters.waiting((TOPIC, 0))
    await _send(backend, b"a")
    await wait_until(lambda: sink.bodies == [b"a"])
    await wait_until(lambda: hub.scope is None)  # delivered: back to the store's call, no task
    assert hub.watching is not None
    await _send(backend, b"b")
    await wait_until(lambda: sink.bodies == [b"a", b"b"])
    await wait_until(lambda: hub.scope is None)
    parking.cancel()
    assert len(hubs) == 0, "the last entry gone: the hub and its watch are gone at once"
    assert not backend._waiters.waiting((TOPIC, 0))


async def test_a_watching_hub_still_wakes_a_reader_it_cannot_serve() -> None:
    backend, hubs = await _watching_hubs()
    served, declined = Sink(take=10), Sink(take=0)
    first = hubs.park_idle("t", Cursor(TOPIC, 0, queue_id=0), served.deliver_now, served.wake)
    second = hubs.park_idle("u", Cursor(TOPIC, 0, queue_id=0), declined.deliver_now, declined.wake)
    assert first is not None
    assert second is not None
    await _send(backend, b"x")
    await wait_until(lambda: declined.wakes == 1)
    assert served.bodies == [b"x"]
    assert served.wakes == 0
    first.cancel()
    await wait_until(lambda: len(hubs) == 0)
