"""Exponential mechanism, permute-and-flip and report-noisy-max: exact selection frequencies.

Statistical tests state their false-failure probability; each is below 1e-6.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import mpmath
import numpy as np
import pytest
from scipy import stats

from dpcurator.accounting import Neighbouring, PureDP
from dpcurator.mechanisms.exponential import (
    Exponential,
    PermuteAndFlip,
    ReportNoisyMax,
    _bernoulli_exp,
)
from dpcurator.noise import SeededRandom, _exact

SCORES = np.array([0.0, 1.0, 2.0, 3.0, 4.5])


def exponential_probabilities(scores: np.ndarray[Any, Any], rate: float) -> np.ndarray[Any, Any]:
    weights = np.exp(rate * (scores - scores.max()))
    return weights / weights.sum()  # type: ignore[no-any-return]


def permute_and_flip_probabilities(scores: np.ndarray[Any, Any],
                                   rate: float) -> np.ndarray[Any, Any]:
    """McKenna and Sheldon's definition, by enumerating every visiting order."""
    n = scores.size
    p = np.exp(rate * (scores - scores.max()))
    out = np.zeros(n)
    orders = list(itertools.permutations(range(n)))
    for order in orders:
        reach = 1.0
        for r in order:
            out[r] += reach * p[r]
            reach *= 1 - p[r]
    return out / len(orders)


def frequencies(mechanism: Any, scores: np.ndarray[Any, Any], draws: int) -> np.ndarray[Any, Any]:
    picks = [mechanism.release(scores) for _ in range(draws)]
    return np.bincount(picks, minlength=scores.size)


def test_exponential_frequencies_match_exp_epsilon_score_over_2_delta() -> None:
    """Chi-square goodness of fit, 8,000 draws, rejected only at p < 1e-7 (smallest expected
    count ~ 410, where the chi-square approximation is accurate): false failure < 1e-7."""
    em = Exponential(epsilon=1.0, sensitivity=1.0, source=SeededRandom(1))
    draws = 8_000
    observed = frequencies(em, SCORES, draws)
    expected = exponential_probabilities(SCORES, 0.5) * draws
    assert stats.chisquare(observed, expected).pvalue > 1e-7


def test_monotonic_exponential_uses_epsilon_over_delta() -> None:
    """Chi-square at p < 1e-7 as above (smallest expected count ~ 460): false failure < 1e-7."""
    em = Exponential(epsilon=0.8, sensitivity=2.0, monotonic=True, source=SeededRandom(2))
    scores = np.array([1.0, 2.0, 4.0, 5.0])
    draws = 5_000
    observed = frequencies(em, scores, draws)
    expected = exponential_probabilities(scores, 0.8 / 2.0) * draws
    assert stats.chisquare(observed, expected).pvalue > 1e-7


def test_permute_and_flip_frequencies_match_its_exact_distribution() -> None:
    """Chi-square at p < 1e-7 against the distribution enumerated over all 120 visiting orders
    (smallest expected count ~ 310): false failure < 1e-7."""
    pf = PermuteAndFlip(epsilon=1.0, sensitivity=1.0, source=SeededRandom(3))
    draws = 8_000
    exact = permute_and_flip_probabilities(SCORES, 0.5)
    # The test can tell the two mechanisms apart: PF puts visibly more mass on the best.
    assert exact[-1] > exponential_probabilities(SCORES, 0.5)[-1] + 0.05
    observed = frequencies(pf, SCORES, draws)
    assert stats.chisquare(observed, exact * draws).pvalue > 1e-7


def test_report_noisy_max_is_the_equivalent_mechanism() -> None:
    gumbel = ReportNoisyMax(epsilon=1.0, sensitivity=1.0, source=SeededRandom(4))
    expo = ReportNoisyMax(epsilon=1.0, sensitivity=1.0, noise="exponential",
                          source=SeededRandom(4))
    assert isinstance(gumbel.equivalent, Exponential)
    assert isinstance(expo.equivalent, PermuteAndFlip)
    assert gumbel.noise_scale == 2.0
    assert ReportNoisyMax(epsilon=2.0, sensitivity=1.0, monotonic=True).noise_scale == 0.5
    # Same seed, same draws as the equivalent mechanism run directly.
    pf = PermuteAndFlip(epsilon=1.0, sensitivity=1.0, source=SeededRandom(4))
    assert [expo.release(SCORES) for _ in range(50)] == [pf.release(SCORES) for _ in range(50)]
    assert gumbel.guarantee == PureDP(1.0)
    assert gumbel.accuracy(0.1, 5) == Exponential(epsilon=1.0, sensitivity=1.0).accuracy(0.1, 5)
    with pytest.raises(ValueError, match="noise"):
        ReportNoisyMax(epsilon=1.0, sensitivity=1.0, noise="laplace")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# The exact coin behind every selection.


class ScriptedSource:
    """Returns the given words first, then seeded random ones (test double)."""

    secure = False

    def __init__(self, words: list[int]) -> None:
        self._script = list(words)
        self._rest = SeededRandom(99)

    def words(self, n: int) -> np.ndarray[Any, np.dtype[np.uint64]]:
        head, self._script = self._script[:n], self._script[n:]
        tail = self._rest.words(n - len(head))
        return np.concatenate([np.array(head, dtype=np.uint64), tail])


def test_bernoulli_exp_decides_exactly_near_the_threshold() -> None:
    gamma = Fraction(1, 3)
    t = _exact.floor_scaled_exp(gamma)  # floor(2^64 e^(-1/3))
    words = [t - 1, t + 1, t - 2**20, t + 2**20, t - 2**45, t + 2**45, 0, 2**64 - 1, t]
    source = ScriptedSource(words)
    calls: list[int] = []

    def exact(i: int) -> Fraction:
        calls.append(i)
        return gamma

    gamma_float = np.full(len(words), float(gamma))
    heads = _bernoulli_exp(gamma_float, exact, source)
    expected = [w < t for w in words[:-1]]
    assert heads[:-1].tolist() == expected
    assert set(calls) == {0, 1, 2, 3, 8}  # only the words inside the 1e-9 margin were exact
    # A word equal to floor(2^64 p) is settled by the next 64 bits V of U (the first word the
    # seeded tail gives): heads iff V / 2^64 < frac(2^64 e^(-1/3)).
    mpmath.mp.prec = 200
    fraction_part = mpmath.mpf(2) ** 64 * mpmath.exp(mpmath.mpf(-1) / 3) - t
    next_word = int(SeededRandom(99).words(1)[0])
    assert heads[-1] == (mpmath.mpf(next_word) / mpmath.mpf(2) ** 64 < fraction_part)


def constant(value: Fraction) -> Callable[[int], Fraction]:
    return lambda i: value


def test_bernoulli_exp_frequencies() -> None:
    """Two-sided exact binomial tests at 1e-7 (3 tests: false failure < 3e-7)."""
    source = SeededRandom(5)
    for gamma in (0.0, 0.25, 3.0):
        n = 50_000
        heads = _bernoulli_exp(np.full(n, gamma), constant(Fraction(gamma)), source)
        if gamma == 0.0:
            assert heads.all()
        else:
            assert stats.binomtest(int(heads.sum()), n, math.exp(-gamma)).pvalue > 1e-7
    huge = _bernoulli_exp(np.array([np.inf]), lambda i: Fraction(10**6), source)
    assert not huge[0]


# ---------------------------------------------------------------------------------------------
# API: labels, validation, utility bound, large inputs.


def test_labels_and_single_candidate() -> None:
    em = Exponential(epsilon=50.0, sensitivity=1.0, candidates=["a", "b", "c"],
                     source=SeededRandom(6))
    assert em.release([0.0, 10.0, 0.0]) == "b"  # P[other] <= 2 e^-250
    assert Exponential(epsilon=1.0, sensitivity=1.0).release([3.0]) == 0
    assert PermuteAndFlip(epsilon=1.0, sensitivity=1.0, candidates=["x"]).release([1]) == "x"
    assert em.guarantee == PureDP(50.0, neighbouring=Neighbouring.ADD_REMOVE)
    replace = Exponential(epsilon=1.0, sensitivity=1.0, neighbouring=Neighbouring.REPLACE)
    assert replace.guarantee.neighbouring is Neighbouring.REPLACE


@pytest.mark.parametrize("cls", [Exponential, PermuteAndFlip, ReportNoisyMax])
@pytest.mark.parametrize(("kwargs", "scores", "pattern"), [
    ({"epsilon": 0.0}, [1.0, 2.0], "epsilon"),
    ({"epsilon": -1.0}, [1.0, 2.0], "epsilon"),
    ({"epsilon": float("nan")}, [1.0, 2.0], "epsilon"),
    ({"sensitivity": 0.0}, [1.0, 2.0], "sensitivity"),
    ({"sensitivity": -2.0}, [1.0, 2.0], "sensitivity"),
    ({}, [], "scores"),
    ({}, [1.0, float("nan")], "scores"),
    ({}, [1.0, float("inf")], "scores"),
    ({}, [[1.0, 2.0]], "1-D"),
    ({}, ["a", "b"], "scores"),
    ({}, np.array([2**60, 0]), "2\\^53"),
    ({"candidates": ["a", "b", "c"]}, [1.0, 2.0], "candidates"),
])
def test_validation(cls: Any, kwargs: dict[str, Any], scores: Any, pattern: str) -> None:
    params: dict[str, Any] = {"epsilon": 1.0, "sensitivity": 1.0, **kwargs}
    with pytest.raises(ValueError, match=pattern):
        cls(**params).release(scores)


def test_accuracy_formula_and_interval() -> None:
    em = Exponential(epsilon=0.5, sensitivity=2.0)
    assert em.accuracy(0.05, 100) == pytest.approx(2 * 2.0 / 0.5 * math.log(100 / 0.05))
    mono = PermuteAndFlip(epsilon=0.5, sensitivity=2.0, monotonic=True)
    assert mono.accuracy(0.05, 100) == pytest.approx(2.0 / 0.5 * math.log(100 / 0.05))
    assert em.confidence_interval(0.05, 100) == (-em.accuracy(0.05, 100), 0.0)
    with pytest.raises(ValueError, match="n_candidates"):
        em.accuracy(0.05, 0)
    with pytest.raises(ValueError, match="alpha"):
        em.accuracy(0.0, 10)


def test_accuracy_bound_holds_empirically() -> None:
    """Each draw misses the bound with probability <= alpha = 0.2 (the theorem), so misses
    among 1,000 draws are stochastically below Binomial(1000, 0.2); we fail only above its
    1 - 1e-7 quantile: false failure < 1e-7 per mechanism, 2e-7 in all."""
    scores = np.concatenate([[10.0], np.full(199, 4.0)])  # a gap of 6 for 199 candidates
    limit = stats.binom.isf(1e-7, 1000, 0.2)
    for cls in (Exponential, PermuteAndFlip):
        mech = cls(epsilon=1.0, sensitivity=1.0, source=SeededRandom(8))
        bound = mech.accuracy(0.2, scores.size)
        misses = sum(scores[mech.release(scores)] < scores.max() - bound for _ in range(1000))
        assert misses <= limit


def test_large_inputs_are_fast_and_exact() -> None:
    n = 200_000
    scores = np.zeros(n)
    scores[12345] = 100.0  # others have weight e^-50 each: P[any other] < 2e5 e^-50 < 1e-16
    for cls in (Exponential, PermuteAndFlip):
        mech = cls(epsilon=1.0, sensitivity=1.0, source=SeededRandom(9))
        assert mech.release(scores) == 12345
    # Flat scores: uniform choice; both finish in one pass.
    flat = Exponential(epsilon=1.0, sensitivity=1.0, source=SeededRandom(10)).release(
        np.ones(n))
    assert 0 <= flat < n


def test_huge_score_range_is_handled_exactly() -> None:
    """Differences that overflow a double (inf gamma) still give exact decisions."""
    em = Exponential(epsilon=1.0, sensitivity=1.0, source=SeededRandom(11))
    assert em.release([1e308, -1e308, 0.0]) == 0
    pf = PermuteAndFlip(epsilon=1.0, sensitivity=1.0, source=SeededRandom(11))
    assert pf.release([-1e308, 1e308]) == 1


@pytest.mark.parametrize("mechanism", [Exponential, PermuteAndFlip])
def test_a_rate_past_the_largest_float_is_a_user_error(mechanism: Any) -> None:
    """A bug hunt: epsilon / sensitivity above ~1.8e308 raised OverflowError at construction
    (float() of the exact rate) before the range check could name it."""
    from dpcurator.errors import UserError

    with pytest.raises(UserError, match="epsilon / sensitivity must lie between"):
        mechanism(epsilon=5e307, sensitivity=5e-324)
    with pytest.raises(UserError, match="epsilon / sensitivity must lie between"):
        mechanism(epsilon=1e-300, sensitivity=1e300)
