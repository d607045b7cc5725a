"""Per-process server state: settings, the broker facade, readiness, drain signal, connection accounting,
metrics; and the request recorder every connection's context reports to."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import trio

from mqproxy.acl.holder import AclHolder
from mqproxy.acl.loader import FileStamp
from mqproxy.codecs.rocketmq_trace import NULL_SINK, TraceSink
from mqproxy.console_view import TopicSection
from mqproxy.limits import ConnectionLimiter
from mqproxy.log import log_info, log_infos
from mqproxy.metrics import Metrics, observe_many
from mqproxy.rejections import RejectionRing

if TYPE_CHECKING:
    from mqproxy.facade.api import BrokerFacade
    from mqproxy.routes import Protocols
    from mqproxy.runtime.context import ConnectionContext
    from mqproxy.settings import Settings


class ByteCounts(Protocol):
    """What the console reads of a connection's wire stream (a ``CountingStream``)."""

    @property
    def bytes_in(self) -> int: ...
    @property
    def bytes_out(self) -> int: ...


@dataclass(eq=False, slots=True)
class LiveConnection:
    """One open connection as the console lists it (registered from accept to close). ``counted_in`` /
    ``counted_out``: the part of its byte counts already added to ``mqproxy_bytes_*_total``
    (:func:`mqproxy.metrics.count_bytes`, at each scrape and at close)."""

    ctx: ConnectionContext
    wire: ByteCounts
    started_monotonic: float
    counted_in: int = 0
    counted_out: int = 0


def always_healthy() -> str | None:
    """The health of a backend that lives in this process: it can always serve (None)."""
    return None


@dataclass(eq=False)
class ServerState:
    """Process-wide state: settings, the broker facade and its health, readiness, drain signal and
    connection accounting."""

    settings: Settings
    backend_name: str
    advertised: tuple[str, int] = ("127.0.0.1", 0)
    #: The advertised host as an IP, for what cannot carry a name (message ids, records' store host).
    id_host: str = ""
    ready: bool = False
    draining: trio.Event = field(default_factory=trio.Event)
    open_connections: int = 0
    connections_total: int = 0
    all_closed: trio.Event = field(default_factory=trio.Event)
    started_monotonic: float = field(default_factory=time.monotonic)
    metrics: Metrics = field(default_factory=lambda: Metrics())
    #: The broker facade every protocol calls (set once the backend is open).
    broker: BrokerFacade | None = None
    #: The protocol services connections are routed to (set once the broker is open).
    protocols: Protocols | None = None
    #: None while the backend can serve, else a one-line reason (a cluster it cannot reach); ``/healthz``
    #: answers 503 with it. Called per health check, so it must be cheap and must not block.
    backend_health: Callable[[], str | None] = always_healthy
    #: The live access rules every protocol checks (``rules`` None: no ``[acl] file``); the same object is
    #: every connection's ``ConnectionContext.acl``. Refusals are counted in ``mqproxy_auth_denied_total``.
    acl: AclHolder = field(default_factory=lambda: AclHolder(clock=time.monotonic))
    #: The ``[acl] file``'s stamp when the rules in force were read (the reload watcher compares against it).
    acl_stamp: FileStamp | None = None
    #: Open connections by ``conn_id`` (the console's list).
    live: dict[str, LiveConnection] = field(default_factory=dict)
    #: The last refusals (``auth.denied`` as logged, ``conn.rejected``) for the console.
    rejections: RejectionRing = field(default_factory=RejectionRing)
    #: Server-sent-event streams of the console now open (bounded by ``mqproxy.console.MAX_STREAMS``).
    console_streams: int = 0
    #: The console's last topic listing and when it was taken (trio time).
    console_topics: tuple[float, TopicSection] | None = None

    #: Where protocols emit message-trace records (:mod:`mqproxy.trace`; a no-op unless ``[trace] enabled``).
    tracer: TraceSink = NULL_SINK

    #: Admitted connections in total and per source address (``server.max_connections*``).
    limiter: ConnectionLimiter = field(default_factory=ConnectionLimiter)

    def __post_init__(self) -> None:
        server = self.settings.server
        self.limiter.max_total = server.max_connections
        self.limiter.max_per_address = server.max_connections_per_address
        self.metrics.watch_mqtt(lambda: None if self.protocols is None else self.protocols.mqtt)
        self.acl.on_denied = self.metrics.count_auth_denied
        self.acl.on_refusal = self._record_refusal
        self.recorder = ServerRecorder(self)

    def _record_refusal(
        self, protocol: str, peer: str, access_key: str | None, reason: str, detail: str
    ) -> None:
        self.rejections.add(
            time.time(),
            "auth.denied",
            protocol=protocol,
            peer=peer,
            reason=reason,
            detail=detail,
            access_key=access_key,
        )

    def connection_opened(self) -> None:
        self.open_connections += 1
        self.connections_total += 1
        self.all_closed = trio.Event() if self.all_closed.is_set() else self.all_closed

    def connection_closed(self) -> None:
        self.open_connections -= 1
        if self.open_connections == 0:
            self.all_closed.set()


class ServerRecorder:
    """The :class:`~mqproxy.runtime.context.RequestRecorder` of a server: one count and latency
    observation per request in ``/metrics``, and the ``request`` event sampled by ``log.request_sample_rate``
    (written by :func:`~mqproxy.log.log_info`: the event carries the context variables, not values bound
    on ``log``)."""

    def __init__(self, state: ServerState) -> None:
        self._state = state

    def record(self, protocol: str | None, log: Any, fields: dict[str, Any]) -> None:
        op = str(fields.get("op", "?"))
        if op.startswith("UNKNOWN_"):
            op = "UNKNOWN"  # bounded label set: unknown codes share one series
        counter, histogram = self._state.metrics.request_series(
            protocol or "unknown", op, fields.get("outcome", "ok")
        )
        counter.inc()
        latency_ms = fields.get("latency_ms")
        if latency_ms is not None:
            histogram.observe(latency_ms / 1000)
        rate = self._state.settings.log.request_sample_rate
        if rate >= 1.0 or (rate > 0.0 and random.random() < rate):
            log_info(log, "request", {"protocol": protocol, **fields})

    def record_run(self, protocol: str | None, log: Any, events: list[dict[str, Any]]) -> None:
        """:meth:`record` for each of ``events`` in order (the same series counts, observations and
        sampled lines), each series looked up once per run of the same kind and the lines written
        together (:func:`~mqproxy.log.log_infos`)."""
        request_series = self._state.metrics.request_series
        label = protocol or "unknown"
        key: tuple[str, Any] | None = None
        counter: Any = None
        histogram: Any = None
        count = 0
        for fields in events:
            op = str(fields.get("op", "?"))
            if op.startswith("UNKNOWN_"):
                op = "UNKNOWN"
            this = (op, fields.get("outcome", "ok"))
            if this != key:
                if count:
                    counter.inc(count)
                key, count = this, 0
                counter, histogram = request_series(label, op, this[1])
            count += 1
            latency_ms = fields.get("latency_ms")
            if latency_ms is not None:
                histogram.observe(latency_ms / 1000)
        if count:
            counter.inc(count)
        rate = self._state.settings.log.request_sample_rate
        if rate >= 1.0:
            log_infos(log, "request", [{"protocol": protocol, **fields} for fields in events])
        elif rate > 0.0:
            sampled = [{"protocol": protocol, **f} for f in events if random.random() < rate]
            if sampled:
                log_infos(log, "request", sampled)

    def record_batch(
        self,
        protocol: str | None,
        log: Any,
        fields: dict[str, Any],
        statuses: list[str],
        outcomes: list[str],
        topics: list[str | None],
    ) -> None:
        """What :meth:`record` does for each of the requests of
        :meth:`~mqproxy.runtime.context.ConnectionContext.request_run` (the same counts, observations and
        sampling), logged as one ``request.run`` event: the shared ``fields``, ``count`` and ``errors``
        (requests with outcome ``error``) and the per-request ``statuses``, ``outcomes`` and ``topics``
        arrays, in order. A run of one (or one sampled) is a plain ``request`` event."""
        op = str(fields.get("op", "?"))
        if op.startswith("UNKNOWN_"):
            op = "UNKNOWN"
        label = protocol or "unknown"
        n = len(statuses)
        errors = outcomes.count("error")
        if errors == 0 or errors == n:
            counter, histogram = self._state.metrics.request_series(label, op, outcomes[0])
            counter.inc(n)
        else:
            for outcome in set(outcomes):
                counter, histogram = self._state.metrics.request_series(label, op, outcome)
                counter.inc(outcomes.count(outcome))
        latency_ms = fields.get("latency_ms")
        if latency_ms is not None:
            observe_many(histogram, latency_ms / 1000, n)
        rate = self._state.settings.log.request_sample_rate
        if rate <= 0.0:
            return
        if rate < 1.0:
            kept = [i for i in range(n) if random.random() < rate]
            if not kept:
                return
            if len(kept) < n:
                statuses = [statuses[i] for i in kept]
                outcomes = [outcomes[i] for i in kept]
                topics = [topics[i] for i in kept]
                n = len(kept)
                errors = outcomes.count("error")
        if n == 1:
            line = {"protocol": protocol, **fields}
            line["status"], line["outcome"], line["topic"] = statuses[0], outcomes[0], topics[0]
            log_info(log, "request", line)
            return
        line = {"protocol": protocol, **fields}
        line["count"], line["errors"] = n, errors
        line["statuses"], line["outcomes"], line["topics"] = statuses, outcomes, topics
        log_info(log, "request.run", line)


def format_addr(addr: tuple[str, int] | Any) -> str:
    """``host:port`` (IPv6 hosts bracketed) for log fields."""
    if isinstance(addr, tuple) and len(addr) >= 2:
        host, port = addr[0], addr[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(addr)


async def receive_unless_draining(
    stream: trio.abc.ReceiveStream, max_bytes: int, server: ServerState, timeout_s: float
) -> bytes | bytearray | None:
    """Read once; None if ``timeout_s`` passes or the server starts draining first."""
    result: bytes | bytearray | None = None
    async with trio.open_nursery() as nursery:

        async def _stop_on_drain() -> None:
            await server.draining.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(_stop_on_drain)
        with trio.move_on_after(timeout_s):
            result = await stream.receive_some(max_bytes)
        nursery.cancel_scope.cancel()
    return result
