"""DuckDB, the embedded default engine: bounding and exact aggregation compiled to one query.

Files are scanned in place (``read_csv`` / ``read_parquet``); pandas, Polars and Arrow tables
are registered without copying; a table of an existing connection is queried where it is.

The compiled statement follows the stages of ``dpcurator.query.bounding`` as common table
expressions, with the data's shape after each stage in a SQL comment. Under ``rescale`` rows
are first aggregated per (unit, partition) and the per-unit partition cap runs on that smaller
table (a count per unit and a join; with private keys, a window ranking each unit's pairs by
keyed hash). Sampled rows are chosen by windows over a keyed random order of the rows,
with the hard partition cap as a second window (DuckDB 1.3+ runs both in about the time of
two hash aggregations, and in far less memory than aggregating sampled lists).

No statement can fail because of a value in the data: user expressions run under ``TRY``
(an error becomes NULL) with casts as ``TRY_CAST``, fixed-point values cannot overflow by
construction, and divisions have non-zero divisors; a CSV file, whose column types DuckDB
infers from its first rows, is read in full once when the curator is made
(``check_source``), so that no later line can fail a query. The per-query secret key is a
bound parameter (``$dp_key``), never part of the SQL text.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from dpcurator.engines._base import ExactAggregates
from dpcurator.errors import InternalError, UserError
from dpcurator.query import _expressions as ex
from dpcurator.query.bounding import BoundedQuery, MeasureSpec, ValueSpec

__all__ = ["DuckDBEngine"]

_ids = itertools.count()


def quote(name: str) -> str:
    """A DuckDB identifier, always quoted."""
    return '"' + name.replace('"', '""') + '"'


def _string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _keyed_hash(args: str) -> str:
    """A 64-bit keyed hash of ``args`` under the per-query secret ``$dp_key``.

    DuckDB's multi-argument ``hash`` combines the arguments' hashes without a final mix, and
    its outputs for inputs that differ in one argument are measurably correlated (a priority
    test in tests/test_engine_duckdb.py sees 0.47 where 0.5 is due); hashing the combined
    value again mixes it fully. Only accuracy depends on this: any deterministic function of
    the unit's rows and the key keeps the sensitivity bounds.
    """
    return f"hash(hash($dp_key, {args}))"


def _double(value: float) -> str:
    return f"CAST({value!r} AS DOUBLE)"


def _rewrite(node: exp.Expression) -> exp.Expression:
    """Casts become TRY_CAST; width_bucket becomes the equivalent CASE (DuckDB has none)."""
    if isinstance(node, exp.Cast) and not isinstance(node, exp.TryCast):
        return exp.TryCast(this=node.this, to=node.args["to"])
    if isinstance(node, exp.WidthBucket):
        x = exp.cast(node.this, exp.DataType.build("DOUBLE"))
        lo = exp.cast(node.args["min_value"], exp.DataType.build("DOUBLE"))
        hi = exp.cast(node.args["max_value"], exp.DataType.build("DOUBLE"))
        n = node.args["num_buckets"]
        inner = sqlglot.parse_one(
            f"LEAST({n.sql()}, CAST(FLOOR((x - lo) * {n.sql()} / (hi - lo)) AS BIGINT) + 1)",
            dialect=ex.DIALECT)
        inner = inner.transform(lambda e: {"x": x, "lo": lo, "hi": hi}.get(
            e.name, e).copy() if isinstance(e, exp.Column) else e)
        return (exp.Case()
                .when(exp.Is(this=x.copy(), expression=exp.Null()), exp.Null())
                .when(exp.LT(this=x.copy(), expression=lo.copy()), exp.Literal.number(0))
                .when(exp.GTE(this=x.copy(), expression=hi.copy()),
                      exp.Literal.number(int(n.name) + 1))
                .else_(inner))
    return node


@functools.lru_cache(maxsize=256)
def scalar_sql(text: str) -> str:
    """Canonical plan SQL -> a DuckDB expression that cannot raise on any row (TRY).

    Cached: a query's compilation asks for the same few expressions several times, and each
    sqlglot parse costs a few milliseconds (its tokenizer is set up anew every time)."""
    node = sqlglot.parse_one(text, dialect=ex.DIALECT)
    ex.check_scalar(node, "expression")  # the plan was checked; check again, cheaply
    node = node.transform(_rewrite)
    return f"TRY({node.sql(dialect=ex.DIALECT, identify=True)})"


@functools.lru_cache(maxsize=256)
def _key_sql(text: str) -> str:
    """A group key's DuckDB expression: a plain column as it is (it cannot raise), anything
    else under TRY."""
    node = sqlglot.parse_one(text, dialect=ex.DIALECT)
    if isinstance(node, exp.Column):
        return node.sql(dialect=ex.DIALECT, identify=True)
    return scalar_sql(text)


class DuckDBEngine:
    """Runs bounded queries on one DuckDB relation (a file, a DataFrame or a table)."""

    name = "duckdb"

    def __init__(self, connection: duckdb.DuckDBPyConnection, relation: str, *,
                 label: str, owns_connection: bool = False, threads: int | None = None) -> None:
        self._con = connection
        self._relation = relation
        self.label = label
        self._owns = owns_connection
        self._lock = threading.Lock()
        self._columns: dict[str, str] | None = None
        self._csv: str | None = None  # a CSV path or glob: types inferred from a sample
        if threads is not None and owns_connection:
            self._con.execute(f"SET threads={int(threads)}")

    # -- constructors ----------------------------------------------------------------------

    @classmethod
    def from_path(cls, path: str | os.PathLike[str], *, threads: int | None = None
                  ) -> DuckDBEngine:
        """A CSV or Parquet file (or glob), scanned in place at every query."""
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
        con = duckdb.connect()
        engine = cls(con, f"{reader}({_string(text)})", label=text, owns_connection=True,
                     threads=threads)
        if reader == "read_csv":
            engine._csv = text
        return engine

    @classmethod
    def from_frame(cls, frame: Any, *, threads: int | None = None) -> DuckDBEngine:
        """A pandas or Polars DataFrame, or an Arrow table, registered without copying."""
        con = duckdb.connect()
        name = f"__dpcurator_source_{next(_ids)}"
        con.register(name, frame)
        return cls(con, quote(name), label=type(frame).__name__, owns_connection=True,
                   threads=threads)

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
        construction), so that no query can fail on a value after it was charged.

        DuckDB infers a CSV file's column types from a sample of its first rows; a later
        line that does not fit them (text in a numeric column, a bad date, a missing field)
        would make every query over the file fail when it runs, after the charge. Such lines
        are found here and named to the data owner in a UserError: line number, column and
        the kind of problem, never the value. Parquet files, DataFrames, Arrow tables and
        database tables carry their own types, so nothing can fail on a value and nothing is
        read. Cost: one scan of the file (about 1.6 s for 10 million rows, 430 MB).
        """
        if self._csv is None:
            return
        columns = self.columns()
        n = next(_ids)
        rejects, scans = f"__dpcurator_rejects_{n}", f"__dpcurator_scans_{n}"
        types = "{" + ", ".join(f"{_string(c)}: {_string(t)}" for c, t in columns.items()) + "}"
        reader = (f"read_csv({_string(self._csv)}, types={types}, store_rejects=true, "
                  f"rejects_table={_string(rejects)}, rejects_scan={_string(scans)})")
        # count(column) converts every value of the column (count(*) would convert none).
        counts = ", ".join(f"count({quote(c)})" for c in columns)
        with self._lock:
            try:
                read = self._con.execute(f"DESCRIBE SELECT * FROM {reader}").fetchall()
                if {str(r[0]): str(r[1]) for r in read} != dict(columns):
                    raise InternalError("the checked read of the CSV file has other columns "
                                        "than the queries' read; this is a bug")
                self._con.execute(f"SELECT {counts} FROM {reader}").fetchall()
                bad = self._con.execute(f"SELECT count(*) FROM {quote(rejects)}").fetchall()
                first = self._con.execute(
                    f"SELECT r.line, r.column_name, CAST(r.error_type AS VARCHAR), s.file_path "
                    f"FROM {quote(rejects)} r JOIN {quote(scans)} s USING (scan_id, file_id) "
                    f"ORDER BY s.file_path, r.line LIMIT 5").fetchall()
            except duckdb.Error as exc:
                # Never echo the engine's message: it could quote a value of the data.
                raise UserError(f"cannot read {self.label} ({type(exc).__name__}): check "
                                "that it is a CSV file, UTF-8, with a header line") from None
            finally:
                with contextlib.suppress(duckdb.Error):
                    self._con.execute(f"DROP TABLE IF EXISTS {quote(rejects)}")
                    self._con.execute(f"DROP TABLE IF EXISTS {quote(scans)}")
        total = int(bad[0][0]) if bad else 0
        if total:
            where = "; ".join(_rejected_line(row, columns, "*" in self._csv) for row in first)
            more = f" and {total - len(first)} more" if total > len(first) else ""
            raise UserError(
                f"{self.label}: {total} line(s) do not fit the column types DuckDB inferred "
                f"from the file's first rows, so every query would fail on them: {where}"
                f"{more}. Correct those lines (a numeric column holds numbers or nothing), "
                "or read the file yourself (for example with pandas, choosing each column's "
                "type) and pass the DataFrame")

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
        if not query.group_keys:
            return []
        keys = ", ".join(f"{scalar_sql(k.expression)} AS __k{i}"
                         for i, k in enumerate(query.group_keys))
        with self._lock:
            rows = self._con.execute(f"DESCRIBE SELECT {keys} FROM {self._relation}").fetchall()
        return [str(r[1]) for r in rows]

    # -- compilation -------------------------------------------------------------------------

    def compile(self, query: BoundedQuery, keys_table: str | None = None) -> list[str]:
        return _Compiler(query, self._relation, keys_table, self.group_key_types(query)
                         if keys_table else [], self.columns()).statements()

    @contextlib.contextmanager
    def _prepared(self, query: BoundedQuery
                  ) -> Iterator[tuple[list[str], str | None, list[str]]]:
        """The query's statements, run under the engine's lock with its public keys registered
        as a table (removed afterwards). Yields (statements, keys table, key types)."""
        keys_name = f"__dpcurator_keys_{next(_ids)}" if query.keys is not None else None
        key_types = self.group_key_types(query) if query.keys is not None else []
        statements = _Compiler(query, self._relation, keys_name, key_types,
                               self.columns()).statements()
        with self._lock:
            if keys_name is not None:
                assert query.keys is not None
                self._con.register(keys_name, _keys_arrow(query.keys.values,
                                                          len(query.group_keys)))
            try:
                yield statements, keys_name, key_types
            finally:
                if keys_name is not None:
                    self._con.unregister(keys_name)

    def validate(self, query: BoundedQuery) -> list[str]:
        """Bind every statement without reading rows, and check the public keys' types.

        Raises a UserError for a query the table's column types cannot run (for example a
        text column in arithmetic), before anything is charged. Returns the statements.
        """
        try:
            with self._prepared(query) as (statements, keys_name, key_types):
                if keys_name is not None:
                    self._check_keys(keys_name, key_types)
                for statement in statements:
                    self._con.execute(f"DESCRIBE {statement}", {"dp_key": 0}
                                      if "$dp_key" in statement else None).fetchall()
        except duckdb.Error as exc:
            raise UserError("the query does not fit the table's column types (check the "
                            "WHERE clause, group keys and keys); the engine said: "
                            f"{type(exc).__name__}") from None
        except SqlglotError:  # an expression sqlglot cannot write back in DuckDB's dialect
            raise UserError("an expression of the query could not be written in DuckDB's "
                            "SQL; write it more simply") from None
        return statements

    def _check_keys(self, keys_name: str, key_types: Sequence[str]) -> None:
        table = quote(keys_name)
        bad = " OR ".join(f"(c{i} IS NOT NULL AND TRY_CAST(c{i} AS {t}) IS NULL)"
                          for i, t in enumerate(key_types))
        row = self._con.execute(f"SELECT min(i) FROM {table} WHERE {bad}").fetchall()[0]
        if row is not None and row[0] is not None:
            raise UserError(f"key #{int(row[0]) + 1} does not convert to the group key types "
                            f"{list(key_types)}")
        cast = ", ".join(f"TRY_CAST(c{i} AS {t})" for i, t in enumerate(key_types))
        row = self._con.execute(f"SELECT (SELECT count(*) FROM {table}) - (SELECT count(*) "
                                f"FROM (SELECT DISTINCT {cast} FROM {table}))").fetchall()[0]
        if row is not None and row[0]:
            raise UserError("two keys name the same partition once converted to the group "
                            f"key types {list(key_types)}")

    def compute_exact_aggregates(self, query: BoundedQuery, key: int) -> ExactAggregates:
        params = {"dp_key": int(key) & ((1 << 64) - 1)}
        with self._prepared(query) as (statements, _, _):
            try:
                results = []
                for statement in statements:
                    used = params if "$dp_key" in statement else None
                    results.append(self._con.execute(statement, used).fetchall())
                if query.histograms:
                    results = _split_parts(query, results[0])
            except duckdb.Error:
                # Never echo the engine's message: it could quote a value of the data.
                raise InternalError("the engine failed while computing the aggregates; "
                                    "nothing was released. This is probably a bug") from None
        return _collect(query, results, statements)

    def close(self) -> None:
        if self._owns:
            self._con.close()


def _keys_arrow(values: tuple[tuple[Any, ...], ...], width: int) -> Any:
    import pyarrow as pa

    columns: dict[str, list[Any]] = {"i": list(range(len(values)))}
    columns.update({f"c{i}": [row[i] for row in values] for i in range(width)})
    try:
        return pa.table(columns)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        raise UserError("keys must have one type per group key column (mixed types in a "
                        "column of keys)") from None


def _split_parts(query: BoundedQuery, rows: list[tuple[Any, ...]]
                 ) -> list[list[tuple[Any, ...]]]:
    """One tagged result (keys, __part, sums..., __bin, __count) -> [sums rows, histogram
    rows...], each shaped as its own statement would return it."""
    width = 1 if query.keys is not None else len(query.group_keys)
    parts: list[list[tuple[Any, ...]]] = [[] for _ in range(1 + len(query.histograms))]
    for row in rows:
        part = int(row[width])
        if part == 0:
            parts[0].append(row[:width] + row[width + 1:-2])
        else:
            parts[part].append(row[:width] + row[-2:])
    return parts


def _collect(query: BoundedQuery, results: list[list[tuple[Any, ...]]],
             statements: list[str]) -> ExactAggregates:
    # With public keys the statements return the key's index in ``query.keys`` instead of
    # the key itself (so a key given as "1" for an integer column is still the same key).
    width = 1 if query.keys is not None else len(query.group_keys)
    main = results[0]
    keys = [tuple(row[:width]) for row in main]
    measures: dict[str, list[int]] = {}
    for j, measure in enumerate(query.measures):
        measures[measure.name] = [int(row[width + j] or 0) for row in main]
    selection = None
    if query.selection_units:
        selection = [int(row[width + len(query.measures)] or 0) for row in main]
    histograms: dict[str, dict[tuple[Any, ...], list[int]]] = {}
    for spec, rows in zip(query.histograms, results[1:], strict=True):
        table: dict[tuple[Any, ...], list[int]] = {}
        for row in rows:
            key = tuple(row[:width])
            counts = table.setdefault(key, [0] * spec.bins)
            counts[int(row[width])] = int(row[width + 1])
        histograms[spec.name] = table
    return ExactAggregates(keys, measures, selection, histograms, statements)


_REJECT_REASONS = {
    "CAST": "the value does not convert to",
    "MISSING COLUMNS": "too few fields",
    "TOO MANY COLUMNS": "too many fields",
    "UNQUOTED VALUE": "a quote out of place",
    "LINE SIZE OVER MAXIMUM": "the line is too long",
    "INVALID ENCODING": "not valid UTF-8",
}



def _rejected_line(row: tuple[Any, ...], columns: Mapping[str, str], with_path: bool) -> str:
    """One line DuckDB could not read, described without its content."""
    line, column, kind, path = row
    place = (f"{path} " if with_path else "") + f"line {int(line)}"
    reason = _REJECT_REASONS.get(str(kind), "unreadable")
    if kind == "CAST" and column is not None:
        return f"{place}, column {str(column)!r} ({reason} {columns.get(str(column), '?')})"
    return f"{place} ({reason})"


_FLOAT_TYPES = ("DOUBLE", "FLOAT", "REAL")
_EXACT_NUMERIC = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT",
                  "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT", "DECIMAL", "BOOLEAN")


class _Compiler:
    """Writes the DuckDB statements for one bounded query.

    Arithmetic on contributions stays in BIGINT: every per-(unit, partition) contribution is
    at most its L1 sensitivity, below 2^52 by construction (``MeasureSpec`` and the curator's
    calibration), so products of it with k stay far from 2^63; only a unit's raw per-pair sum
    (any number of rows) is a HUGEINT, and it is scaled down before the cast.
    """

    def __init__(self, query: BoundedQuery, relation: str, keys_table: str | None,
                 key_types: Sequence[str], column_types: Mapping[str, str]) -> None:
        self.q = query
        self.relation = relation
        self.keys_table = keys_table
        self.key_types = list(key_types)
        self.types = dict(column_types)
        self.k = [f"__k{i}" for i in range(len(query.group_keys))]
        for m in query.measures:
            if query.l1_sensitivity(m) >= 2**52:
                raise InternalError("a measure's sensitivity reaches 2^52; this is a bug")
        columns: list[str] = []
        for m in query.measures:
            if m.value is not None and m.value.column not in columns:
                columns.append(m.value.column)
        for h in query.histograms:
            if h.column not in columns:
                columns.append(h.column)
        self.columns = columns
        self.values: list[ValueSpec] = []
        for m in query.measures:
            if m.kind in ("values", "squares") and m.value is not None \
                    and m.value not in self.values:
                self.values.append(m.value)
        self.sample = query.rows_mode == "sample"
        # The cleaned double per column is needed to order rows for sampling and for bins.
        self.need_x = self.sample or bool(query.histograms)

    # names ------------------------------------------------------------------------------

    def x(self, column: str) -> str:
        return f"__x{self.columns.index(column)}"

    def v(self, spec: ValueSpec) -> str:
        return f"__v{self.values.index(spec)}"

    def keys_list(self) -> str:
        return ", ".join(self.k)

    def partition_order(self) -> str:
        """The keyed random order of a unit's partitions (both hard-cap paths): a 63-bit
        keyed hash of (unit, keys) as a BIGINT (the cheapest sort key), ties broken by the
        keys, so exactly min(m, k) partitions are kept."""
        pair = ", ".join(["__u", *self.k])
        return ", ".join([f"CAST({_keyed_hash(pair)} >> 1 AS BIGINT)", *self.k])

    # stage 1 -----------------------------------------------------------------------------

    def _exact(self, column: str) -> bool:
        """Whether the column is an exact numeric type (its DOUBLE is never NaN)."""
        return self.types.get(column, "").upper().startswith(_EXACT_NUMERIC)

    def _raw(self, column: str) -> tuple[str, str]:
        """(the column as a DOUBLE, the test for a missing value: NULL or NaN)."""
        name = quote(column)
        if self.types.get(column, "").upper().startswith(_FLOAT_TYPES):
            return name, f"({name} IS NULL OR isnan({name}))"
        if self._exact(column):
            return f"CAST({name} AS DOUBLE)", f"({name} IS NULL)"
        cast = f"TRY_CAST({name} AS DOUBLE)"
        return cast, f"({cast} IS NULL OR isnan({cast}))"

    def _clamped(self, column: str, lo: float, hi: float) -> str:
        """The column as a DOUBLE clamped to [lo, hi]; NULL where the value is missing.

        A CASE whose first branch takes the in-range values: no test for a missing value on
        most rows (a NULL fails every comparison and falls through to NULL; NaN, which
        DuckDB orders above +inf, is caught before the upper clamp). LEAST/GREATEST skip
        NULLs, so they needed a second CASE around them for the missing values; with the
        DOUBLE rescale below, this measured about 10% faster on benchmarks/query.py."""
        raw, _ = self._raw(column)
        low, high = _double(lo), _double(hi)
        above = f"{raw} > {high}" + ("" if self._exact(column) else f" AND NOT isnan({raw})")
        return (f"CASE WHEN {raw} >= {low} AND {raw} <= {high} THEN {raw} "
                f"WHEN {raw} < {low} THEN {low} WHEN {above} THEN {high} END")

    def _value_sql(self, spec: ValueSpec) -> str:
        clamped = self._clamped(spec.column, spec.lo, spec.hi)
        centred = f"({clamped} - {_double(spec.center)})" if spec.center != 0.0 else \
            f"({clamped})"
        body = f"({centred} * {centred})" if spec.square else centred
        return f"CAST(ROUND({body} * {_double(spec.scale)}) AS BIGINT)"

    def _bin_sql(self, index: int) -> str:
        h = self.q.histograms[index]
        x = self.x(h.column)
        clamped = f"LEAST(GREATEST({x}, {_double(h.lo)}), {_double(h.hi)})"
        return (f"CASE WHEN {x} IS NULL THEN NULL ELSE LEAST({h.bins - 1}, CAST(FLOOR(("
                f"{clamped} - {_double(h.lo)}) * {_double(h.bins / (h.hi - h.lo))}) AS BIGINT))"
                f" END")

    def rows_cte(self) -> str:
        q = self.q
        select: list[str] = []
        if q.unit is not None:
            select.append(f"{quote(q.unit)} AS __u")
        for key, name in zip(q.group_keys, self.k, strict=True):
            text = _key_sql(key.expression)
            select.append(f"{text} AS {name}")
        if self.need_x:
            for column in self.columns:
                raw, missing = self._raw(column)
                select.append(f"CASE WHEN {missing} THEN NULL ELSE {raw} END "
                              f"AS {self.x(column)}")
        select += [f"{self._value_sql(spec)} AS {self.v(spec)}" for spec in self.values]
        if not select:
            select.append("1 AS __one")  # a SELECT list is never empty
        conditions = []
        if q.unit is not None:
            conditions.append(f"{quote(q.unit)} IS NOT NULL")
        if q.where is not None:
            conditions.append(f"COALESCE({scalar_sql(q.where)}, FALSE)")
        where = f"\n  WHERE {' AND '.join(conditions)}" if conditions else ""
        parts = [f"rows AS (\n  -- one row per input row that passes the filter: unit, keys, "
                 f"clamped fixed-point values\n  SELECT {', '.join(select)}\n"
                 f"  FROM {self.relation}{where}\n)"]
        source = "rows"
        if self.keys_table is not None:
            on = self._key_match("rows")
            parts.append(f"keyed AS (\n  -- the same rows, restricted to the public keys\n"
                         f"  SELECT rows.* FROM rows SEMI JOIN {quote(self.keys_table)} ON {on}"
                         f"\n)")
            source = "keyed"
        bins = [f"{self._bin_sql(i)} AS __b{i}" for i in range(len(q.histograms))]
        if bins:
            parts.append(f"binned AS (\n  -- each row's bin\n  SELECT *, {', '.join(bins)} "
                         f"FROM {source}\n)")
            source = "binned"
        if self.sample:
            parts += self._sampled_ctes(source)
            source = "sampled"
        self.source = source
        return ",\n".join(parts)

    def _sampled_ctes(self, source: str) -> list[str]:
        """Rows (and, under a hard partition cap, partitions) chosen uniformly at random by
        windows over a keyed random order.

        Rows: a unit's rows in a partition are ranked by a keyed hash of their content (unit,
        keys and every sampled column) and of a copy index numbering identical rows 1..c, so
        every row has its own i.i.d. uniform priority and the r smallest are a uniformly
        random r-subset of the rows (not of the distinct contents). Ties of the hash are
        broken by the content and the copy index. Partitions: a unit's partitions are ranked
        by a keyed hash of (unit, keys), ties broken by the keys, and the first k kept:
        exactly min(m, k) partitions, chosen uniformly at random.

        The kept rows are a function of the unit's own rows (as a multiset: which of two
        identical rows gets which copy index changes nothing) and of the secret key only,
        never of row order or of other units, which is what the sensitivity argument needs.
        """
        q = self.q
        r, k = q.rows_cap, q.partitions_cap
        pair = ", ".join(["__u", *self.k])
        xs = [self.x(c) for c in self.columns]
        ctes = []
        if xs:
            content = ", ".join([pair, *xs])
            ctes.append(f"copies AS (\n  -- each row numbered among the identical rows of its "
                        f"unit and partition\n  SELECT *, row_number() OVER (PARTITION BY "
                        f"{content}) AS __d FROM {source}\n)")
            source = "copies"
            order = (f" ORDER BY {_keyed_hash(f'{content}, __d')}, {', '.join(xs)}, __d")
        else:
            order = ""  # counts alone: a pair's rows are interchangeable, any r of them do
        ranks = [f"row_number() OVER (PARTITION BY {pair}{order}) AS __rr"]
        keep = [f"__rr <= {r}"]
        if q.partitions_mode == "sample":
            ranks.append(f"dense_rank() OVER (PARTITION BY __u ORDER BY "
                         f"{self.partition_order()}) AS __pr")
            keep.append(f"__pr <= {k}")
        elif q.partitions_mode != "rescale" and self.k:
            raise InternalError("sampled rows with several partitions need a partition cap")
        what = f"{r} random rows per (unit, partition)" + (
            f", in {k} random partitions per unit" if q.partitions_mode == "sample" else "")
        ctes.append(f"sampled AS (\n  -- the kept rows: {what}\n  SELECT * FROM (SELECT *, "
                    f"{', '.join(ranks)} FROM {source})\n  WHERE {' AND '.join(keep)}\n)")
        return ctes

    # stage 2 -----------------------------------------------------------------------------

    def _count_of(self, column: str) -> str:
        for spec in self.values:
            if spec.column == column:
                return f"count({self.v(spec)})"
        return f"count({self.x(column)})"

    def _per_pair(self, measure: MeasureSpec) -> str:
        """The unit's contribution in one partition after the row cap, as a BIGINT aggregate
        expression over the pair's rows (every measure but ``units``, which is constant).

        Computing it inside the pair aggregation keeps the pairs table narrow (BIGINTs only:
        the raw per-pair sum, a HUGEINT over any number of rows, never leaves it)."""
        r = self.q.rows_cap
        if measure.kind == "rows":
            return f"LEAST(count(*), {r}) * {measure.weight}"
        assert measure.value is not None
        if measure.kind == "present":
            return f"LEAST({self._count_of(measure.value.column)}, {r}) * {measure.weight}"
        v = self.v(measure.value)
        if self.sample:  # at most r rows were kept: |sum| <= r M < 2^52
            return f"COALESCE(CAST(sum({v}) AS BIGINT), 0)"
        c = self._count_of(measure.value.column)
        # rescale rows: s * min(c, r) / c, truncated toward zero; |s| <= c M when c <= r.
        return (f"CASE WHEN {c} <= {r} THEN COALESCE(CAST(sum({v}) AS BIGINT), 0) "
                f"ELSE CAST((sum({v}) * {r}) // {c} AS BIGINT) END")

    def _amount(self, index: int) -> str:
        """Measure ``index``'s per-pair amount, as a column of ``pairs`` (or a constant)."""
        measure = self.q.measures[index]
        return str(measure.weight) if measure.kind == "units" else f"__a{index}"

    def pairs_cte(self) -> str:
        q, r = self.q, self.q.rows_cap
        group = ", ".join(["__u", *self.k])
        select = ["__u", *self.k]
        select += [f"{self._per_pair(m)} AS __a{j}" for j, m in enumerate(q.measures)
                   if m.kind != "units"]
        note = f" over at most {r} sampled rows" if self.sample else f" (rows weighted by " \
            f"min(1, {r}/n))"
        return (f"pairs AS (\n  -- one row per (unit, partition): its contribution to each "
                f"measure{note}\n  SELECT {', '.join(select)}\n  FROM {self.source} "
                f"GROUP BY {group}\n)")

    # stage 3 -----------------------------------------------------------------------------

    def units_cte(self) -> str:
        """Rescaled partitions: each unit's number of partitions, joined back to the pairs
        (a window count over the pairs measured about 30% slower)."""
        return ("units AS (\n  -- one row per unit: how many partitions it has\n"
                "  SELECT __u, count(*) AS __m FROM pairs GROUP BY __u\n)")

    def _contribution(self, index: int) -> str:
        amount = self._amount(index)
        if self.q.partitions_mode != "rescale":
            return amount
        k = self.q.partitions_cap
        # trunc(amount * k / m) toward zero, in DOUBLE: exact because |amount * k| is at
        # most the L1 sensitivity, below 2^52 (checked in __init__), so the product and m
        # are exact doubles and the one rounding of the division moves the quotient by less
        # than 1/m, never across an integer (an integer quotient is exact). Cheaper than
        # DuckDB's BIGINT division (tests/test_engine_duckdb.py checks it at the limit).
        return (f"CASE WHEN __m <= {k} THEN {amount} ELSE CAST(trunc(CAST(({amount}) * {k} "
                f"AS DOUBLE) / __m) AS BIGINT) END")

    def bounded_cte(self) -> str:
        q = self.q
        k = q.partitions_cap
        select = list(self.k)
        select += [f"{self._contribution(j)} AS __m{j}" for j in range(len(q.measures))]
        if not select:
            select.append("1 AS __one")
        where = ""
        if q.partitions_mode == "none":
            source = "pairs"
        elif q.partitions_mode == "rescale":
            source = "pairs JOIN units USING (__u)"
        else:
            # the unit's first k partitions in the keyed order: a window over the pairs,
            # about 20% faster than a per-unit top-(k+1) and a join
            source = (f"(SELECT *, row_number() OVER (PARTITION BY __u ORDER BY "
                      f"{self.partition_order()}) AS __pr FROM pairs)")
            where = f"\n  WHERE __pr <= {k}"
        return (f"bounded AS (\n  -- one row per kept (unit, partition): its bounded "
                f"contribution to each measure\n  SELECT {', '.join(select)}\n"
                f"  FROM {source}{where}\n)")

    def row_level_cte(self) -> str:
        """Row-level privacy: each row is its own unit (r = k = 1)."""
        return self._per_row_bounded("one row per row (each row is its own unit)")

    def sampled_bounded_cte(self) -> str:
        """Sampled rows under a hard (or no) partition cap: the kept rows are the bounded
        contributions themselves; a unit counts once per kept partition (its row of rank 1)."""
        return self._per_row_bounded("one row per kept row: its contribution to each measure")

    def _per_row_bounded(self, comment: str) -> str:
        select = list(self.k)
        for j, m in enumerate(self.q.measures):
            if m.kind == "rows":
                expr = f"{m.weight}"
            elif m.kind == "units":
                if self.q.unit is None:
                    raise InternalError("COUNT(DISTINCT unit) needs a privacy unit; a bug")
                expr = f"CASE WHEN __rr = 1 THEN {m.weight} ELSE 0 END"
            elif m.kind == "present":
                assert m.value is not None
                expr = (f"CASE WHEN {self._first_value(m.value.column)} IS NULL THEN 0 "
                        f"ELSE {m.weight} END")
            else:
                assert m.value is not None
                expr = f"COALESCE({self.v(m.value)}, 0)"
            select.append(f"{expr} AS __m{j}")
        select += [f"__b{i}" for i in range(len(self.q.histograms))]
        if self.q.unit is not None:
            select.append("__rr")
        if not select:
            select.append("1 AS __one")
        return (f"bounded AS (\n  -- {comment}\n"
                f"  SELECT {', '.join(select)} FROM {self.source}\n)")

    def _first_value(self, column: str) -> str:
        for spec in self.values:
            if spec.column == column:
                return self.v(spec)
        return self.x(column)

    # statements ----------------------------------------------------------------------------

    def statements(self) -> list[str]:
        q = self.q
        ctes = [self.rows_cte()]
        per_row = q.unit is None or (self.sample and q.partitions_mode != "rescale")
        if q.unit is None:
            ctes.append(self.row_level_cte())
        elif per_row:
            ctes.append(self.sampled_bounded_cte())
        else:
            ctes.append(self.pairs_cte())
            if q.partitions_mode == "rescale":
                ctes.append(self.units_cte())
            ctes.append(self.bounded_cte())
        prefix = "WITH\n" + ",\n".join(ctes) + "\n"
        keyed = self.keys_table is not None
        sums = [f"sum(__m{j}) AS __m{j}" for j in range(len(q.measures))]
        if q.selection_units:
            # one row per kept pair, or (per kept row) the pair's row of rank 1
            sums.append("count(*) FILTER (WHERE __rr = 1) AS __units" if per_row
                        else "count(*) AS __units")
        if not sums and not self.k:
            sums.append("count(*) AS __pairs")  # a SELECT list is never empty
        group = f"\nGROUP BY {self.keys_list()}" if self.k else ""
        head = ", ".join([*self.k, *sums])
        names = [sum_.rsplit(" AS ", 1)[1] for sum_ in sums]
        if not q.histograms:
            main = (f"{prefix}-- one row per partition: exact integer sums of bounded "
                    f"contributions\nSELECT {head}\nFROM bounded{group}")
            return [self._indexed(main, names) if keyed else main]
        # Histograms share the bounded rows with the sums: one statement, so the bounding
        # pipeline runs once (``bounded`` is materialised once for both branches). Each row
        # is tagged with __part: 0 for the sums, 1 + i for histogram i.
        keys = "".join(k + ", " for k in self.k)
        branches = [f"-- one row per partition: exact integer sums of bounded contributions\n"
                    f"SELECT 0 AS __part, {head}, CAST(NULL AS BIGINT) AS __bin, "
                    f"CAST(NULL AS BIGINT) AS __count\nFROM bounded{group}"]
        nulls = "".join(f"NULL AS {name}, " for name in names)
        for i in range(len(q.histograms)):
            # histograms need sampled rows, so ``bounded`` has one row per kept row
            source = f"SELECT {keys}__b{i} AS __bin FROM bounded WHERE __b{i} IS NOT NULL"
            branches.append(f"-- one row per (partition, bin) of histogram {i}: bounded row "
                            f"counts\nSELECT {i + 1} AS __part, {keys}{nulls}__bin, "
                            f"count(*) AS __count\nFROM ({source})\nGROUP BY {keys}__bin")
        union = prefix + "\nUNION ALL\n".join(f"({branch})" for branch in branches)
        if keyed:
            union = self._indexed(union, ["__part", *names, "__bin", "__count"])
        else:
            # the key columns first, as in the statement without histograms
            columns = ", ".join([*self.k, "__part", *names, "__bin", "__count"])
            union = f"SELECT {columns} FROM (\n{union}\n)"
        return [union]

    def _key_match(self, side: str) -> str:
        """The join condition of ``side``'s group keys with the public keys table.

        A NULL key matches NULL group values, so columns whose keys hold a NULL compare with
        IS NOT DISTINCT FROM; the others with ``=``, which DuckDB joins about 10% faster (the
        semi-join runs over every input row)."""
        assert self.keys_table is not None and self.q.keys is not None
        table = quote(self.keys_table)
        parts = []
        for i, (k, t) in enumerate(zip(self.k, self.key_types, strict=True)):
            has_null = any(key[i] is None for key in self.q.keys.values)
            op = "IS NOT DISTINCT FROM" if has_null else "="
            parts.append(f"{side}.{k} {op} TRY_CAST({table}.c{i} AS {t})")
        return " AND ".join(parts)

    def _indexed(self, statement: str, columns: list[str]) -> str:
        """Replace the key columns of a result by the public key's index."""
        assert self.keys_table is not None
        table = quote(self.keys_table)
        on = self._key_match("agg")
        selected = ", ".join(f"agg.{c}" for c in columns)
        return (f"SELECT {table}.i AS __key, {selected}\nFROM (\n{statement}\n) AS agg\n"
                f"JOIN {table} ON {on}")
