"""Smoke run of ``bench/remoting_services.py`` with tiny parameters: it finishes, every case prints its
figures with units, nothing is lost (the script exits non-zero when a drain, a check-back or a commit
falls short, or a delayed message is delivered early)."""

from __future__ import annotations

import re

import pytest

from .conftest import run_bench

NUM = r"[0-9]+(?:\.[0-9]+)?"


@pytest.mark.slow
def test_services_bench_prints_every_figure() -> None:
    args = "--messages 200 --consumers 1,3 --scheduled 300 --checks 60 --check-delay 1"
    out = run_bench("remoting_services.py", *args.split())
    assert re.search(r"^# load before: .*load average", out, re.M), out
    assert re.search(r"^# load after: .*load average", out, re.M), out
    for consumers in (1, 3):
        pull = rf"^pull +{consumers} cons +200 msgs +{NUM} msgs/s +pull p50 {NUM} ms p99 {NUM} ms"
        pop = (
            rf"^pop +{consumers} cons +200 msgs +{NUM} msgs/s +pop p50 {NUM} ms p99 {NUM} ms"
            rf" +ack p50 {NUM} ms p99 {NUM} ms +proxy cpu {NUM} us/msg"
        )
        assert re.search(pull, out, re.M), out
        assert re.search(pop, out, re.M), out
    assert re.search(rf"^sched empty +0 msgs .* restart {NUM} s", out, re.M), out
    assert re.search(rf"^sched plain +300 msgs +send +{NUM} msgs/s +rss {NUM} -> {NUM} MiB", out, re.M), out
    assert re.search(rf"^sched delayed +300 msgs .* restart {NUM} s .* delivered early 0$", out, re.M), out
    checks = re.search(
        rf"^txn +check-back 60 checks in {NUM} s ({NUM}) checks/s .* all 60 committed", out, re.M
    )
    assert checks is not None, out
    assert float(checks.group(1)) > 0
