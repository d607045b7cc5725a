"""The rules file: typed values, and ``file:line: field: problem`` for anything unusable."""

from __future__ import annotations

import pytest

from mqproxy.connector.rules import RulesError, parse_rules

GOOD = """\
[connector]
name = "edge-to-central"
batch_messages = 64

[clusters.edge]
namesrv = "127.0.0.1:9876"
[clusters.central]
namesrv = "10.0.0.6:9876;10.0.0.5:9876"
access_key = "ak"
secret_key = "sk"

[[rules]]
source = "edge"
target = "central"
topic = "Orders"
target_topic = "OrdersCopy"
filter = "x || y"
start = "earliest"

[[rules]]
name = "events"
source = "edge"
target = "central"
topic = "re:Evt-.*"
sql = "a > 5"
start = "2026-01-02T03:04:05.500Z"
"""


def test_a_good_file_parses_to_typed_rules() -> None:
    config = parse_rules(GOOD, "r.toml")
    assert config.name == "edge-to-central"
    assert config.batch_messages == 64
    assert config.dlq_topic == "CONNECTOR_DLQ_edge-to-central"
    central = config.clusters["central"]
    assert central.id == "10.0.0.5:9876;10.0.0.6:9876"
    assert central.access_key == "ak"
    first, second = config.rules
    assert first.label == "edge->central:Orders"
    assert first.target_of("Orders") == "OrdersCopy"
    assert first.tags is not None
    assert first.tags.matches("y")
    assert not first.tags.matches("z")
    assert first.start.kind == "earliest"
    assert second.label == "events"
    assert second.matches_topic("Evt-12")
    assert not second.matches_topic("xEvt-1")
    assert second.sql is not None
    assert second.sql.matches({"a": "6"})
    assert second.start.kind == "timestamp"
    assert second.start.timestamp_ms == 1767323045500
    assert parse_rules(GOOD.replace('start = "earliest"\n', ""), "r").rules[0].start.kind == "latest"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (('name = "edge-to-central"', 'name = "a b"'), "r.toml:2: connector.name: use 1-100"),
        (("batch_messages = 64", 'batch_messages = "x"'), "r.toml:3: connector.batch_messages: expected int"),
        (
            ("batch_messages = 64", "batch_messages = 0"),
            "r.toml:3: connector.batch_messages: must be positive",
        ),
        (
            ('namesrv = "127.0.0.1:9876"', 'namesrv = "nowhere"'),
            "r.toml:6: clusters.edge.namesrv: expected host:port",
        ),
        (('secret_key = "sk"', ""), "r.toml:9: clusters.central.access_key: keys go in pairs"),
        (
            ('target = "central"\ntopic = "Orders"', 'target = "nope"\ntopic = "Orders"'),
            "r.toml:14: rules[0].target: no cluster named 'nope'",
        ),
        (('topic = "re:Evt-.*"', 'topic = "re:("'), "r.toml:24: rules[1].topic: bad regular expression"),
        (('sql = "a > 5"', 'sql = "a >"'), "r.toml:25: rules[1].sql: bad SQL92 expression"),
        (('start = "earliest"', 'start = "soon"'), "r.toml:18: rules[0].start: expected earliest"),
        (('filter = "x || y"', 'filter = "x"\nsql = "b = 1"'), "r.toml:18: rules[0].sql: 'filter' and 'sql'"),
        (
            ('name = "events"\n', 'name = "events"\ncolour = "red"\n'),
            "r.toml:22: rules[1].colour: unknown field",
        ),
        (
            ('topic = "re:Evt-.*"', 'topic = "re:Evt-.*"\ntarget_topic = "X"'),
            "r.toml:25: rules[1].target_topic: not allowed with a regex topic",
        ),
        (
            ('source = "edge"\ntarget = "central"\ntopic = "Orders"', 'target = "central"\ntopic = "Orders"'),
            "r.toml:12: rules[0]: 'source' is required",
        ),
        (("[clusters.edge]", "[clusters.edge"), "r.toml:5: (syntax)"),
    ],
)
def test_a_bad_file_names_file_line_and_field(change: tuple[str, str], expected: str) -> None:
    old, new = change
    assert old in GOOD
    with pytest.raises(RulesError) as info:
        parse_rules(GOOD.replace(old, new, 1), "r.toml")
    assert str(info.value).startswith(expected), str(info.value)
