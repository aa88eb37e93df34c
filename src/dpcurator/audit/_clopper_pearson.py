"""Exact (Clopper–Pearson) one-sided confidence bounds for a binomial proportion.

Source: C. J. Clopper and E. S. Pearson, "The use of confidence or fiducial limits illustrated in
the case of the binomial", Biometrika 26 (1934). With K ~ Binomial(n, p) and k observed:

- lower bound: the alpha quantile of Beta(k, n - k + 1), and 0 when k = 0;
- upper bound: the 1 - alpha quantile of Beta(k + 1, n - k), and 1 when k = n.

Each bound alone covers p with probability at least 1 - alpha, for every p (the bounds are exact,
not asymptotic, so they stay valid for tiny alpha and for counts of 0 or n, where normal
approximations fail). The auditor leans on this: a lower bound on epsilon is only as sound as the
bounds on the two event probabilities it is built from.

Values are rounded *outward* by a relative 1e-12 so that floating-point error in the Beta
quantile can never make a bound tighter than the exact one.
"""

from __future__ import annotations

import numbers

import numpy as np
import numpy.typing as npt
from scipy import stats

from dpcurator import _validation as check
from dpcurator.errors import UserError, UserTypeError

__all__ = ["clopper_pearson"]

# Relative outward rounding applied to every bound (scipy's Beta quantiles are accurate to a few
# ulps; 1e-12 is far above that and far below any statistical effect).
_OUTWARD = 1e-12


def _check_count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise UserTypeError(f"{name} must be an integer, got {type(value).__name__}")
    return int(value)


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """Return one-sided Clopper–Pearson bounds ``(lower, upper)`` on a binomial proportion.

    Each bound is one-sided at level ``alpha``: ``P[lower > p] <= alpha`` and
    ``P[upper < p] <= alpha`` for every true proportion ``p``. (So together they form a two-sided
    interval of confidence ``1 - 2 * alpha``.) With 0 successes the lower bound is exactly 0, and
    with ``trials`` successes the upper bound is exactly 1.

    Args:
        successes: number of successes observed, ``0 <= successes <= trials``.
        trials: number of independent trials, at least 1.
        alpha: the failure probability of *each* one-sided bound, in (0, 1).

    Raises:
        TypeError: if a count is not an integer or ``alpha`` is not a real number.
        ValueError: if ``trials < 1``, ``successes`` is outside ``[0, trials]`` or ``alpha`` is
            outside (0, 1).
    """
    k = _check_count("successes", successes)
    n = _check_count("trials", trials)
    a = check.unit_interval("alpha", alpha)
    if n < 1:
        raise UserError(f"trials must be at least 1, got {n}")
    if not 0 <= k <= n:
        raise UserError(f"successes must lie in [0, trials] = [0, {n}], got {k}")
    counts = np.array([k], dtype=np.int64)
    return float(_lower_bounds(counts, n, a)[0]), float(_upper_bounds(counts, n, a)[0])


def _lower_bounds(
    successes: npt.NDArray[np.int64] | npt.NDArray[np.float64], trials: int, alpha: float
) -> npt.NDArray[np.float64]:
    """Vectorised one-sided lower bounds (no argument checks: internal use).

    Counts may be real numbers in [0, trials]: the Beta quantiles interpolate between integers.
    """
    k = successes.astype(np.float64)
    out = np.zeros(k.shape, dtype=np.float64)
    positive = k > 0
    if np.any(positive):
        kp = k[positive]
        out[positive] = stats.beta.ppf(alpha, kp, trials - kp + 1.0) * (1.0 - _OUTWARD)
    return out


def _upper_bounds(
    successes: npt.NDArray[np.int64] | npt.NDArray[np.float64], trials: int, alpha: float
) -> npt.NDArray[np.float64]:
    """Vectorised one-sided upper bounds (no argument checks: internal use; real counts too)."""
    k = successes.astype(np.float64)
    out = np.ones(k.shape, dtype=np.float64)
    partial = k < trials
    if np.any(partial):
        kp = k[partial]
        # isf rather than ppf(1 - alpha): 1 - alpha loses the digits of a tiny alpha.
        upper = stats.beta.isf(alpha, kp + 1.0, trials - kp) * (1.0 + _OUTWARD)
        out[partial] = np.minimum(upper, 1.0)
    return out
