"""The fast exact discrete Gaussian behind DP-SGD's noise (``dpcurator.learn._noise``).

Distribution tests are exact binomial tests on the counts of fixed bins against the discrete
Gaussian's exact probabilities (lattice sums in double precision, far more accurate than any
count). Each test states its false-failure probability (below 1e-6) and why a wrong sampler
fails it.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats

from dpcurator.learn import _noise
from dpcurator.learn._noise import MIN_WIDE_SIGMA, WideGaussian, sample_wide_discrete_gaussian
from dpcurator.noise import SecureRandom, SeededRandom

# Bin edges in units of sigma: (-inf, -3], (-3, -2.5], ..., (3, inf).
_EDGES = np.arange(-3.0, 3.01, 0.5)


def _bin_probabilities(sigma: float) -> npt.NDArray[np.float64]:
    """P[Y in bin] for the discrete Gaussian: lattice sums over |y| <= 40 sigma, or for a
    wide sigma the Gaussian CDF at half-integers (Euler-Maclaurin: off by O(sigma^-2), below
    1e-12 here, against counts known to 1e-3)."""
    if sigma > 1e5:
        cdf = stats.norm.cdf((np.floor(_EDGES * sigma) + 0.5) / sigma)
        return np.diff(np.concatenate([[0.0], cdf, [1.0]]))
    half = int(40 * sigma)
    y = np.arange(-half, half + 1, dtype=np.float64)
    weights = np.exp(-(y * y) / (2 * sigma * sigma))
    weights /= weights.sum()
    index = np.searchsorted(_EDGES * sigma, y, side="left")
    counts = np.bincount(index, weights=weights, minlength=len(_EDGES) + 1)
    return counts.astype(np.float64)


def _worst_binomial_p(values: npt.NDArray[np.int64], sigma: float) -> float:
    """The smallest two-sided exact binomial p-value over the bins (x 2, both tails)."""
    index = np.searchsorted(_EDGES * sigma, values.astype(np.float64), side="left")
    counts = np.bincount(index, minlength=len(_EDGES) + 1)
    probs = _bin_probabilities(sigma)
    n = int(values.size)
    worst = 1.0
    for count, p in zip(counts, probs, strict=True):
        lower = stats.binom.cdf(count, n, p)
        upper = stats.binom.sf(count - 1, n, p)
        worst = min(worst, 2 * min(lower, upper))
    return float(worst)


# 14 bins, each tested two-sided at 5e-9: false failure <= 14 * 5e-9 < 1e-7 per sample.
_ALPHA = 5e-9


@pytest.mark.parametrize("sigma", [Fraction(1024), Fraction(3000) + Fraction(1, 3),
                                   Fraction(2**40) * Fraction(11, 10)])
def test_fast_sampler_matches_the_exact_distribution(sigma: Fraction) -> None:
    """300,000 draws per sigma, 14 bins, exact binomial tests (false failure < 1e-7 each).

    A sampler whose sigma is off by 3% moves the outer bins' counts by about 15 standard
    deviations (checked below), so the test has the power to see a wrong scale or shape.
    """
    draws = sample_wide_discrete_gaussian(sigma, 300_000, SeededRandom(int(sigma)))
    assert draws.dtype == np.int64
    assert _worst_binomial_p(draws, float(sigma)) > _ALPHA


def test_the_binomial_check_sees_a_three_percent_error() -> None:
    """The same check rejects draws of sigma * 1.03 judged as sigma.

    With 300,000 draws, P[|Y| > 2.5 sigma] is 0.0124 against 0.0155: about 3,700 against
    4,650 expected, a gap of 15 standard deviations; the check's threshold is 6, so this test
    fails by chance with probability far below 1e-9.
    """
    sigma = 4096.0
    draws = sample_wide_discrete_gaussian(sigma * 1.03, 300_000, SeededRandom(7))
    assert _worst_binomial_p(draws, sigma) < _ALPHA


def _exact_path_draws(table: _noise._Table, count: int, seed: int) -> list[int]:
    """Trials decided only by the exact (interval arithmetic) path, from random words."""
    source = SeededRandom(seed)
    out: list[int] = []
    while len(out) < count:
        w1, w2, w3 = (int(w) for w in source.words(3))
        value = _noise._settle(table, (w1, w2, w3), source)
        if value is not None:
            out.append(value)
    return out


def test_exact_path_alone_draws_the_discrete_gaussian() -> None:
    """Every trial settled in interval arithmetic: 4,000 draws, exact binomial tests.

    This is the path taken by the rare trials the compiled kernel cannot decide; it must be
    exactly right on its own. False failure < 1e-7 (as above); a wrong acceptance rule (say,
    accepting every proposal) flattens each bin and fails by over 10 standard deviations.
    """
    sigma = Fraction(MIN_WIDE_SIGMA)
    draws = np.array(_exact_path_draws(_noise._table(sigma), 4000, 11), dtype=np.int64)
    assert _worst_binomial_p(draws, float(sigma)) > _ALPHA


def test_tail_outcome_is_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tail outcome, moved from 12 sigma to 2 sigma so that it carries 4.6% of the mass.

    At 12 sigma the tail is proposed with probability below 2^-60, too rare to test; the
    construction (a geometric proposal past the cut, accepted exactly) does not depend on
    where the cut is. Both the compiled path (tail trials are pending and settled exactly)
    and the exact path alone must then draw the discrete Gaussian: 60,000 and 4,000 draws,
    exact binomial tests, false failure < 1e-7 each. A tail that drew the wrong law (say
    geometric without the acceptance step) would fill the outer bins with 2-3 times their
    mass, dozens of standard deviations.
    """
    monkeypatch.setattr(_noise, "_CUT", 2)
    _noise._table.cache_clear()
    try:
        sigma = Fraction(MIN_WIDE_SIGMA) + 1
        table = _noise._table(sigma)
        assert table.tail_start <= 2 * sigma + (1 << table.m)
        fast = sample_wide_discrete_gaussian(sigma, 60_000, SeededRandom(5))
        assert np.mean(np.abs(fast) >= table.tail_start) > 0.03  # the tail was drawn
        assert _worst_binomial_p(fast, float(sigma)) > _ALPHA
        exact = np.array(_exact_path_draws(table, 4000, 13), dtype=np.int64)
        assert _worst_binomial_p(exact, float(sigma)) > _ALPHA
    finally:
        _noise._table.cache_clear()


def test_alias_table_is_exact() -> None:
    """The alias columns give every outcome exactly its integer weight out of 2^64."""
    table = _noise._table(Fraction(5000))
    capacity = 1 << (64 - 11)
    mass = [0] * (1 << 11)
    for column in range(1 << 11):
        keep = int(table.prob[column])
        mass[column] += keep
        mass[int(table.alias[column])] += capacity - keep
    weights = [*table.weights, (1 << 64) - sum(table.weights)]
    assert mass[: len(weights)] == weights
    assert sum(mass[len(weights):]) == 0
    # Rejection is rare: the weights fill 2^64 but for about 2^-30.
    assert (1 << 64) - sum(table.weights) < 1 << 36


def test_acceptance_never_exceeds_one() -> None:
    """D exp(-(k M)^2 / 2 s^2) <= W_k for every bin (and the tail), so every acceptance
    probability is a probability."""
    sigma = Fraction(7777)
    table = _noise._table(sigma)
    width = 1 << table.m
    for k in range(table.n_bins):
        assert table.scale * math.exp(-((k * width) ** 2) / float(2 * sigma**2)) <= (
            table.weights[k] * (1 + 1e-15))
        assert 0 < table.ratio[k] <= 1


def test_small_sigma_falls_back_and_sizes() -> None:
    draws = sample_wide_discrete_gaussian(3.5, 1000, SeededRandom(1))
    assert draws.shape == (1000,) and draws.dtype == np.int64
    assert sample_wide_discrete_gaussian(2**20, 0).shape == (0,)
    assert sample_wide_discrete_gaussian(2**20, 5, SecureRandom()).shape == (5,)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), 2.0**57])
def test_bad_sigma_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="sigma"):
        sample_wide_discrete_gaussian(bad, 10)


def test_bad_size_is_refused() -> None:
    with pytest.raises(ValueError, match="size"):
        sample_wide_discrete_gaussian(2**20, -1)


def test_one_sampler_drawn_from_several_threads_at_once_keeps_its_law() -> None:
    """DP-SGD on a GPU draws a large noise vector in parts on several threads, from one
    ``WideGaussian``. Each call keeps its own pending trials (those decided exactly): shared,
    a call could settle another's trial into its own vector and leave a slot unset (zero:
    the vector's fresh memory). Pending trials are rare (a uniform within 2^-36 of its
    threshold, or the tail), so this checks the law under concurrency rather than catching
    that race: 4 threads x 2^18 draws at s = 2^40, every value within 13 s (beyond it,
    below 1e-37 a draw), no exact zero (P[Y = 0] < 4e-13 a draw: below 4e-7 in all), and
    the pooled standard deviation within 1% of s (10 standard errors: below 1e-20)."""
    from concurrent.futures import ThreadPoolExecutor

    s = 2**40
    sampler = WideGaussian(s)
    sampler.sample(1024)  # compile before the threads start
    with ThreadPoolExecutor(4) as pool:
        parts = list(pool.map(sampler.sample, [1 << 18] * 4))
    values = np.concatenate(parts).astype(np.float64)
    assert values.size == 1 << 20
    assert np.abs(values).max() <= 13 * s
    assert np.count_nonzero(values) == values.size
    assert abs(values.std() / s - 1) < 0.01
