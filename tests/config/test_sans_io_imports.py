"""The message model, codecs, the sniffer and the protocol cores are sans-IO: they must not import I/O, clocks
or event loops."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE_DIRS = ["model", "codecs", "negotiation", "acl"]
#: Sans-IO protocol cores (and the pure modules they build on) inside packages that also hold adapters.
PURE_MODULES = [
    "mqtt/protocol.py",
    "mqtt/outcomes.py",
    "mqtt/config.py",
    "mqtt/cursor.py",
    "mqtt/mapping.py",
    "mqtt/subscriptions.py",
    "connector/rules.py",
    "connector/origin.py",
    "connector/progress.py",
    "proxy/console_view.py",
    "proxy/console_auth.py",
    "proxy/console_assets.py",
    "proxy/rejections.py",
]
FORBIDDEN = {"trio", "socket", "ssl", "time", "asyncio", "selectors", "threading"}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize(
    "path",
    sorted([p for d in PURE_DIRS for p in (ROOT / d).rglob("*.py")] + [ROOT / m for m in PURE_MODULES]),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_module_is_sans_io(path: Path) -> None:
    assert not (_imports(path) & FORBIDDEN)
