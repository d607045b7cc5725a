"""The one place that configures logging.

Events are structlog events with stable names and flat snake_case fields, documented in
``config/log_event.schema.json``. JSON lines (orjson, bytes straight to the sink) are the default;
``console`` renders for humans. A log file rotates by size and/or age so the Spark job only ever reads
completed files (rotated names carry a UTC timestamp and never change again).
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

import orjson
import structlog

from mqproxy.settings import LogSettings

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class RotatingFile:
    """An append-only byte sink that rotates ``path`` to ``path.<UTC timestamp>`` by size or age.

    ``rotate_bytes``/``rotate_interval_s`` of 0 disable that trigger. Writes are whole lines, so a rotated
    file never ends mid-event.
    """

    def __init__(self, path: Path, rotate_bytes: int, rotate_interval_s: float) -> None:
        self.path = path
        self.rotate_bytes = rotate_bytes
        self.rotate_interval_s = rotate_interval_s
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._open()

    def _open(self) -> None:
        self._fh: BinaryIO = open(self.path, "ab", buffering=0)
        self._size = self._fh.tell()
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

    def flush(self) -> None:
        """Writes are unbuffered; present for the ``BytesLogger`` file protocol."""

    def close(self) -> None:
        with self._lock:
            self._fh.close()


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
    """structlog logger writing one pre-rendered bytes line per event to a sink."""

    def __init__(self, sink: Any) -> None:
        self._sink = sink

    def msg(self, message: bytes) -> None:
        self._sink.write(message)
        if hasattr(self._sink, "flush"):
            self._sink.flush()

    log = debug = info = warn = warning = error = critical = exception = fatal = msg


def configure_logging(settings: LogSettings, *, stream: Any = None, cache: bool = True) -> Any:
    """Configure structlog for the whole process; return the sink (close it on exit if it is a file).

    ``stream`` overrides the sink (tests pass an in-memory buffer).
    """
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        UtcIsoStamper(),
        structlog.processors.format_exc_info,
    ]
    if settings.format == "console":
        sink = stream if stream is not None else sys.stderr
        processors.append(structlog.dev.ConsoleRenderer(colors=False))
        factory: Any = structlog.PrintLoggerFactory(file=sink)
    else:
        if stream is not None:
            sink = stream
        elif settings.file:
            sink = RotatingFile(Path(settings.file), settings.rotate_bytes, settings.rotate_interval_s)
        else:
            sink = sys.stdout.buffer
        processors.append(_orjson_dumps)

        def factory(*_: Any) -> _LineLogger:
            return _LineLogger(sink)

    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[settings.level]),
        logger_factory=factory,
        cache_logger_on_first_use=cache,
    )
    return sink
