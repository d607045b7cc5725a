"""Transforms on small in-memory DataFrames: edge cases the generated corpus does not pin down."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

from mqproxy.spark_etl import transforms
from mqproxy.spark_etl.schema import EVENT_SCHEMA

pytestmark = pytest.mark.spark

T0 = datetime(2026, 11, 22, 14, 4, 58, tzinfo=UTC)


def _df(spark: Any, events: list[dict[str, Any]]) -> Any:
    names = EVENT_SCHEMA.fieldNames()
    return spark.createDataFrame([tuple(e.get(n) for n in names) for e in events], EVENT_SCHEMA)


def _ev(event: str, conn_id: str, offset_s: float, **fields: Any) -> dict[str, Any]:
    return {
        "ts": T0 + timedelta(seconds=offset_s),
        "level": "info",
        "event": event,
        "conn_id": conn_id,
        **fields,
    }


def test_connections_states_and_client_seen_on_the_connection(spark: Any) -> None:
    events = [
        _ev("conn.accepted", "a", 0, peer="10.0.0.1:5000", local="127.0.0.1:9876"),
        _ev("conn.negotiated", "a", 0.001, protocol="mqtt", tls=True, sniff_ms=1.0, proxied=False),
        _ev(
            "request",
            "a",
            1,
            protocol="mqtt",
            op="PUBLISH",
            outcome="ok",
            latency_ms=1.0,
            client_id="é-1",
            client_version="5.0",
        ),
        _ev(
            "conn.closed", "a", -60, protocol="mqtt", bytes_in=10, bytes_out=5, duration_ms=2500.0, requests=1
        ),
        _ev("conn.accepted", "b", 0, peer="[::1]:6000", local="127.0.0.1:9876"),
        _ev("conn.rejected", "b", 0.5, reason="sniff_timeout", sniff_ms=500.0, bytes_in=3),
        _ev("conn.accepted", "c", 1, peer="10.0.0.3:1"),
        _ev("conn.negotiated", "c", 1.1, protocol="grpc", tls=False, sniff_ms=0.2, proxied=True),
        _ev("conn.accepted", "d", 2, peer="10.0.0.4:1"),
    ]
    rows = {r.conn_id: r for r in transforms.connections(_df(spark, events)).collect()}
    assert {k: r.state for k, r in rows.items()} == {
        "a": "closed",
        "b": "rejected",
        "c": "open",
        "d": "accepted",
    }
    a = rows["a"]
    assert (a.protocol, a.tls, a.client_id, a.tenant, a.duration_ms, a.logged_requests) == (
        "mqtt",
        True,
        "é-1",
        "é-1",
        2500.0,
        1,
    )
    assert a.closed_at < a.accepted_at, "skewed wall clock is kept; duration_ms stays authoritative"
    assert (rows["b"].rejected_reason, rows["b"].bytes_in, rows["b"].sniff_ms) == ("sniff_timeout", 3, 500.0)
    assert rows["c"].proxied is True
    assert rows["c"].tenant == "(unknown)"
    assert all(r.date == date(2026, 11, 22) for r in rows.values())


def test_tenant_falls_back_from_group_to_client_id_to_unknown(spark: Any) -> None:
    base = {"protocol": "remoting", "op": "SEND_MESSAGE_V2", "outcome": "ok", "latency_ms": 1.0}
    events = [
        _ev("request", "a", 0, group="GID_orders", client_id="c1", **base),
        _ev("request", "a", 0, group=None, client_id="设备-1", **base),
        _ev("request", "a", 0, group=None, client_id=None, **base),
    ]
    assert [r.tenant for r in transforms.requests(_df(spark, events)).collect()] == [
        "GID_orders",
        "设备-1",
        "(unknown)",
    ]


def test_minute_rollup_percentiles_error_rate_and_silent_minutes(spark: Any) -> None:
    start = datetime(2026, 11, 22, 14, 5, tzinfo=UTC)
    events = [
        {
            "ts": start + timedelta(milliseconds=i * 500),
            "level": "info",
            "event": "request",
            "conn_id": "x",
            "protocol": "grpc",
            "op": "SendMessage",
            "outcome": "error" if i <= 10 else "ok",
            "latency_ms": float(i),
            "req_bytes": 2,
            "resp_bytes": 1,
        }
        for i in range(1, 101)
    ]
    events.append(_ev("conn.negotiated", "y", 0, protocol="remoting", tls=False, sniff_ms=0.1, proxied=False))
    rows = {r.protocol: r for r in transforms.protocol_minute_rollup(_df(spark, events)).collect()}
    grpc = rows["grpc"]
    assert (grpc.minute, grpc.requests, grpc.errors, grpc.error_rate) == (
        start.replace(tzinfo=None),
        100,
        10,
        0.1,
    )
    assert (grpc.latency_p50, grpc.latency_p95, grpc.latency_p99) == (50.0, 95.0, 99.0)
    assert (grpc.req_bytes, grpc.resp_bytes) == (200, 100)
    remoting = rows["remoting"]
    assert (remoting.requests, remoting.error_rate, remoting.latency_p99, remoting.connections_opened) == (
        0,
        None,
        None,
        1,
    )


def test_top_clients_rank_ties_by_id_and_reject_bad_limit(spark: Any) -> None:
    base = {"protocol": "mqtt", "op": "PUBLISH", "outcome": "ok", "latency_ms": 1.0}
    events = [
        _ev("request", conn, 0, client_id=client, **base)
        for client, conn in [("b", "1"), ("b", "2"), ("🚀", "3"), ("🚀", "3"), ("a", "4")]
    ]
    rows = transforms.top_clients(_df(spark, events), 2).orderBy("rank").collect()
    assert [(r.rank, r.client_id, r.requests, r.connections) for r in rows] == [
        (1, "b", 2, 2),
        (2, "🚀", 2, 1),
    ]
    with pytest.raises(ValueError, match="limit"):
        transforms.top_clients(_df(spark, events), 0)


def test_negotiation_failures_count_peer_hosts_including_ipv6(spark: Any) -> None:
    events = [
        _ev("conn.accepted", "1", 0, peer="[::1]:5000"),
        _ev("conn.rejected", "1", 0.1, reason="unknown_protocol", sniff_ms=0.1, bytes_in=8),
        _ev("conn.accepted", "2", 0, peer="[::1]:5001"),
        _ev("conn.rejected", "2", 0.1, reason="unknown_protocol", sniff_ms=0.3, bytes_in=8),
        _ev("conn.accepted", "3", 0, peer="10.1.1.1:5001"),
        _ev("conn.rejected", "3", 0.1, reason="unknown_protocol", sniff_ms=0.2, bytes_in=0),
        _ev("conn.rejected", "4", 0.1, reason="sniff_timeout", sniff_ms=3000.0, bytes_in=0),
    ]
    rows = {r.reason: r for r in transforms.negotiation_failures(_df(spark, events)).collect()}
    unknown = rows["unknown_protocol"]
    assert (unknown.failures, unknown.peer_hosts, unknown.sniff_ms_p50, unknown.bytes_in) == (3, 2, 0.2, 16)
    assert (rows["sniff_timeout"].failures, rows["sniff_timeout"].peer_hosts) == (1, 0)
