"""
mqproxy.grpc_service.telemetry
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

Client settings (the ``Telemetry`` stream) and the registry of live gRPC clients.

:func:`settings_reply` merges a client's ``Settings`` with the server's values, the way the Apache proxy
does, filling everything the official clients need (spec §2-§4): ``backoff_policy`` always with an
``exponential_backoff`` (the Node client crashes otherwise), ``publishing.max_body_size`` never 0 (a 0
makes every later send fail), ``subscription.receive_batch_size`` / ``long_polling_timeout`` / ``fifo``,
``request_timeout`` and ``metric``. A consumer group with an administrator-set config
(:class:`~mqproxy.facade.types.GroupConfig`) decides ``fifo`` (``consumeMessageOrderly``: the Java client
never asks for it, it learns it here) and ``max_attempts`` (``retryMaxTimes + 1``), as the Apache proxy's
``GrpcClientSettingsManager`` does. Pure: no I/O.

:class:`ClientRegistry` remembers, per ``x-mq-client-id``, the last settings, the client type, the group
and the topics, and the sender of the client's open Telemetry stream (for server-initiated commands such
as transaction check-back). gRPC clients are NOT registered as remoting consumer-group members: they
consume with receipt handles, never by rebalanced queue ownership.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.facade.types import GroupConfig

__all__ = ["ClientRecord", "ClientRegistry", "ServerSettings", "SettingsError", "settings_reply"]

#: Sends one ``TelemetryCommand`` to a client on its open Telemetry stream.
TelemetrySender = Callable[[object], Awaitable[None]]


class SettingsError(Exception):
    """Settings that cannot be accepted (answered with gRPC INVALID_ARGUMENT, like the Apache proxy)."""


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """The server-side values merged into every settings reply."""

    max_body_bytes: int = 4 * 1024 * 1024
    producer_max_attempts: int = 3
    #: first delivery + the broker's redeliveries (``max_reconsume_times``, 16 by default)
    consumer_max_attempts: int = 16 + 1
    receive_batch_size: int = 32
    long_polling_timeout_s: float = 20.0
    request_timeout_s: float = 3.0


def _duration(seconds: float) -> object:
    whole = int(seconds)
    return pb.Duration(seconds=whole, nanos=round((seconds - whole) * 1e9))


def settings_reply(client: object, server: ServerSettings, group: GroupConfig | None = None) -> object:
    """The ``Settings`` to send back for the client's ``Settings`` (``group``: the config of a consumer's
    group, if an administrator set one); raises :class:`SettingsError`."""
    reply = pb.Settings()
    reply.CopyFrom(client)
    which = client.WhichOneof("pub_sub")  # type: ignore[attr-defined]
    if which is None:
        raise SettingsError("settings carry neither publishing nor subscription")
    if not reply.HasField("request_timeout") or reply.request_timeout.ToMilliseconds() <= 0:
        reply.request_timeout.CopyFrom(_duration(server.request_timeout_s))
    policy = pb.RetryPolicy()
    if which == "publishing":
        policy.max_attempts = server.producer_max_attempts
        policy.exponential_backoff.initial.CopyFrom(_duration(0.01))
        policy.exponential_backoff.max.CopyFrom(_duration(1.0))
        policy.exponential_backoff.multiplier = 2.0
        reply.publishing.max_body_size = server.max_body_bytes
    else:
        sub = reply.subscription
        policy.max_attempts = server.consumer_max_attempts if group is None else group.retry_max_times + 1
        policy.exponential_backoff.initial.CopyFrom(_duration(1.0))
        policy.exponential_backoff.max.CopyFrom(_duration(60.0))
        policy.exponential_backoff.multiplier = 2.0
        if group is not None:
            sub.fifo = group.consume_orderly
        elif not sub.HasField("fifo"):
            sub.fifo = False
        if not sub.HasField("receive_batch_size") or sub.receive_batch_size <= 0:
            sub.receive_batch_size = server.receive_batch_size
        if not sub.HasField("long_polling_timeout") or sub.long_polling_timeout.ToMilliseconds() <= 0:
            sub.long_polling_timeout.CopyFrom(_duration(server.long_polling_timeout_s))
    reply.backoff_policy.CopyFrom(policy)
    reply.metric.on = False
    return reply


@dataclass(slots=True)
class ClientRecord:
    """What the proxy knows about one client id."""

    client_id: str
    client_type: int = 0
    group: str = ""
    topics: frozenset[str] = frozenset()
    settings: object | None = None
    telemetry: TelemetrySender | None = None
    last_seen: float = field(default_factory=time.monotonic)


class ClientRegistry:
    """Live gRPC clients by client id (process-wide, shared by all connections).

    Bounded: past ``max_clients`` records, ones without an open Telemetry stream that were not seen for
    ``stale_s`` are dropped (clients that vanished without NotifyClientTermination).
    """

    def __init__(self, max_clients: int = 10_000, stale_s: float = 600.0) -> None:
        self._clients: dict[str, ClientRecord] = {}
        self.max_clients = max_clients
        self.stale_s = stale_s

    def get(self, client_id: str) -> ClientRecord | None:
        return self._clients.get(client_id)

    def touch(self, client_id: str) -> ClientRecord:
        record = self._clients.get(client_id)
        if record is None:
            if len(self._clients) >= self.max_clients:
                self._evict_stale()
            record = self._clients[client_id] = ClientRecord(client_id)
        record.last_seen = time.monotonic()
        return record

    def _evict_stale(self) -> None:
        cutoff = time.monotonic() - self.stale_s
        for client_id in [
            c for c, r in self._clients.items() if r.telemetry is None and r.last_seen < cutoff
        ]:
            del self._clients[client_id]

    def update_settings(self, client_id: str, settings: object) -> ClientRecord:
        """Record a client's settings (type, group, topics)."""
        record = self.touch(client_id)
        record.settings = settings
        if settings.HasField("client_type"):  # type: ignore[attr-defined]
            record.client_type = int(settings.client_type)  # type: ignore[attr-defined]
        which = settings.WhichOneof("pub_sub")  # type: ignore[attr-defined]
        if which == "publishing":
            record.topics = frozenset(r.name for r in settings.publishing.topics)  # type: ignore[attr-defined]
        elif which == "subscription":
            sub = settings.subscription  # type: ignore[attr-defined]
            record.group = sub.group.name
            record.topics = frozenset(e.topic.name for e in sub.subscriptions)
        return record

    def remove(self, client_id: str) -> None:
        self._clients.pop(client_id, None)

    def detach(self, client_id: str, sender: TelemetrySender) -> None:
        """Forget ``sender`` as the client's Telemetry stream (if it still is)."""
        record = self._clients.get(client_id)
        if record is not None and record.telemetry is sender:
            record.telemetry = None

    def producers_of(self, topic: str) -> list[ClientRecord]:
        """Producers with an open Telemetry stream that publish to ``topic``, most recently seen first."""
        found = [
            r
            for r in self._clients.values()
            if r.telemetry is not None and r.client_type == pb.ClientType.PRODUCER and topic in r.topics
        ]
        return sorted(found, key=lambda r: r.last_seen, reverse=True)

    def __len__(self) -> int:
        return len(self._clients)
