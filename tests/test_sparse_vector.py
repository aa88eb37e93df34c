"""Sparse vector technique (Lyu, Su and Li 2017, Algorithm 1) with exact grid Laplace noise.

Statistical tests state their false-failure probability; each is below 1e-6.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from scipy import integrate, stats

from dpcurator.accounting import Neighbouring, PureDP
from dpcurator.mechanisms.sparse_vector import SparseVector
from dpcurator.noise import SeededRandom


def svt(**kwargs: Any) -> SparseVector:
    params: dict[str, Any] = {"epsilon": 1.0, "sensitivity": 1.0, "threshold": 0.0,
                              "source": SeededRandom(0), **kwargs}
    return SparseVector(**params)


# ---------------------------------------------------------------------------------------------
# Stopping rule and outputs. "Far" below means beyond accuracy(1e-9, n): each of these tests
# fails falsely with probability below 1e-9 (the accuracy bound's own guarantee).


def test_stops_after_c_positives() -> None:
    mech = svt(max_positives=3)
    far = mech.accuracy(1e-9, 10) * 2
    out = mech.release(np.full(10, far))
    assert out.tolist() == [0, 1, 2]
    assert out.dtype == np.int64


def test_reports_exactly_the_queries_above() -> None:
    mech = svt(max_positives=2, threshold=100.0, sensitivity=2.0, epsilon=2.0)
    far = mech.accuracy(1e-9, 8) * 2
    answers = np.full(8, 100.0 - far)
    answers[[3, 6]] = 100.0 + far
    assert mech.release(answers).tolist() == [3, 6]
    answers[7] = 100.0 + far  # a third positive after the second is never reached
    assert mech.release(answers).tolist() == [3, 6]
    below = np.full(8, 100.0 - far)
    assert mech.release(below).tolist() == []  # fewer than c: every query was answered
    assert mech.release(np.array([])).tolist() == []


def test_huge_answers_are_compared_exactly() -> None:
    """Answers whose grid index overflows int64 take the exact Python-integer path."""
    mech = svt(max_positives=2)
    assert mech.release([1e300, -1e300, 0.5e300]).tolist() == [0, 2]


def test_seeded_release_is_reproducible() -> None:
    answers = np.linspace(-20, 20, 41)
    a = svt(max_positives=5, source=SeededRandom(3)).release(answers)
    b = svt(max_positives=5, source=SeededRandom(3)).release(answers)
    assert a.tolist() == b.tolist()


# ---------------------------------------------------------------------------------------------
# Budget split, scales and guarantee.


@pytest.mark.parametrize(("c", "monotonic"), [(1, False), (4, False), (4, True), (10, True)])
def test_default_split_is_lyu_su_li_ratio(c: int, monotonic: bool) -> None:
    mech = svt(epsilon=1.5, sensitivity=3.0, max_positives=c, monotonic=monotonic)
    ratio = (c if monotonic else 2 * c) ** (2 / 3)
    assert mech.query_epsilon / mech.threshold_epsilon == pytest.approx(ratio, rel=1e-12)
    # eps1 + eps2 == epsilon exactly.
    assert mech._eps1 + mech._eps2 == Fraction(1.5)
    g = Fraction(mech.granularity)
    assert Fraction(mech.threshold_scale) == pytest.approx((3 + g) / mech._eps1, rel=1e-15)
    factor = c if monotonic else 2 * c
    assert mech.query_scale == pytest.approx(float(factor * (3 + g) / mech._eps2), rel=1e-15)
    assert mech.granularity <= 3.0 * 2.0**-40  # inflation of Delta = 3 by at most 2^-40
    assert mech.guarantee == PureDP(1.5, neighbouring=Neighbouring.ADD_REMOVE)


def test_explicit_threshold_epsilon() -> None:
    mech = svt(epsilon=1.0, threshold_epsilon=0.5, max_positives=2)
    assert mech.threshold_epsilon == 0.5 and mech.query_epsilon == 0.5
    replace = svt(neighbouring=Neighbouring.REPLACE)
    assert replace.guarantee.neighbouring is Neighbouring.REPLACE


@pytest.mark.parametrize(("kwargs", "pattern"), [
    ({"epsilon": 0.0}, "epsilon"),
    ({"epsilon": -1.0}, "epsilon"),
    ({"sensitivity": 0.0}, "sensitivity"),
    ({"sensitivity": float("inf")}, "sensitivity"),
    ({"threshold": float("nan")}, "threshold"),
    ({"threshold": "high"}, "threshold"),
    ({"max_positives": 0}, "max_positives"),
    ({"max_positives": 1.5}, "max_positives"),
    ({"max_positives": True}, "max_positives"),
    ({"threshold_epsilon": 1.0}, "threshold_epsilon"),
    ({"threshold_epsilon": 2.0}, "threshold_epsilon"),
    ({"threshold_epsilon": -0.1}, "threshold_epsilon"),
    ({"monotonic": 1}, "monotonic"),
])
def test_invalid_parameters(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        svt(**kwargs)


@pytest.mark.parametrize(("answers", "pattern"), [
    ([[1.0, 2.0]], "1-D"),
    ([1.0, float("nan")], "finite"),
    ([1.0, float("inf")], "finite"),
    (["a"], "numeric"),
])
def test_invalid_answers(answers: Any, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        svt().release(answers)


# ---------------------------------------------------------------------------------------------
# Noise: the probability of "above" for a single query matches the Laplace model.


def probability_above(gap: float, threshold_scale: float, query_scale: float) -> float:
    """P[gap + Lap(query_scale) >= Lap(threshold_scale)] for continuous Laplace noise.

    The grid noise differs from it by a relative ~2^-40, far below what 4,000 draws resolve.
    """
    def integrand(r: float) -> float:
        return float(stats.laplace.pdf(r, scale=threshold_scale)
                     * stats.laplace.sf(r - gap, scale=query_scale))
    # The integrand has kinks at 0 and at gap: integrate piecewise.
    low, high = min(0.0, gap), max(0.0, gap)
    pieces = [(-np.inf, low), (low, high), (high, np.inf)]
    return float(sum(integrate.quad(integrand, a, b, epsabs=1e-13)[0]
                     for a, b in pieces if a < b))


@pytest.mark.parametrize(("gap", "c", "monotonic"), [(0.0, 1, False), (6.0, 3, True)])
def test_single_query_above_probability(gap: float, c: int, monotonic: bool) -> None:
    """Exact two-sided binomial test at 1e-7 on 4,000 releases: false failure < 1e-7 each."""
    mech = svt(threshold=10.0, max_positives=c, monotonic=monotonic, source=SeededRandom(17))
    draws = 4_000
    above = sum(mech.release([10.0 + gap]).size for _ in range(draws))
    p = probability_above(gap, mech.threshold_scale, mech.query_scale)
    assert stats.binomtest(above, draws, p).pvalue > 1e-7


def test_accuracy_formula() -> None:
    mech = svt(epsilon=1.0, sensitivity=1.0, max_positives=2)
    expected = (mech.threshold_scale * math.log(4 / 0.05)
                + mech.query_scale * math.log(4 * 100 / 0.05) + mech.granularity)
    assert mech.accuracy(0.05, 100) == pytest.approx(expected, rel=1e-11)
    assert mech.accuracy(0.05, 100) >= expected
    with pytest.raises(ValueError, match="n_queries"):
        mech.accuracy(0.05, 0)
    with pytest.raises(ValueError, match="alpha"):
        mech.accuracy(1.0, 10)


@pytest.mark.parametrize(("epsilon", "sensitivity", "monotonic", "named"), [
    (1.0, 5e-324, False, "sensitivity must lie"),  # the grid step underflowed: ZeroDivision
    (2e-113, 9e307, True, "sensitivity must lie"),  # the scale overflowed a float
    (2e-300, 1e200, False, r"noise scales .* 1\.29e\+500"),
    (1e300, 1e-200, False, r"noise scales .* 2\.59e-500"),
])
def test_extreme_parameters_are_user_errors(epsilon: float, sensitivity: float,
                                            monotonic: bool, named: str) -> None:
    """A bug hunt: extreme parameters crashed at construction with ZeroDivisionError or
    OverflowError; they are UserErrors naming the parameter and the range."""
    from dpcurator.errors import UserError

    with pytest.raises(UserError, match=named):
        SparseVector(epsilon=epsilon, sensitivity=sensitivity, threshold=0.0,
                     max_positives=1, monotonic=monotonic)
