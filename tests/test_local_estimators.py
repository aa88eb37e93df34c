"""Estimates are unbiased, their variances equal the closed forms, and intervals cover.

Each mechanism is run R = 2,000 times on a fixed population of n = 1,000 answers (one batch of
R * n reports, split into R surveys). Per category (or for the mean):

- Unbiasedness: the average of the R estimates is compared with the truth in units of the exact
  closed-form standard deviation sqrt(Var / R); |z| > 5.7 has probability < 1.2e-8 per check by
  the central limit theorem (a sum of R * n = 2e6 independent bounded terms), so a correct
  estimator fails a test (at most 4 checks) with probability < 1e-7.
- Variance: (R - 1) s^2 / Var is chi-square with R - 1 degrees of freedom for normal estimates;
  it must lie between the 1e-8 and 1 - 1e-8 quantiles (each estimate is a sum of 1,000
  independent bounded terms: its excess kurtosis is O(1/n) < 0.01, which changes Var[s^2] by
  under 0.5%, immaterial at these quantiles). A wrong closed form by 25% or more fails.
- Coverage of the normal intervals (asymptotic): the number of misses must be a plausible
  Binomial(R, m) count for some miss rate m in [alpha - 0.02, alpha + 0.02] (tails 1e-8). The
  exact intervals (Clopper-Pearson, Hoeffding) must miss at most as often as Binomial(R, alpha)
  allows at 1e-7: their coverage is guaranteed, not asymptotic.
Seeds make runs reproducible, not the assertions true.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpcurator.local import (
    BinaryResponse,
    Duchi,
    FrequencyOracle,
    Piecewise,
    choose_mechanism,
    interval_half_width,
    make_randomizer,
    plot_interval_widths,
    project_simplex,
    sample_size,
)
from dpcurator.local.estimators import frequency_arrays, z_value
from dpcurator.local.frequency import SupportOracle
from dpcurator.noise import SeededRandom

R, N = 2_000, 1_000
Z_MAX = 5.7
ALPHA = 0.05
TAIL = 1e-8


def _check_variance(samples: np.ndarray[Any, Any], variance: float) -> None:
    ratio = (samples.size - 1) * samples.var(ddof=1) / variance
    df = samples.size - 1
    assert stats.chi2.ppf(TAIL, df) < ratio < stats.chi2.isf(TAIL, df), ratio / df


def _check_mean(samples: np.ndarray[Any, Any], truth: float, variance: float) -> None:
    z = (samples.mean() - truth) / math.sqrt(variance / samples.size)
    assert abs(z) < Z_MAX, z


def _check_normal_coverage(misses: int) -> None:
    assert stats.binom.ppf(TAIL, R, ALPHA - 0.02) <= misses <= stats.binom.isf(TAIL, R,
                                                                                ALPHA + 0.02)


def _check_exact_coverage(misses: int) -> None:
    assert misses <= stats.binom.isf(1e-7, R, ALPHA)


def _replicate_counts(oracle: SupportOracle, reports: Any) -> np.ndarray[Any, Any]:
    """Support counts per survey, shape (R, k)."""
    return np.stack([oracle.supports(reports, v).reshape(R, N).sum(axis=1)
                     for v in range(oracle.k)], axis=1)


FREQUENCY_CASES = ["grr", "sue", "oue", "olh", "hadamard"]


@pytest.mark.parametrize("name", FREQUENCY_CASES)
def test_frequency_oracles_unbiased_exact_variance_and_coverage(name: str) -> None:
    shares = np.array([0.4, 0.3, 0.2, 0.1])
    oracle = make_randomizer(name, 1.0, categories=["a", "b", "c", "d"],
                             source=SeededRandom(100 + len(name)))
    assert isinstance(oracle, FrequencyOracle)
    answers = np.repeat(np.arange(4), (shares * N).astype(int))  # a fixed population
    reports = oracle.randomize_indices(np.tile(answers, R))
    counts = _replicate_counts(oracle, reports)
    p, q = oracle.support_probabilities()
    variance = oracle.variance(shares, N, model="fixed")
    misses = np.zeros(4, dtype=np.int64)
    estimates = np.empty((R, 4))
    for r in range(R):
        value, _, low, high = frequency_arrays(counts[r], N, p, q, 1 - ALPHA, "normal")
        estimates[r] = value
        misses += (shares < low) | (shares > high)
    for v in range(4):
        _check_mean(estimates[:, v], shares[v], variance[v])
        _check_variance(estimates[:, v], variance[v])
        _check_normal_coverage(int(misses[v]))
    # The one-shot estimate agrees with the per-survey computation.
    first = oracle.estimate(reports[:N])
    assert np.allclose(first.estimates, estimates[0])


@pytest.mark.parametrize("name", ["rr", "two-coin"])
def test_binary_estimator_is_the_references_and_covers_exactly(name: str) -> None:
    rate = 0.3
    rand = BinaryResponse(1.2, name, SeededRandom(7))
    rng = np.random.default_rng(8)
    # Sampled respondents (i.i.d. answers): the model of Clopper-Pearson and of v(p, mu).
    answers = rng.random(R * N) < rate
    reports = rand.randomize(answers).reshape(R, N)
    variance = float(rand.variance([1 - rate, rate], N, model="sampled")[1])
    p = rand.truth_probability
    if name == "rr":  # Lalanne, lesson 1, eq. (14): v(p, mu) / n
        pf = float(p)
        v = rate / pf - rate**2 + (1 - pf) / (2 * pf**2) - (1 - pf) ** 2 / (4 * pf**2) - (
            rate * (1 - pf) / pf)
        assert math.isclose(variance, v / N, rel_tol=1e-12)
    values = np.empty(R)
    normal_misses = exact_misses = 0
    for r in range(R):
        est = rand.estimate(reports[r], method="normal")
        values[r] = est.estimate
        normal_misses += not est.interval[0] <= rate <= est.interval[1]
        exact = rand.estimate(reports[r], method="exact").interval
        exact_misses += not exact[0] <= rate <= exact[1]
    if name == "rr":  # mu_hat = (mean - (1 - p)/2) / p, eq. (10)
        mean = reports[0].mean()
        assert math.isclose(values[0], (mean - (1 - float(p)) / 2) / float(p), rel_tol=1e-12)
    _check_mean(values, rate, variance)
    _check_variance(values, variance)
    _check_normal_coverage(normal_misses)
    _check_exact_coverage(exact_misses)
    # The mechanism's own estimator gives the same numbers.
    own = rand.randomized_response.estimate(reports[0])
    assert math.isclose(own.value, values[0], rel_tol=1e-12)


def test_exact_interval_for_categories_covers() -> None:
    shares = np.array([0.5, 0.3, 0.2])
    rand = make_randomizer("grr", 0.7, categories=3, source=SeededRandom(9))
    assert isinstance(rand, FrequencyOracle)
    rng = np.random.default_rng(10)
    answers = rng.choice(3, size=R * N, p=shares)  # sampled respondents
    reports = rand.randomize_indices(answers)
    counts = _replicate_counts(rand, reports)
    p, q = rand.support_probabilities()
    misses = np.zeros(3, dtype=np.int64)
    for r in range(R):
        _, _, low, high = frequency_arrays(counts[r], N, p, q, 1 - ALPHA, "exact")
        misses += (shares < low) | (shares > high)
    for m in misses:
        _check_exact_coverage(int(m))


def test_default_interval_holds_its_level_for_rare_categories() -> None:
    """The default interval covers at least 95% for rare shares and never has zero width.

    GRR at epsilon = 5, k = 4, shares (0.9, 0.07, 0.02, 0.01), n = 200 sampled respondents, and
    rr at epsilon = 4 for a 2% rate, n = 300: about 3 reports support the 1% category, where the
    asymptotic interval covered 83% and was the point [0, 0] in 5% of surveys. Over R2 = 10,000
    surveys a correct interval (coverage >= 95%) misses a Binomial(R2, <= 0.05) number of times;
    each of the 5 checks allows up to the 1 - 2e-7 quantile of Binomial(R2, 0.05) (about 6.1%),
    so a correct implementation fails with probability below 1e-6 (union bound). Widths are
    positive for every survey and category: no report stream makes a share certain here.
    """
    r2 = 10_000
    rng = np.random.default_rng(11)
    limit = stats.binom.isf(2e-7, r2, ALPHA)
    shares = np.array([0.9, 0.07, 0.02, 0.01])
    grr = make_randomizer("grr", 5.0, categories=4, source=SeededRandom(12))
    assert isinstance(grr, FrequencyOracle)
    reports = grr.randomize_indices(rng.choice(4, size=r2 * 200, p=shares)).reshape(r2, 200)
    counts = np.stack([np.bincount(row, minlength=4) for row in reports])
    first = grr.estimate(reports[0])
    assert first.method == "exact"  # the default
    p, q = grr.support_probabilities()
    _, _, low, high = frequency_arrays(counts, 200, p, q, 1 - ALPHA, first.method)
    assert np.array_equal(first.intervals[0], low[0])
    assert np.array_equal(first.intervals[1], high[0])
    misses = ((shares < low) | (shares > high)).sum(axis=0)
    assert np.all(misses <= limit), (misses, limit)
    assert np.all(high > low)

    rr = BinaryResponse(4.0, "rr", SeededRandom(13))
    yes = rr.randomize(rng.random(r2 * 300) < 0.02).reshape(r2, 300).sum(axis=1)
    method = rr.estimate(rr.randomize(np.zeros(300, dtype=bool))).method
    assert method == "exact"
    p, q = rr.support_probabilities()
    _, _, low, high = frequency_arrays(np.stack([300 - yes, yes], axis=1), 300, p, q,
                                       1 - ALPHA, method)
    rr_misses = int(((low[:, 1] > 0.02) | (high[:, 1] < 0.02)).sum())
    assert rr_misses <= limit, (rr_misses, limit)
    assert np.all(high > low)


@pytest.mark.parametrize("name", ["duchi", "piecewise"])
def test_mean_estimators_unbiased_exact_variance_and_coverage(name: str) -> None:
    low, high = -2.0, 6.0
    rand = make_randomizer(name, 1.0, low=low, high=high, source=SeededRandom(21))
    assert isinstance(rand, Duchi | Piecewise)
    values = np.linspace(low, high, N) ** 2 / high  # a skewed fixed population in [0, 6]
    values = np.clip(values, low, high)
    truth = float(values.mean())
    reports = rand.randomize(np.tile(values, R)).reshape(R, N)
    variance = rand.variance(values)
    means = np.empty(R)
    normal_misses = exact_misses = 0
    for r in range(R):
        est = rand.estimate(reports[r])
        means[r] = est.estimate
        normal_misses += not est.interval[0] <= truth <= est.interval[1]
        exact = rand.estimate(reports[r], method="exact").interval
        exact_misses += not exact[0] <= truth <= exact[1]
    _check_mean(means, truth, variance)
    _check_variance(means, variance)
    _check_normal_coverage(normal_misses)
    if name == "piecewise":  # Hoeffding: valid for a fixed population too
        _check_exact_coverage(exact_misses)


def test_duchi_exact_interval_covers_sampled_respondents() -> None:
    rand = Duchi(0.5, 0.0, 1.0, SeededRandom(31))
    rng = np.random.default_rng(32)
    values = rng.beta(2, 5, R * N)
    truth = 2 / 7
    reports = rand.randomize(values).reshape(R, N)
    misses = 0
    for r in range(R):
        lo, hi = rand.estimate(reports[r], method="exact").interval
        misses += not lo <= truth <= hi
    _check_exact_coverage(misses)


def test_piecewise_variance_closed_form_matches_enumeration() -> None:
    rand = Piecewise(1.3, 0.0, 1.0, grid_bits=5)
    for x in [Fraction(0), Fraction(1, 3), Fraction(17, 64), Fraction(1)]:
        dist = rand.report_distribution(x)
        n_, m_ = rand.grid, rand.m
        mean = sum(p * Fraction(2 * j - n_ - m_ + 1, n_ - m_) for (j,), p in dist.items())
        second = sum(p * Fraction(2 * j - n_ - m_ + 1, n_ - m_) ** 2 for (j,), p in dist.items())
        xs = 2 * x - 1
        assert mean == xs  # unbiased, exactly
        exact_var = float(second - xs * xs)
        closed = float(rand.conditional_variance(np.array([float(x)]))[0])
        assert math.isclose(closed, exact_var, rel_tol=1e-12)


def test_projection_is_explicit_post_processing() -> None:
    v = np.array([0.7, 0.5, -0.1, -0.1])
    proj = project_simplex(v)
    assert proj.min() >= 0 and math.isclose(proj.sum(), 1.0)
    assert np.allclose(project_simplex(proj), proj)
    assert np.allclose(project_simplex([0.2, 0.3, 0.5]), [0.2, 0.3, 0.5])
    oracle = make_randomizer("oue", 0.5, categories=8, source=SeededRandom(3))
    reports = oracle.randomize(np.zeros(300, dtype=np.int64))
    plain = oracle.estimate(reports)
    assert not plain.projected and np.any(plain.estimates < 0)  # unbiased estimates can be < 0
    projected = oracle.estimate(reports, project=True)
    assert projected.projected and projected.estimates.min() >= 0
    assert np.allclose(projected.unbiased, plain.estimates)
    assert np.allclose(projected.intervals[0], plain.intervals[0])


def test_sample_size_matches_the_closed_form() -> None:
    rand = make_randomizer("rr", 1.0)
    assert isinstance(rand, BinaryResponse)
    p = float(rand.truth_probability)
    z = z_value(0.95)
    # Worst case: lambda = 1/2 is reachable, so v = 1/(4 p^2).
    expected = math.ceil(z * z / (4 * p * p) / 0.01**2)
    n = sample_size(rand, 0.01, 0.95)
    assert n in (expected, expected + 1)
    assert interval_half_width(rand, n) <= 0.01 < interval_half_width(rand, n - 1)
    assert sample_size(rand, 0.01, 0.95, rate=0.05) < n
    assert sample_size(make_randomizer("rr", 2.0), 0.01) < n  # more epsilon, fewer people
    duchi = make_randomizer("duchi", 1.0, low=0, high=10)
    assert isinstance(duchi, Duchi)
    assert sample_size(duchi, 0.5) == math.ceil(z * z * duchi.bound**2 * 25 / 0.25)


def test_figure_is_written(tmp_path: Any) -> None:
    for suffix in (".png", ".svg"):
        path = plot_interval_widths(tmp_path / f"widths{suffix}", epsilons=(0.5, 1, 2),
                                    sample_sizes=[100, 1000, 10000])
        assert path.exists() and path.stat().st_size > 1000
    with pytest.raises(ValueError, match="png"):
        plot_interval_widths(tmp_path / "widths.txt")


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0, 4.0])
def test_chooser_follows_wang_et_al(epsilon: float) -> None:
    for k in (2, 3, 5, 8, 16, 40, 100, 256):
        expected = "grr" if k < 3 * math.exp(epsilon) + 2 else "oue"
        assert choose_mechanism(k, epsilon) == expected, (k, epsilon)
    assert make_randomizer("auto", 1.0, categories=100).mechanism == "oue"
    assert choose_mechanism(100, 1.0, candidates=("olh", "hadamard")) == "olh"


def test_a_mean_interval_beyond_the_range_keeps_low_below_high() -> None:
    """40 reports of +1 under Duchi at epsilon 0.5 (C about 4.1): the raw interval lies wholly
    above 1, and clipping only its top end to 1 gave (1.93, 1.0) in units of [0, 1], low
    above high. Now it runs from the range's end to the estimate."""
    rand = Duchi(0.5, 0.0, 1.0)
    for method in ("normal", "exact"):
        est = rand.estimate(np.ones(40, dtype=np.int8), method=method)
        lo, hi = est.interval
        assert lo == 1.0 and hi == est.estimate > 1.0, (method, est)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(data=st.data(), name=st.sampled_from(["duchi", "piecewise"]),
       epsilon=st.floats(0.05, 8.0), n=st.integers(1, 40),
       low=st.floats(-1e6, 1e6), width=st.floats(1e-3, 1e6),
       confidence=st.floats(0.5, 0.999), method=st.sampled_from(["normal", "exact"]))
def test_mean_intervals_are_ordered_and_hold_the_estimate(
        data: st.DataObject, name: str, epsilon: float, n: int, low: float, width: float,
        confidence: float, method: str) -> None:
    """Whatever the reports (a few, all at one extreme, at any epsilon): low <= estimate <=
    high, projected or not, and the interval leaves [low, high] only as far as the unbiased
    estimate does (``project`` clips the estimate, never the interval)."""
    high = low + width
    rand = make_randomizer(name, epsilon, low=low, high=high)
    assert isinstance(rand, Duchi | Piecewise)
    if isinstance(rand, Duchi):
        reports = np.array(data.draw(st.lists(st.sampled_from([1, -1]), min_size=n,
                                              max_size=n)), dtype=np.int8)
    else:
        cells = st.sampled_from([0, rand.grid + rand.m - 1, rand.grid // 2]) | st.integers(
            0, rand.grid + rand.m - 1)
        reports = np.array(data.draw(st.lists(cells, min_size=n, max_size=n)),
                           dtype=np.int64)
    est = rand.estimate(reports, confidence=confidence, method=method)
    projected = rand.estimate(reports, confidence=confidence, method=method, project=True)
    lo, hi = est.interval
    assert projected.interval == est.interval
    assert lo <= est.estimate <= hi and lo <= projected.estimate <= hi, (est, projected)
    assert min(rand.low, est.estimate) <= lo and hi <= max(rand.high, est.estimate), est
    assert lo <= rand.high and hi >= rand.low, est  # it always meets the range
