"""A query is charged through its events, priced once: the same charges as the mechanisms'
guarantees say, computed here independently, and as the curator charged before the events."""

from __future__ import annotations

import math
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpcurator as dp
from dpcurator.accounting.conversions import zcdp_to_delta
from dpcurator.accounting.events import ApproxDPEvent, PureDPEvent, ZCDPEvent
from dpcurator.curator._compile import CompiledQuery
from dpcurator.curator._prepared import charge_cost
from dpcurator.errors import UserError
from dpcurator.mechanisms import DiscreteGaussian, DiscreteLaplace
from dpcurator.mechanisms.partition_selection import CountThreshold, PartitionSelection

BOUNDS = {"x": (0, 20), "y": (-5, 50)}
GROUP_KEYS = list(range(6))
QUERIES = {
    "global": "SELECT COUNT(DISTINCT u), SUM(y), VARIANCE(x), STDDEV(y) FROM data",
    "quantiles": "SELECT MEDIAN(y), AVG(y) FROM data",
    "grouped": "SELECT g, QUANTILE_CONT(x, 0.9), COUNT(*) FROM data GROUP BY g",
    "private": "SELECT g, COUNT(*), MEDIAN(x) FROM data GROUP BY g",
    "units": "SELECT g, COUNT(DISTINCT u), MEDIAN(x) FROM data GROUP BY g",
}
REQUESTS: list[dict[str, Any]] = [
    {"epsilon": 1.0},
    {"epsilon": 0.3, "delta": 1e-6},
    {"epsilon": 2.0, "delta": 1e-5, "noise": "gaussian"},
    {"rho": 0.05},
    {"epsilon": 1 / 3},
    {"rho": 0.3 / 7},
    {"epsilon": 1.3, "delta": 1e-6, "noise": "gaussian",
     "weights": {"partition_selection": 0.5}},
]


def _curator() -> dp.Curator:
    frame = pd.DataFrame({"u": [1, 2, 3, 3], "g": [0, 1, 1, 2], "x": [1.0, 5.0, 7.5, 19.0],
                          "y": [-1.0, 0.0, 12.0, 49.0]})
    return dp.Curator(frame, privacy_unit="u", budget=dp.ApproxDP(1000, 1e-3), bounds=BOUNDS,
                      max_partitions=2, max_rows_per_partition=3)


def _compile(curator: dp.Curator, name: str, request: dict[str, Any],
             public: bool) -> CompiledQuery:
    keys = GROUP_KEYS if public and "GROUP BY" in QUERIES[name] else None
    plan = dp.query.parse_sql(QUERIES[name], table="data", privacy_unit="u", bounds=BOUNDS,
                              keys=keys)
    return curator.prepare(curator.resolve(plan, **request)).compiled


def _cases() -> Iterator[tuple[str, dict[str, Any], bool]]:
    for name in QUERIES:
        for request in REQUESTS:
            for public in (True, False) if "GROUP BY" in QUERIES[name] else (True,):
                if not public and ("rho" in request or "delta" not in request):
                    continue  # private keys need (epsilon, delta)
                if public and "weights" in request:
                    request = {k: v for k, v in request.items() if k != "weights"}
                yield name, request, public


CASES = list(_cases())


def _mechanisms(compiled: CompiledQuery) -> list[Any]:
    """What runs, in order, read from the compiled query's parts (not from its events)."""
    found: list[Any] = [compiled.selection] if compiled.selection is not None else []
    for estimator in compiled.estimators:
        if estimator.tree is not None:
            found.append(estimator.tree.mechanism)
        found.extend(m.mechanism for m in estimator.measures)
    return found


def _up(value: Fraction) -> float:
    f = float(value)
    return math.nextafter(f, math.inf) if Fraction(f) < value else f


@pytest.mark.parametrize(("name", "request_", "public"), CASES)
def test_events_are_the_mechanisms_guarantees_in_run_order(
        name: str, request_: dict[str, Any], public: bool) -> None:
    compiled = _compile(_curator(), name, request_, public)
    expected: list[Any] = []
    for m in _mechanisms(compiled):
        if isinstance(m, PartitionSelection):
            expected.append(ApproxDPEvent(m.epsilon, m.delta))
        elif isinstance(m, CountThreshold):  # its delta; its noise is the count's own event
            expected.append(ApproxDPEvent(0.0, m.delta))
        elif isinstance(m, DiscreteLaplace):
            expected.append(PureDPEvent(m.epsilon))
        else:
            assert isinstance(m, DiscreteGaussian) and m.rho is not None
            expected.append(ZCDPEvent(m.rho))
    assert compiled.events == tuple(expected)
    assert compiled.event.events == compiled.events


@pytest.mark.parametrize(("name", "request_", "public"), CASES)
def test_zcdp_price_is_the_exact_sum_of_the_mechanisms_rhos(
        name: str, request_: dict[str, Any], public: bool) -> None:
    compiled = _compile(_curator(), name, request_, public)
    if compiled.selection is not None:
        with pytest.raises(UserError, match="cannot account a private partition selection"):
            charge_cost(compiled, "zcdp")
        return
    total = Fraction(0)
    for m in _mechanisms(compiled):
        g = m.guarantee
        total += Fraction(g.epsilon) ** 2 / 2 if isinstance(g, dp.PureDP) else Fraction(g.rho)
    assert charge_cost(compiled, "zcdp") == dp.ZCDP(_up(total))


@pytest.mark.parametrize(("name", "request_", "public"), CASES)
def test_basic_price_is_the_request_and_the_mechanisms_compose_within_it(
        name: str, request_: dict[str, Any], public: bool) -> None:
    compiled = _compile(_curator(), name, request_, public)
    if "rho" in request_:
        with pytest.raises(UserError, match=r"this budget is \(epsilon, delta\)"):
            charge_cost(compiled, "basic")
        return
    epsilon, delta = request_["epsilon"], request_.get("delta", 0.0)
    cost = charge_cost(compiled, "basic")
    gaussian = request_.get("noise") == "gaussian"
    # Laplace noise with public keys spends no delta.
    assert cost == (dp.ApproxDP(epsilon, delta) if gaussian or not public
                    else dp.PureDP(epsilon))
    eps_sum, delta_sum, rho_sum = Fraction(0), Fraction(0), Fraction(0)
    for m in _mechanisms(compiled):
        if isinstance(m, CountThreshold):  # selection by the count: delta only (its events)
            delta_sum += Fraction(m.delta)
            continue
        g = m.guarantee
        if isinstance(g, dp.ZCDP):
            rho_sum += Fraction(g.rho)
        else:
            eps_sum += Fraction(g.epsilon)
            delta_sum += Fraction(g.delta)
    assert eps_sum <= Fraction(epsilon) and delta_sum <= Fraction(delta)  # basic composition
    if gaussian:  # the Gaussian parts' rho, converted with what is left, fits too (CKS 2020)
        left_eps = float(Fraction(epsilon) - eps_sum) * (1 - 1e-15)
        assert zcdp_to_delta(float(rho_sum), left_eps) <= float(Fraction(delta) - delta_sum)


# Charges as the curator computed them before it priced events (parallel lists of epsilons
# and rhos): they must not move by one unit in the last place. Issue 14 moved the zCDP price
# of the pure-epsilon requests whose counts are integers (no partition rescaling): those
# counts now get integer discrete Laplace noise at their *full* share, epsilon_i^2 / 2, where
# the fixed-point grid spent up to 2^-20 less (the old values, in comments, were lower by
# 1e-12 to 1e-11 relative). (epsilon, delta) budgets are charged the request, unchanged.
PINNED = [
    ("global", {"epsilon": 1.0}, 0.08333333333270175),  # was 0.08333333333249963
    ("global", {"epsilon": 0.3, "delta": 1e-6}, 0.007499999999881766),  # 0.007499999999849934
    ("global", {"epsilon": 2.0, "delta": 1e-5, "noise": "gaussian"}, 0.10825636380930868),
    ("global", {"rho": 0.05}, 0.05),
    ("global", {"epsilon": 1 / 3}, 0.009259259259113292),  # was 0.009259259259065572
    ("global", {"rho": 0.3 / 7}, 0.04285714285714286),
    ("quantiles", {"epsilon": 1.0}, 0.18749999999977265),  # was 0.18749999999954528
    ("quantiles", {"epsilon": 0.3, "delta": 1e-6}, 0.016874999999918146),  # 0.016874999999836292
    ("quantiles", {"epsilon": 1 / 3}, 0.020833333333232278),  # was 0.020833333333131223
    ("grouped", {"epsilon": 1.0}, 0.25),  # was 0.24999999999909053
    ("grouped", {"epsilon": 0.3}, 0.0225),  # was 0.022499999999672584
    ("grouped", {"epsilon": 1.3, "delta": 1e-6, "noise": "gaussian"}, 0.039715996842177796),
]


@pytest.mark.parametrize(("name", "request_", "rho"), PINNED)
def test_charges_are_unchanged(name: str, request_: dict[str, Any], rho: float) -> None:
    curator = _curator()
    compiled = _compile(curator, name, request_, public=True)
    assert charge_cost(compiled, "zcdp") == dp.ZCDP(rho)
    prepared = curator.prepare(curator.resolve(compiled.plan, **request_))
    assert curator.cost_in(prepared, "zcdp") == dp.ZCDP(rho)


def test_a_private_keys_query_with_a_quantile_runs_these_events() -> None:
    """The count's noisy value selects the keys: delta for selection, no epsilon share."""
    compiled = _compile(_curator(), "units", {"epsilon": 1.0, "delta": 1e-6}, public=False)
    assert isinstance(compiled.selection, CountThreshold)
    selection, count, median = compiled.events
    assert selection == ApproxDPEvent(0.0, 1e-6)
    assert isinstance(count, PureDPEvent) and isinstance(median, PureDPEvent)
    half = Fraction(1, 2)  # equal weights over the two aggregates, each rounded down
    assert half - Fraction(2**-50) < Fraction(count.epsilon) <= half
    assert Fraction(median.epsilon) <= half
    assert compiled.selection.noise.epsilon == count.epsilon  # one noise, used twice
    gaussian = _compile(_curator(), "units",
                        {"epsilon": 1.0, "delta": 1e-6, "noise": "gaussian"}, public=False)
    assert isinstance(gaussian.selection, CountThreshold)
    assert [type(e) for e in gaussian.events] == [ApproxDPEvent, ZCDPEvent, ZCDPEvent]
    assert gaussian.events[0] == ApproxDPEvent(0.0, 5e-7)  # half of delta
    # COUNT(*) with 3 rows per unit in 2 partitions: its threshold needs more units than a
    # separate selection of units at a third of epsilon, which is therefore chosen.
    rows = _compile(_curator(), "private", {"epsilon": 1.0, "delta": 1e-6}, public=False)
    assert isinstance(rows.selection, PartitionSelection)
    threshold_events = _compile(_curator(), "private", {"epsilon": 1.0, "delta": 1e-6},
                                public=False).events
    assert isinstance(threshold_events[0], ApproxDPEvent) and threshold_events[0].epsilon > 0


def test_a_weight_for_the_selection_asks_for_the_separate_step() -> None:
    compiled = _compile(_curator(), "private",
                        {"epsilon": 1.0, "delta": 1e-6,
                         "weights": {"partition_selection": 1.0}}, public=False)
    assert isinstance(compiled.selection, PartitionSelection)
    selection, count, median = compiled.events
    assert isinstance(selection, ApproxDPEvent) and selection.delta == 1e-6
    third = Fraction(1, 3)  # equal weights: each share is a third, rounded down
    assert third - Fraction(2**-50) < Fraction(selection.epsilon) <= third
    assert Fraction(median.epsilon) <= third and Fraction(count.epsilon) <= third


def test_only_basic_and_zcdp_budgets_take_queries() -> None:
    for public in (True, False):
        compiled = _compile(_curator(), "private", {"epsilon": 1.0, "delta": 1e-6}, public)
        with pytest.raises(UserError, match="not 'rdp' ones"):
            charge_cost(compiled, "rdp")


@settings(max_examples=300, deadline=None, derandomize=True)
@given(parts=st.lists(st.tuples(st.sampled_from(["pure", "approx", "zcdp"]),
                                st.floats(1e-12, 50.0), st.floats(0.0, 1e-3)),
                      min_size=1, max_size=6),
       nest=st.booleans())
def test_the_accounting_interpreter_prices_events_exactly_and_never_below(
        parts: list[tuple[str, float, float]], nest: bool) -> None:
    """``accounting.filters.event_cost``, the one interpreter of a query's events: the exact
    sums, rounded up (basic: epsilons and deltas; zCDP: rhos, epsilon^2 / 2 per pure part),
    whatever the nesting; a part a filter cannot hold is refused."""
    from fractions import Fraction

    from dpcurator.accounting.events import ApproxDPEvent, ComposedEvent, PureDPEvent, ZCDPEvent
    from dpcurator.accounting.filters import event_cost
    from dpcurator.errors import UnsupportedChargeError

    events = [PureDPEvent(v) if kind == "pure" else ZCDPEvent(v) if kind == "zcdp" else
              ApproxDPEvent(v, d) for kind, v, d in parts]
    event = ComposedEvent((ComposedEvent(tuple(events[:1])), *events[1:])) if nest else \
        ComposedEvent(tuple(events))
    kinds = {kind for kind, _, _ in parts}
    if "zcdp" in kinds:
        with pytest.raises(UnsupportedChargeError):
            event_cost(event, "basic")
    else:
        basic = event_cost(event, "basic")
        assert Fraction(basic.epsilon) >= sum(Fraction(v) for _, v, _ in parts)
        assert Fraction(basic.epsilon) - sum(Fraction(v) for _, v, _ in parts) <= \
            Fraction(basic.epsilon) * Fraction(1, 2**52)
        exact_delta = sum(Fraction(d) for kind, _, d in parts if kind == "approx")
        assert Fraction(getattr(basic, "delta", 0.0)) >= exact_delta
    if "approx" in kinds:
        with pytest.raises(UnsupportedChargeError):
            event_cost(event, "zcdp")
    else:
        rho = sum(Fraction(v) ** 2 / 2 if kind == "pure" else Fraction(v)
                  for kind, v, _ in parts)
        priced = Fraction(event_cost(event, "zcdp").rho)  # type: ignore[union-attr]
        assert rho <= priced <= rho * (1 + Fraction(1, 2**51))
