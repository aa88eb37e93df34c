"""The sparse vector technique: which queries are above a threshold, paying only for the positives.

Algorithm (Lyu, Su and Li, "Understanding the sparse vector technique for differential
privacy", PVLDB 10(6), 2017, Algorithm 1, proven epsilon-DP in their Theorem 2):

    rho = Lap(Delta / eps1)                         # threshold noise, drawn once
    for each query answer q_i, in order:
        nu_i = Lap(2 c Delta / eps2)                # c Delta / eps2 for monotonic queries
        if q_i + nu_i >= T + rho: answer "above", and stop after the c-th "above"
        else: answer "below"

with eps1 + eps2 = epsilon. Unlike several published variants (analysed and refuted in the same
paper), it adds fresh noise to every query, never reuses the budget of "below" answers, and
stops after c positives. The default split is the paper's recommended ratio
eps1 : eps2 = 1 : (2c)^(2/3) (1 : c^(2/3) for monotonic queries; Lyu et al., Section 4.2).

Exact noise. Laplace noise is drawn exactly on a grid of spacing g (a power of two about 2^-40
of the smaller of Delta and the noise scales, ``_grid.granularity_for``): as in
``_grid.laplace_on_grid``, each query answer and the
threshold are rounded to the nearest multiple of g and g times an exact discrete Laplace
integer is added. The comparison is then made exactly in integer grid units (no float
addition or rounding decides it). Rounding to the grid can move a query answer by up to g/2,
so two neighbouring datasets' rounded answers differ by at most Delta + g: the noise is
calibrated to the inflated sensitivity Delta + g (both scales), which makes the proof of
Theorem 2 go through verbatim on the lattice g Z (its change of variables shifts the noise by
a multiple of g, and the discrete Laplace pmf ratio for a shift s is exp(s / scale)). The
stated epsilon therefore holds exactly; the inflation raises the noise by a factor of about
1 + 2^-40.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from dpcurator.accounting import Neighbouring, PureDP
from dpcurator.errors import UserError
from dpcurator.mechanisms._base import Mechanism, as_finite_array, check_alpha, check_positive
from dpcurator.mechanisms._grid import granularity_for
from dpcurator.noise import RandomSource, sample_discrete_laplace

__all__ = ["SparseVector"]

IntArray = npt.NDArray[np.int64]

_LOWEST, _HIGHEST = Fraction(1e-290), Fraction(1e290)  # the parameters' range (checked exactly)
_MAX_GRID_SCALE = 2**54  # largest noise scale in grid units (the sampler allows 2^56)
_INT64_SAFE = 2**61


def _grid_units(values: npt.NDArray[np.float64], g: Fraction) -> npt.NDArray[Any]:
    """round(values / g) exactly, as int64 when small enough, else as Python ints (object)."""
    with np.errstate(over="ignore"):
        scaled = np.round(values / float(g))  # a power-of-two scaling: exact unless it overflows
    if scaled.size == 0 or (np.all(np.isfinite(scaled))
                            and float(np.max(np.abs(scaled))) < _INT64_SAFE):
        return scaled.astype(np.int64)
    return np.array([round(Fraction(float(v)) / g) for v in values], dtype=object)


class SparseVector(Mechanism):
    """Sparse vector technique (AboveThreshold for c = 1): report queries above a threshold.

    ``release(query_answers)`` takes a 1-D array of query answers, each of sensitivity
    ``sensitivity`` (Delta) under ``neighbouring``, and returns the int64 array of the indices
    answered "above", in order, at most ``max_positives`` (c) of them. The mechanism stops
    after the c-th positive: if c indices come back, the queries after the last one were not
    answered; if fewer come back, every query was answered and all others were "below". The
    queries must be fixed in advance (not chosen from earlier answers of this call).

    ``threshold_epsilon`` (eps1) may be given; by default eps1 = epsilon / (1 + (2c)^(2/3))
    (epsilon / (1 + c^(2/3)) when ``monotonic``), Lyu et al.'s recommended ratio.
    ``monotonic=True`` is for queries that all move in the same direction when a unit is
    added or removed (counts): the query noise halves.

    Guarantee: ``PureDP(epsilon)`` under ``neighbouring`` (add/remove one unit by default),
    whatever the number of queries. Source: Lyu, Su and Li (PVLDB 2017), Algorithm 1 and
    Theorem 2; for c = 1 it is AboveThreshold (Dwork and Roth 2014, Theorem 3.23). Exact
    noise on a grid with inflated sensitivity: see the module docstring.

    Error: ``accuracy(alpha, n_queries)``.

    ``source``: leave ``None`` for the secure default; a ``SeededRandom`` is INSECURE (tests).
    """

    def __init__(self, *, epsilon: float, sensitivity: float, threshold: float,
                 max_positives: int = 1, monotonic: bool = False,
                 threshold_epsilon: float | None = None,
                 neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
                 source: RandomSource | None = None) -> None:
        super().__init__(neighbouring=neighbouring, source=source)
        self.epsilon = check_positive("epsilon", epsilon)
        self.sensitivity = check_positive("sensitivity", sensitivity)
        if isinstance(threshold, bool) or not isinstance(threshold, int | float | np.integer
                                                         | np.floating) \
                or not math.isfinite(threshold):
            raise UserError(f"threshold must be a finite number, got {threshold!r}")
        self.threshold = float(threshold)
        if isinstance(max_positives, bool) or not isinstance(max_positives, int | np.integer) \
                or max_positives < 1:
            raise UserError(
                f"max_positives must be a positive integer (c, the number of 'above' answers "
                f"before stopping), got {max_positives!r}")
        self.max_positives = int(max_positives)
        if not isinstance(monotonic, bool):
            raise UserError(f"monotonic must be True or False, got {monotonic!r}")
        self.monotonic = monotonic

        c = self.max_positives
        eps = Fraction(self.epsilon)
        if threshold_epsilon is None:
            # Lyu et al., Section 4.2: eps1 : eps2 = 1 : (2c)^(2/3), or 1 : c^(2/3) if monotonic.
            ratio = float(c if monotonic else 2 * c) ** (2 / 3)
            eps1 = Fraction(self.epsilon / (1 + ratio))
        else:
            eps1 = Fraction(check_positive("threshold_epsilon", threshold_epsilon))
        if not 0 < eps1 < eps:
            raise UserError(
                f"threshold_epsilon must lie strictly between 0 and epsilon={self.epsilon!r}, "
                f"got {float(eps1)!r}")
        eps2 = eps - eps1  # exact: eps1 + eps2 == epsilon
        self._eps1, self._eps2 = eps1, eps2

        # Noise scales before and after inflating the sensitivity by the grid spacing g.
        delta = Fraction(self.sensitivity)
        query_factor = c if monotonic else 2 * c
        # Checked exactly before any float is made of them: a float overflows past ~1.8e308,
        # and the grid step (about 2^-40 of the smallest) underflows to 0 below ~1e-296.
        scales = (delta / eps1, query_factor * delta / eps2)
        if not _LOWEST <= delta <= _HIGHEST:
            raise UserError(f"sensitivity must lie between 1e-290 and 1e290, got "
                            f"{self.sensitivity!r}")
        if not all(_LOWEST <= scale <= _HIGHEST for scale in scales):
            raise UserError(
                f"sensitivity / epsilon must give noise scales between 1e-290 and 1e290; "
                f"sensitivity {self.sensitivity!r} and epsilon {self.epsilon!r} give "
                f"{_describe(min(scales))} to {_describe(max(scales))}")
        nominal = (float(scales[0]), float(scales[1]))
        g = Fraction(granularity_for(self.sensitivity, min(nominal)))
        while max(nominal) / g > _MAX_GRID_SCALE:
            g *= 2  # a coarser grid keeps both scales in the sampler's range
        self._g = g
        inflated = delta + g
        self._threshold_scale = inflated / eps1
        self._query_scale = query_factor * inflated / eps2
        if not 0 < self._threshold_scale / g <= 2**56 or not 0 < self._query_scale / g <= 2**56:
            raise UserError("epsilon and sensitivity give a noise scale out of range")

    # -- description --------------------------------------------------------------------------

    @property
    def threshold_epsilon(self) -> float:
        """eps1, spent on the threshold noise (a float view of the exact rational)."""
        return float(self._eps1)

    @property
    def query_epsilon(self) -> float:
        """eps2 = epsilon - eps1, spent on the query noise."""
        return float(self._eps2)

    @property
    def granularity(self) -> float:
        """The grid spacing g of the noise."""
        return float(self._g)

    @property
    def threshold_scale(self) -> float:
        """Scale of the threshold noise: (Delta + g) / eps1."""
        return float(self._threshold_scale)

    @property
    def query_scale(self) -> float:
        """Scale of each query's noise: 2c (Delta + g) / eps2, c (Delta + g) / eps2 if monotonic."""
        return float(self._query_scale)

    @property
    def guarantee(self) -> PureDP:
        """epsilon-DP for one call on one fixed list of queries (Lyu et al., Theorem 2)."""
        return PureDP(self.epsilon, neighbouring=self.neighbouring)

    # -- release ------------------------------------------------------------------------------

    def release(self, query_answers: Any) -> IntArray:
        """Indices of the queries answered "above", at most ``max_positives`` (see the class)."""
        answers = as_finite_array("query_answers", query_answers)
        if answers.ndim != 1:
            raise UserError(
                f"query_answers must be a 1-D array (one answer per query), got "
                f"{answers.ndim} dimensions")
        g, src = self._g, self.source
        # Grid units: every quantity below is an exact integer count of g.
        threshold_units = round(Fraction(self.threshold) / g)
        answer_units = _grid_units(answers, g)  # shape (n,)
        noisy_threshold = threshold_units + int(
            sample_discrete_laplace(self._threshold_scale / g, 1, src)[0])
        # One noise per query, drawn for all n at once so the work does not depend on where
        # the positives fall; noise of queries after the stopping point is never used.
        query_noise = sample_discrete_laplace(self._query_scale / g, answers.size, src)
        if answer_units.dtype == np.int64 and abs(noisy_threshold) < _INT64_SAFE \
                and (query_noise.size == 0 or int(np.max(np.abs(query_noise))) < _INT64_SAFE):
            above = answer_units + query_noise >= noisy_threshold  # no overflow: all < 2^61
        else:
            above = np.array([int(a) + int(z) >= noisy_threshold
                              for a, z in zip(answer_units, query_noise, strict=True)],
                             dtype=np.bool_)
        return np.flatnonzero(above)[: self.max_positives].astype(np.int64)

    # -- error --------------------------------------------------------------------------------

    def accuracy(self, alpha: float, n_queries: int) -> float:
        """A margin a such that, with probability >= 1 - alpha, over the first n queries:

        every query answered "above" has q_i >= T - a, and every query answered "below" has
        q_i < T + a. With b1, b2 the threshold and query noise scales,
        a = b1 ln(4 / alpha) + b2 ln(4 n / alpha) + g: the grid Laplace noise Y of scale b has
        P[|Y| >= t] <= 2 exp(-t / b), so |threshold noise| <= b1 ln(4 / alpha) fails with
        probability <= alpha / 2, some |query noise| >= b2 ln(4 n / alpha) with probability
        <= alpha / 2 (union bound), and rounding T and q_i to the grid moves them by <= g / 2
        each. (The form of Dwork and Roth 2014, Theorem 3.24, with this algorithm's scales.)
        """
        alpha = check_alpha(alpha)
        if isinstance(n_queries, bool) or not isinstance(n_queries, int | np.integer) \
                or n_queries < 1:
            raise UserError(f"n_queries must be a positive integer, got {n_queries!r}")
        margin = (float(self._threshold_scale) * math.log(4 / alpha)
                  + float(self._query_scale) * math.log(4 * int(n_queries) / alpha)
                  + float(self._g))
        return margin * (1 + 1e-12)  # round up against float error

    def __repr__(self) -> str:
        return (f"SparseVector(epsilon={self.epsilon!r}, sensitivity={self.sensitivity!r}, "
                f"threshold={self.threshold!r}, max_positives={self.max_positives!r}, "
                f"monotonic={self.monotonic!r})")


def _describe(value: Fraction) -> str:
    """A Fraction as a short number, also past the largest float."""
    return format(Decimal(value.numerator) / Decimal(value.denominator), ".3g")
