"""The value parsers settings share (``HOST:PORT``, name-server lists) and :class:`SettingsError`; pure,
imported by :mod:`mqproxy.settings` and re-exported there."""

from __future__ import annotations

__all__ = ["SettingsError", "parse_hostport", "parse_namesrv"]


class SettingsError(ValueError):
    """A configuration problem, reported at start-up with the offending key."""


def parse_hostport(value: str, key: str = "server.listen") -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` too); raise :class:`SettingsError` naming ``key``."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise SettingsError(f"{key}: expected HOST:PORT, got {value!r}")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise SettingsError(f"{key}: port must be an integer, got {port_text!r}") from None
    if not 0 <= port <= 65535:
        raise SettingsError(f"{key}: port {port} out of range 0..65535")
    return host, port


def parse_namesrv(value: str, key: str = "backend.namesrv") -> tuple[str, ...]:
    """Split ``host:port;host:port`` (blanks around entries and a trailing ``;`` allowed) into its entries;
    raise :class:`SettingsError` naming ``key`` if there is none or one is not ``HOST:PORT`` with a port
    in 1..65535."""
    entries = tuple(entry.strip() for entry in value.split(";") if entry.strip())
    if not entries:
        raise SettingsError(f'{key}: required when backend.kind = "rocketmq" (HOST:PORT;HOST:PORT)')
    for entry in entries:
        _, port = parse_hostport(entry, key)
        if port == 0:
            raise SettingsError(f"{key}: port 0 in {entry!r} (a name server has a fixed port)")
    return entries
