"""Retention of the embedded store: expired segments go, live state is moved first, min offsets rise and a
pull below them is told where to begin, and everything survives a reopen."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import trio
import trio.testing

from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.backends.embedded.internal_topics import trio_clock_ms
from mqproxy.backends.embedded.retention import DiskUsage, RetentionPolicy
from mqproxy.backends.embedded.services import ServiceSettings, open_services
from mqproxy.facade.compaction import replay
from mqproxy.facade.types import Resolution
from mqproxy.model.errors import StoreUnavailable
from mqproxy.model.properties import HALF_TOPIC, SCHEDULE_GROUP, SCHEDULE_TOPIC
from mqproxy.model.types import Message, PullStatus, StoredMessage
from tests.conftest import EventSink, wait_until

SEGMENT = 4096
BODY = b"x" * 300
_ANY_HOUR = RetentionPolicy(file_reserved_ms=0, delete_hours=None)


def _roomy(_: Path) -> DiskUsage:
    return DiskUsage(total=100 << 30, free=90 << 30)


def _store(path: Path, **kwargs: object):  # type: ignore[no-untyped-def]
    opts: dict[str, object] = {
        "segment_bytes": SEGMENT,
        "retention": _ANY_HOUR,
        "clean_interval_s": 3600.0,
        "disk_probe": _roomy,
    }
    opts.update(kwargs)
    return open_embedded_store(path, **opts)  # type: ignore[arg-type]


async def test_expired_segments_go_and_live_state_stays(tmp_path: Path, log_sink) -> None:  # type: ignore[no-untyped-def]
    async with _store(tmp_path) as store:
        await store.create_topic("MQTT_SESSION_STATE", 1)
        state = await store.send(Message(topic="MQTT_SESSION_STATE", body=b"snapshot", queue_id=0))
        for _ in range(40):
            await store.send(Message(topic="T", body=BODY, queue_id=0))
        before = await store.store_bytes()
        deleted = await store.enforce_retention()
        assert deleted
        assert all(d.reason == "expired" for d in deleted)
        assert await store.store_bytes() < before
        low = await store.min_offset("T", 0)
        assert low > 0
        assert await store.max_offset("T", 0) == 40
        below = await store.pull("T", 0, 0, 10)
        assert below.status is PullStatus.OFFSET_ILLEGAL
        assert below.next_offset == low
        found = await store.pull("T", 0, low, 1)
        assert found.status is PullStatus.FOUND
        kept = await store.pull("MQTT_SESSION_STATE", 0, 0, 10)
        assert [m.body for m in kept.messages] == [b"snapshot"]
        # a message id naming the old place still finds the moved record
        old = await store.get_message(state.commitlog_offset)
        assert old is not None
        assert old.body == b"snapshot"
    names = [e["event"] for e in log_sink.events]
    assert "store.segment_deleted" in names
    assert "store.live_records_moved" in names
    deleted_event = log_sink.named("store.segment_deleted")[0]
    assert deleted_event["reason"] == "expired"
    assert deleted_event["messages"] > 0
    async with _store(tmp_path) as store:  # a reopen keeps the layout
        assert await store.min_offset("T", 0) == low
        kept = await store.pull("MQTT_SESSION_STATE", 0, 0, 10)
        assert [m.body for m in kept.messages] == [b"snapshot"]


async def test_progress_queue_keeps_entries_from_its_group_offset(tmp_path: Path) -> None:
    async with _store(tmp_path) as store:
        await store.create_topic(SCHEDULE_TOPIC, 2)
        for i in range(12):
            await store.send(Message(topic=SCHEDULE_TOPIC, body=b"%d" % i + BODY, queue_id=0))
        await store.commit_consumer_offset(SCHEDULE_GROUP, SCHEDULE_TOPIC, 0, 8)  # 0..7 delivered
        for _ in range(30):
            await store.send(Message(topic="T", body=BODY, queue_id=0))
        await store.enforce_retention()
        assert await store.min_offset(SCHEDULE_TOPIC, 0) == 8
        due = await store.pull(SCHEDULE_TOPIC, 0, 8, 10)
        assert [m.body[:2] for m in due.messages] == [b"8x", b"9x", b"10", b"11"]


async def test_nothing_goes_before_its_time(tmp_path: Path) -> None:
    policy = RetentionPolicy(file_reserved_ms=3_600_000, delete_hours=None)
    async with _store(tmp_path, retention=policy) as store:
        for _ in range(30):
            await store.send(Message(topic=HALF_TOPIC, body=BODY, queue_id=0))
        assert await store.enforce_retention() == []
        assert await store.min_offset(HALF_TOPIC, 0) == 0


@pytest.mark.parametrize("ratio", [0.86, 0.99])
async def test_full_disk_deletes_the_oldest_even_unexpired(tmp_path: Path, ratio: float) -> None:
    policy = RetentionPolicy(file_reserved_ms=3_600_000, delete_hours=frozenset({25 % 24}) - {1})
    total = 1 << 20

    def probe(_: Path) -> DiskUsage:
        return DiskUsage(total=total, free=int(total * (1 - ratio)))

    async with _store(tmp_path, retention=policy, disk_probe=probe) as store:
        for _ in range(30):
            await store.send(Message(topic="T", body=BODY, queue_id=0))
        deleted = await store.enforce_retention()
        assert deleted
        assert deleted[0].reason == "disk_ratio"
        assert await store.min_offset("T", 0) > 0


async def test_a_queue_retention_empties_keeps_its_max_offset(tmp_path: Path) -> None:
    async with _store(tmp_path) as store:
        for _ in range(10):
            await store.send(Message(topic="Old", body=BODY, queue_id=0))
        for _ in range(30):
            await store.send(Message(topic="T", body=BODY, queue_id=0))
        await store.enforce_retention()
        assert (await store.min_offset("Old", 0), await store.max_offset("Old", 0)) == (10, 10)
    async with _store(tmp_path) as store:  # the floor is durable, not only cached
        assert (await store.min_offset("Old", 0), await store.max_offset("Old", 0)) == (10, 10)
        sent = await store.send(Message(topic="Old", body=b"next", queue_id=0))
        assert sent.queue_offset == 10


async def test_an_unresolved_transaction_survives_and_commits_by_its_old_id(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    settings = ServiceSettings(transaction_timeout_s=3600)
    async with _store(tmp_path) as store, open_services(store, settings, now_ms=trio_clock_ms()) as services:
        props = {"TRAN_MSG": "true", "PGROUP": "PG", "UNIQ_KEY": "TX1"}
        prepared = await services.send(Message("Orders", b"tx", queue_id=0, properties=props, sys_flag=0x4))
        for _ in range(30):
            await store.send(Message(topic="T", body=BODY, queue_id=0))
        await store.enforce_retention()
        assert store._log.start > prepared.commitlog_offset  # its segment is gone
        result = await services.transactions.end(
            resolution=Resolution.COMMIT, producer_group="PG", commitlog_offset=prepared.commitlog_offset
        )
        assert result is not None
        committed = await store.pull("Orders", 0, 0, 10)
        assert [m.body for m in committed.messages] == [b"tx"]


async def test_a_deleted_index_is_rebuilt_with_the_moved_state(tmp_path: Path) -> None:
    async with _store(tmp_path) as store:
        await store.create_topic("MQTT_SESSION_STATE", 1)
        await store.send(Message(topic="MQTT_SESSION_STATE", body=b"snapshot", queue_id=0))
        for _ in range(30):
            await store.send(Message(topic="T", body=BODY, queue_id=0))
        await store.enforce_retention()
        low = await store.min_offset("T", 0)
    shutil.rmtree(tmp_path / "index")
    async with _store(tmp_path) as store:
        kept = await store.pull("MQTT_SESSION_STATE", 0, 0, 10)
        assert [m.body for m in kept.messages] == [b"snapshot"]
        assert await store.min_offset("T", 0) == low
        assert await store.max_offset("T", 0) == 30


async def test_background_task_deletes_by_itself(tmp_path: Path, log_sink: EventSink) -> None:
    async with _store(tmp_path, clean_interval_s=0.01, check_interval_s=0.01) as store:
        for _ in range(30):
            await store.send(Message(topic="T", body=BODY, queue_id=0))
        await wait_until(lambda: bool(log_sink.named("store.segment_deleted")))
        assert await store.min_offset("T", 0) > 0


async def test_light_queues_and_key_rows_go_with_their_records(tmp_path: Path) -> None:
    async with _store(tmp_path) as store:
        for i in range(30):
            props = {"KEYS": f"k{i}", "UNIQ_KEY": f"u{i}"}
            await store.send(
                Message(topic="T", body=BODY, queue_id=0, properties=props, dispatch=("%LMQ%a",))
            )
        await store.enforce_retention()
        low = await store.min_offset("T", 0)
        assert await store.min_offset("%LMQ%a", 0) == low
        assert await store.query_messages("T", "k0", 10, 0, 2**62) == []
        assert len(await store.query_messages("T", "k29", 10, 0, 2**62)) == 1
        with store._index._env.begin(db=store._index._keys) as txn:
            assert txn.stat(store._index._keys)["entries"] == 2 * (30 - low)


async def test_an_entry_compaction_moves_during_the_fsync_is_still_moved(tmp_path: Path) -> None:
    async with _store(tmp_path) as store:
        await store.create_topic("MQTT_SESSION_STATE", 1)
        for i in range(3):
            await store.send(Message(topic="MQTT_SESSION_STATE", body=b"s%d" % i, queue_id=0))
        for _ in range(30):
            await store.send(Message(topic="T", body=BODY, queue_id=0))
        flush = store._flush_once
        raced = []

        async def racing_flush() -> None:  # a compaction re-appends entry 0 while the copies are fsynced
            if not raced:
                qid = store._lookup_qid(b"MQTT_SESSION_STATE\x00\x00\x00\x00\x00")
                assert qid is not None
                _, end = store._index.rewrite(qid, [0], 1, store._clock.now_ms())
                store._next_offsets.store(qid, end)
                raced.append(end)
            await flush()

        store._flush_once = racing_flush  # type: ignore[method-assign]
        await store.enforce_retention()
        assert raced
        low = await store.min_offset("MQTT_SESSION_STATE", 0)
        kept = await store.pull("MQTT_SESSION_STATE", 0, low, 10)
        assert sorted(m.body for m in kept.messages) == [b"s0", b"s1", b"s2"]


async def test_moved_twice_the_first_offset_still_finds_it(tmp_path: Path) -> None:
    async with _store(tmp_path) as store:
        await store.create_topic("MQTT_SESSION_STATE", 1)
        first = await store.send(Message(topic="MQTT_SESSION_STATE", body=b"snapshot", queue_id=0))
        for _ in range(2):
            for _ in range(30):
                await store.send(Message(topic="T", body=BODY, queue_id=0))
            await store.enforce_retention()
        found = await store.get_message(first.commitlog_offset)
        assert found is not None
        assert found.body == b"snapshot"
        assert found.commitlog_offset == first.commitlog_offset  # a moved record keeps its identity
        assert store._index.moved_to(first.commitlog_offset) >= store._log.start
        with store._index._env.begin() as txn:  # one row per first offset, not per move
            assert txn.stat(store._index._moved)["entries"] == 1


async def test_no_room_to_move_live_state_deletes_only_what_lies_below_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log_sink: EventSink
) -> None:
    async with _store(tmp_path) as store:
        for _ in range(30):
            await store.send(Message(topic="T", body=BODY, queue_id=0))
        await store.create_topic("MQTT_SESSION_STATE", 1)
        state = await store.send(Message(topic="MQTT_SESSION_STATE", body=b"snapshot", queue_id=0))
        for _ in range(30):
            await store.send(Message(topic="T", body=BODY, queue_id=0))
        real_append = store._log.append

        def full(payloads: list[bytes]) -> list[tuple[int, int]]:
            raise StoreUnavailable("commit log write failed: [Errno 28] No space left on device")

        monkeypatch.setattr(store._log, "append", full)
        deleted = await store.enforce_retention()
        assert deleted, "the segments below the live record still go"
        assert store._log.start <= state.commitlog_offset
        assert log_sink.named("store.retention_failed")
        monkeypatch.setattr(store._log, "append", real_append)
        kept = await store.pull("MQTT_SESSION_STATE", 0, 0, 10)
        assert [m.body for m in kept.messages] == [b"snapshot"]


async def test_a_moved_old_record_never_outranks_a_newer_one(tmp_path: Path) -> None:
    """Compaction ranks records by commit-log offset: a copy must keep the rank of its original."""

    def key_of(message: StoredMessage) -> tuple[str, bool]:
        return message.body.split(b"=")[0].decode(), True

    async with _store(tmp_path) as store:
        await store.create_topic("MQTT_SESSION_STATE", 1)
        await store.send(Message(topic="MQTT_SESSION_STATE", body=b"a=old", queue_id=0))
        for _ in range(30):
            await store.send(Message(topic="T", body=BODY, queue_id=0))
        await store.send(Message(topic="MQTT_SESSION_STATE", body=b"a=new", queue_id=0))
        await store.send(Message(topic="T", body=BODY, queue_id=0))
        await store.enforce_retention()
        found = await replay(store, "MQTT_SESSION_STATE", 0, key_of)
        assert [m.body for m in found.live()] == [b"a=new"]
        assert found.records == 2
