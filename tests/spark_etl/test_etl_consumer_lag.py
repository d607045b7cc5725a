"""Consumer-lag tables (``metrics.lag`` events): small hand-made DataFrames and the reference answer over the
generated corpus."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

from mqproxy.spark_etl import consumer_lag
from mqproxy.spark_etl.schema import EVENT_SCHEMA
from mqproxy.spark_etl.synthetic_lag import expected_consumer_lag_minute, lag_events

T0 = datetime(2026, 11, 22, 23, 59, 10, tzinfo=UTC)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _df(spark: Any, events: list[dict[str, Any]]) -> Any:
    names = EVENT_SCHEMA.fieldNames()
    return spark.createDataFrame([tuple(e.get(n) for n in names) for e in events], EVENT_SCHEMA)


def _lag(offset_s: float, group: str, topic: str, broker: int, consumer: int) -> dict[str, Any]:
    at = T0 + timedelta(seconds=offset_s)
    return {
        "ts": at + timedelta(milliseconds=2),
        "level": "info",
        "event": "metrics.lag",
        "group": group,
        "topic": topic,
        "queues": 4,
        "broker_offset": broker,
        "consumer_offset": consumer,
        "lag": broker - consumer,
        "reading_ms": (at - EPOCH) // timedelta(milliseconds=1),
    }


def test_reference_on_a_hand_made_minute() -> None:
    events = [_lag(0, "G", "T", 10, 4), _lag(15, "G", "T", 30, 20), _lag(55, "G", "T", 31, 31)]
    got = expected_consumer_lag_minute(events)
    assert got == {
        (datetime(2026, 11, 22, 23, 59), "G", "T"): {
            "readings": 2, "lag_max": 10, "lag_min": 6, "lag_last": 10, "consumed": 16, "produced": 20,
        },
        (datetime(2026, 11, 23, 0, 0), "G", "T"): {
            "readings": 1, "lag_max": 0, "lag_min": 0, "lag_last": 0, "consumed": 0, "produced": 0,
        },
    }  # fmt: skip


def test_generated_readings_are_consistent() -> None:
    events = list(lag_events(2, start=T0, span=timedelta(minutes=1), seed=3))
    assert len(events) == 4 * 4  # 2 groups x 2 topics, a reading every 15 s
    assert all(e["lag"] == e["broker_offset"] - e["consumer_offset"] >= 0 for e in events)


@pytest.mark.spark
def test_one_row_per_reading_and_minutes_cross_midnight(spark: Any) -> None:
    events = [
        _lag(0, "G", "T", 10, 4),
        _lag(15, "G", "T", 30, 20),
        _lag(15, "H", "%LMQ%", 5, 5),
        _lag(55, "G", "T", 31, 31),
        {"ts": T0, "level": "info", "event": "request", "conn_id": "x", "protocol": "grpc", "op": "Send",
         "outcome": "ok", "latency_ms": 1.0},
    ]  # fmt: skip
    df = _df(spark, events)
    rows = consumer_lag.consumer_lag(df).orderBy("ts", "group").collect()
    assert len(rows) == 4
    assert rows[0].asDict() == {
        "date": date(2026, 11, 22),
        "ts": datetime(2026, 11, 22, 23, 59, 10, 2000),
        "reading_at": datetime(2026, 11, 22, 23, 59, 10),
        "group": "G",
        "topic": "T",
        "queues": 4,
        "broker_offset": 10,
        "consumer_offset": 4,
        "lag": 6,
    }
    minutes = consumer_lag.consumer_lag_minute(df).collect()
    got = {(r.minute, r.group, r.topic): {m: r[m] for m in consumer_lag.LAG_METRICS} for r in minutes}
    assert got == expected_consumer_lag_minute(events)
    assert {r.date for r in minutes} == {date(2026, 11, 22), date(2026, 11, 23)}


@pytest.mark.spark
def test_batch_tables_match_the_reference(spark: Any, batch_run: Any) -> None:
    rows = spark.read.parquet(str(batch_run.output / "consumer_lag_minute")).collect()
    got = {(r.minute, r.group, r.topic): {m: r[m] for m in consumer_lag.LAG_METRICS} for r in rows}
    assert got == expected_consumer_lag_minute(batch_run.events)
    readings = [e for e in batch_run.events if e["event"] == "metrics.lag"]
    assert batch_run.summary.table_rows["consumer_lag"] == len(readings) > 0


@pytest.mark.spark
def test_no_lag_events_give_empty_tables(spark: Any) -> None:
    df = _df(spark, [{"ts": T0, "level": "info", "event": "proxy.started"}])
    assert consumer_lag.consumer_lag(df).count() == 0
    assert consumer_lag.consumer_lag_minute(df).count() == 0
