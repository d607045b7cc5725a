"""Shared fixtures and helpers: captured structured events validated against the log-event schema, and the
one way tests wait for something (:func:`wait_until`, :func:`wait_until_sync`, ``steered_clock``).

Tests never sleep for a fixed time to let something happen: they wait for the condition itself, with a
generous limit that only turns a hang into a failure (never a check of how fast something was).
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from importlib.resources import files
from typing import Any

import jsonschema
import pytest
import structlog
import trio
import trio.testing

from mqproxy.log import configure_logging
from mqproxy.settings import LogSettings

SCHEMA = json.loads((files("mqproxy.config") / "log_event.schema.json").read_text(encoding="utf-8"))
_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker())


class EventSink:
    """A log sink that keeps every JSON line; ``events`` parses and schema-validates them."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self._events: list[dict[str, Any]] = []  # the first len(_events) lines, parsed and validated

    def write(self, data: bytes) -> None:
        self.lines.append(data)

    def flush(self) -> None:
        pass

    @property
    def events(self) -> list[dict[str, Any]]:
        for line in self.lines[len(self._events) :]:  # each line once: tests poll this while waiting
            event = json.loads(line)
            _VALIDATOR.validate(event)
            self._events.append(event)
        return list(self._events)

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == name]

    def clear(self) -> None:
        self.lines.clear()
        self._events.clear()


@pytest.fixture
def log_sink() -> Iterator[EventSink]:
    sink = EventSink()
    configure_logging(LogSettings(), stream=sink, cache=False)
    yield sink
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


#: How long a wait may take before the test fails: only a guard against hangs, never a timing check.
WAIT_LIMIT_S = 20.0


def _not_met(predicate: Callable[[], Any], limit_s: float) -> AssertionError:
    name = getattr(predicate, "__qualname__", repr(predicate))
    return AssertionError(f"condition {name} still false after {limit_s} s")


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]], limit_s: float = WAIT_LIMIT_S, *, poll_s: float = 0.005
) -> None:
    """Return as soon as ``predicate()`` is true (it may return an awaitable, e.g. a store query); fail
    after ``limit_s``, a guard against hangs only.

    For conditions that no event signals (state owned by another task, a log line, a store offset): checks
    every ``poll_s`` seconds, on trio's clock, so under ``autojump_clock`` the waiting costs no real time.
    """
    with trio.move_on_after(limit_s):
        while True:
            result = predicate()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return
            await trio.sleep(poll_s)
    raise _not_met(predicate, limit_s)


def wait_until_sync(
    predicate: Callable[[], bool], limit_s: float = WAIT_LIMIT_S, *, poll_s: float = 0.02
) -> None:
    """:func:`wait_until` for blocking code: worker threads, subprocesses and the files they write."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise _not_met(predicate, limit_s)
        time.sleep(poll_s)


@pytest.fixture
def steered_clock() -> trio.testing.MockClock:
    """trio's clock running at real speed (for tests over real sockets, where the autojump clock would fire
    timeouts while the kernel still moves data), which the test can ``jump(seconds)`` forward to fire
    trio timers (keep-alive, will delay, session expiry) at once instead of sleeping through them."""
    return trio.testing.MockClock(rate=1.0)
