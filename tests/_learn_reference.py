"""Plain references for the exact clipped sums of ``dpcurator.learn``: one example at a time,
in Python integers, as ``_grads``' docstring specifies them (shared by the CPU and device
tests)."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]


def truncated_reference(held: Floats, factors: Floats) -> tuple[list[int], list[int]]:
    """sum_i trunc(g_ij f_i) over the rows of ``held`` (B, d), and each example's |z_i|^2; an
    example whose factor is not positive and finite contributes nothing."""
    total = [0] * held.shape[1]
    norms = []
    for i in range(held.shape[0]):
        f = float(factors[i])
        if not (f > 0 and math.isfinite(f)):
            norms.append(0)
            continue
        z = [int(v) for v in np.trunc(held[i] * f)]
        norms.append(sum(x * x for x in z))
        total = [s + x for s, x in zip(total, z, strict=True)]
    return total, norms


def outer_reference(a: Floats, b: Floats, *, bias: bool, scale: float, factors: Floats,
                    a2: Floats | None = None, b2: Floats | None = None
                    ) -> tuple[list[int], list[int]]:
    """The exact sum of v_i u_i^T in parameter order (the weight's out x in entries, then the
    bias), and each |v_i|^2 |u_i|^2, from u_i = trunc([a_i, 1] t_i / |[a_i, 1]|) and
    v_i = trunc(b_i t_i / |b_i|), t_i^2 = f_i |[a_i, 1]| |b_i| scale. ``a2``, ``b2``: the
    squares to use (by default numpy's sums)."""
    n, n_in = a.shape
    n_out = b.shape[1]
    total = [[0] * (n_in + bias) for _ in range(n_out)]
    norms = []
    for i in range(n):
        a_sq = float(a2[i]) if a2 is not None else float(np.sum(a[i] * a[i])) + float(bias)
        b_sq = float(b2[i]) if b2 is not None else float(np.sum(b[i] * b[i]))
        na, nb = math.sqrt(a_sq), math.sqrt(b_sq)
        t2 = float(factors[i]) * (na * nb * scale)
        if not (t2 > 0 and math.isfinite(t2) and na > 0 and nb > 0):
            norms.append(0)
            continue
        t = math.sqrt(t2)
        u = [int(np.trunc(a[i, k] * (t / na))) for k in range(n_in)]
        if bias:
            u.append(int(np.trunc(t / na)))
        v = [int(np.trunc(b[i, o] * (t / nb))) for o in range(n_out)]
        norms.append(sum(x * x for x in u) * sum(y * y for y in v))
        for o in range(n_out):
            row = total[o]
            for k, uk in enumerate(u):
                row[k] += v[o] * uk
    flat = [total[o][k] for o in range(n_out) for k in range(n_in)]
    if bias:
        flat += [total[o][n_in] for o in range(n_out)]
    return flat, norms
