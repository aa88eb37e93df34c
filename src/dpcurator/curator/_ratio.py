"""Intervals for ratios of noisy measures (AVG's mean S / C, VARIANCE's second moment Q / C).

Released: a noisy count c~ = C + Z_c and a noisy (centred) total s~ = S + Z_s, with Z_c, Z_s
independent, symmetric and of known law (the mechanisms' noise, public). The parameter is the
ratio r = S / C (C >= 1 in any partition with a value; r lies in a known range [lo, hi]).

**Pivot.** At the true r, s~ - r c~ = Z_s - r Z_c, whose law depends on r alone. So
p(r) = P[|Z_s - r Z_c| >= |s~ - r c~|] is a valid p-value (P[p(r) <= alpha] <= alpha at the true
r, for any law: the probability integral transform of |Z_s - r Z_c|), and the set
{r in [lo, hi] : p(r) > alpha} covers the true ratio with probability at least 1 - alpha,
*exactly* at level 1 - alpha up to the steps below (no union bound over the two measures, no
worst case over a box: the old AVG interval, built from a box of two alpha / 2 intervals,
covered 99.1% at 95%).

**Computing it, conservatively.** The tail T(r, d) = P[|Z_s - r Z_c| >= d] is computed from the
law of |Z_c| in blocks: P[|Z_c| in block i] = m_i exactly (or bounded above), |Z_c| <= t_i in
block i; given Z_c = z, P[|Z_s - r z| >= d] = F(d + |r z|) + F(d - |r z|) (F the upper tail of
Z_s), which grows with |r z| (Anderson: Z_s is symmetric and unimodal). Hence

    T(r, d) <= sum_i m_i (F(d + |r| t_i) + F(d - |r| t_i)) + P[|Z_c| beyond the blocks],

and this bound grows with |r| and falls with d. On a cell [r1, r2] of the range, p(r) is at most
that bound at |r| = max(|r1|, |r2|) and d = min over the cell of |s~ - r c~|: a cell is dropped
only when this is <= alpha, so no r with p(r) > alpha is ever dropped. The interval is the hull
of the cells kept (32 cells over the range, each end cell refined 16-fold, four times: to 2^-21
of the range); where none is kept, it is the point estimate (a miss, counted within alpha).

An integer discrete Laplace count with a Laplace total has T(r, d) in closed form
(``RatioPivot._geometric``, exact), and so does a count on a fine fixed-point grid (partition
rescaling), taken as continuous (``RatioPivot._continuous``). Otherwise, blocks: integer
noises of scale below 32 units use single integers (exact), larger ones blocks of 1/16 of a
scale, with t_i the block's top, a coarsening that only widens. Z_s is a fixed-point noise on
a grid 2^-20 of its scale or finer, taken as its continuous law (Laplace: F(x) = e^(-x/b) / 2;
Gaussian: Phi(-x / sigma)), whose tails it matches to about 2^-20 relative; and the discrete
Gaussian's law of |Z_c| for sigma above 4096 units is the continuous one (error below 2e-9).
These and the outside mass (below 1e-12) are the only approximations, each below 1e-6 in
probability.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import special

from dpcurator.mechanisms import DiscreteGaussian, DiscreteLaplace

__all__ = ["FoldedNoise", "RatioPivot", "refine_end"]

FloatArray = npt.NDArray[np.float64]
CELLS = 32
REFINE = 16  # subcells per refinement of an end cell, four times: 2^-21 of the range
_LEVELS = 4
_BLOCKS_PER_SCALE = 16
_REACH = 30  # scales (Laplace) of |Z_c| covered by the blocks (outside: < 1e-13)
_GAUSS_REACH = 10  # sigmas (Gaussian; outside: < 1e-22)
_FINE = float(2**20)  # a noise scale from which the fixed-point grid is taken as continuous
_NEAR = 1e-3  # Laplace scales this close (relative) are moved apart, upward
_CHUNK = 1 << 21  # (pairs x blocks) evaluated at once: bounds the memory


@dataclass(frozen=True)
class FoldedNoise:
    """|Z| of a symmetric noise in blocks (real units): P[|Z| in block i] = ``mass[i]`` and
    |Z| <= ``top[i]`` there; ``outside`` bounds the mass beyond the last block.

    A noise on a fine fixed-point grid (scale of 2^20 units or more) is instead its continuous
    law, ``continuous`` = its Laplace scale or normal sigma in real units (no blocks)."""

    mass: FloatArray
    top: FloatArray
    outside: float
    continuous: float | None = None
    geometric: tuple[float, float] | None = None  # discrete Laplace: (scale t, unit)

    @classmethod
    def of(cls, mechanism: DiscreteLaplace | DiscreteGaussian, unit: float) -> FoldedNoise:
        """The folded law of ``mechanism``'s noise, one integer unit being worth ``unit``."""
        empty = np.zeros(0, dtype=np.float64)
        if isinstance(mechanism, DiscreteLaplace):
            t = float(mechanism.scale)
            if t >= _FINE:
                return cls(empty, empty, 0.0, t * unit)
            geometric = (t, unit)
            width = max(1, math.floor(t / _BLOCKS_PER_SCALE))
            blocks = math.ceil(_REACH * t / width) + 1
            starts = np.arange(blocks + 1, dtype=np.float64) * width  # block i: [s_i, s_i+1)
            log_norm = math.log1p(math.exp(-1.0 / t))
            # P[|Z| >= m] = 2 q^m / (1 + q) for m >= 1, and 1 at m = 0.
            at_least = np.where(starts >= 1, 2 * np.exp(-starts / t - log_norm), 1.0)
            mass = at_least[:-1] - at_least[1:]
            return cls(mass, (starts[1:] - 1) * unit, float(at_least[-1]), None, geometric)
        sigma = float(mechanism.noise_sigma(1))
        if sigma >= _FINE:
            return cls(empty, empty, 0.0, sigma * unit)
        width = max(1, math.floor(sigma / _BLOCKS_PER_SCALE))
        blocks = math.ceil(_GAUSS_REACH * sigma / width) + 1
        starts = np.arange(blocks + 1, dtype=np.float64) * width
        if sigma <= 4096:
            z = np.arange(0, int(starts[-1]) + 1, dtype=np.float64)
            weights = np.exp(-0.5 * (z / sigma) ** 2)
            total = weights[0] + 2 * weights[1:].sum()
            folded = np.where(z == 0, weights, 2 * weights) / total
            tail = np.append(np.cumsum(folded[::-1])[::-1], 0.0)
            at_least = tail[starts.astype(np.int64)]
            outside = 2 * float(special.ndtr(-(starts[-1] - 1) / sigma)) + 1e-15
        else:
            at_least = np.where(starts >= 1, 2 * special.ndtr(-(starts - 0.5) / sigma), 1.0)
            outside = float(at_least[-1]) + 1e-8
        mass = np.maximum(at_least[:-1] - at_least[1:], 0.0)
        return cls(mass, (starts[1:] - 1) * unit, outside)


@dataclass(frozen=True)
class NumeratorNoise:
    """Z_s, taken as its continuous law: Laplace of scale ``scale`` or normal of sd ``scale``
    (real units)."""

    kind: str
    scale: float

    @classmethod
    def of(cls, mechanism: DiscreteLaplace | DiscreteGaussian, unit: float) -> NumeratorNoise:
        if isinstance(mechanism, DiscreteLaplace):
            return cls("laplace", float(mechanism.scale) * unit)
        return cls("gaussian", float(mechanism.noise_sigma(1)) * unit)

    def away(self, d: FloatArray, shift: FloatArray) -> FloatArray:
        """P[|Z_s - shift| >= d] = F(d + shift) + F(d - shift) for d, shift >= 0 (F the upper
        tail: e^(-x / b) / 2 for x >= 0 and 1 - e^(x / b) / 2 below, or Phi(-x / sigma))."""
        if self.kind == "laplace":
            gap = d - shift
            near = 0.5 * np.exp(-np.abs(gap) / self.scale)
            far = 0.5 * np.exp(-(d + shift) / self.scale)
            return np.asarray(np.where(gap >= 0, near, 1.0 - near) + far, dtype=np.float64)
        return np.asarray(special.ndtr(-(d + shift) / self.scale)
                          + special.ndtr(-(d - shift) / self.scale), dtype=np.float64)


@dataclass(frozen=True)
class RatioPivot:
    """(1 - alpha) intervals for r = S / C in [lo, hi] from c~ and s~ (module docstring)."""

    count: FoldedNoise
    total: NumeratorNoise

    def tail_bound(self, r: FloatArray, d: FloatArray) -> FloatArray:
        """Upper bounds on P[|Z_s - r Z_c| >= d], elementwise over arrays r, d (same shape)."""
        if self.count.continuous is not None:
            return self._continuous(np.abs(np.asarray(r, dtype=np.float64)),
                                    np.asarray(d, dtype=np.float64), self.count.continuous)
        if self.count.geometric is not None and self.total.kind == "laplace":
            return self._geometric(np.abs(np.asarray(r, dtype=np.float64)),
                                   np.asarray(d, dtype=np.float64), *self.count.geometric)
        flat_r = np.abs(np.asarray(r, dtype=np.float64)).ravel()
        flat_d = np.asarray(d, dtype=np.float64).ravel()
        out = np.empty(flat_r.size, dtype=np.float64)
        step = max(1, _CHUNK // self.count.top.size)
        for start in range(0, flat_r.size, step):
            stop = start + step
            shift = flat_r[start:stop, None] * self.count.top  # (chunk, blocks)
            per_block = self.total.away(flat_d[start:stop, None], shift)
            out[start:stop] = per_block @ self.count.mass + self.count.outside
        return out.reshape(np.shape(r))

    def _continuous(self, r: FloatArray, d: FloatArray, scale: float) -> FloatArray:
        """Both noises continuous: P[|Z_s + r Z_c| >= d] in closed form. Two Laplaces of scales
        b1, b2: (b1^2 e^(-d/b1) - b2^2 e^(-d/b2)) / (b1^2 - b2^2) (the tail of their sum, from
        the convolution of the densities), with b2 raised to b1 (1 + 1e-3) where it is that
        close to b1 (the tail grows with b2: only widens); two normals: 2 Phi(-d / sigma)."""
        if self.total.kind == "laplace":
            b1 = self.total.scale
            b2 = r * scale
            b2 = np.where(np.abs(b2 - b1) < _NEAR * b1, b1 * (1 + _NEAR), b2)
            with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
                second = np.where(b2 > 0, b2 * b2 * np.exp(-d / np.maximum(b2, 1e-300)), 0.0)
                value = (b1 * b1 * np.exp(-d / b1) - second) / (b1 * b1 - b2 * b2)
            return np.asarray(np.clip(value, 0.0, 1.0), dtype=np.float64)
        sigma = np.sqrt(self.total.scale**2 + (r * scale) ** 2)
        return np.asarray(2 * special.ndtr(-d / sigma), dtype=np.float64)

    def _geometric(self, r: FloatArray, d: FloatArray, t: float, unit: float) -> FloatArray:
        """Integer discrete Laplace count noise (scale t units of ``unit``) and a Laplace total
        (scale b): T(r, d) exactly, in closed form. With q = e^(-1/t), p0 = (1 - q) / (1 + q)
        (so P[|Z_c| = 0] = p0, P[|Z_c| = z] = 2 p0 q^z), a = |r| unit, z0 = floor(d / a):

            T = sum_z P(z) [F(d + a z) + F(d - a z)],  F(x) = e^(-x/b) / 2 (x >= 0),
                                                        F(x) = 1 - e^(x/b) / 2 (x < 0),

        three geometric series: all z with F(d + a z); z <= z0 with F(d - a z) >= ... below
        1/2; z > z0 with 1 - e^((d - a z) / b) / 2. Evaluated in logarithms (every term is at
        most q^z), so nothing overflows."""
        b = self.total.scale
        log_q = -1.0 / t
        q = math.exp(log_q)
        p0 = -math.expm1(log_q) / (1.0 + q)
        a = r * unit
        e_d = np.exp(-d / b)
        kappa = np.exp(log_q - a / b)  # q e^(-a/b) < 1
        first = 0.5 * p0 * e_d + p0 * e_d * kappa / (1.0 - kappa)  # all z, F(d + a z)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            z0 = np.where(a > 0, np.floor(d / np.where(a > 0, a, 1.0)), np.inf)
            lam = log_q + a / b  # log of the ratio q e^(a/b)
            # sum_{z=1}^{z0} exp(z lam - d / b) = exp(lam - d/b) (e^(z0 lam) - 1) / (e^lam - 1)
            z0_finite = np.where(np.isfinite(z0), z0, 0.0)
            top = np.exp(lam - d / b + z0_finite * lam) - np.exp(lam - d / b)
            ratio = np.expm1(lam)
            series = np.where(np.abs(lam) < 1e-12, z0_finite * np.exp(lam - d / b),
                              top / np.where(ratio == 0, 1.0, ratio))
            infinite = np.exp(lam - d / b) / -np.expm1(lam)  # z0 = inf (a = 0): lam = log q
            series = np.where(np.isfinite(z0), series, infinite)
            second = 0.5 * p0 * e_d + p0 * series  # z <= z0, F(d - a z) = e^(-(d-az)/b) / 2
            # z > z0: P[|Z_c| > z0] - p0 sum_{z > z0} exp(z log q + (d - a z) / b)
            beyond = np.where(np.isfinite(z0), 2 * np.exp((z0_finite + 1) * log_q) / (1 + q)
                              - p0 * np.exp((z0_finite + 1) * (log_q - a / b) + d / b)
                              / (1.0 - kappa), 0.0)
        return np.asarray(np.clip(first + second + beyond, 0.0, 1.0), dtype=np.float64)

    def interval(self, count: FloatArray, total: FloatArray, alpha: float, lo: float,
                 hi: float, point: FloatArray) -> tuple[FloatArray, FloatArray]:
        """The hull of the kept cells of [lo, hi], per partition; ``point`` where none is."""
        c = np.asarray(count, dtype=np.float64)[:, None]
        s = np.asarray(total, dtype=np.float64)[:, None]
        edges = np.linspace(lo, hi, CELLS + 1)
        kept = self._kept(c, s, edges[:-1][None, :], edges[1:][None, :], alpha)
        any_kept = kept.any(axis=1)
        first = np.where(any_kept, kept.argmax(axis=1), 0)
        last = np.where(any_kept, CELLS - 1 - kept[:, ::-1].argmax(axis=1), 0)
        low = self._refine(c, s, edges[first], edges[first + 1], alpha, from_below=True)
        high = self._refine(c, s, edges[last], edges[last + 1], alpha, from_below=False)
        value = np.asarray(point, dtype=np.float64)
        return np.where(any_kept, low, value), np.where(any_kept, high, value)

    def _kept(self, c: FloatArray, s: FloatArray, a: FloatArray, b: FloatArray,
              alpha: float) -> npt.NDArray[np.bool_]:
        """Cells [a, b] that may hold an r with p(r) > alpha (broadcast: partitions x cells)."""
        at_a, at_b = s - a * c, s - b * c
        crosses = np.sign(at_a) != np.sign(at_b)
        d = np.where(crosses, 0.0, np.minimum(np.abs(at_a), np.abs(at_b)))
        far = np.maximum(np.abs(a), np.abs(b))
        far, d = np.broadcast_arrays(far, d)
        return np.asarray(self.tail_bound(far, d) > alpha)

    def _refine(self, c: FloatArray, s: FloatArray, a: FloatArray, b: FloatArray,
                alpha: float, from_below: bool) -> FloatArray:
        return refine_end(lambda lo, hi: self._kept(c, s, lo, hi, alpha), a, b, from_below,
                          _LEVELS)


def refine_end(kept: Callable[[FloatArray, FloatArray], npt.NDArray[np.bool_]],
               a: FloatArray, b: FloatArray, from_below: bool, levels: int) -> FloatArray:
    """The end of the kept set within the end cell [a, b] (per row): split it in REFINE
    subcells and keep the first (last) kept one, ``levels`` times; its outer edge is the end.
    Where no subcell is kept, every point of the cell is excluded, and its inner edge is the
    end. ``kept(lo, hi)`` says, per row and subcell, whether [lo, hi] may hold a kept value."""
    a, b = a.copy(), b.copy()
    done = np.zeros(a.shape, dtype=np.bool_)
    rows = np.arange(a.size)
    fractions = np.linspace(0.0, 1.0, REFINE + 1)[None, :]
    for _ in range(levels):
        edges = a[:, None] + (b - a)[:, None] * fractions
        inside = kept(edges[:, :-1], edges[:, 1:])
        found = inside.any(axis=1) & ~done
        if from_below:
            index = inside.argmax(axis=1)
            a_new = np.where(found, edges[rows, index], b)
            b_new = np.where(found, edges[rows, index + 1], b)
        else:
            index = REFINE - 1 - inside[:, ::-1].argmax(axis=1)
            a_new = np.where(found, edges[rows, index], a)
            b_new = np.where(found, edges[rows, index + 1], a)
        a, b = np.where(done, a, a_new), np.where(done, b, b_new)
        done |= ~found
    return a if from_below else b
