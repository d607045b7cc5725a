"""Deterministic synthetic mqproxy log corpora, and pure-Python reference answers for them.

The generator emits the event shapes of ``log_event.schema.json`` (``conn.accepted``,
``conn.negotiated`` or ``conn.rejected``, ``request`` lines, ``conn.closed``) for simulated
connections over remoting, MQTT and gRPC, with a fixed seed. Options add what real logs contain:
rejected sniffs, failing requests, clock skew (a connection whose close is stamped before its
accept, as after an NTP step), and client ids outside ASCII. :data:`MALFORMED_LINES` are lines the
ETL must quarantine. ``incident_after`` injects a gRPC slowdown, for the report's "what changed".
``connector_rules`` adds a message connector's ``connector.*`` events (batches, lag reports, dead
letters, errors) for that many rules; ``lag_groups`` lag readings; ``trace_messages`` traced messages.

The ``expected_*`` functions recompute the ETL tables in plain Python from the generated events;
tests compare Spark's output to them exactly, and the benchmark uses them as a sanity check.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import orjson

from mqproxy.spark_etl.synthetic_connector import connector_events
from mqproxy.spark_etl.synthetic_lag import lag_events
from mqproxy.spark_etl.synthetic_trace import trace_events

__all__ = [
    "MALFORMED_LINES",
    "CorpusOptions",
    "encode",
    "expected_minute_rollup",
    "expected_negotiation_failures",
    "expected_replication_minute",
    "expected_tenant_traffic",
    "expected_top_clients",
    "iter_events",
    "nearest_rank",
    "write_jsonl",
]

Event = dict[str, Any]

MALFORMED_LINES: Final[tuple[str, ...]] = (
    "this is not json",
    '{"ts":"2026-11-22T10:00:00Z","level":"info","event":"request","conn_id":"x1"',  # truncated
    "[1, 2, 3]",
    '{"ts":"yesterday at noon","level":"info","event":"conn.accepted","conn_id":"x2"}',
    '{"ts":"2026-11-22T10:00:01Z","level":"info","event":"request","latency_ms":"slow"}',
    '{"level":"info","event":"conn.accepted","conn_id":"x3"}',  # no ts
    '{"ts":"2026-11-22T10:00:02Z","level":"info","conn_id":"x4"}',  # no event
)
"""Seven lines the ETL must quarantine: 5 unparseable, 1 missing ts, 1 missing event."""

_OPS: Final[dict[str, tuple[tuple[str, int | None], ...]]] = {
    "remoting": (
        ("SEND_MESSAGE_V2", 310),
        ("PULL_MESSAGE", 11),
        ("HEART_BEAT", 34),
        ("GET_ROUTEINFO_BY_TOPIC", 105),
    ),
    "mqtt": (("PUBLISH", 3), ("SUBSCRIBE", 8), ("PINGREQ", 12)),
    "grpc": (("SendMessage", None), ("ReceiveMessage", None), ("QueryRoute", None), ("Heartbeat", None)),
}
_ERROR_STATUS: Final = {"remoting": "SYSTEM_ERROR", "mqtt": "UNSPECIFIED_ERROR", "grpc": "INTERNAL"}
_OK_STATUS: Final = {"remoting": "SUCCESS", "mqtt": "SUCCESS", "grpc": "OK"}
_VERSIONS: Final = {
    "remoting": ("JAVA/V4_9_4", "CPP/63", "NODE/V4_3_0"),
    "mqtt": ("3.1.1", "5.0"),
    "grpc": ("JAVA/5.0.7",),
}
_GROUPS: Final = ("GID_orders", "GID_payments", "GID_audit", "GID_search")
_UNICODE_IDS: Final = (
    "capteur-température-7",
    "设备-温度-01",
    "🚀-rocket",
    "Ωmega\u00a0sensor",
    "naïve—client",
)
_REJECT_REASONS: Final = ("sniff_timeout", "unknown_protocol", "tls_handshake_failed", "eof_during_sniff")


@dataclass(frozen=True, slots=True)
class CorpusOptions:
    """Knobs of :func:`iter_events`. Ratios are probabilities per connection or per request."""

    start: datetime = datetime(2026, 11, 22, 14, 0, tzinfo=UTC)
    span: timedelta = timedelta(minutes=10)
    seed: int = 0
    reject_ratio: float = 0.05
    error_ratio: float = 0.05
    skew_ratio: float = 0.0
    unicode_ratio: float = 0.0
    max_requests: int = 12
    clients_per_protocol: int = 8
    incident_after: timedelta | None = None
    """From ``start + incident_after`` on, gRPC requests are 15x slower and fail 30% of the time."""
    connector_rules: int = 0
    """Rules of a synthetic connector ``edge-to-central``, each copying 4 source queues; every batch
    has an ``error_ratio`` chance of a dead letter and of a retried error."""
    lag_groups: int = 0
    """Consumer groups whose lag is read every 15 s (``metrics.lag`` events, two topics each)."""
    trace_messages: int = 0
    """Messages traced from producers to consumers (``trace.record`` events, see ``synthetic_trace``)."""


def _client(rng: random.Random, protocol: str, opts: CorpusOptions) -> tuple[str, str, str | None]:
    """``(client_id, client_version, group)``; MQTT carries no group, so its tenant is the client id."""
    index = rng.randrange(opts.clients_per_protocol)
    if protocol == "mqtt":
        if rng.random() < opts.unicode_ratio:
            client_id = _UNICODE_IDS[index % len(_UNICODE_IDS)]
        else:
            client_id = f"device-{index:03d}"
        return client_id, _VERSIONS["mqtt"][index % 2], None
    versions = _VERSIONS[protocol]
    return f"{protocol}-client-{index:03d}", versions[index % len(versions)], _GROUPS[index % len(_GROUPS)]


def _connection(rng: random.Random, number: int, opts: CorpusOptions) -> list[Event]:
    span_us = max(1, int(opts.span.total_seconds() * 1_000_000))
    t0 = opts.start + timedelta(microseconds=rng.randrange(span_us))
    conn_id = f"c{opts.seed:x}-{number:08x}"
    peer_host = f"10.{rng.randrange(4)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
    events: list[Event] = [
        {
            "ts": t0,
            "level": "info",
            "event": "conn.accepted",
            "conn_id": conn_id,
            "peer": f"{peer_host}:{rng.randrange(1024, 65536)}",
            "local": "127.0.0.1:9876",
        }
    ]
    sniff_ms = round(rng.uniform(0.05, 3.0), 3)
    if rng.random() < opts.reject_ratio:
        events.append(
            {
                "ts": t0 + timedelta(milliseconds=sniff_ms),
                "level": "warning",
                "event": "conn.rejected",
                "conn_id": conn_id,
                "reason": rng.choice(_REJECT_REASONS),
                "sniff_ms": sniff_ms,
                "bytes_in": rng.randrange(0, 64),
            }
        )
        return events
    protocol = rng.choice(("remoting", "mqtt", "grpc"))
    tls = rng.random() < 0.3
    events.append(
        {
            "ts": t0 + timedelta(milliseconds=sniff_ms),
            "level": "info",
            "event": "conn.negotiated",
            "conn_id": conn_id,
            "protocol": protocol,
            "tls": tls,
            "alpn": ("h2" if protocol == "grpc" else None) if tls else None,
            "proxied": False,
            "proxy_version": None,
            "sniff_ms": sniff_ms,
        }
    )
    client_id, client_version, group = _client(rng, protocol, opts)
    now = t0 + timedelta(milliseconds=sniff_ms)
    bytes_in = bytes_out = 0
    count = rng.randrange(0, opts.max_requests + 1)
    for _ in range(count):
        now += timedelta(milliseconds=rng.uniform(1, 4000))
        op, code = rng.choice(_OPS[protocol])
        incident = (
            opts.incident_after is not None and protocol == "grpc" and now >= opts.start + opts.incident_after
        )
        failed = rng.random() < (0.3 if incident else opts.error_ratio)
        oneway = not failed and protocol == "mqtt" and op == "PUBLISH" and rng.random() < 0.5
        req_bytes = rng.randrange(40, 4096)
        resp_bytes = 0 if oneway else rng.randrange(20, 512)
        latency = round(
            rng.lognormvariate(0.5, 0.8) * (8.0 if failed else 1.0) * (15.0 if incident else 1.0), 3
        )
        bytes_in += req_bytes
        bytes_out += resp_bytes
        events.append(
            {
                "ts": now,
                "level": "warning" if failed else "info",
                "event": "request",
                "conn_id": conn_id,
                "protocol": protocol,
                "op": op,
                "code": code,
                "status": None if oneway else (_ERROR_STATUS if failed else _OK_STATUS)[protocol],
                "outcome": "error" if failed else ("oneway" if oneway else "ok"),
                "latency_ms": latency,
                "req_bytes": req_bytes,
                "resp_bytes": resp_bytes,
                "client_id": client_id,
                "client_version": client_version,
                "group": group,
                "topic": f"topic-{rng.randrange(5)}",
            }
        )
    now += timedelta(milliseconds=rng.uniform(1, 500))
    duration_ms = round((now - t0).total_seconds() * 1000.0, 3)
    closed_ts = t0 - timedelta(seconds=45) if rng.random() < opts.skew_ratio else now
    broken = rng.random() < opts.error_ratio
    events.append(
        {
            "ts": closed_ts,
            "level": "warning" if broken else "info",
            "event": "conn.closed",
            "conn_id": conn_id,
            "protocol": protocol,
            "bytes_in": bytes_in + 64,
            "bytes_out": bytes_out + 32,
            "duration_ms": duration_ms,
            "requests": count,
            "error": "connection reset by peer" if broken else None,
        }
    )
    return events


def iter_events(connections: int, options: CorpusOptions | None = None) -> Iterator[Event]:
    """Yield the events of ``connections`` simulated connections, connection by connection.

    Events carry ``ts`` as an aware UTC ``datetime``; :func:`encode` renders the JSON line.
    """
    opts = options or CorpusOptions()
    rng = random.Random(opts.seed)
    for number in range(connections):
        yield from _connection(rng, number, opts)
    if opts.connector_rules:
        yield from connector_events(
            opts.connector_rules,
            start=opts.start,
            span=opts.span,
            seed=opts.seed,
            error_ratio=opts.error_ratio,
        )
    if opts.lag_groups:
        yield from lag_events(opts.lag_groups, start=opts.start, span=opts.span, seed=opts.seed)
    if opts.trace_messages:
        yield from trace_events(
            opts.trace_messages,
            start=opts.start,
            span=opts.span,
            seed=opts.seed,
            error_ratio=opts.error_ratio,
        )


def encode(event: Event) -> bytes:
    """One JSON line (with trailing newline) as mqproxy logs it: ``ts`` in ISO 8601 with ``Z``."""
    ts: datetime = event["ts"]
    line = dict(event, ts=ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
    return orjson.dumps(line) + b"\n"


def write_jsonl(path: Path, events: Iterable[Event], malformed: Iterable[str] = ()) -> int:
    """Write events (then the malformed lines) as JSON lines to ``path``; return events written."""
    written = 0
    with path.open("wb") as out:
        for event in events:
            out.write(encode(event))
            written += 1
        for line in malformed:
            out.write(line.encode("utf-8") + b"\n")
    return written


# --- Reference answers ---------------------------------------------------------------------------


def nearest_rank(values: list[float], p: float) -> float | None:
    """The smallest value v with at least ``p * len(values)`` values <= v (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p * len(ordered))) - 1]


def _minute(ts: datetime) -> datetime:
    return ts.astimezone(UTC).replace(second=0, microsecond=0, tzinfo=None)


def expected_minute_rollup(events: Iterable[Event]) -> dict[tuple[datetime, str], dict[str, Any]]:
    """``protocol_minute_rollup`` recomputed: key ``(naive UTC minute, protocol)``."""
    acc: dict[tuple[datetime, str], dict[str, Any]] = defaultdict(
        lambda: {
            "requests": 0,
            "errors": 0,
            "oneway": 0,
            "req_bytes": 0,
            "resp_bytes": 0,
            "latencies": [],
            "connections_opened": 0,
            "connections_closed": 0,
            "connection_errors": 0,
            "conn_bytes_in": 0,
            "conn_bytes_out": 0,
        }
    )
    for e in events:
        kind = e["event"]
        if kind not in ("request", "conn.negotiated", "conn.closed"):
            continue
        row = acc[(_minute(e["ts"]), e.get("protocol") or "(unknown)")]
        if kind == "request":
            row["requests"] += 1
            row["errors"] += e["outcome"] == "error"
            row["oneway"] += e["outcome"] == "oneway"
            row["req_bytes"] += e.get("req_bytes") or 0
            row["resp_bytes"] += e.get("resp_bytes") or 0
            row["latencies"].append(e["latency_ms"])
        elif kind == "conn.negotiated":
            row["connections_opened"] += 1
        else:
            row["connections_closed"] += 1
            row["connection_errors"] += e.get("error") is not None
            row["conn_bytes_in"] += e["bytes_in"]
            row["conn_bytes_out"] += e["bytes_out"]
    result = {}
    for key, row in acc.items():
        latencies = row.pop("latencies")
        row["error_rate"] = row["errors"] / row["requests"] if row["requests"] else None
        for p in (0.5, 0.95, 0.99):
            row[f"latency_p{round(p * 100)}"] = nearest_rank(latencies, p)
        result[key] = row
    return result


def expected_negotiation_failures(events: Iterable[Event]) -> dict[tuple[date, str], dict[str, Any]]:
    """``negotiation_failures`` recomputed: key ``(UTC date, reason)``."""
    events = list(events)
    peers = {e["conn_id"]: e["peer"].rsplit(":", 1)[0] for e in events if e["event"] == "conn.accepted"}
    acc: dict[tuple[date, str], dict[str, Any]] = defaultdict(
        lambda: {"failures": 0, "hosts": set(), "sniff": [], "bytes_in": 0}
    )
    for e in events:
        if e["event"] != "conn.rejected":
            continue
        row = acc[(e["ts"].astimezone(UTC).date(), e["reason"])]
        row["failures"] += 1
        if e["conn_id"] in peers:
            row["hosts"].add(peers[e["conn_id"]])
        row["sniff"].append(e["sniff_ms"])
        row["bytes_in"] += e["bytes_in"]
    return {
        key: {
            "failures": row["failures"],
            "peer_hosts": len(row["hosts"]),
            "sniff_ms_p50": nearest_rank(row["sniff"], 0.5),
            "sniff_ms_max": max(row["sniff"]),
            "bytes_in": row["bytes_in"],
        }
        for key, row in acc.items()
    }


def _tenant(e: Event) -> str:
    return e.get("group") or e.get("client_id") or "(unknown)"


def expected_tenant_traffic(events: Iterable[Event]) -> dict[tuple[date, str], dict[str, int]]:
    """``tenant_traffic`` recomputed: key ``(UTC date, tenant)``."""
    acc: dict[tuple[date, str], dict[str, Any]] = defaultdict(
        lambda: {"requests": 0, "errors": 0, "clients": set(), "req_bytes": 0, "resp_bytes": 0}
    )
    for e in events:
        if e["event"] != "request":
            continue
        row = acc[(e["ts"].astimezone(UTC).date(), _tenant(e))]
        row["requests"] += 1
        row["errors"] += e["outcome"] == "error"
        if e.get("client_id") is not None:
            row["clients"].add(e["client_id"])
        row["req_bytes"] += e.get("req_bytes") or 0
        row["resp_bytes"] += e.get("resp_bytes") or 0
    return {
        key: {**{k: v for k, v in row.items() if k != "clients"}, "clients": len(row["clients"])}
        | {"bytes": row["req_bytes"] + row["resp_bytes"]}
        for key, row in acc.items()
    }


def expected_top_clients(events: Iterable[Event], limit: int) -> dict[date, list[tuple[str, int, int]]]:
    """``top_clients`` recomputed: per UTC date, ranked ``(client_id, requests, connections)``."""
    reqs: dict[tuple[date, str], int] = defaultdict(int)
    conns: dict[tuple[date, str], set[str]] = defaultdict(set)
    for e in events:
        if e["event"] == "request" and e.get("client_id") is not None:
            key = (e["ts"].astimezone(UTC).date(), e["client_id"])
            reqs[key] += 1
            conns[key].add(e["conn_id"])
    per_day: dict[date, list[tuple[str, int, int]]] = defaultdict(list)
    for (day, client), count in reqs.items():
        per_day[day].append((client, count, len(conns[(day, client)])))
    return {day: sorted(rows, key=lambda r: (-r[1], r[0]))[:limit] for day, rows in per_day.items()}


def expected_replication_minute(events: Iterable[Event]) -> dict[tuple[datetime, str, str], dict[str, Any]]:
    """``replication_minute_rollup`` recomputed: key ``(naive UTC minute, connector, rule)``."""
    acc: dict[tuple[datetime, str, str], dict[str, Any]] = defaultdict(
        lambda: {
            "batches": 0,
            "messages": 0,
            "bytes": 0,
            "delays": [],
            "dead_letters": 0,
            "errors": 0,
            "lags": [],
            "copied": [],
        }
    )
    for e in events:
        kind = e["event"]
        if kind not in ("connector.batch", "connector.lag", "connector.dead_letter", "connector.error"):
            continue
        row = acc[(_minute(e["ts"]), e.get("connector") or "(unknown)", e.get("rule") or "(unknown)")]
        if kind == "connector.batch":
            row["batches"] += 1
            row["messages"] += e["messages"]
            row["bytes"] += e["bytes"]
            row["delays"].append(e["delay_ms_max"])
        elif kind == "connector.lag":
            row["lags"].append(e["lag"])
            if e["last_copied_ms"] is not None:
                row["copied"].append(e["last_copied_ms"])
        elif kind == "connector.dead_letter":
            row["dead_letters"] += 1
        else:
            row["errors"] += 1
    result = {}
    for key, row in acc.items():
        delays, lags, copied = row.pop("delays"), row.pop("lags"), row.pop("copied")
        for p in (0.5, 0.95, 0.99):
            row[f"delay_p{round(p * 100)}"] = nearest_rank(delays, p)
        row["delay_max"] = max(delays, default=None)
        row["lag_max"] = max(lags, default=None)
        row["last_copied_at"] = datetime(1970, 1, 1) + timedelta(milliseconds=max(copied)) if copied else None
        result[key] = row
    return result
