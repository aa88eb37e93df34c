"""Tails of the integer noises, and the intervals they give for integer (and truncated) counts.

The curator's counts get exact integer noise Z (``DiscreteLaplace``: P[Z = z] ∝ q^|z| with
q = e^(-1/t); ``DiscreteGaussian``: P[Z = z] ∝ exp(-z^2 / (2 sigma^2))), in the count measure's
integer units. This module gives, for such a noise:

- ``upper_tail_point(mechanism, tail)``: the smallest m >= 1 with P[Z >= m] <= tail, from
  rigorous upper bounds (the exact closed form for the discrete Laplace; the lattice sums and
  Euler-Maclaurin enclosure of ``_calibration.discrete_gaussian_tail_upper`` for the discrete
  Gaussian). It sets partition-selection thresholds, where it protects privacy.
- ``CountIntervals``: confidence intervals for the true count c from a noisy count x = c + Z,
  optionally *conditional on x >= tau* (a partition released because its noisy count reached
  the selection threshold tau), by inverting two one-sided tests (valid p-values for discrete
  laws): c is kept unless P_c[X >= x] <= g_U or P_c[X <= x] <= g_L, where P_c is the law of
  X = c + Z (conditioned on X >= tau when there is a threshold) and g_U + g_L = alpha. For a
  true c each test rejects with probability at most its g, so the interval covers c with
  probability at least 1 - alpha, conditionally on the release when truncated. The family
  {P_c} has a monotone likelihood ratio (both noises are log-concave), so P_c[X >= x] grows
  and P_c[X <= x] falls with c, truncated or not: the kept set is an interval of integers,
  found by bisection.

  The split (g_U, g_L) is that of the *shortest* untruncated interval: with m the least
  integer with P[|Z| > m] <= alpha, the shortest set of consecutive integers holding at least
  1 - alpha of Z is [-(m - 1), m] when P[Z >= m] + P[Z >= m + 1] <= alpha, else [-m, m]; so
  g_U = P[Z >= hi + 1] and g_L = alpha - g_U. Untruncated, the interval is then exactly
  [x - hi, x + lo] (lo = m - 1 or m): an integer noise's symmetric interval covers more than
  1 - alpha by up to one atom on each side (97.3% at 95% for scale 1), the shortest one by at
  most one atom in all (95.0% there).

Accuracy of the tail arithmetic used for intervals (coverage, not privacy): exact closed forms
in double precision for the discrete Laplace; for the discrete Gaussian, exact lattice sums in
double precision for sigma <= 4096 units and, above, the continuous tail Phi(-(m - 1/2)/sigma),
whose error is below 0.02 / sigma^2 < 2e-9 (midpoint rule, Euler-Maclaurin). The tests'
thresholds are inflated by a relative 1e-6 so that these errors can only widen an interval.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import special

from dpcurator.errors import UserError
from dpcurator.mechanisms._calibration import (
    discrete_gaussian_tail_upper,
    discrete_laplace_tail,
)
from dpcurator.mechanisms.gaussian import DiscreteGaussian
from dpcurator.mechanisms.laplace import DiscreteLaplace

__all__ = ["CountIntervals", "NoiseTails", "upper_tail_point"]

FloatArray = npt.NDArray[np.float64]
Predicate = Callable[[FloatArray], npt.NDArray[np.bool_]]
_WINDOW_SIGMA = 4096.0  # exact lattice sums up to this sigma (in units)
_SLACK = 1e-6  # tests' thresholds raised by this relative amount: errors only widen


def _one_sided_upper(mechanism: DiscreteLaplace | DiscreteGaussian, m: int) -> float:
    """A rigorous upper bound on P[Z >= m] for m >= 1 (half the two-sided tail: Z symmetric)."""
    if isinstance(mechanism, DiscreteLaplace):
        return _tail_upper("laplace", float(mechanism.scale), m)
    return _tail_upper("gaussian", float(mechanism.noise_sigma(1)), m)


def _tail_upper(kind: str, scale: float, m: int) -> float:
    if kind == "laplace":
        return discrete_laplace_tail(m, scale) / 2
    return discrete_gaussian_tail_upper(m, scale) / 2


def upper_tail_point(mechanism: DiscreteLaplace | DiscreteGaussian, tail: float) -> int:
    """The smallest integer m >= 1 with P[Z >= m] <= ``tail``, by rigorous upper bounds."""
    if not 0.0 < tail < 0.5:
        raise UserError(f"tail must lie in (0, 1/2), got {tail!r}")
    if isinstance(mechanism, DiscreteLaplace):
        return _tail_point("laplace", float(mechanism.scale), tail)
    return _tail_point("gaussian", float(mechanism.noise_sigma(1)), tail)


@functools.lru_cache(maxsize=256)
def _tail_point(kind: str, scale: float, tail: float) -> int:
    hi = 1
    while _tail_upper(kind, scale, hi) > tail:
        hi *= 2
    lo = hi // 2  # P[Z >= lo] > tail, or lo = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _tail_upper(kind, scale, mid) <= tail:
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True)
class NoiseTails:
    """log P[Z >= m] for one integer noise, vectorized over (float-held) integers m."""

    kind: str  # "laplace" (scale t) or "gaussian" (sigma)
    scale: float

    @classmethod
    def of(cls, mechanism: DiscreteLaplace | DiscreteGaussian) -> NoiseTails:
        if isinstance(mechanism, DiscreteLaplace):
            return cls("laplace", float(mechanism.scale))
        return cls("gaussian", float(mechanism.noise_sigma(1)))

    def log_sf(self, m: FloatArray) -> FloatArray:
        """log P[Z >= m], elementwise (m integer-valued)."""
        m = np.asarray(m, dtype=np.float64)
        if self.kind == "laplace":
            t = self.scale
            log_norm = math.log1p(math.exp(-1.0 / t))
            up = -np.maximum(m, 1.0) / t - log_norm  # m >= 1: q^m / (1 + q)
            # m <= 0: 1 - P[Z >= 1 - m] = 1 - q^(1 - m) / (1 + q)
            down = np.log1p(-np.exp(-np.maximum(1.0 - m, 1.0) / t - log_norm))
            return np.asarray(np.where(m >= 1, up, down), dtype=np.float64)
        if self.scale <= _WINDOW_SIGMA:
            return _lattice_log_sf(self.scale, m)
        return np.asarray(special.log_ndtr(-(m - 0.5) / self.scale), dtype=np.float64)

    def shortest(self, alpha: float) -> tuple[int, int, float]:
        """(lo, hi, g_U): the shortest [-lo, hi] holding >= 1 - alpha of Z, and P[Z >= hi + 1]
        (rigorous bounds; module docstring)."""
        return _shortest(self.kind, self.scale, alpha)


@functools.lru_cache(maxsize=64)
def _shortest(kind: str, scale: float, alpha: float) -> tuple[int, int, float]:
    mechanism: DiscreteLaplace | DiscreteGaussian
    if kind == "laplace":
        mechanism = DiscreteLaplace(epsilon=1.0 / scale, sensitivity=1)
        m = mechanism.accuracy(alpha)
    else:
        mechanism = DiscreteGaussian(rho=1.0 / (2 * scale * scale), sensitivity=1)
        m = mechanism.accuracy(alpha)
    if m == 0:
        return 0, 0, _one_sided_upper(mechanism, 1)
    # Upper bounds on P[Z <= -m] = P[Z >= m] and on P[Z >= m + 1].
    if _one_sided_upper(mechanism, m) + _one_sided_upper(mechanism, m + 1) <= alpha:
        return m - 1, m, _one_sided_upper(mechanism, m + 1)
    return m, m, _one_sided_upper(mechanism, m + 1)


@functools.lru_cache(maxsize=16)
def _lattice(sigma: float) -> tuple[int, FloatArray]:
    """(L, log P[Z >= z] for z = -L..L+1) of the discrete Gaussian, from exact lattice sums."""
    reach = math.ceil(40 * sigma) + 2  # beyond: mass below e^-800
    z = np.arange(-reach, reach + 1, dtype=np.float64)
    log_f = -0.5 * (z / sigma) ** 2
    log_norm = float(np.logaddexp.reduce(log_f))
    tail = np.logaddexp.accumulate(log_f[::-1])[::-1] - log_norm
    return reach, np.append(np.minimum(tail, 0.0), -np.inf)


def _lattice_log_sf(sigma: float, m: FloatArray) -> FloatArray:
    reach, table = _lattice(sigma)
    inside = np.clip(m, -reach, reach + 1).astype(np.int64) + reach
    out = table[inside]
    # Beyond the window: the continuous bound's logarithm (far below any alpha used here).
    far = m > reach
    if np.any(far):
        out = np.where(far, special.log_ndtr(-(m - 0.5) / sigma), out)
    return np.asarray(np.where(m < -reach, 0.0, out), dtype=np.float64)


@dataclass(frozen=True)
class CountIntervals:
    """(1 - alpha) intervals for true counts c (integer units) from noisy counts x = c + Z.

    ``threshold``: when given, every x was released because x >= threshold, and the intervals
    are conditional on that (module docstring); None for counts released unconditionally.
    """

    tails: NoiseTails
    threshold: int | None = None

    def interval(self, noisy: FloatArray, alpha: float) -> tuple[FloatArray, FloatArray]:
        """Low and high ends (integer units, floats; -inf where nothing bounds c below)."""
        x = np.asarray(noisy, dtype=np.float64)
        lo_z, hi_z, g_up = self.tails.shortest(alpha)
        if self.threshold is None:
            return x - hi_z, x + lo_z
        g_up = g_up * (1 + _SLACK)
        if not g_up > 0.0:
            # the noise is so narrow (epsilon in the thousands) that the shortest interval
            # holds all of its mass: split alpha evenly instead (any split of alpha between
            # the two rejections keeps the coverage; math.log(0) raised here)
            g_up = alpha / 2.0
        g_low = max(alpha - g_up, 0.0)
        if g_low <= 0.0:  # cannot happen for alpha < 1/2; be safe: no lower rejection
            g_low = 0.0
        tau = float(self.threshold)
        log_g_up = math.log(g_up)
        log_g_low = math.log(g_low) if g_low > 0 else -math.inf

        def keeps_from_below(c: FloatArray) -> npt.NDArray[np.bool_]:
            """P_c[X >= x | X >= tau] > g_U (not rejected as too small)."""
            return np.asarray(self.tails.log_sf(x - c) - self.tails.log_sf(tau - c) > log_g_up)

        def keeps_from_above(c: FloatArray) -> npt.NDArray[np.bool_]:
            """P_c[X <= x | X >= tau] > g_L (not rejected as too large)."""
            ratio = np.exp(self.tails.log_sf(x + 1 - c) - self.tails.log_sf(tau - c))
            below = np.log(np.maximum(1.0 - np.minimum(ratio, 1.0), 0.0) + 1e-300)
            return np.asarray(below > log_g_low)

        reach = 60.0 * self.tails.scale + 60.0 + hi_z
        floor_c = np.minimum(x, tau) - reach
        # c_lo: the least c kept from below, in [floor_c, x - hi_z]; -inf when floor_c is kept.
        top = x - hi_z  # kept: truncation only raises P_c[X >= x] above P[Z >= hi] > g_U
        open_below = keeps_from_below(floor_c)
        c_lo = _bisect_first(keeps_from_below, floor_c, top)
        c_lo = np.where(open_below, -np.inf, c_lo)
        # c_hi: the last c kept from above, in [floor_c, x + lo_z] (x + lo_z + 1 is rejected:
        # truncation only lowers P_c[X <= x]).
        high = x + lo_z
        kept_high = keeps_from_above(high)
        c_hi = np.where(kept_high, high, _bisect_last(keeps_from_above, floor_c, high))
        c_hi = np.where(keeps_from_above(floor_c) | kept_high, c_hi, x)  # empty: the point
        c_lo = np.where(c_lo > c_hi, c_hi, c_lo)
        return c_lo, c_hi


def _bisect_first(kept: Predicate, low: FloatArray, high: FloatArray) -> FloatArray:
    """Per element, the least integer c in (low, high] with kept(c), kept being monotone
    (False then True) and kept(high) True; low is assumed not kept."""
    lo, hi = low.copy(), high.copy()
    while True:
        mid = np.floor((lo + hi) / 2)
        gap = (hi - lo > 1) & (mid > lo) & (mid < hi)  # beyond 2^53, adjacent doubles stop
        if not np.any(gap):
            return hi
        mid = np.where(gap, mid, hi)
        ok = kept(mid)
        hi = np.where(gap & ok, mid, hi)
        lo = np.where(gap & ~ok, mid, lo)


def _bisect_last(kept: Predicate, low: FloatArray, high: FloatArray) -> FloatArray:
    """Per element, the greatest integer c in [low, high) with kept(c), kept being monotone
    (True then False) and kept(high) False; where kept(low) is False, returns low."""
    lo, hi = low.copy(), high.copy()
    while True:
        mid = np.floor((lo + hi) / 2)
        gap = (hi - lo > 1) & (mid > lo) & (mid < hi)
        if not np.any(gap):
            return lo
        mid = np.where(gap, mid, lo)
        ok = kept(mid)
        lo = np.where(gap & ok, mid, lo)
        hi = np.where(gap & ~ok, mid, hi)
