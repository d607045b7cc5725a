"""
mqproxy.connector.rules
~~~~~~~~~~~~~~~~~~~~~~~

The connector's rules file (TOML) as typed, frozen values. Sans-IO.

Contracts:

* :func:`parse_rules` returns a :class:`ConnectorConfig` or raises :class:`RulesError` whose text is
  ``file:line: field: problem``. ``tomllib`` reports syntax errors with a line but values without one, so
  the line of a key is found by scanning the text for table headers and ``key =`` lines
  (:class:`_Lines`); a missing key is reported at its table's header.
* A cluster's ``id`` (what the origin properties and loop prevention name it by) defaults to its name
  servers, sorted and joined by ``;``: two rules files that name the same cluster differently agree on it.
* ``groups`` lists the consumer groups whose committed offsets are translated to the target (exact names or
  ``re:<regex>`` full matches); none by default, since writing a group's offsets on the target is a choice.
* ``topic = "re:<regex>"`` is a pattern matched in full against source topic names; ``target_topic`` is
  only allowed with an exact ``topic``. ``filter`` (tags) and ``sql`` (SQL92) exclude each other.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Final

from mqproxy.model.sql92 import Sql92Error, Sql92Filter, compile_sql92
from mqproxy.model.topics import MAX_TOPIC_BYTES
from mqproxy.model.types import TagFilter

__all__ = ["ClusterSpec", "ConnectorConfig", "Rule", "RulesError", "Start", "parse_rules"]

_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,100}")
_TOPIC: Final = re.compile(r"[%|A-Za-z0-9_-]+")
_ADDR: Final = re.compile(r"[^\s:;]+:\d{1,5}")
_HEADER: Final = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_RULE_KEYS: Final = ("name", "source", "target", "topic", "target_topic", "filter", "sql", "start", "groups")
_KEY: Final = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_.-]+)\s*=""")


class RulesError(ValueError):
    """A rules file that cannot be used; ``str()`` is ``file:line: field: problem``."""


@dataclass(frozen=True, slots=True)
class Start:
    """Where a source queue without progress starts: ``earliest``, ``latest`` or ``timestamp`` (ms)."""

    kind: str
    timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    name: str
    namesrv: tuple[str, ...]
    id: str
    access_key: str | None = None
    secret_key: str | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    """One copy rule. ``label`` names it in metrics and events (``name``, else ``src->dst:topic``)."""

    label: str
    source: str
    target: str
    topic: str
    pattern: re.Pattern[str] | None
    target_topic: str | None
    tags: TagFilter | None
    sql: Sql92Filter | None
    start: Start
    #: consumer groups whose committed offsets are translated to the target (exact or ``re:`` patterns)
    groups: tuple[str, ...] = ()

    def matches_group(self, group: str) -> bool:
        """True when ``group``'s offsets are translated (an entry is the exact name or ``re:<regex>``)."""
        for entry in self.groups:
            if entry.startswith("re:"):
                if re.fullmatch(entry[3:], group):
                    return True
            elif entry == group:
                return True
        return False

    def matches_topic(self, topic: str) -> bool:
        if self.pattern is not None:
            return self.pattern.fullmatch(topic) is not None
        return topic == self.topic

    def target_of(self, topic: str) -> str:
        return self.target_topic or topic


@dataclass(frozen=True, slots=True)
class ConnectorConfig:
    """The whole rules file. Tunables live in ``[connector]`` beside ``name``."""

    name: str
    clusters: dict[str, ClusterSpec]
    rules: tuple[Rule, ...]
    batch_messages: int = 128
    batch_bytes: int = 1024 * 1024
    lock_ttl_s: float = 60.0
    request_timeout_s: float = 5.0
    refresh_s: float = 10.0
    lag_interval_s: float = 5.0
    recovery_scan: int = 2000
    checkpoint_interval_s: float = 5.0
    checkpoint_scan: int = 10000
    dlq_topic: str = ""


class _Lines:
    """Lines of keys and table headers in a TOML text (``[[rules]]`` tables numbered from 0)."""

    def __init__(self, text: str) -> None:
        self.keys: dict[tuple[str, str], int] = {}
        self.tables: dict[str, int] = {}
        table, counts = "", dict[str, int]()
        for number, line in enumerate(text.splitlines(), start=1):
            header = _HEADER.match(line)
            if header:
                name = ".".join(p.strip().strip("\"'") for p in header.group(2).split("."))
                if header.group(1) == "[[":
                    counts[name] = counts.get(name, -1) + 1
                    name = f"{name}[{counts[name]}]"
                table = name
                self.tables.setdefault(table, number)
                continue
            key = _KEY.match(line)
            if key:
                self.keys.setdefault((table, key.group(1).strip("\"'")), number)

    def line(self, table: str, key: str | None) -> int:
        if key is not None and (table, key) in self.keys:
            return self.keys[(table, key)]
        return self.tables.get(table, 1)


class _Reader:
    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.lines = _Lines(text)

    def fail(self, table: str, key: str | None, problem: str) -> RulesError:
        where = self.lines.line(table, key)
        shown = f"{table}.{key}" if key else table
        return RulesError(f"{self.path}:{where}: {shown}: {problem}")

    def get(self, data: dict[str, Any], table: str, key: str, kind: type, default: Any = ...) -> Any:
        if key not in data:
            if default is ...:
                raise self.fail(table, None, f"'{key}' is required")
            return default
        value = data[key]
        ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise self.fail(table, key, f"expected {kind.__name__}, got {type(value).__name__}")
        return value

    def positive(self, data: dict[str, Any], table: str, key: str, kind: type, default: Any) -> Any:
        value = self.get(data, table, key, kind, default)
        if value <= 0:
            raise self.fail(table, key, "must be positive")
        return value

    def only(self, data: dict[str, Any], table: str, allowed: set[str]) -> None:
        for key in data:
            if key not in allowed:
                raise self.fail(table, key, f"unknown field (known: {', '.join(sorted(allowed))})")


def _start(reader: _Reader, table: str, value: str) -> Start:
    if value in ("earliest", "latest"):
        return Start(value)
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise reader.fail(table, "start", "expected earliest, latest or an RFC 3339 timestamp with offset")
    return Start("timestamp", int(moment.timestamp() * 1000))


def _cluster(reader: _Reader, name: str, data: Any) -> ClusterSpec:
    table = f"clusters.{name}"
    if not isinstance(data, dict):
        raise reader.fail("clusters", name, "expected a table")
    if not _NAME.fullmatch(name):
        raise reader.fail(table, None, "cluster names use letters, digits, '-' and '_'")
    reader.only(data, table, {"namesrv", "id", "access_key", "secret_key"})
    text = reader.get(data, table, "namesrv", str)
    addrs = tuple(a.strip() for a in text.split(";") if a.strip())
    if not addrs or not all(_ADDR.fullmatch(a) for a in addrs):
        raise reader.fail(table, "namesrv", f"expected host:port[;host:port...], got {text!r}")
    cluster_id = reader.get(data, table, "id", str, ";".join(sorted(addrs)))
    if not cluster_id or "," in cluster_id:
        raise reader.fail(table, "id", "must be non-empty and without ','")
    access, secret = data.get("access_key"), data.get("secret_key")
    if (access is None) != (secret is None):
        raise reader.fail(table, "secret_key" if access is None else "access_key", "keys go in pairs")
    return ClusterSpec(name, addrs, cluster_id, access, secret)


def _rule(reader: _Reader, n: int, data: Any, clusters: dict[str, ClusterSpec]) -> Rule:
    table = f"rules[{n}]"
    if not isinstance(data, dict):
        raise reader.fail(table, None, "expected a table")
    reader.only(data, table, set(_RULE_KEYS))
    ends = {}
    for key in ("source", "target"):
        ends[key] = reader.get(data, table, key, str)
        if ends[key] not in clusters:
            raise reader.fail(table, key, f"no cluster named {ends[key]!r} in [clusters]")
    if ends["source"] == ends["target"]:
        raise reader.fail(table, "target", "the target must differ from the source")
    topic = reader.get(data, table, "topic", str)
    pattern = None
    if topic.startswith("re:"):
        try:
            pattern = re.compile(topic[3:])
        except re.error as exc:
            raise reader.fail(table, "topic", f"bad regular expression: {exc}") from None
    elif not _TOPIC.fullmatch(topic) or len(topic) > MAX_TOPIC_BYTES:
        raise reader.fail(table, "topic", f"illegal topic name {topic!r}")
    target_topic = reader.get(data, table, "target_topic", str, None)
    if target_topic is not None:
        if pattern is not None:
            raise reader.fail(table, "target_topic", "not allowed with a regex topic (copies keep names)")
        if not _TOPIC.fullmatch(target_topic) or len(target_topic) > MAX_TOPIC_BYTES:
            raise reader.fail(table, "target_topic", f"illegal topic name {target_topic!r}")
    if "filter" in data and "sql" in data:
        raise reader.fail(table, "sql", "'filter' and 'sql' exclude each other")
    tags = sql = None
    if "filter" in data:
        tags = TagFilter.parse(reader.get(data, table, "filter", str))
    if "sql" in data:
        try:
            sql = compile_sql92(reader.get(data, table, "sql", str))
        except Sql92Error as exc:
            raise reader.fail(table, "sql", f"bad SQL92 expression: {exc}") from None
    start = _start(reader, table, reader.get(data, table, "start", str, "latest"))
    label = reader.get(data, table, "name", str, f"{ends['source']}->{ends['target']}:{topic}")
    groups = _groups(reader, table, reader.get(data, table, "groups", list, []))
    return Rule(label, ends["source"], ends["target"], topic, pattern, target_topic, tags, sql, start, groups)


def _groups(reader: _Reader, table: str, entries: list[Any]) -> tuple[str, ...]:
    for entry in entries:
        if not isinstance(entry, str) or not entry:
            raise reader.fail(table, "groups", "expected a list of group names or 're:<regex>' strings")
        if entry.startswith("re:"):
            try:
                re.compile(entry[3:])
            except re.error as exc:
                raise reader.fail(table, "groups", f"bad regular expression {entry!r}: {exc}") from None
        elif not _NAME.fullmatch(entry) and not _TOPIC.fullmatch(entry):
            raise reader.fail(table, "groups", f"illegal group name {entry!r}")
    return tuple(entries)


def parse_rules(text: str, path: str = "<rules>") -> ConnectorConfig:
    """The connector configuration in ``text`` (read from ``path``); :class:`RulesError` if unusable."""
    reader = _Reader(path, text)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = re.search(r"at line (\d+)", str(exc))
        line = found.group(1) if found else "1"
        raise RulesError(f"{path}:{line}: (syntax): {exc}") from None
    reader.only(data, "(top level)", {"connector", "clusters", "rules"})
    connector = reader.get(data, "(top level)", "connector", dict)
    table = "connector"
    tunables = {
        "batch_messages": int,
        "batch_bytes": int,
        "lock_ttl_s": float,
        "request_timeout_s": float,
        "refresh_s": float,
        "lag_interval_s": float,
        "recovery_scan": int,
        "checkpoint_interval_s": float,
        "checkpoint_scan": int,
    }
    reader.only(connector, table, {"name", "dlq_topic", *tunables})
    name = reader.get(connector, table, "name", str)
    if not _NAME.fullmatch(name):
        raise reader.fail(table, "name", "use 1-100 letters, digits, '-' or '_' (it is a consumer group)")
    dlq = reader.get(connector, table, "dlq_topic", str, f"CONNECTOR_DLQ_{name}")
    if not _TOPIC.fullmatch(dlq) or len(dlq) > MAX_TOPIC_BYTES:
        raise reader.fail(table, "dlq_topic", f"illegal topic name {dlq!r}")
    defaults = {f.name: f.default for f in fields(ConnectorConfig)}
    values = {
        key: reader.positive(connector, table, key, kind, defaults[key]) for key, kind in tunables.items()
    }
    raw_clusters = reader.get(data, "(top level)", "clusters", dict)
    clusters = {n: _cluster(reader, n, c) for n, c in raw_clusters.items()}
    if not clusters:
        raise reader.fail("clusters", None, "at least one cluster is required")
    raw_rules = reader.get(data, "(top level)", "rules", list)
    if not raw_rules:
        raise reader.fail("(top level)", "rules", "at least one [[rules]] table is required")
    rules = tuple(_rule(reader, n, r, clusters) for n, r in enumerate(raw_rules))
    labels = [r.label for r in rules]
    for n, label in enumerate(labels):
        if labels.index(label) != n:
            raise reader.fail(f"rules[{n}]", "name", f"rule name {label!r} is used twice")
    return ConnectorConfig(name, clusters, rules, dlq_topic=dlq, **values)
