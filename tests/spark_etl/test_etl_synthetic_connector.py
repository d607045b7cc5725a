"""The synthetic connector's events are consistent with what a real connector would log."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from mqproxy.spark_etl import synthetic
from mqproxy.spark_etl.synthetic_connector import CONNECTOR, connector_events

START = datetime(2026, 11, 22, 23, 58, tzinfo=UTC)
SPAN = timedelta(minutes=4)


def _events(rules: int = 2, error_ratio: float = 0.05, seed: int = 3) -> list[dict[str, Any]]:
    return list(connector_events(rules, start=START, span=SPAN, seed=seed, error_ratio=error_ratio))


def test_corpus_gains_connector_events_only_when_asked_and_connections_stay_the_same() -> None:
    plain = list(synthetic.iter_events(40, synthetic.CorpusOptions(seed=6)))
    with_connector = list(synthetic.iter_events(40, synthetic.CorpusOptions(seed=6, connector_rules=1)))
    assert not [e for e in plain if e["event"].startswith("connector.")]
    assert with_connector[: len(plain)] == plain
    tail = with_connector[len(plain) :]
    assert tail
    assert all(e["event"].startswith("connector.") for e in tail)


def test_same_seed_same_events_and_lifecycle_brackets_them() -> None:
    events = _events()
    assert events == _events()
    assert events != _events(seed=4)
    assert (events[0]["event"], events[-1]["event"]) == ("connector.started", "connector.stopped")
    assert events[0]["rules"] == events[-1]["rules"] == 2
    assert {e["connector"] for e in events} == {CONNECTOR}
    assert all(START <= e["ts"] <= START + SPAN for e in events)
    assert len({e["rule"] for e in events if e["event"] == "connector.batch"}) == 2


def test_batches_copy_each_source_queue_contiguously_in_time_order() -> None:
    batches = [e for e in _events() if e["event"] == "connector.batch"]
    next_offset: dict[tuple[str, str], int] = defaultdict(int)
    last_ts: dict[str, datetime] = {}
    for b in batches:
        key = (b["rule"], b["source_queue"])
        assert b["first_offset"] == next_offset[key]
        assert b["last_offset"] - b["first_offset"] + 1 == b["messages"] >= 1
        next_offset[key] = b["last_offset"] + 1
        assert b["delay_ms_max"] >= b["delay_ms_min"] >= 0
        assert b["bytes"] >= b["messages"] * 100
        assert b["ts"] > last_ts.get(b["rule"], START)
        last_ts[b["rule"]] = b["ts"]


def test_lag_reports_name_the_last_batch_copied_from_their_queue() -> None:
    last_copied: dict[tuple[Any, Any], int] = {}
    reports = 0
    for e in _events(rules=1):
        key = (e.get("rule"), e.get("source_queue"))
        if e["event"] == "connector.batch":
            last_copied[key] = (e["ts"] - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)
        elif e["event"] == "connector.lag":
            reports += 1
            assert e["last_copied_ms"] == last_copied.get(key)
    assert reports == 4 * 24, "4 queues, every 10 s over 4 minutes"


def test_error_ratio_drives_dead_letters_and_errors() -> None:
    quiet = _events(error_ratio=0.0)
    assert not [e for e in quiet if e["event"] == "connector.dead_letter"]
    errors = [e for e in quiet if e["event"] == "connector.error"]
    assert [(e["rule"], e["op"]) for e in errors] == [(None, "route")]
    noisy = _events(error_ratio=1.0)
    batches = sum(e["event"] == "connector.batch" for e in noisy)
    assert sum(e["event"] == "connector.dead_letter" for e in noisy) == batches
    assert sum(e["event"] == "connector.error" for e in noisy) == batches + 1
