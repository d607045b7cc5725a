"""PySpark ETL over mqproxy's JSON-lines logs, for SREs (``pip install mqproxy[etl]``, needs Java 17+).

Modules (import them directly; this package imports nothing heavy):

* ``schema`` — the Spark ``StructType`` derived at import from ``mqproxy.config/log_event.schema.json``.
* ``session`` — ``build_session(master)``: quiet logs, no UI, loopback-only for local masters.
* ``transforms`` — pure ``DataFrame -> DataFrame`` functions (connections, requests, rollups, ...).
* ``replication`` — the same over the message connector's ``connector.*`` events (batches, per-rule minutes).
* ``consumer_lag`` — the same over the proxy's ``metrics.lag`` readings (per reading, per group/topic minute).
* ``message_trace`` — the same over the proxy's ``trace.record`` events joined to their connections (per
  record, per message id).
* ``batch`` / ``stream`` — the jobs; ``report`` — HTML + PNG charts; ``cli`` — ``mqproxy-etl``.
* ``synthetic`` — deterministic log corpora with pure-Python reference answers (tests, bench);
  ``synthetic_connector``, ``synthetic_lag`` and ``synthetic_trace`` generate the connector's, the lag and
  the message-trace events for them.
* ``notebooks/sre_overview.ipynb`` — loads the tables and draws the report's charts.

Tenant: a request's tenant is its ``group`` (the producer/consumer group RocketMQ clients are
provisioned by), falling back to ``client_id`` where the protocol has no group (MQTT), then to
``"(unknown)"``. Times are UTC; tables are partitioned by the UTC ``date`` of the event time.
"""
