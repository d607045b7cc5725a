"""The HTML report and its PNG charts, from the shared batch run (which has a gRPC incident)."""

from __future__ import annotations

import struct
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from mqproxy.spark_etl import report

pytestmark = pytest.mark.spark

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_MAGIC
    assert head[12:16] == b"IHDR"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_report_data_is_utc_and_complete(spark: Any, batch_run: Any) -> None:
    data = report.load_report_data(spark, str(batch_run.output))
    minutes = sorted({r["minute"] for r in data.rollup})
    first_event = min(e["ts"] for e in batch_run.events).replace(second=0, microsecond=0, tzinfo=None)
    assert minutes[0] == first_event
    assert set(data.protocols) == {"remoting", "mqtt", "grpc"}
    assert data.summary is not None
    assert data.summary["malformed"] == 7
    assert data.top_clients
    assert data.negotiation_failures
    assert data.ops
    assert data.tenants
    assert sorted(data.rules) == [
        ("edge-to-central", "edge->central:Orders"),
        ("edge-to-central", "edge->central:Payments"),
    ]
    assert min(r["minute"] for r in data.replication) == datetime(2026, 11, 22, 23, 52)


def test_notable_changes_point_at_the_incident_onset(spark: Any, batch_run: Any) -> None:
    data = report.load_report_data(spark, str(batch_run.output))
    changes = report.notable_changes(data)
    onsets = {(c.minute, c.protocol, c.metric) for c in changes}
    assert (datetime(2026, 11, 22, 23, 57), "grpc", "latency_p99") in onsets
    incident = next(c for c in changes if c.metric == "latency_p99" and c.protocol == "grpc")
    assert incident.factor > 5
    assert incident.describe().startswith("2026-11-22 23:57 grpc p99 latency:")


def test_write_report_produces_html_and_readable_pngs(spark: Any, batch_run: Any, tmp_path: Path) -> None:
    data = report.load_report_data(spark, str(batch_run.output))
    html_path = tmp_path / "report.html"
    pngs = report.write_report(data, html_path)
    assert [p.name for p in pngs] == [
        "throughput.png",
        "latency.png",
        "errors.png",
        "protocol_mix.png",
        "replication_delay.png",
    ]
    for png in pngs:
        width, height = _png_size(png)
        assert width >= 1000, png
        assert height >= 300, png
        assert png.stat().st_size > 10_000, "a chart with data, not an empty canvas"
    page = html_path.read_text(encoding="utf-8")
    for png in pngs:
        assert f"src='report_files/{png.name}'" in page
    for heading in (
        "What changed",
        "Throughput",
        "Latency percentiles",
        "Errors over time",
        "Protocol mix",
        "Top clients",
        "Bytes per tenant",
        "Negotiation failures",
        "Slowest request kinds",
        "Replication delay",
        "Replication per rule",
        "Consumer lag",
        "Message paths",
    ):
        assert f">{heading}" in page, heading
    assert "grpc p99 latency" in page
    assert "<script" not in page


def test_html_escapes_client_ids(spark: Any, batch_run: Any) -> None:
    data = report.load_report_data(spark, str(batch_run.output))
    data.top_clients = [dict(data.top_clients[0], client_id="<b>évil</b>", rank=1)]
    page = report.render_html(data, {})
    assert "&lt;b&gt;évil&lt;/b&gt;" in page
    assert "<b>évil" not in page


def test_replication_totals_per_rule(spark: Any, batch_run: Any) -> None:
    data = report.load_report_data(spark, str(batch_run.output))
    totals = {t["rule"]: t for t in report.replication_totals(data)}
    batches = [e for e in batch_run.events if e["event"] == "connector.batch"]
    for rule in ("edge->central:Orders", "edge->central:Payments"):
        mine = [e for e in batches if e["rule"] == rule]
        assert totals[rule]["messages"] == sum(e["messages"] for e in mine)
        assert totals[rule]["delay_max"] == max(e["delay_ms_max"] for e in mine)
    assert totals["(unknown)"]["errors"] == 1
    assert totals["(unknown)"]["messages"] == 0


def test_lag_totals_per_group_and_topic(spark: Any, batch_run: Any) -> None:
    data = report.load_report_data(spark, str(batch_run.output))
    totals = {(t["group"], t["topic"]): t for t in report.lag_totals(data)}
    readings = [e for e in batch_run.events if e["event"] == "metrics.lag"]
    assert set(totals) == {(e["group"], e["topic"]) for e in readings}
    for key, total in totals.items():
        mine = sorted((e for e in readings if (e["group"], e["topic"]) == key), key=lambda e: e["reading_ms"])
        assert total["lag_last"] == mine[-1]["lag"]
        assert total["lag_max"] == max(e["lag"] for e in mine)


def test_message_paths_per_producer_and_consumer_protocol(spark: Any, batch_run: Any) -> None:
    from mqproxy.spark_etl.synthetic_trace import expected_message_paths

    data = report.load_report_data(spark, str(batch_run.output))
    got = {(r["producer_protocol"], r["consumer_protocol"]): r for r in data.message_paths}
    paths = expected_message_paths(batch_run.events).values()
    expected: dict[tuple[str, str], list[int | None]] = {}
    for p in paths:
        consumers = {c[0] or "(none)" for c in p["consumers"]} or {"(none)"}
        for consumer in consumers:
            key = (p["producer_protocol"] or "(unknown)", consumer)
            expected.setdefault(key, []).append(p["first_delivery_ms"])
    assert {k: r["messages"] for k, r in got.items()} == {k: len(v) for k, v in expected.items()}
    for key, delays in expected.items():
        known = [d for d in delays if d is not None]
        assert got[key]["first_delivery_max"] == (max(known) if known else None), key


def test_report_without_connector_events_leaves_replication_out(spark: Any, tmp_path: Path) -> None:
    from mqproxy.spark_etl import synthetic
    from mqproxy.spark_etl.batch import run_batch

    logs = tmp_path / "proxy.log"
    synthetic.write_jsonl(logs, synthetic.iter_events(30, synthetic.CorpusOptions(seed=12)))
    summary = run_batch(spark, str(logs), str(tmp_path / "t"))
    assert (summary.table_rows["replication"], summary.table_rows["replication_minute"]) == (0, 0)
    data = report.load_report_data(spark, str(tmp_path / "t"))
    assert (data.replication, data.rules) == ([], [])
    pngs = report.write_report(data, tmp_path / "report.html")
    assert [p.name for p in pngs] == ["throughput.png", "latency.png", "errors.png", "protocol_mix.png"]
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "Replication" not in page
    assert "messages replicated" not in page
    assert report.plot_replication_delay(data).axes, "the notebook can still draw the (empty) figure"


def test_report_of_a_connector_log_alone_has_only_replication(
    spark: Any, batch_run: Any, tmp_path: Path
) -> None:
    data = report.load_report_data(spark, str(batch_run.output))
    data.rollup, data.ops, data.tenants, data.top_clients, data.negotiation_failures = [], [], [], [], []
    pngs = report.write_report(data, tmp_path / "report.html")
    assert [p.name for p in pngs] == ["replication_delay.png"]
    assert pngs[0].stat().st_size > 10_000
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert ">Replication delay" in page
    assert ">messages replicated" in page
    assert "What changed" not in page
    assert "Throughput" not in page
