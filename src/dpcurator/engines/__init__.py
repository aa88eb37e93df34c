"""Engines run bounded queries where the data lives and return exact aggregates.

The bounding algorithm is written once (``_sql``: sqlglot trees over a dialect's primitives,
with the keyed hash of ``_hash``); an engine is a dialect plus a transport, over what all
share (``_engine.SqlEngine``: compile once, validate, check the public keys, compute). DuckDB is the
embedded default (files, DataFrames, Arrow tables, existing connections); PostgreSQL reads a
table where it is (``dpcurator.engines.postgres``, psycopg 3). ``open_engine`` picks the engine
for a curator's data from a registry of source kinds (``register_source``).
"""

from dpcurator.engines._base import (
    ColumnKind,
    Engine,
    ExactAggregates,
    column_kind,
    integer_valued,
)
from dpcurator.engines._joins import LinkReport, TableSet
from dpcurator.engines._sources import (
    PostgresTable,
    SourceKind,
    open_engine,
    open_tables,
    register_source,
)
from dpcurator.engines._sql import MEAN_OCTAVES, PROFILE_STEPS, UNIT_TOTALS
from dpcurator.engines.duckdb import DuckDBEngine

__all__ = [
    "MEAN_OCTAVES",
    "PROFILE_STEPS",
    "UNIT_TOTALS",
    "ColumnKind",
    "DuckDBEngine",
    "Engine",
    "ExactAggregates",
    "LinkReport",
    "PostgresTable",
    "SourceKind",
    "TableSet",
    "column_kind",
    "integer_valued",
    "open_engine",
    "open_tables",
    "register_source",
]
