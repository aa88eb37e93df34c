"""Ledger entries, their hash chain, and the replay that checks a chain from its first entry.

Every entry is one canonical JSON object (sorted keys, no spaces, ASCII), and its hash is the
SHA-256 of those bytes. The object carries the hash of the entry before it (``prev``; the
first entry's ``prev`` is derived from the ledger's random id), so an edited, deleted or
reordered entry breaks the chain at the first place it touched. Each entry also carries its
account's running sums after it (``spent``) and its limits, so the newest entry of an account
says what was spent without re-reading the whole history, and the replay checks that every
sum is the exact sum of the prices before it.

Kinds of entry:

- ``open``: an account is created with its total (the guarantee, the composition rule, the
  limits in exact fractions); its sums start at zero.
- ``charge``: a conditional debit that fitted: the cost, its exact price in the account's
  currency, the label, the sums after it (each within its limit).
- ``raise``: the owner raised the total (every limit at least the old one); sums unchanged.
- ``migrated``: a charge imported from an older JSONL journal; recorded even if it does not
  fit, so that a journal that had overspent stays overspent.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dpcurator.accounting.filters import Cost, FilterRule, decode_cost, encode_cost
from dpcurator.errors import LedgerIntegrityError, UserError, UserTypeError

__all__ = ["AccountState", "Entry", "Replay", "copy_state", "entry_hash", "genesis",
           "make_body"]

FORMAT = "dpcurator-ledger"
VERSION = 1
KINDS = ("open", "charge", "raise", "migrated")


def genesis(ledger_id: str) -> str:
    """The ``prev`` of a ledger's first entry: bound to the ledger's random id."""
    return hashlib.sha256(f"{FORMAT}-v{VERSION}:{ledger_id}".encode()).hexdigest()


def canonical(body: dict[str, Any]) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


def entry_hash(text: str) -> str:
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _fractions(values: list[Fraction]) -> list[str]:
    return [str(v) for v in values]


def make_body(*, seq: int, prev: str, kind: str, account: str, time: float,
              spent: list[Fraction], limits: list[Fraction], label: str = "",
              cost: Cost | None = None, price: list[Fraction] | None = None,
              rule: FilterRule | None = None) -> str:
    """The canonical text of one entry (its hash is ``entry_hash`` of it)."""
    body: dict[str, Any] = {"v": VERSION, "seq": seq, "prev": prev, "kind": kind,
                            "account": account, "time": time, "label": label,
                            "spent": _fractions(spent), "limits": _fractions(limits)}
    if cost is not None:
        assert price is not None
        body["cost"] = encode_cost(cost)
        body["price"] = _fractions(price)
    if rule is not None:
        body["total"] = encode_cost(rule.total)
        body["composition"] = rule.composition
    return canonical(body)


@dataclass(frozen=True)
class Entry:
    """One verified ledger entry, decoded."""

    seq: int
    kind: str
    account: str
    time: float
    label: str
    cost: Cost | None
    spent: tuple[Fraction, ...]
    limits: tuple[Fraction, ...]
    hash: str
    prev: str
    body: str

    def to_json(self) -> dict[str, Any]:
        """The entry as stored (the canonical body) plus its hash: what an export holds."""
        data: dict[str, Any] = json.loads(self.body)
        data["hash"] = self.hash
        return data


@dataclass
class AccountState:
    """An account as the replay leaves it: its rule, limits and exact sums."""

    rule: FilterRule
    limits: list[Fraction]
    spent: list[Fraction]
    opened_at: int
    total_set_at: int
    charges: int = 0


def copy_state(state: AccountState) -> AccountState:
    return AccountState(state.rule, list(state.limits), list(state.spent), state.opened_at,
                        state.total_set_at, state.charges)


class Replay:
    """Checks entries one at a time, in order, and keeps every account's state.

    ``apply`` raises ``LedgerIntegrityError`` naming the first entry that is not what an
    honest ledger would have written: a gap or reorder in the sequence, a broken link, a hash
    that does not match the body, a price that is not the cost's, a sum that is not the sum of
    the prices, or a charge past its limit.
    """

    def __init__(self, where: str, first_prev: str) -> None:
        self.where = where
        self.seq = 0
        self.hash = first_prev
        self.accounts: dict[str, AccountState] = {}

    def snapshot(self) -> tuple[int, str, dict[str, AccountState]]:
        """The replay's state, to restore if a transaction does not commit."""
        return self.seq, self.hash, {k: copy_state(v) for k, v in self.accounts.items()}

    def restore(self, saved: tuple[int, str, dict[str, AccountState]]) -> None:
        self.seq, self.hash, self.accounts = saved[0], saved[1], saved[2]

    def _bad(self, seq: int, why: str) -> LedgerIntegrityError:
        return LedgerIntegrityError(
            f"ledger {self.where}: entry {seq} {why}; the ledger refuses to charge until its "
            "owner restores it (`dpcurator ledger verify` names what is wrong)")

    def apply(self, seq: int, account: str, kind: str, body: str, stored_hash: str) -> Entry:
        expected = self.seq + 1
        if seq != expected:
            if seq > expected:
                missing = (f"entry {expected}" if seq == expected + 1
                           else f"entries {expected} to {seq - 1}")
                raise self._bad(expected, f"is missing ({missing} deleted?)")
            raise self._bad(seq, "appears out of order")
        if entry_hash(body) != stored_hash:
            raise self._bad(seq, "does not match its hash (edited?)")
        try:
            data = json.loads(body)
            if not isinstance(data, dict):
                raise UserTypeError("not an object")
            if data.get("v") != VERSION:
                raise UserError(f"unknown entry version {data.get('v')!r}")
            ok = (data["seq"] == seq and data["account"] == account and data["kind"] == kind
                  and kind in KINDS)
            prev = str(data["prev"])
            spent = [Fraction(v) for v in data["spent"]]
            limits = [Fraction(v) for v in data["limits"]]
            label = str(data["label"])
            time = float(data["time"])
            cost = decode_cost(data["cost"]) if "cost" in data else None
            price = [Fraction(v) for v in data["price"]] if "price" in data else None
            rule = (FilterRule.make(decode_cost(data["total"]), data["composition"])
                    if "total" in data else None)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
            raise self._bad(seq, f"is unreadable ({type(exc).__name__})") from None
        if not ok:
            raise self._bad(seq, "disagrees with its own row (moved or edited?)")
        if prev != self.hash:
            raise self._bad(seq, "does not follow the entry before it (reordered, or an "
                                 "earlier entry deleted or replaced?)")
        self._check_meaning(seq, kind, account, spent, limits, cost, price, rule)
        self.seq, self.hash = seq, stored_hash
        return Entry(seq, kind, account, time, label, cost, tuple(spent), tuple(limits),
                     stored_hash, prev, body)

    def _check_meaning(self, seq: int, kind: str, account: str, spent: list[Fraction],
                       limits: list[Fraction], cost: Cost | None, price: list[Fraction] | None,
                       rule: FilterRule | None) -> None:
        state = self.accounts.get(account)
        if kind == "open":
            if state is not None:
                raise self._bad(seq, f"opens account {account!r} a second time")
            # The limits are taken as stored (hash-chained): recomputing them here would tie
            # old ledgers to this version's numerics (the zCDP conversion of a total).
            if rule is None or len(limits) != len(spent) or any(spent):
                raise self._bad(seq, "opens an account with inconsistent totals")
            self.accounts[account] = AccountState(rule, limits, spent, seq, seq)
            return
        if state is None:
            raise self._bad(seq, f"uses account {account!r} before it was opened")
        if kind == "raise":
            if (rule is None or rule.composition != state.rule.composition
                    or spent != state.spent
                    or len(limits) != len(state.limits)
                    or any(new < old for new, old in zip(limits, state.limits, strict=True))):
                raise self._bad(seq, "is a raise that changes more than the total")
            state.rule, state.limits, state.total_set_at = rule, limits, seq
            return
        # A charge, or a charge migrated from a JSONL journal.
        if cost is None or price is None:
            raise self._bad(seq, "is a charge without a cost")
        try:
            fair = state.rule.price(cost)
        except ValueError:
            raise self._bad(seq, "charges a cost its account cannot hold") from None
        if price != fair:
            raise self._bad(seq, "states a price that is not its cost's")
        if spent != [s + p for s, p in zip(state.spent, price, strict=True)]:
            raise self._bad(seq, "states running sums that are not the sum of the charges")
        if limits != state.limits:
            raise self._bad(seq, "changes the account's limits without a raise")
        if kind == "charge" and not FilterRule.fits(state.spent, price, state.limits):
            raise self._bad(seq, "records a charge past the account's total")
        state.spent = spent
        state.charges += 1
