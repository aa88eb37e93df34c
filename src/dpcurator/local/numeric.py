"""Numeric answers in a bounded range [low, high]: unbiased mean estimation under local DP.

An answer v is mapped to t = (v - low) / (high - low) in [0, 1], x = 2t - 1 in [-1, 1], in
double precision. That can move t by an ulp: privacy holds for every t, so only unbiasedness is
affected, at the 1e-16 level; for [low, high] = [0, 1] the map is the identity and exact.

- ``Duchi``: Duchi, Jordan and Wainwright, "Minimax optimal procedures for locally private
  estimation" (JASA 2018), one-dimensional case: report +C w.p. (1 + rho x) / 2, else -C, with
  rho = (E - 1)/(E + 1) and C = 1/rho, E <= e^epsilon. Ratio (1 + rho)/(1 - rho) = E. Sampled
  here as "w.p. rho, a coin with P[+] = (1 + x)/2 (exact randomized rounding of x), else a fair
  coin".
- ``Piecewise``: the piecewise mechanism of Wang, Xiao, Yang, Zhao, Hu, Lin, Nie and Ma,
  "Collecting and analyzing multidimensional data with local differential privacy" (ICDE 2019),
  made exact on a grid. With E' = N/m <= e^(epsilon/2) (N = 2^grid_bits, m = ceil(N / E'_low)),
  x is first rounded at random to the grid x' = -1 + 2i/N (i in 0..N, unbiased), then the
  output is one of J = N + m cells of width delta = 2/(N - m) covering [-C, C],
  C = (E' + 1)/(E' - 1): the m cells i..i+m-1 (the "centre piece" l(x')..r(x') of the paper)
  each have probability a = N/(m(N + m)), every other cell b = m/(N(N + m)), ratio
  a/b = E'^2 <= e^epsilon. The report is the cell index j; its value y_j = (2j - N - m + 1)/(N - m)
  satisfies E[y | x'] = x' exactly, and
      Var[y | x] = K0 + x^2 m/(N - m) + (N/(N - m)) (2/N)^2 f(1 - f),
      K0 = b delta^2 J(J^2 - 1)/12 + (a - b) delta^2 m(m^2 - 1)/12,
  f the fractional part of (x + 1) N / 2 (the rounding's share, below 2^-60). As N grows this
  is the paper's x^2/(e^(epsilon/2) - 1) + (e^(epsilon/2) + 3)/(3 (e^(epsilon/2) - 1)^2). Unlike
  a continuous output computed in floating point, a cell index cannot leak the input through
  rounding artefacts (Mironov 2012).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from dpcurator.errors import UserError
from dpcurator.local import _sampling, client
from dpcurator.local._base import (
    Accumulator,
    LocalRandomizer,
    ReportError,
    Reports,
    Row,
    check_confidence,
    check_int_field,
    check_method,
    fraction_text,
)
from dpcurator.local.estimators import MeanEstimate, clopper_pearson_interval, z_value
from dpcurator.noise import RandomSource

__all__ = ["Duchi", "NumericRandomizer", "Piecewise"]

FloatArray = npt.NDArray[np.float64]


def _check_bound(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise UserError(f"{name} must be a finite number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise UserError(f"{name} must be a finite number, got {value!r}")
    return v


def _square_sum(z: npt.NDArray[np.int64]) -> int:
    """sum(z^2) exactly for |z| < 2^42: z = a 2^21 + b, in int64 blocks that cannot overflow."""
    a, b = np.divmod(z, np.int64(1 << 21))
    total = 0
    for start in range(0, z.size, 1 << 16):
        aa, bb = a[start:start + (1 << 16)], b[start:start + (1 << 16)]
        total += ((int((aa * aa).sum()) << 42) + (int((aa * bb).sum()) << 22)
                  + int((bb * bb).sum()))
    return total


class MomentAccumulator(Accumulator):
    """n and the exact sums of the reports' integer codes and of their squares.

    Exact integers make the estimate independent of how the reports were chunked."""

    def __init__(self, code: Any, squares: bool = True) -> None:
        self._code = code
        self._squares = squares
        self.n = 0
        self.total = 0
        self.total_squares = 0

    def add(self, reports: Reports) -> None:
        z = self._code(np.asarray(reports).reshape(-1))
        self.total += int(z.sum())
        self.n += int(z.size)
        self.total_squares += _square_sum(z) if self._squares else int(z.size)


class NumericRandomizer(LocalRandomizer):
    """A randomizer for a number in [low, high] whose reports average to the true mean."""

    def __init__(self, epsilon: float, low: float, high: float,
                 source: RandomSource | None) -> None:
        super().__init__(epsilon, source)
        self.low = _check_bound("low", low)
        self.high = _check_bound("high", high)
        if not self.low < self.high:
            raise UserError(f"low must be smaller than high, got [{low!r}, {high!r}]")
        self._width = self.high - self.low
        if not math.isfinite(self._width):  # every answer would map to the same position
            raise UserError(f"high - low must be a finite number, got [{low!r}, {high!r}] whose "
                            "width overflows; rescale the answers")

    def _config_body(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high, "params": self._params()}

    def _params(self) -> dict[str, Any]:
        raise NotImplementedError

    def positions(self, values: Any) -> FloatArray:
        """Answers mapped to t = (v - low)/(high - low) in [0, 1] (x = 2t - 1)."""
        try:
            v = np.asarray(values, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise UserError("values must be numbers") from None
        if not np.all(np.isfinite(v)):
            raise UserError("values must be finite numbers (found NaN or infinity)")
        if v.size and (v.min() < self.low or v.max() > self.high):
            raise UserError(f"values contains answers outside the survey's range "
                            f"[{self.low:g}, {self.high:g}]; clip them first if that is meant")
        if self.low == 0.0 and self.high == 1.0:
            return v
        return np.clip((v - self.low) / self._width, 0.0, 1.0)

    def _exact_position(self, value: Any) -> Fraction:
        v = Fraction(value)
        if not self.low <= v <= self.high:
            raise UserError("value lies outside [low, high]")
        return (v - Fraction(self.low)) / (Fraction(self.high) - Fraction(self.low))

    def to_values(self, x: FloatArray | float) -> Any:
        """Map from the [-1, 1] scale back to [low, high] units."""
        return self.low + (np.asarray(x) + 1.0) * (self._width / 2.0)

    def release(self, values: Any) -> FloatArray:
        """Randomize and return each report as an unbiased estimate of its answer (in units)."""
        return np.asarray(self.to_values(self.report_values(self.randomize(values))),
                          dtype=np.float64)

    def report_values(self, reports: Reports) -> FloatArray:
        """Each report's value on the [-1, 1] scale (unbiased for its answer's x)."""
        raise NotImplementedError

    def report_variance(self, mean: float | None = None) -> float:
        """Per-report variance (n * Var[mean estimate]) in squared units, worst case over the
        answers' distribution (given its mean, if ``mean`` is given), sampled model."""
        raise NotImplementedError

    def _mean_estimate(self, n: int, x_bar: float, variance: float, confidence: float,
                       method: str, interval: tuple[float, float] | None) -> MeanEstimate:
        scale = self._width / 2.0
        se = math.sqrt(max(variance, 0.0) / n) if n else math.inf
        if interval is None:
            z = z_value(confidence)
            interval = (x_bar - z * se, x_bar + z * se)
        # Both ends clipped to the feasible [-1, 1] (the true mean lies there, so coverage is
        # unchanged), but never past the estimate: each end used to be clipped on one side
        # only, and a raw interval beyond 1 (few reports, small epsilon) came out as
        # (above 1, 1), low > high. Now low <= estimate <= high always, and an interval wholly
        # outside [-1, 1] runs from the range's end to the estimate instead of collapsing to a
        # point that would read as certainty (as ``estimators.frequency_arrays`` avoids).
        lo_x = min(min(max(interval[0], -1.0), 1.0), x_bar)
        hi_x = max(max(min(interval[1], 1.0), -1.0), x_bar)
        lo = float(self.to_values(lo_x))
        hi = float(self.to_values(hi_x))
        return MeanEstimate(mechanism=self.mechanism, epsilon=self.epsilon, n=n,
                            confidence=confidence, method=method,
                            estimate=float(self.to_values(x_bar)), standard_error=se * scale,
                            interval=(lo, hi), low=self.low, high=self.high)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(epsilon={self.epsilon!r}, low={self.low!r}, "
                f"high={self.high!r})")


class Duchi(NumericRandomizer):
    """Duchi et al.'s one-bit mechanism for a bounded mean (see the module docstring).

    Reports are signs (+1 / -1); ``release`` returns +-C in units. Per report, in the [-1, 1]
    scale: Var = C^2 - x^2 for a fixed answer, C^2 - mu^2 for sampled respondents.
    """

    mechanism = "duchi"

    def __init__(self, epsilon: float, low: float = 0.0, high: float = 1.0,
                 source: RandomSource | None = None, *, rho: Fraction | None = None) -> None:
        super().__init__(epsilon, low, high, source)
        if rho is None:
            e = client.exp_lower(self.epsilon)
            rho = (e - 1) / (e + 1)
        self._rho = Fraction(rho)
        self.bound = float(1 / self._rho)  # C
        self._verify()

    def _params(self) -> dict[str, Any]:
        return {"rho": fraction_text(self._rho)}

    def randomize(self, values: Any) -> Reports:
        t = self.positions(values)
        src = self.source
        truthful = _sampling.bernoulli(self._rho, t.size, src)
        rounded = _sampling.bernoulli_float(t, src)  # P[+] = t = (1 + x)/2, exactly
        coin = _sampling.bernoulli(Fraction(1, 2), t.size, src)
        plus = _sampling.select(truthful, rounded, coin)
        return plus.view(np.int8) * np.int8(2) - np.int8(1)  # +1 / -1

    def report_values(self, reports: Reports) -> FloatArray:
        return np.asarray(reports, dtype=np.float64) * self.bound

    def report_distribution(self, value: Any) -> dict[Row, Fraction]:
        x = 2 * self._exact_position(value) - 1
        plus = (1 + self._rho * x) / 2
        return {(1,): plus, (-1,): 1 - plus}

    def accumulator(self) -> MomentAccumulator:
        return MomentAccumulator(lambda r: r.astype(np.int64), squares=False)  # z^2 = 1

    def estimate(self, reports: Reports | Accumulator, *, confidence: float = 0.95,
                 method: str | None = None, project: bool = False) -> MeanEstimate:
        """The mean answer: C * (mean sign), unbiased. ``method="exact"`` inverts
        Clopper-Pearson on the number of + signs (Binomial(n, (1 + rho mu)/2) for sampled
        respondents). ``project`` clips the estimate to [low, high]."""
        confidence = check_confidence(confidence)
        method = check_method(method, self.default_method)
        acc = self._accumulated(reports)
        assert isinstance(acc, MomentAccumulator)
        n = acc.n
        if n < 1:
            raise UserError("at least one report is needed to estimate anything")
        c = self.bound
        x_bar = float(Fraction(acc.total, n) / self._rho)
        interval = None
        if method == "exact":
            plus = (acc.total + n) // 2
            lo, hi = clopper_pearson_interval([plus], n, confidence)
            interval = ((2 * float(lo[0]) - 1) * c, (2 * float(hi[0]) - 1) * c)
        est = self._mean_estimate(n, x_bar, c * c - min(x_bar * x_bar, 1.0), confidence, method,
                                  interval)
        return _clipped(est, project)

    def variance(self, values: Any) -> float:
        """Exact variance of the mean estimate (in squared units) for these fixed answers."""
        x = 2 * self.positions(values) - 1
        per = self.bound ** 2 - np.square(x)
        return float(per.mean() / x.size * (self._width / 2) ** 2)

    def report_variance(self, mean: float | None = None) -> float:
        mu = 0.0 if mean is None else 2 * float(self._exact_position(mean)) - 1
        return (self.bound ** 2 - mu * mu) * (self._width / 2) ** 2

    def parse_report(self, obj: Mapping[str, Any]) -> Row:
        y = check_int_field(obj, "y", -1, 2)
        if y == 0:
            raise ReportError("field 'y' must be +1 or -1")
        return (y,)

    def rows_to_reports(self, rows: Sequence[Row]) -> Reports:
        return np.fromiter((r[0] for r in rows), dtype=np.int8, count=len(rows))

    def report_rows(self, reports: Reports) -> Iterator[dict[str, Any]]:
        for y in np.asarray(reports).tolist():
            yield {"mechanism": self.mechanism, "y": int(y)}


class Piecewise(NumericRandomizer):
    """The piecewise mechanism on an exact grid (see the module docstring).

    ``grid_bits`` (N = 2^grid_bits) sets the resolution; the default keeps m >= 2^20 so that
    E' = N/m is within 2^-20 of e^(epsilon/2). Reports are cell indices; ``release`` returns the
    cells' values in units.
    """

    mechanism = "piecewise"

    def __init__(self, epsilon: float, low: float = 0.0, high: float = 1.0,
                 source: RandomSource | None = None, *, grid_bits: int | None = None,
                 m: int | None = None) -> None:
        super().__init__(epsilon, low, high, source)
        if grid_bits is None:
            grid_bits = min(40, max(31, math.ceil(21 + self.epsilon / (2 * math.log(2)))))
        if isinstance(grid_bits, bool) or not isinstance(grid_bits, int) or not (
                1 <= grid_bits <= 40):
            raise UserError(f"grid_bits must be an integer in [1, 40], got {grid_bits!r}")
        self.grid = 1 << grid_bits
        if m is None:
            half = client.exp_lower(Fraction(self.epsilon) / 2)
            m = math.ceil(Fraction(self.grid) / half)  # N/m <= E'_low <= e^(epsilon/2)
        if not 1 <= m < self.grid:
            raise UserError(f"epsilon={epsilon!r} is too large or too small for a grid of "
                            f"2^{grid_bits} cells")
        self.m = m
        n_, m_ = self.grid, m
        self._a = Fraction(n_, m_ * (n_ + m_))
        self._b = Fraction(m_, n_ * (n_ + m_))
        self.bound = (n_ + m_) / (n_ - m_)  # C, the largest |y|
        delta = Fraction(2, n_ - m_)
        j_cells = n_ + m_
        self._k0 = float(self._b * delta**2 * j_cells * (j_cells**2 - 1) / 12
                         + (self._a - self._b) * delta**2 * m_ * (m_**2 - 1) / 12)
        self._verify()

    def _params(self) -> dict[str, Any]:
        return {"grid": self.grid, "m": self.m}

    def randomize(self, values: Any) -> Reports:
        t = self.positions(values)
        src = self.source
        pos = t * self.grid  # exact: a power-of-two scaling
        base = np.floor(pos)
        i = base.astype(np.int64) + _sampling.bernoulli_float(pos - base, src)  # unbiased
        centre = _sampling.bernoulli(Fraction(self.grid, self.grid + self.m), t.size, src)
        inner = i + _sampling.uniform(self.m, t.size, src)
        outer = _sampling.uniform(self.grid, t.size, src)
        outer += (outer >= i) * self.m
        return _sampling.select(centre, inner, outer)

    def _codes(self, reports: Reports) -> npt.NDArray[np.int64]:
        """z = 2j - N - m + 1, so that a cell's value is z / (N - m)."""
        return 2 * np.asarray(reports, dtype=np.int64) - (self.grid + self.m - 1)

    def report_values(self, reports: Reports) -> FloatArray:
        return self._codes(reports) / float(self.grid - self.m)

    def report_distribution(self, value: Any) -> dict[Row, Fraction]:
        if self.grid > 1 << 12:
            raise UserError("report_distribution enumerates every cell: grid_bits <= 12 only")
        pos = self._exact_position(value) * self.grid
        i0 = math.floor(pos)
        frac = pos - i0
        out: dict[Row, Fraction] = {}
        for j in range(self.grid + self.m):
            prob = Fraction(0)
            for i, w in ((i0, 1 - frac), (i0 + 1, frac)):
                if w:
                    prob += w * (self._a if i <= j < i + self.m else self._b)
            out[(j,)] = prob
        return out

    def accumulator(self) -> MomentAccumulator:
        return MomentAccumulator(self._codes)

    def estimate(self, reports: Reports | Accumulator, *, confidence: float = 0.95,
                 method: str | None = None, project: bool = False) -> MeanEstimate:
        """The mean answer: the mean of the reports' values, unbiased.

        ``method="normal"`` uses the reports' sample variance; ``"exact"`` is Hoeffding's bound
        for outputs in [-C, C] (coverage >= confidence for every n, wider). ``project`` clips the
        estimate to [low, high].
        """
        confidence = check_confidence(confidence)
        method = check_method(method, self.default_method)
        acc = self._accumulated(reports)
        assert isinstance(acc, MomentAccumulator)
        n = acc.n
        if n < 1:
            raise UserError("at least one report is needed to estimate anything")
        scale = self.grid - self.m
        x_bar = float(Fraction(acc.total, n * scale))
        if n > 1:  # the sample variance of the reports' values z / scale, exactly
            variance = float((Fraction(acc.total_squares) - Fraction(acc.total**2, n))
                             / (scale * scale * (n - 1)))
        else:
            variance = self.report_variance() / (self._width / 2) ** 2
        interval = None
        if method == "exact":
            half = self.bound * math.sqrt(2 * math.log(2 / (1 - confidence)) / n)
            interval = (x_bar - half, x_bar + half)
        est = self._mean_estimate(n, x_bar, variance, confidence, method, interval)
        return _clipped(est, project)

    def conditional_variance(self, values: Any) -> FloatArray:
        """Var[y | answer] per answer, on the [-1, 1] scale (the closed form above)."""
        t = self.positions(values)
        x = 2 * t - 1
        pos = t * self.grid
        f = pos - np.floor(pos)
        n_, m_ = self.grid, self.m
        rounding = n_ / (n_ - m_) * (2 / n_) ** 2 * f * (1 - f)
        return np.asarray(self._k0 + x * x * m_ / (n_ - m_) + rounding, dtype=np.float64)

    def variance(self, values: Any) -> float:
        """Exact variance of the mean estimate (squared units) for these fixed answers."""
        per = self.conditional_variance(values)
        return float(per.mean() / per.size * (self._width / 2) ** 2)

    def report_variance(self, mean: float | None = None) -> float:
        mu = 0.0 if mean is None else 2 * float(self._exact_position(mean)) - 1
        n_, m_ = self.grid, self.m
        # E[Var[y | x]] + Var[x] <= K0 + E[x^2] N/(N - m) + rounding - mu^2, with E[x^2] <= 1.
        worst = self._k0 + n_ / (n_ - m_) + 1 / (n_ * (n_ - m_)) - mu * mu
        return worst * (self._width / 2) ** 2

    def parse_report(self, obj: Mapping[str, Any]) -> Row:
        return (check_int_field(obj, "y", 0, self.grid + self.m),)

    def rows_to_reports(self, rows: Sequence[Row]) -> Reports:
        return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))

    def report_rows(self, reports: Reports) -> Iterator[dict[str, Any]]:
        for y in np.asarray(reports, dtype=np.int64).tolist():
            yield {"mechanism": self.mechanism, "y": y}


def _clipped(est: MeanEstimate, project: bool) -> MeanEstimate:
    if not project:
        return est
    from dataclasses import replace

    return replace(est, estimate=min(max(est.estimate, est.low), est.high))
