from __future__ import annotations

import datetime
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest
import structlog

from mqproxy.log import LineBuffer, RotatingFile, UtcIsoStamper, configure_logging, log_info, log_infos
from mqproxy.settings import LogSettings

from ..conftest import wait_until_sync  # type: ignore[import-not-found]


def test_json_events_are_schema_valid_lines_with_bound_context(log_sink: Any) -> None:
    structlog.contextvars.bind_contextvars(conn_id="c1")
    structlog.get_logger("t").info("conn.accepted", peer="1.2.3.4:5", local="127.0.0.1:9")
    (event,) = log_sink.events
    assert event["event"] == "conn.accepted"
    assert event["conn_id"] == "c1"
    assert event["level"] == "info"
    assert event["ts"].endswith("Z")


def test_debug_is_filtered_at_info(log_sink: Any) -> None:
    structlog.get_logger("t").debug("conn.accepted", peer="x", local="y", conn_id="c")
    assert log_sink.lines == []


def test_rotating_file_rotates_by_size_on_line_boundaries(tmp_path: Path) -> None:
    path = tmp_path / "mqproxy.log"
    sink = RotatingFile(path, rotate_bytes=100, rotate_interval_s=0)
    for i in range(10):
        sink.write(json.dumps({"i": i, "pad": "x" * 20}).encode() + b"\n")
    sink.close()
    files = sorted(tmp_path.iterdir())
    assert len(files) > 2
    lines = [json.loads(line) for f in files for line in f.read_bytes().splitlines()]
    assert sorted(e["i"] for e in lines) == list(range(10))
    for f in files:
        assert f.stat().st_size <= 100 or f.read_bytes().count(b"\n") == 1


def test_a_path_that_is_not_a_regular_file_is_never_rotated(tmp_path: Path) -> None:
    """Like ``log.file = "/dev/null"``: renaming it would move the device itself (a FIFO stands in)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so opening for writing does not block
    try:
        sink = RotatingFile(fifo, rotate_bytes=10, rotate_interval_s=1)
        for i in range(4):
            sink.write(b"line %d\n" % i)
        sink.close()
        assert os.listdir(tmp_path) == ["pipe"]
        assert stat.S_ISFIFO(fifo.stat().st_mode)
        assert os.read(reader, 1000) == b"line 0\nline 1\nline 2\nline 3\n"
    finally:
        os.close(reader)


def test_rotating_file_rotates_by_age(tmp_path: Path, monkeypatch: Any) -> None:
    import mqproxy.log as log_module

    now = [1000.0]
    monkeypatch.setattr(log_module.time, "monotonic", lambda: now[0])
    sink = RotatingFile(tmp_path / "a.log", rotate_bytes=0, rotate_interval_s=60)
    sink.write(b"one\n")
    now[0] += 61
    sink.write(b"two\n")
    sink.close()
    assert len(os.listdir(tmp_path)) == 2
    assert (tmp_path / "a.log").read_bytes() == b"two\n"


def test_log_file_setting_writes_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "mqproxy.log"
    sink = configure_logging(LogSettings(file=str(path)), cache=False)
    try:
        structlog.get_logger("t").info("proxy.failed", detail="x")
    finally:
        sink.close()
        structlog.reset_defaults()
    assert json.loads(path.read_bytes())["event"] == "proxy.failed"


@pytest.mark.parametrize(
    "micros", [1_700_000_000_123_456, 1_700_000_000_000_000, 1_700_000_000_000_001, 86_399_999_999]
)
def test_the_timestamp_is_structlogs_iso_utc_form(monkeypatch: pytest.MonkeyPatch, micros: int) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: micros * 1000 + 999)
    now = datetime.datetime.fromtimestamp(micros // 1_000_000, datetime.UTC).replace(
        microsecond=micros % 1_000_000
    )
    expected = now.isoformat().replace("+00:00", "Z")  # what TimeStamper(fmt="iso", utc=True) writes
    stamper = UtcIsoStamper()
    assert stamper(None, "info", {})["ts"] == expected
    assert stamper(None, "info", {})["ts"] == expected  # from the cached second


class _Target:
    """A byte sink that records each write (a batch) and each flush."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.flushes = 0
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        self.closed = True


def test_line_buffer_writes_a_batch_once_it_reaches_buffer_bytes() -> None:
    target = _Target()
    buffer = LineBuffer(target, flush_interval_s=3600, max_bytes=10, owns_target=False)
    try:
        buffer.write(b"abcd\n")
        assert target.writes == []
        buffer.write(b"efgh\n")
        assert target.writes == [b"abcd\nefgh\n"]
    finally:
        buffer.close()
    assert not target.closed  # standard output is not the buffer's to close


def test_line_buffer_flushes_on_its_timer_and_on_close() -> None:
    target = _Target()
    buffer = LineBuffer(target, flush_interval_s=0.01, max_bytes=1 << 20, owns_target=True)
    buffer.write(b"one\n")
    wait_until_sync(lambda: target.writes == [b"one\n"])
    buffer.write(b"two\n")
    buffer.close()
    assert target.writes == [b"one\n", b"two\n"]
    assert target.closed
    buffer.close()  # idempotent
    assert target.writes == [b"one\n", b"two\n"]


def test_warnings_reach_the_sink_at_once_info_waits_for_the_batch(tmp_path: Path) -> None:
    path = tmp_path / "mqproxy.log"
    sink = configure_logging(LogSettings(file=str(path), flush_interval_ms=60_000), cache=False)
    try:
        log = structlog.get_logger("t")
        log.info("proxy.drained", duration_ms=1.0)
        assert path.read_bytes() == b""
        log.warning("proxy.failed", detail="x")
        events = [json.loads(line)["event"] for line in path.read_bytes().splitlines()]
        assert events == ["proxy.drained", "proxy.failed"]
        log.info("proxy.drained", duration_ms=2.0)
    finally:
        sink.close()
        structlog.reset_defaults()
    assert len(path.read_bytes().splitlines()) == 3  # close flushed the last line


def test_unbuffered_setting_writes_each_event(tmp_path: Path) -> None:
    path = tmp_path / "mqproxy.log"
    sink = configure_logging(LogSettings(file=str(path), flush_interval_ms=0), cache=False)
    try:
        structlog.get_logger("t").info("proxy.drained", duration_ms=1.0)
        assert json.loads(path.read_bytes())["event"] == "proxy.drained"
    finally:
        sink.close()
        structlog.reset_defaults()


def test_rotating_file_batches_rotate_between_the_same_lines_as_single_writes(tmp_path: Path) -> None:
    lines = [json.dumps({"i": i, "pad": "x" * (i % 7) * 5}).encode() + b"\n" for i in range(40)]
    one_by_one, batched = tmp_path / "a", tmp_path / "b"
    single = RotatingFile(one_by_one / "m.log", rotate_bytes=120, rotate_interval_s=0)
    for line in lines:
        single.write(line)
    single.close()
    batch = RotatingFile(batched / "m.log", rotate_bytes=120, rotate_interval_s=0)
    batch.write_lines(lines[:13])
    batch.write_lines(lines[13:])
    batch.close()

    def contents(folder: Path) -> list[bytes]:
        files = sorted(folder.iterdir(), key=lambda f: (f.name == "m.log", f.stat().st_mtime_ns, f.name))
        return sorted(f.read_bytes() for f in files)

    assert len(list(batched.iterdir())) > 3
    assert contents(one_by_one) == contents(batched)


def test_log_info_writes_the_line_structlog_writes(log_sink: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: 1_700_000_000_123_456_000)
    structlog.contextvars.bind_contextvars(conn_id="c1", protocol="mqtt")
    log = structlog.get_logger("t")
    fields = {
        "protocol": "mqtt",
        "op": "PUBLISH",
        "code": 3,
        "outcome": "ok",
        "latency_ms": 0.1,
        "topic": "t",
    }
    log.info("request", **fields)
    log_info(log, "request", fields)
    assert len(log_sink.lines) == 2
    assert log_sink.lines[0] == log_sink.lines[1]
    assert log_sink.events[1]["conn_id"] == "c1"


def test_log_infos_writes_the_lines_log_info_writes(log_sink: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: 1_700_000_000_123_456_000)
    structlog.contextvars.bind_contextvars(conn_id="c1", protocol="mqtt")
    log = structlog.get_logger("t")
    batch = [
        {
            "protocol": "mqtt",
            "op": "PUBLISH",
            "code": 3,
            "status": s,
            "outcome": "ok",
            "latency_ms": 0.2,
            "topic": t,
        }
        for s, t in (("SUCCESS", "a/b"), ("NOT_AUTHORIZED", "c"), ("SUCCESS", None))
    ]
    for fields in batch:
        log_info(log, "request", dict(fields))
    log_infos(log, "request", [dict(fields) for fields in batch])
    assert len(log_sink.lines) == 6
    assert log_sink.lines[:3] == log_sink.lines[3:]  # same fields, same order, the event's own win
    assert [e["status"] for e in log_sink.events[3:]] == ["SUCCESS", "NOT_AUTHORIZED", "SUCCESS"]
    assert log_sink.events[4]["conn_id"] == "c1"


def test_log_infos_goes_through_structlog_when_it_is_configured_otherwise(log_sink: Any) -> None:
    with structlog.testing.capture_logs() as captured:
        log_infos(structlog.get_logger("t"), "request", [{"op": "PUBLISH"}, {"op": "PUBACK"}])
    assert [c["op"] for c in captured] == ["PUBLISH", "PUBACK"]
    assert log_sink.lines == []


def test_log_info_goes_through_structlog_when_it_is_configured_otherwise(log_sink: Any) -> None:
    with structlog.testing.capture_logs() as captured:
        log_info(structlog.get_logger("t"), "request", {"op": "PUBLISH"})
    assert captured == [{"event": "request", "op": "PUBLISH", "log_level": "info"}]
    assert log_sink.lines == []


def test_log_info_respects_the_level(tmp_path: Path) -> None:
    path = tmp_path / "mqproxy.log"
    sink = configure_logging(LogSettings(file=str(path), level="warning"), cache=False)
    try:
        log_info(structlog.get_logger("t"), "request", {"op": "PUBLISH"})
    finally:
        sink.close()
        structlog.reset_defaults()
    assert path.read_bytes() == b""
