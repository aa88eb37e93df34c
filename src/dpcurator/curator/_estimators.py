"""Estimators: from an aggregate's noisy measures to released values and intervals.

Everything here is post-processing of what ``add_noise`` released, so it costs nothing and any
interval level chosen later is free. One ``Estimator`` per aggregate (intervals: see the
``Release`` docstring; counts by ``mechanisms._tails``, means by ``_ratio``, variances by
``_variance``):

- COUNT, COUNT(DISTINCT unit), SUM: one noisy measure, read in real units (clipped at zero for
  counts, and to the sign of the bounds for sums, with ``postprocess``);
- AVG: noisy count and noisy centred sum, the ratio clipped to the bounds;
- VARIANCE / STDDEV: the same with the noisy centred sum of squares, the interval from one
  pivot on the mean and the variance together;
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

from dpcurator.errors import InternalError
from dpcurator.mechanisms import CountIntervals, DiscreteGaussian, DiscreteLaplace, NoiseTails
from dpcurator.query.bounding import MeasureSpec
from dpcurator.query.plan import Aggregate, Bounds, Count, CountUnits, Mean, Sum, Variance

from . import _total
from ._quantiles import QuantileTree
from ._ratio import FoldedNoise, NumeratorNoise, RatioPivot
from ._variance import VariancePivot

__all__ = ["TOTAL", "Estimator", "Intervals", "Noisy", "NoisyMeasure", "describe_with_error_95",
           "estimate", "estimate_totals"]

FloatArray = npt.NDArray[np.float64]
_MEAN_SHARE = 0.05  # of a variance interval's alpha, to the mean (module docstring)
#: Per aggregate name, its noisy measures: (P,) integer arrays, or one (P, 2047) noisy tree;
#: under ``TOTAL`` + a measure's name, an outer-capped measure of total intervals (``_total``).
Noisy = Mapping[str, list[npt.NDArray[Any]]]
TOTAL = "__total__"


@dataclass(frozen=True)
class NoisyMeasure:
    """A measure, its mechanism and the real value of one of its integer units.

    ``threshold``: set when this measure's noisy value also selected the partitions (released
    only where it reached the threshold, in integer units); its intervals are then conditional
    on that (``_tails.CountIntervals``).
    """

    spec: MeasureSpec
    mechanism: DiscreteLaplace | DiscreteGaussian
    unit: Fraction
    threshold: int | None = None

    def half_width(self, alpha: float) -> float:
        """w with P[|noise| > w] <= alpha, in real units (exact for the integer noise)."""
        return float(self.mechanism.accuracy(alpha) * self.unit)

    def describe(self) -> dict[str, Any]:
        m = self.mechanism
        kind = "discrete Laplace" if isinstance(m, DiscreteLaplace) else "discrete Gaussian"
        scale = (float(m.scale * self.unit) if isinstance(m, DiscreteLaplace)
                 else float(m.noise_sigma(2) * self.unit))
        described = {"measure": self.spec.kind, "noise": kind,
                     "scale" if isinstance(m, DiscreteLaplace) else "sigma": scale,
                     "guarantee": str(m.guarantee)}
        if self.threshold is not None:
            described["selects partitions at"] = float(self.threshold * self.unit)
        return described

    def count_interval(self, noisy: npt.NDArray[Any], alpha: float
                       ) -> tuple[FloatArray, FloatArray]:
        """The shortest exact interval for an integer-noised count, conditional on reaching
        the threshold when this count selected the partitions (``_tails``), in real units."""
        units = np.asarray(noisy, dtype=np.float64)
        tails = NoiseTails.of(self.mechanism)
        low, high = CountIntervals(tails, self.threshold).interval(units, alpha)
        unit = float(self.unit)
        return low * unit, high * unit


@dataclass(frozen=True)
class Estimator:
    """Turns an aggregate's noisy measures into values and (1 - alpha) intervals.

    A quantile has no engine measures: its ``tree`` is released from the engine's histogram,
    and its noisy data is that tree.
    """

    aggregate: Aggregate
    measures: tuple[NoisyMeasure, ...]
    postprocess: bool
    tree: QuantileTree | None = None
    total: NoisyMeasure | None = None  # COUNT(*)'s outer-capped count (``_total``)

    def describe(self) -> list[dict[str, Any]]:
        """The noise of every measure (for ``explain`` and the release's ``mechanisms``)."""
        described = [m.describe() for m in self.measures]
        if self.total is not None:  # the outer cap in the query's units (a sum's: its V)
            value = self.total.spec.value
            described.append({**self.total.describe(), **(
                {"outer cap (rows of one unit)": self.total.spec.outer} if value is None else
                {"outer cap (sum of |value| of one unit)": value.hi})})
        return described + ([self.tree.describe()] if self.tree is not None else [])

    def total_interval(self, noisy: list[npt.NDArray[Any]], total: npt.NDArray[Any],
                       alpha: float) -> tuple[FloatArray, FloatArray]:
        """(1 - alpha) intervals of the count, or the sum, without the query's caps and
        clamping (``_total``): a sum's from its outer-capped sum alone (two-sided)."""
        assert self.total is not None
        if type(self.aggregate) is Sum:
            middle = _to_real(total, self.total.unit)
            width = self.total.half_width(alpha)
            return middle - width, middle + width
        low_alpha, high_alpha = _total.alphas(alpha)
        bounded = self.measures[0]
        low, high = _total.total_interval(
            _to_real(noisy[0], bounded.unit), bounded.half_width(low_alpha),
            _to_real(total, self.total.unit), self.total.half_width(high_alpha))
        return _nonnegative_interval(low, high) if self.postprocess else (low, high)

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
        if isinstance(agg, Count | CountUnits):
            lo, hi = self.measures[0].count_interval(noisy[0], alpha)
            return _nonnegative_interval(lo, hi) if self.postprocess else (lo, hi)
        reals = [_to_real(v, m.unit) for v, m in zip(noisy, self.measures, strict=True)]
        if isinstance(agg, Sum):
            width = self.measures[0].half_width(alpha)
            lo, hi = reals[0] - width, reals[0] + width
            if self.postprocess and agg.bounds is not None and agg.bounds.lo >= 0:
                return _nonnegative_interval(lo, hi)  # the truth cannot be negative either
            if self.postprocess and agg.bounds is not None and agg.bounds.hi <= 0:
                low, high = _nonnegative_interval(-hi, -lo)
                return -high, -low
            return lo, hi
        assert agg.bounds is not None
        half = (agg.bounds.hi - agg.bounds.lo) / 2
        mid = agg.bounds.midpoint
        count, present = reals[0], self.measures[0]
        safe = np.maximum(count, 1.0)
        if isinstance(agg, Mean):
            # The centred mean S / C in [-half, half], by its pivot (``_ratio``).
            point = np.clip(reals[1] / safe, -half, half)
            m_lo, m_hi = _pivot(present, self.measures[1]).interval(
                count, reals[1], alpha, -half, half, point)
            # widened to hold the released value (``estimate``'s point): a superset keeps the
            # coverage, and where the noisy count is near zero the clipped ratio can fall
            # outside the pivot's set (issue 26: a value beside its own interval)
            return mid + np.minimum(m_lo, point), mid + np.maximum(m_hi, point)
        assert isinstance(agg, Variance)
        # One pivot on the mean and the variance together (``_variance``): the mean's interval
        # at alpha_mu = 0.05 alpha, then the variances v whose residual
        # q~ - 2 mu s~ + (mu^2 - v) c~ is not extreme for some mu in it, at the rest of alpha.
        alpha_mu = alpha * _MEAN_SHARE
        mean_point = np.clip(reals[1] / safe, -half, half)
        m_lo, m_hi = _pivot(present, self.measures[1]).interval(
            count, reals[1], alpha_mu, -half, half, mean_point)
        point = np.clip(reals[2] / safe - mean_point * mean_point, 0.0, half * half)
        pivot = VariancePivot(
            FoldedNoise.of(present.mechanism, float(present.unit)),
            NumeratorNoise.of(self.measures[1].mechanism, float(self.measures[1].unit)),
            NumeratorNoise.of(self.measures[2].mechanism, float(self.measures[2].unit)))
        v_lo, v_hi = pivot.interval(count, reals[1], reals[2], (m_lo, m_hi),
                                    alpha - alpha_mu, half * half, point)
        v_lo, v_hi = np.clip(v_lo, 0.0, half * half), np.clip(v_hi, 0.0, half * half)
        var = np.clip(reals[2] / safe - mean_point * mean_point, 0.0, half * half)
        v_lo, v_hi = np.minimum(v_lo, var), np.maximum(v_hi, var)  # holds the value, as above
        if agg.std:
            return np.sqrt(v_lo), np.sqrt(v_hi)
        return v_lo, v_hi


def _pivot(count: NoisyMeasure, total: NoisyMeasure) -> RatioPivot:
    """The pivot of total / count from the two measures' noises, in real units."""
    return RatioPivot(FoldedNoise.of(count.mechanism, float(count.unit)),
                      NumeratorNoise.of(total.mechanism, float(total.unit)))


def estimate(estimators: Sequence[Estimator], noisy: Noisy) -> dict[str, FloatArray]:
    """The released values: per aggregate name, (P,) floats from its noisy measures."""
    return {e.aggregate.name: e.estimate(noisy[e.aggregate.name]) for e in estimators}


def estimate_totals(estimators: Sequence[Estimator], noisy: Noisy) -> dict[str, FloatArray]:
    """Per SUM with an outer-capped measure (``_total``), its own estimate of the sum without
    the caps and the clamping: S~ (P,), the centre of its total interval. The bounded value
    is another estimate, of another sum: each is released with its own interval."""
    return {e.aggregate.name: _to_real(noisy[TOTAL + e.total.spec.name][0], e.total.unit)
            for e in estimators if e.total is not None and type(e.aggregate) is Sum}


@dataclass(frozen=True)
class Intervals:
    """A release's intervals at any level: post-processing of the same noisy measures."""

    estimators: Sequence[Estimator]
    noisy: Noisy

    def __call__(self, name: str, alpha: float, total: bool = False
                 ) -> tuple[FloatArray, FloatArray]:
        """(1 - alpha) intervals of the aggregate ``name``: low (P,), high (P,); of its count
        without the caps (``total``) where it has an outer-capped measure."""
        by_name = {e.aggregate.name: e for e in self.estimators}
        estimator = by_name[name]
        if total and estimator.total is not None:
            return estimator.total_interval(
                self.noisy[name], self.noisy[TOTAL + estimator.total.spec.name][0], alpha)
        return estimator.interval(self.noisy[name], alpha)


def _nonnegative_interval(lo: FloatArray, hi: FloatArray) -> tuple[FloatArray, FloatArray]:
    """The interval of a quantity that cannot be negative (a count; a sum of values that
    cannot be): [max(lo, 0), max(hi, 0)], except where all of [lo, hi] lies below 0. There
    clipping left [0, 0] beside an answer of 0, a tight interval about a wrong answer: the
    widest caps on thin data, where the noise is many times the truth, did so for one
    partition in forty (``examples/orders.csv``, COUNT(*) by region at epsilon 0.2: 19 of 200
    releases had one). It is [0, hi - lo] there, as wide as the noise made it. Coverage
    cannot drop: each interval holds the clipped one."""
    return np.maximum(lo, 0.0), np.where(hi < 0.0, hi - lo, np.maximum(hi, 0.0))


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


def describe_with_error_95(estimator: Estimator) -> list[dict[str, Any]]:
    """``Estimator.describe()``, each noised measure with its mechanism's 95% half-width."""
    noised: list[NoisyMeasure | QuantileTree] = [
        *estimator.measures, *([estimator.total] if estimator.total is not None else []),
        *([estimator.tree] if estimator.tree is not None else [])]
    described = estimator.describe()
    if len(described) != len(noised):
        raise InternalError("an estimator describes other measures than it noises; "
                            "this is probably a bug")
    out = []
    for text, source in zip(described, noised, strict=True):
        if isinstance(source, QuantileTree):  # a node's noise, in counts of one unit
            error = float(source.mechanism.accuracy(0.05)) / source.weight
        else:
            error = source.half_width(0.05)
        out.append({**text, "error_95": error})
    return out
