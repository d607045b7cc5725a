"""The batch job over a generated corpus with known answers: every table is checked exactly."""

from __future__ import annotations

import json
from collections import Counter
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from mqproxy.spark_etl import synthetic
from mqproxy.spark_etl.batch import (
    SUMMARY_FILE,
    TABLE_EVENTS,
    TABLES,
    build_tables,
    read_raw,
    run_batch,
    stage_events,
)
from mqproxy.spark_etl.replication import REPLICATION_METRICS
from mqproxy.spark_etl.transforms import ROLLUP_METRICS

pytestmark = pytest.mark.spark


def _table(spark: Any, run: Any, name: str) -> list[Any]:
    return spark.read.parquet(str(run.output / name)).collect()


def test_summary_counts_rows_and_malformed_lines(batch_run: Any) -> None:
    summary = batch_run.summary
    n = len(batch_run.events)
    assert (summary.input_rows, summary.valid_events, summary.malformed) == (n + 7, n, 7)
    assert summary.malformed_by_reason == {"missing_event": 1, "missing_ts": 1, "unparseable": 5}
    on_disk = json.loads((batch_run.output / SUMMARY_FILE).read_text(encoding="utf-8"))
    assert on_disk["malformed"] == 7
    assert on_disk["table_rows"] == summary.table_rows
    assert set(summary.table_rows) == set(TABLES)


def test_malformed_lines_are_quarantined_verbatim(spark: Any, batch_run: Any) -> None:
    rows = spark.read.json(str(batch_run.output / "quarantine")).collect()
    assert Counter(r.reason for r in rows) == {"unparseable": 5, "missing_ts": 1, "missing_event": 1}
    # Not JSON, truncated, not an object, bad timestamp, wrong field type: kept byte for byte.
    assert {r.line for r in rows if r.reason == "unparseable"} == set(synthetic.MALFORMED_LINES[:5])
    missing_ts = next(json.loads(r.line) for r in rows if r.reason == "missing_ts")
    assert missing_ts["conn_id"] == "x3"


def test_rollup_minute_matches_the_reference_exactly(spark: Any, batch_run: Any) -> None:
    expected = synthetic.expected_minute_rollup(batch_run.events)
    rows = _table(spark, batch_run, "rollup_minute")
    got = {(r.minute, r.protocol): {m: r[m] for m in ROLLUP_METRICS} for r in rows}
    assert len(rows) == len(got), "one row per (minute, protocol)"
    assert got == expected
    assert {r.date for r in rows} == {date(2026, 11, 22), date(2026, 11, 23)}
    assert all(r.date == r.minute.date() for r in rows)


def test_rollup_is_partitioned_by_date_on_disk(batch_run: Any) -> None:
    for name in TABLES:
        parts = sorted(p.name for p in (batch_run.output / name).glob("date=*"))
        assert parts == ["date=2026-11-22", "date=2026-11-23"], name


def test_connections_one_row_per_connection_with_skew_kept(spark: Any, batch_run: Any) -> None:
    rows = {r.conn_id: r for r in _table(spark, batch_run, "connections")}
    events = batch_run.events
    assert len(rows) == len({e["conn_id"] for e in events if "conn_id" in e})
    rejected = {e["conn_id"]: e["reason"] for e in events if e["event"] == "conn.rejected"}
    closed = {e["conn_id"]: e for e in events if e["event"] == "conn.closed"}
    assert Counter(r.state for r in rows.values()) == {"rejected": len(rejected), "closed": len(closed)}
    for conn_id, reason in rejected.items():
        assert rows[conn_id].rejected_reason == reason
        assert rows[conn_id].protocol is None
    for conn_id, e in closed.items():
        row = rows[conn_id]
        assert (row.protocol, row.bytes_in, row.bytes_out, row.duration_ms, row.requests, row.error) == (
            e["protocol"],
            e["bytes_in"],
            e["bytes_out"],
            e["duration_ms"],
            e["requests"],
            e["error"],
        )
    skewed = [r for r in rows.values() if r.closed_at is not None and r.closed_at < r.accepted_at]
    assert skewed, "the corpus has clock-skewed closes"
    assert all(r.duration_ms > 0 for r in skewed)


def test_requests_carry_tenant_group_else_client_id(spark: Any, batch_run: Any) -> None:
    rows = _table(spark, batch_run, "requests")
    assert len(rows) == sum(e["event"] == "request" for e in batch_run.events)
    for r in rows:
        assert r.tenant == (r.group or r.client_id or "(unknown)")
    assert any(not r.tenant.isascii() for r in rows), "MQTT tenants fall back to unicode client ids"


def test_tenants_match_the_reference(spark: Any, batch_run: Any) -> None:
    got = {
        (r.date, r.tenant): {
            k: r[k] for k in ("requests", "errors", "clients", "req_bytes", "resp_bytes", "bytes")
        }
        for r in _table(spark, batch_run, "tenants")
    }
    assert got == synthetic.expected_tenant_traffic(batch_run.events)


def test_top_clients_match_the_reference_with_unicode_ids(spark: Any, batch_run: Any) -> None:
    rows = sorted(_table(spark, batch_run, "top_clients"), key=lambda r: (r.date, r.rank))
    got: dict[date, list[tuple[str, int, int]]] = {}
    for r in rows:
        got.setdefault(r.date, []).append((r.client_id, r.requests, r.connections))
    assert got == synthetic.expected_top_clients(batch_run.events, 5)
    assert [r.rank for r in rows if r.date == date(2026, 11, 22)] == [1, 2, 3, 4, 5]


def test_negotiation_failures_match_the_reference(spark: Any, batch_run: Any) -> None:
    got = {
        (r.date, r.reason): {
            k: r[k] for k in ("failures", "peer_hosts", "sniff_ms_p50", "sniff_ms_max", "bytes_in")
        }
        for r in _table(spark, batch_run, "negotiation_failures")
    }
    assert got == synthetic.expected_negotiation_failures(batch_run.events)


def test_ops_count_every_request_kind(spark: Any, batch_run: Any) -> None:
    expected: Counter[tuple[Any, ...]] = Counter()
    errors: Counter[tuple[Any, ...]] = Counter()
    for e in batch_run.events:
        if e["event"] == "request":
            key = (e["ts"].date(), e["protocol"], e["op"], e["code"])
            expected[key] += 1
            errors[key] += e["outcome"] == "error"
    rows = _table(spark, batch_run, "ops")
    assert {(r.date, r.protocol, r.op, r.code): r.requests for r in rows} == dict(expected)
    assert {(r.date, r.protocol, r.op, r.code): r.errors for r in rows} == dict(errors)


def test_replication_has_one_row_per_connector_batch(spark: Any, batch_run: Any) -> None:
    batches = [e for e in batch_run.events if e["event"] == "connector.batch"]
    rows = _table(spark, batch_run, "replication")
    assert batch_run.summary.table_rows["replication"] == len(rows) == len(batches)
    key = ("rule", "source_queue", "first_offset")
    got = {tuple(r[k] for k in key): (r.messages, r.bytes, r.delay_ms_max, r.target_queue) for r in rows}
    assert got == {
        tuple(e[k] for k in key): (e["messages"], e["bytes"], e["delay_ms_max"], e["target_queue"])
        for e in batches
    }
    assert all(r.date == r.ts.date() for r in rows)


def test_replication_minute_matches_the_reference_exactly(spark: Any, batch_run: Any) -> None:
    expected = synthetic.expected_replication_minute(batch_run.events)
    rows = _table(spark, batch_run, "replication_minute")
    got = {(r.minute, r.connector, r.rule): {m: r[m] for m in REPLICATION_METRICS} for r in rows}
    assert len(rows) == len(got), "one row per (minute, connector, rule)"
    assert got == expected
    assert sum(r.dead_letters for r in rows) == sum(
        e["event"] == "connector.dead_letter" for e in batch_run.events
    )
    assert any(r.rule == "(unknown)" and r.errors for r in rows), "the rule-less route error"


def _layout(root: Path) -> list[str]:
    """Relative paths under ``root``, part files reduced to their suffix (their names are random)."""
    names = []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        name = "part" + "".join(path.suffixes[-2:]) if "part-" in rel.name else rel.name
        names.append(str(rel.parent / name))
    return sorted(names)


def test_tables_of_absent_events_are_written_as_the_full_plan_would(spark: Any, tmp_path: Path) -> None:
    """Without connector, lag or trace events the optional tables come from an empty frame: the
    same schema and the same files on disk as their full plans over the events."""
    logs = tmp_path / "logs"
    logs.mkdir()
    corpus = list(synthetic.iter_events(40, synthetic.CorpusOptions(seed=3)))
    synthetic.write_jsonl(logs / "proxy.log", corpus)
    summary = run_batch(spark, str(logs), str(tmp_path / "gated"))
    assert {name: summary.table_rows[name] for name in TABLE_EVENTS} == dict.fromkeys(TABLE_EVENTS, 0)
    assert summary.table_rows["requests"] > 0

    events = stage_events(read_raw(spark, str(logs))).where("_quarantine_reason IS NULL")
    events = events.drop("_quarantine_reason", "_quarantine_line")
    full = build_tables(events)
    gated = build_tables(events, absent=frozenset(TABLE_EVENTS))
    for name in TABLE_EVENTS:
        assert gated[name].schema == full[name].schema, name
        assert gated[name].count() == 0, name
        full[name].write.mode("overwrite").partitionBy("date").parquet(str(tmp_path / "full" / name))
        assert _layout(tmp_path / "gated" / name) == _layout(tmp_path / "full" / name), name
