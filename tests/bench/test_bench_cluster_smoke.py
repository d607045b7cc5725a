"""Smoke run of ``bench/cluster.py --quick``: Apache RocketMQ's benchmark Producer and Consumer go through
each of the four paths (direct to the stock brokers, RocketMQ's proxy in cluster mode, one and two mqproxy
nodes on the rocketmq backend) in one run, every row prints a positive figure with its unit, the ratios
against RocketMQ's proxy and direct follow, and the MQTT fan-in row gives the embedded figure beside the
figure through a cluster node.

Needs Java 17 and the Maven jars ``make test`` fetches (``scripts/stock_rocketmq.py fetch``); a few minutes
on a 2-core machine, most of it the stock cluster's start (name server, two brokers, RocketMQ's proxy) and
the benchmark Producer's first report (it prints none before its 10th second).
"""

from __future__ import annotations

import re

import pytest

from .conftest import run_bench

NUM = r"[0-9]+(?:\.[0-9]+)?"
PATHS = ("direct", "RocketMQ proxy", "mqproxy x1", "mqproxy x2")


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(1500)  # ~5 min on a busy shared machine
def test_cluster_bench_prints_figures_for_every_path() -> None:
    out = run_bench("cluster.py", "--quick", timeout=1400)
    routes = re.search(r"^set-up: .*write queues per broker in each path's route: (.*)$", out, re.M)
    assert routes, out
    assert "direct [4, 4]" in routes.group(1), routes.group(0)
    assert "mqproxy x1 [8]" in routes.group(1), routes.group(0)  # a node presents itself as the one broker
    for path in PATHS:
        p = re.escape(path)
        producer = re.search(
            rf"^producer {p} +TPS +({NUM}) msgs/s  RT avg {NUM} ms  max {NUM} ms  reports [1-9]\d*  failed 0"
            rf".*\(2 producers: (\d+) \+ (\d+) msgs/s",
            out,
            re.M,
        )
        assert producer, f"no producer row for {path}:\n{out}"
        # the row's figure is positive; one of its two producers may report 0 on a loaded machine, when
        # its sender threads died of route look-ups over the client's 3 s budget (the row says so)
        assert float(producer.group(1)) > 0
        assert int(producer.group(2)) + int(producer.group(3)) > 0, producer.group(0)
        drain = re.search(
            rf"^drain +{p} +TPS +({NUM}) msgs/s  produced (\d+)  consumed (\d+)  drained in {NUM} s"
            rf"  first after {NUM} s  failed 0 .*\(2 consumers: (\d+) \+ (\d+)",
            out,
            re.M,
        )
        assert drain, f"no drain row for {path}:\n{out}"
        assert float(drain.group(1)) > 0
        produced, consumed = int(drain.group(2)), int(drain.group(3))
        assert produced > 0, drain.group(0)
        assert consumed >= produced, drain.group(0)
        assert int(drain.group(4)) + int(drain.group(5)) == consumed, drain.group(0)
    for case in ("producer", "drain"):
        for path in ("mqproxy x1", "mqproxy x2"):
            assert re.search(
                rf"^ratio +{case} +{re.escape(path)} +TPS / RocketMQ proxy {NUM} "
                rf"\(target >= 1\.0: (met|below)\)  / direct {NUM} \(target >= 0\.5: (met|below)\)$",
                out,
                re.M,
            ), f"no {case} ratio for {path}:\n{out}"
    mqtt = re.search(
        r"^mqtt +fan-in QoS 1 \(10→1\)  embedded mqproxy ([0-9,]+) msgs/s \(step [0-9,]+ pub/s\)  \|  "
        r"cluster \(mqproxy node\) ([0-9,]+) msgs/s \(step [0-9,]+ pub/s\)$",
        out,
        re.M,
    )
    assert mqtt, f"no MQTT row:\n{out}"
    assert int(mqtt.group(1).replace(",", "")) > 0
    assert int(mqtt.group(2).replace(",", "")) > 0, "QoS 1 fan-in through a cluster node"
    assert re.search(r"^\| producer \| [0-9,]+ msgs/s", out, re.M), out
    assert re.search(r"^\| drain \| [0-9,]+ msgs/s", out, re.M), out
    assert re.search(r"^uptime after: .*load average", out, re.M), out
    assert "FAILED" not in out
