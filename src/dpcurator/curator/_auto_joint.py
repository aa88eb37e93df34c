"""The joint choice of the caps per group and the first column's magnitude, and the
penalties every choice of bounds scores with (``dpcurator.curator._auto_bounds``).

The rule. A cap tau trades bias (what the units beyond tau lose) against noise (whose scale
grows with tau). Raising tau removes bias at the rate of the mass beyond tau and adds noise
at the rate d(sigma)/d(tau), so the best tau is where the amount beyond tau is about the
noise's rate: Amin, Kulesza, Munoz Medina and Vassilvitskii, "Bounding user contributions: a
bias-variance trade-off in differential privacy" (ICML 2019), Section 3. For G partitions
each with noise s k^a r M (a = 1 under Laplace noise, 1/2 under Gaussian) the rates, in the
units of the statistics below, are (``AutoPlan.target``):

- ``max_partitions``: t = G s a k^(a-1) units with more than k partitions (a unit beyond k
  taken to lose r rows, or r M, per unit of k);
- ``max_rows_per_partition``: t = f G s k^a pairs beyond r, with f = ``ROW_FACTOR`` (1.5)
  for counts and ``ROW_FACTOR_VALUES`` (2) when the query aggregates a column. G s k^a is
  the rate for pairs of units in one partition (the longest pairs are usually theirs; a
  unit in P partitions weighs 1 / P below, so it is reached later, on the safe side); the
  factor f was set on the skewed benchmark (``benchmarks/auto_bounds.py``): its squared
  error is smallest above Amin et al.'s point for counts, and values beyond the cap average
  less than M, so a column's rate per pair is lower than M. A query of SUMs reads that rate
  from the data instead (``_auto_aims.value_factors``): f(M) per magnitude;
- a column's magnitude M: t = G s k^a units' worth of values beyond M (a unit's values
  weigh 1 / T below: a unit of r rows in one partition holds about r of them).

With many partitions the row cap's rate is read per k (``per_k_rows``): each pair weighs 1
/ max(P, k), the rows the cap k keeps of it (min(1, k / P)) over k, and the target is f G s
k^a / k. This is Amin et al.'s point itself: the 1 / P statistic undercounts the rows that a
unit in P > 1 partitions loses (up to min(P, k) times), and a tail of units in many
partitions stays below f G s k^a at every r when G is large (on the skewed benchmark with 32
groups the chosen r was 3 where the best is about 100; RMSE 3.5x the best fixed bounds, 1.2x
per k). Per k a unit adds at most min(P, k) / k <= 1 but usually less, so the statistic is
smaller and the choice noisier: it is used only where its target stands clear of the
choice's noise, f G s k^(a-1) epsilon >= ``PER_K_MIN`` (2.8 under Laplace noise,
``PER_K_MIN_GAUSSIAN`` 3.3 under Gaussian, with the f above, at the largest k). At the
default share and under Laplace noise that is from 12 groups for counts and from 10 for a
column (11 and 9 when the release also pays for total intervals). The thresholds were set on
the benchmark's exact expected RMSE (``benchmarks/auto_bounds.py --exact``: the choice's
permute-and-flip law, each candidate scored by its exact bias and noise) with the knee below,
ratios to the best fixed bounds, 1 / P against per k: SUM 1.46 against 1.07 with 10 groups,
1.70 against 1.09 with 11; counts 1.15 against 1.02 with 12; with 8 groups per k is worse for
a SUM on 50,000 units (0.98 against 1.92) though better on 20,000, so 8 stays on 1 / P. Under
zCDP at rho 0.5, a SUM per k was worse with 16 and 24 groups (0.89 against 1.55, 1.01
against 1.44), hence the higher threshold there. Per k a column's row cap takes the counts'
factor and ramp (1.5 and ``ROW_LAMBDA_COUNTS``): with 2 and ``LAMBDA``, set for the 1 / P
statistic, SUM chose r 13 where the best is 128 (64 groups: 1.67x the best fixed RMSE; 1.15x
with the counts').

The statistics. ``Profile`` computes them from the engine's profile (counts only,
``BoundedQuery.profile``), each weighing a unit's parts so that one unit adds at most 1 to
it; P, n and T are rounded up by the engine, so the weights never exceed the exact ones:

- units with more than K partitions (each of a unit's pairs weighing 1 / P, P its
  partitions);
- pairs with more than R rows, each weighing 1 / P (1 / max(P, k) per k); a pair counted
  as n > 16 rows (n rounded up to ``UNIT_TOTALS``, eight steps an octave) counts for the
  part above R of the interval between the grid's point below n and n (``_beyond``, a
  weight in [0, 1]), not all or nothing, so that the candidates between the grid's points
  see a change. With powers of two (until the twenty-fifth session) the cap read pairs of
  65 to 72 rows as spread up to 128 and landed an octave above the best: on the family
  (``auto_bounds.py --family --questions COUNT``) #5 1.62x -> 0.99x, #51 1.63x -> 0.97x,
  #13 1.74x -> 1.18x, #17 1.46x -> 0.87x, COUNT's median 1.186x -> 1.076x;
- values with |x| > M, each weighing 1 / max(T, r') (T the unit's rows, r' the row cap of
  the candidate, r, rounded down to a power of two and at most ``MAGNITUDE_ROWS``, 4): the
  share of the unit that the cap keeps, over r', so a unit adds at most T / max(T, r') <= 1.
  The bias a clamp adds is in rows beyond it, and the noise it adds in r M: weighing a
  light unit's values 1 / T (as before issue 26) counted each as if its unit had r rows, and
  chose clamps far too wide where light units hold the largest values (the family of
  ``benchmarks/auto_bounds.py --family``, lognormal values: SUM 19x the best fixed bounds).
  r' stops at 4 because the statistic shrinks with r' while the ramp below does not: with
  values mostly zero, r' = 16 left too little above the target to climb from the lowest
  magnitudes to the data's, and the clamp fell to zero (SUM 5.3x on one shape; 1.5x at 4);
- negative and positive values, each weighing 1 / T (for the signs).

A mean (every aggregate an AVG) aims its partition cap at ``MEAN_CAP_FACTOR`` (16) times the
target below: a row a cap removes moves a mean by its distance from the mean, not by its
value, so a mean's bias per row cut is a fraction of a sum's, while the noise per row kept is
the same (its clamp keeps the sum's rate). The factor was set on the family (AVG's exact
expected RMSE against the best fixed bounds, geometric mean over 52 shapes: 3.5x with 1, 2.5x
with 4, 2.0x with 16 and 32; worst 9.7x with 16, 22x with 32). How much a cap moves a mean
depends on how the heavy units' values differ from the rest: where the row cap and the clamp
are chosen, the row cap reads that from the histogram of a sum's row cap (``_auto_aims``), with the
other pairs beside the cut ones (``_mean_factors``); where that histogram is empty, the row
cap aims at ``MEAN_ROW_FACTOR`` (8) times its fixed target. Where it is not, the partition cap
reads it too: a pair cut beyond k moves a mean by its rows' distance from the rows kept, as
a row cut does, so its target at (r, M) is the larger of the fixed factor and the row cap's
factor there (``_mean_partition_penalties``; the family's AVG: geometric mean 1.38x -> 1.36x,
#44 1.94x -> 1.39x, #40 1.36x -> 0.83x, none worse by over 0.01x).

The penalties. For each candidate c_j (in increasing order, steps of 2^(1/4) for rows and
magnitudes, of 2 for partitions) with statistic stat_j (decreasing in j) and target t_j:

    p_j = max(0, stat_j - t_j, max_(i<j) h_ij - stat_i),
    h_ij = max(t_i, min(2 F, t_i + 2 lambda log2(c_j / c_i) / epsilon))     (``ramp_penalties``)

(stat_j - t_j left out for the last candidate, which has nothing above it). p_j is 0 at the
crossing (the smallest candidate within its target) when the statistic below it grows by at
least 2 lambda / epsilon per octave; above the crossing it grows by 2 lambda / epsilon per
octave (each octave about e^-lambda times as likely), up to 2 F. lambda = ``LAMBDA`` (4),
``MAGNITUDE_LAMBDA`` (6) for a column's magnitude,
``K_LAMBDA`` (8) for the partition cap, whose steps are octaves and whose few candidates
compete in the joint choice with many row caps and magnitudes (``K_ALONE_LAMBDA``, 4, where
it is chosen alone with public keys, as for COUNT(DISTINCT)), and ``ROW_LAMBDA_COUNTS`` (3)
for the row cap of a query that aggregates no column (and any row cap read per k), and at
least ``ROW_LAMBDA_PRIVATE`` (8) for the row cap where the keys are private. The row
cap read per k ramps at lambda for ``ROW_KNEE`` (5) octaves above c_i, then at
``ROW_FAR_LAMBDA`` (8) per octave:
the tail of far choices. With lambda = 2 each octave up is e^-2 times as likely while the
noise's squared error grows 4 times (16 when the magnitude rises too), so rare choices far
above the crossing carried a SUM's expected error (12 groups, 20,000 units: 38% of its mean
squared error from row caps above 1024, exact expected RMSE 1.77x the best fixed bounds).
A steeper ramp throughout moves the choice down instead, as the statistic below the
crossing must then grow as fast (the end of "The floor"); past 5 octaves that does not bind
on the benchmark: 12 groups SUM 1.77 -> 1.10, 16 groups 1.49 -> 1.09 and COUNT 1.23 -> 1.06,
32 groups SUM 1.16 -> 1.01 (knees at 3 or 4 octaves, or a far lambda of 6, measured worse).
Every term is a statistic plus a constant, so each penalty, and any maximum of penalties,
moves by at most 1 when a unit is added or removed (the sensitivity).

The choices. One joint choice (``choice_names``) takes the caps asked for and the first
auto-bounded column's magnitude: permute-and-flip (McKenna and Sheldon 2020;
``PermuteAndFlip``, epsilon-DP) over the product of their candidates (at most 11 x 44 x 320)
with the score -max(p_k, p_r(k), p_M(k), p_joint) (the targets of r and M use that
candidate's k): one mechanism with their summed epsilon instead of one each. p_joint
(``_joint_ramp``) adds the ramps of a cap and the magnitude: a candidate above a lower one
in both pays the octaves of each, summed, less the lower one's largest excess over its
targets (one statistic less constants, so sensitivity 1 still). Without it a row cap above
its crossing shared its score with every magnitude whose own penalty stayed below the row
cap's, and its mass grew with their number (UCI Adult's SUM(hours), one row per person:
r = 2 to 32 held two thirds of the expected squared error; ``benchmarks/adult.py --exact``
1.49x the best fixed bounds, 1.05x with it). On the family's 56 shapes (exact expected RMSE
against the best fixed bounds): SUM geometric mean 1.61x -> 1.54x, within 1.25x 16 -> 20
shapes, 17 better by over 5% and 7 worse (the plateau had spread the clamp above a crossing
that sits low: #6 1.45x -> 1.75x, #36 9.9x -> 10.7x); AVG geometric mean 1.93x both;
COUNT and COUNT(DISTINCT) unchanged (no magnitude).

The floor. F = 2 ln(C / beta) / epsilon (``AutoPlan.floor``; C the choice's number of
candidates, beta = ``BETA`` = 1e-4). Each coordinate of a choice has a candidate with
penalty at most F (the smallest j with stat_j <= F, or the last: every term is then at most
F, for targets up to 2 F; with larger ones the crossing scores 0), so the best score is at
least -F; a candidate whose ramp has reached 2 F above a candidate with nothing beyond it
(more than (2 F - t) epsilon / (2 lambda) octaves above the data: about 10 for a SUM's
joint choice, 14 for a COUNT's row cap) scores at most -2 F, and all of them together are
less likely than beta. In data whose best candidate scores 0, each octave above the
crossing is about e^-lambda times as likely (a magnitude's lambda is ``MAGNITUDE_LAMBDA``,
6: 7 octaves for a SUM's joint choice). A small count cannot be located with a small
epsilon: when the statistic grows too slowly below the crossing the ramp penalizes it and
the choice lands lower (more bias), not higher.

The far tail. Less likely than beta is not enough where the noise grows with the candidate:
on the plateau at 2 F every magnitude up to 2^50 kept the same small chance (1e-16 to
1e-10 each), and its noise's variance, 4 times larger an octave, made the expected squared
error theirs (the family's SUM, every candidate counted: median 35,598x the best fixed
bounds). A magnitude's penalties (and a unit's sum's cap's, ``_auto_units``) therefore go
on rising past the cap at 2 ``MAGNITUDE_BEYOND`` / epsilon per octave, each octave e^-2
times as likely, up to stat_0 - stat_i, the units' worth below the anchor c_i (the second
term of ``ramp_penalties``; sensitivity 1 still: a unit adds 0 to 1 to either statistic).
Below the data that worth is 0, so candidates counting every unit add nothing there (a
rise from every candidate without it put the family's #42, values 90% zero with 3
decimals, at 2^-7). The crossing's penalty can then exceed F where, more than the ramp's
reach below it, a candidate has over F units beyond it and over F below it and the
statistic grows slower than 2 ``MAGNITUDE_BEYOND`` / epsilon an octave from there; where
the data's units are few (epsilon stat_0 / 2 well under 2 ln(2^50 / the data's magnitude))
the rise stops short and the plateau beyond it is left (the family's #42 under
``bounding="unit"``: 443x the best with every cap counted, 1.85x without the plateau).

Exactness. The statistics are summed exactly (fractions), capped at 2^36 and rounded down to
multiples of 2^-16, and the penalties capped at 2^35, so that the floating-point scores move
by at most 1 + 2^-14 between neighbours; the mechanisms are told a sensitivity of 1 + 2^-12
(``SENSITIVITY``), never less than the scores' true one. The rise past the cap sums a
public b_i of up to 2^39 with a statistic (only where the cap is below stat_0 <= 2^36, so
b_i < 319 / epsilon < 2^39): two roundings of at most 2^-15 and 2^-17 on each side, 1 +
2^-13.7 in all, within it too
(``test_the_rise_past_the_cap_keeps_its_sensitivity_in_floating_point``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.ndimage import minimum_filter1d

from dpcurator.errors import InternalError
from dpcurator.mechanisms.exponential import PermuteAndFlip
from dpcurator.noise import RandomSource
from dpcurator.query.plan import (
    Count,
    CountUnits,
    Plan,
)

from ._auto_plan import (
    MAGNITUDES,
    ROW_CANDIDATES,
    AutoPlan,
    FloatArray,
    joint_parts,
    means_only,
    partition_candidates,
)
from ._profile import Profile

__all__ = ["JointScores", "choose_joint", "joint_scores", "magnitude_cap", "per_k_rows",
           "ramp_penalties", "release_index", "thin_floor"]

#: Exact scores: statistics are summed exactly (``Fraction``, ``_profile``), capped at 2^36
#: and rounded down to multiples of 2^-16 (so they and the penalties, capped at 2^35, are
#: floats whose arithmetic errs by less than 2^-16 each): a score then moves by at most
#: 1 + 2^-14 between neighbours, and the mechanisms are told 1 + 2^-12.
PENALTY_CAP = float(2**35)
SENSITIVITY = 1.0 + 2.0**-12
#: the ramp above a candidate adds 2 LAMBDA / epsilon per octave (K_LAMBDA for the partition
#: cap, whose steps are octaves, competing in the joint choice with the many row caps and
#: magnitudes), up to CAP times the floor
LAMBDA = 4.0
K_LAMBDA = 8.0
#: the partition cap chosen alone (COUNT(DISTINCT): no row cap, no magnitude) ramps at
#: K_ALONE_LAMBDA: the many candidates K_LAMBDA answers are not there. At 8 the family's
#: heavy units in 6 groups at epsilon 0.3 (#18, #42, #48) drew k = 4 where 6 is best (2.05x,
#: 1.67x, 2.40x the best fixed bounds); at 4 (``auto_bounds.py --family --questions
#: COUNT_DISTINCT``): 1.17x each, all 56 shapes within 1.25x (53 before), median 1.074x ->
#: 1.081x, geometric mean 1.140x -> 1.108x, P[>3x] <= 1% on 53 (51). Public keys only: with
#: private keys the selection's threshold grows with k, and one octave too high can drop every
#: group (20,000 units in 1 to 3 of 40 groups, epsilon 0.1, delta 1e-6: k = 8 where 4 is best
#: in 2 of 40 seeded releases at 4, their threshold about 1,230 against about 1,000 units per
#: group; RMSE 228 against 64 over the 40), so there it keeps K_LAMBDA, as the row cap keeps
#: ``ROW_LAMBDA_PRIVATE``
K_ALONE_LAMBDA = 4.0
#: the row cap's ramp for a query that aggregates no column (counts only): gentler, because a
#: count's bias below the crossing costs more than the noise of a few octaves above it. On
#: the skewed benchmark (``benchmarks/auto_bounds.py --runs 20``) COUNT's RMSE against the
#: best fixed caps, at 10k / 20k / 50k / 100k units: 2.49 / 1.11 / 1.05 / 1.00x with 2, and
#: 4.16 / 1.22 / 1.06 / 1.04x with LAMBDA; SUM's was worse with 2 at every size (1.45-6.5x).
#: On the family of issue 26 (``auto_bounds.py --family``, exact expected RMSE against the
#: best fixed bounds over 52 shapes) 3 does better than 2 and 4: COUNT geometric mean 1.36 /
#: 1.30 / 1.33x, median 1.24 / 1.16 / 1.13x, worst 4.4 / 4.6 / 8.9x; SUM (per k) geometric
#: mean 1.89 -> 1.85x, 90th percentile 4.2 -> 3.3x with 3 against 2.
ROW_LAMBDA_COUNTS = 3.0
CAP = 2.0
#: With private keys the row cap's ramp is at least ROW_LAMBDA_PRIVATE per octave. The keys
#: are unknown, so the targets count one partition (G = 1) where the noise is paid in every
#: partition released, and each octave of k r doubles the private selection's threshold,
#: below which a partition is lost whole: costs no statistic here sees. UCI Adult, COUNT by
#: education with private keys (one row per person, 400 releases): with 3, r = 2 to 6 in 2.5%
#: of releases held 65% of the squared error, RMSE 1.85 (the best fixed caps: 1.34); with 6,
#: 1.57; with 8, 1.49. On 8 shapes of the family asked with private keys (12 releases each)
#: 8 against 3: COUNT's RMSE lower on all 8 (by 2% to 36%), SUM's on 5 of 8 (one 1.6x worse
#: in 12 releases, better by 22% in 40).
ROW_LAMBDA_PRIVATE = 8.0
#: The row cap's ramp, read per k, steepens ROW_KNEE octaves above a candidate to
#: ROW_FAR_LAMBDA per octave (the module docstring: the tail of far choices).
ROW_KNEE = 5.0
#: A column's row cap read per k ramps as a count's (3). UCI Adult's SUM(hours) (one row per
#: person) chose r = 2 to 8 in about 2% of releases, holding most of its squared error; 4.5
#: or 6 here fixed that (exact expected RMSE 2.3x -> 1.25x, 1.06x) but moved the choice
#: below the best on family shapes whose statistic grows slowly (#6: 1.50x -> 2.2x, 2.8x),
#: with the family's geometric mean level: left at 3.
ROW_LAMBDA_VALUES_PER_K = 3.0
#: A magnitude's ramp per octave above its crossing (``LAMBDA`` until issue 26's third round).
#: At 4 each step of 2^(1/4) up was e^-1 times as likely: the clamps' spread alone cost a SUM
#: about 1.14x in RMSE, and in the joint choice a row cap above the crossing shared its
#: penalty with every magnitude on its plateau (the joint score is the maximum of the
#: penalties), so its mass grew with their number. With 6, on the family's 56 shapes
#: (``auto_bounds.py --family``, exact over the choice's law): SUM median 1.61x -> 1.43x,
#: geometric mean 1.79x -> 1.61x, within 1.25x 11 -> 16; AVG geometric mean 1.99x -> 1.93x;
#: one shape worse (#8: SUM 1.61x -> 1.84x). UCI Adult SUM(hours) 2.31x -> 1.49x
#: (``adult.py --exact``).
MAGNITUDE_LAMBDA = 6.0
#: A magnitude's penalties (and a unit's sum's cap's, ``_auto_units``) rise past the cap 2 F
#: at this many per octave, up to the units' worth below the candidate (``ramp_penalties``'
#: ``beyond``): each octave e^-MAGNITUDE_BEYOND times as likely, where the noise's variance
#: grows 4 times. Flat at 2 F, every magnitude on the plateau kept a chance of 1e-16 to 1e-10
#: up to 2^50, 2^30 and more times the data's, and the expected squared error was theirs:
#: with every candidate counted, however unlikely (``auto_bounds.py --family`` with
#: ``ratio_with_left_out``; ``auto_bounds_unit.py --exact``), the family's SUM median
#: 35,598x the best fixed bounds per group and 24,763x under ``bounding="unit"``, none within
#: 1.25x. A ramp rising without end instead, from every candidate, penalized the data's
#: magnitude wherever the candidates far below the data count every unit (the family's #42,
#: values 90% zero with 3 decimals: the unit's cap fell to 2^-7, 1.85x -> 3.78x); the units'
#: worth below the candidate, stat_0 - stat_i, is 0 there.
MAGNITUDE_BEYOND = 2.0
ROW_FAR_LAMBDA = 8.0
#: the row cap aims at this many times the noise's rate: a count, or a column's values
ROW_FACTOR = 1.5
#: The row cap's statistic is read per k where f G s k^(a-1) epsilon is at least this (the
#: module docstring): under Laplace noise, and under Gaussian noise (a = 1/2).
PER_K_MIN = 2.8
PER_K_MIN_GAUSSIAN = 3.3
ROW_FACTOR_VALUES = 2.0
MAGNITUDE_ROWS = 4
#: A mean's partition cap aims at MEAN_CAP_FACTOR times a count's target (``joint_scores``)
MEAN_CAP_FACTOR = 16.0
#: ... and, where its row cap's factors were drawn (``_auto_aims._mean_factors``), at the
#: larger of that and its row cap's factor at each (r, M) (``_mean_partition_penalties``);
#: False only for the tests' and benchmarks' twin that shows what it changes
MEAN_K_AIMED = True
#: ... its factors read on steps of 2^(1 / MEAN_K_STEPS), rounded down
MEAN_K_STEPS = 16
#: A mean's row cap where its histogram is empty aims at MEAN_ROW_FACTOR times the fixed
#: factor: a fixed compromise, as nothing tells how far the cut rows lie from the rest. On the
#: family's shapes where no bin passes (epsilon 0.3 and rho 0.05, 10 shapes; ``auto_bounds.py
#: --family --questions AVG --only ...``), geometric mean 2.19x with 2, 1.93x with 4, 1.92x
#: with 8, 2.18x with 16 (#0 1.75x, 1.31x, 1.44x, 4.49x; #54 4.28x, 1.90x, 1.40x, 1.25x)
MEAN_ROW_FACTOR = 8.0


def ramp_penalties(stats: Sequence[float] | FloatArray, candidates: Sequence[float],
                   targets: float | Sequence[float] | FloatArray, cap: float, epsilon: float,
                   ramp: float, knee: float | None = None, far: float = 0.0,
                   beyond: float = 0.0) -> FloatArray:
    """The penalties p_j of the module docstring: max(0, stat_j - t_j, max_(i<j) h_ij -
    stat_i), the first term left out at the last candidate, h_ij = t_i + 2 ``ramp``
    log2(c_j / c_i) / epsilon (``far`` instead of ``ramp`` per octave beyond ``knee``
    octaves), at most ``cap`` (and at least t_i). Each term is one statistic plus a constant,
    so p moves by at most as much as the statistics. ``stats`` and ``targets`` may hold
    several series (the last axis runs over the candidates): one penalty series each.

    With ``beyond`` > 0 (and no knee) a second term rises past the cap: h'_ij = min(t_i + 2
    ``ramp`` o_ij / epsilon, ``cap`` + 2 ``beyond`` (o_ij - K_i)+ / epsilon), K_i the octaves
    the ramp takes from t_i to the cap, at most stat_0 (the series' first statistic, every
    unit's worth: the candidates are increasing), and the term is max(h_ij, min(h'_ij,
    stat_0)) - stat_i = max(h_ij - stat_i, min(h'_ij - stat_i, stat_0 - stat_i)). stat_0 -
    stat_i is the units' worth between c_0 and c_i: adding a unit adds its weight at c_0 less
    its weight at c_i, both within [0, 1], so the difference moves by at most 1 (and by 0 to
    1 where a unit's weight falls as c rises, as the statistics' do), and every term still
    moves by at most 1. Below the data (stat_i = stat_0) it adds nothing; above it each
    octave is e^-``beyond`` times as likely, up to the units' worth (``MAGNITUDE_BEYOND``)."""
    stat = np.asarray(stats, dtype=np.float64)
    target = np.broadcast_to(np.asarray(targets, dtype=np.float64), stat.shape)
    octaves = np.log2(np.asarray(candidates, dtype=np.float64))
    n = stat.shape[-1]
    low = stat - target
    low[..., -1] = -math.inf  # no larger candidate to move to
    above = np.maximum(octaves[:, None] - octaves[None, :], 0.0)  # [j, i]: c_i up to c_j
    rise = ramp * above
    if knee is not None:
        rise = ramp * np.minimum(above, knee) + max(far, ramp) * np.maximum(above - knee, 0.0)
    # the same operations as max(t_i, min(cap, t_i + 2 rise / epsilon)) - stat_i, in place
    # on one array (the magnitudes' 320 x 320 per series: a tenth of a SUM's release)
    below = target[..., None, :]
    high = np.add(below, 2.0 * rise / epsilon)
    np.minimum(high, cap, out=high)
    np.maximum(high, below, out=high)
    np.subtract(high, stat[..., None, :], out=high)
    np.copyto(high, -math.inf, where=np.arange(n)[None, :] >= np.arange(n)[:, None])  # i < j
    terms = high.max(axis=-1)
    if beyond > 0.0:
        terms = np.maximum(terms, _rise_beyond(stat, octaves, target, cap, epsilon, ramp,
                                               beyond))
    return np.asarray(np.maximum(0.0, np.maximum(low, terms)), dtype=np.float64)


def _rise_beyond(stat: FloatArray, octaves: FloatArray, target: FloatArray, cap: float,
                 epsilon: float, ramp: float, beyond: float) -> FloatArray:
    """``ramp_penalties``' second term, max_(i<j) min(h'_ij - stat_i, stat_0 - stat_i), in
    O(n log n) per series, for one target t per series. Past K = (cap - t)+ epsilon / (2
    ramp) octaves (the ramp's reach; within it h' is the flat cap's h), h'_ij = a_j - b_i
    with a_j = cap + 2 beyond (o_j - K) / epsilon and b_i = 2 beyond o_i / epsilon (the ramp
    is above it, as beyond <= ramp), so the term is S - stat_i (S = stat_0) where b_i <= a_j
    - S, a prefix of the i, and a_j - (b_i + stat_i) after it: a prefix's least statistic
    and a range's least b + stat (a sparse table, as ``_range_min``'s). The candidates
    increase; their spacing may vary."""
    if beyond > ramp:
        raise InternalError("a rise past the cap steeper than the ramp; this is a bug")
    n = stat.shape[-1]
    series = stat.reshape(-1, n)
    t = target.reshape(-1, n)[:, :1]
    if not np.all(target.reshape(-1, n) == t):
        raise InternalError("a rise past the cap with a target per candidate; this is a bug")
    ceiling = series[:, :1]
    if np.all(ceiling <= cap):  # under the cap the flat term is at least as large
        return np.full(stat.shape, -math.inf)
    reach = np.maximum(cap - t, 0.0) * epsilon / (2.0 * ramp)  # per series
    rel = octaves - octaves[0]
    a = cap + 2.0 * beyond * (rel[None, :] - reach) / epsilon
    b = 2.0 * beyond * rel / epsilon
    # per series and j: the last i with o_j - o_i > K, the first past the prefix where the
    # ceiling binds (b_i > a_j - S)
    last = np.searchsorted(octaves, (octaves[None, :] - reach).ravel(), side="left"
                           ).reshape(a.shape) - 1
    first = np.searchsorted(b, (a - ceiling).ravel(), side="right").reshape(a.shape)
    rows = np.arange(series.shape[0])[:, None]
    prefix = np.minimum.accumulate(series, axis=1)
    head = np.minimum(first - 1, last)
    part = np.where(head >= 0, ceiling - prefix[rows, np.maximum(head, 0)], -math.inf)
    # a sparse table of b + stat's minima over runs of 2^l, queried at [first, last]
    table = [b[None, :] + series]
    while (1 << len(table)) <= n:
        half, previous = 1 << (len(table) - 1), table[-1]
        following = np.full(previous.shape, math.inf)
        following[:, :n - half] = np.minimum(previous[:, :n - half], previous[:, half:])
        table.append(following)
    stacked = np.stack(table)
    length = last - first + 1
    level = np.floor(np.log2(np.maximum(length, 1))).astype(np.intp)
    low = stacked[level, rows, np.clip(first, 0, n - 1)]
    high = stacked[level, rows, np.clip(last - (1 << level) + 1, 0, n - 1)]
    tail = np.where(length > 0, a - np.minimum(low, high), -math.inf)
    return np.maximum(part, tail).reshape(stat.shape)


def release_index(scores: FloatArray | Sequence[float], epsilon: float,
                  source: RandomSource | None, *, monotonic: bool = False) -> int:
    mechanism = PermuteAndFlip(epsilon=epsilon, sensitivity=SENSITIVITY, monotonic=monotonic,
                               source=source)
    capped = np.maximum(np.asarray(scores, dtype=np.float64), -PENALTY_CAP)
    return int(mechanism.release(capped))


@dataclass(frozen=True)
class JointScores:
    """The joint choice's candidates and scores, before the draw: ``scores[index]`` for the
    candidate ``decode(index)`` = (k, r, the first column's magnitude index or None), with
    ``epsilon`` the choice's (permute-and-flip, sensitivity ``SENSITIVITY``). Public so that
    the benchmarks weigh each candidate by its exact probability."""

    scores: FloatArray
    epsilon: float
    ks: tuple[int, ...]
    rs: tuple[int, ...]
    sizes: tuple[int, ...]  # row candidates allowed at each k
    width: int  # magnitudes per (k, r): len(MAGNITUDES), or 1 when no column is chosen

    def decode(self, index: int) -> tuple[int, int, int | None]:
        for a, size in enumerate(self.sizes):  # the block of k, then r and m in it
            if index < size * self.width:
                j, m = divmod(index, self.width)
                return self.ks[a], self.rs[j], (m if self.width > 1 else None)
            index -= size * self.width
        raise InternalError("the joint choice's index is out of range; this is a bug")


def choose_joint(auto_plan: AutoPlan, plan: Plan, stats: Profile,
                 source: RandomSource | None,
                 rows_for: Sequence[tuple[int, int]] | None = None,
                 factors: FloatArray | None = None, *, tail: FloatArray | None = None
                 ) -> tuple[int, int, int | None]:
    """The joint choice: (k, r, the first column's magnitude index or None), over the
    candidates ``rows_for`` allows ((k, how many row candidates at k): those proven to compile
    before the charge, ``_candidates``; all of them when None); ``factors`` the row cap's
    factor per magnitude (``value_factors``), or None for the fixed factors; ``tail`` the row
    cap's targets' multipliers (``tail_multipliers``), or None."""
    joint = joint_scores(auto_plan, plan, stats, rows_for, factors, tail=tail)
    return joint.decode(release_index(joint.scores, joint.epsilon, source))


def joint_scores(auto_plan: AutoPlan, plan: Plan, stats: Profile,
                 rows_for: Sequence[tuple[int, int]] | None = None,
                 factors: FloatArray | None = None, *, tail: FloatArray | None = None
                 ) -> JointScores:
    """The joint choice's scores (``choose_joint``) over the allowed candidates; with
    ``factors`` (``value_factors``: public, a noisy release's post-processing) a sum's row
    cap aims at factors[m] G s k^a at the magnitude m (per k, over k), not at the fixed
    ``ROW_FACTOR_VALUES`` G s k^a (``ROW_FACTOR`` G s k^a / k); with ``tail``
    (``tail_multipliers``: public too) the row cap's target at r is multiplied by tail[r]
    (the biases of the joint ramp and its reach read the targets without it)."""
    auto = auto_plan.auto
    name = "+".join(joint_parts(auto))
    epsilon = auto_plan.epsilons[name]
    all_ks = partition_candidates(plan) if auto.max_partitions else [plan.max_partitions or 1]
    all_rs = list(ROW_CANDIDATES) if auto.max_rows_per_partition else \
        [plan.max_rows_per_partition or 1]
    allowed = dict(rows_for) if rows_for is not None else {k: len(all_rs) for k in all_ks}
    ks = [k for k in all_ks if allowed.get(k, 0) > 0]
    if not ks:
        raise InternalError("no proven candidate to choose from; this is a bug")
    magnitude = bool(auto.columns)
    width = len(MAGNITUDES) if magnitude else 1
    cap = CAP * thin_floor(auto_plan, plan, rows_for)
    # a mean's caps cost it less bias per row they cut (``MEAN_CAP_FACTOR``)
    means = means_only(plan)
    weigh = MEAN_CAP_FACTOR if means else 1.0
    pk = np.zeros(len(ks))
    # alone (COUNT(DISTINCT)) the partition cap competes with nothing: the gentler ramp, with
    # public keys (private keys' threshold grows with k: ``K_ALONE_LAMBDA``)
    k_ramp = K_LAMBDA if auto.max_rows_per_partition or magnitude or plan.private_keys \
        else K_ALONE_LAMBDA
    if auto.max_partitions:
        targets = [weigh * auto_plan.target(k, per_partition=True) for k in ks]
        partition_stats = stats.partitions(ks)
        pk = ramp_penalties(partition_stats, ks, targets, cap, epsilon, k_ramp)
    # a mean's partition cap aimed by its row cap's factors too, per (r, M)
    mean_k = None
    if MEAN_K_AIMED and means and auto.max_partitions and magnitude and factors is not None \
            and np.ndim(factors) == 2:
        mean_k = _mean_partition_penalties(partition_stats, ks, targets,
                                           np.asarray(factors)[:, :len(all_rs)].T, weigh,
                                           cap, epsilon, k_ramp)
    # the magnitude's statistic per row cap (a row weighs 1 / max(T, r)): its penalties per r
    # and k (the target's rate depends on k)
    # (read at r' = ``magnitude_cap(r)``: a valid weight, 1 / max(T, r') <= 1 / T, on at most
    # three series, r' = 1, 2, 4, instead of one per row cap)
    octave = {r: magnitude_cap(r) for r in all_rs}
    value_stats = stats.magnitudes_by_cap(0, sorted(set(octave.values()))) if magnitude \
        else {}
    values = any(not isinstance(agg, Count | CountUnits) for agg in plan.aggregates)
    factor = ROW_FACTOR_VALUES if values else ROW_FACTOR
    per_k = per_k_rows(auto_plan, factor, epsilon, max(ks))
    # per k, a column's row cap is read as a count's (the module docstring)
    if per_k:
        factor = ROW_FACTOR
    ramp = (ROW_LAMBDA_VALUES_PER_K if per_k else LAMBDA) if values else ROW_LAMBDA_COUNTS
    if plan.private_keys:
        ramp = max(ramp, ROW_LAMBDA_PRIVATE)
    knee = (ROW_KNEE, ROW_FAR_LAMBDA) if per_k else (None, 0.0)
    # a sum's row cap aimed per magnitude (``value_factors``): one target per magnitude
    valued = factors is not None and magnitude and bool(auto.max_rows_per_partition)
    row_stats = stats.rows(all_rs) if auto.max_rows_per_partition and not per_k else []
    # each candidate's bias (its largest statistic less its target), for the joint ramp
    bias = np.full((len(ks), len(all_rs), width), math.inf)
    targets_seen: list[float] = list(targets) if auto.max_partitions else []
    if mean_k is not None:
        targets_seen.append(float(mean_k[2]))
    blocks = []
    for a, k in enumerate(ks):
        rs = all_rs[:allowed[k]]
        rate = auto_plan.target(k, per_partition=False)
        block = np.full(len(rs), pk[a] if mean_k is None else 0.0)
        over = np.full((len(rs), width), -math.inf)
        if auto.max_partitions:
            over[:] = partition_stats[a] - targets[a] if mean_k is None else \
                mean_k[1][:len(rs), :, a]
        rows_by_magnitude = None
        if auto.max_rows_per_partition and valued:  # (r, magnitude) penalties
            assert factors is not None
            # a mean's factors hold its own weighing (``factors_from``)
            aims = np.asarray(factors, dtype=np.float64)
            aims = aims[:, :len(rs)] if aims.ndim == 2 else \
                np.broadcast_to(aims[:, None], (width, len(rs)))
            targets2 = rate * aims / (k if per_k else 1)
            kept = np.asarray(stats.rows(rs, k) if per_k else row_stats[:len(rs)],
                              dtype=np.float64)
            # one series per distinct target (the factors are flat below and above the data)
            distinct, where = np.unique(targets2, axis=0, return_inverse=True)
            series = np.broadcast_to(kept, distinct.shape)
            if tail is not None:
                distinct = distinct * tail[None, :len(rs)]
            rows_by_magnitude = ramp_penalties(series, rs, distinct, cap, epsilon,
                                               ramp, *knee)[where.ravel()].T
            over = np.maximum(over, kept[:, None] - targets2.T)
            targets_seen.append(float(targets2.max()))
        elif auto.max_rows_per_partition:
            aim = (MEAN_ROW_FACTOR if means else 1.0) * factor * rate
            stat, target = (stats.rows(rs, k), aim / k) if per_k else (row_stats[:len(rs)], aim)
            aimed = np.full(len(rs), target) if tail is None else target * tail[:len(rs)]
            block = np.maximum(block, ramp_penalties(stat, rs, aimed, cap, epsilon, ramp, *knee))
            over = np.maximum(over, (np.asarray(stat, dtype=np.float64) - target)[:, None])
            targets_seen.append(target)
        if magnitude:
            lows = sorted({octave[r] for r in rs})
            per = ramp_penalties(np.array([value_stats[r] for r in lows]), MAGNITUDES, rate, cap,
                                 epsilon, MAGNITUDE_LAMBDA, beyond=MAGNITUDE_BEYOND)
            pm = per[[lows.index(octave[r]) for r in rs]]
            if rows_by_magnitude is not None:
                pm = np.maximum(pm, rows_by_magnitude)
            if mean_k is not None:
                pm = np.maximum(pm, mean_k[0][:len(rs), :, a])
            block = np.maximum(block[:, None], pm).ravel()
            over = np.maximum(over, np.array([value_stats[octave[r]] for r in rs]) - rate)
            targets_seen.append(rate)
        bias[a, :len(rs)] = over
        blocks.append(block)
    if JOINT_RAMP:
        lambdas = (k_ramp if auto.max_partitions else 0.0,
                   ramp if auto.max_rows_per_partition else 0.0, MAGNITUDE_LAMBDA)
        reach = cap - max(targets_seen) if targets_seen else 0.0
        joint = np.full(bias.shape, -math.inf)
        for axes in JOINT_AXES:
            joint = np.maximum(joint, _joint_ramp(bias, (ks, all_rs, MAGNITUDES[:width]),
                                                  lambdas, epsilon, reach, axes))
        blocks = [np.maximum(block, joint[a, :allowed[k]].ravel())
                  for a, (k, block) in enumerate(zip(ks, blocks, strict=True))]
    return JointScores(-np.concatenate(blocks), epsilon, tuple(ks), tuple(all_rs),
                       tuple(allowed[k] for k in ks), width)


def _mean_partition_penalties(stats: Sequence[float], ks: Sequence[int], targets: Sequence[float],
                              factors: FloatArray, weigh: float, cap: float, epsilon: float,
                              ramp: float) -> tuple[FloatArray, FloatArray, float]:
    """A mean's partition cap per row cap r and magnitude M: its penalties (r, M, k), its
    statistic less its targets (the joint ramp's biases) and its largest target. The targets
    are the counts' (``targets`` / ``weigh``) times the larger of ``weigh``
    (``MEAN_CAP_FACTOR``) and the row cap's factor at (r, M) (``factors``, (r, M)): a pair
    a unit loses beyond k moves a mean by its rows' distance from the rows kept, as a row
    the row cap cuts does, so the row cap's reading of that distance (its gap over the
    clamp, ``_auto_aims._mean_factors``) prices the partition cap's cuts too. The fixed
    factor stays the floor: the pairs beyond k are not the longest pairs only, and where
    the gap is wide the fixed factor's k keeps them. The factors are read on steps of 2^(1 /
    ``MEAN_K_STEPS``), rounded down: a few dozen series to ramp instead of one per (r, M)
    (about 2 ms a release instead of 20). The statistic is the counts'
    (``Profile.partitions``), the targets public (a noisy histogram's post-processing), so
    every penalty still moves by at most 1. On the family (``auto_bounds.py --family
    --questions AVG``, 56 shapes): geometric mean 1.382x -> 1.357x the best fixed bounds,
    median 1.222x -> 1.194x, P[>3x] <= 1% on 40 -> 41, #40 1.36x -> 0.83x, #44 1.94x ->
    1.39x, #16 1.67x -> 1.51x, no shape worse by more than 0.01x. The factors alone,
    without the floor, chose k above the fixed factor's where the gap was wide (#25 2.16x ->
    2.40x, #6 2.29x -> 2.41x, #45 1.25x -> 1.38x)."""
    # the factors rounded down to steps of 2^(1/16) (public): a few dozen distinct targets'
    # series instead of one per (r, M)
    steps = np.floor(np.log2(np.maximum(factors, weigh)) * MEAN_K_STEPS)
    distinct, where = np.unique(steps, return_inverse=True)
    base = np.asarray(targets, dtype=np.float64) / weigh
    aims = np.exp2(distinct / MEAN_K_STEPS)[:, None] * base[None, :]  # (distinct, k)
    series = np.broadcast_to(np.asarray(stats, dtype=np.float64), aims.shape)
    penalties = ramp_penalties(series, ks, aims, cap, epsilon, ramp)[where.reshape(steps.shape)]
    over = np.asarray(stats, dtype=np.float64)[None, None, :] - \
        aims[where.reshape(steps.shape)]
    return penalties, over, float(aims.max())


#: the joint choice's ramp across coordinates (``_joint_ramp``); False only for the tests'
#: twin that shows what it removes
JOINT_RAMP = True
#: the coordinates whose ramps add up: the partition cap with the magnitude, the row cap with
#: the magnitude. Not the two caps together: b(i) is the largest of the statistics' excesses,
#: not their sum, so a step down in both caps pays both ramps where its statistics grow by
#: one, and COUNT chose below the best on shapes whose statistics grow slowly (the family,
#: all three summed: #18 2.15x -> 2.51x, #48 2.97x -> 3.44x; SUM #6 1.45x -> 1.80x). The same
#: happens within a pair where the statistics grow slowly: the skewed benchmark with 12 groups
#: and 20,000 units (``auto_bounds.py --exact --categories 12 --units 20000``), SUM 1.81x ->
#: 2.27x, r 76 for 91 (the best 128). Adding half the smaller ramp to the larger instead of
#: the sum (max + min / 2, as two weighted sums) gave 2.01x there but Adult's SUM(hours) 1.12x
#: (1.05x) and the family's SUM geometric mean 1.57x (1.54x): the sum was kept.
JOINT_AXES: tuple[tuple[int, ...], ...] = ((0, 2), (1, 2))
#: the joint ramp's biases are clipped to RAMP_CLIP and each coordinate's potential to
#: POTENTIAL_CLIP, so that every value its arithmetic forms is below 2^36 in magnitude and
#: each rounding errs by at most 2^-17 (``_joint_ramp``, ``SENSITIVITY``)
RAMP_CLIP = float(2**35)
POTENTIAL_CLIP = float(2**33)


def _joint_ramp(bias: FloatArray, candidates: tuple[Sequence[float], ...],
                lambdas: tuple[float, ...], epsilon: float, reach: float,
                axes: tuple[int, ...] = (0, 1, 2)) -> FloatArray:
    """The ramp across the joint choice's coordinates ``axes``: for each candidate j, the
    maximum over the candidates i below it (i <= j in those coordinates, equal in the
    others, i != j) within ``reach`` of rho(j) - rho(i) - b(i): rho the sum over the
    coordinates of 2 lambda log2(c) / epsilon, b(i) the largest of i's statistics less their
    targets (``bias``, shape (k, r, magnitude), +inf where a candidate is not allowed).
    Within reach means rho_c(j) - rho_c(i) <= reach / (the coordinates that ramp) in each
    coordinate c, so the ramp summed over them stays within reach, the cap less the largest
    target: where a coordinate's own ramp would reach its cap (``ramp_penalties``) its own
    penalty speaks, not this one.

    Why. The joint score is the maximum of the coordinates' penalties, so a candidate some
    octaves above the crossing in one coordinate scored the same whatever its other
    coordinates did within that penalty: each row cap above its crossing shared its score
    with every magnitude on that plateau, and its mass grew with their number (UCI Adult's
    SUM(hours): 4 to 14 magnitudes per row cap, the tail of r = 2 to 32 holding two thirds
    of its expected squared error). Here the octaves above a lower, adequate candidate add up
    across the coordinates, so the plateau is about one candidate wide.

    Sensitivity. Each term is a constant less b(i), the maximum of statistics less
    constants: it moves by at most 1 when a unit is added or removed, and so does a maximum
    of such terms over a set of candidates fixed by public numbers (the allowed candidates,
    the cap and the targets). The biases are clipped to ``RAMP_CLIP`` (clipping is
    1-Lipschitz) and the potentials, public, to ``POTENTIAL_CLIP``: rho < 2^35, rho + b and
    rho(j) - min(rho + b) lie within 2^36, so the two roundings that involve the data err
    by at most 2^-17 each, and a score moves by at most 1 + 2^-15 (``SENSITIVITY``: 1 +
    2^-12)."""
    potentials = [np.minimum(2.0 * lam * np.maximum(np.log2(np.asarray(c, dtype=np.float64) /
                                                            float(c[0])), 0.0) / epsilon,
                             POTENTIAL_CLIP)
                  for c, lam in zip(candidates, lambdas, strict=True)]
    ramping = sum(1 for a, (lam, c) in enumerate(zip(lambdas, candidates, strict=True))
                  if lam > 0 and len(c) > 1 and a in axes)
    out = np.full(bias.shape, -math.inf)
    if reach <= 0.0 or ramping == 0:
        return out
    width = reach / ramping
    rho = (potentials[0][:, None, None] + potentials[1][None, :, None] +
           potentials[2][None, None, :])
    points = rho + np.clip(bias, -RAMP_CLIP, RAMP_CLIP)
    points[~np.isfinite(bias)] = math.inf  # not allowed: reaches nothing
    starts = [np.searchsorted(p, p - width, side="left") for p in potentials]
    below = np.full(bias.shape, math.inf)  # the least point over i within reach, i != j
    for strict in axes:  # i_strict < j_strict, the other coordinates <= j's
        least = points
        for axis in axes:  # along the others i equals j: nothing to take the minimum over
            least = _range_min(least, axis, starts[axis], 1 if axis == strict else 0)
        below = np.minimum(below, least)
    finite = np.isfinite(below)
    out[finite] = (rho - below)[finite]
    return out


def _range_min(values: FloatArray, axis: int, starts: npt.NDArray[np.intp], gap: int
               ) -> FloatArray:
    """min(values[starts[j] .. j - gap]) along ``axis`` for each j (+inf where empty): a
    sparse table of minima over runs of 2^l (Bender and Farach-Colton's range minimum), or
    where every window is the w candidates up to j (cut at the first), a sliding minimum
    (``scipy.ndimage.minimum_filter1d``, padded with +inf: the same minima, exactly)."""
    moved = np.moveaxis(values, axis, -1)
    n = moved.shape[-1]
    index = np.arange(n)
    span = int(index[-1] - starts[-1]) if n else 0
    if n > 1 and span > 0 and np.array_equal(starts, np.maximum(index - span, 0)):
        size = span - gap + 1  # the window [j - span, j - gap]
        if size <= 0:
            return np.full(values.shape, math.inf)
        # minimum_filter1d's window at j is [j - size // 2 - origin, ...]: ending at j
        slid = minimum_filter1d(moved, size, axis=-1, mode="constant", cval=math.inf,
                                origin=(size - 1) // 2)
        out = np.full(moved.shape, math.inf)
        out[..., gap:] = slid[..., :n - gap] if gap else slid
        return np.moveaxis(out, -1, axis)
    ends = index - gap
    table = [moved]
    while (1 << len(table)) <= n:
        half = 1 << (len(table) - 1)
        last = table[-1]
        nxt = np.full(last.shape, math.inf)
        nxt[..., :n - half] = np.minimum(last[..., :n - half], last[..., half:])
        table.append(nxt)
    out = np.full(moved.shape, math.inf)
    lengths = ends - starts + 1
    levels = np.where(lengths > 0, np.floor(np.log2(np.maximum(lengths, 1))), -1).astype(int)
    for level in np.unique(levels[levels >= 0]):  # every j of one run length at once
        js = np.flatnonzero(levels == level)
        out[..., js] = np.minimum(table[level][..., starts[js]],
                                  table[level][..., ends[js] - (1 << int(level)) + 1])
    return np.moveaxis(out, -1, axis)


def magnitude_cap(r: int) -> int:
    """The row cap r' a magnitude's statistic is read at (``Profile.magnitudes``): the power
    of two at or below r, at most ``MAGNITUDE_ROWS``."""
    return min(1 << (r.bit_length() - 1), MAGNITUDE_ROWS)


def per_k_rows(auto_plan: AutoPlan, factor: float, epsilon: float, k: int) -> bool:
    """Whether the row cap's statistic is read per k (the module docstring): where the
    target f G s k^(a-1) (f the 1 / P rule's ``factor``) is at least ``PER_K_MIN`` /
    epsilon at the largest candidate ``k`` (under Gaussian noise the smallest target, the
    noisiest choice; under Laplace noise k does not matter). Public numbers only (G, the
    noise, the shares, the candidates)."""
    target = auto_plan.target(k, per_partition=False) / k
    least = PER_K_MIN if auto_plan.exponent == 1.0 else PER_K_MIN_GAUSSIAN
    return factor * target * epsilon >= least


def thin_floor(auto_plan: AutoPlan, plan: Plan,
               rows_for: Sequence[tuple[int, int]] | None = None) -> float:
    """The joint choice's floor F (``AutoPlan.floor``) over the candidates ``rows_for``
    allows (all of them when None): public numbers only. The joint choice caps its ramp at
    ``CAP`` times this, and the thin-data rule compares its count with it."""
    auto = auto_plan.auto
    ks = partition_candidates(plan) if auto.max_partitions else [plan.max_partitions or 1]
    rows = len(ROW_CANDIDATES) if auto.max_rows_per_partition else 1
    allowed = dict(rows_for) if rows_for is not None else {k: rows for k in ks}
    size = sum(allowed.get(k, 0) for k in ks) * (len(MAGNITUDES) if auto.columns else 1)
    return auto_plan.floor("+".join(joint_parts(auto)), max(size, 1))
