"""Message-trace tables (``trace.record`` events joined to the connection events): small hand-made
DataFrames and the reference answer over the generated corpus."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

from mqproxy.spark_etl import message_trace
from mqproxy.spark_etl.schema import EVENT_SCHEMA
from mqproxy.spark_etl.synthetic_trace import (
    expected_message_paths,
    expected_message_trace,
    trace_dates,
    trace_events,
)

T0 = datetime(2026, 11, 22, 23, 59, 59, tzinfo=UTC)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MS0 = (T0 - EPOCH) // timedelta(milliseconds=1)


def _df(spark: Any, events: list[dict[str, Any]]) -> Any:
    names = EVENT_SCHEMA.fieldNames()
    return spark.createDataFrame([tuple(e.get(n) for n in names) for e in events], EVENT_SCHEMA)


def _conn(conn_id: str, protocol: str, peer: str, client_id: str) -> list[dict[str, Any]]:
    base = {"level": "info", "conn_id": conn_id}
    return [
        {**base, "ts": T0 - timedelta(seconds=5), "event": "conn.accepted", "peer": peer,
         "local": "127.0.0.1:1"},
        {**base, "ts": T0 - timedelta(seconds=5), "event": "conn.negotiated", "protocol": protocol,
         "tls": False, "sniff_ms": 0.1, "proxied": False},
        {**base, "ts": T0 - timedelta(seconds=4), "event": "request", "protocol": protocol, "op": "X",
         "outcome": "ok", "latency_ms": 0.1, "client_id": client_id},
    ]  # fmt: skip


def _rec(
    offset_ms: int, kind: str, msg_id: str, conn: str | None, protocol: str | None, **fields: Any
) -> Any:
    event = {"ts": T0 + timedelta(milliseconds=offset_ms, microseconds=300), "level": "info",
             "event": "trace.record", "trace_type": kind, "msg_id": msg_id, "timestamp_ms": MS0 + offset_ms,
             **fields}  # fmt: skip
    if conn is not None:
        event.update(conn_id=conn, protocol=protocol)
    return event


def _hand_made() -> list[dict[str, Any]]:
    return [
        *_conn("p1", "mqtt", "10.0.0.1:5000", "dev-1"),
        *_conn("s1", "remoting", "10.0.0.2:6000", "10.0.0.2@123"),
        *_conn("s2", "grpc", "10.0.0.3:7000", "g@1"),
        _rec(0, "Pub", "M1", "p1", "mqtt", group="dev-1", topic="home", cost_ms=1, success=True),
        _rec(12, "SubBefore", "M1", "s1", "remoting", group="CG", request_id="A", retry_times=0),
        _rec(1012, "SubBefore", "M1", "s1", "remoting", group="CG", request_id="B", retry_times=1),
        _rec(1050, "SubAfter", "M1", "s1", "remoting", group="CG", request_id="B", cost_ms=38, success=True),
        _rec(30, "SubBefore", "M1", "s2", "grpc", group="GG", request_id="C", retry_times=0),
        _rec(5, "Pub", "M2", None, None, group="dev-9", topic="home", cost_ms=0, success=True),  # a Will
        _rec(
            1009, "SubBefore", "M3", "gone", "grpc", group="GG", request_id="D", retry_times=0
        ),  # no Pub, no conn
    ]


def test_reference_on_hand_made_records() -> None:
    paths = expected_message_paths(_hand_made())
    assert paths["M1"] == {
        "date": date(2026, 11, 22), "topic": "home", "producer_protocol": "mqtt",
        "producer_peer": "10.0.0.1:5000", "producer_client_id": "dev-1", "producer_group": "dev-1",
        "producer_conn_id": "p1", "publishes": 1, "publish_failures": 0, "deliveries": 3, "consumer_count": 2,
        "consumers": {("remoting", "10.0.0.2:6000", "CG", "10.0.0.2@123"),
                      ("grpc", "10.0.0.3:7000", "GG", "g@1")},
        "first_delivery_ms": 12, "acks": 1, "transaction_state": None,
    }  # fmt: skip
    assert (paths["M2"]["producer_peer"], paths["M2"]["producer_group"], paths["M2"]["deliveries"]) == (
        None, "dev-9", 0
    )  # fmt: skip
    assert (paths["M3"]["producer_protocol"], paths["M3"]["first_delivery_ms"], paths["M3"]["date"]) == (
        None, None, date(2026, 11, 23)
    )  # fmt: skip
    assert expected_message_trace(_hand_made())[("M3", "SubBefore", "GG", MS0 + 1009)]["protocol"] == "grpc"


def test_generated_records_cover_every_case() -> None:
    start = T0 - timedelta(minutes=3)
    events = list(trace_events(90, start=start, span=timedelta(minutes=6), seed=5, error_ratio=0.2))
    paths = expected_message_paths(events)
    assert 80 < len(paths) <= 90  # a message published before the logs and never delivered leaves none
    assert trace_dates(events) == {date(2026, 11, 22), date(2026, 11, 23)}
    assert {p["producer_protocol"] for p in paths.values()} == {"remoting", "grpc", "mqtt", None}
    assert any(p["publishes"] == 0 and p["deliveries"] for p in paths.values())  # published before the logs
    refused = [p for p in paths.values() if p["publish_failures"]]
    assert refused
    assert all(p["deliveries"] == 0 for p in refused)  # nobody gets what the store refused
    assert {p["transaction_state"] for p in paths.values()} >= {"COMMIT_MESSAGE", None}
    assert any(p["deliveries"] > p["consumer_count"] > 0 for p in paths.values())  # a redelivery
    assert max(p["consumer_count"] for p in paths.values()) == 3


@pytest.mark.spark
def test_records_join_their_connections(spark: Any) -> None:
    df = _df(spark, _hand_made())
    rows = message_trace.message_trace(df).collect()
    assert len(rows) == 7
    assert tuple(rows[0].asDict()) == message_trace.TRACE_COLUMNS
    got = {(r.msg_id, r.trace_type, r.group, r.timestamp_ms): r for r in rows}
    expected = expected_message_trace(_hand_made())
    assert {
        k: {c: got[k][c] for c in ("protocol", "peer", "client_id", "connected_at")} for k in got
    } == expected
    pub = got[("M1", "Pub", "dev-1", MS0)]
    assert (pub.record_at, pub.date, pub.topic, pub.cost_ms, pub.success) == (
        datetime(2026, 11, 22, 23, 59, 59), date(2026, 11, 22), "home", 1, True
    )  # fmt: skip
    retry = got[("M1", "SubBefore", "CG", MS0 + 1012)]
    assert (retry.retry_times, retry.request_id, retry.date) == (1, "B", date(2026, 11, 23))


@pytest.mark.spark
def test_one_path_per_message(spark: Any) -> None:
    df = _df(spark, _hand_made())
    rows = message_trace.message_paths(df).collect()
    assert tuple(rows[0].asDict()) == message_trace.PATH_COLUMNS
    by_id = {r.msg_id: r for r in rows}
    m1 = by_id["M1"]
    assert [tuple(c) for c in m1.consumers] == [
        ("grpc", "10.0.0.3:7000", "GG", "g@1"), ("remoting", "10.0.0.2:6000", "CG", "10.0.0.2@123")
    ]  # fmt: skip
    assert m1.published_at == datetime(2026, 11, 22, 23, 59, 59)
    assert m1.first_delivered_at == datetime(2026, 11, 22, 23, 59, 59, 12000)
    assert m1.last_acked_at == datetime(2026, 11, 23, 0, 0, 0, 50000)
    assert _comparable(rows) == expected_message_paths(_hand_made())


def _comparable(rows: list[Any]) -> dict[str, dict[str, Any]]:
    """``message_paths`` rows in the reference's shape (consumers as a set, no timestamps)."""
    out = {}
    for r in rows:
        row = r.asDict(recursive=True)
        row["consumers"] = {tuple(c[f] for f in message_trace.CONSUMER_FIELDS) for c in row["consumers"]}
        for name in ("msg_id", "published_at", "first_delivered_at", "last_acked_at"):
            del row[name]
        out[r.msg_id] = row
    return out


@pytest.mark.spark
def test_batch_tables_match_the_reference(spark: Any, batch_run: Any) -> None:
    paths = spark.read.parquet(str(batch_run.output / "message_paths")).collect()
    expected = expected_message_paths(batch_run.events)
    assert len(paths) == len(expected) > 100
    assert _comparable(paths) == expected
    trace = spark.read.parquet(str(batch_run.output / "message_trace")).collect()
    got = {
        (r.msg_id, r.trace_type, r.group, r.timestamp_ms): {
            c: r[c] for c in ("protocol", "peer", "client_id", "connected_at")
        }
        for r in trace
    }
    assert len(trace) == len(got) == sum(e["event"] == "trace.record" for e in batch_run.events)
    assert got == expected_message_trace(batch_run.events)


@pytest.mark.spark
def test_no_trace_records_give_empty_tables(spark: Any) -> None:
    df = _df(spark, _conn("p1", "mqtt", "10.0.0.1:5000", "dev-1"))
    assert message_trace.message_trace(df).count() == 0
    assert message_trace.message_paths(df).count() == 0
