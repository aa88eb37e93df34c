"""A schema's tables in one engine: the joined rows a query reads, and the owner's checks.

``TableSet`` holds one engine per table, all on one connection (so that the database joins
them), and gives, for a query's ``JoinSource``, an engine whose relation is the join itself
(``view``): every stage of the bounding (``_rows``, ``_bounding``, ``_profile_sql``) then reads
the joined rows as it reads one table, and the per-unit caps and the clamping apply to the
joined rows, inside the engine, after the join. The join is one subquery:

    SELECT a.x AS "x", b.y AS "b.y", ..., c.unit AS "__unit"
    FROM customer AS c JOIN orders AS o ON o.o_custkey = c.c_custkey ...

(a LEFT JOINed table whose path the compiler joins is a subquery of its rows that reach
their unit: ``LEFT JOIN (SELECT o.* FROM orders AS o JOIN customer AS __path1 ON ...) AS o``).

``check_links`` is the data owner's check of the declared paths, when the curator is made:
every path's target column unique (else a row could reach two units: refused), and the rows
whose path is broken (their key has no match up the path) counted, never shown.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from sqlglot import exp

from dpcurator.engines._engine import SqlEngine
from dpcurator.errors import UserError
from dpcurator.query.joins import UNIT_COLUMN, JoinedTable, JoinSource
from dpcurator.query.schema import Schema

__all__ = ["LinkReport", "TableSet", "join_relation"]

VIEWS = 32  # joined views kept per table set (each caches its compiled statements)


def _placeholder(index: int) -> str:
    return f"__dpcurator_table_{index}__"


def _column(table_alias: str, name: str) -> exp.Column:
    return exp.Column(this=exp.to_identifier(name, quoted=True),
                      table=exp.to_identifier(table_alias, quoted=True))


def _named(node: exp.Expr, name: str) -> exp.Alias:
    return exp.Alias(this=node, alias=exp.to_identifier(name, quoted=True))


def join_relation(source: JoinSource, engine: SqlEngine,
                  relations: Mapping[str, str]) -> str:
    """The joined rows of ``source`` as a parenthesised, aliased subquery in ``engine``'s
    dialect (``relations``: each table's relation text)."""
    order = list(dict.fromkeys(t.table for s in source.tables for t in (s, *s.path)))
    items: list[exp.Expr] = [_named(_column(a, c), flat) for flat, a, c in source.columns]
    items.append(_named(_column(*source.unit), UNIT_COLUMN))

    def read(t: JoinedTable) -> exp.Table:
        return exp.Table(this=exp.to_identifier(_placeholder(order.index(t.table))),
                         alias=exp.TableAlias(this=exp.to_identifier(t.alias, quoted=True)))

    def join(t: JoinedTable) -> exp.Join:
        on = exp.and_(*(exp.EQ(this=_column(*left), expression=_column(*right))
                        for left, right in t.on), copy=False)
        rows: exp.Expr = read(t)
        if t.path:  # its rows that reach their unit, as a subquery under its alias
            star = exp.Column(this=exp.Star(), table=exp.to_identifier(t.alias, quoted=True))
            inner = exp.Select(expressions=[star]).from_(read(t), copy=False)
            inner.set("joins", [join(p) for p in t.path])
            rows = exp.Subquery(this=inner, alias=exp.TableAlias(
                this=exp.to_identifier(t.alias, quoted=True)))
        return exp.Join(this=rows, on=on, side="LEFT" if t.kind == "left" else None)

    first = source.tables[0]
    select = exp.Select(expressions=items).from_(read(first), copy=False)
    select.set("joins", [join(t) for t in source.tables[1:]])
    text = engine.dialect.render(select)
    for i, table in enumerate(order):
        text = text.replace(_placeholder(i), relations[table])
    return f"({text}) AS __joined"


@dataclass(frozen=True)
class LinkReport:
    """What the owner's check found: per table, rows whose path reaches no unit (counts
    only) and rows whose unit is missing (NULL)."""

    broken: Mapping[str, int]
    missing_unit: Mapping[str, int]

    def lines(self) -> list[str]:
        out = [f"{table}: {n} row(s) reach no unit through the declared path (their key has "
               "no match up the path); they are excluded from every answer"
               for table, n in self.broken.items() if n]
        out += [f"{table}: {n} row(s) have no unit (NULL); they are excluded from every "
                "answer" for table, n in self.missing_unit.items() if n]
        return out


class TableSet:
    """Several tables on one connection (module docstring): ``engines`` by table name."""

    def __init__(self, engines: Mapping[str, SqlEngine], label: str) -> None:
        if not engines:
            raise UserError("a schema needs at least one table")
        self.engines = dict(engines)
        self.label = label
        self._views: OrderedDict[JoinSource, SqlEngine] = OrderedDict()
        first = next(iter(self.engines.values()))
        self.name = first.name

    def columns(self) -> dict[str, dict[str, str]]:
        return {name: dict(engine.columns()) for name, engine in self.engines.items()}

    def relations(self) -> dict[str, str]:
        return {name: engine._relation for name, engine in self.engines.items()}

    def view(self, source: JoinSource) -> SqlEngine:
        """The engine reading ``source``'s joined rows (one per source, kept)."""
        first = next(iter(self.engines.values()))
        with first._lock:
            view = self._views.get(source)
            if view is None:
                relation = join_relation(source, first, self.relations())
                view = self._views[source] = first.derived(relation, source.describe(),
                                                           self._columns_of(source))
                while len(self._views) > VIEWS:
                    self._views.popitem(last=False)
            else:
                self._views.move_to_end(source)
            return view

    def _columns_of(self, source: JoinSource) -> dict[str, str]:
        """The joined rows' columns and types, from the tables' (no statement runs)."""
        tables = {t.alias: t.table for t in source.tables}
        types = self.columns()
        out = {flat: types[tables[a]][c] for flat, a, c in source.columns}
        alias, column = source.unit
        out[UNIT_COLUMN] = types[tables[alias]][column]
        return out

    def check_links(self, schema: Schema) -> LinkReport:
        """The data owner's check of the paths (module docstring); UserError if a path's
        target is not unique."""
        first = next(iter(self.engines.values()))
        relations = self.relations()
        q = first.quote
        for table, column in schema.targets():
            rel, col = relations[table], q(column)
            count = first.scalar(f"SELECT count({col}) - count(DISTINCT {col}) FROM {rel}")
            if count:
                raise UserError(f"{table}.{column} is the target of a path but is not unique "
                                f"({count} repeated value(s)): a row pointing at it could "
                                "reach several units; declare a unique key")
        broken: dict[str, int] = {}
        missing: dict[str, int] = {}
        for spec in schema.private:
            if spec.unit is not None:
                missing[spec.name] = first.scalar(
                    f"SELECT count(*) FROM {relations[spec.name]} WHERE {q(spec.unit)} IS NULL")
                continue
            # rows of the table that reach the unit table's row: inner joins up the path
            joins, current = [], "t0"
            for i, link in enumerate(schema.path(spec.name), start=1):
                joins.append(f"JOIN {relations[link.target]} AS t{i} ON "
                             f"{current}.{q(link.column)} = t{i}.{q(link.target_column)}")
                current = f"t{i}"
            root = schema.root(spec.name)
            assert root.unit is not None
            reached = first.scalar(
                f"SELECT count(*) FROM {relations[spec.name]} AS t0 {' '.join(joins)} "
                f"WHERE {current}.{q(root.unit)} IS NOT NULL")
            total = first.scalar(f"SELECT count(*) FROM {relations[spec.name]}")
            if reached > total:  # a row met several keys: it would count for several units
                raise UserError(f"rows of {spec.name} reach several units along their path "
                                f"({reached} matches for {total} rows): its keys must compare "
                                "exactly with their targets (declare columns of one type)")
            broken[spec.name] = total - reached
        return LinkReport(broken, missing)

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()
