"""Both backends satisfy the MessageStore protocol (every method, with the same signature)."""

from __future__ import annotations

import inspect
from pathlib import Path

from mqproxy.backends.embedded.embedded import EmbeddedStore, open_embedded_store
from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.backends.embedded.store import MessageStore

PROTOCOL_METHODS = [
    name
    for name, member in inspect.getmembers(MessageStore)
    if inspect.iscoroutinefunction(member) and not name.startswith("_")
]


def test_protocol_lists_the_expected_operations() -> None:
    assert {"send", "send_batch", "pull", "get_message", "wait_for_message", "commit_consumer_offset"} <= set(
        PROTOCOL_METHODS
    )


def test_memory_backend_implements_every_method_with_the_same_signature() -> None:
    backend = InMemoryBackend()
    assert isinstance(backend, MessageStore)
    for name in PROTOCOL_METHODS:
        assert (
            inspect.signature(getattr(InMemoryBackend, name)).parameters.keys()
            == inspect.signature(getattr(MessageStore, name)).parameters.keys()
        ), name


def test_embedded_store_implements_every_method_with_the_same_signature() -> None:
    for name in PROTOCOL_METHODS:
        assert (
            inspect.signature(getattr(EmbeddedStore, name)).parameters.keys()
            == inspect.signature(getattr(MessageStore, name)).parameters.keys()
        ), name


async def test_open_embedded_store_yields_a_backend(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        assert isinstance(store, MessageStore)


async def _exercise_accounting(backend: MessageStore) -> None:
    from mqproxy.model.types import ConsumerOffset, Message

    assert await backend.store_bytes() == 0
    await backend.send(Message(topic="Acct", body=b"x" * 100, queue_id=0))
    await backend.commit_consumer_offset("G", "Acct", 0, 1)
    await backend.commit_consumer_offset("G", "%LMQ%dev", 0, 1)
    assert await backend.store_bytes() >= 100
    assert await backend.consumer_offsets() == [ConsumerOffset("G", "Acct", 0, 1)]


async def test_accounting_on_memory_backend() -> None:
    await _exercise_accounting(InMemoryBackend())


async def test_accounting_on_embedded_store_survives_reopen(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        await _exercise_accounting(store)
    async with open_embedded_store(tmp_path) as store:
        assert len(await store.consumer_offsets()) == 1
        assert await store.store_bytes() >= 100
