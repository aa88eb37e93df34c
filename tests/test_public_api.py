"""The public surface is exactly what DESIGN.md promises: names, keywords, shapes."""

from __future__ import annotations

import numpy as np

import dpcurator as dp
from dpcurator import noise


def test_top_level_names() -> None:
    assert set(dp.__all__) == {
        "ApproxDP", "Budget", "Curator", "CuratorLike", "Neighbouring", "PureDP", "Release",
        "Schema",
        "ZCDP", "__version__", "accounting", "audit", "connect", "ledger", "local",
        "mechanisms", "noise",
    }
    for name in dp.__all__:
        assert hasattr(dp, name)


def test_subpackage_surfaces() -> None:
    """Each package's exact ``__all__`` is pinned once, in ``test_exported_members``; here,
    that the names resolve and the samplers the design names are public."""
    assert all(getattr(dp.ledger, name) is not None for name in dp.ledger.__all__)
    assert {"SecureRandom", "SeededRandom", "sample_discrete_laplace",
            "sample_discrete_gaussian", "sample_bernoulli_exp"} <= set(noise.__all__)


def test_design_constructors_and_release_shapes() -> None:
    m = dp.mechanisms
    cases = [
        m.Laplace(epsilon=1.0, sensitivity=1.0),
        m.DiscreteLaplace(epsilon=1.0, sensitivity=1),
        m.Gaussian(epsilon=1.0, delta=1e-6, sensitivity=1.0),
        m.Gaussian(rho=0.5, sensitivity=1.0),
        m.DiscreteGaussian(epsilon=1.0, delta=1e-6, sensitivity=1),
        m.DiscreteGaussian(rho=0.5, sensitivity=1),
    ]
    for mech in cases:
        assert np.asarray(mech.release(np.zeros((2, 3), dtype=np.int64))).shape == (2, 3)
        assert np.ndim(mech.release(0)) == 0
        lo, hi = mech.confidence_interval(0.05)
        assert lo < 0 < hi
        assert isinstance(mech.guarantee, dp.PureDP | dp.ApproxDP | dp.ZCDP)
    rr = m.RandomizedResponse(epsilon=np.log(3))
    assert rr.release(np.array([True, False, True])).shape == (3,)
    assert m.RandomizedResponse(truth_probability=0.5).guarantee.epsilon == np.log(3)
    assert m.Exponential(epsilon=1.0, sensitivity=1.0).release(np.array([1.0, 5.0])) in (0, 1)


def test_guarantees_are_immutable_values() -> None:
    g = dp.ApproxDP(1.0, 1e-6)
    assert g == dp.ApproxDP(1.0, 1e-6) and hash(g) == hash(dp.ApproxDP(1.0, 1e-6))
    try:
        g.epsilon = 2.0  # type: ignore[misc]
    except AttributeError:
        pass
    else:
        raise AssertionError("guarantees must be frozen")
    assert dp.PureDP(1.0, dp.Neighbouring.REPLACE).neighbouring is dp.Neighbouring.REPLACE


def test_mechanisms_hand_their_profile_to_the_accountants() -> None:
    from fractions import Fraction

    from dpcurator.accounting import account
    from dpcurator.accounting.events import (
        DiscreteGaussianEvent,
        DiscreteLaplaceEvent,
        PureDPEvent,
        RandomizedResponseEvent,
        SelfComposedEvent,
    )

    m = dp.mechanisms
    dl = m.DiscreteLaplace(epsilon=0.5, sensitivity=1)
    assert isinstance(dl.event, DiscreteLaplaceEvent)
    assert Fraction(dl.event.scale) <= dl.scale  # never less private than the mechanism
    dg = m.DiscreteGaussian(rho=0.5)
    assert isinstance(dg.event, DiscreteGaussianEvent) and dg.event.sigma <= dg.sigma
    rr = m.RandomizedResponse(epsilon=1.0, protocol="truth-or-coin")
    assert isinstance(rr.event, RandomizedResponseEvent)
    assert isinstance(m.Laplace(epsilon=1.0, sensitivity=1.0).event, PureDPEvent)
    # Ten discrete Laplace releases: the PLD is tighter than basic composition (10 x 0.5).
    result = account(SelfComposedEvent(dl.event, 10), delta=1e-6)
    assert result.epsilon <= 5.0
    # The randomized-response profile reproduces its epsilon exactly at delta = 0.
    assert abs(account(rr.event, delta=0.0).epsilon - 1.0) < 1e-6


def test_lazy_exports_match_what_type_checkers_see() -> None:
    """Packages that export lazily (dpcurator._lazy) import the same names for type checkers,
    and every public name resolves on first use."""
    import ast
    import importlib
    import inspect

    for name in ("dpcurator", "dpcurator.accounting", "dpcurator.local", "dpcurator.server"):
        package = importlib.import_module(name)
        tree = ast.parse(inspect.getsource(package))
        seen: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module != "typing" and (
                    node.module != "dpcurator._lazy"):
                seen |= {alias.asname or alias.name for alias in node.names}
        assert seen == set(package.__all__) - {"__version__"}, name
        for public in package.__all__:
            assert getattr(package, public) is not None
        assert set(package.__all__) <= set(dir(package))
