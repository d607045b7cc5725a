"""
mqproxy.grpc_service.guard
~~~~~~~~~~~~~~~~~~~~~~~~~~

:class:`GrpcGuard`: the ACL 1.0 account file applied to every gRPC call (the decisions are
:mod:`.acl`'s; this is the trio side). While the :class:`~mqproxy.acl.holder.AclHolder` has no rules
(no ``[acl] file``) every call passes untouched.

* Unary and server-streaming calls: :meth:`GrpcGuard.admit` raises :class:`~.errors.ApiError` with
  UNAUTHORIZED (40100) or FORBIDDEN (40300), which the service answers in the response's ``status``.
* Telemetry: :meth:`GrpcGuard.open_stream` authenticates when the stream opens and ends it with
  grpc-status UNAUTHENTICATED (16) on failure; each ``settings`` command is then checked by the callback it
  returns, which ends the stream with PERMISSION_DENIED (7).
* Failed authentication is throttled per source address (:class:`~mqproxy.acl.throttle.AuthThrottle`):
  the next call from that address waits out the back-off (never past its deadline) before its
  credentials are looked at.
* Every refusal is reported once to ``on_denied(protocol="grpc", peer, access_key, reason)`` (the
  ``auth.denied`` event and ``mqproxy_auth_denied_total``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import trio

from mqproxy.acl.holder import AclHolder
from mqproxy.acl.throttle import AuthThrottle
from mqproxy.codecs.grpc_framing import GrpcStatus
from mqproxy.grpc_service.acl import Denial, Identity, authenticate, authorize, needs_of, settings_needs
from mqproxy.grpc_service.call import DEADLINE_MARGIN_S, Call
from mqproxy.grpc_service.errors import ApiError, RpcError

__all__ = ["DenialSink", "GrpcGuard", "SettingsCheck"]

PROTOCOL = "grpc"

#: Checks one Telemetry ``settings`` command (raises :class:`~.errors.RpcError` if refused).
SettingsCheck = Callable[[Any], None]


class DenialSink(Protocol):
    """Reports one refused request (event + metric)."""

    def __call__(
        self, *, protocol: str, peer: tuple[str, int], access_key: str | None, reason: str
    ) -> None: ...


def _no_report(*, protocol: str, peer: tuple[str, int], access_key: str | None, reason: str) -> None:
    return None


class GrpcGuard:
    """ACL checks of the calls of one server (see the module docstring)."""

    def __init__(
        self,
        holder: AclHolder | None = None,
        throttle: AuthThrottle | None = None,
        on_denied: DenialSink = _no_report,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.holder = holder if holder is not None else AclHolder()
        self.throttle = throttle if throttle is not None else AuthThrottle()
        self._on_denied = on_denied
        self._clock = clock

    async def _identify(self, call: Call) -> Identity | Denial | None:
        """None when no rules are loaded; else who the caller is, or why not (reported, throttled)."""
        rules = self.holder.rules
        if rules is None:
            return None
        ip = call.peer[0]
        delay = self.throttle.delay_for(ip, self._clock())
        if delay > 0:
            await trio.sleep(max(0.0, min(delay, call.remaining() - DEADLINE_MARGIN_S)))
        found = authenticate(rules, call.metadata, ip)
        if isinstance(found, Denial):
            self.throttle.failed(ip, self._clock())
            self._report(call, found)
        else:
            self.throttle.succeeded(ip)
        return found

    def _report(self, call: Call, denial: Denial) -> None:
        self._on_denied(protocol=PROTOCOL, peer=call.peer, access_key=denial.access_key, reason=denial.reason)

    async def admit(self, call: Call, request: Any) -> None:
        """Pass, or raise :class:`~.errors.ApiError` (UNAUTHORIZED / FORBIDDEN) for ``call``."""
        found = await self._identify(call)
        if found is None:
            return
        if isinstance(found, Identity):
            denial = authorize(found, needs_of(call.method, request))
            if denial is None:
                return
            self._report(call, denial)
            found = denial
        raise ApiError(found.code, found.message)

    async def open_stream(self, call: Call) -> SettingsCheck | None:
        """Authenticate a Telemetry stream; the returned check (None: no rules) vets its ``settings``."""
        found = await self._identify(call)
        if found is None:
            return None
        if isinstance(found, Denial):
            raise RpcError(GrpcStatus.UNAUTHENTICATED, found.message)
        identity = found

        def check(settings: Any) -> None:
            denial = authorize(identity, settings_needs(settings))
            if denial is not None:
                self._report(call, denial)
                raise RpcError(GrpcStatus.PERMISSION_DENIED, denial.message)

        return check
