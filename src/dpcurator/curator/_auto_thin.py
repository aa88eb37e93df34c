"""Where the data is too thin for epsilon to choose bounds from: the noisy counts that set a
choice aside for the widest bounds or a retry (``dpcurator.curator._auto_bounds``).

Thin data (``thin_rule``). Where the values are too few for epsilon, every candidate scores
within about F of the best and the ramp pulls the clamp to the lowest magnitudes: an answer
near zero with a tight interval (issue 26: 1,500 customers at epsilon 0.01 to 0.3). A noisy
count of the clamped columns' nonzero values of the sign kept (the least over the columns,
each weighed as its magnitude statistic, sensitivity 1) below ``THIN`` F (1.25 F), plus half
the magnitude's target t where the noise's rate is large against the values (``thin_rule``:
the lowest magnitudes score max(0, N - t), so the clamp falls below every value while N < F
+ t / 2), replaces the clamps chosen by the widest, +-2^49.75 (about 9.5e14), and says so in
the release (unless the bounds are chosen again: ``_auto_plan``, "Choosing again"); below 20
F the clamps are kept with a warning that a tail of fewer than F units cannot be located.
Before the charge, ``explain`` states the rule with its threshold. Why about F: from the
lowest magnitude (where every nonzero value lies beyond) to the data's the ramp costs up to
2 F, less what the statistic there exceeds its target by; below about F the lowest
magnitudes score better than the data's, and the clamp falls to zero (1,500 customers at
epsilon 0.3: a statistic of 0.8 F chose clamps near 3e-6). On the family, the rule at 2 F
fired with probability above 1% on 13 of 104 SUM and AVG cases (up to 99%), where the choice
was about 1.6x the best fixed bounds without it; at 1.25 F far less often.

Caps per group chosen with no clamp beside them (a COUNT with private keys, or bounds given
and the caps left to the data) have the same rule (``caps_thin_rule``) with a noisy count of
about the units the lowest caps would cut (``caps_statistic``, sensitivity 1), weighing
``CAPS_UNITS`` per cap, on top of the share: below THIN F plus half the caps' target the
caps are chosen within the noise, and low, so they are chosen again
(``_auto_plan.plan_retry``), or replaced by the widest where no retry can follow. The choice
made again is checked by a noisy count of the units its caps cut (``caps_cut_bound``): the
widest caps where they cut many, else kept.

The kept count (``kept_check``). A thin-data count above its threshold does not make the
choice safe near it: the lowest magnitudes then score about F / 2 below the data's, each
(beta / C)^(1/2) as likely, and there are thousands of them, so a few percent of releases
drew a clamp below every value (500 units of 20 rows at epsilon 0.5, AVG per group: 0 within
[0, 0] in 8 of 200 seeded releases). After the clamps are chosen, a noisy count of the units'
worth of nonzero values within them (the least over the columns, sensitivity 1,
``WEIGHTS["kept"]`` all on top of the share, and on top of ``RETRY_SHARE`` on the retry)
below ``CAPS_LOW`` noise scales (``kept_bound``) sets them aside, as the thin-data rule's
widest clamps are: chosen again, or the widest used, said in the release. A clamp at the
bias-variance point keeps all but about the noise's rate t of the N units' worth of values;
a collapsed one keeps none.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from dpcurator.engines import PROFILE_STEPS
from dpcurator.mechanisms import DiscreteLaplace
from dpcurator.noise import RandomSource
from dpcurator.noise.samplers import MAX_SCALE as MAX_NOISE_SCALE
from dpcurator.query.plan import (
    Count,
    CountUnits,
    Plan,
)

from ._auto_joint import (
    MEAN_CAP_FACTOR,
    MEAN_ROW_FACTOR,
    ROW_FACTOR,
    ROW_FACTOR_VALUES,
    magnitude_cap,
    per_k_rows,
    thin_floor,
)
from ._auto_plan import (
    KEPT,
    ROW_CANDIDATES,
    UNITS,
    WIDEST_CLAMPS,
    AutoPlan,
    joint_parts,
    means_only,
    partition_candidates,
)
from ._profile import Profile

__all__ = ["caps_cut_bound", "caps_statistic", "caps_target", "caps_thin_rule",
           "caps_thin_threshold", "count_threshold", "kept_bound", "kept_check",
           "kept_statistic", "needs_retry", "noisy_count", "thin_rule", "thin_threshold",
           "widest_caps"]

#: The data is too thin to choose a clamp from when a noisy count of its units is below
#: THIN times the joint choice's floor F (every unit within F of the best score: the scores
#: cannot tell the candidates apart); THIN_WARN times F or fewer: the tail cannot be located.
THIN = 1.25
THIN_WARN = 20.0
#: the thin-data rule's threshold is at least the magnitude's target plus this many F
#: (``thin_threshold``)
THIN_ABOVE_TARGET = 0.5
#: The retry is made where the first choice's thin-data count is below RETRY_BELOW times its
#: floor F (``needs_retry``)
RETRY_BELOW = THIN
#: On the caps' choice made again, a noisy count of the units they cut at or above CAPS_LOW
#: times its noise scale replaces them by the widest (``caps_cut_bound``): where they cut
#: nobody the count stays below it w.p. 1 - e^-3 / 2, about 97.5%; where they cut 300 units
#: of a SUM over 20 public keys at epsilon 0.3 (scale 44), it reaches it w.p. about 99%. At 4
#: scales a bug hunt's seed kept such caps (a count of 142): answers at 15% of the truth.
CAPS_LOW = 3.0



def noisy_count(count: int, epsilon: float, source: RandomSource | None) -> int | None:
    """A count of sensitivity 1 released by the discrete Laplace mechanism at ``epsilon``
    (every thin-data and kept count of the choices, ``_auto_units.unit_thin`` too); None
    where 1 / epsilon is past the samplers' range, so that nothing is drawn there and the
    caller falls back to the widest bounds on public numbers."""
    if 1.0 / epsilon > MAX_NOISE_SCALE:
        return None
    return int(DiscreteLaplace(epsilon=epsilon, source=source).release(count))

def thin_threshold(auto_plan: AutoPlan, plan: Plan,
                   rows_for: Sequence[tuple[int, int]] | None, k: int) -> float:
    """Below this noisy count the thin-data rule uses the widest clamps (``thin_rule``):
    ``THIN`` F plus half the magnitude's target t at the partition cap ``k``, and at least t
    plus ``THIN_ABOVE_TARGET`` F. Public numbers only; ``explain`` states it and the exact
    measure prices it by this same function.

    Why the second term. The magnitudes below every value score max(0, N - t), so where the
    count N is below t they score 0, the best any candidate can; the data's magnitude scores
    at best -(t - N) there (its ramp is capped at max(t, 2 F) less N). F + t / 2 is above t
    only while t < 2 F: with many partitions, several aggregates or a large epsilon (t up to
    3.6 F with 1,000 public keys at epsilon 1) counts between F + t / 2 and t chose clamps
    near 1e-6 on values of 40 to 60, and answered about zero with a tight interval (12 of 20
    releases). Above t the lowest magnitudes pay N - t, and at t + F / 2 each is at most (beta
    / C)^(1/2) times as likely as the data's, the first term's margin."""
    return count_threshold(thin_floor(auto_plan, plan, rows_for),
                           auto_plan.target(k, per_partition=False))


def count_threshold(floor: float, target: float) -> float:
    """The thin-data rule's threshold for a choice of floor F and target t
    (``thin_threshold``): max(``THIN`` F + t / 2, t + ``THIN_ABOVE_TARGET`` F)."""
    return max(THIN * floor + target / 2.0, target + THIN_ABOVE_TARGET * floor)


def thin_rule(auto_plan: AutoPlan, plan: Plan, count: int, source: RandomSource | None,
              rows_for: Sequence[tuple[int, int]] | None = None, k: int = 1
              ) -> tuple[str, int | None, str | None]:
    """The thin-data rule for a query whose clamps are chosen: (``"widest"`` or
    ``"chosen"``, the noisy count or None, a warning or None).

    The count is the least, over the clamped columns, of each column's magnitude statistic at
    its lowest candidate, of the sign its signs' choice kept (``Profile.nonzero`` at the
    chosen row cap and the released side: the units' worth of nonzero values that [0, M],
    [-M, 0] or [-M, M] keeps, each unit adding at most 1, the floor of an exact sum; their
    least moves by at most 1 too). Made noisy (discrete Laplace,
    sensitivity 1, with the ``units`` choice's epsilon: Ghosh, Roughgarden and Sundararajan
    2009), below ``THIN`` times the joint choice's floor F it means that the statistic
    cannot pay the choice's ramp from the lowest magnitude to the data's (up to 2 F, less
    its excess over the target): the clamp chosen is drawn towards zero (or a sign the data
    does not have). The rule then replaces every chosen clamp by the widest,
    [-2^49.75, 2^49.75] (post-processing of the choices and the count), so that the answer's
    interval is as wide as its uncertainty, and the release says so. Below ``THIN_WARN``
    times F the clamp is kept with a warning: the choice cannot locate a tail of fewer than
    about F units (of values, and of rows where the caps are chosen with them).
    A one-sided clamp of the wrong sign keeps none of the values, so its count is about 0
    and passes the first threshold only with noise above 1.25 F (scale about 0.1 F: e^-12
    or less), on top of the signs' own error (e^-(epsilon n) for n values on the other
    side). The clamps were made symmetric below 4 F instead, when the count read both
    signs: that doubled a mean's width on thin data of one sign (the family's #14 AVG
    3.44x the best fixed clamps with it, 1.86x without; COMPAS's juvenile felonies).
    Below ``THIN`` F plus half the magnitude's target t at the partition cap ``k`` chosen
    (``thin_threshold``; G s k^a: the noise's rate per unit's worth of values) the widest
    clamps too: the magnitudes below every value then score max(0, N - t), the data's about
    2 F - N (the ramp from the lowest, less the statistic), so below N = F + t / 2 it prefers
    clamps below every value and the answer is about zero with a tight interval around it
    (the family's #42 at epsilon 0.3, 20 groups: clamps near 1e-6 on values of 23 and
    more); at t = 0 this is the first threshold. Where t exceeds 2 F the threshold is t +
    F / 2 instead (``thin_threshold``): below t those magnitudes score 0. Where the count's
    epsilon is too small for its noise to be drawn (scale above 2^56) the rule applies
    without a count: a decision on public numbers."""
    floor = thin_floor(auto_plan, plan, rows_for)
    epsilon = auto_plan.epsilons[UNITS]
    widest = (f"too few units for epsilon to choose the clamps from the data (the choice "
              f"needs about {floor:,.0f}); the widest clamps ({WIDEST_CLAMPS}) were used, so "
              "the answer is as uncertain as its interval says: give bounds, or raise epsilon, "
              "or the share of it spent choosing them (bounds_share); values of 2^-30 (about "
              "9.3e-10) or less in magnitude count as zero here: rescale such a column")
    noisy = noisy_count(count, epsilon, source)
    if noisy is None:
        return "widest", None, widest
    if noisy < THIN * floor:
        return "widest", noisy, widest
    if noisy < thin_threshold(auto_plan, plan, rows_for, k):
        rate = auto_plan.target(k, per_partition=False)
        return "widest", noisy, (
            f"the noise at this epsilon outweighs the column's nonzero values (about "
            f"{noisy:,} units' worth, against a noise rate of {rate:,.0f}): clamps chosen from "
            "the data would cut them all and answer about zero, so the widest clamps "
            f"({WIDEST_CLAMPS}) were used and the answer is as uncertain as its interval says: "
            "give bounds, or raise epsilon")
    if noisy < THIN_WARN * floor:
        # the caps are chosen by the same joint choice, with the same floor
        rows = auto_plan.auto.max_rows_per_partition or auto_plan.auto.max_partitions
        what, cut = ("caps and clamps", "rows and values") if rows else ("clamps", "values")
        return "chosen", noisy, (
            f"thin data for this epsilon (about {max(noisy, 0):,} units' worth of nonzero "
            f"values): the {what} chosen from the data cannot locate a tail of fewer than "
            f"about {floor:,.0f} units; {cut} beyond them are cut unseen (give bounds to be "
            "sure; a larger bounds_share locates smaller tails)")
    return "chosen", noisy, None


def kept_statistic(stats: Profile, chosen: Sequence[tuple[int, int, int]], r: int) -> int:
    """The clamps' kept count (``kept_check``): the least, over the columns ``chosen`` (each
    a column's index, its chosen magnitude's and the side its signs kept, ``sign_side``;
    public: released choices), of the units' worth of nonzero values of that sign within that
    magnitude (``Profile.within``, at the row cap's ``magnitude_cap(r)``, as the choice read
    it). Each column's statistic moves by at most 1 when one unit is added or removed (a
    unit's values weigh at most 1 in all), so their least does."""
    cap = magnitude_cap(r)
    return min(stats.within(i, cap, PROFILE_STEPS[m], side) for i, m, side in chosen)


def kept_bound(auto_plan: AutoPlan) -> float:
    """Below this noisy kept count the clamps chosen are set aside (``kept_check``):
    ``CAPS_LOW`` noise scales of the count. Public numbers only."""
    return CAPS_LOW / auto_plan.epsilons[KEPT]


def kept_check(auto_plan: AutoPlan, stats: Profile, chosen: Sequence[tuple[int, int, int]],
               r: int, source: RandomSource | None) -> tuple[bool, int | None, str | None]:
    """Whether the clamps chosen collapsed: (set them aside, the noisy count or None, a
    warning or None).

    The count is ``kept_statistic`` made noisy by the discrete Laplace mechanism (sensitivity
    1, the ``kept`` choice's epsilon; Ghosh, Roughgarden and Sundararajan 2009). A clamp at
    the bias-variance point keeps all but about the noise's rate t of the N units' worth of
    nonzero values; one drawn from the lowest magnitudes' plateau, or below every value,
    keeps none of them. Near the thin-data threshold the plateau holds a few percent of the
    joint choice's mass (its candidates score about F / 2 below the data's, each (beta /
    C)^(1/2) as likely, and there are thousands), so the thin-data count alone let such
    clamps through. Below ``kept_bound`` the outcome is the thin-data rule's widest clamps
    (post-processing of the counts): the choice is made again where it can be, else the
    widest clamps are used, and the release says why."""
    epsilon = auto_plan.epsilons[KEPT]
    bound = kept_bound(auto_plan)
    widest = ("the clamps chosen from the data kept almost none of the values (a noisy count "
              "of {noisy} units' worth within them, against {bound:,.0f}): the choice had "
              "collapsed, so the widest clamps (" + WIDEST_CLAMPS + ") were used and the "
              "answer is as uncertain as its interval says: give bounds, or raise epsilon")
    noisy = noisy_count(kept_statistic(stats, chosen, r), epsilon, source)
    if noisy is None:
        return True, None, widest.format(noisy="no", bound=bound)
    if noisy < bound:
        return True, noisy, widest.format(noisy=f"{noisy:,}", bound=bound)
    return False, noisy, None


def caps_target(auto_plan: AutoPlan, plan: Plan, k: int) -> float:
    """The largest target the joint choice gives the caps per group chosen alone at the
    partition cap ``k`` (``joint_scores``: the partition cap's G s a k^(a-1), the row cap's
    factor times G s k^a, over k where it is read per k). Public numbers only."""
    auto = auto_plan.auto
    targets = [0.0]
    if auto.max_partitions:
        weigh = MEAN_CAP_FACTOR if means_only(plan) else 1.0
        targets.append(weigh * auto_plan.target(k, per_partition=True))
    if auto.max_rows_per_partition:
        values = any(not isinstance(agg, Count | CountUnits) for agg in plan.aggregates)
        factor = ROW_FACTOR_VALUES if values else ROW_FACTOR
        name = "+".join(joint_parts(auto))
        ks = partition_candidates(plan) if auto.max_partitions else [plan.max_partitions or 1]
        per_k = per_k_rows(auto_plan, factor, auto_plan.epsilons[name], max(ks))
        aim = (MEAN_ROW_FACTOR if means_only(plan) else 1.0) * \
            (ROW_FACTOR if per_k else factor) * auto_plan.target(k, per_partition=False)
        targets.append(aim / k if per_k else aim)
    return max(targets)


def caps_thin_threshold(auto_plan: AutoPlan, plan: Plan,
                        rows_for: Sequence[tuple[int, int]] | None, k: int) -> float:
    """Below this noisy count of units the caps per group chosen alone are replaced by the
    widest (``caps_thin_rule``): ``THIN`` F plus half the caps' target t at ``k``
    (``caps_target``), and at least t plus ``THIN_ABOVE_TARGET`` F, as the clamps'
    (``thin_threshold``). Public numbers only."""
    return count_threshold(thin_floor(auto_plan, plan, rows_for), caps_target(auto_plan, plan, k))


def widest_caps(plan: Plan, rows_for: Sequence[tuple[int, int]] | None) -> tuple[int, int]:
    """The widest caps per group the joint choice could pick, among those ``rows_for``
    allows: the largest partition cap, and the largest row cap at it."""
    auto = plan.auto
    assert auto is not None
    ks = partition_candidates(plan) if auto.max_partitions else [plan.max_partitions or 1]
    rs = list(ROW_CANDIDATES) if auto.max_rows_per_partition else \
        [plan.max_rows_per_partition or 1]
    allowed = dict(rows_for) if rows_for is not None else {k: len(rs) for k in ks}
    k = max(k for k in ks if allowed.get(k, 0) > 0)
    return k, rs[allowed[k] - 1]


def caps_statistic(auto_plan: AutoPlan, stats: Profile, chosen: tuple[int, int] | None = None
                   ) -> int:
    """The caps' thin-data count (``caps_thin_rule``). On the first choice (``chosen`` None),
    the units (``Profile.partitions`` at 0: a unit's pairs weigh 1 / P, so it adds exactly
    1). On the choice made again, about the units the caps chosen, ``chosen`` = (k, r), cut:
    the larger of the statistics those caps are scored by (``Profile.partitions`` at k,
    ``Profile.rows`` at r with each pair weighing 1 / P, whatever partition cap is given: a
    bug hunt found 1 / max(P, k) hiding 300 units behind a given cap of 20). Each statistic
    moves by at most 1 when one unit is added or removed, so their larger does, and so does
    its floor."""
    if chosen is None:
        return math.floor(stats.partitions([0])[0])
    auto = auto_plan.auto
    k, r = chosen
    cut = 0.0
    if auto.max_partitions:
        cut = max(cut, stats.partitions([k])[0])
    if auto.max_rows_per_partition:
        cut = max(cut, stats.rows([r])[0])
    return math.floor(cut)


def caps_cut_bound(auto_plan: AutoPlan) -> float:
    """On the choice made again, a noisy count of the units its caps cut at or above this
    replaces them by the widest (``caps_thin_rule``): ``CAPS_LOW`` times the count's noise
    scale. Public numbers only."""
    return CAPS_LOW / auto_plan.epsilons[UNITS]


def caps_thin_rule(auto_plan: AutoPlan, plan: Plan, count: int, source: RandomSource | None,
                   rows_for: Sequence[tuple[int, int]] | None, k: int, again: bool = False
                   ) -> tuple[str, int | None, str | None]:
    """The thin-data rule for caps per group chosen with no clamp beside them: (``"widest"``
    or ``"chosen"``, the noisy count or None, a warning or None), as ``thin_rule``'s for the
    clamps.

    The count is ``caps_statistic``, made noisy by the discrete Laplace mechanism
    (sensitivity 1, the ``units`` choice's epsilon; Ghosh, Roughgarden and Sundararajan 2009).
    On the first choice it is of the units: below ``caps_thin_threshold`` (``THIN`` F plus
    half the caps' target t) the statistics cannot pay the ramp from the lowest caps to the
    data's, and the caps may be drawn within the noise, low (300 units of 10 rows at epsilon
    0.3 chose r of 1 or 2 and answered 10% to 45% of the truth). The caps are then chosen
    again (``plan_retry``), or, where no retry can follow, replaced by the widest
    (``widest_caps``; post-processing of the count), and the release says so. On the choice
    made again (``again``) the data is thin by then, and the count is of the units its caps
    cut: at or above ``caps_cut_bound`` (3 noise scales) they are replaced by the widest; below
    it they are kept, cutting almost nobody (one row per unit keeps caps of one row; a count
    of the units beyond the lowest caps, tried first, kept them wherever the caps' target was
    large against the noise, where the choice had collapsed: a bug hunt). Above the first
    threshold but below ``THIN_WARN`` F, the caps are kept with a warning: a tail of fewer
    than about F units cannot be located."""
    floor = thin_floor(auto_plan, plan, rows_for)
    epsilon = auto_plan.epsilons[UNITS]
    wide_k, wide_r = widest_caps(plan, rows_for)
    auto = auto_plan.auto
    caps = " and ".join(name for name in ("max_partitions", "max_rows_per_partition")
                        if getattr(auto, name))
    keys = (" (with private keys, a unit in up to that many partitions raises the selection's "
            "threshold, so few or no keys may be released)") if plan.private_keys and \
        auto.max_partitions else ""
    threshold = caps_cut_bound(auto_plan) if again else \
        caps_thin_threshold(auto_plan, plan, rows_for, k)
    # public numbers only: the noisy count, never ``count``
    noisy = noisy_count(count, epsilon, source)
    why = (f"the caps chosen again from the data cut many units (a noisy count of "
           f"{noisy if noisy is not None else 'no'} against {threshold:,.0f})" if again else
           f"too few units for epsilon to choose the caps per group ({caps}) from the data "
           f"(the choice needs about {threshold:,.0f})")
    widest = (f"{why}; the widest caps were used ({wide_k:,} partitions of {wide_r:,} rows)"
              f"{keys}, so the answer is as uncertain as its interval says: give {caps}, or "
              "raise epsilon, or the share of it spent choosing them (bounds_share)")
    if noisy is None:
        return "widest", None, widest
    if again:
        if noisy >= threshold:
            return "widest", noisy, widest
        return "chosen", noisy, (
            f"thin data for this epsilon: the caps per group chosen again from the data cut "
            f"few units (a noisy count of {noisy:,}), but cannot locate a tail of fewer than "
            f"about {floor:,.0f} units; rows beyond them are cut unseen (give {caps} to be "
            "sure)")
    if noisy < threshold:
        return "widest", noisy, widest
    if noisy < THIN_WARN * floor:
        return "chosen", noisy, (
            f"thin data for this epsilon (about {max(noisy, 0):,} units): the caps per group "
            f"chosen from the data cannot locate a tail of fewer than about {floor:,.0f} "
            f"units; rows beyond them are cut unseen (give {caps} to be sure; a larger "
            "bounds_share locates smaller tails)")
    return "chosen", noisy, None


def needs_retry(auto_plan: AutoPlan, plan: Plan, chosen: dict[str, Any],
                rows_for: Sequence[tuple[int, int]] | None = None) -> bool:
    """Whether the first choice's outcome (``chosen``) calls for the retry (``plan_retry``):
    the thin-data rule's widest clamps, or its noisy count below ``RETRY_BELOW`` times the
    joint choice's floor F. Post-processing of the count. Under ``bounding="unit"``, the
    widest caps on a unit's sum alone (``unit_thin``: its threshold is above 1.25 F)."""
    if chosen.get("rule") == "widest":
        return True
    if plan.bounding == "unit":
        return False
    units = chosen.get("units")
    return units is not None and units < RETRY_BELOW * thin_floor(auto_plan, plan, rows_for)
