"""A release's warnings: plain sentences on what it cannot vouch for, or which stated rule it
used (``Release.warnings``; before the charge, ``PreparedQuery.warnings``, which ``explain``
shows).

One way in for every stage, and each sentence once (``collect``):

- resolving (``unused_settings``): what the curator or the query set and the plan does not
  use (``bounding="unit"``), carried by ``ResolvedQuery.notes``;
- before the charge, from the compiled query alone (``before_charge``): public numbers;
- choosing the bounds: ``_auto_bounds.choose_bounds`` may put a list of sentences under
  ``chosen["warnings"]``; ``Curator._answer`` moves them to the release (``take_chosen``), so
  that they appear there once and not in ``bounds_chosen``;
- after the noise (``after_noise``): post-processing of the released values and intervals.

A sentence holds public numbers only: caps, bounds, epsilons, counts of partitions, the bounds
chosen under DP. Never a record, and never an exact aggregate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from dpcurator.query.plan import MAX_CONTRIBUTIONS, MAX_UNIT_SUM, Plan, Sum

from ._auto_plan import UNIT_ROW_CANDIDATES, UNITS, WIDEST_CLAMPS, AutoPlan, defers_unit_caps
from ._auto_thin import caps_cut_bound, caps_thin_threshold, thin_threshold
from ._auto_units import unit_thin_threshold
from ._compile import CompiledQuery
from ._estimators import Estimator
from ._resolve import Defaults
from ._total import inner_unit_rows, inner_unit_sum
from .release import FloatArray, total_columns

__all__ = ["after_noise", "before_charge", "collect", "take_chosen", "thin_rule_stated",
           "unused_settings"]

#: the thin-data rule is stated before the charge where it needs this many units or more
THIN_STATED = 1000.0


def collect(*parts: Iterable[str]) -> tuple[str, ...]:
    """The sentences of every part, in order, each once."""
    return tuple(dict.fromkeys(s for part in parts for s in part))


def take_chosen(chosen: dict[str, Any] | None) -> list[str]:
    """The sentences the bounds' choice left under ``chosen["warnings"]``, removed from it."""
    if chosen is None:
        return []
    return [str(s) for s in chosen.pop("warnings", None) or ()]


def unused_settings(asked: Plan, resolved: Plan, defaults: Defaults) -> list[str]:
    """What ``bounding="unit"`` leaves unused (``_resolve.resolve_plan``), said instead of
    dropped silently (and the caps on each unit's total that a query under the caps per group
    does not use): the curator's clamping bounds of a summed column (a SUM is clamped by
    its cap on each unit's sum alone), and total intervals asked for by the curator's
    defaults or by the query's ``total_share`` (the caps already bound each unit's total).
    The query's own bounds and ``intervals="total"`` are refused there instead. ``asked``:
    the plan before ``resolve_plan``. Settings only: nothing here changes a charge."""
    if resolved.bounding != "unit":
        given = [name for name, value in (("max_unit_rows", asked.max_unit_rows),
                                          ("max_unit_sums", asked.max_unit_sums))
                 if value]
        if given and resolved.intervals != "total":
            return [f"{' and '.join(given)} {'was' if len(given) == 1 else 'were'} not used: "
                    "they cap each unit's total under bounding='unit' (COUNT(*) and SUM with "
                    "public keys or no GROUP BY), or bound total intervals "
                    "(intervals='total'); this query's caps are per group."]
        return []
    out = []
    columns = sorted({a.column for a in resolved.aggregates
                      if type(a) is Sum and a.column in defaults.bounds})
    if columns:
        out.append(f"The curator's bounds for {', '.join(columns)} were not used: under "
                   "bounding='unit' a SUM is clamped by the cap on each unit's sum of |value| "
                   "(max_unit_sums, given or chosen from the data) alone.")
    unused = []
    if asked.intervals is None and defaults.intervals == "total":
        unused.append("the curator's intervals='total'")
    if asked.intervals is None and asked.total_share is None and \
            defaults.total_share is not None:
        unused.append(f"the curator's total_share={defaults.total_share:g}")
    if asked.total_share is not None:
        unused.append(f"the query's total_share={asked.total_share:g}")
    if unused:
        names = " and ".join(unused)
        verb = "was" if len(unused) == 1 else "were"
        out.append(f"{names[0].upper()}{names[1:]} {verb} not used: under bounding='unit' "
                   "the caps already bound each unit's total (max_unit_rows, max_unit_sums), "
                   "so the intervals are the bounded ones and no share is spent on total "
                   "intervals.")
    return out


def _total_sums(compiled: CompiledQuery) -> list[Estimator]:
    return [e for e in compiled.estimators if e.total is not None and type(e.aggregate) is Sum]


def before_charge(compiled: CompiledQuery) -> list[str]:
    """What the compiled query says before anything is read: a total SUM printed with its
    own estimate, and (once no bound is left to choose) outer caps below the inner caps."""
    plan = compiled.plan
    sums = [e.aggregate.name for e in _total_sums(compiled)]
    columns = total_columns([k.name for k in plan.group_by] + [a.name for a in plan.aggregates],
                            sums)
    out = [f"{columns[name]} is the sum without the caps and the clamping, with its own "
           f"estimate and interval; the interval beside {name} is the bounded sum's."
           for name in sums]
    if compiled.auto is None:  # placeholders otherwise: checked on the bounds chosen
        out += outer_below_inner(compiled)
    else:
        out += thin_rule_stated(compiled)
    return out


def thin_rule_stated(compiled: CompiledQuery) -> list[str]:
    """The thin-data rule (``_auto_thin.thin_rule``) stated before the charge, where its
    threshold is large enough to matter (``THIN_STATED`` units' worth of values or more):
    public numbers only (epsilon, the candidates)."""
    auto = compiled.auto
    assert auto is not None
    if UNITS in auto.epsilons and compiled.plan.bounding == "unit":
        threshold = unit_thin_threshold(auto)[0]
        if threshold < THIN_STATED:
            return []
        sums = bool(auto.auto.unit_sums)
        # with private keys the caps aim at the keys released (``defers_unit_caps``): the
        # threshold stated is one partition's, the least it can be
        keys = (" if one key is released, and more for more keys (the caps are chosen for "
                "the keys the selection releases)") if defers_unit_caps(compiled.plan) else ""
        if sums:
            each = " of each" if len(auto.auto.unit_sums) > 1 else ""
            first = (f"At this epsilon the caps on each unit's sum of "
                     f"{', '.join(auto.auto.unit_sums)} are chosen from the data only if about "
                     f"{threshold:,.0f} units' worth or more have a nonzero sum{each} (a noisy "
                     "count; "
                     f"a unit spread over more than 8 partitions weighs 1/2 to 1){keys}; below "
                     "that ")
            widest = (f"the widest caps ({MAX_UNIT_SUM:.3g}) are used and the answer is as "
                      "uncertain as its interval says.")
            have, give = "have one", "Give max_unit_sums (and max_unit_rows)"
        else:
            first = (f"At this epsilon the cap on each unit's rows is chosen from the data only "
                     f"if about {threshold:,.0f} units' worth or more have a row (a noisy count; "
                     f"a unit spread over more than 8 partitions weighs 1/2 to 1){keys}; below "
                     "that ")
            widest = (f"the widest cap ({UNIT_ROW_CANDIDATES[-1]:,} rows) is used and the "
                      "answer is as uncertain as its interval says.")
            have, give = "have a row", "Give max_unit_rows"
        retry = compiled.retry
        if retry is not None and compiled.retry_candidates is not None:
            again = unit_thin_threshold(retry)[0]
            answer = retry.request.rho if retry.request.rho is not None else \
                retry.request.epsilon
            cost = "rho" if retry.request.rho is not None else "epsilon"
            return [first + f"{'they are' if sums else 'it is'} chosen again with "
                    f"{retry.share:.0%} of the budget in all, leaving the answer {cost} "
                    f"{answer:.3g}, if about {again:,.0f} or more {have}; below that "
                    f"{widest} {give} to avoid both."]
        return [first + widest + f" {give} to avoid it."]
    if auto.auto.choices == 0:
        return []
    rows_for = compiled.candidates.rows_for if compiled.candidates is not None else None
    if not auto.auto.columns:  # the caps alone: the units' count (``caps_thin_rule``)
        caps = " and ".join(name for name in ("max_partitions", "max_rows_per_partition")
                            if getattr(auto.auto, name))
        needed = _caps_threshold(auto, compiled.plan, rows_for)
        if needed < THIN_STATED:
            return []
        retry = compiled.retry
        first = (f"At this epsilon the caps per group ({caps}) are chosen from the data only "
                 f"if it holds about {needed:,.0f} units or more (a noisy count); below that ")
        widest = ("the widest caps are used and the answer is as uncertain as its interval "
                  "says" + (" (with private keys, few or no keys may then be released)"
                            if compiled.plan.private_keys and auto.auto.max_partitions
                            else "") + ".")
        if retry is not None and compiled.retry_candidates is not None:
            bound = caps_cut_bound(retry)
            answer = retry.request.rho if retry.request.rho is not None else \
                retry.request.epsilon
            cost = "rho" if retry.request.rho is not None else "epsilon"
            return [first + f"they are chosen again with {retry.share:.0%} of the budget in "
                    f"all, leaving the answer {cost} {answer:.3g}, and kept if a second noisy "
                    f"count of the units they cut is below about {bound:,.0f}; else {widest} "
                    f"Give {caps} to avoid both."]
        return [first + widest + f" Give {caps} to avoid it."]
    threshold = _threshold(auto, compiled.plan, rows_for)
    if threshold < THIN_STATED:
        return []
    columns = ", ".join(auto.auto.columns)
    each = " in each" if len(auto.auto.columns) > 1 else ""
    first = (f"At this epsilon the clamps of {columns} are chosen from the data only if it "
             f"holds about {threshold:,.0f} units' worth of nonzero values or more{each}, of "
             "the sign the clamp keeps (a noisy count); below that ")
    retry = compiled.retry
    if retry is not None and compiled.retry_candidates is not None:
        again = _threshold(retry, compiled.plan, compiled.retry_candidates.rows_for)
        answer = retry.request.rho if retry.request.rho is not None else retry.request.epsilon
        cost = "rho" if retry.request.rho is not None else "epsilon"
        return [first + f"they are chosen again with {retry.share:.0%} of the budget in all, "
                f"leaving the answer {cost} {answer:.3g}, if it holds about {again:,.0f} or "
                f"more; below that the widest clamps ({WIDEST_CLAMPS}) are used and the answer "
                f"is as uncertain as its interval says. {KEPT_STATED} Give bounds to avoid both."]
    return [first + f"the widest clamps ({WIDEST_CLAMPS}) are used and the answer is as "
            f"uncertain as its interval says. {KEPT_STATED} Give bounds to avoid it."]


#: the clamps' kept count (``_auto_thin.kept_check``), stated with the thin-data rule
KEPT_STATED = ("Clamps chosen that keep almost none of the values (a second noisy count, of "
               "the values within them) are set aside the same way.")


def _caps_threshold(auto: AutoPlan, plan: Plan, rows_for: Any) -> float:
    """The caps' thin-data threshold (``_auto_thin.caps_thin_threshold``) at the smallest
    partition cap the choice may pick."""
    k = rows_for[0][0] if rows_for else (plan.max_partitions or 1)
    return caps_thin_threshold(auto, plan, rows_for, k)


def _threshold(auto: AutoPlan, plan: Plan, rows_for: Any) -> float:
    """The thin-data rule's threshold (``_auto_thin.thin_threshold``) at the smallest
    partition cap the choice may pick (the rule's noise rate grows with the cap chosen)."""
    k = rows_for[0][0] if rows_for else (plan.max_partitions or 1)
    return thin_threshold(auto, plan, rows_for, k)


def outer_below_inner(compiled: CompiledQuery) -> list[str]:
    """An outer cap (given, or at its limit) below what the caps and the clamping let one
    unit keep: the total intervals then miss units that the bounded answer keeps whole."""
    plan: Plan = compiled.plan
    out = []
    rows = next((e.total.spec.outer for e in compiled.estimators
                 if e.total is not None and e.total.spec.value is None), None)
    inner = inner_unit_rows(plan)
    if rows is not None and rows < inner:
        limit = ", its largest value" if rows >= MAX_CONTRIBUTIONS else ""
        out.append(f"The outer cap max_unit_rows ({rows:,}{limit}) is below the {inner:,} "
                   "rows the caps let one unit keep: the total intervals do not cover units "
                   f"with more than {rows:,} rows.")
    for estimator in _total_sums(compiled):
        assert estimator.total is not None and estimator.total.spec.value is not None
        column = estimator.total.spec.value.column
        outer = estimator.total.spec.value.hi
        most = inner_unit_sum(plan, column)
        if outer < most:
            limit = ", its largest value" if outer >= MAX_UNIT_SUM else ""
            out.append(f"The outer cap max_unit_sums[{column!r}] ({outer:.4g}{limit}) is "
                       f"below the {most:.4g} that the caps and the bounds let one unit keep: "
                       f"the total intervals do not cover units whose sum of |{column}| "
                       f"exceeds {outer:.4g}.")
    return out


def after_noise(compiled: CompiledQuery, values: Mapping[str, FloatArray],
                totals: Mapping[str, tuple[FloatArray, FloatArray]], level: float) -> list[str]:
    """Where a SUM's bounded value lies outside its total's interval (``totals``: per SUM,
    that interval at ``level``), how many partitions: the caps or the clamping may remove
    much there (or the total's interval missed). Post-processing of released values."""
    plan = compiled.plan
    columns = total_columns([k.name for k in plan.group_by] + [a.name for a in plan.aggregates],
                            list(totals))
    out = []
    for name, (low, high) in totals.items():
        value = np.asarray(values[name], dtype=np.float64)
        outside = int(np.sum((value < low) | (value > high)))
        if outside:
            out.append(f"{name}: in {outside} of {value.size} partitions the bounded value "
                       f"lies outside the {level:.0%} interval of {columns[name]}: the caps "
                       "or the clamping may remove much there.")
    return out
