"""Shared by the benchmark smoke tests: run one ``bench/`` script to its end with this interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run_bench(script: str, *args: str, timeout: float = 300) -> str:
    """Run ``bench/<script> ARGS``; its stdout once it exited 0 (else the test fails with both streams)."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{script} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout
