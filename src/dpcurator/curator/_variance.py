"""Intervals for VARIANCE / STDDEV from one pivot on the mean and the variance together.

Released: a noisy count c~ = C + Z_c, a noisy centred sum s~ = S + Z_s (S = sum of x - mid)
and a noisy centred sum of squares q~ = Q + Z_q (Q = sum of (x - mid)^2), with independent
symmetric noises of known law; mid is the bounds' midpoint. The parameters: the centred mean
mu = S / C and the population variance v = Q / C - mu^2.

**Pivot.** At the true (mu, v), Q - 2 mu S + mu^2 C = sum of (x - mid - mu)^2 = C v, so

    R(mu, v) = q~ - 2 mu s~ + (mu^2 - v) c~ = Z_q - 2 mu Z_s + (mu^2 - v) Z_c,

whose law depends on (mu, v) alone; and s~ - mu c~ = Z_s - mu Z_c (the mean's pivot,
``_ratio``). A pair (mu, v) is rejected when the mean's p-value is at most alpha_mu or
P[|Z_q - 2 mu Z_s + (mu^2 - v) Z_c| >= |R(mu, v)|] is at most alpha_v: the true pair is
rejected with probability at most alpha_mu + alpha_v = alpha, and the interval is the range
of v over the pairs kept (a projection: valid, and only slightly wide, because the mean
enters R exactly rather than through the worst case of mu^2 over its interval, which is
what inflated the old construction most when the mean lies far from the midpoint: it
covered 100% there with intervals 10 times the variance).

**Computing it, conservatively.** The mean's interval [m1, m2] (at alpha_mu) is split in
``MEAN_CELLS`` cells; for each, the v range [0, half^2] in ``CELLS`` cells, refined at both
ends (``_ratio``'s search). A box [mu_a, mu_b] x [v_a, v_b] is dropped only when the tail at
the box's largest noise coefficients (|2 mu| and |mu^2 - v|; the tail grows with each, by
Anderson's theorem, every noise being symmetric and unimodal) and the box's smallest |R| is at
most alpha_v. R is a quadratic in mu (its extremes at the ends and the vertex s~ / c~) minus
v c~, so its range over a box is exact. The tail of Z_q - 2 mu Z_s + b Z_c, in closed form
where it can be had: the noises continuous (fixed point on a grid fine enough, as ``_ratio``
takes them), a sum of three Laplaces or of three normals; an integer discrete Laplace Z_c of
scale t is floor(E1) - floor(E2) for exponentials of mean t, within 1 of the continuous
Laplace E1 - E2, so the tail at d is at most the continuous one at d - |b|. Otherwise (a
discrete Gaussian count) Z_c in blocks, each at its top (``_ratio``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import special

from ._ratio import CELLS, FoldedNoise, NumeratorNoise, refine_end

__all__ = ["VariancePivot", "sum_upper"]

FloatArray = npt.NDArray[np.float64]
MEAN_CELLS = 4  # finer cells narrow the intervals by under 0.1% (measured), at 4x the cost
_LEVELS = 3
_NEAR = 1e-3  # Laplace scales this close (relative) are moved apart, upward
_APART = 0.01  # three Laplace scales: at least this far apart (relative), moved upward
_CHUNK = 1 << 21  # (pairs x blocks) evaluated at once


def sum_upper(kind: str, first: float, second: FloatArray, x: FloatArray) -> FloatArray:
    """P[X >= x] for X = Z_1 + Z_2, independent, of one kind: two Laplaces of scales
    ``first`` > 0 and ``second`` >= 0 (an array, broadcast with x), or two normals of those
    sigmas. Laplaces: for x >= 0, (b1^2 e^(-x/b1) - b2^2 e^(-x/b2)) / (2 (b1^2 - b2^2)) (from
    the convolution of the densities; where b2 is within 1e-3 of b1 it is raised to
    b1 (1 + 1e-3): the tail only grows), and 1 - P[X >= -x] below 0. Normals:
    Phi(-x / sqrt(s1^2 + s2^2))."""
    x = np.asarray(x, dtype=np.float64)
    b2 = np.asarray(second, dtype=np.float64)
    if kind == "gaussian":
        return np.asarray(special.ndtr(-x / np.sqrt(first * first + b2 * b2)),
                          dtype=np.float64)
    b1 = first
    y = np.abs(x)
    close = np.abs(b2 - b1) < _NEAR * b1
    b2 = np.where(close, b1 * (1 + _NEAR), b2)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        second_term = np.where(b2 > 0, b2 * b2 * np.exp(-y / np.maximum(b2, 1e-300)), 0.0)
        tail = (b1 * b1 * np.exp(-y / b1) - second_term) / (2 * (b1 * b1 - b2 * b2))
    tail = np.where(b2 > 0, tail, 0.5 * np.exp(-y / b1))
    tail = np.clip(tail, 0.0, 0.5)
    return np.asarray(np.where(x >= 0, tail, 1.0 - tail), dtype=np.float64)


def _continuous_tail(kind: str, b1: float, b2: FloatArray, b3: FloatArray, d: FloatArray
                     ) -> FloatArray:
    """P[|Z_1 + Z_2 + Z_3| >= d] for independent continuous noises of one kind and scales
    b1 > 0, b2, b3 >= 0 (arrays). Normals: 2 Phi(-d / sqrt(b1^2 + b2^2 + b3^2)). Laplaces:
    sum_i A_i e^(-d / b_i) with A_i = prod_(j != i) b_i^2 / (b_i^2 - b_j^2) (the partial
    fractions of the product of their characteristic functions 1 / (1 + b^2 t^2)), after
    raising each scale to at least 1e-9 b1 and the sorted scales to 1% apart: a larger
    scale only makes the tail heavier (Anderson), and 1% apart keeps the cancellation in
    the sum below 1e-12. Computed in units of b1 (the tail depends only on the ratios), so
    that squares of tiny scales do not underflow: bounds 1e-85 wide made every weight 0 / 0
    and every interval a point that covered nothing (a bug hunt)."""
    d = np.asarray(d, dtype=np.float64) / b1
    b2, b3 = np.broadcast_arrays(np.asarray(b2, dtype=np.float64) / b1,
                                 np.asarray(b3, dtype=np.float64) / b1)
    b1 = 1.0
    if kind == "gaussian":
        sigma = np.sqrt(b1 * b1 + b2 * b2 + b3 * b3)
        return np.asarray(np.clip(2 * special.ndtr(-d / sigma), 0.0, 1.0), dtype=np.float64)
    scales = np.sort(np.stack([np.full(b2.shape, b1), b2, b3], axis=-1), axis=-1)
    scales = np.maximum(scales, 1e-9 * b1)
    for k in (1, 2):
        scales[..., k] = np.maximum(scales[..., k], scales[..., k - 1] * (1 + _APART))
    squares = scales * scales
    total = np.zeros(np.broadcast_shapes(d.shape, b2.shape), dtype=np.float64)
    for i in range(3):
        weight = np.ones_like(squares[..., 0])
        for j in range(3):
            if j != i:
                weight = weight * squares[..., i] / (squares[..., i] - squares[..., j])
        total = total + weight * np.exp(-d / scales[..., i])
    return np.asarray(np.clip(total, 0.0, 1.0), dtype=np.float64)


@dataclass(frozen=True)
class VariancePivot:
    """(1 - alpha) intervals for the population variance (module docstring)."""

    count: FoldedNoise  # ``FoldedNoise.of`` the count's mechanism
    total: NumeratorNoise
    squares: NumeratorNoise

    def interval(self, count: FloatArray, total: FloatArray, squares: FloatArray,
                 mean_interval: tuple[FloatArray, FloatArray], alpha_v: float, top: float,
                 point: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Per partition, the range of v in [0, top] over the kept (mu, v) boxes, with mu in
        ``mean_interval`` (the centred mean's interval at alpha_mu); ``point`` where none is
        kept (a miss, within alpha)."""
        c = np.asarray(count, dtype=np.float64)
        s = np.asarray(total, dtype=np.float64)
        q = np.asarray(squares, dtype=np.float64)
        m1, m2 = (np.asarray(m, dtype=np.float64) for m in mean_interval)
        # one row per (partition, mean cell), searched together
        fractions = np.linspace(0.0, 1.0, MEAN_CELLS + 1)
        mu_a = (m1[:, None] + (m2 - m1)[:, None] * fractions[None, :-1]).ravel()
        mu_b = (m1[:, None] + (m2 - m1)[:, None] * fractions[None, 1:]).ravel()
        c_rows, s_rows, q_rows = (np.repeat(x, MEAN_CELLS) for x in (c, s, q))
        g_lo, g_hi = _range_of_r(c_rows, s_rows, q_rows, mu_a, mu_b)
        reach = 2 * np.maximum(np.abs(mu_a), np.abs(mu_b))
        sq_lo = np.where((mu_a <= 0) & (mu_b >= 0), 0.0, np.minimum(mu_a * mu_a, mu_b * mu_b))
        sq_hi = np.maximum(mu_a * mu_a, mu_b * mu_b)
        search = _Search(self.count, self.total, self.squares, c_rows, g_lo, g_hi, reach,
                         sq_lo, sq_hi, alpha_v)
        found, v_lo, v_hi = search.run(top)
        shape = (c.size, MEAN_CELLS)
        found = found.reshape(shape)
        low = np.where(found, v_lo.reshape(shape), np.inf).min(axis=1)
        high = np.where(found, v_hi.reshape(shape), -np.inf).max(axis=1)
        kept = found.any(axis=1)
        value = np.asarray(point, dtype=np.float64)
        return np.where(kept, low, value), np.where(kept, high, value)


def _range_of_r(c: FloatArray, s: FloatArray, q: FloatArray, mu_a: FloatArray,
                mu_b: FloatArray) -> tuple[FloatArray, FloatArray]:
    """The range of g(mu) = q - 2 mu s + mu^2 c over [mu_a, mu_b]: its ends and, where it
    lies inside, its vertex s / c."""
    def g(mu: FloatArray) -> FloatArray:
        return np.asarray(q - 2 * mu * s + mu * mu * c, dtype=np.float64)

    at_a, at_b = g(mu_a), g(mu_b)
    with np.errstate(divide="ignore", invalid="ignore"):
        vertex = np.where(c != 0, s / np.where(c != 0, c, 1.0), mu_a)
    inside = (vertex > mu_a) & (vertex < mu_b)
    at_v = np.where(inside, g(np.clip(vertex, mu_a, mu_b)), at_a)
    return np.minimum(np.minimum(at_a, at_b), at_v), np.maximum(np.maximum(at_a, at_b), at_v)


@dataclass
class _Search:
    """The kept v cells of one mean cell, per partition: R over a box is [g_lo - max(v c),
    g_hi - min(v c)]; its noise is at most Z_q + reach Z_s + max|mu^2 - v| Z_c."""

    count: FoldedNoise
    total: NumeratorNoise
    squares: NumeratorNoise
    c: FloatArray
    g_lo: FloatArray
    g_hi: FloatArray
    reach: FloatArray
    sq_lo: FloatArray
    sq_hi: FloatArray
    alpha: float

    def _tail(self, reach: FloatArray, coefficient: FloatArray, d: FloatArray) -> FloatArray:
        """Upper bounds on P[|Z_q + a Z_s + b Z_c| >= d] at |a| = reach, |b| = coefficient,
        elementwise: given |Z_c| in block i (|Z_c| <= top_i), Z_q + a Z_s + b Z_c is at least
        as likely to be far as with b Z_c = b top_i (Anderson), summed over the blocks."""
        if self.count.continuous is not None:  # a count on a fine grid, taken as continuous
            return _continuous_tail(self.squares.kind, self.squares.scale,
                                    reach * self.total.scale, coefficient * self.count.continuous,
                                    d)
        if self.count.geometric is not None and self.squares.kind == "laplace":
            # An integer discrete Laplace Z of scale t is floor(E1) - floor(E2), E1, E2 iid
            # exponential of mean t (floor(E) is geometric with q = e^(-1/t)), so Z = X + U
            # with X = E1 - E2 a continuous Laplace of scale t and |U| < 1: |b Z| moves the
            # residual by at most |b| unit more than |b X| does.
            t, unit = self.count.geometric
            shifted = np.maximum(d - coefficient * unit, 0.0)
            return _continuous_tail("laplace", self.squares.scale, reach * self.total.scale,
                                    coefficient * (t * unit), shifted)
        flat_reach = np.broadcast_to(reach, d.shape).ravel()
        flat_coef = np.broadcast_to(coefficient, d.shape).ravel()
        flat_d = d.ravel()
        top, mass = self.count.top, self.count.mass
        out = np.empty(flat_d.size, dtype=np.float64)
        step = max(1, _CHUNK // max(1, top.size))
        kind, first = self.squares.kind, self.squares.scale
        for start in range(0, flat_d.size, step):
            rows = slice(start, start + step)
            shift = flat_coef[rows, None] * top[None, :]
            second = flat_reach[rows, None] * self.total.scale
            near = sum_upper(kind, first, second, flat_d[rows, None] + shift)
            back = sum_upper(kind, first, second, flat_d[rows, None] - shift)
            out[rows] = (near + back) @ mass + self.count.outside
        return out.reshape(d.shape)

    def _kept(self, va: FloatArray, vb: FloatArray) -> npt.NDArray[np.bool_]:
        c = self.c[:, None]
        vc_lo = np.minimum(va * c, vb * c)
        vc_hi = np.maximum(va * c, vb * c)
        lo = self.g_lo[:, None] - vc_hi
        hi = self.g_hi[:, None] - vc_lo
        d = np.where((lo <= 0) & (hi >= 0), 0.0, np.minimum(np.abs(lo), np.abs(hi)))
        coefficient = np.maximum(np.abs(self.sq_hi[:, None] - va),
                                 np.abs(self.sq_lo[:, None] - vb))
        reach = np.broadcast_to(self.reach[:, None], d.shape)
        return np.asarray(self._tail(reach, coefficient, d) > self.alpha)

    def run(self, top: float) -> tuple[npt.NDArray[np.bool_], FloatArray, FloatArray]:
        n = self.c.size
        edges = np.linspace(0.0, top, CELLS + 1)
        va = np.broadcast_to(edges[:-1][None, :], (n, CELLS))
        vb = np.broadcast_to(edges[1:][None, :], (n, CELLS))
        kept = self._kept(va, vb)
        found = np.asarray(kept.any(axis=1), dtype=np.bool_)
        first = np.where(found, kept.argmax(axis=1), 0)
        last = np.where(found, CELLS - 1 - kept[:, ::-1].argmax(axis=1), 0)
        low = self._refine(edges[first], edges[first + 1], from_below=True)
        high = self._refine(edges[last], edges[last + 1], from_below=False)
        return found, low, high

    def _refine(self, a: FloatArray, b: FloatArray, from_below: bool) -> FloatArray:
        return refine_end(self._kept, a, b, from_below, _LEVELS)
