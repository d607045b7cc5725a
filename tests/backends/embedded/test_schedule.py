"""Scheduler: delay levels, deliver-at timers, clamping, restart (both backends, mock clock)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import trio
import trio.testing

from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.backends.embedded.internal_topics import trio_clock_ms
from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.backends.embedded.schedule import (
    RECALL_TOPIC,
    RecallHandle,
    Scheduler,
    parse_delay_levels,
    parse_recall_handle,
    recall_handle,
)
from mqproxy.backends.embedded.services import ServiceSettings, open_services
from mqproxy.backends.embedded.store import MessageStore
from mqproxy.model.errors import InvalidArgument, InvalidDelay, MessageNotFound
from mqproxy.model.properties import SCHEDULE_TOPIC
from mqproxy.model.types import Message, StoredMessage

from .conftest import MakeServices  # type: ignore[import-not-found]

#: The broker name recall handles carry in these tests.
B = "broker-a"

#: The cascade the timer tests follow: hops of 1, 5 and 10 s, on a clock that follows trio's.
_CASCADE = ServiceSettings(delay_levels="1s 5s 10s")
_CLOCK = trio_clock_ms()


async def _all(backend: MessageStore, topic: str) -> list[StoredMessage]:
    config = await backend.get_topic(topic)
    if config is None:
        return []
    out: list[StoredMessage] = []
    for qid in range(config.read_queues):
        result = await backend.pull(topic, qid, 0, 1000)
        out.extend(result.messages)
    return out


def test_default_levels_are_the_standard_18() -> None:
    levels = parse_delay_levels(ServiceSettings().delay_levels)
    assert len(levels) == 18
    assert levels[:4] == (1000, 5000, 10000, 30000)
    assert levels[-1] == 2 * 3600 * 1000


@pytest.mark.parametrize("text", ["", "1s 1s", "5s 1s", "1x", "s", "0s", "-1s"])
def test_parse_delay_levels_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="delay level"):
        parse_delay_levels(text)


def test_clamping() -> None:
    scheduler = Scheduler(InMemoryBackend(), delay_levels="1s 2s 3s")
    assert [scheduler.clamp_level(n) for n in (-1, 0, 1, 3, 4, 99)] == [0, 0, 1, 3, 3, 3]
    assert scheduler.delay_ms(99) == 3000
    assert scheduler.delay_ms(0) == 0


async def test_delay_level_delivers_after_its_delay(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    async with make_services() as (backend, services):
        sent = await services.send(
            Message("Orders", b"late", queue_id=2, properties={"DELAY": "2", "TAGS": "A"}, flag=3)
        )
        assert (sent.topic, sent.queue_id) == (SCHEDULE_TOPIC, 1)
        parked = (await backend.pull(SCHEDULE_TOPIC, 1, 0, 10)).messages[0]
        assert parked.properties["REAL_TOPIC"] == "Orders"
        assert parked.properties["REAL_QID"] == "2"
        await trio.sleep(4.9)
        assert await _all(backend, "Orders") == []
        await trio.sleep(0.2)
        (delivered,) = await _all(backend, "Orders")
        assert (delivered.queue_id, delivered.body, delivered.flag, delivered.tags) == (2, b"late", 3, "A")
        assert "DELAY" not in delivered.properties
        assert "SCHEDULE_DUE_MS" not in delivered.properties
        assert await services.scheduler.pending() == 0


async def test_level_zero_is_immediate_and_99_is_clamped(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    settings = ServiceSettings(delay_levels="1s 2s 3s")
    async with make_services(settings) as (backend, services):
        now = await services.send(Message("T", b"now", queue_id=0, properties={"DELAY": "0"}))
        assert now.topic == "T"
        clamped = await services.send(Message("T", b"max", queue_id=0, properties={"DELAY": "99"}))
        assert (clamped.topic, clamped.queue_id) == (SCHEDULE_TOPIC, 2)
        await trio.sleep(2.9)
        assert [m.body for m in await _all(backend, "T")] == [b"now"]
        await trio.sleep(0.2)
        assert [m.body for m in await _all(backend, "T")] == [b"now", b"max"]


@pytest.mark.parametrize("props", [{"DELAY": "soon"}, {"TIMER_DELIVER_MS": "x1"}, {"TIMER_DELAY_SEC": ""}])
async def test_bad_delay_properties_raise_invalid_delay(props: dict[str, str]) -> None:
    backend = InMemoryBackend()
    scheduler = Scheduler(backend)
    await scheduler.start()
    with pytest.raises(InvalidDelay):
        await scheduler.send(Message("T", b"x", properties=props))
    assert await backend.get_topic("T") is None


async def test_timer_too_far_out_is_refused(autojump_clock: trio.testing.MockClock) -> None:
    scheduler = Scheduler(InMemoryBackend(), max_timer_delay_ms=10_000, now_ms=trio_clock_ms())
    await scheduler.start()
    with pytest.raises(InvalidDelay, match="limit"):
        await scheduler.send(Message("T", b"x", properties={"TIMER_DELAY_SEC": "11"}))


async def test_deliver_at_is_never_early_and_at_most_one_short_hop_late(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    async with make_services(_CASCADE, now_ms=_CLOCK) as (backend, services):
        at = _CLOCK() + 7500
        await services.send(Message("T", b"timer", queue_id=0, properties={"TIMER_DELIVER_MS": str(at)}))
        relative = Message("T", b"relative", queue_id=0, properties={"TIMER_DELAY_MS": "12000"})
        await services.send(relative)
        past = Message("T", b"past", queue_id=0, properties={"TIMER_DELIVER_MS": str(_CLOCK() - 1)})
        assert (await services.send(past)).topic == "T"
        await trio.sleep(7.4)
        assert [m.body for m in await _all(backend, "T")] == [b"past"]
        await trio.sleep(0.2)
        delivered = await _all(backend, "T")
        assert [m.body for m in delivered] == [b"past", b"timer"]
        assert delivered[1].properties["TIMER_DELIVER_MS"] == str(at)
        await trio.sleep(4.3)
        assert [m.body for m in await _all(backend, "T")] == [b"past", b"timer"]
        await trio.sleep(0.2)
        assert [m.body for m in await _all(backend, "T")] == [b"past", b"timer", b"relative"]


async def test_many_levels_deliver_everything_in_due_order(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    settings = ServiceSettings(delay_levels="1s 2s 3s 4s")
    async with make_services(settings) as (backend, services):
        for i in range(40):
            level = 4 - i % 4
            await services.send(Message("T", str(i).encode(), queue_id=0, properties={"DELAY": str(level)}))
        await trio.sleep(4.5)
        bodies = [int(m.body) for m in await _all(backend, "T")]
        assert sorted(bodies) == list(range(40))
        # Level 1 (1 s) messages come first, level 4 (4 s) last.
        assert {b % 4 for b in bodies[:10]} == {3}
        assert {b % 4 for b in bodies[-10:]} == {0}
        assert services.scheduler.delivered == 40


async def test_restart_delivers_each_parked_message_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = tmp_path / "store"
    async with open_embedded_store(path) as store, open_services(store, _CASCADE, now_ms=_CLOCK) as services:
        await services.send(Message("T", b"a", queue_id=0, properties={"DELAY": "1"}))
        await services.send(Message("T", b"b", queue_id=0, properties={"DELAY": "3"}))
        await services.send(Message("T", b"c", queue_id=0, properties={"TIMER_DELAY_SEC": "17"}))
        await trio.sleep(1.5)
        assert [m.body for m in await _all(store, "T")] == [b"a"]
    # Down for 3 s: "b" becomes due while nothing runs.
    await trio.sleep(3)
    async with open_embedded_store(path) as store, open_services(store, _CASCADE, now_ms=_CLOCK) as services:
        assert await services.scheduler.pending() == 2
        await trio.sleep(6)
        assert [m.body for m in await _all(store, "T")] == [b"a", b"b"]
    async with open_embedded_store(path) as store, open_services(store, _CASCADE, now_ms=_CLOCK) as services:
        await trio.sleep(10)
        assert [m.body for m in await _all(store, "T")] == [b"a", b"b", b"c"]
        assert await services.scheduler.pending() == 0
    async with open_embedded_store(path) as store, open_services(store, _CASCADE, now_ms=_CLOCK):
        await trio.sleep(30)
        assert [m.body for m in await _all(store, "T")] == [b"a", b"b", b"c"]


def test_parse_delay_levels_units() -> None:
    assert parse_delay_levels("500ms 1s 1m 1h 1d") == (500, 1000, 60_000, 3_600_000, 86_400_000)


async def test_a_crashing_background_task_is_restarted(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = InMemoryBackend()
    real_pull = backend.pull
    failures = [1]

    async def flaky_pull(*args: object, **kwargs: object) -> object:
        if args and args[0] == SCHEDULE_TOPIC and failures:
            failures.pop()
            raise RuntimeError("disk on fire")
        return await real_pull(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(backend, "pull", flaky_pull)
    settings = ServiceSettings(delay_levels="1s")
    async with open_services(backend, settings, now_ms=trio_clock_ms()) as services:
        await services.send(Message("T", b"x", queue_id=0, properties={"DELAY": "1"}))
        await trio.sleep(2.5)
        assert [m.body for m in await _all(backend, "T")] == [b"x"]
        assert failures == []


# --- recall (RocketMQ 5 RecallMessage) ---------------------------------------------------------------


def _timer(body: bytes, uniq: str, at: int) -> Message:
    return Message("T", body, queue_id=0, properties={"TIMER_DELIVER_MS": str(at), "UNIQ_KEY": uniq})


def test_recall_handle_round_trips_and_rejects_garbage() -> None:
    handle = recall_handle("Topic-1", "7F0000010000ABCD", 1_700_000_123_456, broker_name="broker-a")
    assert parse_recall_handle(handle) == RecallHandle(
        "Topic-1", "7F0000010000ABCD", 1_700_000_123_456, "broker-a"
    )
    # RocketMQ's RecallMessageHandle.HandleV1: URL-safe base64 (padded) of the five space-separated fields
    assert base64.urlsafe_b64decode(handle) == b"v1 Topic-1 broker-a 1700000123456 7F0000010000ABCD"
    assert parse_recall_handle(handle.rstrip("=")) == parse_recall_handle(handle)
    # the four-field layout of earlier versions (no broker name) still reads
    legacy = base64.urlsafe_b64encode(b"v1 Topic-1 1700000123456 7F0000010000ABCD").decode().rstrip("=")
    assert parse_recall_handle(legacy) == RecallHandle("Topic-1", "7F0000010000ABCD", 1_700_000_123_456)
    truncated = recall_handle("T", "I", 5, broker_name="b")[:-2] + "!!"
    for bad in ("", "x" * 2000, "h", "@@@@", "djEgVCB4IElE", truncated):
        with pytest.raises(InvalidArgument):
            parse_recall_handle(bad)


async def test_recalled_timer_message_is_dropped_mid_cascade(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    async with make_services(_CASCADE, now_ms=_CLOCK) as (backend, services):
        at = _CLOCK() + 7500
        await services.send(_timer(b"kept", "K1", at))
        await services.send(_timer(b"gone", "K2", at))
        await trio.sleep(5.5)  # both took their first (5 s) hop
        scheduler = services.scheduler
        assert await scheduler.recall("T", recall_handle("T", "K2", at, broker_name=B)) == "K2"
        assert await scheduler.recall("T", recall_handle("T", "K2", at, broker_name=B)) == "K2"  # idempotent
        assert scheduler.is_recalled("T", "K2")
        assert not scheduler.is_recalled("Other", "K2")
        await trio.sleep(3)
        assert [m.body for m in await _all(backend, "T")] == [b"kept"]
        assert scheduler.dropped_recalled == 1
        with pytest.raises(MessageNotFound):
            await scheduler.recall("T", recall_handle("T", "K1", at, broker_name=B))
        with pytest.raises(InvalidArgument, match="topic"):
            await scheduler.recall("Other", recall_handle("T", "K9", _CLOCK() + 60_000, broker_name=B))
        assert len(await _all(backend, RECALL_TOPIC)) == 1


async def test_recall_survives_a_restart(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    path = tmp_path / "store"
    at = _CLOCK() + 4000
    async with open_embedded_store(path) as store, open_services(store, _CASCADE, now_ms=_CLOCK) as services:
        await services.send(_timer(b"a", "A", at))
        await services.send(_timer(b"b", "B", at))
        await services.scheduler.recall("T", recall_handle("T", "A", at, broker_name=B))
        await trio.sleep(0.5)  # stopped before the first (1 s) hop: the recall exists only as a record
        assert services.scheduler.dropped_recalled == 0
    await trio.sleep(5)  # down while both become due
    async with open_embedded_store(path) as store, open_services(store, _CASCADE, now_ms=_CLOCK) as services:
        assert services.scheduler.is_recalled("T", "A")
        await trio.sleep(3)
        assert [m.body for m in await _all(store, "T")] == [b"b"]
        assert services.scheduler.dropped_recalled == 1
        assert await services.scheduler.pending() == 0
