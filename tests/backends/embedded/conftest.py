"""Fixtures shared by the embedded-backend tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest

from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.backends.embedded.internal_topics import Clock, trio_clock_ms
from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.backends.embedded.services import BrokerServices, ServiceSettings, open_services
from mqproxy.backends.embedded.store import MessageStore
from mqproxy.facade.types import CheckBack

#: Opens a fresh store each call (the test's one store; both kinds run every test).
MakeBackend = Callable[[], AbstractAsyncContextManager[MessageStore]]
#: ``make_services(settings=None, *, check_back=None, now_ms=None)``: a fresh store and the broker
#: services over it, as ``(backend, services)``.
MakeServices = Callable[..., AbstractAsyncContextManager[tuple[MessageStore, BrokerServices]]]


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
