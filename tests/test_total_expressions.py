"""The rule table that makes user expressions total (``engines._total``), dialect by dialect.

Table-driven, as sqlglot tests its dialects: each row is (expression, dialect, the SQL the
rule table writes). PostgreSQL's rules ask the server the types of subexpressions; here a
stand-in answers by column name (``f`` double, ``t`` text, ``d`` date, the rest bigint).
Then the meaning, executed: each rule on DuckDB (in memory, no server) against a plain-Python
statement of "the failing operation is NULL". The contract suite (test_engine_contract.py)
runs the same meaning on DuckDB, PostgreSQL and Spark over real tables.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import duckdb
import pytest
from sqlglot import exp

from dpcurator.engines import _postgres_expressions as pe
from dpcurator.engines import _total
from dpcurator.engines import duckdb as dd
from dpcurator.engines import spark as sp
from dpcurator.errors import UserError
from dpcurator.query import expressions as ex

TABLES: dict[str, _total.Rules] = {"duckdb": dd.RULES, "postgres": pe.RULES, "spark": sp.RULES}


def stand_in_type_of(nodes: Sequence[exp.Expr]) -> list[str]:
    out = []
    for node in nodes:
        names = {c.name for c in node.find_all(exp.Column)}
        out.append("double precision" if "f" in names else "text" if "t" in names
                   else "date" if "d" in names else "bigint")
    return out


def duckdb_type_of(nodes: Sequence[exp.Expr]) -> list[str]:
    """DuckDB's names for the stand-in's types (a literal alone is typed by DuckDB)."""
    names = {"double precision": "DOUBLE", "text": "VARCHAR", "date": "DATE",
             "bigint": "BIGINT"}
    out = []
    for node, name in zip(nodes, stand_in_type_of(nodes), strict=True):
        if not any(node.find_all(exp.Column)):
            name = duckdb.sql(f"SELECT typeof({node.sql('duckdb')})").fetchall()[0][0]
        out.append(names.get(name, name))
    return out


def duckdb_evaluates(node: exp.Expr) -> bool:
    try:
        duckdb.sql(f"SELECT {node.sql('duckdb')}").fetchall()
    except duckdb.Error:
        return False
    return True


def write(dialect: str, text: str) -> str:
    if dialect == "duckdb":
        return _total.total(text, dd.RULES, "DuckDB", duckdb_type_of,
                            duckdb_evaluates).sql("duckdb")
    if dialect == "spark":
        tree = _total.total(text, sp.RULES, "Spark")
        return tree.transform(sp._spark_only).sql("spark")
    return _total.total(text, pe.RULES, "PostgreSQL", stand_in_type_of).sql("postgres")


PG_FITS = "BETWEEN -9223372036854775808 AND 9223372036854775807"
INT_RE, NUMBER_RE, SPECIAL_RE = _total.INTEGER_TEXT, _total.NUMBER_TEXT, _total.SPECIAL_TEXT


def spark_text(pattern: str) -> str:
    return pattern.replace("\\", "\\\\")  # Spark's string literals escape backslashes

WRITES: list[tuple[str, str, str]] = [
    # division: NULL by zero (doubles too); PostgreSQL decides its IEEE overflow on logarithms
    ('"x" / "y"', "duckdb", 'CASE WHEN TRY_CAST("y" AS DOUBLE) <> 0 THEN TRY_CAST("x" AS DOUBLE)'
     ' / TRY_CAST("y" AS DOUBLE) END'),
    ('"x" / "y"', "spark", "CASE WHEN TRY_CAST(`y` AS DOUBLE) <> 0 THEN TRY_CAST(`x` AS DOUBLE)"
     " / TRY_CAST(`y` AS DOUBLE) END"),
    ('"x" // "y"', "duckdb", 'TRY("x" // "y")'),
    ('"x" // "y"', "postgres", 'CASE WHEN "y" = 0 THEN NULL WHEN TRUNC((CAST("x" AS DECIMAL))'
     f' / (CAST("y" AS DECIMAL))) {PG_FITS} THEN ("x") / NULLIF("y", 0) END'),
    ('"x" // "y"', "spark", "CASE WHEN `y` = -1 THEN TRY_MULTIPLY((`x`), -1) "
     "ELSE (`x`) DIV NULLIF(`y`, 0) END"),
    ('"x" % "y"', "duckdb", '("x") % NULLIF("y", 0)'),
    ('"x" % "y"', "postgres", '("x") % NULLIF("y", 0)'),
    ('"x" % "y"', "spark", "(`x`) % NULLIF(`y`, 0)"),
    # integer overflow: TRY, a NUMERIC bound, try_add
    ('"x" + "y"', "duckdb", 'TRY("x" + "y")'),
    ('"x" + "y"', "postgres", f'CASE WHEN (CAST("x" AS DECIMAL)) + (CAST("y" AS DECIMAL)) '
     f'{PG_FITS} THEN ("x") + ("y") END'),
    ('"x" + "y"', "spark", "TRY_ADD((`x`), (`y`))"),
    ('"x" - "y"', "duckdb", 'TRY("x" - "y")'),
    ('"x" - "y"', "spark", "TRY_SUBTRACT((`x`), (`y`))"),
    ('"x" * "y"', "duckdb", 'TRY("x" * "y")'),
    ('"x" * "y"', "postgres", f'CASE WHEN (CAST("x" AS DECIMAL)) * (CAST("y" AS DECIMAL)) '
     f'{PG_FITS} THEN ("x") * ("y") END'),
    ('"x" * "y"', "spark", "TRY_MULTIPLY((`x`), (`y`))"),
    ('-"x"', "duckdb", 'TRY(-"x")'),
    ('-"x"', "postgres", f'CASE WHEN -CAST("x" AS DECIMAL) {PG_FITS} THEN -("x") END'),
    ('-"x"', "spark", "TRY_MULTIPLY(`x`, -1)"),
    ("-1", "duckdb", "-1"),
    ("-1", "spark", "-1"),
    ('abs("x")', "duckdb", 'TRY(ABS("x"))'),
    ('abs("x")', "postgres", f'CASE WHEN ABS(CAST("x" AS DECIMAL)) {PG_FITS} THEN ABS(("x")) END'),
    ('abs("x")', "spark", "CASE WHEN `x` < 0 THEN TRY_MULTIPLY(`x`, -1) ELSE `x` END"),
    # casts: TRY_CAST semantics
    ('CAST("t" AS INTEGER)', "duckdb", "CASE WHEN TYPEOF(\"t\") <> 'VARCHAR' OR "
     f"(REGEXP_MATCHES(TRY_CAST(\"t\" AS TEXT), '{INT_RE}')) THEN TRY_CAST(\"t\" AS INT) END"),
    ('CAST("t" AS DOUBLE)', "duckdb", "CASE WHEN TYPEOF(\"t\") <> 'VARCHAR' OR "
     f"(REGEXP_MATCHES(TRY_CAST(\"t\" AS TEXT), '{NUMBER_RE}') OR "
     f"REGEXP_MATCHES(TRY_CAST(\"t\" AS TEXT), '{SPECIAL_RE}')) THEN "
     'TRY_CAST("t" AS DOUBLE) END'),
    ('CAST("t" AS DATE)', "duckdb", 'TRY_CAST("t" AS DATE)'),
    ('CAST("t" AS INTEGER)', "postgres", f"CASE WHEN \"t\" ~ '{INT_RE}' AND "
     'CAST(TRIM("t") AS DECIMAL) BETWEEN -2147483648 AND 2147483647 THEN CAST(TRIM("t") AS INT) '
     "END"),
    ('CAST("t" AS INTEGER)', "spark", "CASE WHEN TYPEOF(`t`) <> 'string' OR (TRY_CAST(`t` AS "
     f"STRING) RLIKE '{spark_text(INT_RE)}') THEN CASE WHEN TYPEOF(`t`) IN ('double', 'float') "
     "THEN TRY_CAST(BROUND(TRY_CAST(`t` AS DOUBLE), 0) AS INT) ELSE TRY_CAST(`t` AS INT) END END"),
    ('TRY_CAST("t" AS DATE)', "spark", "TRY_CAST(`t` AS DATE)"),
    ('CAST("f" AS SMALLINT)', "postgres", 'CASE WHEN "f" >= -32768.5 AND "f" < 32767.5 THEN '
     'CAST("f" AS SMALLINT) END'),
    # domains: shared rules, each engine's log by its own name
    ('ln("f")', "duckdb", 'CASE WHEN TRY_CAST("f" AS DOUBLE) > 0 THEN LN(TRY_CAST("f" AS DOUBLE))'
     " END"),
    ('ln("f")', "postgres", 'CASE WHEN CAST("f" AS DOUBLE PRECISION) > 0 THEN '
     'LN(CAST("f" AS DOUBLE PRECISION)) END'),
    ('ln("f")', "spark", "CASE WHEN TRY_CAST(`f` AS DOUBLE) > 0 THEN LN(TRY_CAST(`f` AS DOUBLE))"
     " END"),
    ('log("f")', "duckdb", 'CASE WHEN TRY_CAST("f" AS DOUBLE) > 0 THEN '
     'LOG(TRY_CAST("f" AS DOUBLE)) END'),
    ('log("f")', "postgres", 'CASE WHEN CAST("f" AS DOUBLE PRECISION) > 0 THEN '
     'LOG(CAST("f" AS DOUBLE PRECISION)) END'),
    ('log("f")', "spark", "CASE WHEN TRY_CAST(`f` AS DOUBLE) > 0 THEN "
     "LOG10(TRY_CAST(`f` AS DOUBLE)) END"),
    ('log10("f")', "postgres", 'CASE WHEN CAST("f" AS DOUBLE PRECISION) > 0 AND '
     "CAST(10 AS DOUBLE PRECISION) > 0 AND CAST(10 AS DOUBLE PRECISION) <> 1 THEN "
     'LOG(CAST("f" AS DOUBLE PRECISION)) END'),
    ('log2("f")', "duckdb", 'CASE WHEN TRY_CAST("f" AS DOUBLE) > 0 AND TRY_CAST(2 AS DOUBLE) > 0 '
     'AND TRY_CAST(2 AS DOUBLE) <> 1 THEN LOG(TRY_CAST(2 AS DOUBLE), TRY_CAST("f" AS DOUBLE)) '
     "END"),
    ('log2("f")', "postgres", 'CASE WHEN CAST("f" AS DOUBLE PRECISION) > 0 AND '
     "CAST(2 AS DOUBLE PRECISION) > 0 AND CAST(2 AS DOUBLE PRECISION) <> 1 THEN "
     'LN(CAST("f" AS DOUBLE PRECISION)) / LN(CAST(2 AS DOUBLE PRECISION)) END'),
    ('log2("f")', "spark", "CASE WHEN TRY_CAST(`f` AS DOUBLE) > 0 AND TRY_CAST(2 AS DOUBLE) > 0 "
     "AND TRY_CAST(2 AS DOUBLE) <> 1 THEN LOG2(TRY_CAST(`f` AS DOUBLE)) END"),
    ('sqrt("f")', "duckdb", 'CASE WHEN TRY_CAST("f" AS DOUBLE) >= 0 THEN '
     'SQRT(TRY_CAST("f" AS DOUBLE)) END'),
    ('sqrt("f")', "postgres", 'CASE WHEN CAST("f" AS DOUBLE PRECISION) >= 0 THEN '
     'SQRT(CAST("f" AS DOUBLE PRECISION)) END'),
    ('pow("f", 0.5)', "duckdb", 'CASE WHEN NOT ((TRY_CAST("f" AS DOUBLE) = 0 AND '
     'TRY_CAST(0.5 AS DOUBLE) < 0) OR (TRY_CAST("f" AS DOUBLE) < 0 AND '
     "ABS(TRY_CAST(0.5 AS DOUBLE)) < 9007199254740992 AND TRY_CAST(0.5 AS DOUBLE) <> "
     'FLOOR(TRY_CAST(0.5 AS DOUBLE)))) THEN POWER(TRY_CAST("f" AS DOUBLE), '
     "TRY_CAST(0.5 AS DOUBLE)) END"),
    # doubles are IEEE beyond their range: DuckDB and Spark natively, PostgreSQL by its rule
    ('exp("f")', "duckdb", 'EXP("f")'),
    ('exp("f")', "spark", "EXP(`f`)"),
    ('exp("f")', "postgres", "CASE WHEN CAST(\"f\" AS DOUBLE PRECISION) = CAST('NaN' AS DOUBLE "
     "PRECISION) THEN CAST('NaN' AS DOUBLE PRECISION) WHEN CAST(\"f\" AS DOUBLE PRECISION) > "
     "CAST(709.78 AS DOUBLE PRECISION) THEN CAST('Infinity' AS DOUBLE PRECISION) WHEN "
     'CAST("f" AS DOUBLE PRECISION) < CAST(-745.13 AS DOUBLE PRECISION) THEN '
     'CAST(0.0 AS DOUBLE PRECISION) ELSE EXP(CAST("f" AS DOUBLE PRECISION)) END'),
    # text, dates, logic
    ('substring("t", 1, "x")', "duckdb",
     'CASE WHEN "x" BETWEEN 0 AND 2147483647 THEN SUBSTRING("t", 1, "x") END'),
    ('substring("t", 1, "x")', "postgres",
     'CASE WHEN "x" BETWEEN 0 AND 2147483647 THEN SUBSTRING("t" FROM 1 FOR "x") END'),
    ('substring("t", 2)', "spark", "SUBSTRING(`t`, 2)"),
    ('substring("t", "x", 2)', "spark", "CASE WHEN `x` BETWEEN -2147483647 AND 2147483647 THEN "
     "CASE WHEN `x` = 0 THEN SUBSTRING(`t`, 1, (2) - 1L) ELSE SUBSTRING(`t`, `x`, 2) END END"),
    ('substring("t", "x")', "postgres", 'CASE WHEN "x" BETWEEN -2147483647 AND 2147483647 THEN '
     'SUBSTRING("t" FROM CASE WHEN "x" < 0 THEN LENGTH("t") + ("x") + 1 ELSE "x" END) END'),
    ('left("t", "x")', "duckdb",
     'CASE WHEN "x" BETWEEN -2147483647 AND 2147483647 THEN LEFT("t", "x") END'),
    ('left("t", 3)', "duckdb", 'LEFT("t", 3)'),
    ('left("t", "x")', "spark", "CASE WHEN `x` BETWEEN -2147483647 AND 2147483647 THEN CASE "
     "WHEN `x` < 0 THEN LEFT(`t`, GREATEST(LENGTH(`t`) + (`x`), 0)) ELSE LEFT(`t`, `x`) END END"),
    ("\"t\" LIKE 'a%'", "duckdb", "\"t\" LIKE 'a%'"),
    ("\"t\" LIKE 'a%'", "spark", "`t` LIKE 'a%'"),
    ("regexp_matches(\"t\", '^a')", "duckdb", "TRY(REGEXP_MATCHES(\"t\", '^a'))"),
    ("regexp_matches(\"t\", '^a')", "postgres", "\"t\" ~ '^a'"),
    ('year("d")', "duckdb", 'YEAR("d")'),
    ('year("d")', "postgres", 'CASE WHEN ISFINITE("d") THEN CAST(EXTRACT(YEAR FROM "d") AS '
     "BIGINT) END"),
    ('week("d")', "spark", "WEEKOFYEAR(`d`)"),
    ('dayofweek("d")', "spark", "(DAYOFWEEK(`d`) - 1L)"),
    ('NOT ("x" > 1) OR "y" IS NULL', "duckdb", 'NOT ("x" > 1) OR "y" IS NULL'),
    ('NOT ("x" > 1) OR "y" IS NULL', "postgres", 'NOT ("x" > 1) OR "y" IS NULL'),
    ('round("f")', "postgres", 'SIGN("f") * FLOOR(ABS("f") + '
     "CAST(0.49999999999999994 AS DOUBLE PRECISION))"),
]


@pytest.mark.parametrize("text, dialect, expected", WRITES,
                         ids=[f"{d}-{t}" for t, d, _ in WRITES])
def test_the_rule_table_writes(text: str, dialect: str, expected: str) -> None:
    assert write(dialect, text) == expected


def test_postgres_guards_division_and_power_before_they_could_raise() -> None:
    division = write("postgres", '"x" / "f"')
    assert division.startswith('CASE WHEN CAST("f" AS DOUBLE PRECISION) = 0 THEN NULL WHEN ')
    power = write("postgres", 'pow("f", 0.5)')
    assert power.startswith('CASE WHEN NOT NOT ((CAST("f" AS DOUBLE PRECISION) = 0 AND ')
    assert "CAST('Infinity' AS DOUBLE PRECISION)" in power  # IEEE beyond the range


@pytest.mark.parametrize("dialect", sorted(TABLES))
def test_every_node_of_the_scalar_subset_has_a_rule(dialect: str) -> None:
    """The shared table covers the checked subset; an engine's table overrides entries."""
    rules = TABLES[dialect]
    missing = [kind.__name__ for kind in ex._ALLOWED if kind is not exp.WidthBucket
               and not any(k in rules for k in kind.__mro__)]
    assert missing == []
    assert set(_total.RULES) <= set(rules)


def test_engine_tables_override_the_shared_one_entry_by_entry() -> None:
    changed = {name: sorted(k.__name__ for k, v in rules.items() if _total.RULES.get(k) is not v)
               for name, rules in TABLES.items()}
    # DuckDB's implicit casts (``_total.implicit_casts``, ``number_arguments``): comparisons,
    # CASE and the like, conditions, and functions whose number arguments it converts
    implicit = ["EQ", "NEQ", "GT", "GTE", "LT", "LTE", "NullSafeEQ", "NullSafeNEQ", "In",
                "Between", "Nullif", "Coalesce", "Greatest", "Least", "Case", "If", "And",
                "Or", "Not", "Xor", "Is", "Mod", "Substring", "Exp", "Left", "Right",
                "Interval"]
    # and its date parts and units, checked once on a constant (a clearer refusal)
    parts = ["DateTrunc", "Extract", "TimestampTrunc"]
    assert changed["duckdb"] == sorted(["Abs", "Add", "Cast", "Ceil", "Floor", "ILike",
                                        "IntDiv", "Like", "Mul", "Neg", "RegexpLike", "Round",
                                        "Sub", *implicit, *parts])
    assert changed["spark"] == sorted(["Abs", "Add", "Cast", "Ceil", "DayOfWeek", "Floor",
                                       "ILike", "Left", "Like", "Log", "Mul", "Neg",
                                       "RegexpLike", "Right", "Sub", "Substring", "Week"])
    assert {"Add", "Cast", "Div", "Exp", "Interval", "Log", "Pow", "Substring"} <= set(
        changed["postgres"])


@pytest.mark.parametrize("dialect, text", [
    ("postgres", '"t" LIKE "g"'), ("spark", '"t" LIKE "g"'),
    ("spark", 'regexp_matches("t", "g")'), ("postgres", '"d" + INTERVAL 1 DAY > "d"'),
    ("postgres", '"t" LIKE \'a\\\''), ("postgres", '"x" // "f" > 1'),
])
def test_what_an_engine_cannot_make_total_is_refused_before_it_runs(dialect: str,
                                                                    text: str) -> None:
    with pytest.raises(UserError):
        write(dialect, text)


@pytest.mark.parametrize("pattern", ["(a|b)*c", "(", "a"])
def test_spark_refuses_every_regular_expression_before_it_runs(pattern: str) -> None:
    """a bug hunt: Java's backtracking regular expressions overflowed the executor's stack on
    one long value ('(a|b)*c' on 'ab' * 50,000) and a malformed one ('(') failed when Spark
    compiled it, both after the charge: refused, with the reason and LIKE suggested."""
    with pytest.raises(UserError, match=r"not supported on Spark.*LIKE"):
        write("spark", f"regexp_matches(\"t\", '{pattern}')")


@pytest.mark.parametrize("text, written", [
    (r"""  "t" LIKE '\a'  """, r"""`t` LIKE '\\\\a'"""),  # the pattern \\a: backslash, a
    (r"""  "t" ILIKE 'x\%\\_'  """, r"""`t` ILIKE 'x\\\\%\\\\\\\\_'"""),
    (r"""  "t" LIKE 'a%b_'  """, r"""`t` LIKE 'a%b_'"""),
])
def test_spark_reads_a_backslash_in_like_as_duckdb_does(text: str, written: str) -> None:
    """a bug hunt: Spark's LIKE escapes with a backslash and failed on '\\a' (a backslash
    before an ordinary character) when it compiled the pattern, after the charge; DuckDB's
    LIKE has no escape character. Each backslash is doubled (Spark's escaped backslash, and
    its string literal doubles it again)."""
    assert write("spark", text.strip()) == written


def test_duckdb_takes_a_pattern_from_the_data_under_a_try_of_its_own() -> None:
    assert write("duckdb", 'regexp_matches("t", "g")') == 'TRY(REGEXP_MATCHES("t", "g"))'


# -- the meaning, executed on DuckDB ---------------------------------------------------------

INF, NAN = math.inf, math.nan
MIN64, MAX64 = -2**63, 2**63 - 1
# (expression over x and y, rows of (x, y), the value for each row: None is NULL)
MEANING: list[tuple[str, list[tuple[Any, Any]], list[Any]]] = [
    ('"x" / "y"', [(1.0, 0.0), (0.0, 0.0), (-1.0, 0.0), (1.0, 4.0), (1e308, 1e-10)],
     [None, None, None, 0.25, INF]),
    ('"x" // "y"', [(7, 0), (7, -2), (MIN64, -1), (MIN64, 1)], [None, -3, None, MIN64]),
    ('"x" % "y"', [(7, 0), (-7, 2), (MIN64, -1)], [None, -1, 0]),
    ('"x" + "y"', [(MAX64, 1), (MAX64, 0), (MIN64, -1)], [None, MAX64, None]),
    ('"x" - "y"', [(MIN64, 1), (0, MIN64)], [None, None]),
    ('"x" * "y"', [(2**62, 2), (2**31, 2**31), (-2**62, 2)], [None, 2**62, MIN64]),
    ('-"x"', [(MIN64, 0), (MAX64, 0)], [None, -MAX64]),
    ('abs("x")', [(MIN64, 0), (-5, 0)], [None, 5]),
    ('ln("x")', [(0.0, 0), (-1.0, 0), (1.0, 0), (INF, 0), (-INF, 0)], [None, None, 0.0, INF, None]),
    ('log10("x")', [(0.0, 0), (-3.0, 0), (1000.0, 0)], [None, None, 3.0]),
    ('log2("x")', [(0.0, 0), (8.0, 0)], [None, 3.0]),
    ('log("y", "x")', [(8.0, 2.0), (8.0, 1.0), (8.0, 0.0), (8.0, -2.0)], [3.0, None, None, None]),
    ('sqrt("x")', [(-1.0, 0), (-INF, 0), (4.0, 0), (-0.0, 0)], [None, None, 2.0, -0.0]),
    ('pow("x", "y")', [(0.0, -1.0), (-8.0, 0.5), (-2.0, 3.0), (10.0, 400.0), (-INF, 0.5),
                       (2.0, -1100.0)], [None, None, -8.0, INF, None, 0.0]),
    ('exp("x")', [(1000.0, 0), (-1000.0, 0), (0.0, 0)], [INF, 0.0, 1.0]),
    ('"x" * "y"', [(1e308, 10.0), (1e-308, 1e-308)], [INF, 0.0]),
    ('substring(\'hello\', 2, CAST("x" AS INTEGER))', [(-1, 0), (2, 0)], [None, "el"]),
    ('substring(\'hello\', CAST("x" AS INTEGER), 2)', [(-2, 0), (0, 0), (-9, 0)],
     ["lo", "h", ""]),
    # positions DuckDB refuses past +-2^32 (raised after the charge: a bug hunt) are NULL
    ('substring(\'hello\', "x", 1)', [(-2**40, 0), (2**40, 0), (-2**31, 0), (2, 0)],
     [None, None, None, "e"]),
    ('substring(\'hello\', 1, "x")', [(2**40, 0), (2**31 - 1, 0), (2, 0)],
     [None, "hello", "he"]),
    ('left(\'hello\', "x")', [(2**40, 0), (-2**40, 0), (2, 0)], [None, None, "he"]),
    ('right(\'hello\', "x")', [(2**40, 0), (2, 0)], [None, "lo"]),
    ('CAST("x" AS INTEGER)', [("12", 0), ("x", 0), ("99999999999", 0), (" -7 ", 0), ("1.5", 0),
                              ("1e3", 0), ("0x10", 0), ("1_000", 0)],
     [12, None, None, -7, None, None, None, None]),
    ('CAST("x" AS DOUBLE)', [("1e400", 0), ("-1e400", 0), ("1e-400", 0), ("Infinity", 0),
                             ("1_0", 0), ("1d", 0), (" .5 ", 0)],
     [INF, -INF, 0.0, INF, None, None, 0.5]),
    ('CAST("x" AS INTEGER)', [(2.5, 0), (3.5, 0), (-2.5, 0), (-2147483648.5, 0),
                              (2147483647.5, 0)], [2, 4, -2, -2147483648, None]),
    # NULL propagates by three-valued logic: it never nulls the whole expression
    ('ln("x") > 0.5 OR "y" = 0', [(0.0, 0), (0.0, 1), (3.0, 1)], [True, None, True]),
    ('NOT (ln("x") > 0.5)', [(0.0, 0), (1.0, 0), (3.0, 0)], [None, True, False]),
    ('coalesce(1 / "x", -1)', [(0, 0), (4, 0)], [-1.0, 0.25]),
    # width_bucket as PostgreSQL and Spark: descending bounds count down from the first (a
    # bug hunt: every value fell in bin 0); NaN lies above every number, NULL stays NULL
    ('width_bucket("x", 0, 10, 5)', [(-0.5, 0), (0.0, 0), (1.99, 0), (2.0, 0), (9.99, 0),
                                     (10.0, 0), (NAN, 0), (None, 0)],
     [0, 1, 1, 2, 5, 6, 6, None]),
    ('width_bucket("x", 10, 0, 5)', [(10.5, 0), (10.0, 0), (9.5, 0), (8.0, 0), (7.99, 0),
                                     (0.5, 0), (0.0, 0), (-1.0, 0), (NAN, 0), (None, 0)],
     [0, 1, 1, 2, 2, 5, 6, 6, 0, None]),
    ('width_bucket("x", 5, -5, 4)', [(5.0, 0), (2.5, 0), (2.49, 0), (-5.0, 0), (-4.99, 0)],
     [1, 2, 2, 5, 4]),
]


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, float) and isinstance(got, float):
        return (math.isnan(got) and math.isnan(want)) or (
            got == want and math.copysign(1, got) == math.copysign(1, want))
    return (bool(got == want) and type(got) is not bool) or got is want


@pytest.mark.parametrize("text, rows, expected", MEANING, ids=[m[0] for m in MEANING])
def test_on_duckdb_the_failing_operation_is_null(text: str, rows: list[tuple[Any, Any]],
                                                 expected: list[Any]) -> None:
    con = duckdb.connect()
    x_type = "VARCHAR" if isinstance(rows[0][0], str) else \
        "DOUBLE" if isinstance(rows[0][0], float) else "BIGINT"
    y_type = "DOUBLE" if isinstance(rows[0][1], float) else "BIGINT"
    con.execute(f"CREATE TABLE t (i INTEGER, x {x_type}, y {y_type})")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", [(i, *r) for i, r in enumerate(rows)])
    sql = _total.total(ex.canonical(ex.parse_scalar(text, "test")), dd.RULES,
                       "DuckDB").sql("duckdb")
    got = [r[0] for r in con.execute(f"SELECT {sql} FROM t ORDER BY i").fetchall()]
    assert all(_same(g, w) for g, w in zip(got, expected, strict=True)), (got, expected)
