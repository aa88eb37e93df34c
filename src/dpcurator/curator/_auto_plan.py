"""The plan of the bounds chosen from the data (``bounds="auto"``): which choices a query
makes (``choice_names``), the epsilon of each (``plan_auto``: the bounds' share split by
``WEIGHTS``, with the parts on top of it) and the events charged, the retry's plan
(``plan_retry``), and the candidates every choice reads.

Cost: each choice is epsilon-DP (``PureDP``) under add/remove one unit; with a rho request it
is charged as epsilon^2 / 2-zCDP (Bun and Steinke 2016, Proposition 1.4). The choices and
the query compose (basic composition for (epsilon, delta), adding rhos for zCDP).

Choosing again (``plan_retry``, ``needs_retry``). Where the thin-data rule would use the
widest clamps (or its count is below ``RETRY_BELOW`` F, the same 1.25 F), the first choices'
outcome is set aside and every choice is made again, each with its weight of the retry's
part: the bounds spend ``RETRY_SHARE`` (half) of the budget in all, the first choices
included, and the answer keeps the other half. At the default share the retry's choices
have 4 times the first's epsilon, so its F is 4 times smaller and it locates tails 4 times
thinner; where its own count is still below 1.25 F, the widest clamps are used as before.
A row cap aimed by a histogram (``value_factors``) reads the first choice's in the retry
(``Aim``: post-processing of a release already charged), and the weight a second one would
have had goes to the retry's other choices.
The answer's noise is then twice the first path's (1.8x), which is why the retry is not
made above 1.25 F: at 4 F it was worse than the first choice on the family (SUM on #2
2.8x -> 5.5x the best fixed bounds, #20 1.6x -> 2.6x; geometric mean 1.37x -> 1.40x, with
the count at 1/4). Its privacy: the path is chosen from the first choices' outputs, a
filter inside the query (``_compile._prove_retry``); where the retry's path could cost more
than the path charged (a Gaussian answer under (epsilon, delta), priced in rho) there is no
retry. It does not apply where the first choices already have half of its share
(``bounds_share`` of about 0.22 or more, with the parts on top of the share), nor where
a total interval's outer caps are chosen too. ``bounding="unit"`` chooses again the same
way where its own thin-data rule (``unit_thin``) would use the widest caps on a unit's sum,
unless its caps wait for a private selection (``defers_unit_caps``). Measured exactly over
both paths' laws (``auto_bounds.py --family``, 56 shapes): the widest clamps
with probability above 1% on 1 SUM shape and no AVG shape (6 and 5 before), SUM median
1.22x and geometric mean 1.37x all-in (1.22x and 1.36x before, leaving the widest clamps'
mass out); COMPAS's juvenile felonies summed by race at epsilon 1: the widest clamps in 9%
of releases (96% before), 1.8x the best fixed bounds (``benchmarks/compas.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dpcurator.accounting.conversions import zcdp_rho_for
from dpcurator.accounting.events import DpEvent, PureDPEvent, ZCDPEvent
from dpcurator.engines import PROFILE_STEPS, UNIT_TOTALS
from dpcurator.errors import InternalError, UserError
from dpcurator.query.plan import (
    MAX_CONTRIBUTIONS,
    Aggregate,
    AutoBounds,
    Bounds,
    Count,
    CountUnits,
    Mean,
    Plan,
    Quantile,
    Sum,
    Variance,
)

from . import _privacy
from ._privacy import PrivacyRequest

__all__ = ["AutoPlan", "choice_names", "count_selects", "defers_unit_caps", "floor_columns",
           "joint_parts", "means_only", "outer_names", "partition_candidates", "plan_auto",
           "plan_retry", "tail_weight", "values_choice", "values_weight", "with_bounds"]


FloatArray = npt.NDArray[np.float64]

PARTITION_CANDIDATES = tuple(2**i for i in range(11))  # 1 .. 1024
# 1 .. 4096 in steps of about 2^(1/4): finer than powers of two, where the error moves fast
ROW_CANDIDATES = tuple(sorted({round(2 ** (i / 4)) for i in range(49)}))
# value bounds: the engine's bucket steps 2^(q/4), 2^-30 .. 2^49.75 (PROFILE_STEPS)
MAGNITUDES = tuple(2.0 ** (q / 4) for q in PROFILE_STEPS)
#: the widest clamps, as the release's sentences name them (+-9.5e+14)
WIDEST_CLAMPS = f"+-{MAGNITUDES[-1]:.2g}"
#: the chance, at most, that a bound is chosen where its ramp has reached its cap
BETA = 1e-4
#: the values histogram's choice (``_auto_aims.value_histogram``): a sum's or a mean's row cap
#: aimed by the values of the rows it cuts
VALUES = "values"
#: The histogram's weight: 1/4 on top of the bounds' share (the other choices keep their
#: epsilon; 0.48% of the budget, from the answer's part, where the choices weigh 5.25). From
#: the share, 1/4 and 1/2 did the same on the family (``auto_bounds.py --family``: SUM
#: median 1.42x -> 1.26x, geometric mean 1.54x -> 1.40x, within 1.25x 20 -> 27 of 56 shapes)
#: but the skewed benchmark's thin shape (8 groups, 20,000 units) lost 1.51x -> 1.61x and
#: 1.72x for the choices' 4.5% and 9% less epsilon, its histogram under the noise
VALUES_WEIGHT = 0.25
#: A mean's histogram (``value_factors`` with its second half) weighs 1, still on top:
#: about 1.9% of the budget instead of 0.48% (2026-12-02). Its bins' threshold is 8 /
#: epsilon, and at 1/4 a tail of a few hundred heavy units sat near it, so which octaves
#: passed was a coin toss, and the row cap's aim with it (the family's #28 AVG: in two
#: thirds of the histogram's draws r = 3 where 108 is best, 7.69x the best fixed bounds).
#: ``auto_bounds.py --family`` with 32 draws of the histogram, AVG, weights 1/4, 1, 2:
#: median 1.405x, 1.278x, 1.313x; geometric mean 1.588x, 1.471x, 1.462x; within 1.25x 22,
#: 27, 26 of 56 shapes; P[>3x] <= 1% on 34, 38, 38; worst 7.69x, 6.33x, 4.97x (#28 7.69x
#: -> 1.17x, #44 4.59x -> 1.94x, #22 2.47x -> 1.72x, #24 1.78x -> 1.21x, #0 1.48x ->
#: 1.09x; worse #16 1.41x -> 1.65x). A SUM's keeps 1/4: at 1 its family moved by less
#: than the draws (geometric mean 1.380x -> 1.367x), and a SUM of one row per person (no
#: pair beyond 3 rows: the histogram always empty) paid for it. The retry (``plan_retry``)
#: draws none of its own since 2026-12-02: it reads the first choice's (``Aim``).
MEAN_VALUES_WEIGHT = 1.0
#: the row cap's tail (``_auto_aims.tail_multipliers``): the histogram of the pairs' rows,
#: and its weight in the budget (on top of the bounds' share)
TAIL = "tail"
TAIL_WEIGHT = 0.25
#: a total interval's outer cap (``choose_outer``): powers of two, where the profile's units'
#: rows are exact, up to ``Plan``'s limit; the cap is twice the one chosen, and each octave
#: costs a prior of 1 / epsilon in the score
OUTER = "max_unit_rows"
OUTER_SUM = "max_unit_sum"
#: the weights of the choices in the budget (``choice_names``). With ``bounding="unit"`` the
#: partition cap only sizes the private selection's count, whose few candidates need little:
#: it weighs 1/4 there, the caps on each unit's total 1 (TPC-H at scale 0.1, private keys, 60
#: releases, ``benchmarks/joins.py --questions 3,5,6``: the chosen caps' median relative
#: errors 0.0022, 0.0028, 0.0034 with 1; 0.0021, 0.0026, 0.0029 with 1/4)
WEIGHTS = {"max_partitions": 1.0, "max_rows_per_partition": 1.0, "magnitude": 2.0,
           "signs": 1.0, "floor": 0.5, "units": 1.0, "unit": 1.0,
           "unit_partitions": 0.25, "unit_units": 0.5, VALUES: VALUES_WEIGHT,
           "kept": 0.5}
#: ``bounding="unit"``: a unit's rows in all, on the profile's grid (``choose_unit_rows``)
UNIT_ROW_CANDIDATES = tuple(t for t in UNIT_TOTALS if t <= MAX_CONTRIBUTIONS)
#: Where the thin-data rule would use the widest clamps, the choice is made again with this
#: share of the whole budget for the bounds in all, taken from the answer's part
#: (``plan_retry``; the module docstring, "Choosing again")
RETRY_SHARE = 0.5
UNITS = "units"
#: The thin-data count weighs 1 (``WEIGHTS``), 3/4 of it on top of the bounds' share, so that
#: the other choices keep the epsilon they had at 1/4. At 1/4 its noise had a scale of about
#: 0.4 F and let a count of F through the 1.25 F gate in about a quarter of releases, where
#: the clamp could collapse to the lowest magnitudes (an answer near zero with a tight
#: interval); at 1 the scale is about 0.1 F. Releases with a clamp below a quarter of the
#: least nonzero |value| (``/tmp`` sweep: 300 customers of examples/orders.csv and 7,000
#: people 5% nonzero, SUM and AVG, epsilon 0.1 to 3, 30 seeds each, with the retry): 22 of
#: 360 at 1/4, 0 at 1; the family's SUM (``auto_bounds.py --family``, with the retry)
#: median 1.22x, geometric mean 1.37x and 32 shapes within 1.25x either way; the answer
#: pays 1.9% of epsilon (COMPAS's other questions about 1% to 2% worse). Inside the share
#: (the others 12.5% less epsilon) it was worse: median 1.25x, 30 shapes within 1.25x.
UNITS_ON_TOP = 0.75
#: Under ``bounding="unit"`` the thin-data count (``unit_thin``) weighs ``WEIGHTS
#: ["unit_units"]`` (1/2) beside each cap's 1, UNIT_UNITS_ON_TOP (1/4) of it on top of the
#: share: each cap keeps the epsilon it had with a count of weight 1 (3/4 on top), and the
#: answer gets the rest. There the caps are one or two choices, not the five or more of the
#: clamps' path, and the count of weight 1 took half of what a SUM's choice spent (UCI Adult's
#: SUM(hours), one row per person: the answer kept 84% of epsilon, 88% now;
#: ``benchmarks/adult.py``). At 1/2 its noise's scale is 0.07 F of the cap's choice (F = 2
#: ln(C / beta) / epsilon, C = 320), and a count of F, where the lowest caps start to score as
#: well as the data's, passes the 1.25 F gate with probability below 2% (8% at 1/4). Taking
#: the count's part from the caps instead (1/2 inside the share, 90% for the answer) cost the
#: family's thin tails, whose caps need every bit of epsilon (``auto_bounds_unit.py --only
#: 6,18,48,50``: #6 2.8x -> 4.3x, #48 6.9x -> 12.8x the best fixed caps).
UNIT_UNITS_ON_TOP = 0.25
#: With no sum beside it, ``bounding="unit"``'s cap on a unit's rows has the thin-data count
#: (``unit_thin``: the units with a row) too, weighing UNIT_ROWS_UNITS (1/4) of the cap's 1,
#: all of it on top of the share: the cap keeps all of the share and the answer pays 2.5% of
#: epsilon. Without it, 300 units of 10 rows at epsilon 0.3 chose caps of 1 to 12 rows
#: within the noise, counts of 296 to 3,600 where the truth is 3,000 with intervals about
#: the capped count (6 of 20 covered). Its noise is about 0.14 F of the cap's choice, and
#: a count of 0.8 F passes the 1.25 F gate in 2% of releases. Taken from the cap's part
#: instead (weight 1/2, a quarter on top, as a sum's), the family's COUNT
#: (``auto_bounds_unit.py --questions COUNT --releases 8``) went from median 0.98x, geometric
#: mean 1.00x, worst 3.1x to 1.05x, 1.19x, 17x (#48: caps of 512 rows fell to 139): the
#: tails at epsilon 0.3 need every bit of the cap's epsilon.
UNIT_ROWS_UNITS = 0.25
#: Caps per group chosen with no clamp beside them (a COUNT with private keys, or bounds
#: given and the caps left to the data) have the thin-data count too (``caps_thin_rule``: the
#: units), weighing CAPS_UNITS per cap chosen (1/4 of each cap's 1), all of it on top of the
#: share: the caps keep all of the share and the answer pays 2.5% of epsilon. Its noise is
#: about 0.13 F of the joint choice's. Without it, 300 units of 10 rows at epsilon 0.3 (two
#: private keys) chose r of 1 or 2 within the noise and answered 10% to 45% of the truth with
#: intervals about the capped counts, nothing said but a sentence before the charge (a bug
#: hunt).
CAPS_UNITS = 0.25
#: Where clamps are chosen, a noisy count of the units' worth of nonzero values the chosen
#: clamps keep (``kept_check``) weighs ``WEIGHTS["kept"]`` (1/2), all of it on top of the
#: share (and of ``RETRY_SHARE`` on the retry); below ``kept_bound`` (3 noise scales) the
#: choice is set aside as the thin-data rule's widest clamps are (the choice is made again,
#: or the widest clamps used). Without it, 500 units of 20 rows (values about N(100, 20), two
#: public keys) asked AVG at epsilon 0.5 answered 0 with the interval [0, 0] or 38 within
#: [33, 38] in 8 of 200 seeded releases: counts just above the thin-data threshold, where the
#: lowest magnitudes' plateau still holds a few percent of the choice's mass. A count of the
#: values the clamps cut, against a bound between the noise's rate t and the thin-data count
#: N, was tried first: the collapses came where the noisy N had passed its threshold well
#: above the true N, so the bound lay above what a collapsed clamp cut (6 of 200 kept at 3/4
#: of the way), and halfway it set aside sound clamps in 1.4% of the family's #42 (AVG over
#: 20 groups at epsilon 0.3: N 1,218, t 419; ``auto_bounds.py --family --only 42``). The
#: kept count needs no N: about 0 where the clamp collapsed, about N - t where it did not.
KEPT = "kept"


@dataclass(frozen=True)
class AutoPlan:
    """How a query's bounds will be chosen (fixed before anything is read).

    ``epsilons`` is each choice's epsilon (``choice_names``), ``request`` what the query
    itself then spends, ``partitions`` the number of partitions G the noise is paid in (the
    public keys; 1 otherwise), ``noise`` the noise's standard deviation per unit of
    sensitivity and ``exponent`` a (1: Laplace, L1; 1/2: Gaussian, L2)."""

    auto: AutoBounds
    epsilons: dict[str, float]  # per choice (``choice_names``)
    request: PrivacyRequest
    partitions: int
    noise: float
    exponent: float
    spent: float  # the bounds' choices' total epsilon (or rho, for a rho request)
    outer: float = 0.0  # the outer cap's choice (``choose_outer``), from the total's share
    total: float | None = None  # what measures the total (``_total``), for the second compile
    share: float = 0.0  # the share of the whole budget the bounds spend (``plan_auto``)
    values_share: float = 0.0  # of which a sum's histogram's (``value_factors``)
    kept_share: float = 0.0  # of which the clamps' kept count's (``kept_check``)
    tail_share: float = 0.0  # of which the row cap's tail's histogram's (``tail_histogram``)
    means: bool = False  # the histogram is a mean's: the light pairs too (``value_histogram``)

    def floor(self, choice: str, candidates: int, beta: float = BETA, *,
              monotonic: bool = False) -> float:
        """F = 2 ln(C / beta) / epsilon (ln(C / beta) / epsilon for a ``monotonic`` choice):
        C candidates scoring F below the best are, together, less likely than beta."""
        factor = 1.0 if monotonic else 2.0
        return factor * math.log(candidates / beta) / self.epsilons[choice]

    def target(self, k: float, *, per_partition: bool) -> float:
        """The noise's rate: G s a k^(a-1) for the partition cap k (``per_partition``, per
        unit beyond it), else G s k^a (per pair beyond the row cap, and per unit's worth of
        values beyond the magnitude)."""
        rate = self.partitions * self.noise
        if per_partition:
            return float(rate * self.exponent * float(k) ** (self.exponent - 1.0))
        return float(rate * float(k) ** self.exponent)


def _round_down(value: float) -> float:
    return math.nextafter(value, 0.0)


def joint_parts(auto: AutoBounds) -> list[str]:
    parts = [name for name in ("max_partitions", "max_rows_per_partition")
             if getattr(auto, name)]
    return parts + [f"magnitude:{column}" for column in auto.columns[:1]]


def _caps_chosen(auto: AutoBounds) -> int:
    """How many of the caps per group are chosen (0 to 2)."""
    return int(bool(auto.max_partitions)) + int(bool(auto.max_rows_per_partition))


def outer_names(auto: AutoBounds) -> list[str]:
    """The outer caps of total intervals to choose (``choose_outer``), in order."""
    return ([OUTER] if auto.unit_rows else []) + [f"{OUTER_SUM}:{c}" for c in auto.unit_sums]


def floor_columns(plan: Plan) -> tuple[str, ...]:
    """The columns whose clamp gets a floor (``choose_floor``): those chosen from the data
    whose every aggregate is a mean or a variance. Those are centred on the clamp's midpoint,
    so their noise grows with the clamp's width, where a SUM's grows with its magnitude
    whatever the floor (and would only be biased by one)."""
    if plan.auto is None:
        return ()
    out = []
    for column in plan.auto.columns:
        uses = [a for a in plan.aggregates
                if not isinstance(a, Count | CountUnits) and a.column == column]
        if uses and all(isinstance(a, Mean | Variance) for a in uses):
            out.append(column)
    return tuple(out)


def values_choice(plan: Plan) -> bool:
    """Whether a sum's or a mean's row cap is aimed per magnitude (``value_factors``):
    public, from the plan alone. Every aggregate a SUM, or every one an AVG; the row cap and
    the first column's clamp chosen, the bounds per partition (not ``bounding="unit"``)."""
    auto = plan.auto
    return (auto is not None and bool(auto.columns) and bool(auto.max_rows_per_partition)
            and plan.bounding != "unit" and bool(plan.aggregates)
            and (all(isinstance(agg, Sum) for agg in plan.aggregates)
                 or means_only(plan)))


def means_only(plan: Plan) -> bool:
    """Every aggregate a mean (AVG): its caps aim at ``MEAN_CAP_FACTOR`` times the targets,
    or, with the histogram of ``value_factors``, at the mean's own factors."""
    return bool(plan.aggregates) and all(isinstance(agg, Mean) for agg in plan.aggregates)


def values_weight(plan: Plan) -> float:
    """The weight of ``value_factors``' histogram in the budget (on top of the bounds'
    share): ``MEAN_VALUES_WEIGHT`` for a query of means, ``VALUES_WEIGHT`` for a query of
    sums; 0 where ``values_choice`` does not hold (no histogram)."""
    if not values_choice(plan):
        return 0.0
    return MEAN_VALUES_WEIGHT if means_only(plan) else WEIGHTS[VALUES]


def tail_weight(plan: Plan) -> float:
    """The weight of the row cap's tail histogram (``tail_multipliers``; on top of the
    bounds' share): ``TAIL_WEIGHT`` where the row cap is chosen per partition for COUNT(*)s
    and SUMs only, or for means only, else 0 (a variance's or a quantile's row cap keeps its
    rule). A row cut costs a COUNT(*) or a SUM the same wherever the cap stands (the
    argument of ``tail_multipliers``); a mean's cost per row cut is its factor's gap times
    the light rows' share lambda(r), and to first order in lambda the least of its squared
    error lies at the same 1 / sqrt(rho(r)) times its target."""
    auto = plan.auto
    return TAIL_WEIGHT if auto is not None and bool(auto.max_rows_per_partition) and \
        plan.bounding != "unit" and bool(plan.aggregates) and \
        (all(isinstance(agg, Count | Sum) for agg in plan.aggregates) or means_only(plan)) \
        else 0.0


def choice_names(auto: AutoBounds, floors: Sequence[str] = (), values: float = 0.0,
                 tail: float = 0.0) -> list[tuple[str, float]]:
    """The choices, in the order they are made, with their weights in the budget: one joint
    choice of the caps and the first column's magnitude (named by its parts joined with
    "+", weighing the sum of theirs: 1 per cap, 2 per magnitude), the further columns'
    magnitudes (2 each), each column's signs (1: a monotonic choice; 1/2 for a column in
    ``floors``), the ``floors`` (``floor_columns``: 1/2 each, taken from their signs') and,
    where a clamp is chosen, the thin-data rule's count (1, ``UNITS_ON_TOP`` of it on top
    of the share: ``plan_auto``); with ``values`` (``values_weight``, above 0) first the
    histogram of ``value_factors``, weighing ``values`` (on top of the share:
    ``plan_auto``); with ``tail`` (``tail_weight``) the row cap's tail histogram
    (``tail_histogram``), on top too."""
    parts = joint_parts(auto)
    names = [(TAIL, tail)] if tail else []
    names += [(VALUES, values)] if values else []
    names += [("+".join(parts), sum(WEIGHTS[part.split(":")[0]] for part in parts))]
    names += [(f"magnitude:{column}", WEIGHTS["magnitude"]) for column in auto.columns[1:]]
    # a column with a floor pays for it from its signs' weight: the other choices keep theirs
    names += [(f"signs:{column}", WEIGHTS["signs"] - (WEIGHTS["floor"] if column in floors
                                                      else 0.0)) for column in auto.columns]
    names += [(f"floor:{column}", WEIGHTS["floor"]) for column in floors]
    if auto.columns:  # the thin-data rule's count of units (``thin_rule``)
        names.append((UNITS, WEIGHTS["units"]))
    return names


def plan_auto(plan: Plan, request: PrivacyRequest, outer: float | None = None,
              remaining: float = 1.0, *, share_of_request: float | None = None,
              reuse_values: bool = False) -> tuple[AutoPlan, list[DpEvent]]:
    """Split the request between choosing ``plan.auto``'s bounds and the query; ``outer``
    (epsilon, or rho) pays for choosing a total interval's outer cap (``choose_outer``).
    ``request`` is the part ``remaining`` of the query's budget that is left after a total
    interval's share: the bounds' share stays a share of the whole budget. A sum's row cap
    is aimed per magnitude (``value_factors``) where ``values_choice`` holds.
    ``share_of_request``: the choices' part of ``request``, every choice included, instead
    of the one the plan's share gives (``plan_retry``). ``reuse_values``: no histogram of
    its own, the row cap aimed by the first choice's (``plan_retry``: post-processing of a
    release already paid for), so its weight goes to the other choices."""
    aimed = values_weight(plan)
    values = 0.0 if reuse_values else aimed
    tail = 0.0 if reuse_values else tail_weight(plan)
    auto = plan.auto
    unit_mode = plan.bounding == "unit"
    outers = outer_names(auto) if auto is not None and (outer or unit_mode) else []
    if auto is None or (auto.choices == 0 and not outers):
        raise InternalError("no bounds to choose; this is a bug")
    names = choice_names(auto, floor_columns(plan), values, tail) if auto.choices else []
    if unit_mode:  # the caps on each unit's total, from the bounds' share (weight 1 each)
        # the partition cap only sizes the private selection's count (``bounding``)
        names = [(name, WEIGHTS["unit_partitions"] if name == "max_partitions" else weight)
                 for name, weight in names]
        names += [(name, WEIGHTS["unit"]) for name in outers]
        if (auto.unit_sums or auto.unit_rows) and not any(name == UNITS for name, _ in names):
            # the thin-data rule's (``unit_thin``; ``UNIT_UNITS_ON_TOP``, and for a count
            # alone ``UNIT_ROWS_UNITS``, all of it on top)
            names.append((UNITS, WEIGHTS["unit_units"] if auto.unit_sums else
                          UNIT_ROWS_UNITS))
        outers = []
    caps_alone = not unit_mode and auto.choices > 0 and not auto.columns
    if caps_alone:  # the caps per group's thin-data count (``caps_thin_rule``), all on top
        names.append((UNITS, CAPS_UNITS * _caps_chosen(auto)))
    kept = not unit_mode and auto.choices > 0 and bool(auto.columns)
    kept_weight = WEIGHTS[KEPT]
    if kept:  # the count of what the clamps chosen keep (``kept_check``), all on top
        names.append((KEPT, kept_weight))
    weights = [w for _, w in names]
    share = auto.spent_share / remaining if names else 0.0
    # the histogram and part of the thin-data count on top of the bounds' share: the other
    # choices keep theirs
    counted = any(name == UNITS for name, _ in names)
    on_top = values + tail + \
        ((CAPS_UNITS * _caps_chosen(auto) if caps_alone else UNITS_ON_TOP if not unit_mode
          else UNIT_UNITS_ON_TOP if auto.unit_sums else UNIT_ROWS_UNITS) if counted else 0.0) \
        + (kept_weight if kept else 0.0)
    if on_top and share * sum(weights) / (sum(weights) - on_top) < 1.0:
        share *= sum(weights) / (sum(weights) - on_top)
    # else (a share near 1) the parts on top come from within it: nothing would be left
    if share_of_request is not None:
        share = share_of_request
        if kept and share * sum(weights) / (sum(weights) - kept_weight) < 1.0:
            # the kept count on top of the retry's part too: its choices keep all of it
            share *= sum(weights) / (sum(weights) - kept_weight)
    if share >= 1.0:
        if remaining < 1.0:
            raise UserError(f"the bounds' share ({auto.spent_share:g}) and the total "
                            f"interval's ({1 - remaining:g}) leave nothing for the query: lower "
                            "bounds_share, or ask for intervals='bounded'")
        raise UserError(f"the bounds' share ({auto.spent_share:g}), with what the thin-data "
                        "count and a sum's histogram take on top of it, leaves nothing for the "
                        "query: lower bounds_share")
    measures = len(plan.aggregates)
    zcdp = request.rho is not None
    whole = request.rho if zcdp else request.epsilon
    assert whole is not None
    chosen, main = _privacy.split(whole, [share, 1.0 - share]) if names else (0.0, whole)
    spends = list(zip([name for name, _ in names],
                      _privacy.split(chosen, weights) if names else [], strict=True))
    if outer is not None and outers:  # the outer caps share their part equally
        spends += zip(outers, _privacy.split(outer, [1.0] * len(outers)), strict=True)
    events: list[DpEvent] = []
    epsilons: dict[str, float] = {}
    for name, each in spends:  # epsilon-DP each; under rho, charged as epsilon^2 / 2-zCDP
        epsilon = each
        if zcdp:
            epsilon = math.sqrt(2.0 * each)
            while Fraction(epsilon) ** 2 / 2 > Fraction(each):
                epsilon = _round_down(epsilon)
        epsilons[name] = epsilon
        events.append(ZCDPEvent(each) if zcdp else PureDPEvent(each))
    if zcdp:
        rest = PrivacyRequest(rho=main, noise=request.noise, weights=request.weights)
        noise, exponent = 1.0 / math.sqrt(2.0 * main / measures), 0.5
    else:
        rest = PrivacyRequest(epsilon=main, delta=request.delta, noise=request.noise,
                              weights=request.weights)
        if request.kind == "laplace":
            noise, exponent = math.sqrt(2.0) * measures / main, 1.0
        else:
            rho = zcdp_rho_for(main, request.delta / 2 if plan.private_keys else request.delta)
            noise, exponent = 1.0 / math.sqrt(2.0 * rho / measures), 0.5
    if unit_mode and plan.private_keys and not zcdp and not count_selects(plan):
        # bounding="unit" selects private keys with no COUNT(*) by a separate step, whose
        # share of epsilon the measures do not get: the noise per unit of sensitivity is that
        # of the smallest share the measures do get (``_privacy.allocate``, public numbers)
        shares = _privacy.allocate(rest, [a.name for a in plan.aggregates], True)
        noise = (math.sqrt(2.0) / min(shares.pure.values()) if request.kind == "laplace"
                 else 1.0 / math.sqrt(2.0 * min(shares.rho.values())))
    spent = chosen
    partitions = len(plan.keys) if plan.keys is not None and plan.group_by else 1
    values_share = share * remaining * values / sum(weights) if values else 0.0
    kept_share = share * remaining * kept_weight / sum(weights) if kept else 0.0
    tail_share = share * remaining * tail / sum(weights) if tail else 0.0
    return AutoPlan(auto, epsilons, rest, partitions, noise, exponent, spent,
                    outer or 0.0, share=share * remaining, values_share=values_share,
                    means=aimed > 0.0 and means_only(plan), kept_share=kept_share,
                    tail_share=tail_share), events


def plan_retry(plan: Plan, first: AutoPlan, remaining: float = 1.0
               ) -> tuple[AutoPlan, list[DpEvent]] | None:
    """The choice made again where the thin-data rule would use the widest clamps (the
    module docstring, "Choosing again"): its plan, with ``RETRY_SHARE`` of the whole budget
    for the bounds in all, the first choices' part included, and the rest of ``first``'s
    request for the answer; and its choices' events. None where it does not apply: nothing
    is chosen (under ``bounding="unit"``, no cap on a unit's total), a total interval's
    outer caps are chosen too, ``bounding="unit"``'s caps are chosen after a private
    selection (``defers_unit_caps``), or the first choices already have half of what the
    retry's would spend in all. Public numbers only.

    Under ``bounding="unit"`` the thin-data rule is ``unit_thin``'s: where its noisy count is
    below its threshold, every cap (on a unit's rows and sums, and the partition cap) is
    chosen again as the clamps are here, from ``RETRY_SHARE`` of the budget in all. Caps
    per group chosen with no clamp beside them are chosen again where ``caps_thin_rule``
    would use the widest."""
    auto = plan.auto
    if auto is None or first.outer:
        return None
    if plan.bounding == "unit":
        if not (auto.unit_sums or auto.unit_rows) or defers_unit_caps(plan):
            return None
    elif auto.choices == 0 or outer_names(auto):
        return None
    whole_share = RETRY_SHARE / remaining  # of the request the first choices split
    first_share = first.share / remaining
    # the clamps' kept counts (``kept_check``) are on top of RETRY_SHARE, the first's and the
    # retry's: the other choices keep what they had without them
    first_choices = (first.share - first.kept_share) / remaining
    if whole_share < 2.0 * first_choices:
        return None
    # the first answer's part is 1 - first_share of the request; the retry's choices take
    # whole_share - first_choices of the request, so that its answer keeps 1 - whole_share
    # less the kept counts
    part = (whole_share - first_choices) / (1.0 - first_share)
    # the row cap aimed by the first choice's histogram (``choose_bounds``' ``aim``): no
    # second one, its weight to the other choices
    retry, events = plan_auto(plan, first.request, share_of_request=part, reuse_values=True)
    # of the first answer's request the retry takes retry.share (its clamps' kept count on top
    # of ``part``: ``plan_auto``); both shares as parts of the whole budget
    whole = first_share + (1.0 - first_share) * retry.share
    return replace(retry, share=whole * remaining,
                   kept_share=(1.0 - first_share) * retry.kept_share * remaining), events


def with_bounds(agg: Aggregate, bounds: dict[str, Bounds]) -> Aggregate:
    if isinstance(agg, Count | CountUnits) or agg.column not in bounds:
        return agg
    chosen = bounds[agg.column]
    if isinstance(agg, Quantile):
        return Quantile(agg.column, chosen, agg.name, q=agg.q, integer=agg.integer)
    if isinstance(agg, Variance):
        return Variance(agg.column, chosen, agg.name, std=agg.std)
    return type(agg)(agg.column, chosen, agg.name)


def partition_candidates(plan: Plan) -> list[int]:
    candidates = [c for c in PARTITION_CANDIDATES if plan.keys is None or c < len(plan.keys)]
    if plan.keys is not None and len(plan.keys) <= PARTITION_CANDIDATES[-1]:
        candidates.append(len(plan.keys))
    return candidates


def defers_unit_caps(plan: Plan) -> bool:
    """Whether ``bounding="unit"``'s caps are chosen after the private selection of the keys
    (``choose_unit_caps``): where the keys are private and a cap is left to the data. Their
    targets count the G partitions whose noise the answer pays (``AutoPlan.target``); before
    the selection G is unknown, and a choice aiming at one partition lands above the best
    cap wherever several are released (TPC-H's count by market segment, five released: caps
    of 140 to 198 rows where 128 is best). Not where a COUNT(*) selects the keys
    (``count_selects``): its noisy count under the cap M is the selection, so M comes first,
    aimed at one partition. Public numbers only."""
    auto = plan.auto
    return plan.bounding == "unit" and plan.private_keys and auto is not None and \
        bool(outer_names(auto)) and not count_selects(plan)


def count_selects(plan: Plan) -> bool:
    """Whether ``bounding="unit"``'s private keys are selected by the query's noisy COUNT(*)
    (``_compile._threshold_candidate``: where it has one, each unit kept to its first k
    partitions) rather than by a separate step with its own share of epsilon. Public numbers
    only."""
    return plan.bounding == "unit" and plan.private_keys and \
        any(type(a) is Count for a in plan.aggregates)
