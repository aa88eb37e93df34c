"""Counts get integer noise: discrete Laplace (or Gaussian) on the integer count itself.

Statistical assertions state their false-failure probability (each below 1e-6 for a correct
implementation); the seeds make runs reproducible, not the assertions true.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binom

import dpcurator as dp
from dpcurator.curator import Curator
from dpcurator.mechanisms import DiscreteGaussian, DiscreteLaplace
from dpcurator.mechanisms._tails import CountIntervals, NoiseTails
from dpcurator.noise import SeededRandom

KEYS = [f"p{i}" for i in range(70)]


def _frame(rows: int = 7000, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"g": rng.choice(KEYS, rows), "x": rng.uniform(0, 10, rows)})
    frame["uid"] = np.arange(rows)
    return frame


def _measures(release: dp.Release, name: str) -> list[dict[str, Any]]:
    return release.mechanisms[name]


def test_counts_get_integer_noise_and_sums_keep_their_fixed_point() -> None:
    curator = Curator(_frame(), one_row_per_person=True, budget=dp.PureDP(100),
                      bounds={"x": (0, 10)}, source=SeededRandom(1))
    release = curator.sql("SELECT g, COUNT(*) AS n, SUM(x) AS s, AVG(x) AS m FROM data "
                          "GROUP BY g", epsilon=3.0, keys=KEYS)
    (count,) = _measures(release, "n")
    assert count["noise"] == "discrete Laplace" and count["scale"] == 1.0  # 1 / (eps / 3)
    assert np.all(release.values["n"] == np.round(release.values["n"]))
    (total,) = _measures(release, "s")
    assert total["scale"] == pytest.approx(10.0, rel=1e-5)  # fixed point: 10 / 1, grid 2^-36
    present, _ = _measures(release, "m")
    assert present["measure"] == "present" and present["scale"] == 2.0  # 1 / (eps / 6)
    # With a privacy unit: sampled partitions (or none) keep counts integer; partition
    # rescaling (the default with public keys) makes them fractions: a fine grid there.
    unit = Curator(_frame(), privacy_unit="uid", budget=dp.PureDP(100), bounds={"x": (0, 10)},
                   max_partitions=2, max_rows_per_partition=3)
    sampled = unit.sql("SELECT g, COUNT(*) AS n FROM data GROUP BY g", epsilon=1.0,
                       keys=KEYS, bounding="sample")
    assert _measures(sampled, "n")[0]["scale"] == 6.0  # k r / eps, on the integers
    rescaled = unit.sql("SELECT g, COUNT(*) AS n FROM data GROUP BY g", epsilon=1.0, keys=KEYS)
    assert rescaled.mechanisms["n"][0]["scale"] == pytest.approx(6.0, rel=1e-5)
    assert not np.all(rescaled.values["n"] == np.round(rescaled.values["n"]))


def test_gaussian_counts_are_integer_when_the_l2_sensitivity_is() -> None:
    """sqrt(k) r must be an integer for an exact integer discrete Gaussian (k = 4 here); with
    k = 2 the count keeps the fine grid, whose rounding of sqrt(2) is negligible."""
    frame = _frame()
    for k, integer in [(1, True), (4, True), (2, False)]:
        curator = Curator(frame, privacy_unit="uid", budget=dp.ZCDP(100),
                          max_partitions=k, max_rows_per_partition=1, source=SeededRandom(k))
        release = curator.sql("SELECT g, COUNT(*) AS n FROM data GROUP BY g", rho=0.5,
                              keys=KEYS, bounding="sample")
        (noise,) = _measures(release, "n")
        assert noise["noise"] == "discrete Gaussian"
        assert noise["sigma"] == pytest.approx(math.sqrt(k), rel=1e-6)  # sqrt(k) / sqrt(2 rho)
        values = release.values["n"]
        assert bool(np.all(values == np.round(values))) is integer


def _laplace_moments(t: float, clip: float) -> tuple[float, float]:
    """E[min(Z^2, clip)] and its variance for Z discrete Laplace of scale t (exact sums)."""
    q = math.exp(-1 / t)
    z = np.arange(-2000, 2001, dtype=np.float64)
    p = (1 - q) / (1 + q) * q ** np.abs(z)
    y = np.minimum(z * z, clip)
    mean = float(np.sum(p * y))
    return mean, float(np.sum(p * (y - mean) ** 2))


def test_count_rmse_at_epsilon_one_is_the_discrete_laplace_one() -> None:
    """3,000 releases of 70 counts at epsilon = 1: the noise is discrete Laplace of scale 1,
    MSE 2q / (1 - q)^2 = 1.8414 (RMSE 1.357), where fixed-point noise had MSE 2 (RMSE 1.414).

    Test: Y = min(Z^2, 400) is bounded, with exact mean mu and variance s^2 (sums above);
    Bernstein's inequality gives P[|mean(Y) - mu| >= t] <= 2 exp(-N t^2 / (2 s^2 + 2 B t / 3))
    with B = 400, and t is set so that this is 1e-7 for N = 210,000: a correct mechanism fails
    with probability below 1e-7, and an MSE of 2 (today's) is 0.16 away, more than 2 t."""
    curator = Curator(_frame(), one_row_per_person=True, budget=dp.PureDP(1e9), cache=False,
                      postprocess=False, source=SeededRandom(2))
    truth = _frame().groupby("g").size().reindex(KEYS).to_numpy(dtype=np.float64)
    runs = 3000
    squares = np.empty((runs, len(KEYS)))
    for run in range(runs):
        release = curator.sql("SELECT g, COUNT(*) AS n FROM data GROUP BY g", epsilon=1.0,
                              keys=KEYS)
        squares[run] = (release.values["n"] - truth) ** 2
    clip = 400.0
    mean, variance = _laplace_moments(1.0, clip)
    assert mean == pytest.approx(2 * math.exp(-1) / (1 - math.exp(-1)) ** 2, rel=1e-6)
    n = squares.size
    log_term = math.log(2 / 1e-7)
    # Solve N t^2 = log_term (2 s^2 + 2 B t / 3) for t > 0.
    b = 2 * clip * log_term / 3
    t = (b + math.sqrt(b * b + 4 * n * 2 * variance * log_term)) / (2 * n)
    observed = float(np.mean(np.minimum(squares, clip)))
    assert abs(observed - mean) <= t, (observed, mean, t)
    assert mean + 2 * t < 2.0  # the test tells the old MSE apart
    assert math.sqrt(float(np.mean(squares))) < 1.409


def test_integer_count_intervals_are_the_shortest_exact_ones() -> None:
    """At epsilon = 1 (scale 1) and 95%: [x - 3, x + 2], coverage P[-2 <= Z <= 3] = 0.9502,
    where the symmetric [x - 3, x + 3] covers 0.9732 and today's fixed-point one was
    2 * 2.996 wide. Exact sums over the discrete Laplace pmf."""
    noise = DiscreteLaplace(epsilon=1.0, sensitivity=1)
    low, high = CountIntervals(NoiseTails.of(noise), None).interval(np.array([100.0]), 0.05)
    assert (low[0], high[0]) == (97.0, 102.0)
    q = math.exp(-1)
    z = np.arange(-200, 201)
    p = (1 - q) / (1 + q) * q ** np.abs(z)
    coverage = float(p[(z >= -2) & (z <= 3)].sum())
    assert 0.95 <= coverage < 0.951
    assert high[0] - low[0] < 2 * math.log(1 / 0.05)
    for epsilon in (0.1, 0.5, 2.0, 5.0):  # always the least width with coverage >= 95%
        mech = DiscreteLaplace(epsilon=epsilon, sensitivity=1)
        lo, hi = CountIntervals(NoiseTails.of(mech), None).interval(np.array([0.0]), 0.05)
        qq = math.exp(-epsilon)
        zz = np.arange(-5000, 5001)
        pp = (1 - qq) / (1 + qq) * qq ** np.abs(zz)
        a, b = int(-hi[0]), int(-lo[0])  # Z in [a, b] covers
        assert pp[(zz >= a) & (zz <= b)].sum() >= 0.95
        narrower = max(pp[(zz >= a + 1) & (zz <= b)].sum(), pp[(zz >= a) & (zz <= b - 1)].sum())
        assert narrower < 0.95


def test_gaussian_count_intervals_cover_their_level() -> None:
    noise = DiscreteGaussian(rho=0.125, sensitivity=1)  # sigma = 2
    low, high = CountIntervals(NoiseTails.of(noise), None).interval(np.array([0.0]), 0.05)
    z = np.arange(-100, 101)
    p = np.exp(-z * z / 8.0)
    p /= p.sum()
    covered = float(p[(z >= -high[0]) & (z <= -low[0])].sum())
    assert 0.95 <= covered < 0.97


def test_integer_count_intervals_cover_in_a_curator() -> None:
    """4,200 count intervals (60 runs x 70 partitions) at 95% for true coverage 0.9502: the
    count is compared with the 1e-7 quantiles of Binomial(4200, 0.9502)."""
    frame = _frame()
    truth = frame.groupby("g").size().reindex(KEYS).to_numpy(dtype=np.float64)
    curator = Curator(frame, one_row_per_person=True, budget=dp.PureDP(1e9), cache=False,
                      source=SeededRandom(3))
    hits, runs = 0, 60
    for _ in range(runs):
        release = curator.sql("SELECT g, COUNT(*) AS n FROM data GROUP BY g", epsilon=1.0,
                              keys=KEYS)
        low, high = release.interval("n", 0.95)
        hits += int(np.sum((low <= truth) & (truth <= high)))
    trials = runs * len(KEYS)
    assert binom.ppf(1e-7, trials, 0.9502) <= hits <= binom.isf(1e-7, trials, 0.9502)
