"""The Python query builder: ``Query().where(...).group_by(...).count().mean(...)``.

Each method returns a new ``Query`` (the builder is immutable, so a partial query can be
reused); ``plan()`` returns the frozen ``Plan``. The same question written in DP SQL gives an
equal plan (``tests/test_query_plans.py`` checks it).

    >>> q = (Query()
    ...      .where("age >= 18")
    ...      .group_by("category")
    ...      .count("n")
    ...      .mean("value", bounds=(0, 100), name="mean_value"))
    >>> curator.run(q, epsilon=0.5)                         # doctest: +SKIP
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from dpcurator.query import expressions as ex
from dpcurator.query._keys import public_keys
from dpcurator.query.errors import QueryError
from dpcurator.query.plan import (
    AUTO,
    Aggregate,
    AutoBounds,
    BoundingMode,
    Bounds,
    Count,
    CountUnits,
    GroupKey,
    IntervalKind,
    Mean,
    Plan,
    PublicKeys,
    Quantile,
    Sum,
    Variance,
    auto_options,
)

__all__ = ["Query", "bins", "column_key", "expression_key", "width_bucket"]

#: Clamping bounds: a pair (lo, hi), or "auto" (chosen from the data under DP).
BoundsLike = Bounds | tuple[float, float] | Sequence[float] | str | None


def column_key(column: str, name: str | None = None) -> GroupKey:
    """Group by a column (output column ``name``, default the column's name)."""
    if not isinstance(column, str) or not column:
        raise QueryError(f"group_by columns must be non-empty strings, got {column!r}")
    return GroupKey(name or column.rsplit(".", 1)[-1], ex.Sql(exp.column(column)))


def expression_key(expression: str, name: str) -> GroupKey:
    """Group by a scalar SQL expression of one row (checked against the DP-safe subset)."""
    node = ex.parse_scalar(expression, f"group key {name!r}")
    return GroupKey(name, ex.Sql(node), ex.labels_of(node))


def _number_literal(value: float) -> exp.Expression:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise QueryError(f"bin edges must be numbers, got a {type(value).__name__}")
    number: float = value
    literal = exp.Literal.number(repr(abs(number)) if isinstance(number, float) else
                                 str(abs(number)))
    return exp.Neg(this=literal) if number < 0 else literal


def bins(column: str, edges: Sequence[float], name: str | None = None,
         labels: Sequence[str] | None = None) -> GroupKey:
    """Group a numeric column into the bins [e0, e1), [e1, e2), ..., [e_{n-1}, e_n].

    The bins are public (they come from the query), so no partition selection is needed and
    empty bins are released as noise around zero. Values outside [e0, e_n] and NULLs fall in
    no bin and are dropped. The last bin includes its upper edge.
    """
    edge_list = list(edges)
    if len(edge_list) < 2:
        raise QueryError("bins need at least two edges")
    if any(not b > a for a, b in itertools.pairwise(edge_list)):
        raise QueryError("bin edges must be strictly increasing")
    if labels is None:
        labels = [f"[{a:g}, {b:g}{']' if i == len(edge_list) - 2 else ')'}"
                  for i, (a, b) in enumerate(itertools.pairwise(edge_list))]
    if len(labels) != len(edge_list) - 1:
        raise QueryError(f"bins got {len(labels)} labels for {len(edge_list) - 1} bins")
    col = exp.column(column)
    case = exp.Case()
    for i, (a, b) in enumerate(itertools.pairwise(edge_list)):
        upper: exp.Expression = (exp.LTE(this=col.copy(), expression=_number_literal(b))
                                 if i == len(edge_list) - 2 else
                                 exp.LT(this=col.copy(), expression=_number_literal(b)))
        cond = exp.and_(exp.GTE(this=col.copy(), expression=_number_literal(a)), upper)
        case = case.when(cond, exp.Literal.string(str(labels[i])))
    ex.check_scalar(case, "bins")
    return GroupKey(name or column, ex.Sql(case), tuple(str(label) for label in labels))


def width_bucket(column: str, lo: float, hi: float, count: int,
                 name: str | None = None) -> GroupKey:
    """Group by SQL's width_bucket(column, lo, hi, count): 0 below lo, count + 1 from hi (as
    PostgreSQL: with hi < lo, 0 above lo, count + 1 from hi down; lo = hi is refused)."""
    node = exp.WidthBucket(this=exp.column(column), min_value=_number_literal(lo),
                           max_value=_number_literal(hi),
                           num_buckets=exp.Literal.number(count))
    ex.check_scalar(node, "width_bucket")
    return GroupKey(name or column, ex.Sql(node), ex.labels_of(node))


@dataclass(frozen=True)
class Query:
    """An immutable DP query under construction; ``plan()`` returns the frozen ``Plan``."""

    aggregates: tuple[Aggregate, ...] = ()
    group_keys: tuple[GroupKey, ...] = ()
    predicate: str | None = None
    public: PublicKeys | None = None
    max_partitions: int | None = None
    max_rows_per_partition: int | None = None
    bounding: BoundingMode | None = None
    auto: AutoBounds | None = None
    interval_kind: IntervalKind | None = None
    max_unit_rows: int | None = None
    max_unit_sums: tuple[tuple[str, float], ...] = ()
    total_share: float | None = None
    tables: str | None = None

    # -- tables (a curator over several) ---------------------------------------------------

    def from_(self, table: str) -> Query:
        """Read ``table`` of a curator over several tables (``"lineitem"``, or with an alias
        ``"lineitem l"``); join others with ``join``. Columns may then be qualified
        (``"l.l_extendedprice"``) or not, as in DP SQL."""
        if not isinstance(table, str) or not table.strip():
            raise QueryError(f"from_ takes a table's name, got {table!r}")
        return replace(self, tables=_table_name(table, "from_"))

    def join(self, table: str, on: str, *, left: bool = False) -> Query:
        """JOIN (or LEFT JOIN) ``table`` ON ``on`` (equalities of columns joined with AND),
        accepted as DP SQL's joins are (``dpcurator.query.joins``)."""
        if self.tables is None:
            raise QueryError("call from_(table) before join")
        for value, what in ((table, "table"), (on, "on")):
            if not isinstance(value, str) or not value.strip():
                raise QueryError(f"join's {what} must be non-empty text, got {value!r}")
        kind = "LEFT JOIN" if left else "JOIN"
        return replace(self, tables=f"{self.tables} {kind} {_table_name(table, 'join')} ON "
                                    f"{_equalities(on)}")

    # -- rows and partitions -------------------------------------------------------------

    def where(self, predicate: str) -> Query:
        """Keep the rows where ``predicate`` (a DP-safe SQL expression) is true.

        Called twice, the predicates are combined with AND.
        """
        node: exp.Expr = ex.parse_scalar(predicate, "where", qualified=self.tables is not None)
        if self.predicate is not None:
            node = exp.and_(ex.tree_of(self.predicate), node)
        return replace(self, predicate=ex.Sql(node))

    def group_by(self, *columns: str | GroupKey, keys: Any = None) -> Query:
        """Group by columns (or ``bins(...)``, ``width_bucket(...)``, ``expression_key(...)``).

        ``keys`` lists the partitions to release when they are public: a list of values (one
        group key), of tuples, a pandas or Polars DataFrame, or an Arrow table. Without keys,
        partitions are selected privately (unless every key is binned).
        """
        if not columns:
            raise QueryError("group_by needs at least one column")
        group = tuple(c if isinstance(c, GroupKey) else column_key(c) for c in columns)
        public = public_keys(keys, [g.name for g in group]) if keys is not None else None
        return replace(self, group_keys=self.group_keys + group, public=public)

    def with_keys(self, keys: Any) -> Query:
        """Declare the public partitions (see ``group_by``)."""
        if not self.group_keys:
            raise QueryError("call group_by before with_keys")
        return replace(self, public=public_keys(keys, [g.name for g in self.group_keys]))

    def bound_contributions(self, *, max_partitions: int | str | None = None,
                            max_rows_per_partition: int | str | None = None,
                            mode: BoundingMode | None = None) -> Query:
        """Set how much one privacy unit may contribute (see ``Plan``); ``"auto"`` has a cap
        chosen from the data under DP (``AutoBounds``)."""
        _, k, r, auto = auto_options(None, max_partitions, max_rows_per_partition)
        if auto is not None:
            auto = auto.merged(self.auto)
        return replace(
            self,
            max_partitions=k if k is not None else (
                None if max_partitions is not None else self.max_partitions),
            max_rows_per_partition=r if r is not None else (
                None if max_rows_per_partition is not None else self.max_rows_per_partition),
            bounding=mode if mode is not None else self.bounding,
            auto=auto if auto is not None else self.auto,
        )

    def bound_unit_totals(self, *, max_unit_rows: int | None = None,
                          max_unit_sums: Mapping[str, float] | None = None) -> Query:
        """Cap each unit's total over all partitions instead of its rows per partition
        (``bounding="unit"``, COUNT(*) and SUM only; see ``Plan``): at most
        ``max_unit_rows`` rows in all, a sum of |value| of at most ``max_unit_sums[column]``;
        each one not given is chosen from the data under DP."""
        plan = Plan(aggregates=(Count(),), max_unit_rows=max_unit_rows,
                    max_unit_sums=tuple((max_unit_sums or {}).items()))  # validates them
        return replace(self, bounding="unit", max_unit_rows=plan.max_unit_rows,
                       max_unit_sums=plan.max_unit_sums)

    def bounds_share(self, share: float) -> Query:
        """Spend ``share`` (in (0, 1)) of this query's budget choosing the bounds it leaves to
        the data ("auto"), instead of the curator's share (10% unless it states another)."""
        return replace(self, auto=AutoBounds(share=share).merged(self.auto))

    def intervals(self, kind: str, *, max_unit_rows: int | None = None,
                  max_unit_sums: Mapping[str, float] | None = None,
                  share: float | None = None) -> Query:
        """What the intervals of COUNT(*) and SUM cover: ``"bounded"`` (the answer after the
        caps and the clamping) or ``"total"`` (the answer without them, wherever no unit has
        more than ``max_unit_rows`` rows in all, nor a sum of |value| above
        ``max_unit_sums[column]``; each chosen from the data when not given), for ``share``
        of the query's budget (default the curator's, 10%)."""
        plan = Plan(aggregates=(Count(),), intervals=kind,  # type: ignore[arg-type]
                    max_unit_rows=max_unit_rows,
                    max_unit_sums=tuple((max_unit_sums or {}).items()),
                    total_share=share)  # validates them
        return replace(self, interval_kind=plan.intervals, max_unit_rows=plan.max_unit_rows,
                       max_unit_sums=plan.max_unit_sums, total_share=plan.total_share)

    def _auto_column(self, bounds: BoundsLike, column: str) -> Query:
        """This query, asking for ``column``'s bounds to be chosen when ``bounds`` is "auto"."""
        if isinstance(bounds, str) and bounds == AUTO:
            return replace(self, auto=AutoBounds(columns=(column,)).merged(self.auto))
        return self

    # -- aggregates ----------------------------------------------------------------------

    def _add(self, aggregate: Aggregate) -> Query:
        return replace(self, aggregates=(*self.aggregates, aggregate))

    def count(self, name: str = "count") -> Query:
        """COUNT(*): rows per partition."""
        return self._add(Count(name))

    def count_units(self, name: str = "count_units") -> Query:
        """COUNT(DISTINCT privacy unit): distinct privacy units per partition."""
        return self._add(CountUnits(name))

    def sum(self, column: str, bounds: BoundsLike = None, name: str | None = None) -> Query:
        """SUM(column) of values clamped to ``bounds`` (lo, hi)."""
        return self._auto_column(bounds, column)._add(
            Sum(column, _bounds(bounds, column), name or ""))

    def mean(self, column: str, bounds: BoundsLike = None, name: str | None = None) -> Query:
        """AVG(column) of values clamped to ``bounds``."""
        return self._auto_column(bounds, column)._add(
            Mean(column, _bounds(bounds, column), name or ""))

    def variance(self, column: str, bounds: BoundsLike = None,
                 name: str | None = None) -> Query:
        """Population variance of values clamped to ``bounds``."""
        return self._auto_column(bounds, column)._add(
            Variance(column, _bounds(bounds, column), name or ""))

    def stddev(self, column: str, bounds: BoundsLike = None, name: str | None = None) -> Query:
        """Population standard deviation of values clamped to ``bounds``."""
        return self._auto_column(bounds, column)._add(
            Variance(column, _bounds(bounds, column), name or "", std=True))

    def quantile(self, column: str, q: float, bounds: BoundsLike = None,
                 name: str | None = None) -> Query:
        """The q-quantile of values clamped to ``bounds``."""
        return self._auto_column(bounds, column)._add(
            Quantile(column, _bounds(bounds, column), name or "", q=q))

    def median(self, column: str, bounds: BoundsLike = None, name: str | None = None) -> Query:
        """The median of values clamped to ``bounds``."""
        return self.quantile(column, 0.5, bounds, name)

    def histogram(self, column: str, edges: Iterable[float], name: str = "count") -> Query:
        """Counts per bin of ``column`` (shorthand for group_by(bins(...)).count())."""
        return self.group_by(bins(column, list(edges))).count(name)

    # -- result --------------------------------------------------------------------------

    def plan(self) -> Plan:
        """The frozen, validated plan."""
        return Plan(
            aggregates=self.aggregates,
            group_by=self.group_keys,
            where=self.predicate,
            keys=self.public,
            max_partitions=self.max_partitions,
            max_rows_per_partition=self.max_rows_per_partition,
            bounding=self.bounding,
            auto=self.auto,
            intervals=self.interval_kind,
            max_unit_rows=self.max_unit_rows,
            max_unit_sums=self.max_unit_sums,
            total_share=self.total_share,
            tables=self.tables,
        )


def _bounds(value: BoundsLike, column: str) -> Bounds | None:
    if value is None or (isinstance(value, str) and value == AUTO):
        return None
    return Bounds.of(value, column)


def _table_name(text: str, what: str) -> str:
    """A table's name, with an alias or not (``"lineitem"``, ``"lineitem l"``, ``"lineitem AS
    l"``), as the builder pastes it into the query's FROM."""
    words = text.split()
    if not (len(words) in (1, 2) or (len(words) == 3 and words[1].upper() == "AS")) or \
            not all(w.isidentifier() for w in (words[0], words[-1])):
        raise QueryError(f"{what} takes a table's name, with an alias or not ('lineitem l'), "
                         f"got {text!r}")
    return " ".join(words)


def _equalities(on: str) -> str:
    """``join``'s ON: equalities of columns joined with AND, nothing else. The text is pasted
    into the query, so a WHERE, LIMIT or ORDER BY written in it was applied or dropped
    silently (a bug hunt)."""
    def columns_equal(node: exp.Expr) -> bool:
        if isinstance(node, exp.And):
            return columns_equal(node.this) and columns_equal(node.expression)
        if isinstance(node, exp.Paren):
            return columns_equal(node.this)
        return isinstance(node, exp.EQ) and isinstance(node.this, exp.Column) and \
            isinstance(node.expression, exp.Column)

    try:
        node = sqlglot.parse_one(on, dialect="duckdb")
    except ParseError:
        node = None
    if node is None or not columns_equal(node):
        raise QueryError("join's on must be equalities of columns joined with AND (such as "
                         "'o.o_custkey = c.c_custkey'); filter with where()")
    return on.strip()
