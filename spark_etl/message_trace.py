"""Pure DataFrame -> DataFrame transforms over the proxy's ``trace.record`` events (message trace), joined to
the connection events.

With ``[trace] enabled`` the proxy logs one ``trace.record`` per RocketMQ trace record it emits: ``Pub`` (a
message stored), ``SubBefore`` (handed to a consumer), ``SubAfter`` (acknowledged) and ``EndTransaction``,
each with the ``conn_id`` (and ``protocol``) of the producer's or consumer's connection. These transforms
join the records to what the connection events say about that connection (:func:`transforms.connections`:
peer address, client id, when it was accepted). As in ``transforms``, nothing here does I/O and every table
carries the UTC ``date`` its job partitions by. Logs without trace records give empty tables.

* ``message_trace``: one row per record, with its connection.
* ``message_paths``: one row per message id: who produced it (protocol, peer, client id, group), when, and
  who was handed it (the distinct consumers: protocol, peer, group, client id), how many deliveries and
  acknowledgements, and the first delivery's delay after the publish.

Times: ``record_at`` and the ``*_at`` columns of ``message_paths`` come from the records' own
``timestamp_ms`` (the proxy's wall clock when it stored, delivered or saw the ack), ``ts`` from the log
line. ``first_delivery_ms`` is the first ``SubBefore``'s ``timestamp_ms`` minus the first ``Pub``'s; the Pub
is stamped when the store answered the send, so a consumer already waiting can make it a few ms negative.
A message whose records fall on two days (or in two runs over different logs) gets a row per run; its
``date`` is that of its first record.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from mqproxy.spark_etl import transforms

__all__ = [
    "CONSUMER_FIELDS",
    "PATH_COLUMNS",
    "TRACE_COLUMNS",
    "TRACE_RECORD",
    "message_paths",
    "message_trace",
]

TRACE_RECORD: Final = "trace.record"
_PUB: Final = "Pub"
_SUB_BEFORE: Final = "SubBefore"
_SUB_AFTER: Final = "SubAfter"
_END_TRANSACTION: Final = "EndTransaction"

#: Columns of :func:`message_trace`, in table order.
TRACE_COLUMNS: Final = (
    "date", "ts", "trace_type", "msg_id", "topic", "group", "record_at", "timestamp_ms", "cost_ms",
    "success", "request_id", "retry_times", "transaction_state", "keys", "conn_id", "protocol", "peer",
    "local", "client_id", "connected_at", "disconnected_at",
)  # fmt: skip
#: Fields of each element of ``message_paths.consumers``.
CONSUMER_FIELDS: Final = ("protocol", "peer", "group", "client_id")
#: Columns of :func:`message_paths`, in table order.
PATH_COLUMNS: Final = (
    "date", "msg_id", "topic", "published_at", "producer_protocol", "producer_peer", "producer_client_id",
    "producer_group", "producer_conn_id", "publishes", "publish_failures", "deliveries", "consumer_count",
    "consumers", "first_delivered_at", "first_delivery_ms", "acks", "last_acked_at", "transaction_state",
)  # fmt: skip


def _connection_info(events: DataFrame) -> DataFrame:
    """Per ``conn_id``: its protocol, peer and local address, client id, accept and close time."""
    return transforms.connections(events).select(
        "conn_id",
        F.col("protocol").alias("conn_protocol"),
        "peer",
        "local",
        "client_id",
        F.coalesce("accepted_at", "negotiated_at").alias("connected_at"),
        F.col("closed_at").alias("disconnected_at"),
    )


def message_trace(events: DataFrame) -> DataFrame:
    """One row per ``trace.record`` event, joined to its connection (columns :data:`TRACE_COLUMNS`).

    ``protocol`` is the record's own (its connection's at the time), else the connection's; the connection
    columns are null for a record that came from no connection or whose connection events are not in
    the logs.
    """
    records = events.where(F.col("event") == TRACE_RECORD).select(
        F.to_date("ts").alias("date"),
        "ts",
        "trace_type",
        "msg_id",
        "topic",
        "group",
        F.timestamp_millis(F.col("timestamp_ms")).alias("record_at"),
        "timestamp_ms",
        "cost_ms",
        "success",
        "request_id",
        "retry_times",
        "transaction_state",
        "keys",
        "conn_id",
        F.col("protocol").alias("record_protocol"),
    )
    joined = records.join(_connection_info(events), "conn_id", "left")
    return joined.withColumn("protocol", F.coalesce("record_protocol", "conn_protocol")).select(
        *TRACE_COLUMNS
    )


def _when(kind: str, column: str | Column) -> Column:
    """``column`` on records of ``kind``, null elsewhere (for conditional aggregates)."""
    value = F.col(column) if isinstance(column, str) else column
    return F.when(F.col("trace_type") == kind, value)


def message_paths(events: DataFrame) -> DataFrame:
    """One row per message id (columns :data:`PATH_COLUMNS`).

    Producer columns come from the earliest ``Pub`` (null without one in the logs); ``publishes`` counts
    Pub records (a resend under the same id adds one), ``publish_failures`` those not stored.
    ``deliveries`` counts ``SubBefore`` records, ``consumers`` is the sorted set of distinct
    ``(protocol, peer, group, client_id)`` they came from and ``consumer_count`` its size; ``acks`` counts
    successful ``SubAfter`` records; ``transaction_state`` is the latest ``EndTransaction``'s.
    """
    trace = message_trace(events)
    producer = F.struct(
        F.col("protocol").alias("protocol"),
        F.col("peer").alias("peer"),
        F.col("client_id").alias("client_id"),
        F.col("group").alias("group"),
        F.col("conn_id").alias("conn_id"),
    )
    consumer = F.struct(*(F.col(name).alias(name) for name in CONSUMER_FIELDS))
    is_ack = (F.col("trace_type") == _SUB_AFTER) & F.col("success")
    paths = trace.groupBy("msg_id").agg(
        F.min("ts").alias("first_ts"),
        F.max("topic").alias("topic"),
        F.min(_when(_PUB, "record_at")).alias("published_at"),
        F.min(_when(_PUB, "timestamp_ms")).alias("published_ms"),
        F.min_by(producer, _when(_PUB, F.struct("timestamp_ms", "ts"))).alias("producer"),
        F.count(_when(_PUB, F.lit(1))).alias("publishes"),
        F.count(_when(_PUB, F.when(~F.col("success"), F.lit(1)))).alias("publish_failures"),
        F.count(_when(_SUB_BEFORE, F.lit(1))).alias("deliveries"),
        F.array_sort(F.collect_set(_when(_SUB_BEFORE, consumer))).alias("consumers"),
        F.min(_when(_SUB_BEFORE, "record_at")).alias("first_delivered_at"),
        F.min(_when(_SUB_BEFORE, "timestamp_ms")).alias("first_delivered_ms"),
        F.count(F.when(is_ack, F.lit(1))).alias("acks"),
        F.max(F.when(is_ack, F.col("record_at"))).alias("last_acked_at"),
        F.max_by(
            _when(_END_TRANSACTION, "transaction_state"),
            _when(_END_TRANSACTION, F.struct("timestamp_ms", "ts")),
        ).alias("transaction_state"),
    )
    return paths.select(
        F.to_date("first_ts").alias("date"),
        "msg_id",
        "topic",
        "published_at",
        *(F.col(f"producer.{name}").alias(f"producer_{name}") for name in ("protocol", "peer", "client_id")),
        F.col("producer.group").alias("producer_group"),
        F.col("producer.conn_id").alias("producer_conn_id"),
        "publishes",
        "publish_failures",
        "deliveries",
        F.size("consumers").alias("consumer_count"),
        "consumers",
        "first_delivered_at",
        (F.col("first_delivered_ms") - F.col("published_ms")).alias("first_delivery_ms"),
        "acks",
        "last_acked_at",
        "transaction_state",
    )
