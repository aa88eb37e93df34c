"""The engine seam: the registry of source kinds, the Engine protocol, compile-once, the hash."""

from __future__ import annotations

import secrets

import duckdb
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

import dpcurator as dp
from dpcurator.engines import (
    DuckDBEngine,
    Engine,
    PostgresTable,
    SourceKind,
    open_engine,
    register_source,
)
from dpcurator.engines._hash import PRIME, hash_parameters
from dpcurator.engines._sources import source_kinds
from dpcurator.errors import UserError
from dpcurator.query.bounding import BoundedQuery, MeasureSpec

FRAME = pd.DataFrame({"uid": [1, 2, 3], "g": ["a", "b", "a"], "v": [1.0, 2.0, 3.0]})


@pytest.mark.parametrize("data", [FRAME, pl.from_pandas(FRAME), pa.Table.from_pandas(FRAME)],
                         ids=["pandas", "polars", "arrow"])
def test_frames_open_a_duckdb_engine(data: object) -> None:
    engine = open_engine(data)
    assert isinstance(engine, DuckDBEngine) and isinstance(engine, Engine)
    assert list(engine.columns()) == ["uid", "g", "v"]


def test_paths_connections_and_engines(tmp_path: object) -> None:
    path = f"{tmp_path}/d.parquet"
    FRAME.to_parquet(path)
    assert isinstance(open_engine(path), DuckDBEngine)
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT 1 AS uid")
    assert list(open_engine(con, table="t").columns()) == ["uid"]
    with pytest.raises(UserError, match="name the table"):
        open_engine(con)
    engine = DuckDBEngine.from_frame(FRAME)
    assert open_engine(engine) is engine


def test_unknown_data_and_database_urls_are_refused_with_a_hint() -> None:
    with pytest.raises(UserError, match="cannot read data of type int"):
        open_engine(42)
    with pytest.raises(UserError, match="from_postgres"):
        open_engine("postgresql://user:secret@host/db")
    assert "secret" not in repr(PostgresTable("postgresql://user:secret@host/db", "t"))


def test_a_new_source_kind_is_registered_once() -> None:
    class Wrapped:
        def __init__(self, frame: pd.DataFrame) -> None:
            self.frame = frame

    name = f"wrapped-{secrets.token_hex(4)}"
    register_source(SourceKind(name, lambda d: isinstance(d, Wrapped),
                               lambda d, table, threads: DuckDBEngine.from_frame(d.frame)))
    assert name in source_kinds()
    curator = dp.Curator(Wrapped(FRAME), privacy_unit="uid", budget=dp.PureDP(1.0))
    assert curator.columns == {"uid": "BIGINT", "g": "VARCHAR", "v": "DOUBLE"}
    with pytest.raises(ValueError, match="already registered"):
        register_source(SourceKind(name, lambda d: False, open_engine))


def test_a_query_is_compiled_once_for_validation_and_computation() -> None:
    engine = DuckDBEngine.from_frame(FRAME)
    q = BoundedQuery("uid", (), None, None, 1, 1, "sample", "none",
                     (MeasureSpec("rows", "rows"),))
    validated = engine.validate(q)
    assert engine.prepare(q) is engine.prepare(q)
    result = engine.compute_exact_aggregates(q, key=3)
    assert result.sql == validated and result.measures == {"rows": [3]}


def test_hash_coefficients_are_elements_of_the_field_chosen_by_the_key() -> None:
    names = [f"dp_key_ac{i}" for i in range(50)]
    first, again = hash_parameters(7, names), hash_parameters(7, names)
    other = hash_parameters(8, names)
    assert first == again and first != other
    assert all(0 <= v < PRIME for v in first.values())
    assert len(set(first.values())) == len(names)  # distinct, as uniform draws would be
    assert hash_parameters(-1, names) == hash_parameters(2**64 - 1, names)  # 64-bit keys
