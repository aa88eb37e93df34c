"""The tail bounds behind VARIANCE's interval (``dpcurator.curator._variance``).

The coverage tests (``test_interval_coverage``) check the interval end to end; here, exactly,
the pieces it rests on: the closed-form tail of a sum of Laplaces (against the one- and
two-Laplace forms it generalises, and against a direct numerical convolution), and the bound
for an integer discrete Laplace count through its coupling with a continuous Laplace (against
the exact sum over the integers). All deterministic.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import integrate, special

import dpcurator as dp
from dpcurator.curator._variance import _continuous_tail, sum_upper
from dpcurator.noise import SeededRandom


def _laplace_tail(b: float, x: float) -> float:
    """P[|L| >= x] for one Laplace of scale b."""
    return math.exp(-max(x, 0.0) / b)


@pytest.mark.parametrize("d", [0.0, 0.3, 1.0, 4.0, 12.0])
def test_three_laplaces_reduce_to_one_and_two_and_match_a_convolution(d: float) -> None:
    one = _continuous_tail("laplace", 2.0, np.array(0.0), np.array(0.0), np.array(d))
    assert float(one) == pytest.approx(_laplace_tail(2.0, d), rel=1e-6, abs=1e-12)
    two = _continuous_tail("laplace", 2.0, np.array(0.7), np.array(0.0), np.array(d))
    assert float(two) == pytest.approx(2 * float(sum_upper("laplace", 2.0, np.array(0.7),
                                                           np.array(d))), rel=1e-6)
    # three: P[|L1 + L2 + L3| >= d] by integrating L3's density against the two-Laplace tail
    def integrand(z: float) -> float:
        density = math.exp(-abs(z) / 1.3) / 2.6
        near = float(sum_upper("laplace", 2.0, np.array(0.7), np.array(d - z)))
        far = float(sum_upper("laplace", 2.0, np.array(0.7), np.array(d + z)))
        return density * (near + far)

    exact, _ = integrate.quad(integrand, -60, 60, points=[-d, d], limit=400)
    three = _continuous_tail("laplace", 2.0, np.array(0.7), np.array(1.3), np.array(d))
    assert exact - 1e-9 <= float(three) <= exact * 1.03 + 1e-9  # 1% apart only adds


def test_close_scales_are_moved_apart_upward_and_gaussians_add_variances() -> None:
    d = np.linspace(0.0, 20.0, 41)
    equal = _continuous_tail("laplace", 1.0, np.full(41, 1.0), np.full(41, 1.0), d)
    apart = _continuous_tail("laplace", 1.0, np.full(41, 1.0 + 1e-9), np.full(41, 1.0), d)
    assert np.all(np.isfinite(equal)) and np.all((equal >= 0) & (equal <= 1))
    assert np.allclose(equal, apart)
    assert np.all(np.diff(equal) <= 1e-15)  # a tail: falls with d
    gauss = _continuous_tail("gaussian", 3.0, np.array(4.0), np.array(12.0), np.array(26.0))
    assert float(gauss) == pytest.approx(2 * special.ndtr(-2.0))


@pytest.mark.parametrize("t", [0.5, 3.0, 20.0])
@pytest.mark.parametrize("b", [0.2, 1.0, 6.0])
def test_the_discrete_laplace_bound_covers_the_exact_tail(t: float, b: float) -> None:
    """P[|L + b Z| >= d], Z integer discrete Laplace of scale t and L a Laplace of scale 2,
    summed exactly over the integers, is at most the continuous bound at d - |b|."""
    q = math.exp(-1.0 / t)
    zs = np.arange(-int(60 * t) - 5, int(60 * t) + 6)
    pmf = (1 - q) / (1 + q) * q ** np.abs(zs)
    for d in (0.0, 0.5, 2.0, 5.0, 15.0, 40.0):
        shift = b * np.abs(zs)
        gap = d - shift  # P[L >= d + s] + P[L <= s - d], L of scale 2
        below = np.exp(-np.abs(gap) / 2.0) / 2
        exact = float(np.sum(pmf * (np.exp(-(d + shift) / 2.0) / 2
                                    + np.where(gap >= 0, below, 1 - below))))
        bound = float(_continuous_tail("laplace", 2.0, np.array(0.0), np.array(b * t),
                                       np.array(max(d - b, 0.0))))
        assert exact <= bound + 1e-12, (t, b, d, exact, bound)


@pytest.mark.parametrize("geometric", [True, False])
def test_the_search_tail_covers_the_exact_tail_of_three_noises(geometric: bool) -> None:
    """``_Search._tail`` for an integer discrete Laplace count (scale 3): through the coupling
    with a continuous Laplace, or (the path a discrete Gaussian count takes) through blocks
    each at its top. Either is at least the exact P[|Z_q + a Z_s + b Z_c| >= d], summed over
    the count's integers with the two Laplaces' tail in closed form."""
    import dataclasses

    from dpcurator.curator._ratio import FoldedNoise, NumeratorNoise
    from dpcurator.curator._variance import _Search
    from dpcurator.mechanisms import DiscreteLaplace

    folded = FoldedNoise.of(DiscreteLaplace(epsilon=1 / 3, sensitivity=1), 1.0)
    assert folded.geometric is not None
    count = folded if geometric else dataclasses.replace(folded, geometric=None)
    total, squares = NumeratorNoise("laplace", 1.5), NumeratorNoise("laplace", 4.0)
    empty = np.zeros(1)
    search = _Search(count, total, squares, empty, empty, empty, empty, empty, empty, 0.05)
    q = math.exp(-1.0 / 3)
    zs = np.arange(-200, 201)
    pmf = (1 - q) / (1 + q) * q ** np.abs(zs)
    for reach in (0.0, 2.0, 8.0):
        for b in (0.0, 0.5, 4.0):
            d = np.array([0.0, 3.0, 10.0, 30.0, 80.0])
            bound = search._tail(np.full(d.shape, reach), np.full(d.shape, b), d)
            second = np.array(reach * total.scale)
            for k, dk in enumerate(d):
                exact = float(np.sum(pmf * (
                    sum_upper("laplace", squares.scale, second, dk + b * np.abs(zs))
                    + sum_upper("laplace", squares.scale, second, dk - b * np.abs(zs)))))
                assert exact <= bound[k] + 1e-12, (geometric, reach, b, dk, exact, bound[k])


@pytest.mark.parametrize("rho", [None, 0.5])
def test_the_interval_does_not_depend_on_the_columns_unit(rho: float | None) -> None:
    """The same values in units 1e90 times smaller, with bounds to match (widths down to
    1e-100 are accepted), give the same intervals scaled by 1e-180: the noises' tail is
    computed in units of its first scale. It squared the scales, which underflowed below
    widths of about 1e-85: every weight 0 / 0, and every interval the point estimate alone,
    covering no partition (a bug hunt). Seeded releases: deterministic."""
    groups = np.repeat(np.arange(60), 20)
    base = np.random.default_rng(0).uniform(0, 1, groups.size)
    widths = []
    for scale in (1.0, 1e-90):
        frame = pd.DataFrame({"u": np.arange(groups.size), "g": groups, "x": base * scale})
        budget = dp.PureDP(100) if rho is None else dp.ZCDP(100)
        cur = dp.Curator.from_pandas(frame, privacy_unit="u", budget=budget,
                                     source=SeededRandom(1))
        privacy: dict[str, float] = {"epsilon": 1.0} if rho is None else {"rho": rho}
        release = cur.sql("SELECT g, VARIANCE(x) AS v FROM data GROUP BY g",
                          keys=list(range(60)), bounds={"x": (0, scale)}, **privacy)
        low, high = release.interval("v", 0.95)
        assert np.all(high > low)
        widths.append((high - low) / scale**2)
    assert np.allclose(widths[0], widths[1], rtol=1e-6)
