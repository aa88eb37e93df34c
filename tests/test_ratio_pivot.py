"""The ratio pivot's tail T(r, d) = P[|Z_s - r Z_c| >= d], checked against direct sums.

Deterministic: exact sums over the count noise's integer support (truncated where its mass is
below 1e-16) and numerical integration; no sampling.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, special

from dpcurator.curator._ratio import FoldedNoise, NumeratorNoise, RatioPivot
from dpcurator.mechanisms import DiscreteGaussian, DiscreteLaplace


def _laplace_sf(x: float, b: float) -> float:
    return 0.5 * math.exp(-x / b) if x >= 0 else 1 - 0.5 * math.exp(x / b)


def _direct(count_pmf: dict[int, float], unit: float, b: float, r: float, d: float) -> float:
    """sum_z P[Z_c = z] P[|Z_s - r unit z| >= d], Z_s Laplace of scale b."""
    total = 0.0
    for z, p in count_pmf.items():
        a = r * unit * z
        total += p * (_laplace_sf(d + a, b) + _laplace_sf(d - a, b))
    return total


@pytest.mark.parametrize("t", [0.5, 2.0, 7.0])
def test_geometric_closed_form_is_the_exact_sum(t: float) -> None:
    mech = DiscreteLaplace(epsilon=1 / t, sensitivity=1)
    q = math.exp(-1 / t)
    pmf = {z: (1 - q) / (1 + q) * q ** abs(z) for z in range(-int(60 * t) - 5, int(60 * t) + 6)}
    pivot = RatioPivot(FoldedNoise.of(mech, 0.5), NumeratorNoise("laplace", 3.0))
    for r in (0.0, 0.2, 1.0, 4.0, 25.0):
        for d in (0.0, 0.7, 4.0, 15.0, 40.0):
            got = float(pivot.tail_bound(np.array(r), np.array(d)))
            assert got == pytest.approx(_direct(pmf, 0.5, 3.0, r, d), abs=1e-12)


def test_gaussian_blocks_bound_the_exact_sum_from_above_and_closely() -> None:
    mech = DiscreteGaussian(rho=0.02, sensitivity=1)  # sigma = 5
    sigma = float(mech.noise_sigma(1))
    z = np.arange(-200, 201)
    weights = np.exp(-0.5 * (z / sigma) ** 2)
    pmf = dict(zip(z.tolist(), (weights / weights.sum()).tolist(), strict=True))
    pivot = RatioPivot(FoldedNoise.of(mech, 1.0), NumeratorNoise("gaussian", 4.0))
    for r in (0.0, 0.5, 2.0):
        for d in (1.0, 8.0, 20.0):
            exact = sum(p * (special.ndtr(-(d + r * k) / 4.0) + special.ndtr(-(d - r * k) / 4.0))
                        for k, p in pmf.items())
            got = float(pivot.tail_bound(np.array(r), np.array(d)))
            assert exact - 1e-12 <= got <= exact + 1e-9


def test_continuous_closed_form_matches_the_convolution() -> None:
    """Two Laplaces (scales 3 and r b_c): the closed form against numerical integration."""
    pivot = RatioPivot(FoldedNoise(np.zeros(0), np.zeros(0), 0.0, 2.0),
                       NumeratorNoise("laplace", 3.0))
    for r in (0.0, 0.7, 1.5, 1.4995, 4.0):
        b2 = r * 2.0
        for d in (0.5, 5.0, 20.0):
            if b2 == 0:
                exact = math.exp(-d / 3.0)
            else:
                def density(y: float, b2: float = b2) -> float:
                    return math.exp(-abs(y) / b2) / (2 * b2)
                exact = integrate.quad(
                    lambda y, d=d: density(y) * (_laplace_sf(d - y, 3.0) + _laplace_sf(d + y, 3.0)),
                    -60 * b2, 60 * b2, points=[0.0, d, -d], limit=400)[0]
            got = float(pivot.tail_bound(np.array(r), np.array(d)))
            # Scales within 1e-3 are moved apart upward: the bound may only be larger (by
            # d / b * 1e-3 relative at most: 0.7% at d = 20, b = 3).
            assert exact - 1e-9 <= got <= exact * (1 + 1e-2) + 1e-12


def test_interval_holds_the_truth_when_noise_is_tiny_and_spans_the_range_when_huge() -> None:
    mech = DiscreteLaplace(epsilon=1e6, sensitivity=1)
    pivot = RatioPivot(FoldedNoise.of(mech, 1.0), NumeratorNoise("laplace", 1e-6))
    low, high = pivot.interval(np.array([100.0]), np.array([37.0]), 0.05, -5, 5,
                               np.array([0.37]))
    assert low[0] <= 0.37 <= high[0] and high[0] - low[0] < 1e-4
    loud = RatioPivot(FoldedNoise.of(DiscreteLaplace(epsilon=1e-3, sensitivity=1), 1.0),
                      NumeratorNoise("laplace", 1e4))
    low, high = loud.interval(np.array([10.0]), np.array([3.0]), 0.05, -5, 5, np.array([0.3]))
    assert (low[0], high[0]) == (-5.0, 5.0)
