"""Numerical kernels of the PLD accountant (private; the public surface is ``accounting.pld``).

A discretized privacy loss distribution (one direction) is stored as a vector ``probs`` on the
uniform grid of losses ``(offset + i) * h`` plus an ``infinity_mass``. Every routine here keeps
the stored distribution *pessimistic*: the hockey-stick curve delta(eps) it implies is, for every
eps, at least the curve of the distribution it approximates. The tools for that are

- **connect the dots** (Doroshenko, Ghazi, Kamath, Kumar and Manurangsi, "Connect the dots:
  tighter discrete approximations of privacy loss distributions", PETS 2022): the probability
  that a cell (a, b] of the grid holds, under both distributions P and Q of the pair, is split
  between the two end points so that both the P-mass and the Q-mass are kept. The resulting
  delta(eps) is the chord, in the variable alpha = e^eps, of the true curve between grid points,
  and the true curve is convex in alpha, so the chord lies above it; at grid points they agree.
  The mass below the lowest grid point is moved up to it (the chord to delta(alpha=0) = 1) and
  the mass above the highest grid point is split between that point and +infinity;
- **moving mass up**: tail mass that is cut off is moved to a higher loss (the lowest kept grid
  point, or +infinity). delta(eps) = E[max(0, 1 - e^(eps - L))] is non-decreasing in L, so a
  stochastically larger loss has a larger curve, and composition (a sum of independent losses)
  keeps that order;
- **Chernoff tail bounds** for the FFT window of a self-composition (see ``self_convolve``).

Losses too large for a grid (single steps above ``MAX_FINITE_LOSS``) go to +infinity, never to a
finite loss; nothing is ever dropped.

Floating-point rounding is not bounded rigorously: ``FLOAT_GUARD`` covers it relative to delta,
and a self-composition adds an estimate of its FFT's rounding, which grows with the count (see
``_power_rounding``), at the largest reachable loss.

Cost: no grid or window exceeds ``MAX_GRID_POINTS`` (a continuous single step
``MAX_STEP_POINTS``), which bounds memory (about 200 MiB at most for one accounting) and time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import fft as sp_fft
from scipy import signal

from dpcurator.errors import UserError

__all__ = [
    "FLOAT_GUARD",
    "MAX_GRID_POINTS",
    "MAX_STEP_POINTS",
    "FloatArray",
    "GridTooLargeError",
    "RawPmf",
    "atoms_to_grid",
    "connect_the_dots",
    "convolve",
    "delta_at",
    "dot",
    "epsilon_for",
    "self_convolve",
    "self_convolve_all",
    "symmetrize",
    "top_segment",
    "truncate_tails",
]

FloatArray = npt.NDArray[np.float64]

#: delta(eps) is reported as (1 + FLOAT_GUARD) times the computed value. Rounding in the
#: cumulative sums and FFTs has relative size about 1e-13 at the deltas people use (1e-10 and
#: up); the factor keeps the reported value above the exact one despite it.
FLOAT_GUARD = 1e-9

#: Largest grid (single step or FFT window) the accountant builds: 2^22 points, 32 MiB each.
#: A composition holds a handful of arrays of this size at once (the window, its spectrum, the
#: powered spectrum, the rotated result), so one accounting peaks near 200 MiB of working memory
#: and well under a second per grid; the automatic grid widens its interval to stay within it.
MAX_GRID_POINTS = 1 << 22

#: Largest single-step grid of a continuous profile: its tail tables and connect the dots
#: hold about twenty arrays of this size at once (2^18 points: about 40 MiB).
MAX_STEP_POINTS = MAX_GRID_POINTS // 16

# An atom whose loss / h is within this many ulps of an integer lies on that grid point.
_SNAP_ULPS = 64.0 * np.finfo(np.float64).eps
# Losses above this are treated as +infinity (e^700 is near the float64 limit).
MAX_FINITE_LOSS = 500.0


class GridTooLargeError(UserError):
    """A grid or FFT window would exceed ``MAX_GRID_POINTS`` (or ``MAX_STEP_POINTS``)."""


@dataclass(frozen=True, slots=True, eq=False)
class RawPmf:
    """Losses (offset + i) * h with probability probs[i]; +infinity with infinity_mass."""

    offset: int
    probs: FloatArray
    infinity_mass: float


def dot(a: FloatArray, b: FloatArray) -> float:
    """sum(a * b), summed by numpy rather than BLAS.

    OpenBLAS splits a long dot product over threads; on a busy machine the threads wait for
    cores, and one call over 35,000 points was measured at 8 ms against 0.03 ms this way.
    """
    return float(np.sum(a * b))


def _trim(offset: int, probs: FloatArray, infinity_mass: float) -> RawPmf:
    """Drop exact zeros at both ends (at least one entry is kept)."""
    nonzero = probs != 0
    first = int(nonzero.argmax())
    if not nonzero[first]:
        return RawPmf(offset, np.zeros(1), infinity_mass)
    last = probs.size - 1 - int(nonzero[::-1].argmax())
    return RawPmf(offset + first, np.ascontiguousarray(probs[first : last + 1]), infinity_mass)


def _prefix_within(probs: FloatArray, limit: float) -> tuple[int, float]:
    """The largest k with sum(probs[:k]) <= limit, and that sum (probs >= 0).

    Sums blocks first and runs a cumulative sum only inside the block where the limit is
    crossed: a tail cut usually takes a small part of a long array, and a full cumulative sum
    is sequential (about 4 ns a point) where block sums vectorize.
    """
    block = 512
    whole = probs.size // block
    start, base = 0, 0.0
    if whole:
        running = np.cumsum(probs[: whole * block].reshape(whole, block).sum(axis=1))
        j = int(np.searchsorted(running, limit, side="right"))  # blocks wholly within
        if j:
            start, base = j * block, float(running[j - 1])
    inside = base + np.cumsum(probs[start : start + block])
    m = int(np.searchsorted(inside, limit, side="right"))
    return start + m, float(inside[m - 1]) if m else base


def connect_the_dots(
    offset: int,
    cell_p: FloatArray,
    cell_q: FloatArray,
    h: float,
    *,
    below_p: float = 0.0,
    top_p: float = 0.0,
    top_q: float = 0.0,
    infinity_mass: float = 0.0,
) -> RawPmf:
    """Pessimistic grid PMF from the masses of the cells of the grid.

    Cell i is the loss interval (a_i, b_i] = ((offset + i) h, (offset + i + 1) h]; cell_p[i] and
    cell_q[i] are P[L in cell] and Q[L in cell] (Q is the second distribution of the pair, under
    which dQ = e^(-L) dP). The cell's P-mass goes to a_i and b_i in the unique proportions that
    keep both masses: to b_i goes (P - e^(a_i) Q) / (1 - e^(-h)). ``below_p`` = P[L <= a_0] goes
    to a_0; the top cell (a_n, inf) with masses top_p, top_q sends e^(a_n) top_q to a_n and the
    rest to +infinity (its delta at a_n).
    """
    n = cell_p.size
    lower = (offset + np.arange(n, dtype=np.float64)) * h
    # e^(a_i) is capped at e^MAX_FINITE_LOSS: a smaller factor sends more mass up (pessimistic)
    # and no product inf * 0 = nan can send a cell's mass down to a_i.
    with np.errstate(over="ignore", invalid="ignore"):
        up = (cell_p - np.exp(np.minimum(lower, MAX_FINITE_LOSS)) * cell_q) / (-math.expm1(-h))
    up = np.where(np.isfinite(up), up, cell_p)
    up = np.minimum(np.maximum(up, 0.0), cell_p)
    probs = np.zeros(n + 1)
    probs[1:] += up
    probs[:-1] += cell_p - up
    probs[0] += below_p
    to_top = 0.0
    if top_p > 0.0:
        top_loss = (offset + n) * h
        to_top = min(top_p, math.exp(min(top_loss, MAX_FINITE_LOSS)) * top_q)
        probs[n] += to_top
    return _trim(offset, probs, infinity_mass + (top_p - to_top))


def atoms_to_grid(
    losses: FloatArray, masses: FloatArray, h: float, infinity_mass: float = 0.0
) -> RawPmf:
    """Pessimistic grid PMF of a finite set of atoms (loss, P-mass).

    An atom on a grid point stays there (exactly); one strictly inside a cell is split between
    the cell's end points keeping its P-mass and its Q-mass p e^(-loss) (connect the dots for a
    one-atom cell; the atom is a post-processing of the two end points, so nothing is lost).
    Atoms above ``MAX_FINITE_LOSS`` go to +infinity.
    """
    losses = np.asarray(losses, dtype=np.float64)
    masses = np.asarray(masses, dtype=np.float64)
    keep = masses > 0
    losses, masses = losses[keep], masses[keep]
    huge = losses > MAX_FINITE_LOSS
    infinity_mass += float(masses[huge].sum())
    losses, masses = losses[~huge], masses[~huge]
    if losses.size == 0:
        return RawPmf(0, np.zeros(1), infinity_mass)
    x = losses / h
    nearest = np.rint(x)
    on_grid = np.abs(x - nearest) <= _SNAP_ULPS * np.maximum(1.0, np.abs(x))
    on_index = nearest[on_grid].astype(np.int64)
    cell_index = np.floor(x[~on_grid]).astype(np.int64)
    lo_candidates = [on_index.min()] if on_index.size else []
    hi_candidates = [on_index.max()] if on_index.size else []
    if cell_index.size:
        lo_candidates.append(cell_index.min())
        hi_candidates.append(cell_index.max() + 1)
    lo, hi = int(min(lo_candidates)), int(max(hi_candidates))
    if hi - lo + 1 > MAX_GRID_POINTS:
        raise GridTooLargeError(
            f"value_discretization_interval={h:g} is too fine for losses spanning "
            f"[{lo * h:g}, {hi * h:g}]: increase it"
        )
    n_cells = max(hi - lo, 1)
    off_losses, off_masses = losses[~on_grid], masses[~on_grid]
    cell_p = np.bincount(cell_index - lo, weights=off_masses, minlength=n_cells)[:n_cells]
    cell_q = np.bincount(
        cell_index - lo, weights=off_masses * np.exp(-off_losses), minlength=n_cells
    )[:n_cells]
    split = connect_the_dots(lo, cell_p.astype(np.float64), cell_q.astype(np.float64), h)
    probs = np.zeros(n_cells + 1)
    start = split.offset - lo
    probs[start : start + split.probs.size] += split.probs
    probs += np.bincount(on_index - lo, weights=masses[on_grid], minlength=n_cells + 1)[
        : n_cells + 1
    ]
    return _trim(lo, probs, infinity_mass + split.infinity_mass)


def truncate_tails(pmf: RawPmf, tail_mass: float, *, owned: bool = False) -> RawPmf:
    """Cut both tails, each of mass at most ``tail_mass``, moving their mass *up*.

    The lower tail is moved to the lowest kept grid point, the upper tail to +infinity; both
    moves make the loss stochastically larger, so delta(eps) can only grow. ``owned``: the
    caller's ``pmf.probs`` may be changed in place (the result is then a view of it).
    """
    probs = pmf.probs
    if tail_mass <= 0 or probs.size <= 1:
        return _trim(pmf.offset, probs, pmf.infinity_mass)
    first, below = _prefix_within(probs, tail_mass)  # probs[:first] holds `below` <= tail
    cut_top, above = _prefix_within(probs[::-1], tail_mass)  # the top cut_top entries
    last = probs.size - 1 - cut_top
    if first > last:  # everything is tail: keep the heaviest entry's neighbourhood whole
        return _trim(pmf.offset, probs, pmf.infinity_mass)
    kept = probs[first : last + 1] if owned else probs[first : last + 1].copy()
    kept[0] += below
    return _trim(pmf.offset + first, kept, pmf.infinity_mass + above)


def _finite_and_total(pmf: RawPmf) -> tuple[float, float]:
    finite = float(pmf.probs.sum())
    return finite, finite + pmf.infinity_mass


def convolve(a: RawPmf, b: RawPmf, tail_mass: float) -> RawPmf:
    """The distribution of the sum of independent losses (composition), tails truncated."""
    if a.probs.size * b.probs.size <= 1 << 16:
        probs = np.convolve(a.probs, b.probs)
    else:
        probs = signal.fftconvolve(a.probs, b.probs)
    probs = np.maximum(probs, 0.0)
    fa, _ = _finite_and_total(a)
    _, tb = _finite_and_total(b)
    # A sum is +infinity when either term is; no mass sits at -infinity.
    infinity_mass = fa * b.infinity_mass + a.infinity_mass * tb
    return truncate_tails(RawPmf(a.offset + b.offset, probs, infinity_mass), tail_mass, owned=True)


def _some_run_infinite(pmf: RawPmf, count: int) -> float:
    """total^count - finite^count: the mass of the compositions in which some run is infinite.

    A small infinity mass (a tail of 1e-300 at delta = 0) is lost to cancellation in that
    difference, so below a share of 1e-6 it is written as total^count (1 - (finite /
    total)^count) with expm1 and log1p; above, the difference is accurate to 1e-10 of itself.
    """
    finite, total = _finite_and_total(pmf)
    if pmf.infinity_mass <= 0.0 or total <= 0.0:
        return 0.0
    share = min(pmf.infinity_mass / total, 1.0)
    if share >= 1e-6:
        return min(total**count - finite**count, 1.0)
    return min(total**count * -math.expm1(count * math.log1p(-share)), 1.0)


def _log_mgf(probs: FloatArray, offset: int, lambdas: FloatArray) -> FloatArray:
    """log sum_i probs[i] exp(lambda (offset + i)) for each lambda (grid units), stably."""
    with np.errstate(divide="ignore"):
        logp = np.log(probs)
    idx = offset + np.arange(probs.size, dtype=np.float64)
    out = np.empty(lambdas.size)
    # Blocks of lambdas keep the temporary matrix small.
    for start in range(0, lambdas.size, 8):
        lam = lambdas[start : start + 8, None]
        z = logp[None, :] + lam * idx[None, :]
        m = np.max(z, axis=1)
        out[start : start + 8] = m + np.log(np.sum(np.exp(z - m[:, None]), axis=1))
    return out


# Chernoff exponents tried first when sizing a window, in units of 1 / (sd of the composed
# loss): six decades in steps of 10^0.4; then a finer grid between the neighbours of the best.
_UNIT_LAMBDAS = np.geomspace(1e-2, 1e4, 16)
_REFINE_LAMBDAS = np.geomspace(10**-0.4, 10**0.4, 13)


def _coarse(probs: FloatArray, offset: int, points: int = 256) -> tuple[FloatArray, FloatArray]:
    """Block sums of probs at each block's mean index, blocks without mass left out.

    An approximation of the distribution for the search of Chernoff exponents only.
    """
    n = probs.size
    block = -(-n // points)
    if block <= 1:
        mass, mean_idx = probs, offset + np.arange(n, dtype=np.float64)
    else:
        padded = np.zeros(-(-n // block) * block)
        padded[:n] = probs
        blocks = padded.reshape(-1, block)
        mass = blocks.sum(axis=1)
        idx = offset + np.arange(padded.size, dtype=np.float64).reshape(-1, block)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_idx = (blocks * idx).sum(axis=1) / mass
    keep = mass > 0
    return mass[keep], mean_idx[keep]


def _chernoff_thresholds(
    mass: FloatArray, idx: FloatArray, lambdas: FloatArray, count: int, log_tail: float
) -> FloatArray:
    """The Chernoff thresholds u(lambda) = (count log M(lambda) - log tail) / lambda.

    M is the moment generating function of the masses at the indices (lambda > 0: P[S >= u]
    <= tail above u; lambda < 0: the same below, in units of -index). The sum is shifted by
    the extreme index in lambda's direction, whose mass is positive (the PMF is trimmed), so
    no term overflows and the sum is at least that mass.
    """
    top = np.where(lambdas > 0, idx[-1], idx[0])
    terms = lambdas[:, None] * (idx[None, :] - top[:, None])
    # Terms under e^-700 of the top one do not matter for a search; dropping them outright
    # spares exp its slow path for arguments that underflow.
    terms[terms < -700.0] = -np.inf
    np.exp(terms, out=terms)
    log_m = lambdas * top + np.log(np.einsum("ij,j->i", terms, mass))
    out: FloatArray = (count * log_m - log_tail) / np.abs(lambdas)
    return out


def _best_lambdas(
    mass: FloatArray, idx: FloatArray, spread: float, count: int, log_tail: float
) -> tuple[float, float]:
    """Exponents lambda > 0 (nearly) minimising the Chernoff thresholds above and below.

    u(lambda) is unimodal in lambda (g = count log M - log tail is convex, and positive at 0
    unless nearly all mass is infinite, so {u <= c} = {g(lambda) <= c lambda} is an interval):
    a geometric grid over six decades finds the basin, a finer grid around its best point the
    bottom. Both run on a coarsened copy of the step (``_coarse``); 256 blocks keep the windows
    of heavy-tailed steps within a few percent of the best exponent's. Only the window's size
    depends on the choice, never its soundness (see ``self_convolve``).
    """
    lambdas = _UNIT_LAMBDAS / spread
    k = lambdas.size
    first = _chernoff_thresholds(mass, idx, np.concatenate([lambdas, -lambdas]), count, log_tail)
    up = float(lambdas[int(np.argmin(first[:k]))]) * _REFINE_LAMBDAS
    down = float(lambdas[int(np.argmin(first[k:]))]) * _REFINE_LAMBDAS
    second = _chernoff_thresholds(mass, idx, np.concatenate([up, -down]), count, log_tail)
    j = _REFINE_LAMBDAS.size
    return float(up[int(np.argmin(second[:j]))]), float(down[int(np.argmin(second[j:]))])


# A Fourier coefficient whose power is below this in modulus is set to zero (see _power).
_NEGLIGIBLE = 1e-40


def _power(z: npt.NDArray[np.complex128], n: int) -> npt.NDArray[np.complex128]:
    """z ** n elementwise, for the spectrum of an n-fold composition; z is consumed.

    A coefficient with |z|^n < 1e-40 is set to 0 instead: every entry of the inverse transform
    is an average of the coefficients times factors of modulus 1, so this moves each by less
    than 2e-40, far below the rounding of the transforms themselves (about 1e-17 of the total
    mass; see ``FLOAT_GUARD``). For large n that is nearly every coefficient (a composition is
    smooth, so its spectrum is narrow: about 60 of 13,500 survive for 10,000 DP-SGD steps).
    The rest are powered by repeated squaring (about 2 log2(n) multiplications), whose
    relative rounding error grows like n * eps, as for exp(n log z), at a fraction of the cost
    of the transcendental functions.
    """
    magnitude2 = np.square(z.real)
    magnitude2 += np.square(z.imag)
    keep = magnitude2 > math.exp(2.0 * math.log(_NEGLIGIBLE) / n)
    if keep.all():
        return _power_all(z, n)
    powered = _power_all(z[keep], n)
    z[~keep] = 0.0
    z[keep] = powered
    return z


def _power_all(z: npt.NDArray[np.complex128], n: int) -> npt.NDArray[np.complex128]:
    """z ** n elementwise by repeated squaring; z is consumed."""
    base = z
    result: npt.NDArray[np.complex128] | None = None
    with np.errstate(under="ignore"):
        while True:
            if n & 1:
                if result is None:
                    result = base.copy() if n > 1 else base
                else:
                    np.multiply(result, base, out=result)
            n >>= 1
            if not n:
                break
            np.multiply(base, base, out=base)
    assert result is not None
    return result


@dataclass(frozen=True, slots=True)
class _Window:
    """Where the FFT of one self-composition is read: grid indices [lo, lo + N), N >= width."""

    lo: int
    width: int  # hi - lo + 1 for the smallest window the Chernoff bounds allow
    lo_support: int  # count * offset: the lowest index the composition can reach
    hi_support: int  # count * (offset + n - 1): the highest
    lam_up: float  # Chernoff exponent for the mass above the window (0: none)
    log_m_up: float  # log M(lam_up), M the exact MGF of the single step's finite part
    infinity_mass: float  # some run was infinite: total^count - finite^count


def _plan_window(pmf: RawPmf, count: int, tail_mass: float) -> _Window:
    """The window of the ``count``-fold composition that cuts at most ``tail_mass`` per side.

    The exponents are searched on a coarsened copy (cheap); the window's upper end is then set
    with the exact MGF at the exponent found, which is what makes the bound rigorous.
    """
    p = pmf.probs
    a = pmf.offset
    n = p.size
    infinity_mass = _some_run_infinite(pmf, count)
    finite = float(pmf.probs.sum())
    lo_support, hi_support = count * a, count * (a + n - 1)
    log_tail = math.log(tail_mass) if tail_mass > 0 else -math.inf
    lo, hi = lo_support, hi_support
    lam_up = 0.0
    log_m_up = 0.0
    if n > 1 and math.isfinite(log_tail) and finite > 0:
        mass, cidx = _coarse(p, a)
        total_c = float(mass.sum())
        mean = dot(mass, cidx) / total_c
        sd = math.sqrt(max(dot(mass, (cidx - mean) ** 2) / total_c, 1e-12))
        spread = sd * math.sqrt(count)
        lam_up, lam_down = _best_lambdas(mass, cidx, spread, count, log_tail)
        log_m_up, log_m_down = _log_mgf(p, a, np.array([lam_up, -lam_down]))
        # P[S >= u] <= tail  if  u >= (count log M(l) - log tail) / l   (l > 0)
        upper = (count * log_m_up - log_tail) / lam_up
        lower = (log_tail - count * log_m_down) / lam_down
        # Each end stays within the support: when the finite part holds almost no mass (a
        # step whose losses nearly all lie beyond the grid), the thresholds can fall outside
        # it, and a window between them would be needlessly (unboundedly) wide. The bound
        # that the reading adds is taken at the window actually used, so any end is sound.
        if math.isfinite(upper):
            hi = min(hi_support, max(lo_support, math.ceil(upper)))
        if math.isfinite(lower):
            lo = max(lo_support, min(hi_support, math.floor(lower) + 1))
        if hi < lo:
            lo, hi = hi, lo
    return _Window(lo, hi - lo + 1, lo_support, hi_support, lam_up, log_m_up, infinity_mass)


def self_convolve(pmf: RawPmf, count: int, tail_mass: float) -> RawPmf:
    """The ``count``-fold composition by one FFT power on a truncated window.

    Why the result is still an upper bound. Let c be the exact ``count``-fold convolution of the
    finite part p (a sub-probability vector on grid indices [a, b]). The FFT of length N
    computes the *circular* convolution, which equals c folded modulo N: c~[j] = sum_k c[j + kN]
    for j in the window [lo, lo + N). Folding only adds non-negative mass, so inside the window
    c~ >= c. Mass of c below the window lands inside it, i.e. at a *higher* loss: pessimistic.
    Mass of c above the window lands lower, which would be optimistic, so its total is bounded
    and added to the infinity mass. The bound is Chernoff's: for every lambda > 0,
    sum_{j >= u} c[j] <= exp(-lambda u) M(lambda)^count with M(lambda) = sum_i p[i] e^(lambda i)
    the exact moment generating function of the discretized single step, at an exponent found
    by a search (``_best_lambdas``). (The same bound for lambda < 0 sizes the lower end of the
    window; it only affects accuracy, never soundness.) The infinity mass of the result is
    total^count - finite^count (some step was infinite), plus that bound.
    """
    return self_convolve_all([pmf], count, tail_mass)[0]


def self_convolve_all(pmfs: list[RawPmf], count: int, tail_mass: float) -> list[RawPmf]:
    """``self_convolve`` of several PMFs (the two orders of a PLD), with one batched FFT.

    Every PMF gets the same FFT length N, the largest any of them needs; a longer window than
    needed is still a window (the bound above is then taken at lo + N), so each result keeps
    its argument. One transform of a stack of rows is markedly faster than one per row (the
    FFT library runs the rows through its vector units together). Stacks that would exceed
    ``MAX_GRID_POINTS`` points are transformed a row at a time, keeping memory as for one.
    """
    if count == 1:
        return list(pmfs)
    windows = [_plan_window(pmf, count, tail_mass) for pmf in pmfs]
    length = max(int(sp_fft.next_fast_len(w.width, real=True)) for w in windows)
    if length > MAX_GRID_POINTS:
        raise GridTooLargeError(
            f"composing {count} times needs an FFT of {length} points: use a coarser "
            "value_discretization_interval"
        )
    per_batch = max(1, MAX_GRID_POINTS // length)
    out: list[RawPmf] = []
    for start in range(0, len(pmfs), per_batch):
        batch = range(start, min(start + per_batch, len(pmfs)))
        rows = np.zeros((len(batch), length))
        for row, i in enumerate(batch):
            p = pmfs[i].probs
            if p.size <= length:
                rows[row, : p.size] = p
            else:  # fold the single step as well: same circular arithmetic
                padded = np.zeros(-(-p.size // length) * length)
                padded[: p.size] = p
                rows[row] = padded.reshape(-1, length).sum(axis=0)
        spectrum = sp_fft.rfft(rows, axis=-1, overwrite_x=True)
        powered = _power(spectrum, count)
        rounding = _power_rounding(powered, count, length)
        folded = sp_fft.irfft(powered, length, axis=-1, overwrite_x=True)
        for row, i in enumerate(batch):
            out.append(
                _read_window(
                    folded[row], pmfs[i].offset, count, windows[i], tail_mass, rounding[row]
                )
            )
    return out


#: Unit roundoff of float64.
_UNIT_ROUNDOFF = 2.0**-53
#: Safety factor on the rounding estimate of ``_power_rounding``: the L1 error measured against
#: an extended-precision FFT was 0.4 to 1.03 times count * u * ||z^count||_2 (DP-SGD from 10^3
#: to 10^9 steps, q from 1e-6 to 0.01).
_POWER_ROUNDING_FACTOR = 4.0


def _power_rounding(powered: npt.NDArray[np.complex128], count: int, length: int) -> FloatArray:
    """Per row, an estimate of the L1 rounding error of the ``count``-fold composition.

    Every Fourier coefficient z_k of the single step carries a relative rounding error of
    about one unit roundoff u; its count-th power w_k = z_k^count then carries count * u. The
    inverse transform (1 / N normalization) maps errors dw of L2 norm ||dw||_2 to errors of L2
    norm ||dw||_2 / sqrt(N) on the N outputs, whose L1 norm is then at most ||dw||_2: about
    count * u * ||w||_2, summed over the whole spectrum (the half that ``rfft`` keeps, twice,
    less the entries that have no mirror image). The L1 error bounds the error of every
    delta(eps). It grows with the count: about 1e-12 for 10^4 DP-SGD steps, 2e-7 for 10^9,
    where ``FLOAT_GUARD`` (relative to delta) no longer covers it; the caller adds it at the
    largest reachable loss.
    """
    magnitude2 = np.square(np.abs(powered))
    full = 2.0 * magnitude2.sum(axis=-1) - magnitude2[..., 0]
    if length % 2 == 0:
        full -= magnitude2[..., -1]
    norm = np.sqrt(np.maximum(np.atleast_1d(full), 0.0))
    out: FloatArray = _POWER_ROUNDING_FACTOR * count * _UNIT_ROUNDOFF * norm
    return out


def _read_window(
    folded: FloatArray,
    offset: int,
    count: int,
    window: _Window,
    tail_mass: float,
    rounding: float = 0.0,
) -> RawPmf:
    """The composition's PMF from the circular result, with its folded-over mass bounded.

    ``rounding`` (an estimate of the L1 rounding error of the transform) is added at the
    largest loss the composition can reach (or at +infinity when the window stops below it):
    the error of delta(eps) = sum over l > eps of p_l (1 - e^(eps - l)) is at most the L1
    error times 1 - e^(eps - l_max), which is exactly the delta of that mass at l_max. So
    losses above the support stay impossible (a pure-DP composition keeps delta = 0 at its
    largest loss).
    """
    length = folded.size
    lo, hi = window.lo, window.lo + length - 1
    infinity_mass = window.infinity_mass
    top = window.hi_support - lo  # index of the largest reachable loss, if in the window
    if not 0 <= top < length:
        infinity_mass += float(rounding)
    if hi < window.hi_support:
        # Mass of the exact convolution at indices >= hi + 1 (it folds back into the window).
        lam = window.lam_up
        above = count * window.log_m_up - lam * (hi + 1) if lam > 0 else 0.0
        infinity_mass += math.exp(min(above, 0.0))
    # folded[k] holds the true index count * offset + k (mod length); rotate to start at lo.
    shift = (lo - count * offset) % length
    result = np.concatenate((folded[shift:], folded[:shift]))
    np.maximum(result, 0.0, out=result)
    if hi > window.hi_support:
        # Beyond the true support there is only rounding noise or folded mass from below the
        # window; either way it may move to the lowest window point (a loss at least as high
        # as its true one), keeping losses above the support impossible.
        beyond = max(window.hi_support - lo + 1, 1)
        result[0] += float(result[beyond:].sum())
        result[beyond:] = 0.0
    if 0 <= top < length:
        result[top] += float(rounding)
    return truncate_tails(RawPmf(lo, result, infinity_mass), tail_mass, owned=True)


def symmetrize(pmf: RawPmf, h: float) -> RawPmf:
    """The symmetric PLD that agrees with ``pmf`` on losses > 0.

    A symmetric pair (its PLD omega satisfies omega(-l) = e^(-l) omega(l)) has the same
    delta(eps) as ``pmf`` for eps >= 0 (only losses > eps count there) and, for eps < 0, the
    value 1 - e^eps + e^eps delta(-eps) that the identity H_a(P||Q) = 1 - a + a H_(1/a)(Q||P)
    demands of a pair that is dominated in both orders. The atom at 0 takes the remaining mass
    (it is >= 0 when ``pmf`` comes from a symmetric base mechanism; see the caller).
    """
    first = max(0, 1 - pmf.offset)  # array index of the first loss > 0
    positive = pmf.probs[first:]
    top = pmf.offset + pmf.probs.size - 1  # largest grid index
    if positive.size == 0 or top <= 0:
        return RawPmf(0, np.array([1.0 - pmf.infinity_mass]), pmf.infinity_mass)
    index = np.arange(pmf.offset + first, top + 1)  # all > 0
    mirrored = positive * np.exp(-index * h)
    at_zero = 1.0 - pmf.infinity_mass - float(positive.sum()) - float(mirrored.sum())
    probs = np.zeros(2 * top + 1)
    probs[top + index] = positive
    probs[top - index] = mirrored
    probs[top] = max(at_zero, 0.0)
    return _trim(-top, probs, pmf.infinity_mass)


def _tail_sums(probs: FloatArray, h: float) -> tuple[FloatArray, FloatArray]:
    """D_k = sum_{i>k} p_i (1 - e^{-(i-k)h}) and C_k = sum_{i>=k} p_i e^{-(i-k)h}.

    Both follow first-order recursions with positive coefficients (no cancellation):
    C_k = p_k + e^{-h} C_{k+1} and D_k = (1 - e^{-h}) A_{k+1} + e^{-h} D_{k+1}, A the upper
    cumulative sum.
    """
    decay = math.exp(-h)
    rev = probs[::-1]
    c = signal.lfilter([1.0], [1.0, -decay], rev)[::-1]
    a_rev = np.cumsum(rev)  # a_rev[j] = A_{n-1-j}
    # input to D's recursion at k is (1 - e^-h) A_{k+1}; reversed: 0 then a_rev[:-1]
    drive = np.concatenate([[0.0], a_rev[:-1]]) * (-math.expm1(-h))
    d = signal.lfilter([1.0], [1.0, -decay], drive)[::-1]
    return np.asarray(d, dtype=np.float64), np.asarray(c, dtype=np.float64)


def _first_above(offset: int, n: int, h: float, eps: FloatArray) -> npt.NDArray[np.int64]:
    """For each eps, the first index i in [0, n) with loss (offset + i) * h > eps, else n.

    The same answer as a search over the computed losses, without building them: the quotient
    eps / h is off by less than one grid step, and one comparison either way corrects it. One
    eps (``epsilon`` confirming its answer) takes a scalar path, the same arithmetic.
    """
    if eps.size == 1:
        e = float(eps.reshape(-1)[0])
        quotient = e / h - offset if math.isfinite(e) else e
        i = min(math.floor(min(max(quotient, -1.0), float(n))) + 1, n)
        if i > 0 and (offset + i - 1) * h > e:
            i -= 1
        elif i < n and (offset + i) * h <= e:
            i += 1
        return np.full(eps.shape, i, dtype=np.int64)
    with np.errstate(invalid="ignore", over="ignore"):
        guess = np.floor(np.clip(eps / h - offset, -1.0, float(n))) + 1.0
    k = guess.astype(np.int64)  # in [0, n + 1]
    k = np.minimum(k, n)
    lower = np.maximum(k - 1, 0)
    k = np.where((k > 0) & ((offset + lower) * h > eps), lower, k)  # one too high
    return np.where((k < n) & ((offset + k) * h <= eps), k + 1, k)  # one too low


def delta_at(
    pmf: RawPmf, h: float, sums: tuple[FloatArray, FloatArray], eps: FloatArray
) -> FloatArray:
    """delta(eps) = inf_mass + sum_{l > eps} p_l (1 - e^(eps - l)) for an array of eps."""
    d, c = sums
    n = pmf.probs.size
    k = _first_above(pmf.offset, n, h, eps)  # first index with loss > eps (n: none)
    inside = k < n
    kk = np.minimum(k, n - 1)
    with np.errstate(over="ignore", invalid="ignore"):
        gap = -np.expm1(-((pmf.offset + kk) * h - eps))
        value = np.where(inside, d[kk] + gap * c[kk], 0.0)
    out: FloatArray = pmf.infinity_mass + value
    return out


def top_segment(
    pmf: RawPmf, h: float, delta: float
) -> tuple[RawPmf, tuple[FloatArray, FloatArray]]:
    """The top of the PMF, with its tail sums, on which delta(eps) crosses ``delta``.

    The sums for index k depend only on higher indices, so a top segment has the same sums as
    the whole array there. If delta at the segment's lowest loss exceeds the target, the
    crossing (and every eps above it) lies inside the segment: ``epsilon_for`` and
    ``delta_at`` give the same answers on it as on the whole PMF, at a fraction of the cost.
    """
    probs = pmf.probs
    n = probs.size
    # the top entries holding a mass of 100 delta, and two more
    length = _prefix_within(probs[::-1], 100.0 * delta)[0] + 2
    while True:
        length = min(length, n)
        segment = RawPmf(pmf.offset + n - length, probs[n - length :], pmf.infinity_mass)
        sums = _tail_sums(segment.probs, h)
        if length == n or pmf.infinity_mass + sums[0][0] > delta:
            return segment, sums
        length *= 4


def epsilon_for(pmf: RawPmf, h: float, sums: tuple[FloatArray, FloatArray], delta: float) -> float:
    """Smallest eps with delta(eps) <= delta for this pmf (may be negative or +infinity)."""
    d, c = sums
    if pmf.infinity_mass > delta:
        return math.inf
    grid_delta = pmf.infinity_mass + d  # delta at each grid loss, non-increasing
    j = int(np.searchsorted(-grid_delta, -delta, side="left"))  # first with grid <= delta
    j = min(j, pmf.probs.size - 1)
    loss_j = (pmf.offset + j) * h
    if c[j] <= 0:
        return loss_j
    ratio = (delta - pmf.infinity_mass - d[j]) / c[j]
    if ratio >= 1.0:
        return -math.inf
    x = -math.log1p(-max(ratio, 0.0))
    return loss_j - x
