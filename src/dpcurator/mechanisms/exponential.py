"""Private selection: the exponential mechanism, permute-and-flip and report-noisy-max.

Each mechanism receives one score per candidate (higher is better) whose sensitivity is Delta:
changing the data by one privacy unit moves every score by at most Delta. It returns one
candidate, chosen so that the choice is epsilon-DP and the chosen score is close to the best.

Exactness. Every random decision is an exact Bernoulli(exp(-gamma)) coin with the *exact*
rational gamma = epsilon * (max - score) / (2 Delta) (floats converted to Fraction exactly), or
an exact uniform integer. The coins are vectorized: each compares a uniformly random 64-bit
word U with the threshold 2^64 exp(-gamma). A double-precision estimate of that threshold,
whose error (below 1e-12 relative, from at most four roundings in gamma and a few ulps in exp)
is covered a thousand times over by a 1e-9 relative margin, settles every word that is clearly
below or above it; the rare word inside the margin (probability about 2e-9 per coin) is settled
by the exact comparison of ``dpcurator.noise`` (floor(2^64 exp(-gamma)) in interval arithmetic,
refined with further random bits on a tie). Floating point only skips work; it never decides.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from dpcurator.accounting import Neighbouring, PureDP
from dpcurator.errors import UserError
from dpcurator.mechanisms._base import Mechanism, as_finite_array, check_alpha, check_positive
from dpcurator.noise import (
    RandomSource,
    below_exp,
    floor_scaled_exp,
    resolve_uniform,
    sample_uniform_int,
)

__all__ = ["Exponential", "PermuteAndFlip", "ReportNoisyMax"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

_SCREEN_MARGIN = 1e-9  # relative margin of the float screen (its true error is < 1e-12)
_TWO_64 = float(2**64)
_MAX_BATCH = 1 << 20  # proposals per vectorized rejection round


def _bernoulli_exp(gamma_float: FloatArray, gamma_exact: Callable[[int], Fraction],
                   source: RandomSource) -> BoolArray:
    """Independent exact Bernoulli(exp(-gamma_i)) coins, one per entry.

    ``gamma_float[i]`` must approximate the exact gamma_i = ``gamma_exact(i)`` >= 0 to a
    relative 1e-12 plus an absolute 1e-300 (or be +inf when gamma_i exceeds the double range);
    only the rare ambiguous entries call ``gamma_exact``. Every entry uses one random word, so
    the running time does not depend on the gammas (but for the rare exact settlements).
    """
    n = gamma_float.size
    words = source.words(n)
    threshold = np.exp(-gamma_float) * _TWO_64  # ~ 2^64 exp(-gamma); 0 when it underflows
    low = threshold * (1 - _SCREEN_MARGIN) - 8.0
    high = threshold * (1 + _SCREEN_MARGIN) + 8.0
    u = words.astype(np.float64)  # within a relative 2^-53 of the word
    # U + 1 <= 2^64 exp(-gamma) proves U / 2^64 + (any further bits) < exp(-gamma): heads.
    heads = u + 1.0 <= low
    # U >= 2^64 exp(-gamma) proves tails.
    ambiguous = ~heads & (u < high)
    for i in np.flatnonzero(ambiguous):
        gamma = gamma_exact(int(i))
        floor_t = floor_scaled_exp(gamma)
        word = int(words[i])
        if word != floor_t:
            heads[i] = word < floor_t
        else:
            heads[i] = resolve_uniform(word, 64, below_exp(gamma), source)
    return heads


class _Selection(Mechanism):
    """What the selection mechanisms share: parameters, validation, labels, utility bound."""

    def __init__(self, *, epsilon: float, sensitivity: float,
                 candidates: Sequence[Any] | None = None, monotonic: bool = False,
                 neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
                 source: RandomSource | None = None) -> None:
        super().__init__(neighbouring=neighbouring, source=source)
        self.epsilon = check_positive("epsilon", epsilon)
        self.sensitivity = check_positive("sensitivity", sensitivity)
        if not isinstance(monotonic, bool):
            raise UserError(f"monotonic must be True or False, got {monotonic!r}")
        self.monotonic = monotonic
        if candidates is not None:
            if isinstance(candidates, str | bytes) or len(candidates) < 1:
                raise UserError("candidates must be a non-empty sequence of labels")
            candidates = tuple(candidates)
        self.candidates: tuple[Any, ...] | None = candidates
        # gamma = rate * (max - score): rate = epsilon / (2 Delta), or epsilon / Delta when
        # monotonic, exactly.
        divisor = Fraction(self.sensitivity) * (1 if monotonic else 2)
        self._rate = Fraction(self.epsilon) / divisor
        # Compared exactly: float() of a rate past ~1.8e308 raises OverflowError.
        if not Fraction(1e-290) < self._rate < Fraction(1e290):
            raise UserError("epsilon / sensitivity must lie between 1e-290 and 1e290, got "
                            f"{self.epsilon!r} / {self.sensitivity!r}")
        self._rate_float = float(self._rate)

    @property
    def guarantee(self) -> PureDP:
        """epsilon-DP for one selection, under this mechanism's neighbouring relation."""
        return PureDP(self.epsilon, neighbouring=self.neighbouring)

    def _scores(self, scores: Any) -> FloatArray:
        raw = np.asarray(scores)
        if raw.dtype.kind in "iu" and raw.size and max(-int(raw.min()), int(raw.max())) > 2**53:
            raise UserError("integer scores must be at most 2^53 in magnitude (exact in float64)")
        arr = as_finite_array("scores", raw)
        if arr.ndim != 1:
            raise UserError(f"scores must be a 1-D array (one score per candidate), got "
                            f"{arr.ndim} dimensions")
        if arr.size == 0:
            raise UserError("scores must not be empty: there is nothing to select")
        if self.candidates is not None and arr.size != len(self.candidates):
            raise UserError(f"scores has {arr.size} entries but there are "
                            f"{len(self.candidates)} candidates")
        return arr

    def _gammas(self, scores: FloatArray) -> tuple[FloatArray, Callable[[int], Fraction]]:
        """Float estimates of gamma_i = rate * (max - score_i), and the exact values."""
        best = float(scores.max())
        with np.errstate(over="ignore"):
            gamma_float = (best - scores) * self._rate_float
        best_exact = Fraction(best)

        def exact(i: int) -> Fraction:
            return self._rate * (best_exact - Fraction(float(scores[i])))

        return gamma_float, exact

    def release(self, scores: Any) -> Any:
        """Select a candidate: its index, or its label when ``candidates`` were given."""
        index = self._select(self._scores(scores))
        return index if self.candidates is None else self.candidates[index]

    @abstractmethod
    def _select(self, scores: FloatArray) -> int:
        """The index of the selected candidate."""

    def accuracy(self, alpha: float, n_candidates: int) -> float:
        """With probability >= 1 - alpha, the chosen score is >= max - this bound.

        Bound: (2 Delta / epsilon) ln(n / alpha), or (Delta / epsilon) ln(n / alpha) when
        monotonic. For all three mechanisms a candidate r is output with probability at most
        exp(-gamma_r) (exponential mechanism: its normalizer is >= 1 after dividing by the
        best term; permute-and-flip: r must win its own coin), so the chance of any candidate
        more than t below the best is at most n exp(-rate t) (Dwork and Roth 2014, Theorem
        3.11; McSherry and Talwar 2007).
        """
        alpha = check_alpha(alpha)
        if isinstance(n_candidates, bool) or not isinstance(n_candidates, int | np.integer) \
                or n_candidates < 1:
            raise UserError(f"n_candidates must be a positive integer, got {n_candidates!r}")
        return math.log(int(n_candidates) / alpha) / self._rate_float

    def confidence_interval(self, alpha: float, n_candidates: int) -> tuple[float, float]:
        """An interval for (chosen score - best score) holding with probability >= 1 - alpha.

        ``(-accuracy(alpha, n_candidates), 0.0)``: the chosen score never exceeds the best.
        """
        return (-self.accuracy(alpha, n_candidates), 0.0)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(epsilon={self.epsilon!r}, "
                f"sensitivity={self.sensitivity!r}, monotonic={self.monotonic!r})")


class Exponential(_Selection):
    """The exponential mechanism: P[choose r] proportional to exp(epsilon score_r / (2 Delta)).

    With ``monotonic=True`` (every score moves in the same direction when a unit is added or
    removed, as counts do) the weight is exp(epsilon score_r / Delta).

    Guarantee: ``PureDP(epsilon)`` under ``neighbouring`` (add/remove one unit by default;
    Delta must be the scores' sensitivity under that same relation). Source: McSherry and
    Talwar, "Mechanism design via differential privacy" (FOCS 2007), Theorem 6; Dwork and
    Roth, "The algorithmic foundations of differential privacy" (2014), Theorem 3.10.
    Utility: ``accuracy`` (Dwork and Roth, Theorem 3.11).

    Sampling (exact rejection): propose a candidate r uniformly (exact uniform integer) and
    accept it with probability exp(-epsilon (max - score_r) / (2 Delta)) (an exact coin with the
    exact rational exponent); an accepted proposal has exactly the target distribution.
    Proposals are made in vectorized batches of max(8 n, 64) (at most 2^20) and the first
    accepted one in the batch is taken. The best candidate is always accepted, so a batch fails
    with probability at most (1 - 1/n)^batch <= e^-8 for n <= 2^17: the running time depends on
    the scores only through that rare extra batch.
    """

    def _select(self, scores: FloatArray) -> int:
        n = scores.size
        if n == 1:
            return 0
        gamma_float, exact = self._gammas(scores)
        batch = min(max(8 * n, 64), _MAX_BATCH)
        src = self.source
        while True:
            proposals = sample_uniform_int(n, batch, src)

            def exact_proposal(i: int, proposals: npt.NDArray[np.int64] = proposals) -> Fraction:
                return exact(int(proposals[i]))

            accepted = _bernoulli_exp(gamma_float[proposals], exact_proposal, src)
            if accepted.any():
                return int(proposals[int(np.argmax(accepted))])


class PermuteAndFlip(_Selection):
    """Permute-and-flip: visit candidates in random order, stop at r with prob. exp(-gamma_r).

    gamma_r = epsilon (max - score_r) / (2 Delta) (epsilon (max - score_r) / Delta when
    ``monotonic``). The best candidate stops with probability 1. Its expected error is never
    larger than the exponential mechanism's and can be half of it.

    Guarantee: ``PureDP(epsilon)`` under ``neighbouring``. Source: McKenna and Sheldon,
    "Permute-and-flip: a new mechanism for differentially private selection" (NeurIPS 2020),
    Theorem 1. The monotonic variant follows from its equality with report-noisy-max with
    exponential noise of scale Delta / epsilon (Ding, Kifer et al. 2021), whose winner's noise
    threshold moves by at most Delta when all scores move the same way by at most Delta.
    Utility: ``accuracy``.

    Sampling (exact, time independent of the scores): flip every candidate's coin (exact
    Bernoulli(exp(-gamma_r))) and return a uniformly random candidate among those whose coin
    came up heads. Since the visiting order is uniform and independent of the coins, the first
    heads in that order is uniform over the set of heads, so this is the same distribution;
    coins the sequential version would never reach are independent and change nothing.
    """

    def _select(self, scores: FloatArray) -> int:
        gamma_float, exact = self._gammas(scores)
        src = self.source
        heads = np.flatnonzero(_bernoulli_exp(gamma_float, exact, src))
        return int(heads[int(sample_uniform_int(heads.size, 1, src)[0])])


NoiseName = Literal["gumbel", "exponential"]


class ReportNoisyMax(Mechanism):
    """Report-noisy-max: add noise to each score and report the index of the largest.

    Implemented exactly through its distributional equivalences, never with float noise:

    - ``noise="gumbel"`` with scale 2 Delta / epsilon (Delta / epsilon when monotonic): the
      arg-max is distributed exactly as the exponential mechanism (the Gumbel-max identity,
      e.g. Durfee and Rogers, NeurIPS 2019, Lemma 4.2), so ``Exponential`` runs.
    - ``noise="exponential"`` with the same scale: the arg-max is distributed exactly as
      permute-and-flip (Ding, Kifer, Wang and Zhang, "The permute-and-flip mechanism is
      identical to report-noisy-max with exponential noise", 2021), so ``PermuteAndFlip``
      runs.

    Laplace noise has no such exact equivalent here and is not offered.

    Guarantee: ``PureDP(epsilon)`` under ``neighbouring``, as the equivalent mechanism.
    """

    def __init__(self, *, epsilon: float, sensitivity: float, noise: NoiseName = "gumbel",
                 candidates: Sequence[Any] | None = None, monotonic: bool = False,
                 neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
                 source: RandomSource | None = None) -> None:
        super().__init__(neighbouring=neighbouring, source=source)
        kinds: dict[str, type[_Selection]] = {"gumbel": Exponential,
                                              "exponential": PermuteAndFlip}
        if noise not in kinds:
            raise UserError(f"noise must be 'gumbel' or 'exponential', got {noise!r}")
        self.noise = noise
        self.equivalent: _Selection = kinds[noise](
            epsilon=epsilon, sensitivity=sensitivity, candidates=candidates,
            monotonic=monotonic, neighbouring=neighbouring, source=source)
        self.epsilon = self.equivalent.epsilon
        self.sensitivity = self.equivalent.sensitivity
        self.monotonic = monotonic
        self.candidates = self.equivalent.candidates

    @property
    def noise_scale(self) -> float:
        """The scale of the Gumbel or exponential noise this mechanism is equivalent to."""
        return self.sensitivity * (1 if self.monotonic else 2) / self.epsilon

    @property
    def guarantee(self) -> PureDP:
        return self.equivalent.guarantee

    def release(self, scores: Any) -> Any:
        """The (label of the) candidate with the largest noisy score."""
        return self.equivalent.release(scores)

    def accuracy(self, alpha: float, n_candidates: int) -> float:
        """As ``Exponential.accuracy`` / ``PermuteAndFlip.accuracy``."""
        return self.equivalent.accuracy(alpha, n_candidates)

    def confidence_interval(self, alpha: float, n_candidates: int) -> tuple[float, float]:
        """As ``Exponential.confidence_interval``."""
        return self.equivalent.confidence_interval(alpha, n_candidates)

    def __repr__(self) -> str:
        return (f"ReportNoisyMax(epsilon={self.epsilon!r}, sensitivity={self.sensitivity!r}, "
                f"noise={self.noise!r}, monotonic={self.monotonic!r})")
