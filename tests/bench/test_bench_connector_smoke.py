"""Smoke run of ``bench/connector.py --quick``: the baseline (plain pull + send) and the connector each copy
a backlog and a live stream from an mqproxy node to a stock RocketMQ broker in one run; every row copied
everything and prints its rate (and, live, its delay percentiles) with units and the load average; the
ratio and the issue's targets follow.

Needs Java 17 and the Maven jars ``make test`` fetches (``scripts/stock_rocketmq.py fetch``); about a minute,
most of it the stock cluster's start.
"""

from __future__ import annotations

import re

import pytest

from .conftest import run_bench

NUM = r"[0-9][0-9,]*(?:\.[0-9]+)?"


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_connector_bench_prints_figures_for_both_copiers() -> None:
    out = run_bench("connector.py", "--quick", timeout=800)
    assert re.search(r"^uptime before: .*load average", out, re.M), out
    for copier in ("baseline", "connector"):
        backlog = re.search(
            rf"^backlog +{copier} +copied (\d+)/(\d+)  rate ({NUM}) msg/s \({NUM} MB/s\)"
            rf"  copier CPU {NUM} us/msg  load {NUM}$",
            out,
            re.M,
        )
        assert backlog, f"no backlog row for {copier}:\n{out}"
        assert backlog.group(1) == backlog.group(2), backlog.group(0)
        assert float(backlog.group(3).replace(",", "")) > 0
        live = re.search(
            rf"^live +{copier} +copied (\d+)/(\d+)  rate ({NUM}) msg/s \({NUM} MB/s\)"
            rf"  delay p50 ({NUM}) ms  p99 ({NUM}) ms  max {NUM} ms  copier CPU {NUM} us/msg  load {NUM}$",
            out,
            re.M,
        )
        assert live, f"no live row for {copier}:\n{out}"
        assert live.group(1) == live.group(2), live.group(0)
        assert float(live.group(5).replace(",", "")) >= float(live.group(4).replace(",", "")) >= 0
    assert re.search(
        rf"^ratio +connector / baseline: backlog rate {NUM}x  live delay p99 {NUM} ms vs {NUM} ms$", out, re.M
    ), out
    assert re.search(
        r"^target +copy rate >= 5,000 msg/s: .*\((met|below)\); delay p99 <= 1000 ms: .*\((met|below)\)$",
        out,
        re.M,
    ), out
