"""The log-event JSON Schema is the single source of truth: it must be self-consistent and name
every event the code emits."""

from __future__ import annotations

import ast
import json
import tomllib
from importlib.resources import files
from pathlib import Path

import jsonschema

SCHEMA = json.loads((files("mqproxy.config") / "log_event.schema.json").read_text(encoding="utf-8"))
ROOT = Path(__file__).resolve().parents[2]
#: Every source folder that installs as part of the ``mqproxy`` package (pyproject ``package-dir``).
SOURCE_DIRS = sorted(
    {
        d.split("/")[0]
        for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
            "package-dir"
        ].values()
    }
    - {"spark_etl", "config"}
)
LOG_METHODS = {"debug", "info", "warning", "error", "critical", "exception"}


def test_schema_is_valid_draft_2020_12() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_conditional_requirements_mirror_the_event_table() -> None:
    table = {name: sorted(spec["required"]) for name, spec in SCHEMA["x-events"].items()}
    conditions = {
        rule["if"]["properties"]["event"]["const"]: sorted(rule["then"]["required"])
        for rule in SCHEMA["allOf"]
    }
    assert conditions == table
    for fields in table.values():
        assert set(fields) <= set(SCHEMA["properties"])


def _emitted_event_names() -> set[str]:
    """First string argument of every ``<logger>.info("name", ...)``-style call in the sources, and the
    event name of every ``log_info(logger, "name", fields)`` (the hot-path events rendered directly)."""
    names: set[str] = set()
    for folder in SOURCE_DIRS:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Call):
                    continue
                if isinstance(node.func, ast.Name) and node.func.id == "log_info" and len(node.args) > 1:
                    first = node.args[1]
                elif isinstance(node.func, ast.Attribute) and node.func.attr in LOG_METHODS and node.args:
                    first = node.args[0]
                else:
                    continue
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    names.add(first.value)
    return names


def test_every_emitted_event_is_documented() -> None:
    emitted = _emitted_event_names()
    assert {"conn.accepted", "conn.negotiated", "conn.rejected", "conn.closed", "proxy.started"} <= emitted
    undocumented = emitted - set(SCHEMA["x-events"])
    assert not undocumented, f"events missing from config/log_event.schema.json: {sorted(undocumented)}"


def test_a_valid_event_passes_and_a_drifted_one_fails() -> None:
    validator = jsonschema.Draft202012Validator(SCHEMA)
    good = {
        "ts": "2026-11-22T10:00:00Z",
        "level": "info",
        "event": "conn.rejected",
        "conn_id": "ab",
        "reason": "sniff_timeout",
        "sniff_ms": 1.0,
        "bytes_in": 0,
    }
    assert not list(validator.iter_errors(good))
    assert list(validator.iter_errors({**good, "unknownField": 1}))
    assert list(validator.iter_errors({k: v for k, v in good.items() if k != "reason"}))
