"""Cluster mode's session-state and retained logs over several queues (one per broker), without a cluster:
an in-memory store whose state topic has two queues stands in for two brokers. The newest record of a
client wins by its version whichever queue holds it; the retained copies on two queues are ordered by store
time."""

from __future__ import annotations

import dataclasses

from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.codecs.mqtt import NO_PROPERTIES
from mqproxy.model.types import Message
from mqproxy.mqtt.mapping import RETAINED_LMQ, SESSION_STATE_TOPIC, encode_properties
from mqproxy.mqtt.retained import RetainedStore
from mqproxy.mqtt.session_record import SessionSnapshot
from mqproxy.mqtt.state import SessionStateStore
from mqproxy.mqtt.store import queue_ids


class TwoBrokers(InMemoryBackend):
    """Every topic read on queues 0 and 1, as a cluster of two brokers answers."""

    async def queue_ids(self, topic: str) -> tuple[int, ...]:
        return (0, 1)


async def _record(backend: InMemoryBackend, queue: int, snapshot: SessionSnapshot) -> None:
    await backend.send(Message(topic=SESSION_STATE_TOPIC, body=snapshot.to_json(), queue_id=queue))


async def test_a_store_without_queue_ids_reads_queue_0() -> None:
    assert await queue_ids(InMemoryBackend(), "%LMQ%x") == (0,)
    assert await queue_ids(TwoBrokers(), "%LMQ%x") == (0, 1)


async def test_the_highest_version_wins_across_queues_tombstones_included() -> None:
    backend = TwoBrokers()
    await backend.create_topic(SESSION_STATE_TOPIC, 2)
    # queue 1 (the broker used while queue 0's was down) holds the newer records
    await _record(backend, 1, SessionSnapshot("moved", 60, node="b", version=200))
    await _record(backend, 0, SessionSnapshot("moved", 30, node="a", version=100))
    await _record(backend, 1, SessionSnapshot("gone", 0, deleted=True, node="b", version=300))
    await _record(backend, 0, SessionSnapshot("gone", 30, node="a", version=250))
    await _record(backend, 0, SessionSnapshot("legacy", 30))  # no version: log order
    state = SessionStateStore(backend, node="c", compacts=False)
    loaded = await state.load()
    assert {c: s.expiry_interval for c, s in loaded.items()} == {"moved": 60, "legacy": 30}
    assert state.ends == {0: 3, 1: 2}
    assert not state.newer(SessionSnapshot("moved", 1, version=150))  # a late, older record
    assert state.newer(SessionSnapshot("moved", 1, version=201))
    assert not state.newer(SessionSnapshot("gone", 1, version=299))

    await state.save(SessionSnapshot("moved", 90))  # this node's next record outranks every one seen
    newest = await backend.pull(SESSION_STATE_TOPIC, 0, 3, 1)
    assert SessionSnapshot.from_json(newest.messages[0].body).version > 200


async def test_retained_copies_on_two_queues_are_ordered_by_store_time() -> None:
    backend = TwoBrokers()

    def retained(payload: bytes, stored_ms: int, queue: int) -> Message:
        return Message(
            topic="parent",
            body=payload,
            properties=encode_properties("r/t", 1, "c", True, NO_PROPERTIES),
            born_timestamp_ms=stored_ms,
            dispatch=(RETAINED_LMQ,),
            queue_id=queue,
        )

    await backend.send(retained(b"old", 1, 0))
    await backend.send(retained(b"new", 2, 0))
    store = RetainedStore(compacts=False)
    await store.load(backend)
    assert store.ends == {0: 2, 1: 0}
    kept = store.get("r/t")
    assert kept is not None
    assert kept.payload == b"new"
    older = (await backend.pull(RETAINED_LMQ, 0, 0, 1)).messages[0]
    older = dataclasses.replace(older, store_timestamp_ms=kept.store_timestamp_ms - 1)
    store.apply_newest(older)  # read late from another broker's queue: stored before, so ignored
    kept = store.get("r/t")
    assert kept is not None
    assert kept.payload == b"new"


async def test_loading_keeps_the_highest_version_even_when_a_lower_one_was_stored_after_it() -> None:
    """Node a loses "twin" to node b but its late write (a lower version: computed before it saw b's) lands
    after b's record in the same queue. The follower ignores that record (:meth:`newer`); a node that loads
    the log must too, and see the session held by b (not disconnected by a), tombstones alike."""
    backend = TwoBrokers()
    await backend.create_topic(SESSION_STATE_TOPIC, 2)
    await _record(backend, 0, SessionSnapshot("twin", 600, node="a", version=100))
    await _record(backend, 0, SessionSnapshot("twin", 600, node="b", version=300))
    await _record(backend, 0, SessionSnapshot("twin", 600, disconnected_at_ms=5, node="a", version=200))
    await _record(backend, 1, SessionSnapshot("ended", 0, deleted=True, node="b", version=300))
    await _record(backend, 1, SessionSnapshot("ended", 600, node="a", version=200))
    state = SessionStateStore(backend, node="c", compacts=False)
    loaded = await state.load()
    assert list(loaded) == ["twin"]
    assert (loaded["twin"].node, loaded["twin"].connected, loaded["twin"].version) == ("b", True, 300)
    assert state.ends == {0: 3, 1: 2}
    assert not state.newer(SessionSnapshot("twin", 600, disconnected_at_ms=5, node="a", version=200))
    assert not state.newer(SessionSnapshot("ended", 600, node="a", version=200))
