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
- ``raise``: the owner raised the total (every limit at least the old one, on the same RDP
  orders: a sum at one order bounds nothing at another); sums unchanged.
- ``migrated``: a charge imported from an older JSONL journal; recorded even if it does not
  fit, so that a journal that had overspent stays overspent.
- ``request``: the service recorded a request (a row of the ``requests`` table: who asked
  what, its idempotency key, its label, the entry of its first charge); the entry holds the
  row's id and the SHA-256 of its canonical text (``request_digest``). Its account is
  ``request/<id>``, never a budget's.
- ``release``: the release stored under a request, once: the SHA-256 of its text.

So the requests table is covered by the chain as the entries are: a row edited, inserted or
deleted, or a release edited or removed, no longer matches the entries that record it
(``Ledger.verify`` checks every row; each operation checks the rows it reads).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dpcurator.accounting.filters import Cost, FilterRule, decode_cost, encode_cost
from dpcurator.errors import LedgerIntegrityError, UserError, UserTypeError

__all__ = ["REQUEST_ACCOUNT", "AccountState", "Entry", "Recorded", "Replay", "copy_state",
           "entry_hash", "genesis", "make_body", "request_digest", "text_digest"]

FORMAT = "dpcurator-ledger"
VERSION = 1
KINDS = ("open", "charge", "raise", "migrated", "request", "release")
RECORD_KINDS = ("request", "release")  # entries of the requests table, not of a budget
REQUEST_ACCOUNT = "request/"  # the account column of a request's entries: request/<id>
DIGEST_BYTES = 16  # of each entry's hash kept in memory by a replay (2^128: no second preimage)


def genesis(ledger_id: str) -> str:
    """The ``prev`` of a ledger's first entry: bound to the ledger's random id."""
    return hashlib.sha256(f"{FORMAT}-v{VERSION}:{ledger_id}".encode()).hexdigest()


def canonical(body: Any) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


def entry_hash(text: str) -> str:
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def text_digest(text: str) -> str:
    """The SHA-256 (hex) of a text, as a ``release`` entry records a stored release."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def request_digest(request_id: str, analyst: str, dataset: str, idempotency_key: str | None,
                   fingerprint: str, created: float, first_entry: int, label: str) -> str:
    """The SHA-256 of a request row's canonical text (every column but its release)."""
    return text_digest(canonical([request_id, analyst, dataset, idempotency_key, fingerprint,
                                  created, first_entry, label]))


def _fractions(values: list[Fraction]) -> list[str]:
    return [str(v) for v in values]


def make_body(*, seq: int, prev: str, kind: str, account: str, time: float,
              spent: list[Fraction], limits: list[Fraction], label: str = "",
              cost: Cost | None = None, price: list[Fraction] | None = None,
              rule: FilterRule | None = None, record: dict[str, str] | None = None) -> str:
    """The canonical text of one entry (its hash is ``entry_hash`` of it); ``record`` is a
    ``request`` or ``release`` entry's ``{"id", "digest"}``."""
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
    if record is not None:
        body["record"] = {"id": record["id"], "digest": record["digest"]}
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
    record: dict[str, str] | None = None  # a request or release entry's {"id", "digest"}

    def to_json(self) -> dict[str, Any]:
        """The entry as stored (the canonical body) plus its hash: what an export holds."""
        data: dict[str, Any] = json.loads(self.body)
        data["hash"] = self.hash
        return data


def read_entry(seq: int, kind: str, account: str, body: str, stored_hash: str) -> Entry:
    """An entry whose hash the caller has already checked against the verified chain,
    decoded (for reading one account's newest entries without replaying the chain)."""
    data = json.loads(body)
    record = data.get("record")
    return Entry(seq, kind, account, float(data["time"]), str(data["label"]),
                 decode_cost(data["cost"]) if "cost" in data else None,
                 tuple(Fraction(v) for v in data["spent"]),
                 tuple(Fraction(v) for v in data["limits"]), stored_hash, str(data["prev"]),
                 body, {"id": str(record["id"]), "digest": str(record["digest"])}
                 if record is not None else None)


@dataclass
class AccountState:
    """An account as the replay leaves it: its rule, limits and exact sums."""

    rule: FilterRule
    limits: list[Fraction]
    spent: list[Fraction]
    opened_at: int
    total_set_at: int
    charges: int = 0
    last_seq: int = 0  # the account's newest entry (its sums): what a debit depends on

    def depends_on(self) -> set[int]:
        """The entries a debit of this account reads: its opening, its total, its sums."""
        return {self.opened_at, self.total_set_at, self.last_seq or self.opened_at}


def copy_state(state: AccountState) -> AccountState:
    return AccountState(state.rule, list(state.limits), list(state.spent), state.opened_at,
                        state.total_set_at, state.charges, state.last_seq)


@dataclass(frozen=True)
class Recorded:
    """What the chain says of one request: its entry, its row's digest, its release's."""

    entry: int
    digest: str
    release: str | None = None
    release_entry: int = 0


class Replay:
    """Checks entries one at a time, in order, and keeps every account's state.

    ``apply`` raises ``LedgerIntegrityError`` naming the first entry that is not what an
    honest ledger would have written: a gap or reorder in the sequence, a broken link, a hash
    that does not match the body, a price that is not the cost's, a sum that is not the sum of
    the prices, or a charge past its limit.
    """

    def __init__(self, where: str, first_prev: str, *, collect_requests: bool = False) -> None:
        self.where = where
        self.seq = 0
        self.hash = first_prev
        self.accounts: dict[str, AccountState] = {}
        # The first DIGEST_BYTES of every entry's hash, entry 1 first: what a later look at
        # an old entry compares it with (16 MB a million entries).
        self.digests = bytearray()
        self.records = 0  # request and release entries seen
        # A full verification collects what the chain says of every request (id -> Recorded)
        # to check the requests table against; a live replay does not keep it.
        self.requests: dict[str, Recorded] | None = {} if collect_requests else None

    def snapshot(self) -> tuple[int, str, dict[str, AccountState], int, int]:
        """The replay's state, to restore if a transaction does not commit."""
        return (self.seq, self.hash, {k: copy_state(v) for k, v in self.accounts.items()},
                len(self.digests), self.records)

    def restore(self, saved: tuple[int, str, dict[str, AccountState], int, int]) -> None:
        self.seq, self.hash, self.accounts = saved[0], saved[1], saved[2]
        del self.digests[saved[3]:]
        self.records = saved[4]

    def digest_of(self, seq: int) -> bytes:
        """The remembered prefix of entry ``seq``'s hash (``seq`` at most ``self.seq``)."""
        return bytes(self.digests[(seq - 1) * DIGEST_BYTES: seq * DIGEST_BYTES])

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
            record = ({"id": str(data["record"]["id"]), "digest": str(data["record"]["digest"])}
                      if "record" in data else None)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
            raise self._bad(seq, f"is unreadable ({type(exc).__name__})") from None
        if not ok:
            raise self._bad(seq, "disagrees with its own row (moved or edited?)")
        if prev != self.hash:
            raise self._bad(seq, "does not follow the entry before it (reordered, or an "
                                 "earlier entry deleted or replaced?)")
        if kind in RECORD_KINDS:
            self._check_record(seq, kind, account, spent, limits, cost, rule, record)
        else:
            if record is not None:
                raise self._bad(seq, "is a budget's entry that records a request")
            self._check_meaning(seq, kind, account, spent, limits, cost, price, rule)
        self.seq, self.hash = seq, stored_hash
        self.digests += bytes.fromhex(stored_hash[: 2 * DIGEST_BYTES])
        return Entry(seq, kind, account, time, label, cost, tuple(spent), tuple(limits),
                     stored_hash, prev, body, record)

    def _check_record(self, seq: int, kind: str, account: str, spent: list[Fraction],
                      limits: list[Fraction], cost: Cost | None, rule: FilterRule | None,
                      record: dict[str, str] | None) -> None:
        if (record is None or spent or limits or cost is not None or rule is not None
                or account != REQUEST_ACCOUNT + record["id"]):
            raise self._bad(seq, f"is a {kind} entry that does not name one request")
        self.records += 1
        if self.requests is None:
            return
        found = self.requests.get(record["id"])
        if kind == "request":
            if found is not None:
                raise self._bad(seq, f"records request {record['id']} a second time")
            self.requests[record["id"]] = Recorded(seq, record["digest"])
            return
        if found is None or found.release is not None:
            raise self._bad(seq, f"stores a release for request {record['id']} "
                                 f"{'before it was made' if found is None else 'a second time'}")
        self.requests[record["id"]] = Recorded(found.entry, found.digest, record["digest"], seq)

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
            self.accounts[account] = AccountState(rule, limits, spent, seq, seq, last_seq=seq)
            return
        if state is None:
            raise self._bad(seq, f"uses account {account!r} before it was opened")
        if kind == "raise":
            if (rule is None or rule.composition != state.rule.composition
                    or spent != state.spent
                    or len(limits) != len(state.limits)
                    or any(new < old for new, old in zip(limits, state.limits, strict=True))):
                raise self._bad(seq, "is a raise that changes more than the total")
            if rule.measures() != state.rule.measures():
                # The sums were taken at the old orders: against limits at other orders they
                # would let charges past the total (a ledger that accepted such a raise).
                raise self._bad(seq, "is a raise to a total on other RDP orders than the "
                                     "sums spent so far")
            state.rule, state.limits, state.total_set_at = rule, limits, seq
            state.last_seq = seq
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
        state.last_seq = seq
