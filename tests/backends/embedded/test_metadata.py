"""Administrator-set broker metadata (subscription-group configs, topic message types): parsing, and
durability through the metadata log over both backends, including a reopen and compaction."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.backends.embedded.metadata import COMPACT_MIN_GARBAGE, METADATA_TOPIC, BrokerMetadata
from mqproxy.backends.embedded.store import MessageStore
from mqproxy.facade.types import GroupConfig, TopicMessageType, parse_topic_attributes
from mqproxy.model.errors import InvalidArgument


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", None),
        ("+message.type=FIFO", TopicMessageType.FIFO),
        ("+queue.type=BatchCQ,+message.type=transaction", TopicMessageType.TRANSACTION),
        ("+message.type=DELAY,-message.type", TopicMessageType.NORMAL),
        ("-message.type", TopicMessageType.NORMAL),
        (" +message.type = Mixed ", TopicMessageType.MIXED),
        ("+cleanup.policy=COMPACTION", None),
    ],
)
def test_parse_topic_attributes(text: str, expected: TopicMessageType | None) -> None:
    assert parse_topic_attributes(text) is expected


@pytest.mark.parametrize("text", ["message.type=FIFO", "+message.type=QUEUE", "+message.type="])
def test_parse_topic_attributes_refuses(text: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_topic_attributes(text)


@pytest.fixture(params=["memory", "embedded"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@asynccontextmanager
async def _open(kind: str, path: Path, memory: InMemoryBackend) -> AsyncIterator[MessageStore]:
    if kind == "memory":
        yield memory
        return
    async with open_embedded_store(path, flush="async", segment_bytes=64 * 1024) as store:
        yield store


async def test_metadata_survives_a_reopen(kind: str, tmp_path: Path) -> None:
    memory = InMemoryBackend()
    async with _open(kind, tmp_path / "s", memory) as backend:
        metadata = BrokerMetadata(backend)
        await metadata.start()
        assert metadata.group("G") is None
        assert metadata.topic_type("T") is None
        await metadata.put_group(GroupConfig("G", consume_orderly=True, retry_max_times=3))
        await metadata.put_group(GroupConfig("Gone"))
        assert await metadata.delete_group("Gone") is True
        assert await metadata.delete_group("Never") is False
        await metadata.set_topic_type("T", TopicMessageType.FIFO)
        await metadata.set_topic_type("U", TopicMessageType.DELAY)
        await metadata.set_topic_type("U", None)
        assert metadata.is_fifo_group("G")
        assert not metadata.is_fifo_group("Gone")
    async with _open(kind, tmp_path / "s", memory) as backend:
        again = BrokerMetadata(backend)
        await again.start()
        assert again.group("G") == GroupConfig("G", consume_orderly=True, retry_max_times=3)
        assert again.group("Gone") is None
        assert again.topic_type("T") is TopicMessageType.FIFO
        assert again.topic_type("U") is None


async def test_unchanged_values_write_nothing_and_dead_records_are_compacted() -> None:
    backend = InMemoryBackend()
    metadata = BrokerMetadata(backend)
    await metadata.start()
    await metadata.put_group(GroupConfig("G"))
    await metadata.put_group(GroupConfig("G"))
    await metadata.set_topic_type("T", TopicMessageType.NORMAL)
    await metadata.set_topic_type("T", TopicMessageType.NORMAL)
    assert await backend.max_offset(METADATA_TOPIC, 0) == 2
    for i in range(COMPACT_MIN_GARBAGE):
        await metadata.put_group(GroupConfig("G", retry_max_times=i % 2))
    restarted = BrokerMetadata(backend)
    await restarted.start()
    assert restarted.group("G") == metadata.group("G")
    assert restarted.topic_type("T") is TopicMessageType.NORMAL
    assert await backend.max_offset(METADATA_TOPIC, 0) - await backend.min_offset(METADATA_TOPIC, 0) == 2
