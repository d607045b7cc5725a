"""The corpus generator is deterministic and its reference answers are right on small cases."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta

import orjson
import pytest

from mqproxy.spark_etl import synthetic


def test_nearest_rank_matches_its_definition() -> None:
    rng = random.Random(3)
    for n in (1, 2, 3, 10, 99, 100, 101):
        values = [float(rng.randrange(40)) for _ in range(n)]
        for p in (0.5, 0.95, 0.99):
            got = synthetic.nearest_rank(values, p)
            assert got is not None
            at_or_below = sum(v <= got for v in values)
            below = sum(v < got for v in values)
            assert at_or_below >= p * n > below or (below == 0 and at_or_below >= p * n)
    assert synthetic.nearest_rank([], 0.5) is None
    assert synthetic.nearest_rank([float(v) for v in range(1, 101)], 0.95) == 95.0


def test_same_seed_same_corpus_other_seed_other_corpus() -> None:
    opts = synthetic.CorpusOptions(seed=9)
    first = [synthetic.encode(e) for e in synthetic.iter_events(30, opts)]
    again = [synthetic.encode(e) for e in synthetic.iter_events(30, opts)]
    other = [synthetic.encode(e) for e in synthetic.iter_events(30, synthetic.CorpusOptions(seed=10))]
    assert first == again
    assert first != other


def test_encode_renders_utc_iso_with_z_and_keeps_unicode() -> None:
    event = {
        "ts": datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
        "level": "info",
        "event": "request",
        "client_id": "设备-温度-01",
    }
    line = synthetic.encode(event)
    assert line.endswith(b"\n")
    assert orjson.loads(line) == {
        "ts": "2026-01-02T03:04:05.000006Z",
        "level": "info",
        "event": "request",
        "client_id": "设备-温度-01",
    }


def test_every_connection_is_accepted_then_negotiated_or_rejected() -> None:
    events = list(
        synthetic.iter_events(200, synthetic.CorpusOptions(reject_ratio=0.3, skew_ratio=0.5, seed=2))
    )
    by_conn: dict[str, list[str]] = {}
    for e in events:
        by_conn.setdefault(e["conn_id"], []).append(e["event"])
    assert len(by_conn) == 200
    for kinds in by_conn.values():
        assert kinds[0] == "conn.accepted"
        assert kinds[1:] == ["conn.rejected"] or (
            kinds[1] == "conn.negotiated" and kinds[-1] == "conn.closed"
        )
    skewed = [
        e
        for e in events
        if e["event"] == "conn.closed"
        and e["duration_ms"] > 0
        and e["ts"] < next(a["ts"] for a in events if a["conn_id"] == e["conn_id"])
    ]
    assert skewed, "skew_ratio=0.5 must stamp some closes before their accepts"


def test_reference_rollup_on_a_hand_made_minute() -> None:
    t = datetime(2026, 11, 22, 14, 5, 0, tzinfo=UTC)
    events = [
        {"ts": t, "event": "conn.negotiated", "protocol": "grpc"},
        *(
            {
                "ts": t + timedelta(seconds=i % 40),
                "event": "request",
                "protocol": "grpc",
                "outcome": outcome,
                "latency_ms": float(i),
                "req_bytes": 10,
                "resp_bytes": 1,
            }
            for i, outcome in zip(range(1, 101), ["ok"] * 90 + ["error"] * 5 + ["oneway"] * 5, strict=True)
        ),
        {
            "ts": t + timedelta(seconds=55),
            "event": "conn.closed",
            "protocol": "grpc",
            "bytes_in": 7,
            "bytes_out": 3,
            "error": "reset",
        },
        {"ts": t, "event": "conn.rejected", "reason": "sniff_timeout"},
    ]
    (key,) = synthetic.expected_minute_rollup(events)
    row = synthetic.expected_minute_rollup(events)[key]
    assert key == (datetime(2026, 11, 22, 14, 5), "grpc")
    assert (row["requests"], row["errors"], row["oneway"], row["error_rate"]) == (100, 5, 5, 0.05)
    assert (row["latency_p50"], row["latency_p95"], row["latency_p99"]) == (50.0, 95.0, 99.0)
    assert (row["req_bytes"], row["resp_bytes"]) == (1000, 100)
    assert (row["connections_opened"], row["connections_closed"], row["connection_errors"]) == (1, 1, 1)
    assert (row["conn_bytes_in"], row["conn_bytes_out"]) == (7, 3)


def test_reference_replication_minute_on_a_hand_made_minute() -> None:
    t = datetime(2026, 11, 22, 14, 5, 0, tzinfo=UTC)
    rule = {"connector": "c", "rule": "a->b:T"}
    events = [
        *(
            {"ts": t + timedelta(seconds=i % 50), "event": "connector.batch", **rule}
            | {"messages": 2, "bytes": 30, "delay_ms_max": i, "delay_ms_min": 0}
            for i in range(1, 101)
        ),
        {"ts": t, "event": "connector.lag", **rule, "lag": 7, "last_copied_ms": None},
        {"ts": t, "event": "connector.lag", **rule, "lag": 9, "last_copied_ms": 1_500},
        {"ts": t, "event": "connector.dead_letter", **rule},
        {"ts": t, "event": "connector.error", "connector": "c", "rule": None},
        {"ts": t + timedelta(minutes=1), "event": "connector.lag", **rule, "lag": 3, "last_copied_ms": None},
        {"ts": t, "event": "connector.started", "connector": "c", "rules": 1},
    ]
    got = synthetic.expected_replication_minute(events)
    minute = datetime(2026, 11, 22, 14, 5)
    assert set(got) == {
        (minute, "c", "a->b:T"),
        (minute, "c", "(unknown)"),
        (minute.replace(minute=6), "c", "a->b:T"),
    }
    row = got[(minute, "c", "a->b:T")]
    assert (row["batches"], row["messages"], row["bytes"]) == (100, 200, 3000)
    assert (row["delay_p50"], row["delay_p95"], row["delay_p99"], row["delay_max"]) == (50, 95, 99, 100)
    assert (row["dead_letters"], row["errors"], row["lag_max"]) == (1, 0, 9)
    assert row["last_copied_at"] == datetime(1970, 1, 1, 0, 0, 1, 500_000)
    assert got[(minute, "c", "(unknown)")]["errors"] == 1
    stalled = got[(minute.replace(minute=6), "c", "a->b:T")]
    assert (stalled["batches"], stalled["delay_p99"], stalled["lag_max"], stalled["last_copied_at"]) == (
        0,
        None,
        3,
        None,
    )


def test_reference_top_clients_orders_by_requests_then_id() -> None:
    t = datetime(2026, 11, 22, tzinfo=UTC)
    events = [
        {"ts": t, "event": "request", "client_id": c, "conn_id": k}
        for c, k in [("b", "1"), ("b", "2"), ("a", "3"), ("é", "4"), ("é", "4"), ("z", "5")]
    ]
    assert synthetic.expected_top_clients(events, 3) == {
        date(2026, 11, 22): [("b", 2, 2), ("é", 2, 1), ("a", 1, 1)]
    }


@pytest.mark.parametrize("ratio", [0.0, 1.0])
def test_unicode_ratio_controls_non_ascii_client_ids(ratio: float) -> None:
    events = synthetic.iter_events(80, synthetic.CorpusOptions(unicode_ratio=ratio, seed=4))
    ids = {e["client_id"] for e in events if e["event"] == "request" and e["protocol"] == "mqtt"}
    assert ids
    assert any(not i.isascii() for i in ids) == (ratio == 1.0)
