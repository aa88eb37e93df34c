"""Group privacy rules and the attacker's posterior bounds."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

import dpcurator as dp
from dpcurator.accounting import GDP, RDP
from dpcurator.accounting.conversions import gdp_to_delta
from dpcurator.accounting.events import (
    ComposedEvent,
    DiscreteLaplaceEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
)
from dpcurator.accounting.group import group_event, group_privacy
from dpcurator.accounting.posterior import PosteriorBounds, plot_posterior, posterior_bounds
from dpcurator.accounting.rdp import event_rdp

# -- group privacy ---------------------------------------------------------------------------


def test_group_privacy_rules() -> None:
    assert group_privacy(dp.PureDP(0.5), 3).epsilon == pytest.approx(1.5)
    g = group_privacy(dp.ApproxDP(0.5, 1e-6), 3)
    expected = 1e-6 * (math.exp(1.5) - 1) / (math.exp(0.5) - 1)  # = delta (1 + e^eps + e^2eps)
    assert g.epsilon == pytest.approx(1.5) and g.delta == pytest.approx(expected)
    assert g.delta >= expected and g.delta <= 3 * math.exp(1.0) * 1e-6
    assert group_privacy(dp.ApproxDP(0.0, 1e-6), 4).delta == pytest.approx(4e-6)
    assert group_privacy(dp.ZCDP(0.1), 3).rho == pytest.approx(0.9)
    assert group_privacy(GDP(0.5), 4).mu == pytest.approx(2.0)
    assert group_privacy(dp.PureDP(0.5, dp.Neighbouring.REPLACE), 2).neighbouring is (
        dp.Neighbouring.REPLACE
    )
    assert group_privacy(dp.ZCDP(0.1), 1) == dp.ZCDP(0.1)


def test_rdp_group_privacy_follows_mironov() -> None:
    rdp = RDP((2.0, 4.0, 8.0, 16.0), (0.1, 0.2, 0.4, 0.8))
    g = group_privacy(rdp, 2)  # c = 1: orders >= 4 become alpha/2 with 3 eps
    assert g.orders == (2.0, 4.0, 8.0)
    assert g.epsilons == pytest.approx((0.6, 1.2, 2.4))
    g3 = group_privacy(rdp, 3)  # rounded up to 4 = 2^2: orders >= 8, alpha/4, 9 eps
    assert g3.orders == (2.0, 4.0) and g3.epsilons == pytest.approx((3.6, 7.2))
    with pytest.raises(ValueError, match="group_event"):
        group_privacy(RDP((2.0, 3.0), (0.1, 0.2)), 2)


def test_group_event_is_exact_for_noise() -> None:
    event = ComposedEvent((GaussianEvent(4.0), LaplaceEvent(2.0), DiscreteLaplaceEvent(3.0, 1)))
    grouped = group_event(event, 2)
    assert grouped == ComposedEvent(
        (GaussianEvent(2.0), LaplaceEvent(1.0), DiscreteLaplaceEvent(3.0, 2))
    )
    single = np.array(event_rdp(GaussianEvent(4.0), [2.0, 8.0]).epsilons)
    group = np.array(event_rdp(group_event(GaussianEvent(4.0), 2), [2.0, 8.0]).epsilons)
    assert np.allclose(group, 4 * single)  # Gaussian: k^2 times, like zCDP
    with pytest.raises(ValueError, match="group_privacy"):
        group_event(PoissonSampledEvent(0.1, GaussianEvent(1.0)), 2)


@pytest.mark.parametrize("bad", [0, -1])
def test_group_size_below_one_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="k"):
        group_privacy(dp.PureDP(1.0), bad)
    with pytest.raises(ValueError, match="k"):
        group_event(GaussianEvent(1.0), bad)
    with pytest.raises(TypeError, match="k"):
        group_privacy(dp.PureDP(1.0), 2.0)  # type: ignore[arg-type]


def test_group_delta_reaching_one_is_refused() -> None:
    with pytest.raises(ValueError, match="delta"):
        group_privacy(dp.ApproxDP(2.0, 0.01), 10)


# -- posterior -----------------------------------------------------------------------------


def test_references_example_eps_1_1_prior_half() -> None:
    b = posterior_bounds(dp.PureDP(1.1), 0.5)
    assert isinstance(b, PosteriorBounds)
    assert b.posterior_max == pytest.approx(0.7503, abs=1e-4)  # "at most 75% certain"
    assert b.posterior_min == pytest.approx(1 - 0.7503, abs=1e-4)
    assert b.prior_odds == 1.0
    assert b.odds_max == pytest.approx(math.exp(1.1)) and b.odds_max >= math.exp(1.1)
    assert b.odds_min == pytest.approx(math.exp(-1.1)) and b.odds_min <= math.exp(-1.1)
    assert b.failure_probability == 0.0 and "0.7503" in str(b)


@settings(max_examples=60, deadline=None)
@given(eps=st.floats(0.01, 10.0), prior=st.floats(0.0, 1.0))
def test_pure_posterior_matches_the_closed_forms(eps: float, prior: float) -> None:
    b = posterior_bounds(dp.PureDP(eps), prior)
    e = math.exp(eps)
    upper = e * prior / (1 + (e - 1) * prior)  # Lalanne, eq. (5)
    lower = prior / (e * (1 - prior) + prior)  # = prior / (e + (1 - e) prior), no cancellation
    assert b.posterior_min <= lower + 1e-15 and b.posterior_max >= upper - 1e-15
    assert b.posterior_max == pytest.approx(upper, abs=1e-12)
    assert b.posterior_min == pytest.approx(lower, abs=1e-12)
    assert 0.0 <= b.posterior_min <= prior <= b.posterior_max <= 1.0


def test_certain_priors_stay_certain() -> None:
    for prior in (0.0, 1.0):
        b = posterior_bounds(dp.PureDP(2.0), prior)
        assert b.posterior_min == b.posterior_max == prior
    assert posterior_bounds(dp.PureDP(2.0), 1.0).odds_max == math.inf


def test_approximate_dp_bound_widens_with_delta_and_is_sound_for_the_gaussian() -> None:
    # A Gaussian mechanism with mu = 1/sigma is (eps, delta(eps))-DP. Its privacy loss is
    # N(+-mu^2/2, mu^2), so the probability of the outputs where the odds bound with eps' fails
    # can be computed exactly and must not exceed the reported failure probability.
    mu, eps = 0.5, 1.0
    delta = gdp_to_delta(mu, eps)
    b = posterior_bounds(dp.ApproxDP(eps, delta), 0.3)
    pure = posterior_bounds(dp.PureDP(eps), 0.3)
    assert b.epsilon > eps and b.posterior_max > pure.posterior_max
    assert b.failure_probability == pytest.approx(10 * delta)
    e2 = b.epsilon
    bad_in = norm.sf((e2 - mu**2 / 2) / mu) + norm.cdf((-e2 - mu**2 / 2) / mu)
    bad_out = norm.sf((e2 + mu**2 / 2) / mu) + norm.cdf((-e2 + mu**2 / 2) / mu)
    assert max(bad_in, bad_out) <= b.failure_probability
    custom = posterior_bounds(dp.ApproxDP(eps, delta), 0.3, failure_probability=0.5)
    assert custom.epsilon < b.epsilon
    expected = math.log((0.5 * math.exp(eps) + delta) / (0.5 - delta))
    assert custom.epsilon == pytest.approx(expected)


@pytest.mark.parametrize("bad", [-0.1, 1.1, float("nan")])
def test_bad_prior_is_named(bad: float) -> None:
    with pytest.raises(ValueError, match="prior"):
        posterior_bounds(dp.PureDP(1.0), bad)


def test_bad_failure_probability_and_guarantee() -> None:
    with pytest.raises(ValueError, match="failure_probability"):
        posterior_bounds(dp.ApproxDP(1.0, 1e-3), 0.5, failure_probability=1e-4)
    with pytest.raises(TypeError, match="guarantee"):
        posterior_bounds(dp.ZCDP(0.5), 0.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_plot_posterior_writes_a_file(tmp_path: Path, suffix: str) -> None:
    path = plot_posterior(tmp_path / f"posterior{suffix}", epsilons=(0.5, 1.1, 3.0))
    assert path.exists() and path.stat().st_size > 1000
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG") if suffix == ".png" else b"<svg" in data[:600]


def test_plot_posterior_refuses_unknown_formats(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="path"):
        plot_posterior(tmp_path / "posterior.jpg")
    with pytest.raises(ValueError, match="epsilons"):
        plot_posterior(tmp_path / "posterior.png", epsilons=(0.0,))
