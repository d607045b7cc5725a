"""EmbeddedBroker's Locking role: the one queue-lock table every protocol uses, behind async methods."""

from __future__ import annotations

import trio

from mqproxy.backends.embedded.broker import open_embedded_broker
from mqproxy.backends.embedded.internal_topics import trio_clock_ms
from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.facade.types import QueueRef

Q0, Q1 = QueueRef("T", 0), QueueRef("T", 1)


async def test_locks_are_exclusive_released_and_expire(autojump_clock) -> None:
    async with open_embedded_broker(InMemoryBackend(), now_ms=trio_clock_ms()) as broker:
        assert await broker.lock_batch("G", "a@1", [Q0, Q1]) == {Q0, Q1}
        assert await broker.lock_batch("G", "b@2", [Q0, Q1]) == set()
        assert await broker.lock_holder("G", Q0) == "a@1"
        assert broker.services.locks.holder("G", Q0) == "a@1"  # the services' table, shared with gRPC
        await broker.unlock("G", "b@2", [Q0])  # not b's: untouched
        await broker.unlock("G", "a@1", [Q0])
        assert await broker.lock_holder("G", Q0) is None
        assert await broker.release_client("G", "a@1") == 1
        assert await broker.lock_batch("G", "b@2", [Q0]) == {Q0}
        await trio.sleep(61)  # not renewed within the TTL
        assert await broker.lock_holder("G", Q0) is None
        assert await broker.lock_batch("G", "a@1", [Q0]) == {Q0}
