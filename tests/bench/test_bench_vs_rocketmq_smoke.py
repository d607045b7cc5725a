"""Smoke run of ``bench/vs_rocketmq.py --quick``: mqproxy and a stock Apache RocketMQ 5.3.3 both get
every case (Apache RocketMQ's benchmark Producer and Consumer, the remoting and gRPC latency drivers),
each prints its figures with units, a ratio follows, and nothing failed.

Needs Java 17 and the Maven jars ``make test`` fetches (``scripts/stock_rocketmq.py fetch``); about a
minute and a half on a quiet 2-core machine, most of it the stock cluster's start and the benchmark
Producer's first report (it prints none before its 10th second).
"""

from __future__ import annotations

import re

import pytest

from .conftest import run_bench

NUM = r"[0-9]+(?:\.[0-9]+)?"
TAIL = "  failed 0 "  # then CPU and load
TARGETS = ("mqproxy/async", "rocketmq/async")


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(600)  # ~90 s on a quiet machine; JVM start-ups stretch it on a shared one
def test_vs_rocketmq_bench_prints_figures_for_both_targets() -> None:
    out = run_bench("vs_rocketmq.py", "--quick", timeout=560)
    drain_counts: set[int] = set()
    for target in TARGETS:
        t = re.escape(target)
        assert re.search(
            rf"^producer {t} +TPS +({NUM}) msgs/s  RT avg {NUM} ms  max {NUM} ms  reports [1-9]\d*{TAIL}",
            out,
            re.M,
        ), f"no producer row for {target}:\n{out}"
        match = re.search(
            rf"^drain +{t} +TPS +{NUM} msgs/s  produced (\d+)  counted (\d+)  consumed (\d+)"
            rf"  first \d+ in {NUM} s",
            out,
            re.M,
        )
        assert match, f"no drain row for {target}:\n{out}"
        produced, counted, consumed = (int(match.group(i)) for i in (1, 2, 3))
        assert 0 < counted <= produced
        assert consumed >= counted
        drain_counts.add(counted)
        for case in ("latency", "grpc"):
            row = re.search(
                rf"^{case} +{t} +TPS +({NUM}) msgs/s  p50 {NUM} ms  p99 {NUM} ms  max {NUM} ms"
                rf"  sent (\d+){TAIL}",
                out,
                re.M,
            )
            assert row, f"no {case} row for {target}:\n{out}"
            assert float(row.group(1)) > 0
            assert int(row.group(2)) > 0
    assert len(drain_counts) == 1, f"targets drained different counts {drain_counts}:\n{out}"
    for case, figures in (
        ("producer", "TPS {n}  RT avg {n}"),
        ("drain", "TPS {n}"),
        ("latency", "TPS {n}  p50 {n}  p99 {n}"),
        ("grpc", "TPS {n}  p50 {n}  p99 {n}"),
    ):
        pattern = rf"^ratio +{case} async +mqproxy/rocketmq  " + figures.format(n=NUM)
        assert re.search(pattern, out, re.M), f"no {case} ratio:\n{out}"
    assert re.search(r"^machine: \d+ cores", out, re.M), out
    assert re.search(r"^software: .*version", out, re.M), out
    assert re.search(r"^uptime before: .*load average", out, re.M), out
    assert re.search(r"^uptime after: .*load average", out, re.M), out
    assert re.search(r"^\| producer \| [0-9,]+ msgs/s", out, re.M), out
    assert "FAILED" not in out
