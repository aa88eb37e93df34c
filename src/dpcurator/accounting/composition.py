"""Composition of (epsilon, delta)-DP guarantees: basic, advanced, Kairouz et al., and optimal.

Each function takes guarantees of adaptively chosen mechanisms run on the same data and returns
a ``Composition``: the composed ``ApproxDP`` guarantee and a short name of the theorem that gave
it. All guarantees must share one neighbouring relation; the result keeps it. Reported epsilons
and deltas are rounded up.

- ``compose_basic``: sum of epsilons and of deltas (Dwork, Kenthapadi, McSherry, Mironov and Naor
  2006; Dwork and Roth 2014, Theorem 3.16).
- ``compose_advanced``: k-fold composition of one (epsilon, delta) guarantee, Dwork, Rothblum and
  Vadhan, "Boosting and differential privacy" (FOCS 2010), Theorem III.3 (Dwork and Roth 2014,
  Theorem 3.20).
- ``compose_kairouz``: heterogeneous sequences, Kairouz, Oh and Viswanath, "The composition
  theorem for differential privacy" (ICML 2015; IEEE Trans. Inf. Theory 2017), Theorem 3.5.
- ``compose_optimal_homogeneous``: the exact, optimal k-fold composition of one (epsilon, delta)
  guarantee, Kairouz, Oh and Viswanath 2015, Theorem 3.3, solved for epsilon at a target delta.
- ``compose``: the tightest of the above that applies, for a target delta.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from numbers import Integral
from typing import NamedTuple

import numpy as np
from scipy.special import gammaln, logsumexp

from dpcurator.accounting.guarantees import ApproxDP, Neighbouring, PureDP
from dpcurator.errors import UserError, UserTypeError

__all__ = [
    "Composition",
    "compose",
    "compose_advanced",
    "compose_basic",
    "compose_kairouz",
    "compose_optimal_homogeneous",
    "optimal_homogeneous_delta",
]

_REL_SLACK = 1e-9


class Composition(NamedTuple):
    """A composed guarantee and the name of the theorem that gave it."""

    guarantee: ApproxDP
    method: str


def _up(x: float, rel: float = _REL_SLACK) -> float:
    if not math.isfinite(x) or x == 0.0:  # an exact zero (pure DP's delta) stays exact
        return x
    return math.nextafter(x + abs(x) * rel, math.inf)


def _as_pairs(
    guarantees: Sequence[PureDP | ApproxDP],
) -> tuple[list[float], list[float], Neighbouring]:
    if isinstance(guarantees, PureDP | ApproxDP):
        raise UserTypeError("guarantees must be a sequence of PureDP/ApproxDP, not a single one")
    items = list(guarantees)
    if not items:
        raise UserError("guarantees must not be empty: there is nothing to compose")
    for g in items:
        if not isinstance(g, PureDP | ApproxDP):
            raise UserTypeError(
                f"guarantees must be PureDP or ApproxDP, got {type(g).__name__}; convert zCDP/RDP "
                "with dpcurator.accounting.conversions or use the RDP accountant"
            )
    relations = {g.neighbouring for g in items}
    if len(relations) != 1:
        raise UserError(
            "guarantees hold under different neighbouring relations; compose only guarantees "
            "stated for the same relation"
        )
    return [g.epsilon for g in items], [g.delta for g in items], relations.pop()


def _check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, Integral) or k < 1:  # numpy integers too
        raise UserError(f"k must be an integer >= 1, got {k!r}")
    return int(k)


def _check_unit_open(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UserTypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    if math.isnan(v) or not 0 < v < 1:
        raise UserError(f"{name} must lie in (0, 1), got {value!r}")
    return v


def _approx(epsilon: float, delta: float, relation: Neighbouring) -> ApproxDP:
    if not delta < 1:
        raise UserError(
            "the composed delta reaches 1: this composition gives no guarantee; use fewer "
            "mechanisms or smaller deltas"
        )
    return ApproxDP(epsilon, delta, relation)


def _one_minus_product(deltas: Sequence[float]) -> float:
    """1 - prod(1 - d_i), computed as -expm1(sum log1p(-d_i)) and rounded up."""
    return _up(-math.expm1(math.fsum(math.log1p(-d) for d in deltas)))


# --------------------------------------------------------------------------------------------
# basic and advanced
# --------------------------------------------------------------------------------------------


def compose_basic(guarantees: Sequence[PureDP | ApproxDP]) -> Composition:
    """(sum eps_i, sum delta_i)-DP (Dwork and Roth 2014, Theorem 3.16; adaptive choice allowed)."""
    eps, deltas, relation = _as_pairs(guarantees)
    return Composition(
        _approx(_up(math.fsum(eps), 1e-15), _up(math.fsum(deltas), 1e-15), relation), "basic"
    )


def compose_advanced(guarantee: PureDP | ApproxDP, k: int, delta_slack: float) -> Composition:
    """k-fold adaptive composition of one (eps, delta) guarantee by advanced composition.

    eps' = sqrt(2 k ln(1/delta')) eps + k eps (e^eps - 1), delta_total = k delta + delta'
    (Dwork, Rothblum and Vadhan 2010, Theorem III.3; Dwork and Roth 2014, Theorem 3.20), where
    delta' = ``delta_slack`` in (0, 1).
    """
    (e,), (d,), relation = _as_pairs([guarantee])
    k = _check_k(k)
    slack = _check_unit_open("delta_slack", delta_slack)
    eps = math.sqrt(2 * k * math.log(1 / slack)) * e + k * e * math.expm1(e)
    return Composition(_approx(_up(eps), _up(k * d + slack, 1e-15), relation), "advanced")


def _kairouz_epsilon(eps: Sequence[float], slack: float) -> float:
    """Kairouz, Oh and Viswanath 2015, Theorem 3.5: the smallest of
    sum eps_i,
    sum eps_i (e^eps_i - 1)/(e^eps_i + 1) + sqrt(2 sum eps_i^2 log(e + sqrt(sum eps_i^2)/slack)),
    sum eps_i (e^eps_i - 1)/(e^eps_i + 1) + sqrt(2 sum eps_i^2 log(1/slack)).
    """
    total = math.fsum(eps)
    squares = math.fsum(x * x for x in eps)
    drift = math.fsum(x * math.tanh(x / 2) for x in eps)  # (e^x - 1)/(e^x + 1) = tanh(x/2)
    second = drift + math.sqrt(2 * squares * math.log(math.e + math.sqrt(squares) / slack))
    third = drift + math.sqrt(2 * squares * math.log(1 / slack))
    return min(total, second, third)


def compose_kairouz(guarantees: Sequence[PureDP | ApproxDP], delta_slack: float) -> Composition:
    """Adaptive composition of heterogeneous (eps_i, delta_i) guarantees.

    (eps~, 1 - (1 - delta') prod(1 - delta_i))-DP with eps~ the smallest of three bounds
    (Kairouz, Oh and Viswanath 2015, Theorem 3.5; see ``_kairouz_epsilon``), delta' =
    ``delta_slack`` in (0, 1). Never worse than ``compose_basic`` in epsilon.
    """
    eps, deltas, relation = _as_pairs(guarantees)
    slack = _check_unit_open("delta_slack", delta_slack)
    delta = _one_minus_product([slack, *deltas])
    return Composition(_approx(_up(_kairouz_epsilon(eps, slack)), delta, relation), "kairouz")


# --------------------------------------------------------------------------------------------
# optimal homogeneous composition (Kairouz, Oh and Viswanath 2015, Theorem 3.3)
# --------------------------------------------------------------------------------------------


def _optimal_log_excess(epsilon: float, k: int, target_epsilon: float) -> tuple[float, float]:
    """log S and a bound on its absolute floating-point error, where

    S = sum_l C(k, l) max(0, e^((k-l) eps) - e^(eps' + l eps)) / (1 + e^eps)^k

    is the hockey-stick divergence of order e^eps' between k copies of randomized response with
    ratio e^eps (the canonical (eps, 0)-DP pair).
    """
    ell = np.arange(k + 1, dtype=np.float64)
    gap = target_epsilon + (2 * ell - k) * epsilon  # log of e^(eps' + l eps) / e^((k - l) eps)
    keep = gap < 0
    if not np.any(keep):
        return -math.inf, 0.0
    ell, gap = ell[keep], gap[keep]
    log_norm = k * float(np.logaddexp(0.0, epsilon))
    log_binom = gammaln(k + 1.0) - gammaln(ell + 1) - gammaln(k - ell + 1)
    log_terms = log_binom + (k - ell) * epsilon - log_norm + np.log(-np.expm1(gap))
    # Each term's log is a sum of pieces of size up to ~ lgamma(k+1) + k (eps + log 2); double
    # rounding there is the dominant error, relative ~ 1e-15 times that magnitude.
    magnitude = float(gammaln(k + 1.0)) + k * (epsilon + log_norm / k) + abs(target_epsilon)
    return float(logsumexp(log_terms)), 1e-15 * magnitude + 1e-13


def optimal_homogeneous_delta(epsilon: float, delta: float, k: int, target_epsilon: float) -> float:
    """The exact smallest delta with k-fold composition of (eps, delta)-DP being (eps', .)-DP.

    Kairouz, Oh and Viswanath 2015, Theorem 3.3: every (eps, delta)-DP mechanism is a
    post-processing of the pair P = (delta, (1-delta) e^eps/(1+e^eps), (1-delta)/(1+e^eps), 0),
    Q = (0, (1-delta)/(1+e^eps), (1-delta) e^eps/(1+e^eps), delta) (their Theorem 2.4), also
    under adaptive composition, so the k-fold composition's delta at eps' is that pair's
    hockey-stick divergence:
        delta(eps') = 1 - (1 - delta)^k (1 - S),
        S = sum_l C(k,l) max(0, e^((k-l) eps) - e^(eps' + l eps)) / (1 + e^eps)^k,
    which at eps' = (k - 2i) eps is their formula. Summed in log space; rounded up.
    """
    e = float(epsilon)
    if not (math.isfinite(e) and e > 0):
        raise UserError(f"epsilon must be a positive finite number, got {epsilon!r}")
    if math.isnan(delta) or not 0 <= delta < 1:
        raise UserError(f"delta must lie in [0, 1), got {delta!r}")
    k = _check_k(k)
    if math.isnan(target_epsilon) or target_epsilon < 0:
        raise UserError(f"target_epsilon must be >= 0, got {target_epsilon!r}")
    log_s, err = _optimal_log_excess(e, k, float(target_epsilon))
    s = math.exp(log_s + err) if math.isfinite(log_s) else 0.0
    if s >= 1:
        return 1.0
    log_keep = k * math.log1p(-delta) + math.log1p(-s)  # log((1 - delta)^k (1 - S))
    return min(1.0, _up(-math.expm1(log_keep)))


def compose_optimal_homogeneous(
    guarantee: PureDP | ApproxDP, k: int, target_delta: float
) -> Composition:
    """The smallest epsilon (rounded up) at which k-fold composition is (eps, target_delta)-DP.

    Exact for the worst case (Kairouz, Oh and Viswanath 2015, Theorem 3.3; see
    ``optimal_homogeneous_delta``); found by bisection on eps' in [0, k eps], keeping the side
    where delta(eps') <= target_delta. Requires target_delta >= 1 - (1 - delta)^k.
    """
    (e,), (d,), relation = _as_pairs([guarantee])
    k = _check_k(k)
    target = _check_unit_open("target_delta", target_delta)
    if e == 0:
        floor = _one_minus_product([d] * k)  # (0, delta)-DP composes to (0, 1 - (1-delta)^k)
        if floor > target:
            raise UserError(f"target_delta must be at least {floor:.6g} for this composition")
        return Composition(_approx(0.0, target, relation), "optimal")
    lo, hi = 0.0, k * e
    if optimal_homogeneous_delta(e, d, k, hi) > target:
        raise UserError(
            f"target_delta must be at least 1 - (1 - delta)^k = "
            f"{optimal_homogeneous_delta(e, d, k, hi):.6g} for this composition"
        )
    if optimal_homogeneous_delta(e, d, k, 0.0) <= target:
        return Composition(_approx(0.0, target, relation), "optimal")
    for _ in range(200):
        mid = (lo + hi) / 2
        if optimal_homogeneous_delta(e, d, k, mid) <= target:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * hi:
            break
    return Composition(_approx(hi, target, relation), "optimal")


# --------------------------------------------------------------------------------------------
# the tightest available
# --------------------------------------------------------------------------------------------


def compose(
    guarantees: Sequence[PureDP | ApproxDP], target_delta: float | None = None
) -> Composition:
    """The tightest composition found, with the name of the method that gave it.

    Without ``target_delta``: basic composition. With it: the smallest epsilon among basic
    composition (if sum delta_i <= target_delta), Kairouz et al. Theorem 3.5 and, when all
    guarantees are equal, advanced composition and the optimal composition of Kairouz et al.
    Theorem 3.3, each with its delta at most ``target_delta``.
    """
    eps, deltas, relation = _as_pairs(guarantees)
    if target_delta is None:
        return compose_basic(guarantees)
    target = _check_unit_open("target_delta", target_delta)
    candidates: list[Composition] = []
    basic = compose_basic(guarantees)
    if basic.guarantee.delta <= target:
        candidates.append(Composition(ApproxDP(basic.guarantee.epsilon, target, relation), "basic"))
    # Kairouz et al. Theorem 3.5 with the slack that makes its delta hit the target.
    keep = math.fsum(math.log1p(-d) for d in deltas)
    exact_slack = -math.expm1(math.log1p(-target) - keep)  # 1 - (1 - target)/prod(1 - delta_i)
    for shrink in (1e-6, 1e-3):  # leave room for the upward rounding of the composed delta
        slack = exact_slack * (1 - shrink)
        if not 0 < slack < 1:
            break
        result = compose_kairouz(guarantees, slack)
        if result.guarantee.delta <= target:
            candidates.append(
                Composition(ApproxDP(result.guarantee.epsilon, target, relation), result.method)
            )
            break
    homogeneous = all(x == eps[0] for x in eps) and all(x == deltas[0] for x in deltas)
    if homogeneous:
        k, first = len(eps), guarantees[0]
        slack = (target - k * deltas[0]) * (1 - 1e-9)
        if 0 < slack < 1:
            result = compose_advanced(first, k, slack)
            if result.guarantee.delta <= target:
                candidates.append(
                    Composition(ApproxDP(result.guarantee.epsilon, target, relation), "advanced")
                )
        with contextlib.suppress(ValueError):  # target below 1 - (1 - delta)^k: not applicable
            candidates.append(compose_optimal_homogeneous(first, k, target))
    if not candidates:
        raise UserError(
            f"no composition theorem reaches target_delta={target!r}: it must be at least about "
            f"the sum of the deltas ({math.fsum(deltas):.6g})"
        )
    return min(candidates, key=lambda c: c.guarantee.epsilon)
