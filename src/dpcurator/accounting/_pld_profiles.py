"""Privacy-loss profiles of mechanisms (private; used by ``accounting.pld``).

Two kinds of profile:

- **continuous, monotone** (``MixtureProfile``): additive Gaussian or Laplace noise, optionally
  Poisson-subsampled. The output x is one real number and the privacy loss is a monotone
  function of x, so P[L > t] and Q[L > t] have closed forms through the noise CDF. The grid PMF
  is built from exact cell masses by connect the dots (``_pld_core.connect_the_dots``);
- **atoms** (``Atoms``): mechanisms whose loss takes finitely many values (randomized response,
  discrete Laplace, pure and approximate DP) or countably many that are summed exactly
  (discrete Gaussian).

Conventions (as in Google's dp_accounting). A pair (P, Q) is written for one ordered pair of
neighbours; L = ln(dP/dQ) with the output drawn from P, and delta(eps) = E_P[max(0, 1 -
e^(eps - L))] = sup_S P(S) - e^eps Q(S). For add/remove neighbours, "remove" is P = M(D),
Q = M(D') where D' has one unit fewer, "add" the opposite order. With base noise A = noise
around 0 and B = noise around 1 (sensitivity 1 in units of the noise scale) and Poisson
sampling rate q, the tight pairs are (Zhu, Dong and Wang, "Optimal accounting of differential
privacy via characteristic function", AISTATS 2022, Section 5; Koskela, Jalko and Honkela,
"Computing tight differential privacy guarantees using FFT", AISTATS 2020):

- remove: P = (1 - q) A + q B, Q = A, so L(x) = ln(1 - q + q e^{r(x)}) with r = ln(dB/dA);
- add:    P = A, Q = (1 - q) A + q B, so L(x) = -ln(1 - q + q e^{r(x)}).

r is non-decreasing in x for both noises, hence L is monotone in x.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
from scipy import special

from dpcurator.accounting._pld_core import MAX_FINITE_LOSS, MAX_GRID_POINTS, FloatArray, dot
from dpcurator.errors import UserError

__all__ = [
    "Atoms",
    "GaussianNoise",
    "LaplaceNoise",
    "MixtureProfile",
    "approx_dp_atoms",
    "discrete_gaussian_atoms",
    "discrete_laplace_atoms",
    "inverse_log_mix",
    "log_mix",
    "log_mix_scalar",
    "mixture_moments",
    "randomized_response_atoms",
    "subsample_atoms",
]

Direction = Literal["remove", "add"]


def log_mix(q: float, r: FloatArray) -> FloatArray:
    """ln(1 - q + q e^r), stable for large |r| (r may be +-inf)."""
    r = np.asarray(r, dtype=np.float64)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        shift = q * np.expm1(np.minimum(r, 0.0))  # in [-q, 0]
        # log1p is exact near 0; near -1 (q close to 1, r very negative) add in log space
        small = np.log1p(shift)
        if q >= 0.5:  # otherwise shift > -0.5 everywhere
            small = np.where(
                shift > -0.5,
                small,
                np.logaddexp(math.log1p(-q) if q < 1.0 else -np.inf, math.log(q) + r),
            )
        large = r + np.log(q + (1.0 - q) * np.exp(-np.maximum(r, 0.0)))
    out: FloatArray = np.where(r > 0, large, small)
    return out


def log_mix_scalar(q: float, r: float) -> float:
    """``log_mix`` for one value, with the math module (numpy's per-call cost is 10x more)."""
    if r > 0:
        return r + math.log(q + (1.0 - q) * math.exp(-r))
    shift = q * math.expm1(r)  # in [-q, 0]
    if shift > -0.5:
        return math.log1p(shift)
    a = math.log1p(-q) if q < 1.0 else -math.inf
    b = math.log(q) + r
    top = max(a, b)
    if top == -math.inf:
        return -math.inf
    return top + math.log1p(math.exp(-abs(a - b)))  # logaddexp(a, b)


def inverse_log_mix(q: float, t: FloatArray) -> FloatArray:
    """rho with ln(1 - q + q e^rho) = t, i.e. ln((e^t - 1 + q) / q); -inf where e^t <= 1 - q.

    Stable for every t. Above 1 it is t - ln q + ln(1 - (1 - q) e^-t), so no e^t is formed
    (e^t overflows past t = 709, and a threshold read as +inf would report no mass above it,
    dropping the largest losses); far below 0 it is ln(e^t - (1 - q)) - ln q, whose difference
    of two small numbers keeps its relative accuracy where 1 + expm1(t) / q would not.
    """
    t = np.asarray(t, dtype=np.float64)
    if q == 1.0:
        out: FloatArray = t.copy()
        return out
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        positive = t - math.log(q) + np.log1p(-(1.0 - q) * np.exp(-np.maximum(t, 1.0)))
        z = np.expm1(np.minimum(t, 1.0)) / q
        near = np.where(z > -1.0, np.log1p(np.maximum(z, -1.0)), -np.inf)
        gap = np.exp(np.minimum(t, 0.0)) - (1.0 - q)
        far = np.where(gap > 0.0, np.log(np.maximum(gap, 0.0)) - math.log(q), -np.inf)
    out = np.where(t > 1.0, positive, np.where(t > -math.log(2.0), near, far))
    return out


class NoiseFamily(Protocol):
    """Additive noise A (around 0) and B (around 1) with r(x) = ln(dB/dA)(x) non-decreasing."""

    r_min: float
    r_max: float

    def log_ratio(self, x: FloatArray) -> FloatArray: ...

    def masses(
        self, rho: FloatArray, strict: bool
    ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """(A[S], A[not S], B[S], B[not S]) for S = {r > rho} (strict) or {r >= rho}."""
        ...

    def quadrature(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Points z and weights w (summing to 1) with x = scale z (A) or 1 + scale z (B)."""
        ...

    def quantile_a(self, p: float) -> float: ...

    def upper_quantile_a(self, tail: float) -> float:
        """x with A[x' > x] = tail, accurate for tiny tails (1 - tail rounds to 1 below 1e-16)."""
        ...

    @property
    def scale(self) -> float: ...


def _normal_tails(z: FloatArray) -> tuple[FloatArray, FloatArray]:
    """(P[N > z], P[N <= z]) for a standard normal N, each accurate where it is small.

    One evaluation of the small tail; the other is 1 minus it (>= 1/2, so no precision lost).
    """
    small = special.ndtr(-np.abs(z))
    large = 1.0 - small
    upper = z >= 0
    return np.where(upper, small, large), np.where(upper, large, small)


@dataclass(frozen=True, slots=True)
class GaussianNoise:
    """N(0, sigma^2) against N(1, sigma^2): r(x) = (2x - 1) / (2 sigma^2)."""

    sigma: float
    r_min: float = -math.inf
    r_max: float = math.inf

    @property
    def scale(self) -> float:
        return self.sigma

    def log_ratio(self, x: FloatArray) -> FloatArray:
        out: FloatArray = (2.0 * x - 1.0) / (2.0 * self.sigma**2)
        return out

    def masses(
        self, rho: FloatArray, strict: bool
    ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        s = self.sigma
        with np.errstate(invalid="ignore"):
            c = s * s * rho + 0.5  # r(x) > rho  <=>  x > c
        a_hi, a_lo = _normal_tails(c / s)
        b_hi, b_lo = _normal_tails((c - 1.0) / s)
        return a_hi, a_lo, b_hi, b_lo

    def quadrature(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        z = np.linspace(-12.0, 12.0, 1201)
        w = np.exp(-0.5 * z * z)
        return z, w / w.sum(), w / w.sum()

    def quantile_a(self, p: float) -> float:
        """x with A[x' <= x] = p (B's quantile is one more)."""
        return float(self.sigma * special.ndtri(p))

    def upper_quantile_a(self, tail: float) -> float:
        """x with A[x' > x] = tail (the noise is symmetric)."""
        return float(-self.sigma * special.ndtri(tail))


@dataclass(frozen=True, slots=True)
class LaplaceNoise:
    """Laplace(0, b) against Laplace(1, b): r(x) = (|x| - |x - 1|) / b in [-1/b, 1/b]."""

    b: float

    @property
    def r_min(self) -> float:
        return -1.0 / self.b

    @property
    def r_max(self) -> float:
        return 1.0 / self.b

    @property
    def scale(self) -> float:
        return self.b

    def log_ratio(self, x: FloatArray) -> FloatArray:
        out: FloatArray = (np.abs(x) - np.abs(x - 1.0)) / self.b
        return out

    def masses(
        self, rho: FloatArray, strict: bool
    ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        b = self.b
        rho = np.asarray(rho, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            c = np.clip((1.0 + b * rho) / 2.0, 0.0, 1.0)  # S = {x > c} (or >=: same mass)
        a_hi = 0.5 * np.exp(-c / b)  # c >= 0
        a_lo = 1.0 - a_hi
        b_lo = 0.5 * np.exp((c - 1.0) / b)  # c <= 1
        b_hi = 1.0 - b_lo
        if strict:
            none = rho >= 1.0 / b
            everything = rho < -1.0 / b
        else:
            none = rho > 1.0 / b
            everything = rho <= -1.0 / b
        one, zero = np.ones_like(c), np.zeros_like(c)
        a_hi = np.where(none, zero, np.where(everything, one, a_hi))
        a_lo = np.where(none, one, np.where(everything, zero, a_lo))
        b_hi = np.where(none, zero, np.where(everything, one, b_hi))
        b_lo = np.where(none, one, np.where(everything, zero, b_lo))
        return a_hi, a_lo, b_hi, b_lo

    def quadrature(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        z = np.linspace(-40.0, 40.0, 2401)
        w = np.exp(-np.abs(z))
        return z, w / w.sum(), w / w.sum()

    def quantile_a(self, p: float) -> float:
        """x with A[x' <= x] = p (B's quantile is one more)."""
        if p < 0.5:
            return self.b * math.log(2.0 * p)
        return -self.b * math.log(2.0 * (1.0 - p))

    def upper_quantile_a(self, tail: float) -> float:
        """x with A[x' > x] = tail (the noise is symmetric)."""
        return -self.quantile_a(tail) if tail < 0.5 else self.quantile_a(1.0 - tail)


@dataclass(frozen=True, slots=True)
class MixtureProfile:
    """The pair for additive noise with Poisson rate q (q = 1: no sampling), one direction."""

    noise: GaussianNoise | LaplaceNoise
    q: float
    direction: Direction

    @property
    def infinity_mass(self) -> float:
        return 0.0

    def tails(self, t: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """(P[L <= t], P[L > t], Q[L <= t], Q[L > t]) for an array of thresholds t."""
        q = self.q
        t = np.asarray(t, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if self.direction == "remove":
                # L > t  <=>  r > rho_t = ln((e^t - 1 + q) / q)
                rho = inverse_log_mix(q, t)
                a_hi, a_lo, b_hi, b_lo = self.noise.masses(rho, strict=True)
                return (
                    (1.0 - q) * a_lo + q * b_lo,
                    (1.0 - q) * a_hi + q * b_hi,
                    a_lo,
                    a_hi,
                )
            # add: L > t  <=>  r < rho_t = ln((e^-t - 1 + q) / q)  (no x at all if e^-t <= 1-q)
            rho = inverse_log_mix(q, -t)
            a_ge, a_lt, b_ge, b_lt = self.noise.masses(rho, strict=False)
            return a_ge, a_lt, (1.0 - q) * a_ge + q * b_ge, (1.0 - q) * a_lt + q * b_lt

    def loss_range(self) -> tuple[float, float]:
        """The support of L (end points may be infinite)."""
        lo = log_mix_scalar(self.q, self.noise.r_min)
        hi = log_mix_scalar(self.q, self.noise.r_max)
        if self.direction == "remove":
            return lo, hi
        return -hi, -lo

    def loss_bounds(self, tail_mass: float) -> tuple[float, float]:
        """lo, hi with P[L <= lo] <= tail_mass and P[L > hi] <= tail_mass."""
        return _loss_bounds(self, tail_mass)

    def moments(self) -> tuple[float, float]:
        """Mean and standard deviation of L under P (numerical quadrature; a heuristic)."""
        return mixture_moments(self.noise, self.q)[self.direction]


def mixture_moments(
    noise: GaussianNoise | LaplaceNoise, q: float
) -> dict[Direction, tuple[float, float]]:
    """Mean and standard deviation of L under P for both directions (one quadrature).

    Both directions evaluate the loss at the same outputs (the add loss is minus the remove
    loss), so one pass over the quadrature points serves both. A heuristic: it only sizes grids.
    """
    z, wa, wb = noise.quadrature()
    s = noise.scale
    la = log_mix(q, noise.log_ratio(s * z))
    lb = log_mix(q, noise.log_ratio(1.0 + s * z))
    pairs: dict[Direction, tuple[list[FloatArray], list[FloatArray]]] = {
        "remove": ([(1.0 - q) * wa, q * wb], [la, lb]),
        "add": ([wa], [-la]),
    }
    out: dict[Direction, tuple[float, float]] = {}
    for direction, (weights, values) in pairs.items():
        mean = sum(float(np.dot(w, v)) for w, v in zip(weights, values, strict=True))
        second = sum(
            float(np.dot(w, (v - mean) ** 2)) for w, v in zip(weights, values, strict=True)
        )
        out[direction] = (mean, math.sqrt(max(second, 0.0)))
    return out


@functools.lru_cache(maxsize=256)
def _loss_bounds(profile: MixtureProfile, tail_mass: float) -> tuple[float, float]:
    """Bounds from quantiles of the output x, through the monotone map x -> L.

    Remove (L non-decreasing in x, P = (1 - q) A + q B, B to the right of A): L > L(x_hi)
    forces x > x_hi, and P[x > x_hi] <= B[x > x_hi] = tail for x_hi = 1 + (A's upper tail
    quantile); L < L(x_lo) forces x < x_lo, and P[x < x_lo] <= A[x < x_lo] = tail (or, when
    1 - q <= tail / 2, P[x < x_lo] <= 1 - q + B[x < x_lo] <= tail at B's tail / 2 quantile). Add (L
    non-increasing, P = A): L < L(x) forces x > x, L > L(x) forces x < x, both at A's
    quantiles. Just below L(x_lo) stands in for "L < L(x_lo)" (flat stretches of L, as for
    Laplace noise, are then safe). Upper quantiles are taken from the tail itself: 1 - tail
    rounds to 1 below 1e-16, whose quantile is infinite.

    ``hi`` is at most ``MAX_FINITE_LOSS``: larger losses go to the top cell of the grid,
    which sends them to +infinity but for the part its Q-mass pins at ``hi`` (connect the
    dots). When nearly all the mass lies above (a Gaussian with sigma below about 0.03), the
    range is the last unit below ``hi``: the PLD then reports a large infinity mass, which is
    sound, and the accountant falls back to another method.
    """
    support_lo, support_hi = profile.loss_range()
    noise, q = profile.noise, profile.q
    tail = min(max(tail_mass, 1e-300), 0.25)

    def loss(x: float) -> float:
        value = log_mix_scalar(q, float(noise.log_ratio(np.asarray(x, dtype=np.float64))))
        return value if profile.direction == "remove" else -value

    if profile.direction == "remove":
        # P[x < x_lo] <= (1 - q) A[x < x_lo] + q B[x < x_lo]: A's quantile, or B's when A's
        # weight is below the tail anyway (q near 1, where A's is far too low).
        if 1.0 - q <= 0.5 * tail:
            x_lo = 1.0 + noise.quantile_a(0.5 * tail)
        else:
            x_lo = noise.quantile_a(tail)
        lo, hi = loss(x_lo), loss(1.0 + noise.upper_quantile_a(tail))
    else:
        lo, hi = loss(noise.upper_quantile_a(tail)), loss(noise.quantile_a(tail))
    lo -= 1e-12 * max(1.0, abs(lo))
    lo = max(lo, support_lo - 1e-12 * max(1.0, abs(support_lo)))
    hi = min(hi, support_hi, MAX_FINITE_LOSS)
    if not lo < hi:
        if hi >= MAX_FINITE_LOSS:  # (nearly) every loss is above what the grid holds
            lo = hi - 1.0
        else:  # degenerate (tiny q): widen to the support's neighbourhood
            hi = lo + max(abs(lo), 1e-12)
    return lo, hi


@dataclass(frozen=True, slots=True, eq=False)
class Atoms:
    """A PLD given by finitely many atoms (loss, P-mass) and a mass at +infinity.

    ``spacing`` (if not None) is a g > 0 such that every loss is an integer multiple of g:
    on a grid of interval g / m the PLD is represented exactly.
    """

    losses: FloatArray
    masses: FloatArray
    infinity_mass: float
    spacing: float | None

    def moments(self) -> tuple[float, float]:
        total = float(self.masses.sum())
        if total <= 0:
            return 0.0, 0.0
        mean = dot(self.masses, self.losses) / total
        var = dot(self.masses, (self.losses - mean) ** 2) / total
        return mean, math.sqrt(max(var, 0.0))


def approx_dp_atoms(epsilon: float, delta: float) -> Atoms:
    """The tight PLD of an (epsilon, delta)-DP mechanism known only by its guarantee.

    Every (epsilon, delta)-DP mechanism is a post-processing of the four-outcome mechanism of
    Kairouz, Oh and Viswanath ("The composition theorem for differential privacy", ICML 2015,
    Theorem 2.1 / Murtagh and Vadhan 2016): loss +inf w.p. delta, +epsilon w.p.
    (1 - delta) e^eps / (1 + e^eps), -epsilon w.p. (1 - delta) / (1 + e^eps). It is a
    dominating pair in the sense of Zhu, Dong and Wang (2022), Definition 7.
    """
    if epsilon == 0.0:
        return Atoms(np.array([0.0]), np.array([1.0 - delta]), delta, None)
    hi = (1.0 - delta) / (1.0 + math.exp(-epsilon))
    # e^-eps / (1 + e^-eps): the same, without e^eps's overflow past eps = 709.78
    lo = (1.0 - delta) * math.exp(-epsilon) / (1.0 + math.exp(-epsilon))
    return Atoms(np.array([epsilon, -epsilon]), np.array([hi, lo]), delta, epsilon)


def randomized_response_atoms(truth_probability: float, categories: int) -> Atoms:
    """k-ary randomized response (replace one unit): exact, three atoms.

    With D holding category a and D' category b, the report is a w.p. p (loss eps0 =
    ln(p (k - 1) / (1 - p))), b w.p. (1 - p) / (k - 1) (loss -eps0), and each of the k - 2 other
    categories w.p. (1 - p) / (k - 1) (loss 0). Warner (1965); k-ary: Kairouz, Bonawitz and
    Ramage, "Discrete distribution estimation under local privacy" (ICML 2016).
    """
    p, k = truth_probability, categories
    other = (1.0 - p) / (k - 1)
    eps0 = math.log(p) - math.log(other)
    losses = np.array([eps0, 0.0, -eps0])
    masses = np.array([p, (k - 2) * other, other])
    return Atoms(losses, masses, 0.0, eps0)


def discrete_laplace_atoms(scale: float, sensitivity: int) -> Atoms:
    """Discrete Laplace P[z] prop. to exp(-|z| / scale), integer sensitivity k: exact.

    L(z) = (|z - k| - |z|) / scale: k / scale for z <= 0, -k / scale for z >= k and
    (k - 2z) / scale in between; the masses are geometric sums in closed form. Source:
    Ghosh, Roughgarden and Sundararajan (SIAM J. Comput. 2012) for the mechanism; the PLD is
    elementary.
    """
    k = sensitivity
    r = math.exp(-1.0 / scale)
    norm = (1.0 - r) / (1.0 + r)
    z = np.arange(1, k, dtype=np.float64)
    losses = np.concatenate([[k / scale], (k - 2.0 * z) / scale, [-k / scale]])
    masses = np.concatenate(
        [[1.0 / (1.0 + r)], norm * np.exp(-z / scale), [math.exp(-k / scale) / (1.0 + r)]]
    )
    return Atoms(losses, masses, 0.0, 1.0 / scale)


def discrete_gaussian_atoms(sigma: float, sensitivity: int, tail_mass: float) -> Atoms:
    """Discrete Gaussian N_Z(0, sigma^2) against N_Z(k, sigma^2), by exact sums.

    L(z) = (k^2 - 2kz) / (2 sigma^2) at z ~ N_Z(0, sigma^2) (Canonne, Kamath and Steinke, "The
    discrete Gaussian for differential privacy", NeurIPS 2020, Section 2). The pmf is summed
    over |z| <= Z; the mass beyond is bounded by a geometric series: for z > Z (the lowest
    losses) it is moved up to the atom at z = Z, for z < -Z (the highest losses) it goes to
    +infinity. Both moves are pessimistic.
    """
    k = sensitivity
    z_max = math.ceil(sigma * math.sqrt(2.0 * math.log(1.0 / tail_mass)) + k + 2)
    n_atoms = 2 * z_max + 1
    if n_atoms > MAX_GRID_POINTS // 2:
        raise UserError(
            f"discrete Gaussian with sigma={sigma:g} needs {n_atoms} atoms for an exact "
            "privacy loss distribution, more than this accountant sums; use the continuous "
            "GaussianEvent only if its guarantee is acceptable for your use"
        )
    z = np.arange(-z_max, z_max + 1, dtype=np.float64)
    log_w = -(z * z) / (2.0 * sigma * sigma)
    # normaliser over all of Z: the kept sum plus the (tiny) tails on both sides
    tail_one_side = math.exp(-((z_max + 1) ** 2) / (2 * sigma * sigma)) / (
        -math.expm1(-(2 * z_max + 1) / (2 * sigma * sigma))
    )
    norm = float(np.sum(np.exp(log_w))) + 2.0 * tail_one_side
    masses = np.exp(log_w) / norm
    losses = (k * k - 2.0 * k * z) / (2.0 * sigma * sigma)
    tail = tail_one_side / norm
    masses[-1] += tail  # z > Z: the lowest losses, moved up to z = Z
    return Atoms(losses, masses, tail, k / (2.0 * sigma * sigma))


def subsample_atoms(base: Atoms, q: float, direction: Direction) -> Atoms:
    """Poisson subsampling (rate q) of a mechanism whose remove-direction pair is ``base``.

    If (P, Q) dominates the base mechanism for "remove", then ((1 - q) Q + q P, Q) dominates the
    subsampled one for "remove" and (Q, (1 - q) Q + q P) for "add" (Zhu, Dong and Wang 2022,
    Theorem 8, and Koskela et al. 2020). An atom at loss l with P-mass p has Q-mass p e^-l; the
    Q-mass where P = 0 (loss -infinity) is 1 - sum p e^-l.
    """
    losses, masses = base.losses, base.masses
    q_masses = masses * np.exp(-losses)
    q_only = max(0.0, 1.0 - float(q_masses.sum()))
    mixed = log_mix(q, losses)
    if direction == "remove":
        new_losses = mixed
        new_masses = q * masses + (1.0 - q) * q_masses
        infinity_mass = q * base.infinity_mass
        if q < 1.0 and q_only > 0:
            new_losses = np.append(new_losses, math.log1p(-q))
            new_masses = np.append(new_masses, (1.0 - q) * q_only)
    else:
        new_losses = -mixed
        new_masses = q_masses
        infinity_mass = 0.0
        if q_only > 0:
            if q < 1.0:
                new_losses = np.append(new_losses, -math.log1p(-q))
                new_masses = np.append(new_masses, q_only)
            else:
                infinity_mass = q_only
    return Atoms(new_losses, new_masses, infinity_mass, None)
