"""Conversions between privacy currencies, each rounded so that the reported loss is never low.

Every function here turns one guarantee into another that it implies. Numbers are computed in
log space where they can underflow, and every floating-point result is nudged in the safe
direction: an epsilon or delta we *report* is rounded up, a rho or mu we *calibrate to* is rounded
down. Where a bound is an infimum over a free parameter (a Renyi order alpha), every value of
the parameter gives a valid bound, so an inexact minimization can only make the answer looser,
never wrong.

Sources, by function:

- ``pure_to_zcdp``: Bun and Steinke, "Concentrated differential privacy: simplifications,
  extensions, and lower bounds" (TCC 2016), Proposition 1.4 (proved as Proposition 3.3).
- ``pure_to_rdp``: the exact worst case over all epsilon-DP mechanisms, which is binary randomized
  response; Steinke, "Sharp RDP & zCDP from pure DP" (differentialprivacy.org, 2024), Theorem 4,
  by the rounding argument of Bun and Steinke 2016, Proposition 3.3.
- ``zcdp_to_delta`` / ``zcdp_to_epsilon``: Canonne, Kamath and Steinke, "The discrete Gaussian
  for differential privacy" (NeurIPS 2020), Proposition 12 / Corollary 13 (the same bound as
  Balle, Barthe, Gaboardi, Hsu and Sato 2020, Theorem 21, applied at every order).
- ``rdp_to_epsilon`` / ``rdp_to_delta``: Balle, Barthe, Gaboardi, Hsu and Sato, "Hypothesis
  testing interpretations and Renyi differential privacy" (AISTATS 2020), Theorem 21 (equal to
  Canonne, Kamath and Steinke 2020, Proposition 12, and tighter at every order than Mironov 2017,
  Proposition 3); for delta also the total-variation bound delta(eps) <= TV <= sqrt(1 - e^-KL)
  (Bretagnolle and Huber 1979), with KL <= D_alpha for every alpha > 1 (van Erven and
  Harremoes 2014, Theorem 3: the Renyi divergence is non-decreasing in alpha).
- ``gdp_to_delta`` / ``gdp_to_epsilon`` / ``gdp_mu_for``: Dong, Roth and Su, "Gaussian
  differential privacy" (JRSS-B 2022), Corollary 2.13.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from scipy.optimize import brentq, minimize_scalar
from scipy.special import erfcx, log_ndtr

from dpcurator import _validation as check
from dpcurator.accounting._orders import DEFAULT_ORDERS
from dpcurator.accounting.guarantees import GDP, RDP, ZCDP, ApproxDP, PureDP
from dpcurator.errors import UserError

__all__ = [
    "gdp_mu_for",
    "gdp_to_approx",
    "gdp_to_delta",
    "gdp_to_epsilon",
    "pure_to_approx",
    "pure_to_rdp",
    "pure_to_zcdp",
    "rdp_epsilon_and_order",
    "rdp_to_approx",
    "rdp_to_delta",
    "rdp_to_epsilon",
    "zcdp_rho_for",
    "zcdp_to_approx",
    "zcdp_to_delta",
    "zcdp_to_epsilon",
    "zcdp_to_rdp",
]

# Relative slack added to every numerically computed epsilon or delta. The formulas below are
# evaluated to ~1e-13 relative accuracy; 1e-9 leaves four orders of magnitude of margin while
# changing no reported figure in a visible digit.
_REL_SLACK = 1e-9


def _up(x: float, rel: float = _REL_SLACK) -> float:
    """x rounded up by a relative margin (and at least one ulp); inf and nan pass through."""
    if not math.isfinite(x):
        return x
    return math.nextafter(x + abs(x) * rel, math.inf)


def _down(x: float, rel: float = _REL_SLACK) -> float:
    if not math.isfinite(x):
        return x
    return math.nextafter(x - abs(x) * rel, -math.inf)


# --------------------------------------------------------------------------------------------
# pure DP
# --------------------------------------------------------------------------------------------


def pure_to_approx(guarantee: PureDP) -> ApproxDP:
    """epsilon-DP is (epsilon, 0)-DP (the definitions coincide at delta = 0)."""
    return ApproxDP(guarantee.epsilon, 0.0, guarantee.neighbouring)


def pure_to_zcdp(guarantee: PureDP) -> ZCDP:
    """epsilon-DP implies (epsilon^2 / 2)-zCDP.

    Source: Bun and Steinke 2016, Proposition 1.4 (proof: Proposition 3.3). Same relation.
    """
    return ZCDP(_up(guarantee.epsilon**2 / 2, 1e-15), guarantee.neighbouring)


def pure_rdp_curve(epsilon: float, orders: np.ndarray) -> np.ndarray:
    """The tight Renyi bound of any epsilon-DP mechanism at each order (not rounded).

    eps(alpha) = eps - log((1 + e^-eps) / (1 + e^-(2 alpha - 1) eps)) / (alpha - 1), which is
    the Renyi divergence of binary randomized response with ratio e^eps, the worst case.
    Source: Steinke 2024 ("Sharp RDP & zCDP from pure DP", Theorem 4), by the argument of Bun
    and Steinke 2016, Proposition 3.3. Always <= min(eps, alpha eps^2 / 2).
    """
    a = np.asarray(orders, dtype=np.float64)
    num = math.log1p(math.exp(-epsilon)) - np.log1p(np.exp(-(2 * a - 1) * epsilon))
    return within_pure_bound(epsilon - num / (a - 1), epsilon, a, 1.0)


#: the rounding slack of the Renyi closed forms, per unit of their terms' magnitude
#: (``within_pure_bound``): a few ulps of each term, with room
RDP_SLACK = 2.0**-44


def within_pure_bound(curve: np.ndarray, epsilon: float, orders: np.ndarray,
                      magnitude: float | np.ndarray) -> np.ndarray:
    """A closed form's Renyi curve made safe from its own rounding: raised by ``RDP_SLACK``
    times (1 + ``magnitude``, the largest of the logarithms it adds up) / (alpha - 1) plus
    epsilon's own ulps, then capped at min(epsilon, alpha epsilon^2 / 2), which bounds every
    epsilon-DP mechanism's curve (Bun and Steinke 2016, Propositions 1.4 and 3.3).

    Why. The closed forms subtract logarithms of order 1 and divide by alpha - 1, so near
    alpha = 1, or where epsilon is tiny, they cancel: at epsilon 1e-10 the pure curve came
    out -8.3e-18 (the exact value is about 5e-21), below zero, which the RDP type refuses,
    and at 1e-7 3.8% below the exact value (a bug hunt, against 60-digit arithmetic). The
    slack covers the rounding, so the result is never below the exact curve, and the cap
    keeps it tight where the slack would dominate."""
    a = np.asarray(orders, dtype=np.float64)
    slack = RDP_SLACK * ((1.0 + np.asarray(magnitude, dtype=np.float64)) / (a - 1.0) + epsilon)
    cap = np.minimum(epsilon, a * epsilon * epsilon / 2.0) * (1.0 + 2.0**-50)  # rounded up
    out: np.ndarray = np.minimum(np.maximum(np.asarray(curve, dtype=np.float64), 0.0) + slack,
                                 cap)
    return out


def pure_to_rdp(guarantee: PureDP, orders: Sequence[float] | None = None) -> RDP:
    """epsilon-DP as Renyi DP at each order, with the tight bound of ``pure_rdp_curve``."""
    grid = _orders(orders)
    eps = pure_rdp_curve(guarantee.epsilon, grid)
    return RDP(
        tuple(float(a) for a in grid), tuple(_up(float(e)) for e in eps), guarantee.neighbouring
    )


# --------------------------------------------------------------------------------------------
# zCDP
# --------------------------------------------------------------------------------------------


def zcdp_to_delta(rho: float, epsilon: float) -> float:
    """delta such that rho-zCDP implies (epsilon, delta)-DP.

    delta = inf over alpha > 1 of exp((alpha - 1)(alpha rho - epsilon)) / (alpha - 1)
    * (1 - 1/alpha)^alpha. Source: Canonne, Kamath and Steinke, "The discrete Gaussian for
    differential privacy" (NeurIPS 2020), Section 3, conversion from concentrated DP (tighter
    than Bun and Steinke 2016, Proposition 1.3). Every alpha gives a valid bound, so an
    inexact minimization can only overstate delta: the result is conservative.
    """
    return min(1.0, _up(math.exp(_zcdp_log_delta(rho, epsilon))))


def _zcdp_log_delta(rho: float, epsilon: float) -> float:
    # the shared checks: NaN, bools and strings refused (NaN gave delta 1, a bug hunt)
    rho = check.positive("rho", rho)
    epsilon = check.nonnegative("epsilon", epsilon)

    def log_delta(log_am1: float) -> float:
        # CKS 2020, Corollary 13, at alpha = 1 + exp(log_am1).
        a = 1.0 + math.exp(log_am1)
        return (a - 1) * (a * rho - epsilon) - math.log(a - 1) + a * math.log1p(-1 / a)

    best = minimize_scalar(
        log_delta, bounds=(-20.0, 20.0), method="bounded", options={"xatol": 1e-10}
    )
    return min(0.0, float(best.fun), log_delta(0.0))


@functools.lru_cache(maxsize=256)  # pure; a root search over scipy minimisations
def zcdp_rho_for(epsilon: float, delta: float) -> float:
    """The largest rho (to 1e-12 relative, rounded down) with zcdp_to_delta(rho, eps) <= delta."""
    if not (epsilon > 0 and 0 < delta < 1):
        raise UserError("epsilon must be > 0 and delta in (0, 1)")

    def excess(r: float) -> float:
        return _zcdp_log_delta(r, epsilon) - math.log(delta)

    low = 1e-12  # below it for a small epsilon: the bracket moves down until delta fits
    while excess(low) > 0:
        if low < 1e-280:
            raise UserError(f"epsilon {epsilon:g} is too small for delta {delta:g}: no rho "
                            "above 1e-280 converts to it")
        low *= 1e-6
    rho = brentq(excess, low, epsilon * 10 + 10, xtol=min(1e-15, low * 1e-3), rtol=1e-12)
    rho = float(rho)
    step = 1e-12
    while zcdp_to_delta(rho, epsilon) > delta:
        rho *= 1 - step
        step *= 2
    return rho


def zcdp_to_epsilon(rho: float, delta: float) -> float:
    """The epsilon (rounded up) such that rho-zCDP implies (epsilon, delta)-DP.

    epsilon = inf over alpha > 1 of alpha rho + log(1 - 1/alpha) - (log delta + log alpha) /
    (alpha - 1): the curve alpha -> alpha rho through ``rdp_to_epsilon`` (Balle et al. 2020,
    Theorem 21; Canonne, Kamath and Steinke 2020, Proposition 12).
    """
    rho = check.positive("rho", rho)
    delta = check.unit_interval("delta", delta)
    log_delta = math.log(delta)

    def eps_at(log_am1: float) -> float:
        a = 1.0 + math.exp(log_am1)
        return a * rho + math.log1p(-1 / a) - (log_delta + math.log(a)) / (a - 1)

    best = minimize_scalar(eps_at, bounds=(-20.0, 20.0), method="bounded", options={"xatol": 1e-10})
    return max(0.0, _up(min(float(best.fun), eps_at(0.0))))


def zcdp_to_approx(guarantee: ZCDP, delta: float) -> ApproxDP:
    """rho-zCDP as (epsilon, delta)-DP at the given delta (``zcdp_to_epsilon``); same relation."""
    return ApproxDP(zcdp_to_epsilon(guarantee.rho, delta), delta, guarantee.neighbouring)


def zcdp_to_rdp(guarantee: ZCDP, orders: Sequence[float] | None = None) -> RDP:
    """rho-zCDP is (alpha, rho alpha)-RDP at every order (Bun and Steinke 2016, Definition 1.1)."""
    grid = _orders(orders)
    eps = tuple(_up(guarantee.rho * float(a), 1e-15) for a in grid)
    return RDP(tuple(float(a) for a in grid), eps, guarantee.neighbouring)


# --------------------------------------------------------------------------------------------
# Renyi DP
# --------------------------------------------------------------------------------------------


def _orders(orders: Sequence[float] | None) -> np.ndarray:
    if orders is None:
        return np.asarray(DEFAULT_ORDERS, dtype=np.float64)
    grid = np.asarray(tuple(float(a) for a in orders), dtype=np.float64)
    if grid.size == 0 or not np.all(np.isfinite(grid)) or np.any(grid <= 1):
        raise UserError("orders must be a non-empty sequence of finite numbers > 1")
    if np.any(np.diff(grid) <= 0):
        raise UserError("orders must be strictly increasing")
    return grid


def rdp_epsilon_and_order(
    orders: Sequence[float] | np.ndarray, epsilons: Sequence[float] | np.ndarray, delta: float
) -> tuple[float, float]:
    """The smallest epsilon (rounded up) over the orders at which RDP gives (epsilon, delta)-DP.

    At each order, (alpha, r)-RDP implies (r + log(1 - 1/alpha) - (log delta + log alpha) /
    (alpha - 1), delta)-DP: Balle, Barthe, Gaboardi, Hsu and Sato 2020, Theorem 21 (also
    Canonne, Kamath and Steinke 2020, Proposition 12); it beats Mironov 2017, Proposition 3
    (r + log(1/delta)/(alpha - 1)) at every order. Returns (epsilon, the order that gave it);
    epsilon is clipped at 0 (a negative value means (0, delta)-DP holds).
    """
    delta = check.unit_interval("delta", delta)
    a = np.asarray(orders, dtype=np.float64)
    r = np.asarray(epsilons, dtype=np.float64)
    if a.shape != r.shape or a.size == 0:
        raise UserError("orders and epsilons must be non-empty and of the same length")
    with np.errstate(invalid="ignore", over="ignore"):
        eps = r + np.log1p(-1 / a) - (math.log(delta) + np.log(a)) / (a - 1)
    eps = np.where(np.isnan(eps), np.inf, eps)
    i = int(np.argmin(eps))
    best = float(eps[i])
    return (max(0.0, _up(best)) if math.isfinite(best) else math.inf), float(a[i])


def rdp_to_epsilon(guarantee: RDP, delta: float) -> float:
    """epsilon (rounded up) such that the RDP guarantee implies (epsilon, delta)-DP.

    Balle et al. 2020, Theorem 21, minimized over the guarantee's orders
    (see ``rdp_epsilon_and_order``).
    """
    return rdp_epsilon_and_order(guarantee.orders, guarantee.epsilons, delta)[0]


def rdp_to_approx(guarantee: RDP, delta: float) -> ApproxDP:
    """The RDP guarantee as (epsilon, delta)-DP at the given delta; same relation."""
    eps = rdp_to_epsilon(guarantee, delta)
    if not math.isfinite(eps):
        raise UserError("this RDP guarantee is infinite at every order: no (epsilon, delta)-DP")
    return ApproxDP(eps, delta, guarantee.neighbouring)


def rdp_log_delta(
    orders: Sequence[float] | np.ndarray, epsilons: Sequence[float] | np.ndarray, epsilon: float
) -> float:
    """log of the smallest delta (not yet rounded) at which RDP gives (epsilon, delta)-DP.

    Per order: log delta = (alpha - 1)(r - epsilon) + alpha log(1 - 1/alpha) - log(alpha - 1)
    (Balle et al. 2020, Theorem 21, solved for delta; Canonne, Kamath and Steinke 2020,
    Proposition 12). Also delta(epsilon) <= delta(0) = TV <= sqrt(1 - exp(-KL)) (Bretagnolle and
    Huber 1979) with KL <= D_alpha for every alpha (van Erven and Harremoes 2014, Theorem 3).
    """
    a = np.asarray(orders, dtype=np.float64)
    r = np.asarray(epsilons, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        log_d = (a - 1) * (r - epsilon) + a * np.log1p(-1 / a) - np.log(a - 1)
    log_d = np.where(np.isnan(log_d), np.inf, log_d)
    best = float(np.min(log_d))
    kl = float(np.min(r))
    if math.isfinite(kl):
        tv = -math.inf if kl == 0 else 0.5 * math.log(-math.expm1(-kl))
        best = min(best, tv)
    return min(best, 0.0)


def rdp_to_delta(guarantee: RDP, epsilon: float) -> float:
    """delta (rounded up) such that the RDP guarantee implies (epsilon, delta)-DP.

    See ``rdp_log_delta`` for the bounds used (Balle et al. 2020, Theorem 21; Bretagnolle-Huber).
    """
    epsilon = check.nonnegative("epsilon", epsilon)
    return min(1.0, _up(math.exp(rdp_log_delta(guarantee.orders, guarantee.epsilons, epsilon))))


# --------------------------------------------------------------------------------------------
# Gaussian DP
# --------------------------------------------------------------------------------------------


def _gdp_log_delta(mu: float, epsilon: float) -> float:
    """log(Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)), in log space (Dong, Roth, Su 2022,
    Corollary 2.13). The bracket is positive for mu > 0, so log1p(-exp(.)) is safe.

    With a = eps/mu - mu/2 and Phi(-x) = erfcx(x / sqrt 2) e^(-x^2 / 2) / 2, the second term is
    e^(-a^2 / 2) erfcx((a + mu) / sqrt 2) / 2 exactly (a + mu > 0 for eps >= 0): no e^eps is
    formed against a tiny Phi. (Adding eps to log Phi(-eps/mu - mu/2) loses about eps * 1e-16
    to cancellation, which for mu = 3e10, where eps is 5e20, is 5e4 in log delta.)"""
    a = epsilon / mu - mu / 2
    la = float(log_ndtr(-a))
    lb = -0.5 * a * a + math.log(0.5 * float(erfcx((a + mu) / math.sqrt(2.0))))
    if lb >= la:  # cannot happen mathematically; only by rounding at extreme arguments
        return la
    return la + math.log(-math.expm1(lb - la))


def gdp_to_delta(mu: float, epsilon: float) -> float:
    """delta(epsilon) of mu-GDP, exactly (rounded up).

    delta = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2): Dong, Roth and Su 2022,
    Corollary 2.13. mu-GDP holds iff this (eps, delta(eps))-DP holds for every eps >= 0. For the
    Gaussian mechanism with noise multiplier sigma, mu = 1/sigma, and this is the analytic
    Gaussian mechanism's privacy curve (Balle and Wang 2018, Theorem 8).
    """
    mu = check.positive("mu", mu)
    epsilon = check.nonnegative("epsilon", epsilon)
    return min(1.0, _up(math.exp(_gdp_log_delta(mu, epsilon))))


def gdp_to_epsilon(mu: float, delta: float) -> float:
    """The smallest epsilon (rounded up) with mu-GDP implying (epsilon, delta)-DP.

    Solves gdp_to_delta(mu, eps) = delta by bracketing root finding (delta is decreasing in eps)
    and then steps up until the exact formula is at most delta. A mu below 1e-6 is evaluated
    at 1e-6 (mu-GDP implies mu'-GDP for every mu' >= mu; below, the two terms of the formula
    agree to more digits than a double holds): epsilon is then at most about 5e-6.
    """
    mu = max(check.positive("mu", mu), 1e-6)
    delta = check.unit_interval("delta", delta)
    target = math.log(delta)
    if _gdp_log_delta(mu, 0.0) <= target:
        return 0.0
    hi = max(1.0, mu * mu)
    while _gdp_log_delta(mu, hi) > target:
        hi *= 2
    eps = float(brentq(lambda e: _gdp_log_delta(mu, e) - target, 0.0, hi, xtol=1e-14, rtol=1e-13))
    eps = _up(eps)
    while _gdp_log_delta(mu, eps) > target:
        eps = _up(eps, 1e-10)
    return eps


def gdp_mu_for(epsilon: float, delta: float) -> float:
    """The largest mu (rounded down) such that mu-GDP implies (epsilon, delta)-DP.

    Use it to calibrate: a mechanism that is mu-GDP with this mu is (epsilon, delta)-DP
    (Dong, Roth and Su 2022, Corollary 2.13). The converse does not hold: (epsilon, delta)-DP
    does not imply any GDP guarantee.
    """
    epsilon = check.nonnegative("epsilon", epsilon)
    delta = check.unit_interval("delta", delta)
    target = math.log(delta)
    lo, hi = 1e-12, 1.0
    while _gdp_log_delta(hi, epsilon) < target:
        hi *= 2
    mu = float(
        brentq(lambda m: _gdp_log_delta(m, epsilon) - target, lo, hi, xtol=1e-15, rtol=1e-13)
    )
    mu = _down(mu)
    while _gdp_log_delta(mu, epsilon) > target:
        mu = _down(mu, 1e-10)
    return mu


def gdp_to_approx(guarantee: GDP, delta: float) -> ApproxDP:
    """mu-GDP as (epsilon, delta)-DP at the given delta (``gdp_to_epsilon``); same relation."""
    return ApproxDP(gdp_to_epsilon(guarantee.mu, delta), delta, guarantee.neighbouring)
