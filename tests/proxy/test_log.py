from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import structlog

from mqproxy.log import RotatingFile, UtcIsoStamper, configure_logging
from mqproxy.settings import LogSettings


def test_json_events_are_schema_valid_lines_with_bound_context(log_sink: Any) -> None:
    structlog.contextvars.bind_contextvars(conn_id="c1")
    structlog.get_logger("t").info("conn.accepted", peer="1.2.3.4:5", local="127.0.0.1:9")
    (event,) = log_sink.events
    assert event["event"] == "conn.accepted" and event["conn_id"] == "c1" and event["level"] == "info"
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
