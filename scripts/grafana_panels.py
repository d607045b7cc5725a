#!/usr/bin/env python3
"""The panels of a Grafana dashboard JSON and their PromQL as Grafana would send it to Prometheus, for
running ``config/grafana/mqproxy.json`` against a real Prometheus without Grafana. Standard library only.

How Grafana turns a panel target into a ``/api/v1/query_range`` call (its documented behaviour, reproduced
for the variables the dashboard uses; nothing else is substituted, so an unknown ``$variable`` reaches
Prometheus and fails to parse there):

* ``$__interval`` (and the step): the time range divided by the panel's maximum data points (Grafana's
  default is the panel's width in pixels), never below the data source's *scrape interval* setting, and
  rounded to a "nice" value (1 s, 2 s, 5 s, 10 s, 15 s, 20 s, 30 s, 1 m, ...). The query's ``step`` is that
  interval; Grafana aligns start and end down to a multiple of the step.
* ``$__rate_interval``: ``max($__interval + scrape interval, 4 * scrape interval)``, with the scrape
  interval the data source's setting (Grafana 10.2+).
* Template variables (``$instance``, ``${group}``, ...): a variable shown as "All" with an ``allValue`` is
  replaced by that value (``.*`` in this dashboard); one value by itself; several values by Grafana's
  regex form ``(a|b)``.
* ``label_values(metric, label)`` (a variable's query) is no PromQL: Grafana asks
  ``/api/v1/label/<label>/values?match[]=<metric>`` (see :func:`label_values`).

Contracts: :func:`panels` lists every panel (rows included, nested ones flattened) in dashboard order;
:func:`substitute` never leaves a known variable in the text; :func:`legend` renders a ``legendFormat``
the way Grafana does (``{{label}}`` → the series' label value, missing labels → empty).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parents[1] / "config" / "grafana" / "mqproxy.json"

#: Grafana's "nice" intervals in seconds, with the upper bound (exclusive) of raw intervals rounded to each.
_NICE_S: tuple[tuple[float, float], ...] = (
    (0.015, 0.01), (0.035, 0.02), (0.075, 0.05), (0.15, 0.1), (0.35, 0.2), (0.75, 0.5),
    (1.5, 1), (3.5, 2), (7.5, 5), (12.5, 10), (17.5, 15), (25, 20), (45, 30),
    (90, 60), (210, 120), (450, 300), (900, 600), (1200, 900), (2400, 1200), (5400, 1800),
)


@dataclass(frozen=True)
class Target:
    ref_id: str
    expr: str
    legend: str
    instant: bool  # an instant query (``/api/v1/query`` at the range's end), as tables use


@dataclass(frozen=True)
class Panel:
    id: int
    type: str  # "row", "timeseries", "table", ...
    title: str
    x: int
    y: int
    w: int
    h: int
    unit: str
    targets: tuple[Target, ...]


@dataclass(frozen=True)
class Variable:
    name: str
    query: str  # the variable's query (``label_values(metric, label)``), "" for other kinds
    all_value: str | None


def load(path: Path = DASHBOARD) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def panels(dashboard: Mapping[str, Any]) -> list[Panel]:
    def walk(items: Sequence[Mapping[str, Any]]) -> Iterator[Panel]:
        for p in items:
            grid = p.get("gridPos", {})
            unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
            targets = tuple(
                Target(t.get("refId", ""), t["expr"], t.get("legendFormat", ""), bool(t.get("instant")))
                for t in p.get("targets", [])
            )
            yield Panel(int(p["id"]), p["type"], p.get("title", ""), int(grid.get("x", 0)),
                        int(grid.get("y", 0)), int(grid.get("w", 24)), int(grid.get("h", 8)), unit, targets)
            yield from walk(p.get("panels", []))

    return list(walk(dashboard["panels"]))


def variables(dashboard: Mapping[str, Any]) -> list[Variable]:
    out = []
    for v in dashboard.get("templating", {}).get("list", []):
        query = v.get("query", "")
        text = query.get("query", "") if isinstance(query, dict) else str(query)
        out.append(Variable(v["name"], text if v["type"] == "query" else "", v.get("allValue")))
    return out


def nice_interval(seconds: float) -> float:
    """Grafana's rounding of a raw interval (seconds) to a "nice" one."""
    for bound, nice in _NICE_S:
        if seconds < bound:
            return nice
    return 3600.0


def interval_s(range_s: float, max_data_points: int, scrape_interval_s: float) -> float:
    """``$__interval`` (and the query step) of a panel ``max_data_points`` wide over ``range_s`` seconds."""
    return max(nice_interval(range_s / max_data_points), scrape_interval_s)


def rate_interval_s(interval: float, scrape_interval_s: float) -> float:
    return max(interval + scrape_interval_s, 4 * scrape_interval_s)


def _duration(seconds: float) -> str:
    return f"{int(seconds)}s" if seconds == int(seconds) else f"{int(seconds * 1000)}ms"


def substitute(
    expr: str,
    *,
    interval: float,
    scrape_interval_s: float,
    values: Mapping[str, Sequence[str] | None],
    known: Sequence[Variable] = (),
) -> str:
    """``expr`` with Grafana's variables replaced. ``values[name]`` is the selection of a template
    variable (None: "All", which takes the variable's ``allValue`` from ``known``)."""
    all_values = {v.name: v.all_value for v in known}
    builtins = {"__rate_interval": _duration(rate_interval_s(interval, scrape_interval_s)),
                "__interval": _duration(interval)}

    def one(name: str) -> str | None:
        if name in builtins:
            return builtins[name]
        if name not in values:
            return None
        chosen = values[name]
        if chosen is None:
            all_value = all_values.get(name)
            return all_value if all_value is not None else ".*"
        escaped = [re.escape(v) for v in chosen]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"

    def replace(match: re.Match[str]) -> str:
        found = one(match.group(1) or match.group(2))
        return match.group(0) if found is None else found

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", replace, expr)


def label_values(query: str) -> tuple[str, str] | None:
    """``(metric, label)`` of a ``label_values(metric, label)`` variable query, else None."""
    found = re.fullmatch(r"\s*label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*(\w+)\s*\)\s*", query)
    return (found.group(1), found.group(2)) if found else None


def legend(template: str, labels: Mapping[str, str]) -> str:
    if not template:
        return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template).strip()
