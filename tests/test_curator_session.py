"""The Curator: constructors, the two ways to ask, releases, the ledger and the cache."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

import dpcurator as dp
from dpcurator.curator import Curator, Release
from dpcurator.errors import BudgetExceededError, UserError
from dpcurator.noise import SeededRandom
from dpcurator.query import Query, bins

SQL = ("SELECT category, COUNT(*) AS n, AVG(value) AS mean_value FROM data "
       "WHERE age >= 18 GROUP BY category")


def table(rows: int = 3000, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "user_id": rng.integers(0, 600, rows),
        "category": rng.choice(["books", "food", "games", "toys"], rows, p=[.4, .3, .2, .1]),
        "value": rng.uniform(0, 100, rows),
        "age": rng.integers(10, 90, rows),
    })


def curator(data: object = None, **options: object) -> Curator:
    settings: dict[str, object] = dict(privacy_unit="user_id", budget=dp.ApproxDP(10.0, 1e-5),
                                       bounds={"value": (0, 100)}, source=SeededRandom(1))
    settings.update(options)
    return Curator(table() if data is None else data, **settings)  # type: ignore[arg-type]


def test_sql_and_builder_answer_the_same_question() -> None:
    c = curator()
    by_sql = c.sql(SQL, epsilon=1.0, keys=["books", "food", "games", "toys"])
    by_builder = (c.query().where("age >= 18")
                  .group_by("category", keys=["books", "food", "games", "toys"])
                  .count("n").mean("value", name="mean_value").release(epsilon=1.0))
    assert by_sql.plan == by_builder.plan
    assert by_sql.columns == by_builder.columns == ("category", "n", "mean_value")
    frame = by_sql.to_pandas(intervals=True)
    assert list(frame.columns) == ["category", "n", "n_low", "n_high", "mean_value",
                                   "mean_value_low", "mean_value_high"]
    assert (frame["n_low"] <= frame["n"]).all() and (frame["n"] <= frame["n_high"]).all()
    assert by_sql.to_arrow().num_rows == 4
    assert by_sql.privacy == dp.PureDP(1.0)  # public keys: no delta spent
    assert "bounded" in by_sql.sql[0] and "pairs" in by_sql.sql[0]


@pytest.mark.parametrize("kind", ["csv", "parquet", "pandas", "polars", "arrow", "duckdb"])
def test_every_constructor(kind: str, tmp_path: Path) -> None:
    df = table()
    if kind == "csv":
        df.to_csv(tmp_path / "d.csv", index=False)
        c = Curator.from_csv(tmp_path / "d.csv", privacy_unit="user_id",
                             budget=dp.PureDP(1.0))
    elif kind == "parquet":
        df.to_parquet(tmp_path / "d.parquet")
        c = Curator.from_parquet(tmp_path / "d.parquet", privacy_unit="user_id",
                                 budget=dp.PureDP(1.0))
    elif kind == "pandas":
        c = Curator.from_pandas(df, privacy_unit="user_id", budget=dp.PureDP(1.0))
    elif kind == "polars":
        c = Curator.from_polars(pl.from_pandas(df), privacy_unit="user_id",
                                budget=dp.PureDP(1.0))
    elif kind == "arrow":
        c = Curator.from_arrow(pa.Table.from_pandas(df), privacy_unit="user_id",
                               budget=dp.PureDP(1.0))
    else:
        con = duckdb.connect()
        con.register("staging", df)
        con.execute("CREATE TABLE purchases AS SELECT * FROM staging")
        c = Curator.from_duckdb(con, "purchases", privacy_unit="user_id",
                                budget=dp.PureDP(1.0))
    release = c.sql("SELECT COUNT(*) AS n FROM data", epsilon=0.5, max_rows_per_partition=1)
    assert len(release) == 1 and abs(release.values["n"][0] - 600) < 200  # ~600 units, k=r=1


def test_ledger_remaining_and_cache() -> None:
    c = curator(budget=dp.PureDP(1.0))
    first = c.sql("SELECT COUNT(*) AS n FROM data", epsilon=0.25)
    assert c.remaining.epsilon == 0.75 and len(c.ledger) == 1
    again = c.sql("SELECT   count(*) AS n FROM data", epsilon=0.25)  # same plan, other text
    assert again.from_cache and again.values["n"][0] == first.values["n"][0]
    assert c.remaining.epsilon == 0.75 and len(c.ledger) == 1
    fresh = c.sql("SELECT COUNT(*) AS n FROM data", epsilon=0.25, cache=False)
    assert not fresh.from_cache and c.remaining.epsilon == 0.5
    assert c.ledger[0].cost == dp.PureDP(0.25) and "COUNT" in c.ledger[0].label
    # A different confidence level is free post-processing of the cached release.
    assert c.sql("SELECT COUNT(*) AS n FROM data", epsilon=0.25, confidence=0.5).from_cache


def test_refused_query_charges_nothing_and_runs_nothing() -> None:
    c = curator(budget=dp.PureDP(1.0))
    calls: list[object] = []
    original = c._engine.compute_exact_aggregates

    def spy(*args: object, **kwargs: object) -> object:
        calls.append(args)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    c._engine.compute_exact_aggregates = spy  # type: ignore[method-assign]
    c.sql("SELECT COUNT(*) AS n FROM data", epsilon=0.9, max_rows_per_partition=1)
    with pytest.raises(BudgetExceededError, match="nothing was charged"):
        c.sql("SELECT AVG(value) AS m FROM data", epsilon=0.2)
    assert len(calls) == 1 and len(c.ledger) == 1 and c.remaining.epsilon == pytest.approx(0.1)
    with pytest.raises(dp.errors.UserError if hasattr(dp, "errors") else Exception):
        c.sql("SELECT category, COUNT(*) FROM data GROUP BY category", epsilon=0.05)
    assert len(calls) == 1 and len(c.ledger) == 1  # private keys without delta: refused


def test_rounding_of_the_last_share_is_absorbed_not_refused() -> None:
    """0.4 + 0.5 + 0.1 > 1.0 in binary; the last query is calibrated to what remains."""
    c = curator(budget=dp.PureDP(1.0), cache=False)
    for epsilon in (0.4, 0.5, 0.1):
        c.sql("SELECT COUNT(*) AS n FROM data", epsilon=epsilon)
    assert len(c.ledger) == 3
    assert c.ledger[2].cost.epsilon <= 0.1  # type: ignore[union-attr]
    with pytest.raises(BudgetExceededError):
        c.sql("SELECT COUNT(*) AS n FROM data", epsilon=1e-6)


def test_journal_makes_charges_durable(tmp_path: Path) -> None:
    journal = tmp_path / "ledger.sqlite"
    c = curator(budget=dp.PureDP(1.0), journal=journal)
    c.sql("SELECT COUNT(*) AS n FROM data", epsilon=0.3)
    entries = dp.ledger.SQLiteLedger(journal, create=False).entries()
    assert [e.kind for e in entries] == ["open", "charge"]
    assert entries[1].cost == dp.PureDP(0.3)
    reopened = curator(budget=dp.PureDP(1.0), journal=journal)
    assert reopened.remaining.epsilon == pytest.approx(0.7)
    # Two curators on one ledger share its total: what one spends, the other cannot.
    reopened.sql("SELECT COUNT(*) AS n FROM data", epsilon=0.5)
    assert c.remaining.epsilon == pytest.approx(0.2)
    with pytest.raises(BudgetExceededError):
        c.sql("SELECT COUNT(*) AS n FROM data", epsilon=0.25, cache=False)


def test_private_keys_spend_delta_and_public_bins_do_not() -> None:
    c = curator()
    private = c.sql("SELECT category, COUNT(*) AS n FROM data GROUP BY category",
                    epsilon=1.0, delta=1e-6)
    assert private.privacy == dp.ApproxDP(1.0, 1e-6)
    assert set(k[0] for k in private.keys) <= {"books", "food", "games", "toys"}
    histogram = c.run(Query().group_by(bins("age", [0, 18, 65, 120])).count("n"),
                      epsilon=1.0)
    assert [k[0] for k in histogram.keys] == ["[0, 18)", "[18, 65)", "[65, 120]"]
    assert histogram.privacy == dp.PureDP(1.0)


def test_absent_public_keys_are_noise_around_zero() -> None:
    c = curator(source=SeededRandom(5))
    release = c.sql("SELECT category, COUNT(*) AS n FROM data GROUP BY category",
                    epsilon=1.0, keys=["books", "unicorns"])
    assert [k[0] for k in release.keys] == ["books", "unicorns"]
    # at level 1 - 1e-6 the interval misses the absent key's 0 with probability below 1e-6
    # (at 95% it did in one seed of 150: its low end misses with probability 0.5%)
    low, high = release.interval("n", confidence=1 - 1e-6)
    assert low[1] <= 0.0 <= high[1]


def test_all_aggregates_and_gaussian_and_zcdp() -> None:
    c = curator(max_partitions=2, max_rows_per_partition=3)
    release = c.sql(
        "SELECT category, COUNT(*) AS n, COUNT(DISTINCT user_id) AS users, SUM(value) AS s, "
        "AVG(value) AS m, VARIANCE(value) AS v, STDDEV(value) AS sd, MEDIAN(value) AS med "
        "FROM data GROUP BY category", epsilon=3.0, delta=1e-6, noise="gaussian")
    frame = release.to_pandas(intervals=True)
    assert set(frame.columns) >= {"n", "users", "s", "m", "v", "sd", "med", "med_low"}
    assert frame["m"].between(0, 100).all() and frame["med"].between(0, 100).all()
    assert (frame["med_low"] <= frame["med"]).all() and (frame["med"] <= frame["med_high"]).all()
    assert frame["med_low"].between(0, 100).all() and frame["med_high"].between(0, 100).all()
    z = curator(budget=dp.ZCDP(1.0))
    zr = z.sql("SELECT category, SUM(value) AS s FROM data GROUP BY category", rho=0.1,
               keys=["books", "food"])
    # the exact sum of its parts' rhos (each share rounded down), at most what it asked
    assert isinstance(zr.privacy, dp.ZCDP) and zr.privacy.rho <= 0.1
    assert zr.privacy.rho == pytest.approx(0.1, rel=1e-12)
    laplace_on_zcdp = z.sql("SELECT COUNT(*) AS n FROM data", epsilon=0.2,
                            max_rows_per_partition=1)
    charged = laplace_on_zcdp.privacy
    assert isinstance(charged, dp.ZCDP) and charged.rho <= 0.2 ** 2 / 2  # eps^2 / 2, a hair less
    assert charged.rho == pytest.approx(0.02, rel=1e-9)


def test_json_shape_for_the_cli() -> None:
    release = curator().sql(SQL, epsilon=1.0, keys=["books", "food"])
    out = json.loads(json.dumps(release.to_dict()))
    assert set(out) >= {"rows", "intervals", "privacy"}
    assert out["privacy"]["epsilon"] == 1.0 and out["privacy"]["delta"] == 0.0
    assert out["rows"][0]["category"] == "books"
    assert set(out["intervals"][0]) == {"n", "mean_value"}


def test_row_level_privacy_needs_the_loud_opt_in() -> None:
    with pytest.raises(dp.errors.UserError, match="one_row_per_person=True"):  # type: ignore[attr-defined]
        Curator(table(), budget=dp.PureDP(1.0))
    c = Curator(table(), one_row_per_person=True, budget=dp.PureDP(1.0))
    assert c.privacy_unit is None
    assert isinstance(c.sql("SELECT COUNT(*) FROM data", epsilon=0.5), Release)


def test_a_quantile_costs_its_share_and_its_tree_pays_for_every_partition() -> None:
    """The tree's one mechanism spends the aggregate's whole share, with the sensitivity of all
    11 levels in all k partitions (r rows each): L1 = 11 r k, L2 = r sqrt(11 k)."""
    c = curator(budget=dp.PureDP(10.0), max_partitions=2, max_rows_per_partition=3)
    sql = ("SELECT category, COUNT(*) AS n, MEDIAN(value) AS med FROM data GROUP BY category")
    keys = ["books", "food"]
    noise = c.explain(sql, epsilon=0.8, keys=keys)["noise"]["med"]
    assert len(noise) == 1 and noise[0]["noise"] == "discrete Laplace"
    assert noise[0]["sensitivity"] == 11 * 3 * 2
    assert noise[0]["scale"] == pytest.approx(66 / 0.4)  # half of epsilon = 0.8
    assert noise[0]["guarantee"].startswith("0.4-DP")
    release = c.sql(sql, epsilon=0.8, keys=keys)
    assert release.privacy == dp.PureDP(0.8)
    assert c.spent.epsilon == pytest.approx(0.8, abs=1e-12)
    z = curator(budget=dp.ZCDP(1.0), max_partitions=2, max_rows_per_partition=3)
    zr = z.sql("SELECT category, MEDIAN(value) AS med FROM data GROUP BY category", rho=0.25,
               keys=keys)
    assert zr.privacy == dp.ZCDP(0.25)
    (tree,) = zr.mechanisms["med"]
    assert tree["noise"] == "discrete Gaussian" and tree["guarantee"].startswith("0.25-zCDP")
    assert tree["sensitivity"] == pytest.approx(3 * np.sqrt(22), rel=1e-3)
    assert tree["sigma"] == pytest.approx(3 * np.sqrt(22) / np.sqrt(0.5), rel=1e-3)
    gaussian = curator().sql(sql, epsilon=1.0, delta=1e-6, noise="gaussian", keys=keys)
    assert gaussian.privacy == dp.ApproxDP(1.0, 1e-6)


def test_a_key_of_an_integer_group_key_must_be_a_whole_number() -> None:
    """keys=[0, 2.5] for an integer key: the engines' casts rounded 2.5 to 2 and released
    partition 2's count labelled 2.5 (a bug hunt). A key that is not a whole number names no
    partition, and is refused before anything is charged; whole numbers in any form pass."""
    df = pd.DataFrame({"uid": range(9), "h": [0, 1, 1, 2, 2, 2, 3, 3, 3]})
    c = dp.Curator.from_pandas(df, privacy_unit="uid", budget=dp.PureDP(10.0),
                               source=SeededRandom(1), cache=False)
    sql = "SELECT h, COUNT(*) AS n FROM data GROUP BY h"
    for keys in ([0, 2.5], ["1.7"], [0.4]):
        with pytest.raises(UserError, match="not a whole number"):
            c.sql(sql, epsilon=1.0, keys=keys)
    assert c.remaining.epsilon == 10.0
    assert len(c.sql(sql, epsilon=1.0, keys=[0, 2.0, 3.0, np.int64(1)]).keys) == 4
    assert len(c.sql(sql, epsilon=1.0, keys=["3", " 1"]).keys) == 2


def test_a_key_of_a_decimal_group_key_keeps_its_scale_and_a_huge_key_is_a_user_error(
        ) -> None:
    """keys=[1.234] for a DECIMAL(10, 2) key: DuckDB and Spark rounded it to 1.23 and released
    that partition's count labelled 1.234 (PostgreSQL gave 0); keys=[2**63] raised pyarrow's
    OverflowError (a bug hunt). Both are refused before anything is charged."""
    import duckdb

    con = duckdb.connect()
    con.execute("CREATE TABLE data AS SELECT i AS uid, CAST(1.23 AS DECIMAL(10, 2)) AS price, "
                "i % 3 AS h FROM range(40) t(i)")
    c = dp.Curator.from_duckdb(con, "data", privacy_unit="uid", budget=dp.PureDP(10.0),
                               source=SeededRandom(1), cache=False)
    sql = "SELECT price, COUNT(*) AS n FROM data GROUP BY price"
    with pytest.raises(UserError, match="3 decimal places where the group key types"):
        c.sql(sql, epsilon=1.0, keys=[1.234])
    for huge in (2**63, 2**70):  # beyond BIGINT: no partition of h (UBIGINT keys are)
        with pytest.raises(UserError, match=r"key #1 does not convert to the group key "
                                            r"types \['BIGINT'\]"):
            c.sql("SELECT h, COUNT(*) AS n FROM data GROUP BY h", epsilon=1.0, keys=[huge])
    assert c.remaining.epsilon == 10.0
    assert len(c.sql(sql, epsilon=1.0, keys=[1.23, 1.2, 4.5]).keys) == 3


def test_private_key_intervals_at_a_huge_epsilon_do_not_fail() -> None:
    """Private keys at epsilon 1,000: the noise is so narrow that the shortest interval holds
    all of its mass, and the conditional interval took log(0) (a bug hunt: the release was
    charged, then to_pandas(intervals=True) raised)."""
    df = pd.DataFrame({"uid": range(300), "g": ["a", "b", "c"] * 100})
    c = dp.Curator.from_pandas(df, privacy_unit="uid", budget=dp.ApproxDP(1e4, 1e-3),
                               source=SeededRandom(1), cache=False)
    release = c.sql("SELECT g, COUNT(*) AS n FROM data GROUP BY g", epsilon=1000, delta=1e-6,
                    max_partitions=1, max_rows_per_partition=1)
    low, high = release.interval("n")
    assert np.all(low <= release.values["n"]) and np.all(release.values["n"] <= high)
    assert np.all(low <= 100.0) and np.all(high >= 100.0)
    assert list(release.to_pandas(intervals=True).columns) == ["g", "n", "n_low", "n_high"]
