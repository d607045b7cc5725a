"""Figures the benchmarks print besides their own: latency percentiles and the machine's load line."""

from __future__ import annotations

import os
import statistics
import subprocess

__all__ = ["percentile", "uptime"]


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (1..99, inclusive method) of ``values``; NaN when empty, the value when one."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def uptime() -> str:
    """``uptime``'s line (load averages); the load averages alone where ``uptime`` is missing."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        load = os.getloadavg()
        return f"load average: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}"
