"""PostgreSQL: the bounding statement of ``_sql`` run where the table lives (psycopg 3).

The dialect: user expressions are made total by the shared rule table (``_total``) with
PostgreSQL's entries (``_postgres_expressions``: PostgreSQL has no ``TRY``); sums of BIGINT
are NUMERIC (exact); ROUND of a double is C's half away from zero (PostgreSQL's rounds half
to even); a double product that would underflow (an error in PostgreSQL) is kept from
happening; text is hashed through ``md5``. The transport: the columns from the catalog,
types of expressions from ``LIMIT 0`` queries (no row is read), public keys in a TEMP table,
the hash coefficients derived from the secret key as bound parameters. Messages never quote
the server's error text (it could quote a value) nor the URL's password.

    curator = dp.Curator.from_postgres("postgresql://user@host/db", "events",
                                       privacy_unit="user_id", budget=dp.PureDP(1.0))
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import psycopg
from sqlglot import exp

from dpcurator.engines import _postgres_expressions as pe
from dpcurator.engines._dialect import Dialect, ValueKind, base_type
from dpcurator.engines._engine import SqlEngine, key_text
from dpcurator.engines._hash import PREFIX, WORD_BITS
from dpcurator.engines._joins import TableSet
from dpcurator.engines._results import CompiledQuery
from dpcurator.engines._total import Evaluates
from dpcurator.engines._trees import add, band, cast, mul, num, shr
from dpcurator.errors import InternalError, UserError
from dpcurator.ledger import mask_url
from dpcurator.query.bounding import BoundedQuery

__all__ = ["PostgresDialect", "PostgresEngine"]

_FLOATISH = ("DOUBLE PRECISION", "REAL", "NUMERIC", "DECIMAL")


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class PostgresDialect(Dialect):
    """PostgreSQL's primitives; ``type_of`` asks the server the types of expressions."""

    sqlglot = "postgres"
    guards_underflow = True
    partitions_by_window = True  # measured 15% faster than the join at 10^6 rows
    fence_rows = True
    # measured against the two-level floor: public keys 2.13x -> 1.68x at 10^6 rows and
    # 1.65x -> 1.02x at 10^7, private keys 2.41x -> 2.01x at 10^6 (benchmarks/README.md)
    sort_pairs_input = True

    def __init__(self, type_of: pe.TypeOf, evaluates: Evaluates | None = None) -> None:
        self.type_of = type_of
        self.evaluates = evaluates

    def value_kind(self, sql_type: str) -> ValueKind:
        base = base_type(sql_type)
        if base in _FLOATISH:
            return "float"  # a NUMERIC can be NaN too
        return super().value_kind(sql_type)

    def to_double(self, node: exp.Expr, sql_type: str) -> exp.Expr:
        if base_type(sql_type) == "DOUBLE PRECISION":
            return node
        return pe.safe_cast(node, sql_type, "double precision")

    def is_nan(self, node: exp.Expr) -> exp.Expr:
        return exp.EQ(this=node, expression=self.double(math.nan))  # NaN = NaN in PostgreSQL

    def round_half_away(self, node: exp.Expr, sign: int = 0) -> exp.Expr:
        return pe.round_half_away(node, sign)

    def pair_sum(self, node: exp.Expr) -> tuple[exp.Expr, exp.Expr]:
        # sum(BIGINT) is NUMERIC, slow to finish per pair: sum the value's high and low
        # 26 bits as INTEGERs instead (sum(INTEGER) is a BIGINT), in NUMERIC only for the
        # pairs above r rows, which the rescale divides (CASE evaluates that branch alone).
        high = exp.Sum(this=cast(shr(node, 26), "INT"))
        low = exp.Sum(this=cast(band(node.copy(), num(2**26 - 1)), "INT"))
        small = add(mul(high, num(2**26)), low)
        big = add(mul(cast(high.copy(), "NUMERIC"), num(2**26)), low.copy())
        return small, big

    def total(self, text: str) -> exp.Expr:
        return pe.total(text, self.type_of, self.evaluates)

    def safe_cast(self, node: exp.Expr, sql_type: str) -> exp.Expr:
        return pe.safe_cast(node, "text", sql_type)  # from the keys' text

    def key_column(self, node: exp.Expr, sql_type: str) -> exp.Expr:
        # The keys table holds the keys converted already: a join on plain columns (a hash
        # join rechecks its condition on every match, so a cast there would run per row).
        return node

    def order_key(self, node: exp.Expr, sql_type: str) -> exp.Expr:
        if self.hash_kind(sql_type) == "text":  # byte order, as DuckDB compares text
            return exp.Collate(this=node, expression=exp.Identifier(this="C", quoted=True))
        return node

    def epoch_microseconds(self, node: exp.Expr) -> exp.Expr:
        seconds = exp.Extract(this=exp.var("EPOCH"), expression=node)
        return cast(mul(seconds, num(1_000_000)), "BIGINT")

    def runnable(self, text: str, parameters: bool) -> str:
        """psycopg reads ``%`` as the start of a placeholder when parameters are bound."""
        if not parameters:
            return text
        marker = "\x00(" + PREFIX
        return text.replace("%(" + PREFIX, marker).replace("%", "%%").replace(
            marker, "%(" + PREFIX)

    def digest(self, node: exp.Expr) -> exp.Expr:
        md5 = exp.Anonymous(this="md5", expressions=[node])
        return exp.Anonymous(this="decode", expressions=[md5, exp.Literal.string("hex")])

    def digest_words(self, node: exp.Expr) -> list[exp.Expr]:
        def u32(first: int) -> exp.Expr:  # bytes first..first+3, little-endian
            return add(*(mul(cast(exp.Anonymous(this="get_byte", expressions=[
                node.copy(), num(first + i)]), "BIGINT"), num(256**i)) for i in range(4)))

        low, high = u32(0), u32(4)
        mask = 2**WORD_BITS - 1
        return [band(low, num(mask)), add(shr(low.copy(), WORD_BITS),
                                          mul(band(high, num(2**28 - 1)), num(4)))]


class PostgresEngine(SqlEngine):
    """Runs bounded queries on one PostgreSQL table or view."""

    name = "postgres"
    title = "PostgreSQL"

    def __init__(self, connection: psycopg.Connection[Any], table: str, *, label: str,
                 owns_connection: bool = False) -> None:
        if not isinstance(table, str) or not table:
            raise UserError("table must be the name of a table of the database")
        super().__init__()
        self._con = connection
        self._table = table
        self._relation = ".".join(quote(part) for part in table.split("."))
        self.label = label
        self._owns = owns_connection
        self._columns: dict[str, str] | None = None
        self._types: dict[str, str] = {}
        self.dialect = PostgresDialect(self.type_of, self.evaluates)

    @classmethod
    def from_dsn(cls, dsn: str, table: str) -> PostgresEngine:
        """Connect to the database of ``dsn`` (a ``postgresql://`` URL or libpq string)."""
        try:
            con = psycopg.connect(dsn, autocommit=True, connect_timeout=30)
        except psycopg.Error as exc:
            raise UserError(f"cannot connect to PostgreSQL at {mask_url(dsn)} "
                            f"({type(exc).__name__})") from None
        return cls(con, table, label=f"{mask_url(dsn)} {table}", owns_connection=True)

    @classmethod
    def from_connection(cls, connection: psycopg.Connection[Any], table: str
                        ) -> PostgresEngine:
        """A table of an open psycopg connection (autocommit; left open by ``close``)."""
        return cls(connection, table, label=table)

    @classmethod
    def tables(cls, dsn: str, tables: Mapping[str, str]) -> TableSet:
        """A schema's tables of one database (``{name in queries: table}``), on one
        connection."""
        first = cls.from_dsn(dsn, next(iter(tables.values())))
        engines: dict[str, SqlEngine] = {}
        for name, table in tables.items():
            engine = first if not engines else cls(first._con, table, label=table)
            engine._lock = first._lock
            engines[name] = engine
        return TableSet(engines, "PostgreSQL")

    def _reset_derived(self) -> None:
        self._columns = None
        self._types = {}
        self._owns = False
        self._table = self.label
        self.dialect = PostgresDialect(self.type_of, self.evaluates)

    def show_progress(self, enabled: bool) -> None:
        """PostgreSQL shows no progress to a client."""

    @contextlib.contextmanager
    def _run(self, what: str, internal: bool = False) -> Iterator[psycopg.Cursor[Any]]:
        """A cursor under the engine's lock; an error never echoes the server's text."""
        with self._lock:
            try:
                with self._con.cursor() as cursor:
                    yield cursor
            except psycopg.Error as exc:
                if internal:
                    raise InternalError(f"PostgreSQL failed while {what}; nothing was "
                                        "released. This is probably a bug") from None
                raise UserError(f"PostgreSQL refused {what} on {self._table} "
                                f"({type(exc).__name__}): check the table's name and "
                                "the query's columns and types") from None

    # -- schema ------------------------------------------------------------------------------

    def columns(self) -> Mapping[str, str]:
        if self._fixed_columns is not None:
            return self._fixed_columns
        if self._columns is None:
            with self._run("reading the table's columns") as cur:
                cur.execute("SELECT a.attname, format_type(a.atttypid, a.atttypmod) "
                            "FROM pg_attribute a WHERE a.attrelid = to_regclass(%s) "
                            "AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                            (self._relation,))
                rows = cur.fetchall()
            if not rows:
                raise UserError(f"no table or view named {self._table!r} in the database")
            self._columns = {str(r[0]): str(r[1]) for r in rows}
        return self._columns

    def check_source(self) -> None:
        """A table's values all have its column types: nothing can fail on a value."""

    def nan_columns(self, columns: Sequence[str]) -> list[str]:
        types = self.columns()
        floats = [c for c in columns if base_type(types.get(c, "")) in _FLOATISH]
        if not floats:
            return []
        checks = ", ".join(f"coalesce(bool_or({quote(c)} = 'NaN'), false)" for c in floats)
        with self._run("checking columns for NaN") as cur:
            cur.execute(f"SELECT {checks} FROM {self._relation}")
            row = cur.fetchone()
        return [c for c, bad in zip(floats, row or (), strict=True) if bad]

    def type_of(self, nodes: Sequence[exp.Expr]) -> list[str]:
        """The PostgreSQL type of each expression over the table (``LIMIT 0``: reads no row;
        a NULL of the type, from an outer join, tells its name)."""
        texts = [n.sql(dialect="postgres") for n in nodes]
        missing = [t for t in dict.fromkeys(texts) if t not in self._types]
        if missing:
            inner = ", ".join(f"{t} AS c{i}" for i, t in enumerate(missing))
            outer = ", ".join(f"pg_typeof(q.c{i})::text" for i in range(len(missing)))
            with self._run("an expression of the query (its types do not fit)") as cur:
                cur.execute(f"SELECT {outer} FROM (SELECT 1) AS one LEFT JOIN (SELECT {inner} "
                            f"FROM {self._relation} LIMIT 0) AS q ON TRUE")
                row = cur.fetchone()
            assert row is not None
            self._types.update(zip(missing, (str(t) for t in row), strict=True))
        return [self._types[t] for t in texts]

    def evaluates(self, node: exp.Expr) -> bool:
        """Does an expression whose columns are NULL (a constant, a pattern on the empty
        text) evaluate without an error? Run once over a ``LIMIT 0`` of the relation,
        outer-joined to one row, so its columns keep their types and collations; no row of
        the table is read."""
        try:
            self._fetch(f"SELECT {node.sql(dialect='postgres')} FROM (SELECT 1) AS "
                        f"__dpcurator_one LEFT JOIN (SELECT * FROM {self._relation} LIMIT 0) "
                        "AS q ON TRUE")
        except psycopg.Error:
            return False
        return True

    def group_key_types(self, query: BoundedQuery) -> list[str]:
        return self.type_of([self.dialect.group_key(k.expression) for k in query.group_keys])

    # -- the transport ------------------------------------------------------------------------

    def _errors(self) -> tuple[type[BaseException], ...]:
        return (psycopg.Error,)

    def _refused(self, exc: BaseException) -> str:
        return (f"PostgreSQL refused the query on {self._table} ({type(exc).__name__}): "
                "check the table's name and the query's columns and types")

    def _fetch(self, text: str, parameters: Mapping[str, int] | None = None
               ) -> list[tuple[Any, ...]]:
        with self._lock, self._con.cursor() as cur:
            cur.execute(text, parameters or None)
            return cur.fetchall()

    def _bind(self, compiled: CompiledQuery) -> None:
        self._fetch(f"EXPLAIN {compiled.statement}",
                    dict.fromkeys(compiled.parameter_names, 0))

    @contextlib.contextmanager
    def _registered(self, compiled: CompiledQuery) -> Iterator[None]:
        """The query's public keys as a TEMP table for the time of one statement: the key's
        index ``i``, its text ``t0, t1...`` and its value as the group key's type ``c0, c1...``
        (NULL where the text does not convert)."""
        name, keys = compiled.keys_table, compiled.query.keys
        assert name is not None and keys is not None
        types = compiled.key_types
        texts = ", ".join(["i BIGINT"] + [f"t{i} TEXT" for i in range(len(types))])
        cast_ = [self.dialect.safe_cast(exp.column(f"t{i}"), t).sql(dialect="postgres")
                 for i, t in enumerate(types)]
        typed = ", ".join(["i"] + [f"t{i}" for i in range(len(types))] +
                          [f"{c} AS c{i}" for i, c in enumerate(cast_)])
        with self._con.cursor() as cur:
            cur.execute(f"CREATE TEMP TABLE {name}_text ({texts})")
            try:
                with cur.copy(f"COPY {name}_text FROM STDIN") as copy:
                    for index, key in enumerate(keys.values):
                        copy.write_row([index, *(key_text(v, "PostgreSQL", intervals=True)
                                                 for v in key)])
                cur.execute(f"CREATE TEMP TABLE {name} AS SELECT {typed} FROM {name}_text")
                cur.execute(f"ANALYZE {name}")
                yield
            finally:
                cur.execute(f"DROP TABLE IF EXISTS {name}_text")
                cur.execute(f"DROP TABLE IF EXISTS {name}")

    def _key_columns(self, compiled: CompiledQuery) -> tuple[list[str], list[str]]:
        width = len(compiled.key_types)
        return [f"t{i}" for i in range(width)], [f"c{i}" for i in range(width)]

    def close(self) -> None:
        if self._owns:
            with contextlib.suppress(psycopg.Error):
                self._con.close()
