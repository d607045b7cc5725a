"""Replication transforms on small in-memory DataFrames: edge cases the generated corpus does not pin down."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

from mqproxy.spark_etl import replication
from mqproxy.spark_etl.schema import EVENT_SCHEMA

pytestmark = pytest.mark.spark

T0 = datetime(2026, 11, 22, 23, 59, 10, tzinfo=UTC)
RULE = {"connector": "edge-to-central", "rule": "edge->central:Orders"}


def _df(spark: Any, events: list[dict[str, Any]]) -> Any:
    names = EVENT_SCHEMA.fieldNames()
    return spark.createDataFrame([tuple(e.get(n) for n in names) for e in events], EVENT_SCHEMA)


def _ev(event: str, offset_s: float, **fields: Any) -> dict[str, Any]:
    return {"ts": T0 + timedelta(seconds=offset_s), "level": "info", "event": event, **fields}


def _batch(offset_s: float, delay_ms_max: int, messages: int = 4, **fields: Any) -> dict[str, Any]:
    return _ev(
        "connector.batch",
        offset_s,
        **{**RULE, **fields},
        source="edge",
        target="central",
        topic="Orders",
        target_topic="OrdersCopy",
        source_queue="b0:1",
        target_queue="c0:1",
        messages=messages,
        bytes=100 * messages,
        first_offset=10,
        last_offset=10 + messages - 1,
        delay_ms_max=delay_ms_max,
        delay_ms_min=1,
    )


def test_replication_is_one_row_per_batch_with_its_fields(spark: Any) -> None:
    events = [
        _batch(0, 40),
        _batch(1, 50, connector=None),
        _ev("connector.lag", 2, **RULE, topic="Orders", source_queue="b0:1", lag=3, last_copied_ms=None),
        _ev("request", 3, conn_id="x", protocol="grpc", op="SendMessage", outcome="ok", latency_ms=1.0),
        _ev("connector.queues", 4, **RULE, owned=1, acquired=["b0:1"], released=[]),
    ]
    rows = replication.replication(_df(spark, events)).orderBy("ts").collect()
    assert rows[0].asDict() == {
        "date": date(2026, 11, 22),
        "ts": datetime(2026, 11, 22, 23, 59, 10),
        **RULE,
        "source": "edge",
        "target": "central",
        "topic": "Orders",
        "target_topic": "OrdersCopy",
        "source_queue": "b0:1",
        "target_queue": "c0:1",
        "messages": 4,
        "bytes": 400,
        "first_offset": 10,
        "last_offset": 13,
        "delay_ms_max": 40,
        "delay_ms_min": 1,
    }
    assert [r.connector for r in rows] == ["edge-to-central", "(unknown)"]


def test_minute_rollup_counts_batches_failures_and_lag_per_rule(spark: Any) -> None:
    other = {**RULE, "rule": "edge->central:Audit"}
    lag = {"topic": "Orders", "source_queue": "b0:1"}
    events = [
        *(_batch(i * 0.4, delay_ms_max=d) for i, d in enumerate([30, 10, 20, 90, 40])),
        _batch(2, delay_ms_max=7, messages=1, **other),
        _ev("connector.lag", 1, **RULE, **lag, lag=12, last_copied_ms=1_764_100_000_123),
        _ev("connector.lag", 2, **RULE, **lag, lag=30, last_copied_ms=None),
        _ev("connector.dead_letter", 3, **RULE, topic="Orders", source_queue="b0:1", offset=11),
        _ev("connector.dead_letter", 4, **RULE, topic="Orders", source_queue="b0:1", offset=12),
        _ev("connector.error", 5, **RULE, cluster="central", op="send", detail="x", retry_in_s=1.0),
        _ev("connector.error", 6, connector=RULE["connector"], rule=None, cluster="edge", op="route"),
        # Next minute (and day): copying stalled, only lag reported.
        _ev("connector.lag", 55, **RULE, **lag, lag=80, last_copied_ms=1_764_100_000_123),
        _ev("connector.started", 0, connector=RULE["connector"], rules=2),
    ]
    rows = replication.replication_minute_rollup(_df(spark, events)).collect()
    got = {(r.minute.strftime("%H:%M"), r.rule): r.asDict() for r in rows}
    assert set(got) == {
        ("23:59", "edge->central:Orders"),
        ("23:59", "edge->central:Audit"),
        ("23:59", "(unknown)"),
        ("00:00", "edge->central:Orders"),
    }
    orders = got[("23:59", "edge->central:Orders")]
    assert {k: orders[k] for k in ("batches", "messages", "bytes", "dead_letters", "errors", "lag_max")} == {
        "batches": 5,
        "messages": 20,
        "bytes": 2000,
        "dead_letters": 2,
        "errors": 1,
        "lag_max": 30,
    }
    # Nearest rank over the five batches' delay_ms_max: 10 20 30 40 90.
    assert (orders["delay_p50"], orders["delay_p95"], orders["delay_p99"], orders["delay_max"]) == (
        30,
        90,
        90,
        90,
    )
    assert orders["last_copied_at"] == datetime(2025, 11, 25, 19, 46, 40, 123000)
    assert orders["date"] == date(2026, 11, 22)
    assert got[("23:59", "edge->central:Audit")]["delay_p50"] == 7
    unknown = got[("23:59", "(unknown)")]
    assert (unknown["errors"], unknown["batches"], unknown["messages"], unknown["delay_p99"]) == (
        1,
        0,
        0,
        None,
    )
    stalled = got[("00:00", "edge->central:Orders")]
    assert (stalled["date"], stalled["batches"], stalled["lag_max"]) == (date(2026, 11, 23), 0, 80)
    assert stalled["delay_max"] is None
    assert list(rows[0].asDict()) == ["date", "minute", "connector", "rule", *replication.REPLICATION_METRICS]


def test_logs_without_connector_events_give_empty_tables(spark: Any) -> None:
    events = [_ev("request", 0, conn_id="x", protocol="mqtt", op="PUBLISH", outcome="ok", latency_ms=1.0)]
    df = _df(spark, events)
    assert replication.replication(df).count() == 0
    assert replication.replication_minute_rollup(df).count() == 0
