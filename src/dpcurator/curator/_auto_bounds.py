"""Contribution bounds chosen from the data under DP (``bounds="auto"``).

A query that gives no ``max_partitions``, ``max_rows_per_partition`` or clamping bounds for a
column can have them chosen from the data, spending a stated share of its budget (10% by
default, ``AutoBounds.spent_share``); the rest answers the query with the chosen bounds. The
release states the bounds chosen and what choosing them cost.

This module makes the choices in order (``choose_bounds``); each has its own module:

- the plan: which choices a query makes, their weights in the budget and the retry's
  (``_auto_plan``);
- the row cap's aims, drawn first: a sum's or a mean's histogram of the cut rows' values and
  the row cap's tail (``_auto_aims``);
- the joint choice of the caps and the first column's magnitude, and the penalties every
  choice scores with (``_auto_joint``);
- each further column's magnitude, then each column's signs, a mean's floor or ends
  (``_auto_ends``);
- the thin-data counts and the kept count, which set a choice aside for the widest bounds or
  a retry (``_auto_thin``);
- ``bounding="unit"``'s caps on each unit's total, and a total interval's outer caps
  (``_auto_units``).

Cost: each choice is epsilon-DP (``PureDP``) under add/remove one unit; with a rho request it
is charged as epsilon^2 / 2-zCDP (Bun and Steinke 2016, Proposition 1.4). The choices and
the query compose (basic composition for (epsilon, delta), adding rhos for zCDP).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dpcurator.errors import InternalError
from dpcurator.noise import RandomSource
from dpcurator.query.plan import (
    MAX_BOUND,
    Bounds,
    Plan,
)

from ._auto_aims import Aim, aimed_at, draw_aim, tail_said
from ._auto_ends import (
    FLOOR_STEPS,
    SIGNS,
    choose_end,
    choose_floor,
    end_gate,
    floor_gate,
    sign_scores,
    sign_side,
)
from ._auto_joint import (
    CAP,
    MAGNITUDE_BEYOND,
    MAGNITUDE_LAMBDA,
    choose_joint,
    magnitude_cap,
    ramp_penalties,
    release_index,
)
from ._auto_plan import (
    KEPT,
    MAGNITUDES,
    OUTER,
    TAIL,
    UNITS,
    VALUES,
    AutoPlan,
    values_choice,
    with_bounds,
)
from ._auto_thin import (
    THIN_WARN,
    caps_statistic,
    caps_thin_rule,
    kept_check,
    thin_rule,
    widest_caps,
)
from ._auto_units import with_outer
from ._profile import Profile

__all__ = ["choose_bounds", "chosen_again"]



def choose_bounds(auto_plan: AutoPlan, plan: Plan,
                  profile: Sequence[tuple[Any, ...]] | Profile,
                  columns: Sequence[str], source: RandomSource | None,
                  rows_for: Sequence[tuple[int, int]] | None = None, *,
                  defer_unit_caps: bool = False, again: bool = False,
                  aim: Aim | None = None) -> tuple[Plan, dict[str, Any]]:
    """The plan with its bounds chosen from ``profile`` (the engine's rows for a
    ``BoundedQuery.profile`` of ``columns``, or their ``Profile``), and what the release says
    about them; the caps among those ``rows_for`` allows (``choose_joint``).
    ``defer_unit_caps`` (``defers_unit_caps``): ``bounding="unit"``'s caps are left at the
    widest (``widest_unit_caps``), to be chosen once the keys are selected
    (``choose_unit_caps``). ``again``: the choice made again (``plan_retry``;
    ``caps_thin_rule``). ``aim``: the row cap's factors (``draw_aim``), drawn here where not
    given and the plan pays for them; the retry reads the first choice's."""
    auto = auto_plan.auto
    stats = profile if isinstance(profile, Profile) else Profile(profile)
    eps = auto_plan.epsilons
    chosen: dict[str, Any] = {}
    if auto.choices == 0:
        return with_outer(auto_plan, plan.replace(auto=None), chosen, stats, source,
                          defer_unit_caps)
    if aim is None:  # the row cap's factor per magnitude, from its own noisy histogram
        aim = draw_aim(auto_plan, stats, source)
    if aim is None and values_choice(plan):
        raise InternalError("a row cap aimed by a histogram that was not drawn; this is a bug")
    factors = aim.factors if aim is not None else None
    tail = aim.tail if aim is not None else None
    k, r, first = choose_joint(auto_plan, plan, stats, source, rows_for, factors, tail=tail)
    if aim is not None and values_choice(plan):
        chosen["value_factors"] = aimed_at(auto_plan, factors, first, r)
    if TAIL in eps or (aim is not None and tail is not None):
        chosen["row_tail"] = tail_said(tail, r)
    # the signs: [0, M] costs the negative values, [-M, 0] the positive ones, [-M, M] a
    # fixed price (twice the width: twice the noise of a mean); adding a unit lowers or keeps
    # every score (monotonic). Drawn first: the thin-data count reads the sign kept
    signs = [SIGNS[release_index(*sign_scores(auto_plan, stats, index, column), source,
                                 monotonic=True)] for index, column in enumerate(columns)]
    # the least over the clamped columns (each moves by at most 1, so does their least): the
    # first alone let a sparse second column's clamp collapse unseen (a bug hunt found it in
    # the caps on each unit's total: ``unit_thin``)
    thin = thin_rule(auto_plan, plan,
                     min(stats.nonzero(i, magnitude_cap(r), sign_side(signs[i]))
                         for i in range(len(columns))), source, rows_for, k) if columns else None
    if not columns and UNITS in eps:  # the caps alone: a count of units checks them
        thin = caps_thin_rule(auto_plan, plan,
                              caps_statistic(auto_plan, stats, (k, r) if again else None),
                              source, rows_for, k, again)
        if thin[0] == "widest":  # post-processing of the count: the stated rule
            k, r = widest_caps(plan, rows_for)
    if auto.max_partitions:
        chosen["max_partitions"] = k
    if auto.max_rows_per_partition:
        chosen["max_rows_per_partition"] = r
    bounds: dict[str, Bounds] = {}
    top: list[str] = []  # the columns whose chosen magnitude is the largest candidate
    raised: list[str] = []  # the columns whose clamp got a floor, or an end brought in
    rate = auto_plan.target(k, per_partition=False)
    indexes: list[int] = []  # each column's magnitude chosen (``kept_check``)
    for index, column in enumerate(columns):
        if index == 0:
            assert first is not None
            chosen_index = first
        else:
            choice = f"magnitude:{column}"
            cap = CAP * auto_plan.floor(choice, len(MAGNITUDES))
            penalties = ramp_penalties(stats.magnitudes(index, magnitude_cap(r)),
                                       MAGNITUDES,
                                       [rate] * len(MAGNITUDES), cap, eps[choice],
                                       MAGNITUDE_LAMBDA, beyond=MAGNITUDE_BEYOND)
            chosen_index = release_index(-penalties, eps[choice], source)
        indexes.append(chosen_index)
        magnitude = MAGNITUDES[chosen_index]
        lo, hi = signs[index][0] * magnitude, signs[index][1] * magnitude
        if thin is not None and thin[0] == "widest":  # post-processing: the stated rule
            lo, hi = -MAGNITUDES[-1], MAGNITUDES[-1]
        elif f"floor:{column}" in eps and lo * hi == 0.0 and thin is not None and \
                thin[1] is not None and thin[1] >= floor_gate(auto_plan, column):
            # a mean's one-sided clamp: its floor too
            low = choose_floor(auto_plan, stats, index, column, chosen_index,
                               1 if lo == 0.0 else -1, r, k, source)
            if low != 0.0:  # a floor: a low tail may be raised
                raised.append(column)
            lo, hi = (low, hi) if lo == 0.0 else (lo, -low)
        elif f"floor:{column}" in eps and thin is not None and \
                thin[1] is not None and thin[1] >= end_gate(auto_plan, column):
            # a mean's two-sided clamp: one end brought in (the floor's epsilon: the two
            # exclude each other)
            lo, hi = choose_end(auto_plan, stats, index, column, chosen_index, r, k, source)
            if (lo, hi) != (-magnitude, magnitude):  # an end brought in: a tail may be moved
                raised.append(column)
        bounds[column] = Bounds(lo, hi)
        if magnitude == MAGNITUDES[-1] and not (thin is not None and thin[0] == "widest"):
            top.append(column)
    # the clamps' kept count (``kept_check``), over the columns whose magnitude is below the
    # largest candidate (there the widest clamps are no wider; ``top`` says what it cuts)
    below_top = [(i, m, sign_side(signs[i])) for i, m in enumerate(indexes)
                 if m < len(MAGNITUDES) - 1]
    if KEPT in eps and below_top and thin is not None and thin[0] != "widest" and \
            thin[1] is not None:
        collapsed, noisy_kept, why = kept_check(auto_plan, stats, below_top, r, source)
        chosen["kept"] = noisy_kept
        if collapsed:  # post-processing of the counts: the thin-data rule's widest clamps
            thin = ("widest", thin[1], why)
            chosen["collapsed"] = True
            bounds = {c: Bounds(-MAGNITUDES[-1], MAGNITUDES[-1]) for c in bounds}
            top, raised = [], []
    if bounds:
        chosen["bounds"] = {c: (b.lo, b.hi) for c, b in bounds.items()}
    aggregates = [with_bounds(agg, bounds) for agg in plan.aggregates]
    final = plan.replace(aggregates=tuple(aggregates), max_partitions=k,
                         max_rows_per_partition=r, auto=None)
    if thin is not None:
        chosen["units"] = thin[1]
        chosen["rule"] = thin[0]  # the thin-data rule's outcome (``thin_rule``)
        if thin[2]:
            chosen["warnings"] = [thin[2]]
    thin_floor_of = [c for c in raised if thin is not None and thin[1] is not None and
                     thin[1] < THIN_WARN * auto_plan.floor(f"floor:{c}", FLOOR_STEPS + 1)]
    if thin_floor_of:  # post-processing of the count (a bug hunt: a floor raising 2% of
        # the values of a VARIANCE, 20,000 units, nothing said)
        worst = max(auto_plan.floor(f"floor:{c}", FLOOR_STEPS + 1) for c in thin_floor_of)
        chosen["warnings"] = [*chosen.get("warnings", ()), (
            f"the clamp of {', '.join(thin_floor_of)} chosen from the data was narrowed on "
            "one side (a floor, or one end brought in), and at this epsilon that choice cannot "
            f"see a tail of fewer than about {worst:,.0f} units beyond it: values there, if "
            "any, were moved to it unseen (give bounds to be sure)")]
    if top:  # post-processing of the choice: the candidates stop at 2^49.75
        chosen["warnings"] = [*chosen.get("warnings", ()), (
            f"the clamp chosen for {', '.join(top)} is the largest the choice can pick "
            f"(+-2^49.75, about {MAGNITUDES[-1]:.3g}): values beyond it, if any, were clamped "
            f"to it unseen; give bounds (up to {MAX_BOUND:.0e}) if they may be larger")]
    cost_name = "rho" if auto_plan.request.rho is not None else "epsilon"
    chosen[cost_name] = auto_plan.spent
    chosen["share"] = auto.spent_share
    if VALUES in eps:  # the histogram, on top of the share (``plan_auto``)
        chosen["values_share"] = auto_plan.values_share
    if TAIL in eps:  # the tail's histogram, on top of the share too
        chosen["tail_share"] = auto_plan.tail_share
    joint = "the caps and the first magnitude" if columns else "the caps"
    chosen["method"] = (f"permute-and-flip over steps of 2^(1/4), one joint choice of {joint} "
                        "(Amin et al. 2019's bias-variance rule, penalties ramping above it); "
                        "epsilons " +
                        ", ".join(f"{name} {value:.3g}" for name, value in eps.items()))
    return with_outer(auto_plan, final, chosen, stats, source, defer_unit_caps)


def chosen_again(first: AutoPlan, retry: AutoPlan, before: dict[str, Any],
                 chosen: dict[str, Any]) -> dict[str, Any]:
    """What the release says about bounds chosen again (``plan_retry``): the retry's choice
    ``chosen``, with what both choices spent and the first one's outcome (``before``), whose
    widest clamps were not used, and a sentence saying why the answer is noisier."""
    cost_name = "rho" if retry.request.rho is not None else "epsilon"
    out = dict(chosen)
    out[cost_name] = first.spent + retry.spent
    out["share"] = retry.share  # in all: the histograms included
    out.pop("values_share", None)
    out.pop("tail_share", None)
    out["first_choice"] = {key: before[key] for key in (
        "max_partitions", "max_rows_per_partition", OUTER, "max_unit_sums", "units", "kept",
        cost_name) if key in before}
    answer = retry.request.rho if retry.request.rho is not None else retry.request.epsilon
    units = max(before.get('units') or 0, 0)
    if "unit_method" in chosen:
        what, give = "caps on each unit's total", "max_unit_rows and max_unit_sums"
        count = f"{units:,} units' worth " + \
            ("of nonzero values" if retry.auto.unit_sums else "with a row")
    elif retry.auto.columns:
        what, give = "clamps", "bounds"
        count = f"{units:,} units' worth of nonzero values"
    else:  # the caps per group alone (``caps_thin_rule``)
        give = " and ".join(name for name in ("max_partitions", "max_rows_per_partition")
                            if getattr(retry.auto, name))
        what, count = f"caps per group ({give})", f"{units:,} units"
    why = f"too few units for the first choice of the {what} (a noisy count of {count})"
    if before.get("collapsed"):  # set aside by its kept count (``kept_check``)
        why = (f"the first choice of the clamps kept almost none of the values (a noisy count "
               f"of {before.get('kept') or 0:,} units' worth within them)")
    out["warnings"] = [
        f"{why}, so they were chosen again with {retry.share:.0%} of the budget in all; the "
        f"answer has {cost_name} {answer:.3g} (give {give} to keep it all for the answer)",
        *out.get("warnings", ())]
    return out
