"""The Gaussian mechanism and its integer twin, the discrete Gaussian mechanism."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from dpcurator.accounting import ZCDP, ApproxDP, Neighbouring
from dpcurator.accounting.conversions import zcdp_rho_for
from dpcurator.accounting.events import DiscreteGaussianEvent, DpEvent
from dpcurator.errors import UserError
from dpcurator.mechanisms import _calibration, _grid
from dpcurator.mechanisms._base import (
    ArrayLike,
    Mechanism,
    as_finite_array,
    check_alpha,
    check_delta,
    check_positive,
)
from dpcurator.mechanisms.laplace import _as_integers
from dpcurator.noise import RandomSource, sample_discrete_gaussian
from dpcurator.noise.samplers import MAX_SCALE

_SQRT_DENOMINATOR = 1 << 20


def _sqrt_upper(k: int) -> Fraction:
    """A rational upper bound on sqrt(k), within 2^-20."""
    return Fraction(math.isqrt(k * _SQRT_DENOMINATOR**2) + 1, _SQRT_DENOMINATOR)


def _rational_at_least(value: float) -> Fraction:
    """A rational >= value (the next double up, taken exactly)."""
    return Fraction(math.nextafter(value, math.inf))


class _GaussianCalibration:
    """Shared parameter handling: (epsilon, delta) or rho, and the resulting guarantee."""

    def __init__(self, epsilon: float | None, delta: float | None, rho: float | None) -> None:
        if rho is not None:
            if epsilon is not None or delta is not None:
                raise UserError("give either rho (zCDP) or epsilon and delta, not both")
            self.rho: float | None = check_positive("rho", rho)
            self.epsilon: float | None = None
            self.delta: float | None = None
        else:
            if epsilon is None or delta is None:
                raise UserError("give epsilon and delta (approximate DP) or rho (zCDP)")
            self.rho = None
            self.epsilon = check_positive("epsilon", epsilon)
            self.delta = check_delta(delta)

    def guarantee(self, neighbouring: Neighbouring) -> ApproxDP | ZCDP:
        if self.rho is not None:
            return ZCDP(self.rho, neighbouring)
        assert self.epsilon is not None and self.delta is not None
        return ApproxDP(self.epsilon, self.delta, neighbouring)


class _GaussianFamily(Mechanism):
    """What the two Gaussian mechanisms share: their calibration's guarantee and repr."""

    _cal: _GaussianCalibration
    epsilon: float | None
    delta: float | None
    rho: float | None
    sensitivity: float

    @property
    def guarantee(self) -> ApproxDP | ZCDP:
        return self._cal.guarantee(self.neighbouring)

    def __repr__(self) -> str:
        params = (
            f"rho={self.rho!r}"
            if self.rho is not None
            else f"epsilon={self.epsilon!r}, delta={self.delta!r}"
        )
        return f"{type(self).__name__}({params}, sensitivity={self.sensitivity!r})"


class Gaussian(_GaussianFamily):
    """The Gaussian mechanism for real-valued queries: x + N(0, sigma^2) per coordinate.

    Guarantees, for queries whose L2 sensitivity under the chosen neighbouring relation
    (default add/remove one privacy unit) is at most ``sensitivity``:
    - ``Gaussian(rho=, sensitivity=)``: rho-zCDP with sigma = sensitivity / sqrt(2 rho)
      (Bun and Steinke 2016, Proposition 1.6; for the discrete Gaussian used here, Canonne,
      Kamath and Steinke 2020, Theorem 4).
    - ``Gaussian(epsilon=, delta=, sensitivity=)``: (epsilon, delta)-DP. A scalar release is
      calibrated with the exact privacy curve (Balle and Wang 2018, Theorem 8; for the discrete
      Gaussian, Canonne, Kamath and Steinke 2020, Theorem 7), bounded rigorously. A vector
      release is calibrated through zCDP and the conversion of Canonne, Kamath and Steinke 2020
      (Section 3), which is sound for the multivariate discrete Gaussian but up to ~15% noisier
      than the scalar curve.

    Floating-point safety: noise is the exact discrete Gaussian on a power-of-two grid (see
    ``_grid``); rounding to the grid inflates the L2 sensitivity by sqrt(k) grid steps, which
    the calibration includes, so the stated guarantee holds exactly.
    """

    def __init__(
        self,
        *,
        sensitivity: float,
        epsilon: float | None = None,
        delta: float | None = None,
        rho: float | None = None,
        neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
        source: RandomSource | None = None,
    ) -> None:
        super().__init__(neighbouring=neighbouring, source=source)
        self._cal = _GaussianCalibration(epsilon, delta, rho)
        self.sensitivity = check_positive("sensitivity", sensitivity)
        self.epsilon, self.delta, self.rho = self._cal.epsilon, self._cal.delta, self._cal.rho
        self.granularity = _grid.granularity_for(
            self.sensitivity, self._nominal_sigma(self.sensitivity)
        )

    def _nominal_sigma(self, sensitivity: float, size: int = 1) -> float:
        if self.rho is not None:
            return sensitivity / math.sqrt(2 * self.rho)
        assert self.epsilon is not None and self.delta is not None
        if size == 1:
            return _calibration.analytic_gaussian_sigma(self.epsilon, self.delta, sensitivity)
        return sensitivity / math.sqrt(2 * zcdp_rho_for(self.epsilon, self.delta))

    @property
    def sigma(self) -> float:
        """The standard deviation of the noise for a scalar release (grid inflation included)."""
        return float(self.noise_sigma(1))

    def noise_sigma(self, size: int = 1) -> Fraction:
        """The exact sigma used for a release of ``size`` coordinates."""
        g = Fraction(self.granularity)
        inflated = Fraction(self.sensitivity) + _sqrt_upper(size) * g
        if self.rho is None and size == 1:
            assert self.epsilon is not None and self.delta is not None
            # Exact discrete curve in grid units: integer sensitivity ceil(inflated / g).
            steps = math.ceil(inflated / g)
            sigma_steps = _calibration.discrete_gaussian_sigma(self.epsilon, self.delta, steps)
            return _rational_at_least(sigma_steps) * g
        return _rational_at_least(self._nominal_sigma(float(inflated), size) * (1 + 2.0**-50))

    def release(self, x: ArrayLike) -> Any:
        values = as_finite_array("x", x)
        flat = np.atleast_1d(values)
        noisy = _grid.gaussian_on_grid(
            flat, self.noise_sigma(max(flat.size, 1)), self.granularity, self.source
        )
        return float(noisy[0]) if values.ndim == 0 else noisy.reshape(values.shape)

    def accuracy(self, alpha: float = 0.05, size: int = 1) -> float:
        """Half-width w with P[|noise| > w] <= alpha per coordinate (rigorous, rounding in)."""
        check_alpha(alpha)
        sigma_steps = float(self.noise_sigma(size) / Fraction(self.granularity))
        return (
            _calibration.discrete_gaussian_interval(alpha, sigma_steps) + 0.5
        ) * self.granularity

    def confidence_interval(self, alpha: float = 0.05, size: int = 1) -> tuple[float, float]:
        """Noise interval (lo, hi) at level 1 - alpha: truth in [released - hi, released - lo]."""
        w = self.accuracy(alpha, size)
        return (-w, w)


class DiscreteGaussian(_GaussianFamily):
    """The discrete Gaussian mechanism for integer queries: x + Z, P[Z = z] ∝ e^(-z^2 / 2 sigma^2).

    Guarantees for integer-valued queries with L2 sensitivity at most ``sensitivity`` (an
    integer) under the chosen neighbouring relation (Canonne, Kamath and Steinke 2020):
    ``rho=`` gives rho-zCDP with sigma = sensitivity / sqrt(2 rho) (Theorem 4);
    ``epsilon=, delta=`` gives (epsilon, delta)-DP, calibrated for scalar releases with the
    exact curve of Theorem 7 (bounded rigorously) and for vectors through zCDP (Section 3).
    """

    sensitivity: int

    def __init__(
        self,
        *,
        sensitivity: int = 1,
        epsilon: float | None = None,
        delta: float | None = None,
        rho: float | None = None,
        neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
        source: RandomSource | None = None,
    ) -> None:
        super().__init__(neighbouring=neighbouring, source=source)
        self._cal = _GaussianCalibration(epsilon, delta, rho)
        if (
            isinstance(sensitivity, bool)
            or not isinstance(sensitivity, int | np.integer)
            or sensitivity < 1
        ):
            raise UserError(f"sensitivity must be a positive integer, got {sensitivity!r}")
        self.sensitivity = int(sensitivity)
        self.epsilon, self.delta, self.rho = self._cal.epsilon, self._cal.delta, self._cal.rho
        if self.rho is not None and self.noise_sigma(1) > MAX_SCALE:  # refused when built
            raise UserError(f"rho {self.rho:g} is too small for sensitivity "
                             f"{self.sensitivity}: the noise's sigma must be at most 2^56")

    def noise_sigma(self, size: int = 1) -> Fraction:
        if self.rho is not None:
            return _rational_at_least(self.sensitivity / math.sqrt(2 * self.rho) * (1 + 2.0**-50))
        assert self.epsilon is not None and self.delta is not None
        if size == 1:
            return _rational_at_least(
                _calibration.discrete_gaussian_sigma(self.epsilon, self.delta, self.sensitivity)
            )
        rho = zcdp_rho_for(self.epsilon, self.delta)
        return _rational_at_least(self.sensitivity / math.sqrt(2 * rho) * (1 + 2.0**-50))

    @property
    def sigma(self) -> float:
        return float(self.noise_sigma(1))

    @property
    def event(self) -> DpEvent:
        """The exact discrete Gaussian profile of a scalar release (sigma rounded down)."""
        exact = self.noise_sigma(1)
        sigma = float(exact)
        if Fraction(sigma) > exact:
            sigma = math.nextafter(sigma, 0.0)
        return DiscreteGaussianEvent(sigma, self.sensitivity)

    def release(self, x: ArrayLike) -> Any:
        values = _as_integers(x)
        noise = sample_discrete_gaussian(
            self.noise_sigma(max(values.size, 1)), values.shape, self.source
        )
        noisy = values + noise
        return int(noisy) if values.ndim == 0 else noisy

    def accuracy(self, alpha: float = 0.05, size: int = 1) -> int:
        """Smallest m with P[|Z| > m] <= alpha (rigorous)."""
        check_alpha(alpha)
        return _calibration.discrete_gaussian_interval(alpha, float(self.noise_sigma(size)))

    def confidence_interval(self, alpha: float = 0.05, size: int = 1) -> tuple[int, int]:
        m = self.accuracy(alpha, size)
        return (-m, m)
