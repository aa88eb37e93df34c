"""Mironov's floating-point attack (CCS 2012) wins against textbook Laplace, not against ours.

numpy's ``Generator.laplace`` computes loc + scale * log(2U) (or loc - scale * log(2 - 2U))
from a uniform double U on the grid k * 2^-53. The set of doubles it can output depends on
loc: many doubles that loc = 1 produces can never come out for loc = 0. An attacker who sees
one such output knows for certain that loc was 1 -- an infinite privacy loss, whatever scale
is used. dpcurator's Laplace outputs multiples of one power-of-two grid step whatever the
input, so the same certificate never appears.

Both samplers are put through the same exact audit of the attack's event E = "numpy's
loc = 0 sampler cannot output this double" (``refutes_epsilon``): any epsilon-DP mechanism M
on neighbours 0 and 1 has P[M(1) in E] <= e^epsilon P[M(0) in E] (and the same with 0 and 1
swapped, and for the complement of E), and the audit rejects that inequality only when
Clopper-Pearson bounds on the two probabilities contradict it. Every threshold below is
derived from a binomial distribution; each test states its false-failure probability.

The tests use fixed seeds, so they are deterministic and cannot flake; the probabilities
stated are those of failing for a seed drawn at random.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from scipy import stats

from dpcurator.mechanisms.laplace import Laplace
from dpcurator.noise import SeededRandom

GRID = 2.0**-53
DRAWS = 3000  # outputs drawn from each input, in both tests

# P_CERTIFICATE_LOWER: a lower bound on p, the probability that numpy's Laplace(loc=1, scale=1)
# outputs a double that Laplace(loc=0, scale=1) can never output (a certificate). p is a fixed
# property of numpy's sampler and the platform's log. Measured once: 10^6 draws of
# np.random.default_rng(53).laplace(1.0, 1.0) gave 800,534 certificates (p-hat = 0.8005);
# the one-sided Clopper-Pearson lower bound at level 1 - 1e-9 is
# scipy.stats.beta.ppf(1e-9, 800534, 199467) = 0.79813, rounded down here. (Reproduce with
# ``count_flagged(np.random.default_rng(53).laplace(1.0, 1.0, 10**6))``, about 12 seconds.)
P_CERTIFICATE_LOWER = 0.798
# The attack must prove loc = 1 from at least this many of the DRAWS outputs of loc = 1.
# P[Binomial(3000, 0.798) < 2250] = 7.8e-11 (exact binomial tail; checked in the test).
MIN_CERTIFICATES = 2250


def numpy_laplace_output(k: int, loc: float) -> float:
    """numpy's random_laplace (scale 1) for the uniform double U = k * 2^-53."""
    u = k * GRID
    if u >= 0.5:
        return loc - math.log(2.0 - u - u)
    return loc + math.log(u + u)


def possible_under_loc0(y: float) -> bool:
    """Can numpy's Laplace(loc=0, scale=1) output exactly y? (monotone binary search over U)."""
    lo, hi = (2**52, 2**53 - 1) if y >= 0 else (1, 2**52 - 1)
    while lo < hi:  # smallest k with output(k) >= y; the output is non-decreasing in k
        mid = (lo + hi) // 2
        if numpy_laplace_output(mid, 0.0) >= y:
            hi = mid
        else:
            lo = mid + 1
    return numpy_laplace_output(lo, 0.0) == y


def count_flagged(outputs: Iterable[float]) -> int:
    """How many outputs fall in E: impossible for numpy's loc = 0 sampler."""
    return sum(not possible_under_loc0(float(y)) for y in outputs)


def refutes_epsilon(k_a: int, n_a: int, k_b: int, n_b: int, epsilon: float,
                    alpha: float) -> bool:
    """Do the counts refute P[M(a) in E] <= e^epsilon P[M(b) in E]?

    k_a of n_a independent outputs of M(a) fell in E, k_b of n_b outputs of M(b). The answer
    is True when the one-sided Clopper-Pearson lower bound on P[M(a) in E] (level alpha / 2)
    exceeds e^epsilon times the upper bound on P[M(b) in E] (level alpha / 2). If the
    inequality holds, a True answer needs one of the two bounds to miss its probability:
    probability at most alpha / 2 + alpha / 2 = alpha (exact, for every pair of probabilities).
    """
    lower_a = 0.0 if k_a == 0 else float(stats.beta.ppf(alpha / 2, k_a, n_a - k_a + 1))
    upper_b = 1.0 if k_b == n_b else float(stats.beta.isf(alpha / 2, k_b + 1, n_b - k_b))
    return lower_a > math.exp(epsilon) * upper_b


def test_attack_wins_against_textbook_floating_point_laplace() -> None:
    """numpy's sampler at scale 1 (nominally 1-DP for sensitivity 1) leaks loc with certainty.

    False-failure probability (for a random seed) below 1e-10 (given p >= 0.798, a bound that
    is itself wrong with probability at most 1e-9, once, not per run):
    - no output of loc = 0 is flagged: probability 1, since ``possible_under_loc0`` replays
      numpy's own arithmetic on every uniform it can draw;
    - at least MIN_CERTIFICATES = 2250 of the 3000 outputs of loc = 1 are flagged: the count
      is Binomial(3000, p) with p >= 0.798, so it falls short with probability at most
      P[Binomial(3000, 0.798) <= 2249] = 7.8e-11 (exact tail, asserted below);
    - the audit refutes epsilon = 1: with no loc = 0 output flagged, the Clopper-Pearson upper
      bound on P[M(0) in E] at level 5e-8 is 1 - (5e-8)^(1/3000) = 0.0056, and e times that is
      0.0152; 2250 or more flagged outputs of loc = 1 put the lower bound on P[M(1) in E] at
      0.706 or more, far above. So this check fails only when the previous one does.
    """
    tail = stats.binom.cdf(MIN_CERTIFICATES - 1, DRAWS, P_CERTIFICATE_LOWER)
    assert tail < 1e-10, tail  # the stated false-failure probability of the threshold
    rng = np.random.default_rng(2012)
    from_zero = rng.laplace(0.0, 1.0, size=DRAWS)
    from_one = rng.laplace(1.0, 1.0, size=DRAWS)
    # The attack never accuses loc = 0 wrongly: every output of loc = 0 is possible under 0.
    flagged_zero = count_flagged(from_zero)
    assert flagged_zero == 0, flagged_zero
    # ...and it proves loc = 1 from a large share of loc = 1's outputs.
    certain = count_flagged(from_one)
    assert certain >= MIN_CERTIFICATES, certain
    # No epsilon could explain that: the exact audit refutes epsilon = 1 (indeed any epsilon).
    assert refutes_epsilon(certain, DRAWS, flagged_zero, DRAWS, epsilon=1.0, alpha=1e-7)


def test_attack_finds_no_certificate_against_dpcurator_laplace() -> None:
    """dpcurator's 1-DP Laplace passes the same audit that catches numpy's sampler.

    False-failure probability (for a random seed) at most 1e-7:
    - the grid check is deterministic: every output is a multiple of the mechanism's one grid
      step (probability 1, whatever the noise);
    - the audit of the attack's event E and of its complement, in both directions (four
      inequalities P[M(a) in F] <= e P[M(b) in F], each true for a 1-DP mechanism on the
      neighbouring inputs 0 and 1), refutes a true inequality with probability at most
      alpha = 2.5e-8 each (``refutes_epsilon``, exact Clopper-Pearson), so at most
      4 * 2.5e-8 = 1e-7 in all (union bound).
    The audit still has power: a sampler whose support depended on the input, like numpy's,
    flags no output of 0 and most outputs of 1, and is refuted as in the test above.
    """
    mech = Laplace(epsilon=1.0, sensitivity=1.0, source=SeededRandom(2012))
    g = mech.granularity
    from_zero = mech.release(np.zeros(100_000))
    from_one = mech.release(np.ones(100_000))
    # Whatever the input, outputs are multiples of the same grid step: the support does not
    # depend on the data, so no output is impossible under either input.
    for out in (from_zero, from_one):
        assert np.all(np.round(out / g) * g == out)
    # The textbook sampler's support test flags outputs of both inputs (it knows nothing of
    # the grid), at rates within the factor e^epsilon that the guarantee allows.
    in_e = {0: count_flagged(from_zero[:DRAWS]), 1: count_flagged(from_one[:DRAWS])}
    for a, b in ((0, 1), (1, 0)):
        for k_a, k_b in ((in_e[a], in_e[b]), (DRAWS - in_e[a], DRAWS - in_e[b])):
            assert not refutes_epsilon(k_a, DRAWS, k_b, DRAWS, epsilon=mech.epsilon,
                                       alpha=2.5e-8), (a, b, in_e)
