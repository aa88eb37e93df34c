"""Conversions between currencies: known values, round trips, and never below the truth."""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpcurator as dp
from dpcurator.accounting import GDP, RDP
from dpcurator.accounting.conversions import (
    gdp_mu_for,
    gdp_to_approx,
    gdp_to_delta,
    gdp_to_epsilon,
    pure_to_approx,
    pure_to_rdp,
    pure_to_zcdp,
    rdp_epsilon_and_order,
    rdp_to_approx,
    rdp_to_delta,
    rdp_to_epsilon,
    zcdp_rho_for,
    zcdp_to_approx,
    zcdp_to_delta,
    zcdp_to_epsilon,
    zcdp_to_rdp,
)
from dpcurator.accounting.rdp import DEFAULT_ORDERS


def _gdp_delta_mp(mu: float, eps: float) -> float:
    mp.mp.dps = 50
    m, e = mp.mpf(mu), mp.mpf(eps)
    return float(mp.ncdf(-e / m + m / 2) - mp.exp(e) * mp.ncdf(-e / m - m / 2))


def test_pure_conversions() -> None:
    g = dp.PureDP(0.8, dp.Neighbouring.REPLACE)
    z = pure_to_zcdp(g)
    assert z.rho == pytest.approx(0.32) and z.rho >= 0.32 and z.neighbouring is g.neighbouring
    assert pure_to_approx(g) == dp.ApproxDP(0.8, 0.0, dp.Neighbouring.REPLACE)
    r = pure_to_rdp(g)
    assert r.orders == DEFAULT_ORDERS
    assert all(e <= min(0.8, a * 0.32) + 1e-12 for a, e in zip(r.orders, r.epsilons, strict=True))


def test_zcdp_known_values_and_round_trips() -> None:
    # Bun-Steinke 2016 Prop 1.3 gives rho + 2 sqrt(rho log(1/delta)); CKS 2020 is tighter.
    rho, delta = 0.5, 1e-6
    eps = zcdp_to_epsilon(rho, delta)
    assert eps < rho + 2 * math.sqrt(rho * math.log(1 / delta))
    assert zcdp_to_delta(rho, eps) <= delta * (1 + 1e-6)
    assert zcdp_to_approx(dp.ZCDP(rho), delta).epsilon == eps
    r = zcdp_rho_for(1.0, 1e-5)
    assert zcdp_to_delta(r, 1.0) <= 1e-5
    assert zcdp_to_delta(r * 1.001, 1.0) > 1e-5
    curve = zcdp_to_rdp(dp.ZCDP(0.1), orders=[2.0, 3.0])
    assert curve.epsilons == pytest.approx((0.2, 0.3)) and curve.epsilons[0] >= 0.2


@settings(max_examples=40, deadline=None)
@given(
    rho=st.floats(1e-4, 5.0),
    log_delta=st.floats(-20.0, -2.0),
)
def test_zcdp_epsilon_is_never_below_the_gaussian_curve(rho: float, log_delta: float) -> None:
    # The Gaussian mechanism with mu = sqrt(2 rho) is exactly rho-zCDP; its exact privacy curve
    # is a lower bound for any conversion from rho-zCDP.
    delta = math.exp(log_delta)
    exact = gdp_to_epsilon(math.sqrt(2 * rho), delta)
    assert zcdp_to_epsilon(rho, delta) >= exact


def test_rdp_to_approx_for_the_gaussian_is_above_the_analytic_value() -> None:
    sigma, delta = 1.0, 1e-5
    orders = np.array(DEFAULT_ORDERS)
    rdp = RDP(DEFAULT_ORDERS, tuple(orders / (2 * sigma**2)))
    eps, order = rdp_epsilon_and_order(rdp.orders, rdp.epsilons, delta)
    exact = gdp_to_epsilon(1 / sigma, delta)
    assert exact <= eps <= 1.1 * exact
    assert 2 <= order <= 20
    # Balle et al. 2020 Thm 21 beats Mironov 2017 Prop 3 at every order.
    mironov = min(
        float(r + math.log(1 / delta) / (a - 1)) for a, r in zip(orders, rdp.epsilons, strict=True)
    )
    assert eps < mironov
    assert rdp_to_epsilon(rdp, delta) == eps
    assert rdp_to_delta(rdp, eps) <= delta * (1 + 1e-6)
    assert rdp_to_approx(rdp, delta) == dp.ApproxDP(eps, delta)
    assert rdp_to_delta(rdp, 0.0) <= 1.0


def test_rdp_to_delta_uses_the_total_variation_bound_for_small_epsilon() -> None:
    rdp = RDP((1.5, 2.0), (1e-4, 2e-4))
    assert rdp_to_delta(rdp, 0.0) <= math.sqrt(-math.expm1(-1e-4)) * (1 + 1e-6)


def test_gdp_known_values() -> None:
    assert gdp_to_delta(1.0, 0.0) == pytest.approx(0.3829249225480262, rel=1e-8)
    for mu, eps in [(0.5, 0.3), (1.0, 1.0), (2.0, 5.0), (0.3, 4.0), (5.0, 30.0)]:
        exact = _gdp_delta_mp(mu, eps)
        got = gdp_to_delta(mu, eps)
        assert exact <= got <= exact * (1 + 1e-8)
    assert gdp_to_approx(GDP(1.0), 1e-5).epsilon == gdp_to_epsilon(1.0, 1e-5)


@settings(max_examples=40, deadline=None)
@given(mu=st.floats(0.05, 8.0), log_delta=st.floats(-25.0, -1.0))
def test_gdp_round_trips_are_conservative(mu: float, log_delta: float) -> None:
    delta = math.exp(log_delta)
    eps = gdp_to_epsilon(mu, delta)
    assert gdp_to_delta(mu, eps) <= delta * (1 + 1e-8)
    if eps > 0:
        assert _gdp_delta_mp(mu, eps * (1 - 1e-6)) > delta * (1 - 1e-6)  # and tight
        m = gdp_mu_for(eps, delta)
        assert _gdp_delta_mp(m, eps) <= delta * (1 + 1e-8)
        assert m == pytest.approx(mu, rel=1e-6)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_mu_rho_and_epsilon_are_named(bad: float) -> None:
    with pytest.raises(ValueError, match="mu"):
        gdp_to_delta(bad, 1.0)
    with pytest.raises(ValueError, match="rho"):
        zcdp_to_epsilon(bad, 1e-5)
    if bad != 0.0:
        with pytest.raises(ValueError, match="epsilon"):
            gdp_to_delta(1.0, bad)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.5, 2.0, float("nan")])
def test_bad_delta_is_named(bad: float) -> None:
    with pytest.raises(ValueError, match="delta"):
        gdp_to_epsilon(1.0, bad)
    with pytest.raises(ValueError, match="delta"):
        zcdp_to_epsilon(0.5, bad)
    with pytest.raises(ValueError, match="delta"):
        rdp_to_epsilon(RDP((2.0,), (1.0,)), bad)
    with pytest.raises(ValueError, match="delta"):
        gdp_mu_for(1.0, bad)


@pytest.mark.parametrize("epsilon", [1e-3, 1e-6, 1e-9, 1e-14, 1e-100])
@pytest.mark.parametrize("delta", [1e-5, 1e-7, 1e-12])
def test_zcdp_rho_for_a_tiny_epsilon_is_found_and_sound(epsilon: float, delta: float) -> None:
    """Below epsilon ~ 1e-4 the rho lies under the search's old bracket (1e-12) and scipy's
    root finder raised; the bracket now moves down until delta fits. The rho found converts
    back within delta, and the Gaussian mechanism of that rho (a rho-zCDP mechanism) has an
    exact delta at most the conversion's. Where the conversion (its orders alpha up to
    1 + e^20) certifies no rho at all, a UserError says so at once."""
    import math

    from scipy.stats import norm

    from dpcurator.accounting.conversions import zcdp_rho_for, zcdp_to_delta
    from dpcurator.errors import UserError

    try:
        rho = zcdp_rho_for(epsilon, delta)
    except UserError as exc:
        assert "too small" in str(exc)
        assert epsilon <= 1e-9  # only where epsilon is far below what delta allows
        return
    assert rho > 0 and zcdp_to_delta(rho, epsilon) <= delta
    sigma = 1 / math.sqrt(2 * rho)
    exact = norm.cdf(-epsilon * sigma + 1 / (2 * sigma)) - math.exp(epsilon) * norm.cdf(
        -epsilon * sigma - 1 / (2 * sigma))
    assert exact <= zcdp_to_delta(rho, epsilon) * (1 + 1e-9)


def test_zcdp_to_delta_refuses_what_every_other_conversion_refuses() -> None:
    """NaN epsilon gave delta 1, a bool rho was read as 1, and a string raised a raw
    TypeError (a bug hunt): the shared checks now name the parameter."""
    from dpcurator.accounting.conversions import zcdp_to_delta
    from dpcurator.errors import UserError

    for rho, epsilon in ((0.5, math.nan), (True, 1.0), (0.5, "1"), (-1.0, 1.0)):
        with pytest.raises(UserError):
            zcdp_to_delta(rho, epsilon)  # type: ignore[arg-type]
    assert 0.0 < zcdp_to_delta(0.5, 1.0) < 1.0
