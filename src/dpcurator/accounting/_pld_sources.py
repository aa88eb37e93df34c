"""Building blocks of PLD accounting (private): mechanism sources and the grid choice.

A *source* is one mechanism (possibly sampled) whose PLD is computed directly, either from a
continuous profile by connect the dots or from exact atoms; ``accounting.pld`` composes them.
Sources return raw grid PMFs (``_pld_core.RawPmf``) and memoize them per grid; a continuous
profile's tail functions (the costly part) are evaluated once for both orders of a Gaussian
pair and for the coarse grid of the error prediction. ``Scale``
summarizes a source for the automatic choice of the grid interval (``auto_interval``) and for
the prediction of the discretization error (``predicted_error``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpcurator.accounting import _pld_core as core
from dpcurator.accounting import _pld_profiles as prof
from dpcurator.accounting._pld_core import FloatArray
from dpcurator.errors import UserError

__all__ = [
    "CELLS_PER_SD",
    "MAX_AUTO_INTERVAL",
    "AtomSource",
    "MixtureSource",
    "Scale",
    "Source",
    "auto_interval",
    "discretize_profile",
    "finite_moments",
    "predicted_error",
]

# Grid interval chosen automatically: the single-step loss standard deviation over this.
# Connect the dots inflates the variance of each step by at most h^2 / 4 and its mean by about
# h^2 / 8, so the relative error of epsilon is about (h / sd)^2 / 4: 6e-4 at 20 cells per sd.
CELLS_PER_SD = 20.0
# ... and at most this, so that a single step's curve is also close between grid points (the
# chord error of delta there is second order in h).
MAX_AUTO_INTERVAL = 0.01


@dataclass(frozen=True, slots=True)
class Scale:
    """What the automatic grid choice needs to know of one building block."""

    sd: float  # standard deviation of the single-step loss (max over directions)
    width: float  # width of the single-step loss range that is discretized
    spacing: float | None  # losses are multiples of this (exact grids), if known
    multiplicity: int = 1  # how many times the block is composed
    anchor: float | None = None  # a loss carrying an atom: best placed on a grid point
    source: MixtureSource | AtomSource | None = None  # the block itself, when it is one


BuildKey = tuple[float, float, "prof.Direction"]


class _MemoizedSource:
    """Discretizations are costly and asked for repeatedly (both directions, grid checks).

    One grid PMF is memoized per (interval, tail, direction); a symmetric source (both orders
    share one PLD) has only its "remove" one.
    """

    symmetric: bool
    _memo: dict[BuildKey, core.RawPmf]

    def build(
        self, h: float, tail: float, direction: prof.Direction | None = None
    ) -> tuple[core.RawPmf, core.RawPmf | None]:
        """(remove, add) on the grid h; add is None for a symmetric source or one direction.

        ``direction`` asks for that order only (returned first); a symmetric source returns its
        one PLD whatever the direction.
        """
        wanted: tuple[prof.Direction, ...]
        if self.symmetric:
            wanted = ("remove",)
        else:
            wanted = ("remove", "add") if direction is None else (direction,)
        pmfs = [self._one(h, tail, d, wanted) for d in wanted]
        return pmfs[0], pmfs[1] if len(pmfs) > 1 else None

    def _one(
        self, h: float, tail: float, direction: prof.Direction, wanted: tuple[prof.Direction, ...]
    ) -> core.RawPmf:
        key = (h, tail, direction)
        pmf = self._memo.get(key)
        if pmf is None:
            pmf = self._memo[key] = self._build(h, tail, direction, wanted)
        return pmf

    def _build(
        self, h: float, tail: float, direction: prof.Direction, wanted: tuple[prof.Direction, ...]
    ) -> core.RawPmf:
        """``direction``'s PMF; ``wanted`` are all the directions asked for at once."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True, eq=False)
class _Tails:
    """P[L <= t], P[L > t], Q[L <= t], Q[L > t] of one profile at t = (first + i) h."""

    first: int
    h: float
    cdf_p: FloatArray
    sf_p: FloatArray
    cdf_q: FloatArray
    sf_q: FloatArray

    def on_grid(self, lo: int, hi: int, interval: float) -> _Tails | None:
        """The entries at the thresholds j * interval, j = lo..hi, if this table has them.

        ``interval`` must be h or 2h: the thresholds of the coarse grid 2h are every other
        threshold of the fine one, and (2j) * h == j * (2h) exactly in floating point.
        """
        if interval == self.h:
            step = 1
        elif interval == 2.0 * self.h:
            step = 2
        else:
            return None
        start, stop = step * lo - self.first, step * hi - self.first
        if start < 0 or stop >= self.cdf_p.size:
            return None
        pick = slice(start, stop + 1, step)
        return _Tails(
            lo, interval, self.cdf_p[pick], self.sf_p[pick], self.cdf_q[pick], self.sf_q[pick]
        )

    def mirrored(self) -> _Tails:
        """The table of the other direction of a pair whose loss is continuous.

        The add pair (A, M) is the remove pair (M, A) swapped, and its loss at an output is
        minus the remove loss there, so P_add[L <= t] = A[L_remove >= -t] = Q_remove[L > -t]
        (the loss has no atoms, so > and >= agree) and likewise for the other three: the table
        at index i is the remove table at index -i with P and Q, <= and >, exchanged.
        """
        last = self.first + self.cdf_p.size - 1
        flip = slice(None, None, -1)
        return _Tails(
            -last, self.h, self.sf_q[flip], self.cdf_q[flip], self.sf_p[flip], self.cdf_p[flip]
        )


class MixtureSource(_MemoizedSource):
    """Gaussian or Laplace noise, Poisson-sampled at rate q (q = 1: plain), maybe symmetrized."""

    def __init__(
        self, noise: prof.GaussianNoise | prof.LaplaceNoise, q: float, *, symmetrize: bool = False
    ) -> None:
        self.noise = noise
        self.q = q
        self.symmetrize = symmetrize
        self.remove = prof.MixtureProfile(noise, q, "remove")
        self.add = prof.MixtureProfile(noise, q, "add")
        self.symmetric = q == 1.0 or symmetrize
        self._memo: dict[BuildKey, core.RawPmf] = {}
        # tail tables kept from the last evaluation, covering the grids h and 2h
        self._tables: dict[tuple[float, prof.Direction], _Tails] = {}

    def scale(self, tail: float) -> Scale:
        moments = prof.mixture_moments(self.noise, self.q)
        directions: list[prof.Direction] = ["remove"] if self.symmetric else ["remove", "add"]
        sd = max(moments[d][1] for d in directions)
        width = 0.0
        for d in directions:
            lo, hi = self._profile(d).loss_bounds(max(tail, 1e-300))
            width = max(width, hi - lo)
        anchor = None
        if isinstance(self.noise, prof.LaplaceNoise):  # atom at the largest loss
            anchor = float(prof.log_mix(self.q, np.array(self.noise.r_max)))
        return Scale(sd, width, None, 1, anchor)

    def _profile(self, direction: prof.Direction) -> prof.MixtureProfile:
        return self.remove if direction == "remove" else self.add

    def _build(
        self, h: float, tail: float, direction: prof.Direction, wanted: tuple[prof.Direction, ...]
    ) -> core.RawPmf:
        if self.symmetrize:
            return core.symmetrize(self._discretize("remove", h, tail, wanted), h)
        return self._discretize(direction, h, tail, wanted)

    def _discretize(
        self, direction: prof.Direction, h: float, tail: float, wanted: tuple[prof.Direction, ...]
    ) -> core.RawPmf:
        profile = self._profile(direction)
        lo, hi = _grid_range(profile, h, tail)
        for base in (h, 0.5 * h):
            table = self._tables.get((base, direction))
            found = None if table is None else table.on_grid(lo, hi, h)
            if found is not None:
                return _connect_tails(found, profile.infinity_mass)
        self._evaluate(h, tail, wanted)
        found = self._tables[(h, direction)].on_grid(lo, hi, h)
        assert found is not None
        return _connect_tails(found, profile.infinity_mass)

    def _evaluate(self, h: float, tail: float, directions: tuple[prof.Direction, ...]) -> None:
        """Evaluate the tails once for every grid asked for at h.

        The table covers the grids h and 2h (``predicted_error`` discretizes at 2h too, whose
        thresholds are every other one of h) and, for Gaussian noise asked in both directions,
        both: its loss is continuous, so the add table is the remove one mirrored
        (``_Tails.mirrored``). Laplace noise has atoms (flat stretches of the loss), so each
        direction is evaluated with its own strict or non-strict inequalities. Tables of other
        intervals are dropped (their PMFs are memoized).
        """
        spans: dict[prof.Direction, tuple[int, int]] = {}
        for d in directions:
            fine, coarse = (
                _grid_range(self._profile(d), h, tail),
                _grid_range(self._profile(d), 2.0 * h, tail),
            )
            spans[d] = (min(fine[0], 2 * coarse[0]), max(fine[1], 2 * coarse[1]))
        if any(interval != h for interval, _ in self._tables):
            self._tables.clear()
        if isinstance(self.noise, prof.GaussianNoise) and len(spans) == 2:
            lo = min(spans["remove"][0], -spans["add"][1])
            hi = max(spans["remove"][1], -spans["add"][0])
            table = _evaluate_tails(self.remove, lo, hi, h)
            self._tables[(h, "remove")] = table
            self._tables[(h, "add")] = table.mirrored()
            return
        for d in directions:
            self._tables[(h, d)] = _evaluate_tails(self._profile(d), *spans[d], h)


class AtomSource(_MemoizedSource):
    """A PLD given by atoms: symmetric, or (remove, add) atoms, or symmetrized remove atoms."""

    def __init__(
        self,
        remove: prof.Atoms,
        add: prof.Atoms | None = None,
        *,
        symmetrize: bool = False,
    ) -> None:
        self.remove_atoms = remove
        self.add_atoms = add
        self.symmetrize = symmetrize
        self.symmetric = add is None
        self._memo: dict[BuildKey, core.RawPmf] = {}

    def scale(self, tail: float) -> Scale:
        atoms = [self.remove_atoms] + ([] if self.add_atoms is None else [self.add_atoms])
        sd = max(a.moments()[1] for a in atoms)
        width = max(float(np.ptp(a.losses)) if a.losses.size else 0.0 for a in atoms)
        spacing = self.remove_atoms.spacing if self.symmetric and not self.symmetrize else None
        finite = self.remove_atoms.losses
        anchor = float(finite.max()) if spacing is None and finite.size else None
        return Scale(sd, width, spacing, 1, anchor)

    def _build(
        self, h: float, tail: float, direction: prof.Direction, wanted: tuple[prof.Direction, ...]
    ) -> core.RawPmf:
        atoms = self.add_atoms if direction == "add" and self.add_atoms is not None else None
        a = self.remove_atoms if atoms is None else atoms
        pmf = core.atoms_to_grid(a.losses, a.masses, h, a.infinity_mass)
        return core.symmetrize(pmf, h) if self.symmetrize else pmf


Source = MixtureSource | AtomSource


def _grid_range(profile: prof.MixtureProfile, h: float, tail: float) -> tuple[int, int]:
    """Grid indices [lo, hi] (of the grid h) covering all but 2 * tail of the loss's mass."""
    lo, hi = profile.loss_bounds(max(tail, 1e-300))
    if not (math.isfinite(lo) and math.isfinite(hi)):  # pragma: no cover - bounds are finite
        raise UserError(f"the privacy loss range [{lo:g}, {hi:g}] cannot be discretized")
    i_lo = math.floor(lo / h)
    i_hi = max(math.ceil(hi / h), i_lo + 1)
    if i_hi - i_lo + 1 > core.MAX_STEP_POINTS:
        raise core.GridTooLargeError(
            f"value_discretization_interval={h:g} is too fine for losses spanning "
            f"[{lo:g}, {hi:g}]: increase it"
        )
    return i_lo, i_hi


def _evaluate_tails(profile: prof.MixtureProfile, lo: int, hi: int, h: float) -> _Tails:
    t = np.arange(lo, hi + 1, dtype=np.float64) * h
    return _Tails(lo, h, *profile.tails(t))


def _connect_tails(tails: _Tails, infinity_mass: float) -> core.RawPmf:
    """Connect the dots on the cells between consecutive thresholds of a tail table."""
    cdf_p, sf_p, cdf_q, sf_q = tails.cdf_p, tails.sf_p, tails.cdf_q, tails.sf_q
    # cell masses from whichever tail function is small (relative accuracy in both tails)
    cell_p = np.where(sf_p[:-1] <= 0.5, sf_p[:-1] - sf_p[1:], cdf_p[1:] - cdf_p[:-1])
    cell_q = np.where(sf_q[:-1] <= 0.5, sf_q[:-1] - sf_q[1:], cdf_q[1:] - cdf_q[:-1])
    return core.connect_the_dots(
        tails.first,
        np.maximum(cell_p, 0.0),
        np.maximum(cell_q, 0.0),
        tails.h,
        below_p=float(cdf_p[0]),
        top_p=float(sf_p[-1]),
        top_q=float(sf_q[-1]),
        infinity_mass=infinity_mass,
    )


def discretize_profile(profile: prof.MixtureProfile, h: float, tail: float) -> core.RawPmf:
    """Connect the dots on the grid h over the range holding all but 2 * tail of the mass."""
    return _connect_tails(
        _evaluate_tails(profile, *_grid_range(profile, h, tail), h), profile.infinity_mass
    )


def auto_interval(scales: list[Scale]) -> tuple[float, bool]:
    """A grid interval for composing these blocks, and whether the result is exact.

    The smallest allowed interval keeps the FFT window of the whole composition within
    ``MAX_GRID_POINTS`` / 2 and each single step within half of ``MAX_STEP_POINTS`` (continuous
    profiles) or of ``MAX_GRID_POINTS`` (atoms); ``pld_epsilon`` widens the grid further if a
    window still does not fit. Exact: every block is
    atoms on multiples of one spacing g (and g is allowed); then h = g. Otherwise
    h = min(min sd / 20, 0.01) (relative epsilon error about 6e-4, see ``CELLS_PER_SD``), or a
    multiple of g when g is too fine; an atom at the top of a continuous profile (Laplace) is
    put on a grid point.
    """
    # the final window: a single block spans its width; many compositions spread like sqrt
    window = sum(
        min(s.width * s.multiplicity, s.width + 24.0 * math.sqrt(s.multiplicity) * s.sd)
        for s in scales
    )
    # a continuous step's tail tables are the costly part: they get the smaller budget
    h_min = max(
        [2.0 * window / core.MAX_GRID_POINTS]
        + [
            2.0 * s.width / (core.MAX_GRID_POINTS if s.spacing else core.MAX_STEP_POINTS)
            for s in scales
        ]
    )
    spacings = [s.spacing for s in scales]
    if spacings and all(g is not None and g > 0 for g in spacings):
        gs = [g for g in spacings if g is not None]
        g_min = min(gs)
        if all(abs(g / g_min - round(g / g_min)) < 1e-9 for g in gs):
            if g_min >= h_min:
                return g_min, True
            return g_min * math.ceil(h_min / g_min), False
    positive = [s.sd for s in scales if s.sd > 0]
    h = min(min(positive) / CELLS_PER_SD, MAX_AUTO_INTERVAL) if positive else 1e-3
    h = max(h, h_min)
    anchors = {s.anchor for s in scales if s.anchor is not None and s.anchor >= h}
    if len(anchors) == 1:  # put that atom on a grid point (h divides it)
        anchor = anchors.pop()
        h = anchor / math.ceil(anchor / h)
    return h, False


def finite_moments(pmf: core.RawPmf, h: float) -> tuple[float, float]:
    """Mean and variance of the finite losses (normalized to their mass)."""
    p = pmf.probs
    losses = (pmf.offset + np.arange(p.size, dtype=np.float64)) * h
    mass = float(p.sum())
    if mass <= 0:
        return 0.0, 0.0
    mean = core.dot(p, losses) / mass
    return mean, core.dot(p, (losses - mean) ** 2) / mass


def _worst_shift(h: float) -> float:
    """The largest rise of an atom's mean under connect the dots on the grid h (about h^2 / 8).

    An atom at a + theta h (theta in [0, 1]) goes up with the share (1 - e^(-theta h)) /
    (1 - e^(-h)) (keeping its P- and Q-mass), so its mean rises by h times that minus theta h:
    a concave function of theta, largest where e^(-theta h) = (1 - e^(-h)) / h.
    """
    gap = -math.expm1(-h)
    theta = -math.log(gap / h) / h
    return h * (-math.expm1(-theta * h) / gap - theta)


def predicted_error(
    scales: list[Scale],
    h: float,
    tail: float,
    eps_by_direction: dict[str, float],
    tolerance: float = 0.0,
) -> float | None:
    """Predicted excess of epsilon on the grid h, from how the grid inflates one step.

    Summed over the composition, a rise dM of the mean loss moves epsilon one for one and a
    change dV of the variance moves it by (eps - mean) dV / (2 V) (Gaussian approximation of
    the composed loss). Two predictions of dM and dV, the cheaper first:

    - worst case, from the grid h alone: the mass of each cell is a mixture of atoms, and
      connect the dots splits each atom between the cell's ends, raising its mean by at most
      s = ``_worst_shift(h)`` (about h^2 / 8) and putting it on two points h apart (variance at
      most h^2 / 4). So a step's mean rises by at most s and its variance changes by at most
      h^2 / 4 + s (2 sd + s + h) (the within-cell variances, and the cell means moving by at
      most s). Returned when it is within ``tolerance`` (a smooth density gets about h^2 / 12
      and h^2 / 6, so this usually settles it);
    - measured: the discretizations at h and 2h give dM and dV (difference / 3, as the error is
      quadratic).

    A heuristic: it decides only when to refine, never what is reported (every grid gives an
    upper bound). None when a block is not a single source (then Richardson).
    """
    if any(s.source is None for s in scales):
        return None
    shift = _worst_shift(h)
    moments: dict[str, list[tuple[float, float]]] = {}
    worst_case = 0.0
    for direction, eps in eps_by_direction.items():
        d: prof.Direction = "remove" if direction == "remove" else "add"
        fine = []
        for s in scales:
            assert s.source is not None
            fine.append(finite_moments(s.source.build(h, tail, d)[0], h))
        moments[direction] = fine
        mean = sum(s.multiplicity * m for s, (m, _) in zip(scales, fine, strict=True))
        var = sum(s.multiplicity * v for s, (_, v) in zip(scales, fine, strict=True))
        d_mean = sum(s.multiplicity * shift for s in scales)
        d_var = sum(
            s.multiplicity * (h * h / 4.0 + shift * (2.0 * math.sqrt(v) + shift + h))
            for s, (_, v) in zip(scales, fine, strict=True)
        )
        bound = d_mean + abs(eps - mean) * d_var / (2.0 * var) if var > 0 else d_mean
        worst_case = max(worst_case, bound)
    if worst_case <= tolerance:
        return worst_case
    worst = 0.0
    for direction, eps in eps_by_direction.items():
        d = "remove" if direction == "remove" else "add"
        mean = var = d_mean = d_var = 0.0
        for s, (m1, v1) in zip(scales, moments[direction], strict=True):
            assert s.source is not None
            coarse_pmf = s.source.build(2.0 * h, tail, d)[0]  # from the table of h
            m2, v2 = finite_moments(coarse_pmf, 2.0 * h)
            mean += s.multiplicity * m1
            var += s.multiplicity * v1
            d_mean += s.multiplicity * (m2 - m1) / 3.0
            d_var += s.multiplicity * (v2 - v1) / 3.0
        error = d_mean + (eps - mean) * d_var / (2.0 * var) if var > 0 else d_mean
        worst = max(worst, abs(error))
    return worst
