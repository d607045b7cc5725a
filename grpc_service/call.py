"""
mqproxy.grpc_service.call
~~~~~~~~~~~~~~~~~~~~~~~~~

What every RPC handler shares: :class:`Call` (one RPC as the service sees it: who, until when, and what the
request log reports), :data:`Send` (the response sink of a streaming call), the v2 ``Status`` builders and
the long-poll budget.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
import trio

from mqproxy.acl.holder import AclHolder
from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.grpc_service.errors import ApiError, code_for
from mqproxy.model.errors import BackendError

__all__ = [
    "MAX_BATCH",
    "Call",
    "Send",
    "error_status",
    "ok",
    "overall_status",
    "poll_budget",
    "status",
    "wall_ms",
]

#: Longest long poll served (seconds), whatever the client asks.
MAX_LONG_POLL_S = 30.0
#: A long poll ends this long before the call's deadline so the answer arrives in time.
DEADLINE_MARGIN_S = 0.2
#: Most messages one send, receive or pull handles.
MAX_BATCH = 32

#: Sends one response message on the call's stream (waits for flow control).
Send = Callable[[Any], Awaitable[None]]


@dataclass(slots=True)
class Call:
    """One RPC as the service sees it. ``group``/``topic``/``code`` are filled in for the request log;
    ``acl`` and ``log`` are the connection's (its access rules and its logger)."""

    method: str
    client_id: str
    peer: tuple[str, int]
    metadata: Mapping[str, str] = field(default_factory=dict)
    deadline: float = math.inf  # trio time
    group: str | None = None
    topic: str | None = None
    code: pb.Code | None = None
    drained: bool = False
    acl: AclHolder = field(default_factory=AclHolder)
    log: Any = field(default_factory=lambda: structlog.get_logger("mqproxy.conn"))
    _drain_scopes: set[trio.CancelScope] = field(default_factory=set)

    def remaining(self) -> float:
        return self.deadline - trio.current_time()

    @contextlib.contextmanager
    def until_drain(self) -> Iterator[trio.CancelScope]:
        """A cancel scope for a long poll: cancelled when the server drains (see :meth:`drain`)."""
        with trio.CancelScope() as scope:
            if self.drained:
                scope.cancel()
            self._drain_scopes.add(scope)
            try:
                yield scope
            finally:
                self._drain_scopes.discard(scope)

    def drain(self) -> None:
        """The server is draining: long polls of this call end now (the driver calls this)."""
        self.drained = True
        for scope in self._drain_scopes:
            scope.cancel()


def status(code: pb.Code, message: str = "") -> Any:
    """A v2 ``Status``; the message defaults to the code's name."""
    return pb.Status(code=code, message=message or code.name)


def ok() -> Any:
    return status(pb.Code.OK)


def error_status(exc: ApiError | BackendError) -> Any:
    """The ``Status`` answering an application or broker error."""
    if isinstance(exc, ApiError):
        return status(exc.code, exc.message)
    return status(code_for(exc), str(exc) or type(exc).__name__)


def overall_status(entries: Any) -> Any:
    """The status of a batch answer: its entries' status when they all share one code, else
    MULTIPLE_RESULTS."""
    if len({entry.status.code for entry in entries}) == 1:
        return entries[0].status
    return status(pb.Code.MULTIPLE_RESULTS)


def poll_budget(call: Call, requested: Any | None) -> float:
    """Seconds a long poll may wait: the client's ask (a ``Duration`` or None), capped at
    :data:`MAX_LONG_POLL_S`, and ending :data:`DEADLINE_MARGIN_S` before the call's deadline."""
    wait = MAX_LONG_POLL_S
    if requested is not None:
        wait = min(wait, max(requested.ToMilliseconds() / 1000, 0.0))
    return max(0.0, min(wait, call.remaining() - DEADLINE_MARGIN_S))


def wall_ms() -> int:
    """Wall-clock milliseconds (delivery timestamps are wall-clock)."""
    return time.time_ns() // 1_000_000
