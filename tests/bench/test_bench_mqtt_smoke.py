"""Smoke run of the MQTT benchmark with tiny parameters: it finishes and prints every figure line, for
mqproxy and for each peer broker installed by scripts/setup-bench-peers.sh (peers missing → mqproxy only)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from .conftest import run_bench

ROOT = Path(__file__).resolve().parents[2]
FLOAT = r"[0-9]+(?:\.[0-9]+)?"
IDLE = 40


def _brokers() -> list[str]:
    brokers = ["mqproxy"]
    if shutil.which("mosquitto") or os.access("/usr/sbin/mosquitto", os.X_OK):
        brokers.append("mosquitto")
    if os.access(ROOT / ".clients" / "amqtt" / "bin" / "amqtt", os.X_OK):
        brokers.append("amqtt")
    return brokers


@pytest.mark.slow
def test_mqtt_bench_prints_every_figure() -> None:
    brokers = _brokers()
    argv = [
        "--only", ",".join(brokers),
        "--seconds", "0.5", "--warmup", "0.2", "--drain", "2",
        "--rates-qos0", "20,40", "--rates-qos1", "20", "--rates-fan-out", "1", "--fan-out", "5",
        "--latency-rate", "100", "--latency-seconds", "0.5",
        "--idle", str(IDLE), "--idle-hold", "0.2",
        "--lmqs", "500", "--lmq-baseline", "20", "--lmq-producers", "2",
    ]  # fmt: skip
    out = run_bench("mqtt.py", *argv)
    assert re.search(r"^mqtt benchmark: .*load average", out, re.M), out
    assert re.search(r"^load average at end: ", out, re.M), out
    for broker in brokers:
        for case, unit in (
            ("fan-in QoS 0 \\(10→1\\)", "msgs/s"),
            ("fan-in QoS 1 \\(10→1\\)", "msgs/s"),
            ("fan-out QoS 0 \\(1→5\\)", "deliveries/s"),
        ):
            line = rf"^{case} +{broker} +max sustained +(?:{FLOAT}|-) {unit} \(.*(?:ladder top|next step)"
            assert re.search(line, out, re.M), f"no {case} line for {broker}:\n{out}"
        for qos in (0, 1):
            match = re.search(
                rf"^latency 1→1 QoS {qos} +{broker} +@100 msgs/s +p50 +{FLOAT} ms +p90 +{FLOAT} ms"
                rf" +p99 +{FLOAT} ms +max +{FLOAT} ms +n=(\d+) \(published (\d+), delivered (\d+)\)",
                out,
                re.M,
            )
            assert match, f"no QoS {qos} latency line for {broker}:\n{out}"
            assert int(match.group(1)) > 0
            assert match.group(2) == match.group(3), match.group(0)
        match = re.search(
            rf"^idle {IDLE} +{broker} +(\d+)/{IDLE} connected in +{FLOAT} s = +{FLOAT} conn/s; broker RSS"
            rf" +{FLOAT} → +{FLOAT} MiB = +-?{FLOAT} B/conn; PINGRESP (\d+)/(\d+)",
            out,
            re.M,
        )
        assert match, f"no idle line for {broker}:\n{out}"
        assert match.group(1) == match.group(2) == match.group(3) == str(IDLE), match.group(0)
        assert re.search(rf"^peak RSS +{broker} +{FLOAT} MiB", out, re.M), out
    for line in (
        rf"^lmq baseline +mqproxy-lmq plain send \(no dispatch\): +{FLOAT} msgs/s",
        rf"^lmq create 500 +mqproxy-lmq 5 msgs x 100 new LMQs: +{FLOAT} msgs/s = +{FLOAT} LMQ dispatches/s",
        rf"^lmq memory 500 +mqproxy-lmq RSS {FLOAT} → {FLOAT} MiB = +-?{FLOAT} B/LMQ;"
        rf" store {FLOAT} → {FLOAT} MiB = +{FLOAT} B/LMQ",
        rf"^lmq dispatch existing +mqproxy-lmq 5 msgs x 100 existing LMQs: +{FLOAT} msgs/s",
    ):
        assert re.search(line, out, re.M), f"no line {line!r}:\n{out}"
