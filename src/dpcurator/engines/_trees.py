"""Small sqlglot tree builders: the vocabulary the bounding trees are written in.

Each writes one node as sqlglot would parse it back; ``wrap`` adds the parentheses sqlglot's
writer does not (it writes trees as they are). No dialect is involved here: a dialect's
primitives (``_dialect.Dialect``) are built from these.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import sqlglot
from sqlglot import exp

from dpcurator.query import expressions as ex

__all__ = ["add", "alias", "band", "case", "cast", "col", "div", "greatest", "least", "mod",
           "mul", "num", "paren", "select", "shr", "star", "sub", "user_col", "width_bucket_case",
           "window", "with_ctes", "wrap"]


def col(name: str, table: str | None = None) -> exp.Column:
    """An internal column (unquoted: internal names are plain identifiers)."""
    return exp.column(name, table=table)


def user_col(name: str) -> exp.Column:
    """A column of the user's table, always quoted."""
    return exp.Column(this=exp.to_identifier(name, quoted=True))


def num(value: int) -> exp.Expr:
    literal = exp.Literal.number(abs(value))
    return exp.Neg(this=literal) if value < 0 else literal


def cast(node: exp.Expr, to: str) -> exp.Cast:
    return exp.Cast(this=node, to=exp.DataType.build(to))


def paren(node: exp.Expr) -> exp.Paren:
    return exp.Paren(this=node)


def case(*whens: tuple[exp.Expr, exp.Expr],
         default: exp.Expr | None = None) -> exp.Case:
    node = exp.Case()
    for condition, value in whens:
        node = node.when(condition, value, copy=False)
    if default is not None:
        node = node.else_(default, copy=False)
    return node


def wrap(node: exp.Expr) -> exp.Expr:
    """``node`` in parentheses where an operator could bind it wrongly (sqlglot writes trees
    as they are, without adding parentheses)."""
    if isinstance(node, exp.Binary | exp.Neg | exp.Not) and not isinstance(node, exp.Paren):
        return exp.Paren(this=node)
    return node


def add(*terms: exp.Expr) -> exp.Expr:
    out = terms[0] if isinstance(terms[0], exp.Add) else wrap(terms[0])
    for term in terms[1:]:
        out = exp.Add(this=out, expression=wrap(term))
    return out


def sub(a: exp.Expr, b: exp.Expr) -> exp.Sub:
    return exp.Sub(this=wrap(a), expression=wrap(b))


def mul(a: exp.Expr, b: exp.Expr) -> exp.Mul:
    return exp.Mul(this=wrap(a), expression=wrap(b))


def div(a: exp.Expr, b: exp.Expr) -> exp.Div:
    return exp.Div(this=wrap(a), expression=wrap(b))


def mod(a: exp.Expr, b: exp.Expr) -> exp.Mod:
    return exp.Mod(this=wrap(a), expression=wrap(b))


def band(a: exp.Expr, b: exp.Expr) -> exp.BitwiseAnd:
    return exp.BitwiseAnd(this=wrap(a), expression=wrap(b))


def shr(a: exp.Expr, bits: int) -> exp.BitwiseRightShift:
    return exp.BitwiseRightShift(this=wrap(a), expression=num(bits))


def least(a: exp.Expr, b: exp.Expr) -> exp.Least:
    return exp.Least(this=a, expressions=[b], ignore_nulls=True)


def greatest(a: exp.Expr, b: exp.Expr) -> exp.Greatest:
    return exp.Greatest(this=a, expressions=[b], ignore_nulls=True)


def alias(node: exp.Expr, name: str) -> exp.Alias:
    return exp.Alias(this=node, alias=exp.to_identifier(name))


def window(func: exp.Expr, partition: Sequence[exp.Expr],
           order: Sequence[exp.Expr] = ()) -> exp.Window:
    node = exp.Window(this=func, partition_by=list(partition))
    if order:
        node.set("order", exp.Order(expressions=[exp.Ordered(this=o, nulls_first=False)
                                                 for o in order]))
    return node


def select(items: Sequence[exp.Expr], source: exp.Expr | str, *,
           where: exp.Expr | None = None, group: Sequence[exp.Expr] = (),
           comment: str | None = None) -> exp.Select:
    """SELECT items FROM source: a table name, or a query (given an alias here)."""
    if isinstance(source, str):
        from_: exp.Expr = exp.to_table(source)
    elif isinstance(source, exp.Query):
        from_ = exp.Subquery(this=source, alias=exp.TableAlias(this=exp.to_identifier("__q")))
    else:
        from_ = source
    node = exp.Select(expressions=list(items)).from_(from_, copy=False)
    if where is not None:
        node = node.where(where, copy=False)
    if group:
        node = node.group_by(*group, copy=False)
    if comment:
        node.add_comments([f" {comment} "])
    return node


def star() -> exp.Star:
    return exp.Star()


@functools.cache
def _bucket_template(descending: bool) -> exp.Expr:
    """The bin of x in [lo, hi) with n bins (descending: in (hi, lo], counted down from lo),
    parsed once per process (transform copies it)."""
    share = "(lo - x) * n / (lo - hi)" if descending else "(x - lo) * n / (hi - lo)"
    return sqlglot.parse_one(f"LEAST(n, CAST(FLOOR({share}) AS BIGINT) + 1)",
                             dialect=ex.DIALECT)


def width_bucket_case(node: exp.WidthBucket) -> exp.Expr:
    """width_bucket(x, lo, hi, n) as a CASE over doubles (bins 0 and n + 1 outside), as
    PostgreSQL and Spark define it: with lo < hi, bin 0 below lo and n + 1 from hi on; with
    lo > hi (a descending histogram), bin 0 above lo and n + 1 from hi down. The bounds are
    literals (``expressions.labels_of``, which refuses lo = hi, as PostgreSQL does)."""
    x = exp.cast(node.this, exp.DataType.build("DOUBLE"))
    lo = exp.cast(node.args["min_value"], exp.DataType.build("DOUBLE"))
    hi = exp.cast(node.args["max_value"], exp.DataType.build("DOUBLE"))
    n = node.args["num_buckets"]
    low, high = (ex.literal_value(node.args[k])[1] for k in ("min_value", "max_value"))
    descending = isinstance(low, int | float) and isinstance(high, int | float) and low > high
    inner = _bucket_template(descending).transform(
        lambda e: {"x": x, "lo": lo, "hi": hi, "n": n}.get(e.name, e).copy()
        if isinstance(e, exp.Column) else e)
    below, above = (exp.GT, exp.LTE) if descending else (exp.LT, exp.GTE)
    return (exp.Case()
            .when(exp.Is(this=x.copy(), expression=exp.Null()), exp.Null())
            .when(below(this=x.copy(), expression=lo.copy()), exp.Literal.number(0))
            .when(above(this=x.copy(), expression=hi.copy()),
                  exp.Literal.number(int(n.name) + 1))
            .else_(inner))


def with_ctes(ctes: Sequence[tuple[str, exp.Query]], body: exp.Query) -> exp.Query:
    """``body`` preceded by ``WITH`` the named queries ``ctes``, in order."""
    for name, query in ctes:
        body = body.with_(name, as_=query, copy=False)
    return body
