"""Smoke runs of ``bench/mqtt_idle.py`` and ``bench/mqtt_codec.py`` with tiny parameters: they finish and
print a figure for every column (mosquitto's row only when it is installed)."""

from __future__ import annotations

import re

import pytest

from .conftest import run_bench

NUMBER = r"-?[0-9]+(?:\.[0-9]+)?"  # an RSS delta of 20 connections may be 0 or below


@pytest.mark.slow
def test_mqtt_idle_bench_prints_every_figure() -> None:
    # /proc CPU times tick every 10 ms: 20 CONNECTs at ~300 µs each can all fall in one tick and read 0,
    # so the connect phase gets enough CONNECTs to span several ticks
    out = run_bench("mqtt_idle.py", "--conns", "200", "--subscribes", "20", "--no-peer")
    assert "200 idle connections, 20 SUBSCRIBEs" in out, out
    row = re.search(rf"^mqproxy((?:\s+{NUMBER}){{6}})\s*$", out, re.M)
    assert row is not None, out
    traced, _rss, connect_us, *_ = (float(v) for v in row.group(1).split())
    assert traced > 0, out
    assert connect_us > 0, out


@pytest.mark.slow
def test_mqtt_codec_bench_prints_every_case() -> None:
    out = run_bench("mqtt_codec.py", "--rounds", "1")
    assert re.search(r"^server\s+v4 qos0\s+v4 qos1\s+v5 qos0\s+v5 qos1\s*$", out, re.M), out
    assert re.search(rf"^mqproxy(?:\s+{NUMBER}){{4}}\s*$", out, re.M), out
