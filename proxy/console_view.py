"""
mqproxy.console_view
~~~~~~~~~~~~~~~~~~~~

The live console's content, sans-IO: a :class:`ConsoleSnapshot` (plain, frozen data read off the server by
:mod:`mqproxy.console`) and two pure renderings of it, :func:`render_page` (the whole HTML page) and
:func:`snapshot_json` (the JSON one ``/console/events`` message carries).

Contracts:

* Every string that can come from a client (client ids, peers, topic, group and account names, reasons and
  details) reaches the HTML only through :func:`html.escape` with ``quote=True``, so it renders as text in
  element content and in attribute values alike; the JSON is ``orjson`` (no raw newline, so one SSE
  ``data:`` line) and the page script writes it with ``textContent`` only.
* Lists are bounded (:data:`MAX_CONNECTION_ROWS`, :data:`MAX_TOPIC_NAMES`, :data:`MAX_LAG_ROWS`; the
  rejection ring is bounded where it is fed): the snapshot carries totals, the rows shown and whether rows
  were left out.
* The page's element ids (``data-live`` names, table body ids) are the contract with
  :data:`mqproxy.console_assets.SCRIPT`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from html import escape
from typing import Any

import orjson

__all__ = [
    "MAX_CONNECTION_ROWS",
    "MAX_LAG_ROWS",
    "MAX_TOPIC_NAMES",
    "ConnRow",
    "ConsoleSnapshot",
    "LagRow",
    "LagSection",
    "RejectionRow",
    "TopicSection",
    "render_page",
    "snapshot_dict",
    "snapshot_json",
]

#: At most this many connections are listed (oldest first); the totals count them all.
MAX_CONNECTION_ROWS = 200
#: At most this many topic names are listed; the counts cover every topic and LMQ.
MAX_TOPIC_NAMES = 100
#: At most this many group/topic lag rows are listed (largest lag first); group totals are all shown.
MAX_LAG_ROWS = 200


@dataclass(frozen=True, slots=True)
class ConnRow:
    """One open connection. ``client_id`` is what the client said (MQTT CONNECT, remoting heartbeat,
    gRPC ``x-mq-client-id``), None before it said it."""

    conn_id: str
    protocol: str
    client_id: str | None
    peer: str
    age_s: float
    bytes_in: int
    bytes_out: int


@dataclass(frozen=True, slots=True)
class TopicSection:
    #: Topics other than LMQs; ``system`` of them are RocketMQ's or mqproxy's own.
    topics: int = 0
    lmqs: int = 0
    system: int = 0
    #: Topic names (not LMQs), the clients' before the system ones, at most :data:`MAX_TOPIC_NAMES`.
    names: tuple[str, ...] = ()
    #: None when the backend could not list its topics (the reason).
    error: str | None = None


@dataclass(frozen=True, slots=True)
class LagRow:
    group: str
    topic: str
    queues: int
    lag: int


@dataclass(frozen=True, slots=True)
class LagSection:
    """The consumer-lag reading ``/metrics`` exports (:class:`mqproxy.lag.LagView`), summed per pair."""

    updated_unix_s: float | None = None
    groups: tuple[tuple[str, int], ...] = ()
    rows: tuple[LagRow, ...] = ()
    rows_total: int = 0
    capped_pairs: int = 0


@dataclass(frozen=True, slots=True)
class RejectionRow:
    """One refusal: ``event`` is the log event that reported it (``auth.denied``, ``conn.rejected`` ...)."""

    at_unix_s: float
    event: str
    protocol: str | None
    peer: str
    reason: str
    detail: str | None = None
    access_key: str | None = None


@dataclass(frozen=True, slots=True)
class ConsoleSnapshot:
    taken_unix_s: float
    uptime_s: float
    backend: str
    open_connections: int
    connections_total: int
    by_protocol: tuple[tuple[str, int], ...] = ()
    connections: tuple[ConnRow, ...] = ()
    topics: TopicSection = field(default_factory=TopicSection)
    lag: LagSection = field(default_factory=LagSection)
    #: Why the connector section is empty (the connector runs as its own process).
    connector_note: str = ""
    rejections: tuple[RejectionRow, ...] = ()


def snapshot_dict(snapshot: ConsoleSnapshot) -> dict[str, Any]:
    """The snapshot as plain JSON-ready data (tuples become lists)."""
    return asdict(snapshot)


def snapshot_json(snapshot: ConsoleSnapshot) -> bytes:
    """One JSON document, no newline in it (an SSE ``data:`` line): ``snapshot`` (the data), ``live`` (the
    page's ``data-live`` texts) and ``tables`` (each table body's rows as cell texts), so the page script
    only copies text and never formats or parses markup."""
    return orjson.dumps(
        {"snapshot": snapshot_dict(snapshot), "live": live_texts(snapshot), "tables": table_texts(snapshot)}
    )


# --- HTML ---------------------------------------------------------------------------------------------


def _t(value: object) -> str:
    """Text (or an attribute value) from anything: escaped, None as an empty cell."""
    return "" if value is None else escape(str(value), quote=True)


def conn_cells(row: ConnRow) -> tuple[object, ...]:
    return (row.protocol, row.client_id, row.peer, f"{row.age_s:.0f} s", row.bytes_in, row.bytes_out)


def lag_cells(row: LagRow) -> tuple[object, ...]:
    return (row.group, row.topic, row.queues, row.lag)


def rejection_cells(row: RejectionRow) -> tuple[object, ...]:
    return (row.event, row.protocol, row.peer, row.access_key, row.reason, row.detail)


def live_texts(s: ConsoleSnapshot) -> dict[str, str]:
    """The text of every ``data-live`` element, as :func:`render_page` writes it."""
    return {
        "backend": s.backend,
        "uptime": f"{s.uptime_s:.0f} s",
        "taken": _stamp(s.taken_unix_s),
        "open_connections": str(s.open_connections),
        "connections_total": str(s.connections_total),
        "by_protocol": _by_protocol(s),
        "connections_shown": str(len(s.connections)),
        "topics": str(s.topics.topics),
        "lmqs": str(s.topics.lmqs),
        "system_topics": str(s.topics.system),
        "topics_error": s.topics.error or "",
        "lag_updated": _stamp(s.lag.updated_unix_s),
        "capped_pairs": str(s.lag.capped_pairs),
        "lag_rows_total": str(s.lag.rows_total),
        "connector_note": s.connector_note,
    }


def _cells(rows: Iterable[Iterable[object]]) -> list[list[str]]:
    return [["" if c is None else str(c) for c in row] for row in rows]


def table_texts(s: ConsoleSnapshot) -> dict[str, list[list[str]]]:
    """Every table body's rows as cell texts, as :func:`render_page` writes them."""
    return {
        "connections": _cells(conn_cells(r) for r in s.connections),
        "topic_names": _cells((name,) for name in s.topics.names),
        "lag_groups": _cells(s.lag.groups),
        "lag_rows": _cells(lag_cells(r) for r in s.lag.rows),
        "rejections": _cells(rejection_cells(r) for r in s.rejections),
    }


def _by_protocol(snapshot: ConsoleSnapshot) -> str:
    return ", ".join(f"{name} {count}" for name, count in snapshot.by_protocol) or "none"


#: Table body id -> column headers, in page order within their sections.
_HEADERS: dict[str, tuple[str, ...]] = {
    "connections": ("protocol", "client id", "address", "age", "bytes in", "bytes out"),
    "topic_names": ("topic",),
    "lag_groups": ("group", "total lag"),
    "lag_rows": ("group", "topic", "queues", "lag"),
    "rejections": ("event", "protocol", "address", "account", "reason", "detail"),
}


def _stamp(unix_s: float | None) -> str:
    if unix_s is None:
        return "none yet"
    return datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def render_page(snapshot: ConsoleSnapshot, *, events_path: str, script_path: str, style_path: str) -> str:
    """The whole console page for ``snapshot`` (readable without script); its script then follows
    ``events_path`` and replaces the ``data-live`` texts and table rows with each new snapshot's."""
    live = live_texts(snapshot)
    tables = table_texts(snapshot)

    def v(name: str) -> str:
        return f'<span data-live="{name}">{_t(live[name])}</span>'

    def table(body_id: str) -> str:
        head = "".join(f"<th>{_t(h)}</th>" for h in _HEADERS[body_id])
        rows = "".join(
            "<tr>" + "".join(f"<td>{_t(c)}</td>" for c in row) + "</tr>" for row in tables[body_id]
        )
        return f'<table><thead><tr>{head}</tr></thead><tbody id="{body_id}">{rows}</tbody></table>'

    return "".join(
        [
            '<!doctype html><html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f'<title>mqproxy console</title><link rel="stylesheet" href="{_t(style_path)}"></head>',
            f'<body data-events="{_t(events_path)}"><header><h1>mqproxy console</h1>',
            f"<p>backend {v('backend')} · up {v('uptime')} · updated {v('taken')} · ",
            '<span id="status">static</span></p></header><main>',
            '<section class="wide"><h2>Connections</h2>',
            f"<p>open <b>{v('open_connections')}</b> · since start {v('connections_total')}",
            f" · by protocol {v('by_protocol')} · listed {v('connections_shown')}</p>",
            table("connections"),
            "</section><section><h2>Topics and LMQs</h2>",
            f"<p>topics <b>{v('topics')}</b> (system {v('system_topics')}) · LMQs <b>{v('lmqs')}</b>",
            f" {v('topics_error')}</p>",
            table("topic_names"),
            "</section><section><h2>Consumer groups and lag</h2>",
            f"<p>reading of {v('lag_updated')} · group/topic pairs {v('lag_rows_total')}",
            f" · pairs without per-queue series {v('capped_pairs')}</p>",
            table("lag_groups"),
            table("lag_rows"),
            "</section><section><h2>Connector</h2>",
            f"<p>{v('connector_note')}</p>",
            '</section><section class="wide"><h2>Recent rejections</h2>',
            table("rejections"),
            "</section></main>",
            f'<script src="{_t(script_path)}" defer></script></body></html>',
        ]
    )
