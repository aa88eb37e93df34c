"""The row cap's aims, drawn before the joint choice: noisy histograms whose
post-processing sets the row cap's targets (``dpcurator.curator._auto_bounds``).

A sum's row cap (``value_factors``). A row the cap cuts costs a sum its value clamped,
min(|x|, M), not M: where the heavy units' rows are mostly zeros, or far below the clamp,
the fixed factor 2 kept rows whose noise cost more than their sum. Where every aggregate is
a SUM and the row cap and the first column's clamp are chosen (``values_choice``), one more
release comes first: the pairs beyond ``VALUES_CAP`` (3) rows
by the octave of their rows' mean |x| (``Profile.mean_octaves``: each pair with its ``rows``
weight, so one unit adds at most 1 in all, L1), by the Laplace mechanism with its own
epsilon (``VALUES_WEIGHT``, 1/4, on top of the bounds' share: the other choices keep
theirs), bins below ``VALUES_PRUNE`` (8) / epsilon set to 0 (an empty bin passes with
probability e^-8 / 2, the 62 together about 1%). The row cap's target at magnitude M is
then f(M) G s k^a (f(M) G s k^a / k read per k), f(M) = M over the histogram's mean of
min(octave middle, M), within [1, 64]; where no bin passed, the fixed factors above
(``factors_from``). Post-processing, public to the joint choice, whose scores keep their
sensitivity. On the family (``auto_bounds.py --family --questions SUM``, exact over both
laws): median 1.42x -> 1.22x the best fixed bounds, geometric mean 1.54x -> 1.36x, within
1.25x 20 -> 31 of 56 shapes, P[>3x] <= 1% on 35 -> 46. On the 1 / P path alone: 1.26x,
1.40x, 27 and 44 (the exact histogram, no noise: 1.25x, 1.37x, 29); per k, f(M) did
better than 0.75 f(M) (the ratio of the fixed factors, 1.5 / 2: median 1.24x, 28 shapes)
and as well as 1.4 f(M).
A query of means (``values_choice``) draws the same histogram, with four times the weight
(``MEAN_VALUES_WEIGHT``), with a second half: the pairs of at most ``VALUES_CAP`` rows by
the same octaves, each weighing 1 / P (``Profile.light_octaves``). A pair counts in one half
or the other, so one unit still adds at most 1 in all (L1). A row cut moves a mean by its
distance from the rest, not by its value, and by the distance from the mean of the rows
kept: the factor at the magnitude M and the row cap r is ``MEAN_HALF`` M / (|m_h(M) -
m_l(M)| lambda(r)) (the two halves' means of min(m_o, M), lambda(r) the short pairs' share
of the rows kept), the gap at least m_h(M) / ``MEAN_RATIO_MOST`` (``_mean_factors``); where
either half is empty, the fixed ``MEAN_ROW_FACTOR``. On the family (``--questions AVG``),
with the gap alone: median 1.59x -> 1.37x, geometric mean 1.93x -> 1.68x, within 1.25x 16 ->
21 of 56 shapes, P[>3x] <= 1% on 30 -> 32; with lambda(r) and the ends below, see
``MEAN_HALF``.

The tail's shape (``tail_histogram``, ``tail_multipliers``). Amin et al.'s point is the
least of bias plus noise; a release's squared error b(r)^2 + s(r)^2 is least where the pairs
beyond the cap are t / sqrt(rho(r)), rho(r) the rows beyond r over r times the pairs beyond
r (the tail's mean excess over r). Heavy units whose pairs lie far beyond the cap (a flat
tail: 30 to 300 rows each, where light units have 1 to 3) have rho >> 1, and the rule's
point leaves a bias several times the noise it saves (the family's mostly-zero SUMs #13 and
#47: r 3 where 128 and 16 are best, about 2x the best fixed bounds). Where the row cap is
chosen and every aggregate is a COUNT(*) or a SUM, or every one a mean (below), one more
release comes first: the pairs by their rows' bin (1 to 8 rows each their own, then octaves;
``Profile.row_octaves``, each pair weighing 1 / P, L1 sensitivity 1) by the Laplace
mechanism with weight ``TAIL_WEIGHT`` (1/4, on top of the share), bins below ``TAIL_PRUNE``
(8) / epsilon set to 0 (none drawn where epsilon is so small that the noise is past the
samplers' range: ``_noisy_histogram``). From it, per row cap, the target is multiplied by 1
/ sqrt(rho(r)), rho within ``TAIL_RATIO`` [1, 32]: it is lowered where the histogram shows
the tail going on far beyond r, never raised (rho < 1, a tail ending just beyond the cap,
would raise it; but at the histogram's epsilon its far bins are pruned and read as the
tail's end: COUNT on the family's #3 1.06x -> 1.9x the best fixed bounds, #48 3.0x -> 5.4x
with a phantom bin of the pruned mass). Post-processing, public to the joint choice, whose
scores keep their sensitivity; the retry reads the first choice's (``Aim``). A query of
means draws it too (since the twenty-ninth session): a mean's cost per row cut is its
factor's gap times lambda(r) (``_mean_factors``), and to first order in lambda the least of
its squared error lies at the same 1 / sqrt(rho) times its target. On the family
(``auto_bounds.py --family --questions AVG``, with the partition cap aimed by the factors,
``_auto_joint._mean_partition_penalties``): within 1.25x 32 -> 35 of 56 shapes, geometric
mean 1.357x -> 1.345x (#47 1.56x -> 1.19x, #27 1.61x -> 1.28x, #16 1.51x -> 1.20x; #44 1.39x
-> 1.79x, P[>3x] 0.4% -> 2.0%; #22 1.75x -> 1.84x). Its epsilon is on top of the share, so
one row per person pays for it and gains nothing: UCI Adult's AVG(age) 0.458 -> 0.461
(``adult.py --exact``), COMPAS's means 0.2% to 0.6% higher, one 3.3% (``compas.py``). Taken
from the mean's own histogram instead (weights 3/4 and 1/4) it cost more than it gave (#6
2.29x -> 2.78x, #22 -> 2.16x). A variance or a quantile draws none. Measured below
(``tail_multipliers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpcurator.engines import MEAN_OCTAVES
from dpcurator.mechanisms import Laplace
from dpcurator.noise import RandomSource
from dpcurator.noise.samplers import MAX_SCALE as MAX_NOISE_SCALE

from ._auto_joint import MEAN_CAP_FACTOR, MEAN_ROW_FACTOR, ROW_FACTOR_VALUES
from ._auto_plan import MAGNITUDES, ROW_CANDIDATES, TAIL, VALUES, AutoPlan, FloatArray
from ._profile import ROW_OCTAVES, Profile

__all__ = ["Aim", "aimed_at", "draw_aim", "factors_from", "tail_histogram", "tail_multipliers",
           "tail_said", "value_factors", "value_histogram"]

#: A sum's row cap aims at f(M) G s k^a (per k, over k), f(M) = M / (the mean of min(mu, M)
#: over the pairs that cut rows, mu a pair's mean |x|), from a noisy histogram of the pairs
#: beyond ``VALUES_CAP`` rows by the octave of their mean (``value_factors``, the ``values``
#: choice), its bins below ``VALUES_PRUNE`` / epsilon set to 0; f(M) within
#: [``VALUES_LEAST``, ``VALUES_MOST``], and the fixed factors where no bin is left
VALUES_CAP = 3
VALUES_PRUNE = 8.0
VALUES_LEAST = 1.0
VALUES_MOST = 64.0
#: the histogram's L1 sensitivity told to the Laplace mechanism: 1, and the roundings of its
#: 62 bins (124 for a mean's) to multiples of 2^-16 (``Profile.mean_octaves``,
#: ``light_octaves``), below 2^-9 in all
VALUES_SENSITIVITY = 1.0 + 2.0**-8
#: the row cap's tail (``tail_multipliers``): its histogram's bins kept above TAIL_PRUNE /
#: epsilon, and the mean excess ratio's range
TAIL_PRUNE = 8.0
TAIL_RATIO = (1.0, 32.0)
#: A mean's row cap, aimed by the histogram (``_mean_factors``): MEAN_HALF M / (gap lambda(r)),
#: the gap between the cut pairs' clamped mean and the others', at least 1 / MEAN_RATIO_MOST of
#: the cut pairs' mean, lambda(r) the other pairs' share of the rows kept at the cap r, their
#: rows taken as MEAN_LIGHT_ROWS per pair (1 to ``VALUES_CAP``) and the cut pairs' as r each.
#: Amin et al.'s point with a clamp's half-width and the values' factor 2 is 1; on the family
#: (``auto_bounds.py --family --questions AVG``, 56 shapes, with the ends below), against the
#: gap alone with 2 (median 1.37x, geometric mean 1.64x, 22 shapes within 1.25x, 33 with
#: P[>3x] <= 1%): with lambda and 1/2 1.32x, 1.62x, 22, 33; with 1 1.29x, 1.56x, 25, 36; with
#: 2 1.41x, 1.60x, 20, 37 (#11 5.2x -> 2.6x at 1: its heavy pairs hold 93% of the rows, so a
#: row they lose moves the mean by a fraction of the gap)
MEAN_HALF = 1.0
MEAN_RATIO_MOST = 32.0
MEAN_LIGHT_ROWS = 2.0


@dataclass(frozen=True)
class Aim:
    """The row cap's factors per magnitude (``value_factors``; None where no bin passed or
    none was drawn) and its targets' multipliers per row cap (``tail_multipliers``; None
    likewise), drawn once per query (``draw_aim``) and read by the first choice and by the
    retry (``plan_retry``) alike: post-processing of the histograms the query paid for."""

    factors: FloatArray | None
    tail: FloatArray | None = None


def draw_aim(auto_plan: AutoPlan, stats: Profile, source: RandomSource | None
             ) -> Aim | None:
    """The first choice's histograms and what they give: the factors (``value_factors``)
    and the tail's multipliers (``tail_multipliers``); None where the plan draws neither
    (``values_choice``, ``tail_weight``)."""
    if VALUES not in auto_plan.epsilons and TAIL not in auto_plan.epsilons:
        return None
    tail = tail_histogram(auto_plan, stats, source) if TAIL in auto_plan.epsilons else None
    factors = value_factors(auto_plan, stats, source) if VALUES in auto_plan.epsilons \
        else None
    return Aim(factors, None if tail is None else tail_multipliers(tail))


def _noisy_histogram(auto_plan: AutoPlan, name: str, histogram: FloatArray,
                     prune: float, source: RandomSource | None) -> FloatArray | None:
    """``histogram`` released by the Laplace mechanism with the choice ``name``'s epsilon and
    ``VALUES_SENSITIVITY``, its bins below ``prune`` / epsilon set to 0 (post-processing);
    None where its noise, on the mechanism's grid, is past the samplers' range (2^56 grid
    steps: an epsilon so small that nothing is drawn; the query was charged before it is
    answered, and the charge stands)."""
    epsilon = auto_plan.epsilons[name]
    mechanism = Laplace(epsilon=epsilon, sensitivity=VALUES_SENSITIVITY, source=source)
    if mechanism.noise_scale(histogram.size) / Fraction(mechanism.granularity) > \
            MAX_NOISE_SCALE:
        return None
    noisy = np.asarray(mechanism.release(histogram), dtype=np.float64)
    return np.where(noisy >= prune / epsilon, noisy, 0.0)


def value_histogram(auto_plan: AutoPlan, stats: Profile, source: RandomSource | None
                    ) -> FloatArray | None:
    """The noisy histogram of ``value_factors``: the pairs beyond ``VALUES_CAP`` rows by the
    octave of their mean |x| (``Profile.mean_octaves``), for a mean followed by the other
    pairs by the same octaves (``Profile.light_octaves``; a pair in one half only), L1
    sensitivity 1 under add/remove one unit (``VALUES_SENSITIVITY`` told), released by the
    Laplace mechanism (epsilon-DP: Dwork, McSherry, Nissim and Smith 2006), its bins below
    ``VALUES_PRUNE`` / epsilon set to 0 (post-processing; None past the samplers' range:
    ``_noisy_histogram``)."""
    parts = [stats.mean_octaves(VALUES_CAP)]
    if auto_plan.means:  # and the other pairs, for a mean's reference (``factors_from``)
        parts.append(stats.light_octaves(VALUES_CAP))
    histogram = np.asarray([b for part in parts for b in part], dtype=np.float64)
    return _noisy_histogram(auto_plan, VALUES, histogram, VALUES_PRUNE, source)


def factors_from(histogram: FloatArray, means: bool = False) -> FloatArray | None:
    """A mean's factors from its two halves (``_mean_factors``) where ``means``; else a sum's
    row cap's factor f(M) per magnitude M in ``MAGNITUDES`` from a (noisy)
    histogram over ``MEAN_OCTAVES``: M / mu(M), mu(M) the histogram's mean of min(m_o, M),
    m_o an octave's middle 2^(o + 1/2) (0 for the lowest: means at most 2^-20), within
    [``VALUES_LEAST``, ``VALUES_MOST``]; None where the histogram is empty (the row cap
    then aims at its fixed factor: ``ROW_FACTOR_VALUES``, or ``ROW_FACTOR`` per k).

    Why. Amin et al.'s point is where the rows the cap cuts cost the sum what its noise
    gains: a row cut costs its value, min(|x|, M) clamped, not M, so the pairs beyond the
    cap are weighed by their mean over M. Weighing the statistic itself (each pair by
    min(1, mean / M)) kept its sensitivity but shrank its growth below the crossing by the
    same ratio, and the ramp then pulled the choice to the lowest caps (the family: SUM
    median 1.42x -> 1.52x, ten shapes above 3x); the full statistic against a target
    raised by M / mu(M) keeps its growth (with the exact, not noisy, histogram: median
    1.25x, geometric mean 1.37x, 29 of 56 shapes within 1.25x, against 20)."""
    if means:
        return _mean_factors(histogram[:len(MEAN_OCTAVES)], histogram[len(MEAN_OCTAVES):])
    mass = float(histogram.sum())
    if not mass > 0.0:
        return None
    kept = _clamped_means(histogram)
    tops = np.asarray(MAGNITUDES, dtype=np.float64)
    with np.errstate(over="ignore"):  # a tiny kept mean: an infinite factor, clipped below
        factors = np.where(kept > 0.0, tops / np.maximum(kept, 1e-300), VALUES_MOST)
    return np.asarray(np.clip(factors, VALUES_LEAST, VALUES_MOST), dtype=np.float64)


def _clamped_means(histogram: FloatArray) -> FloatArray:
    """Per magnitude M in ``MAGNITUDES``: the histogram's mean of min(m_o, M), m_o an
    octave's middle 2^(o + 1/2) (0 for the lowest); the histogram is not empty."""
    middles = np.array([0.0 if o == MEAN_OCTAVES[0] else 2.0 ** (o + 0.5)
                        for o in MEAN_OCTAVES])
    tops = np.asarray(MAGNITUDES, dtype=np.float64)
    kept = (histogram[None, :] * np.minimum(middles[None, :], tops[:, None])).sum(axis=1)
    return np.asarray(kept / float(histogram.sum()), dtype=np.float64)


def _mean_factors(heavy: FloatArray, light: FloatArray) -> FloatArray | None:
    """A mean's row cap's factor per magnitude M (rows) and row cap r in ``ROW_CANDIDATES``
    (columns): MEAN_HALF M / (|m_h(M) - m_l(M)| lambda(r)), m_h the mean of min(m_o, M) over
    the pairs a cap cuts, m_l over the pairs of at most ``VALUES_CAP`` rows, the gap at
    least m_h(M) / ``MEAN_RATIO_MOST``, within [``VALUES_LEAST``, ``VALUES_MOST`` x
    ``MEAN_CAP_FACTOR``]; None where either part is empty.

    Why lambda. A row the cap r cuts moves the mean by its distance from the mean of the
    rows kept, which lies between m_l and m_h: at the light pairs' share lambda(r) of the
    rows kept, the distance is the gap times lambda(r). The histogram counts pairs, not rows
    (N_l and N_h, its two halves' totals, each pair weighing 1 / P): the light pairs' rows
    are taken as ``MEAN_LIGHT_ROWS`` each and the cut pairs' as r each, so lambda(r) =
    MEAN_LIGHT_ROWS N_l / (MEAN_LIGHT_ROWS N_l + r N_h). Where the heavy units hold most of
    the rows (the family's #11: 93%), a cap that trims them moves the mean little, and the
    gap alone aimed the cap far too high (r 431 where 32 is best: 5.2x the best fixed
    bounds; 2.6x with lambda)."""
    if not (float(heavy.sum()) > 0.0 and float(light.sum()) > 0.0):
        return None
    m_h, m_l = _clamped_means(heavy), _clamped_means(light)
    tops = np.asarray(MAGNITUDES, dtype=np.float64)
    gap = np.maximum(np.abs(m_h - m_l), m_h / MEAN_RATIO_MOST)
    with np.errstate(over="ignore", divide="ignore"):
        factors = np.where(gap > 0.0, MEAN_HALF * tops / np.maximum(gap, 1e-300),
                           MEAN_ROW_FACTOR * ROW_FACTOR_VALUES)
    light_rows = MEAN_LIGHT_ROWS * float(light.sum())
    rs = np.asarray(ROW_CANDIDATES, dtype=np.float64)
    share = light_rows / (light_rows + rs * float(heavy.sum()))
    return np.asarray(np.clip(factors[:, None] / share[None, :], VALUES_LEAST,
                              VALUES_MOST * MEAN_CAP_FACTOR), dtype=np.float64)


def aimed_at(auto_plan: AutoPlan, factors: FloatArray | None, magnitude: int | None,
             r: int) -> str:
    """What the release says of how the row cap was aimed (``value_factors``): the factor at
    the magnitude index and row cap chosen (a sum's factors are per magnitude, a mean's per
    magnitude and row cap), or that the histogram was empty."""
    if factors is None or magnitude is None:
        return ("no octave of the pairs' means stood above the histogram's noise: the row cap "
                "aimed at its fixed factor of the noise's rate")
    aim = float(factors[magnitude] if factors.ndim == 1 else
                factors[magnitude, ROW_CANDIDATES.index(r)])
    why = ("for a mean: the clamp over the gap between the mean |value| of the pairs it would "
           "cut and the others', times the others' share of the rows kept" if auto_plan.means
           else "the clamp over the mean |value| of the pairs it would cut")
    return f"the row cap aimed at {aim:.3g} times the noise's rate at the clamp chosen ({why})"


def tail_histogram(auto_plan: AutoPlan, stats: Profile, source: RandomSource | None
                   ) -> FloatArray | None:
    """The noisy histogram of ``tail_multipliers``: the pairs by their rows' bin
    (``Profile.row_octaves``), each weighing 1 / P, L1 sensitivity 1 under add/remove one
    unit (``VALUES_SENSITIVITY`` told, for the roundings), released by the Laplace mechanism
    (epsilon-DP: Dwork, McSherry, Nissim and Smith 2006), its bins below ``TAIL_PRUNE`` /
    epsilon set to 0 (post-processing; None past the samplers' range: ``_noisy_histogram``)."""
    histogram = np.asarray(stats.row_octaves(), dtype=np.float64)
    return _noisy_histogram(auto_plan, TAIL, histogram, TAIL_PRUNE, source)


def tail_multipliers(histogram: FloatArray) -> FloatArray | None:
    """Per row cap r in ``ROW_CANDIDATES``, the factor its target is multiplied by:
    1 / sqrt(rho(r)), rho(r) = B(r) / (r N(r)) within ``TAIL_RATIO`` (so at most 1), from a
    (noisy) histogram of the pairs by their rows' bin (``ROW_OCTAVES``: 1 to 8 rows exact,
    then the rows taken as spread evenly within each octave): N(r) the pairs beyond r, B(r)
    the rows beyond r summed over them (the rows the cap cuts); 1 where the histogram has
    nothing beyond r; None where it is empty.

    Why. Amin et al.'s point (``_auto_joint``'s docstring) is where the marginal bias the cap
    removes equals the marginal noise it adds, the minimum of bias plus noise, not of the
    squared error. The squared error b(r)^2 + s(r)^2 is least where N(r) c b(r) = s(r)
    s'(r) (c a cut row's cost): with b(r) = c B(r) and s(r) = r s'(r), that is N(r) =
    t / sqrt(rho(r)), t the rule's target. A tail whose pairs lie far beyond r (a flat
    one: heavy units of 30 to 300 rows) holds rho >> 1, and Amin et al.'s point leaves a
    bias larger than the noise; a tail that ends just beyond r holds rho << 1, and the
    point keeps rows whose noise costs more than their bias; only the first is acted on
    (the module docstring, "The tail's shape").

    Measured (``benchmarks/auto_bounds.py --family``, exact over the choice's law): from
    the exact statistics at every row cap and both sides, the family's SUM geometric mean
    1.30x -> 1.21x the best fixed bounds and COUNT 1.17x -> 1.09x, a bound on what the idea
    gives; the noisy histogram reads far tails as ended, so only rho >= 1 is kept. With the
    noisy histogram and rho >= 1 (the code here): SUM #13 2.08x -> 1.41x, #47 1.98x ->
    1.30x, #27 1.61x -> 1.42x, geometric mean 1.302x -> 1.283x, no shape worse by 0.05x;
    COUNT #19 1.36x -> 1.10x, geometric mean 1.169x -> 1.174x (the histogram's epsilon, on
    top of the share, costs the answer about 1% where it finds nothing); ``benchmarks/
    README.md``, twenty-sixth session."""
    total = float(histogram.sum())
    if not total > 0.0:
        return None
    highs = np.asarray(ROW_OCTAVES, dtype=np.float64)
    exact = highs <= 8.0  # a bin of one row count
    lows = np.where(exact, highs, highs / 2.0)
    widths = np.where(exact, 1.0, highs - lows)
    r = np.asarray(ROW_CANDIDATES, dtype=np.float64)[:, None]
    # [r, bin]: the part of a bin beyond r, and the mean of (n - r)+ over it (n spread evenly
    # over (low, high] in an octave)
    beyond = np.where(exact, (highs > r).astype(np.float64),
                      np.clip((highs - r) / widths, 0.0, 1.0))
    excess = np.where(exact, np.maximum(highs - r, 0.0),
                      np.where(r <= lows, (lows + highs) / 2.0 - r,
                               np.where(r >= highs, 0.0, (highs - r) ** 2 / (2.0 * widths))))
    n = (beyond * histogram).sum(axis=1)
    b = (excess * histogram).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = np.where(n > 0.0, b / (r[:, 0] * n), 1.0)
    rho = np.clip(rho, *TAIL_RATIO)
    return np.asarray(1.0 / np.sqrt(rho), dtype=np.float64)


def tail_said(tail: FloatArray | None, r: int) -> str:
    """What the release says of the tail's multiplier at the row cap chosen."""
    if tail is None:
        return ("no bin of the pairs' rows stood above the histogram's noise: the row cap "
                "aimed at the bias-variance point")
    m = float(tail[ROW_CANDIDATES.index(r)])
    return (f"the row cap's target times {m:.3g} at the cap chosen (1 / sqrt of the rows "
            "beyond it over the cap times the pairs beyond it: the squared error's least)")


def value_factors(auto_plan: AutoPlan, stats: Profile, source: RandomSource | None
                  ) -> FloatArray | None:
    """The row cap's factor per magnitude: ``factors_from`` of ``value_histogram`` (None
    where no bin passed)."""
    histogram = value_histogram(auto_plan, stats, source)
    return None if histogram is None else factors_from(histogram, auto_plan.means)
