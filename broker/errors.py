"""The one exception tree of the backend layer. Each error names the condition, not the wire code:
protocol handlers map these to their own status codes (remoting response code, MQTT reason code,
gRPC v2 ``Code``)."""

from __future__ import annotations


class BackendError(Exception):
    """Base of every error a backend raises on purpose."""


class TopicNotFound(BackendError):
    """The topic does not exist and auto-creation is off or not allowed for it."""


class IllegalTopic(BackendError):
    """The topic name breaks the naming rules (characters, length, reserved names)."""


class QueueNotFound(BackendError):
    """The queue id is outside the topic's queues."""


class MessageTooLarge(BackendError):
    """Body or properties exceed the configured maximum."""


class StoreUnavailable(BackendError):
    """The store cannot accept writes right now (closed, disk full, shutting down)."""
