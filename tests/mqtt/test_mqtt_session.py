from __future__ import annotations

from mqproxy.codecs.mqtt import Publish, QoS
from mqproxy.mqtt.cursor import Cursor
from mqproxy.mqtt.session import Session


def test_cursor_commits_contiguous_prefix() -> None:
    cursor = Cursor("%LMQ%a", 10)
    cursor.complete(10)
    assert cursor.committed == 11
    cursor.track(11)
    cursor.track(12)
    cursor.complete(13)  # QoS 0 after two un-acked
    assert cursor.committed == 11
    cursor.complete(12)
    assert cursor.committed == 11
    cursor.complete(11)
    assert cursor.committed == 14
    cursor.next_offset = 20
    cursor.rewind()
    assert cursor.next_offset == 14


def test_cursor_complete_all_equals_complete_each() -> None:
    runs = [[], [5], [5, 6, 7], [3], [9, 8, 12]]
    for tracked in ([], [4], [4, 6]):
        one, many = Cursor("%LMQ%a", 4), Cursor("%LMQ%a", 4)
        for offset in tracked:
            one.track(offset)
            many.track(offset)
        for run in runs:
            for offset in run:
                one.complete(offset)
            many.complete_all(run)
            assert (many.committed, many.pending) == (one.committed, one.pending)
        one.complete(4)
        many.complete_all([4])
        assert (many.committed, many.pending) == (one.committed, one.pending)


async def test_inflight_window_and_packet_ids() -> None:
    session = Session("c", 0, send_quota=2)
    cursor = Cursor("%LMQ%a", 0)
    make = lambda pid: Publish("a", b"", QoS.AT_LEAST_ONCE, packet_id=pid)  # noqa: E731
    await session.acquire_slot()
    first = session.add_inflight(make, cursor, 0)
    second = session.add_inflight(make, cursor, 1)
    assert (first.packet_id, second.packet_id) == (1, 2)
    assert second.publish.packet_id == 2
    assert session.finish(2) is not None
    assert cursor.committed == 0
    assert session.finish(2) is None
    assert session.finish(1) is not None
    assert cursor.committed == 2
    session._next_packet_id = 65535
    assert session.add_inflight(make, None, 0).packet_id == 65535
    assert session.add_inflight(make, None, 0).packet_id == 1


def test_cursor_retrack_after_give_back() -> None:
    cursor = Cursor("%LMQ%a", 0)
    cursor.track(0)
    cursor.track(1)
    cursor.track(0)  # handed back and sent to another member
    cursor.complete(1)
    assert cursor.committed == 0
    cursor.complete(0)
    assert cursor.committed == 2


async def test_session_state_replay_last_record_wins_and_ignores_foreign() -> None:
    from mqproxy.backends.embedded.memory import InMemoryBackend
    from mqproxy.model.types import Message
    from mqproxy.mqtt.mapping import SESSION_STATE_TOPIC
    from mqproxy.mqtt.session_record import SessionSnapshot, SubscriptionSpec
    from mqproxy.mqtt.state import SessionStateStore

    backend = InMemoryBackend()
    store = SessionStateStore(backend)
    assert await store.load() == {}
    await store.save(SessionSnapshot("a", 60, [SubscriptionSpec("x/+", 1)]))
    await store.save(SessionSnapshot("b", 0xFFFFFFFF, []))
    await backend.send(Message(SESSION_STATE_TOPIC, b"not json", queue_id=0))
    await store.save(SessionSnapshot("a", 60, [SubscriptionSpec("y/#", 2, no_local=True)], 123))
    await store.save(SessionSnapshot("b", 0, deleted=True))
    loaded = await store.load()
    assert list(loaded) == ["a"]
    assert loaded["a"].subscriptions == [SubscriptionSpec("y/#", 2, no_local=True)]
    assert loaded["a"].disconnected_at_ms == 123


def test_made_at_is_replace_of_since_ms() -> None:
    import dataclasses

    from mqproxy.mqtt.session_record import SubscriptionSpec

    spec = SubscriptionSpec("a/+", 2, True, True, 1, 7, 5)
    made = spec.made_at(99)
    assert made == dataclasses.replace(spec, since_ms=99)
    assert made.since_ms == 99
    assert dataclasses.astuple(made) == (*dataclasses.astuple(spec)[:-1], 99)
