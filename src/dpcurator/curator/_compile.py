"""From a plan and a privacy request to a bounded query, its mechanisms and its estimators.

Small pure passes, in order:

- ``resolve_plan``: fill the curator's defaults (bounds, contribution caps, bounding mode),
  check every column against the schema; Plan -> Plan.
- ``compile_query``: split the privacy request, choose each measure's fixed-point grid from
  its noise scale, derive integer sensitivities, and build the mechanisms; nothing is read.

Estimators (one per aggregate) turn noisy measures into released values and intervals;
a quantile's estimator is a ``QuantileTree`` (see ``_quantiles``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from dpcurator.accounting import ZCDP, ApproxDP, PureDP
from dpcurator.errors import InternalError, UserError
from dpcurator.mechanisms import DiscreteGaussian, DiscreteLaplace
from dpcurator.mechanisms.partition_selection import (
    PartitionSelection,
    choose_partition_selection,
)
from dpcurator.noise import RandomSource
from dpcurator.query import _expressions as ex
from dpcurator.query.bounding import (
    BoundedQuery,
    HistogramSpec,
    MeasureKind,
    MeasureSpec,
    ValueSpec,
)
from dpcurator.query.errors import (
    BoundsError,
    QueryError,
    UnknownColumnError,
    UnsupportedQueryError,
)
from dpcurator.query.plan import (
    Aggregate,
    Bounds,
    Count,
    CountUnits,
    GroupKey,
    Mean,
    Plan,
    Quantile,
    Sum,
    Variance,
)

from . import _privacy
from ._privacy import PrivacyRequest
from ._quantiles import BINS, QuantileTree

__all__ = ["CompiledQuery", "Defaults", "compile_query", "resolve_plan"]

FloatArray = npt.NDArray[np.float64]

CANONICAL_SCALE = 2**40  # every Laplace measure's noise scale, in its integer units
MIN_RESOLUTION = 2**20  # one row's value spans at least this many integer units


@dataclass(frozen=True)
class Defaults:
    """The curator's defaults for what a plan leaves open."""

    bounds: Mapping[str, Bounds] = field(default_factory=dict)
    max_partitions: int = 1
    max_rows_per_partition: int = 1
    bounding: str = "rescale"


def _match_column(name: str, columns: Mapping[str, str], what: str) -> str:
    if name in columns:
        return name
    folded = [c for c in columns if c.lower() == name.lower()]
    if len(folded) == 1:
        return folded[0]
    raise UnknownColumnError(f"{what} names the column {name!r}, which the table does not "
                             f"have; its columns are {list(columns)}")


def _resolve_expression(text: str, columns: Mapping[str, str], what: str) -> str:
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    try:
        node = sqlglot.parse_one(text, dialect=ex.DIALECT)
    except SqlglotError:  # sqlglot wrote text it cannot read back
        raise UnsupportedQueryError(f"{what} could not be compiled (sqlglot cannot read back "
                                    "its canonical form); write it more simply") from None

    def fix(sub: exp.Expression) -> exp.Expression:
        if isinstance(sub, exp.Column):
            return exp.column(_match_column(sub.name, columns, what))
        return sub

    return ex.canonical(node.transform(fix))


def resolve_plan(plan: Plan, columns: Mapping[str, str], defaults: Defaults,
                 privacy_unit: str | None) -> Plan:
    """Fill defaults and check the plan against the schema (column names and types)."""
    from dpcurator.engines import column_kind

    aggregates: list[Aggregate] = []
    for agg in plan.aggregates:
        if isinstance(agg, CountUnits) and privacy_unit is None:
            raise QueryError("COUNT(DISTINCT unit) needs a privacy unit; this curator treats "
                             "each row as its own unit")
        if isinstance(agg, Count | CountUnits):
            aggregates.append(agg)
            continue
        column = _match_column(agg.column, columns, f"aggregate {agg.name!r}")
        if column_kind(columns[column]) not in ("numeric", "boolean"):
            raise QueryError(f"aggregate {agg.name!r} needs a numeric column, but {column!r} "
                             f"has type {columns[column]}")
        bounds = agg.bounds or defaults.bounds.get(column)
        if bounds is None:
            raise BoundsError(
                f"{type(agg).__name__.upper()} over {column!r} needs clamping bounds: pass "
                f"bounds={{'{column}': (lo, hi)}} with values chosen without looking at the "
                "data (the noise is calibrated to them)")
        if isinstance(agg, Quantile):
            aggregates.append(Quantile(column, bounds, agg.name, q=agg.q))
        elif isinstance(agg, Variance):
            aggregates.append(Variance(column, bounds, agg.name, std=agg.std))
        else:
            aggregates.append(type(agg)(column, bounds, agg.name))
    group = tuple(GroupKey(k.name, _resolve_expression(k.expression, columns,
                                                        f"group key {k.name!r}"), k.labels)
                  for k in plan.group_by)
    where = (_resolve_expression(plan.where, columns, "WHERE")
             if plan.where is not None else None)
    keys = plan.keys if plan.keys is not None else plan.public_labels
    return plan.replace(
        aggregates=tuple(aggregates), group_by=group, where=where, keys=keys,
        max_partitions=plan.max_partitions or defaults.max_partitions,
        max_rows_per_partition=plan.max_rows_per_partition or defaults.max_rows_per_partition,
        bounding=plan.bounding or defaults.bounding,
    )


# -- noisy measures -------------------------------------------------------------------------


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

    A quantile has no engine measures: its ``tree`` is released from the engine's histogram.
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


@dataclass
class CompiledQuery:
    """Everything needed to run one query, built before anything is charged or read."""

    plan: Plan
    request: PrivacyRequest
    bounded: BoundedQuery
    estimators: list[Estimator]
    selection: PartitionSelection | None
    cost: PureDP | ApproxDP | ZCDP
    pure_epsilons: list[float]
    rhos: list[float]


def _unit_bound(kind: str, budget: float, k: int, multiplier: int) -> tuple[int, float]:
    """The integer bound M of one row's (or pair's) value, and the budget actually used.

    Laplace: M = floor(T eps / (k m)) so that the L1 sensitivity k m M divided by the epsilon
    used, k m M / T (exact in double), is exactly T = 2^40: every Laplace measure of every
    query then draws from one discrete Laplace of scale 2^40, whose sampling tables are built
    once per process. Flooring M spends at most a 2^-20 fraction less than the share.
    Gaussian: M = floor(2^40 sqrt(2 rho) / (sqrt(k) m)), so that sigma is about 2^40.
    """
    if kind == "laplace":
        exact = Fraction(budget) / (k * multiplier)
        scale = CANONICAL_SCALE
        while exact * scale * (k * multiplier) >= 2**52:  # keep k m M exact in a double
            scale //= 2
        if scale < 1:
            raise UserError(f"epsilon {budget:g} is too large: this query's noise cannot be "
                            f"calibrated above epsilon = {2**51 * k * multiplier:.3g} (its "
                            "answer would be exact, no longer private)")
        bound = math.floor(exact * scale)
        if bound < MIN_RESOLUTION:
            raise UserError("epsilon is too small for this query's contribution bounds; "
                            "raise epsilon or lower max_partitions / max_rows_per_partition")
        used = k * multiplier * bound / scale  # exact: an integer < 2^52 over a power of two
        if Fraction(used) > Fraction(budget):
            raise InternalError("canonical calibration overspent; this is a bug")
        return bound, used
    bound = math.floor(CANONICAL_SCALE * math.sqrt(2 * budget) / (math.sqrt(k) * multiplier))
    bound = min(bound, 2**50 // multiplier)
    if bound < MIN_RESOLUTION:
        raise UserError("rho is too small for this query's contribution bounds; raise it")
    return bound, budget


def _value_scale(worst: float, bound: int) -> float:
    """The largest scale s with ceil(worst * s) <= bound (computed as the engine will)."""
    scale = bound / worst
    while math.ceil(worst * scale) > bound:
        scale = math.nextafter(scale, 0.0)
    return scale


def _new_mechanism(kind: str, budget: float, measure: MeasureSpec, bq: BoundedQuery,
                   source: RandomSource | None) -> DiscreteLaplace | DiscreteGaussian:
    if kind == "laplace":
        return DiscreteLaplace(epsilon=budget, sensitivity=bq.l1_sensitivity(measure),
                               source=source)
    return DiscreteGaussian(rho=budget, sensitivity=bq.l2_sensitivity(measure), source=source)


def _measures_for(agg: Aggregate, index: int, kind: str, budget: float, k: int,
                  r: int) -> list[tuple[MeasureSpec, float]]:
    """The measures of one aggregate and the budget each uses (its share, or a bit less)."""
    if isinstance(agg, Count | CountUnits):
        multiplier = r if isinstance(agg, Count) else 1
        weight, used = _unit_bound(kind, budget, k, multiplier)
        kind_name: MeasureKind = "rows" if isinstance(agg, Count) else "units"
        return [(MeasureSpec(f"a{index}_{kind_name}", kind_name, None, weight), used)]
    assert agg.bounds is not None and agg.column is not None
    bounds = agg.bounds
    center = 0.0 if isinstance(agg, Sum) else bounds.midpoint
    parts: list[MeasureKind] = (["values"] if isinstance(agg, Sum) else
                                ["present", "values"] if isinstance(agg, Mean) else
                                ["present", "values", "squares"])
    shares = _privacy.split(budget, [1.0] * len(parts))
    out: list[tuple[MeasureSpec, float]] = []
    centred = max(abs(bounds.lo - center), abs(bounds.hi - center))
    for j, (part, share) in enumerate(zip(parts, shares, strict=True)):
        bound, used = _unit_bound(kind, share, k, r)
        name = f"a{index}_{j}_{part}"
        if part == "present":
            value = ValueSpec(agg.column, bounds.lo, bounds.hi, center, 1.0)
            out.append((MeasureSpec(name, part, value, bound), used))
            continue
        square = part == "squares"
        worst = centred * centred if square else centred
        value = ValueSpec(agg.column, bounds.lo, bounds.hi, center,
                          _value_scale(worst, bound), square=square)
        out.append((MeasureSpec(name, part, value), used))
    return out


def compile_query(plan: Plan, request: PrivacyRequest, *, privacy_unit: str | None,
                  postprocess: bool, source: RandomSource | None) -> CompiledQuery:
    """Split the budget, pick grids and sensitivities, build mechanisms (plan is resolved)."""
    assert plan.max_partitions is not None and plan.max_rows_per_partition is not None
    private = plan.private_keys
    names = [a.name for a in plan.aggregates]
    allocation = _privacy.allocate(request, names, private)
    has_quantile = any(isinstance(a, Quantile) for a in plan.aggregates)
    mode = "sample" if has_quantile else (plan.bounding or "rescale")
    if privacy_unit is None:
        rows_mode = partitions_mode = "none"
    else:
        rows_mode = mode
        if not plan.group_by:
            partitions_mode = "none"
        elif private or mode == "sample":
            partitions_mode = "sample"
        else:
            partitions_mode = "rescale"
    shell = BoundedQuery(
        unit=privacy_unit, group_keys=plan.group_by, where=plan.where, keys=plan.keys,
        max_partitions=plan.max_partitions, max_rows_per_partition=plan.max_rows_per_partition,
        rows_mode=rows_mode, partitions_mode=partitions_mode,  # type: ignore[arg-type]
        measures=(), selection_units=private)
    k, r = shell.partitions_cap, shell.rows_cap
    kind = request.kind

    per_aggregate: list[tuple[Aggregate, list[tuple[MeasureSpec, float]], float]] = []
    histograms: list[HistogramSpec] = []
    hist_for: dict[int, HistogramSpec] = {}
    for index, agg in enumerate(plan.aggregates):
        budget = allocation.pure[agg.name] if kind == "laplace" else allocation.rho[agg.name]
        if isinstance(agg, Quantile):
            assert agg.bounds is not None and agg.column is not None
            hist_for[index] = HistogramSpec(f"h{index}", agg.column, agg.bounds.lo,
                                            agg.bounds.hi, BINS)
            histograms.append(hist_for[index])
            per_aggregate.append((agg, [], budget))
        else:
            per_aggregate.append((agg, _measures_for(agg, index, kind, budget, k, r), budget))

    measure_list = [m for _, measures, _ in per_aggregate for m, _ in measures]
    bounded = BoundedQuery(
        unit=shell.unit, group_keys=shell.group_keys, where=shell.where, keys=shell.keys,
        max_partitions=shell.max_partitions, max_rows_per_partition=shell.max_rows_per_partition,
        rows_mode=shell.rows_mode, partitions_mode=shell.partitions_mode,
        measures=tuple(measure_list), histograms=tuple(histograms), selection_units=private)

    estimators: list[Estimator] = []
    pure_epsilons: list[float] = []
    rhos: list[float] = []
    for index, (agg, measures, budget) in enumerate(per_aggregate):
        mechanisms: list[DiscreteLaplace | DiscreteGaussian]
        if isinstance(agg, Quantile):
            # The whole share pays for the tree of every partition (sensitivity over all k).
            tree = QuantileTree.build(agg, hist_for[index], kind, budget, k, r, source)
            estimators.append(Estimator(agg, [], postprocess, tree))
            mechanisms = [tree.mechanism]
        else:
            noisy = [NoisyMeasure(spec, _new_mechanism(kind, used, spec, bounded, source),
                                  _unit_of(spec)) for spec, used in measures]
            estimators.append(Estimator(agg, noisy, postprocess))
            mechanisms = [m.mechanism for m in noisy]
        for mechanism in mechanisms:
            g = mechanism.guarantee
            if isinstance(g, PureDP):
                pure_epsilons.append(g.epsilon)
            elif isinstance(g, ZCDP):
                rhos.append(g.rho)
            else:
                raise InternalError("a curator mechanism is neither pure nor zCDP; this is a bug")

    selection = None
    if allocation.selection is not None:
        sel_eps, sel_delta = allocation.selection
        selection = choose_partition_selection(epsilon=sel_eps, delta=sel_delta,
                                               max_partitions=k, source=source)
        pure_epsilons.append(sel_eps)
    _check_composition(allocation, pure_epsilons, rhos, request)
    return CompiledQuery(plan, request, bounded, estimators, selection, allocation.cost,
                         pure_epsilons, rhos)


def _unit_of(spec: MeasureSpec) -> Fraction:
    """The real value of one integer unit of the measure."""
    if spec.kind in ("values", "squares"):
        assert spec.value is not None
        return 1 / Fraction(spec.value.scale)
    return Fraction(1, spec.weight)


def _check_composition(allocation: _privacy.Allocation, pure: list[float], rhos: list[float],
                       request: PrivacyRequest) -> None:
    """The mechanisms' guarantees compose to at most the request (exactly), or it is a bug."""
    if request.kind == "gaussian":
        spent = sum(Fraction(r) for r in rhos)
        if spent > sum(Fraction(v) for v in allocation.rho.values()):
            raise InternalError("the mechanisms' rho exceed the allocation; this is a bug")
        if request.epsilon is not None and sum(Fraction(e) for e in pure) > Fraction(
                request.epsilon):
            raise InternalError("the selection's epsilon exceeds the request; this is a bug")
        return
    assert request.epsilon is not None
    if sum(Fraction(e) for e in pure) > Fraction(request.epsilon):
        raise InternalError("the mechanisms' epsilons exceed the request; this is a bug")
