"""
mqproxy.addresses
~~~~~~~~~~~~~~~~~

The address clients are told to connect to (``[server] advertised_address``), checked strictly.

Contract of :func:`parse_advertised`: ``HOST:PORT`` where HOST is an IPv4 literal, an IPv6 literal in
brackets (``[2001:db8::1]:9876``) or a DNS host name (RFC 1123 labels: letters, digits and ``-``, no
label starting or ending with ``-``, at most 63 characters a label and 253 in all); PORT is 1..65535.
An unspecified address (``0.0.0.0``, ``[::]``) is refused: no client can connect to it. Anything else
raises :class:`~mqproxy.settings.SettingsError` naming the setting. Pure; no name resolution.

Contract of :func:`id_address`: what can only carry an IP (the store host in message records, offset
message ids) gets the advertised address with its host resolved once at start-up: an IP literal as is, a
host name as its first address (IPv4 preferred), or 127.0.0.1 when it does not resolve within
``timeout_s`` (``proxy.advertised_unresolved`` is logged). Routes keep the name.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import structlog
import trio

from mqproxy.settings import SettingsError

__all__ = ["ADVERTISED_KEY", "format_hostport", "id_address", "parse_advertised"]

_log = structlog.get_logger("mqproxy.server")
#: Where a host name that does not resolve points message ids (as the remoting context's own fallback).
UNRESOLVED_ID_HOST: Final = "127.0.0.1"
Resolver = Callable[[str], Awaitable[Sequence[Any]]]

ADVERTISED_KEY: Final = "server.advertised_address"
_LABEL: Final = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_MAX_HOSTNAME: Final = 253


def _hostname_ok(host: str) -> bool:
    name = host[:-1] if host.endswith(".") else host
    if not name or len(name) > _MAX_HOSTNAME:
        return False
    labels = name.split(".")
    if labels[-1].isdigit():  # 1.2.3 or 999.1.1.1: a malformed IP, not a name
        return False
    return all(_LABEL.fullmatch(label) for label in labels)


def parse_advertised(value: str, key: str = ADVERTISED_KEY) -> tuple[str, int]:
    """``(host, port)`` of an advertised ``HOST:PORT`` (IPv6 host without its brackets); raise
    :class:`SettingsError` naming ``key`` when it is malformed."""
    text = value.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise SettingsError(f"{key}: expected [IPV6]:PORT, got {value!r}")
        port_text = rest[1:]
        try:
            ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.IPv6Address(host)
        except ValueError:
            raise SettingsError(f"{key}: {host!r} is not an IPv6 address") from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise SettingsError(f"{key}: expected HOST:PORT, got {value!r}")
        if ":" in host:
            raise SettingsError(f"{key}: an IPv6 address goes in brackets ([{host}]:PORT), got {value!r}")
        try:
            ip = ipaddress.IPv4Address(host)
        except ValueError:
            if not _hostname_ok(host):
                raise SettingsError(f"{key}: {host!r} is neither an IP address nor a host name") from None
            ip = ipaddress.IPv4Address("127.0.0.1")  # a name: nothing more to check
    if ip.is_unspecified:
        raise SettingsError(f"{key}: {host} is the unspecified address; advertise one clients can reach")
    if not port_text.isdigit():
        raise SettingsError(f"{key}: port must be an integer, got {port_text!r}")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise SettingsError(f"{key}: port {port} out of range 1..65535")
    return host, port


def format_hostport(address: tuple[str, int]) -> str:
    """``host:port``, an IPv6 host in brackets."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _getaddrinfo(host: str) -> Sequence[Any]:
    return await trio.socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)


def _first_ip(infos: Sequence[Any]) -> str | None:
    ips = [str(info[4][0]) for info in infos]
    v4 = [ip for ip in ips if ":" not in ip]
    preferred = v4 or ips
    return preferred[0] if preferred else None


async def id_address(
    advertised: tuple[str, int], *, timeout_s: float = 5.0, resolve: Resolver = _getaddrinfo
) -> tuple[str, int]:
    """``advertised`` with an IP for its host (see the module contract)."""
    host, port = advertised
    try:
        ipaddress.ip_address(host)
        return advertised
    except ValueError:
        pass
    detail = "no address"
    with trio.move_on_after(timeout_s) as scope:
        try:
            ip = _first_ip(await resolve(host))
        except OSError as exc:
            ip, detail = None, str(exc)
        if ip is not None:
            return ip.split("%", 1)[0], port
    if scope.cancelled_caught:
        detail = f"no answer within {timeout_s} s"
    _log.warning("proxy.advertised_unresolved", advertised=format_hostport(advertised), detail=detail)
    return UNRESOLVED_ID_HOST, port
