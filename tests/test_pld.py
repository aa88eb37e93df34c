"""The PLD accountant against closed forms, exact sums and high-precision integrals.

Every check of a reported delta(eps) is two-sided: the report is never below the exact value
(pessimism) and not far above it (tightness). No test here is statistical.
"""

from __future__ import annotations

import itertools
import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize, special, stats

from dpcurator.accounting import _pld_core as core
from dpcurator.accounting import _pld_sources as srcs
from dpcurator.accounting import events as ev
from dpcurator.accounting._pld_profiles import Direction, GaussianNoise, MixtureProfile
from dpcurator.accounting.guarantees import ApproxDP, Neighbouring
from dpcurator.accounting.pld import (
    PLD,
    PrivacyLossPmf,
    UnsupportedEventError,
    pld_epsilon,
    pld_from_event,
)

# Reported deltas may exceed the exact ones by design; they must never be below them beyond
# floating-point noise in the *exact* reference (relative 1e-10, absolute 1e-15).


def assert_upper_bound(reported: np.ndarray, exact: np.ndarray, rel: float) -> None:
    reported, exact = np.asarray(reported, float), np.asarray(exact, float)
    assert np.all(reported >= exact * (1 - 1e-10) - 1e-15), (reported, exact)
    assert np.all(reported <= exact * (1 + rel) + 1e-12), (reported, exact)


# ----------------------------------------------------------------------------- closed forms


def gaussian_delta(eps: np.ndarray, mu: float) -> np.ndarray:
    """delta of mu-GDP (Dong, Roth and Su 2022, Corollary 2.13), in a stable form."""
    eps = np.asarray(eps, float)
    a = special.log_ndtr(-eps / mu + mu / 2)
    b = eps + special.log_ndtr(-eps / mu - mu / 2)
    return np.exp(a) * -np.expm1(b - a)


def gaussian_epsilon(delta: float, mu: float) -> float:
    return float(
        optimize.brentq(
            lambda e: gaussian_delta(np.array(e), mu) - delta, 0, 100, xtol=1e-14, rtol=1e-14
        )
    )


def rr_composed_delta(eps: float, p: float, k: int, count: int) -> float:
    """Exact delta of count-fold k-ary randomized response (multinomial over the 3 atoms)."""
    other = (1 - p) / (k - 1)
    e0 = math.log(p / other)
    probs = (p, (k - 2) * other, other)
    total = 0.0
    for plus, zero in itertools.product(range(count + 1), repeat=2):
        minus = count - plus - zero
        if minus < 0:
            continue
        loss = (plus - minus) * e0
        if loss <= eps:
            continue
        w = math.comb(count, plus) * math.comb(count - plus, zero)
        w *= probs[0] ** plus * probs[1] ** zero * probs[2] ** minus
        total += w * (1 - math.exp(eps - loss))
    return total


def subsampled_gaussian_delta(eps: float, q: float, sigma: float, direction: str) -> float:
    """Closed form through the crossing point (the loss is monotone in the output)."""
    if direction == "remove":
        x = sigma**2 * math.log((math.expm1(eps) + q) / q) + 0.5
        p_tail = (1 - q) * stats.norm.sf(x / sigma) + q * stats.norm.sf((x - 1) / sigma)
        return p_tail - math.exp(eps) * stats.norm.sf(x / sigma)
    z = math.expm1(-eps) + q
    if z <= 0:
        return 0.0
    x = sigma**2 * math.log(z / q) + 0.5
    q_tail = (1 - q) * stats.norm.cdf(x / sigma) + q * stats.norm.cdf((x - 1) / sigma)
    return stats.norm.cdf(x / sigma) - math.exp(eps) * q_tail


def hockey_stick_integral(eps: float, q: float, sigma: float, direction: str) -> float:
    """The same, as a 30-digit numerical integral of max(0, p - e^eps q)."""
    mpmath.mp.dps = 30
    s, qq, e = mpmath.mpf(sigma), mpmath.mpf(q), mpmath.e ** mpmath.mpf(eps)

    def phi(x: mpmath.mpf, m: float) -> mpmath.mpf:
        return mpmath.npdf(x, m, s)

    def mix(x: mpmath.mpf) -> mpmath.mpf:
        return (1 - qq) * phi(x, 0) + qq * phi(x, 1)

    if direction == "remove":
        integrand = lambda x: max(mix(x) - e * phi(x, 0), 0)  # noqa: E731
        crossing = s**2 * mpmath.log((e - 1 + qq) / qq) + mpmath.mpf(1) / 2
    else:
        integrand = lambda x: max(phi(x, 0) - e * mix(x), 0)  # noqa: E731
        crossing = s**2 * mpmath.log((1 / e - 1 + qq) / qq) + mpmath.mpf(1) / 2
    points = sorted([-40, -5, 0, 0.5, 1, 5, 40, crossing])
    return float(mpmath.quad(integrand, points))


# ----------------------------------------------------------------------------- Gaussian


@pytest.mark.parametrize("sigma", [0.7, 1.0, 3.0])
def test_gaussian_single_step_is_a_tight_upper_bound(sigma: float) -> None:
    pld = PLD.from_gaussian(sigma)
    assert pld.is_symmetric
    eps = np.linspace(0, 6, 41)
    assert_upper_bound(pld.delta(eps), gaussian_delta(eps, 1 / sigma), rel=1e-3)


@pytest.mark.parametrize(("sigma", "k"), [(1.0, 4), (2.0, 25), (5.0, 400)])
def test_k_gaussians_compose_to_one_with_sigma_over_root_k(sigma: float, k: int) -> None:
    composed = PLD.from_gaussian(sigma).self_compose(k)
    mu = math.sqrt(k) / sigma
    eps = np.linspace(0, 3 * mu + 3, 31)
    assert_upper_bound(composed.delta(eps), gaussian_delta(eps, mu), rel=5e-3)
    exact = gaussian_epsilon(1e-6, mu)
    assert exact <= composed.epsilon(1e-6) <= exact * 1.002


def test_sensitivity_scales_like_sigma() -> None:
    a = PLD.from_gaussian(2.0, sensitivity=2.0, value_discretization_interval=0.01)
    b = PLD.from_gaussian(1.0, value_discretization_interval=0.01)
    np.testing.assert_allclose(a.delta(np.arange(5.0)), b.delta(np.arange(5.0)), rtol=1e-12)


def test_self_compose_agrees_with_repeated_compose() -> None:
    one = PLD.from_gaussian(1.5, sampling_rate=0.3, value_discretization_interval=2e-3)
    repeated = one.compose(one).compose(one).compose(one)
    powered = one.self_compose(4)
    eps = np.linspace(0, 4, 21)
    np.testing.assert_allclose(repeated.delta(eps), powered.delta(eps), rtol=1e-8, atol=1e-14)


# ----------------------------------------------------------------------------- exact atoms


@pytest.mark.parametrize(("p", "k", "count"), [(0.75, 2, 1), (0.75, 2, 10), (0.6, 5, 7)])
def test_randomized_response_composes_to_the_exact_multinomial_curve(
    p: float, k: int, count: int
) -> None:
    pld = PLD.from_randomized_response(p, categories=k).self_compose(count)
    assert pld.neighbouring is Neighbouring.REPLACE
    e0 = math.log(p * (k - 1) / (1 - p))
    for eps in [0.0, 0.3 * e0, e0, 2.5 * e0, count * e0 - 1e-3]:
        exact = rr_composed_delta(eps, p, k, count)
        assert_upper_bound(np.array(pld.delta(eps)), np.array(exact), rel=1e-8)
    assert pld.delta(count * e0) == 0.0


def test_pure_dp_has_no_delta_at_its_epsilon() -> None:
    pld = PLD.from_pure_dp(0.8)
    assert pld.delta(0.8) == 0.0
    assert np.all(pld.delta(np.array([0.8, 1.0, 5.0])) == 0.0)
    assert pld.epsilon(0.0) == pytest.approx(0.8, rel=1e-12)
    assert pld.self_compose(5).delta(4.0) == 0.0
    assert pld.self_compose(5).epsilon(0.0) == pytest.approx(4.0, rel=1e-12)


def test_approx_dp_composes_like_kairouz_oh_viswanath() -> None:
    eps0, d0, count = 0.5, 1e-4, 6
    pld = PLD.from_approx_dp(eps0, d0).self_compose(count)
    p = math.exp(eps0) / (1 + math.exp(eps0))
    for eps in [0.0, 0.5, 1.5, 2.9]:
        j = np.arange(count + 1)
        losses = (2 * j - count) * eps0
        rr = float(np.sum(stats.binom.pmf(j, count, p) * np.maximum(0, -np.expm1(eps - losses))))
        exact = 1 - (1 - d0) ** count + (1 - d0) ** count * rr
        assert_upper_bound(np.array(pld.delta(eps)), np.array(exact), rel=1e-8)
    assert pld.epsilon(1 - (1 - d0) ** count) == pytest.approx(count * eps0, rel=1e-9)


@pytest.mark.parametrize("scale", [0.5, 2.0])
def test_laplace_closed_form(scale: float) -> None:
    pld = PLD.from_laplace(scale)
    e0 = 1 / scale
    eps = np.linspace(0, e0 + 1, 33)
    exact = np.maximum(0, -np.expm1((eps - e0) / 2))
    assert_upper_bound(pld.delta(eps), exact, rel=2e-3)
    assert pld.epsilon(1e-5) == pytest.approx(e0 + 2 * math.log1p(-1e-5), rel=1e-3)


@pytest.mark.parametrize(("scale", "k"), [(1.0, 1), (2.5, 3)])
def test_discrete_laplace_is_exact(scale: float, k: int) -> None:
    pld = PLD.from_discrete_laplace(scale, sensitivity=k)
    z = np.arange(-200, 201)
    pmf = np.exp(-np.abs(z) / scale)
    pmf /= pmf.sum()
    loss = (np.abs(z - k) - np.abs(z)) / scale
    for eps in [0.0, 0.2, 0.9, k / scale - 0.01, k / scale]:
        exact = float(np.sum(pmf * np.maximum(0, -np.expm1(eps - loss))))
        assert_upper_bound(np.array(pld.delta(eps)), np.array(exact), rel=1e-9)


@pytest.mark.parametrize(("sigma", "k"), [(1.0, 1), (3.0, 2)])
def test_discrete_gaussian_matches_exact_sums(sigma: float, k: int) -> None:
    pld = PLD.from_discrete_gaussian(sigma, sensitivity=k)
    z = np.arange(-300, 301)
    pmf = np.exp(-(z**2) / (2 * sigma**2))
    pmf /= pmf.sum()
    loss = (k * k - 2 * k * z) / (2 * sigma**2)
    for eps in [0.0, 0.4, 1.0, 2.5]:
        exact = float(np.sum(pmf * np.maximum(0, -np.expm1(eps - loss))))
        assert_upper_bound(np.array(pld.delta(eps)), np.array(exact), rel=1e-9)


# ----------------------------------------------------------------------------- subsampling


@pytest.mark.parametrize(("q", "sigma"), [(0.01, 1.0), (0.2, 0.8)])
def test_subsampled_gaussian_single_step_against_integral(q: float, sigma: float) -> None:
    pld = PLD.from_gaussian(sigma, sampling_rate=q)
    assert not pld.is_symmetric
    for direction, pmf in (("remove", pld.remove), ("add", pld.add)):
        for eps in [0.0, 0.3 * q, q, 0.5, 2.0]:
            exact = subsampled_gaussian_delta(eps, q, sigma, direction)
            if exact < 1e-9:
                assert pmf.delta(eps) >= 0.0
                continue
            assert_upper_bound(np.array(pmf.delta(eps)), np.array(exact), rel=2e-2)
    # the closed form used above agrees with a 30-digit integral
    for direction in ("remove", "add"):
        closed = subsampled_gaussian_delta(0.5 * q, q, sigma, direction)
        assert closed == pytest.approx(
            hockey_stick_integral(0.5 * q, q, sigma, direction), rel=1e-9
        )


def test_subsampled_laplace_single_step() -> None:
    q, b = 0.1, 1.0
    pld = PLD.from_laplace(b, sampling_rate=q)
    x = np.linspace(-60, 61, 400001)
    dx = x[1] - x[0]
    a = np.exp(-np.abs(x) / b) / (2 * b)
    bb = np.exp(-np.abs(x - 1) / b) / (2 * b)
    mix = (1 - q) * a + q * bb
    for eps in [0.0, 0.02, 0.05, 0.1]:
        remove = float(np.sum(np.maximum(mix - math.exp(eps) * a, 0)) * dx)
        add = float(np.sum(np.maximum(a - math.exp(eps) * mix, 0)) * dx)
        assert pld.remove.delta(eps) >= remove * (1 - 1e-6) - 1e-12
        assert pld.remove.delta(eps) <= remove * 1.05 + 1e-9
        assert pld.add.delta(eps) >= add * (1 - 1e-6) - 1e-12
        assert pld.add.delta(eps) <= add * 1.05 + 1e-9


def test_sampling_without_replacement_is_symmetric_and_matches_poisson_for_positive_eps() -> None:
    h = 1e-3
    wor = PLD.from_gaussian_without_replacement(
        1.0, sample_size=50, population_size=1000, value_discretization_interval=h
    )
    assert wor.neighbouring is Neighbouring.REPLACE and wor.is_symmetric
    poisson = PLD.from_gaussian(1.0, sampling_rate=0.05, value_discretization_interval=h)
    eps = np.linspace(0, 2, 21)
    np.testing.assert_allclose(wor.delta(eps), poisson.remove.delta(eps), rtol=1e-9)
    pmf = wor.remove
    assert pmf.probs.sum() + pmf.infinity_mass == pytest.approx(1.0, abs=1e-12)
    # a valid pair: the second distribution's mass e^-L sums to at most 1
    assert float(np.sum(pmf.probs * np.exp(-pmf.losses))) <= 1 + 1e-12


def test_generic_poisson_subsampling_bounds_the_exact_curve() -> None:
    base = PLD.from_gaussian(1.0, value_discretization_interval=1e-3)
    generic = base.poisson_subsampled(0.1, value_discretization_interval=1e-3)
    for eps in [0.0, 0.05, 0.3, 1.0]:
        exact = subsampled_gaussian_delta(eps, 0.1, 1.0, "remove")
        assert generic.remove.delta(eps) >= exact * (1 - 1e-10)
        assert generic.remove.delta(eps) <= exact * 1.05


# ----------------------------------------------------------------------------- invariants


@settings(max_examples=25, deadline=None)
@given(
    sigma=st.floats(0.5, 5.0),
    k=st.integers(1, 40),
    eps=st.floats(0.0, 8.0),
)
def test_reported_delta_is_never_below_the_exact_gaussian_curve(
    sigma: float, k: int, eps: float
) -> None:
    pld = PLD.from_gaussian(sigma).self_compose(k)
    exact = float(gaussian_delta(np.array(eps), math.sqrt(k) / sigma))
    assert pld.delta(eps) >= exact * (1 - 1e-10) - 1e-15


_mechanisms = st.one_of(
    st.builds(
        lambda s: PLD.from_gaussian(s, value_discretization_interval=0.01), st.floats(0.5, 4.0)
    ),
    st.builds(
        lambda b: PLD.from_laplace(b, value_discretization_interval=0.01), st.floats(0.3, 4.0)
    ),
    st.builds(
        lambda e: PLD.from_pure_dp(e, value_discretization_interval=0.01), st.floats(0.05, 2.0)
    ),
    st.builds(
        lambda s, q: PLD.from_gaussian(s, sampling_rate=q, value_discretization_interval=0.01),
        st.floats(0.5, 4.0),
        st.floats(0.01, 1.0),
    ),
)


@settings(max_examples=30, deadline=None)
@given(a=_mechanisms, b=_mechanisms, delta=st.sampled_from([1e-8, 1e-5, 1e-2]))
def test_composition_never_lowers_epsilon(a: PLD, b: PLD, delta: float) -> None:
    both = a.compose(b)
    assert both.epsilon(delta) >= max(a.epsilon(delta), b.epsilon(delta)) - 1e-9


@settings(max_examples=20, deadline=None)
@given(sigma=st.floats(0.5, 3.0), q=st.floats(0.01, 1.0), count=st.integers(1, 300))
def test_epsilon_is_monotone_in_steps_and_consistent_with_delta(
    sigma: float, q: float, count: int
) -> None:
    one = PLD.from_gaussian(sigma, sampling_rate=q, value_discretization_interval=5e-3)
    eps_count = one.self_compose(count).epsilon(1e-5)
    eps_more = one.self_compose(count + 1).epsilon(1e-5)
    assert eps_more >= eps_count - 1e-9
    assert one.self_compose(count).delta(eps_count) <= 1e-5


def _merged_cells(q: float, sigma: float, direction: str, h: float) -> tuple[np.ndarray, ...]:
    """A PLD *dominated* by the exact one: each grid cell merged into one atom.

    Merging outputs is post-processing, so the atoms (loss ln(P/Q) of the cell, P-mass P) give
    a rigorous lower bound on delta, for compositions too.
    """
    profile = MixtureProfile(GaussianNoise(sigma), q, direction)  # type: ignore[arg-type]
    lo, hi = (-0.06, 4.0) if direction == "remove" else (-4.0, 0.06)
    t = np.arange(lo, hi + h / 2, h)
    cdf_p, sf_p, cdf_q, sf_q = profile.tails(t)
    cell_p = np.concatenate([[cdf_p[0]], np.diff(cdf_p), [sf_p[-1]]])
    cell_q = np.concatenate([[cdf_q[0]], np.diff(cdf_q), [sf_q[-1]]])
    keep = (cell_p > 1e-300) & (cell_q > 1e-300)
    return np.log(cell_p[keep] / cell_q[keep]), cell_p[keep]


@pytest.mark.parametrize("direction", ["remove", "add"])
def test_two_fold_subsampled_gaussian_is_sandwiched(direction: str) -> None:
    q, sigma = 0.05, 0.8
    pld = PLD.from_gaussian(sigma, sampling_rate=q).self_compose(2)
    pmf = pld.remove if direction == "remove" else pld.add
    losses, masses = _merged_cells(q, sigma, direction, 4e-3)
    total = (losses[:, None] + losses[None, :]).ravel()
    weight = (masses[:, None] * masses[None, :]).ravel()
    for eps in [0.0, 0.05, 0.2, 0.6, 1.2]:
        lower = float(np.sum(weight * np.maximum(0, -np.expm1(eps - total))))
        reported = pmf.delta(eps)
        assert reported >= lower
        assert reported <= lower * 1.01 + 1e-12


def test_window_truncation_stays_pessimistic_for_heavy_tails() -> None:
    # a heavy upper tail: loss 3 with tiny mass, composed 60 times on a small grid
    h = 0.5
    probs = np.zeros(9)
    probs[0], probs[1], probs[8] = 0.9, 0.1 - 1e-6, 1e-6  # losses -1.5 .. 2.5 (offset -3)
    pmf = PrivacyLossPmf(h, -3, probs / probs.sum())
    exact = np.array([1.0])
    for _ in range(60):
        exact = np.convolve(exact, pmf.probs)
    exact_pmf = PrivacyLossPmf(h, -3 * 60, exact / exact.sum())
    powered = pmf.self_compose(60, tail_mass_truncation=1e-12)
    eps = np.linspace(0, 40, 81)
    assert np.all(powered.delta(eps) >= exact_pmf.delta(eps) * (1 - 1e-9) - 1e-15)
    np.testing.assert_allclose(powered.delta(eps), exact_pmf.delta(eps), rtol=1e-6, atol=1e-11)


def test_delta_is_vectorized_and_epsilon_inverts_it() -> None:
    pld = PLD.from_gaussian(1.2, sampling_rate=0.05).self_compose(100)
    eps = np.array([[0.1, 0.5], [1.0, 2.0]])
    out = pld.delta(eps)
    assert isinstance(out, np.ndarray) and out.shape == (2, 2)
    assert isinstance(pld.delta(0.5), float)
    for delta in [1e-7, 1e-5, 1e-3]:
        e = pld.epsilon(delta)
        assert pld.delta(e) <= delta
        assert pld.delta(max(e - 1e-6, 0)) > delta or e == 0.0


def test_to_approx_dp() -> None:
    pld = PLD.from_gaussian(1.0, sampling_rate=0.01).self_compose(1000)
    g = pld.to_approx_dp(1e-5)
    assert isinstance(g, ApproxDP)
    assert g.delta == 1e-5 and g.neighbouring is Neighbouring.ADD_REMOVE
    assert g.epsilon == pld.epsilon(1e-5)
    with pytest.raises(ValueError, match="delta"):
        PLD.from_approx_dp(1.0, 1e-3).to_approx_dp(1e-4)


# ----------------------------------------------------------------------------- events


def test_pld_from_event_matches_the_constructors() -> None:
    event = ev.SelfComposedEvent(ev.PoissonSampledEvent(0.02, ev.GaussianEvent(1.1)), 50)
    h = 2e-3
    from_event = pld_from_event(event, value_discretization_interval=h)
    direct = PLD.from_gaussian(1.1, sampling_rate=0.02, value_discretization_interval=h)
    direct = direct.self_compose(50)
    eps = np.linspace(0, 3, 13)
    np.testing.assert_allclose(from_event.delta(eps), direct.delta(eps), rtol=1e-12)


def test_composed_events_group_repeats_and_compose_heterogeneously() -> None:
    g, lap = ev.GaussianEvent(2.0), ev.LaplaceEvent(4.0)
    event = ev.ComposedEvent((g, lap, g, ev.PureDPEvent(0.1), g))
    pld = pld_from_event(event)
    # three Gaussians are one with sigma / sqrt(3); the rest only add loss
    assert pld.epsilon(1e-6) >= gaussian_epsilon(1e-6, math.sqrt(3) / 2.0)
    assert pld.epsilon(1e-6) <= gaussian_epsilon(1e-6, math.sqrt(3) / 2.0) + 0.25 + 0.1 + 0.05


def test_discrete_and_local_events() -> None:
    rr = pld_from_event(ev.SelfComposedEvent(ev.RandomizedResponseEvent(0.75), 10))
    assert rr.neighbouring is Neighbouring.REPLACE
    # 1e-9 of FLOAT_GUARD and the FFT's rounding allowance (about 1e-14 here) on top
    assert rr.delta(1.0) == pytest.approx(rr_composed_delta(1.0, 0.75, 2, 10), rel=2e-9)
    assert rr.delta(1.0) >= rr_composed_delta(1.0, 0.75, 2, 10)
    dl = pld_from_event(ev.DiscreteLaplaceEvent(2.0, 2))
    assert dl.epsilon(0.0) == pytest.approx(1.0, rel=1e-12)
    dg = pld_from_event(ev.DiscreteGaussianEvent(3.0))
    assert dg.epsilon(1e-5) > 0
    assert pld_from_event(ev.ApproxDPEvent(1.0, 1e-6)).epsilon(1e-6) == pytest.approx(1.0)
    wor = pld_from_event(ev.SampledWithoutReplacementEvent(10, 100, ev.GaussianEvent(1.0)))
    assert wor.neighbouring is Neighbouring.REPLACE
    poisson_rr = pld_from_event(ev.PoissonSampledEvent(0.1, ev.PureDPEvent(1.0)))
    assert poisson_rr.epsilon(0.0) == pytest.approx(math.log1p(0.1 * math.expm1(1.0)), rel=2e-3)


def test_unsupported_events_are_refused_clearly() -> None:
    with pytest.raises(UnsupportedEventError, match="zCDP"):
        pld_from_event(ev.ZCDPEvent(0.5))
    with pytest.raises(UnsupportedEventError, match="different neighbouring"):
        pld_from_event(
            ev.ComposedEvent(
                (
                    ev.RandomizedResponseEvent(0.7),
                    ev.PoissonSampledEvent(0.1, ev.GaussianEvent(1.0)),
                )
            )
        )
    with pytest.raises(UnsupportedEventError, match="replace-one"):
        pld_from_event(ev.PoissonSampledEvent(0.1, ev.RandomizedResponseEvent(0.7)))
    with pytest.raises(UnsupportedEventError, match="without replacement"):
        pld_from_event(
            ev.SampledWithoutReplacementEvent(5, 10, ev.SelfComposedEvent(ev.GaussianEvent(1.0), 2))
        )
    assert issubclass(UnsupportedEventError, ValueError)


def test_pld_epsilon_for_dp_sgd() -> None:
    event = ev.SelfComposedEvent(ev.PoissonSampledEvent(0.01, ev.GaussianEvent(1.0)), 1000)
    eps = pld_epsilon(event, 1e-5)
    # Google dp_accounting's PLD accountant: 1.828244 at interval 1e-4 (an upper bound too)
    assert abs(eps - 1.828244) / 1.828244 < 5e-3
    # one fixed fine grid is an upper bound as well; the tolerance keeps them close
    fixed = pld_from_event(event, value_discretization_interval=2e-4).epsilon(1e-5)
    assert eps <= fixed * 1.002


# ----------------------------------------------------------------------------- kernels


@pytest.mark.parametrize(("q", "sigma"), [(0.01, 2.0), (0.2, 0.8), (0.001, 0.6)])
def test_one_tail_table_gives_both_orders_and_the_coarse_grid(q: float, sigma: float) -> None:
    # The add table is the remove table mirrored, and the grid 2h every other threshold of h:
    # the PMFs must be those of discretizing each profile on its own grid, to the last bit.
    source = srcs.MixtureSource(GaussianNoise(sigma), q)
    h, tail = 3e-4, 1e-13
    directions: tuple[Direction, ...] = ("remove", "add")
    for interval in (h, 2.0 * h):
        for direction in directions:
            built = source.build(interval, tail, direction)[0]
            profile = MixtureProfile(GaussianNoise(sigma), q, direction)
            direct = srcs.discretize_profile(profile, interval, tail)
            assert built.offset == direct.offset
            np.testing.assert_array_equal(built.probs, direct.probs)
            assert built.infinity_mass == direct.infinity_mass


def test_tail_cuts_agree_with_cumulative_sums() -> None:
    rng = np.random.default_rng(7)
    for size in (1, 5, 511, 512, 513, 3000):
        probs = rng.exponential(size=size) ** 6
        probs /= probs.sum()
        reference = np.cumsum(probs)
        for limit in (0.0, 1e-12, 1e-3, 0.3, 1.0 + 1e-9):
            k, mass = core._prefix_within(probs, limit)
            assert k == int(np.searchsorted(reference, limit, side="right"))
            assert mass == pytest.approx(reference[k - 1] if k else 0.0, rel=1e-12, abs=0.0)
        raw = core.RawPmf(-17, probs, 1e-6)
        cut = core.truncate_tails(raw, 1e-4)
        assert cut.probs.sum() + cut.infinity_mass == pytest.approx(1.0 + 1e-6, rel=1e-12)
        assert cut.infinity_mass - 1e-6 <= 1e-4
        # mass only moves up: the cumulative distribution is nowhere above the original one
        grid = np.arange(-17, -17 + size)
        kept = np.interp(
            grid,
            np.arange(cut.offset, cut.offset + cut.probs.size),
            np.cumsum(cut.probs),
            left=0.0,
            right=float(cut.probs.sum()),
        )
        assert np.all(kept <= reference * (1 + 1e-12))


def test_first_loss_above_matches_a_search() -> None:
    rng = np.random.default_rng(11)
    for _ in range(200):
        offset, n = int(rng.integers(-(10**6), 10**6)), int(rng.integers(1, 5000))
        h = float(10 ** rng.uniform(-6, 0))
        losses = (offset + np.arange(n, dtype=np.float64)) * h
        picks = losses[rng.integers(0, n, 20)]
        eps = np.concatenate(
            [
                picks,
                np.nextafter(picks, np.inf),
                np.nextafter(picks, -np.inf),
                rng.uniform(losses[0] - 3 * h, losses[-1] + 3 * h, 20),
                [np.inf, -np.inf],
            ]
        )
        expected = np.searchsorted(losses, eps, side="right")
        np.testing.assert_array_equal(core._first_above(offset, n, h, eps), expected)
        for one, want in zip(eps, expected, strict=True):  # the scalar path
            assert core._first_above(offset, n, h, np.array([one]))[0] == want


def test_batched_self_composition_is_pessimistic_and_matches_one_at_a_time() -> None:
    # Two orders of different widths share one FFT length: both stay upper bounds of the exact
    # composition (computed by repeated convolution) and agree with separate transforms.
    h, count = 0.05, 40
    raws = [
        core.RawPmf(-3, np.array([0.2, 0.5, 0.2, 0.1 - 1e-5, 0.0, 0.0, 1e-5]), 0.0),
        core.RawPmf(-1, np.array([0.7, 0.3]), 0.0),
    ]
    batched = core.self_convolve_all(raws, count, 1e-12)
    eps = np.linspace(0.0, 6.0, 61)
    for raw, together in zip(raws, batched, strict=True):
        alone = core.self_convolve(raw, count, 1e-12)
        exact = np.array([1.0])
        for _ in range(count):
            exact = np.convolve(exact, raw.probs)
        exact_pmf = PrivacyLossPmf(h, raw.offset * count, exact)
        for result in (together, alone):
            pmf = PrivacyLossPmf(h, result.offset, result.probs, result.infinity_mass)
            reported, truth = pmf.delta(eps), exact_pmf.delta(eps)
            assert np.all(reported >= truth * (1 - 1e-9) - 1e-15)
            np.testing.assert_allclose(reported, truth, rtol=1e-6, atol=1e-11)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("q", [0.0, -0.1, 1.5, float("nan")])
def test_bad_sampling_rate(q: float) -> None:
    with pytest.raises(ValueError, match="sampling_rate"):
        PLD.from_gaussian(1.0, sampling_rate=q)


@pytest.mark.parametrize("sigma", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_noise(sigma: float) -> None:
    with pytest.raises(ValueError, match="standard_deviation"):
        PLD.from_gaussian(sigma)
    with pytest.raises(ValueError, match="scale"):
        PLD.from_laplace(sigma)


@pytest.mark.parametrize("count", [0, -3])
def test_bad_count(count: int) -> None:
    with pytest.raises(ValueError, match="count"):
        PLD.from_pure_dp(1.0).self_compose(count)


@pytest.mark.parametrize("delta", [-0.1, 1.0, 2.0, float("nan")])
def test_bad_delta(delta: float) -> None:
    pld = PLD.from_pure_dp(1.0)
    with pytest.raises(ValueError, match="delta"):
        pld.epsilon(delta)
    with pytest.raises(ValueError, match="delta"):
        pld.to_approx_dp(delta)
    with pytest.raises(ValueError, match="delta"):
        pld_epsilon(ev.GaussianEvent(1.0), delta)


def test_other_bad_input() -> None:
    with pytest.raises(ValueError, match="sample_size"):
        PLD.from_gaussian_without_replacement(1.0, sample_size=20, population_size=10)
    with pytest.raises(ValueError, match="sampling_rate"):
        PLD.from_gaussian(1.0, sampling_rate=0.5, neighbouring=Neighbouring.REPLACE)
    with pytest.raises(ValueError, match="value_discretization_interval"):
        PLD.from_gaussian(1.0, value_discretization_interval=0.0)
    with pytest.raises(ValueError, match="probs"):
        PrivacyLossPmf(0.1, 0, [0.5, -0.1])
    with pytest.raises(ValueError, match="neighbouring"):
        PLD.from_pure_dp(1.0).compose(PLD.from_randomized_response(0.7))
    with pytest.raises(TypeError, match="event"):
        pld_from_event("gaussian")  # type: ignore[arg-type]
