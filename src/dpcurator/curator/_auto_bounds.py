"""Contribution bounds chosen from the data under DP (``bounds="auto"``).

A query that gives no ``max_partitions``, ``max_rows_per_partition`` or clamping bounds for a
column can have them chosen from the data, spending a stated share of its budget (10% by
default, ``AutoBounds.share``); the rest answers the query with the chosen bounds. The
release states the bounds chosen and what choosing them cost.

The rule. A cap tau trades bias (what the units beyond tau lose) against noise (whose scale
grows with tau). Raising tau removes bias at the rate of the mass beyond tau and adds noise
at the rate d(sigma)/d(tau), so the best tau is where the amount beyond tau is about the
noise's rate: Amin, Kulesza, Munoz Medina and Vassilvitskii, "Bounding user contributions: a
bias-variance trade-off in differential privacy" (ICML 2019), Section 3. For G partitions
each with noise s k^a r (a = 1 under Laplace noise, 1/2 under Gaussian) that rate is
``AutoPlan.target``. A small count cannot be located with a small epsilon: candidates
beyond the data all score alike, and one far beyond it would multiply the noise. So the
target is raised to at least ``AutoPlan.floor`` = 2 ln(C / beta) / epsilon (beta = 1e-4),
which makes every candidate past the data less likely, together, than beta: a slightly
lower bound (a little more bias), and a bound far beyond the data almost never.

The mechanism. Each choice is permute-and-flip (McKenna and Sheldon 2020;
``PermuteAndFlip``, epsilon-DP, never worse than the exponential mechanism) over candidates
in steps of 2^(1/4) (finer than the powers of two a person would try), with the score

    u_j = -max(0, stat_j - t_j, t_(j-1) - stat_(j-1))          (u_0 = -max(0, stat_0 - t_0))

where stat_j, decreasing in j, is how much lies beyond candidate j and t_j its target: 0
exactly at the smallest candidate whose statistic is within its target. Each statistic
weighs a unit's parts so that one unit adds at most 1 to it (``Profile``), so every score
moves by at most 1 when a unit is added or removed (the sensitivity; the max of terms that
each move by at most 1):

- ``max_partitions``: units with more than K partitions, each of a unit's pairs weighing
  1 / P (P, the unit's number of partitions, rounded up by the engine: the weights never
  exceed the exact ones);
- ``max_rows_per_partition``: pairs with more than R rows, each weighing 1 / P;
- a column's bounds: first a magnitude M (values with |x| > M, each weighing 1 / T, T the
  unit's rows), then the signs among [0, M], [-M, 0] and [-M, M] (scores: minus the
  negative values, minus the positive ones, minus a fixed price ``floor``).

The choices are made in that order (the later targets use the k chosen), and the row cap and
magnitudes, where the error moves fastest, get twice the others' share of epsilon.

The statistics are computed inside the engine from counts only (``BoundedQuery.profile``).
Cost: each choice is epsilon-DP (``PureDP``) under add/remove one unit; with a rho request
it is charged as epsilon^2 / 2-zCDP (Bun and Steinke 2016, Proposition 1.4). The choices and
the query compose (basic composition for (epsilon, delta), adding rhos for zCDP).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dpcurator.accounting.conversions import zcdp_rho_for
from dpcurator.accounting.events import DpEvent, PureDPEvent, ZCDPEvent
from dpcurator.engines._sql import PROFILE_STEPS
from dpcurator.errors import InternalError
from dpcurator.mechanisms.exponential import PermuteAndFlip
from dpcurator.noise import RandomSource
from dpcurator.query.plan import (
    Aggregate,
    AutoBounds,
    Bounds,
    Count,
    CountUnits,
    Plan,
    Quantile,
    Variance,
)

from . import _privacy
from ._privacy import PrivacyRequest

__all__ = ["AutoPlan", "Profile", "choose_bounds", "plan_auto"]

PARTITION_CANDIDATES = tuple(2**i for i in range(11))  # 1 .. 1024
# 1 .. 4096 in steps of about 2^(1/4): finer than powers of two, where the error moves fast
ROW_CANDIDATES = tuple(sorted({round(2 ** (i / 4)) for i in range(49)}))
# value bounds: 0, then the engine's bucket steps 2^(q/4), 2^-20 .. 2^40 (PROFILE_STEPS)
MAGNITUDES = (0.0, *(2.0 ** (q / 4) for q in PROFILE_STEPS))
BETA = 1e-4
#: beta for the choices whose worst candidate costs at most a small factor of noise: the
#: partition cap over public keys (at most their number) and the signs (at most 2x)
BETA_BOUNDED = 0.05


@dataclass(frozen=True)
class AutoPlan:
    """How a query's bounds will be chosen (fixed before anything is read).

    ``epsilon`` is each choice's epsilon, ``request`` what the query itself then spends,
    ``partitions`` the number of partitions G the noise is paid in (the public keys; 1
    otherwise), ``noise`` the noise's standard deviation per unit of sensitivity and
    ``exponent`` a (1: Laplace, L1; 1/2: Gaussian, L2)."""

    auto: AutoBounds
    epsilons: dict[str, float]  # per choice (``choice_names``)
    request: PrivacyRequest
    partitions: int
    noise: float
    exponent: float
    spent: float  # the choices' total epsilon (or rho, for a rho request)

    def floor(self, choice: str, candidates: int, beta: float = BETA) -> float:
        """The least target a selection among ``candidates`` can locate (module docstring)."""
        return 2.0 * math.log(candidates / beta) / self.epsilons[choice]

    def target(self, k: float, *, per_partition: bool) -> float:
        """The noise's rate: G s a k^(a-1) for the partition cap k (``per_partition``), else
        G s k^(a-1) (rows and values, per unit of the statistic)."""
        rate = self.partitions * self.noise * float(k) ** (self.exponent - 1.0)
        return float(rate * (self.exponent if per_partition else 1.0))


def _round_down(value: float) -> float:
    return math.nextafter(value, 0.0)


def choice_names(auto: AutoBounds) -> list[tuple[str, float]]:
    """The choices, in the order they are made, with their weights in the budget: the row
    cap and upper bounds, where the error moves fastest, weigh 2; the others 1."""
    names: list[tuple[str, float]] = []
    if auto.max_partitions:
        names.append(("max_partitions", 1.0))
    if auto.max_rows_per_partition:
        names.append(("max_rows_per_partition", 2.0))
    for column in auto.columns:
        names += [(f"magnitude:{column}", 2.0), (f"signs:{column}", 1.0)]
    return names


def plan_auto(plan: Plan, request: PrivacyRequest) -> tuple[AutoPlan, list[DpEvent]]:
    """Split the request between choosing ``plan.auto``'s bounds and the query."""
    auto = plan.auto
    if auto is None or auto.choices == 0:
        raise InternalError("no bounds to choose; this is a bug")
    names = choice_names(auto)
    weights = [w for _, w in names]
    measures = len(plan.aggregates)
    events: list[DpEvent] = []
    epsilons: dict[str, float] = {}
    if request.rho is not None:
        chosen, main = _privacy.split(request.rho, [auto.share, 1.0 - auto.share])
        for (name, _), each in zip(names, _privacy.split(chosen, weights), strict=True):
            epsilon = math.sqrt(2.0 * each)
            while Fraction(epsilon) ** 2 / 2 > Fraction(each):
                epsilon = _round_down(epsilon)
            epsilons[name] = epsilon
            events.append(ZCDPEvent(each))
        rest = PrivacyRequest(rho=main, noise=request.noise, weights=request.weights)
        noise, exponent = 1.0 / math.sqrt(2.0 * main / measures), 0.5
        spent = chosen
    else:
        assert request.epsilon is not None
        chosen, main = _privacy.split(request.epsilon, [auto.share, 1.0 - auto.share])
        for (name, _), epsilon in zip(names, _privacy.split(chosen, weights), strict=True):
            epsilons[name] = epsilon
            events.append(PureDPEvent(epsilon))
        rest = PrivacyRequest(epsilon=main, delta=request.delta, noise=request.noise,
                              weights=request.weights)
        if request.kind == "laplace":
            noise, exponent = math.sqrt(2.0) * measures / main, 1.0
        else:
            rho = zcdp_rho_for(main, request.delta / 2 if plan.private_keys else request.delta)
            noise, exponent = 1.0 / math.sqrt(2.0 * rho / measures), 0.5
        spent = chosen
    partitions = len(plan.keys) if plan.keys is not None and plan.group_by else 1
    return AutoPlan(auto, epsilons, rest, partitions, noise, exponent, spent), events


def _with_bounds(agg: Aggregate, bounds: dict[str, Bounds]) -> Aggregate:
    if isinstance(agg, Count | CountUnits) or agg.column not in bounds:
        return agg
    chosen = bounds[agg.column]
    if isinstance(agg, Quantile):
        return Quantile(agg.column, chosen, agg.name, q=agg.q)
    if isinstance(agg, Variance):
        return Variance(agg.column, chosen, agg.name, std=agg.std)
    return type(agg)(agg.column, chosen, agg.name)


def _score(stats: Sequence[float], targets: Sequence[float]) -> list[float]:
    """u_j = -max(0, stat_j - t_j, t_(j-1) - stat_(j-1)): 0 at the crossing (docstring)."""
    scores = []
    for j, (stat, target) in enumerate(zip(stats, targets, strict=True)):
        below = targets[j - 1] - stats[j - 1] if j else 0.0
        scores.append(-max(0.0, stat - target, below))
    return scores


def _select_scores(scores: Sequence[float], epsilon: float,
                   source: RandomSource | None) -> int:
    return int(PermuteAndFlip(epsilon=epsilon, sensitivity=1.0, source=source).release(scores))


def _select(stats: Sequence[float], targets: Sequence[float], epsilon: float,
            source: RandomSource | None) -> int:
    mechanism = PermuteAndFlip(epsilon=epsilon, sensitivity=1.0, source=source)
    return int(mechanism.release(_score(stats, targets)))


class Profile:
    """The statistics of the module docstring, from a profile's rows (``BoundedQuery.profile``):
    each moves by at most 1 when one unit is added or removed."""

    def __init__(self, rows: Sequence[tuple[Any, ...]]) -> None:
        # (partitions of the unit P, rows of the pair n, pairs) and, per column,
        # (rows of the unit T, sign, bucket q, values)
        self.pairs = [(int(r[1]), int(r[2]), int(r[5])) for r in rows if r[0] == 0]
        self.values: dict[int, list[tuple[int, int, int, int]]] = {}
        for r in rows:
            if r[0] != 0:
                self.values.setdefault(int(r[0]) - 1, []).append(
                    (int(r[1]), int(r[3]), int(r[4]), int(r[5])))

    def partitions(self, caps: Sequence[int]) -> list[float]:
        """Units with more than K partitions (each pair weighs 1 / P)."""
        return [sum(c / p for p, _, c in self.pairs if p > cap) for cap in caps]

    def rows(self, caps: Sequence[int]) -> list[float]:
        """Pairs with more than R rows, each weighing 1 / P: a unit adds the fraction of its
        partitions beyond R."""
        return [sum(c / p for p, n, c in self.pairs if n > cap) for cap in caps]

    def magnitudes(self, column: int) -> list[float]:
        """Values above 2^(q/4) in magnitude, q in ``PROFILE_STEPS`` (each weighs 1 / T)."""
        values = self.values.get(column, [])
        return [sum(c / t for t, _, b, c in values if b >= q) for q in PROFILE_STEPS]

    def signs(self, column: int) -> tuple[float, float]:
        """(negative, positive) values above 2^-20 in magnitude (each weighs 1 / T)."""
        values = self.values.get(column, [])
        first = PROFILE_STEPS[0]
        return (sum(c / t for t, s, b, c in values if s < 0 and b >= first),
                sum(c / t for t, s, b, c in values if s > 0 and b >= first))


def choose_bounds(auto_plan: AutoPlan, plan: Plan, profile: Sequence[tuple[Any, ...]],
                  columns: Sequence[str], source: RandomSource | None
                  ) -> tuple[Plan, dict[str, Any]]:
    """The plan with its bounds chosen from ``profile`` (the engine's rows for a
    ``BoundedQuery.profile`` of ``columns``), and what the release says about them."""
    auto = auto_plan.auto
    stats = Profile(profile)
    eps = auto_plan.epsilons
    k = plan.max_partitions or 1
    chosen: dict[str, Any] = {}
    if auto.max_partitions:
        candidates = [c for c in PARTITION_CANDIDATES
                      if plan.keys is None or c < len(plan.keys)]
        if plan.keys is not None and len(plan.keys) <= PARTITION_CANDIDATES[-1]:
            candidates.append(len(plan.keys))
        floor = auto_plan.floor("max_partitions", len(candidates),
                                BETA_BOUNDED if plan.keys is not None else BETA)
        targets = [max(auto_plan.target(cap, per_partition=True), floor) for cap in candidates]
        k = candidates[_select(stats.partitions(candidates), targets, eps["max_partitions"],
                               source)]
        chosen["max_partitions"] = k
    r = plan.max_rows_per_partition or 1
    if auto.max_rows_per_partition:
        target = max(auto_plan.target(k, per_partition=False),
                     auto_plan.floor("max_rows_per_partition", len(ROW_CANDIDATES)))
        r = ROW_CANDIDATES[_select(stats.rows(ROW_CANDIDATES), [target] * len(ROW_CANDIDATES),
                                   eps["max_rows_per_partition"], source)]
        chosen["max_rows_per_partition"] = r
    bounds: dict[str, Bounds] = {}
    for index, column in enumerate(columns):
        choice = f"magnitude:{column}"
        target = max(auto_plan.target(k, per_partition=False),
                     auto_plan.floor(choice, len(PROFILE_STEPS)))
        magnitude = MAGNITUDES[1 + _select(stats.magnitudes(index), [target] * len(
            PROFILE_STEPS), eps[choice], source)]
        # the signs: [0, M] costs the negative values, [-M, 0] the positive ones, [-M, M] a
        # fixed price (twice the width: twice the noise of a mean)
        choice = f"signs:{column}"
        negative, positive = stats.signs(index)
        both = auto_plan.floor(choice, 3, BETA_BOUNDED)
        lo, hi = ((0.0, magnitude), (-magnitude, 0.0), (-magnitude, magnitude))[
            _select_scores([-negative, -positive, -both], eps[choice], source)]
        bounds[column] = Bounds(lo, hi)
    if bounds:
        chosen["bounds"] = {c: (b.lo, b.hi) for c, b in bounds.items()}
    aggregates = [_with_bounds(agg, bounds) for agg in plan.aggregates]
    final = plan.replace(aggregates=tuple(aggregates), max_partitions=k,
                         max_rows_per_partition=r, auto=None)
    cost_name = "rho" if auto_plan.request.rho is not None else "epsilon"
    chosen[cost_name] = auto_plan.spent
    chosen["share"] = auto.share
    chosen["method"] = ("permute-and-flip over steps of 2^(1/4), one choice per bound "
                        "(Amin et al. 2019's bias-variance rule); epsilons " +
                        ", ".join(f"{name} {value:.3g}" for name, value in eps.items()))
    return final, chosen
