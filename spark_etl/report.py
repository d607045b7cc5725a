"""HTML report with PNG charts from the batch (or streaming) Parquet tables.

:func:`load_report_data` (from :mod:`~mqproxy.spark_etl.report_data`) collects the small aggregate tables
to the driver; the ``plot_*`` functions (from :mod:`~mqproxy.spark_etl.charts`, re-exported here for the
notebook) turn them into matplotlib figures, saved through the Agg canvas. :func:`notable_changes` finds
the minutes worth a look; :func:`write_report` renders ``report.html`` plus its charts in
``<name>_files/*.png`` beside it. ``rollup_minute`` or ``replication_minute`` must have rows; sections
whose table is missing or empty (streaming output has no ``top_clients``, logs without connector events
no replication) are left out, charts included.
"""

from __future__ import annotations

import html
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from matplotlib.figure import Figure

from mqproxy.spark_etl.charts import (
    plot_errors,
    plot_latency,
    plot_protocol_mix,
    plot_replication_delay,
    plot_throughput,
)
from mqproxy.spark_etl.report_data import ReportData, Row, load_report_data

__all__ = [
    "Change",
    "ReportData",
    "lag_totals",
    "load_report_data",
    "notable_changes",
    "plot_errors",
    "plot_latency",
    "plot_protocol_mix",
    "plot_replication_delay",
    "plot_throughput",
    "render_html",
    "replication_totals",
    "write_report",
]


# --- Change detection ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Change:
    """A minute where a protocol's metric departs from the median of the minutes before it."""

    minute: datetime
    protocol: str
    metric: str
    before: float
    after: float

    @property
    def factor(self) -> float:
        """How many times larger (or smaller, as a value < 1) ``after`` is than ``before``."""
        return self.after / self.before if self.before else float("inf")

    def describe(self) -> str:
        """One human sentence, e.g. ``2026-11-22 14:05 grpc p99 latency: 25 ms -> 960 ms (x38.6)``."""
        label, unit, scale = _METRIC_LABELS[self.metric]
        return (
            f"{self.minute:%Y-%m-%d %H:%M} {self.protocol} {label}: "
            f"{self.before * scale:.3g}{unit} -> {self.after * scale:.3g}{unit} (x{self.factor:.1f})"
        )


_METRIC_LABELS: Final = {
    "requests": ("requests/min", "", 1.0),
    "error_rate": ("error rate", "%", 100.0),
    "latency_p99": ("p99 latency", " ms", 1.0),
}


def notable_changes(
    data: ReportData, *, baseline: int = 5, threshold: float = 2.5, limit: int = 8
) -> list[Change]:
    """Onsets of shifts: minutes where requests/min, error rate or p99 latency of a protocol moved
    by ``threshold``x or more against the median of its previous ``baseline`` minutes.

    Only the first minute of a run of such minutes is reported, largest shifts first. Error-rate
    shifts also need 2 percentage points, so 0 -> 1 failed request does not count. The newest
    minute is skipped: logs usually end part-way through it.
    """
    changes: list[Change] = []
    newest = max((r["minute"] for r in data.rollup), default=None)
    for protocol in data.protocols:
        rows = [
            r for r in data.rollup if r["protocol"] == protocol and r["requests"] and r["minute"] != newest
        ]
        for metric in _METRIC_LABELS:
            values = [float(r[metric] or 0.0) for r in rows]
            in_run = False
            for i in range(baseline, len(rows)):
                before = statistics.median(values[i - baseline : i])
                after = values[i]
                low, high = sorted((before, after))
                shifted = high > 0 and (low == 0 or high / low >= threshold)
                if metric == "error_rate" and high - low < 0.02:
                    shifted = False
                if shifted and not in_run:
                    changes.append(Change(rows[i]["minute"], protocol, metric, before, after))
                in_run = shifted
    changes.sort(key=lambda c: (-max(c.factor, 1 / c.factor if c.factor else float("inf")), c.minute))
    return changes[:limit]


# --- HTML ----------------------------------------------------------------------------------------

_CSS: Final = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:1180px;color:#222}
h1{margin-bottom:.2rem} .sub{color:#666;margin-top:0}
.cards{display:flex;flex-wrap:wrap;gap:.8rem;margin:1.2rem 0}
.card{border:1px solid #ddd;border-radius:8px;padding:.7rem 1rem;min-width:140px}
.card b{display:block;font-size:1.5rem} .card span{color:#666;font-size:.85rem}
img{max-width:100%;border:1px solid #eee;border-radius:6px;margin:.4rem 0 1.4rem}
table{border-collapse:collapse;margin:.4rem 0 1.6rem;font-size:.9rem}
th,td{padding:.3rem .7rem;border-bottom:1px solid #eee;text-align:right}
th:first-child,td:first-child{text-align:left} th{background:#fafafa}
.warn{color:#b00020}
"""


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, datetime):
        return f"{value:%Y-%m-%d %H:%M}"
    return str(value)


def _table(rows: list[Row], columns: Sequence[tuple[str, str]]) -> str:
    if not rows:
        return "<p>None.</p>"
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(row.get(key)))}</td>" for key, _ in columns) + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(data: ReportData, charts: dict[str, str], *, title: str = "mqproxy traffic report") -> str:
    """The report page; ``charts`` maps chart name to the (relative) PNG URL to embed."""
    requests = sum(r["requests"] for r in data.rollup)
    errors = sum(r["errors"] for r in data.rollup)
    minutes = sorted({r["minute"] for r in (*data.rollup, *data.replication)})
    cards = []
    if data.rollup:
        cards += [
            ("requests", _fmt(requests)),
            ("request error rate", f"{100.0 * errors / requests:.2f}%" if requests else "-"),
            ("connections", _fmt(sum(r["connections_opened"] for r in data.rollup))),
            ("payload", f"{sum(r['req_bytes'] + r['resp_bytes'] for r in data.rollup) / 1e6:,.1f} MB"),
            ("protocols", ", ".join(data.protocols)),
        ]
    if data.replication:
        cards += [
            ("messages replicated", _fmt(sum(r["messages"] for r in data.replication))),
            ("dead letters", _fmt(sum(r["dead_letters"] for r in data.replication))),
        ]
    if data.summary is not None:
        cards.append(("malformed lines", _fmt(data.summary.get("malformed", 0))))
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>",
        f"<p class='sub'>{_fmt(minutes[0])} - {_fmt(minutes[-1])} UTC, {len(minutes)} minutes</p>",
        "<div class='cards'>",
        *(f"<div class='card'><b>{html.escape(v)}</b><span>{html.escape(k)}</span></div>" for k, v in cards),
        "</div>",
    ]
    if data.rollup:
        changes = notable_changes(data)
        parts.append("<h2>What changed</h2>")
        if changes:
            parts.append("<ul>" + "".join(f"<li>{html.escape(c.describe())}</li>" for c in changes) + "</ul>")
        else:
            parts.append("<p>No minute moved requests, error rate or p99 latency by 2.5x or more.</p>")
    captions = {
        "throughput": "Throughput",
        "latency": "Latency percentiles",
        "errors": "Errors over time",
        "protocol_mix": "Protocol mix",
        "replication_delay": "Replication delay",
    }
    for name, caption in captions.items():
        if name in charts:
            parts.append(f"<h2>{caption}</h2><img src='{html.escape(charts[name])}' alt='{caption}'>")
    for heading, rows, columns in _table_sections(data):
        parts.append(heading)
        parts.append(_table(rows, _columns(columns)))
    parts.append("</body></html>\n")
    return "\n".join(parts)


_PROXY_CHARTS: Final = {
    "throughput": plot_throughput,
    "latency": plot_latency,
    "errors": plot_errors,
    "protocol_mix": plot_protocol_mix,
}


def _charts(data: ReportData) -> dict[str, Callable[[ReportData], Figure]]:
    """The charts ``data`` has rows for, in page order: the proxy's four, then replication delay."""
    charts = dict(_PROXY_CHARTS) if data.rollup else {}
    if data.rules:
        charts["replication_delay"] = plot_replication_delay
    return charts


def write_report(data: ReportData, output: Path) -> list[Path]:
    """Write ``output`` (HTML) and its PNG charts in ``<stem>_files/``; return the PNG paths."""
    chart_dir = output.with_name(f"{output.stem}_files")
    chart_dir.mkdir(parents=True, exist_ok=True)
    pngs: list[Path] = []
    urls: dict[str, str] = {}
    for name, plot in _charts(data).items():
        png = chart_dir / f"{name}.png"
        plot(data).savefig(png, dpi=110)
        pngs.append(png)
        urls[name] = f"{chart_dir.name}/{png.name}"
    output.write_text(render_html(data, urls), encoding="utf-8")
    return pngs


def _columns(spec: str) -> list[tuple[str, str]]:
    """``"op, latency_p99=p99 ms"`` -> ``[("op", "op"), ("latency_p99", "p99 ms")]`` (field, header)."""
    pairs = [item.strip().partition("=") for item in spec.split(",")]
    return [(name, label or name) for name, _, label in pairs]


def _table_sections(data: ReportData) -> list[tuple[str, list[Row], str]]:
    """(heading, rows, column spec) of each table section the data has rows for, in page order."""
    sections: list[tuple[str, list[Row], str]] = []
    if data.ops:
        failing = sorted((r for r in data.ops if r["errors"]), key=lambda r: (-r["error_rate"], r["op"]))
        sections += [
            (
                "<h2>Slowest request kinds (by p99)</h2>",
                data.ops[:10],
                "protocol, op, code, requests, latency_p50=p50 ms, latency_p99=p99 ms, error_rate=error rate",
            ),
            (
                "<h2>Failing request kinds</h2>",
                failing[:10],
                "protocol, op, errors, requests, error_rate=error rate",
            ),
        ]
    if data.top_clients:
        sections.append(
            (
                "<h2>Top clients</h2>",
                [r for r in data.top_clients if r["rank"] <= 10],
                "date, client_id=client, client_version=version, tenant, requests, connections,"
                " error_rate=error rate, latency_p99=p99 ms",
            )
        )
    if data.tenants:
        sections.append(
            (
                "<h2>Bytes per tenant</h2>",
                data.tenants[:10],
                "date, tenant, clients, requests, req_bytes=bytes in, resp_bytes=bytes out",
            )
        )
    if data.negotiation_failures:
        sections.append(
            (
                "<h2 class='warn'>Negotiation failures</h2>",
                data.negotiation_failures,
                "date, reason, failures, peer_hosts=peer hosts, sniff_ms_p50=sniff p50 ms",
            )
        )
    if data.replication:
        sections.append(
            (
                "<h2>Replication per rule</h2>",
                replication_totals(data),
                "connector, rule, messages, bytes, delay_p99=worst minute p99 ms, delay_max=max delay ms,"
                " dead_letters=dead letters, errors, lag_max=max lag, last_copied_at=last copied",
            )
        )
    if data.consumer_lag:
        sections.append(
            (
                "<h2>Consumer lag</h2>",
                lag_totals(data)[:20],
                "group, topic, lag_last=last lag, lag_max=max lag, consumed, produced,"
                " last_minute=last reading",
            )
        )
    if data.message_paths:
        sections.append(
            (
                "<h2>Message paths</h2>",
                data.message_paths[:20],
                "producer_protocol=producer, consumer_protocol=consumer, messages,"
                " first_delivery_p50=first delivery p50 ms, first_delivery_max=max ms",
            )
        )
    return sections


def lag_totals(data: ReportData) -> list[Row]:
    """Per ``(group, topic)`` over the whole report: the lag of the last reading, the largest lag, and
    the offsets the group consumed and the producers added (summed over minutes; movement between two
    minutes' readings is not counted); by descending last lag."""
    totals: dict[tuple[str, str], Row] = {}
    for r in sorted(data.consumer_lag, key=lambda r: r["minute"]):
        key = (r["group"], r["topic"])
        t = totals.setdefault(key, {"group": key[0], "topic": key[1], "lag_max": r["lag_max"], "consumed": 0,
                                    "produced": 0})  # fmt: skip
        t["lag_last"], t["last_minute"] = r["lag_last"], r["minute"]
        t["lag_max"] = max(t["lag_max"], r["lag_max"])
        t["consumed"] += r["consumed"]
        t["produced"] += r["produced"]
    return sorted(totals.values(), key=lambda t: (-t["lag_last"], t["group"], t["topic"]))


def replication_totals(data: ReportData) -> list[Row]:
    """Per ``(connector, rule)`` over the whole report: messages, bytes, the worst minute's delay p99,
    the largest delay, dead letters, errors, the largest lag and the last copy; by descending messages.

    Errors not tied to a rule appear under the rule ``"(unknown)"``.
    """
    totals: dict[tuple[str, str], Row] = {}
    for r in data.replication:
        key = (r["connector"], r["rule"])
        t = totals.setdefault(key, {"connector": key[0], "rule": key[1]})
        for name in ("messages", "bytes", "dead_letters", "errors"):
            t[name] = t.get(name, 0) + r[name]
        for name in ("delay_p99", "delay_max", "lag_max", "last_copied_at"):
            values = [v for v in (t.get(name), r[name]) if v is not None]
            t[name] = max(values) if values else None
    return sorted(totals.values(), key=lambda t: (-t["messages"], t["connector"], t["rule"]))
