"""Free ports for the launcher's JVMs (scripts/jvm_processes.py)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import jvm_processes  # noqa: E402


def test_free_port_keeps_neighbours_free() -> None:
    port = jvm_processes.free_port(neighbours=(-2, 1))
    assert all(jvm_processes._port_free(port + d) for d in (-2, 0, 1))
