"""From a plan and a privacy request to a bounded query, its mechanisms and its estimators.

Small pure passes, in order:

- ``resolve_plan``: fill the curator's defaults (bounds, contribution caps, bounding mode),
  check every column against the schema; Plan -> Plan.
- ``compile_query``: split the privacy request, choose each measure's fixed-point grid from
  its noise scale, derive integer sensitivities, and build the mechanisms and the events they
  will run (what the query is charged: see ``_cost``); nothing is read.

Estimators (one per aggregate, ``_estimators``) turn noisy measures into released values and
intervals; a quantile's estimator reads a ``QuantileTree`` (see ``_quantiles``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from dpcurator.accounting import ZCDP, ApproxDP, PureDP
from dpcurator.accounting.events import ComposedEvent, DpEvent
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
from ._cost import check_within, stated_event
from ._estimators import Estimator, NoisyMeasure
from ._privacy import PrivacyRequest
from ._quantiles import BINS, QuantileTree

__all__ = ["CompiledQuery", "Defaults", "compile_query", "resolve_plan"]

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


@dataclass
class CompiledQuery:
    """Everything needed to run one query, built before anything is charged or read.

    ``events`` is what it will run, in order, each part at its mechanism's guarantee: the
    partition selection (private keys only), then every aggregate's mechanisms (its measures',
    or its quantile tree's); ``cost`` is the guarantee the query states (its request), which
    the events compose within. ``_cost.query_cost`` prices them in a budget's currency.
    """

    plan: Plan
    request: PrivacyRequest
    bounded: BoundedQuery
    estimators: list[Estimator]
    selection: PartitionSelection | None
    cost: PureDP | ApproxDP | ZCDP
    events: tuple[DpEvent, ...]

    @property
    def event(self) -> ComposedEvent:
        """The query's events, composed (run one after another on the same data)."""
        return ComposedEvent(self.events)


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
    events: list[DpEvent] = []
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
        events.extend(stated_event(m.guarantee) for m in mechanisms)

    selection = None
    if allocation.selection is not None:
        sel_eps, sel_delta = allocation.selection
        selection = choose_partition_selection(epsilon=sel_eps, delta=sel_delta,
                                               max_partitions=k, source=source)
        events.insert(0, stated_event(selection.guarantee))  # it runs first
    query = CompiledQuery(plan, request, bounded, estimators, selection, allocation.cost,
                          tuple(events))
    # The events compose within the request, exactly (the shares were rounded down).
    check_within(query.event, epsilon=request.epsilon, delta=request.delta,
                 rho=sum((Fraction(v) for v in allocation.rho.values()), Fraction(0)))
    return query


def _unit_of(spec: MeasureSpec) -> Fraction:
    """The real value of one integer unit of the measure."""
    if spec.kind in ("values", "squares"):
        assert spec.value is not None
        return 1 / Fraction(spec.value.scale)
    return Fraction(1, spec.weight)
