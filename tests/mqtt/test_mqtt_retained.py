"""The retained-message topic tree: same answers as the reference matcher, pruning, counts."""

from __future__ import annotations

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from mqproxy.codecs.mqtt import Properties, topic_matches
from mqproxy.mqtt.retained import RetainedStore

_LEVELS = st.sampled_from(["a", "b", "", "$SYS", "c"])
_TOPICS = st.lists(_LEVELS, min_size=1, max_size=4).map("/".join)
_FILTER_LEVELS = st.sampled_from(["a", "b", "", "$SYS", "+"])


@st.composite
def _filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(_FILTER_LEVELS, min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    return "/".join(levels)


def _store(*topics: str) -> RetainedStore:
    store = RetainedStore()
    for i, topic in enumerate(topics):
        store.set(topic, f"v{i}".encode(), 1, Properties(), i, i)
    return store


def test_wildcards_follow_the_spec_including_dollar_topics() -> None:
    store = _store("a", "a/b", "a/b/c", "a/x/c", "$SYS/load", "/lead")
    assert sorted(m.topic for m in store.matching("a/#")) == ["a", "a/b", "a/b/c", "a/x/c"]
    assert sorted(m.topic for m in store.matching("a/+/c")) == ["a/b/c", "a/x/c"]
    assert sorted(m.topic for m in store.matching("#")) == ["/lead", "a", "a/b", "a/b/c", "a/x/c"]
    assert [m.topic for m in store.matching("+/load")] == []
    assert [m.topic for m in store.matching("$SYS/#")] == ["$SYS/load"]
    assert [m.topic for m in store.matching("+/lead")] == ["/lead"]
    assert [m.payload for m in store.matching("a/b")] == [b"v1"]


def test_replace_and_clear_keep_count_and_prune_branches() -> None:
    store = _store("a/b/c", "a/b")
    store.set("a/b/c", b"new", 0, Properties(), 9, 9)
    assert len(store) == 2
    assert store.get("a/b/c") is not None
    assert store.get("a/b/c").payload == b"new"
    store.set("a/b/c", b"", 0, Properties(), 10, 10)
    store.set("never/there", b"", 0, Properties(), 11, 11)
    assert len(store) == 1
    assert store.get("a/b/c") is None
    store.set("a/b", b"", 0, Properties(), 12, 12)
    assert len(store) == 0
    assert list(store.topics()) == []
    assert store._root.children == {}  # every emptied branch was removed


@settings(max_examples=300, deadline=None)
@given(
    writes=st.lists(st.tuples(_TOPICS, st.booleans()), max_size=25),
    topic_filter=_filters(),
)
def test_matches_the_reference_matcher(writes: list[tuple[str, bool]], topic_filter: str) -> None:
    store = RetainedStore()
    live: dict[str, bytes] = {}
    for i, (topic, keep) in enumerate(writes):
        payload = f"p{i}".encode() if keep else b""
        store.set(topic, payload, 0, Properties(), i, i)
        if payload:
            live[topic] = payload
        else:
            live.pop(topic, None)
    expected = sorted((t, p) for t, p in live.items() if topic_matches(topic_filter, t))
    assert sorted((m.topic, m.payload) for m in store.matching(topic_filter)) == expected
    assert len(store) == len(live)
    assert sorted(store.topics()) == sorted(live)


async def test_gateway_compacts_the_retained_log_at_load_and_when_due() -> None:
    from mqproxy.backends.embedded.memory import InMemoryBackend
    from mqproxy.model.topics import LMQ_QUEUE_ID
    from mqproxy.mqtt.config import MqttConfig
    from mqproxy.mqtt.gateway import Gateway
    from mqproxy.mqtt.mapping import RETAINED_LMQ

    async def queue_records(backend: InMemoryBackend) -> int:
        low = await backend.min_offset(RETAINED_LMQ, LMQ_QUEUE_ID)
        return await backend.max_offset(RETAINED_LMQ, LMQ_QUEUE_ID) - low

    backend = InMemoryBackend()
    config = MqttConfig(compaction_min_records=10)
    first = Gateway(backend, config)
    await first.ready()
    for i in range(30):
        await first.publisher.publish(f"room/{i % 3}", f"v{i}".encode(), 1, True, Properties(), "dev")
    await first.publisher.publish("room/2", b"", 0, True, Properties(), "dev")  # clears room/2
    assert await queue_records(backend) == 31
    assert first.retained.compaction_due()

    second = Gateway(backend, config)  # a restart: load replays, then compacts
    await second.ready()
    assert await queue_records(backend) == 2
    assert sorted((m.topic, m.payload) for m in second.retained.matching("room/+")) == [
        ("room/0", b"v27"),
        ("room/1", b"v28"),
    ]
    assert not second.retained.compaction_due()
    for i in range(12):
        await second.publisher.publish("room/0", f"w{i}".encode(), 0, True, Properties(), "dev")
    assert second.retained.compaction_due()
    await second.retained.compact(backend)  # what the housekeeping timer does
    assert await queue_records(backend) == 2
    third = Gateway(backend, config)
    await third.ready()
    assert third.retained.get("room/0").payload == b"w11"  # type: ignore[union-attr]
    assert third.retained.get("room/1").payload == b"v28"  # type: ignore[union-attr]


async def test_the_housekeeping_timer_compacts_both_state_logs(autojump_clock: object) -> None:
    from mqproxy.backends.embedded.memory import InMemoryBackend
    from mqproxy.model.topics import LMQ_QUEUE_ID
    from mqproxy.mqtt.config import MqttConfig
    from mqproxy.mqtt.gateway import HOUSEKEEPING_INTERVAL_S, Gateway
    from mqproxy.mqtt.mapping import RETAINED_LMQ, SESSION_STATE_TOPIC

    async def span(backend: InMemoryBackend, topic: str, queue_id: int) -> int:
        return await backend.max_offset(topic, queue_id) - await backend.min_offset(topic, queue_id)

    backend = InMemoryBackend()
    gateway = Gateway(backend, MqttConfig(compaction_min_records=5))
    await gateway.ready()
    for i in range(20):
        await gateway.publisher.publish("dev/state", f"v{i}".encode(), 0, True, Properties(), "dev")
        await gateway.open_session("dev", False, 60 + i, 10)  # each reconnect rewrites its snapshot
    assert await span(backend, RETAINED_LMQ, LMQ_QUEUE_ID) == 20
    assert await span(backend, SESSION_STATE_TOPIC, 0) == 20
    await trio.sleep(HOUSEKEEPING_INTERVAL_S + 1)
    assert await span(backend, RETAINED_LMQ, LMQ_QUEUE_ID) == 1
    assert await span(backend, SESSION_STATE_TOPIC, 0) == 1
    assert gateway.retained.get("dev/state").payload == b"v19"  # type: ignore[union-attr]
    gateway._draining.set()  # stop the timer task
