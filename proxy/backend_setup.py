"""Opens the configured backend: the broker facade every protocol calls, and what the server needs besides.

``[backend] kind = "embedded"``: the embedded store (``[store] backend``: durable under ``data_dir``, or in
memory) under an :class:`~mqproxy.backends.embedded.broker.EmbeddedBroker`. ``kind = "rocketmq"``: the
``rocketmq`` backend in front of a stock Apache RocketMQ cluster; no store and no data directory. Handlers
only ever see the :class:`~mqproxy.facade.api.BrokerFacade`.

Several backends (``[backends.NAME]`` and ``[routing]``): each is opened as above (a named embedded one
keeps its files under ``<data_dir>/<NAME>``, the ``[backend]`` one under ``data_dir``) and a
:class:`~mqproxy.facade.routing.RoutingFacade` dispatches between them by topic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mqproxy.backends.embedded.broker import open_embedded_broker
from mqproxy.backends.embedded.services import ServiceSettings
from mqproxy.backends.embedded.store import MessageStore
from mqproxy.context import always_healthy
from mqproxy.settings import BackendSettings, BrokerSettings, Settings

if TYPE_CHECKING:
    from mqproxy.facade.api import BrokerFacade

__all__ = ["OpenBackend", "open_backend", "open_broker", "service_settings"]


@dataclass(frozen=True, slots=True)
class OpenBackend:
    """An open backend.

    ``name`` is what ``proxy.started`` reports (``embedded`` | ``memory`` | ``rocketmq``); ``broker`` the
    facade; ``store`` the embedded message store under it (None in cluster mode: messages live in the
    cluster), for inspection by tests and tools only; ``health()`` None while the backend can serve, else a
    one-line reason (``/healthz`` answers 503 with it)."""

    name: str
    broker: BrokerFacade
    store: MessageStore | None
    health: Callable[[], str | None]


def service_settings(broker: BrokerSettings) -> ServiceSettings:
    """The broker services' tunables from the ``[broker]`` settings section."""
    return ServiceSettings(
        delay_levels=broker.delay_levels,
        max_reconsume_times=broker.max_reconsume_times,
        transaction_timeout_s=broker.transaction_timeout_s,
        transaction_check_interval_s=broker.transaction_check_interval_s,
        transaction_check_max=broker.transaction_check_max,
        lock_ttl_s=broker.lock_ttl_s,
    )


@asynccontextmanager
async def open_broker(settings: Settings, advertised: tuple[str, int]) -> AsyncIterator[OpenBackend]:
    """Open the backend ``settings.backend.kind`` names, with ``advertised`` as the broker address clients
    are given; closed on exit. A cluster backend opens even while the cluster is unreachable (its
    ``health()`` then says why)."""
    if settings.routed:
        async with _open_routed(settings, advertised) as opened:
            yield opened
        return
    async with _open_one(settings, settings.backend, advertised) as opened:
        yield opened


@asynccontextmanager
async def _open_one(
    settings: Settings, backend: BackendSettings, advertised: tuple[str, int]
) -> AsyncIterator[OpenBackend]:
    service = service_settings(settings.broker)
    if backend.cluster:
        async with _open_rocketmq(settings, backend, advertised, service) as opened:
            yield opened
        return
    async with open_backend(settings, advertised) as store:
        async with open_embedded_broker(
            store,
            service,
            auto_create_topics=settings.store.auto_create_topics,
            default_queue_count=settings.store.default_queue_count,
        ) as broker:
            yield OpenBackend(settings.store.backend, broker, store, always_healthy)


@asynccontextmanager
async def _open_rocketmq(
    settings: Settings, backend: BackendSettings, advertised: tuple[str, int], service: ServiceSettings
) -> AsyncIterator[OpenBackend]:
    # Imported here: the embedded-only deployment never loads the cluster client.
    from mqproxy.backends.rocketmq import ClusterConfig, open_rocketmq_broker

    config = ClusterConfig(
        namesrv=backend.namesrv_addresses,
        access_key=backend.access_key or None,
        secret_key=backend.secret_key or None,
        refresh_s=backend.refresh_s,
        request_timeout_s=backend.request_timeout_s,
        default_queue_count=settings.store.default_queue_count,
        auto_create_topics=settings.store.auto_create_topics,
    )
    async with open_rocketmq_broker(config, advertised=advertised, service=service) as broker:
        yield OpenBackend("rocketmq", broker, None, broker.health)


@asynccontextmanager
async def _open_routed(settings: Settings, advertised: tuple[str, int]) -> AsyncIterator[OpenBackend]:
    """Every backend in use, behind one routing facade. ``store`` is the default backend's embedded store
    (else the first embedded one's); ``health()`` names the first backend that cannot serve."""
    from mqproxy.facade.routing import RoutingFacade

    async with AsyncExitStack() as stack:
        opened: dict[str, OpenBackend] = {}
        for name, backend in settings.backends_in_use().items():
            own = settings
            if not backend.cluster and name != "default" and settings.store.backend == "embedded":
                data_dir = str(Path(settings.store.data_dir) / name)
                store = dataclasses.replace(settings.store, data_dir=data_dir)
                own = dataclasses.replace(settings, store=store)
            opened[name] = await stack.enter_async_context(_open_one(own, backend, advertised))
        facade = RoutingFacade({name: o.broker for name, o in opened.items()}, settings.routing_table())
        default = opened.get(settings.routing.default)
        stores = [o.store for o in ([default] if default else []) + list(opened.values()) if o.store]

        def health() -> str | None:
            for name, o in opened.items():
                reason = o.health()
                if reason is not None:
                    return f"backend {name}: {reason}"
            return None

        yield OpenBackend("routed", facade, stores[0] if stores else None, health)


@asynccontextmanager
async def open_backend(settings: Settings, store_host: tuple[str, int]) -> AsyncIterator[MessageStore]:
    """The embedded message store ``[store] backend`` names: ``memory`` or ``embedded`` (under ``data_dir``,
    created if missing)."""
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
        retention=store.retention_policy(),
        clean_interval_s=store.clean_interval_seconds,
        check_interval_s=min(1.0, store.clean_interval_seconds),
    ) as backend:
        yield backend
