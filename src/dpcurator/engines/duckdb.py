"""DuckDB, the embedded default engine: the bounding statement of ``_sql``, in DuckDB's SQL.

Files are scanned in place (``read_csv`` / ``read_parquet``); pandas, Polars and Arrow tables
are registered without copying; a table of an existing connection is queried where it is.

The dialect: user expressions are made total by the shared rule table (``_total``: the
failing operation is NULL), each operation that can raise under a ``TRY`` of its own, casts
as ``TRY_CAST``; sums of BIGINT are HUGEINT (exact); text is hashed through ``md5_number``. No
statement can fail because of a value in the data: fixed-point values cannot overflow by
construction, divisions have non-zero divisors, and a CSV file, whose column types DuckDB
infers from its first rows, and a DataFrame, whose ``object`` columns' types DuckDB infers
from a sample of their rows, are read in full once when the curator is made
(``check_source``), so that no later row can fail a query. The hash coefficients derived
from the per-query secret key are bound parameters (``$dp_key_...``), never part of the SQL
text.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
from sqlglot import exp

from dpcurator.engines import _total
from dpcurator.engines._dialect import Dialect
from dpcurator.engines._duckdb_csv import check_csv
from dpcurator.engines._engine import SqlEngine
from dpcurator.engines._hash import WORD_BITS
from dpcurator.engines._joins import TableSet
from dpcurator.engines._results import CompiledQuery
from dpcurator.engines._trees import band, cast, num, shr
from dpcurator.errors import UserError
from dpcurator.query.bounding import BoundedQuery

__all__ = ["DuckDBDialect", "DuckDBEngine"]

_ids = itertools.count()


def quote(name: str) -> str:
    """A DuckDB identifier, always quoted."""
    return '"' + name.replace('"', '""') + '"'


def _string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _try(t: _total.Total, node: exp.Expr) -> exp.Expr:
    """TRY around one operation (its arguments are total already): NULL where it raises."""
    return exp.Try(this=node)


def _negate(t: _total.Total, node: exp.Expr) -> exp.Expr:
    return node if isinstance(node.this, exp.Literal) else exp.Try(this=node)


def _under_try(node: exp.Expr) -> exp.Expr:
    return exp.Try(this=node)


# A value of each temporal type, for checking a date part or unit once (``_known_part``)
_SAMPLES = {"DATE": "2000-01-01", "TIME": "12:00:00", "TIME WITH TIME ZONE": "12:00:00",
            "TIMETZ": "12:00:00", "INTERVAL": "1 day"}


def _known_part(t: _total.Total, node: exp.Expr) -> exp.Expr:
    """extract, date_trunc: a literal part or unit (``_total.literal_part``) that DuckDB
    knows for the value's type, checked once on a constant of that type before the charge.
    DuckDB refuses an unknown one when it binds the query, but its error names the
    conversion only, which read as the query not fitting the column types (a bug hunt)."""
    _total.literal_part(t, node)
    extract = isinstance(node, exp.Extract)
    key = "expression" if extract else "this"
    part, value = (node.this if extract else node.args.get("unit")), node.args.get(key)
    if t.evaluates is None or t.type_of is None or not isinstance(part, exp.Expr) or \
            not isinstance(value, exp.Expr):
        return node
    type_name = t.type_of([value])[0]
    base = " ".join(type_name.split("(")[0].upper().split())
    sample = "2000-01-01" if base.startswith("TIMESTAMP") else _SAMPLES.get(base)
    if sample is None:
        return node  # not a date, time or interval: the engine's binder refuses it
    try:
        constant = exp.Cast(this=exp.Literal.string(sample),
                            to=exp.DataType.build(type_name, dialect="duckdb", udt=True))
    except Exception:
        return node
    probe = node.copy()
    probe.set(key, constant)
    if t.evaluates(constant) and not t.evaluates(probe):
        what = "EXTRACT's date part" if extract else "date_trunc's unit"
        raise UserError(f"{what} {part.name.lower()!r} is not one DuckDB knows for a "
                        f"{type_name} value (for example year, quarter, month, week, day, "
                        "hour, minute or second)")
    return node


# DuckDB's entries of the rule table (engines._total): an operation that can raise (integer
# overflow of + - * - abs //, a decimal's ceil, floor or round, a malformed regular
# expression) runs under a TRY of its own; casts are TRY_CAST; doubles are IEEE natively;
# a comparison, CASE, COALESCE... whose operands DuckDB would cast to a common type where the
# cast could fail on a value, and a function whose number arguments it would convert so, run
# under TRY (``_total.implicit_casts``: decided from the operands' types, so that a plain
# ``x = 15`` or ``t >= '2024-01-01'`` costs nothing more); conditions are BOOLEANs.
RULES: _total.Rules = {
    **_total.RULES,
    exp.Add: _try, exp.Sub: _try, exp.Mul: _try, exp.Neg: _negate, exp.Abs: _try,
    exp.IntDiv: _try, exp.Ceil: _try, exp.Floor: _try, exp.Round: _try,
    exp.Like: _total.keep, exp.ILike: _total.keep, exp.RegexpLike: _try,
    exp.Cast: _total.cast_by_type_name("VARCHAR"),  # DuckDB reads '1.5', '0x10' as integers
    **dict.fromkeys((exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ,
                     exp.NullSafeNEQ, exp.In, exp.Between, exp.Nullif, exp.Coalesce,
                     exp.Greatest, exp.Least, exp.Case, exp.If, exp.And, exp.Or, exp.Not,
                     exp.Xor, exp.Is), _total.implicit_casts(_under_try)),
    exp.Mod: _total.number_arguments(_under_try, _total.RULES[exp.Mod]),
    exp.Substring: _total.number_arguments(_under_try, _total.RULES[exp.Substring]),
    **dict.fromkeys((exp.Exp, exp.Interval), _total.number_arguments(_under_try)),
    exp.Left: _total.number_arguments(_under_try, _total.RULES[exp.Left]),
    exp.Right: _total.number_arguments(_under_try, _total.RULES[exp.Right]),
    **dict.fromkeys((exp.Extract, exp.DateTrunc, exp.TimestampTrunc), _known_part),
}

class DuckDBDialect(Dialect):
    """DuckDB's primitives: TRY per operation, TRY_CAST, isnan, ROUND, HUGEINT sums,
    md5_number. ``type_of`` and ``evaluates`` are the engine's (the types of expressions
    over its relation, and whether a constant evaluates): without them, every operand whose
    type the rules would ask runs under TRY."""

    sqlglot = "duckdb"
    inline_keys = True

    def __init__(self, type_of: _total.TypeOf | None = None,
                 evaluates: _total.Evaluates | None = None) -> None:
        self.type_of = type_of
        self.evaluates = evaluates
        self._totals = _total.Cache()

    def total(self, text: str) -> exp.Expr:
        return self._totals.get(text, lambda t: _total.total(t, RULES, "DuckDB", self.type_of,
                                                             self.evaluates))

    def condition(self, text: str) -> exp.Expr:
        return _total.as_condition(_total.Total(RULES, "DuckDB", self.type_of,
                                                self.evaluates), self.total(text))

    def epoch_microseconds(self, node: exp.Expr) -> exp.Expr:
        return exp.Anonymous(this="epoch_us", expressions=[node])

    def digest(self, node: exp.Expr) -> exp.Expr:
        return exp.Anonymous(this="md5_number", expressions=[node])  # 16 bytes, little-endian

    def digest_words(self, node: exp.Expr) -> list[exp.Expr]:
        mask = num(2**WORD_BITS - 1)
        return [cast(band(node, mask), "BIGINT"),
                cast(band(shr(node.copy(), WORD_BITS), mask.copy()), "BIGINT")]


DIALECT = DuckDBDialect()


class DuckDBEngine(SqlEngine):
    """Runs bounded queries on one DuckDB relation (a file, a DataFrame or a table)."""

    name = "duckdb"
    title = "DuckDB"
    dialect = DIALECT

    def __init__(self, connection: duckdb.DuckDBPyConnection, relation: str, *,
                 label: str, owns_connection: bool = False, threads: int | None = None) -> None:
        super().__init__()
        self._con = connection
        self._relation = relation
        self.label = label
        self._owns = owns_connection
        self._columns: dict[str, str] | None = None
        self._types: dict[str, str] = {}
        self.dialect = DuckDBDialect(self.type_of, self.evaluates)
        self._csv: str | None = None  # a CSV path or glob: types inferred from a sample
        self._typed: frozenset[str] = frozenset()  # columns whose values cannot fail to read
        if threads is not None and owns_connection:
            self._con.execute(f"SET threads={int(threads)}")

    # -- constructors ----------------------------------------------------------------------

    @classmethod
    def from_path(cls, path: str | os.PathLike[str], *, threads: int | None = None
                  ) -> DuckDBEngine:
        """A CSV or Parquet file (or glob), scanned in place at every query."""
        return cls._on_path(duckdb.connect(), path, owns=True, threads=threads)

    @classmethod
    def _on_path(cls, con: duckdb.DuckDBPyConnection, path: str | os.PathLike[str], *,
                 owns: bool, threads: int | None = None, label: str | None = None
                 ) -> DuckDBEngine:
        text = os.fspath(path)
        suffix = Path(text).suffix.lower()
        if "*" not in text and not Path(text).exists():
            raise UserError(f"data file not found: {text}")
        if suffix in (".parquet", ".pq"):
            reader = "read_parquet"
        elif suffix in (".csv", ".tsv", ".txt", ".gz"):
            reader = "read_csv"
        else:
            raise UserError(f"unknown file type {suffix!r}: give a .csv or .parquet file")
        engine = cls(con, f"{reader}({_string(text)})", label=label or text,
                     owns_connection=owns, threads=threads)
        if reader == "read_csv":
            engine._csv = text
        return engine

    @classmethod
    def tables(cls, sources: Mapping[str, Any], *, connection: Any = None,
               threads: int | None = None) -> TableSet:
        """A schema's tables on one connection: CSV or Parquet paths, DataFrames or Arrow
        tables (registered without copying), or, with ``connection``, the names of its
        tables or views."""
        owns = connection is None
        con = duckdb.connect() if owns else connection
        if threads is not None and owns:
            con.execute(f"SET threads={int(threads)}")
        engines: dict[str, SqlEngine] = {}
        for name, data in sources.items():
            if not owns:
                if not isinstance(data, str) or not data:
                    raise UserError(f"table {name!r}: with a DuckDB connection, give the name "
                                    "of its table or view")
                relation = ".".join(quote(part) for part in data.split("."))
                engine = cls(con, relation, label=data)
            elif isinstance(data, str | os.PathLike):
                engine = cls._on_path(con, data, owns=False, label=str(name))
            elif _is_table_like(data):
                registered = f"__dpcurator_source_{next(_ids)}"
                _register(con, registered, data, str(name))
                engine = cls(con, quote(registered), label=str(name))
                engine._typed = _typed_columns(data)
            else:
                raise UserError(f"table {name!r}: cannot read data of type "
                                f"{type(data).__name__} on DuckDB: give a CSV or Parquet "
                                "path, or a pandas or Polars DataFrame or an Arrow table")
            if engines:
                engine._lock = next(iter(engines.values()))._lock
            engines[str(name)] = engine
        if owns and engines:
            first = next(iter(engines.values()))
            assert isinstance(first, DuckDBEngine)
            first._owns = True  # closes the connection, once
        return TableSet(engines, "DuckDB")

    def _reset_derived(self) -> None:
        self._columns = None
        self._types = {}
        self.dialect = DuckDBDialect(self.type_of, self.evaluates)
        self._csv = None
        self._typed = frozenset()
        self._owns = False

    @classmethod
    def from_frame(cls, frame: Any, *, threads: int | None = None) -> DuckDBEngine:
        """A pandas or Polars DataFrame, or an Arrow table, registered without copying (an
        Arrow record batch reader, a stream that can be scanned once, is read into a table:
        every query scans its data several times)."""
        con = duckdb.connect()
        name = f"__dpcurator_source_{next(_ids)}"
        _register(con, name, frame, type(frame).__name__)
        engine = cls(con, quote(name), label=type(frame).__name__, owns_connection=True,
                     threads=threads)
        engine._typed = _typed_columns(frame)
        return engine

    @classmethod
    def from_connection(cls, connection: duckdb.DuckDBPyConnection, table: str
                        ) -> DuckDBEngine:
        """A table or view of an existing DuckDB connection ("schema.table" allowed)."""
        if not isinstance(table, str) or not table:
            raise UserError("table must be the name of a table of the connection")
        relation = ".".join(quote(part) for part in table.split("."))
        return cls(connection, relation, label=table)

    def show_progress(self, enabled: bool) -> None:
        """DuckDB's progress bar on long scans (only for an engine this curator opened)."""
        if self._owns:
            self._con.execute(f"SET enable_progress_bar = {'true' if enabled else 'false'}")

    # -- schema ------------------------------------------------------------------------------

    def columns(self) -> Mapping[str, str]:
        if self._fixed_columns is not None:
            return self._fixed_columns
        if self._columns is None:
            with self._lock:
                try:
                    rows = self._con.execute(
                        f"DESCRIBE SELECT * FROM {self._relation}").fetchall()
                except duckdb.Error as exc:
                    raise UserError(f"cannot read the table's columns from {self.label}: "
                                    f"{type(exc).__name__}") from None
            self._columns = {str(r[0]): str(r[1]) for r in rows}
        return self._columns

    def check_source(self) -> None:
        """Read every value once with the types queries will use (a data-owner check, at
        construction), so that no query can fail on a value after it was charged: a CSV
        file's lines (``_duckdb_csv``); a DataFrame's, Arrow table's or connection table's
        columns (``_check_columns``: DuckDB infers a pandas ``object`` column's type from a
        sample of its rows, and a view can cast). A Parquet file carries its own types, and
        nothing is read."""
        with self._lock:
            if self._csv is not None:
                check_csv(self._con, self._csv, self.columns(), self.label)
            elif not self._relation.startswith("read_parquet("):
                columns = {c: t for c, t in self.columns().items() if c not in self._typed}
                _check_columns(self._con, self._relation, columns, self.label)

    def nan_columns(self, columns: Sequence[str]) -> list[str]:
        """Columns (of those given) holding a NaN (a data-owner check, at construction)."""
        if not columns:
            return []
        checks = ", ".join(
            f"bool_or(isnan(TRY_CAST({quote(c)} AS DOUBLE))) AS {quote(c)}" for c in columns)
        with self._lock:
            row = self._con.execute(f"SELECT {checks} FROM {self._relation}").fetchall()[0]
        return [c for c, bad in zip(columns, row, strict=True) if bad]

    def group_key_types(self, query: BoundedQuery) -> list[str]:
        """The type of each group key expression (DESCRIBE: no row is read)."""
        if not query.group_keys:
            return []
        keys = ", ".join(f"{DIALECT.render(self.dialect.group_key(k.expression))} AS __k{i}"
                         for i, k in enumerate(query.group_keys))
        with self._lock:
            rows = self._con.execute(f"DESCRIBE SELECT {keys} FROM {self._relation}").fetchall()
        return [str(r[1]) for r in rows]

    def type_of(self, nodes: Sequence[exp.Expr]) -> list[str]:
        """The DuckDB type of each expression over the relation (a column's from
        ``columns``, others from DESCRIBE: no row is read), remembered by its text."""
        columns = self.columns()
        texts = []
        for node in nodes:
            text = node.sql(dialect="duckdb")
            if isinstance(node, exp.Column) and not node.table and node.name in columns:
                self._types.setdefault(text, columns[node.name])
            texts.append(text)
        missing = [t for t in dict.fromkeys(texts) if t not in self._types]
        if missing:
            items = ", ".join(f"{t} AS c{i}" for i, t in enumerate(missing))
            rows = self._fetch(f"DESCRIBE SELECT {items} FROM {self._relation}")
            self._types.update(zip(missing, (str(r[1]) for r in rows), strict=True))
        return [self._types[t] for t in texts]

    def evaluates(self, node: exp.Expr) -> bool:
        """Does a constant expression evaluate without an error (once, reading no row)?"""
        try:
            self._fetch(f"SELECT {node.sql(dialect='duckdb')}")
        except duckdb.Error:
            return False
        return True

    # -- the transport ------------------------------------------------------------------------

    def _errors(self) -> tuple[type[BaseException], ...]:
        return (duckdb.Error,)

    def _fetch(self, text: str, parameters: Mapping[str, int] | None = None
               ) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._con.execute(text, parameters or None).fetchall()

    def _bind(self, compiled: CompiledQuery) -> None:
        self._fetch(f"DESCRIBE {compiled.statement}",
                    dict.fromkeys(compiled.parameter_names, 0))

    @contextlib.contextmanager
    def _registered(self, compiled: CompiledQuery) -> Iterator[None]:
        """The public keys as an Arrow table registered without copying (i, c0, c1...)."""
        name, keys = compiled.keys_table, compiled.query.keys
        assert name is not None and keys is not None
        self._con.register(name, _keys_arrow(keys.values, len(compiled.key_types)))
        try:
            yield
        finally:
            self._con.unregister(name)

    def _key_columns(self, compiled: CompiledQuery) -> tuple[list[str], list[str]]:
        given = [f"c{i}" for i in range(len(compiled.key_types))]
        return given, [f"TRY_CAST({g} AS {t})" for g, t in zip(given, compiled.key_types,
                                                               strict=True)]

    def close(self) -> None:
        if self._owns:
            self._con.close()


def _is_table_like(data: Any) -> bool:
    module = type(data).__module__.split(".")[0]
    return module in ("pandas", "polars", "pyarrow")


def _register(con: duckdb.DuckDBPyConnection, name: str, data: Any, label: str) -> None:
    """Register a DataFrame or Arrow data as DuckDB can scan it more than once: an Arrow
    record batch reader (a stream: a second scan would fail, after the charge) is read into
    a table. Data DuckDB cannot read (a polars column of Python objects) is a UserError that
    names the exception's class only (its message could quote a value)."""
    import sys

    pyarrow = sys.modules.get("pyarrow")
    if pyarrow is not None and isinstance(data, pyarrow.RecordBatchReader):
        data = data.read_all()
    try:
        con.register(name, data)
    except duckdb.Error as exc:
        raise UserError(f"cannot read {label} ({type(exc).__name__}): give each column a "
                        "type DuckDB reads (numbers, text, booleans, dates; not Python "
                        "objects)") from None


def _typed_columns(data: Any) -> frozenset[str]:
    """A pandas frame's columns of NumPy number, boolean or datetime types: DuckDB reads
    their values without a conversion that could fail, and they need no check."""
    dtypes = getattr(data, "dtypes", None)
    if type(data).__module__.split(".")[0] != "pandas" or dtypes is None:
        return frozenset()
    names = [str(c) for c in dtypes.index]
    return frozenset(str(c) for c, dtype in dtypes.items()
                     if getattr(dtype, "kind", "O") in "biufmM" and names.count(str(c)) == 1)


def _check_columns(con: duckdb.DuckDBPyConnection, relation: str,
                   columns: Mapping[str, str], label: str) -> None:
    """Convert every value of every column once, with the types queries read them as.

    DuckDB infers a pandas ``object`` column's type from a sample of its rows (1,000 by
    default); a value the sample missed (text among numbers, an integer beyond 32 bits, a
    wider ``Decimal``) fails every query that reads the column, when it runs, after the
    charge, so whether a query answers would depend on one record. Such columns are named
    here, to the data owner, with their type and never a value. ``count(column)`` converts
    each value of the column (``count(*)`` would convert none). A pandas column of a NumPy
    number, boolean or datetime type cannot fail and is left out (``_typed_columns``). Cost:
    one scan of the other columns, the time a query reading them takes: 0.1-0.2 s a million
    rows for text or integers in ``object`` columns, but about 6 s for Python ``Decimal``
    objects (which every query reading such a column pays too).
    """
    if not columns:
        return
    counts = ", ".join(f"count({quote(c)})" for c in columns)
    try:
        con.execute(f"SELECT {counts} FROM {relation}").fetchall()
        return
    except duckdb.Error:
        pass
    bad = []
    for column in columns:  # which columns: each read alone
        try:
            con.execute(f"SELECT count({quote(column)}) FROM {relation}").fetchall()
        except duckdb.Error:  # never echoed: DuckDB's message quotes the value
            bad.append(column)
    if not bad:
        raise UserError(f"cannot read {label}: DuckDB failed reading all its columns at once "
                        "(each column reads alone)")
    named = ", ".join(f"{c!r} ({columns[c]})" for c in bad)
    raise UserError(
        f"{label}: column(s) {named} hold values that do not convert to the type DuckDB reads "
        "the column as, so every query reading them would fail. DuckDB infers a pandas "
        "object column's type from a sample of its rows: give each such column one type "
        "before making the curator (for example with pd.to_numeric, or astype('float64'), "
        "'Int64' or 'string'), or correct the values that do not fit")


def _keys_arrow(values: tuple[tuple[Any, ...], ...], width: int) -> Any:
    import pyarrow as pa

    columns: dict[str, Any] = {"i": list(range(len(values)))}
    try:
        columns.update({f"c{i}": _key_array([row[i] for row in values]) for i in range(width)})
        return pa.table(columns)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        raise UserError("keys must have one type per group key column (mixed types in a "
                        "column of keys)") from None


def _key_array(column: list[Any]) -> Any:
    """One column of public keys as Arrow: integers beyond BIGINT as UBIGINT where they fit
    (a 64-bit hash: pyarrow's OverflowError escaped, and such keys were refused), else as
    their digits, which the engine casts exactly to the group key's type (HUGEINT)."""
    import pyarrow as pa

    try:
        return pa.array(column)
    except OverflowError:
        pass
    if not all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in column):
        raise pa.ArrowInvalid("mixed types")
    if all(v is None or 0 <= v < 2**64 for v in column):
        return pa.array(column, type=pa.uint64())
    return pa.array([None if v is None else str(v) for v in column], type=pa.string())
