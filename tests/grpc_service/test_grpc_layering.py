"""The gRPC protocol sits on the broker facade: its modules import only the layers below it (codecs, facade,
model, runtime, negotiation) and each other, never a backend, another protocol or the server core; and its
own imports have no cycle. The message conversion and the error mapping are sans-IO."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "grpc_service"
ALLOWED = ("acl", "codecs", "facade", "model", "runtime", "negotiation", "grpc_service")
SANS_IO = ("acl", "convert", "errors")
FORBIDDEN = {"trio", "socket", "ssl", "time", "asyncio", "selectors", "threading"}


def _mqproxy_imports(path: Path) -> set[str]:
    """The ``mqproxy.*`` modules ``path`` imports (relative imports resolved within its package)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("mqproxy."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.add(f"mqproxy.grpc_service.{node.module or ''}".rstrip("."))
            elif node.module and node.module.startswith("mqproxy."):
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


MODULES = sorted(PACKAGE.glob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_module_imports_only_lower_layers(path: Path) -> None:
    for name in _mqproxy_imports(path):
        assert name.split(".")[1] in ALLOWED, f"{path.name} imports {name}"


def test_no_import_cycle() -> None:
    names = {f"mqproxy.grpc_service.{p.stem}" for p in MODULES if p.stem != "__init__"}
    graph = {
        f"mqproxy.grpc_service.{p.stem}": {n for n in _mqproxy_imports(p) if n in names}
        for p in MODULES
        if p.stem != "__init__"
    }
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, " -> ".join((*path, node))
        if node in done:
            return
        for dep in graph[node]:
            visit(dep, (*path, node))
        done.add(node)

    for module in sorted(graph):
        visit(module, ())


@pytest.mark.parametrize("stem", SANS_IO)
def test_pure_module_is_sans_io(stem: str) -> None:
    tree = ast.parse((PACKAGE / f"{stem}.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not {a.name.split(".")[0] for a in node.names} & FORBIDDEN, stem
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            assert (node.module or "").split(".")[0] not in FORBIDDEN, stem
