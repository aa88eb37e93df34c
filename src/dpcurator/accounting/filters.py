"""The arithmetic of a privacy filter: what a total allows and what each charge costs, exactly.

A *privacy filter* (Rogers, Roth, Ullman and Vadhan, "Privacy odometers and filters:
pay-as-you-go composition", NeurIPS 2016) accepts charges one by one, each possibly chosen after
seeing earlier results (fully adaptive composition), and refuses a charge -- recording nothing --
when accepting it could break the total guarantee. The composition rule decides which filters
are valid:

- ``"basic"`` (for ``PureDP`` and ``ApproxDP`` totals): accept while the sum of epsilons and the
  sum of deltas stay within the total. Basic composition is a valid filter under fully
  adaptive choice of the parameters (Rogers et al. 2016, Section 3).
- ``"zcdp"`` (for ``ZCDP`` totals, or an ``ApproxDP`` total converted with the tight
  conversion of Canonne, Kamath and Steinke 2020): accept while the sum of rhos stays within
  the total. Pure epsilon-DP charges cost epsilon^2 / 2 (Bun and Steinke 2016, Prop. 1.4).
  Valid under full adaptivity: the Renyi filter of Feldman and Zrnic ("Individual privacy
  accounting via a Renyi filter", NeurIPS 2021, Theorem 3.1) holds at every order alpha, where
  rho-zCDP is the line rho * alpha.
- ``"rdp"`` (for ``RDP`` totals): accept while, at every order of the total, the sum of the
  charges' epsilon(alpha) stays within the total's (Feldman and Zrnic 2021, Theorem 3.1, at
  each order).

Not offered on purpose: filtering on a composed privacy-loss distribution (the "natural"
f-DP filter) is not valid under fully adaptive composition (Tran, Koskela, Raisa and Honkela
2026, "f-Differential privacy filters: validity and approximate solutions"); PLDs are for
accounting fixed sequences, such as DP-SGD, before they run.

Everything here is pure arithmetic on exact fractions: a total becomes a vector of *limits*,
a charge a vector of *prices* in the same currency, and a charge fits when every running sum
plus its price stays within its limit. Floats are taken at their exact binary values, so
repeated subtraction can never overspend through rounding. Where the state lives (memory,
SQLite, PostgreSQL) is the ``ledger`` package's business.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from dpcurator.accounting.conversions import zcdp_rho_for
from dpcurator.accounting.events import (
    ApproxDPEvent,
    ComposedEvent,
    DpEvent,
    PureDPEvent,
    ZCDPEvent,
)
from dpcurator.accounting.guarantees import (
    RDP,
    ZCDP,
    ApproxDP,
    Neighbouring,
    PureDP,
    require_post_processing_closure,
)
from dpcurator.errors import UnsupportedChargeError, UserError

__all__ = ["Amount", "Composition", "Cost", "FilterRule", "decode_cost", "encode_cost",
           "event_cost", "event_totals"]

Composition = Literal["basic", "zcdp", "rdp"]
Cost = PureDP | ApproxDP | ZCDP | RDP

# An infinite epsilon at an RDP order: the total's is a limit no finite charge reaches, a
# charge's is larger than any total's (so it is refused rather than compared as infinity).
_INFINITE_LIMIT = Fraction(10**300)
_INFINITE_PRICE = Fraction(10**301)


@dataclass(frozen=True)
class Amount:
    """An amount of privacy loss in the budget's currency (unused fields are None)."""

    epsilon: float | None = None
    delta: float | None = None
    rho: float | None = None
    rdp: tuple[float, ...] | None = None

    def describe(self) -> str:
        """``epsilon=0.5, delta=1e-06`` (or the RDP orders' count)."""
        parts = [f"{name}={value:g}" for name, value in
                 (("epsilon", self.epsilon), ("delta", self.delta), ("rho", self.rho))
                 if value is not None]
        if self.rdp is not None:
            parts.append(f"rdp at {len(self.rdp)} orders")
        return ", ".join(parts)


@dataclass(frozen=True)
class FilterRule:
    """How a total limits a filter, and how each cost is priced, in exact fractions.

    ``total`` is the guarantee the whole interaction must keep (its neighbouring relation is
    the one every charge must be stated under); ``composition`` picks the filter (see the
    module docstring), by default ``"basic"`` for PureDP/ApproxDP, ``"zcdp"`` for ZCDP and
    ``"rdp"`` for RDP totals.
    """

    total: Cost
    composition: Composition

    @classmethod
    def make(cls, total: Cost, composition: Composition | None = None) -> FilterRule:
        require_post_processing_closure(total, "a budget", UnsupportedChargeError)
        if not isinstance(total, PureDP | ApproxDP | ZCDP | RDP):
            raise UnsupportedChargeError(
                "total must be a PureDP, ApproxDP, ZCDP or RDP guarantee, "
                f"got {type(total).__name__}")
        rule = cls(total, composition or default_composition(total))
        rule.limits()  # refuses a composition that cannot hold this total
        return rule

    def limits(self) -> list[Fraction]:
        """The total as limits on the running sums."""
        total, c = self.total, self.composition
        if c == "basic":
            if isinstance(total, PureDP):
                return [Fraction(total.epsilon), Fraction(0)]
            if isinstance(total, ApproxDP):
                return [Fraction(total.epsilon), Fraction(total.delta)]
        elif c == "zcdp":
            if isinstance(total, ZCDP):
                return [Fraction(total.rho)]
            if isinstance(total, ApproxDP):
                if total.epsilon <= 0 or total.delta <= 0:
                    raise UnsupportedChargeError(
                        "a zCDP filter needs an ApproxDP total with epsilon > 0 and delta > 0")
                # Largest rho whose tight conversion gives (epsilon, delta), rounded down.
                return [Fraction(zcdp_rho_for(total.epsilon, total.delta))]
        elif c == "rdp":
            if isinstance(total, RDP):
                return [Fraction(e) if math.isfinite(e) else _INFINITE_LIMIT
                        for e in total.epsilons]
        else:
            raise UnsupportedChargeError(
                f"composition must be 'basic', 'zcdp' or 'rdp', got {c!r}")
        raise UnsupportedChargeError(
            f"composition={c!r} cannot hold a {type(total).__name__} total; "
            f"use {default_composition(total)!r}")

    def price(self, cost: Cost) -> list[Fraction]:
        """The cost in the filter's currency, exactly; refuses what the filter cannot hold."""
        require_post_processing_closure(cost, "a budget", UnsupportedChargeError)
        if not isinstance(cost, PureDP | ApproxDP | ZCDP | RDP):
            raise UnsupportedChargeError(
                f"cost must be a PureDP, ApproxDP, ZCDP or RDP guarantee, "
                f"got {type(cost).__name__}")
        if cost.neighbouring is not self.total.neighbouring:
            raise UnsupportedChargeError(
                f"the cost is stated under '{cost.neighbouring}' but the budget under "
                f"'{self.total.neighbouring}'; state both under the same relation")
        c = self.composition
        if c == "basic":
            if isinstance(cost, PureDP):
                return [Fraction(cost.epsilon), Fraction(0)]
            if isinstance(cost, ApproxDP):
                return [Fraction(cost.epsilon), Fraction(cost.delta)]
            raise UnsupportedChargeError(
                f"a basic-composition budget takes PureDP or ApproxDP costs, not "
                f"{type(cost).__name__}; create the Budget with composition='zcdp' or 'rdp'")
        if c == "zcdp":
            if isinstance(cost, ZCDP):
                return [Fraction(cost.rho)]
            if isinstance(cost, PureDP):
                return [Fraction(cost.epsilon) ** 2 / 2]  # Bun and Steinke 2016, Prop. 1.4
            raise UnsupportedChargeError(
                f"a zCDP budget takes ZCDP or PureDP costs, not {type(cost).__name__}")
        assert isinstance(self.total, RDP)
        orders = self.total.orders
        if isinstance(cost, RDP):
            table = dict(zip(cost.orders, cost.epsilons, strict=True))
            if not all(a in table for a in orders):
                raise UnsupportedChargeError(
                    "an RDP cost must give epsilon at every order of the budget's total")
            return [Fraction(table[a]) if math.isfinite(table[a]) else _INFINITE_PRICE
                    for a in orders]
        if isinstance(cost, ZCDP):
            return [Fraction(cost.rho) * Fraction(a) for a in orders]
        if isinstance(cost, PureDP):
            eps = Fraction(cost.epsilon)
            # D_alpha <= epsilon, and <= alpha epsilon^2 / 2 via zCDP (Bun and Steinke 2016).
            return [min(eps, Fraction(a) * eps * eps / 2) for a in orders]
        raise UnsupportedChargeError(
            f"an RDP budget takes RDP, ZCDP or PureDP costs, not {type(cost).__name__}")

    def measures(self) -> tuple[str, tuple[float, ...]]:
        """What the limits measure: the composition and, for ``"rdp"``, the total's orders.

        Two rules with the same ``measures`` hold their running sums in the same currency,
        entry by entry; limits may only be compared (a raise, a reopen) between such rules.
        An RDP sum at order 2 says nothing of order 10 (Mironov 2017, Definition 4: each
        order is its own divergence), so comparing them would let charges past the total.
        """
        orders = self.total.orders if isinstance(self.total, RDP) else ()
        return self.composition, orders

    def zero(self) -> list[Fraction]:
        return [Fraction(0)] * len(self.limits())

    @staticmethod
    def fits(spent: Sequence[Fraction], price: Sequence[Fraction],
             limits: Sequence[Fraction]) -> bool:
        """Whether every running sum plus its price stays within its limit."""
        return all(s + p <= lim for s, p, lim in zip(spent, price, limits, strict=True))

    def amount(self, values: Sequence[Fraction], *, up: bool) -> Amount:
        """Exact sums as floats, rounded ``up`` (what was spent) or down (what is left)."""
        floats = tuple(_round(v, up) for v in values)
        if self.composition == "basic":
            return Amount(epsilon=floats[0], delta=floats[1])
        if self.composition == "zcdp":
            return Amount(rho=floats[0])
        return Amount(rdp=floats)


def default_composition(total: Cost) -> Composition:
    if isinstance(total, ZCDP):
        return "zcdp"
    if isinstance(total, RDP):
        return "rdp"
    return "basic"


def _round(value: Fraction, up: bool) -> float:
    f = float(value)
    if up and Fraction(f) < value:
        return math.nextafter(f, math.inf)
    if not up and Fraction(f) > value:
        return math.nextafter(f, -math.inf)
    return f


def encode_cost(cost: Cost) -> dict[str, Any]:
    """A guarantee as plain JSON data (floats round-trip exactly through ``json``)."""
    data: dict[str, Any] = {"type": type(cost).__name__, "neighbouring": cost.neighbouring.name}
    if isinstance(cost, PureDP):
        data["epsilon"] = cost.epsilon
    elif isinstance(cost, ApproxDP):
        data.update(epsilon=cost.epsilon, delta=cost.delta)
    elif isinstance(cost, ZCDP):
        data["rho"] = cost.rho
    else:
        data.update(orders=list(cost.orders),
                    epsilons=[e if math.isfinite(e) else "inf" for e in cost.epsilons])
    return data


def decode_cost(data: dict[str, Any]) -> Cost:
    """The inverse of ``encode_cost``; raises KeyError, TypeError or ValueError on bad data."""
    relation = Neighbouring[data["neighbouring"]]
    kind = data["type"]
    if kind == "PureDP":
        return PureDP(float(data["epsilon"]), relation)
    if kind == "ApproxDP":
        return ApproxDP(float(data["epsilon"]), float(data["delta"]), relation)
    if kind == "ZCDP":
        return ZCDP(float(data["rho"]), relation)
    if kind == "RDP":
        return RDP(tuple(float(a) for a in data["orders"]),
                   tuple(float(e) for e in data["epsilons"]), relation)
    raise UserError(f"unknown guarantee type {kind!r}")


def event_totals(event: DpEvent) -> tuple[Fraction, Fraction, Fraction]:
    """The exact (sum of epsilons, sum of deltas) of an event's (epsilon, delta) parts and the
    sum of its zCDP parts' rhos: what a filter reads of a composition of stated guarantees
    (``PureDPEvent``, ``ApproxDPEvent``, ``ZCDPEvent``, composed in any nesting). Other
    events (a mechanism's exact noise profile) are for the PLD and RDP accountants."""
    match event:
        case ComposedEvent(events=parts):
            sums = [event_totals(part) for part in parts]
            return (sum((s[0] for s in sums), Fraction(0)),
                    sum((s[1] for s in sums), Fraction(0)),
                    sum((s[2] for s in sums), Fraction(0)))
        case PureDPEvent(epsilon=epsilon):
            return Fraction(epsilon), Fraction(0), Fraction(0)
        case ApproxDPEvent(epsilon=epsilon, delta=delta):
            return Fraction(epsilon), Fraction(delta), Fraction(0)
        case ZCDPEvent(rho=rho):
            return Fraction(0), Fraction(0), Fraction(rho)
    raise UnsupportedChargeError(f"a filter prices stated guarantees, not a "
                                 f"{type(event).__name__}")


def _event_rho(event: DpEvent) -> Fraction:
    """The exact zCDP rho of an event of stated guarantees (an approximate-DP part has none)."""
    match event:
        case ComposedEvent(events=parts):
            return sum((_event_rho(part) for part in parts), Fraction(0))
        case PureDPEvent(epsilon=epsilon):
            return Fraction(epsilon) ** 2 / 2  # Bun and Steinke 2016, Prop. 1.4
        case ZCDPEvent(rho=rho):
            return Fraction(rho)
        case ApproxDPEvent():
            raise UnsupportedChargeError(
                "a zCDP filter cannot account an approximate-DP part (epsilon, delta)")
    raise UnsupportedChargeError(f"a filter prices stated guarantees, not a "
                                 f"{type(event).__name__}")


def event_cost(event: DpEvent, composition: Composition) -> Cost:
    """What an event of stated guarantees costs in a filter of ``composition``, rounded up:
    basic, the sums of its epsilons and deltas (``PureDP`` when no part spends delta; basic
    composition, Dwork and Roth 2014, Theorem 3.16, valid in a filter by Rogers et al. 2016);
    zCDP, the sum of its parts' rhos (a pure part epsilon^2 / 2; Bun and Steinke 2016,
    Proposition 1.4 and Lemma 1.7). Every part is stated under add/remove one unit."""
    if composition == "basic":
        epsilon, delta, rho = event_totals(event)
        if rho:
            raise UnsupportedChargeError("a basic-composition filter cannot account a zCDP part")
        up_epsilon = _round(epsilon, True)
        return ApproxDP(up_epsilon, _round(delta, True)) if delta else PureDP(up_epsilon)
    if composition == "zcdp":
        return ZCDP(_round(_event_rho(event), True))
    raise UnsupportedChargeError(f"events are priced in basic or zcdp filters, not "
                                 f"{composition!r}")
