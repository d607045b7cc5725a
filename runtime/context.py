"""
mqproxy.runtime.context
~~~~~~~~~~~~~~~~~~~~~~~

:class:`ConnectionContext`: what a protocol handler knows about its connection. The server core fills it
in; handlers bump ``requests`` through :meth:`ConnectionContext.request_event` and set ``error`` /
``detail`` for the ``conn.closed`` event.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
import trio

from mqproxy.acl.holder import AclHolder

__all__ = ["ConnectionContext", "RequestRecorder"]


class RequestRecorder(Protocol):
    """Counts and logs one handled request (metrics series and the sampled ``request`` event)."""

    def record(self, protocol: str | None, log: Any, fields: dict[str, Any]) -> None: ...


class _NoRecorder:
    def record(self, protocol: str | None, log: Any, fields: dict[str, Any]) -> None:
        return None


@dataclass(eq=False, slots=True)  # one per connection: no attribute dict
class ConnectionContext:
    """One accepted connection as its protocol handler sees it.

    ``draining`` is set when the server stops: handlers finish what is in flight and close. ``acl`` is the
    server's one :class:`~mqproxy.acl.holder.AclHolder` (``acl.rules`` is None when no ``[acl] file`` is
    configured: nothing is checked).
    """

    conn_id: str
    peer: tuple[str, int]
    local: tuple[str, int]
    draining: trio.Event = field(default_factory=trio.Event)
    recorder: RequestRecorder = field(default_factory=_NoRecorder)
    acl: AclHolder = field(default_factory=lambda: AclHolder(clock=time.monotonic))
    log: Any = field(default_factory=lambda: structlog.get_logger("mqproxy.conn"))
    protocol: str | None = None
    #: The id the client gave itself (MQTT CONNECT, remoting heartbeat/request, gRPC ``x-mq-client-id``);
    #: shown by the console, never trusted.
    client_id: str | None = None
    tls: bool = False
    alpn: str | None = None
    proxied: bool = False
    requests: int = 0
    error: str | None = None
    detail: str | None = None

    def request_event(self, **fields: Any) -> None:
        """Count one request and report it (the ``request`` log event's fields)."""
        self.requests += 1
        self.recorder.record(self.protocol, self.log, fields)

    def request_events(self, events: list[dict[str, Any]]) -> None:
        """:meth:`request_event` for each of ``events`` (requests of one read handled together), in order:
        the same counts, metrics and log lines, with a recorder's ``record_run`` when it has one (one
        look-up of each series, the lines rendered together)."""
        self.requests += len(events)
        record_run = getattr(self.recorder, "record_run", None)
        if record_run is not None:
            record_run(self.protocol, self.log, events)
            return
        for fields in events:
            self.recorder.record(self.protocol, self.log, fields)

    def request_run(
        self, fields: dict[str, Any], statuses: list[str], outcomes: list[str], topics: list[str | None]
    ) -> None:
        """Count and report ``len(statuses)`` requests of one read that share ``fields`` (op, code,
        latency_ms, client_id) and differ only in status, outcome and topic (the i-th of each list, all
        three the same length, at least one). A recorder with ``record_batch`` reports them as one
        ``request.run`` event (a run of one as a plain ``request``, see the event schema); otherwise one
        :meth:`request_event` each, in order."""
        self.requests += len(statuses)
        record_batch = getattr(self.recorder, "record_batch", None)
        if record_batch is not None:
            record_batch(self.protocol, self.log, fields, statuses, outcomes, topics)
            return
        for status, outcome, topic in zip(statuses, outcomes, topics, strict=True):
            self.recorder.record(
                self.protocol, self.log, {**fields, "status": status, "outcome": outcome, "topic": topic}
            )
