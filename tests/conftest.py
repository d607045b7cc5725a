"""Shared fixtures and helpers: captured structured events validated against the log-event schema, one
builder of stored messages (:func:`stored_message`), the proxy as a child process (:func:`serve_proxy`,
:func:`wait_proxy_started`), and the one way tests wait for something (:func:`wait_until`,
:func:`wait_until_sync`, ``steered_clock``).

Tests never sleep for a fixed time to let something happen: they wait for the condition itself, with a
generous limit that only turns a hang into a failure (never a check of how fast something was).
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import structlog
import trio
import trio.testing

from mqproxy.log import configure_logging
from mqproxy.model.types import StoredMessage
from mqproxy.settings import LogSettings

#: Proxies the tests start as child processes write each log event at once (``log.flush_interval_ms = 0``):
#: tests read a child's events as soon as its client is done, and the default 100 ms batching would make
#: them race the flush. The buffered sink itself is tested in-process (tests/proxy/test_log.py).
os.environ.setdefault("MQPROXY_LOG_FLUSH_INTERVAL_MS", "0")

SCHEMA = json.loads((files("mqproxy.config") / "log_event.schema.json").read_text(encoding="utf-8"))
_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker())


#: The fields of a ``request.run`` event that are not a ``request`` event's.
_RUN_FIELDS = frozenset({"count", "errors", "statuses", "outcomes", "topics"})


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

    def requests(self) -> list[dict[str, Any]]:
        """The ``request`` events, each ``request.run`` read as the ``request`` events it stands for (the
        run's shared fields with the i-th of ``statuses``, ``outcomes`` and ``topics``), in order."""
        out: list[dict[str, Any]] = []
        for e in self.events:
            if e["event"] == "request":
                out.append(e)
            elif e["event"] == "request.run":
                shared = {k: v for k, v in e.items() if k not in _RUN_FIELDS}
                assert e["count"] == len(e["statuses"]) == len(e["outcomes"]) == len(e["topics"])
                out.extend(
                    {**shared, "event": "request", "status": s, "outcome": o, "topic": t}
                    for s, o, t in zip(e["statuses"], e["outcomes"], e["topics"], strict=True)
                )
        return out

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


async def read_until_eof(stream: trio.abc.Stream, limit_s: float = 5.0) -> bytes:
    """Everything the peer sends until it closes (or resets) the connection; ``limit_s`` only turns a hang
    into a failure."""
    buf = bytearray()
    with trio.fail_after(limit_s):
        while True:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                break
            if not data:
                break
            buf += data
    return bytes(buf)


class CountingStream(trio.abc.Stream):
    """``inner`` with its writes counted; with ``cut`` a write sends its first half, then blocks."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.writes = 0
        self.cut = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.writes += 1
        if self.cut:
            await self.inner.send_all(bytes(data)[: len(data) // 2])
            await trio.sleep_forever()  # as a full socket buffer does
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


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


def stored_message(**fields: Any) -> StoredMessage:
    """A :class:`StoredMessage` with plain defaults (topic ``T``, queue 0 at offset 0, empty body and
    properties, zero times, flags and CRC, both hosts ``127.0.0.1:0``); keyword arguments replace fields."""
    defaults: dict[str, Any] = dict(
        topic="T",
        queue_id=0,
        queue_offset=0,
        commitlog_offset=0,
        store_size=0,
        body=b"",
        flag=0,
        properties={},
        sys_flag=0,
        born_timestamp_ms=0,
        born_host=("127.0.0.1", 0),
        store_timestamp_ms=0,
        store_host=("127.0.0.1", 0),
        reconsume_times=0,
        body_crc=0,
    )
    return StoredMessage(**(defaults | fields))


def serve_proxy(
    data_dir: Path, *extra: str, stdout: Any, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``python -m mqproxy serve`` on an ephemeral loopback port over ``data_dir``; ``extra`` are
    further arguments, ``env`` entries are added to this process's environment; stderr is a pipe."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mqproxy",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            str(data_dir),
            *extra,
        ],
        stdout=stdout,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )


def log_events(log: Path) -> list[dict[str, Any]]:
    """The events a proxy has written to its JSON-lines ``log`` so far (none before the file exists)."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def wait_proxy_started(proc: subprocess.Popen[bytes], log: Path) -> tuple[str, int]:
    """Wait for ``proxy.started`` in ``log``, failing with the proxy's stderr if it exits first; returns the
    address it listens on."""

    def started() -> list[dict[str, Any]]:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        return [event for event in log_events(log) if event["event"] == "proxy.started"]

    wait_until_sync(started)
    host, port = started()[0]["listen"].rsplit(":", 1)
    return host, int(port)


def running_stock_cluster(workdir: Path, **options: Any) -> Iterator[Any]:
    """Yield a started stock RocketMQ cluster (``scripts/stock_rocketmq.StockCluster(workdir, **options)``),
    stopped afterwards. The test fails, not skips, with the launcher's one-line reason when it cannot start:
    ``make test`` installs and fetches everything it needs."""
    scripts = str(Path(__file__).resolve().parents[1] / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    import stock_rocketmq

    cluster = stock_rocketmq.StockCluster(workdir, **options)
    try:
        cluster.start()
    except stock_rocketmq.LauncherError as exc:
        pytest.fail(f"stock RocketMQ did not start: {exc}", pytrace=False)
    yield cluster
    cluster.stop()
