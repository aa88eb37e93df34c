"""DP SQL: the SELECT statements the curator answers, parsed with sqlglot into a ``Plan``.

Accepted (the DP-safe subset)::

    SELECT <group keys>, <aggregates>
    FROM <the curator's table>
    [WHERE <row predicate>]
    [GROUP BY <columns, CASE bins, width_bucket(...), aliases, positions> | GROUP BY ALL]

Aggregates: COUNT(*), COUNT(DISTINCT <privacy unit>), SUM(col), AVG(col), VARIANCE / VAR_POP
(col), STDDEV / STDDEV_POP(col) (the population's: VAR_SAMP and STDDEV_SAMP are refused),
MEDIAN(col), QUANTILE_CONT(col, q) /
QUANTILE(col, q) / PERCENTILE_CONT(q) WITHIN GROUP (ORDER BY col). Row predicates and group
keys use the scalar subset of ``expressions``.

Refused, each with the reason: any statement other than SELECT; joins, several tables,
subqueries, CTEs, set operations (every one could combine rows of different privacy units or
read data outside the table); HAVING, ORDER BY, LIMIT, DISTINCT, QUALIFY (they act on exact
results: filter, sort or cut the released noisy table instead); window functions; aggregates
over expressions or with FILTER; COUNT(column) and COUNT(DISTINCT column) of another column.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from dpcurator.query import expressions as ex
from dpcurator.query._keys import public_keys
from dpcurator.query.errors import QueryError, UnsupportedQueryError
from dpcurator.query.joins import UNIT_COLUMN, flatten, rekey, rekey_auto
from dpcurator.query.plan import (
    Aggregate,
    BoundingMode,
    Bounds,
    Count,
    CountUnits,
    GroupKey,
    Mean,
    Plan,
    Quantile,
    Sum,
    Variance,
    auto_options,
)
from dpcurator.query.schema import Schema

__all__ = ["parse_sql"]

_CLAUSES = {
    "joins": "JOIN is answered over a schema of several tables (Curator({name: data, ...}, "
             "privacy_unit={table: column or path})); this curator has one table",
    "having": "HAVING is not supported: it filters on exact aggregates; filter the released "
              "noisy table instead",
    "order": "ORDER BY is not supported: sort the released table instead (sorting noisy "
             "values is free post-processing)",
    "limit": "LIMIT is not supported: cut the released table instead",
    "offset": "OFFSET is not supported: cut the released table instead",
    "distinct": "SELECT DISTINCT is not supported: use GROUP BY",
    "qualify": "QUALIFY is not supported: it filters on window functions over exact values",
    "with_": "WITH (common table expressions) is not supported: a DP query reads its one "
             "table directly",
    "laterals": "LATERAL is not supported",
    "windows": "WINDOW clauses are not supported",
    "into": "SELECT INTO is not supported: the curator only answers queries",
    "pivots": "PIVOT is not supported",
}


def _unsupported(message: str) -> UnsupportedQueryError:
    return UnsupportedQueryError(message)


def _parse(sql: str) -> exp.Select:
    if not isinstance(sql, str) or not sql.strip():
        raise QueryError("sql must be a non-empty string")
    try:
        statements = sqlglot.parse(sql, dialect=ex.DIALECT)
    except (ParseError, TokenError):
        raise _unsupported("the SQL could not be parsed; check the syntax (only single SELECT "
                           "statements over the curator's table are answered)") from None
    statements = [s for s in statements if s is not None]
    if len(statements) != 1:
        raise _unsupported(f"exactly one SQL statement is answered, got {len(statements)}; "
                           "';' separated statements are refused")
    stmt = ex.without_comments(statements[0])
    assert stmt is not None
    if isinstance(stmt, exp.SetOperation):
        raise _unsupported(f"{stmt.key.upper()} is not supported: a DP query reads one table "
                           "once (set operations can count one unit several times)")
    if not isinstance(stmt, exp.Select):
        raise _unsupported(f"only SELECT queries are answered; {stmt.key.upper()} statements "
                           "are refused")
    return stmt


def _check_clauses(select: exp.Select, *, joins: bool = False) -> None:
    """Refuse the clauses outside the subset (``joins``: joins are allowed)."""
    for arg, message in _CLAUSES.items():
        if arg == "joins" and joins:
            continue
        if select.args.get(arg):
            raise _unsupported(message)


def _check_from(select: exp.Select, table: str) -> None:
    source = select.args.get("from_") or select.args.get("from")
    if source is None:
        raise _unsupported(f"the query needs FROM {table}")
    node = source.this
    if isinstance(node, exp.Subquery):
        raise _unsupported("subqueries in FROM are not supported: a DP query reads the "
                           "curator's table directly")
    if not isinstance(node, exp.Table) or not isinstance(node.this, exp.Identifier):
        raise _unsupported(f"FROM must name the curator's table ({table}); table functions "
                           "and other sources are refused")
    if node.args.get("db") or node.args.get("catalog"):
        raise _unsupported(f"FROM must name the curator's table ({table}) without a schema")
    if node.name.lower() != table.lower():
        raise QueryError(f"unknown table {node.name!r}: this curator answers queries about "
                         f"one table, named {table!r}")
    if len(source.expressions or []) > 0:
        raise _unsupported("several tables in FROM are not supported (that is a join)")


def _column_arg(node: exp.Expression | None, func: str) -> str:
    if isinstance(node, exp.Column) and not node.table:
        return str(node.name)
    raise _unsupported(f"{func}() takes a column name as its argument (expressions inside "
                       "aggregates are not supported; filter with WHERE instead)")


def _number(node: exp.Expression | None, what: str) -> float:
    ok, value = ex.literal_value(node) if node is not None else (False, None)
    if not ok or isinstance(value, bool) or not isinstance(value, int | float):
        raise _unsupported(f"{what} must be a literal number")
    try:
        return float(value)
    except OverflowError:
        raise QueryError(f"{what} is out of range") from None


def _aggregate(node: exp.Expression, name: str | None, privacy_unit: str | None,
               bounds: Mapping[str, Bounds]) -> Aggregate | None:
    """The plan aggregate for a SELECT item, or None if it is not an aggregate (``bounds`` is
    keyed by lower-case column name)."""
    if isinstance(node, exp.Filter):
        raise _unsupported("aggregate FILTER clauses are not supported; use WHERE")
    if isinstance(node, exp.Window):
        raise _unsupported("window functions are not supported: they combine rows of "
                           "different privacy units")
    if isinstance(node, exp.WithinGroup):
        inner = node.this
        order = node.expression
        if not isinstance(inner, exp.PercentileCont | exp.PercentileDisc) or \
                not isinstance(order, exp.Order) or len(order.expressions) != 1:
            raise _unsupported("WITHIN GROUP is supported only as PERCENTILE_CONT(q) "
                               "WITHIN GROUP (ORDER BY column)")
        column = _column_arg(order.expressions[0].this, "PERCENTILE_CONT")
        q = _number(inner.this, "the percentile")
        return Quantile(column, bounds.get(column.lower()), name or "", q=q)
    if not isinstance(node, exp.AggFunc):
        return None
    func = node.sql_name() if not isinstance(node, exp.Anonymous) else str(node.this).upper()
    if isinstance(node, exp.Count):
        arg = node.this
        if isinstance(arg, exp.Star) or (ex.literal_value(arg)[0] and arg is not None
                                         and not isinstance(arg, exp.Null)):
            return Count(name or "count")
        if isinstance(arg, exp.Distinct):
            cols = arg.expressions
            if len(cols) == 1 and isinstance(cols[0], exp.Column) and privacy_unit is not None \
                    and cols[0].name.lower() == privacy_unit.lower():
                return CountUnits(name or "count_units")
            raise _unsupported("COUNT(DISTINCT ...) is supported only for the privacy unit "
                               f"column ({privacy_unit or 'none: this curator is row-level'}); "
                               "distinct values of other columns need a partition selection "
                               "per value")
        raise _unsupported("COUNT(column) is not supported; use COUNT(*) with "
                           "WHERE column IS NOT NULL")
    if node.args.get("distinct") or isinstance(node.this, exp.Distinct):
        raise _unsupported(f"{func}(DISTINCT ...) is not supported")
    if isinstance(node, exp.Sum):
        column = _column_arg(node.this, "SUM")
        return Sum(column, bounds.get(column.lower()), name or "")
    if isinstance(node, exp.Avg):
        column = _column_arg(node.this, "AVG")
        return Mean(column, bounds.get(column.lower()), name or "")
    if isinstance(node, exp.Variance | exp.VariancePop):
        column = _column_arg(node.this, func)
        return Variance(column, bounds.get(column.lower()), name or "")
    if isinstance(node, exp.Stddev | exp.StddevPop | exp.StddevSamp):
        column = _column_arg(node.this, func)
        return Variance(column, bounds.get(column.lower()), name or "", std=True)
    if isinstance(node, exp.Median):
        column = _column_arg(node.this, "MEDIAN")
        return Quantile(column, bounds.get(column.lower()), name or "", q=0.5)
    if isinstance(node, exp.PercentileCont | exp.PercentileDisc | exp.ApproxQuantile |
                  exp.Quantile):
        column = _column_arg(node.this, func)
        q_node = node.args.get("expression") or node.args.get("quantile")
        q = _number(q_node, "the quantile")
        return Quantile(column, bounds.get(column.lower()), name or "", q=q)
    raise _unsupported(f"aggregate {func}() is not supported; the supported aggregates are "
                       "COUNT(*), COUNT(DISTINCT <privacy unit>), SUM, AVG, VARIANCE, STDDEV, "
                       "MEDIAN and QUANTILE_CONT")


def _bounds_map(bounds: Mapping[str, Any] | None) -> dict[str, Bounds]:
    """Bounds keyed by the column name in lower case: DuckDB's identifiers are
    case-insensitive (quoted or not), so ``SUM(AMOUNT)`` takes the bounds of ``amount``."""
    if bounds is None:
        return {}
    if not isinstance(bounds, Mapping):
        raise QueryError("bounds must be a mapping {column: (lo, hi)}")
    out: dict[str, Bounds] = {}
    for col, value in bounds.items():
        if not isinstance(col, str):
            raise QueryError(f"bounds must be keyed by column name, got {col!r}")
        if col.lower() in out:
            raise QueryError(f"bounds name the column {col!r} twice (column names are "
                             "case-insensitive)")
        out[col.lower()] = Bounds.of(value, col)
    return out


def parse_sql(
    sql: str,
    *,
    table: str = "data",
    privacy_unit: str | None = None,
    bounds: Mapping[str, Any] | str | None = None,
    keys: Any = None,
    max_partitions: int | str | None = None,
    max_rows_per_partition: int | str | None = None,
    bounding: BoundingMode | None = None,
    schema: Schema | None = None,
) -> Plan:
    """Parse a DP SQL query into a ``Plan`` (see the module docstring for the subset).

    ``schema``: the query is over the schema's tables, joined as ``dpcurator.query.joins``
    accepts (``table`` and ``privacy_unit`` are then unused: the joined rows carry the unit).

    ``bounds`` gives clamping bounds per column; ``keys`` the public partitions (a list, tuples,
    DataFrame or Arrow table); the contribution bounds default to the curator's. ``"auto"``
    (for ``bounds``, a column's bounds, or a cap) asks the curator to choose that bound from
    the data under DP (``AutoBounds``).
    """
    bounds, max_partitions, max_rows_per_partition, auto = auto_options(
        bounds, max_partitions, max_rows_per_partition)
    try:
        plan = _parse_sql(sql, table, privacy_unit, bounds, keys,  # type: ignore[arg-type]
                          max_partitions,
                          max_rows_per_partition, bounding, schema)
    except RecursionError:  # sqlglot parses and writes expressions recursively
        raise too_deep_error() from None
    if plan.source is not None and schema is not None:
        auto = rekey_auto(auto, plan.source, schema, "bounds")
    return plan if auto is None else plan.replace(auto=auto)


def too_deep_error() -> UnsupportedQueryError:
    """The error for an expression nested too deeply to be parsed or written back."""
    return UnsupportedQueryError("the query is nested too deeply (parentheses, NOT, or long "
                                 "chains of operators); write it more simply")


def _refuse_sample_variance(select: exp.Expr, sql: str) -> None:
    """VAR_SAMP and STDDEV_SAMP are refused: the curator releases the population variance,
    and sqlglot reads VAR_SAMP as VARIANCE (which means the population's here, as
    documented), so the name written is read from the text."""
    for node in select.find_all(exp.Variance, exp.StddevSamp):
        start, end = node.meta.get("start"), node.meta.get("end")
        written = sql[start:end + 1].upper() if isinstance(start, int) and \
            isinstance(end, int) else ""
        if isinstance(node, exp.StddevSamp) or written in ("VAR_SAMP", "VARIANCE_SAMP"):
            raise _unsupported(f"{written or node.sql_name()} (the sample variance) is not "
                               "released: the curator releases the population variance "
                               "(VAR_POP, VARIANCE, STDDEV_POP, STDDEV)")


def _group_entries(group: exp.Group, items: list[exp.Expression]) -> list[exp.Expression]:
    """The GROUP BY entries; ``GROUP BY ALL`` names every SELECT item that holds no aggregate
    (DuckDB's meaning), as ``GROUP BY 1, 2, ...`` of those items would."""
    if not group.args.get("all"):
        return list(group.expressions)
    if group.expressions:
        raise _unsupported("GROUP BY ALL takes no other keys: write GROUP BY ALL alone, or "
                           "list the keys")
    return [exp.Literal.number(i) for i, item in enumerate(items, start=1)
            if not any(isinstance(n, exp.AggFunc | exp.WithinGroup | exp.Window)
                       for n in item.walk())]


def _aliased_key(name: str, target: exp.Expression) -> exp.Expression:
    """The SELECT expression a GROUP BY name refers to as an output alias. Refused where the
    alias also names a column the expression reads (``SELECT h % 2 AS h ... GROUP BY h``):
    DuckDB and PostgreSQL group such a name by the input column, a reader may mean the alias,
    and the two answers differ."""
    if isinstance(target, exp.Column) and not target.table and \
            target.name.lower() == name.lower():
        return target
    if any(c.name.lower() == name.lower() for c in target.find_all(exp.Column)):
        raise QueryError(f"GROUP BY {name} is ambiguous: {name!r} is both an output alias and "
                         "a column that alias reads; rename the alias, or GROUP BY the "
                         "expression or its position")
    return target


def _parse_sql(sql: str, table: str, privacy_unit: str | None,
               bounds: Mapping[str, Any] | None, keys: Any, max_partitions: int | None,
               max_rows_per_partition: int | None, bounding: BoundingMode | None,
               schema: Schema | None = None) -> Plan:
    select = _parse(sql)
    _refuse_sample_variance(select, sql)
    source = None
    if schema is not None:
        _check_clauses(select, joins=True)
        select, source = flatten(select, schema)
        table, privacy_unit = "__joined", UNIT_COLUMN
        if isinstance(bounds, Mapping) and all(isinstance(c, str) for c in bounds):
            bounds = rekey(bounds, source, schema, "bounds")  # as the joined rows name them
    _check_clauses(select)
    _check_from(select, table)
    bounds_by_column = _bounds_map(bounds)

    # GROUP BY entries: expressions, output aliases or 1-based ordinals.
    items = list(select.expressions)
    if any(isinstance(i, exp.Star) for i in items):
        raise _unsupported("SELECT * is not supported: a DP query releases aggregates only")
    aliases = {str(i.alias).lower(): i.this for i in items if isinstance(i, exp.Alias)}
    group_nodes: list[exp.Expression] = []
    group = select.args.get("group")
    if group is not None:
        if group.args.get("grouping_sets") or group.args.get("cube") or group.args.get("rollup"):
            raise _unsupported("GROUPING SETS, CUBE and ROLLUP are not supported: ask one "
                               "grouping per query")
        for node in _group_entries(group, items):
            ok, value = ex.literal_value(node)
            if ok and isinstance(value, int) and not isinstance(value, bool):
                if not 1 <= value <= len(items):
                    raise QueryError(f"GROUP BY {value} does not name a SELECT item")
                chosen = items[value - 1]
                node = chosen.this if isinstance(chosen, exp.Alias) else chosen
            elif isinstance(node, exp.Column) and not node.table and \
                    node.name.lower() in aliases:
                node = _aliased_key(node.name, aliases[node.name.lower()])
            ex.check_scalar(node, "GROUP BY")
            group_nodes.append(node)
    group_texts = [ex.Sql(n) for n in group_nodes]  # each written once, its tree kept

    aggregates: list[Aggregate] = []
    key_names: dict[str, str] = {}
    for item in items:
        node, alias = (item.this, str(item.alias)) if isinstance(item, exp.Alias) \
            else (item, None)
        aggregate = _aggregate(node, alias, privacy_unit, bounds_by_column)
        if aggregate is not None:
            aggregates.append(aggregate)
            continue
        if any(isinstance(n, exp.AggFunc) for n in node.walk()):
            raise _unsupported("aggregates must be whole SELECT items (arithmetic on "
                               "aggregates, such as SUM(a) / COUNT(*), is not supported: "
                               "compute it from the released values)")
        ex.check_scalar(node, "SELECT")
        text = ex.canonical(node)
        if text not in group_texts:
            raise QueryError(f"SELECT item {node.sql(dialect=ex.DIALECT)} is neither an "
                             "aggregate nor a GROUP BY key")
        name = alias or (node.name if isinstance(node, exp.Column) else None)
        if name is None:
            raise QueryError(f"give the group key {node.sql(dialect=ex.DIALECT)} a name with AS")
        if text in key_names:  # one output column per key: the release keys it by name
            raise QueryError(f"the group key {node.sql(dialect=ex.DIALECT)} is selected "
                             f"twice (as {key_names[text]!r} and {name!r}): select it once")
        key_names[text] = name
    group_keys: list[GroupKey] = []
    for node, text in zip(group_nodes, group_texts, strict=True):
        if text not in key_names:
            raise QueryError(f"GROUP BY key {node.sql(dialect=ex.DIALECT)} must also appear "
                             "in the SELECT list")
        group_keys.append(GroupKey(key_names[text], text, ex.labels_of(node)))

    where = select.args.get("where")
    predicate = None
    if where is not None:
        ex.check_scalar(where.this, "WHERE")
        predicate = ex.Sql(where.this)
    public = public_keys(keys, [g.name for g in group_keys]) if keys is not None else None
    return Plan(
        aggregates=tuple(aggregates),
        group_by=tuple(group_keys),
        where=predicate,
        keys=public,
        max_partitions=max_partitions,
        max_rows_per_partition=max_rows_per_partition,
        bounding=bounding,
        source=source,
    )
