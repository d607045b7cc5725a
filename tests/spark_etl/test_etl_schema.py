"""The Spark schema tracks log_event.schema.json (drift fails here), and generated events obey it."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the etl extra is not installed")

from jsonschema import Draft202012Validator
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DoubleType,
    LongType,
    StringType,
    StructType,
    TimestampType,
)

from mqproxy.spark_etl import schema, synthetic

JSON_SCHEMA = schema.load_json_schema()
EXPECTED_TYPE = {
    "integer": LongType(),
    "number": DoubleType(),
    "boolean": BooleanType(),
    "object": StringType(),
}


def _expected(prop: dict[str, Any]) -> tuple[Any, bool]:
    declared = prop["type"]
    types = [declared] if isinstance(declared, str) else declared
    (kind,) = [t for t in types if t != "null"]
    if kind == "array":
        element, element_null = _expected(prop["items"])
        return ArrayType(element, element_null), "null" in types
    if kind == "string":
        return (TimestampType() if prop.get("format") == "date-time" else StringType()), "null" in types
    return EXPECTED_TYPE[kind], "null" in types


def test_every_json_schema_property_is_a_column_of_the_mapped_type() -> None:
    required = set(JSON_SCHEMA["required"])
    columns = {f.name: f for f in schema.EVENT_SCHEMA.fields}
    assert list(columns) == list(JSON_SCHEMA["properties"])
    for name, prop in JSON_SCHEMA["properties"].items():
        dtype, allows_null = _expected(prop)
        assert columns[name].dataType == dtype, name
        assert columns[name].nullable == (allows_null or name not in required), name


def test_required_fields_are_not_nullable_and_null_unions_are() -> None:
    columns = {f.name: f for f in schema.EVENT_SCHEMA.fields}
    assert [n for n, f in columns.items() if not f.nullable] == ["ts", "level", "event"]
    assert columns["ts"].dataType == TimestampType()
    assert columns["protocol"].nullable
    assert columns["client_id"].nullable


def test_fields_the_transforms_read_exist_with_the_expected_types() -> None:
    columns = {f.name: f.dataType for f in schema.EVENT_SCHEMA.fields}
    drift = {n: (t, columns.get(n)) for n, t in schema.USED_FIELDS.items() if columns.get(n) != t}
    assert drift == {}


def test_read_schema_adds_only_the_corrupt_record_column() -> None:
    extra = [f for f in schema.READ_SCHEMA.fields if f not in schema.EVENT_SCHEMA.fields]
    assert [(f.name, f.dataType, f.nullable) for f in extra] == [(schema.CORRUPT_COLUMN, StringType(), True)]


def test_the_translation_fails_loudly_on_constructs_it_cannot_map() -> None:
    with pytest.raises(schema.SchemaError, match="unsupported"):
        schema.struct_from_json_schema({"properties": {"tags": {"type": "array"}}})
    with pytest.raises(schema.SchemaError, match="exactly one"):
        schema.struct_from_json_schema({"properties": {"x": {"type": ["string", "integer"]}}})
    renamed = json.loads(json.dumps(JSON_SCHEMA))
    renamed["properties"]["latency_us"] = renamed["properties"].pop("latency_ms")
    columns = {f.name for f in schema.struct_from_json_schema(renamed).fields}
    assert "latency_ms" in schema.USED_FIELDS
    assert "latency_ms" not in columns


def test_arrays_of_a_simple_type_are_array_columns() -> None:
    columns = {f.name: f.dataType for f in schema.EVENT_SCHEMA.fields}
    assert columns["acquired"] == ArrayType(StringType(), containsNull=False)
    nullable_items = {"type": "array", "items": {"type": ["integer", "null"]}}
    struct = schema.struct_from_json_schema({"properties": {"ids": nullable_items}})
    assert struct["ids"].dataType == ArrayType(LongType(), containsNull=True)
    with pytest.raises(schema.SchemaError, match="unsupported"):
        schema.struct_from_json_schema({"properties": {"m": {"type": "array", "items": {"type": "array"}}}})


def test_event_types_come_from_x_events() -> None:
    assert {
        "conn.accepted",
        "conn.negotiated",
        "conn.rejected",
        "conn.closed",
        "request",
        "connector.batch",
        "connector.lag",
        "connector.dead_letter",
        "connector.error",
    } <= schema.EVENT_TYPES


def test_generated_events_validate_against_the_json_schema() -> None:
    validator = Draft202012Validator(JSON_SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
    opts = synthetic.CorpusOptions(skew_ratio=0.2, unicode_ratio=0.5, reject_ratio=0.2, seed=5)
    events = list(synthetic.iter_events(120, opts))
    assert {e["event"] for e in events} == {
        "conn.accepted",
        "conn.negotiated",
        "conn.rejected",
        "conn.closed",
        "request",
    }
    for event in events:
        line = json.loads(synthetic.encode(event))
        errors = [e.message for e in validator.iter_errors(line)]
        assert errors == [], (line, errors)
        assert line["ts"].endswith("Z")


def test_generated_connector_events_validate_against_the_json_schema() -> None:
    validator = Draft202012Validator(JSON_SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
    opts = synthetic.CorpusOptions(connector_rules=2, error_ratio=0.3, seed=5)
    events = list(synthetic.iter_events(0, opts))
    assert {e["event"] for e in events} == {
        "connector.started",
        "connector.queues",
        "connector.batch",
        "connector.lag",
        "connector.dead_letter",
        "connector.error",
        "connector.stopped",
    }
    for event in events:
        line = json.loads(synthetic.encode(event))
        errors = [e.message for e in validator.iter_errors(line)]
        assert errors == [], (line, errors)


def test_malformed_lines_are_invalid_json_or_invalid_events() -> None:
    validator = Draft202012Validator(JSON_SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
    for line in synthetic.MALFORMED_LINES:
        try:
            parsed = json.loads(line)
        except ValueError:
            continue
        assert not validator.is_valid(parsed), line


def test_struct_is_a_structtype_usable_by_spark_readers() -> None:
    assert isinstance(schema.READ_SCHEMA, StructType)
    assert schema.READ_SCHEMA.fieldNames()[-1] == schema.CORRUPT_COLUMN
