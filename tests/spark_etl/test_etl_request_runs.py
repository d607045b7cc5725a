"""``request.run`` events: the batch tables from aggregated logs equal those from one ``request`` line per
request of the same traffic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mqproxy.spark_etl import synthetic
from mqproxy.spark_etl.batch import build_tables, read_raw, stage_events

pytestmark = pytest.mark.spark

_PER_REQUEST = ("status", "outcome", "topic")
_FROM_REQUESTS = ("connections", "requests", "rollup_minute", "ops", "tenants", "top_clients")


def _in_runs(events: list[dict[str, Any]], size: int) -> list[list[dict[str, Any]]]:
    """Each connection's requests grouped by ``size`` consecutive ones, made to share every field but
    status, outcome and topic (what one read's run shares); other events are groups of one."""
    groups: list[list[dict[str, Any]]] = []
    for event in events:
        last = groups[-1] if groups else None
        if (
            event["event"] == "request"
            and last is not None
            and last[0]["event"] == "request"
            and last[0]["conn_id"] == event["conn_id"]
            and len(last) < size
        ):
            shared = {k: v for k, v in last[0].items() if k not in _PER_REQUEST}
            last.append({**shared, **{k: event.get(k) for k in _PER_REQUEST}})
        else:
            groups.append([event])
    return groups


def _folded(group: list[dict[str, Any]]) -> dict[str, Any]:
    """The documented rule: a run of two or more is one ``request.run`` (shared fields, count, errors,
    the per-request arrays in order); a run of one is its ``request``."""
    if len(group) == 1:
        return group[0]
    shared = {k: v for k, v in group[0].items() if k not in _PER_REQUEST}
    outcomes = [e["outcome"] for e in group]
    return {
        **shared,
        "event": "request.run",
        "count": len(group),
        "errors": outcomes.count("error"),
        "statuses": [e["status"] for e in group],
        "outcomes": outcomes,
        "topics": [e["topic"] for e in group],
    }


def _tables(spark: Any, logs: Path) -> dict[str, list[str]]:
    """The tables built from requests, as the batch builds them (staged rows, valid ones), collected."""
    staged = stage_events(read_raw(spark, str(logs))).where("_quarantine_reason IS NULL")
    tables = build_tables(staged.drop("_quarantine_reason", "_quarantine_line"))
    return {
        name: sorted(repr(sorted(row.asDict().items())) for row in tables[name].collect())
        for name in _FROM_REQUESTS
    }


def test_tables_from_runs_equal_tables_from_one_line_per_request(spark: Any, tmp_path: Path) -> None:
    corpus = list(synthetic.iter_events(40, synthetic.CorpusOptions(seed=11, max_requests=14)))
    for number, event in enumerate(corpus):
        if event["event"] == "request" and number % 7 == 0:
            event["topic"] = None  # a request without a topic (a failed read's close)
    groups = _in_runs(corpus, size=4)
    per_request = [event for group in groups for event in group]
    folded = [_folded(group) for group in groups]
    runs = [e for e in folded if e["event"] == "request.run"]
    assert len(runs) > 20
    assert any(e["errors"] for e in runs)
    assert any(None in e["statuses"] for e in runs)  # oneway requests have no status
    for name, events in (("per_request", per_request), ("folded", folded)):
        (tmp_path / name).mkdir()
        synthetic.write_jsonl(tmp_path / name / "proxy.log", events)
    before = _tables(spark, tmp_path / "per_request")
    after = _tables(spark, tmp_path / "folded")
    assert len(before["requests"]) == sum(e["event"] == "request" for e in per_request)
    for name in _FROM_REQUESTS:
        assert before[name], name
        assert after[name] == before[name], name
