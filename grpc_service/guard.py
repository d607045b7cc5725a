"""
mqproxy.grpc_service.guard
~~~~~~~~~~~~~~~~~~~~~~~~~~

:class:`GrpcGuard`: the ACL 1.0 account file applied to every gRPC call (the decisions are
:mod:`.acl`'s; this is the trio side). The rules, the throttle and the refusal reporter are the
connection's :class:`~mqproxy.acl.holder.AclHolder` (``Call.acl``, the server's one holder); while it has
no rules (no ``[acl] file``) every call passes untouched.

* Unary and server-streaming calls: :meth:`GrpcGuard.admit` raises :class:`~.errors.ApiError` with
  UNAUTHORIZED (40100) or FORBIDDEN (40300), which the service answers in the response's ``status``.
* Telemetry: :meth:`GrpcGuard.open_stream` authenticates when the stream opens and ends it with
  grpc-status UNAUTHENTICATED (16) on failure; each ``settings`` command is then checked by the callback it
  returns, which ends the stream with PERMISSION_DENIED (7). RocketMQ's proxy instead answers a refused
  command with a ``TelemetryCommand{status}`` and keeps the stream; both official clients then wait for
  settings that never come (the Go 5.1.4 client's ``Start`` never returns, the Java 5.2.0 client's send is
  cancelled after about 8 s), whereas an ended stream makes them fail at once with the reason.
* Failed authentication is throttled per source address (``AclHolder.throttle``): while the address backs
  off, its calls are refused UNAUTHORIZED unseen (reason ``throttled``, counted, not logged), as remoting
  requests are; a globally white address is never throttled.
* Every refusal is reported once through ``AclHolder.denied`` (the ``auth.denied`` event and
  ``mqproxy_auth_denied_total{protocol="grpc"}``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mqproxy.codecs.grpc_framing import GrpcStatus
from mqproxy.grpc_service.acl import Denial, Identity, authenticate, authorize, needs_of, settings_needs
from mqproxy.grpc_service.call import Call
from mqproxy.grpc_service.errors import ApiError, RpcError

__all__ = ["GrpcGuard", "SettingsCheck", "peer_text"]

PROTOCOL = "grpc"

#: Checks one Telemetry ``settings`` command (raises :class:`~.errors.RpcError` if refused).
SettingsCheck = Callable[[Any], None]


def peer_text(peer: tuple[str, int]) -> str:
    """``host:port`` (an IPv6 host bracketed), as log events write addresses."""
    host, port = peer[0], peer[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class GrpcGuard:
    """ACL checks of gRPC calls (see the module docstring)."""

    async def _identify(self, call: Call) -> Identity | Denial | None:
        """None when no rules are loaded; else who the caller is, or why not (reported, throttled)."""
        holder = call.acl
        rules = holder.rules
        if rules is None:
            return None
        ip = call.peer[0]
        wait = holder.throttle.delay_for(ip, holder.clock())
        if wait > 0 and not rules.globally_white(ip):
            why = f"too many failed authentications from {ip}; retry in {wait:.1f} s"
            throttled = Denial("throttled", why)
            self._report(call, throttled, emit=False)
            return throttled
        found = authenticate(rules, call.metadata, ip)
        if isinstance(found, Denial):
            holder.throttle.failed(ip, holder.clock())
            self._report(call, found)
        else:
            holder.throttle.succeeded(ip)
        return found

    @staticmethod
    def _report(call: Call, denial: Denial, *, emit: bool = True) -> None:
        call.acl.denied(
            call.log,
            protocol=PROTOCOL,
            peer=peer_text(call.peer),
            access_key=denial.access_key,
            reason=denial.reason,
            detail=f"{call.method}: {denial.message}",
            emit=emit,
        )

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
            """Vets one ``settings`` command against the rules in force now (a reload applies)."""
            current, rules, access_key = identity, call.acl.rules, identity.access_key
            if identity.account is not None and rules is not None and access_key is not None:
                account = rules.account(access_key)
                if account is None:
                    gone = Denial("unknown_access_key", f"No acl config for {access_key}", access_key)
                    self._report(call, gone)
                    raise RpcError(GrpcStatus.UNAUTHENTICATED, gone.message)
                current = Identity(access_key, account)
            denial = authorize(current, settings_needs(settings))
            if denial is not None:
                self._report(call, denial)
                raise RpcError(GrpcStatus.PERMISSION_DENIED, denial.message)

        return check
