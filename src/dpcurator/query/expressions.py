"""The DP-safe scalar subset of SQL: parse, check and canonicalise one expression.

A row filter or a computed group key is a function of one row at a time; any such function
keeps differential privacy, because it cannot move information between privacy units. What
must be refused is everything that looks at *other* rows (subqueries, window functions,
aggregates inside a predicate), everything that reaches outside the table (table functions,
file readers, settings, parameters), and functions not on an explicit list: a function that
can fail on some values would turn a record's value into an error message or a refusal, so
the engines make these expressions total (``engines._total``: one rule table, the failing
operation is NULL on every engine) and casts are ``TRY_CAST``.

Expressions are stored in plans as ``Sql``: their canonical DuckDB-dialect text (written by
sqlglot once, where the expression enters: DP SQL or the builder), carrying the parsed tree.
Later stages (resolving column names, the engines) read the tree with ``tree_of`` instead of
parsing the text again, so a query's text is parsed once.
"""

from __future__ import annotations

from typing import Any, TypeVar

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from dpcurator.query.errors import QueryError, UnsupportedQueryError

__all__ = [
    "DIALECT",
    "Sql",
    "canonical",
    "check_scalar",
    "columns_of",
    "describe",
    "labels_of",
    "literal_value",
    "parse_scalar",
    "tree_of",
    "without_comments",
]

_Node = TypeVar("_Node", bound=exp.Expr | None)

DIALECT = "duckdb"

# Structure, logic, comparison and arithmetic.
_STRUCTURE: tuple[type[exp.Expression], ...] = (
    exp.Column, exp.Identifier, exp.Literal, exp.Boolean, exp.Null, exp.Paren, exp.Tuple,
    exp.And, exp.Or, exp.Not, exp.Xor,
    exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ,
    exp.Is, exp.In, exp.Between, exp.Like, exp.ILike,
    exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.Neg, exp.Pow,
    exp.Case, exp.If, exp.Cast, exp.TryCast, exp.DataType, exp.DataTypeParam, exp.Var,
    exp.Interval, exp.DPipe,
)
# Scalar functions that read only their arguments and return a value for every input (made
# total by engines._total: where one fails, it is NULL).
_FUNCTIONS: tuple[type[exp.Expression], ...] = (
    exp.Abs, exp.Ceil, exp.Floor, exp.Round, exp.Sqrt, exp.Ln, exp.Log, exp.Exp, exp.Sign,
    exp.Greatest, exp.Least, exp.Coalesce, exp.Nullif,
    exp.Lower, exp.Upper, exp.Length, exp.Substring, exp.Trim, exp.Concat, exp.StartsWith,
    exp.RegexpLike, exp.Left, exp.Right,
    exp.Year, exp.Month, exp.Day, exp.DayOfWeek, exp.DayOfYear, exp.Quarter, exp.Week,
    exp.Extract, exp.DateTrunc, exp.TimestampTrunc, exp.WidthBucket,
)
_ALLOWED = _STRUCTURE + _FUNCTIONS
_ALLOWED_NAMES = sorted({cls.__name__.upper() for cls in _FUNCTIONS})


def describe(node: exp.Expr) -> str:
    if isinstance(node, exp.Anonymous):
        return f"function {str(node.this).upper()}()"
    if isinstance(node, exp.Func):
        return f"function {node.sql_name()}()"
    return node.key.upper()


def _reason(node: exp.Expr, context: str) -> str:
    name = describe(node)
    if isinstance(node, exp.Subquery | exp.Select | exp.Exists | exp.Union | exp.Query):
        return (f"{name} is not supported in {context}: a DP query reads its one table once, "
                "and a subquery could compare rows of different privacy units")
    if isinstance(node, exp.Window):
        return (f"window functions are not supported in {context}: they combine rows of "
                "different privacy units, so one unit could change every row's value")
    if isinstance(node, exp.AggFunc):
        return (f"aggregate {name} is not allowed in {context}: aggregates belong in the "
                "SELECT list of a grouped query, where they are bounded and noised")
    if isinstance(node, exp.Star):
        return f"'*' is not allowed in {context}"
    if isinstance(node, exp.Placeholder | exp.Parameter):
        return f"query parameters are not supported in {context}; write the value inline"
    if isinstance(node, exp.Func):
        return (f"{name} is not supported in {context}: only scalar functions known to read "
                f"nothing but their arguments are allowed ({', '.join(_ALLOWED_NAMES)})")
    return f"{name} is not supported in {context}"


def parse_scalar(text: str, context: str, *, qualified: bool = False) -> exp.Expression:
    """Parse one scalar SQL expression (a predicate or a value), refusing anything else
    (``qualified``: columns may name their table, over a schema of several)."""
    if not isinstance(text, str) or not text.strip():
        raise QueryError(f"{context} must be a non-empty SQL expression string")
    try:
        parsed = sqlglot.parse(text, dialect=DIALECT)
    except (ParseError, TokenError):
        raise UnsupportedQueryError(
            f"{context} is not a valid SQL expression (it could not be parsed)") from None
    except RecursionError:
        raise UnsupportedQueryError(f"{context} is nested too deeply; write it more "
                                    "simply") from None
    if len(parsed) != 1 or parsed[0] is None:
        raise UnsupportedQueryError(f"{context} must be exactly one SQL expression; "
                                    "statements separated by ';' are refused")
    node = without_comments(parsed[0])
    if isinstance(node, exp.Query | exp.Command) or not isinstance(node, exp.Expression) \
            or type(node).__module__.startswith("sqlglot.expressions.ddl"):
        raise UnsupportedQueryError(
            f"{context} must be a scalar expression, not a {node.key.upper()} statement")
    check_scalar(node, context, qualified=qualified)
    return node


def without_comments(node: _Node) -> _Node:
    """The tree with its SQL comments dropped (in place): sqlglot keeps a comment on the node
    beside it, where it would become part of that node's text (``GROUP BY region -- per
    region`` no longer matched the SELECT's ``region``; a bug hunt). A comment means nothing
    to a query."""
    if node is not None:
        for sub in node.walk():
            sub.comments = None
    return node


def check_scalar(node: exp.Expr, context: str, *, qualified: bool = False) -> None:
    """Raise UnsupportedQueryError naming the first construct outside the safe subset
    (``qualified``: a column may name its table, as ``alias.column``)."""
    for sub in node.walk():
        if not isinstance(sub, _ALLOWED):
            raise UnsupportedQueryError(_reason(sub, context))
        if isinstance(sub, exp.Column) and sub.table and (
                not qualified or sub.args.get("db") or sub.args.get("catalog")):
            raise UnsupportedQueryError(
                f"qualified column names ({sub.sql(dialect=DIALECT)}) are not supported in "
                f"{context}: write the column name alone (table.column is for a query over "
                "several tables: from_(...) first)")
        if isinstance(sub, exp.In) and sub.args.get("query") is not None:
            raise UnsupportedQueryError(_reason(exp.Subquery(), context))
        if isinstance(sub, exp.WidthBucket):
            labels_of(sub)  # literal bounds and bucket count, wherever it is used
        if isinstance(sub, exp.Identifier) and not isinstance(sub.parent, exp.Column):
            parent = sub.parent
            if not isinstance(parent, exp.DataType | exp.Var | exp.Extract | exp.DateTrunc |
                              exp.TimestampTrunc | exp.Interval):
                raise UnsupportedQueryError(
                    f"the identifier {sub.sql(dialect=DIALECT)} is not supported in {context}")


def canonical(node: exp.Expr) -> str:
    """Canonical text of an expression (DuckDB dialect, identifiers quoted)."""
    return node.sql(dialect=DIALECT, identify=True)


class Sql(str):
    """A scalar expression in a plan: its canonical text (``canonical``), which compares,
    hashes, prints and serialises as the text, holding the tree it was written from, so that
    nothing parses it again (``tree_of``). Build it from a tree: ``Sql(node)``."""

    tree: exp.Expr

    def __new__(cls, node: exp.Expr) -> Sql:
        text = super().__new__(cls, canonical(node))
        text.tree = node.copy()
        return text

    def __reduce__(self) -> tuple[Any, tuple[str]]:  # pickled as text, parsed on load
        return (_sql_of_text, (str(self),))


def _sql_of_text(text: str) -> Sql:
    return Sql(sqlglot.parse_one(text, dialect=DIALECT))


def tree_of(text: str) -> exp.Expr:
    """The expression's tree, a copy the caller may change: a plan's ``Sql`` holds it (no
    parse); other text (a plan read from JSON, a test's) is parsed."""
    if isinstance(text, Sql):
        return text.tree.copy()
    return sqlglot.parse_one(text, dialect=DIALECT)


def columns_of(node: exp.Expression) -> list[str]:
    """Column names the expression reads, in order of first appearance."""
    seen: list[str] = []
    for col in node.find_all(exp.Column):
        name = col.name
        if name not in seen:
            seen.append(name)
    return seen


def literal_value(node: exp.Expression) -> tuple[bool, Any]:
    """(True, python value) when ``node`` is a literal (string, number, boolean, NULL)."""
    if isinstance(node, exp.Paren):
        return literal_value(node.this)
    if isinstance(node, exp.Null):
        return True, None
    if isinstance(node, exp.Boolean):
        return True, bool(node.this)
    if isinstance(node, exp.Neg):
        ok, value = literal_value(node.this)
        if ok and isinstance(value, int | float) and not isinstance(value, bool):
            return True, -value
        return False, None
    if isinstance(node, exp.Literal):
        if node.is_string:
            return True, str(node.this)
        text = str(node.this)
        try:
            return True, int(text)
        except ValueError:
            try:
                return True, float(text)
            except ValueError:
                return False, None
    return False, None


def labels_of(node: exp.Expression) -> tuple[Any, ...] | None:
    """The fixed set of values a binning expression can take, or None if not fixed.

    CASE whose every THEN / ELSE is a literal (no ELSE adds NULL); width_bucket(x, lo, hi, n)
    with literal lo, hi, n gives 0, ..., n + 1 (and NULL for NULL x).
    """
    if isinstance(node, exp.Paren):
        return labels_of(node.this)
    if isinstance(node, exp.Case):
        values: list[Any] = []
        for branch in node.args.get("ifs") or []:
            ok, value = literal_value(branch.args["true"])
            if not ok:
                return None
            values.append(value)
        default = node.args.get("default")
        if default is None:
            values.append(None)
        else:
            ok, value = literal_value(default)
            if not ok:
                return None
            values.append(value)
        unique: list[Any] = []
        for value in values:
            if value not in unique:
                unique.append(value)
        return tuple(unique)
    if isinstance(node, exp.WidthBucket):
        parts = ("this", "min_value", "max_value", "num_buckets")
        if any(not isinstance(node.args.get(p), exp.Expression) for p in parts):
            raise UnsupportedQueryError("width_bucket takes 4 arguments: width_bucket(value, "
                                        "low, high, buckets)")
        ok_n, n = literal_value(node.args["num_buckets"])
        if not ok_n or not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 1_000_000:
            raise UnsupportedQueryError("width_bucket needs a literal number of buckets "
                                        "between 1 and 1000000")
        ends = []
        for part in ("min_value", "max_value"):
            ok, value = literal_value(node.args[part])
            if not ok or not isinstance(value, int | float) or isinstance(value, bool):
                raise UnsupportedQueryError(
                    "width_bucket needs literal numeric bounds (its bins must be public)")
            ends.append(value)
        if ends[0] == ends[1]:  # PostgreSQL: "lower bound cannot equal upper bound"
            raise UnsupportedQueryError(
                "width_bucket's low and high bounds must differ (high < low counts the "
                "buckets down from low)")
        return (*range(n + 2), None)
    return None
