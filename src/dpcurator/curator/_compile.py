"""From a plan and a privacy request to a bounded query, its mechanisms and its estimators.

Small pure passes, in order:

- ``resolve_plan`` (``_resolve``): fill the curator's defaults (bounds, contribution caps,
  bounding mode), check every column against the schema; Plan -> Plan.
- ``compile_query``: split the privacy request, choose each measure's fixed-point grid from
  its noise scale, derive integer sensitivities, and build the mechanisms and the events they
  will run (what the query is charged: see ``_cost``); choose how private keys are selected
  (thresholding a noisy count, or a separate step); nothing is read.

Counts of rows, units and present values get weight 1 (exact integer noise on the integer
count) whenever the bounded counts are integers (``_integer_counts``); sums, and counts under
partition rescaling, keep a fine fixed-point grid.

Estimators (one per aggregate, ``_estimators``) turn noisy measures into released values and
intervals; a quantile's estimator reads a ``QuantileTree`` (see ``_quantiles``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import partial
from typing import Any

from dpcurator.accounting import ZCDP, ApproxDP, PureDP
from dpcurator.accounting.events import ComposedEvent, DpEvent
from dpcurator.errors import InternalError, UserError
from dpcurator.mechanisms import DiscreteGaussian, DiscreteLaplace
from dpcurator.mechanisms.partition_selection import (
    CountThreshold,
    PartitionSelection,
    choose_partition_selection,
    per_partition_delta,
)
from dpcurator.noise import RandomSource
from dpcurator.query.bounding import (
    BoundedQuery,
    HistogramSpec,
    MeasureKind,
    MeasureSpec,
    ValueSpec,
)
from dpcurator.query.plan import (
    Aggregate,
    Count,
    CountUnits,
    Mean,
    Plan,
    Quantile,
    Sum,
)

from . import _privacy, _total
from ._auto_plan import AutoPlan, outer_names, plan_auto, plan_retry
from ._candidates import Candidates, prove_candidates
from ._cost import check_within, stated_event, within_charge
from ._estimators import Estimator, NoisyMeasure
from ._grid import unit_bound as _unit_bound
from ._grid import value_scale as _value_scale
from ._privacy import PrivacyRequest
from ._quantiles import QuantileTree, histogram_for

__all__ = ["CompiledQuery", "compile_query"]



@dataclass(frozen=True)
class CompiledQuery:
    """Everything needed to run one query, built before anything is charged or read.

    ``events`` is what it will run, in order, each part at its mechanism's guarantee: the
    partition selection (private keys only: a separate selection's (epsilon, delta), or the
    delta of thresholding a noisy count), then every aggregate's mechanisms (its measures', or
    its quantile tree's); ``cost`` is the guarantee the query states (its request), which the
    events compose within. ``_cost.query_cost`` prices them in a budget's currency.

    ``selection`` is how private keys are selected (None otherwise): a ``PartitionSelection``
    reading each partition's number of units, or a ``CountThreshold`` on the noisy measure
    ``threshold_measure`` (the name of one of the engine's measures).
    """

    plan: Plan
    request: PrivacyRequest
    bounded: BoundedQuery
    estimators: tuple[Estimator, ...]
    selection: PartitionSelection | CountThreshold | None
    cost: PureDP | ApproxDP | ZCDP
    events: tuple[DpEvent, ...]
    threshold_measure: str | None = None
    auto: AutoPlan | None = None  # bounds still to choose: compiled with placeholders
    candidates: Candidates | None = None  # the bounds it may choose, proven to compile
    # where the thin-data rule would use the widest clamps, the choice made again
    # (``_auto_plan.plan_retry``) and its candidates, proven too; None where it cannot be
    retry: AutoPlan | None = None
    retry_candidates: Candidates | None = None

    @property
    def event(self) -> ComposedEvent:
        """The query's events, composed (run one after another on the same data)."""
        return ComposedEvent(self.events)


def _new_mechanism(kind: str, budget: float, measure: MeasureSpec, bq: BoundedQuery,
                   source: RandomSource | None) -> DiscreteLaplace | DiscreteGaussian:
    if kind == "laplace":
        return DiscreteLaplace(epsilon=budget, sensitivity=bq.l1_sensitivity(measure),
                               source=source)
    return DiscreteGaussian(rho=budget, sensitivity=bq.l2_sensitivity(measure), source=source)


def _integer_counts(kind: str, k: int, integer: bool) -> bool:
    """Whether counts get weight 1 (integer noise on the integer count itself): the counts
    must be integers (no partition rescaling, whose k / m weights are fractions), and, for
    Gaussian noise, the integer L2 sensitivity sqrt(k) m exact (k a perfect square); else the
    count keeps a fine fixed-point weight, whose rounding of sqrt(k) m is negligible."""
    return integer and (kind == "laplace" or math.isqrt(k) ** 2 == k)


def _count_unit(kind: str, budget: float, k: int, multiplier: int,
                integer: bool) -> tuple[int, float]:
    """A count's weight (integer units per row or unit) and the budget it uses."""
    if _integer_counts(kind, k, integer):
        if kind == "laplace" and budget >= 2.0**52:  # the fixed-point grid's limit, kept
            raise UserError(f"epsilon {budget:g} is too large: this query's noise cannot be "
                            f"calibrated above epsilon = {2.0**52:.3g} (its answer would be "
                            "exact, no longer private)")
        return 1, budget  # the whole share: discrete noise of scale k m / epsilon on the count
    return _unit_bound(kind, budget, k, multiplier)


def _unit_measure(agg: Aggregate, index: int, kind: str, budget: float, plan: Plan
                  ) -> tuple[MeasureSpec, float]:
    """The measure of a COUNT(*) or SUM under ``bounding="unit"`` and the budget it uses: the
    unit's rows weighed by min(1, M / T) (integer: noise of scale M / epsilon on the count
    itself), or its sum of |value| within V (``dpcurator.query.bounding``, ``unit_rows`` and
    ``unit_values``)."""
    # a cap still to choose is compiled with a placeholder of 1: the cost does not depend on it
    if isinstance(agg, Count):
        weight, used = _count_unit(kind, budget, 1, 1, True)
        assert weight == 1
        return MeasureSpec(f"a{index}_unit_rows", "unit_rows", None, 1,
                           plan.max_unit_rows or 1), used
    assert isinstance(agg, Sum) and agg.column is not None
    outer = dict(plan.max_unit_sums).get(agg.column, 1.0)
    bound, used = _unit_bound(kind, budget, 1, 1)
    value = ValueSpec(agg.column, -outer, outer, 0.0, _value_scale(outer, bound))
    return MeasureSpec(f"a{index}_unit_values", "unit_values", value, 1, value.bound), used


def _measures_for(agg: Aggregate, index: int, kind: str, budget: float, k: int,
                  r: int, integer: bool, plan: Plan | None = None
                  ) -> list[tuple[MeasureSpec, float]]:
    """The measures of one aggregate and the budget each uses (its share, or a bit less).

    ``integer``: the bounded counts are integers (no partition rescaling), so counts of rows,
    units and present values can get integer noise (``_integer_counts``). A ``plan`` with
    ``bounding="unit"`` measures under its caps on each unit's total (``_unit_measure``)."""
    if plan is not None and plan.bounding == "unit":
        return [_unit_measure(agg, index, kind, budget, plan)]
    if isinstance(agg, Count | CountUnits):
        multiplier = r if isinstance(agg, Count) else 1
        weight, used = _count_unit(kind, budget, k, multiplier, integer)
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
        name = f"a{index}_{j}_{part}"
        if part == "present":
            bound, used = _count_unit(kind, share, k, r, integer)
            value = ValueSpec(agg.column, bounds.lo, bounds.hi, center, 1.0)
            out.append((MeasureSpec(name, part, value, bound), used))
            continue
        bound, used = _unit_bound(kind, share, k, r)
        square = part == "squares"
        worst = centred * centred if square else centred
        value = ValueSpec(agg.column, bounds.lo, bounds.hi, center,
                          _value_scale(worst, bound), square=square)
        out.append((MeasureSpec(name, part, value), used))
    return out


def compile_query(plan: Plan, request: PrivacyRequest, *, privacy_unit: str | None,
                  postprocess: bool, source: RandomSource | None,
                  total: float | None = None) -> CompiledQuery:
    """``_compile_query``, with a mechanism's refusal of its parameters (a noise scale it
    cannot draw with, a ValueError) reported as the query's: a ``UserError``, before any
    charge."""
    try:
        return _compile_query(plan, request, privacy_unit=privacy_unit,
                              postprocess=postprocess, source=source, total=total)
    except UserError:
        raise
    except (ValueError, OverflowError) as exc:
        raise UserError(f"this query's noise cannot be calibrated: {exc}; raise epsilon (or "
                        "rho), or lower its contribution bounds") from None


def _compile_query(plan: Plan, request: PrivacyRequest, *, privacy_unit: str | None,
                   postprocess: bool, source: RandomSource | None,
                   total: float | None = None) -> CompiledQuery:
    """The query compiled (``_compile_plain``); with bounds to choose (``plan.auto``), compiled
    with placeholder bounds and the rest of the request, its events preceded by the choices'
    (what it costs does not depend on the bounds chosen: ``_auto_bounds``).

    Measured total intervals (``_total``) first take their share of the request,
    ``_total.CHOICE_PART`` of it for choosing the outer caps the plan does not give; ``total``
    is what is left to measure them when the caller has already split the request (the
    bounds' second compile)."""
    whole = request
    outer = None
    if plan.intervals == "total" and privacy_unit is not None and total is None:
        request, total = _total.split(request, plan.total_share or _total.SHARE)
        if plan.auto is not None and (plan.auto.unit_rows or plan.auto.unit_sums):
            outer, total = _privacy.split(total, [_total.CHOICE_PART, 1 - _total.CHOICE_PART])
    if plan.auto is None:
        return _compile_plain(plan, request, privacy_unit=privacy_unit,
                              postprocess=postprocess, source=source, total=total, whole=whole)
    remaining = 1.0 - (plan.total_share or _total.SHARE) if whole is not request else 1.0
    auto, choices = plan_auto(plan, request, outer, remaining)
    auto = replace(auto, total=total)
    main = _compile_plain(plan, auto.request, privacy_unit=privacy_unit,
                          postprocess=postprocess, source=source, total=total,
                          whole=None)
    # every bound the choice can pick, compiled now: after the charge nothing can fail
    candidates = prove_candidates(plan, auto, partial(
        compile_query, request=auto.request, privacy_unit=privacy_unit,
        postprocess=postprocess, source=source, total=total), source)
    # the bounds' choices within their share, the outer caps' (the last) within their own
    outers = len(outer_names(auto.auto)) if outer is not None else 0
    parts = [(choices[:len(choices) - outers], auto.spent)]
    if outers:
        parts.append((choices[len(choices) - outers:], auto.outer))
    for events, allowed in parts:
        if whole.rho is not None:
            check_within(ComposedEvent(tuple(events)), epsilon=None, delta=0.0,
                         rho=Fraction(allowed))
        else:
            check_within(ComposedEvent(tuple(events)), epsilon=allowed, delta=0.0,
                         rho=Fraction(0))
    charged = (*choices, *main.events)
    retry = _prove_retry(plan, auto, remaining, choices, charged, request, partial(
        compile_query, privacy_unit=privacy_unit, postprocess=postprocess, source=source,
        total=total), source)
    return CompiledQuery(plan, whole, main.bounded, main.estimators, main.selection,
                         _whole_cost(whole, main.cost), charged, main.threshold_measure,
                         auto, candidates, *(retry or (None, None)))


def _prove_retry(plan: Plan, first: AutoPlan, remaining: float, choices: list[DpEvent],
                 charged: tuple[DpEvent, ...], allowed: PrivacyRequest,
                 compile_with: Callable[..., Any],
                 source: RandomSource | None) -> tuple[AutoPlan, Candidates] | None:
    """The choice made again where the thin-data rule would use the widest clamps
    (``_auto_plan.plan_retry``), its candidates proven to compile, before the charge;
    None where it does not apply or cannot be compiled (public numbers only).

    Privacy. The retry runs only after the first choices' outputs (the thin-data rule's
    noisy count) say so, and its answer then has less epsilon (or rho): the path is chosen
    adaptively, each mechanism's parameters fixed by what was released before it. Such a
    sequence is a privacy filter run inside the query (Rogers, Roth, Ullman and Vadhan 2016,
    Section 3, for basic composition of (epsilon, delta); Feldman and Zrnic 2021, Theorem
    3.1, for zCDP, at every Renyi order): it keeps the total that every path's parameters
    compose within. The query is charged its first path (``charged``); the retry's path (the
    first choices, the retry's and its answer) is checked here to compose within the same
    charge in both currencies a budget uses: its choices' and answer's epsilons (or rhos)
    within ``allowed`` (the request the first choices and answer split: the query's, less
    a total interval's part, which both paths spend alike), the same delta, and its price in
    rho no more than the first path's (``_cost.within_charge``). Where it does not, there is
    no retry and the widest clamps stay the rule."""
    planned = plan_retry(plan, first, remaining)
    if planned is None:
        return None
    retry, retry_choices = planned
    retry = replace(retry, total=first.total)
    try:
        candidates = prove_candidates(plan, retry, partial(compile_with,
                                                           request=retry.request), source)
    except (UserError, ValueError, OverflowError):  # as compile_query reports them
        return None
    # the answer's events (stated guarantees) are the same whatever the bounds chosen: any
    # proven candidate's
    answer = next(iter(candidates.frontier.values()))
    path = ComposedEvent((*choices, *retry_choices, *answer.events))
    if not within_charge(ComposedEvent((*choices, *retry_choices)), retry.request, path,
                         ComposedEvent(charged), allowed):
        return None
    return retry, candidates


def _whole_cost(whole: PrivacyRequest, part: PureDP | ApproxDP | ZCDP
                ) -> PureDP | ApproxDP | ZCDP:
    """What the whole request costs, given what its part for the aggregates costs: the same
    kind of guarantee (pure or approximate DP, or zCDP) at the whole request's parameters."""
    if whole.rho is not None:
        return ZCDP(whole.rho)
    assert whole.epsilon is not None
    return PureDP(whole.epsilon) if isinstance(part, PureDP) else \
        ApproxDP(whole.epsilon, whole.delta)


def _compile_plain(plan: Plan, request: PrivacyRequest, *, privacy_unit: str | None,
                   postprocess: bool, source: RandomSource | None, total: float | None = None,
                   whole: PrivacyRequest | None = None) -> CompiledQuery:
    """Split the budget, pick grids and sensitivities, build mechanisms (plan is resolved).

    Private keys are selected by thresholding the query's noisy count when it has one (a
    COUNT(DISTINCT unit), else a COUNT(*)), or by a separate selection step: whichever needs
    fewer units for a partition to be released with probability 1/2 (a choice made from the
    parameters alone, never the data). Weights naming ``"partition_selection"`` ask for the
    separate step explicitly.
    """
    assert plan.max_partitions is not None and plan.max_rows_per_partition is not None
    private = plan.private_keys
    names = [a.name for a in plan.aggregates]
    has_quantile = any(isinstance(a, Quantile) for a in plan.aggregates)
    mode = "sample" if has_quantile else (plan.bounding or "rescale")
    if privacy_unit is None:
        rows_mode = partitions_mode = "none"
    elif mode == "unit":  # every row of every pair, weighed by the unit's total (bounding)
        rows_mode = "rescale"
        # private keys: the noisy COUNT(*) selects them where there is one, among each unit's
        # first k partitions ("sample"); else a separate step counts the units there while
        # every pair is measured ("select")
        partitions_mode = "none" if not private else \
            "sample" if _threshold_candidate(plan, request) is not None else "select"
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
        measures=())
    allocation = _choose_allocation(plan, request, names, shell, source)
    query = _compile_with(plan, request, allocation, shell, postprocess, source)
    if total is not None:
        query = _with_total(query, total, source)
    if whole is not None and whole is not request:  # the request before the total's share
        query = replace(query, request=whole, cost=_whole_cost(whole, query.cost))
    return query


def _with_total(query: CompiledQuery, budget: float, source: RandomSource | None
                ) -> CompiledQuery:
    """The query with the outer-capped measures of total intervals (``_total``): one count,
    shared by its COUNT(*)s, and one sum per SUM column, each with an equal part of
    ``budget``, run last. Before the outer caps are chosen (the placeholder compile) any cap
    costs the same: the noise is calibrated to it."""
    plan = query.plan
    zcdp = query.request.rho is not None
    owners: list[str | None] = [None] if any(
        type(e.aggregate) is Count for e in query.estimators) else []
    owners += _total.sum_columns(plan)  # None: the COUNT(*)s; else a SUM's column
    given = dict(plan.max_unit_sums)
    noisy: dict[str | None, NoisyMeasure] = {}
    events = []
    for owner, part in zip(owners, _privacy.split(budget, [1.0] * len(owners)), strict=True):
        if owner is None:
            spec, mechanism = _total.measure(plan.max_unit_rows or 1, part, zcdp, source)
        else:
            grid = _unit_bound("gaussian" if zcdp else "laplace", part, 1, 1)
            spec, mechanism = _total.sum_measure(owner, given.get(owner, 1.0), grid, zcdp,
                                                 source)
        noisy[owner] = NoisyMeasure(spec, mechanism, _unit_of(spec))
        event = stated_event(mechanism.guarantee)
        check_within(ComposedEvent((event,)), epsilon=None if zcdp else part, delta=0.0,
                     rho=Fraction(part) if zcdp else Fraction(0))
        events.append(event)
    estimators = tuple(
        replace(e, total=noisy[None]) if type(e.aggregate) is Count else
        replace(e, total=noisy[e.aggregate.column]) if type(e.aggregate) is Sum else e
        for e in query.estimators)
    bounded = replace(query.bounded, measures=(
        *query.bounded.measures, *(m.spec for m in noisy.values())))
    return replace(query, bounded=bounded, estimators=estimators,
                   events=(*query.events, *events))


def _threshold_candidate(plan: Plan, request: PrivacyRequest) -> Aggregate | None:
    """The count whose noisy value could select private keys: COUNT(DISTINCT unit) first (its
    contribution is one per unit), else the first COUNT(*); none when weights ask for a
    separate selection."""
    names = [a.name for a in plan.aggregates]
    if not plan.private_keys or (_privacy.SELECTION in dict(request.weights)
                                 and _privacy.SELECTION not in names):
        return None
    if plan.bounding == "unit":  # its COUNT(*): a unit's weighed rows, at most M in all
        return next((a for a in plan.aggregates if type(a) is Count), None)
    for wanted in (CountUnits, Count):
        for agg in plan.aggregates:
            if isinstance(agg, wanted):
                return agg
    return None


def _count_threshold(agg: Aggregate, index: int, allocation: _privacy.Allocation,
                     kind: str, shell: BoundedQuery, source: RandomSource | None,
                     plan: Plan | None = None) -> tuple[MeasureSpec, CountThreshold]:
    """The thresholded count's measure and its ``CountThreshold`` under ``allocation``."""
    budget = allocation.pure[agg.name] if kind == "laplace" else allocation.rho[agg.name]
    k, r = shell.partitions_cap, shell.rows_cap
    integer = shell.partitions_mode != "rescale"
    ((spec, used),) = _measures_for(agg, index, kind, budget, k, r, integer, plan)
    assert allocation.threshold_delta is not None
    noise = _new_mechanism(kind, used, spec, shell, source)
    # under caps on each unit's total a unit's weighed rows are non-negative and sum to at
    # most M over its partitions: both norms are at most M (``CountThreshold``'s total)
    total = shell.l1_sensitivity(spec) if spec.kind == "unit_rows" else None
    return spec, CountThreshold(noise=noise, contribution=shell.per_partition_bound(spec),
                                delta=allocation.threshold_delta, max_partitions=k,
                                unit_weight=spec.weight, total=total, source=source)


def _choose_allocation(plan: Plan, request: PrivacyRequest, names: list[str],
                       shell: BoundedQuery, source: RandomSource | None
                       ) -> _privacy.Allocation:
    """The request's split, with the better way of selecting private keys (compile_query)."""
    private = plan.private_keys
    candidate = _threshold_candidate(plan, request)
    separate = _privacy.allocate(request, names, private)
    if candidate is None:
        return separate
    by_threshold = _privacy.allocate(request, names, private, threshold=candidate.name)
    assert by_threshold.threshold_delta is not None
    if per_partition_delta(by_threshold.threshold_delta, shell.partitions_cap) >= 0.5:
        return separate  # delta of 1/2 or more per partition (allow_large_delta): no tail
    if plan.bounding == "unit":
        # the caps on each unit's total are not known here (chosen from the data, or given
        # per query): the count selects wherever there is one (``_threshold_candidate``), its
        # noise of scale M / epsilon on every partition instead of a separate step's share
        return by_threshold
    index = list(plan.aggregates).index(candidate)
    _, threshold = _count_threshold(candidate, index, by_threshold, request.kind, shell, source,
                                    plan)
    assert separate.selection is not None
    sel_eps, sel_delta = separate.selection
    other = choose_partition_selection(epsilon=sel_eps, delta=sel_delta,
                                       max_partitions=shell.partitions_cap, source=source)
    return by_threshold if threshold.units_for_half() <= other.units_for_half() else separate


def _compile_with(plan: Plan, request: PrivacyRequest, allocation: _privacy.Allocation,
                  shell: BoundedQuery, postprocess: bool, source: RandomSource | None
                  ) -> CompiledQuery:
    """Grids, sensitivities, mechanisms and events for one allocation of the request."""
    private = plan.private_keys
    k, r = shell.partitions_cap, shell.rows_cap
    kind = request.kind
    integer = shell.partitions_mode != "rescale"

    per_aggregate: list[tuple[Aggregate, list[tuple[MeasureSpec, float]], float]] = []
    histograms: list[HistogramSpec] = []
    hist_for: dict[int, HistogramSpec] = {}
    for index, agg in enumerate(plan.aggregates):
        budget = allocation.pure[agg.name] if kind == "laplace" else allocation.rho[agg.name]
        if isinstance(agg, Quantile):
            assert agg.bounds is not None and agg.column is not None
            hist_for[index] = histogram_for(agg, f"h{index}")
            histograms.append(hist_for[index])
            per_aggregate.append((agg, [], budget))
        else:
            per_aggregate.append((agg, _measures_for(agg, index, kind, budget, k, r, integer,
                                                     plan), budget))

    measure_list = [m for _, measures, _ in per_aggregate for m, _ in measures]
    bounded = BoundedQuery(
        unit=shell.unit, group_keys=shell.group_keys, where=shell.where, keys=shell.keys,
        max_partitions=shell.max_partitions, max_rows_per_partition=shell.max_rows_per_partition,
        rows_mode=shell.rows_mode, partitions_mode=shell.partitions_mode,
        measures=tuple(measure_list), histograms=tuple(histograms),
        selection_units=allocation.selection is not None)

    selection: PartitionSelection | CountThreshold | None = None
    threshold_measure = None
    if allocation.threshold is not None:
        position = [a.name for a in plan.aggregates].index(allocation.threshold)
        spec, selection = _count_threshold(plan.aggregates[position], position, allocation,
                                           kind, bounded, source, plan)
        threshold_measure = spec.name

    estimators: list[Estimator] = []
    events: list[DpEvent] = []
    for index, (agg, measures, budget) in enumerate(per_aggregate):
        mechanisms: list[DiscreteLaplace | DiscreteGaussian]
        if isinstance(agg, Quantile):
            # The whole share pays for the tree of every partition (sensitivity over all k).
            tree = QuantileTree.build(agg, hist_for[index], kind, budget, k, r, source)
            estimators.append(Estimator(agg, (), postprocess, tree))
            mechanisms = [tree.mechanism]
        else:
            noisy = []
            for spec, used in measures:
                if spec.name == threshold_measure:
                    assert isinstance(selection, CountThreshold)
                    # The selection's own noise answers the count: one draw, used twice.
                    noisy.append(NoisyMeasure(spec, selection.noise, _unit_of(spec),
                                              selection.threshold))
                else:
                    noisy.append(NoisyMeasure(spec, _new_mechanism(kind, used, spec, bounded,
                                                                   source), _unit_of(spec)))
            estimators.append(Estimator(agg, tuple(noisy), postprocess))
            mechanisms = [m.mechanism for m in noisy]
        events.extend(stated_event(m.guarantee) for m in mechanisms)

    if allocation.selection is not None:
        sel_eps, sel_delta = allocation.selection
        selection = choose_partition_selection(epsilon=sel_eps, delta=sel_delta,
                                               max_partitions=k, source=source)
        events.insert(0, stated_event(selection.guarantee))  # it runs first
    elif isinstance(selection, CountThreshold):
        events.insert(0, selection.events[0])  # its delta; its noise is the count's event
    if private and selection is None:
        raise InternalError("private keys without a selection; this is a bug")
    query = CompiledQuery(plan, request, bounded, tuple(estimators), selection, allocation.cost,
                          tuple(events), threshold_measure)
    # The events compose within the request, exactly (the shares were rounded down).
    check_within(query.event, epsilon=request.epsilon, delta=request.delta,
                 rho=sum((Fraction(v) for v in allocation.rho.values()), Fraction(0)))
    return query


def _unit_of(spec: MeasureSpec) -> Fraction:
    """The real value of one integer unit of the measure."""
    if spec.kind in ("values", "squares", "unit_values"):
        assert spec.value is not None
        return 1 / Fraction(spec.value.scale)
    return Fraction(1, spec.weight)
