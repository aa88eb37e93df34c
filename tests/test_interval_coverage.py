"""Intervals at their stated level: each aggregate kind covers close to 95% at 95%, not above.

One curator, 80 public partitions of 300 to 600 people (one row each, so the bounded answer is
the plain one), 400 releases at epsilon = 6 (each of the six aggregates gets 1): 32,000
intervals per kind, each from independent noise. Then VARIANCE alone on data whose mean lies
far from the bounds' midpoint, where the old construction covered 100%.

False-failure probability. Every kind must cover within [0.94, 0.97]: for any true coverage
in [0.949, 0.965], 32,000 independent intervals fall outside with probability below 3e-7
(binomial tails: 4.5e-13 below at 0.949, 2.9e-7 above at 0.965). Their true coverages lie in
that band: COUNT and COUNT(DISTINCT) 0.9502 exactly (the shortest integer interval for
discrete Laplace noise of scale 1, computed in ``test_integer_counts``); SUM 0.95 (a
fixed-point Laplace, continuous to 2^-20); AVG at least 0.95 by construction (an exact pivot)
and at most 0.95 plus the 2^-21 resolution of its search. VARIANCE and STDDEV (one pivot on
the mean and the variance together, ``_variance``) at least 0.95 by construction, and above
it only by what the projection over the mean's interval, the boxes of the search and the
coupling of an integer count's noise with a continuous one add: measured 0.962 and 0.964 on
20,000 intervals each of this data (standard error 0.0013), 0.956 on the off-centre data.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import dpcurator as dp
from dpcurator.curator import Curator
from dpcurator.curator._estimators import _MEAN_SHARE, _pivot
from dpcurator.noise import SeededRandom

PARTITIONS, RUNS = 80, 400
KINDS = ("n", "u", "s", "m", "v", "sd")
SQL = ("SELECT g, COUNT(*) AS n, COUNT(DISTINCT uid) AS u, SUM(x) AS s, AVG(x) AS m, "
       "VAR_POP(x) AS v, STDDEV_POP(x) AS sd FROM data GROUP BY g")


def _box_mean_width(release: dp.Release, alpha: float) -> np.ndarray:
    """The width of the old AVG interval: a box of two alpha / 2 intervals (count, sum), the
    range of sum / count over it, in [lo, hi] = [0, 10] (centred: [-5, 5])."""
    estimator = next(e for e in release._intervals.estimators if e.aggregate.name == "m")
    count_m, total_m = estimator.measures
    count, total = (np.asarray(v, dtype=np.float64) * float(m.unit)
                    for v, m in zip(release._intervals.noisy["m"], estimator.measures,
                                    strict=True))
    wc, ws = count_m.half_width(alpha / 2), total_m.half_width(alpha / 2)
    c_lo, c_hi, s_lo, s_hi = count - wc, count + wc, total - ws, total + ws
    low = np.clip(np.minimum(s_lo / c_lo, s_lo / c_hi), -5, 5)
    high = np.clip(np.maximum(s_hi / c_lo, s_hi / c_hi), -5, 5)
    return np.where(c_lo >= 1, high - low, 10.0)


def _old_variance_width(release: dp.Release, name: str, alpha: float) -> np.ndarray:
    """The width of the old VARIANCE interval: pivot intervals for the centred mean (at 5% of
    alpha) and the centred second moment w (the rest), and the range of w - mu^2 over them."""
    estimator = next(e for e in release._intervals.estimators if e.aggregate.name == name)
    present, total_m, squares_m = estimator.measures
    count, total, squares = (np.asarray(v, dtype=np.float64) * float(m.unit) for v, m in
                             zip(release._intervals.noisy[name], estimator.measures,
                                 strict=True))
    bounds = estimator.aggregate.bounds
    assert bounds is not None
    half = (bounds.hi - bounds.lo) / 2
    safe = np.maximum(count, 1.0)
    alpha_mu = alpha * _MEAN_SHARE
    m_lo, m_hi = _pivot(present, total_m).interval(
        count, total, alpha_mu, -half, half, np.clip(total / safe, -half, half))
    w_lo, w_hi = _pivot(present, squares_m).interval(
        count, squares, alpha - alpha_mu, 0.0, half * half,
        np.clip(squares / safe, 0.0, half * half))
    sq_max = np.maximum(m_lo * m_lo, m_hi * m_hi)
    sq_min = np.where((m_lo <= 0) & (m_hi >= 0), 0.0, np.minimum(m_lo * m_lo, m_hi * m_hi))
    return np.clip(w_hi - sq_min, 0.0, half * half) - np.clip(w_lo - sq_max, 0.0, half * half)


@pytest.mark.xdist_group("coverage")
def test_every_kind_covers_within_94_and_97_percent_at_95() -> None:
    rng = np.random.default_rng(1)
    keys = [f"p{i}" for i in range(PARTITIONS)]
    sizes = rng.integers(300, 600, PARTITIONS)
    frame = pd.DataFrame({"g": np.repeat(keys, sizes), "x": rng.uniform(0, 10, sizes.sum())})
    frame["uid"] = np.arange(len(frame))
    grouped = frame.groupby("g")["x"]
    truth = {"n": grouped.size(), "u": grouped.size(), "s": grouped.sum(),
             "m": grouped.mean(), "v": grouped.var(ddof=0), "sd": grouped.std(ddof=0)}
    exact = {k: v.loc[keys].to_numpy(dtype=np.float64) for k, v in truth.items()}
    curator = Curator(frame, privacy_unit="uid", budget=dp.PureDP(1e9), cache=False,
                      bounds={"x": (0, 10)}, bounding="sample", source=SeededRandom(11),
                      max_partitions=1, max_rows_per_partition=1)  # one row a unit
    hits = dict.fromkeys(KINDS, 0)
    new_width, old_width = 0.0, 0.0
    new_var_width, old_var_width = 0.0, 0.0
    for _ in range(RUNS):
        release = curator.sql(SQL, epsilon=6.0, keys=keys)
        for kind in KINDS:
            low, high = release.interval(kind, 0.95)
            hits[kind] += int(np.sum((low <= exact[kind] + 1e-9)
                                     & (exact[kind] - 1e-9 <= high)))
            if kind == "m":
                new_width += float(np.sum(high - low))
                old_width += float(np.sum(_box_mean_width(release, 0.05)))
            if kind == "v":
                new_var_width += float(np.sum(high - low))
                old_var_width += float(np.sum(_old_variance_width(release, "v", 0.05)))
    trials = PARTITIONS * RUNS
    coverage = {kind: hits[kind] / trials for kind in KINDS}
    print(coverage, new_width / old_width)  # shown with pytest -s
    for kind in KINDS:
        assert 0.94 <= coverage[kind] <= 0.97, coverage
    assert new_width < 0.9 * old_width  # narrower than the box it replaces (~0.78 of it)
    assert new_var_width < old_var_width  # narrower than the old variance interval (~0.95)


@pytest.mark.xdist_group("coverage")
def test_variance_covers_at_its_level_when_the_mean_is_far_from_the_midpoint() -> None:
    """Values in [0, 2] with bounds [0, 10]: the centred mean is -4, where the old interval
    (the range of w - mu^2 over two intervals) covered 100% at twice the width. 400 releases
    of 80 partitions at epsilon = 1 (VARIANCE alone), and half as many from integer counts
    (one row per person declared): within [0.94, 0.97] (as above), and the 16,000
    integer-count intervals within [0.935, 0.975] (below 1e-8 outside for a true coverage in
    [0.952, 0.965]); each at most 0.7 times the old width."""
    rng = np.random.default_rng(2)
    keys = [f"p{i}" for i in range(PARTITIONS)]
    sizes = rng.integers(300, 600, PARTITIONS)
    frame = pd.DataFrame({"g": np.repeat(keys, sizes), "x": rng.uniform(0, 2, sizes.sum())})
    frame["uid"] = np.arange(len(frame))
    truth = frame.groupby("g")["x"].var(ddof=0).loc[keys].to_numpy(dtype=np.float64)
    sql = "SELECT g, VAR_POP(x) AS v FROM data GROUP BY g"
    unit = {"privacy_unit": "uid", "max_partitions": 1, "max_rows_per_partition": 1}
    for runs, options, band in ((RUNS, unit, (0.94, 0.97)),
                                (RUNS // 2, {"one_row_per_person": True}, (0.935, 0.975))):
        curator = Curator(frame, budget=dp.PureDP(1e9), cache=False, bounds={"x": (0, 10)},
                          source=SeededRandom(12), **options)  # type: ignore[arg-type]
        hits, new_width, old_width = 0, 0.0, 0.0
        for _ in range(runs):
            release = curator.sql(sql, epsilon=1.0, keys=keys)
            low, high = release.interval("v", 0.95)
            hits += int(np.sum((low <= truth + 1e-9) & (truth - 1e-9 <= high)))
            new_width += float(np.sum(high - low))
            old_width += float(np.sum(_old_variance_width(release, "v", 0.05)))
        coverage = hits / (PARTITIONS * runs)
        assert band[0] <= coverage <= band[1], (options, coverage)
        assert new_width < 0.7 * old_width, (options, new_width / old_width)
