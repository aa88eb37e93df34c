"""Laws of the privacy loss random variable, one ordered pair of neighbours at a time (private;
the public surface is ``accounting.loss``).

For an ordered pair (P, Q) of output distributions (P = M(D1), Q = M(D2)) the privacy loss of
an output o ~ P is L(o) = ln(dP/dQ)(o), +infinity where Q(o) = 0. A *law* gives its two upper
tails,

    sf_p(t) = P[L > t]   (the +infinity mass included)   and   sf_q(t) = Q[L > t],

from which both readings of delta follow exactly (Sommer, Meiser and Mohammadi, "Privacy loss
classes: the central limit theorem in differential privacy", PoPETs 2019, Section 4):

- probabilistic DP: delta_pDP(eps) = P[L > eps];
- approximate DP: delta_aDP(eps) = E_P[max(0, 1 - e^(eps - L))] = P[L > eps] - e^eps Q[L > eps]
  (the set {L > eps} is the one that attains sup_S P(S) - e^eps Q(S); on it
  e^(-L) dP = dQ).

Strict inequality: an output whose loss is exactly eps satisfies P(o) <= e^eps Q(o), so an atom
of the loss at eps counts as *within* eps in both readings. Atoms are compared with a relative
tolerance of ``ATOM_TOLERANCE`` (floating-point losses such as k * ln 3 cannot be compared more
finely than that).

Laws here: ``GaussianLaw`` (closed form), ``MixtureLaw`` (additive Gaussian or Laplace noise,
optionally Poisson-subsampled, through ``_pld_profiles.MixtureProfile``'s exact tails),
``AtomLaw`` (finitely many losses: randomized response, discrete noise, name-and-shame, grid
PMFs), and the *envelopes* ``PureEnvelope`` / ``ApproxEnvelope``: for a mechanism known only by
its guarantee, the largest P[L > t] any mechanism with that guarantee can have. The envelopes
have no Q (they bound the pDP reading only); the approximate reading of such a mechanism comes
from its dominating pair (``_pld_profiles.approx_dp_atoms``).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import numpy.typing as npt
from scipy import special

from dpcurator.accounting import _pld_profiles as prof
from dpcurator.accounting.conversions import gdp_to_delta

__all__ = [
    "ATOM_TOLERANCE",
    "ApproxEnvelope",
    "AtomLaw",
    "GaussianLaw",
    "Law",
    "MixtureLaw",
    "PureEnvelope",
]

FloatArray = npt.NDArray[np.float64]

#: Two losses closer than this (relative, at least absolute 1e-12) are read as equal: an atom
#: that close to eps counts as an atom at eps (within the guarantee).
ATOM_TOLERANCE = 1e-12


def _array(t: npt.ArrayLike) -> FloatArray:
    return np.asarray(t, dtype=np.float64)


class Law(ABC):
    """The law of the privacy loss L under P (and, for the approximate reading, under Q)."""

    #: P[L = +infinity]: outputs that the second dataset cannot produce.
    infinity_mass: float = 0.0
    #: Whether ``sf_q`` is known (envelopes know only P's tail).
    has_q: ClassVar[bool] = True

    @abstractmethod
    def sf_p(self, t: npt.ArrayLike) -> FloatArray:
        """P[L > t], the +infinity mass included."""

    def sf_q(self, t: npt.ArrayLike) -> FloatArray:
        """Q[L > t] (no mass at +infinity: Q cannot produce those outputs)."""
        raise NotImplementedError(f"{type(self).__name__} has no second distribution")

    def adp(self, epsilon: npt.ArrayLike) -> FloatArray:
        """delta_aDP(eps) = P[L > eps] - e^eps Q[L > eps], clipped to [0, 1]."""
        eps = _array(epsilon)
        q = np.asarray(self.sf_q(eps), dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            # e^eps Q with Q = 0 is 0, not inf * 0 = NaN: past eps = 709.78, where e^eps
            # overflows, mapping that NaN to 0 dropped P's whole tail (a bug hunt: delta 0 at
            # eps 800 where the truth is 1)
            value = self.sf_p(eps) - np.where(q > 0.0, np.exp(eps) * q, 0.0)
        # a NaN left is a bug elsewhere: read it as the largest delta, never the smallest
        out: FloatArray = np.clip(np.nan_to_num(value, nan=1.0), 0.0, 1.0)
        return out

    @abstractmethod
    def bounds(self, tail: float) -> tuple[float, float]:
        """(lo, hi) holding most of the finite mass: P[L < lo] <= tail, P[hi < L < inf] <= tail.

        Only the accuracy of a grid or the range of a picture depends on it, never a bound.
        """

    def atoms(self) -> tuple[FloatArray, FloatArray]:
        """The finite losses that carry a positive P-mass of their own, and those masses."""
        return np.zeros(0), np.zeros(0)

    @abstractmethod
    def moments(self) -> tuple[float, float]:
        """Mean and standard deviation of the finite part of L under P (sizes grids only)."""


@dataclass(frozen=True, eq=False)
class GaussianLaw(Law):
    """Gaussian noise: L ~ N(mu, 2 mu) under P and N(-mu, 2 mu) under Q, mu = Delta^2 / (2 s^2).

    Both orders of the pair have this law, and a composition of Gaussian mechanisms has it with
    the mus added (Balle and Wang, "Improving the Gaussian mechanism for differential privacy",
    ICML 2018, Section 3; Dong, Roth and Su, "Gaussian differential privacy", JRSS-B 2022,
    Corollary 3.3). So delta_pDP(eps) = Phi((mu - eps) / sqrt(2 mu)) and delta_aDP(eps) =
    Phi(-eps/m + m/2) - e^eps Phi(-eps/m - m/2) with m = sqrt(2 mu) (their Corollary 2.13).
    P[L > eps] grows with the shift Delta for every eps >= 0 ((eps - mu) / sqrt(2 mu) falls as
    mu grows), so the pair at the full sensitivity is the worst for both readings.
    """

    mu: float

    @property
    def sd(self) -> float:
        return math.sqrt(2.0 * self.mu)

    def sf_p(self, t: npt.ArrayLike) -> FloatArray:
        out: FloatArray = special.ndtr((self.mu - _array(t)) / self.sd)
        return out

    def sf_q(self, t: npt.ArrayLike) -> FloatArray:
        out: FloatArray = special.ndtr((-self.mu - _array(t)) / self.sd)
        return out

    def adp(self, epsilon: npt.ArrayLike) -> FloatArray:
        """The analytic Gaussian curve in log space (``conversions.gdp_to_delta``)."""
        eps = _array(epsilon)
        if np.any(eps < 0):
            return super().adp(eps)
        flat = [gdp_to_delta(self.sd, float(e)) for e in eps.reshape(-1)]
        return np.asarray(flat, dtype=np.float64).reshape(eps.shape)

    def bounds(self, tail: float) -> tuple[float, float]:
        z = -float(special.ndtri(max(tail, 1e-300)))
        return self.mu - z * self.sd, self.mu + z * self.sd

    def moments(self) -> tuple[float, float]:
        return self.mu, self.sd


@dataclass(frozen=True, eq=False)
class MixtureLaw(Law):
    """Additive Gaussian or Laplace noise, Poisson-subsampled at rate q (q = 1: not sampled).

    The tails are ``MixtureProfile.tails``: exact, through the noise's CDF, for the remove
    pair ((1 - q) A + q B, A) and the add pair (A, (1 - q) A + q B), A the noise around 0 and
    B around the sensitivity (Zhu, Dong and Wang, "Optimal accounting of differential privacy
    via characteristic function", AISTATS 2022, Section 5). For Laplace noise of scale b
    (sensitivity 1, q = 1) this is L = 1/b w.p. 1/2, -1/b w.p. e^(-1/b) / 2 and (1 - 2x) / b at
    x ~ Laplace(b) in between, so delta_pDP(eps) = 1 - e^(-(1/b - eps) / 2) / 2 and
    delta_aDP(eps) = 1 - e^((eps - 1/b) / 2) for 0 <= eps < 1/b, both 0 from 1/b on; P[L > eps]
    grows with the shift, so the full sensitivity is the worst pair.
    """

    profile: prof.MixtureProfile

    def sf_p(self, t: npt.ArrayLike) -> FloatArray:
        return np.asarray(self.profile.tails(_array(t))[1], dtype=np.float64)

    def sf_q(self, t: npt.ArrayLike) -> FloatArray:
        return np.asarray(self.profile.tails(_array(t))[3], dtype=np.float64)

    def bounds(self, tail: float) -> tuple[float, float]:
        return self.profile.loss_bounds(max(tail, 1e-300))

    def atoms(self) -> tuple[FloatArray, FloatArray]:
        """Laplace noise: the two ends of the loss's range carry atoms; Gaussian: none."""
        if not isinstance(self.profile.noise, prof.LaplaceNoise):
            return np.zeros(0), np.zeros(0)
        lo, hi = self.profile.loss_range()
        below = float(1.0 - self.sf_p(np.array(lo))[()])  # P[L <= lo] = P[L = lo]
        top = float(self.sf_p(np.array(math.nextafter(hi, -math.inf)))[()])  # P[L = hi]
        return np.array([lo, hi]), np.array([below, top])

    def moments(self) -> tuple[float, float]:
        return self.profile.moments()


@dataclass(frozen=True, eq=False)
class AtomLaw(Law):
    """Finitely many losses with P-masses, and a mass at +infinity.

    ``q_masses`` are the atoms' Q-masses; by default p e^(-loss) (the exact relation dQ =
    e^(-L) dP). Q-mass that P does not have (loss -infinity) never lies above any t.
    """

    losses: FloatArray
    masses: FloatArray
    infinity_mass: float = 0.0
    q_masses: FloatArray | None = None
    _order: tuple[FloatArray, FloatArray, FloatArray] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        losses = np.asarray(self.losses, dtype=np.float64).reshape(-1)
        masses = np.asarray(self.masses, dtype=np.float64).reshape(-1)
        if self.q_masses is None:
            with np.errstate(over="ignore"):
                q = masses * np.exp(-losses)
        else:
            q = np.asarray(self.q_masses, dtype=np.float64).reshape(-1)
        keep = masses > 0
        order = np.argsort(losses[keep], kind="stable")
        sorted_losses = losses[keep][order]
        # upper sums from the top, so that small tails keep their relative accuracy
        p_above = np.concatenate([np.cumsum(masses[keep][order][::-1])[::-1], [0.0]])
        q_above = np.concatenate([np.cumsum(q[keep][order][::-1])[::-1], [0.0]])
        object.__setattr__(self, "losses", losses)
        object.__setattr__(self, "masses", masses)
        object.__setattr__(self, "_order", (sorted_losses, p_above, q_above))

    def _first_above(self, t: FloatArray) -> npt.NDArray[np.intp]:
        sorted_losses = self._order[0]
        slack = ATOM_TOLERANCE * np.maximum(1.0, np.abs(t))
        out: npt.NDArray[np.intp] = np.searchsorted(sorted_losses, t + slack, side="right")
        return out

    def sf_p(self, t: npt.ArrayLike) -> FloatArray:
        tt = _array(t)
        out: FloatArray = self.infinity_mass + self._order[1][self._first_above(tt)]
        return np.minimum(out, 1.0)

    def sf_q(self, t: npt.ArrayLike) -> FloatArray:
        out: FloatArray = self._order[2][self._first_above(_array(t))]
        return out

    def bounds(self, tail: float) -> tuple[float, float]:
        sorted_losses, p_above, _ = self._order
        n = sorted_losses.size
        if n == 0:
            return 0.0, 0.0
        at_or_below = np.cumsum(p_above[:-1] - p_above[1:])  # P[L <= i-th loss]
        first = min(int(np.searchsorted(at_or_below, tail, side="right")), n - 1)
        last = min(int(np.searchsorted(-p_above[1:], -tail, side="left")), n - 1)
        return float(sorted_losses[first]), float(sorted_losses[max(last, first)])

    def atoms(self) -> tuple[FloatArray, FloatArray]:
        keep = self.masses > 0
        return self.losses[keep], self.masses[keep]

    def moments(self) -> tuple[float, float]:
        losses, masses = self.atoms()
        total = float(masses.sum())
        if total <= 0:
            return 0.0, 0.0
        mean = float(np.sum(masses * losses)) / total
        var = float(np.sum(masses * (losses - mean) ** 2)) / total
        return mean, math.sqrt(max(var, 0.0))


@dataclass(frozen=True, eq=False)
class PureEnvelope(Law):
    """The largest P[L > t] over every epsilon-DP mechanism and pair of neighbours.

    For an epsilon-DP pair, L lies in [-eps, eps] and E_P[e^(-L)] = 1. Mass p above t >= 0
    contributes less than p e^(-t) to that mean and the rest at most (1 - p) e^eps, so
    p < (e^eps - 1) / (e^eps - e^(-t)), approached by putting the mass just above t and the
    rest at -eps; below 0 the bound is 1, from eps on it is 0. This is a survival function, so
    compositions of such mechanisms are dominated by sums of independent variables with it.
    (A mechanism known only by its guarantee cannot be read through its dominating pair here:
    that pair bounds every hockey-stick divergence, but pDP is not closed under
    post-processing, so the pair's P[L > t] can be below the mechanism's.)
    """

    epsilon: float
    has_q: ClassVar[bool] = False

    def sf_p(self, t: npt.ArrayLike) -> FloatArray:
        tt = _array(t)
        # e^eps - 1 overflows past eps = 709.78; there the ratio below is 1 to within 1e-308
        grow = math.expm1(self.epsilon) if self.epsilon < 700.0 else math.inf
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            inside = (grow / (grow - np.expm1(-np.maximum(tt, 0.0))) if math.isfinite(grow)
                      else np.ones_like(tt))
        out: FloatArray = np.where(tt < 0, 1.0, np.where(tt >= self.epsilon, 0.0, inside))
        return np.minimum(out, 1.0)

    def bounds(self, tail: float) -> tuple[float, float]:
        return 0.0, self.epsilon

    def atoms(self) -> tuple[FloatArray, FloatArray]:
        top = 1.0 / (1.0 + math.exp(-self.epsilon))  # the bound's jump at eps
        return np.array([self.epsilon]), np.array([top])

    def moments(self) -> tuple[float, float]:
        return self.epsilon / 2.0, self.epsilon / 2.0


@dataclass(frozen=True, eq=False)
class ApproxEnvelope(Law):
    """An upper bound on P[L > t] over every (epsilon, delta)-DP mechanism and pair.

    For t > eps take S = {L > t}: P(S) <= e^eps Q(S) + delta and Q(S) <= e^(-t) P(S), so
    P(S) <= delta / (1 - e^(eps - t)) (the argument of Kasiviswanathan and Smith, "On the
    'semantics' of differential privacy: a Bayesian formulation", JPC 2014, as in
    ``accounting.posterior``); at or below eps nothing is bounded (1). It tends to delta, the
    mass that may be lost outright (+infinity).
    """

    epsilon: float
    delta: float
    has_q: ClassVar[bool] = False
    infinity_mass: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "infinity_mass", self.delta)

    def sf_p(self, t: npt.ArrayLike) -> FloatArray:
        tt = _array(t)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            bound = self.delta / -np.expm1(self.epsilon - tt)
        out: FloatArray = np.where(tt > self.epsilon, np.minimum(bound, 1.0), 1.0)
        return out

    def bounds(self, tail: float) -> tuple[float, float]:
        start = self.epsilon - math.log1p(-self.delta) if self.delta < 1 else self.epsilon
        # delta e^(eps - t) / (1 - e^(eps - t)) <= tail  for  t >= eps + log(1 + delta / tail)
        return start, max(start, self.epsilon + math.log1p(self.delta / max(tail, 1e-300)))

    def moments(self) -> tuple[float, float]:
        lo, hi = self.bounds(1e-6)
        return (lo + hi) / 2.0, max(hi - lo, 1e-9) / 4.0
