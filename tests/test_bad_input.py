"""Bad input: a clear error, nothing charged, nothing leaked, never a traceback (issue 11).

Each test is the regression test of one reported failure. Statistical assertions state their
false-failure probability (all below 1e-6).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import dpcurator as dp
from dpcurator.cli import app
from dpcurator.curator import Curator
from dpcurator.errors import UserError
from dpcurator.local import Collector, client, from_config, make_randomizer
from dpcurator.query import BoundsError, UnknownColumnError
from dpcurator.query.plan import MAX_BOUND, Bounds

SECRET = "Zebulon"  # a value of the data: no message may contain it

runner = CliRunner()


def frame(n: int = 300) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    return pd.DataFrame({"uid": rng.integers(0, 60, n), "amount": rng.uniform(0, 10, n),
                         "region": rng.choice(["north", "south"], n)})


def curator(**options: Any) -> Curator:
    settings: dict[str, Any] = {"privacy_unit": "uid", "budget": dp.ApproxDP(10.0, 1e-5)}
    settings.update(options)
    return Curator(frame(), **settings)


# -- a CSV whose 60,001st row does not fit the inferred types ---------------------------------


def _csv(path: Path, rows: int, bad_row: str | None) -> Path:
    with path.open("w", encoding="utf-8") as handle:
        handle.write("uid,amount,region\n")
        handle.writelines(f"{i % 500},{i % 97},r{i % 3}\n" for i in range(rows))
        if bad_row is not None:
            handle.write(bad_row + "\n")
    return path


def test_csv_line_that_does_not_fit_the_sniffed_types_is_named_at_construction(
        tmp_path: Path) -> None:
    # DuckDB infers the types from the first rows: row 60,001 (line 60,002) is never sampled,
    # and every query used to be charged and then fail with "this is probably a bug".
    path = _csv(tmp_path / "big.csv", 60_000, f"5,{SECRET},r1")
    with pytest.raises(UserError) as info:
        Curator.from_csv(path, privacy_unit="uid", budget=dp.PureDP(1.0))
    text = str(info.value)
    assert "line 60002" in text and "'amount'" in text and "BIGINT" in text
    assert SECRET not in text


def test_csv_line_with_too_few_fields_is_named(tmp_path: Path) -> None:
    path = _csv(tmp_path / "short.csv", 30_000, "7,3")
    with pytest.raises(UserError, match=r"line 30002 \(too few fields\)"):
        Curator.from_csv(path, privacy_unit="uid", budget=dp.PureDP(1.0))


def test_clean_csv_is_read_once_and_answers(tmp_path: Path) -> None:
    path = _csv(tmp_path / "clean.csv", 2_000, None)
    c = Curator.from_csv(path, privacy_unit="uid", budget=dp.PureDP(1.0))
    release = c.sql("SELECT SUM(amount) AS s FROM data", epsilon=1.0,
                    bounds={"amount": (0, 100)})
    assert np.isfinite(release.values["s"][0]) and c.spent.epsilon == 1.0


def _object_frame(n: int = 12_000) -> pd.DataFrame:
    # DuckDB infers an object column's type from 1,000 sampled rows (every 12th here): the
    # rare values at rows 5, 777 and 9001 are never sampled.
    import decimal

    rare = [5, 777, 9001]
    score = pd.Series([1.5] * n, dtype=object)
    score[rare] = SECRET  # text among numbers (a messy export)
    code = pd.Series([7] * n, dtype=object)
    code[rare] = 2**40 + 12345  # an integer beyond 32 bits
    price = pd.Series([decimal.Decimal("19.99")] * n, dtype=object)
    price[rare] = decimal.Decimal("1234567.50")  # a wider Decimal
    return pd.DataFrame({"uid": np.arange(n) % 3000, "score": score, "code": code,
                         "price": price, "fine": pd.Series(["a", "b"] * (n // 2), dtype=object)})


def test_pandas_object_column_a_sample_mistyped_is_named_at_construction() -> None:
    # A bug hunt: the curator was made, then every query reading such a column was charged
    # and failed with InternalError; whether it failed depended on one record.
    df = _object_frame()
    with pytest.raises(UserError) as info:
        Curator.from_pandas(df, privacy_unit="uid", budget=dp.PureDP(1.0))
    text = str(info.value)
    assert "'score' (DOUBLE)" in text and "'code' (INTEGER)" in text
    assert "'price' (DECIMAL(4,2))" in text and "'fine'" not in text and "'uid'" not in text
    assert SECRET not in text and "1234567" not in text and str(2**40 + 12345) not in text
    # one column alone is named too, in a schema's table as well
    for column in ("score", "code", "price"):
        with pytest.raises(UserError, match=f"'{column}'"):
            Curator.from_pandas(df[["uid", column]], privacy_unit="uid",
                                budget=dp.PureDP(1.0))
    with pytest.raises(UserError, match="'score'"):
        Curator({"orders": df[["uid", "score"]]}, privacy_unit={"orders": "uid"},
                budget=dp.PureDP(1.0))
    # a view of a DuckDB connection over the frame is read the same way
    import duckdb

    con = duckdb.connect()
    con.register("orders", df[["uid", "code"]])
    with pytest.raises(UserError, match="'code'"):
        Curator.from_duckdb(con, "orders", privacy_unit="uid", budget=dp.PureDP(1.0))


def test_pandas_object_columns_of_one_type_answer() -> None:
    df = _object_frame()
    df["score"] = pd.to_numeric(df["score"], errors="coerce")  # the fix the error suggests
    df["code"] = df["code"].astype("int64")
    df["price"] = df["price"].astype("float64")
    c = Curator.from_pandas(df, privacy_unit="uid", budget=dp.PureDP(2.0))
    release = c.sql("SELECT SUM(code) AS s, COUNT(*) AS n FROM data WHERE score > 1",
                    epsilon=1.0, bounds={"code": (0, 10)})
    assert np.isfinite(release.values["s"][0]) and c.spent.epsilon == 1.0


def test_arrow_record_batch_reader_answers_every_query() -> None:
    # A stream is scanned once: the second statement of the first query failed, after the
    # charge. It is read into a table when the curator is made.
    import pyarrow as pa

    table = pa.table({"uid": np.arange(3000), "x": np.arange(3000.0) % 10})
    reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches())
    c = Curator(reader, privacy_unit="uid", budget=dp.PureDP(2.0))
    for cut in (3, 5):
        assert np.isfinite(c.sql(f"SELECT COUNT(*) AS n FROM data WHERE x > {cut}",
                                 epsilon=1.0).values["n"][0])
    assert c.spent.epsilon == 2.0


def test_polars_column_of_python_objects_is_a_user_error() -> None:
    import polars as pl

    values: list[Any] = [1.5] * 3000
    values[777] = SECRET
    df = pl.DataFrame({"uid": np.arange(3000), "score": pl.Series(values, dtype=pl.Object)})
    with pytest.raises(UserError, match="cannot read DataFrame") as info:
        Curator(df, privacy_unit="uid", budget=dp.PureDP(1.0))
    assert SECRET not in str(info.value)


def test_binary_file_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "blob.csv"
    path.write_bytes(bytes(range(256)) * 64)
    with pytest.raises(UserError, match="cannot read"):
        Curator.from_csv(path, one_row_per_person=True, budget=dp.PureDP(1.0))


# -- a delta that lets a mechanism publish records ---------------------------------------------


def test_large_delta_is_refused_unless_opted_in() -> None:
    with pytest.raises(UserError, match="allow_large_delta") as info:
        curator(budget=dp.ApproxDP(1.0, 0.9999))
    assert "release records" in str(info.value)
    c = curator(budget=dp.ApproxDP(10.0, 1e-3))
    for delta in (0.9999, 0.5, 2e-3):
        with pytest.raises(UserError, match="allow_large_delta"):
            c.sql("SELECT uid, COUNT(*) FROM data GROUP BY uid", epsilon=1.0, delta=delta)
        with pytest.raises(UserError, match="allow_large_delta"):
            c.explain("SELECT uid, COUNT(*) FROM data GROUP BY uid", epsilon=1.0, delta=delta)
    assert c.spent.epsilon == 0 and not c.ledger
    # the explicit opt-in, for whoever really means it
    loud = curator(budget=dp.ApproxDP(1.0, 0.5), allow_large_delta=True)
    release = loud.sql("SELECT uid, COUNT(*) FROM data GROUP BY uid", epsilon=1.0, delta=0.5)
    assert release.privacy.delta == 0.5  # type: ignore[union-attr]


def test_delta_at_the_ceiling_is_accepted() -> None:
    c = curator(budget=dp.ApproxDP(10.0, 1e-3))
    c.sql("SELECT region, COUNT(*) FROM data GROUP BY region", epsilon=1.0, delta=1e-3)
    assert c.spent.delta == pytest.approx(1e-3)


# -- an empty table is answered like any other --------------------------------------------------


def test_empty_table_is_answered_noisily_and_charged() -> None:
    from dpcurator.noise import SeededRandom

    empty = frame().iloc[:0]
    c = Curator(empty, privacy_unit="uid", budget=dp.ApproxDP(20.0, 1e-5),
                source=SeededRandom(11))
    counted = c.sql("SELECT COUNT(*) AS n FROM data", epsilon=1.0)
    # Discrete Laplace of scale 1 (epsilon 1, sensitivity 1): P[|noise| > 25] < 2e-11, so a
    # correct answer fails this with probability below 1e-6.
    assert 0.0 <= counted.values["n"][0] <= 25.0
    assert c.spent.epsilon == 1.0
    stats = c.sql("SELECT SUM(amount) AS s, AVG(amount) AS m, VARIANCE(amount) AS v, "
                  "MEDIAN(amount) AS q FROM data", epsilon=4.0, bounds={"amount": (0, 10)})
    for name in ("s", "m", "v", "q"):
        value = stats.values[name][0]
        low, high = stats.intervals()[name]
        assert np.isfinite(value) and np.isfinite(low[0]) and np.isfinite(high[0]), name
    assert 0.0 <= stats.values["m"][0] <= 10.0
    grouped = c.sql("SELECT region, COUNT(*) AS n FROM data GROUP BY region", epsilon=1.0,
                    delta=1e-6)
    assert grouped.keys == ()  # private keys: nothing to select
    keyed = c.sql("SELECT region, COUNT(*) AS n FROM data GROUP BY region", epsilon=1.0,
                  keys=["north", "south"])
    assert len(keyed.keys) == 2 and c.spent.epsilon == pytest.approx(7.0)


def test_empty_csv_is_answered(tmp_path: Path) -> None:
    path = tmp_path / "empty.csv"
    path.write_text("uid,amount\n", encoding="utf-8")
    c = Curator.from_csv(path, privacy_unit="uid", budget=dp.PureDP(1.0))
    assert np.isfinite(c.sql("SELECT COUNT(*) AS n FROM data", epsilon=1.0).values["n"][0])


# -- column names resolve as DuckDB resolves them ----------------------------------------------


def test_column_names_are_case_insensitive_like_duckdb() -> None:
    c = curator(privacy_unit="UID")
    assert c.privacy_unit == "uid"
    upper = c.explain("SELECT SUM(AMOUNT) AS s FROM data", epsilon=1.0,
                      bounds={"amount": (0, 10)})
    lower = c.explain("SELECT SUM(amount) AS s FROM data", epsilon=1.0,
                      bounds={"AMOUNT": (0, 10)})
    assert upper["plan"] == lower["plan"]
    quoted = c.sql('SELECT SUM("Amount") AS s FROM data', epsilon=1.0,
                   bounds={"amount": (0, 10)})
    assert np.isfinite(quoted.values["s"][0])
    declared = curator(bounds={"AMOUNT": (0, 10)})
    assert np.isfinite(declared.sql("SELECT AVG(amount) AS m FROM data",
                                    epsilon=1.0).values["m"][0])


def test_bounds_naming_a_missing_or_repeated_column_are_refused() -> None:
    c = curator()
    with pytest.raises(UnknownColumnError, match="'amout'"):
        c.sql("SELECT SUM(amount) FROM data", epsilon=1.0, bounds={"amout": (0, 1)})
    with pytest.raises(UserError, match="twice"):
        c.sql("SELECT SUM(amount) FROM data", epsilon=1.0,
              bounds={"amount": (0, 1), "AMOUNT": (0, 2)})
    assert not c.ledger


# -- bounds beyond what the fixed-point sums hold ----------------------------------------------


@pytest.mark.parametrize("aggregate", ["SUM", "AVG", "VARIANCE", "STDDEV", "MEDIAN"])
def test_bound_too_large_names_the_bound_and_the_largest_allowed(aggregate: str) -> None:
    c = curator()
    with pytest.raises(BoundsError) as info:
        c.sql(f"SELECT {aggregate}(amount) AS a FROM data", epsilon=1.0,
              bounds={"amount": (0, 1e16)})
    text = str(info.value)
    assert "1e+16" in text and "1e+15" in text and "'amount'" in text
    assert not c.ledger
    release = c.sql(f"SELECT {aggregate}(amount) AS a FROM data", epsilon=1.0,
                    bounds={"amount": (-MAX_BOUND, MAX_BOUND)})
    assert np.isfinite(release.values["a"][0])


def test_bounds_too_close_are_refused() -> None:
    with pytest.raises(BoundsError, match="too close"):
        Bounds(0.0, 1e-300)
    assert Bounds(0.0, 1e-100).hi == 1e-100


# -- SQL that used to escape as another exception type -----------------------------------------


@pytest.mark.parametrize("sql, options", [
    ("SELECT COUNT(*) FROM data WHERE width_bucket(amount, uid, 1, 2) = 1", {}),
    ("SELECT QUANTILE_CONT(amount, 1" + "0" * 400 + ") FROM data",
     {"bounds": {"amount": (0, 1)}}),
    ("SELECT region, COUNT(*) FROM data GROUP BY region", {"keys": [{"a": 1}]}),
    ("SELECT COUNT(*) FROM data WHERE " + "(" * 3000 + "uid" + ")" * 3000 + " > 1", {}),
])
def test_malformed_queries_are_user_errors_and_charge_nothing(
        sql: str, options: dict[str, Any]) -> None:
    c = curator()
    with pytest.raises(UserError):
        c.sql(sql, epsilon=1.0, **options)
    assert not c.ledger


def test_malformed_builder_expressions_are_user_errors() -> None:
    from dpcurator.query.builder import Query

    for where in ("'unterminated", "(" * 3000 + "uid" + ")" * 3000 + " > 1"):
        with pytest.raises(UserError):
            Query().where(where)


# -- the command line: one line or one JSON object, exit status 2 ------------------------------


def _cli(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture()
def shop(tmp_path: Path) -> Path:
    path = tmp_path / "shop.csv"
    frame().to_csv(path, index=False)
    return path


def test_cli_binary_keys_file_is_a_clear_error(shop: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys.bin"
    keys.write_bytes(bytes(range(256)) * 16)
    args = [str(shop), "--sql", "SELECT region, COUNT(*) FROM data GROUP BY region",
            "--privacy-unit", "uid", "--epsilon", "1", "--keys", str(keys)]
    code, out, err = _cli("query", *args, "--json")
    assert code == 2 and json.loads(out)["error"].startswith("--keys: cannot read")
    code, out, err = _cli("query", *args)
    assert code == 2 and err.startswith("error: --keys") and len(err.splitlines()) == 1
    assert "Traceback" not in out + err


def test_cli_large_delta_needs_the_flag(shop: Path) -> None:
    args = ["query", str(shop), "--sql", "SELECT uid, COUNT(*) FROM data GROUP BY uid",
            "--privacy-unit", "uid", "--epsilon", "1", "--delta", "0.9999", "--json"]
    code, out, _ = _cli(*args)
    assert code == 2 and "--allow-large-delta" in json.loads(out)["error"]
    code, out, _ = _cli(*args, "--allow-large-delta")
    assert code == 0 and json.loads(out)["privacy"]["delta"] == 0.9999


def test_cli_bounds_resolve_like_the_sql(shop: Path) -> None:
    code, out, _ = _cli("query", str(shop), "--sql", "SELECT SUM(AMOUNT) AS s FROM data",
                        "--privacy-unit", "UID", "--epsilon", "1", "--bounds", "amount=0:10",
                        "--json")
    assert code == 0, out
    code, out, _ = _cli("query", str(shop), "--sql", "SELECT SUM(amount) AS s FROM data",
                        "--privacy-unit", "uid", "--epsilon", "1", "--bounds",
                        "amount=0:1e16", "--json")
    error = json.loads(out)
    assert code == 2 and error["type"] == "BoundsError" and "1e+15" in error["error"]


def test_cli_bad_csv_line_is_named(tmp_path: Path) -> None:
    path = _csv(tmp_path / "big.csv", 60_000, f"5,{SECRET},r1")
    code, out, _ = _cli("query", str(path), "--sql", "SELECT COUNT(*) FROM data",
                        "--privacy-unit", "uid", "--epsilon", "1", "--json")
    error = json.loads(out)
    assert code == 2 and "line 60002" in error["error"] and SECRET not in out


@pytest.mark.parametrize("args", [
    ["explain", "--epsilon", "-1"],
    ["explain", "--epsilon", "abc"],
    ["explain", "--epsilon", "1", "--prior", "2"],
    ["account", "dpsgd", "--sampling-rate", "0.01", "--steps", "10", "--delta", "1e-5"],
    ["account", "compose", "--mechanism", "nope"],
    ["account", "convert", "--from", "zcdp"],
    ["query", "/nonexistent/x.csv", "--sql", "SELECT COUNT(*) FROM data", "--epsilon", "1",
     "--one-row-per-person"],
    ["query", "x.csv"],
    ["survey", "plan", "--epsilon", "1", "--margin", "-1"],
    ["demo", "--respondents", "1"],
    ["nonsense"],
])
def test_every_command_with_json_prints_one_error_object(args: list[str]) -> None:
    code, out, err = _cli(*args, "--json")
    assert code == 2, out + err
    lines = out.splitlines()
    assert len(lines) == 1, out
    error = json.loads(lines[0])
    assert set(error) == {"error", "type"} and error["error"]
    assert "Traceback" not in out + err


def test_without_json_the_error_is_one_line_on_stderr() -> None:
    code, out, err = _cli("explain", "--epsilon", "-1")
    assert code == 2 and out == "" and err.startswith("error: ") and len(err.splitlines()) == 1


# -- survey numbers are bounded before any arithmetic ------------------------------------------


def _config(mechanism: str = "oue", **changes: Any) -> dict[str, Any]:
    config = make_randomizer(mechanism, 1.0, categories=["a", "b", "c"]).config()
    config["params"].update(changes)
    return config


def test_huge_exponent_in_a_config_is_refused_promptly(tmp_path: Path) -> None:
    bad = _config(q="1e-999999999")
    start = time.perf_counter()
    with pytest.raises(client.ConfigError, match=r"params\.q"):
        client.check_config(bad)
    with pytest.raises(client.ConfigError):
        from_config(bad)
    assert time.perf_counter() - start < 1.0
    path = tmp_path / "survey.json"
    path.write_text(json.dumps(bad), encoding="utf-8")
    done = subprocess.run([sys.executable, "-I", client.__file__, str(path), "a"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "params.q" in done.stderr and "Traceback" not in done.stderr
    reports = tmp_path / "r.jsonl"
    reports.write_text('{"mechanism": "oue", "bits": "010"}\n', encoding="utf-8")
    code, out, _ = _cli("survey", "estimate", str(reports), "--config", str(path), "--json")
    assert code == 2 and "params.q" in json.loads(out)["error"]


@pytest.mark.parametrize("mechanism, changes", [
    ("olh", {"g": 10**30 + 57}),           # is_prime(g) would run for ever
    ("oue", {"p": "1" * 1000 + "/3"}),     # longer than any real parameter
    ("oue", {"p": "0.5e+99999"}),
    ("oue", {"p": "nan"}),
])
def test_oversized_config_numbers_are_refused(mechanism: str, changes: dict[str, Any]) -> None:
    start = time.perf_counter()
    with pytest.raises(client.ConfigError):
        client.check_config(_config(mechanism, **changes))
    assert time.perf_counter() - start < 1.0


def test_config_range_beyond_floats_and_deep_json_are_refused(tmp_path: Path) -> None:
    config = make_randomizer("duchi", 1.0).config()
    config["high"] = 10**400
    with pytest.raises(client.ConfigError, match="high"):
        client.check_config(config)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000, encoding="utf-8")
    assert client.main([str(deep), "1"]) == 2


def test_numeric_answer_with_a_huge_exponent_is_refused_promptly() -> None:
    config = client.check_config(make_randomizer("duchi", 1.0).config())
    start = time.perf_counter()
    with pytest.raises(ValueError, match="finite number"):
        client.randomize(config, "1e-999999999")
    assert time.perf_counter() - start < 1.0
    assert client.randomize(config, "0.25")["y"] in (-1, 1)


def test_oversized_report_fields_are_bad_reports() -> None:
    collector = Collector(make_randomizer("olh", 1.0, categories=["a", "b"]))
    collector.read_csv_text("seed,y\n" + "9" * 5000 + ",1\n" + "1²,1\n")
    assert collector.bad_count == 2 and collector.n == 0
    rr = Collector(make_randomizer("rr", 1.0))
    rr.read_csv_text('y\n1\n"' + "x" * 200_000 + '"\n0\n')
    rr.add_reports(["[" * 100_000])
    assert rr.n == 2 and rr.bad_count == 2
