"""Which engine reads a curator's data: a registry of source kinds, matched by type.

Each kind says which objects it reads (an ``isinstance`` check against the library's own
types, looked up only where that library is already imported: an object of a library that was
never imported cannot be one of its types) and opens an engine on them. The curator asks
``open_engine``; a new engine registers its kind with ``register_source``.

    kind          data                                      engine
    engine        an object that is already an ``Engine``   itself
    path          a CSV or Parquet path (str or PathLike)   DuckDB, scanning the file
    frame         a pandas or Polars DataFrame, an Arrow    DuckDB, registered without copy
                  table or record batch reader              (a reader is read into a table)
    duckdb        a DuckDB connection (with ``table``)      DuckDB, on the connection
    postgres      ``PostgresTable(dsn, table)``             PostgreSQL
    spark         a pyspark DataFrame                       Spark, on the DataFrame's session
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dpcurator.engines._base import Engine
from dpcurator.engines._joins import TableSet
from dpcurator.errors import UserError

__all__ = ["PostgresTable", "SourceKind", "open_engine", "open_tables", "register_source",
           "source_kinds"]


@dataclass(frozen=True)
class PostgresTable:
    """A table or view of a PostgreSQL database: ``dsn`` is a ``postgresql://`` URL (or a
    libpq connection string) and ``table`` its name ("schema.table" allowed)."""

    dsn: str
    table: str

    def __repr__(self) -> str:
        from dpcurator.ledger import mask_url

        return f"PostgresTable({mask_url(self.dsn)!r}, {self.table!r})"


Opener = Callable[[Any, str | None, int | None], Engine]


@dataclass(frozen=True)
class SourceKind:
    """One kind of data: which objects it is, and how to open an engine on one."""

    name: str
    matches: Callable[[Any], bool]
    open: Opener


_KINDS: list[SourceKind] = []


def register_source(kind: SourceKind, *, first: bool = False) -> None:
    """Add a kind of source (``first``: before the built-in kinds)."""
    if any(k.name == kind.name for k in _KINDS):
        raise UserError(f"a source kind named {kind.name!r} is already registered")
    _KINDS.insert(0, kind) if first else _KINDS.append(kind)


def source_kinds() -> tuple[str, ...]:
    return tuple(k.name for k in _KINDS)


def open_engine(data: Any, *, table: str | None = None, threads: int | None = None) -> Engine:
    """The engine that reads ``data`` (``table`` names a table of a connection)."""
    for kind in _KINDS:
        if kind.matches(data):
            return kind.open(data, table, threads)
    raise UserError(f"cannot read data of type {type(data).__name__}: give a CSV or Parquet "
                    "path, a pandas or Polars DataFrame, an Arrow table, a DuckDB connection "
                    "and table (Curator.from_duckdb), a PostgreSQL table "
                    "(Curator.from_postgres), or a Spark DataFrame (Curator.from_spark)")


def open_tables(sources: Any, *, connection: Any = None, threads: int | None = None
                ) -> TableSet:
    """A schema's tables on one engine (``_joins.TableSet``): files, DataFrames and Arrow
    tables on one DuckDB connection, or the named tables of a DuckDB ``connection``;
    ``PostgresTable`` values of one database; Spark DataFrames of one application."""
    from dpcurator.engines.duckdb import DuckDBEngine

    values = list(sources.values())
    spark = _instance_of("pyspark.sql.dataframe", "DataFrame")
    if any(isinstance(v, PostgresTable) for v in values):
        dsns = {v.dsn for v in values if isinstance(v, PostgresTable)}
        if len(dsns) != 1 or not all(isinstance(v, PostgresTable) for v in values):
            raise UserError("several PostgreSQL tables must all be PostgresTable values of "
                            "one database (Curator.from_postgres(dsn, [tables...]))")
        try:
            from dpcurator.engines.postgres import PostgresEngine
        except ImportError:
            raise UserError("PostgreSQL needs psycopg 3: pip install 'dpcurator[postgres]'"
                            ) from None
        return PostgresEngine.tables(dsns.pop(), {n: v.table for n, v in sources.items()})
    if any(spark(v) for v in values):
        if not all(spark(v) for v in values):
            raise UserError("several Spark tables must all be Spark DataFrames")
        from dpcurator.engines.spark import SparkEngine

        return SparkEngine.tables(sources)
    if connection is not None and not _instance_of("duckdb", "DuckDBPyConnection")(connection):
        raise UserError("connection must be a DuckDB connection")
    return DuckDBEngine.tables(sources, connection=connection, threads=threads)


def _instance_of(module: str, *names: str) -> Callable[[Any], bool]:
    """isinstance(data, module.name) for any of ``names``, without importing ``module``."""

    def check(data: Any) -> bool:
        loaded = sys.modules.get(module)
        if loaded is None:
            return False
        types = tuple(t for t in (getattr(loaded, n, None) for n in names)
                      if isinstance(t, type))
        return bool(types) and isinstance(data, types)

    return check


def _is_frame(data: Any) -> bool:
    return (_instance_of("pandas", "DataFrame")(data)
            or _instance_of("polars", "DataFrame")(data)
            or _instance_of("pyarrow", "Table", "RecordBatchReader")(data))


def _open_path(data: Any, table: str | None, threads: int | None) -> Engine:
    from dpcurator.engines.duckdb import DuckDBEngine
    from dpcurator.ledger import is_postgres_url

    if is_postgres_url(data):
        raise UserError("a postgresql:// URL names a database, not a file: use "
                        "Curator.from_postgres(dsn, 'table', ...)")
    return DuckDBEngine.from_path(data, threads=threads)


def _open_frame(data: Any, table: str | None, threads: int | None) -> Engine:
    from dpcurator.engines.duckdb import DuckDBEngine

    return DuckDBEngine.from_frame(data, threads=threads)


def _open_duckdb(data: Any, table: str | None, threads: int | None) -> Engine:
    from dpcurator.engines.duckdb import DuckDBEngine

    if table is None:
        raise UserError("with a DuckDB connection, name the table: "
                        "Curator.from_duckdb(connection, 'table', ...)")
    return DuckDBEngine.from_connection(data, table)


def _open_postgres(data: Any, table: str | None, threads: int | None) -> Engine:
    try:
        from dpcurator.engines.postgres import PostgresEngine
    except ImportError:
        raise UserError("PostgreSQL needs psycopg 3: pip install 'dpcurator[postgres]'"
                        ) from None
    assert isinstance(data, PostgresTable)
    return PostgresEngine.from_dsn(data.dsn, data.table)


def _open_spark(data: Any, table: str | None, threads: int | None) -> Engine:
    from dpcurator.engines.spark import SparkEngine

    return SparkEngine(data)


for _kind in (
    SourceKind("engine", lambda data: isinstance(data, Engine),
               lambda data, table, threads: data),
    SourceKind("path", lambda data: isinstance(data, str | os.PathLike), _open_path),
    SourceKind("frame", _is_frame, _open_frame),
    SourceKind("duckdb", _instance_of("duckdb", "DuckDBPyConnection"), _open_duckdb),
    SourceKind("postgres", lambda data: isinstance(data, PostgresTable), _open_postgres),
    SourceKind("spark", _instance_of("pyspark.sql.dataframe", "DataFrame"), _open_spark),
):
    register_source(_kind)
