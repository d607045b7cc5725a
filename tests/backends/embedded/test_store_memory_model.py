"""The embedded store behaves like the in-memory model across random operations and restarts."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.model.errors import QueueNotFound, TopicNotFound
from mqproxy.model.types import (
    Message,
    PullResult,
    TagFilter,
)

_op = st.one_of(
    st.tuples(
        st.just("send"),
        st.sampled_from(["A", "B"]),
        st.integers(-1, 1),
        st.sampled_from([None, "x", "y"]),
        st.lists(st.sampled_from(["%LMQ%p", "%LMQ%q"]), max_size=2),
        st.integers(1, 3),
    ),
    st.tuples(
        st.just("pull"),
        st.sampled_from(["A", "B", "%LMQ%p", "%LMQ%q"]),
        st.integers(0, 1),
        st.integers(0, 6),
        st.sampled_from([None, "x", "y || x", "*"]),
        st.integers(1, 4),
    ),
    st.tuples(st.just("restart"), st.none(), st.none(), st.none(), st.none(), st.none()),
    st.tuples(
        st.just("rewrite"),
        st.sampled_from(["A", "B", "%LMQ%p", "%LMQ%q"]),
        st.integers(0, 1),
        st.lists(st.integers(0, 5), max_size=3, unique=True),
        st.integers(0, 6),
        st.none(),
    ),
    st.tuples(st.just("sweep"), st.none(), st.none(), st.none(), st.none(), st.none()),
)


def _view(result: PullResult) -> tuple[object, ...]:
    """A pull result without the store-specific fields (commit-log offset, size, timestamps)."""
    return (
        result.status,
        result.next_offset,
        result.min_offset,
        result.max_offset,
        tuple((m.topic, m.queue_id, m.queue_offset, m.body, dict(m.properties)) for m in result.messages),
    )


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_op, max_size=25))
def test_embedded_store_matches_the_memory_model_across_restarts(
    tmp_path_factory: pytest.TempPathFactory, ops: list[Any]
) -> None:
    data_dir = tmp_path_factory.mktemp("model")

    async def run() -> None:
        model = InMemoryBackend(default_queue_count=2)
        async with AsyncExitStack() as stack:
            store = await stack.enter_async_context(
                open_embedded_store(data_dir, default_queue_count=2, segment_bytes=4096)
            )
            for n, (kind, topic, queue_id, a, b, c) in enumerate(ops):
                if kind == "restart":
                    await stack.aclose()
                    store = await stack.enter_async_context(
                        open_embedded_store(data_dir, default_queue_count=2, segment_bytes=4096)
                    )
                elif kind == "send":
                    body, properties = f"{n}".encode() * c, {"TAGS": a} if a else {}
                    got = await store.send(
                        Message(topic, body, queue_id, properties=dict(properties), dispatch=tuple(b))
                    )
                    # The model follows the store's queue choice (round-robin restarts with the process).
                    expected = await model.send(
                        Message(topic, body, got.queue_id, properties=dict(properties), dispatch=tuple(b))
                    )
                    assert (got.queue_offset, got.lmq_offsets) == (
                        expected.queue_offset,
                        expected.lmq_offsets,
                    )
                elif kind == "sweep":
                    swept = [sorted(await be.delete_idle_lmqs(0, set())) for be in (model, store)]
                    assert swept[0] == swept[1]
                elif kind == "rewrite":
                    try:
                        lo, hi = (
                            await model.min_offset(topic, queue_id),
                            await model.max_offset(topic, queue_id),
                        )
                    except (TopicNotFound, QueueNotFound):
                        lo = hi = 0
                    below = lo + min(b, hi - lo)
                    keep = [lo + k for k in a if lo + k < below]
                    outcomes = []
                    for backend in (model, store):
                        try:
                            outcomes.append(await backend.rewrite_queue(topic, queue_id, keep, below))
                        except (TopicNotFound, QueueNotFound) as exc:
                            outcomes.append(type(exc))
                    assert outcomes[0] == outcomes[1]
                else:
                    tag_filter = TagFilter.parse(b) if b else None
                    outcomes: list[object] = []
                    for backend in (model, store):
                        try:
                            outcomes.append(
                                _view(await backend.pull(topic, queue_id, a, c, tag_filter=tag_filter))
                            )
                        except (TopicNotFound, QueueNotFound) as exc:
                            outcomes.append(type(exc))
                    assert outcomes[0] == outcomes[1]

    trio.run(run)
