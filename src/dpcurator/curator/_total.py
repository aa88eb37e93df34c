"""Intervals of the *total* COUNT(*) and SUM: the answer without the query's caps and clamping
(``intervals="total"``).

Why an outer cap. The caps make each unit's contribution small enough to hide, and the
released count estimates the *bounded* count B_p <= N_p, the true count of partition p. What
they removed, N_p - B_p >= 0, has no finite upper confidence bound that a DP mechanism can
give for every data set: one unit with arbitrarily many rows must stay hidden. So a total
interval has an outer cap M on the rows of one unit in all (``Plan.max_unit_rows``, given or
chosen from the data): it covers N_p whenever no unit has more than M rows, and the release
states M.

The measurement. T_p = sum over units u of n_(u,p) min(1, M / T_u), with n_(u,p) the unit's
rows in p and T_u its rows in all partitions (``MeasureSpec`` kind ``unit_rows``; each pair's
part truncated to an integer). Adding or removing a unit moves the vector (T_p) by at most M
in L1 (and so in L2); T_p <= N_p always, and T_p = N_p when every T_u <= M. It gets integer
noise of scale M / epsilon_t (discrete Laplace; discrete Gaussian for a rho request), paid
from ``SHARE`` of the query's budget (``Plan.total_share`` sets another): of that share,
``CHOICE_PART`` chooses M when it is not given (``_auto_units.choose_outer``) and the rest
measures T.

The interval at level 1 - alpha (``total_interval``), from the bounded count's noisy value
B~ and T~, both with noise symmetric about 0:

    [B~ - w_B, max(T~ + w_T, B~ + w_B)],
    P[Z_B > w_B] <= alpha / 10,  P[Z_T < -w_T] <= 9 alpha / 10.

N_p >= B_p, so the low end fails with probability at most alpha / 10; N_p = T_p under the
outer cap, so the high end fails with probability at most 9 alpha / 10 (a union bound gives
alpha; widening the high end to B~'s own never hurts). Most of alpha goes to the high end
because the low end is seldom tight: where the caps bind, N_p is well above B_p.

A SUM's total. S_p = sum over units of (the unit's exact sum in p of its values, clamped to
[-V, V] on a fixed-point grid) / 2^j_u, truncated toward zero, 2^j_u the least power of two
with A_u <= V 2^j_u, A_u the unit's sum of |value| over its pairs (``MeasureSpec`` kind
``unit_values``): a unit moves (S_p) by at most V in L1, and S_p is the true sum (on the
grid) when every A_u <= V, which the release states (``max_unit_sums``; V given, or chosen as
M is, from the units' sums of |value|). The clamping bounds say nothing about the true sum's
sign, so its interval is S~'s own, two-sided: [S~ - w, S~ + w], P[|Z| > w] <= alpha. S~ is
another estimate than the bounded sum's, so the release prints it as its own column, with
that interval beside it (``Release.totals``); the bounded sum keeps its bounded interval.

An outer cap below the inner caps would leave uncovered the units that the bounded answer keeps
whole: a chosen one is at least k r rows (``inner_unit_rows``) and k r max(|lo|, |hi|)
(``inner_unit_sum``), or at its limit where none reaches them; a given one below them, or one
at its limit, is a warning on the release (``_warnings``).

Where a total interval can be had (``available``): a COUNT(*) or SUM of a query with a privacy
unit, public keys or one global partition (private keys are selected from the bounded counts),
``rescale`` bounding (every row of every pair is read: sampled rows would miss the others) and
no quantile (which samples rows). Without a privacy unit each row is its own unit and no cap
removes a row: COUNT(*)'s bounded interval is already the total one, at no cost (a SUM's
clamping still binds: its interval stays bounded).

The share's parts: the outer caps to choose share ``CHOICE_PART`` of it equally, and the
measures (one count for the COUNT(*)s, one sum per SUM column) the rest equally.

The guarantee, under add/remove one privacy unit: each measure's noise is epsilon_t-DP (the
discrete Laplace of scale sensitivity / epsilon_t: Ghosh, Roughgarden and Sundararajan 2009)
or rho_t-zCDP (the discrete Gaussian: Canonne, Kamath and Steinke 2020, Theorem 4), by the
sensitivities above (``dpcurator.query.bounding``); each outer cap's choice is epsilon-DP
(permute-and-flip, McKenna and Sheldon 2020; monotonic, Ding, Kifer, Wang and Zhang 2021);
they compose with the query's other parts within its request (basic composition, or adding
rhos). Tested: ``tests/test_total_intervals.py`` audits both measures end to end with their
twins without the outer caps, and checks the coverage.

Reference for the one-sided construction: a standard union bound over two one-sided
confidence bounds (e.g. Casella and Berger, Statistical Inference, 2nd ed., Section 9.2).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dpcurator.errors import InternalError
from dpcurator.mechanisms import DiscreteGaussian, DiscreteLaplace
from dpcurator.noise import RandomSource
from dpcurator.query.bounding import MeasureSpec, ValueSpec
from dpcurator.query.errors import QueryError
from dpcurator.query.plan import Count, Plan, Quantile, Sum

from . import _privacy
from ._grid import value_scale
from ._privacy import PrivacyRequest

__all__ = ["CHOICE_PART", "SHARE", "alphas", "available", "inner_unit_rows", "inner_unit_sum",
           "measure", "resolve", "split", "sum_columns", "sum_measure", "total_interval"]

FloatArray = npt.NDArray[np.float64]

#: the share of a query's budget (epsilon, or rho) that a total interval costs
SHARE = 0.1
#: the part of that share that chooses the outer cap when the query does not give it
CHOICE_PART = 0.5
#: of alpha, the part given to the interval's low end (the bounded count's noise)
LOW_PART = 0.1


def _totals(plan: Plan) -> bool:
    return any(type(a) in (Count, Sum) for a in plan.aggregates)


def sum_columns(plan: Plan) -> list[str]:
    """The columns of the plan's SUMs, each with one outer-capped sum (in order)."""
    return list(dict.fromkeys(a.column for a in plan.aggregates
                              if type(a) is Sum and a.column is not None))


def inner_unit_rows(plan: Plan) -> int:
    """k r: the most rows the plan's caps let one unit keep (k as it binds: 1 with one global
    partition, at most the number of public keys; a cap not set counts 1). An outer cap
    below it would leave uncovered units that the bounded answer itself keeps whole."""
    k = plan.max_partitions or 1
    if not plan.group_by:
        k = 1
    elif plan.keys is not None:
        k = min(k, len(plan.keys))
    return k * (plan.max_rows_per_partition or 1)


def inner_unit_sum(plan: Plan, column: str) -> float:
    """k r max(|lo|, |hi|): the largest sum of |value| of ``column`` that the caps and the
    clamping bounds of the plan's SUMs of it let one unit keep (0 without such a SUM)."""
    largest = max((max(abs(a.bounds.lo), abs(a.bounds.hi)) for a in plan.aggregates
                   if type(a) is Sum and a.column == column and a.bounds is not None),
                  default=0.0)
    return float(inner_unit_rows(plan) * largest)


def available(plan: Plan, privacy_unit: str | None) -> bool:
    """Whether the plan's COUNT(*) and SUMs can have measured total intervals (module
    docstring)."""
    return (privacy_unit is not None and _totals(plan)
            and not plan.private_keys and (plan.bounding or "rescale") == "rescale"
            and not any(isinstance(a, Quantile) for a in plan.aggregates))


def resolve(plan: Plan, privacy_unit: str | None, default: str | None) -> tuple[str, bool]:
    """The plan's interval kind and whether it measures a total (an outer cap and its noise).

    Asked for (by the query, else the curator's ``default``), ``"total"`` must be available;
    not asked for, the kind is ``"bounded"``."""
    asked = plan.intervals or default
    counts = any(type(a) is Count for a in plan.aggregates)
    if not _totals(plan) or (privacy_unit is None and not counts):
        if asked == "total":
            raise QueryError("intervals='total' covers COUNT(*) and SUM (SUM with a privacy "
                             "unit), which this query does not have; ask for "
                             "intervals='bounded'")
        return "bounded", False
    if privacy_unit is None:
        return asked or "total", False  # no cap removes a row: COUNT(*)'s bounded is total
    if asked == "total" and not available(plan, privacy_unit):
        raise QueryError("intervals='total' (COUNT(*), SUM) needs public keys (keys=...) or "
                         "no GROUP BY, "
                         "bounding='rescale' and no quantile in the same query; ask for "
                         "intervals='bounded'")
    # Not asked for: bounded. A total interval's share (10%) costs every release 1 / 0.9 of
    # its noise, more than the 1.25x that bounds chosen from the data may cost in all (issue
    # 26: ``benchmarks/auto_bounds.py --family``), so it is had on request only.
    asked = asked or "bounded"
    return asked, asked == "total"


def split(request: PrivacyRequest, share: float = SHARE) -> tuple[PrivacyRequest, float]:
    """(what the query's aggregates spend, what the total costs: epsilon, or rho)."""
    if request.rho is not None:
        total, main = _privacy.split(request.rho, [share, 1.0 - share])
        return PrivacyRequest(rho=main, noise=request.noise, weights=request.weights), total
    assert request.epsilon is not None
    total, main = _privacy.split(request.epsilon, [share, 1.0 - share])
    return PrivacyRequest(epsilon=main, delta=request.delta, noise=request.noise,
                          weights=request.weights), total


def measure(outer: int, budget: float, zcdp: bool, source: RandomSource | None
            ) -> tuple[MeasureSpec, DiscreteLaplace | DiscreteGaussian]:
    """The outer-capped count's measure (integer: weight 1) and its noise: a discrete
    Laplace of epsilon ``budget``, or for a rho request a discrete Gaussian of rho ``budget``,
    calibrated to the sensitivity ``outer`` (L1 and L2)."""
    spec = MeasureSpec("total_unit_rows", "unit_rows", None, 1, outer)
    return spec, _noise(spec.outer, budget, zcdp, source)


def sum_measure(column: str, outer: float, grid: tuple[int, float], zcdp: bool,
                source: RandomSource | None
                ) -> tuple[MeasureSpec, DiscreteLaplace | DiscreteGaussian]:
    """The outer-capped sum of ``column``: values clamped to [-V, V] (V = ``outer``) on a
    fixed-point grid whose largest value is at most ``grid[0]`` (``_grid.unit_bound``:
    the noise's scale is then about 2^40 units), the same noise as ``measure`` with the
    budget ``grid[1]``, calibrated to the sensitivity V (in those units)."""
    bound, used = grid
    value = ValueSpec(column, -outer, outer, 0.0, value_scale(outer, bound))
    spec = MeasureSpec(f"total_unit_values_{column}", "unit_values", value, 1, value.bound)
    return spec, _noise(spec.outer, used, zcdp, source)


def _noise(sensitivity: int, budget: float, zcdp: bool, source: RandomSource | None
           ) -> DiscreteLaplace | DiscreteGaussian:
    if zcdp:
        return DiscreteGaussian(rho=budget, sensitivity=sensitivity, source=source)
    return DiscreteLaplace(epsilon=budget, sensitivity=sensitivity, source=source)


def total_interval(bounded: FloatArray, bounded_half_width: float, total: FloatArray,
                   total_half_width: float) -> tuple[FloatArray, FloatArray]:
    """[B~ - w_B, max(T~ + w_T, B~ + w_B)] (module docstring) from the noisy values in real
    units and the half-widths w with P[|Z| > w] <= 2 alpha / 10 (B) and 2 (9 alpha / 10)
    (T): symmetric noise puts half of each on either side."""
    if bounded.shape != total.shape:
        raise InternalError("bounded and total counts of different partitions; a bug")
    low = bounded - bounded_half_width
    high = np.maximum(total + total_half_width, bounded + bounded_half_width)
    return low, high


def alphas(alpha: float) -> tuple[float, float]:
    """The two-sided levels whose one-sided halves are the interval's (alpha / 10 for the
    low end, 9 alpha / 10 for the high end); a level of 1/2 or more (an interval below 50%
    confidence) is held at 1/2, which only widens it."""
    return min(2 * LOW_PART * alpha, 0.5), min(2 * (1 - LOW_PART) * alpha, 0.5)
