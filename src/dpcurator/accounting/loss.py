"""What delta means: the probabilistic and the approximate reading of a privacy loss.

For a mechanism M and neighbours D1, D2, the privacy loss of an output o ~ M(D1) is
L = ln(P[M(D1) = o] / P[M(D2) = o]). Two guarantees share the name (epsilon, delta) and read
delta differently (Meiser, "Approximate and probabilistic differential privacy definitions",
IACR ePrint 2018/277; the references' "DP from A to epsilon" and Lalanne, lesson 1):

- **probabilistic DP** (pDP): delta_pDP(eps) = P[L > eps], the probability that the loss goes
  past eps at all: with probability 1 - delta, eps-DP holds for the output seen;
- **approximate DP** (aDP): delta_aDP(eps) = E[max(0, 1 - e^(eps - L))], the mass past eps
  *weighted* by how far past it is, which is what P[M(D1) in S] <= e^eps P[M(D2) in S] + delta
  for every S requires.

Every output past eps weighs at most 1 in the second, so delta_aDP(eps) <= delta_pDP(eps):
pDP implies aDP with the same parameters. The converse fails, and the gap is the point: for
name-and-shame (publish everything with probability delta) the two agree, because whatever
passes eps is lost completely; for the Gaussian mechanism the loss passes eps often but by
little, so delta_aDP is far smaller (sigma = 1, eps = 1: 0.127 against 0.309).

Both orders of each pair count (the larger delta; "remove" draws the output from the dataset
with the unit, "add" from the one without), and an atom of the loss at exactly eps counts as
within eps (its outputs satisfy P(o) <= e^eps Q(o)): delta_pDP(eps) is P[L > eps], strict.

Public names: ``loss_profile(event)`` returns a ``PrivacyLossProfile`` with both deltas at any
eps >= 0 and the eps for a target delta under either reading; ``delta_pdp``, ``delta_adp``,
``epsilon_pdp`` and ``epsilon_adp`` are one-call shortcuts. How each is computed:

- closed forms (``exact`` is True): one Gaussian, Laplace, randomized-response, discrete Laplace
  or Gaussian, or name-and-shame mechanism; compositions of Gaussians; one Poisson-sampled
  Gaussian, Laplace or discrete step; and a mechanism known only by its (pure or approximate)
  guarantee, read in the worst case over every mechanism with it (``_loss_laws``);
- anything else that has a PLD: delta_pDP on a grid rounded *up* (``_loss_grid``), never below
  the truth, or Markov's bound from the Renyi accountant where that is smaller; delta_aDP from
  the PLD accountant (``pld``), pessimistic as well.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy import special

from dpcurator.accounting import _loss_grid as grid
from dpcurator.accounting import _pld_profiles as prof
from dpcurator.accounting._loss_events import Block, LawPair, blocks, exact_laws, relation_of
from dpcurator.accounting._loss_laws import (
    ATOM_TOLERANCE,
    AtomLaw,
    FloatArray,
    GaussianLaw,
    Law,
    MixtureLaw,
)
from dpcurator.accounting._pld_core import FLOAT_GUARD, RawPmf
from dpcurator.accounting.conversions import gdp_to_epsilon
from dpcurator.accounting.events import DpEvent
from dpcurator.accounting.guarantees import Neighbouring
from dpcurator.accounting.pld import PLD, pld_epsilon, pld_from_event
from dpcurator.errors import UnsupportedEventError, UserError, UserTypeError

__all__ = [
    "Direction",
    "PrivacyLossProfile",
    "delta_adp",
    "delta_pdp",
    "epsilon_adp",
    "epsilon_pdp",
    "loss_profile",
    "pair_deltas",
]

Direction = Literal["remove", "add"]

#: Closed forms are rounded up by this (relative): floating-point evaluation never reports
#: less than the formula.
_ROUND_UP = 1e-12


def _epsilons(value: object) -> tuple[FloatArray, bool]:
    """The epsilons as a float array, and whether a scalar was given; each finite and >= 0."""
    if isinstance(value, bool):
        raise UserTypeError("epsilon must be a real number or an array of them, got bool")
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise UserTypeError("epsilon must be a real number or an array of them") from None
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise UserError("epsilon must be finite and >= 0 (every entry)")
    return arr, arr.ndim == 0


def _target_delta(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating):
        raise UserTypeError(f"delta must be a real number, got {type(value).__name__}")
    delta = float(value)
    if math.isnan(delta) or not 0.0 <= delta < 1.0:
        raise UserError(f"delta must lie in [0, 1), got {value!r}")
    return delta


def _confirm(f: Callable[[float], float], eps: float, delta: float) -> float:
    """``eps`` moved up until f(eps) <= delta, as evaluated (a solver's answer rounded up)."""
    bump = 1e-15 * max(eps, 1.0)
    while f(eps) > delta:
        eps += bump
        bump *= 2.0
    return eps


def _unbounded(law: Law) -> bool:
    """Whether the loss exceeds every bound with positive probability (Gaussian noise): then no
    finite eps has delta 0, however far a floating-point tail underflows."""
    return isinstance(law, GaussianLaw) or (
        isinstance(law, MixtureLaw) and isinstance(law.profile.noise, prof.GaussianNoise))


def _invert(f: Callable[[float], float], delta: float, atoms: FloatArray, floor: float) -> float:
    """The smallest eps >= 0 with f(eps) <= delta, for f non-increasing and right-continuous.

    ``floor`` is f's limit at +infinity (its +infinity mass): above delta, no eps will do.
    Bisection to adjacent floats; the answer is then moved onto an atom of the loss if one
    lies there (f jumps at atoms, and the smallest eps is the atom itself).
    """
    if f(0.0) <= delta:
        return 0.0
    if floor > delta:
        return math.inf
    lo, hi = 0.0, 1.0
    while f(hi) > delta:
        lo, hi = hi, hi * 2.0
        if hi > 1e12:  # pragma: no cover - every law here settles long before
            return math.inf
    for _ in range(2000):
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:
            break
        if f(mid) <= delta:
            hi = mid
        else:
            lo = mid
    # An atom just above hi (within the tolerance at which atoms count as "at eps") is the
    # true answer; one inside (lo, hi] is a smaller one.
    slack = 2.0 * ATOM_TOLERANCE * max(1.0, hi)
    near = atoms[(atoms >= 0) & (atoms > lo - slack) & (atoms <= hi + slack)]
    for a in np.sort(near):
        if f(float(a)) <= delta:
            return float(a)
    return hi


class PrivacyLossProfile:
    """Both readings of delta for one event: delta_pDP(eps), delta_aDP(eps) and their inverses.

    Guarantee: for every eps >= 0 the mechanism (or composition) the event records is
    (eps, ``delta_pdp(eps)``)-probabilistically DP and (eps, ``delta_adp(eps)``)-approximately
    DP under ``neighbouring``; each value is the exact one where ``exact`` is True (rounded up
    by 1e-12), and above it otherwise. Sources: the module docstring; the laws in
    ``_loss_laws`` and ``_loss_events``, the grid in ``_loss_grid``.
    """

    __slots__ = ("_event", "_grid_h", "_laws", "_neighbouring", "_pld", "_renyi")

    def __init__(self, event: DpEvent, *, neighbouring: Neighbouring | None = None) -> None:
        if not isinstance(event, DpEvent):
            raise UserTypeError(f"event must be a DpEvent, got {type(event).__name__}")
        if neighbouring is not None and not isinstance(neighbouring, Neighbouring):
            raise UserTypeError(f"neighbouring must be a Neighbouring, got {neighbouring!r}")
        self._event = event
        self._pld: PLD | None = None
        self._renyi: tuple[FloatArray, FloatArray, float] | None = None
        self._grid_h: float | None = None
        laws = exact_laws(event)
        parts = [] if laws is not None else blocks(event)
        relation = relation_of([laws.relation] if laws is not None
                               else [b.laws.relation for b in parts])
        if neighbouring is not None and relation is not None and relation is not neighbouring:
            raise UnsupportedEventError(f"the event is stated under {relation}, not {neighbouring}")
        self._neighbouring = neighbouring or relation or Neighbouring.ADD_REMOVE
        self._laws = laws if laws is not None else self._grid_laws(event, parts,
                                                                   self._neighbouring)

    def _grid_laws(self, event: DpEvent, parts: list[Block],
                   relation: Neighbouring) -> LawPair:
        h, remove, add = grid.build_upward(event, parts)
        self._grid_h = h
        self._renyi = grid.renyi_tail(event, relation)
        pld = self._pld = pld_from_event(event, neighbouring=relation)

        def law(pmf: RawPmf) -> AtomLaw:
            losses = (pmf.offset + np.arange(pmf.probs.size, dtype=np.float64)) * h
            return AtomLaw(losses, pmf.probs, pmf.infinity_mass)

        up_remove = law(remove)
        up_add = up_remove if add is remove else law(add)
        cd_remove = AtomLaw(pld.remove.losses, pld.remove.probs, pld.remove.infinity_mass)
        cd_add = cd_remove if pld.is_symmetric else AtomLaw(
            pld.add.losses, pld.add.probs, pld.add.infinity_mass)
        return LawPair(up_remove, up_add, cd_remove, cd_add,
                       f"grid rounded up (interval {h:.3g})", relation)

    # ---- what it is

    @property
    def event(self) -> DpEvent:
        """The event this profile reads."""
        return self._event

    @property
    def neighbouring(self) -> Neighbouring:
        """The relation both readings hold under."""
        return self._neighbouring

    @property
    def exact(self) -> bool:
        """Whether both deltas are closed forms (else upper bounds from grids)."""
        return self._grid_h is None

    @property
    def method_pdp(self) -> str:
        """How delta_pDP is computed."""
        if self._grid_h is None:
            return self._laws.method
        renyi = " or the Renyi tail bound where smaller" if self._renyi is not None else ""
        return self._laws.method + renyi

    @property
    def method_adp(self) -> str:
        """How delta_aDP is computed."""
        if self._grid_h is None:
            if self._laws.adp_remove is not self._laws.remove:
                return "the dominating pair of the guarantee (Kairouz, Oh and Viswanath 2015)"
            return self._laws.method
        return "PLD accountant (connect the dots)"

    @property
    def directions(self) -> tuple[Direction, ...]:
        """The orders whose laws differ ("remove" alone when both share one)."""
        same = self._laws.add is self._laws.remove and self._laws.adp_add is self._laws.adp_remove
        return ("remove",) if same else ("remove", "add")

    def pdp_law(self, direction: Direction) -> Law:
        """The law delta_pDP is read from, in one order (``_loss_laws.Law``)."""
        return self._laws.remove if direction == "remove" else self._laws.add

    def adp_law(self, direction: Direction) -> Law:
        """The law delta_aDP is read from, in one order."""
        return self._laws.adp_remove if direction == "remove" else self._laws.adp_add

    def __repr__(self) -> str:
        return (f"PrivacyLossProfile({type(self._event).__name__}, {self._neighbouring}, "
                f"pDP: {self.method_pdp})")

    # ---- the two readings

    def _pdp_one(self, direction: Direction, eps: FloatArray) -> FloatArray:
        values = self.pdp_law(direction).sf_p(eps)
        if self._grid_h is None:
            return np.minimum(values * (1.0 + _ROUND_UP), 1.0)
        values = np.minimum(values * (1.0 + FLOAT_GUARD), 1.0)
        if self._renyi is not None:
            values = np.minimum(values, grid.renyi_delta(self._renyi, eps))
        return values

    def _adp_one(self, direction: Direction, eps: FloatArray) -> FloatArray:
        if self._pld is not None:
            pmf = self._pld.remove if direction == "remove" else self._pld.add
            return np.asarray(pmf.delta(eps), dtype=np.float64)
        return np.minimum(self.adp_law(direction).adp(eps) * (1.0 + _ROUND_UP), 1.0)

    def delta_pdp(self, epsilon: float | npt.ArrayLike) -> float | FloatArray:
        """P[L > eps], the larger of the two orders: the probabilistic delta at eps.

        ``epsilon`` is a number >= 0 or an array of them (then an array comes back).
        """
        eps, scalar = _epsilons(epsilon)
        flat = eps.reshape(-1)
        out = np.max([self._pdp_one(d, flat) for d in self.directions], axis=0)
        return float(out[0]) if scalar else out.reshape(eps.shape)

    def delta_adp(self, epsilon: float | npt.ArrayLike) -> float | FloatArray:
        """E[max(0, 1 - e^(eps - L))], the larger of the two orders: the approximate delta."""
        eps, scalar = _epsilons(epsilon)
        flat = eps.reshape(-1)
        out = np.max([self._adp_one(d, flat) for d in self.directions], axis=0)
        return float(out[0]) if scalar else out.reshape(eps.shape)

    def epsilon_pdp(self, delta: float) -> float:
        """The smallest eps >= 0 with delta_pDP(eps) <= delta (+inf if none)."""
        target = _target_delta(delta)
        return max(self._epsilon_pdp_one(d, target) for d in self.directions)

    def epsilon_adp(self, delta: float) -> float:
        """The smallest eps >= 0 with delta_aDP(eps) <= delta (+inf if none)."""
        target = _target_delta(delta)
        if self._pld is not None:
            return pld_epsilon(self._event, target, neighbouring=self._neighbouring)
        return max(self._epsilon_adp_one(d, target) for d in self.directions)

    def _epsilon_pdp_one(self, direction: Direction, delta: float) -> float:
        law = self.pdp_law(direction)

        def f(e: float) -> float:
            return float(self._pdp_one(direction, np.array([e]))[0])

        if self._grid_h is not None:
            return self._epsilon_on_grid(direction, delta)
        if delta == 0.0 and _unbounded(law):
            return math.inf
        if isinstance(law, GaussianLaw):
            # Phi((mu - eps) / sd) <= delta  <=>  eps >= mu - sd Phi^-1(delta)
            guess = max(law.mu - law.sd * float(special.ndtri(delta)), 0.0)
            return _confirm(f, guess, delta)
        return _invert(f, delta, law.atoms()[0], law.infinity_mass)

    def _epsilon_on_grid(self, direction: Direction, delta: float) -> float:
        """Grid losses are where the rounded-up tail steps down: the answer is 0 or one of them
        (or the Renyi bound's, when smaller)."""
        law = self.pdp_law(direction)
        losses = law.atoms()[0]
        candidates = np.concatenate([[0.0], np.sort(losses[losses > 0])])
        ok = np.flatnonzero(self._pdp_one(direction, candidates) <= delta)
        best = float(candidates[ok[0]]) if ok.size else math.inf
        if self._renyi is not None:
            best = min(best, grid.renyi_epsilon(self._renyi, delta))
        return best

    def _epsilon_adp_one(self, direction: Direction, delta: float) -> float:
        law = self.adp_law(direction)
        if delta == 0.0 and _unbounded(law):
            return math.inf

        def f(e: float) -> float:
            return float(self._adp_one(direction, np.array([e]))[0])

        if isinstance(law, GaussianLaw):
            return _confirm(f, gdp_to_epsilon(law.sd, delta), delta)
        return _invert(f, delta, law.atoms()[0], law.infinity_mass)


def loss_profile(event: DpEvent, *, neighbouring: Neighbouring | None = None) -> PrivacyLossProfile:
    """The ``PrivacyLossProfile`` of everything an event records (see the module docstring).

    ``neighbouring`` defaults to the event's own relation (add/remove when it states none).
    Raises ``UnsupportedEventError`` (a ``ValueError``) for what has no privacy loss
    distribution here (a zCDP guarantee) or no sound probabilistic reading (sampling without
    replacement, Poisson sampling of compositions or of guarantees).
    """
    return PrivacyLossProfile(event, neighbouring=neighbouring)


def delta_pdp(event: DpEvent, epsilon: float) -> float:
    """The probabilistic delta of the event at ``epsilon``: P[L > eps] (see ``loss_profile``)."""
    value = loss_profile(event).delta_pdp(epsilon)
    assert isinstance(value, float)
    return value


def delta_adp(event: DpEvent, epsilon: float) -> float:
    """The approximate delta of the event at ``epsilon``: E[max(0, 1 - e^(eps - L))]."""
    value = loss_profile(event).delta_adp(epsilon)
    assert isinstance(value, float)
    return value


def epsilon_pdp(event: DpEvent, delta: float) -> float:
    """The smallest eps whose probabilistic delta is at most ``delta``."""
    return loss_profile(event).epsilon_pdp(delta)


def epsilon_adp(event: DpEvent, delta: float) -> float:
    """The smallest eps whose approximate delta is at most ``delta``."""
    return loss_profile(event).epsilon_adp(delta)


def pair_deltas(
    first: npt.ArrayLike, second: npt.ArrayLike, epsilon: float
) -> tuple[float, float]:
    """(delta_pDP, delta_aDP) at ``epsilon`` of two output distributions on the same finite set.

    ``first[i]`` and ``second[i]`` are the probabilities of output i on two neighbouring
    datasets. Both orders count (the larger). Output i's loss is ln(first[i] / second[i]);
    delta_pDP sums the probabilities of the outputs with loss > eps (an output at exactly eps,
    to ``ATOM_TOLERANCE``, counts as within), delta_aDP sums (first[i] - e^eps second[i])+.
    For small worked examples, such as the references' post-processing counterexample.
    """
    eps, scalar = _epsilons(epsilon)
    if not scalar:
        raise UserTypeError("epsilon must be one number here")
    p = np.asarray(first, dtype=np.float64).reshape(-1)
    q = np.asarray(second, dtype=np.float64).reshape(-1)
    if p.shape != q.shape or p.size == 0:
        raise UserError("first and second must be probabilities over the same outputs")
    for name, dist in (("first", p), ("second", q)):
        if not np.all(np.isfinite(dist)) or np.any(dist < 0) or abs(dist.sum() - 1.0) > 1e-9:
            raise UserError(f"{name} must be a probability distribution (>= 0, summing to 1)")
    e = float(eps)
    beyond = math.exp(e + ATOM_TOLERANCE * max(1.0, e))
    orders = ((p, q), (q, p))
    pdp = max(float(np.sum(np.where((a > 0) & (a > beyond * b), a, 0.0))) for a, b in orders)
    adp = max(float(np.sum(np.maximum(a - math.exp(e) * b, 0.0))) for a, b in orders)
    return pdp, adp
