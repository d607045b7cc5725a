"""Several backends in the settings: ``[backends.NAME]``, ``[routing]`` and what they refuse (exit status 2
naming the setting, as every setting)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mqproxy.cli import main
from mqproxy.settings import Settings, SettingsError, build_settings, load_settings

TOML = """
[backends.east]
kind = "rocketmq"
namesrv = "127.0.0.1:9876"
secret_key = "s3cret"
access_key = "ak"

[backends.local]
kind = "embedded"

[[routing.rules]]
match = "exact:orders"
backend = "east"

[[routing.rules]]
match = "re:^audit-.*$"
backend = "east"

[routing]
default = "local"
"""


def test_toml_shape_loads_named_backends_and_ordered_rules(tmp_path: Path) -> None:
    cfg = tmp_path / "m.toml"
    cfg.write_text(TOML)  # [routing] may follow its [[routing.rules]] (a super-table defined later)
    s = load_settings(cfg)
    assert s.routed
    assert set(s.backends) == {"east", "local"}
    assert s.backends["east"].cluster
    assert s.backends["east"].namesrv_addresses == ("127.0.0.1:9876",)
    table = s.routing_table()
    assert [r.text for r in table.rules] == ["exact:orders", "re:^audit-.*$"]
    assert table.backend_for("audit-1") == "east"
    assert table.backend_for("x") == "local"
    assert list(s.backends_in_use()) == ["east", "local"]  # [backend] unused: nothing names "default"
    assert s.default_backend == s.backends["local"]
    assert s.as_dict()["backends"]["east"]["secret_key"] == "<redacted>"


def test_single_backend_unchanged() -> None:
    s = Settings()
    assert not s.routed
    assert list(s.backends_in_use()) == ["default"]
    assert s.default_backend is s.backend


def test_backend_section_is_the_backend_named_default() -> None:
    s = build_settings(
        {
            "backends": {"b": {"kind": "embedded"}},
            "routing": {"default": "default", "rules": [{"match": "prefix:b-", "backend": "b"}]},
        }
    )
    assert list(s.backends_in_use()) == ["default", "b"]
    assert s.default_backend is s.backend


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"routing": {"rules": [{"match": "re:(", "backend": "default"}]}}, r"routing\.rules\[0\]\.match"),
        ({"routing": {"rules": [{"match": "exact:a", "backend": "nope"}]}}, r"routing\.rules\[0\]\.backend"),
        ({"routing": {"rules": [{"match": "exact:a"}]}}, r"routing\.rules\[0\]: expected match"),
        (
            {"routing": {"rules": [{"match": "exact:a", "backend": "default"}] * 2}},
            r"routing\.rules\[1\]\.match: duplicate",
        ),
        ({"routing": {"default": "nope"}}, r"routing\.default: unknown backend 'nope'"),
        ({"backends": {"default": {}}}, r"backends\.default: duplicate backend name"),
        ({"backends": {"East": {}, "east": {}}}, r"backends\.east: duplicate backend name"),
        ({"backends": {"a b": {}}}, r"backends\.a b: a backend name"),
        ({"backends": {"e": {"kind": "rocketmq"}}}, r"backends\.e\.namesrv: required"),
        ({"backends": {"e": {"kind": "kafka"}}}, r"backends\.e\.kind"),
        ({"backends": {"e": "x"}}, r"backends\.e: expected a \[backends\.e\] table"),
    ],
)
def test_bad_backends_and_rules_name_the_setting(values: dict[str, Any], named: str) -> None:
    with pytest.raises(SettingsError, match=named):
        build_settings(values)


def test_bad_rule_exits_2_naming_the_setting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[backends.x]\nkind = "embedded"\n\n[[routing.rules]]\nmatch = "re:[a-"\nbackend = "x"\n')
    assert main(["serve", "--config", str(cfg)]) == 2
    assert "routing.rules[0].match" in capsys.readouterr().err
