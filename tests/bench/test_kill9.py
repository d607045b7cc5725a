"""``bench/kill9.py``: kill -9 under remoting + MQTT QoS 1 load, restart, nothing acknowledged lost (sync)
or no more than the last flush interval (async), recovery timed. The slow test (in ``make test``) kills
100 times: 50 per flush policy (``MQBENCH_KILL9_ITERATIONS``; ``make kill9`` runs 100 per policy); the quick
ones check the verdict logic."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from .conftest import run_bench  # type: ignore[import-not-found]

BENCH = Path(__file__).resolve().parents[2] / "bench"
ITERATIONS = int(os.environ.get("MQBENCH_KILL9_ITERATIONS", "50"))


def _load_kill9() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_kill9", BENCH / "kill9.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_kill9_iterations_lose_nothing_acknowledged() -> None:
    out = run_bench("kill9.py", "--iterations", str(ITERATIONS), "--seed", "19", timeout=1700)
    for flush in ("sync", "async"):
        lines = re.findall(rf"^{flush} +#\s*\d+: .* lost (\d+) \(window (\d+)\); restart (\d+) ms", out, re.M)
        assert len(lines) == ITERATIONS, out
        for lost, window, _restart in lines:
            assert int(lost) <= (0 if flush == "sync" else int(window)), out
        summary = rf"^summary flush={flush}: {ITERATIONS} kills; acked (\d+) .*; lost (\d+);.* OK$"
        match = re.search(summary, out, re.M)
        assert match, out
        assert int(match.group(1)) > 0
    assert re.search(r"^summary flush=sync: .*; lost 0;", out, re.M), out


def _iteration(kill9: ModuleType, lost: int, window: int) -> object:
    return kill9.Iteration(1, 0.5, 10, 10, 25, lost, window, 900.0, 20.0, 0)


def test_verdict_sync_allows_no_loss_async_allows_the_window() -> None:
    kill9 = _load_kill9()
    assert kill9.summary("sync", [_iteration(kill9, 0, 5)])[1] is True
    assert kill9.summary("sync", [_iteration(kill9, 1, 5)])[1] is False
    assert kill9.summary("async", [_iteration(kill9, 5, 5)])[1] is True
    line, ok = kill9.summary("async", [_iteration(kill9, 6, 5), _iteration(kill9, 0, 9)])
    assert ok is False
    assert "lost 6;" in line
    assert "p50 900 / p95 900 / max 900 ms" in line
