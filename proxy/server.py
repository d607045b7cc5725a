"""The server: bind, open the backend, accept, and stop gracefully.

``serve`` owns the listener, the connection nursery and the shutdown sequence. SIGINT/SIGTERM (or
``handle.stop()``) → ``proxy.stopping`` → the drain: the drain event is set, so ``/healthz`` answers 503
"draining", held long polls are answered at once, in-flight requests finish and each protocol closes its
connections politely (remoting after its last response, answering GO_AWAY to clients newer than 5.3.1 until
then, MQTT 5 with DISCONNECT 0x8B, gRPC with GOAWAY, HTTP with ``Connection: close``); the listener stays
open meanwhile, so a load balancer's health checks see the 503 and new connections get the same polite
close (an MQTT CONNECT: CONNACK 0x89 server busy, 3.1.1 return code 3). The drain lasts at least
``server.drain_window_s`` and until no connection is open, at most ``max(drain_window_s, shutdown_grace_s)``;
a second signal ends it at once. Then ``proxy.drained`` → the listener closes → what is left is cancelled →
the backend closes (the store flushes) → ``proxy.stopped``.
"""

from __future__ import annotations

import gc
import os
import signal
import ssl
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import structlog
import trio

from mqproxy import __version__
from mqproxy.accepting import Acceptor
from mqproxy.acl.holder import AclHolder
from mqproxy.acl_watch import initial_rules, watch_acl_file
from mqproxy.addresses import id_address, parse_advertised
from mqproxy.backend_setup import open_broker
from mqproxy.backends.embedded.store import MessageStore
from mqproxy.connection import handle_connection
from mqproxy.context import ServerState, format_addr
from mqproxy.lag_sources import log_lag_readings
from mqproxy.routes import build_protocols
from mqproxy.settings import Settings, parse_hostport
from mqproxy.tls import server_ssl_context
from mqproxy.trace import TraceDispatcher
from mqproxy.trace_facade import TracingBroker

if TYPE_CHECKING:
    from mqproxy.facade.api import BrokerFacade

_log = structlog.get_logger("mqproxy.server")


@dataclass(eq=False)
class ServerHandle:
    """Returned through ``task_status`` once the server accepts: its address and a stop trigger.

    ``store`` is the embedded message store under the broker facade, for inspection by tests and tools only
    (nothing that serves clients reaches it except through the facade); None when ``backend.kind =
    "rocketmq"``, where messages live in the cluster."""

    address: tuple[str, int]
    state: ServerState
    store: MessageStore | None
    _stop: trio.Event = field(default_factory=trio.Event)
    _hurry: trio.Event = field(default_factory=trio.Event)

    def stop(self, reason: str = "requested") -> None:
        """Start the graceful shutdown; called again once it started, end its drain at once."""
        if self._stop.is_set():
            self._hurry.set()
            return
        self.reason = reason
        self._stop.set()

    reason: str = ""


async def _drain(state: ServerState, settings: Settings, hurry: trio.Event) -> None:
    """Return once ``server.drain_window_s`` has passed and no connection is open (new ones included),
    after ``max(drain_window_s, shutdown_grace_s)`` at the latest, or at once when ``hurry`` is set."""
    window_s, grace_s = settings.server.drain_window_s, settings.server.shutdown_grace_s
    start = trio.current_time()
    with trio.move_on_at(start + max(window_s, grace_s)):
        async with trio.open_nursery() as nursery:

            async def stop_on_hurry() -> None:
                await hurry.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(stop_on_hurry)
            await trio.sleep_until(start + window_s)
            while state.open_connections:
                await state.all_closed.wait()
            nursery.cancel_scope.cancel()


async def _watch_signals(handle: ServerHandle, signals: tuple[int, ...]) -> None:
    with trio.open_signal_receiver(*signals) as received:
        async for signum in received:  # the first starts the shutdown, a second one hurries it
            handle.stop(signal.Signals(signum).name)


async def serve(
    settings: Settings,
    *,
    install_signal_handlers: bool = True,
    freeze_heap: bool = False,
    task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the proxy until a stop signal (or ``handle.stop()``), then shut down gracefully.

    ``freeze_heap`` (the ``mqproxy serve`` process; not for a server run inside another program): once
    started, collect and then :func:`gc.freeze` what start-up allocated, so later full collections
    skip it (see :func:`freeze_startup_heap`)."""
    ssl_context = server_ssl_context(settings.tls)
    rules, acl_stamp = initial_rules(settings.acl)
    acl = AclHolder(rules, clock=time.monotonic)
    host, port = parse_hostport(settings.server.listen)
    listeners = await trio.open_tcp_listeners(port, host=host)
    listener = listeners[0]
    for extra in listeners[1:]:
        await extra.aclose()
    sock = listener.socket.getsockname()
    bound = (sock[0], sock[1])
    advertised = (
        parse_advertised(settings.server.advertised_address)
        if settings.server.advertised_address
        else bound
    )
    ids = await id_address(advertised)  # store host and message ids carry an IP, never a name
    async with open_broker(settings, ids) as backend:
        state = ServerState(
            settings=settings,
            backend_name=backend.name,
            advertised=advertised,
            id_host=ids[0],
            broker=backend.broker,
            backend_health=backend.health,
            acl=acl,
        )
        if settings.trace.enabled:
            state.tracer = TraceDispatcher(
                backend.broker,
                settings.trace.topic,
                settings.trace.buffer_records,
                state.metrics.count_trace,
                create_topic=not settings.backend.cluster,
                born_host=ids,
                log_sample_rate=settings.trace.log_sample_rate,
            )
            state.broker = cast(
                "BrokerFacade", TracingBroker(backend.broker, state.tracer, settings.trace.topic, ids)
            )
        state.protocols = build_protocols(state)
        state.protocols.mqtt.gateway.tracer.sink = state.tracer
        state.metrics.watch_store(lambda: backend.store)
        state.acl_stamp = acl_stamp
        await _serve_state(
            settings,
            ServerHandle(address=bound, state=state, store=backend.store),
            listener,
            ssl_context,
            install_signal_handlers,
            freeze_heap,
            task_status,
        )


async def _serve_state(
    settings: Settings,
    handle: ServerHandle,
    listener: trio.SocketListener,
    ssl_context: ssl.SSLContext | None,
    install_signal_handlers: bool,
    freeze_heap: bool,
    task_status: trio.TaskStatus[ServerHandle],
) -> None:
    state, bound = handle.state, handle.address
    acceptor = Acceptor(listener)
    if freeze_heap:
        freeze_startup_heap()
    _log.info(
        "proxy.started",
        listen=format_addr(bound),
        advertised=format_addr(state.advertised),
        pid=os.getpid(),
        version=__version__,
        backend=state.backend_name,
        data_dir=settings.store.data_dir if state.backend_name == "embedded" else None,
        namesrv=settings.backend.namesrv if settings.backend.cluster and not settings.routed else None,
        tls=ssl_context is not None,
    )
    _log.info("proxy.config", config=settings.as_dict())
    async with trio.open_nursery() as root:
        if install_signal_handlers:
            root.start_soon(_watch_signals, handle, (signal.SIGINT, signal.SIGTERM))
        if isinstance(state.tracer, TraceDispatcher):
            await root.start(state.tracer.run)
        if settings.acl.file:
            await root.start(watch_acl_file, settings.acl, state.acl, state.acl_stamp)
        if settings.metrics.lag_log_interval_s > 0 and state.broker is not None:
            refresher = state.metrics.lag_refresher(settings.metrics)
            root.start_soon(log_lag_readings, refresher, state.broker, settings.metrics.lag_log_interval_s)
        assert state.protocols is not None
        for service in state.protocols:
            await root.start(service.run)
        async with trio.open_nursery() as connections:
            async with trio.open_nursery() as accepting:
                accepting.start_soon(acceptor.run, connections, handle_connection, state, ssl_context)
                state.ready = True
                task_status.started(handle)
                await handle._stop.wait()
                state.ready = False
                _log.info("proxy.stopping", reason=handle.reason, open_connections=state.open_connections)
                state.draining.set()
                started = trio.current_time()
                await _drain(state, settings, handle._hurry)
                accepting.cancel_scope.cancel()
            await acceptor.aclose()
            _log.info(
                "proxy.drained",
                open_connections=state.open_connections,
                duration_ms=round((trio.current_time() - started) * 1000, 3),
            )
            connections.cancel_scope.cancel()
        root.cancel_scope.cancel()
    _log.info(
        "proxy.stopped",
        connections_total=state.connections_total,
        uptime_s=round(time.monotonic() - state.started_monotonic, 3),
    )


def freeze_startup_heap() -> int:
    """Collect once, then move every object the process tracks now (modules, settings, the store's and
    protocols' long-lived state: ~53,000 objects) to the collector's permanent generation; returns how
    many. A full collection then traverses only what was allocated after start-up: on the started
    heap it cost ~24 ms of CPU, a stall of every connection, and after the freeze ~0.01 ms (measured
    in round 4 of docs/performance.md). Objects frozen are still freed by reference counting; only a
    reference cycle among them would outlive its use."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
