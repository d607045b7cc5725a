"""SQL92 message filters, as RocketMQ brokers evaluate them (``org.apache.rocketmq.filter``).

A consumer subscribes with an expression over message properties (user properties and system ones such
as ``TAGS``), e.g. ``a >= 4 AND b = 'even'``; the broker delivers the messages it is TRUE for. Pure code:
:func:`compile_sql92` parses once (raising :class:`Sql92Error` with a reason), :meth:`Sql92Filter.matches`
evaluates per message.

Grammar (the broker's JavaCC ``SelectorParser``, keywords case-insensitive)::

    or    := and (OR and)*                  and   := equal (AND equal)*
    equal := cmp ('=' cmp | '<>' cmp | IS NULL | IS NOT NULL)*
    cmp   := unary ( ('>'|'>='|'<'|'<=') unary | [NOT] (CONTAINS|STARTSWITH|ENDSWITH) 'str'
                   | [NOT] BETWEEN unary AND unary | [NOT] IN ('str', ...) )*
    unary := '+' unary | '-' unary | NOT unary | literal | identifier | '(' or ')'

Literals: ``'text'`` (``''`` escapes a quote), integers (optional ``L``), decimals, TRUE, FALSE, NULL;
identifiers ``[A-Za-z_$][A-Za-z0-9_$]*``; comments ``-- ...`` and ``/* ... */``.

Semantics kept from the broker: property values are strings, converted to the other operand's type when
compared with a number or boolean (a string that does not parse makes the expression fail, which counts
as no match); ``>``/``<``-style comparisons of two strings compare them as numbers; ``=`` with NULL is
unknown; AND/OR/NOT use three-valued logic; only TRUE matches. Parse-time checks refuse what the broker
refuses: comparing with NULL or non-numbers by ``>``/``<``, IN on a non-property, BETWEEN with a lower
bound above the upper one, and a top-level expression that is not boolean.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

__all__ = ["Sql92Error", "Sql92Filter", "compile_sql92"]

Value = str | int | float | bool | None


class Sql92Error(ValueError):
    """The expression is not valid SQL92 for a RocketMQ filter."""


class _EvalError(Exception):
    """Evaluation failed for one message (the broker logs it and does not deliver the message)."""


# --- tokens -----------------------------------------------------------------------------------------

_KEYWORDS: Final = frozenset(
    {"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS", "CONTAINS", "STARTSWITH", "ENDSWITH"}
)
_TOKEN: Final = re.compile(
    r"""
    (?P<space>\s+|--[^\n\r]*(?:\r\n|\n|\r|$)|/\*.*?\*/)
  | (?P<float>(?:[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+))
  | (?P<int>(?:0|[1-9][0-9]*)[lL]?)
  | (?P<string>'(?:''|[^'])*')
  | (?P<word>[A-Za-z_$][A-Za-z0-9_$]*)
  | (?P<op><>|>=|<=|[=<>(),+-])
    """,
    re.VERBOSE | re.DOTALL,
)

_INT32: Final = (-(2**31), 2**31 - 1)
_INT64: Final = (-(2**63), 2**63 - 1)


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "int", "float", "string", "word", "keyword", "op", "end"
    text: str


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            raise Sql92Error(f"unexpected character {text[position]!r} at {position}")
        position = match.end()
        kind = match.lastgroup or ""
        value = match.group()
        if kind == "space":
            continue
        if kind == "word" and value.upper() in _KEYWORDS:
            out.append(_Token("keyword", value.upper()))
        else:
            out.append(_Token(kind, value))
    out.append(_Token("end", ""))
    return out


# --- expression tree --------------------------------------------------------------------------------

Props = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class _Node:
    """One expression: ``evaluate(props)``; ``boolean`` says whether it yields TRUE/FALSE/NULL."""

    evaluate: Callable[[Props], Value]
    boolean: bool
    constant: bool = False
    value: Value = None
    prop: str | None = None


def _const(value: Value) -> _Node:
    return _Node(
        lambda _p: value, boolean=isinstance(value, bool) or value is None, constant=True, value=value
    )


def _prop(name: str) -> _Node:
    return _Node(lambda p: p.get(name), boolean=False, prop=name)


def _as_bool(value: Value) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise _EvalError(f"{value!r} is not a boolean")


def _java_parse(text: str, like: Value) -> Value:
    """A property string converted to the type of ``like`` (Java ``Integer/Long/Double/Boolean.valueOf``)."""
    if isinstance(like, bool):
        return text.lower() == "true"
    if isinstance(like, int):
        if not re.fullmatch(r"[+-]?[0-9]+", text):
            raise _EvalError(f"{text!r} is not an integer")
        number = int(text)
        low, high = _INT32 if _INT32[0] <= like <= _INT32[1] else _INT64
        if not low <= number <= high:
            raise _EvalError(f"{text!r} is out of range")
        return number
    try:
        return float(text.strip())
    except ValueError:
        raise _EvalError(f"{text!r} is not a number") from None


def _compare(left: Value, right: Value) -> int:
    """The broker's ``ComparisonExpression.__compare`` with string conversion on."""
    if type(left) is not type(right) and not (_is_number(left) and _is_number(right)):
        if isinstance(left, bool):
            raise _EvalError("a boolean compared with a non-boolean")
        if _is_number(left) and isinstance(right, str):
            right = _java_parse(right, left)
        elif isinstance(left, str) and (isinstance(right, bool) or _is_number(right)):
            left = _java_parse(left, right)
        else:
            return -1
    if left == right:
        return 0
    return -1 if left < right else 1  # type: ignore[operator]


def _is_number(value: Value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _equal(left: _Node, right: _Node) -> _Node:
    def evaluate(p: Props) -> Value:
        lv, rv = left.evaluate(p), right.evaluate(p)
        if (lv is None) != (rv is None):
            return None if lv is None else False
        if lv is None or (type(lv) is type(rv) and lv == rv):
            return True
        return _compare(lv, rv) == 0

    return _Node(evaluate, boolean=True)


def _relation(left: _Node, right: _Node, accept: Callable[[int], bool]) -> _Node:
    def evaluate(p: Props) -> Value:
        lv = left.evaluate(p)
        if lv is None:
            return None
        rv = right.evaluate(p)
        if rv is None:
            return None
        if isinstance(lv, str) and isinstance(rv, str):  # both strings: compared as numbers
            lv, rv = _java_parse(lv, 0.0), _java_parse(rv, 0.0)
        return accept(_compare(lv, rv))

    return _Node(evaluate, boolean=True)


def _not(node: _Node) -> _Node:
    def evaluate(p: Props) -> Value:
        value = _as_bool(node.evaluate(p))
        return None if value is None else not value

    return _Node(evaluate, boolean=True)


def _connective(left: _Node, right: _Node, decisive: bool) -> _Node:
    """SQL's three-valued AND (``decisive`` False) or OR (``decisive`` True): an operand equal to ``decisive``
    decides without the other; otherwise an unknown (None) operand makes the result unknown."""

    def evaluate(p: Props) -> Value:
        lv = _as_bool(left.evaluate(p))
        if lv is decisive:
            return decisive
        rv = _as_bool(right.evaluate(p))
        if rv is decisive:
            return decisive
        return None if lv is None or rv is None else not decisive

    return _Node(evaluate, boolean=True)


def _and(left: _Node, right: _Node) -> _Node:
    return _connective(left, right, decisive=False)


def _or(left: _Node, right: _Node) -> _Node:
    return _connective(left, right, decisive=True)


def _string_test(node: _Node, search: str, test: Callable[[str, str], bool], negate: bool) -> _Node:
    def evaluate(p: Props) -> Value:
        value = node.evaluate(p)
        if not search or not isinstance(value, str):
            return False
        return test(value, search) != negate

    return _Node(evaluate, boolean=True)


def _in(node: _Node, items: frozenset[str], negate: bool) -> _Node:
    def evaluate(p: Props) -> Value:
        value = node.evaluate(p)
        if not isinstance(value, str):
            return None
        return (value in items) != negate

    return _Node(evaluate, boolean=True)


def _negate(node: _Node) -> _Node:
    if node.constant and _is_number(node.value):
        return _const(-node.value)  # type: ignore[operator]

    def evaluate(p: Props) -> Value:
        value = node.evaluate(p)
        return -value if _is_number(value) else None  # type: ignore[operator]

    return _Node(evaluate, boolean=False)


def _boolean(node: _Node) -> _Node:
    """The broker's ``asBooleanExpression``: a property is cast, anything else must be boolean."""
    if node.boolean:
        return node
    if node.prop is not None:

        def evaluate(p: Props) -> Value:
            value = node.evaluate(p)
            return value if value is None or isinstance(value, bool) else False

        return _Node(evaluate, boolean=True)
    raise Sql92Error("expression will not result in a boolean value")


# --- parser -----------------------------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str) -> None:
        self._tokens = _tokens(text)
        self._at = 0

    def parse(self) -> _Node:
        node = _boolean(self._or())
        if self._peek().kind != "end":
            raise Sql92Error(f"unexpected {self._peek().text!r}")
        return node

    def _peek(self, ahead: int = 0) -> _Token:
        return self._tokens[min(self._at + ahead, len(self._tokens) - 1)]

    def _take(self) -> _Token:
        token = self._peek()
        self._at += 1
        return token

    def _accept(self, kind: str, text: str) -> bool:
        token = self._peek()
        if token.kind == kind and token.text == text:
            self._at += 1
            return True
        return False

    def _expect(self, kind: str, text: str) -> None:
        if not self._accept(kind, text):
            raise Sql92Error(f"expected {text!r}, found {self._peek().text or 'the end'!r}")

    def _or(self) -> _Node:
        node = self._and()
        while self._accept("keyword", "OR"):
            node = _or(_boolean(node), _boolean(self._and()))
        return node

    def _and(self) -> _Node:
        node = self._equality()
        while self._accept("keyword", "AND"):
            node = _and(_boolean(node), _boolean(self._equality()))
        return node

    def _equality(self) -> _Node:
        node = self._comparison()
        while True:
            if self._accept("op", "="):
                node = self._checked_equal(node, self._comparison())
            elif self._accept("op", "<>"):
                node = _not(self._checked_equal(node, self._comparison()))
            elif self._peek().text == "IS" and self._peek(1).text == "NULL":
                self._at += 2
                node = _equal(node, _const(None))
            elif self._accept("keyword", "IS"):
                self._expect("keyword", "NOT")
                self._expect("keyword", "NULL")
                node = _not(_equal(node, _const(None)))
            else:
                return node

    @staticmethod
    def _checked_equal(left: _Node, right: _Node) -> _Node:
        for side in (left, right):
            if side.constant and side.value is None:
                raise Sql92Error("NULL cannot be compared with '=', use IS NULL")
        if left.constant and right.constant and left.boolean and not right.boolean:
            raise Sql92Error(f"{left.value!r} cannot be compared with {right.value!r}")
        return _equal(left, right)

    _RELATIONS: Final = {
        ">": lambda c: c > 0,
        ">=": lambda c: c >= 0,
        "<": lambda c: c < 0,
        "<=": lambda c: c <= 0,
    }
    _STRING_TESTS: Final = {
        "CONTAINS": lambda value, search: search in value,
        "STARTSWITH": lambda value, search: value.startswith(search),
        "ENDSWITH": lambda value, search: value.endswith(search),
    }

    def _comparison(self) -> _Node:
        node = self._unary()
        while True:
            token = self._peek()
            negate = token.text == "NOT" and self._peek(1).text in (
                "CONTAINS",
                "STARTSWITH",
                "ENDSWITH",
                "BETWEEN",
                "IN",
            )
            if token.kind == "op" and token.text in self._RELATIONS:
                self._at += 1
                node = _relation(
                    self._comparable(node), self._comparable(self._unary()), self._RELATIONS[token.text]
                )
                continue
            if negate:
                self._at += 1
                token = self._peek()
            if token.kind == "keyword" and token.text in self._STRING_TESTS:
                self._at += 1
                node = _string_test(node, self._string(), self._STRING_TESTS[token.text], negate)
            elif self._accept("keyword", "BETWEEN"):
                node = self._between(node, negate)
            elif self._accept("keyword", "IN"):
                node = self._in(node, negate)
            elif negate:
                raise Sql92Error("NOT must be followed by CONTAINS, STARTSWITH, ENDSWITH, BETWEEN or IN here")
            else:
                return node

    @staticmethod
    def _comparable(node: _Node) -> _Node:
        if (node.constant and not _is_number(node.value)) or node.boolean:
            raise Sql92Error(f"value {node.value!r} cannot be compared with '>', '<', '>=' or '<='")
        return node

    def _between(self, node: _Node, negate: bool) -> _Node:
        low = self._unary()
        self._expect("keyword", "AND")
        high = self._unary()
        if low.constant and high.constant:
            if low.value is None or high.value is None:
                raise Sql92Error("BETWEEN values cannot be NULL")
            if _is_number(low.value) and _is_number(high.value) and high.value < low.value:  # type: ignore[operator]
                raise Sql92Error(f"BETWEEN: {low.value} must be less than or equal to {high.value}")
        node, low, high = self._comparable(node), self._comparable(low), self._comparable(high)
        if negate:
            return _or(_relation(node, low, lambda c: c < 0), _relation(node, high, lambda c: c > 0))
        return _and(_relation(node, low, lambda c: c >= 0), _relation(node, high, lambda c: c <= 0))

    def _in(self, node: _Node, negate: bool) -> _Node:
        if node.prop is None:
            raise Sql92Error("IN needs a property on its left")
        self._expect("op", "(")
        items = [self._string()]
        while self._accept("op", ","):
            items.append(self._string())
        self._expect("op", ")")
        return _in(node, frozenset(items), negate)

    def _string(self) -> str:
        token = self._take()
        if token.kind != "string":
            raise Sql92Error(f"expected a string literal, found {token.text or 'the end'!r}")
        return token.text[1:-1].replace("''", "'")

    def _unary(self) -> _Node:
        if self._accept("op", "+"):
            return self._unary()
        if self._accept("op", "-"):
            return _negate(self._unary())
        if self._accept("keyword", "NOT"):
            return _not(_boolean(self._unary()))
        return self._primary()

    def _primary(self) -> _Node:
        token = self._take()
        if token.kind == "string":
            return _const(token.text[1:-1].replace("''", "'"))
        if token.kind == "int":
            number = int(token.text.rstrip("lL"))
            if not _INT64[0] <= number <= _INT64[1]:
                raise Sql92Error(f"{token.text} is out of the long range")
            return _const(number)
        if token.kind == "float":
            return _const(float(token.text))
        if token.kind == "keyword" and token.text in ("TRUE", "FALSE", "NULL"):
            return _const({"TRUE": True, "FALSE": False, "NULL": None}[token.text])
        if token.kind == "word":
            return _prop(token.text)
        if token.kind == "op" and token.text == "(":
            node = self._or()
            self._expect("op", ")")
            return node
        raise Sql92Error(f"unexpected {token.text or 'end of expression'!r}")


@dataclass(frozen=True, slots=True)
class Sql92Filter:
    """A compiled SQL92 expression; ``matches`` is TRUE-only (NULL, FALSE and failures do not match)."""

    expression: str
    _root: _Node

    def matches(self, properties: Props) -> bool:
        try:
            return self._root.evaluate(properties) is True
        except (_EvalError, TypeError, ValueError):
            return False


@functools.lru_cache(maxsize=256)
def compile_sql92(expression: str) -> Sql92Filter:
    """Parse ``expression`` (remembered: every pull of a subscription brings it again); :class:`Sql92Error`
    says why it is not a valid filter."""
    if not expression or not expression.strip():
        raise Sql92Error("the expression is empty")
    try:
        root = _Parser(expression).parse()
    except RecursionError:
        raise Sql92Error("the expression nests too deeply") from None
    return Sql92Filter(expression, root)
