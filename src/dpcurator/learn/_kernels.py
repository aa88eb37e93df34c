"""Compiled kernels of the private step: norms, truncation onto the grid, exact sums, release.

Each kernel is one pass over arrays the step already has, so that a step costs a few calls
instead of dozens of small tensor operations. Why their results are exact, and why one
example moves the sum by at most C: ``_grads`` (the module docstring). Conventions:

- grid units: a clipped gradient is summed as integers n, standing for n C 2^-GRID_BITS;
- ``factors[i]`` = c_i 2^GRID_BITS / C for example i (its clip factor and the grid in one);
  a factor that is not a positive finite number (a gradient with an infinity or a NaN, whose
  norm is not finite) makes the example contribute exactly nothing;
- float64 sums of integers are exact while every partial sum stays below 2^53: ``ROWS``
  examples of at most 2^GRID_BITS each, whatever the order of summation.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["GRID_BITS", "ROWS"]

#: Clipped gradients are summed on a grid of step C 2^-GRID_BITS.
GRID_BITS = 40
#: Examples summed at once in float64: 2^13 integers of magnitude at most 2^40 stay below 2^53.
ROWS = 1 << (53 - GRID_BITS)


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def squares(x, out, add_one):  # type: ignore[no-untyped-def]
    """out[i] = sum_j float64(x[i, j])^2 (+ 1 when ``add_one``, a linear layer's bias input).

    The squares are computed in float64 (exactly, for float32 values) and summed in whatever
    order the compiler vectorizes (``reassoc``; infinities and NaNs still propagate): a sum
    of d non-negative terms, in any order, is within a relative d 2^-53 of the exact one.
    """
    rows, cols = x.shape
    for i in range(rows):
        total = 1.0 if add_one else 0.0
        for j in range(cols):
            value = np.float64(x[i, j])
            total += value * value
        out[i] = total


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def outer_squares(a, b, add_one, a_out, b_out):  # type: ignore[no-untyped-def]
    """``squares`` of a (+ 1 when ``add_one``) and of b, in one call."""
    rows = a.shape[0]
    for i in range(rows):
        total = 1.0 if add_one else 0.0
        for j in range(a.shape[1]):
            value = np.float64(a[i, j])
            total += value * value
        a_out[i] = total
        total = 0.0
        for j in range(b.shape[1]):
            value = np.float64(b[i, j])
            total += value * value
        b_out[i] = total


@njit(cache=True, nogil=True, error_model="numpy")
def clip(squared, bound, out):  # type: ignore[no-untyped-def]
    """out[i] = min(1, bound / sqrt(squared[i])): 1 for a zero norm, 0 for an infinite one,
    NaN for a NaN (the last two make the example contribute nothing)."""
    for i in range(squared.shape[0]):
        ratio = bound / math.sqrt(squared[i])
        out[i] = 1.0 if ratio >= 1.0 else ratio


@njit(cache=True, nogil=True)
def outer_factors(a, b, a_squares, b_squares, scale, factors, u, v):  # type: ignore[no-untyped-def]
    """The truncated factors of a linear layer's clipped gradients f_i b_i [a_i, 1]^T.

    Example i's gradient is g_i = scale b_i [a_i, 1]^T (the bias entry when ``u`` has one
    more column than a), of norm |g_i| = scale |b_i| |[a_i, 1]| from the squares
    given. With t_i = sqrt(f_i |g_i|): row i of ``u`` is u_i = trunc([a_i, 1] t_i /
    |[a_i, 1]|) and row i of ``v`` is v_i = trunc(b_i t_i / |b_i|), so that |u_i| |v_i| <=
    t_i^2 = f_i |g_i| up to float64 rounding, and the integer matrix v_i u_i^T (each entry at
    most 2^GRID_BITS) is example i's contribution. Examples whose factor is not positive and
    finite get zeros.
    """
    rows, n_in = a.shape
    n_out = b.shape[1]
    bias = u.shape[1] > n_in
    for i in range(rows):
        na = math.sqrt(a_squares[i])
        nb = math.sqrt(b_squares[i])
        t2 = factors[i] * (na * nb * scale)
        if not (t2 > 0.0 and t2 < math.inf and na > 0.0 and nb > 0.0):
            for k in range(u.shape[1]):
                u[i, k] = 0.0
            for o in range(n_out):
                v[i, o] = 0.0
            continue
        t = math.sqrt(t2)
        ta = t / na
        tb = t / nb
        for k in range(n_in):
            u[i, k] = np.trunc(np.float64(a[i, k]) * ta)
        if bias:
            u[i, n_in] = np.trunc(ta)
        for o in range(n_out):
            v[i, o] = np.trunc(np.float64(b[i, o]) * tb)


@njit(cache=True, nogil=True)
def add_outer(product, total, n_in):  # type: ignore[no-untyped-def]
    """total += product^T, an exact integer matrix in float64, in parameter order.

    ``product`` is (n_in, out) for a weight alone, or (n_in + 1, out) for a weight and its
    bias (the last row): total then holds the weight's out x n_in entries, then the bias.
    """
    n_out = product.shape[1]
    for o in range(n_out):
        for k in range(n_in):
            total[o * n_in + k] += np.int64(product[k, o])
    if product.shape[0] > n_in:
        base = n_out * n_in
        for o in range(n_out):
            total[base + o] += np.int64(product[n_in, o])


@njit(cache=True, nogil=True)
def truncated_sum(grads, factors, total):  # type: ignore[no-untyped-def]
    """total += sum_i trunc(float64(grads[i]) f_i), exactly, in one pass.

    Rows are added in float64 (exact: at most ROWS integers of magnitude 2^GRID_BITS stay
    below 2^53), and every ROWS rows the partial sums move into the int64 total.
    """
    rows, cols = grads.shape
    partial = np.zeros(cols, dtype=np.float64)
    for start in range(0, rows, ROWS):
        stop = min(rows, start + ROWS)
        partial[:] = 0.0
        for i in range(start, stop):
            f = factors[i]
            if not (f > 0.0 and f < math.inf):
                continue
            for j in range(cols):
                partial[j] += np.trunc(np.float64(grads[i, j]) * f)
        for j in range(cols):
            total[j] += np.int64(partial[j])


@njit(cache=True, nogil=True)
def release(total, noise, scale, out):  # type: ignore[no-untyped-def]
    """out = (total + noise) scale: the released integers, then post-processing in float."""
    for j in range(total.shape[0]):
        out[j] = np.float64(total[j] + noise[j]) * scale


@njit(cache=True, nogil=True)
def im2col_rows(a, kh, kw, sh, sw, ph, pw, dh, dw, out_w, cols):  # type: ignore[no-untyped-def]
    """cols[i, (c kh + ki) kw + kj, h out_w + w] = a[i, c, h sh - ph + ki dh, w sw - pw + kj dw]
    (0 outside the image): torch's unfold, (B, C kh kw, L). A row past the last, if ``cols``
    has one, is all ones (a bias). Rows of out_w are copied at a time (the better loop when
    the channels are few).
    """
    n, channels, height, width = a.shape
    positions = cols.shape[2]
    out_h = positions // out_w
    rows = channels * kh * kw
    for i in range(n):
        for c in range(channels):
            for ki in range(kh):
                for kj in range(kw):
                    r = (c * kh + ki) * kw + kj
                    for h in range(out_h):
                        y = h * sh - ph + ki * dh
                        base = h * out_w
                        if y < 0 or y >= height:
                            for w in range(out_w):
                                cols[i, r, base + w] = 0.0
                            continue
                        for w in range(out_w):
                            x = w * sw - pw + kj * dw
                            if 0 <= x < width:
                                cols[i, r, base + w] = a[i, c, y, x]
                            else:
                                cols[i, r, base + w] = 0.0
        for r in range(rows, cols.shape[1]):
            for p in range(positions):
                cols[i, r, p] = 1.0


@njit(cache=True, nogil=True)
def im2col_channels(a, kh, kw, sh, sw, ph, pw, dh, dw, out_w, cols):  # type: ignore[no-untyped-def]
    """cols[i, h out_w + w, (ki kw + kj) C + c] = a[i, c, h sh - ph + ki dh, w sw - pw + kj dw]
    (0 outside the image): (B, L, kh kw C), channels innermost (the better loop when the
    channels are many and the image small). A column past the last, if ``cols`` has one, is
    all ones (a bias).
    """
    n, channels, height, width = a.shape
    positions = cols.shape[1]
    out_h = positions // out_w
    columns = kh * kw * channels
    for i in range(n):
        for h in range(out_h):
            for w in range(out_w):
                p = h * out_w + w
                for ki in range(kh):
                    y = h * sh - ph + ki * dh
                    for kj in range(kw):
                        x = w * sw - pw + kj * dw
                        base = (ki * kw + kj) * channels
                        if 0 <= y < height and 0 <= x < width:
                            for c in range(channels):
                                cols[i, p, base + c] = a[i, c, y, x]
                        else:
                            for c in range(channels):
                                cols[i, p, base + c] = 0.0
                for c in range(columns, cols.shape[2]):
                    cols[i, p, c] = 1.0
