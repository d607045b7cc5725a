"""The one place that configures logging.

Events are structlog events with stable names and flat snake_case fields, documented in
``config/log_event.schema.json``. JSON lines (orjson, bytes straight to the sink) are the default;
``console`` renders for humans. A log file rotates by size and/or age so the Spark job only ever reads
completed files (rotated names carry a UTC timestamp and never change again).

JSON lines are buffered (:class:`LineBuffer`): one write per batch instead of one per event. A batch is
written when ``log.flush_interval_ms`` has passed (a daemon thread), when it reaches ``log.buffer_bytes``,
right after any warning or worse, and on close (shutdown). A process killed with SIGKILL loses at most
the last interval's info events; ``flush_interval_ms = 0`` writes every event on its own, as before.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
import stat
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

import orjson
import structlog

from mqproxy.settings import LogSettings

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class RotatingFile:
    """An append-only byte sink that rotates ``path`` to ``path.<UTC timestamp>`` by size or age.

    ``rotate_bytes``/``rotate_interval_s`` of 0 disable that trigger. Writes are whole lines, so a rotated
    file never ends mid-event. A path that is not a regular file (``/dev/null``, a FIFO, a terminal) is
    never rotated: renaming it would move the device or pipe itself.
    """

    def __init__(self, path: Path, rotate_bytes: int, rotate_interval_s: float) -> None:
        self.path = path
        self.rotate_bytes = rotate_bytes
        self.rotate_interval_s = rotate_interval_s
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._open()
        if not self._regular:
            self.rotate_bytes = 0
            self.rotate_interval_s = 0.0

    def _open(self) -> None:
        self._fh: BinaryIO = open(self.path, "ab", buffering=0)
        self._regular = stat.S_ISREG(os.fstat(self._fh.fileno()).st_mode)
        self._size = self._fh.tell() if self._regular else 0
        self._opened = time.monotonic()

    def _rotate(self) -> None:
        self._fh.close()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        target = self.path.with_name(f"{self.path.name}.{stamp}")
        n = 0
        while target.exists():
            n += 1
            target = self.path.with_name(f"{self.path.name}.{stamp}-{n}")
        os.replace(self.path, target)
        self._open()

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._size and (
                (self.rotate_bytes and self._size + len(data) > self.rotate_bytes)
                or (self.rotate_interval_s and time.monotonic() - self._opened >= self.rotate_interval_s)
            ):
                self._rotate()
            self._fh.write(data)
            self._size += len(data)

    def write_lines(self, lines: Sequence[bytes]) -> None:
        """Write whole lines, one write per run of lines that fits the current file (the size trigger
        is applied line by line, exactly as :meth:`write` would)."""
        with self._lock:
            if (
                self._size
                and self.rotate_interval_s
                and time.monotonic() - self._opened >= self.rotate_interval_s
            ):
                self._rotate()
            start, size = 0, self._size
            for i, line in enumerate(lines):
                if size and self.rotate_bytes and size + len(line) > self.rotate_bytes:
                    if i > start:
                        self._fh.write(b"".join(lines[start:i]))
                    self._rotate()
                    start, size = i, 0
                size += len(line)
            if start < len(lines):
                self._fh.write(b"".join(lines[start:]) if start else b"".join(lines))
            self._size = size

    def flush(self) -> None:
        """Writes are unbuffered; present for the ``BytesLogger`` file protocol."""

    def close(self) -> None:
        with self._lock:
            self._fh.close()


class LineBuffer:
    """Batches whole lines for a byte sink ``target``; thread-safe (store threads log too).

    :meth:`write` only appends; the batch goes out in one write when it reaches ``max_bytes``, every
    ``flush_interval_s`` (a daemon thread), on :meth:`flush` and on :meth:`close`. Batches reach
    ``target`` in order, whole lines only (``target.write_lines`` when it has one, so a rotating file
    still rotates between lines). :meth:`close` flushes, stops the thread and closes ``target`` when
    ``owns_target``; it also runs at interpreter exit.
    """

    def __init__(self, target: Any, *, flush_interval_s: float, max_bytes: int, owns_target: bool) -> None:
        self._target = target
        self._owns_target = owns_target
        self._max_bytes = max_bytes
        self._lines: list[bytes] = []
        self._pending = 0
        self._lock = threading.Lock()  # guards _lines/_pending
        self._write_lock = threading.Lock()  # keeps batches in order
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(flush_interval_s,), name="mqproxy-log-flush", daemon=True
        )
        self._thread.start()
        atexit.register(self.close)

    def write(self, line: bytes) -> None:
        with self._lock:
            self._lines.append(line)
            self._pending += len(line)
            full = self._pending >= self._max_bytes
        if full:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered now (one write, or one per rotation)."""
        with self._write_lock:
            with self._lock:
                lines, self._lines, self._pending = self._lines, [], 0
            if not lines:
                return
            write_lines = getattr(self._target, "write_lines", None)
            if write_lines is not None:
                write_lines(lines)
            else:
                self._target.write(b"".join(lines))
                flush = getattr(self._target, "flush", None)
                if flush is not None:
                    flush()

    def _run(self, interval_s: float) -> None:
        while not self._closed.wait(interval_s):
            try:
                self.flush()
            except (OSError, ValueError):  # sink closed or full: the next flush tries again
                pass

    def close(self) -> None:
        """Flush, stop the timer; close ``target`` when this buffer owns it. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        atexit.unregister(self.close)
        self.flush()
        if self._owns_target:
            self._target.close()


class UtcIsoStamper:
    """The ``ts`` field exactly as ``structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts")``
    writes it (``datetime.isoformat`` in UTC with ``Z``: ``2025-01-02T03:04:05.678901Z``, no fraction at
    a whole second), with the date and time of day formatted once per second, not once per event."""

    def __init__(self) -> None:
        #: (second, its "YYYY-MM-DDTHH:MM:SS" text); one attribute, so threads read a matching pair.
        self._second: tuple[int, str] = (-1, "")

    def __call__(self, _logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
        second, micro = divmod(time.time_ns() // 1000, 1_000_000)
        cached, text = self._second
        if cached != second:
            text = datetime.datetime.fromtimestamp(second, datetime.UTC).isoformat()[:19]
            self._second = (second, text)
        event["ts"] = f"{text}.{micro:06d}Z" if micro else f"{text}Z"
        return event


def _orjson_dumps(_logger: Any, _method: str, event: dict[str, Any]) -> bytes:
    return orjson.dumps(event, default=str) + b"\n"


class _LineLogger:
    """structlog logger writing one pre-rendered bytes line per event to a sink; warnings and worse are
    flushed at once (a buffered sink holds info and debug lines until its next batch)."""

    def __init__(self, sink: Any) -> None:
        self._sink = sink
        self._flush = getattr(sink, "flush", None)

    def msg(self, message: bytes) -> None:
        self._sink.write(message)

    def urgent(self, message: bytes) -> None:
        self._sink.write(message)
        if self._flush is not None:
            self._flush()

    log = debug = info = msg
    warn = warning = error = critical = exception = fatal = urgent


class _Unbuffered:
    """A sink written line by line, flushed after each (``log.flush_interval_ms = 0`` and test streams)."""

    def __init__(self, target: Any) -> None:
        self._target = target
        self._target_flush = getattr(target, "flush", None)

    def write(self, line: bytes) -> None:
        self._target.write(line)
        if self._target_flush is not None:
            self._target_flush()

    def flush(self) -> None:
        """Every line is already written."""


class _DirectJson:
    """Renders an info event into the same JSON line the structlog chain of :func:`configure_logging`
    writes (same fields in the same order: the call's fields, ``event``, the context variables, ``level``,
    ``ts``) and writes it to the sink, without structlog's per-call work (about half the cost of an
    event). Active while that configuration is structlog's (a test's ``capture_logs`` or
    ``reset_defaults`` turns it off)."""

    def __init__(self, sink: Any, processors: list[Any], stamper: UtcIsoStamper, enabled: bool) -> None:
        self._write = sink.write
        self._processors = processors
        self._stamp = stamper
        self._enabled = enabled

    def info(self, event: str, fields: dict[str, Any]) -> bool:
        """Write ``event`` with ``fields`` (info level); False when inactive (nothing written)."""
        processors = structlog.get_config()["processors"]
        if processors is not self._processors or processors[-1] is not _orjson_dumps:
            return False  # reconfigured (capture_logs changes the list in place)
        if self._enabled:
            line = dict(fields)
            line["event"] = event
            structlog.contextvars.merge_contextvars(None, "info", line)
            line["level"] = "info"
            self._write(_orjson_dumps(None, "info", self._stamp(None, "info", line)))
        return True

    def infos(self, event: str, lines: list[dict[str, Any]]) -> bool:
        """:meth:`info` for each of ``lines`` (modified in place), the context variables merged and the
        time stamped once for all: the same lines as one :meth:`info` each at that instant."""
        processors = structlog.get_config()["processors"]
        if processors is not self._processors or processors[-1] is not _orjson_dumps:
            return False
        if self._enabled:
            context = structlog.contextvars.merge_contextvars(None, "info", {}).items()
            ts = self._stamp(None, "info", {})["ts"]
            write = self._write
            for line in lines:
                line["event"] = event
                for key, value in context:  # as merge_contextvars: the event's own fields win
                    line.setdefault(key, value)
                line["level"] = "info"
                line["ts"] = ts
                write(orjson.dumps(line, default=str) + b"\n")
        return True


_direct: _DirectJson | None = None


def log_info(log: Any, event: str, fields: dict[str, Any]) -> None:
    """``log.info(event, **fields)`` for hot-path events (one per request). With the JSON output of
    :func:`configure_logging` in force the line is rendered and written directly; the result is the
    same line, but ``log``'s own bound values are not added (the connection loggers this is used with
    bind none: ``conn_id`` and ``protocol`` come from context variables)."""
    direct = _direct
    if direct is None or not direct.info(event, fields):
        log.info(event, **fields)


def log_infos(log: Any, event: str, lines: list[dict[str, Any]]) -> None:
    """:func:`log_info` for each of ``lines`` (hot-path events of one batch, e.g. the requests of one
    read; the dicts may be modified)."""
    direct = _direct
    if direct is None or not direct.infos(event, lines):
        for fields in lines:
            log.info(event, **fields)


def configure_logging(settings: LogSettings, *, stream: Any = None, cache: bool = True) -> Any:
    """Configure structlog for the whole process; return the sink (close it on exit: that flushes it,
    and closes the log file when there is one; standard output stays open).

    ``stream`` overrides the sink (tests pass an in-memory buffer); it is written line by line.
    """
    global _direct
    stamper = UtcIsoStamper()
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        stamper,
        structlog.processors.format_exc_info,
    ]
    _direct = None
    if settings.format == "console":
        sink = stream if stream is not None else sys.stderr
        processors.append(structlog.dev.ConsoleRenderer(colors=False))
        factory: Any = structlog.PrintLoggerFactory(file=sink)
    else:
        if stream is not None:
            sink = _Unbuffered(stream)
        else:
            target: Any = (
                RotatingFile(Path(settings.file), settings.rotate_bytes, settings.rotate_interval_s)
                if settings.file
                else sys.stdout.buffer
            )
            if settings.flush_interval_ms:
                sink = LineBuffer(
                    target,
                    flush_interval_s=settings.flush_interval_ms / 1000,
                    max_bytes=settings.buffer_bytes,
                    owns_target=bool(settings.file),
                )
            else:
                sink = target if settings.file else _Unbuffered(target)
        processors.append(_orjson_dumps)

        def factory(*_: Any) -> _LineLogger:
            return _LineLogger(sink)

        _direct = _DirectJson(sink, processors, stamper, _LEVELS[settings.level] <= logging.INFO)

    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[settings.level]),
        logger_factory=factory,
        cache_logger_on_first_use=cache,
    )
    return sink
