"""PostgreSQL's total expressions (``engines._postgres_expressions``) on the real server: no
value of one unit, and no unit's presence, decides between a release and an error after the
charge.

Found by a bug hunt (hunt F, PostgreSQL compared with DuckDB): casts to DECIMAL(p, s) and to
REAL, NUMERICs beyond the double range in ``/``, ``sqrt``, ``ln``, NUMERIC products beyond
NUMERIC's limits, invalid literal regular expressions and unknown ``date_trunc`` units each
raised after the charge on one neighbour and were released on the other (a one-bit leak).
Each pair here is run on both neighbours: both released, or both refused before any charge.
"""

from __future__ import annotations

import datetime
import decimal
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import dpcurator as dp
from _outcomes import outcome
from dpcurator.noise import SeededRandom

psycopg = pytest.importorskip("psycopg")

TYPES = {"uid": "bigint", "y": "bigint", "x": "double precision", "code": "text",
         "t": "timestamp", "d": "date", "n": "numeric"}
Make = Callable[..., dp.Curator]


def rows(**unit5: Any) -> list[dict[str, Any]]:
    """20 units, one row each; unit 5's values as given (the neighbour's secret)."""
    out = [{"uid": i, "y": i, "x": 1.5, "code": "7",
            "t": datetime.datetime(2024, 1, 1) + datetime.timedelta(days=i),
            "d": datetime.date(2024, 1, 1) + datetime.timedelta(days=i),
            "n": decimal.Decimal("1.5")} for i in range(20)]
    out[5].update(unit5)
    return out


@pytest.fixture
def make(postgres_url: str) -> Iterator[Make]:
    """A curator on a table of its own (in a schema dropped afterwards) holding ``rows``."""
    schema = f"total_{secrets.token_hex(6)}"
    admin = psycopg.connect(postgres_url, autocommit=True)
    admin.execute(f'CREATE SCHEMA "{schema}"')
    curators: list[dp.Curator] = []
    counter = iter(range(10**6))

    def build(data: list[dict[str, Any]]) -> dp.Curator:
        name = f"{schema}.t{next(counter)}"
        columns = ", ".join(f'"{c}" {t}' for c, t in TYPES.items())
        admin.execute(f"CREATE TABLE {name} ({columns})")
        with admin.cursor() as cur, cur.copy(f"COPY {name} FROM STDIN") as copy:
            for row in data:
                copy.write_row([row[c] for c in TYPES])
        curator = dp.Curator.from_postgres(postgres_url, name, privacy_unit="uid",
                                           budget=dp.PureDP(10), source=SeededRandom(1),
                                           cache=False)
        curators.append(curator)
        return curator

    yield build
    for curator in curators:
        curator.close()
    admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
    admin.close()


def count(where: str) -> str:
    return f"SELECT COUNT(*) AS n FROM data WHERE {where}"


BIG, HUGE = decimal.Decimal("1e400"), decimal.Decimal("9e100000")


@pytest.mark.parametrize("where, column, values", [
    # a bug hunt: casts to DECIMAL(p, s) and REAL had no range guard
    ("CAST(y AS DECIMAL(3,0)) > 0", "y", (5, 1000)),
    ("CAST(x AS DECIMAL(5,2)) > 0", "x", (1.5, 1e10)),
    ("CAST(code AS DECIMAL(3,1)) > 0", "code", ("7", "12345")),
    ("CAST(code AS DECIMAL(3,1)) > 0", "code", ("7", "inf")),
    ("CAST(code AS DECIMAL(3,1)) > 0", "code", ("7", "99.95")),
    ("CAST(n AS DECIMAL(3,1)) > 0", "n", (decimal.Decimal("1.5"), decimal.Decimal("Infinity"))),
    ("CAST(x AS FLOAT) > 0", "x", (1.5, 1e300)),
    ("CAST(x AS FLOAT) > 0", "x", (1.5, 1e-300)),
    ("CAST(n AS FLOAT) > 0", "n", (decimal.Decimal("1.5"), decimal.Decimal("1e100"))),
    ("CAST(n AS FLOAT) > 0", "n", (decimal.Decimal("1.5"), decimal.Decimal("1e-100"))),
    ("CAST(code AS FLOAT) > 0", "code", ("7", "1e39")),
    # a bug hunt: a NUMERIC beyond the double range where it is converted to a double
    ("n / 3 > 0", "n", (decimal.Decimal("1.5"), BIG)),
    ("sqrt(n) > 0", "n", (decimal.Decimal("1.5"), BIG)),
    ("ln(n) > 0", "n", (decimal.Decimal("1.5"), BIG)),
    ("log(n) > 0", "n", (decimal.Decimal("1.5"), BIG)),
    ("log(2, n) > 0", "n", (decimal.Decimal("1.5"), BIG)),
    ("power(n, 2) > 0", "n", (decimal.Decimal("1.5"), BIG)),
    ("exp(n) > 0", "n", (decimal.Decimal("1.5"), BIG)),
    ("n * x > 0", "n", (decimal.Decimal("1.5"), BIG)),
    ("n + x > 0", "n", (decimal.Decimal("1.5"), BIG)),
    ("n > x", "n", (decimal.Decimal("1.5"), BIG)),
    ("x BETWEEN n AND 2", "n", (decimal.Decimal("1.5"), BIG)),
    ("coalesce(n, x) > 0", "n", (decimal.Decimal("1.5"), BIG)),
    ("CASE WHEN uid = 5 THEN n ELSE x END > 0", "n", (decimal.Decimal("1.5"), BIG)),
    ("sqrt(code) > 0", "code", ("7", "abc")),
    # a bug hunt: NUMERIC + - * beyond NUMERIC's own limits
    ("n * n > 0", "n", (decimal.Decimal("1.5"), HUGE)),
    ("n + n > 0", "n", (decimal.Decimal("1.5"), decimal.Decimal("9e131071"))),
    # a date beyond the timestamps, where it is converted to one
    ("CAST(d AS TIMESTAMP) > TIMESTAMP '2000-01-01'", "d", (datetime.date(2024, 1, 6),
                                                              "300000-01-01")),
    ("date_trunc('month', d) > TIMESTAMP '2000-01-01'", "d", (datetime.date(2024, 1, 6),
                                                                "300000-01-01")),
])
def test_neighbours_differing_in_one_value_are_both_released(
        make: Make, where: str, column: str, values: tuple[Any, Any]) -> None:
    """A bug hunt: each of these raised after the charge with the second value."""
    outcomes = [outcome(make(rows(**{column: v})), count(where)) for v in values]
    assert outcomes == ["released", "released"]


@pytest.mark.parametrize("where, expected", [
    # a bug hunt: PostgreSQL compiles a pattern when the first row reaches it
    ("uid = 5 AND regexp_matches(code, '(')", "refused"),
    ("uid = 5 AND regexp_matches(code, 'a{2,1}')", "refused"),
    ("uid = 5 AND regexp_matches(code, '(', 'i')", "refused"),
    ("uid = 5 AND regexp_matches(code, '^7$')", "released"),
    ("uid = 5 AND code LIKE '\\a'", "released"),
    ("uid = 5 AND code ILIKE '7%'", "released"),
    # a bug hunt: PostgreSQL checks date_trunc's unit only on a row that reaches it
    ("uid = 5 AND date_trunc('fortnight', t) IS NULL", "refused"),
    ("uid = 5 AND date_trunc('foo', d) IS NULL", "refused"),
    ("uid = 5 AND date_trunc('week', t) IS NULL", "released"),
    ("uid = 5 AND date_trunc('months', t) IS NULL", "released"),
])
def test_neighbours_with_and_without_a_unit_get_the_same_outcome(
        make: Make, where: str, expected: str) -> None:
    """A bug hunt: released without unit 5, raised after the charge with it."""
    with_unit = rows()
    without = [r for r in with_unit if r["uid"] != 5]
    assert [outcome(make(data), count(where)) for data in (with_unit, without)] == \
        [expected, expected]


@pytest.mark.parametrize("where, expected", [
    ("t > TIMESTAMP '2000-01-01'", "released"),
    ("t > TIMESTAMP '2000-01-01 12:30:00'", "released"),
    ("d > TIMESTAMP '2000-01-01'", "released"),
    ("t > TIMESTAMP '2000-02-30'", "refused"),
])
def test_a_timestamp_literal_is_evaluated_before_the_charge(make: Make, where: str,
                                                            expected: str) -> None:
    """It was refused on PostgreSQL ('a cast from text to TIMESTAMP is not supported')."""
    assert outcome(make(rows()), count(where)) == expected


@pytest.mark.parametrize("text, column, values, expected", [
    ("CAST(code AS DECIMAL(3,1))", "code", ["99.94", "99.95", "-0.25", "inf", "nan", "12345"],
     [decimal.Decimal("99.9"), None, decimal.Decimal("-0.3"), None, None, None]),
    ("CAST(x AS DECIMAL(3,1))", "x", [0.25, 99.95, 1e10, float("nan"), float("inf")],
     [decimal.Decimal("0.3"), None, None, None, None]),
    ("CAST(y AS DECIMAL(3,0))", "y", [999, -999, 1000], [999, -999, None]),
    ("CAST(n AS DECIMAL(3,1))", "n", [decimal.Decimal("1.25"), decimal.Decimal("Infinity"),
                                      decimal.Decimal("NaN")], [decimal.Decimal("1.3"), None,
                                                                None]),
    ("CAST(x AS FLOAT)", "x", [1.5, 1e300, -1e-300, 1e-40, float("inf")],
     [1.5, None, -0.0, pytest.approx(1e-40, rel=1e-6), float("inf")]),
    ("CAST(code AS FLOAT)", "code", ["1e39", "-1e39", "1e-50", "3.5"],
     [float("inf"), float("-inf"), 0.0, 3.5]),
    ("CAST(n AS FLOAT)", "n", [decimal.Decimal("1e39"), decimal.Decimal("1e-50"),
                               decimal.Decimal("2.5")], [None, 0.0, 2.5]),
    ("sqrt(n)", "n", [BIG, decimal.Decimal("4")], [None, 2.0]),
    ("n * n", "n", [HUGE, decimal.Decimal("3")], [None, decimal.Decimal("9")]),
    # a backslash in LIKE is an ordinary character, as on DuckDB and Spark (PostgreSQL's
    # default escape made 'a' LIKE '\a' true; a bug hunt)
    ("code LIKE '\\a'", "code", ["a", "\\a", "\\"], [False, True, False]),
    ("code ILIKE '\\%'", "code", ["%", "\\x", "x"], [False, True, False]),
])
def test_the_guarded_operations_give_duckdbs_values(
        postgres_url: str, text: str, column: str, values: list[Any],
        expected: list[Any]) -> None:
    """What DuckDB's TRY_CAST gives: NULL out of a DECIMAL's range (rounded half away from
    zero first), NULL for a double beyond REAL's range and +-0 below it, IEEE +-inf and 0 for
    text; NULL where a NUMERIC does not convert to a double or a product passes NUMERIC's
    limits."""
    from dpcurator.engines.postgres import PostgresEngine
    from dpcurator.query import expressions as ex

    schema = f"total_{secrets.token_hex(6)}"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            name = f"{schema}.t"
            columns = ", ".join(f'"{c}" {t}' for c, t in TYPES.items())
            admin.execute(f"CREATE TABLE {name} ({columns})")
            with admin.cursor() as cur, cur.copy(f"COPY {name} FROM STDIN") as copy:
                for i, value in enumerate(values):
                    copy.write_row([i if c == "uid" else value if c == column else None
                                    for c in TYPES])
            engine = PostgresEngine.from_dsn(postgres_url, name)
            try:
                sql = engine.dialect.total(ex.canonical(ex.parse_scalar(text, "test")))
                got = [r[0] for r in admin.execute(
                    f'SELECT {sql.sql(dialect="postgres")} FROM {name} ORDER BY uid')]
            finally:
                engine.close()
        finally:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
    assert got == expected, (got, expected)
