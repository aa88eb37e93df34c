"""Fuzzing the inputs an analyst controls: every outcome is an answer or a one-line user error.

(a) The SQL front end: queries built from DP SQL pieces (valid and not), mutations of valid
    queries and arbitrary text, with arbitrary privacy parameters, through ``Curator.sql``.
    Each call returns a ``Release`` or raises a ``UserError`` whose message is one line and
    quotes no record; a refused query leaves the budget as it was.
(b) The command line: random values for the options of ``query``, ``explain``, ``account`` and
    ``survey``. Each run exits with status 0 or 2, never shows a traceback, and with ``--json``
    prints exactly one JSON object on stdout (``{"error", "type"}`` when it exits with 2).

Deterministic (``derandomize=True``): the same examples on every run.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import dpcurator as dp
from dpcurator.cli import app
from dpcurator.curator import Curator, Release
from dpcurator.errors import UserError
from dpcurator.noise import SeededRandom

SECRET = "Zebulon"  # a value of the data: no error message may contain it
FUZZ = settings(derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# -- (a) the SQL front end --------------------------------------------------------------------

COLUMNS = ["uid", "x", "n", "s", "d", "b", "X", '"x"', "missing", "data.x"]
LITERALS = ["0", "1", "-1", "2.5", "1e308", "1e400", "99999999999999999999999999", "'a'",
            "'2020-01-01'", "NULL", "TRUE", "''", "'%'", "DATE '2020-01-01'",
            "INTERVAL 1 DAY", "9" * 400]
FUNCTIONS = ["abs({})", "upper({})", "length({})", "substr({}, {}, {})", "year({})",
             "date_trunc('month', {})", "CAST({} AS INTEGER)", "TRY_CAST({} AS DATE)",
             "{} / {}", "{} // {}", "{} % {}", "ln({})", "sqrt({})", "{} || {}",
             "CASE WHEN {} THEN 'a' ELSE 'b' END", "width_bucket({}, {}, {}, {})",
             "{} LIKE {}", "{} IN ({}, {})", "{} BETWEEN {} AND {}", "random()",
             "read_csv('x')", "(SELECT 1)", "concat({}, {})", "greatest({}, {})",
             "{} IS NULL", "NOT {}", "{} AND {}", "{} = {}", "{} < {}", "({})"]
AGGREGATES = ["COUNT(*)", "COUNT(DISTINCT uid)", "SUM({c})", "AVG({c})", "VARIANCE({c})",
              "STDDEV({c})", "MEDIAN({c})", "QUANTILE_CONT({c}, {q})",
              "PERCENTILE_CONT({q}) WITHIN GROUP (ORDER BY {c})", "COUNT({c})", "MAX({c})",
              "SUM({c} + 1)", "COUNT(*) FILTER (WHERE x > 0)", "SUM(DISTINCT {c})"]
VALID = [
    "SELECT COUNT(*) AS n FROM data",
    "SELECT s, COUNT(*) AS n, AVG(x) AS m FROM data GROUP BY s",
    "SELECT SUM(x) AS t FROM data WHERE n > 3 AND s <> 'a'",
    "SELECT CASE WHEN x < 0 THEN 'neg' ELSE 'pos' END AS sign, COUNT(*) AS n FROM data "
    "GROUP BY 1",
    "SELECT width_bucket(x, -5, 5, 4) AS bin, MEDIAN(x) AS med FROM data GROUP BY bin",
    "SELECT year(d) AS y, STDDEV(n) AS sd FROM data GROUP BY y",
]


@functools.cache
def sql_curator() -> Curator:
    n = 120
    frame = pd.DataFrame({"uid": np.arange(n) % 40, "x": np.linspace(-5, 5, n),
                          "n": np.arange(n), "s": [f"s{i % 3}" for i in range(n)],
                          "d": pd.date_range("2020-01-01", periods=n),
                          "b": np.arange(n) % 2 == 0})
    frame.loc[5, "s"] = SECRET
    return Curator(frame, privacy_unit="uid", budget=dp.ApproxDP(1e12, 1e-3), cache=False,
                   source=SeededRandom(7))


def expressions() -> st.SearchStrategy[str]:
    leaves = st.sampled_from(["uid", "x", "n", "s", "d", "b"]) | st.sampled_from(
        COLUMNS + LITERALS)

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.tuples(st.sampled_from(FUNCTIONS), st.lists(inner, min_size=4,
                                                               max_size=4)).map(
            lambda t: t[0].format(*t[1][:t[0].count("{}")]))

    return st.recursive(leaves, extend, max_leaves=6)


KEYS = ["s", "b", "year(d)", "width_bucket(x, -5, 5, 4)", "CASE WHEN x < 0 THEN 'a' END",
        "n % 3", "upper(s)"]
PREDICATES = ["x > 0", "s <> 'a'", "n BETWEEN 3 AND 50", "b", "d < DATE '2020-02-01'",
              "length(s) = 2 OR x IS NULL", "s LIKE 's%'", "n / 0 > 1", "CAST(s AS INT) > 1"]


def mostly(good: list[str], other: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A good choice three times in four, else ``other``."""
    return st.one_of(st.sampled_from(good), st.sampled_from(good), st.sampled_from(good),
                     other)


@st.composite
def queries(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["built"] * 6 + ["mutated", "text"]))
    if kind == "text":
        return draw(st.text(max_size=80))
    if kind == "mutated":
        text = list(draw(st.sampled_from(VALID)))
        for _ in range(draw(st.integers(1, 4))):
            position = draw(st.integers(0, len(text)))
            if draw(st.booleans()) and position < len(text):
                del text[position]
            else:
                text.insert(position, draw(st.sampled_from(list("()',;*\"x0 -+%/"))))
        return "".join(text)
    items = []
    for template in draw(st.lists(mostly(AGGREGATES[:9], st.sampled_from(AGGREGATES)),
                                  min_size=1, max_size=3, unique=True)):
        column = draw(mostly(["x", "n", "b"], st.sampled_from(COLUMNS)))
        q = draw(mostly(["0.5", "0.9"], st.sampled_from(["2", "'a'", "1e400"])))
        items.append(template.replace("{c}", column).replace("{q}", q))
    items = [f"{item} AS a{i}" for i, item in enumerate(items)]
    if draw(st.sampled_from([False] * 9 + [True])):
        items[0] = items[0].replace(" AS a0", draw(st.sampled_from(["", " AS __z", " AS a1"])))
    group = draw(st.lists(mostly(KEYS, expressions()), max_size=2, unique=True))
    items = [f"{g} AS k{i}" for i, g in enumerate(group)] + items
    source = draw(mostly(["data"], st.sampled_from(["DATA", "other", "data t", "data, data",
                                                    "(SELECT * FROM data)"])))
    text = f"SELECT {', '.join(items)} FROM {source}"
    if draw(st.booleans()):
        text += f" WHERE {draw(mostly(PREDICATES, expressions()))}"
    if group:
        text += " GROUP BY " + ", ".join(
            group if draw(st.booleans()) else [str(i + 1) for i in range(len(group))])
    if draw(st.sampled_from([False] * 9 + [True])):
        text += draw(st.sampled_from([" HAVING COUNT(*) > 1", " ORDER BY 1", " LIMIT 1",
                                      "; DROP TABLE data", " UNION SELECT 1"]))
    return text


GOOD_BOUNDS = {"x": (-5, 5), "n": (0, 200), "b": (0, 1)}


def privacy() -> st.SearchStrategy[dict[str, Any]]:
    """Mostly sound parameters (so that queries reach the engine), sometimes odd ones."""
    sound = st.fixed_dictionaries({"epsilon": st.sampled_from([1.0, 0.3]),
                                   "delta": st.just(1e-6), "bounds": st.just(GOOD_BOUNDS)},
                                  optional={"keys": st.just(["s0", "s1"]),
                                            "max_partitions": st.sampled_from([1, 3]),
                                            "max_rows_per_partition": st.sampled_from([1, 4]),
                                            "noise": st.just("gaussian"),
                                            "bounding": st.just("sample"),
                                            "bounds_share": st.sampled_from([0.05, 0.5]),
                                            "intervals": st.sampled_from(["total",
                                                                          "bounded"]),
                                            "total_share": st.sampled_from([0.05, 0.3])})
    odd_numbers = [0, -1, float("nan"), float("inf"), 1e-9, 1e300, "1", None, True]
    odd = st.fixed_dictionaries({"epsilon": st.sampled_from([1.0, *odd_numbers])}, optional={
        "delta": st.sampled_from([1e-6, 0, 0.5, 2e-3, -1, "x"]),
        "bounds": st.sampled_from([
            GOOD_BOUNDS, {"X": (-5, 5)}, {"n": (0, 1e16)}, {"x": (1, 0)}, {"x": "a"},
            {"missing": (0, 1)}, {"x": (0, float("nan"))}, {"s": (0, 1)}, {1: (0, 1)}, "x",
            {"x": (0, 1), "X": (0, 2)}, {"x": (0, 1e-300)}]),
        "keys": st.sampled_from([["s0", "s1"], [1, 2], [("a", 1)], [], [None], ["s0", "s0"],
                                 [[1, 2, 3]], "abc", 5, [float("nan")], [{"a": 1}]]),
        "max_partitions": st.sampled_from([1, 2, 0, -1, 10**9, 2.5]),
        "max_rows_per_partition": st.sampled_from([1, 5, 0, 10**7]),
        "bounding": st.sampled_from(["sample", "rescale", "x"]),
        "noise": st.sampled_from(["gaussian", "laplace", "x"]),
        "weights": st.sampled_from([{"a0": 2}, {"zz": 1}, {"a0": -1}, {"a0": "x"}, [1]]),
        "confidence": st.sampled_from([0.5, 1, 0, 2, float("nan"), "x"]),
        "bounds_share": st.sampled_from([0.1, 0, 1, -0.5, 2, float("nan"), "x", True, None]),
        "intervals": st.sampled_from(["total", "bounded", "x", 1, None, True]),
        "total_share": st.sampled_from([0.1, 0, 1, -0.5, 2, float("nan"), "x", True, None]),
    })
    return st.one_of(sound, sound, odd)


@settings(FUZZ, max_examples=250)
@given(sql=queries(), options=privacy())
def test_sql_front_end_answers_or_refuses_cleanly(sql: str, options: dict[str, Any]) -> None:
    curator = sql_curator()
    before = (curator.spent, len(curator.ledger))
    try:
        release = curator.sql(sql, **options)
    except UserError as exc:
        message = str(exc)
        assert message and "\n" not in message, message
        assert SECRET not in message
        assert (curator.spent, len(curator.ledger)) == before, "a refused query was charged"
        return
    assert isinstance(release, Release)
    assert len(curator.ledger) == before[1] + 1


# -- (b) the command line ---------------------------------------------------------------------

ODD_NUMBERS = ["0", "-1", "nan", "inf", "1e-999999999", "1e309", "abc", "", "1e6", "0.9999"]
ODD_INTEGERS = ["0", "-5", "abc", "1e3", "2.5", "99999999999999999999"]


@functools.cache
def files() -> dict[str, str]:
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="dpcurator-fuzz-"))
    shop = folder / "shop.csv"
    rng = np.random.default_rng(2)
    pd.DataFrame({"uid": rng.integers(0, 30, 200), "amount": rng.uniform(0, 10, 200),
                  "region": rng.choice(["n", "s"], 200)}).to_csv(shop, index=False)
    keys = folder / "keys.csv"
    keys.write_text("region\nn\ns\nw\n", encoding="utf-8")
    blob = folder / "blob.csv"
    blob.write_bytes(bytes(range(256)) * 8)
    reports = folder / "reports.jsonl"
    reports.write_text('{"mechanism": "rr", "y": 1}\n{"y": 0}\nnot json\n', encoding="utf-8")
    good_config = folder / "good.json"
    good_config.write_text(json.dumps({"format": "dpcurator-survey/1", "mechanism": "rr",
                                       "epsilon": 1.0, "params": {"p": "1/2"}}),
                           encoding="utf-8")
    bad_config = folder / "bad.json"
    bad_config.write_text(json.dumps({"format": "dpcurator-survey/1", "mechanism": "rr",
                                      "epsilon": 1.0, "params": {"p": "1e-999999999"}}),
                          encoding="utf-8")
    return {"shop": str(shop), "keys": str(keys), "blob": str(blob), "dir": str(folder),
            "missing": str(folder / "missing.csv"), "reports": str(reports),
            "good_config": str(good_config), "bad_config": str(bad_config)}


def _path(good: str, *odd: str) -> st.SearchStrategy[str]:
    return mostly([good], st.sampled_from(odd)).map(lambda name: files()[name])


def _number(*good: str) -> st.SearchStrategy[str]:
    return mostly(list(good), st.sampled_from(ODD_NUMBERS))


def _integer(*good: str) -> st.SearchStrategy[str]:
    return mostly(list(good), st.sampled_from(ODD_INTEGERS))


SQL = mostly(["SELECT COUNT(*) AS n FROM data",
              "SELECT region, COUNT(*) AS n FROM data GROUP BY region",
              "SELECT SUM(AMOUNT) AS s FROM data", "SELECT AVG(amount) AS m FROM data"],
             st.sampled_from(["SELECT uid, COUNT(*) FROM data GROUP BY uid",
                              "DELETE FROM data", "SELECT", "",
                              "SELECT COUNT(*) FROM data; --"]))
# Each command's options: name -> values (None: a flag), and the options it needs.
Options = dict[str, st.SearchStrategy[str] | None]
COMMANDS: dict[tuple[str, ...], tuple[Options, tuple[str, ...]]] = {
    ("query",): ({
        "": _path("shop", "blob", "dir", "missing"), "--sql": SQL,
        "--privacy-unit": mostly(["uid", "UID"], st.sampled_from(["nope", ""])),
        "--epsilon": _number("1", "0.5"), "--delta": _number("1e-6", "0"),
        "--bounds": mostly(["amount=0:10"], st.sampled_from([
            "AMOUNT=0:1e16", "x", "amount=a:b", "amount=1:0", "amount=nan:1", "nope=0:1"])),
        "--keys": _path("keys", "blob", "dir", "missing"),
        "--max-partitions": _integer("1", "2"),
        "--max-rows-per-partition": _integer("1", "3"),
        "--bounds-share": _number("0.1", "0.3"),
        "--intervals": mostly(["total", "bounded"], st.sampled_from(["x", ""])),
        "--total-share": _number("0.1", "0.3"),
        "--noise": mostly(["laplace", "gaussian"], st.just("x")),
        "--confidence": _number("0.9", "0.95"),
        "--one-row-per-person": None, "--allow-large-delta": None},
        ("", "--sql", "--epsilon", "--privacy-unit")),
    ("explain",): ({"--epsilon": _number("1", "0.1"), "--prior": _number("0.5", "0.01"),
                    "--delta": _number("0", "1e-6")}, ("--epsilon",)),
    ("account", "dpsgd"): ({
        "--sampling-rate": _number("0.01", "0.5"), "--steps": _integer("10", "1000"),
        "--delta": _number("1e-5"), "--noise-multiplier": _number("1", "2"),
        "--target-epsilon": _number("1", "3"),
        "--method": mostly(["best", "pld", "rdp"], st.just("x"))},
        ("--sampling-rate", "--steps", "--delta")),
    ("account", "compose"): ({
        "--mechanism": mostly(["gaussian", "laplace", "randomized-response"], st.just("x")),
        "--times": _integer("1", "16"), "--delta": _number("1e-6"), "--noise": _number("4"),
        "--sensitivity": _number("1"), "--epsilon": _number("1")}, ("--mechanism",)),
    ("account", "convert"): ({
        "--from": mostly(["pure", "zcdp", "gdp"], st.just("x")), "--delta": _number("1e-6"),
        "--epsilon": _number("1"), "--rho": _number("0.5"), "--mu": _number("1")},
        ("--from",)),
    ("survey", "simulate"): ({
        "--mechanism": mostly(["rr", "oue", "duchi", "auto"], st.just("x")),
        "--epsilon": _number("1", "2"), "--n": _integer("100", "1000"),
        "--true-rate": _number("0.3", "0.5"),
        "--true-frequencies": mostly(["0.5,0.5", "0.2,0.8"],
                                     st.sampled_from(["1", "a,b", "0.2,0.9", ""])),
        "--categories": mostly(["a,b"], st.sampled_from(["a,,b", "x"])),
        "--low": _number("0"), "--high": _number("1"), "--confidence": _number("0.95"),
        "--exact": None}, ("--epsilon", "--n")),
    ("survey", "estimate"): ({
        "": _path("reports", "missing", "blob", "dir"),
        "--mechanism": mostly(["rr"], st.sampled_from(["oue", "auto", "x"])),
        "--epsilon": _number("1"), "--config": _path("good_config", "bad_config", "blob",
                                                     "missing"),
        "--categories": mostly(["a,b"], st.just("x")), "--k": _integer("2"),
        "--confidence": _number("0.95")}, ("",)),
    ("survey", "plan"): ({
        "--mechanism": mostly(["rr", "oue", "duchi"], st.just("x")),
        "--epsilon": _number("1"), "--margin": _number("0.05", "0.1"),
        "--confidence": _number("0.95"), "--rate": _number("0.3"), "--k": _integer("4")},
        ("--epsilon", "--margin")),
    ("survey", "config"): ({
        "--mechanism": mostly(["rr", "olh", "piecewise"], st.just("x")),
        "--epsilon": _number("1"), "--categories": mostly(["a,b"], st.just("x")),
        "--k": _integer("3")}, ("--epsilon",)),
}


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    command = draw(st.sampled_from(sorted(COMMANDS)))
    options, needed = COMMANDS[command]
    names = list(needed) if draw(st.sampled_from([True] * 5 + [False])) else []
    names += draw(st.lists(st.sampled_from(sorted(set(options) - set(names))), unique=True,
                           max_size=3))
    args = list(command)
    for name in names:
        values = options[name]
        if values is None:
            args.append(name)
        elif name == "":
            args.append(draw(values))
        else:
            args += [name, draw(values)]
    if draw(st.booleans()):
        args.append("--json")
    return args


@settings(FUZZ, max_examples=120)
@given(args=command_lines())
def test_command_line_exits_0_or_2_without_a_traceback(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    output = result.stdout + result.stderr
    assert result.exit_code in (0, 2), (args, output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), args
    assert "Traceback" not in output, args
    assert SECRET not in output
    if "--json" in args:
        lines = [line for line in result.stdout.splitlines() if line.strip()]
        assert len(lines) == 1, (args, result.stdout)
        parsed = json.loads(lines[0])
        assert isinstance(parsed, dict)
        if result.exit_code == 2:
            assert set(parsed) == {"error", "type"} and "\n" not in parsed["error"], parsed
