"""
mqproxy.connector.telemetry
~~~~~~~~~~~~~~~~~~~~~~~~~~~

The connector's Prometheus metrics and its ``connector.*`` events, and the small HTTP listener that serves
``GET /metrics``.

Contracts:

* One :class:`ConnectorMetrics` per process, with its own registry; every series is labelled by ``rule``.
* :meth:`ConnectorMetrics.batch` / :meth:`~ConnectorMetrics.dead_letter` / :meth:`~ConnectorMetrics.error` /
  :meth:`~ConnectorMetrics.checkpoint`
  update the metrics and log the event of the same name with exactly the fields of the connector event
  schema (README, log events).
* :func:`serve_metrics` listens on ``host:port`` (port 0: any), reports the bound address through
  ``task_status.started`` and answers ``/metrics`` (Prometheus text) and ``/healthz``; anything else 404.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import h11
import structlog
import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

__all__ = ["BatchReport", "Checkpoint", "ConnectorMetrics", "serve_metrics"]

log = structlog.get_logger("mqproxy.connector")
DELAY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


@dataclass(frozen=True, slots=True)
class BatchReport:
    """One acknowledged batch, for ``connector.batch``."""

    rule: str
    source: str
    target: str
    topic: str
    target_topic: str
    source_queue: str
    target_queue: str
    messages: int
    bytes: int
    first_offset: int
    last_offset: int
    store_ms: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One translated consumer offset written on the target, for ``connector.checkpoint``."""

    rule: str
    group: str
    topic: str
    source_queue: str
    source_offset: int
    target_topic: str
    target_queue: str
    target_offset: int


class ConnectorMetrics:
    def __init__(self, connector: str) -> None:
        self.connector = connector
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.messages = Counter("mqproxy_connector_messages", "Messages copied", ["rule"], registry=r)
        self.bytes = Counter("mqproxy_connector_bytes", "Body bytes copied", ["rule"], registry=r)
        self.lag = Gauge(
            "mqproxy_connector_lag_messages", "Messages behind in owned source queues", ["rule"], registry=r
        )
        self.delay = Histogram(
            "mqproxy_connector_replication_delay_seconds",
            "Source store time to target acknowledgement",
            ["rule"],
            buckets=DELAY_BUCKETS_S,
            registry=r,
        )
        self.last_copied = Gauge(
            "mqproxy_connector_last_copied_timestamp_seconds",
            "When the last batch was acknowledged",
            ["rule"],
            registry=r,
        )
        self.errors = Counter(
            "mqproxy_connector_errors", "Failed operations (retried)", ["rule", "op"], registry=r
        )
        self.dead_letters = Counter(
            "mqproxy_connector_dead_letters", "Messages the target refused for good", ["rule"], registry=r
        )
        self.owned = Gauge(
            "mqproxy_connector_owned_queues", "Source queues this process owns", ["rule"], registry=r
        )
        self.checkpoints = Counter(
            "mqproxy_connector_checkpoints",
            "Consumer offsets translated and written on the target",
            ["rule"],
            registry=r,
        )
        self._lags: dict[tuple[str, str, str], int] = {}

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def batch(self, b: BatchReport) -> None:
        now_ms = int(time.time() * 1000)
        delays = [max(0, now_ms - s) for s in b.store_ms] or [0]
        self.messages.labels(b.rule).inc(b.messages)
        self.bytes.labels(b.rule).inc(b.bytes)
        for d in delays:
            self.delay.labels(b.rule).observe(d / 1000)
        self.last_copied.labels(b.rule).set(now_ms / 1000)
        log.info(
            "connector.batch",
            connector=self.connector,
            rule=b.rule,
            source=b.source,
            target=b.target,
            topic=b.topic,
            target_topic=b.target_topic,
            source_queue=b.source_queue,
            target_queue=b.target_queue,
            messages=b.messages,
            bytes=b.bytes,
            first_offset=b.first_offset,
            last_offset=b.last_offset,
            delay_ms_max=max(delays),
            delay_ms_min=min(delays),
        )

    def set_lag(self, rule: str, topic: str, source_queue: str, lag: int, last_copied_ms: int | None) -> None:
        self._lags[(rule, topic, source_queue)] = lag
        self.lag.labels(rule).set(sum(v for k, v in self._lags.items() if k[0] == rule))
        log.info(
            "connector.lag",
            connector=self.connector,
            rule=rule,
            topic=topic,
            source_queue=source_queue,
            lag=lag,
            last_copied_ms=last_copied_ms,
        )

    def drop_lag(self, rule: str, topic: str, source_queue: str) -> None:
        self._lags.pop((rule, topic, source_queue), None)
        self.lag.labels(rule).set(sum(v for k, v in self._lags.items() if k[0] == rule))

    def dead_letter(
        self, rule: str, topic: str, source_queue: str, offset: int, msg_id: str, reason: str, dlq_topic: str
    ) -> None:
        self.dead_letters.labels(rule).inc()
        log.warning(
            "connector.dead_letter",
            connector=self.connector,
            rule=rule,
            topic=topic,
            source_queue=source_queue,
            offset=offset,
            msg_id=msg_id,
            reason=reason,
            dlq_topic=dlq_topic,
        )

    def error(self, rule: str | None, cluster: str, op: str, detail: str, retry_in_s: float) -> None:
        self.errors.labels(rule or "", op).inc()
        log.warning(
            "connector.error",
            connector=self.connector,
            rule=rule,
            cluster=cluster,
            op=op,
            detail=detail[:500],
            retry_in_s=round(retry_in_s, 3),
        )

    def checkpoint(self, c: Checkpoint) -> None:
        self.checkpoints.labels(c.rule).inc()
        log.info(
            "connector.checkpoint",
            connector=self.connector,
            rule=c.rule,
            group=c.group,
            topic=c.topic,
            source_queue=c.source_queue,
            source_offset=c.source_offset,
            target_topic=c.target_topic,
            target_queue=c.target_queue,
            target_offset=c.target_offset,
        )

    def queues(self, rule: str, owned: int, acquired: list[str], released: list[str]) -> None:
        self.owned.labels(rule).set(owned)
        log.info(
            "connector.queues",
            connector=self.connector,
            rule=rule,
            owned=owned,
            acquired=acquired,
            released=released,
        )


async def _serve_one(stream: trio.abc.Stream, metrics: ConnectorMetrics) -> None:
    conn = h11.Connection(h11.SERVER)
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(16384)
                if not data:
                    return
                conn.receive_data(bytes(data))
                continue
            if not isinstance(event, h11.Request):
                return
            path = event.target.split(b"?", 1)[0]
            if path == b"/metrics":
                status, ctype, body = 200, CONTENT_TYPE_LATEST, metrics.render()
            elif path == b"/healthz":
                status, ctype, body = 200, "application/json", b'{"status":"ok"}'
            else:
                status, ctype, body = 404, "text/plain; charset=utf-8", b"not found\n"
            headers = [("content-type", ctype), ("content-length", str(len(body))), ("connection", "close")]
            await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)) or b"")
            await stream.send_all(conn.send(h11.Data(data=body)) or b"")
            await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
            return
    except (h11.RemoteProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
        return
    finally:
        await trio.aclose_forcefully(stream)


async def serve_metrics(
    metrics: ConnectorMetrics,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    listeners = await trio.open_tcp_listeners(port, host=host)
    sockname = listeners[0].socket.getsockname()
    async with trio.open_nursery() as nursery:
        task_status.started(f"{sockname[0]}:{sockname[1]}")

        async def handler(stream: trio.SocketStream) -> None:
            with trio.move_on_after(10):
                await _serve_one(stream, metrics)

        await trio.serve_listeners(handler, listeners, handler_nursery=nursery)
