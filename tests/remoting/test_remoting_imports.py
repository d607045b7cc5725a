"""The remoting package reaches the broker only through the facade: it imports no backend, no other
protocol and nothing of the server core above it; and only its drivers touch I/O, clocks or trio."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The mqproxy packages remoting may import (the layers below it, access control included, and itself).
ALLOWED = {"codecs", "model", "facade", "runtime", "negotiation", "remoting", "acl"}
#: Single modules of other packages it may import: the frame outbox its connections share with the
#: remoting client (a trio writer; it knows nothing of brokers).
ALLOWED_MODULES = {"mqproxy.remoting_client.outbox"}
#: The modules that may wait, time or do I/O: the connection driver, its socket wire and service, the
#: session (latency), pop (long polls and pop times) and produce (time-based unique keys).
DRIVERS = {"connection.py", "wire.py", "service.py", "session.py", "pop.py", "produce.py"}
IO = {"trio", "socket", "ssl", "time", "asyncio", "selectors", "threading"}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _mqproxy_imports(path: Path) -> set[str]:
    return {n.split(".")[1] for n in _imports(path) if n.startswith("mqproxy.") and n not in ALLOWED_MODULES}


@pytest.mark.parametrize(
    "path", sorted((ROOT / "remoting").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_remoting_imports_only_the_layers_below(path: Path) -> None:
    assert _mqproxy_imports(path) <= ALLOWED


@pytest.mark.parametrize(
    "path",
    sorted(p for p in (ROOT / "remoting").rglob("*.py") if p.name not in DRIVERS),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_protocol_modules_are_sans_io(path: Path) -> None:
    assert not {n.split(".")[0] for n in _imports(path)} & IO
