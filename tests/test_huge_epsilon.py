"""Accounting past epsilon = 709.78, where e^epsilon overflows a double (a bug hunt).

e^eps Q with Q = 0 is 0, but inf * 0 is NaN in floating point, and a NaN read as 0 dropped a
whole tail of the privacy loss: delta_adp of a 1000-DP Laplace was 0 at eps 800 (truth 1),
and a keep rule's delta was 0 at eps 709.8 (truth 0.9): a delta below the truth, the worst
kind of bug. Exact values here, no sampling: nothing can flake.
"""

from __future__ import annotations

import math

import pytest

from dpcurator.accounting import (
    ApproxDP,
    KeepRule,
    PureDP,
    ThresholdedHistogram,
    delta_adp,
    delta_pdp,
    epsilon_adp,
    posterior_bounds,
)
from dpcurator.accounting.events import (
    ApproxDPEvent,
    LaplaceEvent,
    NameAndShameEvent,
    PureDPEvent,
)


@pytest.mark.parametrize("eps", [700.0, 709.8, 800.0, 999.0])
def test_a_laplace_losses_delta_is_never_below_the_truth_past_the_overflow(eps: float) -> None:
    truth = max(0.0, -math.expm1((eps - 1000.0) / 2))  # Laplace of scale 1e-3: 1000-DP
    assert delta_adp(LaplaceEvent(1e-3), eps) >= truth * (1 - 1e-9)


@pytest.mark.parametrize("delta", [0.5, 1e-5, 1e-300])
def test_a_laplace_losses_epsilon_is_never_below_the_truth_past_the_overflow(
        delta: float) -> None:
    truth = 1000.0 + 2 * math.log1p(-delta)
    assert epsilon_adp(LaplaceEvent(1e-3), delta) >= truth * (1 - 1e-9)


@pytest.mark.parametrize("event", [NameAndShameEvent(1e-3), ApproxDPEvent(1.0, 1e-3)])
def test_a_mass_at_infinite_loss_is_kept_at_every_epsilon(event: object) -> None:
    for eps in (709.0, 709.8, 800.0, 1e6):
        assert delta_adp(event, eps) >= 1e-3 * (1 - 1e-9)


def test_pure_dp_beyond_the_overflow_is_accounted_not_raised() -> None:
    assert delta_pdp(PureDPEvent(800.0), 1.0) == pytest.approx(1.0)
    assert delta_adp(PureDPEvent(800.0), 900.0) == 0.0


def test_thresholding_keeps_its_infinite_losses_past_the_overflow() -> None:
    rule = KeepRule([0.0, 0.1, 1.0])  # dropping at n = 2 is impossible at n = 1: loss +inf
    for eps in (709.0, 709.8, 710.0, 1000.0):
        assert rule.delta_pdp(eps) >= 0.9 and rule.delta_adp(eps) >= 0.9
    histogram = ThresholdedHistogram(1.0, 2.0)
    below = histogram.delta_adp(709.0)
    for eps in (709.8, 710.0, 1e4):
        assert histogram.delta_adp(eps) == pytest.approx(below)  # the +inf mass alone
        assert histogram.delta_pdp(eps) == pytest.approx(below)


def test_the_posterior_bound_of_a_huge_epsilon_is_computed() -> None:
    for eps in (709.8, 800.0):
        bounds = posterior_bounds(ApproxDP(eps, 1e-5), 0.5)
        assert 0.0 <= bounds.posterior_min <= 1e-300 and bounds.posterior_max == 1.0
    assert posterior_bounds(PureDP(800.0), 0.5) is not None
