"""The traffic report's charts as matplotlib figures (the report and the notebook call the same functions).

Figures are built with ``matplotlib.figure.Figure``, no pyplot and no global backend switch, so importing
this module leaves a notebook's inline backend alone.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any, Final

import matplotlib.dates as mdates
from matplotlib.figure import Figure

from mqproxy.spark_etl.report_data import ReportData

__all__ = ["plot_errors", "plot_latency", "plot_protocol_mix", "plot_replication_delay", "plot_throughput"]

_COLORS: Final = {"remoting": "#1f77b4", "mqtt": "#2ca02c", "grpc": "#ff7f0e", "http": "#9467bd"}
_FALLBACK_COLORS: Final = ("#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
_RULE_COLORS: Final = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", *_FALLBACK_COLORS)


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


def plot_replication_delay(data: ReportData) -> Figure:
    """Message connector, per rule and minute: batch delay p50/p99 (ms, log scale) and messages copied.

    Delay is source store time -> connector ack of each batch's oldest message. Without connector
    batches the figure says so instead of plotting.
    """
    rules = data.rules
    fig = Figure(figsize=(11, 6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.set_title("Replication delay")
    if not rules:
        top.text(0.5, 0.5, "no connector.batch events", ha="center", va="center", transform=top.transAxes)
        return fig
    single_connector = len({connector for connector, _ in rules}) == 1
    for i, (connector, rule) in enumerate(rules):
        rows = [
            r for r in data.replication if r["connector"] == connector and r["rule"] == rule and r["batches"]
        ]
        minutes = [r["minute"] for r in rows]
        color = _RULE_COLORS[i % len(_RULE_COLORS)]
        label = rule if single_connector else f"{connector}: {rule}"
        top.plot(
            minutes, [r["delay_p99"] for r in rows], "-", color=color, linewidth=1.8, label=f"{label} p99"
        )
        top.plot(
            minutes, [r["delay_p50"] for r in rows], ":", color=color, linewidth=1.2, label=f"{label} p50"
        )
        bottom.plot(minutes, [r["messages"] for r in rows], color=color, linewidth=1.5, label=label)
    top.set_yscale("log")
    top.set_ylabel("delay ms\n(store -> ack)")
    top.legend(loc="upper left", ncols=2, frameon=False, fontsize=8)
    top.grid(True, alpha=0.3, which="both")
    bottom.set_ylabel("messages / minute")
    _format_time_axis(bottom, sorted({r["minute"] for r in data.replication}))
    return fig
