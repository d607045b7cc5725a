"""``ServerRecorder.record_run`` counts, observes and logs what one ``record`` per event does."""

from __future__ import annotations

from typing import Any

import structlog

from mqproxy.context import ServerRecorder, ServerState
from mqproxy.runtime.context import ConnectionContext
from mqproxy.settings import Settings


def _events() -> list[dict[str, Any]]:
    return [
        {"op": "PUBLISH", "code": 3, "status": s, "outcome": o, "latency_ms": 0.5, "topic": "a"}
        for s, o in (("SUCCESS", "ok"), ("SUCCESS", "ok"), ("NOT_AUTHORIZED", "error"), ("SUCCESS", "ok"))
    ]


def _samples(state: ServerState) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in (state.metrics.requests, state.metrics.request_latency):
        for metric in family.collect():
            for sample in metric.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return {key: value for key, value in out.items() if not key[0].endswith("_created")}


def test_record_run_equals_one_record_per_event(log_sink: Any) -> None:
    structlog.contextvars.bind_contextvars(conn_id="c9", protocol="mqtt")
    one, run = (ServerState(settings=Settings.for_tests(), backend_name="memory") for _ in range(2))
    ctx_one = ConnectionContext("c9", ("127.0.0.1", 1), ("127.0.0.1", 2), recorder=ServerRecorder(one))
    ctx_run = ConnectionContext("c9", ("127.0.0.1", 1), ("127.0.0.1", 2), recorder=ServerRecorder(run))
    ctx_one.protocol = ctx_run.protocol = "mqtt"
    for fields in _events():
        ctx_one.request_event(**fields)
    ctx_run.request_events(_events())
    assert ctx_one.requests == ctx_run.requests == 4
    counted = _samples(one)
    assert (
        counted[("mqproxy_requests_total", (("op", "PUBLISH"), ("outcome", "ok"), ("protocol", "mqtt")))] == 3
    )
    assert _samples(run) == counted
    lines = [{k: v for k, v in e.items() if k != "ts"} for e in log_sink.events]
    assert len(lines) == 8
    assert lines[:4] == lines[4:]
    assert lines[2]["status"] == "NOT_AUTHORIZED"
    assert lines[2]["conn_id"] == "c9"
