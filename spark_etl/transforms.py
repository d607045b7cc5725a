"""Pure DataFrame -> DataFrame transforms over mqproxy log events.

Input is a DataFrame read with :data:`mqproxy.spark_etl.schema.READ_SCHEMA` (``raw``) or its valid
rows (``events``, see :func:`valid_events`). Nothing here reads, writes, caches or collects; the
jobs in ``batch`` and ``stream`` do I/O. Every output table carries a ``date`` column (UTC day of
the event time) that the jobs partition by.

Conventions:

* **Tenant** is the request's ``group`` (producer/consumer group, how RocketMQ clients are
  provisioned), falling back to ``client_id`` when the protocol carries no group (MQTT), then to
  ``"(unknown)"``. See :func:`tenant`.
* **Connection lifetime** is the ``duration_ms`` the proxy measured with its monotonic clock, not
  the difference of ``ts`` values: those come from the wall clock and may be skewed.
* **Minutes** are tumbling event-time windows of one minute (``window(ts, "1 minute")``), so the
  same rollup works in batch and, with a watermark, in Structured Streaming.
* **Latency percentiles** use ``percentile_approx`` with accuracy 10000: on groups of fewer than
  10000 values it returns the exact nearest-rank percentile (the smallest value v with at least
  p·n values <= v).
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from mqproxy.spark_etl.schema import CORRUPT_COLUMN, EVENT_SCHEMA

__all__ = [
    "PERCENTILES",
    "PERCENTILE_ACCURACY",
    "QUARANTINE_REASONS",
    "ROLLUP_METRICS",
    "UNKNOWN",
    "connections",
    "is_valid",
    "negotiation_failures",
    "op_rollup",
    "protocol_minute_rollup",
    "quarantine",
    "quarantine_line",
    "quarantine_reason",
    "requests",
    "tenant",
    "tenant_traffic",
    "top_clients",
    "valid_events",
]

PERCENTILES: Final = (0.5, 0.95, 0.99)
PERCENTILE_ACCURACY: Final = 10_000
UNKNOWN: Final = "(unknown)"
#: Every value :func:`quarantine_reason` yields.
QUARANTINE_REASONS: Final = ("unparseable", "missing_ts", "missing_event")
#: The metric columns of :func:`protocol_minute_rollup`, in table order (after date, minute, protocol).
ROLLUP_METRICS: Final = (
    "requests",
    "errors",
    "oneway",
    "error_rate",
    "req_bytes",
    "resp_bytes",
    *(f"latency_p{round(q * 100)}" for q in PERCENTILES),
    "connections_opened",
    "connections_closed",
    "connection_errors",
    "conn_bytes_in",
    "conn_bytes_out",
)

_REQUEST: Final = "request"
_NEGOTIATED: Final = "conn.negotiated"
_CLOSED: Final = "conn.closed"
_REJECTED: Final = "conn.rejected"
_ACCEPTED: Final = "conn.accepted"


def is_valid() -> Column:
    """True for rows that parsed and carry ``ts`` and ``event``."""
    return F.col(CORRUPT_COLUMN).isNull() & F.col("ts").isNotNull() & F.col("event").isNotNull()


def quarantine_reason() -> Column:
    """Why a row is malformed (meaningful only where :func:`is_valid` is false); see :func:`quarantine`."""
    return (
        F.when(F.col(CORRUPT_COLUMN).isNotNull(), F.lit("unparseable"))
        .when(F.col("ts").isNull(), F.lit("missing_ts"))
        .otherwise(F.lit("missing_event"))
    )


def valid_events(raw: DataFrame) -> DataFrame:
    """Rows that parsed and carry ``ts`` and ``event``, without the corrupt-record column.

    In batch, cache ``raw`` first: Spark refuses queries over raw JSON whose only referenced
    column is ``_corrupt_record``.
    """
    return raw.where(is_valid()).drop(CORRUPT_COLUMN)


def quarantine_line() -> Column:
    """A malformed row's text (meaningful only where :func:`is_valid` is false); see :func:`quarantine`."""
    parsed = F.to_json(F.struct(*[F.col(f.name) for f in EVENT_SCHEMA.fields]))
    return F.coalesce(F.col(CORRUPT_COLUMN), parsed)


def quarantine(raw: DataFrame) -> DataFrame:
    """Malformed rows as ``(line, reason)``.

    ``reason`` is ``unparseable`` (not JSON, not an object, or a field of the wrong type: Spark
    keeps the raw text), ``missing_ts`` or ``missing_event`` (valid JSON without a required
    field: ``line`` is then the parsed fields re-encoded as JSON).
    """
    return raw.where(~is_valid()).select(quarantine_line().alias("line"), quarantine_reason().alias("reason"))


def tenant() -> Column:
    """The tenant of a request: ``group``, else ``client_id``, else ``"(unknown)"``."""
    return F.coalesce(F.col("group"), F.col("client_id"), F.lit(UNKNOWN))


def _date(ts: Column) -> Column:
    return F.to_date(ts)


def _protocol() -> Column:
    return F.coalesce(F.col("protocol"), F.lit(UNKNOWN))


def _on(event: str, column: str) -> Column:
    """``column`` on rows of ``event``, null elsewhere (for conditional aggregates)."""
    return F.when(F.col("event") == event, F.col(column))


def _percentiles(column: Column, prefix: str) -> list[Column]:
    values = F.percentile_approx(column, list(PERCENTILES), PERCENTILE_ACCURACY)
    return [values[i].alias(f"{prefix}_p{round(p * 100)}") for i, p in enumerate(PERCENTILES)]


def _ratio(numerator: str, denominator: str) -> Column:
    return F.when(F.col(denominator) > 0, F.col(numerator) / F.col(denominator))


def requests(events: DataFrame) -> DataFrame:
    """One row per ``request`` event, with ``tenant`` and ``date``."""
    return events.where(F.col("event") == _REQUEST).select(
        _date(F.col("ts")).alias("date"),
        "ts",
        "conn_id",
        _protocol().alias("protocol"),
        "op",
        "code",
        "status",
        "outcome",
        "latency_ms",
        "req_bytes",
        "resp_bytes",
        "client_id",
        "client_version",
        "group",
        "topic",
        tenant().alias("tenant"),
    )


def connections(events: DataFrame) -> DataFrame:
    """One row per ``conn_id``: accept, negotiation, close or rejection, and the client seen on it.

    ``state`` is ``rejected``, ``closed``, ``open`` (negotiated, no close logged yet) or
    ``accepted`` (neither negotiated nor rejected yet). ``client_id``/``client_version`` come from
    the connection's requests (the greatest value when a connection carried several).
    """
    conn = events.where(F.col("conn_id").isNotNull())
    is_request = F.col("event") == _REQUEST
    firsts = {
        "accepted_at": (_ACCEPTED, "ts"),
        "negotiated_at": (_NEGOTIATED, "ts"),
        "rejected_at": (_REJECTED, "ts"),
    }
    lasts = {
        "peer": (_ACCEPTED, "peer"),
        "local": (_ACCEPTED, "local"),
        "negotiated_protocol": (_NEGOTIATED, "protocol"),
        "closed_protocol": (_CLOSED, "protocol"),
        **{name: (_NEGOTIATED, name) for name in ("tls", "alpn", "proxied")},
        "closed_at": (_CLOSED, "ts"),
        **{name: (_CLOSED, name) for name in ("duration_ms", "bytes_in", "bytes_out", "requests", "error")},
        "rejected_reason": (_REJECTED, "reason"),
        "rejected_bytes_in": (_REJECTED, "bytes_in"),
    }
    grouped = conn.groupBy("conn_id").agg(
        *(F.min(_on(event, column)).alias(name) for name, (event, column) in firsts.items()),
        *(F.max(_on(event, column)).alias(name) for name, (event, column) in lasts.items()),
        F.max(F.when(F.col("event").isin(_NEGOTIATED, _REJECTED), F.col("sniff_ms"))).alias("sniff_ms"),
        *(
            F.max(F.when(is_request, F.col(name))).alias(name)
            for name in ("client_id", "client_version", "group")
        ),
        F.count(F.when(is_request, F.lit(1))).alias("logged_requests"),
    )
    state = (
        F.when(F.col("rejected_at").isNotNull(), F.lit("rejected"))
        .when(F.col("closed_at").isNotNull(), F.lit("closed"))
        .when(F.col("negotiated_at").isNotNull(), F.lit("open"))
        .otherwise(F.lit("accepted"))
    )
    first_seen = F.coalesce("accepted_at", "negotiated_at", "rejected_at", "closed_at")
    return grouped.select(
        _date(first_seen).alias("date"),
        "conn_id",
        state.alias("state"),
        F.coalesce("negotiated_protocol", "closed_protocol").alias("protocol"),
        "accepted_at",
        "negotiated_at",
        "closed_at",
        "rejected_at",
        "peer",
        "local",
        "tls",
        "alpn",
        "proxied",
        "sniff_ms",
        "duration_ms",
        F.coalesce("bytes_in", "rejected_bytes_in").alias("bytes_in"),
        "bytes_out",
        "requests",
        "logged_requests",
        "error",
        "rejected_reason",
        "client_id",
        "client_version",
        F.coalesce("group", "client_id", F.lit(UNKNOWN)).alias("tenant"),
    )


def protocol_minute_rollup(events: DataFrame) -> DataFrame:
    """Per protocol and one-minute event-time window: traffic, latency percentiles, errors.

    Columns: ``date, minute, protocol, requests, errors, oneway, error_rate (errors/requests),
    req_bytes, resp_bytes, latency_p50/p95/p99, connections_opened (negotiated),
    connections_closed, connection_errors (closed with an error), conn_bytes_in, conn_bytes_out
    (wire bytes of connections closed in that minute)``.

    Works on streaming DataFrames (append mode needs a watermark on ``ts``).
    """
    relevant = events.where(F.col("event").isin(_REQUEST, _NEGOTIATED, _CLOSED))
    is_request = F.col("event") == _REQUEST
    is_closed = F.col("event") == _CLOSED
    rolled = relevant.groupBy(F.window("ts", "1 minute").alias("window"), _protocol().alias("protocol")).agg(
        F.count(F.when(is_request, F.lit(1))).alias("requests"),
        F.count(F.when(is_request & (F.col("outcome") == "error"), F.lit(1))).alias("errors"),
        F.count(F.when(is_request & (F.col("outcome") == "oneway"), F.lit(1))).alias("oneway"),
        F.coalesce(F.sum(_on(_REQUEST, "req_bytes")), F.lit(0)).alias("req_bytes"),
        F.coalesce(F.sum(_on(_REQUEST, "resp_bytes")), F.lit(0)).alias("resp_bytes"),
        *_percentiles(_on(_REQUEST, "latency_ms"), "latency"),
        F.count(F.when(F.col("event") == _NEGOTIATED, F.lit(1))).alias("connections_opened"),
        F.count(F.when(is_closed, F.lit(1))).alias("connections_closed"),
        F.count(F.when(is_closed & F.col("error").isNotNull(), F.lit(1))).alias("connection_errors"),
        F.coalesce(F.sum(_on(_CLOSED, "bytes_in")), F.lit(0)).alias("conn_bytes_in"),
        F.coalesce(F.sum(_on(_CLOSED, "bytes_out")), F.lit(0)).alias("conn_bytes_out"),
    )
    return rolled.withColumn("error_rate", _ratio("errors", "requests")).select(
        _date(F.col("window.start")).alias("date"),
        F.col("window.start").alias("minute"),
        "protocol",
        *ROLLUP_METRICS,
    )


def op_rollup(events: DataFrame) -> DataFrame:
    """Per day, protocol, ``op`` and ``code``: request count, errors, latency percentiles."""
    reqs = requests(events)
    rolled = reqs.groupBy("date", "protocol", F.coalesce("op", F.lit(UNKNOWN)).alias("op"), "code").agg(
        F.count(F.lit(1)).alias("requests"),
        F.count(F.when(F.col("outcome") == "error", F.lit(1))).alias("errors"),
        *_percentiles(F.col("latency_ms"), "latency"),
        F.max("latency_ms").alias("latency_max"),
    )
    return rolled.withColumn("error_rate", _ratio("errors", "requests"))


def tenant_traffic(events: DataFrame) -> DataFrame:
    """Per day and tenant: requests, errors and request/response bytes."""
    return (
        requests(events)
        .groupBy("date", "tenant")
        .agg(
            F.count(F.lit(1)).alias("requests"),
            F.count(F.when(F.col("outcome") == "error", F.lit(1))).alias("errors"),
            F.countDistinct("client_id").alias("clients"),
            F.coalesce(F.sum("req_bytes"), F.lit(0)).alias("req_bytes"),
            F.coalesce(F.sum("resp_bytes"), F.lit(0)).alias("resp_bytes"),
        )
        .withColumn("bytes", F.col("req_bytes") + F.col("resp_bytes"))
    )


def top_clients(events: DataFrame, limit: int = 50) -> DataFrame:
    """Per day, the ``limit`` clients with most requests (ties by ``client_id``), ranked from 1.

    ``connections`` counts distinct connections the client used that day: a high count relative to
    ``requests`` is churn (reconnect loops).
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    reqs = requests(events).where(F.col("client_id").isNotNull())
    per_client = reqs.groupBy("date", "client_id").agg(
        F.max("client_version").alias("client_version"),
        F.max("tenant").alias("tenant"),
        F.max("protocol").alias("protocol"),
        F.count(F.lit(1)).alias("requests"),
        F.count(F.when(F.col("outcome") == "error", F.lit(1))).alias("errors"),
        F.coalesce(F.sum(F.col("req_bytes") + F.col("resp_bytes")), F.lit(0)).alias("bytes"),
        F.percentile_approx("latency_ms", 0.99, PERCENTILE_ACCURACY).alias("latency_p99"),
    )
    # Distinct connections as a separate distinct-then-count: a countDistinct next to
    # percentile_approx makes Spark expand every row and costs several times more.
    conns = (
        reqs.select("date", "client_id", "conn_id")
        .distinct()
        .groupBy("date", "client_id")
        .agg(F.count(F.lit(1)).alias("connections"))
    )
    per_client = per_client.join(conns, ["date", "client_id"]).withColumn(
        "error_rate", _ratio("errors", "requests")
    )
    order = Window.partitionBy("date").orderBy(F.col("requests").desc(), F.col("client_id"))
    return per_client.withColumn("rank", F.row_number().over(order)).where(F.col("rank") <= limit)


def negotiation_failures(events: DataFrame) -> DataFrame:
    """Per day and rejection ``reason``: failures, distinct peer hosts, sniff time, bytes seen.

    The peer comes from the connection's ``conn.accepted`` line (null when it was not logged).
    """
    rejected = events.where(F.col("event") == _REJECTED).select(
        "conn_id", "ts", F.coalesce("reason", F.lit(UNKNOWN)).alias("reason"), "sniff_ms", "bytes_in"
    )
    peers = (
        events.where((F.col("event") == _ACCEPTED) & F.col("conn_id").isNotNull())
        .groupBy("conn_id")
        .agg(F.max(F.regexp_extract("peer", r"^\[?(.*?)\]?:\d+$", 1)).alias("peer_host"))
    )
    joined = rejected.join(peers, "conn_id", "left")
    return joined.groupBy(_date(F.col("ts")).alias("date"), "reason").agg(
        F.count(F.lit(1)).alias("failures"),
        F.countDistinct("peer_host").alias("peer_hosts"),
        F.percentile_approx("sniff_ms", 0.5, PERCENTILE_ACCURACY).alias("sniff_ms_p50"),
        F.max("sniff_ms").alias("sniff_ms_max"),
        F.coalesce(F.sum("bytes_in"), F.lit(0)).alias("bytes_in"),
    )
