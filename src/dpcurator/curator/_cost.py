"""What a query costs: the events it will run, priced once in the budget's currency.

A compiled query records what it will run as events, in the order they run: the partition
selection (private keys only), then each aggregate's mechanisms. Each part is recorded at its
mechanism's *stated guarantee* (``stated_event``), the statement the budgets' filters read. For
``SELECT g, COUNT(*), MEDIAN(x) FROM data GROUP BY g`` asked with ``epsilon=1, delta=1e-6``
and no public keys (equal weights, each share rounded down, each measure's a little less):

    ComposedEvent((
        ApproxDPEvent(0.333.., 1e-06),  # select_partitions: partition selection
        PureDPEvent(0.333..),           # COUNT(*): discrete Laplace on the row counts
        PureDPEvent(0.333..),           # MEDIAN(x): the dyadic tree's discrete Laplace
    ))

(with ``noise="gaussian"`` or ``rho=`` the aggregates' parts are ``ZCDPEvent(rho)``s.)

``query_cost`` is the one place a query is priced (once, when it is prepared); the events
are interpreted by the accounting package (``accounting.filters.event_cost`` and
``event_totals``), the same interpreter a budget's filter uses:

- ``"basic"`` (an (epsilon, delta) budget, basic composition; Dwork and Roth 2014, Theorem
  3.16): the query's stated guarantee, its request (``PureDP(epsilon)`` when no part spends
  delta, else ``ApproxDP(epsilon, delta)``). ``check_within`` proved at compile time that the events
  compose within it: the shares are rounded down, so the exact sums of the parts' epsilons
  and deltas never exceed it, and the Gaussian parts' rhos never exceed the rho converted
  from their share of (epsilon, delta) (Canonne, Kamath and Steinke 2020).
- ``"zcdp"``: the exact sum of the parts' rhos, rounded up: a pure epsilon-DP part costs
  epsilon^2 / 2 (Bun and Steinke 2016, Proposition 1.4), a zCDP part its rho (zCDP composes
  by adding rhos, ibid. Lemma 1.7). An approximate-DP part (a private partition selection)
  has no zCDP guarantee and is refused.

Every guarantee here is for add/remove one privacy unit (the curator's only relation).
Arithmetic is exact (floats taken at their binary values, ``fractions.Fraction``) and the
charge is rounded up, so a budget never overspends through rounding.

Why the stated guarantees and not the mechanisms' exact noise profiles (``mechanism.event``,
for the PLD and RDP accountants): the budgets here are (epsilon, delta) and rho filters, which
read guarantees, and the profiles restate them with rounding of their own (the discrete
Gaussian's sigma is inflated by 2^-50, a tree's Laplace scale rounded down), which would move
charges by a few units in the last place.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from dpcurator.accounting import ZCDP, ApproxDP, PureDP
from dpcurator.accounting.events import (
    ApproxDPEvent,
    ComposedEvent,
    PureDPEvent,
    ZCDPEvent,
)
from dpcurator.accounting.filters import event_cost, event_totals
from dpcurator.errors import InternalError, UnsupportedChargeError, UserError

__all__ = ["check_within", "query_cost", "stated_event", "within_charge"]

Stated = PureDP | ApproxDP | ZCDP


def stated_event(guarantee: Stated) -> PureDPEvent | ApproxDPEvent | ZCDPEvent:
    """A mechanism's guarantee as an event (what a filter prices)."""
    if isinstance(guarantee, PureDP):
        return PureDPEvent(guarantee.epsilon)
    if isinstance(guarantee, ApproxDP):
        return ApproxDPEvent(guarantee.epsilon, guarantee.delta)
    if isinstance(guarantee, ZCDP):
        return ZCDPEvent(guarantee.rho)
    raise InternalError(f"a curator mechanism states a {type(guarantee).__name__} guarantee; "
                        "this is a bug")


def query_cost(event: ComposedEvent, stated: Stated, composition: str) -> Stated:
    """The guarantee to charge for a query's events, in a budget's currency (module docstring),
    as the accounting package's interpreter of events prices them (``event_cost``).

    ``stated`` is the query's own guarantee (its request), which the events compose within:
    a basic budget is charged it (the events' sums, each share rounded down, are at most it)."""
    if composition == "basic":
        if isinstance(stated, ZCDP):
            raise UserError("this budget is (epsilon, delta); ask with epsilon= "
                            "(and delta=, noise='gaussian' for Gaussian noise), not rho=")
        return stated
    if composition != "zcdp":
        raise UserError(f"queries are charged to (epsilon, delta) or zCDP budgets, not "
                        f"{composition!r} ones")
    try:
        cost = event_cost(event, "zcdp")
    except UnsupportedChargeError:
        raise UserError("this budget is zCDP, which cannot account a private partition "
                        "selection (approximate DP); pass keys=... (public partitions) or "
                        "use an (epsilon, delta) budget") from None
    if not isinstance(cost, ZCDP):
        raise InternalError("a zCDP price that is not a ZCDP; this is a bug")
    return cost


def check_within(event: ComposedEvent, *, epsilon: float | None, delta: float,
                 rho: Fraction) -> None:
    """The parts compose within what was allocated to them, exactly, or it is a bug.

    The (epsilon, delta) parts' sums must stay within ``epsilon`` and ``delta`` (unless
    ``epsilon`` is None: a rho request has none), and the zCDP parts' rhos within ``rho``
    (sums by the accounting package's ``event_totals``).
    """
    eps_sum, delta_sum, rho_sum = event_totals(event)
    if rho_sum > rho:
        raise InternalError("the mechanisms' rho exceed the allocation; this is a bug")
    if epsilon is None:
        if eps_sum or delta_sum:
            raise InternalError("a rho request ran an (epsilon, delta) mechanism; this is a bug")
        return
    if eps_sum > Fraction(epsilon) or delta_sum > Fraction(delta):
        raise InternalError("the mechanisms' epsilons or deltas exceed the request; "
                            "this is a bug")


def within_charge(choices: ComposedEvent, answer: Any, path: ComposedEvent,
                  charged: ComposedEvent, allowed: Any) -> bool:
    """Whether another path a query may take (``_compile._prove_retry``) composes within what
    it is charged, in both currencies a budget uses (``query_cost``).

    ``choices`` are the path's choices (pure epsilon-DP, or zCDP under a rho request),
    ``answer`` the request its answer is compiled at (``_compile_plain`` checks that the
    answer's mechanisms compose within it), ``path`` every event of the path, ``charged``
    every event of the path the query is charged for, ``allowed`` the part of the request
    the choices and the answer share on either path (the request less a total interval's
    part, which both paths spend alike). Basic composition: the choices' epsilons (or rhos)
    plus the answer's within ``allowed``, the answer's delta ``allowed``'s (the choices spend
    none). In rho: the path's price (``event_cost``) no more than the charged path's, where
    that has one (a private partition selection has none, and a zCDP budget refuses the
    query)."""
    eps_sum, delta_sum, rho_sum = event_totals(choices)
    if delta_sum or answer.delta != allowed.delta:
        return False
    if allowed.rho is not None:
        if eps_sum or answer.rho is None or \
                rho_sum + Fraction(answer.rho) > Fraction(allowed.rho):
            return False
    elif rho_sum or answer.epsilon is None or \
            eps_sum + Fraction(answer.epsilon) > Fraction(allowed.epsilon):
        return False
    try:
        charged_rho = event_cost(charged, "zcdp")
    except UnsupportedChargeError:
        return True
    price = event_cost(path, "zcdp")
    assert isinstance(price, ZCDP) and isinstance(charged_rho, ZCDP)
    return Fraction(price.rho) <= Fraction(charged_rho.rho)
