"""Where probabilistic DP first appears: the thresholded histogram, and partition selection.

The references' food survey (Lalanne, lesson 1, Section 3): a histogram over categories that
the respondents typed in. Adding Laplace noise to each count does not hide a category that one
person created ("Escargots"): it appears only when that person is in the data. Thresholding
helps: release only the categories whose noisy count reaches tau. The mechanism then fails,
outright, exactly when Escargots' count 1 plus its noise reaches tau, with probability
p = P[1 + Z >= tau]: that is the (epsilon, delta)-probabilistic DP reading, and here the two
readings of delta agree at the Laplace's epsilon. ``ThresholdedHistogram`` computes both, at
every epsilon, over every pair of neighbours (add or remove one person, who adds 1 to one
category's count).

When a query releases a count, the curator thresholds that noisy count itself
(``dpcurator.mechanisms.partition_selection.CountThreshold``): the thresholded histogram above,
with the count's own noise. Without a count it selects partitions differently: the optimal
rule of ``dpcurator.mechanisms.partition_selection`` keeps a partition backed by n units with
probability pi(n), the largest keep function that
(epsilon, delta)-*approximate* DP allows (Desfontaines, Voss, Gipson and Mandayam,
"Differentially private partition selection", PoPETs 2022, Theorem 1). It spends delta at every
step of the ramp pi(n) = e^eps pi(n - 1) + delta: the loss of a keep is ln(e^eps + delta /
pi(n - 1)), a little above eps, with probability pi(n). So it is (eps, delta)-aDP and yet its
probabilistic delta at that eps is the largest keep probability on the ramp, often above 1/2;
privacy degrades gracefully there, as with Gaussian noise. ``KeepRule`` computes both readings
from a table pi(0), pi(1), ... (``OptimalPartitionSelection.table``; this module does not import
the mechanisms, which sit above accounting).

Both give ``delta_pdp(eps)`` and ``delta_adp(eps)`` (eps >= 0, a number or an array), each the
largest over the pairs of neighbours and both orders of each pair; an atom of the loss at eps
counts as within eps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dpcurator import _validation as check
from dpcurator.accounting import _pld_profiles as prof
from dpcurator.accounting._loss_laws import ATOM_TOLERANCE, AtomLaw, FloatArray, MixtureLaw
from dpcurator.accounting.loss import _epsilons
from dpcurator.errors import UserError

__all__ = ["KeepRule", "ThresholdedHistogram"]


def _laplace_below(v: FloatArray, b: float) -> FloatArray:
    """P[Z < v] for Z ~ Laplace(0, b) (v may be +-infinity)."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.where(v < 0, 0.5 * np.exp(np.minimum(v, 0.0) / b),
                       1.0 - 0.5 * np.exp(-np.maximum(v, 0.0) / b))
    result: FloatArray = np.asarray(out, dtype=np.float64)
    return result


def _cut(r: FloatArray, b: float, strict_top: bool) -> FloatArray:
    """u with {l(u) > r} = {u > cut} for the Laplace loss l(u) = clip((2u - 1) / b, -1/b, 1/b).

    ``strict_top``: whether r = 1/b still admits nothing (l > r) or everything below does
    (l < r read through -r). -inf: every u; +inf: none.
    """
    inside = (1.0 + b * r) / 2.0
    if strict_top:  # {l > r}
        return np.where(r < -1.0 / b, -np.inf, np.where(r >= 1.0 / b, np.inf, inside))
    # {l < r} = {u < cut}
    return np.where(r > 1.0 / b, np.inf, np.where(r <= -1.0 / b, -np.inf, inside))


@dataclass(frozen=True)
class ThresholdedHistogram:
    """Laplace noise of ``scale`` b on each category's count, then release the categories whose
    noisy count is at least ``threshold`` tau (with their noisy counts).

    Neighbouring: add/remove one person, who adds 1 to one category (L1 sensitivity 1). Pairs:

    - the person's category is new (Escargots): it appears with p = P[1 + Z >= tau]; then the
      loss is +infinity, otherwise ln(1 - p) (remove order) or -ln(1 - p) (add order);
    - the category holds c >= 1 others: the released count has the Laplace loss, the
      "not released" outcome the loss ln(P[c + 1 + Z < tau] / P[c + Z < tau]) (or its
      negative). Thresholding is post-processing, so its approximate delta is at most the
      Laplace mechanism's, which it reaches as c grows (the limit pair is the plain Laplace);
      its probabilistic delta can exceed the Laplace's (pDP is not closed under
      post-processing). For eps >= 0, a pair with c >= tau is dominated by the plain Laplace
      pair in both orders (the "not released" outcome then has a loss below eps or a mass the
      Laplace pair also counts), so c = 1 .. ceil(tau) and the limit are all the pairs needed.

    Guarantee, for eps >= 1/b: (eps, p)-pDP and (eps, p)-aDP, the references' reading.
    Source: Lalanne, lesson 1, Section 3; Wilson et al., "Differentially private SQL with
    bounded user contribution", PoPETs 2020, Section 4 (thresholding noisy counts).
    """

    scale: float
    threshold: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", check.positive("scale", self.scale))
        tau = check.real("threshold", self.threshold)
        if not math.isfinite(tau):
            raise UserError(f"threshold must be a finite number, got {tau!r}")
        object.__setattr__(self, "threshold", tau)

    @classmethod
    def for_guarantee(cls, epsilon: float, delta: float) -> ThresholdedHistogram:
        """Scale 1/eps and the threshold at which a new category appears with probability
        delta: tau = 1 + ln(1 / (2 delta)) / eps (delta <= 1/2)."""
        eps = check.positive("epsilon", epsilon)
        d = check.unit_interval("delta", delta)
        if d > 0.5:
            raise UserError(f"delta must be at most 1/2 here, got {d!r}")
        return cls(1.0 / eps, 1.0 + math.log(1.0 / (2.0 * d)) / eps)

    @property
    def new_category_probability(self) -> float:
        """p = P[1 + Z >= tau]: the probability that a one-person category is released."""
        return float(1.0 - _laplace_below(np.array(self.threshold - 1.0), self.scale))

    def _pairs(self) -> list[tuple[str, int]]:
        top = max(1, math.ceil(self.threshold))
        return [("new", 0), ("laplace", 0)] + [("existing", c) for c in range(1, top + 1)]

    def _pair_tails(
        self, kind: str, c: int, eps: FloatArray
    ) -> list[tuple[FloatArray, FloatArray]]:
        """(P[L > eps], Q[L > eps]) of each order of one pair."""
        b, tau = self.scale, self.threshold
        if kind == "new":
            p = self.new_category_probability
            laws = (AtomLaw(np.array([math.log1p(-p)]), np.array([1.0 - p]), p),
                    AtomLaw(np.array([-math.log1p(-p)]), np.array([1.0])))
            return [(law.sf_p(eps), law.sf_q(eps)) for law in laws]
        if kind == "laplace":
            law = MixtureLaw(prof.MixtureProfile(prof.LaplaceNoise(b), 1.0, "remove"))
            return [(law.sf_p(eps), law.sf_q(eps))]
        t = np.array(tau - c)  # released iff u >= t, u the count's offset from c
        f0, f1 = _laplace_below(t, b), _laplace_below(t - 1.0, b)  # P[u < t]: D2, D1
        tol = ATOM_TOLERANCE * np.maximum(1.0, eps)
        # remove: the output is drawn with the person (u = 1 + Z), compared without (u = Z)
        cut = np.maximum(t, _cut(eps, b, strict_top=True))
        loss_none = math.log(float(f1)) - math.log(float(f0))
        none = (loss_none > eps + tol).astype(np.float64)
        remove = (1.0 - _laplace_below(cut - 1.0, b) + f1 * none,
                  1.0 - _laplace_below(cut, b) + f0 * none)
        # add: drawn without the person (u = Z), compared with (u = 1 + Z)
        upper = _cut(-eps, b, strict_top=False)  # released with loss > eps: t <= u < upper
        none = (-loss_none > eps + tol).astype(np.float64)
        add = (np.maximum(_laplace_below(upper, b) - f0, 0.0) + f0 * none,
               np.maximum(_laplace_below(upper - 1.0, b) - f1, 0.0) + f1 * none)
        return [remove, add]

    def _curves(self, epsilon: float | npt.ArrayLike, pdp: bool) -> float | FloatArray:
        eps, scalar = _epsilons(epsilon)
        flat = eps.reshape(-1)
        best = np.zeros(flat.size)
        for kind, c in self._pairs():
            for p_tail, q_tail in self._pair_tails(kind, c, flat):
                value = p_tail if pdp else p_tail - _times_e(flat, q_tail)
                best = np.maximum(best, value)
        out = np.clip(best * (1.0 + 1e-12), 0.0, 1.0)
        return float(out[0]) if scalar else out.reshape(eps.shape)

    def delta_pdp(self, epsilon: float | npt.ArrayLike) -> float | FloatArray:
        """The probabilistic delta at eps: the largest P[L > eps] over pairs and orders."""
        return self._curves(epsilon, pdp=True)

    def delta_adp(self, epsilon: float | npt.ArrayLike) -> float | FloatArray:
        """The approximate delta at eps: the largest P[L > eps] - e^eps Q[L > eps]."""
        return self._curves(epsilon, pdp=False)


def _times_e(exponent: npt.ArrayLike, q: npt.ArrayLike) -> FloatArray:
    """e^exponent q, with 0 wherever q is 0: past 709.78 e^exponent overflows, and inf * 0 is
    NaN, which compared as False and subtracted as NaN (a bug hunt: delta 0 at eps 709.8 where
    the truth was 0.9)."""
    q = np.asarray(q, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        out: FloatArray = np.where(q > 0.0, np.exp(exponent) * q, 0.0)
    return out


class KeepRule:
    """Keep a partition backed by n units with probability pi(n); both readings of delta.

    ``keep_probabilities`` is pi(0), pi(1), ..., non-decreasing in [0, 1] (beyond the table,
    pi stays at its last value). Neighbouring: add/remove one unit, who backs one partition,
    so the pairs are n - 1 against n units, n >= 1; each is two outcomes, kept or dropped, whose
    losses are ln(pi(n) / pi(n - 1)) and ln((1 - pi(n)) / (1 - pi(n - 1))) (or their negatives
    in the other order). The hockey-stick sum over the two outcomes is the approximate delta,
    the P-mass of those above eps the probabilistic one.
    Source: Desfontaines et al., PoPETs 2022 (the rule and its (eps, delta)-DP constraints).
    """

    def __init__(self, keep_probabilities: Sequence[float] | npt.ArrayLike) -> None:
        pi = np.asarray([float(p) for p in np.asarray(keep_probabilities).reshape(-1)])
        if pi.size < 2:
            raise UserError("keep_probabilities must hold pi(0), pi(1), ... (two at least)")
        if np.any(~np.isfinite(pi)) or np.any(pi < 0) or np.any(pi > 1):
            raise UserError("keep_probabilities must lie in [0, 1]")
        if np.any(np.diff(pi) < 0):
            raise UserError("keep_probabilities must be non-decreasing in n")
        self.keep_probabilities = pi
        before, after = pi[:-1], pi[1:]
        # (P, Q) of each outcome, one row per pair n - 1 -> n: remove draws with n units
        self._outcomes = [
            (after, before), (1.0 - after, 1.0 - before),  # remove: keep, drop
            (before, after), (1.0 - before, 1.0 - after),  # add: keep, drop
        ]

    def _curves(self, epsilon: float | npt.ArrayLike, pdp: bool) -> float | FloatArray:
        eps, scalar = _epsilons(epsilon)
        flat = eps.reshape(-1)
        grow = flat[:, None]
        beyond = (flat + ATOM_TOLERANCE * np.maximum(1.0, flat))[:, None]
        best = np.zeros(flat.size)
        for order in (self._outcomes[:2], self._outcomes[2:]):
            total = np.zeros((flat.size, self.keep_probabilities.size - 1))
            for p, q in order:
                if pdp:  # L > eps  <=>  P > e^eps Q  (P > 0)
                    total += np.where((p[None, :] > _times_e(beyond, q[None, :])) &
                                      (p[None, :] > 0), p[None, :], 0.0)
                else:
                    total += np.maximum(p[None, :] - _times_e(grow, q[None, :]), 0.0)
            best = np.maximum(best, total.max(axis=1))
        out = np.clip(best * (1.0 + 1e-12), 0.0, 1.0)
        return float(out[0]) if scalar else out.reshape(eps.shape)

    def delta_pdp(self, epsilon: float | npt.ArrayLike) -> float | FloatArray:
        """The probabilistic delta at eps: the largest P[L > eps] over pairs and orders."""
        return self._curves(epsilon, pdp=True)

    def delta_adp(self, epsilon: float | npt.ArrayLike) -> float | FloatArray:
        """The approximate delta at eps: the largest hockey-stick divergence."""
        return self._curves(epsilon, pdp=False)
