"""Maven artifacts and JVM command lines (scripts/java_toolchain.py): one-line failures."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import java_toolchain  # noqa: E402


def test_maven_failure_names_an_unreachable_central() -> None:
    out = "[ERROR] Could not transfer artifact org.apache.rocketmq:x:pom:1 from/to central: Unknown host"
    assert java_toolchain._maven_failure(out) == "Maven Central unreachable"
    assert java_toolchain._maven_failure("[ERROR]\n[ERROR] Could not find artifact a:b:jar:1") == (
        "Could not find artifact a:b:jar:1"
    )


def test_fetch_without_maven_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(java_toolchain, "CACHE", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(java_toolchain.LauncherError, match=r"^Maven \(mvn\) not found"):
        java_toolchain.fetch("client4")


def test_pom_lists_every_coordinate() -> None:
    pom = java_toolchain._pom(["g:a:1", "h:b:2"])
    assert "<artifactId>a</artifactId><version>1</version>" in pom
    assert "<groupId>h</groupId>" in pom
