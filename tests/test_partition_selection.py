"""Private partition selection: the Escargots guarantee, the audit, and broken twins.

Statistical tests state their false-failure probability: each binomial threshold is the
1e-7 upper quantile of the count a correct mechanism produces, and each audit's bound is
wrong with probability at most 1e-7 (the auditor's failure probability).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import binom

from dpcurator.audit import audit_mechanism
from dpcurator.errors import UserError
from dpcurator.mechanisms.partition_selection import (
    GaussianThresholdPartitionSelection,
    OptimalPartitionSelection,
    _optimal_table,
    choose_partition_selection,
)
from dpcurator.noise import SeededRandom

DRAWS = 2_000_000


def released_singletons(mechanism: object, draws: int = DRAWS) -> int:
    """How many of ``draws`` partitions backed by a single unit are released."""
    return int(np.sum(mechanism.release(np.ones(draws, dtype=np.int64))))  # type: ignore[attr-defined]


@pytest.mark.parametrize("k", [1, 5])
def test_escargots_is_released_with_probability_at_most_delta(k: int) -> None:
    """A category created by one person appears with probability <= delta (per release)."""
    delta = 1e-3
    mechanism = OptimalPartitionSelection(epsilon=1.0, delta=delta, max_partitions=k,
                                          source=SeededRandom(k))
    assert mechanism.keep_probability(1) <= -math.expm1(math.log1p(-delta) / k) <= delta
    assert mechanism.keep_probability(0) == 0.0
    # False failure < 1e-7: the count exceeds this only with that probability if p <= delta.
    assert released_singletons(mechanism) <= binom.isf(1e-7, DRAWS, delta)


def test_escargots_under_gaussian_thresholding() -> None:
    delta = 1e-3
    mechanism = GaussianThresholdPartitionSelection(epsilon=1.0, delta=delta, max_partitions=8,
                                                    source=SeededRandom(11))
    assert released_singletons(mechanism, 500_000) <= binom.isf(1e-7, 500_000, delta / 2)


def test_popular_partitions_are_released() -> None:
    mechanism = OptimalPartitionSelection(epsilon=1.0, delta=1e-6, source=SeededRandom(3))
    n = mechanism.units_for_half()
    assert 10 < n < 25
    assert mechanism.keep_probability(n) >= 0.5 > mechanism.keep_probability(n - 1)
    assert mechanism.release(np.full(1000, len(mechanism.table))).all()


@pytest.mark.parametrize("epsilon, delta", [(1.0, 1e-6), (0.1, 1e-9), (5.0, 1e-3)])
def test_the_table_is_the_optimal_recurrence_and_passes_its_exact_check(
        epsilon: float, delta: float) -> None:
    table = _optimal_table(epsilon, delta)
    assert table[0] == 0.0 and table[-1] == 1.0
    assert all(b >= a for a, b in itertools.pairwise(table))
    # Near-optimal: each step within 1e-6 (relative) of the unconstrained recurrence.
    for prev, cur in itertools.pairwise(table):
        bound = min(math.exp(epsilon) * prev + delta,
                    1 - math.exp(-epsilon) * (1 - prev - delta), 1.0)
        assert cur <= bound * (1 + 1e-12) and cur >= bound * (1 - 1e-6)


def test_choice_prefers_gaussian_thresholding_for_many_partitions() -> None:
    assert isinstance(choose_partition_selection(epsilon=1, delta=1e-6, max_partitions=1),
                      OptimalPartitionSelection)
    assert isinstance(choose_partition_selection(epsilon=1, delta=1e-6, max_partitions=50),
                      GaussianThresholdPartitionSelection)


class DoubledEpsilon(OptimalPartitionSelection):
    """Broken twin: keep probabilities built for 2 epsilon while claiming epsilon."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.table = _optimal_table(2 * self.partition_epsilon, self.partition_delta)


def test_audit_passes_and_doubled_epsilon_twin_is_caught() -> None:
    delta = 1e-6
    # Partitions backed by 4 and 5 units: in the geometric part of both tables, where the
    # keep probabilities' ratio is e^eps (correct) or e^(2 eps) (twin).
    good = OptimalPartitionSelection(epsilon=1.0, delta=delta, source=SeededRandom(21))
    assert not audit_mechanism(good, 5, 4, n=400_000, delta=delta).exceeds(1.0)
    twin = DoubledEpsilon(epsilon=1.0, delta=delta, source=SeededRandom(22))
    # Twin: P[keep | 4] ~ 4.7e-4, P[keep | 5] ~ 3.4e-3 (ratio e^2): ~190 vs ~1400 kept per
    # 400,000 draws, a bound near ln 5.5 = 1.7, far above 1 (a miss needs > 5 sigma).
    assert audit_mechanism(twin, 5, 4, n=400_000, delta=delta).exceeds(1.0)


class HalvedSigma(GaussianThresholdPartitionSelection):
    """Broken twin: Gaussian thresholding with half the calibrated noise."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.sigma = self.sigma / 2


def test_gaussian_threshold_audit_passes_and_halved_sigma_twin_is_caught() -> None:
    delta = 1e-4
    good = GaussianThresholdPartitionSelection(epsilon=1.0, delta=delta, max_partitions=1,
                                               source=SeededRandom(31))
    t = int(good.threshold)
    assert not audit_mechanism(good, t - 2, t - 3, n=400_000, delta=delta).exceeds(1.0)
    twin = HalvedSigma(epsilon=1.0, delta=delta, max_partitions=1, source=SeededRandom(32))
    # sigma ~ 2.4 instead of ~4.8 below the threshold: P[keep] moves by a factor ~1.9 per
    # unit there (likelihood ratio e^(t / sigma^2) in the tail), ~e^(1.3) over the pair.
    assert audit_mechanism(twin, t - 2, t - 4, n=400_000, delta=delta).exceeds(1.0)


@pytest.mark.parametrize("counts", [[2**63], [1e19], [9.3e18, 5]])
def test_unit_counts_of_2_to_the_63_or_more_are_refused(counts: list[float]) -> None:
    """A bug hunt: counts of 2^63 or more wrapped to negative int64: the optimal rule raised
    IndexError and Gaussian thresholding silently dropped the partition."""
    for mechanism in (OptimalPartitionSelection(epsilon=1.0, delta=1e-6),
                      GaussianThresholdPartitionSelection(epsilon=1.0, delta=1e-6)):
        with pytest.raises(UserError, match=r"below 2\^63"):
            mechanism.release(np.array(counts, dtype=float))
    assert OptimalPartitionSelection(epsilon=1.0, delta=1e-6).release([2**62]).tolist() == [True]
