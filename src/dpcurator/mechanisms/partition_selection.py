"""Private partition selection: which group keys may be released when the keys are private.

When the set of group keys (the partitions) is not public, releasing every key that occurs in
the data reveals the rare ones: a category that a single person created ("Escargots" in the
references' food survey) would appear only when that person is in the data. A partition
selection mechanism releases each key with a probability that depends only on how many
privacy units contribute to it, so that a key backed by one unit appears with probability at
most delta.

Three mechanisms, and a chooser:

- ``OptimalPartitionSelection``: the optimal per-partition rule of Desfontaines, Voss, Gipson
  and Mandayam, "Differentially private partition selection" (PoPETs 2022, Theorem 1 and
  Section 3.3). A partition backed by n units is kept with probability pi(n), where pi is the
  largest function allowed by (epsilon', delta')-DP for a count with sensitivity one:
  pi(0) = 0 and pi(n) = min(e^eps' pi(n-1) + delta', 1 - e^-eps' (1 - pi(n-1) - delta'), 1).
- ``GaussianThresholdPartitionSelection``: add Gaussian noise to the unit counts of all
  partitions (L2 sensitivity sqrt(k)) and keep the partitions above a threshold tau chosen so
  that a partition backed by one unit passes with small probability (Wilson, Zhang, Lam,
  Desfontaines, Simmons-Marengo and Gipson, "Differentially private SQL with bounded user
  contribution", PoPETs 2020, Section 4, with the Gaussian mechanism in place of Laplace).
  It wins over the optimal per-partition rule when units contribute to many partitions,
  because its noise grows as sqrt(k) instead of k.
- ``choose_partition_selection(epsilon, delta, max_partitions)`` builds both and returns the
  one that needs fewer units for a partition to be kept with probability 1/2.
- ``CountThreshold``: no separate selection step at all. When the query releases a count of
  rows or of units per partition anyway, that noisy count (discrete Laplace or discrete
  Gaussian, with its full share of the budget) is itself thresholded: a partition is released
  when its noisy count reaches tau, so selection costs only delta (Wilson et al. 2020,
  Section 4; OpenDP's ``make_laplace_threshold`` / ``make_gaussian_threshold``; see the class).

Neighbouring relation: add/remove one privacy unit, who contributes to at most
``max_partitions`` (k) partitions (the caller enforces this cap before counting units; a
partition's count is its number of distinct units). With k > 1, the optimal rule runs each
partition at (eps / k, delta_k) with delta_k = 1 - (1 - delta)^(1/k): the k partitions a unit
touches are independent, and the k-fold composition of (eps', delta')-DP mechanisms is
(k eps', 1 - (1 - delta')^k)-DP (Kairouz, Oh and Viswanath, "The composition theorem for
differential privacy", ICML 2015, Theorem 3.3 with i = 0).

Exactness: the keep probabilities are computed in 60-digit arithmetic for slightly smaller
(eps, delta) than stated (relative slack 1e-9 and 1e-6), rounded down to multiples of
2^-120, and then *checked* against the stated (eps', delta') constraints in exact rational
arithmetic for every n (an InternalError if any fails, which would be a bug); each keep
decision is an exact Bernoulli draw of that rational.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Any

import mpmath
import numpy as np
import numpy.typing as npt

from dpcurator.accounting import ApproxDP, Neighbouring
from dpcurator.accounting.conversions import zcdp_to_epsilon
from dpcurator.accounting.events import ApproxDPEvent, DpEvent, PureDPEvent, ZCDPEvent
from dpcurator.errors import InternalError, UserError
from dpcurator.mechanisms import _grid
from dpcurator.mechanisms._base import Mechanism, as_finite_array, check_delta, check_positive
from dpcurator.mechanisms._tails import NoiseTails, upper_tail_point
from dpcurator.mechanisms.gaussian import DiscreteGaussian, Gaussian
from dpcurator.mechanisms.laplace import DiscreteLaplace
from dpcurator.noise import RandomSource, sample_bernoulli

__all__ = [
    "CountThreshold",
    "GaussianThresholdPartitionSelection",
    "OptimalPartitionSelection",
    "PartitionSelection",
    "choose_partition_selection",
]

BoolArray = npt.NDArray[np.bool_]

_DIGITS = 60
# The table is built for (1 - _SLACK) eps and (1 - _DELTA_SLACK) delta on a 2^-100 grid, then
# checked exactly at the full ones: the slack (1e-6 delta >= 2^-100) dwarfs the 2^-120 grid.
_SLACK = 1e-9
_DELTA_SLACK = 1e-6
_GRID_BITS = 120


def _check_max_partitions(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise UserError(f"max_partitions must be a positive integer, got {value!r}")
    return int(value)


def _unit_counts(counts: Any) -> npt.NDArray[np.int64]:
    arr = as_finite_array("unit_counts", counts)
    if arr.ndim != 1:
        raise UserError("unit_counts must be a 1-D array (one count per partition)")
    if arr.size and (np.any(arr < 0) or np.any(arr != np.round(arr))):
        raise UserError("unit_counts must hold non-negative integers (units per partition)")
    if arr.size and np.any(arr >= _MAX_COUNT):
        # int64 would wrap such a count to a negative one: a crash, or a partition dropped.
        raise UserError(f"unit_counts must be below 2^63 (the largest is {float(arr.max()):.6g})")
    return arr.astype(np.int64)


_MAX_COUNT = 2**63  # the counts are int64


def per_partition_delta(delta: float, max_partitions: int) -> float:
    """delta_k = 1 - (1 - delta)^(1/k), rounded down, so k independent ones compose to delta."""
    value = -math.expm1(math.log1p(-delta) / max_partitions)
    return value * (1 - 1e-12)


class PartitionSelection(Mechanism):
    """What partition selection mechanisms share: (epsilon, delta), k, and keep decisions."""

    def __init__(self, *, epsilon: float, delta: float, max_partitions: int = 1,
                 neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
                 source: RandomSource | None = None) -> None:
        super().__init__(neighbouring=neighbouring, source=source)
        if neighbouring is not Neighbouring.ADD_REMOVE:
            raise UserError("partition selection is stated for add/remove neighbouring only")
        self.epsilon = check_positive("epsilon", epsilon)
        self.delta = check_delta(delta)
        self.max_partitions = _check_max_partitions(max_partitions)

    @property
    def guarantee(self) -> ApproxDP:
        """(epsilon, delta)-DP for the set of kept partitions, add/remove one unit."""
        return ApproxDP(self.epsilon, self.delta, self.neighbouring)

    def release(self, x: Any) -> BoolArray:
        """Keep decisions, one per partition, from each partition's number of distinct units."""
        return self.keep(_unit_counts(x))

    def keep(self, unit_counts: npt.NDArray[np.int64]) -> BoolArray:
        raise NotImplementedError

    def keep_probability(self, n: int) -> float:
        """P[a partition backed by n units is kept] (exact for the optimal rule)."""
        raise NotImplementedError

    def units_for_half(self) -> int:
        """The fewest units a partition needs to be kept with probability >= 1/2."""
        lo, hi = 0, 1
        while self.keep_probability(hi) < 0.5:
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.keep_probability(mid) >= 0.5:
                hi = mid
            else:
                lo = mid
        return hi


#: The optimal rule's table is built one exact step per unit (about 20 us each); where it
#: would be longer than this, ``choose_partition_selection`` takes Gaussian thresholding.
OPTIMAL_TABLE_LIMIT = 50_000


def optimal_table_length(epsilon: float, delta: float) -> float:
    """About how many units the optimal rule's keep probability takes to reach 1 at the
    per-partition (epsilon, delta): 2 ln(1 / delta) / epsilon, an overestimate (it rises
    geometrically by e^epsilon from delta to 1/2, and falls as fast to 1)."""
    return 2.0 * math.log(1.0 / delta) / epsilon + 2.0


@functools.lru_cache(maxsize=128)
def _optimal_table(epsilon: float, delta: float) -> tuple[Fraction, ...]:
    """pi(0), ..., pi(N) with pi(N) = 1, as dyadic rationals (2^-120 grid), checked exactly."""
    if delta < 2.0**-80:
        raise UserError("delta must be at least 2^-80 for partition selection")
    if optimal_table_length(epsilon, delta) > 20_000_000:  # refused at once, not after hours
        raise UserError("epsilon per partition is too small: the keep probability "
                        "needs more than ten million units to reach 1")
    ctx = mpmath.MPContext()
    ctx.dps = _DIGITS
    eps = ctx.mpf(epsilon) * (1 - ctx.mpf(_SLACK))
    dlt = ctx.mpf(delta) * (1 - ctx.mpf(_DELTA_SLACK))
    up, down = ctx.exp(eps), ctx.exp(-eps)
    grid = 1 << _GRID_BITS
    table = [Fraction(0)]
    while table[-1] < 1:
        # The recurrence runs on the stored (rounded) values, so each step's two
        # constraints hold for them exactly; the complement 1 - pi is computed directly so
        # that it cannot vanish in rounding when epsilon is large.
        prev = ctx.mpf(table[-1].numerator) / table[-1].denominator
        rise = int(ctx.floor((up * prev + dlt) * grid))
        complement = down * (1 - prev - dlt)
        fall = (min(int(ctx.floor((1 - complement) * grid)), grid - 1) if complement > 0
                else grid)
        table.append(Fraction(max(min(rise, fall, grid), 0), grid))
        if len(table) > 10_000_000:
            raise UserError("epsilon per partition is too small: the keep probability "
                            "needs more than ten million units to reach 1")
    _verify_table(table, epsilon, delta)
    return tuple(table)


def _verify_table(table: list[Fraction], epsilon: float, delta: float) -> None:
    """Check pi(n) <= e^eps pi(n-1) + delta and 1 - pi(n-1) <= e^eps (1 - pi(n)) + delta.

    (The two other constraints hold because pi is non-decreasing.) e^eps is bracketed from
    below by a rational from interval arithmetic, so the check is exact.
    """
    iv = mpmath.MPIntervalContext()
    iv.dps = _DIGITS
    e_interval = iv.exp(iv.mpf(Fraction(epsilon).numerator) / Fraction(epsilon).denominator)
    e_low = _mpf_to_fraction(e_interval.a)
    d = Fraction(delta)
    prev = Fraction(0)
    for cur in table[1:]:
        if cur < prev or cur > e_low * prev + d or 1 - prev > e_low * (1 - cur) + d:
            raise InternalError("partition selection table failed its exact check; "
                                "this is probably a bug")
        prev = cur
    if prev != 1:
        raise InternalError("partition selection table does not reach 1; this is a bug")


def _mpf_to_fraction(value: Any) -> Fraction:
    man, exp = mpmath.mpf(value).man_exp
    return Fraction(int(man)) * Fraction(2) ** int(exp)


class OptimalPartitionSelection(PartitionSelection):
    """Keep a partition of n units with probability pi(n), the optimal (eps', delta') rule.

    Guarantee: (epsilon, delta)-DP for the set of kept partitions under add/remove one privacy
    unit, when each unit contributes to at most ``max_partitions`` partitions and a
    partition's count is its number of distinct units. Source: Desfontaines, Voss, Gipson and
    Mandayam, "Differentially private partition selection", PoPETs 2022 (Theorem 1: pi is the
    pointwise-largest keep function for one partition; Section 3.3: several partitions per
    unit); the per-partition (eps / k, 1 - (1 - delta)^(1/k)) composes to (epsilon, delta) by
    Kairouz, Oh and Viswanath 2015, Theorem 3.3. A partition backed by one unit is kept with
    probability delta_k = 1 - (1 - delta)^(1/k), about delta / k.
    """

    def __init__(self, *, epsilon: float, delta: float, max_partitions: int = 1,
                 neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
                 source: RandomSource | None = None) -> None:
        super().__init__(epsilon=epsilon, delta=delta, max_partitions=max_partitions,
                         neighbouring=neighbouring, source=source)
        eps = self.epsilon / self.max_partitions
        if eps * self.max_partitions > self.epsilon:
            eps = math.nextafter(eps, 0.0)
        self.partition_epsilon = eps
        self.partition_delta = per_partition_delta(self.delta, self.max_partitions)
        self.table = _optimal_table(self.partition_epsilon, self.partition_delta)

    def keep_probability(self, n: int) -> float:
        if n < 0:
            raise UserError("n must be >= 0")
        return float(self.table[n]) if n < len(self.table) else 1.0

    def keep(self, unit_counts: npt.NDArray[np.int64]) -> BoolArray:
        out = np.zeros(unit_counts.shape, dtype=np.bool_)
        capped = np.minimum(unit_counts, len(self.table) - 1)
        for n in np.unique(capped):
            where = capped == n
            p = self.table[int(n)]
            if p >= 1:
                out[where] = True
            elif p > 0:
                out[where] = sample_bernoulli(p, int(where.sum()), self.source)
        return out

    def __repr__(self) -> str:
        return (f"OptimalPartitionSelection(epsilon={self.epsilon!r}, delta={self.delta!r}, "
                f"max_partitions={self.max_partitions!r})")


class GaussianThresholdPartitionSelection(PartitionSelection):
    """Keep a partition when its unit count plus Gaussian noise reaches a threshold tau.

    The noise is the Gaussian mechanism (exact discrete noise on a fine grid) with L2
    sensitivity sqrt(k) at (epsilon, delta / 2); tau is set so that a partition backed by a
    single unit passes with probability at most delta_k = 1 - (1 - delta / 2)^(1/k), using a
    rigorous bound on the noise's tail. Guarantee: (epsilon, delta)-DP under add/remove one
    unit contributing to at most k partitions. Proof sketch (Wilson et al., PoPETs 2020,
    Theorem 3): on partitions present in both neighbours the noisy counts are
    (epsilon, delta / 2)-DP and thresholding is post-processing; a partition only the larger
    dataset has is backed by that one unit, and any of its at most k such partitions passes
    with probability at most 1 - (1 - delta_k)^k = delta / 2.
    """

    def __init__(self, *, epsilon: float, delta: float, max_partitions: int = 1,
                 neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
                 source: RandomSource | None = None) -> None:
        super().__init__(epsilon=epsilon, delta=delta, max_partitions=max_partitions,
                         neighbouring=neighbouring, source=source)
        half = self.delta / 2
        self.noise = Gaussian(epsilon=self.epsilon, delta=half,
                              sensitivity=math.sqrt(self.max_partitions) * (1 + 1e-12),
                              neighbouring=neighbouring, source=source)
        tail = per_partition_delta(half, self.max_partitions)
        # One sigma whatever the number of partitions (the vector calibration): a sigma that
        # depended on how many partitions the data has would itself depend on the data.
        self.sigma = self.noise.noise_sigma(2)
        # P[noise > w] <= tail: the two-sided interval at 2 * tail bounds the upper tail.
        self.threshold = 1.0 + self.noise.accuracy(min(2 * tail, 0.5), size=2)

    def keep_probability(self, n: int) -> float:
        from scipy.stats import norm

        return float(norm.sf(self.threshold - n, scale=float(self.sigma)))

    def keep(self, unit_counts: npt.NDArray[np.int64]) -> BoolArray:
        if unit_counts.size == 0:
            return np.zeros(0, dtype=np.bool_)
        noisy = _grid.gaussian_on_grid(unit_counts.astype(np.float64), self.sigma,
                                       self.noise.granularity, self.source)
        return np.asarray(noisy >= self.threshold)

    def __repr__(self) -> str:
        return (f"GaussianThresholdPartitionSelection(epsilon={self.epsilon!r}, "
                f"delta={self.delta!r}, max_partitions={self.max_partitions!r})")


def choose_partition_selection(*, epsilon: float, delta: float, max_partitions: int = 1,
                               source: RandomSource | None = None) -> PartitionSelection:
    """The tighter of the optimal rule and Gaussian thresholding for these parameters.

    "Tighter" means fewer units needed for a partition to be kept with probability 1/2; the
    choice depends only on (epsilon, delta, max_partitions), never on the data. Where the
    optimal rule's table would take more than ``OPTIMAL_TABLE_LIMIT`` units to reach 1 (a
    small epsilon per partition), Gaussian thresholding is taken without building it, so that
    choosing takes bounded time.
    """
    try:  # bad parameters fall through to the constructors, which name them
        long = optimal_table_length(epsilon / max_partitions, per_partition_delta(
            delta, max_partitions)) > OPTIMAL_TABLE_LIMIT
    except (ArithmeticError, TypeError, ValueError):
        long = False
    if long:
        return GaussianThresholdPartitionSelection(epsilon=epsilon, delta=delta,
                                                   max_partitions=max_partitions,
                                                   source=source)
    optimal = OptimalPartitionSelection(epsilon=epsilon, delta=delta,
                                        max_partitions=max_partitions, source=source)
    if max_partitions == 1:
        return optimal  # the optimal rule is optimal among all rules for one partition
    gaussian = GaussianThresholdPartitionSelection(epsilon=epsilon, delta=delta,
                                                   max_partitions=max_partitions,
                                                   source=source)
    return gaussian if gaussian.units_for_half() < optimal.units_for_half() else optimal



def _check_noise_sensitivity(noise: DiscreteLaplace | DiscreteGaussian, contribution: int,
                             max_partitions: int, total: int | None = None) -> None:
    """The noise must be calibrated for what one unit moves: the counts of k partitions by C
    each, L1 norm k C (Laplace) and L2 norm sqrt(k) C (Gaussian), or at most ``total`` where
    the unit's counts are non-negative and sum to at most that (then both norms are at most
    ``total``). ``CountThreshold`` claims the noise's own epsilon or rho, which holds only
    then (class docstring); compared exactly, as Fractions and integers."""
    k, c = max_partitions, contribution
    if isinstance(noise, DiscreteLaplace):
        need = k * c if total is None else min(k * c, total)
        if Fraction(noise.sensitivity) < need:
            what = (f"max_partitions x contribution = {k} x {c} = {k * c}" if need == k * c
                    else f"its total over all partitions, {total}")
            raise UserError(
                f"the noise's sensitivity {noise.sensitivity:g} is below what one unit moves "
                f"the counts by: {what} (L1); calibrate the DiscreteLaplace for sensitivity "
                f"{need}")
    elif noise.sensitivity**2 < k * c * c and (total is None or noise.sensitivity < total):
        need = math.isqrt(k * c * c - 1) + 1  # the least integer >= sqrt(k) C
        if total is not None:
            need = min(need, total)
        raise UserError(
            f"the noise's sensitivity {noise.sensitivity} is below what one unit moves the "
            f"counts by: sqrt(max_partitions) x contribution = sqrt({k}) x {c} (L2)"
            f"{'' if total is None else f', or its total over all partitions, {total}'}; "
            f"calibrate the DiscreteGaussian for sensitivity {need}")


class CountThreshold(Mechanism):
    """Release a partition when its noisy count reaches tau: selection that costs only delta.

    The mechanism adds exact integer noise Z (the given ``DiscreteLaplace`` or
    ``DiscreteGaussian``, in the count's integer units) to the count of *every* partition found
    in the data, and releases the partitions whose noisy count x = c + Z is at least
    ``threshold`` = tau, together with x (the released count). The same noisy count answers the
    query and selects the partition: nothing is spent on a separate selection step.

    Setting. Neighbouring: add/remove one privacy unit, who contributes to at most
    k = ``max_partitions`` partitions (a hard cap, enforced before counting) and at most
    ``contribution`` = C units of the count in each (C = W r for a count of rows, W for a
    count of units, W being the measure's weight per row or unit). The noise must be calibrated
    for that: a ``DiscreteLaplace`` for L1 sensitivity at least k C, a ``DiscreteGaussian`` for
    L2 sensitivity at least sqrt(k) C; a noise calibrated for less is refused (the guarantee
    below claims the noise's own epsilon or rho). Where the unit's counts are also known to
    be non-negative and to sum to at most ``total`` = T over all its partitions (the caps on
    each unit's total, ``bounding="unit"``: its rows weighed by min(1, M / rows) sum to at most
    M, C = M too), both norms are at most T, and noise calibrated for min(k C, T) (L1) or
    min(sqrt(k) C, T) (L2) suffices: the L2 norm of non-negative parts is at most their sum.

    Guarantee. Let D' = D plus unit u. Split D''s partitions into those D also has (P_both) and
    the at most k that only u backs (P_new), each with a count of at most C in D'. The output
    is a pair of independent parts: what is released about P_both, a post-processing
    (thresholding) of noisy counts whose difference between D and D' has L1 norm <= k C and L2
    norm <= sqrt(k) C (each at most T where ``total`` is given); and what is released about
    P_new, which is nothing on D and, on D', something only when one of those noisy counts
    reaches tau: probability at most 1 - (1 - P[Z >= tau - C])^k <= delta, so the two output
    distributions of that part are within total variation delta, a (0, delta)-DP statement
    in both directions. Basic composition of the independent parts (Dwork and Roth 2014,
    Theorem 3.16) gives:

    - discrete Laplace of scale t = k C / epsilon (T / epsilon where ``total`` = T is the
      smaller): (epsilon, delta)-DP (the pure part:
      Ghosh, Roughgarden and Sundararajan 2009);
    - discrete Gaussian with rho-zCDP for L2 sensitivity sqrt(k) C (Canonne, Kamath and
      Steinke 2020, Theorem 14): rho-zCDP for P_both, hence (epsilon(rho, delta'), delta' +
      delta)-DP for any delta' (Bun and Steinke 2016; Canonne, Kamath and Steinke 2020).

    That is the analysis of Wilson, Zhang, Lam, Desfontaines, Simmons-Marengo and Gipson,
    "Differentially private SQL with bounded user contribution" (PoPETs 2020, Section 4) and of
    OpenDP's thresholded counts (Rogers 2023, "A unifying privacy analysis framework for unknown
    domain algorithms"). tau is the least integer with P[Z >= tau - C] <= delta_k =
    1 - (1 - delta)^(1/k), from rigorous upper bounds on the tail (``_tails``); a partition
    backed by one unit (count <= C) is released with probability at most delta_k <= delta (the
    Escargots guarantee of ``OptimalPartitionSelection``).

    Events (``events``): the selection as ``ApproxDPEvent(0, delta)`` and the noise's own
    guarantee (``PureDPEvent(epsilon)`` or ``ZCDPEvent(rho)``); their basic composition is the
    guarantee above. A zCDP budget cannot account the delta part, so it refuses these.

    Note on OpenDP 0.16 (measured, ``benchmarks/README.md``): its low-level
    ``make_laplace_threshold(scale=1, threshold=2)`` releases a partition of count 1 in 26.9% of
    draws (P[Z >= 1]) while its privacy map states delta = P[Z >= 2] = 0.099, one step further
    out than this analysis (its Context API, which picks the threshold itself, releases as this
    class does).
    """

    #: The value ``release`` gives a partition that is not released.
    DROPPED = -1

    def __init__(self, *, noise: DiscreteLaplace | DiscreteGaussian, contribution: int,
                 delta: float, max_partitions: int = 1, unit_weight: int = 1,
                 total: int | None = None, source: RandomSource | None = None) -> None:
        super().__init__(neighbouring=Neighbouring.ADD_REMOVE, source=source)
        if not isinstance(noise, DiscreteLaplace | DiscreteGaussian):
            raise UserError("noise must be a DiscreteLaplace or a DiscreteGaussian mechanism")
        if noise.neighbouring is not Neighbouring.ADD_REMOVE:
            raise UserError("count thresholding is stated for add/remove neighbouring only")
        if isinstance(noise, DiscreteGaussian) and noise.rho is None:
            raise UserError("a Gaussian count threshold needs the noise calibrated by rho")
        for name, value in (("contribution", contribution), ("unit_weight", unit_weight),
                            ("total", 1 if total is None else total)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise UserError(f"{name} must be a positive integer, got {value!r}")
        self.noise = noise
        self.contribution = int(contribution)
        self.unit_weight = int(unit_weight)
        self.delta = check_delta(delta)
        self.max_partitions = _check_max_partitions(max_partitions)
        self.total = None if total is None else int(total)
        _check_noise_sensitivity(noise, self.contribution, self.max_partitions, self.total)
        self.partition_delta = per_partition_delta(self.delta, self.max_partitions)
        if not self.partition_delta < 0.5:
            raise UserError("delta is too large for count thresholding")
        self.threshold = self.contribution + upper_tail_point(noise, self.partition_delta)

    @property
    def guarantee(self) -> ApproxDP:
        """(epsilon, delta) under add/remove one unit (class docstring): the Laplace noise's
        epsilon; for Gaussian noise, rho-zCDP converted at delta, plus delta for selection."""
        if isinstance(self.noise, DiscreteLaplace):
            return ApproxDP(self.noise.epsilon, self.delta)
        assert self.noise.rho is not None
        return ApproxDP(zcdp_to_epsilon(self.noise.rho, self.delta), 2 * self.delta)

    @property
    def events(self) -> tuple[DpEvent, DpEvent]:
        """The selection's delta and the noise's guarantee, in that order (class docstring)."""
        noise: DpEvent
        if isinstance(self.noise, DiscreteLaplace):
            noise = PureDPEvent(self.noise.epsilon)
        else:
            assert self.noise.rho is not None
            noise = ZCDPEvent(self.noise.rho)
        return ApproxDPEvent(0.0, self.delta), noise

    def add_noise(self, counts: Any) -> npt.NDArray[np.int64]:
        """Every partition's noisy count (integer units), kept or not."""
        values = _unit_counts(counts)
        return np.asarray(self.noise.release(values), dtype=np.int64).reshape(values.shape)

    def keep(self, noisy: npt.NDArray[np.int64]) -> BoolArray:
        """Which noisy counts reach the threshold."""
        return np.asarray(noisy >= self.threshold)

    def release(self, x: Any) -> npt.NDArray[np.int64]:
        """Noisy counts of the released partitions, ``DROPPED`` (-1) for the others."""
        noisy = self.add_noise(x)
        return np.where(self.keep(noisy), noisy, self.DROPPED)

    def keep_probability(self, n: int) -> float:
        """P[a partition of n units, one row each, is released] = P[Z >= tau - n W]."""
        if n < 0:
            raise UserError("n must be >= 0")
        if n == 0:
            return 0.0
        tails = NoiseTails.of(self.noise)
        return float(np.exp(tails.log_sf(np.array([self.threshold - n * self.unit_weight],
                                                  dtype=np.float64)))[0])

    def units_for_half(self) -> int:
        """The fewest units (one row each) released with probability >= 1/2: ceil(tau / W),
        as P[Z >= m] >= 1/2 exactly when m <= 0 for these symmetric integer noises."""
        return max(1, -(-self.threshold // self.unit_weight))

    def __repr__(self) -> str:
        return (f"CountThreshold(noise={self.noise!r}, threshold={self.threshold}, "
                f"delta={self.delta!r}, max_partitions={self.max_partitions!r})")
