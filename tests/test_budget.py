"""The budget is a privacy filter: exact, refusing whole, thread-safe and durable.

The ledger under it (processes, crashes, tampering) is tested in tests/test_ledger*.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpcurator as dp
from dpcurator.accounting import RDP
from dpcurator.accounting.conversions import zcdp_rho_for, zcdp_to_delta
from dpcurator.errors import BudgetExceededError, LedgerIntegrityError, UnsupportedChargeError
from dpcurator.ledger import Budget


def test_basic_filter_accepts_until_the_total_and_refuses_whole() -> None:
    budget = Budget(dp.ApproxDP(1.0, 1e-6))
    budget.charge(dp.PureDP(0.5), "count")
    budget.charge(dp.ApproxDP(0.25, 5e-7), "sum")
    assert budget.remaining.epsilon == 0.25
    with pytest.raises(BudgetExceededError, match="nothing was charged"):
        budget.charge(dp.PureDP(0.3), "too much")
    assert len(budget.ledger) == 2  # the refused charge left no trace
    assert budget.spent.epsilon == 0.75
    with pytest.raises(BudgetExceededError):
        budget.charge(dp.ApproxDP(0.25, 6e-7))  # epsilon fits, delta does not
    budget.charge(dp.PureDP(0.25))  # exactly what is left is still affordable
    assert budget.remaining.epsilon == 0.0


def test_exact_arithmetic_never_overspends_through_rounding() -> None:
    # 0.1 ten times is not 1.0 in floating point; the budget must still accept exactly ten.
    budget = Budget(dp.PureDP(1.0))
    accepted = 0
    for _ in range(11):
        if budget.can_afford(dp.PureDP(0.1)):
            budget.charge(dp.PureDP(0.1))
            accepted += 1
    # Ten times the double nearest 0.1 exceeds 1 exactly (0.1 is stored slightly above
    # one tenth), so the exact filter accepts only nine: it never rounds in the user's favour.
    assert accepted == 9
    assert budget.spent.epsilon is not None and budget.spent.epsilon <= 1.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=1e-6, max_value=0.5), min_size=1, max_size=40))
def test_the_sum_of_accepted_charges_never_exceeds_the_total(costs: list[float]) -> None:
    budget = Budget(dp.PureDP(1.0))
    total = 0.0
    for eps in costs:
        try:
            budget.charge(dp.PureDP(eps))
            total = total + eps
        except BudgetExceededError:
            pass
    from fractions import Fraction

    exact = sum((Fraction(c.cost.epsilon) for c in budget.ledger), Fraction(0))
    assert exact <= 1


def test_zcdp_filter_for_an_approx_total() -> None:
    budget = Budget(dp.ApproxDP(1.0, 1e-5), composition="zcdp")
    rho_total = zcdp_rho_for(1.0, 1e-5)
    assert zcdp_to_delta(rho_total, 1.0) <= 1e-5
    budget.charge(dp.ZCDP(rho_total / 2))
    budget.charge(dp.PureDP(0.1))  # costs 0.005
    assert budget.remaining.rho == pytest.approx(rho_total / 2 - 0.005)
    with pytest.raises(UnsupportedChargeError, match="ZCDP or PureDP"):
        budget.charge(dp.ApproxDP(0.1, 1e-9))


def test_rdp_filter_checks_every_order() -> None:
    total = RDP((2.0, 8.0, 32.0), (1.0, 2.0, 4.0))
    budget = Budget(total)
    budget.charge(dp.ZCDP(0.05))  # 0.1, 0.4, 1.6
    budget.charge(dp.ZCDP(0.05))  # 0.2, 0.8, 3.2
    with pytest.raises(BudgetExceededError):
        budget.charge(dp.ZCDP(0.05))  # order 32 would reach 4.8 > 4
    budget.charge(dp.PureDP(0.5))  # min(eps, alpha eps^2 / 2): 0.25, 0.5, 0.5
    assert budget.spent.rdp == pytest.approx((0.45, 1.3, 3.7))


def test_refuses_what_it_cannot_account_and_mismatched_relations() -> None:
    with pytest.raises(UnsupportedChargeError, match="composition='zcdp'"):
        Budget(dp.PureDP(1.0)).charge(dp.ZCDP(0.1))
    with pytest.raises(UnsupportedChargeError, match="same relation"):
        Budget(dp.PureDP(1.0)).charge(dp.PureDP(0.1, dp.Neighbouring.REPLACE))
    with pytest.raises(UnsupportedChargeError, match="composition"):
        Budget(dp.PureDP(1.0), composition="rdp")


def test_thread_safe_charging_never_overspends() -> None:
    budget = Budget(dp.PureDP(1.0))
    cost = dp.PureDP(2.0**-7)  # exactly 128 charges fit

    def worker() -> None:
        for _ in range(100):
            try:
                budget.charge(cost)
            except BudgetExceededError:
                return

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(budget.ledger) == 128
    assert budget.remaining.epsilon == 0.0


def test_journal_survives_a_restart(tmp_path: Path) -> None:
    journal = tmp_path / "ledger.sqlite"
    first = Budget(dp.ApproxDP(1.0, 1e-6), journal=journal)
    first.charge(dp.PureDP(0.6), "first query")
    first.charge(dp.ApproxDP(0.3, 1e-7), "second query")
    again = Budget(dp.ApproxDP(1.0, 1e-6), journal=journal)  # a new process, same journal
    assert [c.label for c in again.ledger] == ["first query", "second query"]
    assert again.spent.epsilon == pytest.approx(0.9)
    with pytest.raises(BudgetExceededError):
        again.charge(dp.PureDP(0.2))
    first.close()
    again.close()
    journal.write_bytes(b"")  # emptied: never a refund
    with pytest.raises(LedgerIntegrityError, match="is empty"):
        Budget(dp.ApproxDP(1.0, 1e-6), journal=journal)
