"""Randomized response: each person randomizes their own answer before anyone sees it (local DP).

Three protocols, all exact (every coin is an exact Bernoulli or uniform draw with a rational
parameter, see ``dpcurator.noise``):

- ``"two-coin"`` (binary only; the survey of the references): a first coin lands tails with
  probability p and the person answers truthfully; otherwise a second coin with the same tails
  probability p says "yes" on tails and "no" on heads. P[yes | yes] = 2p - p^2 and
  P[yes | no] = p - p^2, so a "yes" report has likelihood ratio (2 - p) / (1 - p), which tends
  to 2 as p -> 0: this protocol cannot go below epsilon = ln 2 ~ 0.693. Fair coins
  (p = 1/2) give epsilon = ln 3 ~ 1.0986 (the references' "epsilon = 1.1"). Beware: the
  references stop at the "yes" ratio, but a "no" report has ratio
  P[no | no] / P[no | yes] = (1 - p + p^2) / (1 - p)^2, which is the larger one when p > 1/2.
  So epsilon = ln((2 - p) / (1 - p)) and p = (e^eps - 2) / (e^eps - 1) only for
  epsilon <= ln 3; above, epsilon = ln((1 - p + p^2) / (1 - p)^2) and
  p = 1 - 2 / (1 + sqrt(4 e^eps - 3)). Both branches are used here.
- ``"truth-or-coin"``: answer truthfully with probability p, otherwise report a uniformly random
  category (a fair coin when binary). With k categories, epsilon = ln(1 + k p / (1 - p)); for
  k = 2 that is ln((1 + p) / (1 - p)) (Lalanne, lesson 1, equations (7)-(8)). Any epsilon > 0.
- ``"generalized"`` (k-ary randomized response, Kairouz, Oh and Viswanath 2014; Wang, Blocki, Li
  and Jha 2017 call it direct encoding): keep the true category with probability q, otherwise
  report a uniformly random *other* category. epsilon = ln(q (k - 1) / (1 - q)), so
  q = e^epsilon / (e^epsilon + k - 1). It is the truth-or-coin protocol reparametrized
  (q = p + (1 - p) / k). Any epsilon > 0.

Neighbouring relation. A randomizer sees one person's answer, so the guarantee compares the
report distributions of two *different answers* of that person: ``Neighbouring.REPLACE``
(replace one privacy unit's answer). For any two answers x, x' and any report y,
P[R(x) = y] <= e^epsilon P[R(x') = y]; reports of different people use independent coins, so a
table of reports is epsilon-DP under REPLACE as well (parallel composition). Add/remove is not
offered: whether a person sent a report at all is not hidden by randomizing its content.

Exact rational parameters. The truth probability that reaches a requested epsilon is
irrational in general (it involves e^epsilon). Built from ``epsilon=``, the mechanism uses the
rational p obtained by rounding the exact value p*(epsilon) *down* (towards more privacy) to
100 significant bits: the smaller of p and 1 - p is kept to a relative precision of 2^-100
(computed in rigorous interval arithmetic, so p <= p* is proven, not hoped). The privacy loss
is increasing in p, so this p achieves at most the requested epsilon. The reported guarantee is
``min(requested epsilon, ln(ratio of p) rounded up to a float)``: never below the loss that the
rational p actually has, and never above what was asked for. Built from ``truth_probability=``
(an int, float or Fraction, taken exactly), the reported epsilon is the exact loss of that p
rounded up to the next float.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt
from scipy import stats

from dpcurator.accounting import Neighbouring, PureDP
from dpcurator.accounting.events import DpEvent, PureDPEvent, RandomizedResponseEvent
from dpcurator.errors import UserError
from dpcurator.mechanisms._base import Mechanism, check_alpha, check_positive
from dpcurator.noise import (
    RandomSource,
    interval_bounds,
    interval_context,
    sample_bernoulli,
    sample_uniform_int,
)

__all__ = ["Estimate", "RandomizedResponse"]

ProtocolName = Literal["two-coin", "truth-or-coin", "generalized"]
Real = int | float | Fraction
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

_SIGNIFICANT_BITS = 100  # precision of the rational truth probability built from epsilon
_INTERVAL_PRECISION = 320  # bits of mpmath interval arithmetic, far above _SIGNIFICANT_BITS
_MAX_EPSILON = 700.0  # beyond this e^-epsilon underflows doubles; no privacy is left anyway
_OUTWARD = 1e-12  # relative outward rounding of Clopper-Pearson endpoints (scipy accuracy)


# ---------------------------------------------------------------------------------------------
# Rigorous arithmetic helpers (mpmath intervals; every endpoint read back as an exact Fraction).


def _interval_context() -> Any:
    return interval_context(_INTERVAL_PRECISION)


def _ln_upper(ratio: Fraction) -> float:
    """A float >= ln(ratio) (ratio > 1 rational), at most a couple of ulps above it."""
    ctx = _interval_context()
    value = ctx.log(ctx.mpf(ratio.numerator) / ctx.mpf(ratio.denominator))
    high = interval_bounds(value)[1]
    result = float(high)
    if Fraction(result) < high:
        result = math.nextafter(result, math.inf)
    return result


def _binary_exponent(value: Fraction) -> int:
    """floor(log2(value)) for a positive rational, exactly."""
    e = value.numerator.bit_length() - value.denominator.bit_length()
    while Fraction(2) ** e > value:
        e -= 1
    while Fraction(2) ** (e + 1) <= value:
        e += 1
    return e


def _round_down_probability(p_low: Fraction, p_high: Fraction, q_high: Fraction) -> Fraction:
    """A rational p <= p*, given p_low <= p* <= p_high and 1 - p* <= q_high.

    The smaller of p and 1 - p keeps _SIGNIFICANT_BITS significant bits.
    """
    if p_high <= Fraction(1, 2):
        if p_low <= 0:
            return Fraction(0)
        shift = _SIGNIFICANT_BITS - 1 - _binary_exponent(p_low)
        return Fraction(math.floor(p_low * 2**shift), 2**shift)
    shift = _SIGNIFICANT_BITS - 1 - _binary_exponent(q_high)
    return 1 - Fraction(math.ceil(q_high * 2**shift), 2**shift)


# ---------------------------------------------------------------------------------------------
# The protocols: one small class each.


class _Protocol(ABC):
    name: ClassVar[ProtocolName]
    minimum_epsilon: ClassVar[float]

    def check_categories(self, k: int) -> None:
        """Raise if this protocol does not work with k categories (all k >= 2 by default)."""
        return None

    @abstractmethod
    def minimum_p(self, k: int) -> Fraction:
        """The truth probability (exclusive) at which the privacy loss reaches its minimum."""

    @abstractmethod
    def loss_ratio(self, p: Fraction, k: int) -> Fraction:
        """e^epsilon as an exact function of p: the largest ratio of report probabilities."""

    @abstractmethod
    def optimal_p(self, ctx: Any, e_eps: Any, k: int) -> list[tuple[Any, Any]]:
        """Candidates (p, 1 - p) as intervals, given one enclosing e^epsilon.

        p*(epsilon), the largest p whose loss ratio is <= e^epsilon, is the smallest candidate.
        """

    @abstractmethod
    def matrix(self, p: Fraction, k: int) -> list[list[Fraction]]:
        """matrix[i][j] = P[report j | true answer i], exactly."""

    @abstractmethod
    def randomize(self, idx: IntArray, p: Fraction, k: int, source: RandomSource) -> IntArray:
        """Reports for true answers ``idx`` (category indices), flattened."""


class _TwoCoin(_Protocol):
    """First coin tails (prob. p): the truth; else second coin tails (prob. p): "yes"."""

    name = "two-coin"
    minimum_epsilon = math.log(2)

    def check_categories(self, k: int) -> None:
        if k != 2:
            raise UserError(
                "protocol 'two-coin' is for yes/no questions; with more categories use "
                "protocol='generalized' or 'truth-or-coin'")

    def minimum_p(self, k: int) -> Fraction:
        return Fraction(0)

    def loss_ratio(self, p: Fraction, k: int) -> Fraction:
        # "yes": (2p - p^2) / (p - p^2) = (2 - p) / (1 - p); "no": (1 - p + p^2) / (1 - p)^2.
        # The first is larger for p < 1/2, the second for p > 1/2 (they differ by
        # (1 - 2p) / (1 - p)^2); both increase with p.
        return max((2 - p) / (1 - p), (1 - p + p * p) / ((1 - p) * (1 - p)))

    def optimal_p(self, ctx: Any, e_eps: Any, k: int) -> list[tuple[Any, Any]]:
        # The largest p with both ratios <= E is the smaller of the two inverses:
        # (2 - p) / (1 - p) = E  <=>  p = (E - 2) / (E - 1), 1 - p = 1 / (E - 1);
        # (1 - p + p^2) / (1 - p)^2 = E  <=>  1 - p = 2 / (1 + sqrt(4E - 3)) (the positive root
        # of (E - 1) u^2 + u - 1 = 0 with u = 1 - p, written without cancellation).
        root = ctx.sqrt(4 * e_eps - 3)
        return [((e_eps - 2) / (e_eps - 1), 1 / (e_eps - 1)),
                ((root - 1) / (root + 1), 2 / (root + 1))]

    def matrix(self, p: Fraction, k: int) -> list[list[Fraction]]:
        yes_given_no = p - p * p
        yes_given_yes = 2 * p - p * p
        return [[1 - yes_given_no, yes_given_no], [1 - yes_given_yes, yes_given_yes]]

    def randomize(self, idx: IntArray, p: Fraction, k: int, source: RandomSource) -> IntArray:
        first_tails = sample_bernoulli(p, idx.size, source)  # tails: answer truthfully
        second_tails = sample_bernoulli(p, idx.size, source)  # tails: "yes", heads: "no"
        return np.where(first_tails, idx, second_tails.astype(np.int64))


class _TruthOrCoin(_Protocol):
    """The truth with probability p, else a uniformly random category (a fair coin if k = 2)."""

    name = "truth-or-coin"
    minimum_epsilon = 0.0

    def minimum_p(self, k: int) -> Fraction:
        return Fraction(0)

    def loss_ratio(self, p: Fraction, k: int) -> Fraction:
        # (p + (1 - p) / k) / ((1 - p) / k) = 1 + k p / (1 - p)
        return 1 + k * p / (1 - p)

    def optimal_p(self, ctx: Any, e_eps: Any, k: int) -> list[tuple[Any, Any]]:
        return [((e_eps - 1) / (e_eps - 1 + k), ctx.mpf(k) / (e_eps - 1 + k))]

    def matrix(self, p: Fraction, k: int) -> list[list[Fraction]]:
        off = (1 - p) / k
        return [[p + off if i == j else off for j in range(k)] for i in range(k)]

    def randomize(self, idx: IntArray, p: Fraction, k: int, source: RandomSource) -> IntArray:
        truthful = sample_bernoulli(p, idx.size, source)
        uniform = sample_uniform_int(k, idx.size, source)
        return np.where(truthful, idx, uniform)


class _Generalized(_Protocol):
    """Keep the truth with probability q, else a uniformly random *other* category."""

    name = "generalized"
    minimum_epsilon = 0.0

    def minimum_p(self, k: int) -> Fraction:
        return Fraction(1, k)

    def loss_ratio(self, p: Fraction, k: int) -> Fraction:
        return p * (k - 1) / (1 - p)

    def optimal_p(self, ctx: Any, e_eps: Any, k: int) -> list[tuple[Any, Any]]:
        return [(e_eps / (e_eps + (k - 1)), ctx.mpf(k - 1) / (e_eps + (k - 1)))]

    def matrix(self, p: Fraction, k: int) -> list[list[Fraction]]:
        off = (1 - p) / (k - 1)
        return [[p if i == j else off for j in range(k)] for i in range(k)]

    def randomize(self, idx: IntArray, p: Fraction, k: int, source: RandomSource) -> IntArray:
        keep = sample_bernoulli(p, idx.size, source)
        other = sample_uniform_int(k - 1, idx.size, source)
        other = other + (other >= idx)  # skip the true category: uniform over the k - 1 others
        return np.where(keep, idx, other)


_PROTOCOLS: dict[str, _Protocol] = {
    proto.name: proto for proto in (_TwoCoin(), _TruthOrCoin(), _Generalized())
}


# ---------------------------------------------------------------------------------------------
# Encodings between user values (booleans or labels) and category indices 0..k-1.


class _Encoding(ABC):
    k: int
    values: tuple[Any, ...]

    @abstractmethod
    def encode(self, name: str, x: Any) -> tuple[IntArray, tuple[int, ...]]:
        """Category indices (flattened) and the input's shape."""

    @abstractmethod
    def decode(self, idx: IntArray, shape: tuple[int, ...]) -> Any:
        """Values for indices, in the given shape; a scalar when the shape is ()."""


class _BinaryEncoding(_Encoding):
    k = 2
    values = (False, True)

    def encode(self, name: str, x: Any) -> tuple[IntArray, tuple[int, ...]]:
        arr = np.asarray(x)
        if arr.dtype.kind == "b":
            return arr.astype(np.int64).ravel(), arr.shape
        if arr.dtype.kind in "iuf":
            if not np.all((arr == 0) | (arr == 1)):
                raise UserError(
                    f"{name} must contain only booleans or 0/1: it contains values outside "
                    "{0, 1}")
            return arr.astype(np.int64).ravel(), arr.shape
        raise UserError(f"{name} must contain only booleans or 0/1 (numbers or bools)")

    def decode(self, idx: IntArray, shape: tuple[int, ...]) -> Any:
        out = idx.astype(np.bool_).reshape(shape)
        return bool(out) if shape == () else out


class _LabelEncoding(_Encoding):
    def __init__(self, categories: Sequence[Any]) -> None:
        if isinstance(categories, str | bytes) or not isinstance(categories, Sequence | np.ndarray):
            raise UserError("categories must be a sequence of at least 2 distinct labels")
        values = tuple(categories.tolist() if isinstance(categories, np.ndarray) else categories)
        if len(values) < 2:
            raise UserError("categories must hold at least 2 distinct labels")
        for v in values:
            if isinstance(v, float) and math.isnan(v):
                raise UserError("categories must not contain NaN")
            if isinstance(v, list | tuple | dict | set | np.ndarray):
                raise UserError("categories must be scalar labels (strings, numbers, ...)")
        try:
            self._lookup = {v: i for i, v in enumerate(values)}
        except TypeError:
            raise UserError("categories must be hashable labels") from None
        if len(self._lookup) != len(values):
            raise UserError("categories must be distinct (note that 1, 1.0 and True are equal)")
        self.values = values
        self.k = len(values)
        self._objects = np.empty(self.k, dtype=object)
        self._objects[:] = values
        # Fast path: all-str or all-int labels are looked up with a sorted numpy array.
        self._fast: npt.NDArray[Any] | None = None
        if all(isinstance(v, str) for v in values):
            self._fast = np.array(values, dtype=str)
        elif all(isinstance(v, int | np.integer) and not isinstance(v, bool | np.bool_)
                 for v in values) and all(-(2**63) <= int(v) < 2**63 for v in values):
            self._fast = np.array(values, dtype=np.int64)
        if self._fast is not None:
            self._order = np.argsort(self._fast, kind="stable")
            self._sorted = self._fast[self._order]

    def _encode_fast(self, arr: npt.NDArray[Any]) -> IntArray | None:
        assert self._fast is not None
        fast_kind = self._fast.dtype.kind
        if fast_kind == "U" and arr.dtype.kind != "U":
            return None
        if fast_kind == "i" and not (arr.dtype.kind in "iu" and np.can_cast(arr.dtype, np.int64)):
            return None
        flat = arr.ravel()
        pos = np.minimum(np.searchsorted(self._sorted, flat), self.k - 1)
        if not np.all(self._sorted[pos] == flat):
            raise UserError("the input contains values that are not among the categories")
        return self._order[pos].astype(np.int64)

    def encode(self, name: str, x: Any) -> tuple[IntArray, tuple[int, ...]]:
        arr = np.asarray(x)
        if self._fast is not None:
            try:
                idx = self._encode_fast(arr)
            except ValueError:
                raise UserError(f"{name} contains values that are not among the categories") \
                    from None
            if idx is not None:
                return idx, arr.shape
        objects = np.asarray(x, dtype=object)
        try:
            idx = np.fromiter((self._lookup.get(v, -1) for v in objects.ravel()),
                              dtype=np.int64, count=objects.size)
        except TypeError:
            idx = np.full(1, -1, dtype=np.int64)
        if np.any(idx < 0):
            raise UserError(f"{name} contains values that are not among the categories")
        return idx, objects.shape

    def decode(self, idx: IntArray, shape: tuple[int, ...]) -> Any:
        if self._fast is not None:
            out = self._fast[idx].reshape(shape)
            return out.item() if shape == () else out
        objs = self._objects[idx].reshape(shape)
        return objs[()] if shape == () else objs


# ---------------------------------------------------------------------------------------------
# Estimates.


@dataclass(frozen=True)
class Estimate:
    """A population estimate from randomized reports, with its uncertainty.

    For a yes/no question every field is a float: the estimated proportion of true "yes"
    answers. For categories, ``value``, ``standard_error`` and the two interval ends are arrays
    in the order of ``categories``: the estimated proportion of each true category.

    - ``value``: the unbiased estimate (it may fall outside [0, 1]: clipping it would bias it).
    - ``interval``: the two-sided normal-approximation interval at level 1 - alpha (per
      category for k-ary; each covers marginally), clipped to [0, 1].
    - ``standard_error``: the plug-in estimate of the estimator's standard deviation.
    - ``n``: the number of reports; ``alpha``: the interval's nominal miss probability.
    """

    value: float | FloatArray
    interval: tuple[float, float] | tuple[FloatArray, FloatArray]
    standard_error: float | FloatArray
    n: int
    alpha: float
    categories: tuple[Any, ...] | None = None


def _read_only(arr: FloatArray) -> FloatArray:
    arr.setflags(write=False)
    return arr


# ---------------------------------------------------------------------------------------------
# The mechanism.


class RandomizedResponse(Mechanism):
    """Randomized response, a local randomizer: epsilon-DP for one person's answer.

    Give exactly one of ``epsilon`` or ``truth_probability``.

    - Yes/no questions (``categories=None``): ``release`` takes booleans or 0/1 values and
      returns booleans. ``protocol`` is ``"two-coin"`` (default; epsilon > ln 2),
      ``"truth-or-coin"`` or ``"generalized"`` (classic Warner response for k = 2).
    - Multiple choice (``categories`` = a sequence of >= 2 distinct scalar labels):
      ``release`` takes labels and returns labels. ``protocol`` is ``"generalized"``
      (default) or ``"truth-or-coin"``.

    ``truth_probability`` is the protocol's p: the first coin's tails probability (two-coin),
    the probability of answering truthfully rather than by a uniform draw (truth-or-coin), or
    the probability of keeping the true category (generalized).

    Guarantee: ``PureDP(epsilon, Neighbouring.REPLACE)``: for any two answers of one person and
    any report, the report's probabilities differ by a factor of at most e^epsilon.
    Neighbouring: replace one person's answer (see the module docstring for why add/remove is
    refused). Sources: Warner (1965); the two-coin survey and its p(epsilon) as in Dwork and
    Roth (2014), Section 3.2, and the project references; k-ary: Kairouz, Oh and Viswanath,
    "Extremal mechanisms for local differential privacy" (NeurIPS 2014). The rational
    truth probability actually used is explained in the module docstring.

    ``source``: leave ``None`` for the secure default; a ``SeededRandom`` is INSECURE (tests).
    """

    #: The smallest epsilon each protocol can reach (exclusive).
    MINIMUM_EPSILON: ClassVar[dict[str, float]] = {
        name: proto.minimum_epsilon for name, proto in _PROTOCOLS.items()}

    def __init__(self, *, epsilon: float | None = None, truth_probability: Real | None = None,
                 categories: Sequence[Any] | None = None, protocol: ProtocolName | None = None,
                 neighbouring: Neighbouring = Neighbouring.REPLACE,
                 source: RandomSource | None = None) -> None:
        if neighbouring is Neighbouring.ADD_REMOVE:
            raise UserError(
                "randomized response protects the content of one person's answer, not whether "
                "they answered: its guarantee holds under Neighbouring.REPLACE (the default)")
        super().__init__(neighbouring=neighbouring, source=source)
        self._encoding: _Encoding = (
            _BinaryEncoding() if categories is None else _LabelEncoding(categories))
        if protocol is None:
            protocol = "two-coin" if categories is None else "generalized"
        if protocol not in _PROTOCOLS:
            raise UserError(
                f"protocol must be one of {sorted(_PROTOCOLS)}, got {protocol!r}")
        self._protocol = _PROTOCOLS[protocol]
        k = self._encoding.k
        self._protocol.check_categories(k)
        if (epsilon is None) == (truth_probability is None):
            raise UserError("give exactly one of epsilon= or truth_probability=")
        if epsilon is not None:
            self._p, self._epsilon = self._from_epsilon(check_positive("epsilon", epsilon))
        else:
            assert truth_probability is not None
            self._p = self._check_truth_probability(truth_probability)
            self._epsilon = _ln_upper(self._protocol.loss_ratio(self._p, k))

    # -- construction -------------------------------------------------------------------------

    def _from_epsilon(self, epsilon: float) -> tuple[Fraction, float]:
        proto, k = self._protocol, self._encoding.k
        if epsilon > _MAX_EPSILON:
            raise UserError(
                f"epsilon must be at most {_MAX_EPSILON:g} (a larger value leaves no privacy), "
                f"got {epsilon!r}")
        if epsilon <= proto.minimum_epsilon:
            raise UserError(
                f"epsilon must exceed the {proto.name} protocol's minimum "
                f"ln 2 ~ {proto.minimum_epsilon:.3f}, got {epsilon!r}; use "
                "protocol='truth-or-coin' or 'generalized' for smaller epsilon")
        ctx = _interval_context()
        candidates = proto.optimal_p(ctx, ctx.exp(ctx.mpf(epsilon)), k)
        p_bounds = [interval_bounds(p_star) for p_star, _ in candidates]
        p = _round_down_probability(min(low for low, _ in p_bounds),
                                    min(high for _, high in p_bounds),
                                    max(interval_bounds(q_star)[1] for _, q_star in candidates))
        if p <= proto.minimum_p(k):
            raise UserError(
                f"epsilon={epsilon!r} is too close to the {proto.name} protocol's minimum "
                f"{proto.minimum_epsilon:.6g} to be represented; use a larger epsilon")
        achieved = _ln_upper(proto.loss_ratio(p, k))
        return p, min(epsilon, achieved)

    def _check_truth_probability(self, value: Real) -> Fraction:
        low = self._protocol.minimum_p(self._encoding.k)
        if isinstance(value, bool) or not isinstance(value, int | float | Fraction):
            raise UserError(f"truth_probability must be a number in ({low}, 1), got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"truth_probability must be a number in ({low}, 1), got {value!r}")
        p = Fraction(value)
        if not low < p < 1:
            raise UserError(
                f"truth_probability must lie strictly between {low} and 1 for protocol "
                f"{self._protocol.name!r}, got {value!r}")
        return p

    # -- description --------------------------------------------------------------------------

    @property
    def protocol(self) -> ProtocolName:
        return self._protocol.name

    @property
    def categories(self) -> tuple[Any, ...] | None:
        """The labels, or None for a yes/no question."""
        return None if isinstance(self._encoding, _BinaryEncoding) else self._encoding.values

    @property
    def truth_probability(self) -> Fraction:
        """The exact rational p the randomizer uses."""
        return self._p

    @property
    def epsilon(self) -> float:
        """The reported epsilon: at least the exact privacy loss of ``truth_probability``."""
        return self._epsilon

    @property
    def minimum_epsilon(self) -> float:
        """The smallest epsilon this protocol approaches (ln 2 for two-coin, else 0)."""
        return self._protocol.minimum_epsilon

    @property
    def guarantee(self) -> PureDP:
        """epsilon-DP under replacement of one person's answer (see the class docstring)."""
        return PureDP(self._epsilon, neighbouring=self.neighbouring)

    @property
    def event(self) -> DpEvent:
        """Its exact profile when reports are "truth w.p. p, each other answer alike"."""
        matrix = self.probability_matrix()
        k = len(matrix)
        diagonal = {matrix[i][i] for i in range(k)}
        off = {matrix[i][j] for i in range(k) for j in range(k) if i != j}
        if len(diagonal) == 1 and len(off) == 1:
            p = matrix[0][0]
            p_float = float(p)
            if Fraction(p_float) < p:  # round up: a larger p is a larger privacy loss
                p_float = math.nextafter(p_float, 1.0)
            return RandomizedResponseEvent(p_float, k)
        return PureDPEvent(self.guarantee.epsilon)

    def probability_matrix(self) -> tuple[tuple[Fraction, ...], ...]:
        """Exact report probabilities: ``[i][j] = P[report = category j | answer = category i]``.

        Rows and columns follow ``categories`` ((False, True) for a yes/no question).
        """
        return tuple(tuple(row) for row in self._protocol.matrix(self._p, self._encoding.k))

    # -- release ------------------------------------------------------------------------------

    def release(self, x: Any) -> Any:
        """Randomize each answer independently: a scalar or array in, the same shape out."""
        idx, shape = self._encoding.encode("x", x)
        reports = self._protocol.randomize(idx, self._p, self._encoding.k, self.source)
        return self._encoding.decode(reports, shape)

    # -- estimation ---------------------------------------------------------------------------

    def _affine(self) -> tuple[float, float]:
        """(a, b) with E[share of reports in a category] = a + b * (true share of it).

        Binary: the "yes" column (a = P[yes | no], b = P[yes | yes] - P[yes | no]). K-ary: all
        protocols are symmetric, a = the off-diagonal and b = diagonal - off-diagonal.
        """
        m = self._protocol.matrix(self._p, self._encoding.k)
        if isinstance(self._encoding, _BinaryEncoding):
            a, b = m[0][1], m[1][1] - m[0][1]
        else:
            a, b = m[1][0], m[0][0] - m[1][0]
        return float(a), float(b)

    def _counts(self, reports: Any) -> tuple[FloatArray, int]:
        idx, _ = self._encoding.encode("reports", reports)
        if idx.size == 0:
            raise UserError("reports must hold at least one report")
        return np.bincount(idx, minlength=self._encoding.k).astype(np.float64), int(idx.size)

    def estimate(self, reports: Any, alpha: float = 0.05) -> Estimate:
        """Unbiased estimate of the true proportion(s) from released reports.

        With a = P[report c | answer not c] and b = P[report c | answer c] - a, the share of
        reports in category c has expectation a + b * pi_c, so pi_hat_c = (share_c - a) / b is
        unbiased (Lalanne, lesson 1, equation (10), for truth-or-coin: a = (1 - p) / 2, b = p;
        two-coin: a = p - p^2, b = p). Its standard error is estimated by plugging the observed
        share into sqrt(share (1 - share) / n) / b, and the interval is the normal approximation
        pi_hat +- z_{1 - alpha/2} * se, clipped to [0, 1] (asymptotic; use ``exact_interval``
        for a guaranteed coverage).
        """
        alpha = check_alpha(alpha)
        counts, n = self._counts(reports)
        a, b = self._affine()
        z = float(stats.norm.ppf(1 - alpha / 2))
        share = counts / n
        value = (share - a) / b
        se = np.sqrt(share * (1 - share) / n) / b
        low = np.clip(value - z * se, 0.0, 1.0)
        high = np.clip(value + z * se, 0.0, 1.0)
        if isinstance(self._encoding, _BinaryEncoding):
            return Estimate(float(value[1]), (float(low[1]), float(high[1])), float(se[1]), n,
                            alpha)
        return Estimate(_read_only(value), (_read_only(low), _read_only(high)), _read_only(se),
                        n, alpha, self._encoding.values)

    def exact_interval(self, reports: Any, alpha: float = 0.05) -> tuple[Any, Any]:
        """A (1 - alpha) interval for the true proportion(s) with guaranteed coverage.

        The count of reports in a category is Binomial(n, a + b * pi) with a, b as in
        ``estimate``; the two-sided Clopper-Pearson interval for that binomial proportion
        (Clopper and Pearson, Biometrika 1934) covers it with probability >= 1 - alpha, and the
        increasing affine map lambda -> (lambda - a) / b turns it into an interval for pi
        with the same coverage; clipping to [0, 1] loses none. Ends are rounded outward by a
        relative 1e-12 against scipy's rounding. For categories the interval of each category
        covers marginally: arrays (low, high) in category order.
        """
        alpha = check_alpha(alpha)
        counts, n = self._counts(reports)
        a, b = self._affine()
        lam_low = np.where(counts > 0,
                           stats.beta.ppf(alpha / 2, np.maximum(counts, 1), n - counts + 1), 0.0)
        lam_high = np.where(counts < n,
                            stats.beta.ppf(1 - alpha / 2, counts + 1, np.maximum(n - counts, 1)),
                            1.0)
        low = np.clip((lam_low * (1 - _OUTWARD) - a) / b, 0.0, 1.0)
        high = np.clip((lam_high * (1 + _OUTWARD) - a) / b, 0.0, 1.0)
        if isinstance(self._encoding, _BinaryEncoding):
            return float(low[1]), float(high[1])
        return _read_only(low), _read_only(high)

    def confidence_interval(self, alpha: float, n: int) -> float:
        """Worst-case half-width of ``estimate``'s normal interval for n reports.

        The share of reports in a category lies in [a, a + b] whatever the population; its
        variance lambda (1 - lambda) / n is largest at lambda* = the point of [a, a + b] closest
        to 1/2, so the half-width is at most z_{1 - alpha/2} sqrt(lambda* (1 - lambda*) / n) / b
        (the same for every category). This is the error bar to plan a survey with: a larger n
        or epsilon shrinks it.
        """
        alpha = check_alpha(alpha)
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
            raise UserError(f"n must be a positive integer (the number of reports), got {n!r}")
        a, b = self._affine()
        lam = min(max(0.5, a), a + b)
        z = float(stats.norm.ppf(1 - alpha / 2))
        return z * math.sqrt(lam * (1 - lam) / int(n)) / b

    def __repr__(self) -> str:
        cats = "" if self.categories is None else f", categories={list(self.categories)!r}"
        return (f"RandomizedResponse(epsilon={self._epsilon!r}, protocol={self.protocol!r}"
                f"{cats})")
