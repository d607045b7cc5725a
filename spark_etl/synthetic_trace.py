"""Deterministic synthetic message-trace events (``trace.record``), the connections they come from, and the
reference answers of ``message_trace`` and ``message_paths``.

:func:`mqproxy.spark_etl.synthetic.iter_events` appends :func:`trace_events` to a corpus when
``CorpusOptions.trace_messages`` is set. Producers and consumers over remoting, gRPC and MQTT stay
connected for the whole span (accepted, negotiated, one request naming their client id, closed at the end).
Each message gets a ``Pub`` from a producer (an MQTT producer's group is its client id), then ``SubBefore``
from up to three consumers, some redelivered, most acknowledged (``SubAfter``). Among them are what real
logs hold: a publish the store refused (nobody gets it), a Pub from no connection (an MQTT Will),
deliveries of a message published before the logs begin (no Pub), and transactions committed or rolled
back (``EndTransaction``).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final

__all__ = ["expected_message_paths", "expected_message_trace", "trace_dates", "trace_events"]

Event = dict[str, Any]

_PROTOCOLS: Final = ("remoting", "grpc", "mqtt")
_TOPICS: Final = ("Orders", "Payments", "home")
_HELLO: Final = {"remoting": ("HEART_BEAT", 34), "grpc": ("Heartbeat", None), "mqtt": ("CONNECT", 1)}
_VERSIONS: Final = {"remoting": "JAVA/V4_9_4", "grpc": "JAVA/5.0.7", "mqtt": "5.0"}
_UTC_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class _Conn:
    conn_id: str
    protocol: str
    client_id: str
    group: str  # a record's group: the producer/consumer group, or the MQTT client id


def _ms(at: datetime) -> int:
    return (at - _UTC_EPOCH) // timedelta(milliseconds=1)


def _connection_events(conn: _Conn, number: int, opened: datetime, closed: datetime) -> tuple[Event, ...]:
    base = {"level": "info", "conn_id": conn.conn_id}
    op, code = _HELLO[conn.protocol]
    negotiated = opened + timedelta(milliseconds=1)
    return (
        {**base, "ts": opened, "event": "conn.accepted", "local": "127.0.0.1:8081",
         "peer": f"10.9.{number}.{7 + number}:{40000 + number}"},
        {**base, "ts": negotiated, "event": "conn.negotiated", "protocol": conn.protocol, "tls": False,
         "alpn": None, "proxied": False, "proxy_version": None, "sniff_ms": 0.4},
        {**base, "ts": negotiated + timedelta(milliseconds=2), "event": "request", "protocol": conn.protocol,
         "op": op, "code": code, "status": "SUCCESS", "outcome": "ok", "latency_ms": 0.5, "req_bytes": 90,
         "resp_bytes": 40, "client_id": conn.client_id, "client_version": _VERSIONS[conn.protocol],
         "group": None if conn.protocol == "mqtt" else conn.group, "topic": None},
        {**base, "ts": closed, "event": "conn.closed", "protocol": conn.protocol, "bytes_in": 4096,
         "bytes_out": 8192, "duration_ms": round((closed - opened).total_seconds() * 1000, 3), "requests": 1,
         "error": None},
    )  # fmt: skip


def _conns(seed: int, role: str, start_number: int) -> list[_Conn]:
    out = []
    for i, protocol in enumerate(p for p in _PROTOCOLS for _ in range(2)):
        client_id = f"{role}-{protocol}-{i}"
        group = client_id if protocol == "mqtt" else f"GID_trace_{role}_{i % 2}"
        out.append(_Conn(f"t{seed:x}-{start_number + i:04x}", protocol, client_id, group))
    return out


def _record(at: datetime, conn: _Conn | None, kind: str, msg_id: str, **fields: Any) -> Event:
    event: Event = {"ts": at + timedelta(microseconds=500), "level": "info", "event": "trace.record"}
    if conn is not None:
        event.update(conn_id=conn.conn_id, protocol=conn.protocol)
    event.update(trace_type=kind, msg_id=msg_id, timestamp_ms=_ms(at), **fields)
    return event


def _message_records(
    rng: random.Random,
    i: int,
    at: datetime,
    producers: list[_Conn],
    consumers: list[_Conn],
    error_ratio: float,
) -> list[Event]:
    producer = rng.choice(producers)
    msg_id = f"0A090001{i:024X}"
    topic = rng.choice(_TOPICS)
    out: list[Event] = []
    stored = rng.random() >= error_ratio
    if i % 30 != 7:  # else: published before the logs begin
        source = None if i % 25 == 3 else producer  # else: an MQTT Will, published by no connection
        out.append(_record(at, source, "Pub", msg_id, group=producer.group, topic=topic,
                           cost_ms=rng.randrange(0, 20), success=stored, keys=f"order-{i}"))  # fmt: skip
    if not stored:
        return out
    if i % 40 == 11:
        state = rng.choice(("COMMIT_MESSAGE", "ROLLBACK_MESSAGE"))
        out.append(_record(at + timedelta(milliseconds=30), producer, "EndTransaction", msg_id,
                           group=producer.group, topic=topic, transaction_state=state))  # fmt: skip
        if state == "ROLLBACK_MESSAGE":
            return out
    for k, consumer in enumerate(rng.sample(consumers, rng.randrange(0, 4))):
        request_id = f"R{i:06d}{k}"
        delivered = at + timedelta(milliseconds=rng.randrange(-2, 800))
        attempts = 2 if rng.random() < 0.1 else 1
        for retry in range(attempts):
            sent = delivered + timedelta(seconds=retry)
            out.append(_record(sent, consumer, "SubBefore", msg_id, group=consumer.group,
                               request_id=f"{request_id}-{retry}", retry_times=retry))  # fmt: skip
        if rng.random() < 0.85:
            cost = rng.randrange(1, 300)
            out.append(_record(sent + timedelta(milliseconds=cost), consumer, "SubAfter", msg_id,
                               group=consumer.group, request_id=f"{request_id}-{attempts - 1}", cost_ms=cost,
                               success=rng.random() < 0.95))  # fmt: skip
    return out


def trace_events(
    messages: int, *, start: datetime, span: timedelta, seed: int = 0, error_ratio: float = 0.05
) -> Iterator[Event]:
    """The connections' events and the ``trace.record`` events of ``messages`` messages published over
    ``[start, start + span)``, in time order."""
    rng = random.Random(f"trace-{seed}")
    producers, consumers = _conns(seed, "pub", 0), _conns(seed, "sub", 6)
    opened, closed = start - timedelta(seconds=2), start + span + timedelta(seconds=3)
    records: list[Event] = []
    span_ms = max(1, int(span.total_seconds() * 1000))
    for i in range(messages):
        at = start + timedelta(milliseconds=rng.randrange(span_ms))
        records.extend(_message_records(rng, i, at, producers, consumers, error_ratio))
    conn_events = [
        e for n, c in enumerate(producers + consumers) for e in _connection_events(c, n, opened, closed)
    ]
    yield from sorted(conn_events + records, key=lambda e: e["ts"])


def _naive(ts: datetime) -> datetime:
    return ts.astimezone(UTC).replace(tzinfo=None)


def _connections(events: Iterable[Event]) -> dict[str, dict[str, Any]]:
    """Per conn_id what ``transforms.connections`` keeps of it: protocol, peer, local, client id, times."""
    conns: dict[str, dict[str, Any]] = defaultdict(dict)
    for e in events:
        conn_id, kind = e.get("conn_id"), e["event"]
        if conn_id is None:
            continue
        row = conns[conn_id]
        if kind == "conn.accepted":
            row.update(peer=e["peer"], local=e["local"], connected_at=_naive(e["ts"]))
        elif kind == "conn.negotiated":
            row["protocol"] = e["protocol"]
        elif kind == "conn.closed":
            row["disconnected_at"] = _naive(e["ts"])
        elif kind == "request" and e.get("client_id") is not None:
            row["client_id"] = max(row.get("client_id", e["client_id"]), e["client_id"])
    return conns


def expected_message_trace(events: Iterable[Event]) -> dict[tuple[str, str, str, int], dict[str, Any]]:
    """``message_trace`` recomputed: key ``(msg_id, trace_type, group, timestamp_ms)`` -> the record's
    protocol and its connection's peer, client id and accept time."""
    events = list(events)
    conns = _connections(events)
    out = {}
    for e in events:
        if e["event"] != "trace.record":
            continue
        conn = conns.get(e.get("conn_id") or "", {})
        out[(e["msg_id"], e["trace_type"], e["group"], e["timestamp_ms"])] = {
            "protocol": e.get("protocol") or conn.get("protocol"),
            "peer": conn.get("peer"),
            "client_id": conn.get("client_id"),
            "connected_at": conn.get("connected_at"),
        }
    return out


def expected_message_paths(events: Iterable[Event]) -> dict[str, dict[str, Any]]:
    """``message_paths`` recomputed: msg_id -> its columns (``consumers`` as a set of
    ``(protocol, peer, group, client_id)`` tuples)."""
    events = list(events)
    conns = _connections(events)
    by_msg: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        if e["event"] == "trace.record":
            by_msg[e["msg_id"]].append(e)
    out = {}
    for msg_id, records in by_msg.items():
        of = {
            kind: [r for r in records if r["trace_type"] == kind] for kind in ("Pub", "SubBefore", "SubAfter")
        }
        pubs, befores = of["Pub"], of["SubBefore"]
        first_pub = min(pubs, key=lambda r: (r["timestamp_ms"], r["ts"])) if pubs else None
        conn = conns.get((first_pub or {}).get("conn_id") or "", {})
        ends = [r for r in records if r["trace_type"] == "EndTransaction"]
        consumers = set()
        for r in befores:
            c = conns.get(r.get("conn_id") or "", {})
            consumers.add(
                (r.get("protocol") or c.get("protocol"), c.get("peer"), r["group"], c.get("client_id"))
            )
        first_delivered = min((r["timestamp_ms"] for r in befores), default=None)
        published = min((r["timestamp_ms"] for r in pubs), default=None)
        topics = [r["topic"] for r in records if r.get("topic") is not None]
        out[msg_id] = {
            "date": min(_naive(r["ts"]) for r in records).date(),
            "topic": max(topics) if topics else None,
            "producer_protocol": (first_pub.get("protocol") or conn.get("protocol")) if first_pub else None,
            "producer_peer": conn.get("peer"),
            "producer_client_id": conn.get("client_id"),
            "producer_group": first_pub["group"] if first_pub else None,
            "producer_conn_id": first_pub.get("conn_id") if first_pub else None,
            "publishes": len(pubs),
            "publish_failures": sum(not r["success"] for r in pubs),
            "deliveries": len(befores),
            "consumer_count": len(consumers),
            "consumers": consumers,
            "first_delivery_ms": None
            if first_delivered is None or published is None
            else first_delivered - published,
            "acks": sum(bool(r["success"]) for r in of["SubAfter"]),
            "transaction_state": max(ends, key=lambda r: (r["timestamp_ms"], r["ts"]))["transaction_state"]
            if ends
            else None,
        }
    return out


def trace_dates(events: Iterable[Event]) -> set[date]:
    """The UTC dates ``trace.record`` events fall on."""
    return {_naive(e["ts"]).date() for e in events if e["event"] == "trace.record"}
