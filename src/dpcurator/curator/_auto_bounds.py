"""Contribution bounds chosen from the data under DP (``bounds="auto"``).

A query that gives no ``max_partitions``, ``max_rows_per_partition`` or clamping bounds for a
column can have them chosen from the data, spending a stated share of its budget (10% by
default, ``AutoBounds.spent_share``); the rest answers the query with the chosen bounds. The
release states the bounds chosen and what choosing them cost.

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
  from the data instead (``value_factors``, "A sum's row cap" below): f(M) per magnitude;
- a column's magnitude M: t = G s k^a units' worth of values beyond M (a unit's values
  weigh 1 / T below: a unit of r rows in one partition holds about r of them).

With many partitions the row cap's rate is read per k (``_per_k_rows``): each pair weighs 1
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
are chosen, the row cap reads that from the histogram of "A sum's row cap" below, with the
other pairs beside the cut ones (``_mean_factors``); where that histogram is empty, the row
cap aims at ``MEAN_ROW_FACTOR`` (8) times its fixed target.

The penalties. For each candidate c_j (in increasing order, steps of 2^(1/4) for rows and
magnitudes, of 2 for partitions) with statistic stat_j (decreasing in j) and target t_j:

    p_j = max(0, stat_j - t_j, max_(i<j) h_ij - stat_i),
    h_ij = max(t_i, min(2 F, t_i + 2 lambda log2(c_j / c_i) / epsilon))     (``_penalties``)

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
``PermuteAndFlip``, epsilon-DP) over the product of their candidates (at most 11 x 44 x 241)
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
COUNT and COUNT(DISTINCT) unchanged (no magnitude). Each further column's magnitude
is its own permute-and-flip, with the k chosen. Then each column's signs: [0, M] scores minus
the negative values, [-M, 0] minus the positive ones, [-M, M] minus a fixed price
ln(3 / beta) / epsilon with beta = ``BETA_BOUNDED`` (twice the width: twice the noise of a
mean); adding a unit lowers or keeps each of these scores, so the choice is monotonic
(permute-and-flip with half the noise: Ding, Kifer, Wang and Zhang 2021). Weights in the
budget: 1 per cap and 2 per magnitude (summed for the joint choice), 1 per column's signs,
1/2 per mean's floor or ends (below; taken from its column's signs, which keep 1/2) and 1 for
the thin-data rule's count (1/4 of it from the share and 3/4 on top: "Thin data" below;
and 1/4 for a sum's histogram, on top: "A sum's row cap" below; and 1/4 for the row cap's
tail, on top: "The tail's shape" below). The signs weigh 1 so
that, where the data is not thin (``thin_rule``: its count of values at least 1.25 F), a
one-sided clamp of the wrong sign is less likely than exp(-epsilon_s 1.25 F) = (beta /
C)^(2.5 w_s / w_joint), about 2e-6 for a SUM's joint choice (w_joint 4), and exponentially
less as the values grow. The signs are drawn before the thin-data count, which reads the
values of the sign kept: a wrong side keeps none, and its count passes 1.25 F only with
noise of about 12 scales more (``thin_rule``).

A mean's floor (``floor_scores``, ``choose_floor``). AVG and VARIANCE are centred on the
clamp's midpoint, so their noise grows with the clamp's width; a clamp [0, M] on values far
from zero pays for the width below them (AVG of years 1990 to 2030 in [0, 2048]: 88x the
error with the data's own range; of heights about 170 cm in [0, 215]: 3x). Where every
aggregate of a column is a mean or a variance (``floor_columns``) and its signs chose one
side, one more permute-and-flip chooses the floor L of [L, M] (or [-M, -L]) among the
magnitudes up to 4 octaves below M, and 0: the penalties above over the widths M - L (the
ramp ``FLOOR_LAMBDA``, 16, per octave of width: the floors below the least value differ
little in width), the statistic the values the floor raises (``Profile.raised``:
those at or below it, zeros included, and those of the other sign, each weighing 1 / max(T,
r') as the magnitude's; each value counted once, so a unit adds at most 1), the target the
magnitude's. The choice is made after M and the side, which it takes as given (adaptive
composition). It is drawn only where the thin-data rule's noisy count is at least
``FLOOR_THIN`` (4) times its own F (post-processing of that count): with fewer values spread
over [0, M] the narrowest clamps, which raise most of them, could score above the widest,
whose ramp is capped at 2 F; at 4 F values spread evenly over [0, M], the narrowest raises
about 3.4 F of them and scores at least 1.3 F - t below 0 (each F below is a factor beta /
17 in probability). This bounds accuracy, not privacy. Its weight comes from the
signs' (1/2 each), so the other choices keep their epsilon; a wrong side drawn with less
epsilon keeps no values, and the thin-data count, read on the side kept, then sets it
aside unless its noise exceeds 1.25 F (``thin_rule``). The profile's steps of 2^(1/4)
bound its resolution: years 1990 to 2030 get [1722, 2048] (17x the data's range's error,
not 88x), heights [128, 215] (1.4x, not 3x).
A SUM's sensitivity is max(|lo|, |hi|) whatever the floor, so a SUM's clamp keeps 0 and
spends nothing on one.

Thin data (``thin_rule``). Where the values are too few for epsilon, every candidate scores
within about F of the best and the ramp pulls the clamp to the lowest magnitudes: an answer
near zero with a tight interval (issue 26: 1,500 customers at epsilon 0.01 to 0.3). A noisy
count of the clamped columns' nonzero values of the sign kept (the least over the columns,
each weighed as its magnitude statistic, sensitivity 1) below ``THIN`` F (1.25 F), plus half
the magnitude's target t where the noise's rate is large against the values (``thin_rule``:
the lowest magnitudes score max(0, N - t), so the clamp falls below every value while N < F
+ t / 2), replaces the clamps chosen by the widest, +-2^49.75 (about 9.5e14), and says so in
the release (unless the bounds are chosen again, below); below 20 F the clamps are kept with
a warning that a tail of fewer than F units cannot be located. Before the charge,
``explain`` states the rule with its threshold. Why about F: from the lowest magnitude
(where every nonzero value lies beyond) to the data's the ramp costs up to 2 F, less what
the statistic there exceeds its target by; below about F the lowest magnitudes score better
than the data's, and the clamp falls to zero (1,500 customers at epsilon 0.3: a statistic of
0.8 F chose clamps near 3e-6). On the family, the rule at 2 F fired with probability above
1% on 13 of 104 SUM and AVG cases (up to 99%), where the choice was about 1.6x the best
fixed bounds without it; at 1.25 F far less often.

Caps per group chosen with no clamp beside them (a COUNT with private keys, or bounds given
and the caps left to the data) have the same rule (``caps_thin_rule``) with a noisy count of
about the units the lowest caps would cut (``caps_statistic``, sensitivity 1), weighing
``CAPS_UNITS`` per cap, on top of the share: below THIN F plus half the caps' target the
caps are chosen within the noise, and low, so they are chosen again (below), or replaced by
the widest where no retry can follow. The choice made again is checked by a noisy count of
the units its caps cut (``caps_cut_bound``): the widest caps where they cut many, else kept.

Choosing again (``plan_retry``, ``needs_retry``). Where the thin-data rule would use the
widest clamps (or its count is below ``RETRY_BELOW`` F, the same 1.25 F), the first choices'
outcome is set aside and every choice is made again, each with its weight of the retry's
part: the bounds spend ``RETRY_SHARE`` (half) of the budget in all, the first choices
included, and the answer keeps the other half. At the default share the retry's choices
have 4 times the first's epsilon, so its F is 4 times smaller and it locates tails 4 times
thinner; where its own count is still below 1.25 F, the widest clamps are used as before.
A row cap aimed by a histogram (``value_factors``) reads the first choice's in the retry
(``Aim``: post-processing of a release already charged), and the weight a second one would
have had goes to the retry's other choices.
The answer's noise is then twice the first path's (1.8x), which is why the retry is not
made above 1.25 F: at 4 F it was worse than the first choice on the family (SUM on #2
2.8x -> 5.5x the best fixed bounds, #20 1.6x -> 2.6x; geometric mean 1.37x -> 1.40x, with
the count at 1/4). Its privacy: the path is chosen from the first choices' outputs, a
filter inside the query (``_compile._prove_retry``); where the retry's path could cost more
than the path charged (a Gaussian answer under (epsilon, delta), priced in rho) there is no
retry. It does not apply where the first choices already have half of its share
(``bounds_share`` of about 0.22 or more, with the parts on top of the share), nor where
a total interval's outer caps are chosen too. ``bounding="unit"`` chooses again the same
way where its own thin-data rule (``unit_thin``) would use the widest caps on a unit's sum,
unless its caps wait for a private selection (``defers_unit_caps``). Measured exactly over
both paths' laws (``auto_bounds.py --family``, 56 shapes): the widest clamps
with probability above 1% on 1 SUM shape and no AVG shape (6 and 5 before), SUM median
1.22x and geometric mean 1.37x all-in (1.22x and 1.36x before, leaving the widest clamps'
mass out); COMPAS's juvenile felonies summed by race at epsilon 1: the widest clamps in 9%
of releases (96% before), 1.8x the best fixed bounds (``benchmarks/compas.py``).

The kept count (``kept_check``). A thin-data count above its threshold does not make the
choice safe near it: the lowest magnitudes then score about F / 2 below the data's, each
(beta / C)^(1/2) as likely, and there are thousands of them, so a few percent of releases
drew a clamp below every value (500 units of 20 rows at epsilon 0.5, AVG per group: 0 within
[0, 0] in 8 of 200 seeded releases). After the clamps are chosen, a noisy count of the units'
worth of nonzero values within them (the least over the columns, sensitivity 1,
``WEIGHTS["kept"]`` all on top of the share, and on top of ``RETRY_SHARE`` on the retry)
below ``CAPS_LOW`` noise scales (``kept_bound``) sets them aside, as the thin-data rule's
widest clamps are: chosen again, or the widest used, said in the release. A clamp at the
bias-variance point keeps all but about the noise's rate t of the N units' worth of values;
a collapsed one keeps none.

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

Exactness. The statistics are summed exactly (fractions), capped at 2^36 and rounded down to
multiples of 2^-16, and the penalties capped at 2^35, so that the floating-point scores move
by at most 1 + 2^-14 between neighbours; the mechanisms are told a sensitivity of 1 + 2^-12
(``SENSITIVITY``), never less than the scores' true one.

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
chosen and every aggregate is a COUNT(*) or a SUM, one more release comes first: the pairs
by their rows' bin (1 to 8 rows each their own, then octaves; ``Profile.row_octaves``, each
pair weighing 1 / P, L1 sensitivity 1) by the Laplace mechanism with weight ``TAIL_WEIGHT``
(1/4, on top of the share), bins below ``TAIL_PRUNE`` (8) / epsilon set to 0 (none drawn
where epsilon is so small that the noise is past the samplers' range: ``_noisy_histogram``). From
it, per row cap, the target is multiplied by 1 / sqrt(rho(r)), rho within ``TAIL_RATIO`` [1,
32]: it is lowered where the histogram shows the tail going on far beyond r, never raised
(rho < 1, a tail ending just beyond the cap, would raise it; but at the histogram's epsilon
its far bins are pruned and read as the tail's end: COUNT on the family's #3 1.06x -> 1.9x
the best fixed bounds, #48 3.0x -> 5.4x with a phantom bin of the pruned mass).
Post-processing, public to the joint choice, whose scores keep their sensitivity; the retry
reads the first choice's (``Aim``). A query with a mean, a variance or a quantile draws
none: a mean's cost per row cut falls as the cap rises (its factors' lambda(r),
``_mean_factors``), so rho does not describe it (AVG on the family: #44 1.9x -> 2.7x with
it). Measured below (``tail_multipliers``).

A two-sided mean's ends (``end_scores``, ``choose_end``). A mean's noise grows with its
clamp's width, and values mostly of one sign need the other end only as far as their own
values reach: on the family's shapes with a fifth of the values negative, [-M, M] paid twice
the width of [-M / 4, M] and [0, M] lost the negative fifth (#11 8.7x, #26 3.6x the best
fixed bounds with such clamps). Where a column's every aggregate is a mean or a variance and
its signs chose [-M, M], one more permute-and-flip, with the floor's epsilon (the floor is
drawn only for one-sided clamps: the two exclude each other), chooses [-L, M], [-M, L] or
[-M, M], L among 0 and the magnitudes up to 4 octaves below M. Each side is a chain of the
penalties above over the widths M + L: the statistic the values of that side beyond L
(``Profile.side_magnitudes``, each weighing 1 / max(T, r') as the magnitude's), the target the
magnitude's, the ramp ``FLOOR_LAMBDA`` per octave of width; [-M, M], the top of both, scores
the larger of its two penalties (a maximum of statistics plus constants: sensitivity 1). It
is drawn only where the thin-data rule's noisy count reaches ``END_THIN`` (10) times the
floor choice's F: the majority side's values weigh 1 / T each, and where heavy units hold
them, a thin count could not tell the sides apart.

The outer cap of a total interval (``choose_outer``; ``dpcurator.curator._total``) is one
more choice, paid from the total interval's share, not the bounds': the units with more than
M rows (each pair weighing 1 / P, so one unit adds at most 1), with a fixed prior per octave.

Cost: each choice is epsilon-DP (``PureDP``) under add/remove one unit; with a rho request it
is charged as epsilon^2 / 2-zCDP (Bun and Steinke 2016, Proposition 1.4). The choices and
the query compose (basic composition for (epsilon, delta), adding rhos for zCDP).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from dpcurator.accounting.conversions import zcdp_rho_for
from dpcurator.accounting.events import DpEvent, PureDPEvent, ZCDPEvent
from dpcurator.engines import MEAN_OCTAVES, PROFILE_STEPS, UNIT_TOTALS
from dpcurator.errors import InternalError, UserError
from dpcurator.mechanisms import DiscreteLaplace, Laplace
from dpcurator.mechanisms.exponential import PermuteAndFlip
from dpcurator.noise import RandomSource
from dpcurator.noise.samplers import MAX_SCALE as MAX_NOISE_SCALE
from dpcurator.query.plan import (
    MAX_BOUND,
    MAX_CONTRIBUTIONS,
    MAX_UNIT_SUM,
    Aggregate,
    AutoBounds,
    Bounds,
    Count,
    CountUnits,
    Mean,
    Plan,
    Quantile,
    Sum,
    Variance,
)

from . import _privacy
from ._privacy import PrivacyRequest
from ._profile import ROW_OCTAVES, Profile
from ._total import inner_unit_rows, inner_unit_sum

__all__ = ["AutoPlan", "JointScores", "Profile", "choose_bounds", "joint_scores", "plan_auto",
           "sign_scores"]

FloatArray = npt.NDArray[np.float64]

PARTITION_CANDIDATES = tuple(2**i for i in range(11))  # 1 .. 1024
# 1 .. 4096 in steps of about 2^(1/4): finer than powers of two, where the error moves fast
ROW_CANDIDATES = tuple(sorted({round(2 ** (i / 4)) for i in range(49)}))
# value bounds: the engine's bucket steps 2^(q/4), 2^-30 .. 2^49.75 (PROFILE_STEPS)
MAGNITUDES = tuple(2.0 ** (q / 4) for q in PROFILE_STEPS)
#: the widest clamps, as the release's sentences name them (+-9.5e+14)
WIDEST_CLAMPS = f"+-{MAGNITUDES[-1]:.2g}"
#: the chance, at most, that a bound is chosen where its ramp has reached its cap
BETA = 1e-4
#: Exact scores: statistics are summed exactly (``Fraction``, ``_profile``), capped at 2^36
#: and rounded down to multiples of 2^-16 (so they and the penalties, capped at 2^35, are
#: floats whose arithmetic errs by less than 2^-16 each): a score then moves by at most
#: 1 + 2^-14 between neighbours, and the mechanisms are told 1 + 2^-12.
PENALTY_CAP = float(2**35)
SENSITIVITY = 1.0 + 2.0**-12
#: beta of the sign choice, whose worst candidate costs at most twice the noise
BETA_BOUNDED = 0.05
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
#: ``bounding="unit"``'s cap on a unit's rows in all ramps at 2.5 per octave, not ``LAMBDA``:
#: its one choice (eight steps an octave) has no joint partner, and with 4 a tail of a few
#: hundred heavy units at epsilon 0.3 priced every cap above the light units' rows out
#: (UNIT_ROW_CANDIDATES' M of 6 to 70 where 128 to 512 is best). On the family's 56 shapes
#: (``benchmarks/auto_bounds_unit.py``, 8 releases each, against the best fixed M in
#: hindsight): with 4 median 0.97x, geometric mean 1.13x, worst 18.1x, 45 within 1.25x;
#: with 2.5 0.98x, 1.00x, 3.1x, 46; with 2 1.04x, 1.05x, 3.9x, 44.
UNIT_ROW_LAMBDA = 2.5
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
ROW_FAR_LAMBDA = 8.0
#: the row cap aims at this many times the noise's rate: a count, or a column's values
ROW_FACTOR = 1.5
#: The row cap's statistic is read per k where f G s k^(a-1) epsilon is at least this (the
#: module docstring): under Laplace noise, and under Gaussian noise (a = 1/2).
PER_K_MIN = 2.8
PER_K_MIN_GAUSSIAN = 3.3
ROW_FACTOR_VALUES = 2.0
#: ``bounding="unit"``'s cap V on a unit's sum aims at this many times the noise's rate
#: (``choose_unit_sum``): a unit above V is divided by a power of two, losing at least V / 2
#: where a clamp loses only the excess, so each unit beyond V costs more than Amin et al.'s
#: rule assumes and V aims at fewer of them than the row cap does. Measured 2026-12-02 with
#: the factor at 2, 1.5, 1, 1/2 and 1/4: the family's SUM (``auto_bounds_unit.py --questions
#: SUM --releases 8``, against the best fixed caps of both kinds) median 1.09x, 1.11x, 1.06x,
#: 1.08x, 1.10x; geometric mean 1.29x, 1.23x, 1.18x, 1.21x, 1.22x; within 1.25x 33, 38, 41,
#: 39, 39 of 56; TPC-H's revenue by priority at scale 0.1 (five public keys, customers in up
#: to five of them; median relative error over 60 to 100 releases) 0.0022, 0.0019, 0.0015 to
#: 0.0017, 0.0013, 0.0015, where V of 160 line items at the mean price is best in hindsight
#: (0.0009) and 128 cuts 68 customers, each halved; UCI Adult's SUM(hours) by education
#: (one row per person, values up to 99; 150 releases) RMSE 180, 180, 187: V = 107.6 in 97%,
#: 94% and 84% of releases, the rest spread above it.
UNIT_SUM_FACTOR = 1.0
#: A sum's row cap aims at f(M) G s k^a (per k, over k), f(M) = M / (the mean of min(mu, M)
#: over the pairs that cut rows, mu a pair's mean |x|), from a noisy histogram of the pairs
#: beyond ``VALUES_CAP`` rows by the octave of their mean (``value_factors``, the ``values``
#: choice), its bins below ``VALUES_PRUNE`` / epsilon set to 0; f(M) within
#: [``VALUES_LEAST``, ``VALUES_MOST``], and the fixed factors where no bin is left
VALUES = "values"
VALUES_CAP = 3
VALUES_PRUNE = 8.0
VALUES_LEAST = 1.0
VALUES_MOST = 64.0
#: The histogram's weight: 1/4 on top of the bounds' share (the other choices keep their
#: epsilon; 0.48% of the budget, from the answer's part, where the choices weigh 5.25). From
#: the share, 1/4 and 1/2 did the same on the family (``auto_bounds.py --family``: SUM
#: median 1.42x -> 1.26x, geometric mean 1.54x -> 1.40x, within 1.25x 20 -> 27 of 56 shapes)
#: but the skewed benchmark's thin shape (8 groups, 20,000 units) lost 1.51x -> 1.61x and
#: 1.72x for the choices' 4.5% and 9% less epsilon, its histogram under the noise
VALUES_WEIGHT = 0.25
#: A mean's histogram (``value_factors`` with its second half) weighs 1, still on top:
#: about 1.9% of the budget instead of 0.48% (2026-12-02). Its bins' threshold is 8 /
#: epsilon, and at 1/4 a tail of a few hundred heavy units sat near it, so which octaves
#: passed was a coin toss, and the row cap's aim with it (the family's #28 AVG: in two
#: thirds of the histogram's draws r = 3 where 108 is best, 7.69x the best fixed bounds).
#: ``auto_bounds.py --family`` with 32 draws of the histogram, AVG, weights 1/4, 1, 2:
#: median 1.405x, 1.278x, 1.313x; geometric mean 1.588x, 1.471x, 1.462x; within 1.25x 22,
#: 27, 26 of 56 shapes; P[>3x] <= 1% on 34, 38, 38; worst 7.69x, 6.33x, 4.97x (#28 7.69x
#: -> 1.17x, #44 4.59x -> 1.94x, #22 2.47x -> 1.72x, #24 1.78x -> 1.21x, #0 1.48x ->
#: 1.09x; worse #16 1.41x -> 1.65x). A SUM's keeps 1/4: at 1 its family moved by less
#: than the draws (geometric mean 1.380x -> 1.367x), and a SUM of one row per person (no
#: pair beyond 3 rows: the histogram always empty) paid for it. The retry (``plan_retry``)
#: draws none of its own since 2026-12-02: it reads the first choice's (``Aim``).
MEAN_VALUES_WEIGHT = 1.0
#: the histogram's L1 sensitivity told to the Laplace mechanism: 1, and the roundings of its
#: 62 bins (124 for a mean's) to multiples of 2^-16 (``Profile.mean_octaves``,
#: ``light_octaves``), below 2^-9 in all
VALUES_SENSITIVITY = 1.0 + 2.0**-8
#: the row cap's tail (``tail_multipliers``): the histogram of the pairs' rows, its weight
#: in the budget (on top of the bounds' share), the bins kept above TAIL_PRUNE / epsilon,
#: and the mean excess ratio's range
TAIL = "tail"
TAIL_WEIGHT = 0.25
TAIL_PRUNE = 8.0
TAIL_RATIO = (1.0, 32.0)
#: a total interval's outer cap (``choose_outer``): powers of two, where the profile's units'
#: rows are exact, up to ``Plan``'s limit; the cap is twice the one chosen, and each octave
#: costs a prior of 1 / epsilon in the score
OUTER = "max_unit_rows"
OUTER_SUM = "max_unit_sum"
OUTER_CANDIDATES = tuple(2**i for i in range(21))
OUTER_MARGIN = 2
OUTER_PRIOR = 1.0
#: the weights of the choices in the budget (``choice_names``). With ``bounding="unit"`` the
#: partition cap only sizes the private selection's count, whose few candidates need little:
#: it weighs 1/4 there, the caps on each unit's total 1 (TPC-H at scale 0.1, private keys, 60
#: releases, ``benchmarks/joins.py --questions 3,5,6``: the chosen caps' median relative
#: errors 0.0022, 0.0028, 0.0034 with 1; 0.0021, 0.0026, 0.0029 with 1/4)
WEIGHTS = {"max_partitions": 1.0, "max_rows_per_partition": 1.0, "magnitude": 2.0,
           "signs": 1.0, "floor": 0.5, "units": 1.0, "unit": 1.0,
           "unit_partitions": 0.25, "unit_units": 0.5, VALUES: VALUES_WEIGHT,
           "kept": 0.5}
#: ``bounding="unit"``: a unit's rows in all, on the profile's grid (``choose_unit_rows``)
UNIT_ROW_CANDIDATES = tuple(t for t in UNIT_TOTALS if t <= MAX_CONTRIBUTIONS)
#: The data is too thin to choose a clamp from when a noisy count of its units is below
#: THIN times the joint choice's floor F (every unit within F of the best score: the scores
#: cannot tell the candidates apart); THIN_WARN times F or fewer: the tail cannot be located.
THIN = 1.25
THIN_WARN = 20.0
#: the thin-data rule's threshold is at least the magnitude's target plus this many F
#: (``thin_threshold``)
THIN_ABOVE_TARGET = 0.5
#: Where the thin-data rule would use the widest clamps, the choice is made again with this
#: share of the whole budget for the bounds in all, taken from the answer's part
#: (``plan_retry``; the module docstring, "Choosing again")
RETRY_SHARE = 0.5
#: The retry is made where the first choice's thin-data count is below RETRY_BELOW times its
#: floor F (``needs_retry``)
RETRY_BELOW = THIN
UNITS = "units"
#: The thin-data count weighs 1 (``WEIGHTS``), 3/4 of it on top of the bounds' share, so that
#: the other choices keep the epsilon they had at 1/4. At 1/4 its noise had a scale of about
#: 0.4 F and let a count of F through the 1.25 F gate in about a quarter of releases, where
#: the clamp could collapse to the lowest magnitudes (an answer near zero with a tight
#: interval); at 1 the scale is about 0.1 F. Releases with a clamp below a quarter of the
#: least nonzero |value| (``/tmp`` sweep: 300 customers of examples/orders.csv and 7,000
#: people 5% nonzero, SUM and AVG, epsilon 0.1 to 3, 30 seeds each, with the retry): 22 of
#: 360 at 1/4, 0 at 1; the family's SUM (``auto_bounds.py --family``, with the retry)
#: median 1.22x, geometric mean 1.37x and 32 shapes within 1.25x either way; the answer
#: pays 1.9% of epsilon (COMPAS's other questions about 1% to 2% worse). Inside the share
#: (the others 12.5% less epsilon) it was worse: median 1.25x, 30 shapes within 1.25x.
UNITS_ON_TOP = 0.75
#: Under ``bounding="unit"`` the thin-data count (``unit_thin``) weighs ``WEIGHTS
#: ["unit_units"]`` (1/2) beside each cap's 1, UNIT_UNITS_ON_TOP (1/4) of it on top of the
#: share: each cap keeps the epsilon it had with a count of weight 1 (3/4 on top), and the
#: answer gets the rest. There the caps are one or two choices, not the five or more of the
#: clamps' path, and the count of weight 1 took half of what a SUM's choice spent (UCI Adult's
#: SUM(hours), one row per person: the answer kept 84% of epsilon, 88% now;
#: ``benchmarks/adult.py``). At 1/2 its noise's scale is 0.07 F of the cap's choice (F = 2
#: ln(C / beta) / epsilon, C = 241), and a count of F, where the lowest caps start to score as
#: well as the data's, passes the 1.25 F gate with probability below 2% (8% at 1/4). Taking
#: the count's part from the caps instead (1/2 inside the share, 90% for the answer) cost the
#: family's thin tails, whose caps need every bit of epsilon (``auto_bounds_unit.py --only
#: 6,18,48,50``: #6 2.8x -> 4.3x, #48 6.9x -> 12.8x the best fixed caps).
UNIT_UNITS_ON_TOP = 0.25
#: With no sum beside it, ``bounding="unit"``'s cap on a unit's rows has the thin-data count
#: (``unit_thin``: the units with a row) too, weighing UNIT_ROWS_UNITS (1/4) of the cap's 1,
#: all of it on top of the share: the cap keeps all of the share and the answer pays 2.5% of
#: epsilon. Without it, 300 units of 10 rows at epsilon 0.3 chose caps of 1 to 12 rows
#: within the noise, counts of 296 to 3,600 where the truth is 3,000 with intervals about
#: the capped count (6 of 20 covered). Its noise is about 0.14 F of the cap's choice, and
#: a count of 0.8 F passes the 1.25 F gate in 2% of releases. Taken from the cap's part
#: instead (weight 1/2, a quarter on top, as a sum's), the family's COUNT
#: (``auto_bounds_unit.py --questions COUNT --releases 8``) went from median 0.98x, geometric
#: mean 1.00x, worst 3.1x to 1.05x, 1.19x, 17x (#48: caps of 512 rows fell to 139): the
#: tails at epsilon 0.3 need every bit of the cap's epsilon.
UNIT_ROWS_UNITS = 0.25
#: Caps per group chosen with no clamp beside them (a COUNT with private keys, or bounds
#: given and the caps left to the data) have the thin-data count too (``caps_thin_rule``: the
#: units), weighing CAPS_UNITS per cap chosen (1/4 of each cap's 1), all of it on top of the
#: share: the caps keep all of the share and the answer pays 2.5% of epsilon. Its noise is
#: about 0.13 F of the joint choice's. Without it, 300 units of 10 rows at epsilon 0.3 (two
#: private keys) chose r of 1 or 2 within the noise and answered 10% to 45% of the truth with
#: intervals about the capped counts, nothing said but a sentence before the charge (a bug
#: hunt).
CAPS_UNITS = 0.25
#: On the caps' choice made again, a noisy count of the units they cut at or above CAPS_LOW
#: times its noise scale replaces them by the widest (``caps_cut_bound``): where they cut
#: nobody the count stays below it w.p. 1 - e^-3 / 2, about 97.5%; where they cut 300 units
#: of a SUM over 20 public keys at epsilon 0.3 (scale 44), it reaches it w.p. about 99%. At 4
#: scales a bug hunt's seed kept such caps (a count of 142): answers at 15% of the truth.
CAPS_LOW = 3.0
#: Where clamps are chosen, a noisy count of the units' worth of nonzero values the chosen
#: clamps keep (``kept_check``) weighs ``WEIGHTS["kept"]`` (1/2), all of it on top of the
#: share (and of ``RETRY_SHARE`` on the retry); below ``kept_bound`` (3 noise scales) the
#: choice is set aside as the thin-data rule's widest clamps are (the choice is made again,
#: or the widest clamps used). Without it, 500 units of 20 rows (values about N(100, 20), two
#: public keys) asked AVG at epsilon 0.5 answered 0 with the interval [0, 0] or 38 within
#: [33, 38] in 8 of 200 seeded releases: counts just above the thin-data threshold, where the
#: lowest magnitudes' plateau still holds a few percent of the choice's mass. A count of the
#: values the clamps cut, against a bound between the noise's rate t and the thin-data count
#: N, was tried first: the collapses came where the noisy N had passed its threshold well
#: above the true N, so the bound lay above what a collapsed clamp cut (6 of 200 kept at 3/4
#: of the way), and halfway it set aside sound clamps in 1.4% of the family's #42 (AVG over
#: 20 groups at epsilon 0.3: N 1,218, t 419; ``auto_bounds.py --family --only 42``). The
#: kept count needs no N: about 0 where the clamp collapsed, about N - t where it did not.
KEPT = "kept"
MAGNITUDE_ROWS = 4
#: A mean's partition cap aims at MEAN_CAP_FACTOR times a count's target (``joint_scores``)
MEAN_CAP_FACTOR = 16.0
#: A mean's row cap where its histogram is empty aims at MEAN_ROW_FACTOR times the fixed
#: factor: a fixed compromise, as nothing tells how far the cut rows lie from the rest. On the
#: family's shapes where no bin passes (epsilon 0.3 and rho 0.05, 10 shapes; ``auto_bounds.py
#: --family --questions AVG --only ...``), geometric mean 2.19x with 2, 1.93x with 4, 1.92x
#: with 8, 2.18x with 16 (#0 1.75x, 1.31x, 1.44x, 4.49x; #54 4.28x, 1.90x, 1.40x, 1.25x)
MEAN_ROW_FACTOR = 8.0
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
#: A two-sided mean's ends (``choose_end``) are drawn only where the thin-data rule's noisy
#: count is at least END_THIN times the floor choice's F: at 4.9 F (the family's #26, its
#: majority side's values mostly in heavy units, each weighing 1 / T) the wrong side's end came
#: in with probability about 10% and the ratio went 3.6x -> 6.9x; the shapes that gained had
#: 14 F to 380 F
END_THIN = 10.0
#: a mean's floor (``choose_floor``) is chosen among the magnitudes up to FLOOR_STEPS steps of
#: 2^(1/4) below its clamp's magnitude M (down to M / 16: a lower floor narrows the clamp by
#: under 7%), and 0
FLOOR_STEPS = 16
#: a mean's floor is chosen only where the thin-data rule's noisy count of values is at least
#: FLOOR_THIN times the floor's own floor F (``floor_scores``): below it, values spread over
#: [0, M] could not outweigh the ramp, and the narrowest clamp could be chosen (the module
#: docstring, "A mean's floor")
FLOOR_THIN = 4.0
#: A mean's floor ramps FLOOR_LAMBDA per octave of the clamp's width above its crossing. The
#: floors below the data's least value differ little in width (UCI Adult's ages: floors 16 to
#: 6.7 under M = 90.5 widen the clamp by 0.17 octave), so at ``LAMBDA`` (4) the choice spread
#: over them: AVG(age) 0.460 -> 0.445 with 16 (``adult.py --exact``; [17, 90] gives 0.36); on
#: the family's AVG (``auto_bounds.py --family``) geometric mean 1.93x -> 1.92x, #52 1.27x ->
#: 1.05x, #54 1.03x -> 0.98x, no shape worse; 32 put #54's floor above its values (1.47x).
FLOOR_LAMBDA = 16.0


@dataclass(frozen=True)
class AutoPlan:
    """How a query's bounds will be chosen (fixed before anything is read).

    ``epsilons`` is each choice's epsilon (``choice_names``), ``request`` what the query
    itself then spends, ``partitions`` the number of partitions G the noise is paid in (the
    public keys; 1 otherwise), ``noise`` the noise's standard deviation per unit of
    sensitivity and ``exponent`` a (1: Laplace, L1; 1/2: Gaussian, L2)."""

    auto: AutoBounds
    epsilons: dict[str, float]  # per choice (``choice_names``)
    request: PrivacyRequest
    partitions: int
    noise: float
    exponent: float
    spent: float  # the bounds' choices' total epsilon (or rho, for a rho request)
    outer: float = 0.0  # the outer cap's choice (``choose_outer``), from the total's share
    total: float | None = None  # what measures the total (``_total``), for the second compile
    share: float = 0.0  # the share of the whole budget the bounds spend (``plan_auto``)
    values_share: float = 0.0  # of which a sum's histogram's (``value_factors``)
    kept_share: float = 0.0  # of which the clamps' kept count's (``kept_check``)
    tail_share: float = 0.0  # of which the row cap's tail's histogram's (``tail_histogram``)
    means: bool = False  # the histogram is a mean's: the light pairs too (``value_histogram``)

    def floor(self, choice: str, candidates: int, beta: float = BETA, *,
              monotonic: bool = False) -> float:
        """F = 2 ln(C / beta) / epsilon (ln(C / beta) / epsilon for a ``monotonic`` choice):
        C candidates scoring F below the best are, together, less likely than beta."""
        factor = 1.0 if monotonic else 2.0
        return factor * math.log(candidates / beta) / self.epsilons[choice]

    def target(self, k: float, *, per_partition: bool) -> float:
        """The noise's rate: G s a k^(a-1) for the partition cap k (``per_partition``, per
        unit beyond it), else G s k^a (per pair beyond the row cap, and per unit's worth of
        values beyond the magnitude)."""
        rate = self.partitions * self.noise
        if per_partition:
            return float(rate * self.exponent * float(k) ** (self.exponent - 1.0))
        return float(rate * float(k) ** self.exponent)


def _round_down(value: float) -> float:
    return math.nextafter(value, 0.0)


def _joint_parts(auto: AutoBounds) -> list[str]:
    parts = [name for name in ("max_partitions", "max_rows_per_partition")
             if getattr(auto, name)]
    return parts + [f"magnitude:{column}" for column in auto.columns[:1]]


def _caps_chosen(auto: AutoBounds) -> int:
    """How many of the caps per group are chosen (0 to 2)."""
    return int(bool(auto.max_partitions)) + int(bool(auto.max_rows_per_partition))


def outer_names(auto: AutoBounds) -> list[str]:
    """The outer caps of total intervals to choose (``choose_outer``), in order."""
    return ([OUTER] if auto.unit_rows else []) + [f"{OUTER_SUM}:{c}" for c in auto.unit_sums]


def floor_columns(plan: Plan) -> tuple[str, ...]:
    """The columns whose clamp gets a floor (``choose_floor``): those chosen from the data
    whose every aggregate is a mean or a variance. Those are centred on the clamp's midpoint,
    so their noise grows with the clamp's width, where a SUM's grows with its magnitude
    whatever the floor (and would only be biased by one)."""
    if plan.auto is None:
        return ()
    out = []
    for column in plan.auto.columns:
        uses = [a for a in plan.aggregates
                if not isinstance(a, Count | CountUnits) and a.column == column]
        if uses and all(isinstance(a, Mean | Variance) for a in uses):
            out.append(column)
    return tuple(out)


def values_choice(plan: Plan) -> bool:
    """Whether a sum's or a mean's row cap is aimed per magnitude (``value_factors``):
    public, from the plan alone. Every aggregate a SUM, or every one an AVG; the row cap and
    the first column's clamp chosen, the bounds per partition (not ``bounding="unit"``)."""
    auto = plan.auto
    return (auto is not None and bool(auto.columns) and bool(auto.max_rows_per_partition)
            and plan.bounding != "unit" and bool(plan.aggregates)
            and (all(isinstance(agg, Sum) for agg in plan.aggregates)
                 or _means(plan)))


def _means(plan: Plan) -> bool:
    """Every aggregate a mean (AVG): its caps aim at ``MEAN_CAP_FACTOR`` times the targets,
    or, with the histogram of ``value_factors``, at the mean's own factors."""
    return bool(plan.aggregates) and all(isinstance(agg, Mean) for agg in plan.aggregates)


def values_weight(plan: Plan) -> float:
    """The weight of ``value_factors``' histogram in the budget (on top of the bounds'
    share): ``MEAN_VALUES_WEIGHT`` for a query of means, ``VALUES_WEIGHT`` for a query of
    sums; 0 where ``values_choice`` does not hold (no histogram)."""
    if not values_choice(plan):
        return 0.0
    return MEAN_VALUES_WEIGHT if _means(plan) else WEIGHTS[VALUES]


def tail_weight(plan: Plan) -> float:
    """The weight of the row cap's tail histogram (``tail_multipliers``; on top of the
    bounds' share): ``TAIL_WEIGHT`` where the row cap is chosen per partition for COUNT(*)s
    and SUMs only (a row cut costs them the same wherever the cap stands: the argument of
    ``tail_multipliers``; not a mean's, a variance's or a quantile's), else 0."""
    auto = plan.auto
    return TAIL_WEIGHT if auto is not None and bool(auto.max_rows_per_partition) and \
        plan.bounding != "unit" and bool(plan.aggregates) and \
        all(isinstance(agg, Count | Sum) for agg in plan.aggregates) else 0.0


def choice_names(auto: AutoBounds, floors: Sequence[str] = (), values: float = 0.0,
                 tail: float = 0.0) -> list[tuple[str, float]]:
    """The choices, in the order they are made, with their weights in the budget: one joint
    choice of the caps and the first column's magnitude (named by its parts joined with
    "+", weighing the sum of theirs: 1 per cap, 2 per magnitude), the further columns'
    magnitudes (2 each), each column's signs (1: a monotonic choice; 1/2 for a column in
    ``floors``), the ``floors`` (``floor_columns``: 1/2 each, taken from their signs') and,
    where a clamp is chosen, the thin-data rule's count (1, ``UNITS_ON_TOP`` of it on top
    of the share: ``plan_auto``); with ``values`` (``values_weight``, above 0) first the
    histogram of ``value_factors``, weighing ``values`` (on top of the share:
    ``plan_auto``); with ``tail`` (``tail_weight``) the row cap's tail histogram
    (``tail_histogram``), on top too."""
    parts = _joint_parts(auto)
    names = [(TAIL, tail)] if tail else []
    names += [(VALUES, values)] if values else []
    names += [("+".join(parts), sum(WEIGHTS[part.split(":")[0]] for part in parts))]
    names += [(f"magnitude:{column}", WEIGHTS["magnitude"]) for column in auto.columns[1:]]
    # a column with a floor pays for it from its signs' weight: the other choices keep theirs
    names += [(f"signs:{column}", WEIGHTS["signs"] - (WEIGHTS["floor"] if column in floors
                                                      else 0.0)) for column in auto.columns]
    names += [(f"floor:{column}", WEIGHTS["floor"]) for column in floors]
    if auto.columns:  # the thin-data rule's count of units (``thin_rule``)
        names.append((UNITS, WEIGHTS["units"]))
    return names


def plan_auto(plan: Plan, request: PrivacyRequest, outer: float | None = None,
              remaining: float = 1.0, *, share_of_request: float | None = None,
              reuse_values: bool = False) -> tuple[AutoPlan, list[DpEvent]]:
    """Split the request between choosing ``plan.auto``'s bounds and the query; ``outer``
    (epsilon, or rho) pays for choosing a total interval's outer cap (``choose_outer``).
    ``request`` is the part ``remaining`` of the query's budget that is left after a total
    interval's share: the bounds' share stays a share of the whole budget. A sum's row cap
    is aimed per magnitude (``value_factors``) where ``values_choice`` holds.
    ``share_of_request``: the choices' part of ``request``, every choice included, instead
    of the one the plan's share gives (``plan_retry``). ``reuse_values``: no histogram of
    its own, the row cap aimed by the first choice's (``plan_retry``: post-processing of a
    release already paid for), so its weight goes to the other choices."""
    aimed = values_weight(plan)
    values = 0.0 if reuse_values else aimed
    tail = 0.0 if reuse_values else tail_weight(plan)
    auto = plan.auto
    unit_mode = plan.bounding == "unit"
    outers = outer_names(auto) if auto is not None and (outer or unit_mode) else []
    if auto is None or (auto.choices == 0 and not outers):
        raise InternalError("no bounds to choose; this is a bug")
    names = choice_names(auto, floor_columns(plan), values, tail) if auto.choices else []
    if unit_mode:  # the caps on each unit's total, from the bounds' share (weight 1 each)
        # the partition cap only sizes the private selection's count (``bounding``)
        names = [(name, WEIGHTS["unit_partitions"] if name == "max_partitions" else weight)
                 for name, weight in names]
        names += [(name, WEIGHTS["unit"]) for name in outers]
        if (auto.unit_sums or auto.unit_rows) and not any(name == UNITS for name, _ in names):
            # the thin-data rule's (``unit_thin``; ``UNIT_UNITS_ON_TOP``, and for a count
            # alone ``UNIT_ROWS_UNITS``, all of it on top)
            names.append((UNITS, WEIGHTS["unit_units"] if auto.unit_sums else
                          UNIT_ROWS_UNITS))
        outers = []
    caps_alone = not unit_mode and auto.choices > 0 and not auto.columns
    if caps_alone:  # the caps per group's thin-data count (``caps_thin_rule``), all on top
        names.append((UNITS, CAPS_UNITS * _caps_chosen(auto)))
    kept = not unit_mode and auto.choices > 0 and bool(auto.columns)
    kept_weight = WEIGHTS[KEPT]
    if kept:  # the count of what the clamps chosen keep (``kept_check``), all on top
        names.append((KEPT, kept_weight))
    weights = [w for _, w in names]
    share = auto.spent_share / remaining if names else 0.0
    # the histogram and part of the thin-data count on top of the bounds' share: the other
    # choices keep theirs
    counted = any(name == UNITS for name, _ in names)
    on_top = values + tail + \
        ((CAPS_UNITS * _caps_chosen(auto) if caps_alone else UNITS_ON_TOP if not unit_mode
          else UNIT_UNITS_ON_TOP if auto.unit_sums else UNIT_ROWS_UNITS) if counted else 0.0) \
        + (kept_weight if kept else 0.0)
    if on_top and share * sum(weights) / (sum(weights) - on_top) < 1.0:
        share *= sum(weights) / (sum(weights) - on_top)
    # else (a share near 1) the parts on top come from within it: nothing would be left
    if share_of_request is not None:
        share = share_of_request
        if kept and share * sum(weights) / (sum(weights) - kept_weight) < 1.0:
            # the kept count on top of the retry's part too: its choices keep all of it
            share *= sum(weights) / (sum(weights) - kept_weight)
    if share >= 1.0:
        if remaining < 1.0:
            raise UserError(f"the bounds' share ({auto.spent_share:g}) and the total "
                            f"interval's ({1 - remaining:g}) leave nothing for the query: lower "
                            "bounds_share, or ask for intervals='bounded'")
        raise UserError(f"the bounds' share ({auto.spent_share:g}), with what the thin-data "
                        "count and a sum's histogram take on top of it, leaves nothing for the "
                        "query: lower bounds_share")
    measures = len(plan.aggregates)
    zcdp = request.rho is not None
    whole = request.rho if zcdp else request.epsilon
    assert whole is not None
    chosen, main = _privacy.split(whole, [share, 1.0 - share]) if names else (0.0, whole)
    spends = list(zip([name for name, _ in names],
                      _privacy.split(chosen, weights) if names else [], strict=True))
    if outer is not None and outers:  # the outer caps share their part equally
        spends += zip(outers, _privacy.split(outer, [1.0] * len(outers)), strict=True)
    events: list[DpEvent] = []
    epsilons: dict[str, float] = {}
    for name, each in spends:  # epsilon-DP each; under rho, charged as epsilon^2 / 2-zCDP
        epsilon = each
        if zcdp:
            epsilon = math.sqrt(2.0 * each)
            while Fraction(epsilon) ** 2 / 2 > Fraction(each):
                epsilon = _round_down(epsilon)
        epsilons[name] = epsilon
        events.append(ZCDPEvent(each) if zcdp else PureDPEvent(each))
    if zcdp:
        rest = PrivacyRequest(rho=main, noise=request.noise, weights=request.weights)
        noise, exponent = 1.0 / math.sqrt(2.0 * main / measures), 0.5
    else:
        rest = PrivacyRequest(epsilon=main, delta=request.delta, noise=request.noise,
                              weights=request.weights)
        if request.kind == "laplace":
            noise, exponent = math.sqrt(2.0) * measures / main, 1.0
        else:
            rho = zcdp_rho_for(main, request.delta / 2 if plan.private_keys else request.delta)
            noise, exponent = 1.0 / math.sqrt(2.0 * rho / measures), 0.5
    if unit_mode and plan.private_keys and not zcdp and not count_selects(plan):
        # bounding="unit" selects private keys with no COUNT(*) by a separate step, whose
        # share of epsilon the measures do not get: the noise per unit of sensitivity is that
        # of the smallest share the measures do get (``_privacy.allocate``, public numbers)
        shares = _privacy.allocate(rest, [a.name for a in plan.aggregates], True)
        noise = (math.sqrt(2.0) / min(shares.pure.values()) if request.kind == "laplace"
                 else 1.0 / math.sqrt(2.0 * min(shares.rho.values())))
    spent = chosen
    partitions = len(plan.keys) if plan.keys is not None and plan.group_by else 1
    values_share = share * remaining * values / sum(weights) if values else 0.0
    kept_share = share * remaining * kept_weight / sum(weights) if kept else 0.0
    tail_share = share * remaining * tail / sum(weights) if tail else 0.0
    return AutoPlan(auto, epsilons, rest, partitions, noise, exponent, spent,
                    outer or 0.0, share=share * remaining, values_share=values_share,
                    means=aimed > 0.0 and _means(plan), kept_share=kept_share,
                    tail_share=tail_share), events


def plan_retry(plan: Plan, first: AutoPlan, remaining: float = 1.0
               ) -> tuple[AutoPlan, list[DpEvent]] | None:
    """The choice made again where the thin-data rule would use the widest clamps (the
    module docstring, "Choosing again"): its plan, with ``RETRY_SHARE`` of the whole budget
    for the bounds in all, the first choices' part included, and the rest of ``first``'s
    request for the answer; and its choices' events. None where it does not apply: nothing
    is chosen (under ``bounding="unit"``, no cap on a unit's total), a total interval's
    outer caps are chosen too, ``bounding="unit"``'s caps are chosen after a private
    selection (``defers_unit_caps``), or the first choices already have half of what the
    retry's would spend in all. Public numbers only.

    Under ``bounding="unit"`` the thin-data rule is ``unit_thin``'s: where its noisy count is
    below its threshold, every cap (on a unit's rows and sums, and the partition cap) is
    chosen again as the clamps are here, from ``RETRY_SHARE`` of the budget in all. Caps
    per group chosen with no clamp beside them are chosen again where ``caps_thin_rule``
    would use the widest."""
    auto = plan.auto
    if auto is None or first.outer:
        return None
    if plan.bounding == "unit":
        if not (auto.unit_sums or auto.unit_rows) or defers_unit_caps(plan):
            return None
    elif auto.choices == 0 or outer_names(auto):
        return None
    whole_share = RETRY_SHARE / remaining  # of the request the first choices split
    first_share = first.share / remaining
    # the clamps' kept counts (``kept_check``) are on top of RETRY_SHARE, the first's and the
    # retry's: the other choices keep what they had without them
    first_choices = (first.share - first.kept_share) / remaining
    if whole_share < 2.0 * first_choices:
        return None
    # the first answer's part is 1 - first_share of the request; the retry's choices take
    # whole_share - first_choices of the request, so that its answer keeps 1 - whole_share
    # less the kept counts
    part = (whole_share - first_choices) / (1.0 - first_share)
    # the row cap aimed by the first choice's histogram (``choose_bounds``' ``aim``): no
    # second one, its weight to the other choices
    retry, events = plan_auto(plan, first.request, share_of_request=part, reuse_values=True)
    # of the first answer's request the retry takes retry.share (its clamps' kept count on top
    # of ``part``: ``plan_auto``); both shares as parts of the whole budget
    whole = first_share + (1.0 - first_share) * retry.share
    return replace(retry, share=whole * remaining,
                   kept_share=(1.0 - first_share) * retry.kept_share * remaining), events


def with_bounds(agg: Aggregate, bounds: dict[str, Bounds]) -> Aggregate:
    if isinstance(agg, Count | CountUnits) or agg.column not in bounds:
        return agg
    chosen = bounds[agg.column]
    if isinstance(agg, Quantile):
        return Quantile(agg.column, chosen, agg.name, q=agg.q, integer=agg.integer)
    if isinstance(agg, Variance):
        return Variance(agg.column, chosen, agg.name, std=agg.std)
    return type(agg)(agg.column, chosen, agg.name)


def _penalties(stats: Sequence[float] | FloatArray, candidates: Sequence[float],
               targets: float | Sequence[float] | FloatArray, cap: float, epsilon: float,
               ramp: float, knee: float | None = None, far: float = 0.0) -> FloatArray:
    """The penalties p_j of the module docstring: max(0, stat_j - t_j, max_(i<j) h_ij -
    stat_i), the first term left out at the last candidate, h_ij = t_i + 2 ``ramp``
    log2(c_j / c_i) / epsilon (``far`` instead of ``ramp`` per octave beyond ``knee``
    octaves), at most ``cap`` (and at least t_i). Each term is one statistic plus a constant,
    so p moves by at most as much as the statistics. ``stats`` and ``targets`` may hold
    several series (the last axis runs over the candidates): one penalty series each."""
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
    high = target[..., None, :] + 2.0 * rise / epsilon
    high = np.maximum(target[..., None, :], np.minimum(cap, high)) - stat[..., None, :]
    high[..., np.arange(n)[None, :] >= np.arange(n)[:, None]] = -math.inf  # i < j only
    return np.asarray(np.maximum(0.0, np.maximum(low, high.max(axis=-1))), dtype=np.float64)


def _release(scores: FloatArray | Sequence[float], epsilon: float,
             source: RandomSource | None, *, monotonic: bool = False) -> int:
    mechanism = PermuteAndFlip(epsilon=epsilon, sensitivity=SENSITIVITY, monotonic=monotonic,
                               source=source)
    capped = np.maximum(np.asarray(scores, dtype=np.float64), -PENALTY_CAP)
    return int(mechanism.release(capped))


def partition_candidates(plan: Plan) -> list[int]:
    candidates = [c for c in PARTITION_CANDIDATES if plan.keys is None or c < len(plan.keys)]
    if plan.keys is not None and len(plan.keys) <= PARTITION_CANDIDATES[-1]:
        candidates.append(len(plan.keys))
    return candidates


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


def _choose_joint(auto_plan: AutoPlan, plan: Plan, stats: Profile,
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
    return joint.decode(_release(joint.scores, joint.epsilon, source))


def joint_scores(auto_plan: AutoPlan, plan: Plan, stats: Profile,
                 rows_for: Sequence[tuple[int, int]] | None = None,
                 factors: FloatArray | None = None, *, tail: FloatArray | None = None
                 ) -> JointScores:
    """The joint choice's scores (``_choose_joint``) over the allowed candidates; with
    ``factors`` (``value_factors``: public, a noisy release's post-processing) a sum's row
    cap aims at factors[m] G s k^a at the magnitude m (per k, over k), not at the fixed
    ``ROW_FACTOR_VALUES`` G s k^a (``ROW_FACTOR`` G s k^a / k); with ``tail``
    (``tail_multipliers``: public too) the row cap's target at r is multiplied by tail[r]
    (the biases of the joint ramp and its reach read the targets without it)."""
    auto = auto_plan.auto
    name = "+".join(_joint_parts(auto))
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
    means = _means(plan)
    weigh = MEAN_CAP_FACTOR if means else 1.0
    pk = np.zeros(len(ks))
    # alone (COUNT(DISTINCT)) the partition cap competes with nothing: the gentler ramp, with
    # public keys (private keys' threshold grows with k: ``K_ALONE_LAMBDA``)
    k_ramp = K_LAMBDA if auto.max_rows_per_partition or magnitude or plan.private_keys \
        else K_ALONE_LAMBDA
    if auto.max_partitions:
        targets = [weigh * auto_plan.target(k, per_partition=True) for k in ks]
        partition_stats = stats.partitions(ks)
        pk = _penalties(partition_stats, ks, targets, cap, epsilon, k_ramp)
    # the magnitude's statistic per row cap (a row weighs 1 / max(T, r)): its penalties per r
    # and k (the target's rate depends on k)
    # (read at r' = ``magnitude_cap(r)``: a valid weight, 1 / max(T, r') <= 1 / T, on at most
    # three series, r' = 1, 2, 4, instead of one per row cap)
    octave = {r: magnitude_cap(r) for r in all_rs}
    value_stats = stats.magnitudes_by_cap(0, sorted(set(octave.values()))) if magnitude \
        else {}
    values = any(not isinstance(agg, Count | CountUnits) for agg in plan.aggregates)
    factor = ROW_FACTOR_VALUES if values else ROW_FACTOR
    per_k = _per_k_rows(auto_plan, factor, epsilon, max(ks))
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
    blocks = []
    for a, k in enumerate(ks):
        rs = all_rs[:allowed[k]]
        rate = auto_plan.target(k, per_partition=False)
        block = np.full(len(rs), pk[a])
        over = np.full((len(rs), width), -math.inf)
        if auto.max_partitions:
            over[:] = partition_stats[a] - targets[a]
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
            rows_by_magnitude = _penalties(series, rs, distinct, cap, epsilon,
                                           ramp, *knee)[where.ravel()].T
            over = np.maximum(over, kept[:, None] - targets2.T)
            targets_seen.append(float(targets2.max()))
        elif auto.max_rows_per_partition:
            aim = (MEAN_ROW_FACTOR if means else 1.0) * factor * rate
            stat, target = (stats.rows(rs, k), aim / k) if per_k else (row_stats[:len(rs)], aim)
            aimed = np.full(len(rs), target) if tail is None else target * tail[:len(rs)]
            block = np.maximum(block, _penalties(stat, rs, aimed, cap, epsilon, ramp, *knee))
            over = np.maximum(over, (np.asarray(stat, dtype=np.float64) - target)[:, None])
            targets_seen.append(target)
        if magnitude:
            lows = sorted({octave[r] for r in rs})
            per = _penalties(np.array([value_stats[r] for r in lows]), MAGNITUDES, rate, cap,
                             epsilon, MAGNITUDE_LAMBDA)
            pm = per[[lows.index(octave[r]) for r in rs]]
            if rows_by_magnitude is not None:
                pm = np.maximum(pm, rows_by_magnitude)
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
    target: where a coordinate's own ramp would reach its cap (``_penalties``) its own
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
    sparse table of minima over runs of 2^l (Bender and Farach-Colton's range minimum)."""
    moved = np.moveaxis(values, axis, -1)
    n = moved.shape[-1]
    ends = np.arange(n) - gap
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


def _per_k_rows(auto_plan: AutoPlan, factor: float, epsilon: float, k: int) -> bool:
    """Whether the row cap's statistic is read per k (the module docstring): where the
    target f G s k^(a-1) (f the 1 / P rule's ``factor``) is at least ``PER_K_MIN`` /
    epsilon at the largest candidate ``k`` (under Gaussian noise the smallest target, the
    noisiest choice; under Laplace noise k does not matter). Public numbers only (G, the
    noise, the shares, the candidates)."""
    target = auto_plan.target(k, per_partition=False) / k
    least = PER_K_MIN if auto_plan.exponent == 1.0 else PER_K_MIN_GAUSSIAN
    return factor * target * epsilon >= least


def choose_outer(auto_plan: AutoPlan, stats: Profile, source: RandomSource | None,
                 least: float = 1.0) -> int:
    """A total interval's outer cap M (``dpcurator.curator._total``): permute-and-flip over
    M = 2^j scoring q_j = -U(2^j) - ``OUTER_PRIOR`` j / epsilon, U(M) the units with more than
    M rows, then ``OUTER_MARGIN`` times the choice (post-processing).

    The crossing (the smallest M no unit exceeds) scores best but for the prior; each octave
    above it is e^-``OUTER_PRIOR`` times as likely, and one below it is preferred only where
    fewer than ``OUTER_PRIOR`` / epsilon units exceed it (the prior pays for the width of the
    larger cap: the interval widens in proportion to M, while units above M break its cover).
    Adding a unit lowers or keeps every score and the prior is fixed, so the choice is
    monotonic: permute-and-flip with half the noise (Ding, Kifer, Wang and Zhang 2021).

    Never below the inner caps: only the candidates whose cap is at least ``least`` (k r, the
    rows the caps let one unit keep: ``_total.inner_unit_rows``) compete, and where none is,
    the largest cap (``Plan``'s limit) is taken without a choice. At small epsilon the prior
    alone would pick the smallest cap, whose interval then misses every partition. The inner
    caps are public or were chosen under DP before this choice, so the restriction is
    post-processing of those outputs, and the choice over it is still epsilon-DP on the data
    (adaptive composition; the scores are those above, restricted)."""
    epsilon = auto_plan.epsilons[OUTER]
    caps = OUTER_CANDIDATES
    final = [min(OUTER_MARGIN * c, caps[-1]) for c in caps]
    first = next((j for j, cap in enumerate(final) if cap >= least), None)
    if first is None:
        return int(caps[-1])
    octaves = np.log2(np.asarray(caps, dtype=np.float64))
    return int(final[_outer_index(stats.unit_rows(caps), octaves, epsilon, source, first)])


def choose_outer_sum(auto_plan: AutoPlan, stats: Profile, column: int, name: str,
                     source: RandomSource | None, least: float = 0.0) -> float:
    """A total SUM's outer cap V on a unit's sum of |value| of ``name`` (the profile's
    ``column``-th of the sums), as ``choose_outer`` chooses M: over V = 2^(q/4), q in
    ``PROFILE_STEPS``, at most ``MAX_UNIT_SUM``, and never below ``least`` (k r max(|lo|,
    |hi|), what the caps and the clamping let one unit keep: ``_total.inner_unit_sum``;
    ``MAX_UNIT_SUM`` where no candidate reaches it), as ``choose_outer`` argues."""
    epsilon = auto_plan.epsilons[f"{OUTER_SUM}:{name}"]
    final = [min(OUTER_MARGIN * 2.0 ** (q / 4), MAX_UNIT_SUM) for q in PROFILE_STEPS]
    first = next((j for j, cap in enumerate(final) if cap >= least), None)
    if first is None:
        return float(MAX_UNIT_SUM)
    octaves = np.asarray(PROFILE_STEPS, dtype=np.float64) / 4.0
    return float(final[_outer_index(stats.unit_sums(column), octaves, epsilon, source,
                                    first)])


def _outer_index(stats: Sequence[float], octaves: npt.NDArray[np.float64], epsilon: float,
                 source: RandomSource | None, first: int = 0) -> int:
    """Permute-and-flip (monotonic) over -(units beyond the candidate) minus the prior, among
    the candidates from ``first`` on (an index into all of them)."""
    prior = OUTER_PRIOR * (octaves - octaves[0]) / epsilon
    scores = -(np.asarray(stats, dtype=np.float64) + prior)
    return first + _release(scores[first:], epsilon, source, monotonic=True)


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
    return auto_plan.floor("+".join(_joint_parts(auto)), max(size, 1))


def thin_threshold(auto_plan: AutoPlan, plan: Plan,
                   rows_for: Sequence[tuple[int, int]] | None, k: int) -> float:
    """Below this noisy count the thin-data rule uses the widest clamps (``thin_rule``):
    ``THIN`` F plus half the magnitude's target t at the partition cap ``k``, and at least t
    plus ``THIN_ABOVE_TARGET`` F. Public numbers only; ``explain`` states it and the exact
    measure prices it by this same function.

    Why the second term. The magnitudes below every value score max(0, N - t), so where the
    count N is below t they score 0, the best any candidate can; the data's magnitude scores
    at best -(t - N) there (its ramp is capped at max(t, 2 F) less N). F + t / 2 is above t
    only while t < 2 F: with many partitions, several aggregates or a large epsilon (t up to
    3.6 F with 1,000 public keys at epsilon 1) counts between F + t / 2 and t chose clamps
    near 1e-6 on values of 40 to 60, and answered about zero with a tight interval (12 of 20
    releases). Above t the lowest magnitudes pay N - t, and at t + F / 2 each is at most (beta
    / C)^(1/2) times as likely as the data's, the first term's margin."""
    return _threshold(thin_floor(auto_plan, plan, rows_for),
                      auto_plan.target(k, per_partition=False))


def _threshold(floor: float, target: float) -> float:
    """The thin-data rule's threshold for a choice of floor F and target t
    (``thin_threshold``): max(``THIN`` F + t / 2, t + ``THIN_ABOVE_TARGET`` F)."""
    return max(THIN * floor + target / 2.0, target + THIN_ABOVE_TARGET * floor)


def thin_rule(auto_plan: AutoPlan, plan: Plan, count: int, source: RandomSource | None,
              rows_for: Sequence[tuple[int, int]] | None = None, k: int = 1
              ) -> tuple[str, int | None, str | None]:
    """The thin-data rule for a query whose clamps are chosen: (``"widest"`` or
    ``"chosen"``, the noisy count or None, a warning or None).

    The count is the least, over the clamped columns, of each column's magnitude statistic at
    its lowest candidate, of the sign its signs' choice kept (``Profile.nonzero`` at the
    chosen row cap and the released side: the units' worth of nonzero values that [0, M],
    [-M, 0] or [-M, M] keeps, each unit adding at most 1, the floor of an exact sum; their
    least moves by at most 1 too). Made noisy (discrete Laplace,
    sensitivity 1, with the ``units`` choice's epsilon: Ghosh, Roughgarden and Sundararajan
    2009), below ``THIN`` times the joint choice's floor F it means that the statistic
    cannot pay the choice's ramp from the lowest magnitude to the data's (up to 2 F, less
    its excess over the target): the clamp chosen is drawn towards zero (or a sign the data
    does not have). The rule then replaces every chosen clamp by the widest,
    [-2^49.75, 2^49.75] (post-processing of the choices and the count), so that the answer's
    interval is as wide as its uncertainty, and the release says so. Below ``THIN_WARN``
    times F the clamp is kept with a warning: the choice cannot locate a tail of fewer than
    about F units (of values, and of rows where the caps are chosen with them).
    A one-sided clamp of the wrong sign keeps none of the values, so its count is about 0
    and passes the first threshold only with noise above 1.25 F (scale about 0.1 F: e^-12
    or less), on top of the signs' own error (e^-(epsilon n) for n values on the other
    side). The clamps were made symmetric below 4 F instead, when the count read both
    signs: that doubled a mean's width on thin data of one sign (the family's #14 AVG
    3.44x the best fixed clamps with it, 1.86x without; COMPAS's juvenile felonies).
    Below ``THIN`` F plus half the magnitude's target t at the partition cap ``k`` chosen
    (``thin_threshold``; G s k^a: the noise's rate per unit's worth of values) the widest
    clamps too: the magnitudes below every value then score max(0, N - t), the data's about
    2 F - N (the ramp from the lowest, less the statistic), so below N = F + t / 2 it prefers
    clamps below every value and the answer is about zero with a tight interval around it
    (the family's #42 at epsilon 0.3, 20 groups: clamps near 1e-6 on values of 23 and
    more); at t = 0 this is the first threshold. Where t exceeds 2 F the threshold is t +
    F / 2 instead (``thin_threshold``): below t those magnitudes score 0. Where the count's
    epsilon is too small for its noise to be drawn (scale above 2^56) the rule applies
    without a count: a decision on public numbers."""
    floor = thin_floor(auto_plan, plan, rows_for)
    epsilon = auto_plan.epsilons[UNITS]
    widest = (f"too few units for epsilon to choose the clamps from the data (the choice "
              f"needs about {floor:,.0f}); the widest clamps ({WIDEST_CLAMPS}) were used, so "
              "the answer is as uncertain as its interval says: give bounds, or raise epsilon, "
              "or the share of it spent choosing them (bounds_share); values of 2^-30 (about "
              "9.3e-10) or less in magnitude count as zero here: rescale such a column")
    if 1.0 / epsilon > MAX_NOISE_SCALE:
        return "widest", None, widest
    noisy = int(DiscreteLaplace(epsilon=epsilon, source=source).release(count))
    if noisy < THIN * floor:
        return "widest", noisy, widest
    if noisy < thin_threshold(auto_plan, plan, rows_for, k):
        rate = auto_plan.target(k, per_partition=False)
        return "widest", noisy, (
            f"the noise at this epsilon outweighs the column's nonzero values (about "
            f"{noisy:,} units' worth, against a noise rate of {rate:,.0f}): clamps chosen from "
            "the data would cut them all and answer about zero, so the widest clamps "
            f"({WIDEST_CLAMPS}) were used and the answer is as uncertain as its interval says: "
            "give bounds, or raise epsilon")
    if noisy < THIN_WARN * floor:
        # the caps are chosen by the same joint choice, with the same floor
        rows = auto_plan.auto.max_rows_per_partition or auto_plan.auto.max_partitions
        what, cut = ("caps and clamps", "rows and values") if rows else ("clamps", "values")
        return "chosen", noisy, (
            f"thin data for this epsilon (about {max(noisy, 0):,} units' worth of nonzero "
            f"values): the {what} chosen from the data cannot locate a tail of fewer than "
            f"about {floor:,.0f} units; {cut} beyond them are cut unseen (give bounds to be "
            "sure; a larger bounds_share locates smaller tails)")
    return "chosen", noisy, None


def kept_statistic(stats: Profile, chosen: Sequence[tuple[int, int, int]], r: int) -> int:
    """The clamps' kept count (``kept_check``): the least, over the columns ``chosen`` (each
    a column's index, its chosen magnitude's and the side its signs kept, ``sign_side``;
    public: released choices), of the units' worth of nonzero values of that sign within that
    magnitude (``Profile.within``, at the row cap's ``magnitude_cap(r)``, as the choice read
    it). Each column's statistic moves by at most 1 when one unit is added or removed (a
    unit's values weigh at most 1 in all), so their least does."""
    cap = magnitude_cap(r)
    return min(stats.within(i, cap, PROFILE_STEPS[m], side) for i, m, side in chosen)


def kept_bound(auto_plan: AutoPlan) -> float:
    """Below this noisy kept count the clamps chosen are set aside (``kept_check``):
    ``CAPS_LOW`` noise scales of the count. Public numbers only."""
    return CAPS_LOW / auto_plan.epsilons[KEPT]


def kept_check(auto_plan: AutoPlan, stats: Profile, chosen: Sequence[tuple[int, int, int]],
               r: int, source: RandomSource | None) -> tuple[bool, int | None, str | None]:
    """Whether the clamps chosen collapsed: (set them aside, the noisy count or None, a
    warning or None).

    The count is ``kept_statistic`` made noisy by the discrete Laplace mechanism (sensitivity
    1, the ``kept`` choice's epsilon; Ghosh, Roughgarden and Sundararajan 2009). A clamp at
    the bias-variance point keeps all but about the noise's rate t of the N units' worth of
    nonzero values; one drawn from the lowest magnitudes' plateau, or below every value,
    keeps none of them. Near the thin-data threshold the plateau holds a few percent of the
    joint choice's mass (its candidates score about F / 2 below the data's, each (beta /
    C)^(1/2) as likely, and there are thousands), so the thin-data count alone let such
    clamps through. Below ``kept_bound`` the outcome is the thin-data rule's widest clamps
    (post-processing of the counts): the choice is made again where it can be, else the
    widest clamps are used, and the release says why."""
    epsilon = auto_plan.epsilons[KEPT]
    bound = kept_bound(auto_plan)
    widest = ("the clamps chosen from the data kept almost none of the values (a noisy count "
              "of {noisy} units' worth within them, against {bound:,.0f}): the choice had "
              "collapsed, so the widest clamps (" + WIDEST_CLAMPS + ") were used and the "
              "answer is as uncertain as its interval says: give bounds, or raise epsilon")
    if 1.0 / epsilon > MAX_NOISE_SCALE:
        return True, None, widest.format(noisy="no", bound=bound)
    noisy = int(DiscreteLaplace(epsilon=epsilon, source=source).release(
        kept_statistic(stats, chosen, r)))
    if noisy < bound:
        return True, noisy, widest.format(noisy=f"{noisy:,}", bound=bound)
    return False, noisy, None


def caps_target(auto_plan: AutoPlan, plan: Plan, k: int) -> float:
    """The largest target the joint choice gives the caps per group chosen alone at the
    partition cap ``k`` (``joint_scores``: the partition cap's G s a k^(a-1), the row cap's
    factor times G s k^a, over k where it is read per k). Public numbers only."""
    auto = auto_plan.auto
    targets = [0.0]
    if auto.max_partitions:
        weigh = MEAN_CAP_FACTOR if _means(plan) else 1.0
        targets.append(weigh * auto_plan.target(k, per_partition=True))
    if auto.max_rows_per_partition:
        values = any(not isinstance(agg, Count | CountUnits) for agg in plan.aggregates)
        factor = ROW_FACTOR_VALUES if values else ROW_FACTOR
        name = "+".join(_joint_parts(auto))
        ks = partition_candidates(plan) if auto.max_partitions else [plan.max_partitions or 1]
        per_k = _per_k_rows(auto_plan, factor, auto_plan.epsilons[name], max(ks))
        aim = (MEAN_ROW_FACTOR if _means(plan) else 1.0) * \
            (ROW_FACTOR if per_k else factor) * auto_plan.target(k, per_partition=False)
        targets.append(aim / k if per_k else aim)
    return max(targets)


def caps_thin_threshold(auto_plan: AutoPlan, plan: Plan,
                        rows_for: Sequence[tuple[int, int]] | None, k: int) -> float:
    """Below this noisy count of units the caps per group chosen alone are replaced by the
    widest (``caps_thin_rule``): ``THIN`` F plus half the caps' target t at ``k``
    (``caps_target``), and at least t plus ``THIN_ABOVE_TARGET`` F, as the clamps'
    (``thin_threshold``). Public numbers only."""
    return _threshold(thin_floor(auto_plan, plan, rows_for), caps_target(auto_plan, plan, k))


def widest_caps(plan: Plan, rows_for: Sequence[tuple[int, int]] | None) -> tuple[int, int]:
    """The widest caps per group the joint choice could pick, among those ``rows_for``
    allows: the largest partition cap, and the largest row cap at it."""
    auto = plan.auto
    assert auto is not None
    ks = partition_candidates(plan) if auto.max_partitions else [plan.max_partitions or 1]
    rs = list(ROW_CANDIDATES) if auto.max_rows_per_partition else \
        [plan.max_rows_per_partition or 1]
    allowed = dict(rows_for) if rows_for is not None else {k: len(rs) for k in ks}
    k = max(k for k in ks if allowed.get(k, 0) > 0)
    return k, rs[allowed[k] - 1]


def caps_statistic(auto_plan: AutoPlan, stats: Profile, chosen: tuple[int, int] | None = None
                   ) -> int:
    """The caps' thin-data count (``caps_thin_rule``). On the first choice (``chosen`` None),
    the units (``Profile.partitions`` at 0: a unit's pairs weigh 1 / P, so it adds exactly
    1). On the choice made again, about the units the caps chosen, ``chosen`` = (k, r), cut:
    the larger of the statistics those caps are scored by (``Profile.partitions`` at k,
    ``Profile.rows`` at r with each pair weighing 1 / P, whatever partition cap is given: a
    bug hunt found 1 / max(P, k) hiding 300 units behind a given cap of 20). Each statistic
    moves by at most 1 when one unit is added or removed, so their larger does, and so does
    its floor."""
    if chosen is None:
        return math.floor(stats.partitions([0])[0])
    auto = auto_plan.auto
    k, r = chosen
    cut = 0.0
    if auto.max_partitions:
        cut = max(cut, stats.partitions([k])[0])
    if auto.max_rows_per_partition:
        cut = max(cut, stats.rows([r])[0])
    return math.floor(cut)


def caps_cut_bound(auto_plan: AutoPlan) -> float:
    """On the choice made again, a noisy count of the units its caps cut at or above this
    replaces them by the widest (``caps_thin_rule``): ``CAPS_LOW`` times the count's noise
    scale. Public numbers only."""
    return CAPS_LOW / auto_plan.epsilons[UNITS]


def caps_thin_rule(auto_plan: AutoPlan, plan: Plan, count: int, source: RandomSource | None,
                   rows_for: Sequence[tuple[int, int]] | None, k: int, again: bool = False
                   ) -> tuple[str, int | None, str | None]:
    """The thin-data rule for caps per group chosen with no clamp beside them: (``"widest"``
    or ``"chosen"``, the noisy count or None, a warning or None), as ``thin_rule``'s for the
    clamps.

    The count is ``caps_statistic``, made noisy by the discrete Laplace mechanism
    (sensitivity 1, the ``units`` choice's epsilon; Ghosh, Roughgarden and Sundararajan 2009).
    On the first choice it is of the units: below ``caps_thin_threshold`` (``THIN`` F plus
    half the caps' target t) the statistics cannot pay the ramp from the lowest caps to the
    data's, and the caps may be drawn within the noise, low (300 units of 10 rows at epsilon
    0.3 chose r of 1 or 2 and answered 10% to 45% of the truth). The caps are then chosen
    again (``plan_retry``), or, where no retry can follow, replaced by the widest
    (``widest_caps``; post-processing of the count), and the release says so. On the choice
    made again (``again``) the data is thin by then, and the count is of the units its caps
    cut: at or above ``caps_cut_bound`` (3 noise scales) they are replaced by the widest; below
    it they are kept, cutting almost nobody (one row per unit keeps caps of one row; a count
    of the units beyond the lowest caps, tried first, kept them wherever the caps' target was
    large against the noise, where the choice had collapsed: a bug hunt). Above the first
    threshold but below ``THIN_WARN`` F, the caps are kept with a warning: a tail of fewer
    than about F units cannot be located."""
    floor = thin_floor(auto_plan, plan, rows_for)
    epsilon = auto_plan.epsilons[UNITS]
    wide_k, wide_r = widest_caps(plan, rows_for)
    auto = auto_plan.auto
    caps = " and ".join(name for name in ("max_partitions", "max_rows_per_partition")
                        if getattr(auto, name))
    keys = (" (with private keys, a unit in up to that many partitions raises the selection's "
            "threshold, so few or no keys may be released)") if plan.private_keys and \
        auto.max_partitions else ""
    threshold = caps_cut_bound(auto_plan) if again else \
        caps_thin_threshold(auto_plan, plan, rows_for, k)
    # public numbers only: the noisy count, never ``count``
    noisy = None if 1.0 / epsilon > MAX_NOISE_SCALE else \
        int(DiscreteLaplace(epsilon=epsilon, source=source).release(count))
    why = (f"the caps chosen again from the data cut many units (a noisy count of "
           f"{noisy if noisy is not None else 'no'} against {threshold:,.0f})" if again else
           f"too few units for epsilon to choose the caps per group ({caps}) from the data "
           f"(the choice needs about {threshold:,.0f})")
    widest = (f"{why}; the widest caps were used ({wide_k:,} partitions of {wide_r:,} rows)"
              f"{keys}, so the answer is as uncertain as its interval says: give {caps}, or "
              "raise epsilon, or the share of it spent choosing them (bounds_share)")
    if noisy is None:
        return "widest", None, widest
    if again:
        if noisy >= threshold:
            return "widest", noisy, widest
        return "chosen", noisy, (
            f"thin data for this epsilon: the caps per group chosen again from the data cut "
            f"few units (a noisy count of {noisy:,}), but cannot locate a tail of fewer than "
            f"about {floor:,.0f} units; rows beyond them are cut unseen (give {caps} to be "
            "sure)")
    if noisy < threshold:
        return "widest", noisy, widest
    if noisy < THIN_WARN * floor:
        return "chosen", noisy, (
            f"thin data for this epsilon (about {max(noisy, 0):,} units): the caps per group "
            f"chosen from the data cannot locate a tail of fewer than about {floor:,.0f} "
            f"units; rows beyond them are cut unseen (give {caps} to be sure; a larger "
            "bounds_share locates smaller tails)")
    return "chosen", noisy, None


#: the signs' candidates, as multiples of the magnitude M: [0, M], [-M, 0], [-M, M]
SIGNS = ((0.0, 1.0), (-1.0, 0.0), (-1.0, 1.0))


def sign_side(sign: tuple[float, float]) -> int:
    """The sign of the values a clamp of ``SIGNS`` keeps: 1, -1, or 0 for both."""
    return 1 if sign[0] == 0.0 else -1 if sign[1] == 0.0 else 0


def sign_scores(auto_plan: AutoPlan, stats: Profile, index: int, column: str
                ) -> tuple[list[float], float]:
    """The scores of a column's signs, [0, M], [-M, 0] and [-M, M], and their epsilon (a
    monotonic permute-and-flip; ``choose_bounds``)."""
    choice = f"signs:{column}"
    negative, positive = stats.signs(index)
    both = auto_plan.floor(choice, 3, BETA_BOUNDED, monotonic=True)
    return [-negative, -positive, -both], auto_plan.epsilons[choice]


def floor_scores(auto_plan: AutoPlan, stats: Profile, index: int, column: str, magnitude: int,
                 side: int, r: int, k: int) -> tuple[FloatArray, list[float], float]:
    """A mean's floor L on the clamp [L, M] (``side`` 1; [-M, -L] for -1), M =
    ``MAGNITUDES[magnitude]``: (the scores, the floors L scored, widest last, and the
    choice's epsilon), for ``choose_floor``.

    The candidates are the magnitudes up to ``FLOOR_STEPS`` steps below M, then 0, in
    increasing order of the clamp's width W = M - L; the penalties are those of the module
    docstring (``_penalties``) over the widths, the statistic the values each floor raises
    (``Profile.raised`` at the row cap ``magnitude_cap(r)``: it grows as L rises, as the
    magnitude's shrinks as M rises), the target the magnitude's (G s k^a: a mean's noise
    grows with W as a sum's with M), the ramp ``FLOOR_LAMBDA`` per octave of width above the
    crossing. Each penalty is a statistic plus a constant, and one unit moves each
    statistic by at most 1, so the scores' sensitivity is 1 (``SENSITIVITY``)."""
    choice = f"floor:{column}"
    steps = [j for j in range(magnitude - 1, magnitude - 1 - FLOOR_STEPS, -1) if j >= 0]
    top = MAGNITUDES[magnitude]
    floors = [float(MAGNITUDES[j]) for j in steps] + [0.0]
    widths = [top - low for low in floors]
    raised = stats.raised(index, magnitude_cap(r), side)
    series = [raised[j] for j in steps] + [0.0]  # the last's statistic is never read
    cap = CAP * auto_plan.floor(choice, len(floors))
    epsilon = auto_plan.epsilons[choice]
    penalties = _penalties(series, widths, auto_plan.target(k, per_partition=False), cap,
                           epsilon, FLOOR_LAMBDA)
    return -penalties, floors, epsilon


def end_scores(auto_plan: AutoPlan, stats: Profile, index: int, column: str, magnitude: int,
               r: int, k: int) -> tuple[FloatArray, list[tuple[float, float]], float]:
    """A mean's two-sided clamp's ends, M = ``MAGNITUDES[magnitude]``: (the scores, the
    clamps scored, and the choice's epsilon), for ``choose_end``.

    The candidates are [-L, M] and [-M, L] for L among 0 and the magnitudes up to
    ``FLOOR_STEPS`` steps below M, and [-M, M]: one side's end brought in. Each side is a
    chain of the penalties of the module docstring (``_penalties``) over the widths M + L,
    increasing, ending at [-M, M]: the statistic the values of that side beyond L (what the
    end cuts; ``Profile.side_magnitudes`` at the row cap ``magnitude_cap(r)``), the target
    the magnitude's (G s k^a: a mean's noise grows with the width), the ramp ``FLOOR_LAMBDA``
    per octave of width above the crossing. [-M, M], the top of both chains, scores the
    larger of its two penalties. Each penalty is a statistic plus a constant, or a maximum of
    such terms, so the scores' sensitivity is 1 (``SENSITIVITY``)."""
    choice = f"floor:{column}"
    steps = [j for j in range(magnitude - FLOOR_STEPS, magnitude) if j >= 0]
    top = float(MAGNITUDES[magnitude])
    ends = [0.0] + [float(MAGNITUDES[j]) for j in steps]
    widths = [top + e for e in ends] + [2.0 * top]
    cap = CAP * auto_plan.floor(choice, 2 * len(ends) + 1)
    epsilon = auto_plan.epsilons[choice]
    target = auto_plan.target(k, per_partition=False)
    chains = []
    for side in (-1, 1):
        every, beyond = stats.side_magnitudes(index, magnitude_cap(r), side)
        series = [every] + [beyond[j] for j in steps] + [0.0]  # the last is never read
        chains.append(_penalties(series, widths, target, cap, epsilon, FLOOR_LAMBDA))
    penalties = np.concatenate([chains[0][:-1], chains[1][:-1],
                                [max(chains[0][-1], chains[1][-1])]])
    clamps = [(-e, top) for e in ends] + [(-top, e) for e in ends] + [(-top, top)]
    return -penalties, clamps, epsilon


def choose_end(auto_plan: AutoPlan, stats: Profile, index: int, column: str, magnitude: int,
               r: int, k: int, source: RandomSource | None) -> tuple[float, float]:
    """A mean's two-sided clamp (``end_scores``): permute-and-flip, epsilon-DP under
    add/remove one unit (McKenna and Sheldon 2020). A mean's noise grows with its clamp's
    width, and values mostly of one sign (a fifth negative, say) need the other end only as
    far as their own values reach."""
    scores, clamps, epsilon = end_scores(auto_plan, stats, index, column, magnitude, r, k)
    return clamps[_release(scores, epsilon, source)]


def end_gate(auto_plan: AutoPlan, column: str) -> float:
    """The thin-data rule's noisy count a two-sided mean's ends need before they are drawn
    (``choose_bounds``): ``END_THIN`` times the floor choice's F, whose epsilon they use.
    Public numbers only, as ``floor_gate``."""
    return END_THIN * auto_plan.floor(f"floor:{column}", FLOOR_STEPS + 1)


def floor_gate(auto_plan: AutoPlan, column: str) -> float:
    """The thin-data rule's noisy count a mean's floor needs before it is drawn
    (``choose_bounds``): ``FLOOR_THIN`` times the floor choice's own F. Public numbers only;
    the exact measure of ``benchmarks/auto_bounds_family.py`` prices floors by the same gate."""
    return FLOOR_THIN * auto_plan.floor(f"floor:{column}", FLOOR_STEPS + 1)


def choose_floor(auto_plan: AutoPlan, stats: Profile, index: int, column: str,
                 magnitude: int, side: int, r: int, k: int, source: RandomSource | None
                 ) -> float:
    """A mean's floor (``floor_scores``): permute-and-flip, epsilon-DP under add/remove one
    unit (McKenna and Sheldon 2020). Without it a mean of values far from zero (years,
    heights) was clamped to [0, M], its noise set by M instead of the values' spread: AVG of
    years 1990 to 2030 was 88x the error with the data's own range, and of heights 3x."""
    scores, floors, epsilon = floor_scores(auto_plan, stats, index, column, magnitude, side,
                                           r, k)
    return floors[_release(scores, epsilon, source)]


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


def choose_bounds(auto_plan: AutoPlan, plan: Plan,
                  profile: Sequence[tuple[Any, ...]] | Profile,
                  columns: Sequence[str], source: RandomSource | None,
                  rows_for: Sequence[tuple[int, int]] | None = None, *,
                  defer_unit_caps: bool = False, again: bool = False,
                  aim: Aim | None = None) -> tuple[Plan, dict[str, Any]]:
    """The plan with its bounds chosen from ``profile`` (the engine's rows for a
    ``BoundedQuery.profile`` of ``columns``, or their ``Profile``), and what the release says
    about them; the caps among those ``rows_for`` allows (``_choose_joint``).
    ``defer_unit_caps`` (``defers_unit_caps``): ``bounding="unit"``'s caps are left at the
    widest (``widest_unit_caps``), to be chosen once the keys are selected
    (``choose_unit_caps``). ``again``: the choice made again (``plan_retry``;
    ``caps_thin_rule``). ``aim``: the row cap's factors (``draw_aim``), drawn here where not
    given and the plan pays for them; the retry reads the first choice's."""
    auto = auto_plan.auto
    stats = profile if isinstance(profile, Profile) else Profile(profile)
    eps = auto_plan.epsilons
    chosen: dict[str, Any] = {}
    if auto.choices == 0:
        return _with_outer(auto_plan, plan.replace(auto=None), chosen, stats, source,
                           defer_unit_caps)
    if aim is None:  # the row cap's factor per magnitude, from its own noisy histogram
        aim = draw_aim(auto_plan, stats, source)
    if aim is None and values_choice(plan):
        raise InternalError("a row cap aimed by a histogram that was not drawn; this is a bug")
    factors = aim.factors if aim is not None else None
    tail = aim.tail if aim is not None else None
    k, r, first = _choose_joint(auto_plan, plan, stats, source, rows_for, factors, tail=tail)
    if aim is not None and values_choice(plan):
        chosen["value_factors"] = _aimed_at(auto_plan, factors, first, r)
    if TAIL in eps or (aim is not None and tail is not None):
        chosen["row_tail"] = _tail_said(tail, r)
    # the signs: [0, M] costs the negative values, [-M, 0] the positive ones, [-M, M] a
    # fixed price (twice the width: twice the noise of a mean); adding a unit lowers or keeps
    # every score (monotonic). Drawn first: the thin-data count reads the sign kept
    signs = [SIGNS[_release(*sign_scores(auto_plan, stats, index, column), source,
                            monotonic=True)] for index, column in enumerate(columns)]
    # the least over the clamped columns (each moves by at most 1, so does their least): the
    # first alone let a sparse second column's clamp collapse unseen (a bug hunt found it in
    # the caps on each unit's total: ``unit_thin``)
    thin = thin_rule(auto_plan, plan,
                     min(stats.nonzero(i, magnitude_cap(r), sign_side(signs[i]))
                         for i in range(len(columns))), source, rows_for, k) if columns else None
    if not columns and UNITS in eps:  # the caps alone: a count of units checks them
        thin = caps_thin_rule(auto_plan, plan,
                              caps_statistic(auto_plan, stats, (k, r) if again else None),
                              source, rows_for, k, again)
        if thin[0] == "widest":  # post-processing of the count: the stated rule
            k, r = widest_caps(plan, rows_for)
    if auto.max_partitions:
        chosen["max_partitions"] = k
    if auto.max_rows_per_partition:
        chosen["max_rows_per_partition"] = r
    bounds: dict[str, Bounds] = {}
    top: list[str] = []  # the columns whose chosen magnitude is the largest candidate
    raised: list[str] = []  # the columns whose clamp got a floor, or an end brought in
    rate = auto_plan.target(k, per_partition=False)
    indexes: list[int] = []  # each column's magnitude chosen (``kept_check``)
    for index, column in enumerate(columns):
        if index == 0:
            assert first is not None
            chosen_index = first
        else:
            choice = f"magnitude:{column}"
            cap = CAP * auto_plan.floor(choice, len(MAGNITUDES))
            penalties = _penalties(stats.magnitudes(index, magnitude_cap(r)),
                                   MAGNITUDES,
                                   [rate] * len(MAGNITUDES), cap, eps[choice],
                                   MAGNITUDE_LAMBDA)
            chosen_index = _release(-penalties, eps[choice], source)
        indexes.append(chosen_index)
        magnitude = MAGNITUDES[chosen_index]
        lo, hi = signs[index][0] * magnitude, signs[index][1] * magnitude
        if thin is not None and thin[0] == "widest":  # post-processing: the stated rule
            lo, hi = -MAGNITUDES[-1], MAGNITUDES[-1]
        elif f"floor:{column}" in eps and lo * hi == 0.0 and thin is not None and \
                thin[1] is not None and thin[1] >= floor_gate(auto_plan, column):
            # a mean's one-sided clamp: its floor too
            low = choose_floor(auto_plan, stats, index, column, chosen_index,
                               1 if lo == 0.0 else -1, r, k, source)
            if low != 0.0:  # a floor: a low tail may be raised
                raised.append(column)
            lo, hi = (low, hi) if lo == 0.0 else (lo, -low)
        elif f"floor:{column}" in eps and thin is not None and \
                thin[1] is not None and thin[1] >= end_gate(auto_plan, column):
            # a mean's two-sided clamp: one end brought in (the floor's epsilon: the two
            # exclude each other)
            lo, hi = choose_end(auto_plan, stats, index, column, chosen_index, r, k, source)
            if (lo, hi) != (-magnitude, magnitude):  # an end brought in: a tail may be moved
                raised.append(column)
        bounds[column] = Bounds(lo, hi)
        if magnitude == MAGNITUDES[-1] and not (thin is not None and thin[0] == "widest"):
            top.append(column)
    # the clamps' kept count (``kept_check``), over the columns whose magnitude is below the
    # largest candidate (there the widest clamps are no wider; ``top`` says what it cuts)
    below_top = [(i, m, sign_side(signs[i])) for i, m in enumerate(indexes)
                 if m < len(MAGNITUDES) - 1]
    if KEPT in eps and below_top and thin is not None and thin[0] != "widest" and \
            thin[1] is not None:
        collapsed, noisy_kept, why = kept_check(auto_plan, stats, below_top, r, source)
        chosen["kept"] = noisy_kept
        if collapsed:  # post-processing of the counts: the thin-data rule's widest clamps
            thin = ("widest", thin[1], why)
            chosen["collapsed"] = True
            bounds = {c: Bounds(-MAGNITUDES[-1], MAGNITUDES[-1]) for c in bounds}
            top, raised = [], []
    if bounds:
        chosen["bounds"] = {c: (b.lo, b.hi) for c, b in bounds.items()}
    aggregates = [with_bounds(agg, bounds) for agg in plan.aggregates]
    final = plan.replace(aggregates=tuple(aggregates), max_partitions=k,
                         max_rows_per_partition=r, auto=None)
    if thin is not None:
        chosen["units"] = thin[1]
        chosen["rule"] = thin[0]  # the thin-data rule's outcome (``thin_rule``)
        if thin[2]:
            chosen["warnings"] = [thin[2]]
    thin_floor_of = [c for c in raised if thin is not None and thin[1] is not None and
                     thin[1] < THIN_WARN * auto_plan.floor(f"floor:{c}", FLOOR_STEPS + 1)]
    if thin_floor_of:  # post-processing of the count (a bug hunt: a floor raising 2% of
        # the values of a VARIANCE, 20,000 units, nothing said)
        worst = max(auto_plan.floor(f"floor:{c}", FLOOR_STEPS + 1) for c in thin_floor_of)
        chosen["warnings"] = [*chosen.get("warnings", ()), (
            f"the clamp of {', '.join(thin_floor_of)} chosen from the data was narrowed on "
            "one side (a floor, or one end brought in), and at this epsilon that choice cannot "
            f"see a tail of fewer than about {worst:,.0f} units beyond it: values there, if "
            "any, were moved to it unseen (give bounds to be sure)")]
    if top:  # post-processing of the choice: the candidates stop at 2^49.75
        chosen["warnings"] = [*chosen.get("warnings", ()), (
            f"the clamp chosen for {', '.join(top)} is the largest the choice can pick "
            f"(+-2^49.75, about {MAGNITUDES[-1]:.3g}): values beyond it, if any, were clamped "
            f"to it unseen; give bounds (up to {MAX_BOUND:.0e}) if they may be larger")]
    cost_name = "rho" if auto_plan.request.rho is not None else "epsilon"
    chosen[cost_name] = auto_plan.spent
    chosen["share"] = auto.spent_share
    if VALUES in eps:  # the histogram, on top of the share (``plan_auto``)
        chosen["values_share"] = auto_plan.values_share
    if TAIL in eps:  # the tail's histogram, on top of the share too
        chosen["tail_share"] = auto_plan.tail_share
    joint = "the caps and the first magnitude" if columns else "the caps"
    chosen["method"] = (f"permute-and-flip over steps of 2^(1/4), one joint choice of {joint} "
                        "(Amin et al. 2019's bias-variance rule, penalties ramping above it); "
                        "epsilons " +
                        ", ".join(f"{name} {value:.3g}" for name, value in eps.items()))
    return _with_outer(auto_plan, final, chosen, stats, source, defer_unit_caps)


def needs_retry(auto_plan: AutoPlan, plan: Plan, chosen: dict[str, Any],
                rows_for: Sequence[tuple[int, int]] | None = None) -> bool:
    """Whether the first choice's outcome (``chosen``) calls for the retry (``plan_retry``):
    the thin-data rule's widest clamps, or its noisy count below ``RETRY_BELOW`` times the
    joint choice's floor F. Post-processing of the count. Under ``bounding="unit"``, the
    widest caps on a unit's sum alone (``unit_thin``: its threshold is above 1.25 F)."""
    if chosen.get("rule") == "widest":
        return True
    if plan.bounding == "unit":
        return False
    units = chosen.get("units")
    return units is not None and units < RETRY_BELOW * thin_floor(auto_plan, plan, rows_for)


def chosen_again(first: AutoPlan, retry: AutoPlan, before: dict[str, Any],
                 chosen: dict[str, Any]) -> dict[str, Any]:
    """What the release says about bounds chosen again (``plan_retry``): the retry's choice
    ``chosen``, with what both choices spent and the first one's outcome (``before``), whose
    widest clamps were not used, and a sentence saying why the answer is noisier."""
    cost_name = "rho" if retry.request.rho is not None else "epsilon"
    out = dict(chosen)
    out[cost_name] = first.spent + retry.spent
    out["share"] = retry.share  # in all: the histograms included
    out.pop("values_share", None)
    out.pop("tail_share", None)
    out["first_choice"] = {key: before[key] for key in (
        "max_partitions", "max_rows_per_partition", OUTER, "max_unit_sums", "units", "kept",
        cost_name) if key in before}
    answer = retry.request.rho if retry.request.rho is not None else retry.request.epsilon
    units = max(before.get('units') or 0, 0)
    if "unit_method" in chosen:
        what, give = "caps on each unit's total", "max_unit_rows and max_unit_sums"
        count = f"{units:,} units' worth " + \
            ("of nonzero values" if retry.auto.unit_sums else "with a row")
    elif retry.auto.columns:
        what, give = "clamps", "bounds"
        count = f"{units:,} units' worth of nonzero values"
    else:  # the caps per group alone (``caps_thin_rule``)
        give = " and ".join(name for name in ("max_partitions", "max_rows_per_partition")
                            if getattr(retry.auto, name))
        what, count = f"caps per group ({give})", f"{units:,} units"
    why = f"too few units for the first choice of the {what} (a noisy count of {count})"
    if before.get("collapsed"):  # set aside by its kept count (``kept_check``)
        why = (f"the first choice of the clamps kept almost none of the values (a noisy count "
               f"of {before.get('kept') or 0:,} units' worth within them)")
    out["warnings"] = [
        f"{why}, so they were chosen again with {retry.share:.0%} of the budget in all; the "
        f"answer has {cost_name} {answer:.3g} (give {give} to keep it all for the answer)",
        *out.get("warnings", ())]
    return out


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


def _aimed_at(auto_plan: AutoPlan, factors: FloatArray | None, magnitude: int | None,
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

    Why. Amin et al.'s point (the module docstring) is where the marginal bias the cap
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


def _tail_said(tail: FloatArray | None, r: int) -> str:
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


def choose_unit_rows(auto_plan: AutoPlan, stats: Profile, source: RandomSource | None
                     ) -> int:
    """``bounding="unit"``'s cap M on a unit's rows in all: permute-and-flip over
    ``UNIT_ROW_CANDIDATES`` (eight steps an octave) with the penalties of the module
    docstring (``_penalties``, ramp ``UNIT_ROW_LAMBDA``, capped at ``CAP`` times the floor),
    the statistic U(M) the units with more than M rows (``Profile.unit_rows``, exact on the
    grid), the target ``ROW_FACTOR`` G s: Amin et al.'s point, where the rows the cap
    removes per unit of M (the U(M) units beyond it lose one each) meet the noise's rate (G
    partitions, each with noise of standard deviation s M). One unit moves U by at most 1,
    so each penalty too."""
    epsilon = auto_plan.epsilons[OUTER]
    caps = UNIT_ROW_CANDIDATES
    target = ROW_FACTOR * auto_plan.target(1, per_partition=False)
    cap = CAP * auto_plan.floor(OUTER, len(caps))
    penalties = _penalties(stats.unit_rows(caps), caps, target, cap, epsilon, UNIT_ROW_LAMBDA)
    return int(caps[_release(-penalties, epsilon, source)])


def choose_unit_sum(auto_plan: AutoPlan, stats: Profile, column: int, name: str,
                    source: RandomSource | None) -> float:
    """``bounding="unit"``'s cap V on a unit's sum of |value| of ``name`` (the profile's
    ``column``-th of the sums), as ``choose_unit_rows`` chooses M, over ``MAGNITUDES``
    (steps of 2^(1/4) up to ``MAX_UNIT_SUM``, where the profile's units' sums are exact), the
    target ``UNIT_SUM_FACTOR`` G s: a unit above V is divided by a power of two
    (``dpcurator.query.bounding``), losing at least half of its sum, more than the linear
    loss Amin et al.'s rule assumes, so V aims higher than M does."""
    choice = f"{OUTER_SUM}:{name}"
    epsilon = auto_plan.epsilons[choice]
    target = UNIT_SUM_FACTOR * auto_plan.target(1, per_partition=False)
    cap = CAP * auto_plan.floor(choice, len(MAGNITUDES))
    penalties = _penalties(stats.unit_sums(column), MAGNITUDES, target, cap, epsilon, LAMBDA)
    return float(MAGNITUDES[_release(-penalties, epsilon, source)])


def unit_thin_threshold(auto_plan: AutoPlan) -> tuple[float, float]:
    """``bounding="unit"``'s thin-data rule (``unit_thin``): (its threshold, the floor F of a
    unit's sum's choice), as ``thin_threshold`` with that choice's F and target; with no sum,
    the cap on a unit's rows' (``unit_rows_threshold``). Public numbers only."""
    name = next((n for n in auto_plan.epsilons if n.startswith(f"{OUTER_SUM}:")), None)
    if name is None:
        return unit_rows_threshold(auto_plan), auto_plan.floor(OUTER, len(UNIT_ROW_CANDIDATES))
    floor = auto_plan.floor(name, len(MAGNITUDES))
    return _threshold(floor, UNIT_SUM_FACTOR * auto_plan.target(1, per_partition=False)), floor


def unit_rows_threshold(auto_plan: AutoPlan) -> float:
    """The units ``bounding="unit"``'s cap on a unit's rows needs to be chosen from the
    data, as ``unit_thin_threshold`` for the sums: with fewer, its statistic is within the
    noise of every candidate's, and the cap chosen may cut most rows unseen (300 units of 10
    rows at epsilon 0.3: M of 1 to 12, a count of 296 to 3,600 against 3,000 with an
    interval about the capped count). Public numbers only; ``unit_thin``'s count checks it."""
    floor = auto_plan.floor(OUTER, len(UNIT_ROW_CANDIDATES))
    return _threshold(floor, ROW_FACTOR * auto_plan.target(1, per_partition=False))


def unit_thin(auto_plan: AutoPlan, stats: Profile, source: RandomSource | None
              ) -> tuple[bool, bool, int | None, str | None]:
    """The thin-data rule of ``bounding="unit"``'s caps (whether the widest caps on a unit's
    sums replace those chosen, whether the widest cap on its rows does, the noisy count or
    None, a warning or None), as ``thin_rule``'s for the clamps: the least, over the summed
    columns, of the units whose sum of |value| of the column is nonzero (``Profile.unit_sums``
    at the lowest magnitude), or with no sum the units with a row (``Profile.unit_rows``
    above 0). Each count moves by at most 1 when a unit is added or removed, so their least
    does too. (It read the first column alone: a second column summed over 150 of 20,000
    units got a cap of 1e-6, an answer near zero with a tight interval; a bug hunt.) Made
    noisy by the discrete Laplace mechanism with the ``units``
    choice's epsilon. Below ``unit_thin_threshold`` the lowest caps score as well as the
    data's and the caps chosen fall near zero: an answer about zero with a tight interval (a
    bug hunt: 300 units at epsilon 1, caps of 5e-6 on sums of thousands, in 10 of 10
    releases, nothing said). The widest caps (``MAX_UNIT_SUM``) replace them then
    (post-processing), and the release says so; below ``THIN_WARN`` F the caps chosen are
    kept with a warning. The cap on a unit's rows is the widest (``UNIT_ROW_CANDIDATES``'
    last) where the same count is below its own threshold (``unit_rows_threshold``):
    post-processing too."""
    threshold, floor = unit_thin_threshold(auto_plan)
    sums = bool(auto_plan.auto.unit_sums)
    rows = OUTER in auto_plan.epsilons
    rows_threshold = unit_rows_threshold(auto_plan) if rows else -math.inf
    cut = (f"the cap on each unit's rows chosen beside them cannot locate a tail of fewer "
           f"than about {auto_plan.floor(OUTER, len(UNIT_ROW_CANDIDATES)):,.0f} units "
           "either, and rows beyond it are cut unseen (give max_unit_rows)") if rows else ""
    widest_rows = (f"the widest cap on each unit's rows ({UNIT_ROW_CANDIDATES[-1]:,}) was "
                   "used, so the answer is as uncertain as its interval says: give "
                   "max_unit_rows, or raise epsilon, or the share of it spent choosing it "
                   "(bounds_share)")
    if sums:
        each = " of each column summed" if len(auto_plan.auto.unit_sums) > 1 else ""
        widest = (f"too few units for epsilon to choose the caps on each unit's sum from the "
                  f"data (the choice needs about {threshold:,.0f} units' worth with a nonzero "
                  f"sum{each}, a unit spread over more than 8 partitions weighing 1/2 to 1); the "
                  f"widest caps ({MAX_UNIT_SUM:.3g}) were used, so the answer is as uncertain "
                  "as its interval says: give max_unit_sums, or raise epsilon, or the share "
                  "of it spent choosing them (bounds_share)")
    else:
        widest = (f"too few units for epsilon to choose the cap on each unit's rows from the "
                  f"data (the choice needs about {threshold:,.0f} units' worth, a unit spread "
                  f"over more than 8 partitions weighing 1/2 to 1); {widest_rows}")
    epsilon = auto_plan.epsilons[UNITS]
    if 1.0 / epsilon > MAX_NOISE_SCALE:
        return sums, rows, None, widest + (f"; {widest_rows}" if sums and rows else "")
    count = math.floor(min(stats.unit_sums(c)[0] for c in range(len(auto_plan.auto.unit_sums)))
                       if sums else stats.unit_rows([0])[0])
    noisy = int(DiscreteLaplace(epsilon=epsilon, source=source).release(count))
    rows_widest = noisy < rows_threshold
    if noisy < threshold:
        if sums and rows:
            widest += f"; {widest_rows}" if rows_widest else f"; {cut}"
        return sums, rows_widest, noisy, widest
    if rows_widest:  # a sum's threshold below the rows' (not with this module's constants)
        return False, True, noisy, widest_rows
    if noisy < THIN_WARN * floor:
        what = ("the caps on each unit's total chosen from the data cannot locate a tail of "
                f"fewer than about {floor:,.0f} units; units beyond them are cut unseen (give "
                "max_unit_rows and max_unit_sums to be sure)") if sums else (
                "the cap on each unit's rows chosen from the data cannot locate a tail of "
                f"fewer than about {floor:,.0f} units; rows beyond it are cut unseen (give "
                "max_unit_rows to be sure)")
        worth = " with a nonzero sum" if sums else ""
        return False, False, noisy, (
            f"thin data for this epsilon (about {max(noisy, 0):,} units' worth{worth}): "
            + what)
    return False, False, noisy, None


def _with_unit_caps(auto_plan: AutoPlan, plan: Plan, chosen: dict[str, Any], stats: Profile,
                    source: RandomSource | None) -> tuple[Plan, dict[str, Any]]:
    """The plan with ``bounding="unit"``'s caps chosen (``choose_unit_rows``,
    ``choose_unit_sum``), each SUM's bounds the clamp [-V, V] its values get; the caps the
    widest where the data is thin (``unit_thin``)."""
    auto = auto_plan.auto
    thin = unit_thin(auto_plan, stats, source) if UNITS in auto_plan.epsilons else None
    if auto.unit_rows:
        chosen[OUTER] = UNIT_ROW_CANDIDATES[-1] if thin is not None and thin[1] else \
            choose_unit_rows(auto_plan, stats, source)
        plan = plan.replace(max_unit_rows=chosen[OUTER])
    sums = dict(plan.max_unit_sums)
    for index, column in enumerate(auto.unit_sums):  # the stated rule, or the choice
        sums[column] = float(MAX_UNIT_SUM) if thin is not None and thin[0] else \
            choose_unit_sum(auto_plan, stats, index, column, source)
    if thin is not None:
        chosen["units"] = thin[2]
        chosen["rule"] = "widest" if thin[0] or thin[1] else "chosen"
        if thin[3]:
            chosen["warnings"] = [*chosen.get("warnings", ()), thin[3]]
    top = _at_the_top(auto, chosen, sums, thin)
    if top:
        chosen["warnings"] = [*chosen.get("warnings", ()), *top]
    if auto.unit_sums:
        chosen["max_unit_sums"] = {c: sums[c] for c in auto.unit_sums}
    aggregates = _clamped_by_caps(plan, sums)
    if "method" not in chosen:
        cost = "rho" if auto_plan.request.rho is not None else "epsilon"
        chosen[cost] = auto_plan.spent
        chosen["share"] = auto.spent_share
    chosen["unit_method"] = (
        "permute-and-flip over the caps on each unit's total (Amin et al. 2019's "
        "bias-variance rule, penalties ramping above it); epsilons " +
        ", ".join(f"{n} {v:.3g}" for n, v in auto_plan.epsilons.items()
                  if n in outer_names(auto)))
    return plan.replace(aggregates=aggregates, max_unit_sums=tuple(sums.items())), chosen


def _at_the_top(auto: AutoBounds, chosen: dict[str, Any], sums: dict[str, float],
                thin: tuple[bool, bool, int | None, str | None] | None) -> list[str]:
    """What a cap chosen at the largest candidate says: units beyond it may have been cut
    (the thin-data rule's widest caps say so themselves). 700 units of values 1e15 got the
    cap 2^40 on each unit's sum and an answer of 6.9e14 with a tight interval where the
    truth is 5e18, with nothing said (a bug hunt); the caps per group said so already."""
    out = []
    if auto.unit_rows and chosen.get(OUTER) == UNIT_ROW_CANDIDATES[-1] and \
            not (thin is not None and thin[1]):
        out.append(f"the cap on each unit's rows chosen from the data is the largest the "
                   f"choice can pick ({UNIT_ROW_CANDIDATES[-1]:,}): rows beyond it, if any, "
                   "were cut")
    top = [c for c in auto.unit_sums if sums[c] >= MAX_UNIT_SUM and
           not (thin is not None and thin[0])]
    if top:
        out.append(f"the cap on each unit's sum of |{', '.join(top)}| chosen from the data is "
                   f"the largest the choice can pick ({MAX_UNIT_SUM:.3g}): values beyond it "
                   "were clamped and larger sums divided, so the answer may be far below the "
                   "truth; for values this large ask for bounding='rescale' with bounds")
    return out


def _clamped_by_caps(plan: Plan, sums: dict[str, float]) -> tuple[Any, ...]:
    """The plan's aggregates, each SUM of a column in ``sums`` clamped to [-V, V] by its cap
    V (``bounding="unit"``: the unit's sum of |value| is capped at V)."""
    return tuple(type(a)(a.column, Bounds(-sums[a.column], sums[a.column]), a.name)
                 if isinstance(a, Sum) and a.column in sums else a for a in plan.aggregates)


def defers_unit_caps(plan: Plan) -> bool:
    """Whether ``bounding="unit"``'s caps are chosen after the private selection of the keys
    (``choose_unit_caps``): where the keys are private and a cap is left to the data. Their
    targets count the G partitions whose noise the answer pays (``AutoPlan.target``); before
    the selection G is unknown, and a choice aiming at one partition lands above the best
    cap wherever several are released (TPC-H's count by market segment, five released: caps
    of 140 to 198 rows where 128 is best). Not where a COUNT(*) selects the keys
    (``count_selects``): its noisy count under the cap M is the selection, so M comes first,
    aimed at one partition. Public numbers only."""
    auto = plan.auto
    return plan.bounding == "unit" and plan.private_keys and auto is not None and \
        bool(outer_names(auto)) and not count_selects(plan)


def count_selects(plan: Plan) -> bool:
    """Whether ``bounding="unit"``'s private keys are selected by the query's noisy COUNT(*)
    (``_compile._threshold_candidate``: where it has one, each unit kept to its first k
    partitions) rather than by a separate step with its own share of epsilon. Public numbers
    only."""
    return plan.bounding == "unit" and plan.private_keys and \
        any(type(a) is Count for a in plan.aggregates)


def widest_unit_caps(plan: Plan, auto: AutoBounds) -> Plan:
    """The plan with ``auto``'s caps on each unit's total at the widest candidates, which the
    candidates' proof compiled (``_candidates``): the first pass of a query whose caps are
    chosen after the selection (``defers_unit_caps``). Only the selection reads that pass,
    and a unit's selection count does not depend on these caps
    (``dpcurator.query.bounding``, stage 3, ``select``)."""
    sums = dict(plan.max_unit_sums)
    for column in auto.unit_sums:
        sums[column] = float(MAX_UNIT_SUM)
    aggregates = _clamped_by_caps(plan, sums)
    rows = UNIT_ROW_CANDIDATES[-1] if auto.unit_rows else plan.max_unit_rows
    return plan.replace(aggregates=aggregates, max_unit_rows=rows,
                        max_unit_sums=tuple(sums.items()))


def choose_unit_caps(auto_plan: AutoPlan, plan: Plan, chosen: dict[str, Any],
                     profile: Sequence[tuple[Any, ...]], partitions: int,
                     source: RandomSource | None) -> tuple[Plan, dict[str, Any]]:
    """``bounding="unit"``'s caps chosen once the private selection released ``partitions``
    keys (``defers_unit_caps``): as ``_with_unit_caps`` chooses them, with G that number
    (at least 1) instead of 1. The choices spend the epsilons they always had; G, an output
    of the selection (a mechanism of its own), only moves their targets: the choices run
    after it, on the same profile, and compose with it as before (adaptive composition)."""
    aimed = replace(auto_plan, partitions=max(1, partitions))
    plan, chosen = _with_unit_caps(aimed, plan, chosen, Profile(profile), source)
    chosen["unit_method"] += (f"; aimed at the {partitions:,} partitions the selection "
                              "released")
    return plan, chosen


def _with_outer(auto_plan: AutoPlan, plan: Plan, chosen: dict[str, Any], stats: Profile,
                source: RandomSource | None, defer_unit_caps: bool = False
                ) -> tuple[Plan, dict[str, Any]]:
    """The plan with a total interval's outer cap chosen, when asked (``choose_outer``), or
    ``bounding="unit"``'s caps (``_with_unit_caps``; the widest, for now, where they are
    chosen after the keys: ``defer_unit_caps``)."""
    auto = auto_plan.auto
    if not outer_names(auto):
        return plan, chosen
    if plan.bounding == "unit":
        if defer_unit_caps:
            return widest_unit_caps(plan, auto), chosen
        return _with_unit_caps(auto_plan, plan, chosen, stats, source)
    cost = "rho" if auto_plan.request.rho is not None else "epsilon"
    if auto.unit_rows:  # never below the inner caps, chosen or given (``choose_outer``)
        outer = choose_outer(auto_plan, stats, source, inner_unit_rows(plan))
        chosen[OUTER] = outer
        plan = plan.replace(max_unit_rows=outer)
    sums = dict(plan.max_unit_sums)
    for index, column in enumerate(auto.unit_sums):
        sums[column] = choose_outer_sum(auto_plan, stats, index, column, source,
                                        inner_unit_sum(plan, column))
    if auto.unit_sums:
        chosen["max_unit_sums"] = {c: sums[c] for c in auto.unit_sums}
    chosen[f"outer_caps_{cost}"] = auto_plan.outer  # what choosing them cost, in all
    return plan.replace(max_unit_sums=tuple(sums.items())), chosen
