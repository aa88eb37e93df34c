"""Calibration and error-bound mathematics for the noise mechanisms.

Pure functions, float in and float (or int) out. Nothing here draws noise; the mechanisms use
these functions to pick a noise scale for a privacy target and to state the error of a release.

Three families:

- **Continuous Gaussian** (``gaussian_delta``, ``gaussian_epsilon``, ``analytic_gaussian_sigma``,
  ``classic_gaussian_sigma``): the exact privacy curve of Balle and Wang (ICML 2018), evaluated in
  high precision with mpmath so the cancellation between its two terms cannot eat the answer.
- **Discrete Gaussian** N_Z(0, sigma^2), P[Y = y] proportional to exp(-y^2 / (2 sigma^2)) on the
  integers (Canonne, Kamath and Steinke, NeurIPS 2020): rigorous *upper* bounds on delta and on
  tail probabilities for any sigma (exact lattice sums for small sigma or steep tails,
  Euler-Maclaurin with a bounded remainder otherwise), and the calibrations built on them.
- **Discrete Laplace** (two-sided geometric), P[Y = y] proportional to exp(-|y| / t): closed forms.

Conventions. Every value that protects privacy or coverage is rounded in the safe direction: a
returned sigma or epsilon is never below the exact answer by more than the stated relative
tolerance and always satisfies the target *as computed*; a returned delta or tail probability is
rounded up to the next double. Mechanisms are stated for the add/remove-one-unit relation with the
sensitivity measured under that relation; the formulas themselves only see the sensitivity, so
they hold for "replace one unit" when given that relation's sensitivity.

Invalid arguments raise ``TypeError`` (not a number) or ``ValueError`` (out of range), naming the
parameter.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import mpmath
import numpy as np
from scipy import special

from dpcurator import _validation as check
from dpcurator.errors import InternalError, UserError

__all__ = [
    "analytic_gaussian_sigma",
    "classic_gaussian_sigma",
    "discrete_gaussian_delta_exact",
    "discrete_gaussian_delta_upper",
    "discrete_gaussian_interval",
    "discrete_gaussian_sigma",
    "discrete_gaussian_tail_upper",
    "discrete_gaussian_variance",
    "discrete_laplace_interval",
    "discrete_laplace_tail",
    "discrete_laplace_variance",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_interval",
    "laplace_interval",
]

# Relative tolerance of the sigma / epsilon searches (the answer is the upper end of a bracket
# whose ends differ by at most this factor, so it is conservative by construction).
_ANALYTIC_RTOL = 1e-12
_DISCRETE_RTOL = 1e-9

# Below this sigma the discrete Gaussian lattice sums are done term by term; above it the tails
# use Euler-Maclaurin (whose remainder is then below 1e-17 of the normaliser, see _em_tail).
_DIRECT_SIGMA = 8.0
# Largest sigma accepted by the plain double-precision reference sum.
_EXACT_MAX_SIGMA = 1000.0

# Euler-Maclaurin order 2m = 10: Bernoulli numbers B_2, B_4, ..., B_10 (DLMF Table 24.2.1).
_EM_BERNOULLI = (
    Fraction(1, 6),
    Fraction(-1, 30),
    Fraction(1, 42),
    Fraction(-1, 30),
    Fraction(5, 66),
)
_EM_ORDER = 10
# Every zero of He_10 lies below sqrt(4 * 10 + 2): the zeros of the physicists' H_n lie below
# sqrt(2n + 1) (Szego, "Orthogonal Polynomials", Section 6.31) and He_n(x) = 2^(-n/2) H_n(x/sqrt 2).
_EM_MONOTONE_FROM = math.sqrt(4 * _EM_ORDER + 2)


# --------------------------------------------------------------------------------------------
# High-precision helpers
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _context(dps: int) -> Any:
    """A private mpmath context at ``dps`` decimal digits (never mutated after creation)."""
    ctx = mpmath.MPContext()
    ctx.dps = dps
    return ctx


def _round_up(ctx: Any, value: Any) -> float:
    """The smallest double that is >= ``value`` (an mpf), clamped to [0, inf)."""
    if value <= 0:
        return 0.0
    result = float(value)
    if ctx.mpf(result) < value:
        result = math.nextafter(result, math.inf)
    return result


# --------------------------------------------------------------------------------------------
# Continuous Gaussian
# --------------------------------------------------------------------------------------------


def _gaussian_context(epsilon: float, sigma: float, sensitivity: float) -> Any:
    # Cancellation between the two terms of the curve costs about log10(sigma/Delta) digits when
    # sigma >> Delta; give that back on top of 30 working digits.
    ratio = sigma / sensitivity
    spread = abs(math.log10(ratio)) if 0.0 < ratio < math.inf else 300.0
    return _context(30 + math.ceil(spread) + math.ceil(math.log10(1.0 + epsilon)))


def _gaussian_delta_mp(ctx: Any, epsilon: float, sigma: float, sensitivity: float) -> Any:
    """Balle-Wang curve Phi(D/(2s) - e s/D) - e^e Phi(-D/(2s) - e s/D) at ctx's precision."""
    s = ctx.mpf(sigma)
    d = ctx.mpf(sensitivity)
    e = ctx.mpf(epsilon)
    a = d / (2 * s)
    b = e * s / d
    root2 = ctx.sqrt(2)
    # Phi(x) = erfc(-x / sqrt 2) / 2
    first = ctx.erfc((b - a) / root2) / 2
    second = ctx.exp(e) * ctx.erfc((a + b) / root2) / 2
    return first - second


def _gaussian_delta_rounded_up(epsilon: float, sigma: float, sensitivity: float) -> float:
    ctx = _gaussian_context(epsilon, sigma, sensitivity)
    return min(1.0, _round_up(ctx, _gaussian_delta_mp(ctx, epsilon, sigma, sensitivity)))


def gaussian_delta(epsilon: float, sigma: float, sensitivity: float) -> float:
    """The exact privacy curve delta(epsilon) of the Gaussian mechanism, rounded up.

    For M(x) = f(x) + N(0, sigma^2 I) with L2 sensitivity Delta, M is (epsilon, delta)-DP if and
    only if

        delta >= Phi(Delta/(2 sigma) - epsilon sigma/Delta)
                 - e^epsilon Phi(-Delta/(2 sigma) - epsilon sigma/Delta)

    (Balle and Wang, "Improving the Gaussian mechanism for differential privacy: analytical
    calibration and optimal denoising", ICML 2018, Theorem 8). The right-hand side is returned,
    computed with mpmath at enough digits to survive the cancellation between its two terms
    (which grows like sigma/Delta) and rounded up to the next double, so the value is never
    below the true curve. It holds for both add/remove and replace neighbours, with Delta the
    sensitivity under the relation in use.

    Args:
        epsilon: epsilon >= 0.
        sigma: standard deviation of the noise, > 0.
        sensitivity: L2 sensitivity Delta > 0.
    """
    eps = check.nonnegative("epsilon", epsilon)
    sig = check.positive("sigma", sigma)
    sens = check.positive("sensitivity", sensitivity)
    return _gaussian_delta_rounded_up(eps, sig, sens)


@functools.lru_cache(maxsize=256)  # pure; a bisection of mpmath calls, ms each time
def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """The smallest sigma for which the Gaussian mechanism is (epsilon, delta)-DP.

    Solves gaussian_delta(epsilon, sigma, Delta) = delta for sigma, the analytic Gaussian
    mechanism of Balle and Wang (ICML 2018, Theorem 8 for the curve; their Algorithm 1 solves the
    same equation by a different parametrisation). The curve is strictly decreasing in sigma
    (ibid.), so the search is a geometric bisection that keeps delta(hi) <= target < delta(lo)
    and stops when hi / lo - 1 <= 1e-12; ``hi`` is returned. Hence
    ``gaussian_delta(epsilon, result, sensitivity) <= delta`` always holds (checked on the
    rounded-up curve), and the result exceeds the exact minimum by a relative 1e-12 at most.
    Valid for every epsilon >= 0 (unlike the classical bound, which needs epsilon < 1); large
    epsilon (e.g. 50) is fine because the curve is evaluated with mpmath.

    Args:
        epsilon: epsilon >= 0.
        delta: target delta, 0 < delta < 1.
        sensitivity: L2 sensitivity Delta > 0.
    """
    eps = check.nonnegative("epsilon", epsilon)
    target = check.unit_interval("delta", delta)
    sens = check.positive("sensitivity", sensitivity)

    def private_enough(sigma: float) -> bool:
        return _gaussian_delta_rounded_up(eps, sigma, sens) <= target

    # Starting point: sigma_0 = Delta / (sqrt(2 pi) delta) always suffices, because
    # delta(epsilon) <= delta(0) = 2 Phi(Delta/(2 sigma)) - 1 <= Delta / (sqrt(2 pi) sigma);
    # the classical bound is usually much closer when epsilon is not tiny.
    guess = sens / (math.sqrt(2.0 * math.pi) * target)
    if eps > 0.0:
        guess = min(guess, sens * math.sqrt(2.0 * math.log(1.25 / target)) / eps)
    return _geometric_bisection(private_enough, guess, 0.5, _ANALYTIC_RTOL, "sigma")


def gaussian_epsilon(delta: float, sigma: float, sensitivity: float) -> float:
    """The smallest epsilon >= 0 for which N(0, sigma^2) noise is (epsilon, delta)-DP.

    Inverts the Balle-Wang curve (ICML 2018, Theorem 8) in epsilon: the curve is non-increasing
    in epsilon, so a bisection keeps delta(hi) <= target and returns ``hi`` once
    hi - lo <= 1e-12 hi. The result therefore satisfies
    ``gaussian_delta(result, sigma, sensitivity) <= delta`` and is conservative (rounded up).
    Returns 0.0 when the mechanism is already (0, delta)-DP.

    Args:
        delta: target delta, 0 < delta < 1.
        sigma: standard deviation of the noise, > 0.
        sensitivity: L2 sensitivity Delta > 0.
    """
    target = check.unit_interval("delta", delta)
    sig = check.positive("sigma", sigma)
    sens = check.positive("sensitivity", sensitivity)

    def private_enough(eps: float) -> bool:
        return _gaussian_delta_rounded_up(eps, sig, sens) <= target

    if private_enough(0.0):
        return 0.0
    lo, hi = 0.0, 1.0
    while not private_enough(hi):
        lo, hi = hi, 2.0 * hi
        if hi > 1e6:  # delta(epsilon) -> 0, so this only happens for absurd inputs
            raise UserError(
                f"delta={target!r} needs epsilon above 1e6 at sigma={sig!r}; increase sigma"
            )
    while hi - lo > _ANALYTIC_RTOL * hi:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if private_enough(mid):
            hi = mid
        else:
            lo = mid
    return hi


def classic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """The classical Gaussian calibration sigma = Delta sqrt(2 ln(1.25/delta)) / epsilon.

    Dwork and Roth, "The Algorithmic Foundations of Differential Privacy" (2014), Theorem A.1:
    for 0 < epsilon < 1 this sigma makes the Gaussian mechanism (epsilon, delta)-DP. Kept for
    comparison: ``analytic_gaussian_sigma`` is never larger and is valid for all epsilon.

    Args:
        epsilon: 0 < epsilon < 1 (the theorem does not cover epsilon >= 1).
        delta: 0 < delta < 1.
        sensitivity: L2 sensitivity Delta > 0.
    """
    eps = check.unit_interval("epsilon", epsilon)
    target = check.unit_interval("delta", delta)
    sens = check.positive("sensitivity", sensitivity)
    return sens * math.sqrt(2.0 * math.log(1.25 / target)) / eps


def gaussian_interval(alpha: float, sigma: float) -> float:
    """Half-width m with P[|X| > m] = alpha for X ~ N(0, sigma^2): m = sigma Phi^{-1}(1 - alpha/2).

    For comparison and documentation (the library releases discrete noise; see
    ``discrete_gaussian_interval``). Computed as -sigma Phi^{-1}(alpha/2) to stay accurate for
    tiny alpha.

    Args:
        alpha: 0 < alpha < 1.
        sigma: standard deviation, > 0.
    """
    a = check.unit_interval("alpha", alpha)
    sig = check.positive("sigma", sigma)
    return -sig * float(special.ndtri(0.5 * a))


def laplace_interval(alpha: float, scale: float) -> float:
    """Half-width m with P[|X| > m] = alpha for X ~ Laplace(0, b): m = b ln(1/alpha).

    From P[|X| > m] = exp(-m/b). For comparison and documentation (see
    ``discrete_laplace_interval`` for the noise the library releases).

    Args:
        alpha: 0 < alpha < 1.
        scale: Laplace scale b > 0.
    """
    a = check.unit_interval("alpha", alpha)
    b = check.positive("scale", scale)
    return -b * math.log(a)


def _geometric_bisection(
    private_enough: Callable[[float], bool], guess: float, spread: float, rtol: float, name: str
) -> float:
    """Smallest x > 0 with private_enough(x), for a predicate that is monotone in x.

    Brackets around ``guess`` with steps of relative size ``spread`` (doubling the step each
    time), keeping private_enough(hi) true and private_enough(lo) false, then bisects
    geometrically until hi / lo - 1 <= rtol and returns hi.
    """
    step = spread
    if private_enough(guess):
        hi = guess
        lo = hi / (1.0 + step)
        while private_enough(lo):
            hi = lo
            step *= 2.0
            lo = hi / (1.0 + step)
            if lo == 0.0:
                return hi
    else:
        lo = guess
        hi = lo * (1.0 + step)
        while not private_enough(hi):
            lo = hi
            step *= 2.0
            hi = lo * (1.0 + step)
            if not math.isfinite(hi):
                raise UserError(f"no finite {name} meets the target; loosen epsilon or delta")
    while hi > lo * (1.0 + rtol):
        mid = math.sqrt(lo) * math.sqrt(hi)
        if not lo < mid < hi:
            break
        if private_enough(mid):
            hi = mid
        else:
            lo = mid
    return hi


# --------------------------------------------------------------------------------------------
# Discrete Gaussian: rigorous lattice sums
# --------------------------------------------------------------------------------------------


class _LatticeGaussian:
    """Rigorous enclosures of sums of w(k) = exp(-k^2 / (2 sigma^2)) over the integers.

    All arithmetic is in a private mpmath context with 40 + log10(sigma) digits; every enclosure
    is widened by a relative ``slack`` of 10^-(dps - 10), which dominates the accumulated
    rounding of the few hundred operations behind it, so the enclosures hold for the real
    numbers, not just for the floating-point computation.
    """

    def __init__(self, sigma: float) -> None:
        dps = 40 + max(0, math.ceil(math.log10(sigma)))
        ctx = _context(dps)
        self.ctx = ctx
        self.sigma_float = sigma
        self.sigma = ctx.mpf(sigma)
        self.two_var = 2 * self.sigma * self.sigma
        self.slack = ctx.mpf(10) ** (-(dps - 10))
        self.stop = ctx.mpf(10) ** (-(dps + 5))
        self.norm_lo, self.norm_hi = self._normaliser()

    # -- pieces ------------------------------------------------------------------------------

    def weight(self, k: int) -> Any:
        kk = self.ctx.mpf(k)
        return self.ctx.exp(-kk * kk / self.two_var)

    def integral_from(self, x: Any) -> Any:
        """Integral of w over [x, inf): sigma sqrt(pi/2) erfc(x / (sigma sqrt 2))."""
        ctx = self.ctx
        return self.sigma * ctx.sqrt(ctx.pi / 2) * ctx.erfc(x / (self.sigma * ctx.sqrt(2)))

    def _widen(self, lo: Any, hi: Any) -> tuple[Any, Any]:
        return lo * (1 - self.slack), hi * (1 + self.slack)

    # -- tails -------------------------------------------------------------------------------

    def tail(self, n: int) -> tuple[Any, Any]:
        """Enclosure of T(n) = sum_{k >= n} w(k) for an integer n >= 0."""
        if n < 0:
            raise InternalError(f"tail start must be >= 0, got {n}; this is probably a bug")
        steep = 2 * n > self.sigma_float * self.sigma_float  # w(n+1)/w(n) < exp(-1/2)
        if self.sigma_float < _DIRECT_SIGMA or steep:
            return self._direct_tail(n)
        return self._em_tail(n)

    def _direct_tail(self, n: int) -> tuple[Any, Any]:
        """Term-by-term sum, stopped once a term is below 10^-(dps+5) of the running total.

        The rest, sum_{k >= N} w(k) for N >= 0 where w is decreasing, lies between
        integral_N^inf w and w(N) + integral_N^inf w (compare each term with the integral over
        the unit interval to its left / right).
        """
        total = self.ctx.mpf(0)
        k = n
        for _ in range(1_000_000):
            term = self.weight(k)
            total += term
            k += 1
            if term <= total * self.stop:
                break
        else:  # pragma: no cover - the loop needs at most ~20 sigma + 300 terms here
            raise InternalError("the lattice sum did not converge; this is probably a bug")
        rest = self.integral_from(self.ctx.mpf(k))
        return self._widen(total + rest, total + self.weight(k) + rest)

    def _em_tail(self, n: int) -> tuple[Any, Any]:
        """Euler-Maclaurin enclosure of T(n), n >= 1, used when sigma >= 8 and n <= sigma^2 / 2.

        DLMF 2.10.1 with all terms up to B_10 and a -> n, b -> inf:

            T(n) = int_n^inf w + w(n)/2 - sum_{j=1}^{5} B_{2j}/(2j)! w^{(2j-1)}(n) + R,
            |R| <= |B_10| / 10! * int_n^inf |w^{(10)}|

        (the periodic Bernoulli function satisfies |B~_10(x)| <= |B_10|, DLMF 24.9.1).
        With u = n / sigma, w^{(k)}(x) = (-1/sigma)^k He_k(x/sigma) w(x) (probabilists' Hermite
        polynomials), so the sum becomes + sum_j B_{2j}/(2j)! sigma^{1-2j} He_{2j-1}(u) w(n) and

            int_n^inf |w^{(10)}| = sigma^-9 J(u),  J(u) = int_u^inf |He_10(v)| e^{-v^2/2} dv.

        For u >= sqrt(42), beyond every zero of He_10, J(u) = He_9(u) e^{-u^2/2} exactly (since
        (He_9 e^{-v^2/2})' = -He_10 e^{-v^2/2}); below that, Cauchy-Schwarz with
        int He_10^2 e^{-v^2/2} = sqrt(2 pi) 10! gives J(u) <= sqrt(2 pi) sqrt(10! Q(u)),
        Q the standard normal upper tail. For sigma >= 8 the remainder is below 1e-17 of the
        normaliser, and it shrinks like w(n) far in the tail. The enclosure is also intersected
        with the elementary one  int_n^inf w <= T(n) <= w(n) + int_n^inf w.
        """
        ctx = self.ctx
        u = ctx.mpf(n) / self.sigma
        wn = ctx.exp(-u * u / 2)
        hermite = [ctx.mpf(1), u]  # He_0, He_1, ...
        for k in range(1, _EM_ORDER):
            hermite.append(u * hermite[k] - k * hermite[k - 1])
        integral = self.integral_from(ctx.mpf(n))
        estimate = integral + wn / 2
        for j, bernoulli in enumerate(_EM_BERNOULLI, start=1):
            order = 2 * j - 1
            coefficient = ctx.mpf(bernoulli.numerator) / bernoulli.denominator
            coefficient /= math.factorial(2 * j)
            estimate += coefficient * hermite[order] * wn / self.sigma**order
        if u >= _EM_MONOTONE_FROM:
            j_bound = hermite[_EM_ORDER - 1] * wn
        else:
            upper_tail = ctx.erfc(u / ctx.sqrt(2)) / 2
            j_bound = ctx.sqrt(2 * ctx.pi) * ctx.sqrt(math.factorial(_EM_ORDER) * upper_tail)
        last = _EM_BERNOULLI[-1]
        remainder = (ctx.mpf(abs(last.numerator)) / last.denominator) / math.factorial(_EM_ORDER)
        remainder *= j_bound / self.sigma ** (_EM_ORDER - 1)
        lo = max(estimate - remainder, integral)
        hi = min(estimate + remainder, wn + integral)
        return self._widen(lo, hi)

    def _normaliser(self) -> tuple[Any, Any]:
        """Enclosure of Z = sum_k w(k).

        Small sigma: Z = 1 + 2 T(1) summed directly. Otherwise Poisson summation,
        Z = sqrt(2 pi) sigma (1 + 2 sum_{j >= 1} exp(-2 pi^2 sigma^2 j^2)), so
        sqrt(2 pi) sigma <= Z <= sqrt(2 pi) sigma (1 + 2 r / (1 - r)), r = exp(-2 pi^2 sigma^2)
        (the sum over j^2 is at most the geometric series in r).
        """
        ctx = self.ctx
        if self.sigma_float < _DIRECT_SIGMA:
            lo, hi = self._direct_tail(1)
            return 1 + 2 * lo, 1 + 2 * hi
        base = ctx.sqrt(2 * ctx.pi) * self.sigma
        r = ctx.exp(-2 * ctx.pi**2 * self.sigma**2)
        return self._widen(base, base * (1 + 2 * r / (1 - r)))

    # -- probabilities -----------------------------------------------------------------------

    def prob_at_least(self, n: int) -> tuple[Any, Any]:
        """Enclosure of P[Y >= n] for any integer n (symmetry handles n <= 0)."""
        if n >= 1:
            lo, hi = self.tail(n)
            return lo / self.norm_hi, min(self.ctx.mpf(1), hi / self.norm_lo)
        # P[Y >= n] = 1 - P[Y <= n - 1] = 1 - P[Y >= 1 - n]
        lo, hi = self.prob_at_least(1 - n)
        return max(self.ctx.mpf(0), 1 - hi), 1 - lo

    def abs_at_least_hi(self, m: int) -> Any:
        """Upper bound on P[|Y| >= m] = 2 T(m) / Z for m >= 1 (1 for m = 0)."""
        if m <= 0:
            return self.ctx.mpf(1)
        return min(self.ctx.mpf(1), 2 * self.tail(m)[1] / self.norm_lo)

    def delta_hi(self, epsilon: float, sensitivity: int) -> Any:
        """Upper bound on the discrete Gaussian mechanism's delta(epsilon); see the public docs."""
        scaled = Fraction(epsilon) * Fraction(self.sigma_float) ** 2 / sensitivity
        threshold = scaled - Fraction(sensitivity, 2)
        n1 = math.floor(threshold) + 1  # P[Y > c] = P[Y >= floor(c) + 1] on the integers
        n2 = n1 + sensitivity  # c + Delta has floor(c) + Delta, Delta an integer
        first_hi = self.prob_at_least(n1)[1]
        second_lo = self.prob_at_least(n2)[0]
        bound = first_hi - self.ctx.exp(self.ctx.mpf(epsilon)) * second_lo
        return min(self.ctx.mpf(1), bound)


def discrete_gaussian_delta_upper(epsilon: float, sigma: float, sensitivity: int) -> float:
    """A rigorous upper bound on delta(epsilon) of the discrete Gaussian mechanism.

    M(x) = f(x) + Y with Y ~ N_Z(0, sigma^2) and f integer-valued with |f(x) - f(x')| <= Delta
    for neighbours x, x' (one dimension). Canonne, Kamath and Steinke ("The discrete Gaussian for
    differential privacy", NeurIPS 2020, arXiv:2004.00010, Theorem 7) show M is (epsilon,
    delta)-DP exactly for

        delta >= P[Y > c] - e^epsilon P[Y > c + Delta],   c = epsilon sigma^2/Delta - Delta/2,

    which is also Sum_y max(0, P[Y=y] - e^epsilon P[Y=y-Delta]) (the tests check both agree).
    The thresholds are computed exactly in rational arithmetic, so P[Y > c] = P[Y >= n] with
    the right integer n. Each probability is a lattice tail divided by Z = Sum_k w(k),
    w(k) = exp(-k^2/(2 sigma^2)); we bound the first term from above and the subtracted term from
    below with

    - T(n) = Sum_{k >= n} w(k) summed term by term (rest bounded by integrals) when sigma < 8 or
      n > sigma^2/2, otherwise Euler-Maclaurin to order 10 with a proven remainder bound (see
      ``_LatticeGaussian._em_tail``), intersected with int_n^inf w <= T(n) <= w(n) + int_n^inf w;
    - sqrt(2 pi) sigma <= Z <= sqrt(2 pi) sigma (1 + 2 r/(1 - r)), r = exp(-2 pi^2 sigma^2)
      (Poisson summation), or the direct sum for small sigma;
    - P[Y >= n] = 1 - P[Y >= 1 - n] for n <= 0 (symmetry).

    Arithmetic is mpmath with 40 + log10(sigma) digits, widened by a slack that dominates its
    rounding, and the result is rounded up to a double. It works for any sigma (2^40 included)
    and is tight: relative excess below 1e-12 in practice (the remainder terms are far below
    delta for any delta a user can ask for).

    Args:
        epsilon: epsilon >= 0.
        sigma: the discrete Gaussian's scale parameter, > 0 (its variance is slightly below
            sigma^2, see ``discrete_gaussian_variance``).
        sensitivity: integer sensitivity Delta >= 1.
    """
    eps = check.nonnegative("epsilon", epsilon)
    sig = check.positive("sigma", sigma)
    sens = check.integer("sensitivity", sensitivity, minimum=1, fractional=UserError)
    lattice = _LatticeGaussian(sig)
    return min(1.0, _round_up(lattice.ctx, lattice.delta_hi(eps, sens)))


def discrete_gaussian_delta_exact(epsilon: float, sigma: float, sensitivity: int) -> float:
    """delta(epsilon) of the discrete Gaussian mechanism by direct summation (sigma <= 1000).

    Evaluates the definition delta = Sum_y max(0, P[Y=y] - e^epsilon P[Y=y-Delta]) for
    Y ~ N_Z(0, sigma^2) term by term in 40-digit mpmath. The positive terms are those with
    privacy loss L(y) = (Delta^2 - 2 y Delta)/(2 sigma^2) > epsilon, i.e. the integers
    y < Delta/2 - epsilon sigma^2/Delta (found exactly in rational arithmetic); each is
    w(y) (1 - e^(epsilon - L(y))) with w(y) = exp(-y^2/(2 sigma^2)); successive w and
    e^(epsilon - L) follow exact multiplicative recurrences, so each term costs two products.
    The sum runs down from the largest such y until, past the mode, a term is below 1e-45 of the
    total; Z = 1 + 2 Sum_{k>=1} w(k) likewise. This equals the expression
    in Canonne, Kamath and Steinke 2020, Theorem 7, and serves as an independent reference for
    ``discrete_gaussian_delta_upper`` (it truncates, so it is not itself a rigorous bound).
    Costs O(sigma) terms, hence the limit on sigma.

    Args:
        epsilon: epsilon >= 0.
        sigma: scale, 0 < sigma <= 1000.
        sensitivity: integer sensitivity Delta >= 1.
    """
    eps = check.nonnegative("epsilon", epsilon)
    sig = check.positive("sigma", sigma)
    if sig > _EXACT_MAX_SIGMA:
        raise UserError(
            f"sigma must be <= {_EXACT_MAX_SIGMA:g} for direct summation, got {sig!r}; "
            "use discrete_gaussian_delta_upper for larger sigma"
        )
    sens = check.integer("sensitivity", sensitivity, minimum=1, fractional=UserError)
    ctx = _context(40)
    stop = ctx.mpf(10) ** -45
    two_var = 2 * ctx.mpf(sig) ** 2
    shrink = ctx.exp(-2 / two_var)  # ratio of successive weight ratios

    # Z = 1 + 2 Sum_{k>=1} w(k), with w(k+1) = w(k) r_k and r_{k+1} = r_k shrink
    # (r_k = exp(-(2k + 1)/(2 sigma^2))); a few thousand products lose under 1e-35.
    weight = ctx.exp(-1 / two_var)
    ratio = ctx.exp(-3 / two_var)
    normaliser = ctx.mpf(0)
    while True:
        normaliser += weight
        if weight <= normaliser * stop:
            break
        weight *= ratio
        ratio *= shrink
    normaliser = 1 + 2 * normaliser

    threshold = Fraction(sens, 2) - Fraction(eps) * Fraction(sig) ** 2 / sens
    y = math.ceil(threshold) - 1  # largest integer with L(y) > epsilon
    yy = ctx.mpf(y)
    weight = ctx.exp(-yy * yy / two_var)
    ratio = ctx.exp((2 * yy - 1) / two_var)  # w(y - 1) / w(y), times shrink per step down
    excess = ctx.mpf(eps) - (sens * sens - 2 * yy * sens) / two_var  # epsilon - L(y) < 0
    factor_step = ctx.exp(-2 * ctx.mpf(sens) / two_var)  # e^{eps - L(y-1)} / e^{eps - L(y)}
    factor = ctx.exp(excess)
    total = -ctx.expm1(excess) * weight  # first term: expm1 avoids cancellation near L = eps
    while True:
        y -= 1
        weight *= ratio
        ratio *= shrink
        factor *= factor_step
        term = weight * (1 - factor)
        total += term
        if y <= 0 and term <= total * stop:
            break
    return min(1.0, float(total / normaliser))


def discrete_gaussian_sigma(epsilon: float, delta: float, sensitivity: int) -> float:
    """The smallest sigma with ``discrete_gaussian_delta_upper(epsilon, sigma, Delta) <= delta``.

    Canonne, Kamath and Steinke (NeurIPS 2020, Theorem 7) give the discrete Gaussian mechanism's
    exact delta; this inverts our rigorous upper bound on it. The search starts from the
    continuous analytic sigma (Balle-Wang), which it matches closely for large sigma, brackets,
    and bisects geometrically until hi / lo - 1 <= 1e-9, returning ``hi`` (rounded up). The
    returned sigma always satisfies the bound; it is the smallest to that tolerance wherever the
    bound is monotone in sigma (it is in every case we have examined, but that is observed, not
    proven, for sigma below about 8).

    Args:
        epsilon: epsilon >= 0.
        delta: target delta, 0 < delta < 1.
        sensitivity: integer sensitivity Delta >= 1.
    """
    eps = check.nonnegative("epsilon", epsilon)
    target = check.unit_interval("delta", delta)
    sens = check.integer("sensitivity", sensitivity, minimum=1, fractional=UserError)

    def private_enough(sigma: float) -> bool:
        lattice = _LatticeGaussian(sigma)
        return _round_up(lattice.ctx, lattice.delta_hi(eps, sens)) <= target

    guess = analytic_gaussian_sigma(eps, target, float(sens)) * (1.0 + 1e-6)
    return _geometric_bisection(private_enough, guess, 1e-3, _DISCRETE_RTOL, "sigma")


def discrete_gaussian_tail_upper(m: int, sigma: float) -> float:
    """A rigorous upper bound on P[|Y| >= m] for Y ~ N_Z(0, sigma^2).

    P[|Y| >= m] = 2 T(m) / Z with T(m) = Sum_{k >= m} exp(-k^2/(2 sigma^2)); the numerator is
    bounded above and Z below exactly as in ``discrete_gaussian_delta_upper`` (direct lattice sums
    for small sigma or steep tails, Euler-Maclaurin with a proven remainder otherwise, Poisson
    summation for Z), in mpmath, then rounded up to a double. Returns 1.0 for m = 0.

    Args:
        m: integer m >= 0.
        sigma: scale, > 0.
    """
    mm = check.integer("m", m, minimum=0, fractional=UserError)
    sig = check.positive("sigma", sigma)
    lattice = _LatticeGaussian(sig)
    return min(1.0, _round_up(lattice.ctx, lattice.abs_at_least_hi(mm)))


@functools.lru_cache(maxsize=256)  # a pure function of two numbers; a repeated query's
# partition selection and intervals ask again (about 20 ms a call)
def discrete_gaussian_interval(alpha: float, sigma: float) -> int:
    """The smallest integer m >= 0 whose rigorous bound gives P[|Y| > m] <= alpha.

    Y ~ N_Z(0, sigma^2), so [-m, m] contains the noise with probability at least 1 - alpha:
    m is the least integer with ``discrete_gaussian_tail_upper(m + 1, sigma) <= alpha``, found
    by integer bisection around the continuous answer sigma Phi^{-1}(1 - alpha/2). For small
    sigma the bound is an exact lattice sum (up to a relative 1e-30), so m is the true minimum;
    for large sigma the Euler-Maclaurin enclosure is far tighter than the spacing between
    integers, so it is the true minimum there too except at exact ties.

    Args:
        alpha: 0 < alpha < 1.
        sigma: scale, > 0.
    """
    a = check.unit_interval("alpha", alpha)
    sig = check.positive("sigma", sigma)
    lattice = _LatticeGaussian(sig)
    limit = lattice.ctx.mpf(a)

    def covers(m: int) -> bool:  # P[|Y| > m] = P[|Y| >= m + 1] <= alpha, by the upper bound
        return bool(lattice.abs_at_least_hi(m + 1) <= limit)

    if covers(0):
        return 0
    guess = sig * -float(special.ndtri(0.5 * a))
    hi = max(1, math.ceil(guess * (1.0 + 1e-6)) + 1)
    while not covers(hi):
        hi *= 2
    lo = min(hi - 1, max(0, math.floor(guess * (1.0 - 1e-6)) - 1))
    while lo > 0 and covers(lo):
        lo //= 2
    # Invariant: covers(hi) and not covers(lo).
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if covers(mid):
            hi = mid
        else:
            lo = mid
    return hi


def discrete_gaussian_variance(sigma: float) -> float:
    """Var[Y] for Y ~ N_Z(0, sigma^2), to double precision.

    Canonne, Kamath and Steinke (NeurIPS 2020) show Var[Y] < sigma^2. Exactly, with s = sigma^2,
    Poisson summation gives Z = sqrt(2 pi s) theta(s) with
    theta(s) = 1 + 2 Sum_{j>=1} e^{-2 pi^2 s j^2}, and Var[Y] = 2 s^2 (ln Z)'(s), hence

        Var[Y] = s - 8 pi^2 s^2 Sum_{j>=1} j^2 e^{-2 pi^2 s j^2} / theta(s)

    (so sigma^2 - Var[Y] <= 8 pi^2 sigma^4 e^{-2 pi^2 sigma^2} (1 + o(1)), below 1e-60 sigma^2
    once sigma >= 2). We evaluate this rapidly converging series for sigma > 1 and the direct sum
    Var = 2 Sum_{k>=1} k^2 w(k) / (1 + 2 Sum_{k>=1} w(k)) for sigma <= 1.

    Args:
        sigma: scale, > 0.
    """
    sig = check.positive("sigma", sigma)
    s = sig * sig
    if sig <= 1.0:
        ks = np.arange(1, math.ceil(40.0 * sig) + 3, dtype=np.float64)
        w = np.exp(-(ks * ks) / (2.0 * s))
        return 2.0 * math.fsum((ks * ks * w).tolist()) / (1.0 + 2.0 * math.fsum(w.tolist()))
    js = np.arange(1, 6, dtype=np.float64)
    r = np.exp(-2.0 * math.pi**2 * s * js * js)
    theta = 1.0 + 2.0 * math.fsum(r.tolist())
    deficit = 8.0 * math.pi**2 * s * s * math.fsum((js * js * r).tolist()) / theta
    return s - deficit


# --------------------------------------------------------------------------------------------
# Discrete Laplace (two-sided geometric)
# --------------------------------------------------------------------------------------------


def discrete_laplace_tail(m: int, t: float) -> float:
    """Exact P[|Y| >= m] for the discrete Laplace distribution P[Y = y] ∝ exp(-|y|/t).

    With q = e^{-1/t}, P[Y = y] = (1 - q)/(1 + q) q^{|y|}, so for m >= 1

        P[|Y| >= m] = 2 (1 - q)/(1 + q) Sum_{k >= m} q^k = 2 q^m / (1 + q)

    (and 1 for m = 0). Computed as 2 exp(-m/t) / (1 + exp(-1/t)), accurate for any t > 0
    (t = 2^45 included). See Inusah and Kozubowski, "A discrete analogue of the Laplace
    distribution" (J. Stat. Plan. Inference, 2006) for the distribution.

    Args:
        m: integer m >= 0.
        t: scale t > 0 (the discrete Laplace mechanism uses t = Delta / epsilon).
    """
    mm = check.integer("m", m, minimum=0, fractional=UserError)
    scale = check.positive("t", t)
    if mm == 0:
        return 1.0
    return min(1.0, 2.0 * math.exp(-mm / scale) / (1.0 + math.exp(-1.0 / scale)))


def discrete_laplace_interval(alpha: float, t: float) -> int:
    """The smallest integer m >= 0 with P[|Y| > m] <= alpha, Y discrete Laplace with scale t.

    From the exact tail (see ``discrete_laplace_tail``), P[|Y| > m] = 2 q^{m+1}/(1 + q) <= alpha
    iff m >= t (ln(2/alpha) - ln(1 + q)) - 1, q = e^{-1/t}; so
    m = max(0, ceil(t (ln(2/alpha) - log1p(q)) - 1)), about t ln(1/alpha) for large t. Evaluated
    with 40-digit mpmath and checked against the tail at m and m - 1, so it is exact even for
    t = 2^45 where t ln(1/alpha) loses the units digit in double precision.

    Args:
        alpha: 0 < alpha < 1.
        t: scale t > 0.
    """
    a = check.unit_interval("alpha", alpha)
    scale = check.positive("t", t)
    ctx = _context(40)
    tt = ctx.mpf(scale)
    q = ctx.exp(-1 / tt)
    limit = ctx.mpf(a)

    def covers(m: int) -> bool:
        return bool(2 * ctx.exp(-(m + 1) / tt) / (1 + q) <= limit)

    level = ctx.log(2 / limit) - ctx.log1p(q)
    m = max(0, int(ctx.ceil(tt * level - 1)))
    while not covers(m):
        m += 1
    while m > 0 and covers(m - 1):
        m -= 1
    return m


def discrete_laplace_variance(t: float) -> float:
    """Var[Y] = 2q / (1 - q)^2, q = e^{-1/t}, for the discrete Laplace with scale t.

    From E[Y^2] = 2 (1 - q)/(1 + q) Sum_{k >= 1} k^2 q^k = 2q/(1 - q)^2. Computed with
    1 - q = -expm1(-1/t), so it stays accurate (about 2 t^2) for huge t.

    Args:
        t: scale t > 0.
    """
    scale = check.positive("t", t)
    q = math.exp(-1.0 / scale)
    one_minus_q = -math.expm1(-1.0 / scale)
    return 2.0 * q / (one_minus_q * one_minus_q)
