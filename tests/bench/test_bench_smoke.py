"""Smoke runs of the remoting benchmarks with tiny parameters: they finish, print their figures, and
the kill -9 durability check loses nothing acknowledged."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from .conftest import run_bench

BENCH = Path(__file__).resolve().parents[2] / "bench"
FLOAT = r"[0-9]+(?:\.[0-9]+)?"


def _load_durability() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_durability", BENCH / "durability.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_remoting_bench_prints_every_figure() -> None:
    args = "--messages 200 --seconds 2 --producers 1,4 --bodies 128 --backlog 200 --warmup 20"
    out = run_bench("remoting.py", *args.split())
    for target in ("baseline", "mqproxy async", "mqproxy sync"):
        for producers in (1, 4):
            line = (
                rf"^send  {target} +128 B +{producers} prod +{FLOAT} msgs/s +{FLOAT} MB/s"
                rf" +p50 +{FLOAT} ms +p99 +{FLOAT} ms"
            )
            assert re.search(line, out, re.M), f"no send line for {target}/{producers}:\n{out}"
        for consumers in (1, 4):
            line = rf"^drain {target} +128 B +{consumers} cons +{FLOAT} msgs/s +{FLOAT} MB/s +n=200\b"
            assert re.search(line, out, re.M), f"no drain line for {target}/{consumers}:\n{out}"
        match = re.search(rf"^peak RSS {target} +({FLOAT}) MiB", out, re.M)
        assert match, f"no peak RSS for {target}:\n{out}"
        assert float(match.group(1)) > 1
    assert "FAILED" not in out


@pytest.mark.slow
def test_durability_loses_nothing_acknowledged_after_kill9() -> None:
    out = run_bench(
        "durability.py", "--rounds", "1", "--connections", "4", "--kill-min-s", "0.2", "--kill-max-s", "0.6"
    )
    assert re.search(r"^round 1: killed after .* lost 0; misplaced 0;", out, re.M), out
    match = re.search(r"^lost: (\d+) of (\d+) acknowledged$", out, re.M)
    assert match, out
    assert int(match.group(1)) == 0
    assert int(match.group(2)) > 0


def test_durability_check_counts_lost_and_misplaced() -> None:
    """The comparison is not vacuous: a missing ack is lost, a moved or altered one misplaced."""
    dur = _load_durability()
    acked = {
        "K1": dur.Ack(0, 0, "m1"),
        "K2": dur.Ack(1, 0, "m2"),
        "K3": dur.Ack(2, 5, "m3"),
        "K4": dur.Ack(3, 0, "m4"),
    }
    stored = [
        ("K1", 0, 0, dur.body_for("K1", 16)),
        ("K3", 2, 6, dur.body_for("K3", 16)),  # wrong offset
        ("K4", 3, 0, b"x" * 16),  # wrong body
        ("K4", 3, 1, dur.body_for("K4", 16)),  # duplicate
        ("K9", 1, 0, dur.body_for("K9", 16)),  # stored, never acknowledged
    ]
    result = dur.RoundResult(acked=4, attempted=5, refused=0, kill_after_s=0.0)
    dur._compare(acked, stored, 16, result)
    assert (result.lost, result.misplaced, result.duplicates, result.unacked_stored) == (1, 2, 1, 1)
    assert result.read_back == 5


@pytest.mark.slow
def test_cpu_bench_prints_cpu_per_message_for_every_case() -> None:
    args = "--rounds 1 --seconds 0.5 --warmup 0.2 --drain 1 --rate-qos0 200 --rate-qos1 100 --messages 200"
    out = run_bench("cpu.py", *args.split(), "--no-peers")
    for case in ("qos0", "qos1", "remoting"):
        assert re.search(rf"^  round 1  mqproxy +{case} +{FLOAT} us CPU/msg$", out, re.M), out
        assert re.search(rf"^  {case} +mqproxy +{FLOAT} us \(1\.00x\)", out, re.M), out


@pytest.mark.slow
def test_disk_bytes_bench_prints_the_breakdown() -> None:
    out = run_bench("disk_bytes.py", "--messages", "300")
    assert re.search(r"^commit log: 300 records, \d+ B on disk, " + FLOAT + " B per message$", out, re.M), out
    for section in ("body", "frame header", "topic", "property MQTT_TOPIC"):
        match = re.search(rf"^  {section} +({FLOAT}) B/message$", out, re.M)
        assert match, f"no {section} line:\n{out}"
    assert re.search(r"^  body +64\.0 B/message$", out, re.M), out
    assert re.search(rf"^  cqd +\d+ pages +{FLOAT} B/message +900 entries +{FLOAT} B/entry$", out, re.M), out
    match = re.search(rf"^total on disk: ({FLOAT}) B per message", out, re.M)
    assert match, out
    assert 64 < float(match.group(1)) < 2000


@pytest.mark.slow
def test_append_cpu_bench_prints_both_figures() -> None:
    out = run_bench("append_cpu.py", "--messages", "640", "--rounds", "1")
    assert re.search(rf"^store\.send, 64 tasks, batch 1: min {FLOAT} µs CPU/message", out, re.M), out
    assert re.search(rf"^encode_message alone: min {FLOAT} µs CPU/message", out, re.M), out


@pytest.mark.slow
def test_append_cpu_bench_with_a_reader_and_batches() -> None:
    # the reader follows an LMQ until every message came, so the run ending at all is part of the check
    out = run_bench("append_cpu.py", "--messages", "640", "--rounds", "1", "--reader", "--batch", "4")
    shape = "64 tasks, batch 4, a reader"
    assert re.search(rf"^store\.send, {shape}: min {FLOAT} µs CPU/message", out, re.M), out
