"""Smoke run of the gRPC benchmark with tiny parameters: it finishes and prints every figure, for both
protocols and both client counts, with nothing failed."""

from __future__ import annotations

import re

import pytest

from .conftest import run_bench

FLOAT = r"[0-9]+(?:\.[0-9]+)?"


@pytest.mark.slow
def test_grpc_bench_prints_every_figure() -> None:
    # --seconds is only a bound: every case sends its 160 messages (n=160 below), however slow the box
    out = run_bench("grpc.py", *"--messages 160 --seconds 240 --clients 1,4 --warmup 10 --batch 8".split())
    for kind, unit in (("send", "send"), ("recv", None)):
        for protocol in ("grpc", "remoting"):
            for clients in (1, 4):
                per = unit or ("receive\\+ack" if protocol == "grpc" else "pull")
                line = (
                    rf"^{kind} {protocol} +128 B +{clients} cli +({FLOAT}) msgs/s +p50 +{FLOAT} ms"
                    rf" +p99 +{FLOAT} ms per {per} +n=(\d+)"
                )
                match = re.search(line, out, re.M)
                assert match, f"no {kind} line for {protocol}/{clients}:\n{out}"
                assert float(match.group(1)) > 0
                assert int(match.group(2)) == 160
    assert re.search(r"^uptime before: .*load average", out, re.M), out
    assert re.search(r"^uptime after: .*load average", out, re.M), out
    assert re.search(rf"^peak RSS mqproxy {FLOAT} MiB", out, re.M), out
    assert "FAILED" not in out
