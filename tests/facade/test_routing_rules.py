"""Topic -> backend rules: matching order, kinds, defaults and malformed rules."""

from __future__ import annotations

import pytest

from mqproxy.facade.routing_rules import RoutingTable, RuleError, parse_rule


def test_each_kind_matches_what_it_says() -> None:
    exact, prefix, regex = (
        parse_rule("exact:orders", "a"),
        parse_rule("prefix:iot-", "b"),
        parse_rule("re:^audit-[0-9]+$", "c"),
    )
    assert exact.matches("orders")
    assert not exact.matches("orders2")
    assert not exact.matches("xorders")
    assert prefix.matches("iot-")
    assert prefix.matches("iot-temp")
    assert not prefix.matches("iot")
    assert regex.matches("audit-42")
    assert not regex.matches("audit-x")
    assert not regex.matches("xaudit-1")
    assert regex.text == "re:^audit-[0-9]+$"


def test_re_matches_from_the_start_without_anchor() -> None:
    rule = parse_rule("re:a.c", "x")
    assert rule.matches("abc")
    assert rule.matches("abcdef")
    assert not rule.matches("zabc")


def test_first_matching_rule_wins_then_default_then_none() -> None:
    rules = (parse_rule("exact:iot-special", "west"), parse_rule("prefix:iot-", "east"))
    table = RoutingTable(rules, "local")
    assert table.backend_for("iot-special") == "west"
    assert table.backend_for("iot-x") == "east"
    assert table.backend_for("other") == "local"
    assert RoutingTable(rules).backend_for("other") is None
    assert (
        RoutingTable(rules).describe() == "exact:iot-special -> west, prefix:iot- -> east; no routing.default"
    )
    assert table.describe().endswith("; default local")


@pytest.mark.parametrize(
    ("match", "why"),
    [
        ("orders", "is not exact:TOPIC"),
        ("glob:a*", "is not exact:TOPIC"),
        ("exact:", "empty pattern"),
        ("re:(unclosed", "not a valid regular expression"),
        ("re:*x", "not a valid regular expression"),
    ],
)
def test_malformed_rules_say_why(match: str, why: str) -> None:
    with pytest.raises(RuleError, match=why):
        parse_rule(match, "b")
