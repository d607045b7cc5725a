"""Message filters of the embedded broker: a subscription's expression compiled once (tags or SQL92), and
a pull answer narrowed by a SQL92 filter."""

from __future__ import annotations

from mqproxy.model.errors import BadFilter
from mqproxy.model.sql92 import Sql92Error, Sql92Filter, compile_sql92
from mqproxy.model.types import FilterExpression, PullResult, PullStatus, TagFilter

__all__ = ["compile_filter", "select"]


def compile_filter(expression: FilterExpression | None) -> TagFilter | Sql92Filter | None:
    """The evaluator of ``expression``: a tag filter, a compiled SQL92 filter, or None for everything.

    Raises :class:`BadFilter` for an unknown kind or SQL92 that does not parse."""
    if expression is None or expression.matches_all:
        return None
    kind = expression.kind.strip().upper() or "TAG"
    if kind == "TAG":
        tags = TagFilter.parse(expression.expression)
        return None if tags.is_all else tags
    if kind == "SQL92":
        try:
            return compile_sql92(expression.expression)
        except Sql92Error as exc:
            raise BadFilter(f"SQL92 expression does not parse: {exc}") from None
    raise BadFilter(f"expression type {expression.kind[:32]!r} is not supported, only TAG and SQL92")


def select(result: PullResult, sql: Sql92Filter) -> PullResult:
    """``result`` without the messages ``sql`` rejects (NO_MATCHED_MSG when none is left)."""
    if result.status is not PullStatus.FOUND:
        return result
    kept = tuple(m for m in result.messages if sql.matches(m.properties))
    if kept:
        return PullResult(PullStatus.FOUND, kept, result.next_offset, result.min_offset, result.max_offset)
    return PullResult(PullStatus.NO_MATCHED_MSG, (), result.next_offset, result.min_offset, result.max_offset)
