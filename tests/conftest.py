"""Shared fixtures: captured structured events validated against the log-event schema."""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib.resources import files
from typing import Any

import jsonschema
import pytest
import structlog

from mqproxy.log import configure_logging
from mqproxy.settings import LogSettings

SCHEMA = json.loads((files("mqproxy.config") / "log_event.schema.json").read_text(encoding="utf-8"))
_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker())


class EventSink:
    """A log sink that keeps every JSON line; ``events`` parses and schema-validates them."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.lines.append(data)

    def flush(self) -> None:
        pass

    @property
    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.lines:
            event = json.loads(line)
            _VALIDATOR.validate(event)
            out.append(event)
        return out

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == name]

    def clear(self) -> None:
        self.lines.clear()


@pytest.fixture
def log_sink() -> Iterator[EventSink]:
    sink = EventSink()
    configure_logging(LogSettings(), stream=sink, cache=False)
    yield sink
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
