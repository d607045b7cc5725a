"""HTML report with PNG charts from the batch (or streaming) Parquet tables.

:func:`load_report_data` collects the small aggregate tables to the driver; the ``plot_*``
functions turn them into matplotlib figures (the notebook calls the same functions). Figures are
built with ``matplotlib.figure.Figure`` and saved through the Agg canvas: no pyplot, no global
backend switch, so importing this module leaves a notebook's inline backend alone.
:func:`write_report` renders ``report.html`` plus its charts in ``<name>_files/*.png`` beside it.
Only ``rollup_minute`` is required; sections whose table is missing (streaming output has no
``top_clients``, for instance) are left out.
"""

from __future__ import annotations

import html
import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

import matplotlib.dates as mdates
from matplotlib.figure import Figure
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import TimestampType

from mqproxy.spark_etl.batch import SUMMARY_FILE

__all__ = [
    "Change",
    "ReportData",
    "load_report_data",
    "notable_changes",
    "plot_errors",
    "plot_latency",
    "plot_protocol_mix",
    "plot_throughput",
    "render_html",
    "write_report",
]

Row = dict[str, Any]

_EPOCH: Final = datetime(1970, 1, 1)
_COLORS: Final = {"remoting": "#1f77b4", "mqtt": "#2ca02c", "grpc": "#ff7f0e", "http": "#9467bd"}
_FALLBACK_COLORS: Final = ("#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


@dataclass(slots=True)
class ReportData:
    """Driver-side rows of the tables the report shows (each a list of plain dicts)."""

    rollup: list[Row]
    top_clients: list[Row] = field(default_factory=list)
    negotiation_failures: list[Row] = field(default_factory=list)
    ops: list[Row] = field(default_factory=list)
    tenants: list[Row] = field(default_factory=list)
    summary: dict[str, Any] | None = None

    @property
    def protocols(self) -> list[str]:
        """Protocols by descending request count."""
        totals: dict[str, int] = defaultdict(int)
        for row in self.rollup:
            totals[row["protocol"]] += row["requests"] + row["connections_opened"]
        return sorted(totals, key=lambda p: (-totals[p], p))


def _rows(spark: SparkSession, path: str, order: Sequence[Any], limit: int | None = None) -> list[Row]:
    try:
        df = spark.read.parquet(path)
    except AnalysisException:
        return []
    df = df.orderBy(*order)
    if limit is not None:
        df = df.limit(limit)
    # Collect timestamps as epoch microseconds: PySpark would convert them to the Python process's
    # local zone, and the report is in UTC.
    stamps = {f.name for f in df.schema.fields if isinstance(f.dataType, TimestampType)}
    df = df.select(*[F.unix_micros(c).alias(c) if c in stamps else F.col(c) for c in df.columns])
    rows = []
    for row in df.collect():
        values = row.asDict()
        for name in stamps:
            if values[name] is not None:
                values[name] = _EPOCH + timedelta(microseconds=values[name])
        rows.append(values)
    return rows


def _read_summary(tables_dir: str) -> dict[str, Any] | None:
    path = Path(tables_dir.removeprefix("file:")) / SUMMARY_FILE
    if "://" in tables_dir and not tables_dir.startswith("file:"):
        return None
    try:
        summary: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return summary


def load_report_data(spark: SparkSession, tables_dir: str, *, top: int = 10) -> ReportData:
    """Collect what the report needs from the Parquet tables under ``tables_dir``.

    Raises ``FileNotFoundError`` when ``rollup_minute`` is missing or empty.
    """
    rollup = _rows(spark, f"{tables_dir}/rollup_minute", ["minute", "protocol"])
    if not rollup:
        raise FileNotFoundError(f"no rollup_minute table with rows under {tables_dir}")
    return ReportData(
        rollup=rollup,
        top_clients=_rows(spark, f"{tables_dir}/top_clients", ["date", "rank"]),
        negotiation_failures=_rows(
            spark, f"{tables_dir}/negotiation_failures", [F.col("failures").desc(), "reason"]
        ),
        ops=_rows(spark, f"{tables_dir}/ops", [F.col("latency_p99").desc_nulls_last(), "op"]),
        tenants=_rows(spark, f"{tables_dir}/tenants", [F.col("bytes").desc(), "tenant"], top * 5),
        summary=_read_summary(tables_dir),
    )


# --- Charts --------------------------------------------------------------------------------------


def _color(protocol: str, protocols: list[str]) -> str:
    if protocol in _COLORS:
        return _COLORS[protocol]
    return _FALLBACK_COLORS[protocols.index(protocol) % len(_FALLBACK_COLORS)]


def _series(data: ReportData, metric: str) -> tuple[list[datetime], dict[str, list[float]]]:
    """Minutes (sorted) and, per protocol, ``metric`` per minute (0 where the protocol was silent)."""
    minutes = sorted({row["minute"] for row in data.rollup})
    index = {m: i for i, m in enumerate(minutes)}
    series = {p: [0.0] * len(minutes) for p in data.protocols}
    for row in data.rollup:
        value = row[metric]
        series[row["protocol"]][index[row["minute"]]] = float(value) if value is not None else float("nan")
    return minutes, series


def _format_time_axis(ax: Any, minutes: list[datetime]) -> None:
    multi_day = bool(minutes) and minutes[0].date() != minutes[-1].date()
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M" if multi_day else "%H:%M"))
    ax.grid(True, alpha=0.3)
    ax.set_xlabel("time (UTC)")


def plot_throughput(data: ReportData) -> Figure:
    """Requests per minute (stacked by protocol) and payload MB per minute."""
    minutes, reqs = _series(data, "requests")
    _, req_bytes = _series(data, "req_bytes")
    _, resp_bytes = _series(data, "resp_bytes")
    protocols = data.protocols
    fig = Figure(figsize=(11, 6.5), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.stackplot(
        minutes,
        *[reqs[p] for p in protocols],
        labels=protocols,
        colors=[_color(p, protocols) for p in protocols],
    )
    top.set_ylabel("requests / minute")
    top.set_title("Throughput")
    top.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncols=len(protocols), frameon=False)
    top.grid(True, alpha=0.3)
    for p in protocols:
        mb = [(a + b) / 1e6 for a, b in zip(req_bytes[p], resp_bytes[p], strict=True)]
        bottom.plot(minutes, mb, label=p, color=_color(p, protocols), linewidth=1.5)
    bottom.set_ylabel("payload MB / minute")
    _format_time_axis(bottom, minutes)
    return fig


def plot_latency(data: ReportData) -> Figure:
    """p50/p95/p99 request latency per minute, one panel per protocol (log scale)."""
    protocols = [p for p in data.protocols if any(r["requests"] for r in data.rollup if r["protocol"] == p)]
    panels = max(1, len(protocols))
    fig = Figure(figsize=(11, 2.6 * panels + 0.6), layout="constrained")
    axes_list = list(fig.subplots(panels, 1, sharex=True, squeeze=False)[:, 0])
    minutes: list[datetime] = []
    for ax, protocol in zip(axes_list, protocols, strict=False):
        rows = [r for r in data.rollup if r["protocol"] == protocol and r["requests"]]
        minutes = [r["minute"] for r in rows]
        color = _color(protocol, data.protocols)
        for pct, style, width in (("p50", ":", 1.2), ("p95", "--", 1.2), ("p99", "-", 1.8)):
            ax.plot(
                minutes, [r[f"latency_{pct}"] for r in rows], style, color=color, linewidth=width, label=pct
            )
        ax.set_yscale("log")
        ax.set_ylabel(f"{protocol}\nlatency ms")
        ax.legend(loc="upper left", ncols=3, frameon=False)
        ax.grid(True, alpha=0.3, which="both")
    axes_list[0].set_title("Request latency percentiles")
    _format_time_axis(axes_list[-1], sorted({r["minute"] for r in data.rollup}) or minutes)
    return fig


def plot_errors(data: ReportData) -> Figure:
    """Request error rate (%) per protocol, and failed connections, per minute."""
    minutes, _ = _series(data, "requests")
    protocols = data.protocols
    fig = Figure(figsize=(11, 6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    for p in protocols:
        rows = [r for r in data.rollup if r["protocol"] == p and r["requests"]]
        top.plot(
            [r["minute"] for r in rows],
            [100.0 * r["error_rate"] for r in rows],
            color=_color(p, protocols),
            label=p,
            linewidth=1.5,
        )
    top.set_ylabel("request errors %")
    top.set_title("Errors over time")
    top.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncols=len(protocols), frameon=False)
    top.grid(True, alpha=0.3)
    _, conn_errors = _series(data, "connection_errors")
    bottoms = [0.0] * len(minutes)
    width = 0.8 / (24 * 60)
    for p in protocols:
        bottom.bar(minutes, conn_errors[p], width=width, bottom=bottoms, color=_color(p, protocols), label=p)
        bottoms = [a + b for a, b in zip(bottoms, conn_errors[p], strict=True)]
    bottom.set_ylabel("connections closed\nwith an error")
    _format_time_axis(bottom, minutes)
    return fig


def plot_protocol_mix(data: ReportData) -> Figure:
    """Share of requests, connections and payload bytes per protocol (horizontal 100% bars)."""
    protocols = data.protocols
    totals: dict[str, dict[str, float]] = {p: defaultdict(float) for p in protocols}
    for row in data.rollup:
        t = totals[row["protocol"]]
        t["requests"] += row["requests"]
        t["connections"] += row["connections_opened"]
        t["bytes"] += row["req_bytes"] + row["resp_bytes"]
    measures = ("requests", "connections", "bytes")
    fig = Figure(figsize=(11, 3.2), layout="constrained")
    ax = fig.subplots()
    left = [0.0] * len(measures)
    for p in protocols:
        shares = []
        for m in measures:
            whole = sum(totals[q][m] for q in protocols)
            shares.append(100.0 * totals[p][m] / whole if whole else 0.0)
        bars = ax.barh(measures, shares, left=left, color=_color(p, protocols), label=p)
        for bar, share in zip(bars, shares, strict=True):
            if share >= 6:
                ax.text(
                    bar.get_x() + bar.get_width() / 2,
                    bar.get_y() + bar.get_height() / 2,
                    f"{p} {share:.0f}%",
                    ha="center",
                    va="center",
                    color="white",
                    fontsize=9,
                )
        left = [a + b for a, b in zip(left, shares, strict=True)]
    ax.set_xlim(0, 100)
    ax.invert_yaxis()
    ax.set_xlabel("% of total")
    ax.set_title("Protocol mix")
    ax.legend(loc="lower right", ncols=len(protocols), frameon=False, bbox_to_anchor=(1.0, 1.0))
    return fig


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
    minutes = sorted({r["minute"] for r in data.rollup})
    cards = [
        ("requests", _fmt(requests)),
        ("request error rate", f"{100.0 * errors / requests:.2f}%" if requests else "-"),
        ("connections", _fmt(sum(r["connections_opened"] for r in data.rollup))),
        ("payload", f"{sum(r['req_bytes'] + r['resp_bytes'] for r in data.rollup) / 1e6:,.1f} MB"),
        ("protocols", ", ".join(data.protocols)),
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
    }
    for name, caption in captions.items():
        if name in charts:
            parts.append(f"<h2>{caption}</h2><img src='{html.escape(charts[name])}' alt='{caption}'>")
    if data.ops:
        parts.append("<h2>Slowest request kinds (by p99)</h2>")
        parts.append(
            _table(
                data.ops[:10],
                [
                    ("protocol", "protocol"),
                    ("op", "op"),
                    ("code", "code"),
                    ("requests", "requests"),
                    ("latency_p50", "p50 ms"),
                    ("latency_p99", "p99 ms"),
                    ("error_rate", "error rate"),
                ],
            )
        )
        failing = sorted((r for r in data.ops if r["errors"]), key=lambda r: (-r["error_rate"], r["op"]))
        parts.append("<h2>Failing request kinds</h2>")
        parts.append(
            _table(
                failing[:10],
                [
                    ("protocol", "protocol"),
                    ("op", "op"),
                    ("errors", "errors"),
                    ("requests", "requests"),
                    ("error_rate", "error rate"),
                ],
            )
        )
    if data.top_clients:
        parts.append("<h2>Top clients</h2>")
        parts.append(
            _table(
                [r for r in data.top_clients if r["rank"] <= 10],
                [
                    ("date", "date"),
                    ("client_id", "client"),
                    ("client_version", "version"),
                    ("tenant", "tenant"),
                    ("requests", "requests"),
                    ("connections", "connections"),
                    ("error_rate", "error rate"),
                    ("latency_p99", "p99 ms"),
                ],
            )
        )
    if data.tenants:
        parts.append("<h2>Bytes per tenant</h2>")
        parts.append(
            _table(
                data.tenants[:10],
                [
                    ("date", "date"),
                    ("tenant", "tenant"),
                    ("clients", "clients"),
                    ("requests", "requests"),
                    ("req_bytes", "bytes in"),
                    ("resp_bytes", "bytes out"),
                ],
            )
        )
    if data.negotiation_failures:
        parts.append("<h2 class='warn'>Negotiation failures</h2>")
        parts.append(
            _table(
                data.negotiation_failures,
                [
                    ("date", "date"),
                    ("reason", "reason"),
                    ("failures", "failures"),
                    ("peer_hosts", "peer hosts"),
                    ("sniff_ms_p50", "sniff p50 ms"),
                ],
            )
        )
    parts.append("</body></html>\n")
    return "\n".join(parts)


_CHARTS: Final = {
    "throughput": plot_throughput,
    "latency": plot_latency,
    "errors": plot_errors,
    "protocol_mix": plot_protocol_mix,
}


def write_report(data: ReportData, output: Path) -> list[Path]:
    """Write ``output`` (HTML) and its PNG charts in ``<stem>_files/``; return the PNG paths."""
    chart_dir = output.with_name(f"{output.stem}_files")
    chart_dir.mkdir(parents=True, exist_ok=True)
    pngs: list[Path] = []
    urls: dict[str, str] = {}
    for name, plot in _CHARTS.items():
        png = chart_dir / f"{name}.png"
        plot(data).savefig(png, dpi=110)
        pngs.append(png)
        urls[name] = f"{chart_dir.name}/{png.name}"
    output.write_text(render_html(data, urls), encoding="utf-8")
    return pngs
