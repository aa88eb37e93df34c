"""Estimators: from an aggregate's noisy measures to released values and intervals.

Everything here is post-processing of what ``add_noise`` released, so it costs nothing and any
interval level chosen later is free. One ``Estimator`` per aggregate:

- COUNT, COUNT(DISTINCT unit), SUM: one noisy measure, read in real units (clipped at zero for
  counts, and to the sign of the bounds for sums, with ``postprocess``);
- AVG: noisy count and noisy centred sum, the ratio clipped to the bounds;
- VARIANCE / STDDEV: the same with the noisy centred sum of squares;
- quantiles: one noisy dyadic tree per partition, read by its ``QuantileTree`` (``_quantiles``).

The noisy data of one aggregate is a list of integer arrays, one per measure, each (P,) for the
P released partitions; a quantile's is one (P, 2047) array, its noisy trees.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from dpcurator.mechanisms import DiscreteGaussian, DiscreteLaplace
from dpcurator.query.bounding import MeasureSpec
from dpcurator.query.plan import Aggregate, Bounds, Count, CountUnits, Mean, Sum, Variance

from ._quantiles import QuantileTree

__all__ = ["Estimator", "Intervals", "Noisy", "NoisyMeasure", "estimate"]

FloatArray = npt.NDArray[np.float64]
#: Per aggregate name, its noisy measures: (P,) integer arrays, or one (P, 2047) noisy tree.
Noisy = Mapping[str, list[npt.NDArray[Any]]]


@dataclass
class NoisyMeasure:
    """A measure, its mechanism and the real value of one of its integer units."""

    spec: MeasureSpec
    mechanism: DiscreteLaplace | DiscreteGaussian
    unit: Fraction

    def half_width(self, alpha: float) -> float:
        """w with P[|noise| > w] <= alpha, in real units (exact for the integer noise)."""
        return float(self.mechanism.accuracy(alpha) * self.unit)

    def describe(self) -> dict[str, Any]:
        m = self.mechanism
        kind = "discrete Laplace" if isinstance(m, DiscreteLaplace) else "discrete Gaussian"
        scale = (float(m.scale * self.unit) if isinstance(m, DiscreteLaplace)
                 else float(m.noise_sigma(2) * self.unit))
        return {"measure": self.spec.kind, "noise": kind,
                "scale" if isinstance(m, DiscreteLaplace) else "sigma": scale,
                "guarantee": str(m.guarantee)}


@dataclass
class Estimator:
    """Turns an aggregate's noisy measures into values and (1 - alpha) intervals.

    A quantile has no engine measures: its ``tree`` is released from the engine's histogram,
    and its noisy data is that tree.
    """

    aggregate: Aggregate
    measures: list[NoisyMeasure]
    postprocess: bool
    tree: QuantileTree | None = None

    def describe(self) -> list[dict[str, Any]]:
        """The noise of every measure (for ``explain`` and the release's ``mechanisms``)."""
        described = [m.describe() for m in self.measures]
        return described + ([self.tree.describe()] if self.tree is not None else [])

    def estimate(self, noisy: list[npt.NDArray[Any]]) -> FloatArray:
        """The released values (P,) from this aggregate's noisy measures (post-processing)."""
        if self.tree is not None:
            return self.tree.estimate(noisy[0])
        agg = self.aggregate
        reals = [_to_real(v, m.unit) for v, m in zip(noisy, self.measures, strict=True)]
        if isinstance(agg, Count | CountUnits):
            value = reals[0]
            return np.maximum(value, 0.0) if self.postprocess else value
        assert agg.bounds is not None
        if isinstance(agg, Sum):
            return _sign_clip(reals[0], agg.bounds) if self.postprocess else reals[0]
        count, total = reals[0], reals[1]
        mid = agg.bounds.midpoint
        half = (agg.bounds.hi - agg.bounds.lo) / 2
        safe = np.maximum(count, 1.0)
        mean_c = np.clip(total / safe, -half, half)
        if isinstance(agg, Mean):
            return mid + mean_c
        assert isinstance(agg, Variance)
        squares = reals[2]
        var = np.clip(squares / safe - mean_c * mean_c, 0.0, half * half)
        return np.sqrt(var) if agg.std else var

    def interval(self, noisy: list[npt.NDArray[Any]], alpha: float
                 ) -> tuple[FloatArray, FloatArray]:
        """(1 - alpha) intervals (P,), (P,) from the same noisy measures (post-processing)."""
        if self.tree is not None:
            return self.tree.interval(noisy[0], alpha)
        agg = self.aggregate
        parts = len(self.measures)
        widths = [m.half_width(alpha / parts) for m in self.measures]
        reals = [_to_real(v, m.unit) for v, m in zip(noisy, self.measures, strict=True)]
        if isinstance(agg, Count | CountUnits | Sum):
            lo, hi = reals[0] - widths[0], reals[0] + widths[0]
            if self.postprocess:  # the truth obeys the same sign constraint: coverage holds
                sign = agg.bounds if isinstance(agg, Sum) else Bounds(0.0, 1.0)
                lo, hi = _sign_clip(lo, sign), _sign_clip(hi, sign)
            return lo, hi
        assert agg.bounds is not None
        half = (agg.bounds.hi - agg.bounds.lo) / 2
        mid = agg.bounds.midpoint
        c_lo = reals[0] - widths[0]
        c_hi = reals[0] + widths[0]
        s_lo = reals[1] - widths[1]
        s_hi = reals[1] + widths[1]
        # The true count is >= 1 in any partition with a value; where c_lo < 1 nothing is known.
        usable = c_lo >= 1.0
        c_lo_safe = np.where(usable, c_lo, 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            m_lo = np.minimum(s_lo / c_lo_safe, s_lo / c_hi)
            m_hi = np.maximum(s_hi / c_lo_safe, s_hi / c_hi)
        m_lo = np.where(usable, np.clip(m_lo, -half, half), -half)
        m_hi = np.where(usable, np.clip(m_hi, -half, half), half)
        if isinstance(agg, Mean):
            return mid + m_lo, mid + m_hi
        assert isinstance(agg, Variance)
        q_lo = np.maximum(reals[2] - widths[2], 0.0)
        q_hi = reals[2] + widths[2]
        sq_max = np.maximum(m_lo * m_lo, m_hi * m_hi)
        sq_min = np.where((m_lo <= 0) & (m_hi >= 0), 0.0, np.minimum(m_lo * m_lo, m_hi * m_hi))
        v_lo = np.where(usable, q_lo / np.maximum(c_hi, 1.0) - sq_max, 0.0)
        v_hi = np.where(usable, q_hi / c_lo_safe - sq_min, half * half)
        v_lo = np.clip(v_lo, 0.0, half * half)
        v_hi = np.clip(v_hi, 0.0, half * half)
        if agg.std:
            return np.sqrt(v_lo), np.sqrt(v_hi)
        return v_lo, v_hi



def estimate(estimators: Sequence[Estimator], noisy: Noisy) -> dict[str, FloatArray]:
    """The released values: per aggregate name, (P,) floats from its noisy measures."""
    return {e.aggregate.name: e.estimate(noisy[e.aggregate.name]) for e in estimators}


@dataclass(frozen=True)
class Intervals:
    """A release's intervals at any level: post-processing of the same noisy measures."""

    estimators: Sequence[Estimator]
    noisy: Noisy

    def __call__(self, name: str, alpha: float) -> tuple[FloatArray, FloatArray]:
        """(1 - alpha) intervals of the aggregate ``name``: low (P,), high (P,)."""
        by_name = {e.aggregate.name: e for e in self.estimators}
        return by_name[name].interval(self.noisy[name], alpha)


def _sign_clip(values: FloatArray, bounds: Bounds | None) -> FloatArray:
    """Counts, and sums of non-negative (non-positive) values, cannot be negative (positive)."""
    if bounds is None:
        return values
    if bounds.lo >= 0:
        return np.maximum(values, 0.0)
    if bounds.hi <= 0:
        return np.minimum(values, 0.0)
    return values


def _to_real(values: npt.NDArray[Any], unit: Fraction) -> FloatArray:
    if values.dtype == object:
        return np.array([float(Fraction(int(v)) * unit) for v in values], dtype=np.float64)
    return values.astype(np.float64) * float(unit)
