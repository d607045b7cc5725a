"""The MessageStore contract, run against every store kind: topic configs, topic list, lookup by key."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.model.errors import IllegalTopic

from .conftest import MakeStore, msg  # type: ignore[import-not-found]

# --- admin: topic configs, topic list, lookup by key -------------------------------------------------


async def test_update_topic_creates_then_replaces_a_config(make_store: MakeStore) -> None:
    from mqproxy.model.types import TopicConfig

    async with make_store() as backend:
        created = await backend.update_topic(TopicConfig("Adm", read_queues=3, write_queues=3, perm=6))
        assert await backend.get_topic("Adm") == created
        await backend.send(msg("Adm", queue_id=2))
        changed = await backend.update_topic(TopicConfig("Adm", read_queues=8, write_queues=2, perm=4))
        assert await backend.get_topic("Adm") == changed
        assert (await backend.pull("Adm", 2, 0, 1)).messages[0].body == b"hello"
        with pytest.raises(IllegalTopic):
            await backend.update_topic(TopicConfig("bad name", read_queues=1, write_queues=1))
        with pytest.raises(IllegalTopic):
            await backend.update_topic(TopicConfig("Adm", read_queues=0, write_queues=0))
        with pytest.raises(IllegalTopic):
            await backend.update_topic(TopicConfig("%LMQ%x", read_queues=1, write_queues=1))
        assert "Adm" in await backend.topic_names()
        assert await backend.topic_names() == sorted(await backend.topic_names())


async def test_updated_topic_config_survives_reopen(tmp_path: Path) -> None:
    from mqproxy.model.types import TopicConfig

    async with open_embedded_store(tmp_path) as store:
        await store.update_topic(TopicConfig("Kept", read_queues=5, write_queues=3, perm=6))
    async with open_embedded_store(tmp_path) as store:
        assert await store.get_topic("Kept") == TopicConfig("Kept", read_queues=5, write_queues=3, perm=6)


async def test_query_messages_finds_keys_and_unique_keys_newest_first(make_store: MakeStore) -> None:
    async with make_store() as backend:
        first = await backend.send(msg("Q", b"1", properties={"KEYS": "order-7 user-1", "UNIQ_KEY": "U1"}))
        await backend.send(msg("Q", b"2", properties={"KEYS": "order-8", "UNIQ_KEY": "U2"}))
        third = await backend.send(msg("Q", b"3", properties={"KEYS": "order-7", "UNIQ_KEY": "U3"}))
        await backend.send(msg("Other", b"4", properties={"KEYS": "order-7"}))
        found = await backend.query_messages("Q", "order-7", 32, 0, 2**62)
        assert [m.body for m in found] == [b"3", b"1"]
        assert [m.commitlog_offset for m in found] == [third.commitlog_offset, first.commitlog_offset]
        assert [m.body for m in await backend.query_messages("Q", "order-7", 1, 0, 2**62)] == [b"3"]
        assert [m.body for m in await backend.query_messages("Q", "U2", 32, 0, 2**62)] == [b"2"]
        assert [m.body for m in await backend.query_messages("Q", "user-1", 32, 0, 2**62)] == [b"1"]
        assert await backend.query_messages("Q", "order", 32, 0, 2**62) == []
        assert await backend.query_messages("Q", "order-7", 32, 0, first.store_timestamp_ms - 1) == []
        later = await backend.query_messages("Q", "order-7", 32, third.store_timestamp_ms, 2**62)
        assert b"3" in [m.body for m in later]


async def test_query_messages_after_reopen_and_after_a_lost_index(tmp_path: Path) -> None:
    import shutil

    async with open_embedded_store(tmp_path) as store:
        await store.send(msg("Q", b"kept", properties={"KEYS": "k1", "UNIQ_KEY": "U1"}))
    async with open_embedded_store(tmp_path) as store:
        assert [m.body for m in await store.query_messages("Q", "k1", 32, 0, 2**62)] == [b"kept"]
    shutil.rmtree(tmp_path / "index")  # recovery rebuilds the index from the commit log
    async with open_embedded_store(tmp_path) as store:
        assert [m.body for m in await store.query_messages("Q", "U1", 32, 0, 2**62)] == [b"kept"]
