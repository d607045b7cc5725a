"""The remoting package reaches the broker only through the facade: it imports no backend, no other
protocol and nothing of the server core above it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The mqproxy packages remoting may import (the layers below it, and itself).
ALLOWED = {"codecs", "model", "facade", "runtime", "negotiation", "remoting"}


def _mqproxy_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        found.update(n.split(".")[1] for n in names if n.startswith("mqproxy."))
    return found


@pytest.mark.parametrize(
    "path", sorted((ROOT / "remoting").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_remoting_imports_only_the_layers_below(path: Path) -> None:
    assert _mqproxy_imports(path) <= ALLOWED
