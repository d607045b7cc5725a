"""
mqproxy.facade.routing_rules
~~~~~~~~~~~~~~~~~~~~~~~~~~~~

Topic -> backend rules for a proxy in front of several backends (sans-IO; no backend here).

A rule is ``kind:pattern`` and a backend name: ``exact:orders`` matches the topic ``orders`` only,
``prefix:iot/`` every topic starting ``iot/``, ``re:^audit-.*$`` every topic the regular expression
matches from its start (:func:`re.match`; anchor the end with ``$``). Rules are tried in order and the
first match wins; a topic no rule matches goes to the default backend, or is *unrouted* when there is none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["RouteRule", "RoutingTable", "RuleError", "parse_rule"]

_KINDS = ("exact", "prefix", "re")


class RuleError(ValueError):
    """A malformed rule; the message says what is wrong (the caller adds the setting's name)."""


@dataclass(frozen=True, slots=True)
class RouteRule:
    """One rule: ``kind`` (``exact`` | ``prefix`` | ``re``), its ``pattern`` and the ``backend`` it names."""

    kind: str
    pattern: str
    backend: str
    _regex: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    @property
    def text(self) -> str:
        """The rule as written in the settings (``kind:pattern``)."""
        return f"{self.kind}:{self.pattern}"

    def matches(self, topic: str) -> bool:
        if self.kind == "exact":
            return topic == self.pattern
        if self.kind == "prefix":
            return topic.startswith(self.pattern)
        assert self._regex is not None
        return self._regex.match(topic) is not None


def parse_rule(match: str, backend: str) -> RouteRule:
    """The rule ``match`` (``exact:NAME`` | ``prefix:TEXT`` | ``re:REGEX``) sending topics to ``backend``;
    raises :class:`RuleError` for an unknown kind, an empty pattern or a regular expression that does not
    compile."""
    kind, sep, pattern = match.partition(":")
    if not sep or kind not in _KINDS:
        raise RuleError(f"{match!r} is not exact:TOPIC, prefix:TEXT or re:REGEX")
    if not pattern:
        raise RuleError(f"{match!r} has an empty pattern")
    if kind != "re":
        return RouteRule(kind, pattern, backend)
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise RuleError(f"{match!r} is not a valid regular expression ({exc})") from None
    return RouteRule(kind, pattern, backend, regex)


@dataclass(frozen=True, slots=True)
class RoutingTable:
    """Ordered rules and the default backend (``""``: none)."""

    rules: tuple[RouteRule, ...] = ()
    default: str = ""

    def backend_for(self, topic: str) -> str | None:
        """The name of the backend owning ``topic``: the first matching rule's, else the default; None
        when unrouted."""
        for rule in self.rules:
            if rule.matches(topic):
                return rule.backend
        return self.default or None

    def describe(self) -> str:
        """The rules in one line for error remarks: ``exact:orders -> east, prefix:iot/ -> west; default
        local`` (or ``no default``)."""
        rules = ", ".join(f"{rule.text} -> {rule.backend}" for rule in self.rules) or "no rules"
        tail = f"default {self.default}" if self.default else "no routing.default"
        return f"{rules}; {tail}"
