"""Caps on each unit's total (``bounding="unit"``), chosen from the data: a unit's rows in
all (``choose_unit_rows``) and its sum of |value| per column (``choose_unit_sum``), each one
permute-and-flip over the penalties of ``_auto_joint`` with its own thin-data count
(``unit_thin``); and a total interval's outer caps.

The outer cap of a total interval (``choose_outer``; ``dpcurator.curator._total``) is one
more choice, paid from the total interval's share, not the bounds': the units with more than
M rows (each pair weighing 1 / P, so one unit adds at most 1), with a fixed prior per octave.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from dpcurator.engines import PROFILE_STEPS
from dpcurator.noise import RandomSource
from dpcurator.query.plan import (
    MAX_UNIT_SUM,
    AutoBounds,
    Bounds,
    Plan,
    Sum,
)

from ._auto_joint import CAP, LAMBDA, MAGNITUDE_BEYOND, ROW_FACTOR, ramp_penalties, release_index
from ._auto_plan import (
    MAGNITUDES,
    OUTER,
    OUTER_SUM,
    UNIT_ROW_CANDIDATES,
    UNITS,
    AutoPlan,
    outer_names,
)
from ._auto_thin import THIN_WARN, count_threshold, noisy_count
from ._profile import Profile
from ._total import inner_unit_rows, inner_unit_sum

__all__ = ["choose_outer", "choose_outer_sum", "choose_unit_caps", "choose_unit_rows",
           "choose_unit_sum", "unit_row_scores", "unit_rows_threshold", "unit_sum_scores",
           "unit_thin", "unit_thin_statistic", "unit_thin_threshold", "widest_unit_caps",
           "with_outer"]

#: ``bounding="unit"``'s cap on a unit's rows in all ramps at 2.5 per octave, not ``LAMBDA``:
#: its one choice (eight steps an octave) has no joint partner, and with 4 a tail of a few
#: hundred heavy units at epsilon 0.3 priced every cap above the light units' rows out
#: (UNIT_ROW_CANDIDATES' M of 6 to 70 where 128 to 512 is best). On the family's 56 shapes
#: (``benchmarks/auto_bounds_unit.py``, 8 releases each, against the best fixed M in
#: hindsight): with 4 median 0.97x, geometric mean 1.13x, worst 18.1x, 45 within 1.25x;
#: with 2.5 0.98x, 1.00x, 3.1x, 46; with 2 1.04x, 1.05x, 3.9x, 44.
UNIT_ROW_LAMBDA = 2.5
#: ``bounding="unit"``'s cap V on a unit's sum aims at this many times the noise's rate
#: (``choose_unit_sum``): a unit above V is divided by a power of two, losing at least V / 2
#: where a clamp loses only the excess, so each unit beyond V costs more than Amin et al.'s
#: rule assumes and V aims at fewer of them than the row cap does. Measured 2026-12-02 with
#: the factor at 2, 1.5, 1, 1/2 and 1/4: the family's SUM (``auto_bounds_unit.py --questions
#: SUM --releases 8``, against the best fixed caps of both kinds) median 1.09x, 1.11x, 1.06x,
#: 1.08x, 1.10x; geometric mean 1.29x, 1.23x, 1.18x, 1.21x, 1.22x; within 1.25x 33, 38, 41,
#: 39, 39 of 56; TPC-H's revenue by priority at scale 0.1 (five public keys, customers in up
#: to five of them; median relative error over 60 to 100 releases) 0.0022, 0.0019, 0.0015 to
#: 0.0017, 0.0013, 0.0015, where V of 160 line items at the mean price is best in hindsight
#: (0.0009) and 128 cuts 68 customers, each halved; UCI Adult's SUM(hours) by education
#: (one row per person, values up to 99; 150 releases) RMSE 180, 180, 187: V = 107.6 in 97%,
#: 94% and 84% of releases, the rest spread above it.
UNIT_SUM_FACTOR = 1.0
OUTER_CANDIDATES = tuple(2**i for i in range(21))
OUTER_MARGIN = 2
OUTER_PRIOR = 1.0


def choose_outer(auto_plan: AutoPlan, stats: Profile, source: RandomSource | None,
                 least: float = 1.0) -> int:
    """A total interval's outer cap M (``dpcurator.curator._total``): permute-and-flip over
    M = 2^j scoring q_j = -U(2^j) - ``OUTER_PRIOR`` j / epsilon, U(M) the units with more than
    M rows, then ``OUTER_MARGIN`` times the choice (post-processing).

    The crossing (the smallest M no unit exceeds) scores best but for the prior; each octave
    above it is e^-``OUTER_PRIOR`` times as likely, and one below it is preferred only where
    fewer than ``OUTER_PRIOR`` / epsilon units exceed it (the prior pays for the width of the
    larger cap: the interval widens in proportion to M, while units above M break its cover).
    Adding a unit lowers or keeps every score and the prior is fixed, so the choice is
    monotonic: permute-and-flip with half the noise (Ding, Kifer, Wang and Zhang 2021).

    Never below the inner caps: only the candidates whose cap is at least ``least`` (k r, the
    rows the caps let one unit keep: ``_total.inner_unit_rows``) compete, and where none is,
    the largest cap (``Plan``'s limit) is taken without a choice. At small epsilon the prior
    alone would pick the smallest cap, whose interval then misses every partition. The inner
    caps are public or were chosen under DP before this choice, so the restriction is
    post-processing of those outputs, and the choice over it is still epsilon-DP on the data
    (adaptive composition; the scores are those above, restricted)."""
    epsilon = auto_plan.epsilons[OUTER]
    caps = OUTER_CANDIDATES
    final = [min(OUTER_MARGIN * c, caps[-1]) for c in caps]
    first = next((j for j, cap in enumerate(final) if cap >= least), None)
    if first is None:
        return int(caps[-1])
    octaves = np.log2(np.asarray(caps, dtype=np.float64))
    return int(final[_outer_index(stats.unit_rows(caps), octaves, epsilon, source, first)])


def choose_outer_sum(auto_plan: AutoPlan, stats: Profile, column: int, name: str,
                     source: RandomSource | None, least: float = 0.0) -> float:
    """A total SUM's outer cap V on a unit's sum of |value| of ``name`` (the profile's
    ``column``-th of the sums), as ``choose_outer`` chooses M: over V = 2^(q/4), q in
    ``PROFILE_STEPS``, at most ``MAX_UNIT_SUM``, and never below ``least`` (k r max(|lo|,
    |hi|), what the caps and the clamping let one unit keep: ``_total.inner_unit_sum``;
    ``MAX_UNIT_SUM`` where no candidate reaches it), as ``choose_outer`` argues."""
    epsilon = auto_plan.epsilons[f"{OUTER_SUM}:{name}"]
    final = [min(OUTER_MARGIN * 2.0 ** (q / 4), MAX_UNIT_SUM) for q in PROFILE_STEPS]
    first = next((j for j, cap in enumerate(final) if cap >= least), None)
    if first is None:
        return float(MAX_UNIT_SUM)
    octaves = np.asarray(PROFILE_STEPS, dtype=np.float64) / 4.0
    return float(final[_outer_index(stats.unit_sums(column), octaves, epsilon, source,
                                    first)])


def _outer_index(stats: Sequence[float], octaves: npt.NDArray[np.float64], epsilon: float,
                 source: RandomSource | None, first: int = 0) -> int:
    """Permute-and-flip (monotonic) over -(units beyond the candidate) minus the prior, among
    the candidates from ``first`` on (an index into all of them)."""
    prior = OUTER_PRIOR * (octaves - octaves[0]) / epsilon
    scores = -(np.asarray(stats, dtype=np.float64) + prior)
    return first + release_index(scores[first:], epsilon, source, monotonic=True)


def choose_unit_rows(auto_plan: AutoPlan, stats: Profile, source: RandomSource | None
                     ) -> int:
    """``bounding="unit"``'s cap M on a unit's rows in all: permute-and-flip over
    ``UNIT_ROW_CANDIDATES`` (eight steps an octave) with the penalties of the module
    docstring (``ramp_penalties``, ramp ``UNIT_ROW_LAMBDA``, capped at ``CAP`` times the floor),
    the statistic U(M) the units with more than M rows (``Profile.unit_rows``, exact on the
    grid), the target ``ROW_FACTOR`` G s: Amin et al.'s point, where the rows the cap
    removes per unit of M (the U(M) units beyond it lose one each) meet the noise's rate (G
    partitions, each with noise of standard deviation s M). One unit moves U by at most 1,
    so each penalty too."""
    scores, epsilon = unit_row_scores(auto_plan, stats)
    return int(UNIT_ROW_CANDIDATES[release_index(scores, epsilon, source)])


def unit_row_scores(auto_plan: AutoPlan, stats: Profile
                    ) -> tuple[npt.NDArray[np.float64], float]:
    """``choose_unit_rows``' scores over ``UNIT_ROW_CANDIDATES`` (minus its penalties) and its
    epsilon, before the draw (permute-and-flip, sensitivity ``_auto_joint.SENSITIVITY``):
    public so that the benchmarks weigh each cap by its exact probability."""
    epsilon = auto_plan.epsilons[OUTER]
    caps = UNIT_ROW_CANDIDATES
    target = ROW_FACTOR * auto_plan.target(1, per_partition=False)
    cap = CAP * auto_plan.floor(OUTER, len(caps))
    penalties = ramp_penalties(stats.unit_rows(caps), caps, target, cap, epsilon, UNIT_ROW_LAMBDA)
    return -penalties, epsilon


def choose_unit_sum(auto_plan: AutoPlan, stats: Profile, column: int, name: str,
                    source: RandomSource | None) -> float:
    """``bounding="unit"``'s cap V on a unit's sum of |value| of ``name`` (the profile's
    ``column``-th of the sums), as ``choose_unit_rows`` chooses M, over ``MAGNITUDES``
    (steps of 2^(1/4) up to ``MAX_UNIT_SUM``, where the profile's units' sums are exact), the
    target ``UNIT_SUM_FACTOR`` G s: a unit above V is divided by a power of two
    (``dpcurator.query.bounding``), losing at least half of its sum, more than the linear
    loss Amin et al.'s rule assumes, so V aims higher than M does."""
    scores, epsilon = unit_sum_scores(auto_plan, stats, column, name)
    return float(MAGNITUDES[release_index(scores, epsilon, source)])


def unit_sum_scores(auto_plan: AutoPlan, stats: Profile, column: int, name: str
                    ) -> tuple[npt.NDArray[np.float64], float]:
    """``choose_unit_sum``'s scores over ``MAGNITUDES`` and its epsilon, before the draw, as
    ``unit_row_scores`` gives ``choose_unit_rows``'. Past the ramp's cap the penalties rise
    as a magnitude's do (``_auto_joint.MAGNITUDE_BEYOND``): a cap far above every unit's sum
    is vanishingly unlikely, not merely rare."""
    choice = f"{OUTER_SUM}:{name}"
    epsilon = auto_plan.epsilons[choice]
    target = UNIT_SUM_FACTOR * auto_plan.target(1, per_partition=False)
    cap = CAP * auto_plan.floor(choice, len(MAGNITUDES))
    penalties = ramp_penalties(stats.unit_sums(column), MAGNITUDES, target, cap, epsilon, LAMBDA,
                               beyond=MAGNITUDE_BEYOND)
    return -penalties, epsilon


def unit_thin_threshold(auto_plan: AutoPlan) -> tuple[float, float]:
    """``bounding="unit"``'s thin-data rule (``unit_thin``): (its threshold, the floor F of a
    unit's sum's choice), as ``thin_threshold`` with that choice's F and target; with no sum,
    the cap on a unit's rows' (``unit_rows_threshold``). Public numbers only."""
    name = next((n for n in auto_plan.epsilons if n.startswith(f"{OUTER_SUM}:")), None)
    if name is None:
        return unit_rows_threshold(auto_plan), auto_plan.floor(OUTER, len(UNIT_ROW_CANDIDATES))
    floor = auto_plan.floor(name, len(MAGNITUDES))
    return count_threshold(floor, UNIT_SUM_FACTOR * auto_plan.target(1, per_partition=False)), floor


def unit_rows_threshold(auto_plan: AutoPlan) -> float:
    """The units ``bounding="unit"``'s cap on a unit's rows needs to be chosen from the
    data, as ``unit_thin_threshold`` for the sums: with fewer, its statistic is within the
    noise of every candidate's, and the cap chosen may cut most rows unseen (300 units of 10
    rows at epsilon 0.3: M of 1 to 12, a count of 296 to 3,600 against 3,000 with an
    interval about the capped count). Public numbers only; ``unit_thin``'s count checks it."""
    floor = auto_plan.floor(OUTER, len(UNIT_ROW_CANDIDATES))
    return count_threshold(floor, ROW_FACTOR * auto_plan.target(1, per_partition=False))


def unit_thin(auto_plan: AutoPlan, stats: Profile, source: RandomSource | None
              ) -> tuple[bool, bool, int | None, str | None]:
    """The thin-data rule of ``bounding="unit"``'s caps (whether the widest caps on a unit's
    sums replace those chosen, whether the widest cap on its rows does, the noisy count or
    None, a warning or None), as ``thin_rule``'s for the clamps: the least, over the summed
    columns, of the units whose sum of |value| of the column is nonzero (``Profile.unit_sums``
    at the lowest magnitude), or with no sum the units with a row (``Profile.unit_rows``
    above 0). Each count moves by at most 1 when a unit is added or removed, so their least
    does too. (It read the first column alone: a second column summed over 150 of 20,000
    units got a cap of 1e-6, an answer near zero with a tight interval; a bug hunt.) Made
    noisy by the discrete Laplace mechanism with the ``units``
    choice's epsilon. Below ``unit_thin_threshold`` the lowest caps score as well as the
    data's and the caps chosen fall near zero: an answer about zero with a tight interval (a
    bug hunt: 300 units at epsilon 1, caps of 5e-6 on sums of thousands, in 10 of 10
    releases, nothing said). The widest caps (``MAX_UNIT_SUM``) replace them then
    (post-processing), and the release says so; below ``THIN_WARN`` F the caps chosen are
    kept with a warning. The cap on a unit's rows is the widest (``UNIT_ROW_CANDIDATES``'
    last) where the same count is below its own threshold (``unit_rows_threshold``):
    post-processing too."""
    threshold, floor = unit_thin_threshold(auto_plan)
    sums = bool(auto_plan.auto.unit_sums)
    rows = OUTER in auto_plan.epsilons
    rows_threshold = unit_rows_threshold(auto_plan) if rows else -math.inf
    cut = (f"the cap on each unit's rows chosen beside them cannot locate a tail of fewer "
           f"than about {auto_plan.floor(OUTER, len(UNIT_ROW_CANDIDATES)):,.0f} units "
           "either, and rows beyond it are cut unseen (give max_unit_rows)") if rows else ""
    widest_rows = (f"the widest cap on each unit's rows ({UNIT_ROW_CANDIDATES[-1]:,}) was "
                   "used, so the answer is as uncertain as its interval says: give "
                   "max_unit_rows, or raise epsilon, or the share of it spent choosing it "
                   "(bounds_share)")
    if sums:
        each = " of each column summed" if len(auto_plan.auto.unit_sums) > 1 else ""
        widest = (f"too few units for epsilon to choose the caps on each unit's sum from the "
                  f"data (the choice needs about {threshold:,.0f} units' worth with a nonzero "
                  f"sum{each}, a unit spread over more than 8 partitions weighing 1/2 to 1); the "
                  f"widest caps ({MAX_UNIT_SUM:.3g}) were used, so the answer is as uncertain "
                  "as its interval says: give max_unit_sums, or raise epsilon, or the share "
                  "of it spent choosing them (bounds_share)")
    else:
        widest = (f"too few units for epsilon to choose the cap on each unit's rows from the "
                  f"data (the choice needs about {threshold:,.0f} units' worth, a unit spread "
                  f"over more than 8 partitions weighing 1/2 to 1); {widest_rows}")
    noisy = noisy_count(unit_thin_statistic(auto_plan, stats), auto_plan.epsilons[UNITS],
                        source)
    if noisy is None:
        return sums, rows, None, widest + (f"; {widest_rows}" if sums and rows else "")
    rows_widest = noisy < rows_threshold
    if noisy < threshold:
        if sums and rows:
            widest += f"; {widest_rows}" if rows_widest else f"; {cut}"
        return sums, rows_widest, noisy, widest
    if rows_widest:  # a sum's threshold below the rows' (not with this module's constants)
        return False, True, noisy, widest_rows
    if noisy < THIN_WARN * floor:
        what = ("the caps on each unit's total chosen from the data cannot locate a tail of "
                f"fewer than about {floor:,.0f} units; units beyond them are cut unseen (give "
                "max_unit_rows and max_unit_sums to be sure)") if sums else (
                "the cap on each unit's rows chosen from the data cannot locate a tail of "
                f"fewer than about {floor:,.0f} units; rows beyond it are cut unseen (give "
                "max_unit_rows to be sure)")
        worth = " with a nonzero sum" if sums else ""
        return False, False, noisy, (
            f"thin data for this epsilon (about {max(noisy, 0):,} units' worth{worth}): "
            + what)
    return False, False, noisy, None


def unit_thin_statistic(auto_plan: AutoPlan, stats: Profile) -> int:
    """``unit_thin``'s count before its noise: the least, over the summed columns, of the
    units with a nonzero sum of |value|, or with no sum the units with a row (each moves by
    at most 1 when a unit is added or removed)."""
    if auto_plan.auto.unit_sums:
        return math.floor(min(stats.unit_sums(c)[0]
                              for c in range(len(auto_plan.auto.unit_sums))))
    return math.floor(stats.unit_rows([0])[0])


def _with_unit_caps(auto_plan: AutoPlan, plan: Plan, chosen: dict[str, Any], stats: Profile,
                    source: RandomSource | None) -> tuple[Plan, dict[str, Any]]:
    """The plan with ``bounding="unit"``'s caps chosen (``choose_unit_rows``,
    ``choose_unit_sum``), each SUM's bounds the clamp [-V, V] its values get; the caps the
    widest where the data is thin (``unit_thin``)."""
    auto = auto_plan.auto
    thin = unit_thin(auto_plan, stats, source) if UNITS in auto_plan.epsilons else None
    if auto.unit_rows:
        chosen[OUTER] = UNIT_ROW_CANDIDATES[-1] if thin is not None and thin[1] else \
            choose_unit_rows(auto_plan, stats, source)
        plan = plan.replace(max_unit_rows=chosen[OUTER])
    sums = dict(plan.max_unit_sums)
    for index, column in enumerate(auto.unit_sums):  # the stated rule, or the choice
        sums[column] = float(MAX_UNIT_SUM) if thin is not None and thin[0] else \
            choose_unit_sum(auto_plan, stats, index, column, source)
    if thin is not None:
        chosen["units"] = thin[2]
        chosen["rule"] = "widest" if thin[0] or thin[1] else "chosen"
        if thin[3]:
            chosen["warnings"] = [*chosen.get("warnings", ()), thin[3]]
    top = _at_the_top(auto, chosen, sums, thin)
    if top:
        chosen["warnings"] = [*chosen.get("warnings", ()), *top]
    if auto.unit_sums:
        chosen["max_unit_sums"] = {c: sums[c] for c in auto.unit_sums}
    aggregates = _clamped_by_caps(plan, sums)
    if "method" not in chosen:
        cost = "rho" if auto_plan.request.rho is not None else "epsilon"
        chosen[cost] = auto_plan.spent
        chosen["share"] = auto.spent_share
    chosen["unit_method"] = (
        "permute-and-flip over the caps on each unit's total (Amin et al. 2019's "
        "bias-variance rule, penalties ramping above it); epsilons " +
        ", ".join(f"{n} {v:.3g}" for n, v in auto_plan.epsilons.items()
                  if n in outer_names(auto)))
    return plan.replace(aggregates=aggregates, max_unit_sums=tuple(sums.items())), chosen


def _at_the_top(auto: AutoBounds, chosen: dict[str, Any], sums: dict[str, float],
                thin: tuple[bool, bool, int | None, str | None] | None) -> list[str]:
    """What a cap chosen at the largest candidate says: units beyond it may have been cut
    (the thin-data rule's widest caps say so themselves). 700 units of values 1e15 got the
    cap 2^40 on each unit's sum and an answer of 6.9e14 with a tight interval where the
    truth is 5e18, with nothing said (a bug hunt); the caps per group said so already."""
    out = []
    if auto.unit_rows and chosen.get(OUTER) == UNIT_ROW_CANDIDATES[-1] and \
            not (thin is not None and thin[1]):
        out.append(f"the cap on each unit's rows chosen from the data is the largest the "
                   f"choice can pick ({UNIT_ROW_CANDIDATES[-1]:,}): rows beyond it, if any, "
                   "were cut")
    top = [c for c in auto.unit_sums if sums[c] >= MAX_UNIT_SUM and
           not (thin is not None and thin[0])]
    if top:
        out.append(f"the cap on each unit's sum of |{', '.join(top)}| chosen from the data is "
                   f"the largest the choice can pick ({MAX_UNIT_SUM:.3g}): values beyond it "
                   "were clamped and larger sums divided, so the answer may be far below the "
                   "truth; for values this large ask for bounding='rescale' with bounds")
    return out


def _clamped_by_caps(plan: Plan, sums: dict[str, float]) -> tuple[Any, ...]:
    """The plan's aggregates, each SUM of a column in ``sums`` clamped to [-V, V] by its cap
    V (``bounding="unit"``: the unit's sum of |value| is capped at V)."""
    return tuple(type(a)(a.column, Bounds(-sums[a.column], sums[a.column]), a.name)
                 if isinstance(a, Sum) and a.column in sums else a for a in plan.aggregates)


def widest_unit_caps(plan: Plan, auto: AutoBounds) -> Plan:
    """The plan with ``auto``'s caps on each unit's total at the widest candidates, which the
    candidates' proof compiled (``_candidates``): the first pass of a query whose caps are
    chosen after the selection (``defers_unit_caps``). Only the selection reads that pass,
    and a unit's selection count does not depend on these caps
    (``dpcurator.query.bounding``, stage 3, ``select``)."""
    sums = dict(plan.max_unit_sums)
    for column in auto.unit_sums:
        sums[column] = float(MAX_UNIT_SUM)
    aggregates = _clamped_by_caps(plan, sums)
    rows = UNIT_ROW_CANDIDATES[-1] if auto.unit_rows else plan.max_unit_rows
    return plan.replace(aggregates=aggregates, max_unit_rows=rows,
                        max_unit_sums=tuple(sums.items()))


def choose_unit_caps(auto_plan: AutoPlan, plan: Plan, chosen: dict[str, Any],
                     profile: Sequence[tuple[Any, ...]], partitions: int,
                     source: RandomSource | None) -> tuple[Plan, dict[str, Any]]:
    """``bounding="unit"``'s caps chosen once the private selection released ``partitions``
    keys (``defers_unit_caps``): as ``_with_unit_caps`` chooses them, with G that number
    (at least 1) instead of 1. The choices spend the epsilons they always had; G, an output
    of the selection (a mechanism of its own), only moves their targets: the choices run
    after it, on the same profile, and compose with it as before (adaptive composition)."""
    aimed = replace(auto_plan, partitions=max(1, partitions))
    plan, chosen = _with_unit_caps(aimed, plan, chosen, Profile(profile), source)
    chosen["unit_method"] += (f"; aimed at the {partitions:,} partitions the selection "
                              "released")
    return plan, chosen


def with_outer(auto_plan: AutoPlan, plan: Plan, chosen: dict[str, Any], stats: Profile,
               source: RandomSource | None, defer_unit_caps: bool = False
               ) -> tuple[Plan, dict[str, Any]]:
    """The plan with a total interval's outer cap chosen, when asked (``choose_outer``), or
    ``bounding="unit"``'s caps (``_with_unit_caps``; the widest, for now, where they are
    chosen after the keys: ``defer_unit_caps``)."""
    auto = auto_plan.auto
    if not outer_names(auto):
        return plan, chosen
    if plan.bounding == "unit":
        if defer_unit_caps:
            return widest_unit_caps(plan, auto), chosen
        return _with_unit_caps(auto_plan, plan, chosen, stats, source)
    cost = "rho" if auto_plan.request.rho is not None else "epsilon"
    if auto.unit_rows:  # never below the inner caps, chosen or given (``choose_outer``)
        outer = choose_outer(auto_plan, stats, source, inner_unit_rows(plan))
        chosen[OUTER] = outer
        plan = plan.replace(max_unit_rows=outer)
    sums = dict(plan.max_unit_sums)
    for index, column in enumerate(auto.unit_sums):
        sums[column] = choose_outer_sum(auto_plan, stats, index, column, source,
                                        inner_unit_sum(plan, column))
    if auto.unit_sums:
        chosen["max_unit_sums"] = {c: sums[c] for c in auto.unit_sums}
    chosen[f"outer_caps_{cost}"] = auto_plan.outer  # what choosing them cost, in all
    return plan.replace(max_unit_sums=tuple(sums.items())), chosen
