"""
mqproxy.grpc_service.settings
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

What the gRPC protocol takes from the server's configuration: :class:`GrpcSettings` (built once per server
by :meth:`GrpcSettings.from_config`) and its per-connection :class:`ConnectionLimits`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mqproxy.grpc_service.telemetry import ServerSettings

__all__ = ["ConnectionLimits", "GrpcSettings"]

#: Room a request needs beyond its message body (properties and envelope).
REQUEST_ENVELOPE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Per-connection limits: largest request message, concurrent calls (more are refused with
    REFUSED_STREAM), how long a connection without calls may stay silent, and how long a frame (or the
    client preface with its SETTINGS) may take to arrive whole once it has begun."""

    max_message_bytes: int = 16 * 1024 * 1024
    max_concurrent_streams: int = 1000
    idle_timeout_s: float = 120.0
    frame_timeout_s: float = 10.0


@dataclass(frozen=True, slots=True)
class GrpcSettings:
    """``advertised`` is the address routes name; ``auto_create_topics`` lets QueryRoute and SendMessage
    create a missing topic; ``server`` holds the values merged into client settings; ``limits`` the
    per-connection limits; ``settings_timeout_s`` how long a Telemetry stream may wait for its first
    settings."""

    advertised: tuple[str, int]
    auto_create_topics: bool = True
    server: ServerSettings = field(default_factory=ServerSettings)
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    settings_timeout_s: float = 30.0

    @classmethod
    def from_config(cls, config: Any, advertised: tuple[str, int]) -> GrpcSettings:
        """From the server's ``Settings`` (its ``store``, ``broker``, ``remoting`` and ``server``
        sections)."""
        max_body = config.store.max_message_bytes
        return cls(
            advertised=advertised,
            auto_create_topics=config.store.auto_create_topics,
            server=ServerSettings(
                max_body_bytes=max_body,
                consumer_max_attempts=config.broker.max_reconsume_times + 1,
                long_polling_timeout_s=min(20.0, config.remoting.long_poll_max_s) or 20.0,
            ),
            limits=ConnectionLimits(
                max_message_bytes=max_body + REQUEST_ENVELOPE_BYTES,
                max_concurrent_streams=config.server.grpc_max_concurrent_streams,
                idle_timeout_s=config.server.idle_timeout_s,
                frame_timeout_s=config.server.frame_timeout_s,
            ),
        )
