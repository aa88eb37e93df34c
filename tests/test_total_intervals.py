"""COUNT(*)'s ``total`` intervals: the count without the caps (``dpcurator.curator._total``)."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd
import pytest

import dpcurator as dp
from dpcurator.accounting.events import ComposedEvent, PureDPEvent
from dpcurator.errors import UserError
from dpcurator.noise import SeededRandom
from dpcurator.query import Query

KEYS = [f"g{i}" for i in range(40)]


def heavy_frame(units: int = 3000, seed: int = 0) -> pd.DataFrame:
    """Most units have 1-3 rows in one or two groups; 5% have 40-120 rows over up to 4."""
    rng = np.random.default_rng(seed)
    heavy = rng.random(units) < 0.05
    rows = np.where(heavy, rng.integers(40, 121, units), rng.integers(1, 4, units))
    spread = np.where(heavy, rng.integers(1, 5, units), rng.integers(1, 3, units))
    unit = np.repeat(np.arange(units), rows)
    first = np.repeat(rng.integers(0, len(KEYS), units), rows)
    group = (first + rng.integers(0, np.repeat(spread, rows))) % len(KEYS)
    return pd.DataFrame({"u": unit, "g": np.array(KEYS)[group], "x": rng.random(unit.size)})


def truth(df: pd.DataFrame) -> np.ndarray:
    return df.groupby("g").size().reindex(KEYS, fill_value=0).to_numpy(np.float64)


def curator(df: pd.DataFrame, epsilon: float, seed: int, **options: Any) -> dp.Curator:
    return dp.Curator.from_pandas(df, privacy_unit="u", budget=dp.PureDP(epsilon),
                                  source=SeededRandom(seed), cache=False, **options)


COUNT = "SELECT g, COUNT(*) AS n FROM data GROUP BY g"


def test_total_intervals_cover_the_count_without_the_caps_and_bounded_ones_do_not() -> None:
    """With the outer cap at least every unit's rows, each total interval covers its true
    count with probability >= 95% (the union bound of ``_total``), independently across the
    partitions of a release (independent noise): over 100 releases of 40 partitions the
    coverage stochastically dominates a Binomial(4000, 0.95), which falls below 0.933 (4.9
    standard deviations) with probability below 1e-6. The bounded intervals, after caps of
    2 partitions and 2 rows, miss the heavy units' rows: they cover far less than half."""
    df = heavy_frame()
    most = int(df.groupby("u").size().max())
    exact = truth(df)
    runs = 100
    cur = curator(df, 2.0 * runs, 1)
    covered = bounded_covered = 0
    for _ in range(runs):
        release = cur.sql(COUNT, epsilon=1.0, keys=KEYS, max_partitions=2,
                          max_rows_per_partition=2, intervals="total")
        assert release.interval_kinds == {"n": "total"}
        low, high = release.interval("n")
        covered += int(np.sum((low <= exact) & (exact <= high)))
        b_low, b_high = release.interval("n", kind="bounded")
        bounded_covered += int(np.sum((b_low <= exact) & (exact <= b_high)))
        # it holds the bounded interval: its ends are the bounded count's at alpha / 5
        assert np.all(low <= b_low) and np.all(b_high <= high)
    # the outer cap above was chosen from the data; with one given that no unit exceeds,
    # the 95% is a theorem (module docstring of ``_total``)
    assert covered / (runs * len(KEYS)) >= 0.933
    assert bounded_covered / (runs * len(KEYS)) < 0.5
    given = curator(df, 2.0 * runs, 3)
    query = (Query().group_by("g", keys=KEYS).count("n")
             .bound_contributions(max_partitions=2, max_rows_per_partition=2)
             .intervals("total", max_unit_rows=most))
    covered = 0
    for _ in range(runs):
        release = given.run(query, epsilon=1.0)
        assert release.max_unit_rows == most and release.bounds_chosen is None
        low, high = release.interval("n")
        covered += int(np.sum((low <= exact) & (exact <= high)))
    assert covered / (runs * len(KEYS)) >= 0.933


def test_the_total_share_and_the_bounds_share_are_shares_of_the_whole_budget() -> None:
    df = heavy_frame(600)
    cur = curator(df, 10.0, 4)
    assert cur.sql(COUNT, epsilon=1.0, keys=KEYS).interval_kinds == {"n": "bounded"}
    release = cur.sql(COUNT, epsilon=1.0, keys=KEYS, intervals="total")  # asked for
    assert release.interval_kinds == {"n": "total"}
    assert release.epsilon == 1.0 and cur.spent.epsilon == pytest.approx(2.0)
    cur = curator(df, 10.0, 4)
    release = cur.sql(COUNT, epsilon=1.0, keys=KEYS, total_share=0.1)  # a share asks too
    assert release.interval_kinds == {"n": "total"}
    assert release.epsilon == 1.0 and cur.spent.epsilon == pytest.approx(1.0)
    chosen = release.bounds_chosen
    assert chosen is not None
    # the caps' 10%, and on top of it their thin-data count's quarter a cap (``CAPS_UNITS``)
    # and the row cap's tail's histogram (``TAIL_WEIGHT``): weights 2 + 0.5 + 0.25 over 2
    assert chosen["epsilon"] == pytest.approx(0.1375) and chosen["epsilon"] <= 0.1375
    assert chosen["outer_caps_epsilon"] == pytest.approx(0.05)  # half of the 10%
    total = [m for m in release.mechanisms["n"] if m["measure"] == "unit_rows"]
    assert len(total) == 1 and total[0]["outer cap (rows of one unit)"] == chosen[
        "max_unit_rows"]


def test_the_events_compose_exactly_within_the_request() -> None:
    df = heavy_frame(600)
    cur = curator(df, 10.0, 5)
    prepared = cur.prepare(cur.resolve(Query().group_by("g", keys=KEYS).count("n"),
                                       epsilon=0.7))
    events = prepared.compiled.events
    assert all(isinstance(e, PureDPEvent) for e in events)
    assert sum(Fraction(e.epsilon) for e in events) <= Fraction(0.7)  # type: ignore[attr-defined]
    assert sum(Fraction(e.epsilon) for e in events) > Fraction(0.7) * (1 - 1e-5)  # type: ignore[attr-defined]
    assert isinstance(prepared.compiled.event, ComposedEvent)


def test_defaults_explicit_caps_and_row_level_privacy() -> None:
    df = heavy_frame(600)
    explicit = curator(df, 10.0, 6).sql(COUNT, epsilon=1.0, keys=KEYS, max_partitions=2,
                                        max_rows_per_partition=2)
    assert explicit.interval_kinds == {"n": "bounded"} and explicit.max_unit_rows is None
    assert all(m["measure"] != "unit_rows" for m in explicit.mechanisms["n"])
    off = curator(df, 10.0, 7, intervals="bounded").sql(COUNT, epsilon=1.0, keys=KEYS)
    assert off.interval_kinds == {"n": "bounded"}
    rows = dp.Curator.from_pandas(df, one_row_per_person=True, budget=dp.PureDP(10),
                                  source=SeededRandom(8))
    release = rows.sql(COUNT, epsilon=1.0, keys=KEYS)
    assert release.interval_kinds == {"n": "total"}  # no cap removes a row
    low, high = release.interval("n")
    b_low, b_high = release.interval("n", kind="bounded")
    assert np.array_equal(low, b_low) and np.array_equal(high, b_high)
    mixed = curator(df, 10.0, 9).sql(
        "SELECT g, COUNT(*) AS n, AVG(x) AS m FROM data GROUP BY g", epsilon=1.0, keys=KEYS,
        bounds={"x": (0, 1)}, intervals="total")
    assert mixed.interval_kinds == {"n": "total", "m": "bounded"}
    out = mixed.to_dict()
    assert out["interval_kinds"] == {"n": "total", "m": "bounded"}
    assert out["max_unit_rows"] == mixed.max_unit_rows
    assert len(out["bounded_intervals"]) == len(KEYS) and set(out["bounded_intervals"][0]) == {
        "n"}


@pytest.mark.parametrize("sql, options, needle", [
    ("SELECT g, COUNT(*) AS n FROM data GROUP BY g", {"delta": 1e-6}, "public keys"),
    ("SELECT AVG(x) AS m FROM data", {"bounds": {"x": (0, 1)}}, "COUNT(*)"),
    ("SELECT g, COUNT(*) AS n FROM data GROUP BY g", {"keys": KEYS, "bounding": "sample"},
     "rescale"),
    ("SELECT g, COUNT(*) AS n FROM data GROUP BY g", {"keys": KEYS, "intervals": "wide"},
     "intervals"),
])
def test_a_total_that_cannot_be_had_is_refused_and_nothing_is_charged(
        sql: str, options: dict[str, Any], needle: str) -> None:
    cur = curator(heavy_frame(300), 10.0, 10)
    asked = {"intervals": "total", **options}
    with pytest.raises(UserError, match=re.escape(needle)):
        cur.sql(sql, epsilon=1.0, **asked)
    assert cur.spent.epsilon == 0.0


def test_asking_a_total_of_an_aggregate_without_one_is_refused() -> None:
    cur = curator(heavy_frame(300), 10.0, 11)
    release = cur.sql("SELECT g, COUNT(*) AS n, AVG(x) AS m FROM data GROUP BY g",
                      epsilon=1.0, keys=KEYS, bounds={"x": (0, 1)})
    with pytest.raises(UserError, match="'m' has no total interval"):
        release.interval("m", kind="total")
    with pytest.raises(UserError, match="kind must be"):
        release.interval("n", kind="everything")
    with pytest.raises(UserError, match="intervals must be"):
        dp.Curator.from_pandas(heavy_frame(30), privacy_unit="u", budget=dp.PureDP(1),
                               intervals="everything")


def test_the_outer_capped_count_passes_the_audit_and_its_uncapped_twin_is_caught() -> None:
    """End to end on the engine: D and D plus one unit with 400 rows in one partition. The
    outer-capped count moves by at most M = 16 there, and its discrete Laplace, calibrated to
    M, stays within its epsilon = 1; the twin counts the unit's rows without the outer weights
    (M = 2^20: the 400 rows) under the same noise, an effective epsilon of 25, which the
    auditor proves above 1. Each audit's lower bound is wrong with probability at most 1e-7
    (``audit_mechanism``), so this test fails a correct implementation w.p. below 1e-6."""
    from dpcurator.audit import audit_mechanism
    from dpcurator.curator import _total
    from dpcurator.engines import DuckDBEngine
    from dpcurator.query import GroupKey
    from dpcurator.query.bounding import BoundedQuery

    base = heavy_frame(300)
    heavy = pd.DataFrame({"u": np.full(400, 10**6), "g": ["g0"] * 400, "x": np.zeros(400)})
    bigger = pd.concat([base, heavy], ignore_index=True)

    def measured(df: pd.DataFrame, outer: int) -> int:
        spec, _ = _total.measure(outer, 1.0, False, None)
        q = BoundedQuery("u", (GroupKey("g", '"g"'),), None, None, 2, 2, "rescale", "rescale",
                         (spec,))
        result = DuckDBEngine.from_frame(df).compute_exact_aggregates(q, key=3)
        return dict(zip((k[0] for k in result.keys), result.measures[spec.name],
                        strict=True))["g0"]

    _, mechanism = _total.measure(16, 1.0, False, SeededRandom(31))
    x1, x2 = measured(bigger, 16), measured(base, 16)
    assert 0 < x1 - x2 <= 16
    assert not audit_mechanism(mechanism, x1, x2, n=200_000).exceeds(1.0)
    t1, t2 = measured(bigger, 2**20), measured(base, 2**20)
    assert t1 - t2 == 400
    assert audit_mechanism(mechanism, t1, t2, n=200_000).exceeds(1.0)


SUM = "SELECT g, SUM(x) AS s FROM data GROUP BY g"


def test_total_sum_intervals_cover_the_sum_without_the_clamping_and_the_caps() -> None:
    """Values in [-1, 3) (some beyond the clamping bounds [0, 1]), heavy units beyond the caps.
    With the outer cap V at least every unit's sum of |x|, each total interval covers the true
    sum (of the values on the measure's grid: the same convention as SUM's bounded interval)
    with probability >= 95%, independently across the 40 partitions: over 100 releases the
    coverage is below 0.933 with probability below 1e-6 (as above). The bounded intervals
    miss what the clamping and the caps removed."""
    df = heavy_frame(seed=4)
    rng = np.random.default_rng(5)
    df["x"] = rng.uniform(-1.0, 3.0, len(df))
    exact = df.groupby("g").x.sum().reindex(KEYS, fill_value=0.0).to_numpy()
    most = float(df.assign(a=df.x.abs()).groupby("u").a.sum().max())
    runs = 100
    query = (Query().group_by("g", keys=KEYS).sum("x", (0.0, 1.0), "s")
             .bound_contributions(max_partitions=2, max_rows_per_partition=2)
             .intervals("total", max_unit_sums={"x": most}))
    cur = curator(df, 2.0 * runs, 6)
    covered = bounded_covered = 0
    for _ in range(runs):
        release = cur.run(query, epsilon=1.0)
        assert release.interval_kinds == {"s": "bounded", "s_total": "total"}
        assert release.max_unit_sums == {"x": most}
        low, high = release.interval("s", kind="total")
        assert np.array_equal(low, release.interval("s_total")[0])
        covered += int(np.sum((low <= exact) & (exact <= high)))
        b_low, b_high = release.interval("s", kind="bounded")
        bounded_covered += int(np.sum((b_low <= exact) & (exact <= b_high)))
    assert covered / (runs * len(KEYS)) >= 0.933
    assert bounded_covered / (runs * len(KEYS)) < 0.5


def test_a_total_sum_chooses_its_outer_cap_and_states_it() -> None:
    df = heavy_frame(600)
    cur = curator(df, 10.0, 12)
    release = cur.sql("SELECT g, COUNT(*) AS n, SUM(x) AS s, AVG(x) AS m FROM data GROUP BY g",
                      epsilon=1.0, keys=KEYS, bounds={"x": (0, 1)}, max_partitions=2,
                      max_rows_per_partition=2, intervals="total")
    assert release.interval_kinds == {"n": "total", "s": "bounded", "s_total": "total",
                                      "m": "bounded"}
    chosen = release.bounds_chosen
    assert chosen is not None and set(chosen["max_unit_sums"]) == {"x"}
    assert chosen["max_unit_sums"]["x"] == release.max_unit_sums["x"] > 0
    assert chosen["outer_caps_epsilon"] == pytest.approx(0.05)  # two caps, half of 10%
    assert release.epsilon == 1.0 and cur.spent.epsilon == pytest.approx(1.0)
    stated = [m for m in release.mechanisms["s"] if m["measure"] == "unit_values"]
    assert len(stated) == 1 and stated[0]["outer cap (sum of |value| of one unit)"] == \
        release.max_unit_sums["x"]  # in the query's units, not the fixed-point grid's
    out = release.to_dict()
    assert out["max_unit_sums"] == release.max_unit_sums
    assert set(out["bounded_intervals"][0]) == {"n"}  # beside s: its bounded interval
    assert out["total_columns"] == {"s": "s_total"}
    assert set(out["intervals"][0]) == set(out["rows"][0]) - {"g"} == {"n", "s", "s_total", "m"}
    rows = dp.Curator.from_pandas(df, one_row_per_person=True, budget=dp.PureDP(10),
                                  source=SeededRandom(13))
    mixed = rows.sql("SELECT g, COUNT(*) AS n, SUM(x) AS s FROM data GROUP BY g",
                     epsilon=1.0, keys=KEYS, bounds={"x": (0, 1)}, intervals="total")
    assert mixed.interval_kinds == {"n": "total", "s": "bounded"}  # a SUM needs a unit


def test_the_outer_capped_sum_passes_the_audit_and_its_uncapped_twin_is_caught() -> None:
    """As for the count: one unit adds 50 rows of 1e6 to one partition. The outer-capped sum
    (V = 8) moves by at most V there and its noise, calibrated to V, stays within epsilon = 1;
    the twin without the outer cap (V = 2^40) moves by the unit's 5e7, far beyond, and the
    auditor proves its epsilon above 1 (each audit wrong w.p. at most 1e-7)."""
    from dpcurator.audit import audit_mechanism
    from dpcurator.curator import _total
    from dpcurator.engines import DuckDBEngine
    from dpcurator.query import GroupKey
    from dpcurator.query.bounding import BoundedQuery, MeasureSpec, ValueSpec

    base = heavy_frame(300)
    heavy = pd.DataFrame({"u": np.full(50, 10**6), "g": ["g0"] * 50, "x": np.full(50, 1e6)})
    bigger = pd.concat([base, heavy], ignore_index=True)

    spec, mechanism = _total.sum_measure("x", 8.0, (2**20, 1.0), False, SeededRandom(32))
    assert spec.value is not None
    # the twin: the same grid, the outer cap far above the unit's sum
    wide = ValueSpec("x", -2.0**30, 2.0**30, 0.0, spec.value.scale)
    twin = MeasureSpec(spec.name, "unit_values", wide, 1, wide.bound)

    def measured(df: pd.DataFrame, measure: MeasureSpec) -> int:
        q = BoundedQuery("u", (GroupKey("g", '"g"'),), None, None, 2, 2, "rescale", "rescale",
                         (measure,))
        result = DuckDBEngine.from_frame(df).compute_exact_aggregates(q, key=3)
        return dict(zip((k[0] for k in result.keys), result.measures[measure.name],
                        strict=True))["g0"]

    x1, x2 = measured(bigger, spec), measured(base, spec)
    assert 0 < x1 - x2 <= mechanism.sensitivity == spec.outer
    assert not audit_mechanism(mechanism, x1, x2, n=200_000).exceeds(1.0)
    t1, t2 = measured(bigger, twin), measured(base, twin)
    assert t1 - t2 > 1000 * spec.outer
    assert audit_mechanism(mechanism, t1, t2, n=200_000).exceeds(1.0)


def test_a_bounds_share_that_leaves_no_room_keeps_bounded_intervals_by_default() -> None:
    """A bounds' share of 0.95 and the total's 0.1 would leave nothing for the query: by
    default the intervals stay bounded; asked for, the total is refused (nothing charged)."""
    cur = curator(heavy_frame(300), 10.0, 14, auto_bounds_share=0.95)
    release = cur.sql(COUNT, epsilon=1.0, keys=KEYS)
    assert release.interval_kinds == {"n": "bounded"}
    spent = cur.spent.epsilon
    with pytest.raises(UserError, match="leave nothing for the query"):
        cur.sql(COUNT, epsilon=1.0, keys=KEYS, intervals="total")
    assert cur.spent.epsilon == spent


def test_the_total_share_is_the_users_to_set() -> None:
    """A query's ``total_share`` (or the curator's) is what its total intervals spend: their
    mechanisms' epsilons add up to it, the bounds' share stays 10% of the whole, and the
    intervals narrow with it. A share outside (0, 1) is refused, nothing charged."""
    df = heavy_frame(600)
    cur = curator(df, 20.0, 15)
    query = (Query().group_by("g", keys=KEYS).count("n")
             .bound_contributions(max_partitions=2, max_rows_per_partition=2)
             .intervals("total", max_unit_rows=256, share=0.4))
    wide = cur.run(query.intervals("total", max_unit_rows=256), epsilon=1.0)
    narrow = cur.run(query, epsilon=1.0)
    total = next(m for m in narrow.mechanisms["n"] if m["measure"] == "unit_rows")
    assert total["guarantee"].startswith("0.4-DP")
    low, high = narrow.interval("n")
    w_low, w_high = wide.interval("n")
    assert float(np.median(high - low)) < 0.5 * float(np.median(w_high - w_low))
    by_curator = curator(df, 20.0, 16, total_share=0.25).sql(
        COUNT, epsilon=1.0, keys=KEYS, max_partitions=2, max_rows_per_partition=2,
        intervals="total")
    chosen = by_curator.bounds_chosen
    assert chosen is not None and chosen["outer_caps_epsilon"] == pytest.approx(0.125)
    before = cur.spent.epsilon
    for bad in (0, 1, -0.1, "x"):
        with pytest.raises(UserError, match="total_share"):
            cur.sql(COUNT, epsilon=1.0, keys=KEYS, total_share=bad)  # type: ignore[arg-type]
    assert cur.spent.epsilon == before
    with pytest.raises(UserError, match="total_share"):
        curator(df, 1.0, 17, total_share=2)


@pytest.mark.parametrize("privacy, noise", [
    ({"epsilon": 1.0, "delta": 1e-6, "noise": "gaussian"}, "discrete Laplace"),
    ({"rho": 0.5}, "discrete Gaussian"),
])
def test_totals_under_gaussian_noise_and_zcdp(privacy: dict[str, Any], noise: str) -> None:
    """Under (epsilon, delta) with Gaussian noise the totals take a pure epsilon share (the
    rest keeps delta); under rho they are discrete Gaussians of a rho share. Either way the
    query costs what it asked, and with the outer cap above every unit the intervals at level
    1 - 1e-9 all cover the true counts (each misses w.p. at most 1e-9: 4e-8 for the 40)."""
    df = heavy_frame(600)
    budget: Any = dp.ZCDP(1.0) if "rho" in privacy else dp.ApproxDP(10.0, 1e-3)
    cur = dp.Curator.from_pandas(df, privacy_unit="u", budget=budget, source=SeededRandom(18),
                                 cache=False)
    most = int(df.groupby("u").size().max())
    query = (Query().group_by("g", keys=KEYS).count("n").sum("x", (0.0, 1.0), "s")
             .bound_contributions(max_partitions=2, max_rows_per_partition=2)
             .intervals("total", max_unit_rows=most, max_unit_sums={"x": float(most)}))
    release = cur.run(query, **privacy)
    assert release.interval_kinds == {"n": "total", "s": "bounded", "s_total": "total"}
    totals = [m for name in ("n", "s") for m in release.mechanisms[name]
              if m["measure"] in ("unit_rows", "unit_values")]
    assert len(totals) == 2 and all(m["noise"] == noise for m in totals)
    if "rho" in privacy:
        assert release.privacy.rho == pytest.approx(0.5, rel=1e-12)  # type: ignore[union-attr]
    else:
        assert release.privacy == dp.ApproxDP(1.0, 1e-6)
    low, high = release.interval("n", 1 - 1e-9)
    exact = truth(df)
    assert np.all((low <= exact) & (exact <= high))
