"""Joins in DP SQL: which are answered, and the rows each answered join hands to the bounding.

A query over a ``Schema`` names tables in FROM and JOIN ... ON. The join is answered when each
of its output rows belongs to exactly one privacy unit, so that the per-unit bounding applied
*after* the join (caps on partitions and rows, value clamping, inside the engine) bounds each
unit's whole influence, as it does for one table:

- Joins to public tables are free, on any key (their rows are the same in neighbouring
  databases).
- A private table joined to private tables already in the query must be joined on an equality
  of columns that stand for the same key (``Schema.key_of``): the unit itself
  (``o.o_custkey = c.c_custkey``) or a key on the declared paths (``l.l_orderkey =
  o.o_orderkey``). Equal keys then mean the same unit, so no output row mixes two units;
  other private-private joins are refused before any charge, with the join that would be
  accepted.
- INNER and LEFT equi-joins (ON a conjunction of column equalities); a LEFT JOIN whose kept
  side has no private table is refused (its unmatched rows belong to no one).

Why the bound holds (add/remove one unit u with all its rows in every table): an output row
that holds a row of u holds only rows of u and public rows (the equalities above); an output
row that holds no row of u is in both databases (public rows are fixed; for a LEFT JOIN, a row
of another unit matched no row of u, since matches share a unit). So the join's output changes
by exactly the output rows of one unit, the neighbouring relation the single-table bounding
is proved for (``dpcurator.query.bounding``).

A private table whose path to its unit is not in the query (``FROM lineitem`` alone) is joined
along the declared path by the compiler (inner joins, so rows with a broken path drop out, as
the schema says). A LEFT JOINed table's path is joined inside it, before its LEFT JOIN: only
its own rows with a broken path drop out, and the kept side's unmatched rows stay. It is then
a table of whole units' rows (removing u removes exactly its rows that reach u), so the
argument above holds for it unchanged. The unit of each output row is read from a table
holding it in its own column and not LEFT JOINed: every output row holds one of its rows,
and every private row it holds is of that row's unit (the equalities above), an unmatched
kept row's included. ``flatten`` returns the source (``JoinSource``) and the query rewritten
over its flat column names, which the single-table front end then parses as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from sqlglot import exp

from dpcurator.errors import InternalError
from dpcurator.query.errors import QueryError, UnknownColumnError, UnsupportedQueryError
from dpcurator.query.schema import UNIT, Schema, join_key_refusal

__all__ = ["UNIT_COLUMN", "JoinSource", "JoinedTable", "flatten", "flatten_plan", "rekey",
           "rekey_auto"]

UNIT_COLUMN = "__unit"  # the joined rows' privacy unit, a column of the source

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class JoinedTable:
    """One table of a join: its alias, how it joins (``from``, ``inner`` or ``left``) and the
    equalities ``((left alias, column), (right alias, column))`` it joins on. ``path``: the
    tables a LEFT JOINed table is inner-joined with, before its LEFT JOIN, to keep only its
    rows that reach their unit (the engine reads it as a subquery under ``alias``)."""

    alias: str
    table: str
    kind: str
    on: tuple[tuple[tuple[str, str], tuple[str, str]], ...] = ()
    path: tuple[JoinedTable, ...] = ()

    def describe(self) -> str:
        name = self.table if self.alias == self.table else f"{self.table} AS {self.alias}"
        if self.path:
            name = f"({' '.join([name, *(p.describe() for p in self.path)])}) AS {self.alias}"
        if self.kind == "from":
            return name
        on = " AND ".join(f"{a}.{c} = {b}.{d}" for (a, c), (b, d) in self.on)
        return f"{'LEFT JOIN' if self.kind == 'left' else 'JOIN'} {name} ON {on}"


@dataclass(frozen=True, slots=True)
class JoinSource:
    """The rows a joined query reads: the tables joined, in order; ``columns`` ((flat name,
    alias, column), ...), each read column once; ``unit`` (alias, column) holding every
    output row's unit. Hashable: a curator keeps one engine view per source."""

    tables: tuple[JoinedTable, ...]
    columns: tuple[tuple[str, str, str], ...]
    unit: tuple[str, str]
    neighbouring: str = ""  # the relation the guarantee holds under, in words

    def describe(self) -> str:
        return " ".join(t.describe() for t in self.tables)


def _unsupported(message: str) -> UnsupportedQueryError:
    return UnsupportedQueryError(message)


def _table_of(node: exp.Expression, schema: Schema) -> tuple[str, str]:
    """(alias, table name as the schema spells it) of a FROM or JOIN item."""
    if isinstance(node, exp.Subquery):
        raise _unsupported("subqueries in FROM are not supported: a DP query reads the "
                           "schema's tables directly")
    if not isinstance(node, exp.Table) or not isinstance(node.this, exp.Identifier):
        raise _unsupported("FROM and JOIN must name the schema's tables; table functions and "
                           "other sources are refused")
    if node.args.get("db") or node.args.get("catalog"):
        raise _unsupported(f"name the table {node.name!r} without a database or schema")
    spec = schema.table(node.name)  # QueryError naming the tables
    alias = node.alias or spec.name
    if "__dpcurator" in alias.lower() and node.alias:  # the engines' placeholders are
        # replaced as text (``engines._joins``): an alias holding one broke the SQL
        raise QueryError(f"the alias {alias!r} holds '__dpcurator', which the curator reserves "
                         f"for its own names: give the table {spec.name!r} another alias "
                         f"(FROM {spec.name} AS t)")
    if alias.startswith("__"):  # the compiler's own aliases (__path1, ...) start so
        raise QueryError(f"the alias {alias!r} starts with '__', which the curator reserves "
                         f"for its own names: give the table {spec.name!r} another alias "
                         f"(FROM {spec.name} AS t)" if node.alias else
                         f"the table {spec.name!r} starts with '__', which the curator "
                         f"reserves for its own names: give it an alias (FROM {spec.name} "
                         "AS t)")
    return alias, spec.name


def _join_kind(join: exp.Join) -> str:
    side = (join.args.get("side") or "").upper()
    kind = (join.args.get("kind") or "").upper()
    if join.args.get("method"):
        raise _unsupported(f"{join.args['method'].upper()} JOIN is not supported: write the "
                           "join condition with ON")
    if not side and kind in ("", "INNER"):
        if join.args.get("on") is None and not join.args.get("using"):
            raise _unsupported("a join needs ON with the columns it joins on (a comma or "
                               "CROSS JOIN pairs every row with every row)")
        return "inner"
    if side == "LEFT" and kind in ("", "OUTER"):
        return "left"
    what = " ".join(w for w in (side, kind) if w) or "this"
    raise _unsupported(f"{what} JOIN is not supported: the curator answers JOIN (inner) and "
                       "LEFT JOIN")


class _Columns:
    """Resolves the query's column references to (alias, column) and names them flat."""

    def __init__(self, schema: Schema, aliases: dict[str, str]) -> None:
        self.schema = schema
        self.aliases = aliases  # alias -> table
        self.used: dict[tuple[str, str], None] = {}
        self.names: dict[str, tuple[str, str]] = {}  # flat name, folded -> (alias, column)

    def resolve(self, node: exp.Column, what: str) -> tuple[str, str]:
        if node.args.get("db") or node.args.get("catalog"):
            raise _unsupported(f"name the column {node.sql()} as table.column or column")
        if not node.table and "." in node.name and not any(
                self.schema.table(t).has(node.name) for t in self.aliases.values()):
            # a builder's "alias.column", quoted whole; a column of that very name (a
            # flattened export's "orders.amount") is that column, as in SQL
            table, _, name = node.name.partition(".")
            node = exp.column(name, table)
        if node.table:
            alias = self._alias(node.table)
            return alias, self.schema.table(self.aliases[alias]).column(node.name, what)
        found = [(a, self.schema.table(t).column(node.name, what))
                 for a, t in self.aliases.items() if self.schema.table(t).has(node.name)]
        if not found:
            tables = ", ".join(f"{a} ({t})" if a != t else t for a, t in self.aliases.items())
            raise UnknownColumnError(f"{what} names the column {node.name!r}, which none of "
                                     f"the query's tables has ({tables})")
        if len(found) > 1:
            raise QueryError(f"the column {node.name!r} is in several of the query's tables "
                             f"({', '.join(a for a, _ in found)}): qualify it, as "
                             f"{found[0][0]}.{found[0][1]}")
        return found[0]

    def _alias(self, name: str) -> str:
        if name in self.aliases:
            return name
        folded = [a for a in self.aliases if a.lower() == name.lower()]
        if len(folded) == 1:
            return folded[0]
        aliased = [a for a, t in self.aliases.items() if t.lower() == name.lower()]
        if aliased:  # SQL's rule: an aliased table is named by its alias only
            raise QueryError(f"the table {name!r} is aliased as {aliased[0]!r} in this query: "
                             f"name its columns {aliased[0]}.column")
        raise QueryError(f"unknown table or alias {name!r} in a column reference; the "
                         f"query's tables are {list(self.aliases)}")

    def flat(self, alias: str, column: str) -> str:
        """The column's name in the joined rows: its own where no other table of the query
        has a column of that name, else ``alias.column``. A name starting with ``__`` (the
        curator's own, as ``UNIT_COLUMN``) or holding a dot is always qualified, so that
        a bare name is never an internal one nor another column's ``alias.column``; and no
        two columns ever share a flat name (DuckDB would bind the first: a data column
        read as the unit would cap each row as a person)."""
        clash = [a for a, t in self.aliases.items()
                 if a != alias and self.schema.table(t).has(column)]
        qualified = clash or column.startswith("__") or "." in column
        name = f"{alias}.{column}" if qualified else column
        owner = self.names.setdefault(name.lower(), (alias, column))
        if owner != (alias, column) or name.startswith("__"):
            # aliases starting with "__" are refused (_table_of): only an alias holding a
            # dot ("a.b" with column "c" against "a" with "b.c") can get here
            raise QueryError(f"the column {owner[1]!r} of {owner[0]!r} and the column "
                             f"{column!r} of {alias!r} would have the same name ({name!r}) "
                             "in the joined rows: give the tables aliases without dots")
        self.used[(alias, column)] = None
        return name


def _equalities(on: exp.Expression, columns: _Columns, joined: str, before: list[str]
                ) -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """ON as ((alias, column), (alias, column)) pairs, one side in ``joined`` and the other
    in a table of ``before`` (joined before it)."""
    terms: list[exp.Expression] = []
    stack = [on]
    while stack:
        node = stack.pop()
        if isinstance(node, exp.Paren):
            stack.append(node.this)
        elif isinstance(node, exp.And):
            stack += [node.this, node.expression]
        else:
            terms.append(node)
    pairs = []
    for term in terms:
        if not isinstance(term, exp.EQ) or not isinstance(term.this, exp.Column) or \
                not isinstance(term.expression, exp.Column):
            raise _unsupported("ON takes equalities of two columns joined with AND "
                               f"(equi-joins); got {term.sql()}; filter rows with WHERE")
        left = columns.resolve(term.this, "ON")
        right = columns.resolve(term.expression, "ON")
        refusal = join_key_refusal(
            *(columns.schema.table(columns.aliases[a]).type_of(c) for a, c in (left, right)))
        if refusal is not None:  # a cast could fail on a value, or match a row twice
            raise _unsupported(f"ON {term.sql()}: {refusal}")
        if left[0] == right[0]:
            raise _unsupported(f"ON {term.sql()} compares two columns of one table; filter "
                               "rows with WHERE")
        if right[0] == joined:
            left, right = right, left
        if left[0] != joined or right[0] not in before:
            raise _unsupported(f"ON {term.sql()} must compare a column of {joined!r} with a "
                               "column of a table joined before it")
        pairs.append((right, left))  # (earlier table's column, the joined table's column)
    return pairs


def _suggest(schema: Schema, aliases: dict[str, str], private_before: list[str],
             joined: str) -> str:
    """The join that would be accepted for ``joined``, for the refusal's message: on the
    unit's columns where both tables have one, else on a key of the paths, else along the
    path of the table farther from its unit."""
    table = aliases[joined]
    found = []
    for earlier in private_before:
        for column, key in schema.keyed_columns(aliases[earlier]):
            for mine, other in schema.keyed_columns(table):
                if key == other:
                    found.append((key != UNIT, f"JOIN {table} AS {joined} ON "
                                               f"{earlier}.{column} = {joined}.{mine}"))
    if found:
        return min(found)[1]
    longest = max([table, *(aliases[p] for p in private_before)],
                  key=lambda t: len(schema.path(t)))
    path = [link.target for link in schema.path(longest)]
    return (f"join {longest} along its path to the unit ({' -> '.join([longest, *path])}), "
            "on the declared keys")


def flatten(select: exp.Select, schema: Schema) -> tuple[exp.Select, JoinSource]:
    """Check the query's FROM and JOINs against the rules (module docstring) and return the
    query rewritten over the joined rows' flat column names, with its ``JoinSource``."""
    source = select.args.get("from_") or select.args.get("from")
    if source is None:
        raise _unsupported(f"the query needs FROM one of the tables {schema.names()}")
    if source.expressions:
        raise _unsupported("several tables in FROM are not supported: write JOIN ... ON")
    alias, table = _table_of(source.this, schema)
    aliases = {alias: table}
    joins = list(select.args.get("joins") or [])
    for join in joins:
        a, t = _table_of(join.this, schema)
        if a in aliases or a.lower() in {x.lower() for x in aliases}:
            raise QueryError(f"the table or alias {a!r} appears twice: give each table of "
                             "the join its own alias")
        aliases[a] = t
    columns = _Columns(schema, aliases)
    tables = [JoinedTable(alias, table, "from")]
    private = [alias] if schema.table(table).private else []
    for join in joins:
        kind = _join_kind(join)
        if join.args.get("using"):
            raise _unsupported("JOIN ... USING is not supported: write ON a.column = "
                               "b.column")
        joined, name = _table_of(join.this, schema)
        on = _equalities(join.args["on"], columns, joined, [t.alias for t in tables])
        if schema.table(name).private:
            if kind == "left" and not private:
                raise _unsupported(f"LEFT JOIN {name}: the kept side has no private table, "
                                   "so its unmatched rows belong to no one; write JOIN")
            equated = [(e, j) for e, j in on if e[0] in private and
                       schema.key_of(aliases[e[0]], e[1]) is not None and
                       schema.key_of(aliases[e[0]], e[1]) == schema.key_of(name, j[1])]
            if private and not equated:
                raise _unsupported(
                    f"the join of {name!r} with {', '.join(aliases[p] for p in private)} is "
                    "refused: its ON does not equate their privacy units, so an output row "
                    "could hold two people's rows. It is accepted on columns that lead to "
                    "the same unit through the declared paths: "
                    f"{_suggest(schema, aliases, private, joined)}")
            private.append(joined)
        tables.append(JoinedTable(joined, name, kind, tuple(on)))
    if not private:
        raise _unsupported("the query reads no private table: public tables hold no one's "
                           "data, so query them directly")
    tables, unit = _complete_paths(schema, tables, private)
    rewritten = _rewrite(select, columns, {t.alias for t in tables if t.kind == "left"})
    read = tuple(sorted((columns.flat(a, c), a, c) for a, c in columns.used))
    relation = ("add or remove one privacy unit with every row that reaches it, in every "
                f"table, through the declared paths ({schema.describe()})")
    return rewritten, JoinSource(tuple(tables), read, unit, relation)


def _complete_paths(schema: Schema, tables: list[JoinedTable], private: list[str]
                    ) -> tuple[list[JoinedTable], tuple[str, str]]:
    """Join each private table whose path to its unit is not in the query along that path
    (inner joins: a broken path drops the row), and say where the unit is read.

    A LEFT JOINed table's path is joined inside it (``JoinedTable.path``): its rows that
    reach no unit are dropped *before* its LEFT JOIN, so the kept side's unmatched rows stay
    (NULL-extended, as the query says) where inner joins after it would drop them. The unit
    is read from a table that is not LEFT JOINed, whose row every output row holds.

    A table's path is in the query when the table holds its unit itself, or when its path
    column is equated with a column of a table whose own path is in the query, standing for
    the same key (for the unit itself, of the same unit table), and that table's row cannot
    be missing where this table's is (it is not LEFT JOINed to it)."""
    aliases = {t.alias: t.table for t in tables}
    kind_of = {t.alias: t.kind for t in tables}
    out = list(tables)
    completed: set[str] = set()  # LEFT JOINed tables whose path is joined inside them

    def covered(alias: str, seen: frozenset[str]) -> bool:
        spec = schema.table(aliases[alias])
        if spec.unit is not None or alias in completed:
            return True
        link = spec.link
        assert link is not None
        key = schema.key_of(spec.name, link.column)
        for t in out:
            for ends in t.on:
                for (x, xc), (y, yc) in (ends, ends[::-1]):
                    if x != alias or xc != link.column or y in seen:
                        continue
                    if not schema.table(aliases[y]).private or \
                            schema.key_of(aliases[y], yc) != key:
                        continue
                    if key == UNIT and schema.root(aliases[y]).name != \
                            schema.root(spec.name).name:
                        continue
                    if t.alias == y and kind_of[y] == "left":
                        continue  # y LEFT JOINed to this table: its row may be missing
                    if covered(y, seen | {alias}):
                        return True
        return False

    extra = 0
    # the tables nearest their unit first: a path completed for one (orders -> customer)
    # then covers those joined to it on their path's key (lineitem ON l_orderkey =
    # o_orderkey), which need no path of their own (one join of a large table fewer)
    for alias in sorted(private, key=lambda a: len(schema.path(aliases[a]))):
        if covered(alias, frozenset()):
            continue
        current, path = alias, []
        for link in schema.path(aliases[alias]):
            extra += 1
            target = f"__path{extra}"
            aliases[target] = link.target
            kind_of[target] = "inner"
            path.append(JoinedTable(target, link.target, "inner",
                                    (((current, link.column), (target, link.target_column)),)))
            current = target
        if kind_of[alias] == "left":  # inside it: its unmatched kept rows stay
            at = next(i for i, t in enumerate(out) if t.alias == alias)
            out[at] = replace(out[at], path=tuple(path))
            completed.add(alias)
        else:
            out += path
    roots = [t for t in out if schema.table(t.table).private and
             schema.table(t.table).unit is not None and t.kind != "left"]
    if not roots:  # every private table is LEFT JOINed to a public one: refused before
        raise InternalError("a joined query without a table holding its unit; a bug")
    anchor = roots[0]
    spec = schema.table(anchor.table)
    assert spec.unit is not None
    return out, (anchor.alias, spec.unit)


def _rewrite(select: exp.Select, columns: _Columns, left: set[str]) -> exp.Select:
    """The query over the flat columns: FROM the joined rows, each column by its flat name
    (a bare column item keeps its own name as its alias); COUNT(DISTINCT c) of a column
    holding the unit counts the unit, unless c's table is LEFT JOINed (``left``): its
    unmatched rows hold NULL there, yet carry a unit, so that is refused."""
    out = select.copy()
    out.set("joins", None)
    out.set("from_", exp.From(this=exp.to_table("__joined")))

    def fix(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Count) and isinstance(node.this, exp.Distinct):
            cols = node.this.expressions
            if len(cols) == 1 and isinstance(cols[0], exp.Column):
                alias, column = columns.resolve(cols[0], "COUNT(DISTINCT ...)")
                table = columns.aliases[alias]
                if columns.schema.key_of(table, column) == UNIT and alias in left:
                    raise _unsupported(_null_extended(columns, alias, column, left))
                if columns.schema.key_of(table, column) == UNIT:
                    unit = exp.column(UNIT_COLUMN)
                    unit.meta["dp_unit"] = True
                    return exp.Count(this=exp.Distinct(expressions=[unit]))
                raise _unsupported("COUNT(DISTINCT ...) is supported only for a column "
                                   "holding the privacy unit (a private table's unit "
                                   "column, or a path column pointing at one)")
        if isinstance(node, exp.Column) and not node.meta.get("dp_unit"):
            alias, column = columns.resolve(node, "the query")
            return exp.Column(this=exp.to_identifier(columns.flat(alias, column),
                                                     quoted=True))
        return node

    items = []
    for item in out.expressions:
        if isinstance(item, exp.Column):
            item = exp.Alias(this=item, alias=exp.to_identifier(item.name))
        items.append(item)
    out.set("expressions", items)
    names = {item.alias for item in items if isinstance(item, exp.Alias)}

    def fix_group(node: exp.Expression) -> exp.Expression:
        # GROUP BY an output's alias, as on one table (``GROUP BY band`` after ``CASE ...
        # END AS band``): a bare name no table has, kept for the query's own parser (it was
        # refused as an unknown column over joins: a bug hunt); a column's name goes first,
        # as in SQL
        if isinstance(node, exp.Column) and not node.table and node.name in names and \
                not any(columns.schema.table(t).has(node.name)
                        for t in columns.aliases.values()):
            return node
        return fix(node)

    for part in ("expressions", "where", "group"):
        value = out.args.get(part)
        if value is None:
            continue
        how = fix_group if part == "group" else fix
        if isinstance(value, list):
            out.set(part, [v.transform(how, copy=False) for v in value])
        else:
            out.set(part, value.transform(how, copy=False))
    return out


def _null_extended(columns: _Columns, alias: str, column: str, left: set[str]) -> str:
    """The refusal of COUNT(DISTINCT alias.column) where ``alias`` is LEFT JOINed, with the
    query counting the same units (a unit column of a table that is not)."""
    kept = [f"{a}.{c}" for a, t in columns.aliases.items() if a not in left and
            not a.startswith("__") for c, key in columns.schema.keyed_columns(t) if key == UNIT]
    count = f"COUNT(DISTINCT {kept[0]})" if kept else \
        "COUNT(DISTINCT ...) of a unit column of a table that is not LEFT JOINed"
    return (f"COUNT(DISTINCT {alias}.{column}) is refused: {alias} is LEFT JOINed, so its "
            "unmatched rows hold NULL there but still belong to a unit, and the count of "
            f"units would count them. Count the units with a match as {count} with WHERE "
            f"{alias}.{column} IS NOT NULL (in a query of its own if other aggregates need "
            "the unmatched rows)")


def flatten_plan(plan: Any, schema: Schema) -> Any:
    """A builder's plan over a schema (``Plan.tables``, its FROM clause) as DP SQL's: the
    join checked by the same rules, every column (aggregates', group keys', WHERE's) named
    as the joined rows name it, ``source`` set. The plan is written as a SELECT of its
    columns and expressions, flattened, and read back."""
    import sqlglot
    from sqlglot.errors import ParseError, TokenError

    from dpcurator.query import expressions as ex

    try:
        select = sqlglot.parse_one(f"SELECT 1 FROM {plan.tables}", dialect=ex.DIALECT)
    except (ParseError, TokenError):
        raise QueryError(f"the query's tables ({plan.tables}) could not be parsed as a FROM "
                         "clause: write from_('table') and join('table', on='a.x = b.y')"
                         ) from None
    if not isinstance(select, exp.Select):
        raise _unsupported("the query's tables must be a FROM clause")
    items: list[exp.Expression] = []
    columns = [a.column for a in plan.aggregates if getattr(a, "column", None) is not None]
    for i, column in enumerate(columns):
        # the name whole: a column of that very name, else "alias.column" (_Columns.resolve)
        items.append(exp.Alias(this=exp.column(exp.to_identifier(column, quoted=True)),
                               alias=exp.to_identifier(f"c{i}")))
    for i, key in enumerate(plan.group_by):
        items.append(exp.Alias(this=ex.tree_of(key.expression),
                               alias=exp.to_identifier(f"k{i}")))
    select.set("expressions", items or [exp.Literal.number(1)])
    if plan.where is not None:
        select.set("where", exp.Where(this=ex.tree_of(plan.where)))
    flat, source = flatten(select, schema)
    flat_items = flat.expressions
    renamed = dict(zip(columns, (i.this.name for i in flat_items[:len(columns)]),
                       strict=True))
    aggregates = tuple(
        type(a)(**{**{f: getattr(a, f) for f in a.__dataclass_fields__ if
                      a.__dataclass_fields__[f].init}, "column": renamed[a.column],
                   "name": a.name})
        if getattr(a, "column", None) is not None else a for a in plan.aggregates)
    # the keys' items follow the columns' (none, and no placeholder, without keys)
    keyed = flat_items[len(columns):len(columns) + len(plan.group_by)]
    group = tuple(type(k)(k.name, ex.Sql(item.this), k.labels)
                  for k, item in zip(plan.group_by, keyed, strict=True))
    where = flat.args.get("where")
    return plan.replace(aggregates=aggregates, group_by=group,
                        where=ex.Sql(where.this) if where is not None else None,
                        source=source, tables=None)


def rekey(given: Mapping[str, V], source: JoinSource, schema: Schema, what: str
          ) -> dict[str, V]:
    """Options keyed by column (bounds, ``max_unit_sums``, columns to choose bounds for) as
    the joined rows name their columns.

    A key names a column as ``alias.column`` (an alias of this query), ``table.column`` (every
    alias of that table) or ``column`` (every table's column of that name); for each column
    the query reads, the most specific key given wins, so ``{"amount": ..., "refunds.amount":
    ...}`` bounds ``refunds.amount`` by the second and every other ``amount`` by the first.
    Names match case-insensitively. A key naming a column of the schema that this query does
    not read is left out; one naming no column at all is an ``UnknownColumnError``."""
    aliases = {t.alias: t.table for t in source.tables}
    lowered: dict[str, V] = {}
    for name, value in given.items():
        key = str(name).lower()
        if key in lowered:
            raise QueryError(f"{what} names the column {name!r} twice (column names are "
                             "case-insensitive)")
        _check_key(str(name), aliases, schema, what)
        lowered[key] = value
    out: dict[str, V] = {}
    for flat, alias, column in source.columns:
        for name in (f"{alias}.{column}", f"{aliases[alias]}.{column}", column):
            if name.lower() in lowered:
                out[flat] = lowered[name.lower()]
                break
    return out


def rekey_auto(auto: Any, source: JoinSource, schema: Schema, what: str) -> Any:
    """An ``AutoBounds`` with the columns it chooses bounds for named as the joined rows
    name them (``rekey``)."""
    if auto is None or not auto.columns:
        return auto
    return replace(auto, columns=tuple(rekey(dict.fromkeys(auto.columns), source, schema,
                                             what)))


def _check_key(name: str, aliases: Mapping[str, str], schema: Schema, what: str) -> None:
    if any(t.has(name) for t in schema.tables):
        return
    prefix, dot, column = name.partition(".")
    if dot:
        folded_aliases = {a.lower(): t for a, t in aliases.items()}
        table = folded_aliases.get(prefix.lower())
        if table is None and any(t.lower() == prefix.lower() for t in schema.names()):
            table = schema.table(prefix).name
        if table is not None:
            if schema.table(table).has(column):
                return
            raise UnknownColumnError(f"{what} names the column {name!r}, which the table "
                                     f"{table!r} does not have; its columns are "
                                     f"{list(schema.table(table).column_names())}")
    shown = [f"{a}.{c}" if a == t else f"{a}.{c} ({t}.{c})"
             for a, t in aliases.items() if not a.startswith("__")
             for c in schema.table(t).column_names()]
    raise UnknownColumnError(f"{what} names the column {name!r}, which no table of the schema "
                             f"has; name a column as column, table.column or alias.column: "
                             f"{', '.join(shown[:40])}{' ...' if len(shown) > 40 else ''}")
