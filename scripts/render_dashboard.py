#!/usr/bin/env python3
"""Draw the Grafana dashboard ``config/grafana/mqproxy.json`` as a PNG (``docs/dashboard.png``) from its own
queries, evaluated by a stock Prometheus against a live mqproxy under load. No Grafana is involved:
Grafana is AGPL-licensed and this project does not use it, and the machines have no container engine.

The set-up is the one of ``tests/e2e/test_grafana_prometheus.py`` (``scripts/dashboard_rig.py``: a node, a
second node, a Message Connector copying one topic between them, Prometheus scraping every second). The
load runs for ``--seconds`` (60): rounds of MQTT publishes, remoting sends, a consumer group whose lag rises
and falls, an unsupported request and a garbage connection, at a rate that swells and ebbs. Then every
panel's targets are asked of Prometheus as Grafana would (``scripts/grafana_panels.py``: a 1 s step and
``$__rate_interval`` = 4 s, every variable "All"), and each panel is drawn in its grid place with its title,
unit and legend (``legendFormat``); a table panel shows the last values of its instant queries, merged.

    .venv/bin/python scripts/render_dashboard.py [--seconds 60] [--out docs/dashboard.png]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dashboard_rig  # scripts/ is not a package
import grafana_panels

REPO = Path(__file__).resolve().parents[1]
SCRAPE_S = 1.0
MAX_POINTS = 1000
ROW_UNIT_IN = 0.28  # height of one grid unit (Grafana: 30 px)
WIDTH_IN = 18.0
COLORS = ("#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9", "#705da0",
          "#508642", "#cca300")


def _si(value: float, suffix: str, base: float = 1000.0, prefixes: str = " kMGTP") -> str:
    if value == 0 or not math.isfinite(value):
        return f"0 {suffix}".strip() if value == 0 else str(value)
    n = 0
    while abs(value) >= base and n < len(prefixes) - 1:
        value /= base
        n += 1
    prefix = prefixes[n].strip()
    if base == 1024 and prefix:
        prefix += "i"
    return f"{value:.3g} {prefix}{suffix}".strip()


def _seconds(value: float) -> str:
    if value == 0:
        return "0 s"
    if abs(value) < 1e-3:
        return f"{value * 1e6:.3g} µs"
    if abs(value) < 1:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s"


#: Grafana unit id → axis label formatter, for the units the dashboard uses.
UNITS: dict[str, Callable[[float], str]] = {
    "short": lambda v: _si(v, ""),
    "cps": lambda v: _si(v, "c/s"),
    "reqps": lambda v: _si(v, "req/s"),
    "Bps": lambda v: _si(v, "B/s"),
    "bytes": lambda v: _si(v, "B", 1024.0, " KMGTP"),
    "s": _seconds,
    "percentunit": lambda v: f"{v * 100:.3g}%",
}


def load(rig: dashboard_rig.Rig, seconds: float) -> None:
    """Rounds of traffic for ``seconds``, paced one per second, with a swelling and ebbing rate and lag."""
    began = time.monotonic()
    while (elapsed := time.monotonic() - began) < seconds:
        wave = 0.5 + 0.5 * math.sin(2 * math.pi * elapsed / 40)
        rig.traffic(mqtt_count=10 + int(40 * wave), remoting_count=5 + int(25 * wave),
                    lag_per_queue=int(1 + 6 * wave))
        pause = 1.0 - (time.monotonic() - began - elapsed)
        if pause > 0:
            time.sleep(pause)  # pacing of a load generator, not a wait for a condition


#: Panel id → one frame (Prometheus result list) per target, and the range's start (Unix seconds).
Frames = dict[str, Any]


def fetch(prometheus: Any, dashboard: dict[str, Any], start: float, end: float, step: float) -> Frames:
    """Every target's answer, asked as Grafana would (range query, or instant at ``end`` for tables)."""
    frames: dict[str, list[list[dict[str, Any]]]] = {}
    variables = grafana_panels.variables(dashboard)
    for panel in grafana_panels.panels(dashboard):
        for target in panel.targets:
            expr = grafana_panels.substitute(target.expr, interval=step, scrape_interval_s=SCRAPE_S,
                                             values={"instance": None, "group": None, "rule": None},
                                             known=variables)
            if target.instant:
                answer = prometheus.api("query", query=expr, time=end)
            else:
                answer = prometheus.query_range(expr, start, end, step)
            if answer.get("status") != "success":
                raise SystemExit(f"render_dashboard: {expr}: {answer.get('error')}")
            frames.setdefault(str(panel.id), []).append(answer["data"]["result"])
    return {"start": start, "panels": frames}


def _timeseries(ax: Axes, panel: grafana_panels.Panel, frames: Sequence[list[dict[str, Any]]],
                start: float) -> None:
    n = 0
    for target, frame in zip(panel.targets, frames, strict=True):
        for series in frame:
            xs = [float(t) - start for t, _ in series["values"]]
            ys = [float(v) for _, v in series["values"]]
            ax.plot(xs, ys, color=COLORS[n % len(COLORS)], linewidth=1.2,
                    label=grafana_panels.legend(target.legend, series["metric"]))
            n += 1
    fmt = UNITS.get(panel.unit, UNITS["short"])
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: fmt(v)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:.0f} s"))
    ax.tick_params(labelsize=6.5, colors="#c7d0d9")
    ax.grid(color="#2c3235", linewidth=0.5)
    if n == 0:
        ax.text(0.5, 0.5, "No data", transform=ax.transAxes, ha="center", va="center", color="#8e8e8e",
                fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    handles, labels = ax.get_legend_handles_labels()
    columns = max(1, panel.w // 4)
    if len(labels) > 3 * columns:  # Grafana scrolls a long legend; here the first rows and a count
        handles, labels = handles[: 3 * columns - 1], labels[: 3 * columns - 1]
        handles.append(plt.Line2D([], [], color="none"))
        labels.append(f"+{n - len(labels)} more")
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(0.0, -0.1), ncol=columns, fontsize=6,
              frameon=False, labelcolor="#c7d0d9", handlelength=1.2, columnspacing=1.0)


def _table(ax: Axes, panel: grafana_panels.Panel, frames: Sequence[list[dict[str, Any]]]) -> None:
    """Instant frames merged on their common labels (Grafana's "merge" transformation)."""
    keys = ("group", "topic", "broker", "queue")
    rows: dict[tuple[str, ...], dict[str, str]] = {}
    for target, frame in zip(panel.targets, frames, strict=True):
        for series in frame:
            key = tuple(series["metric"].get(k, "") for k in keys)
            rows.setdefault(key, {})[target.legend] = f"{float(series['value'][1]):.0f}"
    columns = [*keys, *(t.legend for t in panel.targets)]
    cells = [[*key, *(values.get(t.legend, "") for t in panel.targets)]
             for key, values in sorted(rows.items(), key=lambda kv: (kv[0][:3], int(kv[0][3] or 0)))]
    ax.axis("off")
    if not cells:
        ax.text(0.5, 0.5, "No data", transform=ax.transAxes, ha="center", va="center", color="#8e8e8e")
        return
    table = ax.table(cellText=cells[:8], colLabels=columns, loc="upper center", cellLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    for cell in table.get_celld().values():
        cell.set_edgecolor("#2c3235")
        cell.set_facecolor("#181b1f")
        cell.get_text().set_color("#c7d0d9")


def draw(dashboard: dict[str, Any], data: Frames, out: Path) -> None:
    start = float(data["start"])
    panels = grafana_panels.panels(dashboard)
    rows = max(p.y + p.h for p in panels)
    fig = plt.figure(figsize=(WIDTH_IN, rows * ROW_UNIT_IN + 0.6), facecolor="#111217")
    height = rows * ROW_UNIT_IN + 0.6
    caption = f"{dashboard['title']}: the dashboard's queries on Prometheus, drawn (not a Grafana screenshot)"
    fig.text(0.01, 1 - 0.3 / height, caption, color="#d8d9da", fontsize=11, va="center")

    def box(p: grafana_panels.Panel) -> tuple[float, float, float, float]:
        top = (0.6 + p.y * ROW_UNIT_IN) / height
        return p.x / 24, 1 - top - p.h * ROW_UNIT_IN / height, p.w / 24, p.h * ROW_UNIT_IN / height

    for panel in panels:
        left, bottom, width, tall = box(panel)
        if panel.type == "row":
            fig.text(left + 0.005, bottom + tall / 2, panel.title, color="#d8d9da", fontsize=10,
                     fontweight="bold", va="center")
            continue
        frames = data["panels"][str(panel.id)]
        # the plot area inside the panel: room for the title above and the legend below
        pad_x, pad_top, pad_bottom = 0.045 * 8 / panel.w * 0.9, 0.4 / height, 0.75 / height
        back = fig.add_axes((left + 0.002, bottom + 0.002 / height, width - 0.004, tall - 0.004 / height))
        back.set_facecolor("#181b1f")
        back.set_xticks([])
        back.set_yticks([])
        for spine in back.spines.values():
            spine.set_color("#2c3235")
        back.text(0.008 * 24 / panel.w, 1 - 0.12 / (panel.h * ROW_UNIT_IN), panel.title,
                  transform=back.transAxes, fontsize=8.5, color="#d8d9da", va="top")
        ax = fig.add_axes((left + pad_x, bottom + pad_bottom, width - pad_x - 0.01,
                           tall - pad_top - pad_bottom))
        ax.set_facecolor("#181b1f")
        for spine in ax.spines.values():
            spine.set_visible(False)
        if panel.type == "table":
            _table(ax, panel, frames)
        else:
            _timeseries(ax, panel, frames, start)
    out.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=72, facecolor=fig.get_facecolor())
    plt.close(fig)
    # a 64-colour palette keeps the PNG small (a dark page of thin lines has few colours anyway)
    image = Image.open(buffer).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    image.save(out, optimize=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the load runs")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "dashboard.png")
    parser.add_argument("--save-data", type=Path, help="also write the query answers there (JSON)")
    parser.add_argument("--from-data", type=Path, help="draw answers saved by --save-data; run nothing")
    opts = parser.parse_args(argv)
    dashboard = grafana_panels.load()
    if opts.from_data:
        draw(dashboard, json.loads(opts.from_data.read_text()), opts.out)
    else:
        with tempfile.TemporaryDirectory(prefix="mqdash-") as tmp, dashboard_rig.running_rig(
            Path(tmp), scrape_interval_s=SCRAPE_S
        ) as rig:
            start = time.time()
            load(rig, opts.seconds)
            rig.wait_scraped(time.time())
            end = time.time()
            step = grafana_panels.interval_s(end - start, MAX_POINTS, SCRAPE_S)
            data = fetch(rig.prometheus, dashboard, start // step * step, end // step * step, step)
        if opts.save_data:
            opts.save_data.write_text(json.dumps(data))
        draw(dashboard, data, opts.out)
    print(f"{opts.out}: {opts.out.stat().st_size // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
