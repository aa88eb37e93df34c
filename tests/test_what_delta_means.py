"""What delta means (issue 16): probabilistic against approximate DP, checked.

- The issue's numbers (Gaussian, Laplace), and the closed forms of Laplace, randomized
  response and name-and-shame over a grid of epsilons, with their inverses.
- pDP implies aDP: delta_aDP(eps) <= delta_pDP(eps) for every mechanism of the package, and
  for compositions, sampled steps, the thresholded histogram and partition selection.
- Grids are never below the truth: exact binomial compositions of randomized response, the
  grid machinery on a Gaussian composition against its closed form, and a Monte Carlo check of
  composed Laplace losses (stated failure probability below 1e-6).
- ``ProbabilisticDP``: conversion, basic composition, refusal by every budget and the curator
  (with the reason), the references' post-processing counterexample (Lalanne, lesson 1,
  Proposition 4), and ``NameAndShame`` never accepted by the curator.
- The thresholded histogram (Escargots) against the curator's partition selection.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from scipy import special, stats

import dpcurator as dp
from dpcurator.accounting import (
    KeepRule,
    ProbabilisticDP,
    ThresholdedHistogram,
    loss_profile,
    pair_deltas,
)
from dpcurator.accounting import _loss_grid as grid
from dpcurator.accounting import events as ev
from dpcurator.accounting._loss_events import Block, LawPair
from dpcurator.accounting._loss_laws import GaussianLaw
from dpcurator.errors import UnsupportedChargeError, UnsupportedEventError, UserError
from dpcurator.ledger import Budget
from dpcurator.mechanisms import NameAndShame
from dpcurator.mechanisms.partition_selection import (
    GaussianThresholdPartitionSelection,
    OptimalPartitionSelection,
)

EPS_GRID = np.concatenate([np.linspace(0.0, 3.0, 61), [0.0986, 1.0986122886681098, 4.0, 8.0]])


# ----------------------------------------------------------------------------- the numbers


def test_gaussian_sigma_one_at_epsilon_one() -> None:
    profile = loss_profile(ev.GaussianEvent(1.0))
    # the figures, to 1e-5
    assert abs(profile.delta_pdp(1.0) - 0.30854) < 1e-5
    assert abs(profile.delta_adp(1.0) - 0.12694) < 1e-5
    # and the closed forms themselves: 1 - Phi(1/2), Phi(-1/2) - e Phi(-3/2)
    assert profile.delta_pdp(1.0) == pytest.approx(1 - special.ndtr(0.5), rel=1e-11)
    exact_adp = special.ndtr(-0.5) - math.e * special.ndtr(-1.5)
    assert profile.delta_adp(1.0) == pytest.approx(exact_adp, rel=3e-9)
    assert profile.exact and profile.delta_adp(1.0) >= exact_adp  # rounded up, never below


def test_gaussian_closed_forms_over_a_grid() -> None:
    for sigma, sensitivity in ((0.7, 1.0), (3.0, 2.0)):
        mu = sensitivity**2 / (2 * sigma**2)
        profile = loss_profile(ev.GaussianEvent(sigma / sensitivity))
        sd = math.sqrt(2 * mu)
        pdp = special.ndtr((mu - EPS_GRID) / sd)
        m = sensitivity / sigma
        adp = special.ndtr(-EPS_GRID / m + m / 2) - np.exp(EPS_GRID) * special.ndtr(
            -EPS_GRID / m - m / 2)
        assert np.allclose(profile.delta_pdp(EPS_GRID), pdp, rtol=1e-9, atol=1e-15)
        assert np.allclose(profile.delta_adp(EPS_GRID), adp, rtol=1e-6, atol=1e-12)
    # k Gaussians with noise s are one with noise s / sqrt(k): the same loss
    four = loss_profile(ev.SelfComposedEvent(ev.GaussianEvent(2.0), 4))
    one = loss_profile(ev.GaussianEvent(1.0))
    assert four.exact
    assert np.allclose(four.delta_pdp(EPS_GRID), one.delta_pdp(EPS_GRID), rtol=1e-12)


def test_laplace_scale_one_at_epsilon_half() -> None:
    profile = loss_profile(ev.LaplaceEvent(1.0))
    assert abs(profile.delta_pdp(0.5) - 0.61060) < 1e-5
    assert abs(profile.delta_adp(0.5) - 0.22120) < 1e-5
    assert profile.delta_pdp(0.5) == pytest.approx(1 - math.exp(-0.25) / 2, rel=1e-11)
    assert profile.delta_adp(0.5) == pytest.approx(1 - math.exp(-0.25), rel=1e-11)


@pytest.mark.parametrize(("scale", "sensitivity"), [(1.0, 1.0), (0.7, 2.0), (5.0, 1.0)])
def test_laplace_against_its_closed_forms(scale: float, sensitivity: float) -> None:
    """L = a w.p. 1/2, -a w.p. e^-a / 2, continuous in between (a = sensitivity / scale):
    delta_pDP = 1 - e^(-(a - eps) / 2) / 2 and delta_aDP = 1 - e^((eps - a) / 2) below a."""
    a = sensitivity / scale
    profile = loss_profile(ev.LaplaceEvent(scale / sensitivity))
    below = a > EPS_GRID
    pdp = np.where(below, 1 - np.exp(-(a - EPS_GRID) / 2) / 2, 0.0)
    adp = np.where(below, 1 - np.exp((EPS_GRID - a) / 2), 0.0)
    assert np.allclose(profile.delta_pdp(EPS_GRID), pdp, rtol=1e-10, atol=1e-15)
    assert np.allclose(profile.delta_adp(EPS_GRID), adp, rtol=1e-9, atol=1e-15)
    # the epsilon each reading gives: pDP jumps to 0 at a (the atom), aDP crosses smoothly
    for delta in (1e-6, 0.1, 0.4, 0.55):
        expected_pdp = a + 2 * math.log(2 * (1 - delta)) if delta >= 0.5 else a
        assert profile.epsilon_pdp(delta) == pytest.approx(max(expected_pdp, 0.0), abs=1e-9)
        expected_adp = max(a + 2 * math.log1p(-delta), 0.0)
        assert profile.epsilon_adp(delta) == pytest.approx(expected_adp, abs=1e-9)
        assert profile.delta_adp(profile.epsilon_adp(delta)) <= delta


@pytest.mark.parametrize(("p", "k"), [(0.75, 2), (0.6, 3), (0.9, 5), (0.51, 2)])
def test_randomized_response_against_its_closed_forms(p: float, k: int) -> None:
    """True answer w.p. p, each other w.p. o = (1 - p) / (k - 1): L = eps0 = ln(p / o) w.p. p,
    0 w.p. (k - 2) o, -eps0 w.p. o. Below eps0: delta_pDP = p and delta_aDP = p - e^eps o;
    from eps0 on both are 0 (the atom at eps0 is within eps0)."""
    o = (1 - p) / (k - 1)
    eps0 = math.log(p / o)
    profile = loss_profile(ev.RandomizedResponseEvent(p, k))
    assert profile.neighbouring is dp.Neighbouring.REPLACE
    below = eps0 * (1 - 1e-9) > EPS_GRID
    assert np.allclose(profile.delta_pdp(EPS_GRID), np.where(below, p, 0.0), rtol=1e-11, atol=0)
    adp = np.where(below, p - np.exp(EPS_GRID) * o, 0.0)
    assert np.allclose(profile.delta_adp(EPS_GRID), adp, rtol=1e-9, atol=1e-15)
    assert profile.delta_pdp(eps0) == 0.0 and profile.delta_adp(eps0) == 0.0
    assert profile.epsilon_pdp(p / 2) == pytest.approx(eps0, rel=1e-12)  # below p: all of eps0
    assert profile.epsilon_pdp(p * (1 + 1e-9)) == 0.0  # (the values are rounded up by 1e-12)
    assert profile.epsilon_adp(p / 2) == pytest.approx(max(math.log(p / 2 / o), 0.0), abs=1e-9)


def test_name_and_shame_both_deltas_are_delta_at_every_epsilon() -> None:
    mechanism = NameAndShame(delta=1e-3)
    profile = loss_profile(mechanism.event)
    grid_eps = np.concatenate([[0.0, 1e-12], EPS_GRID, [50.0, 500.0]])
    assert np.allclose(profile.delta_pdp(grid_eps), 1e-3, rtol=1e-9, atol=0)
    assert np.allclose(profile.delta_adp(grid_eps), 1e-3, rtol=1e-9, atol=0)
    assert np.all(profile.delta_pdp(grid_eps) >= 1e-3)
    assert profile.epsilon_pdp(1e-3 * 1.01) == 0.0 and profile.epsilon_pdp(1e-4) == math.inf
    assert profile.epsilon_adp(1e-4) == math.inf
    # the mechanism states it: (0, delta)-pDP, hence (0, delta)-aDP
    assert mechanism.guarantee == ProbabilisticDP(0.0, 1e-3)
    assert mechanism.guarantee.to_approx_dp() == dp.ApproxDP(0.0, 1e-3)
    # and the PLD accountant reads its event as exactly (0, delta): delta 1e-3 at every eps
    pld = dp.accounting.pld_from_event(mechanism.event)
    assert pld.delta(0.0) == pytest.approx(1e-3, rel=1e-8)
    assert pld.delta(3.0) == pytest.approx(1e-3, rel=1e-8)


def test_name_and_shame_publishes_everything_or_nothing() -> None:
    """Its two outcomes, by an exact binomial test: the number of releases out of n is
    Binomial(n, delta); the test fails for a correct sampler with probability below 2e-7 (each
    tail at 1e-7). The data published is the data given, unchanged."""
    data = np.arange(5)
    mechanism = NameAndShame(delta=0.25)
    outcomes = [mechanism.release(data) for _ in range(4000)]
    named = [o for o in outcomes if o is not None]
    assert all(o is data for o in named)
    count = len(named)
    assert stats.binom.cdf(count, 4000, 0.25) > 1e-7
    assert stats.binom.sf(count - 1, 4000, 0.25) > 1e-7


# ------------------------------------------------------------------- pDP implies aDP


def _package_mechanisms() -> dict[str, ev.DpEvent]:
    """One instance of every mechanism the package exports, as the event of its privacy loss.

    A Gaussian calibrated by rho states a zCDP event, which has no PLD; its noise N(0, s^2)
    with s = 1 / sqrt(2 rho) (per unit of sensitivity) is a Gaussian event with that loss.
    """
    m = dp.mechanisms
    made = {
        "Laplace": m.Laplace(epsilon=1.0, sensitivity=1.0),
        "DiscreteLaplace": m.DiscreteLaplace(epsilon=0.7, sensitivity=2),
        "Gaussian": m.Gaussian(epsilon=1.0, delta=1e-5, sensitivity=1.0),
        "DiscreteGaussian": m.DiscreteGaussian(epsilon=1.0, delta=1e-6, sensitivity=1),
        "RandomizedResponse": m.RandomizedResponse(epsilon=1.0, categories=["a", "b", "c"],
                                                   protocol="generalized"),
        "Exponential": m.Exponential(epsilon=1.0, sensitivity=1.0),
        "PermuteAndFlip": m.PermuteAndFlip(epsilon=1.0, sensitivity=1.0),
        "ReportNoisyMax": m.ReportNoisyMax(epsilon=1.0, sensitivity=1.0),
        "SparseVector": m.SparseVector(epsilon=1.0, sensitivity=1.0, threshold=3.0),
        "NameAndShame": m.NameAndShame(delta=1e-3),
    }
    exported = {name for name in m.__all__ if isinstance(getattr(m, name), type)
                and issubclass(getattr(m, name), m.Mechanism) and name != "Mechanism"}
    assert exported == set(made), "a new mechanism: add it here"
    events = {name: mech.event for name, mech in made.items()}
    events["Gaussian(rho)"] = ev.GaussianEvent(1 / math.sqrt(2 * 0.5))
    assert isinstance(m.Gaussian(rho=0.5, sensitivity=1.0).event, ev.ZCDPEvent)
    for selection in (OptimalPartitionSelection(epsilon=1.0, delta=1e-5),
                      GaussianThresholdPartitionSelection(epsilon=1.0, delta=1e-5,
                                                          max_partitions=3)):
        events[type(selection).__name__] = selection.event
    return events


def _other_events() -> dict[str, ev.DpEvent]:
    sampled = ev.PoissonSampledEvent(0.05, ev.GaussianEvent(1.0))
    return {
        "Gaussian event": ev.GaussianEvent(0.8),
        "Laplace event": ev.LaplaceEvent(0.5),
        "RR 5 categories": ev.RandomizedResponseEvent(0.5, 5),
        "sampled Gaussian": sampled,
        "sampled Laplace": ev.PoissonSampledEvent(0.1, ev.LaplaceEvent(1.0)),
        "sampled discrete Laplace": ev.PoissonSampledEvent(0.2, ev.DiscreteLaplaceEvent(1.0)),
        "sampled name-and-shame": ev.PoissonSampledEvent(0.3, ev.NameAndShameEvent(0.01)),
        "DP-SGD": ev.SelfComposedEvent(sampled, 200),
        "Laplace x 3": ev.SelfComposedEvent(ev.LaplaceEvent(2.0), 3),
        "RR x 7": ev.SelfComposedEvent(ev.RandomizedResponseEvent(0.7), 7),
        "mixed": ev.ComposedEvent((ev.GaussianEvent(2.0), ev.LaplaceEvent(3.0),
                                   ev.PureDPEvent(0.3), ev.ApproxDPEvent(0.2, 1e-4))),
    }


@pytest.mark.parametrize("name", sorted({**_package_mechanisms(), **_other_events()}))
def test_pdp_implies_adp(name: str) -> None:
    event = {**_package_mechanisms(), **_other_events()}[name]
    profile = loss_profile(event)
    pdp = np.asarray(profile.delta_pdp(EPS_GRID))
    adp = np.asarray(profile.delta_adp(EPS_GRID))
    assert np.all(adp <= pdp), (name, (adp - pdp).max())
    assert np.all(np.diff(pdp[:61]) <= 1e-15) and np.all(np.diff(adp[:61]) <= 1e-15)
    assert np.all((pdp >= 0) & (pdp <= 1) & (adp >= 0))


def test_thresholding_and_partition_selection_pdp_imply_adp() -> None:
    curves = [ThresholdedHistogram.for_guarantee(1.0, 1e-5), ThresholdedHistogram(0.5, 2.5),
              KeepRule([float(p) for p in OptimalPartitionSelection(
                  epsilon=1.0, delta=1e-5).table])]
    for curve in curves:
        pdp, adp = np.asarray(curve.delta_pdp(EPS_GRID)), np.asarray(curve.delta_adp(EPS_GRID))
        assert np.all(adp <= pdp)


def test_a_guarantee_alone_is_read_in_the_worst_case() -> None:
    """An eps-DP mechanism's loss can sit just above any t in [0, eps): P[L > t] reaches
    (e^eps - 1) / (e^eps - e^-t), more than its dominating pair's e^eps / (1 + e^eps)."""
    profile = loss_profile(ev.PureDPEvent(1.0))
    t = np.array([0.0, 0.3, 0.9])
    assert np.allclose(profile.delta_pdp(t), (math.e - 1) / (math.e - np.exp(-t)), rtol=1e-11)
    dominating = math.e / (1 + math.e)
    assert np.all(profile.delta_pdp(t) > dominating)
    # a mechanism that reaches it: L = t + 0.001 w.p. p, -1 otherwise, E[e^-L] = 1
    for s in t:
        top = s + 1e-3
        p = (math.e - 1) / (math.e - math.exp(-top))
        first = np.array([p, 1 - p])
        second = first * np.exp(-np.array([top, -1.0]))
        assert second.sum() == pytest.approx(1.0)
        assert pair_deltas(first, second / second.sum(), s)[0] <= profile.delta_pdp(s)
        assert pair_deltas(first, second / second.sum(), s)[0] > dominating


# ------------------------------------------------------------- grids never below the truth


def test_randomized_response_compositions_are_exact_binomials() -> None:
    p, k = 0.7, 9
    eps0 = math.log(p / (1 - p))
    profile = loss_profile(ev.SelfComposedEvent(ev.RandomizedResponseEvent(p), k))
    assert not profile.exact  # a grid, on the atoms' own spacing
    ups = np.arange(k + 1)
    losses = (2 * ups - k) * eps0
    probs = stats.binom.pmf(ups, k, p)
    for e in EPS_GRID:
        above = losses > e + 1e-9
        pdp = probs[above].sum()
        adp = np.sum(probs[above] * -np.expm1(e - losses[above]))
        assert profile.delta_pdp(e) >= pdp - 1e-15
        assert profile.delta_pdp(e) == pytest.approx(pdp, rel=1e-8, abs=1e-14)
        assert profile.delta_adp(e) == pytest.approx(adp, rel=1e-7, abs=1e-14)


def test_the_grid_on_a_gaussian_composition_matches_the_closed_form() -> None:
    """The grid machinery itself (upward single step, FFT power), on 16 Gaussian steps whose
    composition is known exactly: never below it, and close."""
    step = GaussianLaw(0.5 / 4.0**2)
    inner = ev.GaussianEvent(4.0)
    event = ev.SelfComposedEvent(inner, 16)
    block = Block(LawPair.symmetric(step, "test"), 16, inner)
    h, remove, _ = grid.build_upward(event, [block])
    losses = (remove.offset + np.arange(remove.probs.size)) * h
    exact = GaussianLaw(16 * step.mu)
    for e in np.linspace(0.0, 3.0, 31):
        upward = remove.infinity_mass + remove.probs[losses > e + 1e-12].sum()
        truth = float(exact.sf_p(e))
        assert upward >= truth * (1 - 1e-9) - 1e-15
        assert upward <= float(exact.sf_p(e - 16 * h)) + 1e-12  # moved up by at most 16 h


def test_composed_laplace_losses_against_monte_carlo() -> None:
    """Three Laplace mechanisms (scale 1): the grid's P[L > eps] is at least the true one and at
    most the true P[L > eps - 3h] (each step is rounded up by at most h), checked against
    Clopper-Pearson bounds from 10^6 exact draws of the loss (L_i = |x_i| - |x_i - 1|,
    x_i ~ Laplace(1, 1): the output drawn with the unit). Each of the 2 x 7 one-sided bounds
    fails with probability 1e-8 for a correct grid: below 1.4e-7 in all."""
    event = ev.SelfComposedEvent(ev.LaplaceEvent(1.0), 3)
    profile = loss_profile(event)
    law = profile.pdp_law("remove")
    h = float(np.diff(np.unique(law.atoms()[0]))[:10].min())
    rng = np.random.default_rng(20240516)
    x = rng.laplace(1.0, 1.0, size=(1_000_000, 3))
    total = (np.abs(x) - np.abs(x - 1.0)).sum(axis=1)
    n = total.size
    for e in (0.0, 0.4, 0.9, 1.5, 2.0, 2.5, 2.9):
        reported = profile.delta_pdp(e)
        hits = int(np.sum(total > e))
        lower = stats.beta.ppf(1e-8, hits, n - hits + 1) if hits else 0.0
        assert reported >= lower, (e, reported, lower)
        wider = int(np.sum(total > e - 3 * h))
        upper = stats.beta.isf(1e-8, wider + 1, n - wider) if wider < n else 1.0
        assert reported <= upper, (e, reported, upper)


def test_no_probabilistic_reading_from_a_dominating_pair() -> None:
    for event in (ev.SampledWithoutReplacementEvent(10, 100, ev.GaussianEvent(1.0)),
                  ev.PoissonSampledEvent(0.1, ev.PureDPEvent(1.0)),
                  ev.ZCDPEvent(0.5)):
        with pytest.raises(UnsupportedEventError):
            loss_profile(event)


def test_bad_input_names_the_parameter() -> None:
    profile = loss_profile(ev.GaussianEvent(1.0))
    with pytest.raises(ValueError, match="epsilon"):
        profile.delta_pdp(-0.1)
    with pytest.raises(ValueError, match="epsilon"):
        profile.delta_adp(np.array([0.5, math.nan]))
    with pytest.raises(ValueError, match="delta"):
        profile.epsilon_pdp(1.5)
    with pytest.raises(TypeError, match="event"):
        loss_profile("gaussian")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="delta"):
        NameAndShame(delta=0.0)
    with pytest.raises(ValueError, match="delta"):
        ProbabilisticDP(1.0, 1.5)
    with pytest.raises(ValueError, match="epsilon"):
        ProbabilisticDP(-1.0, 0.1)
    with pytest.raises(ValueError, match="threshold"):
        ThresholdedHistogram(1.0, math.inf)
    with pytest.raises(ValueError, match="keep_probabilities"):
        KeepRule([0.0, 0.5, 0.4])


@pytest.mark.parametrize("event", [ev.GaussianEvent(0.9), ev.LaplaceEvent(0.8),
                                   ev.DiscreteGaussianEvent(1.5), ev.PureDPEvent(1.2),
                                   ev.ApproxDPEvent(1.0, 1e-4),
                                   ev.PoissonSampledEvent(0.2, ev.GaussianEvent(0.8))])
def test_inverses_are_the_smallest_epsilon(event: ev.DpEvent) -> None:
    profile = loss_profile(event)
    for delta in (1e-6, 1e-3, 0.05, 0.3):
        for reading, inverse in ((profile.delta_pdp, profile.epsilon_pdp),
                                 (profile.delta_adp, profile.epsilon_adp)):
            eps = inverse(delta)
            if not math.isfinite(eps):
                continue
            assert reading(eps) <= delta
            if eps > 1e-9:
                assert reading(eps * (1 - 1e-7) - 1e-12) > delta


# ------------------------------------------------------------------ ProbabilisticDP


def test_probabilistic_dp_converts_and_composes() -> None:
    g = ProbabilisticDP(0.5, 1e-4)
    assert g.to_approx_dp() == dp.ApproxDP(0.5, 1e-4)
    both = g.compose(ProbabilisticDP(0.25, 2e-4), dp.PureDP(0.25))
    assert both.epsilon >= 1.0 and both.epsilon == pytest.approx(1.0, rel=1e-15)
    assert both.delta >= 3e-4 and both.delta == pytest.approx(3e-4, rel=1e-15)
    assert ProbabilisticDP(1.0, 0.7).compose(ProbabilisticDP(1.0, 0.6)).delta == 1.0
    with pytest.raises(TypeError, match="to_approx_dp"):
        g.compose(dp.ApproxDP(1.0, 1e-5))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="neighbouring"):
        g.compose(ProbabilisticDP(1.0, 0.0, dp.Neighbouring.REPLACE))
    assert "probabilistic" in str(g)


def test_basic_composition_of_pdp_holds_on_real_losses() -> None:
    """Two mechanisms' pDP deltas add up to bound their composition's (the union bound):
    checked on the composed randomized response, whose loss is exactly binomial."""
    one = loss_profile(ev.RandomizedResponseEvent(0.8))
    two = loss_profile(ev.SelfComposedEvent(ev.RandomizedResponseEvent(0.8), 2))
    for e in (0.0, 0.5, 1.0, 1.5):
        assert two.delta_pdp(2 * e) <= 2 * one.delta_pdp(e) + 1e-12


def test_every_budget_refuses_probabilistic_dp_with_the_reason() -> None:
    with pytest.raises(UnsupportedChargeError, match="post-processing") as info:
        Budget(ProbabilisticDP(1.0, 1e-6))
    assert "to_approx_dp" in str(info.value)
    budget = Budget(dp.ApproxDP(2.0, 1e-2))
    with pytest.raises(UnsupportedChargeError, match="not closed under post-processing"):
        budget.charge(NameAndShame(delta=1e-3).guarantee)  # type: ignore[arg-type]
    assert budget.spent.epsilon == 0 and not budget.ledger
    budget.charge(NameAndShame(delta=1e-3).guarantee.to_approx_dp())  # its aDP form is fine
    assert budget.spent.delta == pytest.approx(1e-3)


def test_the_curator_never_accepts_name_and_shame() -> None:
    frame = pd.DataFrame({"user": [1, 2, 3], "x": [1.0, 2.0, 3.0]})
    guarantee = NameAndShame(delta=1e-3).guarantee
    with pytest.raises(UserError):
        dp.Curator(frame, privacy_unit="user", budget=guarantee)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedChargeError, match="post-processing"):
        dp.Curator(frame, privacy_unit="user",
                   budget=Budget(guarantee))  # type: ignore[arg-type]


def test_the_references_post_processing_counterexample() -> None:
    """Lalanne, lesson 1, Proposition 4: K is (eps, delta)-pDP; T merges outputs 0 and 1; then
    T(K) loses more than eps with probability far above delta, while its aDP delta stays at
    delta (approximate DP is closed under post-processing)."""
    eps, delta = 1.0, 0.01
    up, down = math.exp(eps) / (1 + math.exp(eps)), 1 / (1 + math.exp(eps))
    k0 = np.array([delta, up * (1 - delta), down * (1 - delta), 0.0])  # outputs 0, 1, 2, 3
    k1 = np.array([0.0, down * (1 - delta), up * (1 - delta), delta])
    pdp, adp = pair_deltas(k0, k1, eps)
    assert pdp == pytest.approx(delta, rel=1e-12) and adp == pytest.approx(delta, rel=1e-12)
    merge = np.array([[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]])  # T: 0, 1 -> 4; 2; 3
    t0, t1 = k0 @ merge, k1 @ merge
    pdp_after, adp_after = pair_deltas(t0, t1, eps)
    assert t0[0] > math.exp(eps) * t1[0] and t0[0] > delta  # the proposition's two facts
    assert pdp_after == pytest.approx(t0[0], rel=1e-12)  # everything merged into "4" counts
    assert pdp_after > 50 * delta
    assert adp_after <= adp + 1e-15


def test_thresholding_a_laplace_count_raises_its_pdp_not_its_adp() -> None:
    """A second counterexample, in the package's own terms: thresholding is post-processing
    of the Laplace count, yet its probabilistic delta exceeds the Laplace's at some eps."""
    histogram = ThresholdedHistogram(1.0, 3.0)
    laplace = loss_profile(ev.LaplaceEvent(1.0))
    eps = np.linspace(0.0, 0.99, 100)
    p = histogram.new_category_probability
    adp_expected = np.maximum(np.asarray(laplace.delta_adp(eps)), p)
    assert np.allclose(histogram.delta_adp(eps), adp_expected, rtol=1e-9)
    assert np.all(np.asarray(histogram.delta_pdp(eps)) >= np.asarray(laplace.delta_pdp(eps)))
    assert np.any(np.asarray(histogram.delta_pdp(eps)) > np.asarray(laplace.delta_pdp(eps)) + 0.05)


# ---------------------------------------------------- Escargots against partition selection


def _thresholded_pair_by_summation(b: float, tau: float, c: int, eps: float) -> tuple[float,
                                                                                       float]:
    """pDP of the pair (c + 1 units against c) of the thresholded Laplace count, by summing
    over a fine grid of outputs (u = output - c), both orders: an independent computation."""
    u = np.linspace(tau - c, tau - c + 60 * b, 1_200_001)
    du = u[1] - u[0]
    with_unit = np.exp(-np.abs(u - 1) / b) / (2 * b) * du
    without = np.exp(-np.abs(u) / b) / (2 * b) * du
    below_with = stats.laplace.cdf(tau - c - 1, scale=b)
    below_without = stats.laplace.cdf(tau - c, scale=b)
    first = np.concatenate([with_unit, [below_with]])
    second = np.concatenate([without, [below_without]])
    first, second = first / first.sum(), second / second.sum()
    return pair_deltas(first, second, eps)


def test_thresholded_histogram_against_a_direct_summation() -> None:
    b, tau = 1.0, 2.5
    histogram = ThresholdedHistogram(b, tau)
    p = float(stats.laplace.sf(tau - 1, scale=b))
    assert histogram.new_category_probability == pytest.approx(p, rel=1e-12)
    for eps in (0.0, 0.2, 0.5, 0.8, 1.2):
        pairs = [_thresholded_pair_by_summation(b, tau, c, eps) for c in range(1, 12)]
        laplace = loss_profile(ev.LaplaceEvent(b))
        new_pdp = max(p, 1.0 if eps < -math.log1p(-p) else 0.0)
        expected_pdp = max([new_pdp, laplace.delta_pdp(eps)] + [x[0] for x in pairs])
        expected_adp = max([p, laplace.delta_adp(eps)] + [x[1] for x in pairs])
        assert histogram.delta_pdp(eps) == pytest.approx(expected_pdp, abs=2e-4)
        assert histogram.delta_adp(eps) == pytest.approx(expected_adp, abs=2e-4)


def _keep_rule_pdp_exactly(table: tuple[Fraction, ...], eps: float) -> float:
    """max over n and both orders of the probability of the outcomes with loss > eps, on the
    exact rational table (e^eps bracketed by a float: the test keeps away from ties)."""
    grow = Fraction(math.exp(eps))
    best = Fraction(0)
    for before, after in itertools.pairwise(table):
        for p_keep, q_keep in ((after, before), (before, after)):
            p_drop, q_drop = 1 - p_keep, 1 - q_keep
            lost = sum(p for p, q in ((p_keep, q_keep), (p_drop, q_drop)) if p > grow * q)
            best = max(best, Fraction(lost))
    return float(best)


def test_escargots_side_by_side_with_the_curators_partition_selection() -> None:
    """At the same (eps, delta) = (1, 1e-5): the thresholded histogram is (1, 1e-5) under both
    readings; the curator's partition selection is (1, 1e-5)-aDP but loses a little more than
    eps = 1 with probability above 1/2 (its ramp keeps the loss just above eps)."""
    eps, delta = 1.0, 1e-5
    histogram = ThresholdedHistogram.for_guarantee(eps, delta)
    assert histogram.new_category_probability == pytest.approx(delta, rel=1e-9)
    assert histogram.delta_pdp(eps) == pytest.approx(delta, rel=1e-9)
    assert histogram.delta_adp(eps) == pytest.approx(delta, rel=1e-9)
    selection = OptimalPartitionSelection(epsilon=eps, delta=delta)
    rule = KeepRule([float(p) for p in selection.table])
    assert rule.delta_adp(eps) <= delta * (1 + 1e-9)
    assert rule.delta_pdp(eps) > 0.5
    for e in (0.5, 1.0, 1.3, 2.0):
        assert rule.delta_pdp(e) == pytest.approx(_keep_rule_pdp_exactly(selection.table, e),
                                                  rel=1e-9, abs=1e-15)
    # by 2 eps the ramp's losses are behind: the two agree to within a few delta
    assert rule.delta_pdp(2 * eps) < 10 * delta
