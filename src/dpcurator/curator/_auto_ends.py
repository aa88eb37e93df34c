"""A column's signs, and a mean's floor or ends: the clamp's choices after its magnitude
(``dpcurator.curator._auto_bounds``).

The signs (``sign_scores``). Each further column's magnitude is its own permute-and-flip,
with the k chosen. Then each column's signs: [0, M] scores minus the negative values, [-M,
0] minus the positive ones, [-M, M] minus a fixed price ln(3 / beta) / epsilon with beta =
``BETA_BOUNDED`` (twice the width: twice the noise of a mean); adding a unit lowers or keeps
each of these scores, so the choice is monotonic (permute-and-flip with half the noise:
Ding, Kifer, Wang and Zhang 2021). Weights in the budget: 1 per cap and 2 per magnitude
(summed for the joint choice), 1 per column's signs, 1/2 per mean's floor or ends (below;
taken from its column's signs, which keep 1/2) and 1 for the thin-data rule's count (1/4 of
it from the share and 3/4 on top: ``_auto_thin``; and 1/4 for a sum's histogram, on top:
``_auto_aims``; and 1/4 for the row cap's tail, on top: ``_auto_aims``). The signs weigh 1
so that, where the data is not thin (``thin_rule``: its count of values at least 1.25 F), a
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
"""

from __future__ import annotations

import numpy as np

from dpcurator.noise import RandomSource

from ._auto_joint import CAP, magnitude_cap, ramp_penalties, release_index
from ._auto_plan import MAGNITUDES, AutoPlan, FloatArray
from ._profile import Profile

__all__ = ["choose_end", "choose_floor", "end_gate", "end_scores", "floor_gate", "floor_scores",
           "sign_scores", "sign_side"]

#: beta of the sign choice, whose worst candidate costs at most twice the noise
BETA_BOUNDED = 0.05
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
    docstring (``ramp_penalties``) over the widths, the statistic the values each floor raises
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
    penalties = ramp_penalties(series, widths, auto_plan.target(k, per_partition=False), cap,
                               epsilon, FLOOR_LAMBDA)
    return -penalties, floors, epsilon


def end_scores(auto_plan: AutoPlan, stats: Profile, index: int, column: str, magnitude: int,
               r: int, k: int) -> tuple[FloatArray, list[tuple[float, float]], float]:
    """A mean's two-sided clamp's ends, M = ``MAGNITUDES[magnitude]``: (the scores, the
    clamps scored, and the choice's epsilon), for ``choose_end``.

    The candidates are [-L, M] and [-M, L] for L among 0 and the magnitudes up to
    ``FLOOR_STEPS`` steps below M, and [-M, M]: one side's end brought in. Each side is a
    chain of the penalties of the module docstring (``ramp_penalties``) over the widths M + L,
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
        chains.append(ramp_penalties(series, widths, target, cap, epsilon, FLOOR_LAMBDA))
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
    return clamps[release_index(scores, epsilon, source)]


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
    return floors[release_index(scores, epsilon, source)]
