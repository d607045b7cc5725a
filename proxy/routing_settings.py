"""Validation of several backends: the ``[backends.NAME]`` tables and the ``[routing]`` rules.

Split from :mod:`mqproxy.settings`, which calls :func:`build_backends` and :func:`check_routing` while it
builds the settings; every problem is a :class:`~mqproxy.settings.SettingsError` naming the setting.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mqproxy.facade.routing_rules import RuleError, parse_rule
from mqproxy.settings import BackendSettings, Settings, SettingsError
from mqproxy.settings import _build_section as build_section

__all__ = ["build_backends", "check_routing"]

#: What a ``[backends.NAME]`` name may be (``default`` is ``[backend]``'s).
_BACKEND_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def build_backends(values: Mapping[str, Any], env_keys: set[str]) -> dict[str, BackendSettings]:
    """``[backends.NAME]`` tables; a name is ``[A-Za-z0-9_-]``, unique ignoring case, and not ``default``
    (that is ``[backend]``)."""
    out: dict[str, BackendSettings] = {}
    seen: dict[str, str] = {"default": "backend"}
    for name, table in values.items():
        key = f"backends.{name}"
        if not isinstance(table, Mapping):
            raise SettingsError(f"{key}: expected a [backends.{name}] table (kind = ..., namesrv = ...)")
        if not _BACKEND_NAME.fullmatch(name):
            raise SettingsError(f"{key}: a backend name is 1 to 64 of A-Z a-z 0-9 _ -")
        if name.lower() in seen:
            raise SettingsError(f"{key}: duplicate backend name (also {seen[name.lower()]})")
        seen[name.lower()] = key
        try:
            out[name] = build_section(key, BackendSettings, table, env_keys)
        except SettingsError as exc:
            raise SettingsError(str(exc).replace("backend.", f"{key}.")) from None
    return out


def check_routing(settings: Settings) -> None:
    """Every rule well formed and naming a known backend, the default known, each rule once."""
    known = {"default", *settings.backends}
    names = ", ".join(sorted(known))
    seen: dict[str, str] = {}
    for i, rule in enumerate(settings.routing.rules):
        key = f"routing.rules[{i}]"
        if set(rule) != {"match", "backend"}:
            wanted = 'match = "KIND:PATTERN" and backend = "NAME"'
            raise SettingsError(f"{key}: expected {wanted}, got {rule!r}")
        if rule["backend"] not in known:
            raise SettingsError(f"{key}.backend: unknown backend {rule['backend']!r} (known: {names})")
        try:
            parse_rule(rule["match"], rule["backend"])
        except RuleError as exc:
            raise SettingsError(f"{key}.match: {exc}") from None
        if rule["match"] in seen:
            raise SettingsError(f"{key}.match: duplicate of {seen[rule['match']]} ({rule['match']!r})")
        seen[rule["match"]] = key
    if settings.routing.default and settings.routing.default not in known:
        raise SettingsError(f"routing.default: unknown backend {settings.routing.default!r} (known: {names})")
