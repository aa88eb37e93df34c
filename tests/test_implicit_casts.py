"""Implicit casts (``engines._total``, "Implicit casts"): no value of the data makes a
statement fail after its charge, where DuckDB converts values the query never casts.

Found by a bug hunt: ``WHERE CASE WHEN uid = 5 THEN code ELSE '0' END = 1`` was released
where unit 5's ``code`` was '42' and failed after the charge where it was 'SECRET123' (a
one-bit leak of one unit's value). Each query here is either answered or refused before any
charge; never charged and then failed.
"""

from __future__ import annotations

import pandas as pd
import pytest

import dpcurator as dp
from _outcomes import outcome
from dpcurator.engines import _postgres_expressions as pe
from dpcurator.engines import _total
from dpcurator.engines import duckdb as dd
from dpcurator.engines import spark as sp
from dpcurator.engines.duckdb import DuckDBEngine
from dpcurator.errors import UserError
from dpcurator.noise import SeededRandom


def frame(secret: str = "SECRET123") -> pd.DataFrame:
    df = pd.DataFrame({
        "uid": range(20), "code": ["7"] * 20, "x": [1.5] * 20, "y": range(20),
        "p": ["day"] * 20, "flag": ["true"] * 20,
        "t": pd.to_datetime("2024-01-01") + pd.to_timedelta(range(20), unit="D")})
    df.loc[5, ["code", "p", "flag"]] = [secret, secret, secret]
    return df


def curator(df: pd.DataFrame) -> dp.Curator:
    return dp.Curator.from_pandas(df, privacy_unit="uid", budget=dp.PureDP(10),
                                  source=SeededRandom(1), cache=False)


def test_neighbours_differing_in_one_value_are_both_released() -> None:
    query = ("SELECT COUNT(*) AS n FROM data WHERE "
             "CASE WHEN uid = 5 THEN code ELSE '0' END = 1")
    outcomes = [outcome(curator(frame(secret)), query) for secret in ("42", "SECRET123")]
    assert outcomes == ["released", "released"]


@pytest.mark.parametrize("where, expected", [
    ("code IN (1, 2)", "released"),
    ("y = code", "released"),
    ("nullif(p, 3) IS NULL", "released"),
    ("x = 'abc'", "refused"),  # a literal that does not convert: public, before the charge
    ("t > 'notadate'", "refused"),
    ("date_trunc(CASE WHEN uid = 5 THEN p ELSE 'day' END, t) > DATE '2020-01-01'", "refused"),
    ("flag", "released"),  # text as a condition: TRY_CAST(... AS BOOLEAN)
    ("NOT flag", "released"),
    ("uid = 1 OR flag", "released"),
    ("CASE WHEN flag THEN 1 END = 1", "released"),
    ("CASE code WHEN 1 THEN 1 END = 1", "released"),
    ("left(code, 'a') = 'a'", "released"),
    ("t + INTERVAL 'abc' DAY > t", "refused"),
])
def test_each_implicit_cast_is_answered_or_refused_before_the_charge(where: str,
                                                                     expected: str) -> None:
    c = curator(frame())
    assert outcome(c, f"SELECT COUNT(*) AS n FROM data WHERE {where}") == expected


def test_a_failing_cast_filters_its_row_out() -> None:
    """The failing operation is NULL: unit 5's 'SECRET123' is no number, its row is out."""
    con_engine = DuckDBEngine.from_frame(frame())
    try:
        node = con_engine.dialect.condition('"code" IN (7, 8)')
        rows = con_engine._fetch(f"SELECT count(*) FROM {con_engine._relation} WHERE "
                                 f"{con_engine.dialect.render(node)}")
    finally:
        con_engine.close()
    assert rows == [(19,)]


def test_plain_comparisons_are_not_under_try() -> None:
    engine = DuckDBEngine.from_frame(frame())
    try:
        def written(text: str) -> str:
            return engine.dialect.render(engine.dialect.condition(text))

        assert written('"x" = 15') == '"x" = 15'
        assert written('"y" BETWEEN 1 AND 5') == '"y" BETWEEN 1 AND 5'
        assert written("\"t\" >= '2024-01-01'") == "\"t\" >= CAST('2024-01-01' AS TIMESTAMP)"
        assert written("\"code\" IN ('1', '2')") == "\"code\" IN ('1', '2')"
        assert "TRY" not in written("CASE WHEN \"y\" > 2 THEN 'a' ELSE 'b' END = 'a'")
        assert written('"code" IN (1, 2)') == 'TRY("code" IN (1, 2))'
    finally:
        engine.close()


def test_a_date_beside_a_timestamp_constant_is_compared_as_a_timestamp() -> None:
    """SQL widens the DATE to a TIMESTAMP: the constant keeps its time (a bug hunt: it was
    cast to DATE, and ``d = TIMESTAMP '2022-03-15 10:00:00'`` counted the whole day)."""
    import datetime

    import duckdb

    days = [datetime.date(2022, 3, 1) + datetime.timedelta(days=i % 30) for i in range(300)]
    df = pd.DataFrame({"uid": range(300), "d": days})
    wheres = ["d = TIMESTAMP '2022-03-15 10:00:00'", "d >= TIMESTAMP '2022-03-15 10:00:00'",
              "d < CAST('2022-03-15 10:00:00' AS TIMESTAMP)",
              "d BETWEEN TIMESTAMP '2022-03-14 10:00:00' AND TIMESTAMP '2022-03-20 00:00:00'",
              "d IN (TIMESTAMP '2022-03-15 10:00:00', TIMESTAMP '2022-03-16')",
              "d <= TIMESTAMPTZ '2022-03-15 10:00:00+00'", "d > TIMESTAMP '2022-03-15'",
              "TIMESTAMP '2022-03-15 00:00:01' <> d"]
    engine = DuckDBEngine.from_frame(df)
    try:
        for where in wheres:
            node = engine.dialect.condition(where)
            got = engine._fetch(f"SELECT count(*) FROM {engine._relation} "
                                f"WHERE {engine.dialect.render(node)}")
            assert got == duckdb.sql(f"SELECT count(*) FROM df WHERE {where}").fetchall(), where
        # a constant that casts to DATE and back unchanged is still cast: no TRY
        plain = engine.dialect.render(engine.dialect.condition("d > TIMESTAMP '2022-03-15'"))
        assert "TRY(" not in plain and "AS DATE)" in plain
    finally:
        engine.close()


@pytest.mark.parametrize("rules, engine", [(dd.RULES, "DuckDB"), (sp.RULES, "Spark"),
                                           (pe.RULES, "PostgreSQL")])
def test_a_date_part_read_from_the_data_is_refused(rules: _total.Rules, engine: str) -> None:
    def type_of(nodes: object) -> list[str]:
        return ["timestamp without time zone"]

    for text in ['date_trunc(CASE WHEN "uid" = 5 THEN "p" ELSE \'day\' END, "t")',
                 'date_trunc(lower("p"), "t")']:
        with pytest.raises(UserError, match="literal date part"):
            _total.total(text, rules, engine, type_of)
    _total.total("date_trunc('day', \"t\")", rules, engine, type_of)  # a literal unit
