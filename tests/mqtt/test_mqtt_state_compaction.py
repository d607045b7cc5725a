"""The session-state log is compacted to one record per live persistent session."""

from __future__ import annotations

from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.mqtt.mapping import SESSION_STATE_TOPIC
from mqproxy.mqtt.session_record import SessionSnapshot, SubscriptionSpec
from mqproxy.mqtt.state import SessionStateStore


async def _records(backend: InMemoryBackend) -> int:
    return await backend.max_offset(SESSION_STATE_TOPIC, 0) - await backend.min_offset(SESSION_STATE_TOPIC, 0)


async def test_state_log_compacts_at_load_and_when_due() -> None:
    backend = InMemoryBackend()
    store = SessionStateStore(backend, min_garbage=5)
    assert await store.load() == {}
    for round_ in range(10):
        for client in ("c1", "c2", "c3"):
            subs = [SubscriptionSpec(f"{client}/{i}", qos=1) for i in range(round_ + 1)]
            await store.save(SessionSnapshot(client, 3600, subs))
    await store.save(SessionSnapshot("c3", 0, deleted=True))
    assert await _records(backend) == 31
    assert store.compaction_due()
    await store.compact()
    assert await _records(backend) == 2
    assert not store.compaction_due()

    for _ in range(7):
        await store.save(SessionSnapshot("c1", 60, [SubscriptionSpec("only/this")]))
    restarted = SessionStateStore(backend, min_garbage=5)
    loaded = await restarted.load()  # replays 9 records, compacts to 2
    assert await _records(backend) == 2
    assert set(loaded) == {"c1", "c2"}
    assert loaded["c1"].expiry_interval == 60
    assert [s.topic_filter for s in loaded["c1"].subscriptions] == ["only/this"]
    assert len(loaded["c2"].subscriptions) == 10


async def test_foreign_records_are_dropped_and_small_logs_left_alone() -> None:
    from mqproxy.model.types import Message

    backend = InMemoryBackend()
    store = SessionStateStore(backend, min_garbage=3)
    await store.load()
    await backend.send(Message(topic=SESSION_STATE_TOPIC, body=b"[not a snapshot", queue_id=0))
    await store.save(SessionSnapshot("c1", 10))
    await store.save(SessionSnapshot("c1", 20))
    loaded = await SessionStateStore(backend, min_garbage=3).load()  # 2 dead of 3: below min_garbage
    assert loaded["c1"].expiry_interval == 20
    assert await _records(backend) == 3
    await store.save(SessionSnapshot("c1", 30))
    loaded = await SessionStateStore(backend, min_garbage=3).load()  # 3 dead of 4: compacted
    assert loaded["c1"].expiry_interval == 30
    assert await _records(backend) == 1


async def test_clean_sessions_write_nothing_and_ending_a_stored_session_writes_a_tombstone() -> None:
    from mqproxy.mqtt.config import MqttConfig
    from mqproxy.mqtt.gateway import Gateway

    backend = InMemoryBackend()
    gateway = Gateway(backend, MqttConfig())
    await gateway.ready()
    for _ in range(3):  # clean session, connect and leave: no record at all
        session, _ = await gateway.open_session("clean", True, 0, 10)
        await gateway.detached(session)
    assert await _records(backend) == 0
    session, _ = await gateway.open_session("dev", False, 3600, 10)
    assert await _records(backend) == 1
    session, present = await gateway.open_session("dev", False, 0, 10)  # back with expiry 0
    assert present
    await gateway.detached(session)  # ends the stored session: its tombstone must be written
    assert await _records(backend) == 2
    assert await SessionStateStore(backend).load() == {}
