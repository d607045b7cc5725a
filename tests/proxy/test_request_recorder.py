"""``ServerRecorder.record_run`` counts, observes and logs what one ``record`` per event does."""

from __future__ import annotations

from typing import Any

import pytest
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


class _PerRequest:
    """A recorder without ``record_batch``: a run is reported one ``record`` (and line) per request."""

    def __init__(self, recorder: ServerRecorder) -> None:
        self.record = recorder.record


_SHARED = {"op": "PUBLISH", "code": 3, "latency_ms": 0.25, "client_id": "pub-1"}
_STATUSES = ["SUCCESS", "SUCCESS", "NOT_AUTHORIZED", "SUCCESS", "CLOSED"]
_OUTCOMES = ["ok", "ok", "error", "ok", "error"]
_TOPICS: list[str | None] = ["a/1", "a/2", "b", "a/1", None]


def _contexts(**log: Any) -> tuple[ConnectionContext, ConnectionContext, ServerState, ServerState]:
    one, run = (ServerState(settings=Settings.for_tests(log=log), backend_name="memory") for _ in range(2))
    ctx_one = ConnectionContext(
        "c9", ("127.0.0.1", 1), ("127.0.0.1", 2), recorder=_PerRequest(ServerRecorder(one))
    )
    ctx_run = ConnectionContext("c9", ("127.0.0.1", 1), ("127.0.0.1", 2), recorder=ServerRecorder(run))
    ctx_one.protocol = ctx_run.protocol = "mqtt"
    return ctx_one, ctx_run, one, run


def _expanded(line: dict[str, Any]) -> list[dict[str, Any]]:
    """The documented reading of a ``request.run`` line: one ``request`` per element of its arrays."""
    if line["event"] != "request.run":
        return [line]
    shared = {k: v for k, v in line.items() if k not in ("count", "errors", "statuses", "outcomes", "topics")}
    assert line["count"] == len(line["statuses"]) == len(line["outcomes"]) == len(line["topics"])
    assert line["errors"] == line["outcomes"].count("error")
    return [
        {**shared, "event": "request", "status": s, "outcome": o, "topic": t}
        for s, o, t in zip(line["statuses"], line["outcomes"], line["topics"], strict=True)
    ]


def test_a_run_is_one_request_run_line_that_expands_to_the_per_request_lines(log_sink: Any) -> None:
    structlog.contextvars.bind_contextvars(conn_id="c9", protocol="mqtt")
    ctx_one, ctx_run, one, run = _contexts()
    ctx_one.request_run(dict(_SHARED), list(_STATUSES), list(_OUTCOMES), list(_TOPICS))
    ctx_run.request_run(dict(_SHARED), list(_STATUSES), list(_OUTCOMES), list(_TOPICS))
    assert ctx_one.requests == ctx_run.requests == 5
    counted, aggregated = _samples(one), _samples(run)
    assert (
        counted[("mqproxy_requests_total", (("op", "PUBLISH"), ("outcome", "error"), ("protocol", "mqtt")))]
        == 2
    )
    assert aggregated.keys() == counted.keys()
    for key, value in counted.items():
        assert aggregated[key] == pytest.approx(value), key
    events = [{k: v for k, v in e.items() if k != "ts"} for e in log_sink.events]  # schema-validated
    per_request, batched = events[:5], events[5:]
    assert [e["event"] for e in per_request] == ["request"] * 5
    assert [e["event"] for e in batched] == ["request.run"]
    assert batched[0]["count"] == 5
    assert batched[0]["errors"] == 2
    assert _expanded(batched[0]) == per_request


def test_a_run_of_one_is_a_plain_request_line(log_sink: Any) -> None:
    structlog.contextvars.bind_contextvars(conn_id="c9", protocol="mqtt")
    ctx_one, ctx_run, _, _ = _contexts()
    ctx_one.request_run(dict(_SHARED), ["SUCCESS"], ["ok"], ["a/1"])
    ctx_run.request_run(dict(_SHARED), ["SUCCESS"], ["ok"], ["a/1"])
    lines = [{k: v for k, v in e.items() if k != "ts"} for e in log_sink.events]
    assert lines[0] == lines[1]
    assert lines[1]["event"] == "request"
    assert lines[1]["topic"] == "a/1"
    assert "count" not in lines[1]


def test_a_sampled_run_logs_the_sampled_requests_and_counts_all(
    log_sink: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    structlog.contextvars.bind_contextvars(conn_id="c9", protocol="mqtt")
    _, ctx_run, _, run = _contexts(request_sample_rate=0.5)
    draws = iter([0.1, 0.9, 0.2, 0.9, 0.3])  # keeps the 1st, 3rd and 5th
    monkeypatch.setattr("mqproxy.context.random.random", lambda: next(draws))
    ctx_run.request_run(dict(_SHARED), list(_STATUSES), list(_OUTCOMES), list(_TOPICS))
    (line,) = log_sink.events
    assert (line["event"], line["count"], line["errors"]) == ("request.run", 3, 2)
    assert line["topics"] == ["a/1", "b", None]
    assert line["statuses"] == ["SUCCESS", "NOT_AUTHORIZED", "CLOSED"]
    assert sum(v for (name, _), v in _samples(run).items() if name == "mqproxy_requests_total") == 5
