"""Composition theorems: closed forms, the optimal KOV sum against brute force, invariants."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import dpcurator as dp
from dpcurator.accounting.composition import (
    Composition,
    compose,
    compose_advanced,
    compose_basic,
    compose_kairouz,
    compose_optimal_homogeneous,
    optimal_homogeneous_delta,
)


def _brute_force_delta(eps: float, delta: float, k: int, target: float) -> float:
    """Hockey-stick divergence of k copies of the canonical (eps, delta) pair, by enumeration."""
    e = math.exp(eps)
    p = np.array([delta, (1 - delta) * e / (1 + e), (1 - delta) / (1 + e), 0.0])
    q = np.array([0.0, (1 - delta) / (1 + e), (1 - delta) * e / (1 + e), delta])
    total = 0.0
    for idx in itertools.product(range(4), repeat=k):
        pp, qq = float(np.prod(p[list(idx)])), float(np.prod(q[list(idx)]))
        total += max(0.0, pp - math.exp(target) * qq)
    return total


@pytest.mark.parametrize(
    ("eps", "delta", "k", "target"),
    [
        (0.5, 0.0, 3, 0.2),
        (0.5, 1e-3, 4, 0.7),
        (1.0, 0.01, 5, 1.5),
        (0.3, 0.0, 6, 0.0),
        (2.0, 1e-4, 2, 0.0),
    ],
)
def test_optimal_composition_matches_brute_force(
    eps: float, delta: float, k: int, target: float
) -> None:
    exact = _brute_force_delta(eps, delta, k, target)
    got = optimal_homogeneous_delta(eps, delta, k, target)
    assert exact <= got <= exact * (1 + 1e-7) + 1e-15


def test_optimal_composition_matches_kov_closed_form_on_its_grid() -> None:
    # KOV 2015, Theorem 3.3 at eps' = (k - 2i) eps.
    eps, delta, k = 0.4, 1e-4, 20
    for i in range(0, k // 2 + 1):
        s = (
            sum(
                math.comb(k, j) * (math.exp((k - j) * eps) - math.exp((k - 2 * i + j) * eps))
                for j in range(i)
            )
            / (1 + math.exp(eps)) ** k
        )
        closed = 1 - (1 - delta) ** k * (1 - s)
        got = optimal_homogeneous_delta(eps, delta, k, (k - 2 * i) * eps)
        assert got == pytest.approx(closed, rel=1e-7, abs=1e-15) and got >= closed - 1e-15


def test_basic_and_advanced_closed_forms() -> None:
    basic = compose_basic([dp.ApproxDP(0.5, 1e-6), dp.PureDP(0.25), dp.ApproxDP(1.0, 1e-7)])
    assert basic.method == "basic"
    assert basic.guarantee.epsilon == pytest.approx(1.75) and basic.guarantee.epsilon >= 1.75
    assert basic.guarantee.delta == pytest.approx(1.1e-6)
    adv = compose_advanced(dp.ApproxDP(0.1, 1e-8), 100, 1e-6)
    expected = math.sqrt(200 * math.log(1e6)) * 0.1 + 100 * 0.1 * math.expm1(0.1)
    assert adv.method == "advanced"
    assert adv.guarantee.epsilon == pytest.approx(expected) and adv.guarantee.epsilon >= expected
    assert adv.guarantee.delta == pytest.approx(100 * 1e-8 + 1e-6)


def test_large_k_runs_in_log_space() -> None:
    result = compose_optimal_homogeneous(dp.PureDP(0.01), 100_000, 1e-6)
    assert math.isfinite(result.guarantee.epsilon)
    # Below the Kairouz et al. Theorem 3.5 bound, and not far below: for small eps the
    # composition behaves like a Gaussian (about sqrt(2 k log(1/delta)) eps = 16.6 here).
    kairouz = compose_kairouz([dp.PureDP(0.01)] * 100_000, 1e-6).guarantee.epsilon
    assert 0.8 * kairouz < result.guarantee.epsilon < kairouz


def test_compose_picks_the_tightest_and_names_it() -> None:
    homogeneous = [dp.ApproxDP(0.1, 1e-9)] * 200
    best = compose(homogeneous, 1e-5)
    assert isinstance(best, Composition) and best.method == "optimal"
    assert best.guarantee.delta == 1e-5
    assert best.guarantee.epsilon < compose_basic(homogeneous).guarantee.epsilon
    hetero = [dp.PureDP(0.1), dp.PureDP(0.2), dp.ApproxDP(0.5, 1e-6)] * 50
    assert compose(hetero, 1e-4).method == "kairouz"
    assert compose([dp.PureDP(1.0)], 1e-9).guarantee.epsilon <= 1.0 + 1e-12
    assert compose(hetero).method == "basic"


eps_st = st.floats(0.01, 2.0)
delta_st = st.sampled_from([0.0, 1e-10, 1e-8, 1e-7])


@settings(max_examples=40, deadline=None)
@given(
    items=st.lists(st.tuples(eps_st, delta_st), min_size=1, max_size=8),
    extra=st.tuples(eps_st, delta_st),
    target=st.sampled_from([1e-6, 1e-5, 1e-3]),
)
def test_composing_never_lowers_epsilon(
    items: list[tuple[float, float]], extra: tuple[float, float], target: float
) -> None:
    gs = [dp.ApproxDP(e, d) for e, d in items]
    before = compose(gs, target).guarantee.epsilon
    after = compose([*gs, dp.ApproxDP(*extra)], target).guarantee.epsilon
    assert after >= before
    assert compose_basic([*gs, dp.ApproxDP(*extra)]).guarantee.epsilon >= max(
        e for e, _ in [*items, extra]
    )


@settings(max_examples=40, deadline=None)
@given(eps=eps_st, delta=delta_st, k=st.integers(1, 300), target=st.sampled_from([1e-6, 1e-4]))
def test_optimal_is_below_advanced_and_basic(
    eps: float, delta: float, k: int, target: float
) -> None:
    assume(1 - (1 - delta) ** k < target)
    g = dp.ApproxDP(eps, delta)
    optimal = compose_optimal_homogeneous(g, k, target).guarantee.epsilon
    assert optimal <= compose_basic([g] * k).guarantee.epsilon
    slack = target - k * delta
    if slack > 0:
        assert optimal <= compose_advanced(g, k, slack).guarantee.epsilon
        assert optimal <= compose_kairouz([g] * k, slack).guarantee.epsilon


def test_errors_name_the_parameter() -> None:
    g = dp.ApproxDP(0.5, 1e-6)
    with pytest.raises(ValueError, match="empty"):
        compose_basic([])
    with pytest.raises(ValueError, match="k"):
        compose_advanced(g, 0, 1e-6)
    with pytest.raises(ValueError, match="delta_slack"):
        compose_advanced(g, 3, 0.0)
    with pytest.raises(ValueError, match="target_delta"):
        compose([g], 1.5)
    with pytest.raises(ValueError, match="target_delta"):
        compose_optimal_homogeneous(g, 10, 1e-7)  # below 1 - (1 - delta)^k
    with pytest.raises(ValueError, match="neighbouring"):
        compose_basic([g, dp.PureDP(0.1, dp.Neighbouring.REPLACE)])
    with pytest.raises(ValueError, match="epsilon"):
        dp.ApproxDP(-0.1, 1e-6)
    with pytest.raises(ValueError, match="delta"):
        dp.ApproxDP(0.1, 1.0)
    with pytest.raises(TypeError, match="guarantees"):
        compose_basic([dp.ZCDP(0.1)])  # type: ignore[list-item]


def test_a_numpy_integer_count_of_compositions_is_an_integer() -> None:
    """compose_advanced(PureDP(1), np.int64(5), ...) was refused as not an integer, where
    group_privacy took it (a bug hunt)."""
    from dpcurator.accounting.composition import compose_advanced

    assert compose_advanced(dp.PureDP(1.0), np.int64(5), 1e-5) == \
        compose_advanced(dp.PureDP(1.0), 5, 1e-5)


def test_numpy_integer_counts_for_the_renyi_accountant_and_self_composed_events() -> None:
    """``RDPAccountant.compose(count=np.int64(3))`` and ``SelfComposedEvent(e, np.int64(4))``
    were refused as not integers, and ``SelfComposedEvent(e, True)`` was taken as one run."""
    from dpcurator.accounting.events import GaussianEvent, SelfComposedEvent
    from dpcurator.accounting.rdp import RDPAccountant

    event = GaussianEvent(1.0)
    assert RDPAccountant().compose(event, count=np.int64(3)).rdp == \
        RDPAccountant().compose(event, count=3).rdp
    composed = SelfComposedEvent(event, np.int64(4))  # type: ignore[arg-type]
    assert composed.count == 4 and type(composed.count) is int
    assert composed == SelfComposedEvent(event, 4)
    with pytest.raises(TypeError, match="count"):
        SelfComposedEvent(event, True)
    with pytest.raises(ValueError, match="count must be an integer >= 1"):
        SelfComposedEvent(event, 2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="count must be an integer >= 1"):
        RDPAccountant().compose(event, count=0)
