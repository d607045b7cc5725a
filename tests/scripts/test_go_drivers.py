"""The Go driver builder (scripts/go_drivers.py): one-line failures and a source hash that tracks the tree."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import go_drivers  # noqa: E402


def test_an_unreachable_module_proxy_is_named_with_the_failing_line() -> None:
    out = (
        "go: downloading github.com/apache/rocketmq-client-go/v2 v2.1.3\n"
        'remoting/main.go:29:2: ...: Get "https://proxy.golang.org/...": '
        "dial tcp 1.2.3.4:443: i/o timeout\n"
    )
    reason = go_drivers._failure(out)
    assert reason.startswith("Go module proxy unreachable (remoting/main.go:29:2")
    assert "\n" not in reason


def test_other_failures_are_one_line() -> None:
    assert go_drivers._failure("go: go.mod requires go >= 1.25 (running go 1.24.2; GOTOOLCHAIN=local)\n") == (
        "Go too old: go: go.mod requires go >= 1.25 (running go 1.24.2; GOTOOLCHAIN=local)"
    )
    stale = "go: updates to go.mod needed; to update it:\n\tgo mod tidy\n"
    assert go_drivers._failure(stale).startswith("go.mod/go.sum out of date")
    compile_error = "# mqtest/grpc5\ngrpc5/main.go:12:2: undefined: nope\ngrpc5/main.go:13:2: more\n"
    assert go_drivers._failure(compile_error) == "grpc5/main.go:12:2: undefined: nope"
    assert go_drivers._failure("") == "no output"


def test_the_source_digest_covers_the_module_and_the_go_version() -> None:
    digest = go_drivers.source_digest("go1.26.8")
    assert digest == go_drivers.source_digest("go1.26.8")
    assert digest != go_drivers.source_digest("go1.25.0")
    assert {"go.mod", "go.sum"} <= {p.name for p in go_drivers.GO_SOURCES.iterdir()}


def test_unknown_driver_and_missing_go(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(go_drivers.GoBuildError, match="unknown Go driver"):
        go_drivers.build("nope")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(go_drivers.GoBuildError, match="Go not found"):
        go_drivers.build("grpc5")
