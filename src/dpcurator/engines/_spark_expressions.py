"""User expressions in Spark SQL, written so that no row can make them raise.

The plan's expressions (``dpcurator.query._expressions``: canonical DuckDB text) run on Spark
with DuckDB's results wherever DuckDB's ``TRY`` gives one, and NULL where it gives NULL:

- casts are ``TRY_CAST`` (NULL where the value does not convert, or overflows);
- integer ``+ - *``, negation and ``abs`` are ``try_add`` / ``try_subtract`` /
  ``try_multiply`` (NULL on overflow, where Spark without ANSI would wrap around);
- ``/`` is IEEE double division, as DuckDB's (x / 0 is +-inf, 0 / 0 and NaN / 0 are NaN;
  Spark's is NULL); ``//`` and ``%`` by zero are NULL;
- ``ln`` and ``log`` (DuckDB's ``log`` is base 10, Spark's is natural) give -inf at 0 and
  NaN below it, as DuckDB's do (Spark's give NULL); ``week`` is ``weekofyear`` and
  ``dayofweek`` counts from 0, as DuckDB's do;
- LIKE and regular expressions take literal patterns only (a pattern read from a row could
  be malformed, an error at run time): another pattern is refused when the query is
  validated, before anything is charged.

The statement also runs in a session of its own with ANSI mode off (``engines.spark``), so
that an operation not listed here gives NULL (or wraps) instead of raising.
"""

from __future__ import annotations

import functools

import sqlglot
from sqlglot import exp

from dpcurator.engines._sql import case, cast, num, paren, width_bucket_case
from dpcurator.errors import UserError
from dpcurator.query import _expressions as ex

__all__ = ["total"]

_TRY: dict[type[exp.Expr], str] = {exp.Add: "try_add", exp.Sub: "try_subtract",
                                  exp.Mul: "try_multiply"}


def _double(text: str) -> exp.Expr:
    return cast(exp.Literal.string(text), "DOUBLE")


def _call(name: str, *args: exp.Expr) -> exp.Expr:
    return exp.Anonymous(this=name, expressions=list(args))


def _negated(node: exp.Expr) -> exp.Expr:
    return _call("try_multiply", node, exp.Neg(this=num(1)))


def _divide(a: exp.Expr, b: exp.Expr) -> exp.Expr:
    x, y = cast(a, "DOUBLE"), cast(b, "DOUBLE")
    zero = num(0)
    by_zero = case((exp.Is(this=x.copy(), expression=exp.Null()), exp.Null()),
                   (exp.IsNan(this=x.copy()), _double("nan")),
                   (exp.GT(this=x.copy(), expression=zero.copy()), _double("inf")),
                   (exp.LT(this=x.copy(), expression=zero.copy()), _double("-inf")),
                   default=_double("nan"))
    return case((exp.EQ(this=y.copy(), expression=zero), by_zero),
                default=exp.Div(this=x, expression=y))


def _logarithm(x: exp.Expr, base: exp.Expr | None) -> exp.Expr:
    value = _call("ln", x.copy()) if base is None else _call("log", base, x.copy())
    return case((exp.EQ(this=x.copy(), expression=num(0)), _double("-inf")),
                (exp.LT(this=x.copy(), expression=num(0)), _double("nan")), default=value)


def _safe(node: exp.Expr) -> exp.Expr:
    """One node, its children already rewritten."""
    if isinstance(node, exp.Cast) and not isinstance(node, exp.TryCast):
        return exp.TryCast(this=node.this, to=node.args["to"])
    if isinstance(node, exp.WidthBucket):
        return width_bucket_case(node)
    name = _TRY.get(type(node))
    if name is not None:
        return _call(name, paren(node.this), paren(node.expression))
    if isinstance(node, exp.Neg) and not isinstance(node.this, exp.Literal):
        return _negated(node.this)
    if isinstance(node, exp.Abs):
        return case((exp.LT(this=node.this, expression=num(0)), _negated(node.this.copy())),
                    default=node.this.copy())
    if isinstance(node, exp.Div):
        return _divide(node.this, node.expression)
    if isinstance(node, exp.IntDiv | exp.Mod):
        node.set("expression", exp.Nullif(this=node.expression, expression=num(0)))
        return paren(node)
    if isinstance(node, exp.Ln):
        return _logarithm(node.this, None)
    if isinstance(node, exp.Log):
        if node.expression is None:  # DuckDB's one-argument log is base 10
            return _logarithm(node.this, num(10))
        return _logarithm(node.expression, node.this)
    if isinstance(node, exp.Week):
        return _call("weekofyear", node.this)
    if isinstance(node, exp.DayOfWeek):
        return paren(exp.Sub(this=_call("dayofweek", node.this), expression=num(1)))
    if isinstance(node, exp.Like | exp.ILike | exp.RegexpLike) and \
            not isinstance(node.expression, exp.Literal):
        raise UserError("on Spark, LIKE and regular expressions need a literal pattern "
                            "(a pattern read from the data could fail on a row)")
    return node


def _rewrite(node: exp.Expr) -> exp.Expr:
    for key, value in list(node.args.items()):
        if isinstance(value, exp.Expr):
            node.set(key, _rewrite(value))
        elif isinstance(value, list):
            node.set(key, [_rewrite(v) if isinstance(v, exp.Expr) else v for v in value])
    return _safe(node)


@functools.lru_cache(maxsize=256)
def _total(text: str) -> exp.Expr:
    node = sqlglot.parse_one(text, dialect=ex.DIALECT)
    ex.check_scalar(node, "expression")  # the plan was checked; check again, cheaply
    return _rewrite(node)


def total(text: str) -> exp.Expr:
    """Canonical plan SQL -> a Spark expression that cannot raise on any row."""
    return _total(text).copy()
