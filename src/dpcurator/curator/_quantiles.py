"""Quantiles from one noisy dyadic tree per partition: a point estimate and intervals at any level.

The engine returns, per partition, the exact counts of the bounded rows in ``BINS`` = 1024
equal bins of [lo, hi] (bin b holds the rows whose clamped value x has
``min(1023, floor((x - lo) * (1024 / (hi - lo)))) == b``; edge j is e_j = lo + j (hi - lo) / 1024;
an integer column's bins hold whole integers instead: **Integer columns** below).

**Release** (the only step that sees data). Per partition, the counts of all 2047 nodes of the
dyadic tree over the bins (levels 0..10: level l has 2^l nodes of 2^(10-l) bins each, the root
is level 0), times a public weight W (1 under pure DP, 1024 under zCDP: a fine lattice makes
the integer L2 sensitivity below tight), plus independent exact integer noise per node:

- pure DP: discrete Laplace of scale t = Delta_1 / epsilon, Delta_1 = 11 r k;
- zCDP: discrete Gaussian of sigma = Delta_2 / sqrt(2 rho), Delta_2 = ceil(W r sqrt(11 k)).

Neighbouring: add/remove all rows of one privacy unit. After bounding, one unit has at most
r = rows_cap rows in each of at most k = partitions_cap partitions, and other units' rows do
not change. Each row adds 1 to exactly one node per level, so one unit changes a partition's
node vector by a non-negative vector whose entries sum to at most r on each of the 11 levels:
L1 <= 11 r per partition, 11 r k in all; the sum of squares is at most r^2 per level (the
entries are non-negative integers summing to <= r), so L2 <= r sqrt(11) per partition and
r sqrt(11 k) in all (W times that on the lattice). The discrete Laplace vector mechanism is then
epsilon-DP (Ghosh, Roughgarden and Sundararajan 2009; Canonne, Kamath and Steinke 2020) and the
discrete Gaussian one rho-zCDP (Canonne, Kamath and Steinke 2020, Theorem 14), for the whole
tree of every partition at once. Everything below is post-processing of the noisy nodes, so
point estimates and intervals at any level chosen later cost nothing more.

**Noisy CDF.** F(j) = number of rows in bins < j (F(0) = 0, F(B) = n). [0, j) is the disjoint
union of one node per set bit of j (popcount(j) <= 10 nodes for j < 1024; the root for
j = 1024), so F~(j) = W F(j) + Z_j, with Z_j the sum of those nodes' noises, and
n~ = F~(1024) = W n + Z_0 (Z_0 the root's noise, independent of Z_j for j < 1024). Let
G~(j) = F~(j) - q n~ = W (F(j) - q n) + D_j with D_j = Z_j - q Z_0 (j < 1024; D_0 = -q Z_0) and
D_1024 = (1 - q) Z_0: a fixed combination of at most 11 independent node noises, whose law
depends only on popcount(j) (and whether j = 1024).

**Point estimate.** The noisy rank q n~ is located twice: from the left at the first edge j
with G~(j) >= 0, and from the right at the last edge j < 1024 with G~(j) < 0; each is
interpolated linearly within its bin, and the estimate is the mean of the two, clipped to
[lo, hi]. (Without noise both are the same point: the linear interpolation of the histogram
CDF at rank q n. An integer column's searches stop at its last bin that can hold a row:
below.)

**True quantile.** For n >= 1 bounded rows with sorted clamped values x_(0) <= ... <= x_(n-1),
the sample quantile of SQL's QUANTILE_CONT / MEDIAN lies between x_(a) and x_(b) with
a = floor(q (n - 1)) and b = ceil(q (n - 1)). An interval [e_jL, e_jU] *covers* it when
jL <= bin(x_(a)) and jU >= bin(x_(b)) + 1: it contains the whole bins of both order
statistics, hence the sample quantile (up to the rounding of the bin assignment itself).
Since F(j) counts the rows before x's bin, covering is exactly F(jL) <= a and F(jU) >= b + 1.

**Interval at level 1 - alpha.** Per-edge margins m_L(j), m_U(j) at a level alpha' (below)
define two tests: edge j is *confidently below* the rank when G~(j) <= -m_L(j), *confidently
above* when G~(j) >= m_U(j). The ends are found in stages, coarse to fine: stage i looks only at
the edges on the grid of step 2^s_i (multiples of 2^s_i) with margins at alpha_i = share_i alpha
(``STAGES``: s = 6, 3, 0 with shares 0.01, 0.01, 0.98). Starting from jL = 0 and jU = 1024:

- jL <- (first grid edge j > jL that is not confidently below) - 2^s_i, or 1024 if none;
- jU <- (last grid edge j < jU that is not confidently above) + 2^s_i, or 0 if none;

and the interval is [e_jL, e_jU], widened to contain the point estimate. (Each stage's ends are
on its grid, so jL only rises and jU only falls.)

Why it covers (one edge per stage, no union over edges). Let j* = min{j : F(j) >= a + 1}, a
fixed edge determined by the data (1 <= j* <= 1024 as F(0) = 0 <= a < n = F(1024)). The lower
end fails iff the final jL >= j*. Let i be the first stage whose jL reached j*, and t_i the
first edge of its grid at or above j*. Before stage i, jL < j* <= t_i; stage i's new jL is a
grid edge >= j*, hence >= t_i, and every grid edge between the old jL and the new jL + 2^s_i,
t_i among them, was confidently below. As
F(t_i) >= F(j*) >= a + 1 > q (n - 1), that is D_t_i < W q - m_L(t_i). Likewise, with
j** = max{j : F(j) <= b} (0 <= j** <= 1023), the upper end fails only if, at the first stage i
whose jU fell to j** or below, the last edge u_i of its grid at or below j** was confidently
above, which needs D_u_i > m_U(u_i) - W (1 - q) as F(u_i) <= F(j**) <= b < q (n - 1) + 1. The
noises are symmetric, so with c*(j) <= 0 any number such that P[D_j < c*(j)] <= alpha' / 2
(for D_j's law), the margins m_L(j) = W q - c*(j) and m_U(j) = W (1 - q) - c*(j) make stage i's
side fail with probability at most alpha_i / 2, and each side fails with probability at most
sum alpha_i / 2 = alpha / 2: coverage is at least 1 - alpha for every partition with n >= 1
(nothing is claimed for n = 0, where the quantile is undefined). Widening to the point estimate
only helps.

Why stages. A single fine stage (the rule until 2026-11) is exact when the rows sit in a spike
just past the quantile, but on spread-out data its end is the first of hundreds of edges far
below the rank whose noise happens to clear the margin: at 300 rows, epsilon = 1, the median of
a normal sample got an interval 67% of the range wide. The coarse grids (16 and 128 edges, whose
prefix sums also use fewer nodes) reach the rank's neighbourhood first, and the fine stage only
refines from there: 35% there, for 2% of alpha, and no wider than before on dense data, where
the fine stage keeps 98% of alpha (5% and 5% for the coarse stages gave 25% there, but up to
0.9% wider on dense data; benchmarks/README.md).

**Integer columns** (``Quantile.integer``: the column's type holds only integers), when the
bounds hold L = ceil(lo) .. H = floor(hi) with H - L <= 1024: the values are clamped to [L, H]
(for an integer x the same as clamping to [lo, hi], then to [L, H]) and each bin holds one
integer, bin i the integer L + i (the last bin L + 1023 .. H, two integers when H - L = 1024):
x falls in bin min(1023, floor(x - L + 1/2)), the edges are half-integers,
e_j = L - 1/2 + j for j < 1024 and e_1024 = max(L + 1023.5, H + 1/2) (``histogram_for``; bins
past H are empty). Everything above holds with these edges and with x the integer-clamped
values. The interval is then cut to the integers it holds, [e_jL + 1/2, e_jU - 1/2] within
[L, H]: when it covers, it holds the whole bins of x_(a) and x_(b), which are integers, so it
still holds both and the sample quantile between them. The point estimate reads the same two
crossings; in a bin of c integers from f, a crossing takes f + min(c - 1, floor(frac c)) (the
bin's integer when c = 1), except at an exact tie of the noisy rank with the noisy CDF at a bin
edge (frac 0 or 1), where the quantile lies between two integers and the edge, a half-integer,
is kept. Both searches stop at the bin of H (bin H - L): the bins past it are empty by the
bounds and the type, public facts, so their noisy edges say nothing of the data, and a
crossing found among them (the noise of up to 923 empty bins' edges, where H - L = 100) put
the mean of the two crossings past H, clipped to H: a median of values 20 to 30 in [0, 100]
read 100 in 80% of releases at epsilon 1 (a bug hunt). So wherever the rank falls inside
one integer's rows by more than the noise at the nearby edges, both crossings find its bin
and the estimate is that integer. Wider bounds keep
the equal bins: bins of several integers gain no exact answer and, aligned on integers, are
up to twice as coarse (measured: 2.6x wider intervals for a median over [0, 1.5e6]). Privacy
is unchanged: the bins are a function of the bounds (given, or chosen under DP before) and of
the column's type in the schema, both public; each row still adds 1 to one bin, so the
sensitivity is as above; the estimate and the interval read only the noisy nodes and those
public numbers (post-processing).

**Tail bounds** (``_TailBounds``). c*(j) comes from a rigorous upper bound on
P[S_p + beta Z_0 < c] (S_p the sum of p = popcount(j) node noises; beta = -q, or 1 - q at
j = 1024). Each noise Z is coarsened to U = floor(Z / g) with g = max(1, floor(scale / 32)),
so Z lies in [g U, g U + g - 1]; then S_p + beta Z_0 >= g (sum of U_i) + beta g U_0
+ min(beta, 0) (g - 1), and the event becomes one about integer sums of U's. Upper bounds on
U's probabilities (closed form for the discrete Laplace; for the discrete Gaussian, exact
lattice sums normalised by a lower bound of the normaliser, or, for sigma > 2^16, the midpoint
rule with its error bound 1/(24 sigma^2) per point and the normaliser's Poisson-summation lower
bound sigma sqrt(2 pi)) are convolved exactly (direct convolution of non-negative arrays;
every step can only raise an upper bound), the mass outside the truncated range is added, and
a relative 1e-9 for floating point. With g = 1 (scale < 64) the bound is the exact tail; the
coarsening costs at most (p + 1) g <= 11 scale / 32 in the margin, typically about 2%.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import special

from dpcurator.errors import InternalError, UserError
from dpcurator.mechanisms import DiscreteGaussian, DiscreteLaplace
from dpcurator.noise import RandomSource
from dpcurator.query.bounding import HistogramSpec, isqrt_ceil
from dpcurator.query.plan import Quantile

__all__ = ["BINS", "LEVELS", "NODES", "STAGES", "QuantileTree", "histogram_for", "node_counts",
           "prefix_counts", "staged_ends"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

DEPTH = 10
BINS = 1 << DEPTH  # leaves of the tree: the histogram's bins
LEVELS = DEPTH + 1  # levels 0..10: every row is counted once per level
NODES = 2 * BINS - 1
GAUSSIAN_WEIGHT = 1 << 10  # lattice units per row under zCDP
RESOLUTION = 32  # coarse blocks per unit of noise scale in the tail bounds
# The interval's stages (module docstring): (grid shift s, share of alpha), coarse to fine.
STAGES = ((6, 0.01), (3, 0.01), (0, 0.98))
_MAX_COUNT = 1 << 50


# -- the bins ---------------------------------------------------------------------------------


def histogram_for(aggregate: Quantile, name: str) -> HistogramSpec:
    """The engine's bins for a quantile (module docstring): 1024 equal bins of its bounds, or,
    for an integer column whose bounds hold at most 1025 integers, one integer per bin."""
    if aggregate.bounds is None:
        raise InternalError("a quantile is binned once its bounds are known; this is a bug")
    lo, hi = aggregate.bounds.lo, aggregate.bounds.hi
    if aggregate.integer and math.isfinite(lo) and math.isfinite(hi) and \
            0 <= math.floor(hi) - math.ceil(lo) <= BINS:
        return HistogramSpec(name, aggregate.column, float(math.ceil(lo)),
                             float(math.floor(hi)), BINS, integers=True)
    return HistogramSpec(name, aggregate.column, lo, hi, BINS)


# -- the tree ---------------------------------------------------------------------------------


def node_counts(leaves: IntArray) -> IntArray:
    """(P, 1024) bin counts -> (P, 2047) node counts, heap order (level l at 2^l - 1 ...)."""
    parts = leaves.shape[0]
    levels = [leaves.reshape(parts, 1 << level, BINS >> level).sum(axis=2)
              for level in range(LEVELS)]
    return np.concatenate(levels, axis=1)


def _prefix_plan() -> list[tuple[npt.NDArray[np.bool_], IntArray]]:
    """Per level: which edges j use a node of that level, and which node."""
    edges = np.arange(BINS + 1)
    plan = []
    for level in range(LEVELS):
        shift = DEPTH - level
        uses = ((edges >> shift) & 1).astype(bool)
        node = (1 << level) - 1 + (edges >> shift) - 1
        plan.append((uses, node[uses].astype(np.int64)))
    return plan


_PREFIX = _prefix_plan()
_POPCOUNT = np.array([bin(j).count("1") for j in range(BINS)], dtype=np.int64)


def prefix_counts(nodes: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """(P, 2047) node counts -> (P, 1025): F(j), the count in bins < j, from <= 10 nodes each.

    [0, j) is the union of the node of level l at index (j >> (10 - l)) - 1 for every set bit
    10 - l of j (j = 1024 is the root alone); F(0) = 0.
    """
    out = np.zeros((nodes.shape[0], BINS + 1), dtype=nodes.dtype)
    for uses, node in _PREFIX:
        out[:, uses] += nodes[:, node]
    return out


@dataclass
class QuantileTree:
    """A quantile aggregate's noisy dyadic tree: its mechanism, estimator and intervals."""

    aggregate: Quantile
    histogram: HistogramSpec
    mechanism: DiscreteLaplace | DiscreteGaussian
    weight: int

    @classmethod
    def build(cls, aggregate: Quantile, histogram: HistogramSpec, kind: str, budget: float,
              k: int, r: int, source: RandomSource | None) -> QuantileTree:
        """The tree for one aggregate, spending its whole share ``budget`` (eps, or rho)."""
        if histogram.bins != BINS:
            raise InternalError(f"the quantile tree needs {BINS} bins, got "
                                f"{histogram.bins}; this is a bug")
        mechanism: DiscreteLaplace | DiscreteGaussian
        if kind == "laplace":
            weight = 1
            mechanism = DiscreteLaplace(epsilon=budget, sensitivity=LEVELS * r * k,
                                        source=source)
        else:
            weight = GAUSSIAN_WEIGHT
            mechanism = DiscreteGaussian(
                rho=budget, sensitivity=isqrt_ceil(LEVELS * k * (r * weight) ** 2),
                source=source)
        return cls(aggregate, histogram, mechanism, weight)

    # -- add_noise ---------------------------------------------------------------------------

    def add_noise(self, leaves: IntArray) -> IntArray:
        """(P, 1024) exact bin counts -> (P, 2047) noisy node counts on the lattice."""
        if leaves.size and int(leaves.max()) >= _MAX_COUNT:
            raise UserError("a partition has too many rows for a quantile (2^50 or more)")
        exact = node_counts(leaves) * self.weight
        return np.asarray(self.mechanism.release(exact), dtype=np.int64).reshape(exact.shape)

    # -- estimate ----------------------------------------------------------------------------

    def _edges(self) -> FloatArray:
        h = self.histogram
        if h.integers:  # half-integer edges, the last bin up to H (module docstring)
            edges = h.lo - 0.5 + np.arange(BINS + 1, dtype=np.float64)
            edges[BINS] = max(edges[BINS], h.hi + 0.5)
            return edges
        return np.linspace(h.lo, h.hi, BINS + 1)

    def _last_bin(self) -> int:
        """The last bin a row can fall in: an integer column's bins past H are empty (they
        hold L + i > H), a public fact of the bounds and the type; else the last of all."""
        h = self.histogram
        return min(BINS - 1, int(h.hi - h.lo)) if h.integers else BINS - 1

    def _ranks(self, noisy: IntArray) -> tuple[FloatArray, FloatArray]:
        """F~ (P, 1025) and G~ = F~ - q n~, as doubles (exact up to 2^53)."""
        cdf = prefix_counts(noisy).astype(np.float64)
        return cdf, cdf - self.aggregate.q * cdf[:, -1:]

    def estimate(self, noisy: IntArray) -> FloatArray:
        """Mean of the left and right crossings of rank q n~, interpolated in their bins."""
        cdf, gap = self._ranks(noisy)
        parts = np.arange(cdf.shape[0])
        last = self._last_bin()  # the bins past it are empty, publicly: not searched
        crossed = gap[:, 1:last + 2] >= 0  # edges 1 .. last + 1
        left = np.where(crossed.any(axis=1), crossed.argmax(axis=1) + 1, last + 1) - 1
        below = gap[:, :last + 1] < 0  # edges 0 .. last
        right = np.where(below.any(axis=1), last - below[:, ::-1].argmax(axis=1), 0)
        edges = self._edges()
        integer = self.histogram.integers
        rank = self.aggregate.q * cdf[:, -1]

        def within(j: IntArray) -> FloatArray:
            start, stop = cdf[parts, j], cdf[parts, j + 1]
            step = stop - start
            safe = np.where(step > 0, step, 1.0)
            frac = np.where(step > 0, np.clip((rank - start) / safe, 0.0, 1.0), 0.5)
            width = edges[j + 1] - edges[j]  # integer bins: the count of integers they hold
            linear = edges[j] + frac * width
            if not integer:
                return np.asarray(linear, dtype=np.float64)
            # the integer whose share of the bin holds the interpolation; at an exact tie
            # with an edge (frac 0 or 1) the edge, between two integers
            cell = edges[j] + 0.5 + np.minimum(width - 1, np.floor(frac * width))
            return np.asarray(np.where((frac > 0) & (frac < 1), cell, linear),
                              dtype=np.float64)

        value = (within(left) + within(right)) / 2
        return np.clip(value, self.histogram.lo, self.histogram.hi)

    # -- intervals ---------------------------------------------------------------------------

    def margins(self, alpha: float) -> tuple[FloatArray, FloatArray]:
        """m_L(j) and m_U(j) for j = 0..1024, on the lattice (inf where no margin suffices)."""
        m = self.mechanism
        if isinstance(m, DiscreteLaplace):
            return _margins("laplace", float(m.scale), self.weight, self.aggregate.q, alpha)
        return _margins("gaussian", float(m.noise_sigma(1)), self.weight, self.aggregate.q,
                        alpha)

    def interval(self, noisy: IntArray, alpha: float) -> tuple[FloatArray, FloatArray]:
        """[e_jL, e_jU] by the staged first-crossing rules (module docstring), holding the
        estimate."""
        cdf, gap = self._ranks(noisy)
        # Doubles hold the integers F~ exactly; only q n~ is rounded: widen by far more.
        guard = 2.0**-40 * (np.abs(cdf).max(axis=1, initial=0.0) + 1.0)[:, None]
        margins = [self.margins(alpha * share) for _, share in STAGES]
        j_low, j_high = staged_ends(gap, [(low + guard, high + guard) for low, high in margins])
        edges = self._edges()
        value = self.estimate(noisy)
        h = self.histogram
        low, high = edges[j_low], edges[j_high]
        if h.integers:  # the integers they hold, within [L, H]
            low, high = np.clip(low + 0.5, h.lo, h.hi), np.clip(high - 0.5, h.lo, h.hi)
        return np.minimum(low, value), np.maximum(high, value)

    def describe(self) -> dict[str, Any]:
        m = self.mechanism
        if isinstance(m, DiscreteLaplace):
            noise, scale = {"noise": "discrete Laplace"}, {"scale": float(m.scale)}
        else:
            noise, scale = {"noise": "discrete Gaussian"}, {"sigma": float(m.noise_sigma(1))}
        h = self.histogram
        bins = f"1024 bins, one per integer from {h.lo:g}" if h.integers else "1024 bins"
        return {"measure": f"dyadic tree over {bins} (2047 nodes per partition)", **noise,
                **{name: value / self.weight for name, value in scale.items()},
                "sensitivity": m.sensitivity / self.weight, "guarantee": str(m.guarantee)}


def staged_ends(gap: FloatArray, margins: list[tuple[FloatArray, FloatArray]]
                ) -> tuple[IntArray, IntArray]:
    """The interval's edges jL, jU per partition: stage i of ``STAGES`` tests the edges on its
    grid with margins ``margins[i]`` = (m_L, m_U), each (1025,) or (P, 1025) (module
    docstring)."""
    j_low = np.zeros(gap.shape[0], dtype=np.int64)
    j_high = np.full(gap.shape[0], BINS, dtype=np.int64)
    for (shift, _), (m_low, m_high) in zip(STAGES, margins, strict=True):
        step = 1 << shift
        ups = np.arange(step, BINS + 1, step)
        # The first grid edge past the last stage's end that is not confidently below.
        above = (gap[:, ups] > -np.asarray(m_low)[..., ups]) & (ups > j_low[:, None])
        first = np.where(above.any(axis=1), ups[above.argmax(axis=1)], BINS + step)
        j_low = np.maximum(j_low, first - step)
        downs = np.arange(0, BINS, step)
        below = (gap[:, downs] < np.asarray(m_high)[..., downs]) & (downs < j_high[:, None])
        last = np.where(below.any(axis=1),
                        downs[downs.size - 1 - below[:, ::-1].argmax(axis=1)], -step)
        j_high = np.minimum(j_high, last + step)
    return j_low, j_high


# -- tail bounds ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Blocks:
    """Upper bounds on P[floor(Z / width) = first + i] (``upper``) and on the mass outside."""

    width: int
    first: int
    upper: FloatArray
    outside: float


def _laplace_blocks(t: float) -> _Blocks:
    """Discrete Laplace of scale t: P[Z = z] = (1 - s) s^|z| / (1 + s), s = e^(-1/t).

    A block [g u, g u + g - 1] has mass s^(g u) (1 - s^g) / (1 + s) for u >= 0 and
    s^(g |u| - g + 1) (1 - s^g) / (1 + s) for u < 0.
    """
    g = max(1, int(t // RESOLUTION))
    reach = math.ceil((37 * t + 2) / g) + 1  # s^(g reach) <= e^-37: the outside is < 1e-16
    u = np.arange(-reach, reach + 1, dtype=np.float64)
    mass = -math.expm1(-g / t) / (1.0 + math.exp(-1.0 / t))
    exponent = np.where(u >= 0, g * u, g * -u - g + 1)
    upper = np.exp(-exponent / t) * mass * (1 + 1e-12)
    outside = (math.exp(-g * (reach + 1) / t) + math.exp(-(g * reach + 1) / t)) / (
        1.0 + math.exp(-1.0 / t))
    return _Blocks(g, -reach, upper, outside * (1 + 1e-12))


def _gaussian_tail(m: int, sigma: float, normaliser: float) -> float:
    """An upper bound on P[Z >= m] for m >= 0: (f(m) + integral_m^inf f) / N, f unimodal."""
    return (math.exp(-0.5 * (m / sigma) ** 2) + sigma * math.sqrt(2 * math.pi)
            * float(special.ndtr(-m / sigma))) / normaliser


def _gaussian_blocks(sigma: float) -> _Blocks:
    """Discrete Gaussian: P[Z = z] = f(z) / N with f(z) = exp(-z^2 / (2 sigma^2))."""
    g = max(1, int(sigma // RESOLUTION))
    reach = math.ceil((10 * sigma + 2) / g) + 1  # e^-50: the outside is < 1e-21
    if sigma <= 2**16:
        z = np.arange(-reach * g, (reach + 1) * g, dtype=np.float64)
        f = np.exp(-0.5 * (z / sigma) ** 2)
        normaliser = math.fsum(f) * (1 - 1e-12)  # a lower bound on N: positive terms left out
        upper = f.reshape(2 * reach + 1, g).sum(axis=1) / normaliser * (1 + 1e-12)
    else:
        # Midpoint rule: f(z) <= integral over [z - 1/2, z + 1/2] + sup|f''| / 24, with
        # sup|f''| = 1 / sigma^2; N >= sigma sqrt(2 pi) by Poisson summation.
        normaliser = sigma * math.sqrt(2 * math.pi)
        u = np.arange(-reach, reach + 1, dtype=np.float64)
        start = special.ndtr((g * u - 0.5) / sigma)
        stop = special.ndtr((g * u + g - 0.5) / sigma)
        upper = (stop - start + g / (24 * sigma**2 * normaliser)) * (1 + 1e-12) + 1e-300
    outside = (_gaussian_tail(g * (reach + 1), sigma, normaliser)
               + _gaussian_tail(g * reach + 1, sigma, normaliser))
    return _Blocks(g, -reach, np.asarray(upper, dtype=np.float64), outside * (1 + 1e-12))


class _TailBounds:
    """Rigorous upper bounds on P[S_p + beta Z_0 < c] for sums of iid node noises."""

    def __init__(self, blocks: _Blocks) -> None:
        self.blocks = blocks
        # cdfs[p][i]: upper bound on P[U_1 + ... + U_p <= p * first + i, all in range].
        self.cdfs: list[FloatArray] = []
        pmf = np.ones(1)
        for p in range(DEPTH + 1):
            if p:
                pmf = np.convolve(pmf, blocks.upper)
            self.cdfs.append(np.minimum(np.cumsum(pmf) * (1 + 1e-9), 1.0))
        self._quantiles: dict[tuple[int, float, float], float] = {}

    def lower_tail(self, p: int, beta: float, c: float) -> float:
        """Upper bound on P[Z_1 + ... + Z_p + beta Z_0 < c] (lattice units)."""
        b = self.blocks
        g = b.width
        u0 = b.first + np.arange(b.upper.size, dtype=np.float64)
        # Z_i >= g U_i, beta Z_0 >= beta g U_0 + min(beta, 0) (g - 1): the event implies
        # U_1 + ... + U_p < x(U_0), i.e. <= ceil(x) - 1 (x rounded up: only loosens).
        x = (c - min(beta, 0.0) * (g - 1)) / g - beta * u0
        x = x + 1e-12 * (np.abs(x) + 1.0)
        index = np.ceil(x) - 1 - p * b.first
        cdf = self.cdfs[p]
        inside = np.clip(index, -1, cdf.size - 1).astype(np.int64)
        at = np.where(inside >= 0, cdf[np.maximum(inside, 0)], 0.0)
        # A dot product of non-negative terms: relative error <= n u, far below the 1e-9 added.
        total = float(np.dot(b.upper, at)) + (p + 1) * b.outside
        return total * (1 + 1e-9) + 1e-15

    def lower_quantile(self, p: int, beta: float, tail: float) -> float:
        """c* <= 0, as large as bisection finds, with lower_tail(p, beta, c*) <= tail; -inf if
        none."""
        key = (p, beta, tail)
        if key not in self._quantiles:
            self._quantiles[key] = self._search(p, beta, tail)
        return self._quantiles[key]

    def _search(self, p: int, beta: float, tail: float) -> float:
        if self.lower_tail(p, beta, 0.0) <= tail:
            return 0.0
        b = self.blocks
        low = -float(b.width) * (b.upper.size + 2) * (p + 1 + abs(beta)) - 1.0
        if self.lower_tail(p, beta, low) > tail:
            return -math.inf
        high = 0.0
        # Invariant: lower_tail(low) <= tail < lower_tail(high); stop within 1/1000 block.
        while high - low > 1e-3 * b.width:
            mid = (low + high) / 2
            if mid in (low, high):
                break
            if self.lower_tail(p, beta, mid) <= tail:
                low = mid
            else:
                high = mid
        return low


@functools.lru_cache(maxsize=32)
def _tails(kind: str, scale: float) -> _TailBounds:
    """The tail bounds of one node noise (discrete Laplace scale t, or discrete Gaussian sigma)."""
    return _TailBounds(_laplace_blocks(scale) if kind == "laplace" else _gaussian_blocks(scale))


@functools.lru_cache(maxsize=256)
def _margins(kind: str, scale: float, weight: int, q: float, alpha: float
             ) -> tuple[FloatArray, FloatArray]:
    """Per edge j = 0..1024: m_L(j) = W q - c*(j) and m_U(j) = W (1 - q) - c*(j), where
    P[D_j < c*(j)] <= alpha / 2 and c*(j) <= 0 (module docstring)."""
    tails = _tails(kind, scale)
    by_count = np.array([tails.lower_quantile(p, -q, alpha / 2) for p in range(DEPTH + 1)])
    c = np.append(by_count[_POPCOUNT], tails.lower_quantile(0, 1 - q, alpha / 2))
    low, high = weight * q - c, weight * (1 - q) - c
    low.flags.writeable = high.flags.writeable = False  # shared by every caller
    return low, high
