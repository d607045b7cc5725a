#!/usr/bin/env python3
"""Build the Go client drivers of the e2e tests (``tests/e2e/go``) with ``go build``, once per source hash.

The Go module ``tests/e2e/go`` (``go.mod`` + ``go.sum`` committed) holds one ``main`` package per
driver (``remoting``: rocketmq-client-go/v2, ``grpc5``: the RocketMQ 5 gRPC client). Binaries land in
the cache folder outside git (``java_toolchain.CACHE / "go"``, i.e. ``$MQTEST_CACHE/go``), in a
folder named by the hash of every source file and the Go version, so an edit or a new toolchain rebuilds
and an unchanged tree builds nothing. Modules come from the Go module proxy into the usual module cache;
``-mod=readonly`` means a build never edits ``go.mod``/``go.sum``.

Contracts:

* :func:`build` returns the path of a built driver binary, or raises :class:`GoBuildError` whose
  message is one line saying what failed (Go missing, Go module proxy unreachable, compile error).
* Concurrent builds of the same tree (pytest-xdist, ``make`` and a test) wait on one file lock.

Command line (``make test`` runs the first, so the tests find the binaries built)::

    python scripts/go_drivers.py build          # build every driver, print their paths
    python scripts/go_drivers.py build grpc5
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from java_toolchain import CACHE, cache_lock  # scripts/ is not a package

REPO = Path(__file__).resolve().parents[1]
GO_SOURCES = REPO / "tests" / "e2e" / "go"
#: The driver packages (folders of ``GO_SOURCES`` with a ``main`` package).
DRIVERS = ("remoting", "grpc5")
BUILD_TIMEOUT = 1200.0


class GoBuildError(RuntimeError):
    """A Go driver could not be built; the message is one line saying why."""


def go_executable() -> str:
    found = shutil.which("go")
    if found is None:
        raise GoBuildError("Go not found: put Go >= 1.25 on PATH (tests/e2e/go/go.mod needs it)")
    return found


def _go_version(go: str) -> str:
    done = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise GoBuildError(f"`go env GOVERSION` failed: {_first_line(done.stderr)}")
    return done.stdout.strip()


def source_digest(go_version: str) -> str:
    """Hash of every file of the module (sources, go.mod, go.sum) and the Go version."""
    digest = hashlib.sha256(go_version.encode())
    for path in sorted(p for p in GO_SOURCES.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(GO_SOURCES)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0][:300] if lines else "no output"


_NETWORK_ERRORS = (
    "dial tcp",
    "no such host",
    "i/o timeout",
    "connection refused",
    "tls handshake timeout",
    "network is unreachable",
)


def _failure(output: str) -> str:
    for line in output.splitlines():
        if any(s in line.lower() for s in _NETWORK_ERRORS):
            return f"Go module proxy unreachable ({line.strip()[:240]})"
    lowered = output.lower()
    if "requires go >=" in lowered or "go.mod requires go" in lowered:
        return f"Go too old: {_first_line(output)}"
    if "updates to go.mod needed" in lowered or "missing go.sum entry" in lowered:
        return f"go.mod/go.sum out of date (run `go mod tidy` in tests/e2e/go): {_first_line(output)}"
    errors = [ln for ln in output.splitlines() if ".go:" in ln]
    return errors[0].strip()[:300] if errors else _first_line(output)


def build(name: str) -> Path:
    """The binary of driver ``name`` (one of :data:`DRIVERS`), built on first use of this source tree."""
    if name not in DRIVERS:
        raise GoBuildError(f"unknown Go driver {name!r} (known: {', '.join(DRIVERS)})")
    go = go_executable()
    out_dir = CACHE / "go" / source_digest(_go_version(go))
    binary = out_dir / name
    if binary.exists():
        return binary
    with cache_lock(out_dir / ".lock"):
        if binary.exists():
            return binary
        env = dict(os.environ, GOFLAGS="-mod=readonly", CGO_ENABLED="0")
        partial = out_dir / f".{name}.partial"
        try:
            done = subprocess.run(
                [go, "build", "-trimpath", "-o", str(partial), f"./{name}"],
                cwd=GO_SOURCES,
                env=env,
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise GoBuildError(f"go build ./{name} took over {BUILD_TIMEOUT:.0f} s") from exc
        if done.returncode != 0:
            raise GoBuildError(f"go build ./{name}: {_failure(done.stderr + done.stdout)}")
        partial.replace(binary)
    return binary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_build = sub.add_parser("build", help="build Go drivers into the cache")
    p_build.add_argument("drivers", nargs="*", default=list(DRIVERS))
    opts = parser.parse_args(argv)
    try:
        for name in opts.drivers:
            print(f"{name}: {build(name)}")
    except GoBuildError as exc:
        print(f"go_drivers: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
