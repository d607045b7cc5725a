"""SQL92 filters evaluate as a RocketMQ broker's (``org.apache.rocketmq.filter``) do."""

from __future__ import annotations

import pytest

from mqproxy.model.sql92 import Sql92Error, compile_sql92

PROPS = {"a": "6", "b": "even", "c": "2.5", "flag": "true", "TAGS": "TagA", "s": "hello world", "q": "it's"}


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("a >= 4 AND b = 'even'", True),
        ("a > 6", False),
        ("a BETWEEN 1 AND 6", True),
        ("a NOT BETWEEN 1 AND 6", False),
        ("a = 6", True),
        ("a <> 6", False),
        ("a = 6.0", True),
        ("c > 2", False),  # as Java: "2.5" is converted to the integer type of 2 and fails
        ("c > 2.0", True),
        ("c < 2.6", True),
        ("b IN ('odd', 'even')", True),
        ("b NOT IN ('odd', 'even')", False),
        ("TAGS = 'TagA' OR nothing = 'x'", True),
        ("nothing IS NULL", True),
        ("a IS NOT NULL", True),
        ("nothing = 'x'", False),  # unknown, not a match
        ("NOT (nothing = 'x')", False),  # NOT unknown is unknown
        ("nothing = 'x' OR a = 6", True),
        ("nothing = 'x' AND a = 7", False),
        ("s CONTAINS 'lo w'", True),
        ("s NOT CONTAINS 'xyz'", True),
        ("s STARTSWITH 'hell'", True),
        ("s ENDSWITH 'world'", True),
        ("s NOT ENDSWITH 'world'", False),
        ("nothing CONTAINS 'x'", False),
        ("flag = TRUE", True),
        ("flag = FALSE", False),
        ("q = 'it''s'", True),
        ("b > 1", False),  # 'even' is not a number: the evaluation fails, no match
        ("a > c", True),  # two strings compared by '>' are compared as numbers
        ("-a < 0", False),  # a property's string value is not negated (NULL)
        ("a > -1", True),
        ("a = 6 -- trailing comment\n", True),
        ("/* x */ a = 6", True),
        ("a = 6l", True),
        ("TRUE", True),
        ("FALSE OR b = 'even'", True),
        ("flag", False),  # a property used as a boolean is FALSE unless it is a boolean
    ],
)
def test_evaluation(expression: str, expected: bool) -> None:
    assert compile_sql92(expression).matches(PROPS) is expected


def test_keywords_are_case_insensitive_and_identifiers_are_not() -> None:
    assert compile_sql92("a >= 4 and B is null or b = 'even'").matches(PROPS)
    assert not compile_sql92("A = 6").matches(PROPS)


@pytest.mark.parametrize(
    "expression",
    [
        "",
        "   ",
        "a >",
        "a = NULL",  # the broker: 'NULL' cannot be compared
        "a > 'x'",  # only numbers compare by '>'
        "a > TRUE",
        "'x' IN ('x')",  # IN needs a property
        "a BETWEEN 5 AND 1",
        "a = 1 b = 2",
        "a = 'unterminated",
        "a ! 1",
        "5",  # not boolean
        "'text'",
        "a NOT 5",
        "(" * 5000 + "a = 1" + ")" * 5000,
    ],
)
def test_invalid_expressions_are_refused(expression: str) -> None:
    with pytest.raises(Sql92Error):
        compile_sql92(expression)
