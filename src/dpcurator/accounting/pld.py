"""Privacy loss distributions (PLDs): the tightest accountant in dpcurator.

The privacy loss of an output o of a mechanism M on neighbours D1, D2 is
L(o) = ln(P[M(D1) = o] / P[M(D2) = o]) with o drawn from M(D1). Its distribution determines
every (epsilon, delta) guarantee of M on that ordered pair:

    delta(epsilon) = E[max(0, 1 - e^(epsilon - L))]  (+ P[L = +inf]),

and the losses of a composition add up, so composing mechanisms convolves their PLDs (Sommer,
Meiser and Mohammadi, "Privacy loss classes: the central limit theorem in differential
privacy", PoPETs 2019; Koskela, Jalko and Honkela, "Computing tight differential privacy
guarantees using FFT", AISTATS 2020). Here a PLD is discretized on a uniform grid of losses with
*pessimistic* rounding, so that every delta(epsilon) it reports is at least the true one (see
``PrivacyLossPmf``), and composed by FFT.

For the add/remove relation the two orders of a pair of neighbours can have different PLDs
(subsampled mechanisms do), so ``PLD`` holds both: ``remove`` (D1 has the extra unit) and
``add`` (D2 has it); a guarantee must hold for both, so delta is the larger of the two. Under
the replace relation the two entries are the two orders of the replaced pair.

Public names: ``PrivacyLossPmf`` (one direction), ``PLD`` (both), ``pld_from_event`` (interpret
an event of ``accounting.events``) and ``pld_epsilon`` (epsilon for an event at a delta, with
the grid refined until the discretization error is below a tolerance).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dpcurator import _validation as check
from dpcurator.accounting import _pld_core as core
from dpcurator.accounting import _pld_profiles as prof
from dpcurator.accounting import _pld_sources as srcs
from dpcurator.accounting.events import (
    ApproxDPEvent,
    ComposedEvent,
    DiscreteGaussianEvent,
    DiscreteLaplaceEvent,
    DpEvent,
    GaussianEvent,
    LaplaceEvent,
    NameAndShameEvent,
    PoissonSampledEvent,
    PureDPEvent,
    RandomizedResponseEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    ZCDPEvent,
)
from dpcurator.accounting.guarantees import ApproxDP, Neighbouring
from dpcurator.errors import UnsupportedEventError, UserError, UserTypeError

__all__ = [
    "DEFAULT_TAIL_MASS_TRUNCATION",
    "PLD",
    "PrivacyLossPmf",
    "UnsupportedEventError",
    "pld_epsilon",
    "pld_from_event",
]

FloatArray = npt.NDArray[np.float64]

#: Default bound on the probability mass cut from each tail at every truncation. Cut mass is
#: moved up (to the lowest kept loss, or to +infinity), never dropped.
DEFAULT_TAIL_MASS_TRUNCATION = 1e-15


# --------------------------------------------------------------------------- validation


def _check_tail(value: object) -> float:
    out = check.real("tail_mass_truncation", value)
    if not 0.0 <= out < 0.01:
        raise UserError(f"tail_mass_truncation must lie in [0, 0.01), got {out!r}")
    return out


def _check_interval(value: object) -> float:
    return check.positive("value_discretization_interval", value)


def _check_sensitivity_int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise UserError(f"sensitivity must be a positive integer, got {value!r}")
    return int(value)


# --------------------------------------------------------------------------- one direction


class PrivacyLossPmf:
    """A discretized privacy loss distribution for one ordered pair of neighbours.

    Losses lie on the grid ``(offset + i) * interval``: ``probs[i]`` is the probability of loss
    ``(offset + i) * interval`` and ``infinity_mass`` that of +infinity (outputs impossible
    under the other dataset). There is no mass at -infinity: under the first distribution of
    the pair such outputs have probability 0.

    Pessimism. Every constructor and operation in this module rounds so that the stored PLD
    *dominates* the exact one: its delta(eps) is >= the exact delta(eps) for all eps, and the
    stored PLD is itself the PLD of a pair of distributions (or stochastically larger than
    one), so compositions of dominating PLDs dominate the exact composition (Zhu, Dong and
    Wang 2022, Theorem 10). Continuous mechanisms are discretized by connect the dots
    (Doroshenko et al. 2022); finitely many atoms are kept exactly when they lie on the grid and
    split between neighbouring grid points (keeping both distributions' masses) otherwise;
    truncated tails are moved to higher losses, and single-step losses above
    ``MAX_FINITE_LOSS`` (500) to +infinity. ``delta`` multiplies the finite part by (1 + 1e-9)
    to cover floating-point rounding; a self-composition also adds an estimate of its FFT's
    rounding (count * u * ||z^count||_2, about 1e-12 for 10^4 DP-SGD steps) at its largest
    loss.
    """

    __slots__ = ("_infinity_mass", "_interval", "_offset", "_probs", "_sums")

    def __init__(
        self,
        interval: float,
        offset: int,
        probs: npt.ArrayLike,
        infinity_mass: float = 0.0,
    ) -> None:
        self._interval = check.positive("interval", interval)
        if isinstance(offset, bool) or not isinstance(offset, int | np.integer):
            raise UserTypeError(f"offset must be an integer, got {type(offset).__name__}")
        self._offset = int(offset)
        arr = np.array(probs, dtype=np.float64, copy=True).reshape(-1)
        if arr.size == 0:
            arr = np.zeros(1)
        if not np.all(np.isfinite(arr)) or np.any(arr < 0):
            raise UserError("probs must be finite and non-negative")
        inf_mass = check.real("infinity_mass", infinity_mass)
        if not 0.0 <= inf_mass <= 1.0 + 1e-9:
            raise UserError(f"infinity_mass must lie in [0, 1], got {inf_mass!r}")
        total = float(arr.sum()) + inf_mass
        if total > 1.0 + 1e-6:
            raise UserError(f"probabilities sum to {total!r} > 1")
        arr.setflags(write=False)
        self._probs = arr
        self._infinity_mass = inf_mass
        self._sums: tuple[FloatArray, FloatArray] | None = None

    @classmethod
    def _from_raw(cls, raw: core.RawPmf, interval: float) -> PrivacyLossPmf:
        out = cls.__new__(cls)
        out._interval = interval
        out._offset = raw.offset
        probs = np.ascontiguousarray(raw.probs, dtype=np.float64)
        probs.setflags(write=False)
        out._probs = probs
        out._infinity_mass = min(max(raw.infinity_mass, 0.0), 1.0)
        out._sums = None
        return out

    def _raw(self) -> core.RawPmf:
        return core.RawPmf(self._offset, self._probs, self._infinity_mass)

    def _finite_raw(self) -> core.RawPmf:
        return core.RawPmf(self._offset, self._probs, 0.0)

    # ---- data

    @property
    def interval(self) -> float:
        """Grid spacing of the losses (``value_discretization_interval``)."""
        return self._interval

    @property
    def offset(self) -> int:
        """Grid index of ``probs[0]``: its loss is ``offset * interval``."""
        return self._offset

    @property
    def probs(self) -> FloatArray:
        """Probabilities of the finite losses (read-only)."""
        return self._probs

    @property
    def infinity_mass(self) -> float:
        """Probability of an infinite loss."""
        return self._infinity_mass

    @property
    def losses(self) -> FloatArray:
        """The finite losses, ``(offset + arange(len(probs))) * interval``."""
        index = np.arange(self._probs.size, dtype=np.float64) + self._offset
        out: FloatArray = index * self._interval
        return out

    def __repr__(self) -> str:
        lo, hi = (
            self._offset * self._interval,
            (self._offset + self._probs.size - 1) * self._interval,
        )
        return (
            f"PrivacyLossPmf(interval={self._interval:g}, losses in [{lo:g}, {hi:g}], "
            f"{self._probs.size} points, infinity_mass={self._infinity_mass:g})"
        )

    # ---- reading guarantees

    def _tail_sums(self) -> tuple[FloatArray, FloatArray]:
        if self._sums is None:
            self._sums = core._tail_sums(self._probs, self._interval)
        return self._sums

    def delta(self, epsilon: float | npt.ArrayLike) -> float | FloatArray:
        """delta(eps) = infinity_mass + sum over losses l > eps of p_l (1 - e^(eps - l)).

        Vectorized: an array of epsilons gives an array of deltas. Pessimistic (see the class).
        """
        eps = np.asarray(epsilon, dtype=np.float64)
        if np.any(np.isnan(eps)):
            raise UserError("epsilon must not be NaN")
        finite = core.delta_at(
            self._finite_raw(), self._interval, self._tail_sums(), eps.reshape(-1)
        )
        values = np.minimum(self._infinity_mass + finite * (1.0 + core.FLOAT_GUARD), 1.0)
        if eps.ndim == 0:
            return float(values[0])
        out: FloatArray = values.reshape(eps.shape)
        return out

    def epsilon(self, delta: float) -> float:
        """The smallest epsilon >= 0 with delta(epsilon) <= delta (+inf if there is none).

        delta(eps) is piecewise of the form a - b e^eps between grid points, so the crossing is
        solved exactly on the right piece; the result is then rounded up until delta(eps),
        computed as ``delta`` does, confirms it.
        """
        delta = check.unit_interval("delta", delta, include_zero=True)
        if self._infinity_mass > delta:
            return math.inf
        target = (delta - self._infinity_mass) / (1.0 + core.FLOAT_GUARD)
        if self._sums is not None:
            segment, sums = self._finite_raw(), self._sums
        else:  # only the top of the PMF matters; see core.top_segment
            segment, sums = core.top_segment(self._finite_raw(), self._interval, target)
        eps = core.epsilon_for(segment, self._interval, sums, target)
        if eps == math.inf:
            return math.inf
        eps = max(eps, 0.0)
        bump = 1e-12 * max(abs(eps), 1.0)
        for _ in range(64):
            finite = core.delta_at(segment, self._interval, sums, np.array([eps]))[0]
            if self._infinity_mass + finite * (1.0 + core.FLOAT_GUARD) <= delta:
                return eps
            eps += bump
            bump *= 2.0
        return eps  # pragma: no cover - the solved crossing is off by far less

    def mean(self) -> float:
        """E[L] over the finite part (+inf if there is infinite mass)."""
        if self._infinity_mass > 0:
            return math.inf
        return core.dot(self._probs, self.losses)

    # ---- operations

    def regrid(self, interval: float) -> PrivacyLossPmf:
        """The same PLD on another grid (atoms off the new grid are split: pessimistic)."""
        interval = _check_interval(interval)
        if interval == self._interval:
            return self
        nonzero = self._probs > 0
        raw = core.atoms_to_grid(
            self.losses[nonzero], self._probs[nonzero], interval, self._infinity_mass
        )
        return PrivacyLossPmf._from_raw(raw, interval)

    def compose(
        self,
        other: PrivacyLossPmf,
        *,
        tail_mass_truncation: float = DEFAULT_TAIL_MASS_TRUNCATION,
    ) -> PrivacyLossPmf:
        """The PLD of running both mechanisms (losses add: a convolution).

        If the grids differ, the finer PLD is moved to the coarser grid first.
        """
        if not isinstance(other, PrivacyLossPmf):
            raise UserTypeError(f"other must be a PrivacyLossPmf, got {type(other).__name__}")
        tail = _check_tail(tail_mass_truncation)
        a, b = self, other
        if not math.isclose(a.interval, b.interval, rel_tol=1e-12):
            h = max(a.interval, b.interval)
            a, b = a.regrid(h), b.regrid(h)
        raw = core.convolve(a._raw(), b._raw(), tail)
        return PrivacyLossPmf._from_raw(raw, a.interval)

    def self_compose(
        self,
        count: int,
        *,
        tail_mass_truncation: float = DEFAULT_TAIL_MASS_TRUNCATION,
    ) -> PrivacyLossPmf:
        """The PLD of ``count`` runs: one FFT power on a window sized by Chernoff bounds.

        Let c be the exact count-fold convolution of the finite part p. The FFT computes c
        folded modulo the window length N; folding adds only non-negative mass, so inside the
        window the result is >= c. Mass that lies *below* the window folds in at a higher loss
        (pessimistic, harmless). Mass *above* the window would fold in lower, so its total is
        bounded by Chernoff's inequality with the exact moment generating function of the
        discretized single step, sum_{j >= u} c_j <= min over lambda > 0 of
        e^(-lambda u) (sum_i p_i e^(lambda i))^count, and that bound is added to the infinity
        mass. The infinity mass also gets 1 - (1 - infinity_mass)^count (some run was
        infinite). The window is chosen so that both tails are below ``tail_mass_truncation``.
        The FFT's rounding grows with the count (about count * 1e-16 relative); an estimate of
        it is added at the largest reachable loss (``_pld_core._power_rounding``). A window over
        ``MAX_GRID_POINTS`` raises ``ValueError`` (use a coarser grid).
        """
        count = check.integer("count", count, minimum=1)
        tail = _check_tail(tail_mass_truncation)
        raw = core.self_convolve(self._raw(), count, tail)
        return PrivacyLossPmf._from_raw(raw, self._interval)


# --------------------------------------------------------------------------- both directions


class PLD:
    """The privacy loss distributions of a mechanism for both orders of a pair of neighbours.

    ``remove`` is the PLD with the extra unit in the first dataset (D1 = D + unit, D2 = D),
    ``add`` the opposite order; under ``Neighbouring.REPLACE`` they are the two orders of a
    replaced pair. For a mechanism whose two orders have the same PLD (every unsampled additive
    mechanism, randomized response, any (eps, delta) profile) ``add`` is ``remove``.

    Guarantee: the mechanism satisfies (eps, delta(eps))-DP for every eps >= 0 under
    ``neighbouring``, with delta(eps) = max(remove.delta(eps), add.delta(eps)) and each of those
    at least the exact value (``PrivacyLossPmf`` explains the rounding). Sources: the
    constructor docstrings.
    """

    __slots__ = ("_add", "_neighbouring", "_remove")

    def __init__(
        self,
        remove: PrivacyLossPmf,
        add: PrivacyLossPmf | None = None,
        *,
        neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
    ) -> None:
        if not isinstance(remove, PrivacyLossPmf):
            raise UserTypeError(f"remove must be a PrivacyLossPmf, got {type(remove).__name__}")
        if add is not None and not isinstance(add, PrivacyLossPmf):
            raise UserTypeError(f"add must be a PrivacyLossPmf or None, got {type(add).__name__}")
        if not isinstance(neighbouring, Neighbouring):
            raise UserTypeError(f"neighbouring must be a Neighbouring, got {neighbouring!r}")
        self._remove = remove
        self._add = remove if add is None else add
        self._neighbouring = neighbouring

    @property
    def remove(self) -> PrivacyLossPmf:
        """PLD with the output drawn on the dataset that has the unit (D1 = D + unit)."""
        return self._remove

    @property
    def add(self) -> PrivacyLossPmf:
        """PLD with the output drawn on the dataset without the unit (D2 = D + unit)."""
        return self._add

    @property
    def neighbouring(self) -> Neighbouring:
        """The relation the guarantee holds under."""
        return self._neighbouring

    @property
    def is_symmetric(self) -> bool:
        """True when both orders share one PLD object."""
        return self._add is self._remove

    @property
    def interval(self) -> float:
        """Grid spacing (the larger of the two directions')."""
        return max(self._remove.interval, self._add.interval)

    def __repr__(self) -> str:
        if self.is_symmetric:
            return f"PLD({self._remove!r}, symmetric, {self._neighbouring})"
        return f"PLD(remove={self._remove!r}, add={self._add!r}, {self._neighbouring})"

    def _directions(self) -> tuple[PrivacyLossPmf, ...]:
        return (self._remove,) if self.is_symmetric else (self._remove, self._add)

    def delta(self, epsilon: float | npt.ArrayLike) -> float | FloatArray:
        """max(remove.delta(eps), add.delta(eps)); vectorized over an array of epsilons."""
        values = [np.asarray(d.delta(epsilon)) for d in self._directions()]
        out = np.maximum.reduce(values) if len(values) > 1 else values[0]
        if out.ndim == 0:
            return float(out)
        result: FloatArray = out
        return result

    def epsilon(self, delta: float) -> float:
        """Smallest epsilon >= 0 with delta(epsilon) <= delta for both orders (rounded up)."""
        return max(d.epsilon(delta) for d in self._directions())

    def to_approx_dp(self, delta: float) -> ApproxDP:
        """The (epsilon, delta)-DP guarantee at this delta, under this PLD's relation."""
        delta = check.unit_interval("delta", delta, include_zero=True)
        eps = self.epsilon(delta)
        if not math.isfinite(eps):
            raise UserError(
                f"no finite epsilon at delta={delta!r}: the probability of an infinite privacy "
                f"loss is {max(d.infinity_mass for d in self._directions())!r}; use a larger delta"
            )
        if eps == 0.0 and delta == 0.0:
            raise UserError("epsilon and delta are both 0: nothing to state")
        return ApproxDP(eps, delta, self._neighbouring)

    def _check_same_relation(self, other: PLD) -> None:
        if not isinstance(other, PLD):
            raise UserTypeError(f"other must be a PLD, got {type(other).__name__}")
        if other.neighbouring is not self._neighbouring:
            raise UserError(
                f"cannot compose PLDs under different neighbouring relations "
                f"({self._neighbouring} and {other.neighbouring})"
            )

    def compose(
        self, other: PLD, *, tail_mass_truncation: float = DEFAULT_TAIL_MASS_TRUNCATION
    ) -> PLD:
        """The PLD of running both mechanisms, direction by direction."""
        self._check_same_relation(other)
        remove = self._remove.compose(other.remove, tail_mass_truncation=tail_mass_truncation)
        if self.is_symmetric and other.is_symmetric:
            return PLD(remove, neighbouring=self._neighbouring)
        add = self._add.compose(other.add, tail_mass_truncation=tail_mass_truncation)
        return PLD(remove, add, neighbouring=self._neighbouring)

    def self_compose(
        self, count: int, *, tail_mass_truncation: float = DEFAULT_TAIL_MASS_TRUNCATION
    ) -> PLD:
        """The PLD of ``count`` runs (FFT power; see ``PrivacyLossPmf.self_compose``).

        Both orders on one grid are powered in one batched FFT (``core.self_convolve_all``).
        """
        count = check.integer("count", count, minimum=1)
        if self.is_symmetric or self._remove.interval != self._add.interval:
            remove = self._remove.self_compose(count, tail_mass_truncation=tail_mass_truncation)
            if self.is_symmetric:
                return PLD(remove, neighbouring=self._neighbouring)
            add = self._add.self_compose(count, tail_mass_truncation=tail_mass_truncation)
            return PLD(remove, add, neighbouring=self._neighbouring)
        tail = _check_tail(tail_mass_truncation)
        raw_remove, raw_add = core.self_convolve_all(
            [self._remove._raw(), self._add._raw()], count, tail
        )
        h = self._remove.interval
        return PLD(
            PrivacyLossPmf._from_raw(raw_remove, h),
            PrivacyLossPmf._from_raw(raw_add, h),
            neighbouring=self._neighbouring,
        )

    def poisson_subsampled(
        self, sampling_rate: float, *, value_discretization_interval: float | None = None
    ) -> PLD:
        """This mechanism run on a Poisson sample (each unit kept w.p. ``sampling_rate``).

        Generic amplification from the ``remove`` PLD (a dominating pair (P, Q)): "remove"
        becomes ((1 - q) Q + q P, Q) and "add" (Q, (1 - q) Q + q P) (Zhu, Dong and Wang 2022,
        Theorem 8). The grid atoms are mapped exactly and split onto the result's grid. For
        Gaussian and Laplace noise ``PLD.from_gaussian`` / ``from_laplace`` with
        ``sampling_rate`` are more accurate (they discretize the subsampled pair directly).
        """
        q = check.unit_interval("sampling_rate", sampling_rate, include_one=True)
        if self._neighbouring is not Neighbouring.ADD_REMOVE:
            raise UserError(
                "Poisson subsampling amplifies under add/remove neighbouring; this PLD is "
                f"stated under {self._neighbouring}"
            )
        base = _pmf_atoms(self._remove)
        h = (
            self.interval
            if value_discretization_interval is None
            else _check_interval(value_discretization_interval)
        )
        return _subsampled_from_atoms(base, q, h)

    # ---- mechanism profiles

    @classmethod
    def from_gaussian(
        cls,
        standard_deviation: float,
        *,
        sensitivity: float = 1.0,
        sampling_rate: float = 1.0,
        neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
        value_discretization_interval: float | None = None,
        tail_mass_truncation: float = DEFAULT_TAIL_MASS_TRUNCATION,
    ) -> PLD:
        """Gaussian noise N(0, standard_deviation^2) on a query of L2 ``sensitivity``.

        Without sampling the PLD is N(mu, 2 mu) with mu = sensitivity^2 / (2 sigma^2), the same
        in both orders (Balle and Wang, "Improving the Gaussian mechanism for differential
        privacy", ICML 2018). With Poisson ``sampling_rate`` q < 1 (add/remove only) the pairs
        are the mixtures ((1 - q) N(0) + q N(s), N(0)) for remove and the reverse roles for
        add (Zhu, Dong and Wang 2022, Theorem 8; Mironov, Talwar and Zhang 2019). Discretized
        by connect the dots (Doroshenko et al. 2022).
        """
        sigma = check.positive("standard_deviation", standard_deviation)
        s = check.positive("sensitivity", sensitivity)
        q = check.unit_interval("sampling_rate", sampling_rate, include_one=True)
        _check_poisson_relation(q, neighbouring)
        source = _noise_source(sigma / s, q, gaussian=True)
        return _build_source(
            source, neighbouring, value_discretization_interval, tail_mass_truncation
        )

    @classmethod
    def from_laplace(
        cls,
        scale: float,
        *,
        sensitivity: float = 1.0,
        sampling_rate: float = 1.0,
        neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
        value_discretization_interval: float | None = None,
        tail_mass_truncation: float = DEFAULT_TAIL_MASS_TRUNCATION,
    ) -> PLD:
        """Laplace noise of ``scale`` b on a query of L1 ``sensitivity`` s (epsilon = s / b).

        The loss is s / b w.p. 1/2, -s / b w.p. e^(-s/b) / 2 and continuous in between (Koskela
        et al. 2020); with Poisson ``sampling_rate`` the mixture pairs as for the Gaussian.
        """
        b = check.positive("scale", scale)
        s = check.positive("sensitivity", sensitivity)
        q = check.unit_interval("sampling_rate", sampling_rate, include_one=True)
        _check_poisson_relation(q, neighbouring)
        source = _noise_source(b / s, q, gaussian=False)
        return _build_source(
            source, neighbouring, value_discretization_interval, tail_mass_truncation
        )

    @classmethod
    def from_gaussian_without_replacement(
        cls,
        standard_deviation: float,
        *,
        sample_size: int,
        population_size: int,
        sensitivity: float = 1.0,
        value_discretization_interval: float | None = None,
        tail_mass_truncation: float = DEFAULT_TAIL_MASS_TRUNCATION,
    ) -> PLD:
        """Gaussian noise on a uniform sample of ``sample_size`` of ``population_size`` units.

        Relation: replace one unit; ``sensitivity`` is the replace-one L2 sensitivity (2C for
        sums of vectors clipped to norm C). With gamma = m / n, the pair of neighbours gives
        P = (1 - g) A + g B, Q = (1 - g) A + g B' where A is the output on samples without the
        replaced unit and B, B' on samples with it; every two of A, B, B' are outputs on replace
        neighbours. Balle, Barthe and Gaboardi's advanced joint convexity ("Privacy
        amplification by subsampling", NeurIPS 2018, Theorem 2) and convexity of the hockey
        stick give H_(1 + g(a - 1))(P || Q) <= g H_a(N(s) || N(0)) for a >= 1, which is exactly
        the curve of the Poisson "remove" pair ((1 - g) N(0) + g N(s), N(0)) for eps >= 0. The
        same holds for the swapped pair, so the symmetric PLD agreeing with that curve for
        eps >= 0 dominates both orders (this is the symmetrized trade-off function
        C_g(f) = min{f_g, f_g^-1}** of Dong, Roth and Su, "Gaussian differential privacy",
        JRSS-B 2022, Theorem 4.2; Zhu, Dong and Wang 2022, Section 5).
        """
        sigma = check.positive("standard_deviation", standard_deviation)
        s = check.positive("sensitivity", sensitivity)
        gamma = _sampling_fraction(sample_size, population_size)
        source = _noise_source(sigma / s, gamma, gaussian=True, symmetrize=True)
        return _build_source(
            source, Neighbouring.REPLACE, value_discretization_interval, tail_mass_truncation
        )

    @classmethod
    def from_discrete_laplace(
        cls,
        scale: float,
        *,
        sensitivity: int = 1,
        neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
        value_discretization_interval: float | None = None,
    ) -> PLD:
        """Discrete Laplace noise P[z] prop. to exp(-|z| / scale) on an integer query: exact.

        The loss takes the k + 1 values (k - 2z) / scale, z = 0..k (k the sensitivity); by
        default the grid interval is 1 / scale, on which they lie exactly.
        """
        b = check.positive("scale", scale)
        k = _check_sensitivity_int(sensitivity)
        return _build_source(
            srcs.AtomSource(prof.discrete_laplace_atoms(b, k)),
            neighbouring,
            value_discretization_interval,
            0.0,
        )

    @classmethod
    def from_discrete_gaussian(
        cls,
        sigma: float,
        *,
        sensitivity: int = 1,
        neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
        value_discretization_interval: float | None = None,
        tail_mass_truncation: float = DEFAULT_TAIL_MASS_TRUNCATION,
    ) -> PLD:
        """Discrete Gaussian noise N_Z(0, sigma^2) on an integer query, by exact pmf sums.

        Loss (k^2 - 2kz) / (2 sigma^2) at z ~ N_Z(0, sigma^2) (Canonne, Kamath and Steinke
        2020); the pmf is summed exactly over |z| <= Z and the tails beyond are bounded and
        moved up (see ``_pld_profiles.discrete_gaussian_atoms``). Supported while the sum has
        at most about a million terms (sigma / k up to about 6e4); beyond, ``pld_epsilon`` and
        ``account`` fall back to the Renyi bound.
        """
        sig = check.positive("sigma", sigma)
        k = _check_sensitivity_int(sensitivity)
        tail = _check_tail(tail_mass_truncation)
        atoms = prof.discrete_gaussian_atoms(sig, k, max(tail, 1e-300))
        return _build_source(
            srcs.AtomSource(atoms), neighbouring, value_discretization_interval, tail
        )

    @classmethod
    def from_randomized_response(
        cls,
        truth_probability: float,
        *,
        categories: int = 2,
        neighbouring: Neighbouring = Neighbouring.REPLACE,
        value_discretization_interval: float | None = None,
    ) -> PLD:
        """k-ary randomized response (true category w.p. p, each other w.p. (1-p)/(k-1)).

        Exact: three atoms, +-ln(p (k - 1) / (1 - p)) and 0; by default the grid interval is
        that epsilon, so compositions are exact (binomial / multinomial).
        """
        if isinstance(categories, bool) or not isinstance(categories, int) or categories < 2:
            raise UserError(f"categories must be an integer >= 2, got {categories!r}")
        p = check.real("truth_probability", truth_probability)
        if not 1.0 / categories < p < 1.0:
            raise UserError(
                f"truth_probability must lie in (1/k, 1) = ({1 / categories:g}, 1), got {p!r}"
            )
        atoms = prof.randomized_response_atoms(p, categories)
        return _build_source(
            srcs.AtomSource(atoms), neighbouring, value_discretization_interval, 0.0
        )

    @classmethod
    def from_pure_dp(
        cls,
        epsilon: float,
        *,
        neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
        value_discretization_interval: float | None = None,
    ) -> PLD:
        """Any epsilon-DP mechanism: the tight PLD is randomized response (loss +-epsilon)."""
        eps = check.positive("epsilon", epsilon)
        return _build_source(
            srcs.AtomSource(prof.approx_dp_atoms(eps, 0.0)),
            neighbouring,
            value_discretization_interval,
            0.0,
        )

    @classmethod
    def from_approx_dp(
        cls,
        epsilon: float,
        delta: float,
        *,
        neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
        value_discretization_interval: float | None = None,
    ) -> PLD:
        """Any (epsilon, delta)-DP mechanism known only by its guarantee: the tight PLD.

        Loss +inf w.p. delta, +-epsilon w.p. (1 - delta) e^(+-eps) / (1 + e^eps) (Kairouz, Oh
        and Viswanath 2015; a dominating pair in the sense of Zhu, Dong and Wang 2022).
        """
        eps = check.nonnegative("epsilon", epsilon)
        d = check.unit_interval("delta", delta, include_zero=True)
        if eps == 0.0 and d == 0.0:
            raise UserError("epsilon and delta cannot both be 0")
        return _build_source(
            srcs.AtomSource(prof.approx_dp_atoms(eps, d)),
            neighbouring,
            value_discretization_interval,
            0.0,
        )


def _check_poisson_relation(q: float, neighbouring: Neighbouring) -> None:
    if not isinstance(neighbouring, Neighbouring):
        raise UserTypeError(f"neighbouring must be a Neighbouring, got {neighbouring!r}")
    if q < 1.0 and neighbouring is not Neighbouring.ADD_REMOVE:
        raise UserError(
            "Poisson sampling_rate < 1 is supported under add/remove neighbouring only; for "
            "replace-one use sampling without replacement (from_gaussian_without_replacement)"
        )


def _sampling_fraction(sample_size: object, population_size: object) -> float:
    for name, value in (("sample_size", sample_size), ("population_size", population_size)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise UserError(f"{name} must be a positive integer, got {value!r}")
    assert isinstance(sample_size, int | np.integer)
    assert isinstance(population_size, int | np.integer)
    if sample_size > population_size:
        raise UserError(
            f"sample_size must be <= population_size, got {sample_size} of {population_size}"
        )
    return float(sample_size) / float(population_size)


# --------------------------------------------------------------------------- sources


def _build_source(
    source: srcs.Source,
    neighbouring: Neighbouring,
    value_discretization_interval: float | None,
    tail_mass_truncation: float,
) -> PLD:
    if not isinstance(neighbouring, Neighbouring):
        raise UserTypeError(f"neighbouring must be a Neighbouring, got {neighbouring!r}")
    tail = _check_tail(tail_mass_truncation)
    if value_discretization_interval is None:
        h, _ = srcs.auto_interval([source.scale(tail)])
    else:
        h = _check_interval(value_discretization_interval)
    return _pld_from_source(source, h, tail, None, neighbouring)


def _pld_from_source(
    source: srcs.Source,
    h: float,
    tail: float,
    direction: prof.Direction | None,
    neighbouring: Neighbouring,
) -> PLD:
    remove, add = source.build(h, tail, direction)
    return PLD(
        PrivacyLossPmf._from_raw(remove, h),
        None if add is None else PrivacyLossPmf._from_raw(add, h),
        neighbouring=neighbouring,
    )


def _pmf_atoms(pmf: PrivacyLossPmf) -> prof.Atoms:
    keep = pmf.probs > 0
    return prof.Atoms(pmf.losses[keep], pmf.probs[keep], pmf.infinity_mass, None)


def _subsampled_from_atoms(base: prof.Atoms, q: float, h: float) -> PLD:
    if q == 1.0:
        raw = core.atoms_to_grid(base.losses, base.masses, h, base.infinity_mass)
        return PLD(PrivacyLossPmf._from_raw(raw, h))
    source = srcs.AtomSource(
        prof.subsample_atoms(base, q, "remove"), prof.subsample_atoms(base, q, "add")
    )
    return _pld_from_source(source, h, 0.0, None, Neighbouring.ADD_REMOVE)


# --------------------------------------------------------------------------- events


_Analysis = tuple[Neighbouring | None, list[srcs.Scale]]


@functools.singledispatch
def _analyse(event: DpEvent, multiplicity: int, cache: dict[DpEvent, srcs.Source]) -> _Analysis:
    """Check an event tree (before anything is computed) and collect its building blocks."""
    raise UnsupportedEventError(
        f"the PLD accountant does not support {type(event).__name__}; supported: Gaussian, "
        "Laplace, discrete Laplace, discrete Gaussian, randomized response, pure and approximate "
        "DP events, their compositions, Poisson sampling (add/remove) and sampling without "
        "replacement (replace)"
    )


@_analyse.register
def _(event: ZCDPEvent, multiplicity: int, cache: dict[DpEvent, srcs.Source]) -> _Analysis:
    raise UnsupportedEventError(
        "a zCDP guarantee does not determine a privacy loss distribution; account ZCDPEvent "
        "with the RDP/zCDP accountant (or convert it to (epsilon, delta) first)"
    )


# Noise scales outside this range are accounted at its ends. Above it, as noise of scale 1e100:
# a Gaussian's or a Laplace's curve delta(eps) only grows as the scale falls, so that is an upper
# bound (and squaring 1e300 would overflow). Below it, as no noise at all (the unit's presence
# is revealed: loss +infinity), which dominates any additive noise, a post-processing of the
# exact answer (and 1 / 1e-300^2 would overflow).
_NOISE_SCALES = (1e-100, 1e100)


def _additive_source(noise_scale: float, gaussian: bool) -> srcs.Source:
    scale = min(float(noise_scale), _NOISE_SCALES[1])
    if scale < _NOISE_SCALES[0]:
        return srcs.AtomSource(prof.approx_dp_atoms(0.0, 1.0))
    noise = prof.GaussianNoise(scale) if gaussian else prof.LaplaceNoise(scale)
    return srcs.MixtureSource(noise, 1.0)


def _noise_source(
    noise_scale: float, q: float, *, gaussian: bool, symmetrize: bool = False
) -> srcs.Source:
    """``_additive_source`` sampled at rate q (Poisson, or symmetrized without replacement)."""
    base = _additive_source(noise_scale, gaussian)
    if isinstance(base, srcs.MixtureSource):
        return srcs.MixtureSource(base.noise, q, symmetrize=symmetrize)
    if q == 1.0:
        return base
    atoms = base.remove_atoms
    if symmetrize:
        return srcs.AtomSource(prof.subsample_atoms(atoms, q, "remove"), symmetrize=True)
    return srcs.AtomSource(
        prof.subsample_atoms(atoms, q, "remove"), prof.subsample_atoms(atoms, q, "add")
    )


def _leaf_source(event: DpEvent) -> srcs.Source | None:
    match event:
        case GaussianEvent(noise_multiplier=sigma):
            return _additive_source(sigma, gaussian=True)
        case LaplaceEvent(noise_multiplier=b):
            return _additive_source(b, gaussian=False)
        case DiscreteLaplaceEvent(scale=b, sensitivity=k):
            return srcs.AtomSource(prof.discrete_laplace_atoms(float(b), int(k)))
        case DiscreteGaussianEvent(sigma=sigma, sensitivity=k):
            if sigma < _NOISE_SCALES[0]:  # no noise (sigma^2 would underflow)
                return srcs.AtomSource(prof.approx_dp_atoms(0.0, 1.0))
            return srcs.AtomSource(prof.discrete_gaussian_atoms(float(sigma), int(k), 1e-16))
        case RandomizedResponseEvent(truth_probability=p, categories=k):
            return srcs.AtomSource(prof.randomized_response_atoms(float(p), int(k)))
        case PureDPEvent(epsilon=eps):
            return srcs.AtomSource(prof.approx_dp_atoms(float(eps), 0.0))
        case ApproxDPEvent(epsilon=eps, delta=d):
            if eps == 0 and d == 0:
                return srcs.AtomSource(prof.Atoms(np.array([0.0]), np.array([1.0]), 0.0, None))
            return srcs.AtomSource(prof.approx_dp_atoms(float(eps), float(d)))
        case NameAndShameEvent(delta=d):  # loss 0 w.p. 1 - d, +inf w.p. d: exactly these atoms
            return srcs.AtomSource(prof.approx_dp_atoms(0.0, float(d)))
    return None


def _leaf_analysis(
    event: DpEvent, multiplicity: int, cache: dict[DpEvent, srcs.Source]
) -> _Analysis:
    source = _leaf_source(event)
    assert source is not None
    cache[event] = source
    relation = event.neighbouring if isinstance(event, RandomizedResponseEvent) else None
    scale = source.scale(DEFAULT_TAIL_MASS_TRUNCATION)
    return relation, [
        srcs.Scale(scale.sd, scale.width, scale.spacing, multiplicity, scale.anchor, source)
    ]


for _leaf_type in (
    GaussianEvent,
    LaplaceEvent,
    DiscreteLaplaceEvent,
    DiscreteGaussianEvent,
    RandomizedResponseEvent,
    PureDPEvent,
    ApproxDPEvent,
    NameAndShameEvent,
):
    _analyse.register(_leaf_type, _leaf_analysis)


def _merge_relations(relations: list[Neighbouring | None]) -> Neighbouring | None:
    named = {r for r in relations if r is not None}
    if len(named) > 1:
        raise UnsupportedEventError(
            "the composed events are stated under different neighbouring relations "
            f"({', '.join(sorted(str(r) for r in named))}); account them separately"
        )
    return named.pop() if named else None


@_analyse.register
def _(event: ComposedEvent, multiplicity: int, cache: dict[DpEvent, srcs.Source]) -> _Analysis:
    if not event.events:
        raise UnsupportedEventError("ComposedEvent with no events has no PLD")
    relations: list[Neighbouring | None] = []
    scales: list[srcs.Scale] = []
    for child, count in Counter(event.events).items():
        rel, sc = _analyse(child, multiplicity * count, cache)
        relations.append(rel)
        scales.extend(sc)
    return _merge_relations(relations), scales


@_analyse.register
def _(event: SelfComposedEvent, multiplicity: int, cache: dict[DpEvent, srcs.Source]) -> _Analysis:
    return _analyse(event.event, multiplicity * event.count, cache)


@_analyse.register
def _(
    event: PoissonSampledEvent, multiplicity: int, cache: dict[DpEvent, srcs.Source]
) -> _Analysis:
    q = float(event.sampling_rate)
    inner = event.event
    source: srcs.Source
    noise = _leaf_source(inner) if isinstance(inner, GaussianEvent | LaplaceEvent) else None
    if isinstance(noise, srcs.MixtureSource):
        # the exact mixture; the unsampled noise needs no analysis (nor its grid scale) of its own
        source = srcs.MixtureSource(noise.noise, q)
        cache[event] = source
        sc = source.scale(DEFAULT_TAIL_MASS_TRUNCATION)
        return Neighbouring.ADD_REMOVE, [
            srcs.Scale(sc.sd, sc.width, None, multiplicity, sc.anchor, source)
        ]
    rel, scales = _analyse(inner, 1, cache)
    if rel is Neighbouring.REPLACE:
        raise UnsupportedEventError(
            "Poisson sampling is accounted under add/remove neighbouring, but the sampled event "
            "is stated under replace-one"
        )
    base = cache.get(inner)
    if isinstance(base, srcs.AtomSource) and base.symmetric:
        source = srcs.AtomSource(
            prof.subsample_atoms(base.remove_atoms, q, "remove"),
            prof.subsample_atoms(base.remove_atoms, q, "add"),
        )
        cache[event] = source
        sc = source.scale(DEFAULT_TAIL_MASS_TRUNCATION)
        return Neighbouring.ADD_REMOVE, [
            srcs.Scale(sc.sd, sc.width, None, multiplicity, sc.anchor, source)
        ]
    # a composite inner event: amplified from its built PLD (rough scale: q times its own)
    return Neighbouring.ADD_REMOVE, [
        srcs.Scale(q * s.sd, s.width, None, s.multiplicity * multiplicity) for s in scales
    ]


@_analyse.register
def _(
    event: SampledWithoutReplacementEvent, multiplicity: int, cache: dict[DpEvent, srcs.Source]
) -> _Analysis:
    gamma = float(event.sample_size) / float(event.population_size)
    inner = event.event
    rel, _ = _analyse(inner, 1, cache)
    if rel is Neighbouring.ADD_REMOVE:
        raise UnsupportedEventError(
            "sampling without replacement is accounted under replace-one neighbouring, but the "
            "sampled event is stated under add/remove"
        )
    base = cache.get(inner)
    source: srcs.Source
    if isinstance(base, srcs.MixtureSource) and base.q == 1.0:
        source = srcs.MixtureSource(base.noise, gamma, symmetrize=True)
    elif isinstance(base, srcs.AtomSource) and base.symmetric:
        source = srcs.AtomSource(
            prof.subsample_atoms(base.remove_atoms, gamma, "remove"), symmetrize=True
        )
    else:
        raise UnsupportedEventError(
            "sampling without replacement is supported for a single Gaussian, Laplace, discrete "
            f"or (epsilon, delta) mechanism, not for {type(inner).__name__}"
        )
    cache[event] = source
    sc = source.scale(DEFAULT_TAIL_MASS_TRUNCATION)
    return Neighbouring.REPLACE, [
        srcs.Scale(sc.sd, sc.width, None, multiplicity, sc.anchor, source)
    ]


@dataclass(frozen=True, slots=True)
class _Context:
    interval: float
    tail: float
    neighbouring: Neighbouring
    cache: dict[DpEvent, srcs.Source]
    direction: prof.Direction | None = None  # build only this order (a "symmetric" PLD)
    composition_tail: float | None = None  # truncation after compositions (default: tail)

    @property
    def window_tail(self) -> float:
        return self.tail if self.composition_tail is None else self.composition_tail


def _build_event(event: DpEvent, ctx: _Context) -> PLD:
    source = ctx.cache.get(event)
    if source is not None:
        return _pld_from_source(source, ctx.interval, ctx.tail, ctx.direction, ctx.neighbouring)
    return _build_composite(event, ctx)


@functools.singledispatch
def _build_composite(event: DpEvent, ctx: _Context) -> PLD:  # pragma: no cover - analysed first
    raise UnsupportedEventError(f"internal error: no PLD builder for {type(event).__name__}")


@_build_composite.register
def _(event: ComposedEvent, ctx: _Context) -> PLD:
    result: PLD | None = None
    for child, count in Counter(event.events).items():
        part = _build_event(child, ctx)
        if count > 1:
            part = part.self_compose(count, tail_mass_truncation=ctx.window_tail)
        result = (
            part if result is None else result.compose(part, tail_mass_truncation=ctx.window_tail)
        )
    assert result is not None
    return result


@_build_composite.register
def _(event: SelfComposedEvent, ctx: _Context) -> PLD:
    inner = _build_event(event.event, ctx)
    return inner.self_compose(event.count, tail_mass_truncation=ctx.window_tail)


@_build_composite.register
def _(event: PoissonSampledEvent, ctx: _Context) -> PLD:
    inner = _build_event(event.event, dataclasses.replace(ctx, direction=None))
    out = _subsampled_from_atoms(_pmf_atoms(inner.remove), float(event.sampling_rate), ctx.interval)
    if ctx.direction is None:
        return out
    return PLD(out.remove if ctx.direction == "remove" else out.add, neighbouring=ctx.neighbouring)


def _prepare(
    event: DpEvent, neighbouring: Neighbouring | None
) -> tuple[Neighbouring, list[srcs.Scale], dict[DpEvent, srcs.Source]]:
    if not isinstance(event, DpEvent):
        raise UserTypeError(f"event must be a DpEvent, got {type(event).__name__}")
    cache: dict[DpEvent, srcs.Source] = {}
    relation, scales = _analyse(event, 1, cache)
    if neighbouring is not None:
        if not isinstance(neighbouring, Neighbouring):
            raise UserTypeError(f"neighbouring must be a Neighbouring, got {neighbouring!r}")
        if relation is not None and relation is not neighbouring:
            raise UnsupportedEventError(f"the event is stated under {relation}, not {neighbouring}")
        relation = neighbouring
    return relation or Neighbouring.ADD_REMOVE, scales, cache


def pld_from_event(
    event: DpEvent,
    *,
    neighbouring: Neighbouring | None = None,
    value_discretization_interval: float | None = None,
    tail_mass_truncation: float = DEFAULT_TAIL_MASS_TRUNCATION,
) -> PLD:
    """The PLD of everything an event records, under its neighbouring relation.

    Gaussian, Laplace (continuous, by connect the dots), discrete Laplace, discrete Gaussian,
    randomized response, pure and approximate DP, name-and-shame (exact atoms), compositions
    (FFT), Poisson sampling (add/remove; exact mixtures for Gaussian and Laplace, generic
    amplification otherwise) and sampling without replacement (replace one). ``ZCDPEvent`` and
    mixed relations raise ``UnsupportedEventError`` (a ``ValueError``) before anything is
    computed.

    ``neighbouring`` defaults to the event's own relation (add/remove when it states none).
    ``value_discretization_interval`` defaults to an automatic choice: the exact atom spacing
    where every block has one, else a twentieth of the smallest single-step loss standard
    deviation.
    """
    relation, scales, cache = _prepare(event, neighbouring)
    tail = _check_tail(tail_mass_truncation)
    if value_discretization_interval is None:
        h, _ = srcs.auto_interval(scales)
    else:
        h = _check_interval(value_discretization_interval)
    return _build_event(event, _Context(h, tail, relation, cache))


def _count_compositions(event: DpEvent) -> int:
    """How many compose / self_compose operations building the event's PLD performs."""
    match event:
        case SelfComposedEvent(event=inner):
            return 1 + _count_compositions(inner)
        case ComposedEvent(events=children):
            return len(children) + sum(_count_compositions(c) for c in set(children))
        case PoissonSampledEvent(event=inner) | SampledWithoutReplacementEvent(event=inner):
            return _count_compositions(inner)
    return 0


def _unbounded_loss(event: DpEvent) -> bool:
    """Whether the event's privacy loss exceeds every bound with positive probability.

    Gaussian noise (continuous or discrete, sampled or not, on any part of a composition) and
    any (epsilon, delta) guarantee with delta > 0 have no pure-DP epsilon: at delta = 0 their
    epsilon is +infinity, however little mass a computed PLD keeps far out (it may underflow).
    """
    match event:
        case GaussianEvent() | DiscreteGaussianEvent():
            return True
        case ApproxDPEvent(delta=d) | NameAndShameEvent(delta=d):
            return d > 0
        case ComposedEvent(events=children):
            return any(_unbounded_loss(c) for c in children)
        case (
            SelfComposedEvent(event=inner)
            | PoissonSampledEvent(event=inner)
            | SampledWithoutReplacementEvent(event=inner)
        ):
            return _unbounded_loss(inner)
    return False


#: How many times ``pld_epsilon`` doubles the interval of a grid that does not fit
#: ``MAX_GRID_POINTS``.
_WIDENINGS = 10


def pld_epsilon(
    event: DpEvent,
    delta: float,
    *,
    neighbouring: Neighbouring | None = None,
    relative_tolerance: float = 1e-3,
    tail_mass_truncation: float | None = None,
) -> float:
    """epsilon of an event at ``delta``, refining the grid until the estimate is tight.

    Every PLD built here is pessimistic, so each grid gives an upper bound on the true
    epsilon; the smallest bound found is returned. The discretization error shrinks like h^2
    (connect the dots). It is predicted from how the grid inflates the mean and variance of a
    single step (``srcs.predicted_error``), or, for blocks that are compositions themselves, from
    the bounds eps(2h) and eps(h) (the error of eps(h) is about (eps(2h) - eps(h)) / 3); the
    grid is refined until the prediction is below ``relative_tolerance`` * eps. Exact grids
    (atoms) need one pass.
    ``tail_mass_truncation`` defaults to 1e-4 delta / (steps + 2) (at most 1e-9): all
    truncations together then add at most about 1e-4 delta to delta.

    Soundness for every input: the result is an upper bound on the true epsilon, or +inf.
    Losses a grid cannot hold (single-step losses above ``MAX_FINITE_LOSS`` = 500, as for a
    Gaussian with sigma below about 0.03) and mass cut from a window go to +infinity, so such
    events come out as +inf (``account`` then reports a sound fallback: the analytic Gaussian
    curve or the Renyi bound). At delta = 0 an event with unbounded loss (any Gaussian, any
    delta > 0 guarantee) gives +inf. A grid that would exceed ``MAX_GRID_POINTS`` is widened
    (its interval doubled, up to 2^10 times; beyond, ``ValueError``).

    Cost: every grid and FFT window holds at most ``MAX_GRID_POINTS`` (2^22) points and at
    most a handful of grids are built, so one call takes at most about 200 MiB of working
    memory and a few seconds (measured: under a second for every noise multiplier from 1e-6
    to 1e6, sampling rate from 1e-6 to 1 and count up to 10^9), whatever the noise, sampling
    rate or count; an event made of many *distinct* blocks costs one composition per block.
    """
    delta = check.unit_interval("delta", delta, include_zero=True)
    rel = check.positive("relative_tolerance", relative_tolerance)
    relation, scales, cache = _prepare(event, neighbouring)
    if delta == 0.0 and _unbounded_loss(event):
        return math.inf
    steps = sum(s.multiplicity for s in scales)
    if tail_mass_truncation is None:
        # Every truncation moves at most its tail mass up, adding at most that to delta: the
        # single steps' truncations count once per step, those after compositions once each.
        tail = min(1e-9, 1e-4 * delta / (steps + 2)) if delta > 0 else 1e-300
        operations = _count_compositions(event)
        window = min(1e-9, 1e-4 * delta / (operations + 2)) if delta > 0 else 1e-300
    else:
        tail = window = _check_tail(tail_mass_truncation)
    h, exact = srcs.auto_interval(scales)

    def build(interval: float, direction: prof.Direction | None = None) -> PLD:
        ctx = _Context(interval, tail, relation, cache, direction, window)
        return _build_event(event, ctx)

    for widening in range(_WIDENINGS + 1):
        try:
            pld = build(h)
            break
        except core.GridTooLargeError:  # the grid would exceed MAX_GRID_POINTS: widen it
            if widening == _WIDENINGS:
                raise
            h *= 2.0
            exact = False
    eps_by_direction = {"remove": pld.remove.epsilon(delta), "add": pld.add.epsilon(delta)}
    fine = max(eps_by_direction.values())
    if exact or fine == 0.0 or not math.isfinite(fine):  # 0: no finer grid can do better
        return fine
    best = fine
    predicted = srcs.predicted_error(scales, h, tail, eps_by_direction, rel * max(best, 1e-9))
    if predicted is not None:
        for _ in range(4):
            if predicted <= rel * max(best, 1e-9):
                return best
            h *= max(0.25, min(0.7, 0.8 * math.sqrt(rel * max(best, 1e-9) / predicted)))
            try:
                pld = build(h)
            except ValueError:  # the grid would exceed MAX_GRID_POINTS: keep the best so far
                return best
            eps_by_direction = {"remove": pld.remove.epsilon(delta), "add": pld.add.epsilon(delta)}
            best = min(best, max(eps_by_direction.values()))
            predicted = srcs.predicted_error(
                scales, h, tail, eps_by_direction, rel * max(best, 1e-9)
            )
            assert predicted is not None
        return best
    # Richardson check on the order that decides epsilon (the other one only bounds less)
    worst: prof.Direction = "remove" if eps_by_direction["remove"] >= fine else "add"
    fine_worst = fine
    coarse_worst = build(2.0 * h, worst).epsilon(delta)
    ratio = 2.0
    for _ in range(4):
        # eps(h) - eps_true ~ c h^2, so eps(ratio h) - eps(h) ~ (ratio^2 - 1) (eps(h) - eps_true)
        error = max(coarse_worst - fine_worst, 0.0) / (ratio * ratio - 1.0)
        if error <= rel * max(best, 1e-9):
            break
        factor = max(0.25, min(0.5, 0.8 * math.sqrt(rel * max(best, 1e-9) / error)))
        h *= factor
        try:
            pld = build(h)
        except ValueError:  # the grid would exceed MAX_GRID_POINTS: keep the best so far
            break
        coarse_worst, ratio = fine_worst, 1.0 / factor
        fine_worst = (pld.remove if worst == "remove" else pld.add).epsilon(delta)
        best = min(best, pld.epsilon(delta))
    return best
