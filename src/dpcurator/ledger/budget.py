"""A privacy budget: a total, a ledger of charges, and a refusal before anything overspends.

``Budget`` is a privacy filter (see ``dpcurator.accounting.filters`` for the composition rules
and their sources) whose state lives in a ledger, never in the object: every ``charge`` is
one conditional debit in one transaction of the ledger's database, committed (on disk, for
a file or a PostgreSQL ledger) before it returns. So any number of ``Budget`` objects,
threads and processes on one ledger (a SQLite file, or a ``postgresql://`` URL) share one
total and can never spend more than it, and a process killed at any moment leaves every
answered query with its charge. Without a ``journal`` the ledger is an in-memory SQLite
database private to the object.

The total is stored when the ledger is created. Opening the ledger again with a different
total is refused; the owner raises it explicitly (``Budget.raise_total``, or
``dpcurator ledger raise``), and the raise is itself a recorded entry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpcurator.accounting.filters import Amount, Composition, Cost, FilterRule
from dpcurator.accounting.guarantees import require_post_processing_closure
from dpcurator.errors import UnsupportedChargeError, UserError

from ._chain import AccountState, Entry
from ._ledger import Ledger
from ._open import open_ledger

__all__ = ["Amount", "Budget", "Charge"]

DEFAULT_ACCOUNT = "default"


@dataclass(frozen=True)
class Charge:
    """One accepted charge, as the ledger records it (``sequence`` is its entry number)."""

    sequence: int
    cost: Cost
    label: str
    timestamp: float


class Budget:
    """A privacy filter over a ledger: ``charge`` accepts a cost or refuses it whole.

    Args:
        total: the guarantee the whole interaction must keep (``PureDP``, ``ApproxDP``,
            ``ZCDP`` or ``RDP``); its neighbouring relation is the one every charge must be
            stated under. With an existing ledger it must equal the stored total (or be left
            out: ``Budget.open``).
        composition: the filter's rule, by default ``"basic"`` for PureDP/ApproxDP, ``"zcdp"``
            for ZCDP and ``"rdp"`` for RDP totals.
        journal: the ledger: a SQLite file, or a ``postgresql://`` URL (``?schema=NAME``
            optional; needs ``dpcurator[postgres]``), created with ``total`` if it does not
            exist.
        account: the account in the ledger (one ledger may hold several budgets).
        ledger: an open ledger to use instead of a ``journal`` path (several budgets, say a
            service's, sharing one connection).
    """

    def __init__(
        self,
        total: Cost | None = None,
        *,
        composition: Composition | None = None,
        journal: str | os.PathLike[str] | None = None,
        account: str = DEFAULT_ACCOUNT,
        ledger: Ledger | None = None,
    ) -> None:
        if total is None and journal is None and ledger is None:
            raise UserError("a Budget needs its total (or the journal of an existing ledger)")
        if journal is not None and ledger is not None:
            raise UserError("give journal= (a ledger's path) or ledger= (an open ledger), not "
                            "both")
        # a probabilistic-DP total is refused with its reason (not closed under post-processing)
        require_post_processing_closure(total, "a budget", UnsupportedChargeError)
        if total is not None and not isinstance(total, Cost):
            raise UnsupportedChargeError(
                "total must be a PureDP, ApproxDP, ZCDP or RDP guarantee, "
                f"got {type(total).__name__}")
        rule = FilterRule.make(total, composition) if total is not None else None
        self._owns_store = ledger is None
        self._store: Ledger = ledger if ledger is not None else open_ledger(journal)
        self.account = account
        try:
            if rule is None:
                state = self._store.account(account)
                if state is None:
                    raise UserError(f"the ledger {self._store.where} has no budget yet; give "
                                    "its total to create it")
            else:
                state = self._store.open_account(account, rule)
        except BaseException:
            if self._owns_store:
                self._store.close()
            raise
        self.composition: Composition = state.rule.composition

    @classmethod
    def open(cls, journal: str | os.PathLike[str], account: str = DEFAULT_ACCOUNT) -> Budget:
        """The budget an existing ledger (a file, or a ``postgresql://`` URL) holds, with
        the total stored in it; a ledger that does not exist is refused, never created."""
        store = open_ledger(journal, create=False)
        try:
            budget = cls(None, ledger=store, account=account)
        except BaseException:
            store.close()
            raise
        budget._owns_store = True
        return budget

    # -- what it holds -------------------------------------------------------------------------

    @property
    def path(self) -> Path | None:
        """The ledger file, or None for an in-memory budget or one not in a file."""
        path = getattr(self._store, "path", None)
        return path if isinstance(path, Path) else None

    @property
    def ledger_store(self) -> Ledger:
        """The ledger this budget's account lives in."""
        return self._store

    @property
    def total(self) -> Cost:
        """The total as it stands now (the owner may have raised it since creation)."""
        return self._current().rule.total

    def _current(self) -> AccountState:
        state = self._store.account(self.account)
        if state is None:  # pragma: no cover - accounts are never removed
            raise UserError(f"the ledger has no account {self.account!r}")
        return state

    # -- the filter ----------------------------------------------------------------------------

    def can_afford(self, cost: Cost) -> bool:
        """Whether ``charge(cost)`` would be accepted now (nothing is recorded).

        Another process may spend in between: only ``charge`` decides.
        """
        state = self._current()
        return FilterRule.fits(state.spent, state.rule.price(cost), state.limits)

    def charge(self, cost: Cost, label: str = "") -> Charge:
        """Record ``cost`` or refuse it whole (``BudgetExceededError``, nothing recorded).

        The charge is committed to the ledger (on disk, for a file) before this returns.
        """
        return _charge_of(self._store.debit(self.account, cost, str(label)))

    def raise_total(self, total: Cost, label: str = "") -> None:
        """Raise the total (every part at least the current one); recorded in the ledger."""
        self._store.raise_total(self.account, total, str(label))

    # -- the odometer --------------------------------------------------------------------------

    @property
    def ledger(self) -> tuple[Charge, ...]:
        """Every accepted charge, in order."""
        return tuple(_charge_of(e) for e in self._store.entries(self.account)
                     if e.kind in ("charge", "migrated"))

    @property
    def spent(self) -> Amount:
        """What the accepted charges add up to in the filter's currency (rounded up)."""
        state = self._current()
        return state.rule.amount(state.spent, up=True)

    @property
    def remaining(self) -> Amount:
        """What is left before the filter refuses (rounded down; never below zero)."""
        state = self._current()
        left = [max(lim - s, 0 * lim) for lim, s in zip(state.limits, state.spent, strict=True)]
        return state.rule.amount(left, up=False)

    def close(self) -> None:
        """Close the ledger's connection if this budget opened it (a ``ledger=`` given to it
        stays open); the object cannot charge afterwards."""
        if self._owns_store:
            self._store.close()

    def __enter__(self) -> Budget:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = self._current()
        where = f", journal={self._store.where!r}" if self._store.where != ":memory:" else ""
        return (f"Budget(total={state.rule.total}, composition={self.composition!r}, "
                f"charges={state.charges}{where})")


def _charge_of(entry: Entry) -> Charge:
    assert entry.cost is not None
    return Charge(entry.seq, entry.cost, entry.label, entry.time)
