"""A schema of several tables: which are private, and how each private row reaches its unit.

A private table holds the privacy unit in a column of its own (``customer``: ``"c_custkey"``)
or reaches it through a foreign key to another private table (``orders``:
``"o_custkey -> customer.c_custkey"``; ``lineitem``: ``"l_orderkey -> orders.o_orderkey"``).
Public tables (``nation``, ``region``) hold no one's data. Every table of the data is declared
one or the other, and the declaration is checked here against the tables' columns: unknown
tables, a column a table does not have, a path through a public table, a table declared both
ways, and a cycle of paths are each refused with the table and column named.

The neighbouring relation a schema states: two databases are neighbours when one is the
other with one unit added or removed *together with every row that reaches it* through the
declared paths, in every table; both satisfy the declared keys (a path's target column is
unique in its table, which the data owner's check verifies when the curator is made). A row
whose path is broken (an order whose customer is not in ``customer``) reaches no unit: it is
counted at creation and excluded from every answer.

``key_of`` gives what joins are judged by (``dpcurator.query.joins``): the *key* a column
stands for along the paths. Two rows whose columns stand for the same key and hold equal
values belong to the same unit: ``UNIT`` for a column holding the unit itself (its own unit
column, or a path column that points at one), or ``(table, column)`` for a path's target
(the unique key of the table a path passes through) and for every path column that points at
it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dpcurator.query.errors import QueryError, UnknownColumnError

__all__ = ["UNIT", "ColumnKind", "Link", "Schema", "TableSpec", "column_kind", "declare",
           "folded"]

UNIT = ("", "")  # the key of a column that holds the privacy unit itself


ColumnKind = str  # "numeric", "text", "temporal", "boolean" or "other"


def folded(name: str, names: Iterable[str]) -> str | None:
    """``name`` as ``names`` spell it: itself, or the one name equal to it but for case (as
    DuckDB matches identifiers); None when there is none, or several."""
    names = list(names)
    if name in names:
        return name
    matches = [n for n in names if n.lower() == name.lower()]
    return matches[0] if len(matches) == 1 else None


#: The kinds' type names, matched whole on the base name (``_base_name``): a prefix would
#: read INTERVAL as INT and INTEGER[] as INTEGER (a bug hunt: SUM of an INTERVAL column was
#: charged and answered 0)
_KINDS: dict[str, ColumnKind] = {
    **dict.fromkeys(("TINYINT", "SMALLINT", "INTEGER", "INT", "BIGINT", "HUGEINT", "UTINYINT",
                     "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT", "INT1", "INT2", "INT4",
                     "INT8", "INT128", "SIGNED", "SHORT", "LONG", "FLOAT", "FLOAT4", "FLOAT8",
                     "DOUBLE", "DOUBLE PRECISION", "REAL", "DECIMAL", "NUMERIC"), "numeric"),
    **dict.fromkeys(("VARCHAR", "TEXT", "STRING", "CHAR", "CHARACTER", "CHARACTER VARYING",
                     "BPCHAR", "NAME"), "text"),
    **dict.fromkeys(("DATE", "TIME", "TIMETZ", "TIME WITH TIME ZONE", "TIME WITHOUT TIME ZONE",
                     "TIMESTAMP", "TIMESTAMPTZ", "TIMESTAMP WITH TIME ZONE",
                     "TIMESTAMP WITHOUT TIME ZONE", "TIMESTAMP_S", "TIMESTAMP_MS",
                     "TIMESTAMP_US", "TIMESTAMP_NS", "TIMESTAMP_NTZ", "DATETIME", "INTERVAL"),
                    "temporal"),
    **dict.fromkeys(("BOOLEAN", "BOOL", "LOGICAL"), "boolean"),
}


#: Integer types whose values compare exactly with one another's on every engine (a wider
#: integer holds each; DuckDB compares BIGINT with UBIGINT as HUGEINT)
_JOIN_INTEGERS = {"TINYINT", "SMALLINT", "INTEGER", "INT", "INT2", "INT4", "INT8", "BIGINT",
                  "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "LONG", "SHORT", "BYTE"}
_JOIN_TEXT = {"VARCHAR", "TEXT", "STRING", "CHARACTERVARYING"}  # (PostgreSQL's spelling)
#: Never a join key: floating point (-0.0 equals 0.0; an integer key compared as a double
#: meets two of them at 2^53), intervals, nested values
_NOT_KEYS = ("FLOAT", "DOUBLE", "REAL", "INTERVAL", "STRUCT", "MAP", "LIST", "ARRAY", "UNION",
             "JSON", "VARIANT")


def join_key_class(sql_type: str) -> str | None:
    """The class of types a join key of this type may be equated with (None: never a key).

    Two columns are joined only within one class: integer types together, text types
    together, any other type only with itself (a DECIMAL(p, s) with the same p and s, DATE
    with DATE, ...). Across classes the engine casts to a common type, which can fail on one
    value after the charge (DuckDB: DECIMAL(38, 0) = DECIMAL(38, 10) on 10^30) or make one
    row equal to two keys (a DOUBLE against BIGINT keys 2^53 and 2^53 + 1: one order reached
    two customers and counted twice; a bug hunt)."""
    upper = "".join(sql_type.upper().split())
    base = upper.split("(")[0]
    if base in _JOIN_INTEGERS:
        return "integer"
    if base in _JOIN_TEXT:
        return "text"
    if base.startswith(_NOT_KEYS) or "[" in upper:
        return None
    return upper


def join_key_refusal(left: str, right: str) -> str | None:
    """Why columns of these two types cannot be equated in a join, or None."""
    classes = (join_key_class(left), join_key_class(right))
    if None in classes:
        bad = left if classes[0] is None else right
        return (f"a column of type {bad} cannot be a join key (floating point, intervals and "
                "nested values do not compare exactly)")
    if classes[0] != classes[1]:
        return (f"a {left} column cannot be equated with a {right} one: join keys must be of "
                "the same type (integers of any width together, text together), else the "
                "engine's conversion could fail on a value, or match one row to two keys")
    return None


def column_kind(sql_type: str) -> ColumnKind:
    """A coarse kind for a SQL type name (DuckDB, PostgreSQL or Spark spelling), by its base
    name whole (``DECIMAL(18,3)``: DECIMAL); an array, list, struct, map or union is
    "other", whatever its elements (``INTEGER[]``, ``ARRAY<INT>``, ``STRUCT(a INTEGER)``)."""
    upper = " ".join(sql_type.upper().split())
    if "[" in upper or "<" in upper:  # DuckDB's and PostgreSQL's arrays, Spark's nested types
        return "other"
    base = " ".join(re.sub(r"\([^()]*\)", " ", upper).split())  # the parameters left out
    if base.startswith("INTERVAL "):  # Spark's INTERVAL DAY TO SECOND, YEAR TO MONTH
        return "temporal"
    return _KINDS.get(base, "other")


@dataclass(frozen=True, slots=True)
class Link:
    """A foreign key on a path to the unit: ``table.column -> target.target_column``."""

    table: str
    column: str
    target: str
    target_column: str

    def __str__(self) -> str:
        return f"{self.table}.{self.column} -> {self.target}.{self.target_column}"


@dataclass(frozen=True, slots=True)
class TableSpec:
    """One table: public, or private with its own ``unit`` column or a ``link`` up a path."""

    name: str
    columns: tuple[tuple[str, str], ...]  # (column, SQL type), in table order
    private: bool
    unit: str | None = None
    link: Link | None = None

    def column_names(self) -> tuple[str, ...]:
        return tuple(c for c, _ in self.columns)

    def column(self, name: str, what: str) -> str:
        """The column as the table spells it (names match case-insensitively, as DuckDB's)."""
        names = self.column_names()
        found = folded(name, names)
        if found is not None:
            return found
        raise UnknownColumnError(f"{what} names the column {name!r}, which the table "
                                 f"{self.name!r} does not have; its columns are {list(names)}")

    def type_of(self, column: str) -> str:
        return dict(self.columns)[self.column(column, "a join")]

    def has(self, name: str) -> bool:
        return any(c.lower() == name.lower() for c in self.column_names())


@dataclass(frozen=True)
class Schema:
    """The declared tables (``declare`` builds and checks one)."""

    tables: tuple[TableSpec, ...]

    def table(self, name: str) -> TableSpec:
        found = folded(name, self.names())
        if found is not None:
            return next(t for t in self.tables if t.name == found)
        raise QueryError(f"unknown table {name!r}: the schema's tables are {self.names()}")

    def names(self) -> list[str]:
        return [t.name for t in self.tables]

    @property
    def private(self) -> tuple[TableSpec, ...]:
        return tuple(t for t in self.tables if t.private)

    def path(self, name: str) -> tuple[Link, ...]:
        """The links from ``name``'s rows up to the table holding their unit (empty for a
        table with its own unit column)."""
        links: list[Link] = []
        spec = self.table(name)
        while spec.link is not None:
            links.append(spec.link)
            spec = self.table(spec.link.target)
        return tuple(links)

    def root(self, name: str) -> TableSpec:
        """The table at the end of ``name``'s path (it holds the unit in a column)."""
        path = self.path(name)
        return self.table(path[-1].target) if path else self.table(name)

    def targets(self) -> tuple[tuple[str, str], ...]:
        """Every path's target (table, column): each must be unique in its table."""
        return tuple(dict.fromkeys((t.link.target, t.link.target_column)
                                   for t in self.tables if t.link is not None))

    def key_of(self, table: str, column: str) -> tuple[str, str] | None:
        """The key a private table's column stands for (module docstring), or None."""
        spec = self.table(table)
        if not spec.private:
            return None
        if spec.unit is not None and column == spec.unit:
            return UNIT
        if spec.link is not None and column == spec.link.column:
            return self.key_of(spec.link.target, spec.link.target_column)
        if (spec.name, column) in self.targets():
            return (spec.name, column)
        return None

    def keyed_columns(self, table: str) -> list[tuple[str, tuple[str, str]]]:
        """The columns of a private table that stand for a key, with their keys."""
        spec = self.table(table)
        out = []
        for column in spec.column_names():
            key = self.key_of(spec.name, column)
            if key is not None:
                out.append((column, key))
        return out

    def describe(self) -> str:
        """The declaration, one table a line (what a release and an error quote)."""
        lines = []
        for t in self.tables:
            if not t.private:
                lines.append(f"{t.name}: public")
            elif t.unit is not None:
                lines.append(f"{t.name}: private, unit {t.name}.{t.unit}")
            else:
                lines.append(f"{t.name}: private, {t.link}")
        return "; ".join(lines)


def _parse_link(table: str, text: str) -> tuple[str, str, str] | None:
    """"col -> target.col2" as (col, target, col2); a plain column name as None."""
    if "->" not in text:
        return None
    left, _, right = text.partition("->")
    column, target = left.strip(), right.strip()
    if "." in column:  # "orders.o_custkey -> ..." names its own table: allowed
        owner, _, column = column.partition(".")
        if owner.strip().lower() != table.lower():
            raise QueryError(f"privacy_unit[{table!r}] = {text!r}: the path must start "
                             f"from a column of {table!r}, not of {owner.strip()!r}")
        column = column.strip()
    target_table, dot, target_column = target.partition(".")
    if not column or not dot or not target_table.strip() or not target_column.strip() or \
            "->" in target_column:
        raise QueryError(f"privacy_unit[{table!r}] = {text!r}: write a path as "
                         "'column -> table.column' (one link a table; the target table "
                         "declares its own)")
    return column, target_table.strip(), target_column.strip()


def declare(columns: Mapping[str, Mapping[str, str]], privacy_unit: Any,
            public: Iterable[str] = ()) -> Schema:
    """Check a declaration against the tables' columns and return the ``Schema``.

    ``columns``: each table's columns and types (the schema is public); ``privacy_unit``:
    ``{table: "unit_column" | "column -> table.column"}`` for every private table;
    ``public``: the public tables. Raises QueryError naming what is wrong.
    """
    if not isinstance(privacy_unit, Mapping) or not privacy_unit:
        raise QueryError("with several tables, privacy_unit maps each private table to its "
                         "unit column or its path, e.g. {'customer': 'c_custkey', "
                         "'orders': 'o_custkey -> customer.c_custkey'}")
    if isinstance(public, str):
        raise QueryError("public must be a list of table names, got a string")
    names = list(columns)

    def known(name: Any, what: str) -> str:
        if not isinstance(name, str):
            raise QueryError(f"{what} must name a table, got {name!r}")
        found = folded(name, names)
        if found is not None:
            return found
        raise QueryError(f"{what} names the table {name!r}, which the data does not have; "
                         f"its tables are {names}")

    public_names = [known(p, "public") for p in public]
    private_specs: dict[str, tuple[str | None, tuple[str, str, str] | None]] = {}
    for table, text in privacy_unit.items():
        name = known(table, "privacy_unit")
        if name in private_specs:  # the last spelling won before, silently (a bug hunt)
            raise QueryError(f"privacy_unit declares the table {name!r} twice (as {table!r} "
                             "and another spelling); declare each table once")
        if not isinstance(text, str) or not text.strip():
            raise QueryError(f"privacy_unit[{table!r}] must be the table's unit column or a "
                             f"path 'column -> table.column', got {text!r}")
        if name in public_names:
            raise QueryError(f"the table {name!r} is declared both public and private "
                             f"(privacy_unit[{table!r}]); a table is one or the other")
        link = _parse_link(name, text)
        private_specs[name] = (None, link) if link else (text.strip(), None)
    undeclared = [n for n in names if n not in private_specs and n not in public_names]
    if undeclared:
        raise QueryError(f"the table(s) {undeclared} are declared neither private "
                         "(privacy_unit) nor public (public=[...]): declare each table")
    specs: dict[str, TableSpec] = {}
    for name in names:
        cols = tuple((str(c), str(t)) for c, t in columns[name].items())
        if name in public_names:
            specs[name] = TableSpec(name, cols, private=False)
            continue
        unit, raw = private_specs[name]
        probe = TableSpec(name, cols, private=True)
        if raw is None:
            assert unit is not None
            specs[name] = TableSpec(name, cols, True,
                                    unit=probe.column(unit, f"privacy_unit[{name!r}]"))
            continue
        column, target, target_column = raw
        target = known(target, f"the path of {name!r}")
        del raw
        if target in public_names:
            raise QueryError(f"the path {name}.{column} -> {target}.{target_column} leads "
                             f"through {target!r}, which is declared public: a path reaches "
                             "the privacy unit through private tables only")
        target_spec = TableSpec(target, tuple((str(c), str(t))
                                              for c, t in columns[target].items()), True)
        declared = Link(name, probe.column(column, f"the path of {name!r}"), target,
                        target_spec.column(target_column, f"the path of {name!r}"))
        refusal = join_key_refusal(probe.type_of(declared.column),
                                   target_spec.type_of(declared.target_column))
        if refusal is not None:
            raise QueryError(f"the path {declared} cannot join its columns: {refusal}")
        specs[name] = TableSpec(name, cols, True, link=declared)
    schema = Schema(tuple(specs[n] for n in names))
    for spec in schema.private:  # a cycle never reaches a unit column
        seen = [spec.name]
        current = spec
        while current.link is not None:
            current = schema.table(current.link.target)
            if current.name in seen:
                loop = " -> ".join([*seen[seen.index(current.name):], current.name])
                raise QueryError(f"the paths {loop} form a cycle: some table on a path must "
                                 "hold the privacy unit in a column of its own")
            seen.append(current.name)
    if not schema.private:
        raise QueryError("no table is private: declare the tables holding people's data "
                         "in privacy_unit")
    return schema
