"""Topic name and filter validation, `$share` parsing and `topic_matches` tables."""

from __future__ import annotations

import pytest

from mqproxy.codecs.mqtt import (
    MqttCodecError,
    ReasonCode,
    TopicFilter,
    parse_topic_filter,
    topic_matches,
    validate_topic_name,
)


@pytest.mark.parametrize(
    "topic", ["a", "a/b", "/", "a//b", "/a", "$SYS/broker/load", "$share/g/a", " ", "ü/€"]
)
def test_valid_topic_names(topic: str) -> None:
    validate_topic_name(topic)


@pytest.mark.parametrize("topic", ["", "+", "#", "a/+", "a/#", "a+b", "sport/tennis#"])
def test_invalid_topic_names(topic: str) -> None:
    with pytest.raises(MqttCodecError) as info:
        validate_topic_name(topic)
    assert info.value.reason_code == ReasonCode.TOPIC_NAME_INVALID


@pytest.mark.parametrize(
    ("topic_filter", "parsed"),
    [
        ("a", TopicFilter("a")),
        ("#", TopicFilter("#")),
        ("+", TopicFilter("+")),
        ("+/+", TopicFilter("+/+")),
        ("/+", TopicFilter("/+")),
        ("sport/+/player1", TopicFilter("sport/+/player1")),
        ("sport/tennis/#", TopicFilter("sport/tennis/#")),
        ("$SYS/#", TopicFilter("$SYS/#")),
        ("$share/g/a/+", TopicFilter("a/+", "g")),
        ("$share/group-1/#", TopicFilter("#", "group-1")),
        ("$share/g//", TopicFilter("/", "g")),
        ("$shared/g/a", TopicFilter("$shared/g/a")),
    ],
)
def test_valid_topic_filters(topic_filter: str, parsed: TopicFilter) -> None:
    assert parse_topic_filter(topic_filter) == parsed


def test_has_wildcards() -> None:
    assert parse_topic_filter("$share/g/a/+").has_wildcards
    assert parse_topic_filter("a/#").has_wildcards
    assert not parse_topic_filter("$share/g/a/b").has_wildcards


@pytest.mark.parametrize(
    "topic_filter",
    [
        "",
        "a#",
        "#/a",
        "a/#/b",
        "a/b#",
        "+a",
        "a/+b",
        "sport+",
        "##",
        "++",
        "$share/g",
        "$share/g/",
        "$share//a",
        "$share/g+/a",
        "$share/#/a",
        "$share/",
    ],
)
def test_invalid_topic_filters(topic_filter: str) -> None:
    with pytest.raises(MqttCodecError) as info:
        parse_topic_filter(topic_filter)
    assert info.value.reason_code == ReasonCode.TOPIC_FILTER_INVALID


MATCHES = [
    # exact
    ("a/b", "a/b", True),
    ("a/b", "a/c", False),
    ("a/b", "a/b/c", False),
    ("A", "a", False),
    # '#'
    ("#", "a", True),
    ("#", "a/b/c", True),
    ("#", "/", True),
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("sport/#", "sports", False),
    ("a/#", "b/a", False),
    # '+'
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+", "a", True),
    ("+", "a/b", False),
    ("+", "/finance", False),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+/tennis/#", "sport/tennis/player1", True),
    ("+/+/+", "a/b", False),
    ("a/+/c", "a//c", True),
    # '$' topics: no leading wildcard matches them
    ("#", "$SYS/broker/load", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("+/+", "$TopicA/B", False),
    ("$SYS/#", "$SYS/broker/load", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("$SYS", "$SYS", True),
    ("a/#", "a/$b", True),
    # shared subscriptions match on the filter after the group
    ("$share/g/a/+", "a/b", True),
    ("$share/g/#", "x/y", True),
    ("$share/g/#", "$SYS/x", False),
    ("$share/g/a", "$share/g/a", False),
    ("$share/g/a", "a", True),
]


@pytest.mark.parametrize(("topic_filter", "topic", "expected"), MATCHES)
def test_topic_matches(topic_filter: str, topic: str, expected: bool) -> None:
    assert topic_matches(topic_filter, topic) is expected
