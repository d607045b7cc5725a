"""The idle-LMQ sweeper the MQTT service runs: periodic sweeps, the lmq.swept event, in-use protection,
surviving store errors."""

from __future__ import annotations

from collections.abc import Container
from pathlib import Path
from typing import Any

import trio
import trio.testing

from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.model.errors import StoreUnavailable
from mqproxy.model.types import Message
from mqproxy.mqtt import sweeper as lmq_sweeper
from mqproxy.mqtt.sweeper import run_lmq_sweeper

from ..conftest import wait_until  # type: ignore[import-not-found]


async def _lmqs(backend: InMemoryBackend, *names: str) -> None:
    await backend.send(Message("Parent", b"x", 0, dispatch=names))


async def test_sweeps_on_schedule_and_logs_what_it_deleted(
    autojump_clock: trio.testing.MockClock, log_sink: Any
) -> None:
    backend = InMemoryBackend()
    await _lmqs(backend, "%LMQ%a", "%LMQ%b", "%LMQ%kept")
    calls: list[float] = []

    def in_use() -> set[str]:
        calls.append(trio.current_time())
        return {"%LMQ%kept"}

    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: run_lmq_sweeper(backend, idle_ms=0, interval_s=60, in_use=in_use, limit=100)
        )
        await trio.sleep(59)
        assert calls == [], "the first sweep waits one interval"
        assert await backend.max_offset("%LMQ%a", 0) == 1
        await trio.sleep(2)
        assert calls == [60.0]
        assert await backend.max_offset("%LMQ%a", 0) == 0
        assert await backend.max_offset("%LMQ%kept", 0) == 1
        await trio.sleep(60)  # nothing idle left but the protected queue: a sweep, no event
        assert len(calls) == 2
        assert await backend.delete_idle_lmqs(0, set()) == ["%LMQ%kept"]  # released by its reader
        await trio.sleep(60)  # nothing qualifies: ``in_use`` is not even asked
        assert len(calls) == 2
        nursery.cancel_scope.cancel()
    (event,) = log_sink.named("lmq.swept")
    assert event["deleted"] == 2
    assert event["duration_ms"] >= 0
    assert event["level"] == "info"


class _Flaky(InMemoryBackend):
    def __init__(self) -> None:
        super().__init__()
        self.failures = 2

    async def delete_idle_lmqs(self, idle_ms: int, in_use: Container[str], limit: int = 10_000) -> list[str]:
        if self.failures:
            self.failures -= 1
            raise StoreUnavailable("index write failed: disk full")
        return await super().delete_idle_lmqs(idle_ms, in_use, limit)


async def test_store_errors_are_logged_and_the_loop_goes_on(
    autojump_clock: trio.testing.MockClock, log_sink: Any
) -> None:
    backend = _Flaky()
    await _lmqs(backend, "%LMQ%a")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: run_lmq_sweeper(backend, idle_ms=0, interval_s=1, in_use=set, limit=10))
        await trio.sleep(3.5)
        nursery.cancel_scope.cancel()
    errors = log_sink.named("internal.error")
    assert len(errors) == 2
    assert "disk full" in errors[0]["exception"]
    assert await backend.max_offset("%LMQ%a", 0) == 0, "the third sweep worked"
    assert [e["deleted"] for e in log_sink.named("lmq.swept")] == [1]


async def test_a_long_sweep_sees_queues_taken_into_use_meanwhile(
    autojump_clock: trio.testing.MockClock, monkeypatch: Any
) -> None:
    backend = InMemoryBackend()
    await _lmqs(backend, "%LMQ%a", "%LMQ%b")
    in_use: set[str] = set()
    fresh = lmq_sweeper._FreshInUse(lambda: set(in_use))
    assert "%LMQ%b" not in fresh
    in_use.add("%LMQ%b")  # subscribed after the sweep took its first snapshot
    assert "%LMQ%b" not in fresh
    await trio.sleep(lmq_sweeper.IN_USE_REFRESH_S + 0.1)
    assert "%LMQ%b" in fresh
    assert await backend.delete_idle_lmqs(0, fresh) == ["%LMQ%a"]


async def test_server_protects_the_gateways_queues_and_the_retained_queue() -> None:
    from mqproxy.mqtt.config import MqttConfig
    from mqproxy.mqtt.gateway import Gateway
    from mqproxy.mqtt.mapping import RETAINED_LMQ, lmq_name
    from mqproxy.mqtt.session_record import SubscriptionSpec

    backend = InMemoryBackend()
    gateway = Gateway(backend, MqttConfig())
    assert gateway.lmqs_in_use() == {RETAINED_LMQ}, "before any MQTT client connected"
    online, _ = await gateway.open_session("online", True, 0, 10)
    offline, _ = await gateway.open_session("offline", True, 3600, 10)
    await gateway.subscribe(online, SubscriptionSpec("a/b"))
    await gateway.subscribe(offline, SubscriptionSpec("c/+"))
    await gateway.subscribe(online, SubscriptionSpec("$share/g/d/#"))
    expected = {RETAINED_LMQ, lmq_name("a/b"), lmq_name("c/+"), lmq_name("d/#")}
    assert gateway.lmqs_in_use() == expected
    await _lmqs(backend, *expected, lmq_name("a/unread"), lmq_name("was/read"))
    await gateway.read_cache.pull(lmq_name("was/read"), 0, 0, 8)  # its segment is cached now
    assert await backend.delete_idle_lmqs(0, gateway.lmqs_in_use()) == [lmq_name("a/unread")]


async def test_the_server_runs_the_sweeper_from_its_settings(log_sink: Any, tmp_path: Path) -> None:
    from mqproxy.mqtt.mapping import RETAINED_LMQ
    from mqproxy.server import ServerHandle, serve
    from mqproxy.settings import Settings

    settings = Settings.for_tests(tmp_path, store={"lmq_idle_seconds": 1, "lmq_sweep_interval_seconds": 0.1})
    async with trio.open_nursery() as nursery:
        handle: ServerHandle = await nursery.start(
            lambda task_status: serve(settings, install_signal_handlers=False, task_status=task_status)
        )
        backend = handle.store
        assert backend is not None, "an embedded-store server"
        await backend.send(Message("Parent", b"x", 0, dispatch=("%LMQ%gone", RETAINED_LMQ)))

        async def gone() -> bool:  # deleted after about one idle time (1 s) plus one interval
            return await backend.max_offset("%LMQ%gone", 0) == 0

        await wait_until(gone)
        assert await backend.max_offset(RETAINED_LMQ, 0) == 1
        handle.stop("test")
    assert [e["deleted"] for e in log_sink.named("lmq.swept")] == [1]
