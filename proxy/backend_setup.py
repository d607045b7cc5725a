"""Opens the configured backend. Handlers only ever see the :class:`~mqproxy.backends.embedded.store.MessageStore`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from mqproxy.backends.embedded.store import MessageStore
from mqproxy.settings import Settings


@asynccontextmanager
async def open_backend(settings: Settings, store_host: tuple[str, int]) -> AsyncIterator[MessageStore]:
    store = settings.store
    if store.backend == "memory":
        from mqproxy.backends.embedded.memory import InMemoryBackend

        yield InMemoryBackend(
            default_queue_count=store.default_queue_count,
            auto_create_topics=store.auto_create_topics,
            store_host=store_host,
        )
        return
    from mqproxy.backends.embedded.embedded import open_embedded_store

    async with open_embedded_store(
        Path(store.data_dir),
        flush=store.flush,  # type: ignore[arg-type]
        flush_interval_ms=store.flush_interval_ms,
        segment_bytes=store.segment_bytes,
        default_queue_count=store.default_queue_count,
        auto_create_topics=store.auto_create_topics,
        store_host=store_host,
        max_message_bytes=store.max_message_bytes,
    ) as backend:
        yield backend
