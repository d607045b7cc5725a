"""The packages of ``mqproxy`` form a one-way stack (README, "Architecture").

Each package has a layer; a module may import only packages of a lower layer or its own package. Protocols
never import a backend, backends never import a protocol, and the server core reaches the protocols only
through its one registry of protocol services (``proxy/routes.py``). A test fails on any import that
breaks this, including one made only for type checking (a cycle for the type checker is a cycle in the
design).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: package -> layer; a module may import its own package and packages of a strictly lower layer.
LAYERS: dict[str, int] = {
    "mqproxy.model": 0,
    "mqproxy.config": 0,
    "mqproxy.codecs": 1,
    "mqproxy.codecs.mqtt": 1,
    "mqproxy.negotiation": 1,
    "mqproxy.acl": 1,
    "mqproxy.facade": 2,
    "mqproxy.runtime": 2,
    "mqproxy.remoting_client": 2,
    "mqproxy.backends": 3,
    "mqproxy.backends.embedded": 3,
    "mqproxy.backends.rocketmq": 3,
    "mqproxy.remoting": 4,
    "mqproxy.mqtt": 4,
    "mqproxy.grpc_service": 4,
    "mqproxy.spark_etl": 4,
    "mqproxy.connector": 4,
    "mqproxy": 5,
    # the fuzzing campaign's harness: a tool over every codec and protocol core, imported by nothing
    "mqproxy.fuzz": 6,
}
#: Packages of one layer that must not import each other (no protocol reaches into another).
SIBLINGS_APART = {3, 4}
#: The server core modules allowed to import protocol packages: the one registry of protocol services, and
#: the settings loader, which checks each protocol's configuration with that protocol's own parsers.
REGISTRY = {"mqproxy.routes", "mqproxy.settings"}
PROTOCOLS = {"mqproxy.remoting", "mqproxy.mqtt", "mqproxy.grpc_service"}


def _package_dirs() -> dict[str, Path]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    mapping = config["tool"]["setuptools"]["package-dir"]
    return {package: ROOT / folder for package, folder in mapping.items()}


def _modules() -> list[tuple[str, str, Path]]:
    """(module name, its package, file) of every module of the installed packages."""
    found = []
    for package, folder in _package_dirs().items():
        for path in sorted(folder.glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            found.append((name, package, path))
    return found


def _package_of(module: str, packages: set[str]) -> str | None:
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in packages:
            return candidate
    return None


def _imported(path: Path, package: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: -(node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return {n for n in names if n == "mqproxy" or n.startswith("mqproxy.")}


def _violations() -> list[str]:
    packages = set(_package_dirs())
    assert packages <= set(LAYERS), f"give these packages a layer: {sorted(packages - set(LAYERS))}"
    bad = []
    for name, package, path in _modules():
        own = LAYERS[package]
        for target in sorted(_imported(path, package)):
            other = _package_of(target, packages)
            if other is None or other == package:
                continue
            layer = LAYERS[other]
            where = f"{path.relative_to(ROOT)} imports {other}"
            if layer > own:
                bad.append(f"{where}: upward (layer {own} -> {layer})")
            elif layer == own and own in SIBLINGS_APART and not other.startswith(package + "."):
                if not package.startswith(other + ".") and not other.startswith(package):
                    bad.append(f"{where}: sibling package of the same layer")
            if package == "mqproxy" and other in PROTOCOLS and name not in REGISTRY:
                bad.append(f"{where}: the server core reaches protocols only through {sorted(REGISTRY)}")
    return sorted(set(bad))


def test_every_import_goes_down_the_stack() -> None:
    assert _violations() == []


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_layer_table_names_real_packages(package: str) -> None:
    assert package in _package_dirs()
