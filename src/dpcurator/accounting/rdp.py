"""A Renyi-DP accountant: events in, epsilon(alpha) on a grid of orders, (epsilon, delta) out.

Every event becomes an upper bound on D_alpha(M(D1) || M(D2)) at each order of the grid, for the
accountant's neighbouring relation, and composition adds the curves order by order (Mironov,
"Renyi differential privacy", CSF 2017, Proposition 1). Alongside, the accountant keeps the sum of
the events' max-divergences D_inf (their pure-DP epsilon, infinite for Gaussian noise), which is
itself a valid (sum, 0)-DP guarantee and wins for compositions of a few pure-DP events.

Per-event bounds (each cited again beside its code):

- Gaussian, noise multiplier sigma: alpha / (2 sigma^2) (Mironov 2017, Table II).
- Laplace, scale b per unit of L1 sensitivity: Mironov 2017, Proposition 6 (exact).
- Discrete Laplace and k-ary randomized response: the exact Renyi divergence of the two output
  distributions, summed in closed form (definition: Mironov 2017, Definition 3).
- Discrete Gaussian, parameter sigma, integer sensitivity k: alpha k^2 / (2 sigma^2), the same as
  the continuous one (Canonne, Kamath and Steinke, "The discrete Gaussian for differential
  privacy", NeurIPS 2020, Theorem 4).
- Any epsilon-DP mechanism: the tight bound of ``conversions.pure_rdp_curve``.
- rho-zCDP: rho alpha (Bun and Steinke 2016, Definition 1.1).
- Poisson-subsampled Gaussian (add/remove): Mironov, Talwar and Zhang, "Renyi differential privacy
  of the sampled Gaussian mechanism" (2019): eps(alpha) = log(A_alpha) / (alpha - 1), exact
  binomial sum at integer orders and their numerically stable series at fractional orders
  (Section 3.3), with a rigorous bound on the truncated tail added.
- Sampling without replacement (replace-one relation), any inner event with an RDP bound at the
  integer orders: Wang, Balle and Kasiviswanathan, "Subsampled Renyi differential privacy and
  analytical moments accountant" (AISTATS 2019), Theorem 9 at integer orders and Corollary 10
  (convex interpolation of (alpha - 1) eps(alpha)) between them, never above the inner bound
  (joint quasi-convexity of the Renyi divergence: van Erven and Harremoes 2014, Theorem 13).

Conversion to (epsilon, delta): ``conversions.rdp_epsilon_and_order`` (Balle, Barthe, Gaboardi,
Hsu and Sato 2020, Theorem 21). Every per-event value is rounded up by a relative 1e-9 so that
floating-point error can never report less privacy loss than the formula gives.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from scipy.special import gammaln, gammasgn, log_ndtr, logsumexp

from dpcurator import _validation as check
from dpcurator.accounting._orders import DEFAULT_ORDERS
from dpcurator.accounting.conversions import (
    pure_rdp_curve,
    rdp_epsilon_and_order,
    rdp_log_delta,
    within_pure_bound,
)
from dpcurator.accounting.events import (
    ApproxDPEvent,
    ComposedEvent,
    DiscreteGaussianEvent,
    DiscreteLaplaceEvent,
    DpEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    PureDPEvent,
    RandomizedResponseEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    ZCDPEvent,
)
from dpcurator.accounting.guarantees import RDP, ApproxDP, Neighbouring, check_neighbouring
from dpcurator.errors import UnsupportedEventError, UserError, UserTypeError

__all__ = [
    "DEFAULT_ORDERS",
    "RDPAccountant",
    "UnsupportedEventError",
    "event_rdp",
]


_REL_SLACK = 1e-9  # relative rounding margin on every per-event bound (see module docstring)


@dataclass(frozen=True)
class _Ctx:
    orders: tuple[float, ...]
    neighbouring: Neighbouring

    @property
    def a(self) -> np.ndarray:
        return np.asarray(self.orders, dtype=np.float64)


@dataclass(frozen=True)
class _Curve:
    """Upper bounds on D_alpha at ctx.orders, and on D_inf (``pure``; inf when unbounded)."""

    eps: np.ndarray
    pure: float


def _up(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.nextafter(x + np.abs(x) * _REL_SLACK, np.inf)
    return out


# --------------------------------------------------------------------------------------------
# dispatch: one function per event type (STYLE habit 6)
# --------------------------------------------------------------------------------------------


@functools.singledispatch
def _curve(event: DpEvent, ctx: _Ctx) -> _Curve:
    raise UnsupportedEventError(
        f"the RDP accountant cannot account a {type(event).__name__}; "
        "use the PLD accountant or compose its (epsilon, delta) guarantee directly"
    )


@functools.lru_cache(maxsize=512)
def _cached_curve(event: DpEvent, ctx: _Ctx) -> _Curve:
    curve = _curve(event, ctx)
    eps = np.array(curve.eps, dtype=np.float64)
    eps.setflags(write=False)
    return _Curve(eps, curve.pure)


_E = TypeVar("_E", bound=DpEvent)


def _register(cls: type[_E]) -> Callable[[Callable[[_E, _Ctx], _Curve]], Callable[..., _Curve]]:
    def deco(fn: Callable[[_E, _Ctx], _Curve]) -> Callable[..., _Curve]:
        _curve.register(cls)(fn)
        return fn

    return deco


def _check_relation(event: DpEvent, ctx: _Ctx, required: Neighbouring, why: str) -> None:
    if ctx.neighbouring is not required:
        name = "ADD_REMOVE" if required is Neighbouring.ADD_REMOVE else "REPLACE"
        raise UnsupportedEventError(
            f"{type(event).__name__} is only accounted under '{required}' ({why}); "
            f"this accountant uses '{ctx.neighbouring}': create "
            f"RDPAccountant(neighbouring=Neighbouring.{name})"
        )


# Noise multipliers above this are accounted as this one (a Gaussian of larger sigma is a
# post-processing of it: add independent noise), and those below it as +inf at every order;
# either way no square of sigma can overflow or underflow.
_SIGMA_RANGE = (1e-100, 1e100)


def _clamped_sigma(sigma: float) -> float:
    """sigma within ``_SIGMA_RANGE``: its top, or 0.0 (no noise) below its bottom."""
    return 0.0 if sigma < _SIGMA_RANGE[0] else min(float(sigma), _SIGMA_RANGE[1])


def _gaussian_rdp(sigma: float, orders: np.ndarray) -> np.ndarray:
    """alpha / (2 sigma^2), rounded up; +inf without noise."""
    s = _clamped_sigma(sigma)
    if s == 0.0:
        return np.full_like(orders, np.inf, dtype=np.float64)
    return _up(orders / (2 * s * s))


@_register(GaussianEvent)
def _gaussian(event: GaussianEvent, ctx: _Ctx) -> _Curve:
    # Mironov 2017, Table II: D_alpha(N(0, s^2) || N(1, s^2)) = alpha / (2 s^2).
    return _Curve(_gaussian_rdp(event.noise_multiplier, ctx.a), math.inf)


@_register(DiscreteGaussianEvent)
def _discrete_gaussian(event: DiscreteGaussianEvent, ctx: _Ctx) -> _Curve:
    # Canonne, Kamath and Steinke 2020, Theorem 4: (k^2 / (2 sigma^2))-zCDP for integer
    # sensitivity k, hence alpha k^2 / (2 sigma^2) at every order.
    with np.errstate(over="ignore"):
        rho = 0.5 * (event.sensitivity / event.sigma) ** 2 if event.sigma > 1e-100 else math.inf
    return _Curve(_up(ctx.a * rho), math.inf)


def laplace_rdp(scale: float, orders: np.ndarray) -> np.ndarray:
    """Exact D_alpha between Laplace(0, b) and Laplace(1, b), b = ``scale`` (not rounded).

    Mironov 2017, Proposition 6: (1/(alpha-1)) log[alpha/(2alpha-1) e^((alpha-1)/b)
    + (alpha-1)/(2alpha-1) e^(-alpha/b)], rewritten with e = 1/b as
    e + log1p((alpha-1)/(2alpha-1) expm1(-(2alpha-1) e)) / (alpha-1) for stability near 1.
    """
    e = 1.0 / scale
    a = np.asarray(orders, dtype=np.float64)
    out = e + np.log1p((a - 1) / (2 * a - 1) * np.expm1(-(2 * a - 1) * e)) / (a - 1)
    return within_pure_bound(out, e, a, 1.0)  # Laplace(b) is 1/b-DP


@_register(LaplaceEvent)
def _laplace(event: LaplaceEvent, ctx: _Ctx) -> _Curve:
    b = event.noise_multiplier
    return _Curve(_up(laplace_rdp(b, ctx.a)), 1.0 / b)


def discrete_laplace_rdp(scale: float, shift: int, orders: np.ndarray) -> np.ndarray:
    """Exact D_alpha(P || P(. - d)) for P(z) = c r^|z|, r = e^(-1/t), t = ``scale``, d = ``shift``.

    Summing P(z) exp((alpha-1) L(z)) with L(z) = (|z - d| - |z|)/t over z <= 0, 0 < z < d and
    z >= d gives three geometric series (our derivation from the definition, Mironov 2017,
    Definition 3): with c = (1-r)/(1+r) and rho = e^(-(2alpha-1)/t),
    A = c e^((alpha-1)d/t) [ (1 + e^(-(2alpha-1)d/t)) / (1-r) + rho (1 - rho^(d-1)) / (1-rho) ].
    """
    t = float(scale)
    a = np.asarray(orders, dtype=np.float64)
    d = float(shift)
    log_r = -1.0 / t
    log_one_minus_r = math.log(-math.expm1(log_r))
    log_c = log_one_minus_r - math.log1p(math.exp(log_r))
    log_rho = -(2 * a - 1) / t
    # log of rho (1 - rho^(d-1)) / (1 - rho); zero terms when d = 1.
    if shift > 1:
        log_mid = log_rho + np.log(-np.expm1((d - 1) * log_rho)) - np.log(-np.expm1(log_rho))
    else:
        log_mid = np.full_like(a, -np.inf)
    log_outer = np.logaddexp(0.0, -(2 * a - 1) * d / t) - log_one_minus_r
    log_a = log_c + (a - 1) * d / t + np.logaddexp(log_outer, log_mid)
    # the terms cancel at a large scale (log_c about -log(2 t)): d / t-DP bounds it
    magnitude = abs(log_c) + np.abs(log_outer) + (a - 1) * d / t + np.abs(log_mid[
        np.isfinite(log_mid)].max(initial=0.0))
    return within_pure_bound(log_a / (a - 1), d / t, a, magnitude)


@_register(DiscreteLaplaceEvent)
def _discrete_laplace(event: DiscreteLaplaceEvent, ctx: _Ctx) -> _Curve:
    pure = event.sensitivity / event.scale
    if event.sensitivity > 4096:
        # Too many shifts to scan: fall back to the (valid, slightly looser) pure-DP bound.
        return _Curve(_up(pure_rdp_curve(pure, ctx.a)), pure)
    # A query of sensitivity k moves the count by any d in 1..k: take the worst shift.
    eps = np.max(
        [discrete_laplace_rdp(event.scale, d, ctx.a) for d in range(1, event.sensitivity + 1)],
        axis=0,
    )
    return _Curve(_up(np.minimum(eps, pure_rdp_curve(pure, ctx.a))), pure)


def randomized_response_rdp(p: float, k: int, orders: np.ndarray) -> np.ndarray:
    """Exact D_alpha between k-ary randomized response on two different true values.

    P = (p, q, q, ...), Q = (q, p, q, ...) with q = (1-p)/(k-1), so
    e^((alpha-1) D) = p^alpha q^(1-alpha) + q^alpha p^(1-alpha) + (k-2) q (Renyi divergence by
    definition, Mironov 2017, Definition 3). The pair is symmetric, so both directions agree.
    """
    a = np.asarray(orders, dtype=np.float64)
    q = (1 - p) / (k - 1)
    lp, lq = math.log(p), math.log(q)
    parts = [a * lp + (1 - a) * lq, a * lq + (1 - a) * lp]
    if k > 2:
        parts.append(np.full_like(a, math.log((k - 2) * q)))
    curve = logsumexp(np.stack(parts), axis=0) / (a - 1)
    magnitude = np.max(np.abs(np.stack(parts)), axis=0)
    return within_pure_bound(curve, abs(lp - lq), a, magnitude)  # ln(p / q)-DP


@_register(RandomizedResponseEvent)
def _randomized_response(event: RandomizedResponseEvent, ctx: _Ctx) -> _Curve:
    if event.neighbouring is not ctx.neighbouring:
        raise UnsupportedEventError(
            f"this RandomizedResponseEvent holds under '{event.neighbouring}', but the accountant "
            f"uses '{ctx.neighbouring}'; create the accountant with the event's relation"
        )
    p, k = event.truth_probability, event.categories
    pure = math.log(p) - math.log((1 - p) / (k - 1))
    eps = randomized_response_rdp(p, k, ctx.a)
    return _Curve(_up(np.minimum(eps, pure)), pure)


@_register(PureDPEvent)
def _pure(event: PureDPEvent, ctx: _Ctx) -> _Curve:
    # Tight bound over all epsilon-DP mechanisms (Steinke 2024, Theorem 4; Bun-Steinke 2016,
    # Proposition 3.3).
    return _Curve(_up(pure_rdp_curve(event.epsilon, ctx.a)), event.epsilon)


@_register(ApproxDPEvent)
def _approx(event: ApproxDPEvent, ctx: _Ctx) -> _Curve:
    if event.delta > 0:
        raise UnsupportedEventError(
            "an ApproxDPEvent with delta > 0 has no Renyi-DP bound (the divergence can be "
            "infinite with probability delta); use the PLD accountant or basic/optimal "
            "composition in dpcurator.accounting.composition"
        )
    if event.epsilon == 0:
        return _Curve(np.zeros_like(ctx.a), 0.0)
    return _Curve(_up(pure_rdp_curve(event.epsilon, ctx.a)), event.epsilon)


@_register(ZCDPEvent)
def _zcdp(event: ZCDPEvent, ctx: _Ctx) -> _Curve:
    # Bun and Steinke 2016, Definition 1.1: D_alpha <= rho alpha.
    return _Curve(_up(ctx.a * event.rho), math.inf)


@_register(ComposedEvent)
def _composed(event: ComposedEvent, ctx: _Ctx) -> _Curve:
    # Mironov 2017, Proposition 1: RDP of an adaptive composition is the sum, order by order.
    curves = [_cached_curve(e, ctx) for e in event.events]  # every part checked before summing
    eps = np.zeros_like(ctx.a)
    pure = 0.0
    for c in curves:
        eps = eps + c.eps
        pure += c.pure
    return _Curve(eps, pure)


@_register(SelfComposedEvent)
def _self_composed(event: SelfComposedEvent, ctx: _Ctx) -> _Curve:
    inner = _cached_curve(event.event, ctx)
    return _Curve(inner.eps * event.count, inner.pure * event.count)


# --------------------------------------------------------------------------------------------
# Poisson-subsampled Gaussian (Mironov, Talwar and Zhang 2019)
# --------------------------------------------------------------------------------------------


def _effective_gaussian_sigma(event: DpEvent) -> float | None:
    """Noise multiplier of the single Gaussian equivalent to a structure of Gaussians.

    Gaussian queries on the same sample, with noise multipliers s_i, are one Gaussian query with
    multiplier (sum s_i^-2)^(-1/2) after pre- and post-processing (McMahan, Andrew, Erlingsson
    et al. 2018, "A general approach to adding differential privacy to iterative training
    procedures", Section 3). None if the event is not built only from Gaussians.
    """
    if isinstance(event, GaussianEvent):
        return _clamped_sigma(event.noise_multiplier)
    if isinstance(event, SelfComposedEvent):
        s = _effective_gaussian_sigma(event.event)
        return None if s is None else s / math.sqrt(event.count)
    if isinstance(event, ComposedEvent) and event.events:
        total = 0.0
        for e in event.events:
            s = _effective_gaussian_sigma(e)
            if s is None:
                return None
            total += math.inf if s < _SIGMA_RANGE[0] else 1.0 / (s * s)
        return 0.0 if math.isinf(total) else float(total**-0.5)
    return None


def _log_expm1(x: np.ndarray) -> np.ndarray:
    """log(e^x - 1) for x > 0 without overflow."""
    big = x > 30
    safe = np.where(big, 1.0, x)
    large = x + np.log1p(-np.exp(-np.where(big, x, 30.0)))
    out: np.ndarray = np.where(big, large, np.log(np.expm1(safe)))
    return out


def sgm_log_a_int(q: float, sigma: float, alpha: int) -> float:
    """log A_alpha of the sampled Gaussian mechanism at an integer order alpha >= 2.

    A_alpha = sum_k C(alpha, k) (1-q)^(alpha-k) q^k exp((k^2 - k)/(2 sigma^2)) (Mironov, Talwar
    and Zhang 2019, Section 3.3). Since the same sum without the exponential equals 1, we sum
    A_alpha - 1 = sum_{k>=2} C(alpha,k)(1-q)^(alpha-k) q^k expm1((k^2-k)/(2 sigma^2)): only
    positive terms, so no cancellation even when A_alpha - 1 is tiny.
    """
    k = np.arange(2, alpha + 1, dtype=np.float64)
    log_terms = (
        gammaln(alpha + 1.0)
        - gammaln(k + 1)
        - gammaln(alpha - k + 1)
        + (alpha - k) * math.log1p(-q)
        + k * math.log(q)
        + _log_expm1((k * k - k) / (2 * sigma**2))
    )
    return float(np.logaddexp(0.0, logsumexp(log_terms)))


def sgm_log_a_frac(q: float, sigma: float, alpha: float) -> float:
    """An upper bound on log A_alpha of the sampled Gaussian mechanism at a fractional order.

    Split the integral defining A_alpha at z0 = sigma^2 log(1/q - 1) + 1/2 and expand each side
    as a binomial series (Mironov, Talwar and Zhang 2019, Section 3.3):
      A = sum_i C(alpha,i) (1-q)^(alpha-i) q^i e^((i^2-i)/(2s^2)) Phi((z0 - i)/s)
        + sum_i C(alpha,i) q^(alpha-i) (1-q)^i e^((j^2-j)/(2s^2)) Phi((j - z0)/s),  j = alpha-i.
    The series alternate for i > alpha and decay only polynomially, so we truncate and add a
    rigorous tail bound (our derivation): by the Mills ratio Phi(-x) <= phi(x)/x, each term for
    i > max(alpha, z0, alpha - z0) is at most K |C(alpha,i)| (1/(i - z0) + 1/(i - alpha + z0))
    with K = (1-q)^alpha e^(-z0^2/(2s^2)) s / sqrt(2 pi), and since
    alpha |C(alpha,i)| = i |C(alpha,i)| - (i+1)|C(alpha,i+1)| for i > alpha, the sum of
    |C(alpha,i)| over i > N is at most (N+1)|C(alpha,N+1)| / alpha. A floating-point margin of
    4e-14 times the sum of |terms| is added as well.
    """
    s2 = sigma * sigma
    z0 = s2 * math.log1p(-q) - s2 * math.log(q) + 0.5
    log_q, log_1mq = math.log(q), math.log1p(-q)
    log_k = alpha * log_1mq - z0 * z0 / (2 * s2) + math.log(sigma) - 0.5 * math.log(2 * math.pi)
    logs: list[np.ndarray] = []
    signs: list[np.ndarray] = []
    lo, chunk = 0, 64
    start_tail = max(alpha, z0, alpha - z0) + 1
    if start_tail > _MAX_SERIES_TERMS:
        raise UserError(
            f"the series at order {alpha:g} needs over {_MAX_SERIES_TERMS} terms (sigma={sigma:g}, "
            f"q={q:g}): use an integer order (sampled_gaussian_rdp does)"
        )
    while True:
        i = np.arange(lo, lo + chunk, dtype=np.float64)
        log_c = gammaln(alpha + 1) - gammaln(i + 1) - gammaln(alpha - i + 1)
        sign = np.nan_to_num(gammasgn(alpha - i + 1))  # C(alpha, i) = 0 past an integer alpha
        j = alpha - i
        l1 = log_c + (alpha - i) * log_1mq + i * log_q + (i * i - i) / (2 * s2)
        l1 = l1 + log_ndtr((z0 - i) / sigma)
        l2 = log_c + j * log_q + i * log_1mq + (j * j - j) / (2 * s2) + log_ndtr((j - z0) / sigma)
        logs += [l1, l2]
        signs += [sign, sign]
        lo += chunk
        chunk *= 2
        all_logs = np.concatenate(logs)
        all_signs = np.concatenate(signs)
        m = float(np.max(all_logs))
        scaled = np.exp(all_logs - m)
        total = float(np.sum(all_signs * scaled))
        magnitude = float(np.sum(scaled))
        n = float(lo)  # the next index not summed: the tail is i >= n, i.e. i > N = n - 1
        if n < start_tail:
            continue
        log_cn = float(gammaln(alpha + 1) - gammaln(n + 1) - gammaln(alpha - n + 1))
        g = 1 / (n - z0) + 1 / (n - alpha + z0)
        log_tail = log_k + log_cn + math.log(n) - math.log(alpha) + math.log(g)
        tail = math.exp(log_tail - m)
        excess = total - math.exp(-m)  # (A - 1) in units of e^m, for the stopping rule only
        if tail <= 1e-7 * max(excess, 0.0) or lo >= 2 * _MAX_SERIES_TERMS:
            upper = total + tail + 4e-14 * magnitude
            return m + math.log(upper)


#: Most terms the fractional-order series of ``sgm_log_a_frac`` may need before its tail bound
#: applies; beyond (|sigma^2 log(1/q - 1)| above about 8e3), the next integer order is used.
_MAX_SERIES_TERMS = 1 << 13


def _series_terms(q: float, sigma: float, alpha: float) -> float:
    """Index from which ``sgm_log_a_frac``'s tail bound holds: max(alpha, z0, alpha - z0) + 1."""
    s2 = sigma * sigma
    z0 = s2 * math.log1p(-q) - s2 * math.log(q) + 0.5
    return max(alpha, z0, alpha - z0) + 1


def sampled_gaussian_rdp(q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """RDP of the Poisson-subsampled Gaussian mechanism (add/remove), rounded up.

    eps(alpha) = log(A_alpha) / (alpha - 1): Mironov, Talwar and Zhang 2019 (Section 3, where
    A_alpha dominates the reverse direction B_alpha; Section 3.3 for the computation). At a
    fractional order whose series would need more than ``_MAX_SERIES_TERMS`` terms (large
    sigma, where the split point z0 = sigma^2 log(1/q - 1) + 1/2 is far out) the value at the
    next integer order is used: the Renyi divergence is non-decreasing in the order (van Erven
    and Harremoes 2014, Theorem 3), so it is an upper bound. Cost: at most about 2^14 terms per
    order, a few MiB and well under a second for all the default orders, for any q and sigma.
    """
    a = np.asarray(orders, dtype=np.float64)
    sigma = _clamped_sigma(sigma)
    if q == 1.0 or sigma == 0.0:
        return _gaussian_rdp(sigma, a)
    out = np.empty_like(a)
    integer_values: dict[int, float] = {}

    def at_integer(alpha: int) -> float:
        if alpha not in integer_values:
            integer_values[alpha] = sgm_log_a_int(q, sigma, alpha) / (alpha - 1)
        return integer_values[alpha]

    for n, alpha in enumerate(a):
        if float(alpha).is_integer():
            out[n] = at_integer(int(alpha))
        elif _series_terms(q, sigma, float(alpha)) > _MAX_SERIES_TERMS:
            out[n] = at_integer(max(2, math.ceil(alpha)))
        else:
            out[n] = sgm_log_a_frac(q, sigma, float(alpha)) / (alpha - 1)
    # A sampled mechanism is never less private than the unsampled one (quasi-convexity).
    return _up(np.minimum(out, a / (2 * sigma * sigma)))


@_register(PoissonSampledEvent)
def _poisson(event: PoissonSampledEvent, ctx: _Ctx) -> _Curve:
    if event.sampling_rate == 1.0:
        return _cached_curve(event.event, ctx)
    _check_relation(event, ctx, Neighbouring.ADD_REMOVE, "Poisson sampling amplifies add/remove")
    sigma = _effective_gaussian_sigma(event.event)
    if sigma is None:
        raise UnsupportedEventError(
            "the RDP accountant bounds Poisson sampling only for Gaussian noise (or Gaussians "
            f"composed on the same sample), not {type(event.event).__name__}; use the PLD "
            "accountant"
        )
    return _Curve(sampled_gaussian_rdp(event.sampling_rate, sigma, ctx.a), math.inf)


# --------------------------------------------------------------------------------------------
# Sampling without replacement (Wang, Balle and Kasiviswanathan 2019)
# --------------------------------------------------------------------------------------------


def _wor_log_moment(gamma: float, inner: np.ndarray, alpha: int) -> float:
    """(alpha - 1) * eps'(alpha) from WBK 2019, Theorem 9, at an integer order alpha >= 2.

    eps'(alpha) <= log(1 + gamma^2 C(alpha,2) min(4 (e^eps(2) - 1), 2 e^eps(2))
    + sum_{j=3}^alpha 2 gamma^j C(alpha,j) e^((j-1) eps(j))) / (alpha - 1), where eps(j) =
    inner[j - 2] is the inner mechanism's RDP at order j. (Theorem 9 allows the factor
    min(2, (e^eps(inf) - 1)^j) in place of 2; we use 2, which is always valid.)
    """
    e2 = float(inner[0])
    log_terms = [
        2 * math.log(gamma)
        + float(gammaln(alpha + 1) - gammaln(3) - gammaln(alpha - 1))
        + min(math.log(4) + float(_log_expm1(np.array([e2]))[0]), math.log(2) + e2)
        if e2 > 0
        else -math.inf
    ]
    if alpha >= 3:
        j = np.arange(3, alpha + 1, dtype=np.float64)
        lj = (
            math.log(2)
            + j * math.log(gamma)
            + gammaln(alpha + 1.0)
            - gammaln(j + 1)
            - gammaln(alpha - j + 1)
            + (j - 1) * inner[1 : alpha - 1]
        )
        log_terms.extend(lj.tolist())
    return float(np.logaddexp(0.0, logsumexp(np.array(log_terms))))


@_register(SampledWithoutReplacementEvent)
def _without_replacement(event: SampledWithoutReplacementEvent, ctx: _Ctx) -> _Curve:
    if event.sample_size == event.population_size:
        return _cached_curve(event.event, ctx)
    _check_relation(
        event, ctx, Neighbouring.REPLACE, "Wang, Balle and Kasiviswanathan 2019 state it so"
    )
    inner_full = _cached_curve(event.event, ctx)
    gamma = event.sample_size / event.population_size
    a = ctx.a
    top = max(2, math.ceil(float(a.max())))
    int_ctx = _Ctx(tuple(float(j) for j in range(2, top + 1)), ctx.neighbouring)
    inner_int = _cached_curve(event.event, int_ctx).eps  # eps(j) for j = 2..top
    if not np.all(np.isfinite(inner_int)):
        raise UnsupportedEventError("the inner event has no finite RDP bound at some integer order")
    moments: dict[int, float] = {}

    def moment(alpha: int) -> float:
        if alpha not in moments:
            moments[alpha] = _wor_log_moment(gamma, inner_int, alpha)
        return moments[alpha]

    out = np.empty_like(a)
    for n, alpha in enumerate(a):
        if alpha < 2:
            out[n] = moment(2)  # D_alpha <= D_2 (van Erven and Harremoes 2014, Theorem 3)
        elif float(alpha).is_integer():
            out[n] = moment(int(alpha)) / (alpha - 1)
        else:
            # WBK 2019, Corollary 10: (alpha - 1) eps(alpha) is convex in alpha, so it lies
            # below the chord between the neighbouring integer orders.
            lo, hi = math.floor(alpha), math.ceil(alpha)
            t = alpha - lo
            out[n] = ((1 - t) * moment(lo) + t * moment(hi)) / (alpha - 1)
    return _Curve(_up(np.minimum(out, inner_full.eps)), inner_full.pure)


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------


def _check_orders(orders: Sequence[float] | None) -> tuple[float, ...]:
    if orders is None:
        return DEFAULT_ORDERS
    grid = tuple(float(a) for a in orders)
    if not grid or any(not math.isfinite(a) or a <= 1 for a in grid):
        raise UserError("orders must be a non-empty sequence of finite numbers > 1")
    if any(b <= a for a, b in itertools.pairwise(grid)):
        raise UserError("orders must be strictly increasing")
    return grid


def event_rdp(
    event: DpEvent,
    orders: Sequence[float] | None = None,
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
) -> RDP:
    """The Renyi-DP guarantee of one event at each order (``DEFAULT_ORDERS`` by default).

    Raises ``UnsupportedEventError`` (a ``UserError``) if no sound bound is known here.
    """
    if not isinstance(event, DpEvent):
        raise UserTypeError(f"event must be a DpEvent, got {type(event).__name__}")
    ctx = _Ctx(_check_orders(orders), check_neighbouring(neighbouring))
    curve = _cached_curve(event, ctx)
    return RDP(ctx.orders, tuple(float(e) for e in curve.eps), ctx.neighbouring)


class RDPAccountant:
    """Composes events in Renyi DP and converts the total to (epsilon, delta)-DP.

    Guarantee: after composing events E_1..E_n (adaptively chosen), the whole run satisfies
    ``self.rdp`` (Renyi DP at each order; Mironov 2017, Proposition 1) and
    (``get_epsilon(delta)``, delta)-DP (Balle et al. 2020, Theorem 21), under ``neighbouring``
    (add/remove one unit by default). The noise multiplier of an event is relative to the
    sensitivity under that same relation.

    Example::

        acc = RDPAccountant()
        acc.compose(PoissonSampledEvent(0.01, GaussianEvent(1.1)), count=1000)
        eps = acc.get_epsilon(1e-5)
    """

    def __init__(
        self,
        orders: Sequence[float] | None = None,
        neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
    ) -> None:
        self._ctx = _Ctx(_check_orders(orders), check_neighbouring(neighbouring))
        self._eps = np.zeros(len(self._ctx.orders))
        self._pure = 0.0

    @property
    def orders(self) -> tuple[float, ...]:
        return self._ctx.orders

    @property
    def neighbouring(self) -> Neighbouring:
        return self._ctx.neighbouring

    def supports(self, event: DpEvent) -> bool:
        """Whether ``compose(event)`` would succeed (nothing is composed)."""
        try:
            _cached_curve(event, self._ctx)
        except UnsupportedEventError:
            return False
        return True

    def compose(self, event: DpEvent, count: int = 1) -> RDPAccountant:
        """Add ``count`` runs of ``event``. The event is fully checked first; on error nothing
        changes. Returns self, so calls chain."""
        if not isinstance(event, DpEvent):
            raise UserTypeError(f"event must be a DpEvent, got {type(event).__name__}")
        count = check.integer("count", count, minimum=1, fractional=UserError)  # numpy ints too
        curve = _cached_curve(event, self._ctx)
        self._eps = self._eps + count * curve.eps
        pure = self._pure + count * curve.pure
        self._pure = math.nextafter(pure, math.inf) if math.isfinite(pure) else pure
        return self

    @property
    def rdp(self) -> RDP:
        """The composed guarantee as RDP at each order (values rounded up)."""
        return RDP(self._ctx.orders, tuple(float(e) for e in self._eps), self._ctx.neighbouring)

    @property
    def pure_epsilon(self) -> float:
        """The sum of the events' pure-DP epsilons (inf if any event has none)."""
        return self._pure

    def get_epsilon_and_order(self, delta: float) -> tuple[float, float]:
        """(epsilon, the order that gave it); order is inf when the pure-DP sum was smaller."""
        if isinstance(delta, bool) or not isinstance(delta, int | float):
            raise UserTypeError(f"delta must be a real number, got {type(delta).__name__}")
        if math.isnan(delta) or not 0 <= delta < 1:
            raise UserError(f"delta must lie in [0, 1), got {delta!r}")
        if not np.any(self._eps):
            return (0.0, math.inf) if self._pure == 0 else (self._pure, math.inf)
        if delta == 0:
            return self._pure, math.inf
        eps, order = rdp_epsilon_and_order(self._ctx.orders, self._eps, delta)
        if self._pure <= eps:
            return self._pure, math.inf
        return eps, order

    def get_epsilon(self, delta: float) -> float:
        """The smallest epsilon found such that the composition is (epsilon, delta)-DP.

        With delta = 0 this is the pure-DP sum (inf when a Gaussian-type event was composed).
        """
        return self.get_epsilon_and_order(delta)[0]

    def get_delta(self, epsilon: float) -> float:
        """The smallest delta found such that the composition is (epsilon, delta)-DP."""
        if isinstance(epsilon, bool) or not isinstance(epsilon, int | float):
            raise UserTypeError(f"epsilon must be a real number, got {type(epsilon).__name__}")
        if math.isnan(epsilon) or math.isinf(epsilon) or epsilon < 0:
            raise UserError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
        if epsilon >= self._pure or not np.any(self._eps):
            return 0.0
        log_d = rdp_log_delta(self._ctx.orders, self._eps, float(epsilon))
        d = math.exp(log_d)
        return min(1.0, float(np.nextafter(d + d * _REL_SLACK, np.inf)))

    def approx_dp(self, delta: float) -> ApproxDP:
        """The composition as an ``ApproxDP`` guarantee at the given delta."""
        eps = self.get_epsilon(delta)
        if not math.isfinite(eps):
            raise UserError(
                "no finite epsilon at this delta: give delta > 0 for Gaussian-type events"
            )
        if eps == 0 and delta == 0:
            raise UserError("nothing has been composed: there is no privacy loss to report")
        return ApproxDP(eps, delta, self._ctx.neighbouring)

    def __repr__(self) -> str:
        return f"RDPAccountant({len(self._ctx.orders)} orders, {self._ctx.neighbouring})"
