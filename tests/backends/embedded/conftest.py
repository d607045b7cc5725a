"""Fixtures and helpers shared by the embedded-backend tests."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.backends.embedded.internal_topics import Clock, trio_clock_ms
from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.backends.embedded.services import BrokerServices, ServiceSettings, open_services
from mqproxy.backends.embedded.store import MessageStore
from mqproxy.facade.types import CheckBack
from mqproxy.model.types import Message

#: Opens a fresh store each call (the test's one store; both kinds run every test).
MakeBackend = Callable[[], AbstractAsyncContextManager[MessageStore]]
#: ``make_services(settings=None, *, check_back=None, now_ms=None)``: a fresh store and the broker
#: services over it, as ``(backend, services)``.
MakeServices = Callable[..., AbstractAsyncContextManager[tuple[MessageStore, BrokerServices]]]
#: ``make_store(**store_kwargs)``: opens a fresh store of the test's kind each call (a conformance test may
#: open several, e.g. with different settings).
MakeStore = Callable[..., AbstractAsyncContextManager[MessageStore]]


@pytest.fixture(params=["memory", "embedded"])
def make_backend(request: pytest.FixtureRequest, tmp_path: Path) -> MakeBackend:
    """The in-memory store, then the embedded one (in ``tmp_path / "store"``, 1 MiB segments)."""

    @asynccontextmanager
    async def make() -> AsyncIterator[MessageStore]:
        if request.param == "memory":
            yield InMemoryBackend()
            return
        async with open_embedded_store(tmp_path / "store", segment_bytes=1 << 20) as store:
            yield store

    return make


@pytest.fixture
def make_services(make_backend: MakeBackend) -> MakeServices:
    """A store from ``make_backend`` with :class:`BrokerServices` running over it; ``now_ms`` defaults to
    trio's clock (:func:`trio_clock_ms`, so ``autojump_clock`` drives the services' timers)."""

    @asynccontextmanager
    async def make(
        settings: ServiceSettings | None = None,
        *,
        check_back: CheckBack | None = None,
        now_ms: Clock | None = None,
    ) -> AsyncIterator[tuple[MessageStore, BrokerServices]]:
        async with make_backend() as backend:
            clock = trio_clock_ms() if now_ms is None else now_ms
            async with open_services(backend, settings, check_back=check_back, now_ms=clock) as services:
                yield backend, services

    return make


@pytest.fixture(params=["memory", "embedded-async", "embedded-sync"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> MakeStore:
    """Every store kind and flush mode: the in-memory store, then the embedded one flushing asynchronously
    and synchronously (each call in a new directory under ``tmp_path``, 64 KiB segments). Keyword
    arguments go to the store."""
    counter = iter(range(1000))

    @asynccontextmanager
    async def make(**kwargs: Any) -> AsyncIterator[MessageStore]:
        if request.param == "memory":
            yield InMemoryBackend(**kwargs)
            return
        flush = request.param.removeprefix("embedded-")
        async with open_embedded_store(
            tmp_path / f"store{next(counter)}", flush=flush, segment_bytes=64 * 1024, **kwargs
        ) as store:
            yield store

    return make


@pytest.fixture
def wall_clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """Stop the wall clock the stores read (store times, idleness: ``time.time_ns``); the test moves it
    on by the seconds it passes to the returned function."""
    now = [time.time_ns()]
    monkeypatch.setattr(time, "time_ns", lambda: now[0])

    def advance(seconds: float) -> None:
        now[0] += int(seconds * 1e9)

    return advance


def msg(topic: str = "T", body: bytes = b"hello", **kw: Any) -> Message:
    """A message for ``topic``; keyword arguments are further :class:`Message` fields."""
    return Message(topic=topic, body=body, **kw)


async def fill_queue(backend: MessageStore, topic: str, n: int, **kw: Any) -> list[Any]:
    """Send ``n`` messages (bodies ``m0``, ``m1``, ...) to queue 0 of ``topic``; returns the send results."""
    return [await backend.send(msg(topic, body=f"m{i}".encode(), queue_id=0, **kw)) for i in range(n)]


async def long_poll_result(
    backend: MessageStore, topic: str, offset: int, then: Callable[[], Awaitable[object]]
) -> list[bool]:
    """Park a 30 s long poll on queue 0 of ``topic`` past ``offset``, run ``then`` once it waits;
    returns what the poll answered (one value)."""
    woke: list[bool] = []
    async with trio.open_nursery() as nursery:

        async def waiter() -> None:
            woke.append(await backend.wait_for_message(topic, 0, offset, 30))

        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()  # the waiter waits
        assert woke == []
        await then()
    return woke
