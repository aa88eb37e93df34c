"""The Laplace mechanism and its integer twin, the discrete Laplace (geometric) mechanism."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from dpcurator.accounting import Neighbouring, PureDP
from dpcurator.accounting.events import DiscreteLaplaceEvent, DpEvent
from dpcurator.errors import UserError
from dpcurator.mechanisms import _grid
from dpcurator.mechanisms._base import (
    ArrayLike,
    Mechanism,
    as_finite_array,
    check_alpha,
    check_positive,
)
from dpcurator.noise import RandomSource, sample_discrete_laplace
from dpcurator.noise.samplers import MAX_SCALE


def discrete_laplace_quantile(alpha: float, t: float) -> int:
    """Smallest m >= 0 with P[|Z| > m] <= alpha for Z ~ discrete Laplace of scale t.

    P[|Z| >= m] = 2 q^m / (1 + q) with q = e^(-1/t) for m >= 1 (sum of two geometric tails).
    """
    log_q = -1.0 / t
    log_two_over = math.log(2.0) - math.log1p(math.exp(log_q))
    # P[|Z| > m] = P[|Z| >= m + 1] <= alpha  <=>  (m + 1) log q + log(2/(1+q)) <= log alpha
    m = max(0, math.ceil((math.log(alpha) - log_two_over) / log_q) - 1)
    while m > 0 and (m) * log_q + log_two_over <= math.log(alpha):  # float safety: step down
        m -= 1
    while (m + 1) * log_q + log_two_over > math.log(alpha):  # and never below the truth
        m += 1
    return m


class Laplace(Mechanism):
    """The Laplace mechanism for real-valued queries: x + Laplace(sensitivity / epsilon).

    Guarantee: epsilon-DP (``PureDP``) for queries whose L1 sensitivity under the chosen
    neighbouring relation (default: add/remove one privacy unit) is at most ``sensitivity``.
    Source: Dwork, McSherry, Nissim and Smith 2006, Proposition 1; Dwork and Roth 2014,
    Theorem 3.6.

    Floating-point safety: the noise is the discrete Laplace on a power-of-two grid (see
    ``_grid``), sampled exactly. Rounding to the grid inflates the sensitivity by one grid step
    per coordinate; the scale is calibrated to the inflated sensitivity, so the stated epsilon
    holds exactly and the noise is larger than Delta/epsilon by a factor of at most 1 + k * 2^-40.

    Error: ``accuracy(alpha)`` is the half-width w with P[|released - x| > w] <= alpha for each
    coordinate (exact for the grid noise, including the rounding).
    """

    def __init__(
        self,
        *,
        epsilon: float,
        sensitivity: float,
        neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
        source: RandomSource | None = None,
    ) -> None:
        super().__init__(neighbouring=neighbouring, source=source)
        self.epsilon = check_positive("epsilon", epsilon)
        self.sensitivity = check_positive("sensitivity", sensitivity)
        self.granularity = _grid.granularity_for(self.sensitivity, self.sensitivity / self.epsilon)

    @property
    def guarantee(self) -> PureDP:
        return PureDP(self.epsilon, self.neighbouring)

    @property
    def scale(self) -> float:
        """The nominal Laplace scale b = sensitivity / epsilon (before grid inflation)."""
        return self.sensitivity / self.epsilon

    def noise_scale(self, size: int = 1) -> Fraction:
        """The exact scale used for a release of ``size`` coordinates, grid inflation included."""
        g = Fraction(self.granularity)
        return (Fraction(self.sensitivity) + size * g) / Fraction(self.epsilon)

    def release(self, x: ArrayLike) -> Any:
        values = as_finite_array("x", x)
        noisy = _grid.laplace_on_grid(
            np.atleast_1d(values),
            self.noise_scale(max(values.size, 1)),
            self.granularity,
            self.source,
        )
        return float(noisy[0]) if values.ndim == 0 else noisy.reshape(values.shape)

    def accuracy(self, alpha: float = 0.05, size: int = 1) -> float:
        """Half-width w with P[|noise| > w] <= alpha per coordinate (exact, rounding included)."""
        check_alpha(alpha)
        t = float(self.noise_scale(size) / Fraction(self.granularity))
        return (discrete_laplace_quantile(alpha, t) + 0.5) * self.granularity

    def confidence_interval(self, alpha: float = 0.05, size: int = 1) -> tuple[float, float]:
        """Noise interval (lo, hi) at level 1 - alpha: truth in [released - hi, released - lo]."""
        w = self.accuracy(alpha, size)
        return (-w, w)

    def __repr__(self) -> str:
        return f"Laplace(epsilon={self.epsilon!r}, sensitivity={self.sensitivity!r})"


class DiscreteLaplace(Mechanism):
    """The discrete Laplace (geometric) mechanism for integer queries: x + Z, Z exact.

    P[Z = z] ∝ exp(-|z| epsilon / sensitivity). Guarantee: epsilon-DP for integer-valued queries
    with L1 sensitivity at most ``sensitivity`` under the chosen neighbouring relation. Source:
    Ghosh, Roughgarden and Sundararajan, "Universally utility-maximizing privacy mechanisms"
    (STOC 2009); Canonne, Kamath and Steinke 2020, Section 2 (exact sampling).

    Error: ``accuracy(alpha)`` is the smallest integer m with P[|Z| > m] <= alpha (exact).
    """

    def __init__(
        self,
        *,
        epsilon: float,
        sensitivity: float = 1,
        neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
        source: RandomSource | None = None,
    ) -> None:
        super().__init__(neighbouring=neighbouring, source=source)
        self.epsilon = check_positive("epsilon", epsilon)
        self.sensitivity = check_positive("sensitivity", sensitivity)
        if self.scale > MAX_SCALE:  # refused when built, before anything is charged for it
            raise UserError(f"epsilon {self.epsilon:g} is too small for sensitivity "
                             f"{self.sensitivity:g}: the noise's scale sensitivity / epsilon "
                             "must be at most 2^56")

    @property
    def guarantee(self) -> PureDP:
        return PureDP(self.epsilon, self.neighbouring)

    @property
    def event(self) -> DpEvent:
        """The exact discrete Laplace profile when the sensitivity is an integer."""
        if float(self.sensitivity).is_integer():
            scale = float(self.scale)
            if Fraction(scale) > self.scale:  # round down: less noise is a larger loss
                scale = math.nextafter(scale, 0.0)
            return DiscreteLaplaceEvent(scale, int(self.sensitivity))
        return super().event

    @property
    def scale(self) -> Fraction:
        """The exact scale t = sensitivity / epsilon."""
        return Fraction(self.sensitivity) / Fraction(self.epsilon)

    def release(self, x: ArrayLike) -> Any:
        values = _as_integers(x)
        noisy = values + sample_discrete_laplace(self.scale, values.shape, self.source)
        return int(noisy) if values.ndim == 0 else noisy

    def accuracy(self, alpha: float = 0.05) -> int:
        """Smallest m with P[|Z| > m] <= alpha."""
        return discrete_laplace_quantile(check_alpha(alpha), float(self.scale))

    def confidence_interval(self, alpha: float = 0.05) -> tuple[int, int]:
        m = self.accuracy(alpha)
        return (-m, m)

    def __repr__(self) -> str:
        return f"DiscreteLaplace(epsilon={self.epsilon!r}, sensitivity={self.sensitivity!r})"


def _as_integers(x: ArrayLike) -> npt.NDArray[np.int64]:
    arr = as_finite_array("x", x, dtype=None)
    if arr.dtype.kind == "b" or arr.dtype.kind in "iu":
        return arr.astype(np.int64)
    if arr.dtype.kind == "f":
        if not np.all(arr == np.round(arr)) or np.any(np.abs(arr) >= 2.0**62):
            raise UserError(
                "x must hold integers for an integer mechanism "
                "(use Laplace or Gaussian for real values)"
            )
        return arr.astype(np.int64)
    raise UserError("x must be numeric (integers for an integer mechanism)")
