"""Spark schema of mqproxy log events, derived at import from ``mqproxy.config/log_event.schema.json``.

The JSON Schema is the single source of truth; this module only translates it:

===============================  ===================================================
JSON Schema                      Spark
===============================  ===================================================
``string`` + ``format: date-time``  ``TimestampType`` (ISO 8601 ``...Z`` parses as UTC)
``string``                       ``StringType``
``integer``                      ``LongType``
``number``                       ``DoubleType``
``boolean``                      ``BooleanType``
``object``                       ``StringType`` (the raw JSON text of the object)
``array`` + ``items`` of a type  ``ArrayType`` of that type's mapping
===============================  ===================================================

A field is nullable unless it is in the top-level ``required`` list and its ``type`` does not
list ``"null"``. (Spark's JSON reader relaxes every field to nullable anyway; the flag documents
the contract.) ``READ_SCHEMA`` is ``EVENT_SCHEMA`` plus the ``_corrupt_record`` column that
PERMISSIVE reads fill with the raw text of lines that do not parse.

``USED_FIELDS`` names every field the transforms read, with the Spark type they expect; the
drift test checks it against the JSON Schema, so renaming or retyping a field there fails a test
instead of silently producing null columns. The batch job caches only these columns
(``batch.stage_events``): a transform reading a field not listed fails there (AnalysisException).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any, Final

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

__all__ = [
    "CORRUPT_COLUMN",
    "EVENT_SCHEMA",
    "EVENT_TYPES",
    "READ_SCHEMA",
    "USED_FIELDS",
    "SchemaError",
    "load_json_schema",
    "spark_type",
    "struct_from_json_schema",
]

CORRUPT_COLUMN: Final = "_corrupt_record"


class SchemaError(ValueError):
    """The JSON Schema uses a construct this translation does not support."""


def load_json_schema() -> dict[str, Any]:
    """Return the parsed log-event JSON Schema shipped in ``mqproxy.config``."""
    text = (resources.files("mqproxy.config") / "log_event.schema.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


_SIMPLE: Final[dict[str, DataType]] = {
    "string": StringType(),
    "integer": LongType(),
    "number": DoubleType(),
    "boolean": BooleanType(),
    "object": StringType(),
}


def spark_type(name: str, prop: dict[str, Any]) -> tuple[DataType, bool]:
    """Map one JSON Schema property to ``(spark type, has "null" in its type list)``."""
    declared = prop.get("type")
    types = [declared] if isinstance(declared, str) else list(declared or [])
    allows_null = "null" in types
    concrete = [t for t in types if t != "null"]
    if len(concrete) != 1:
        raise SchemaError(f"property {name!r}: need exactly one non-null type, got {declared!r}")
    kind = concrete[0]
    if kind == "array" and isinstance(prop.get("items"), dict):
        element, element_null = spark_type(f"{name}[]", prop["items"])
        return ArrayType(element, containsNull=element_null), allows_null
    if kind == "string" and prop.get("format") == "date-time":
        return TimestampType(), allows_null
    try:
        return _SIMPLE[kind], allows_null
    except KeyError:
        raise SchemaError(f"property {name!r}: unsupported JSON Schema type {kind!r}") from None


def struct_from_json_schema(schema: dict[str, Any]) -> StructType:
    """Translate the flat object schema's ``properties`` into a StructType, in declaration order."""
    required = set(schema.get("required", ()))
    fields = []
    for name, prop in schema["properties"].items():
        dtype, allows_null = spark_type(name, prop)
        fields.append(StructField(name, dtype, nullable=allows_null or name not in required))
    return StructType(fields)


_JSON_SCHEMA: Final = load_json_schema()

EVENT_SCHEMA: Final[StructType] = struct_from_json_schema(_JSON_SCHEMA)
READ_SCHEMA: Final[StructType] = StructType([*EVENT_SCHEMA.fields, StructField(CORRUPT_COLUMN, StringType())])
EVENT_TYPES: Final[frozenset[str]] = frozenset(_JSON_SCHEMA.get("x-events", {}))

USED_FIELDS: Final[dict[str, DataType]] = {
    "ts": TimestampType(),
    "level": StringType(),
    "event": StringType(),
    "conn_id": StringType(),
    "peer": StringType(),
    "local": StringType(),
    "protocol": StringType(),
    "tls": BooleanType(),
    "alpn": StringType(),
    "proxied": BooleanType(),
    "sniff_ms": DoubleType(),
    "reason": StringType(),
    "bytes_in": LongType(),
    "bytes_out": LongType(),
    "duration_ms": DoubleType(),
    "requests": LongType(),
    "error": StringType(),
    "op": StringType(),
    "code": LongType(),
    "status": StringType(),
    "outcome": StringType(),
    "latency_ms": DoubleType(),
    "req_bytes": LongType(),
    "resp_bytes": LongType(),
    "client_id": StringType(),
    "statuses": ArrayType(StringType(), containsNull=True),
    "outcomes": ArrayType(StringType(), containsNull=False),
    "topics": ArrayType(StringType(), containsNull=True),
    "client_version": StringType(),
    "group": StringType(),
    "topic": StringType(),
    "connector": StringType(),
    "rule": StringType(),
    "source": StringType(),
    "target": StringType(),
    "target_topic": StringType(),
    "source_queue": StringType(),
    "target_queue": StringType(),
    "messages": LongType(),
    "bytes": LongType(),
    "first_offset": LongType(),
    "last_offset": LongType(),
    "delay_ms_max": LongType(),
    "delay_ms_min": LongType(),
    "lag": LongType(),
    "queues": LongType(),
    "broker_offset": LongType(),
    "consumer_offset": LongType(),
    "reading_ms": LongType(),
    "last_copied_ms": LongType(),
    "trace_type": StringType(),
    "msg_id": StringType(),
    "timestamp_ms": LongType(),
    "cost_ms": LongType(),
    "success": BooleanType(),
    "request_id": StringType(),
    "retry_times": LongType(),
    "transaction_state": StringType(),
    "keys": StringType(),
}
