"""Exact samplers over the integers, vectorized, from a ``RandomSource``.

Every sampler here draws from *exactly* the distribution its docstring names: decisions are
made by comparing uniform random words with exactly computed thresholds, and the rare word
that lands too close to a threshold for 64 bits to settle is settled by drawing more bits and
comparing in rigorous interval arithmetic (see ``_exact``). Floating point is used only to
guess and to skip work, never to decide.

Parameters (scales, probabilities) may be given as ``int``, ``float`` or ``fractions.Fraction``;
a float is taken at its exact binary value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from dpcurator.errors import UserError, UserTypeError
from dpcurator.noise import _exact, _kernels
from dpcurator.noise.source import RandomSource, resolve_source

__all__ = [
    "MAX_SCALE",
    "sample_bernoulli",
    "sample_bernoulli_exp",
    "sample_discrete_gaussian",
    "sample_discrete_laplace",
    "sample_uniform_int",
]

Real = int | float | Fraction
Size = int | tuple[int, ...]

_CHUNK = 1 << 18  # samples per kernel call: bounds the memory of the word pool
_PENDING_CAPACITY = 64
#: The largest scale (discrete Laplace) or sigma (discrete Gaussian) the samplers draw with;
#: mechanisms refuse a larger one when they are built, not when they release.
MAX_SCALE = Fraction(2) ** 56
_MAX_SCALE = MAX_SCALE


def _as_fraction(name: str, value: Real) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, int | float | Fraction):
        raise UserTypeError(f"{name} must be a real number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{name} must be finite, got {value!r}")
    return Fraction(value)


def _count(size: Size) -> tuple[int, tuple[int, ...]]:
    shape = (size,) if isinstance(size, int) else tuple(size)
    if any((not isinstance(d, int)) or d < 0 for d in shape):
        raise UserError(f"size must be a non-negative int or tuple of them, got {size!r}")
    return math.prod(shape), shape


# ---------------------------------------------------------------------------------------------
# Bernoulli and uniform integers: vectorized numpy, one word per draw.


def sample_bernoulli(
    p: Real, size: Size, source: RandomSource | None = None
) -> npt.NDArray[np.bool_]:
    """Exact Bernoulli(p) draws for rational p in [0, 1]."""
    prob = _as_fraction("p", p)
    if not 0 <= prob <= 1:
        raise UserError(f"p must lie in [0, 1], got {p!r}")
    return _threshold_draws(
        _exact.floor_scaled_rational(prob), _exact.below_rational(prob), size, source
    )


def sample_bernoulli_exp(
    gamma: Real, size: Size, source: RandomSource | None = None
) -> npt.NDArray[np.bool_]:
    """Exact Bernoulli(exp(-gamma)) draws for rational gamma >= 0."""
    g = _as_fraction("gamma", gamma)
    if g < 0:
        raise UserError(f"gamma must be >= 0, got {gamma!r}")
    return _threshold_draws(_bernoulli_exp_threshold(g), _exact.below_exp(g), size, source)


@lru_cache(maxsize=4096)
def _bernoulli_exp_threshold(gamma: Fraction) -> int:
    return _exact.floor_scaled_exp(gamma)


def _threshold_draws(
    threshold: int, decide: _exact.Decision[bool], size: Size, source: RandomSource | None
) -> npt.NDArray[np.bool_]:
    """U < p decided by U's first 64 bits against floor(2^64 p); ties settled exactly."""
    n, shape = _count(size)
    src = resolve_source(source)
    if threshold >= 1 << 64:  # p == 1
        return np.ones(shape, dtype=np.bool_)
    words = src.words(n)
    out = words < np.uint64(threshold)
    for i in np.flatnonzero(words == np.uint64(threshold)):
        out[i] = _exact.resolve_uniform(int(words[i]), 64, decide, src)
    return out.reshape(shape)


def sample_uniform_int(
    high: int, size: Size, source: RandomSource | None = None
) -> npt.NDArray[np.int64]:
    """Exact uniform draws from {0, ..., high - 1}, 1 <= high <= 2^63 (rejection sampling)."""
    if isinstance(high, bool) or not isinstance(high, int | np.integer) or not 1 <= high <= 2**63:
        raise UserError(f"high must be an integer in [1, 2^63], got {high!r}")
    n, shape = _count(size)
    src = resolve_source(source)
    if high & (high - 1) == 0:  # a power of two: the top bits of a word are exactly uniform
        bits = int(high).bit_length() - 1
        if bits == 0:
            return np.zeros(shape, dtype=np.int64)
        return (src.words(n) >> np.uint64(64 - bits)).astype(np.int64).reshape(shape)
    high_u = np.uint64(high)
    # Accept words below the largest multiple of `high`; each residue is then equally likely.
    excess = (1 << 64) % int(high)
    limit = np.uint64((1 << 64) - excess) if excess else None
    out = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        words = src.words(todo.size)
        ok = words < limit if limit is not None else np.ones(todo.size, dtype=np.bool_)
        out[todo[ok]] = (words[ok] % high_u).astype(np.int64)
        todo = todo[~ok]
    return out.reshape(shape)


# ---------------------------------------------------------------------------------------------
# Discrete Laplace and discrete Gaussian: compiled trials, exact settlement of pending ones.


@dataclass(frozen=True)
class _LaplaceTable:
    """Everything a discrete Laplace trial needs for scale t (see ``_kernels._laplace_trial``)."""

    t: Fraction
    low_bits: int  # M = 2^low_bits <= t / 8 for t >= 16; 0 (the folded layout) below
    table: npt.NDArray[np.uint64]  # table[a] = floor(2^64 f exp(-a M / t)), a = 1..k_max
    k_max: int  # first a with table[a] == 0

    @property
    def t_float(self) -> float:
        return float(self.t)

    @property
    def kernel_params(self) -> tuple[Any, ...]:
        """The arguments every compiled trial takes after (words, out, start), in order."""
        return (self.table, self.k_max, self.low_bits, self.t_float, self.log_f)

    @property
    def rate(self) -> Fraction:
        return Fraction(1 << self.low_bits) / self.t

    @property
    def folded(self) -> bool:
        """Small scales read |Y| off the table directly: prefactor f = 2 / (1 + e^(-1/t))."""
        return self.low_bits == 0

    @property
    def log_f(self) -> float:
        return math.log(2 / (1 + math.exp(-1 / self.t_float))) if self.folded else 0.0


@lru_cache(maxsize=256)
def _laplace_table(t: Fraction) -> _LaplaceTable:
    low_bits = max(0, math.floor(math.log2(t / 8))) if t >= 16 else 0
    while low_bits > 0 and Fraction(1 << low_bits) > t / 8:  # guard the float log2
        low_bits -= 1
    rate = Fraction(1 << low_bits) / t
    thresholds = [(1 << 64) - 1]
    while thresholds[-1] > 0:
        a = len(thresholds)
        if low_bits == 0:
            thresholds.append(_exact.floor_scaled_folded_exp(rate, a))
        else:
            thresholds.append(_exact.floor_scaled_exp(rate * a))
    return _LaplaceTable(t, low_bits, np.array(thresholds, dtype=np.uint64), len(thresholds) - 1)


def _exact_laplace_trial(
    words: tuple[int, int, int], tab: _LaplaceTable, src: RandomSource
) -> int | None:
    """The discrete Laplace trial, decided exactly; None when the trial is rejected."""
    u, w, v = words
    a = _exact.resolve_uniform(u, 64, _exact.geometric_count(tab.rate, tab.folded), src)
    negative = bool(w & 1)
    if tab.folded:
        return -a if negative else a
    low = w >> (64 - tab.low_bits) if tab.low_bits else 0
    if low > 0 and not _exact.resolve_uniform(v, 64, _exact.below_exp(Fraction(low) / tab.t), src):
        return None
    magnitude = a * (1 << tab.low_bits) + low
    if magnitude == 0 and negative:
        return None
    return -magnitude if negative else magnitude


def _check_scale(name: str, value: Real) -> Fraction:
    scale = _as_fraction(name, value)
    if scale <= 0:
        raise UserError(f"{name} must be > 0, got {value!r}")
    if scale > _MAX_SCALE:
        raise UserError(f"{name} must be at most 2^56, got {value!r}")
    return scale


def sample_discrete_laplace(
    scale: Real, size: Size, source: RandomSource | None = None
) -> npt.NDArray[np.int64]:
    """Exact draws of the discrete Laplace distribution P[Y = y] ∝ exp(-|y| / scale) on Z.

    Also called the two-sided geometric distribution (Ghosh, Roughgarden and Sundararajan
    2009). Uses 3 random words per trial and about 1.07 trials per sample.
    """
    t = _check_scale("scale", scale)
    tab = _laplace_table(t)
    n, shape = _count(size)
    src = resolve_source(source)

    def settle(w: tuple[int, ...]) -> int | None:
        return _exact_laplace_trial((w[0], w[1], w[2]), tab, src)

    kernel = _kernels.discrete_laplace_kernel
    return _drive(kernel, tab.kernel_params, settle, 3, 1.1, n, src).reshape(shape)


def sample_discrete_gaussian(
    sigma: Real, size: Size, source: RandomSource | None = None
) -> npt.NDArray[np.int64]:
    """Exact draws of the discrete Gaussian P[Y = y] ∝ exp(-y^2 / (2 sigma^2)) on Z.

    Canonne, Kamath and Steinke, "The discrete Gaussian for differential privacy" (NeurIPS
    2020), Algorithm 3: discrete Laplace proposals with scale floor(sigma) + 1, each kept with
    probability exp(-(|y| - sigma^2 / t)^2 / (2 sigma^2)).
    """
    s = _check_scale("sigma", sigma)
    sigma2 = s * s
    t = Fraction(math.floor(s) + 1)
    tab = _laplace_table(t)
    n, shape = _count(size)
    src = resolve_source(source)
    shift = sigma2 / t
    sigma2_float = float(sigma2)

    def settle(w: tuple[int, ...]) -> int | None:
        y = _exact_laplace_trial((w[0], w[1], w[2]), tab, src)
        if y is None:
            return None
        gamma = (abs(y) - shift) ** 2 / (2 * sigma2)
        return y if _exact.resolve_uniform(w[3], 64, _exact.below_exp(gamma), src) else None

    kernel = _kernels.discrete_gaussian_kernel
    params = (*tab.kernel_params, sigma2_float)
    return _drive(kernel, params, settle, 4, 1.6, n, src).reshape(shape)


def _drive(
    kernel: Callable[..., tuple[int, int]],
    params: tuple[Any, ...],
    settle: Callable[[tuple[int, ...]], int | None],
    words_per_trial: int,
    trials_per_sample: float,
    n: int,
    src: RandomSource,
) -> npt.NDArray[np.int64]:
    """Call a kernel over fresh word pools until ``n`` samples exist; settle pending trials.

    A pending trial is settled exactly; if it turns out rejected, its slot gets a fresh,
    independent sample (a rejected trial's successor is a fresh trial in any case).
    """
    out = np.empty(n, dtype=np.int64)
    p_index = np.empty(_PENDING_CAPACITY, dtype=np.int64)
    p_words = np.empty((_PENDING_CAPACITY, words_per_trial), dtype=np.uint64)
    start = 0
    redo: list[int] = []
    while start < n:
        todo = min(n - start, _CHUNK)
        pool = src.words(int(todo * trials_per_sample * words_per_trial) + 4 * words_per_trial)
        start, n_pending = kernel(pool, out, start, *params, p_index, p_words)
        for k in range(n_pending):
            value = settle(tuple(int(x) for x in p_words[k]))
            if value is None:
                redo.append(int(p_index[k]))
            else:
                out[p_index[k]] = value
    for index in redo:
        out[index] = _drive(kernel, params, settle, words_per_trial, trials_per_sample, 1, src)[0]
    return out
