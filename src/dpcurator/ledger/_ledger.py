"""What every ledger does, whatever database holds it: the chain, the accounts, the debits.

A ledger is a set of *accounts* (a budget each: the library's ``Budget`` uses one, the service
one per dataset and one per analyst and dataset) in one hash-chained, append-only sequence of
entries (``_chain``), plus a table of *requests* (the service's record of who asked what, and
the release it got). A subclass supplies the database: a transaction context that takes the
writers' lock before it reads anything, and the SQL execution (``?`` placeholders). Everything
else lives here, once:

- before each operation the ledger checks the entries appended since it last looked (and that
  the last one it verified is still there, unchanged) and that the ``head`` row names the
  newest entry; opening a ledger checks the whole chain;
- a reservation is one transaction: every account's debit fits or nothing is written, and the
  request is recorded with them (a retry with the same idempotency key finds it instead of
  paying again);
- a release is stored under its request once, and never replaced.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol

from dpcurator.accounting.filters import Cost, FilterRule
from dpcurator.errors import BudgetExceededError, LedgerIntegrityError, UserError

from ._chain import AccountState, Entry, Replay, copy_state, entry_hash, genesis, make_body

__all__ = ["Ledger", "LedgerReport", "Reservation", "StoredRequest"]


class Cursor(Protocol):
    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """The one method a ledger needs of its database inside a transaction."""

    def execute(self, sql: str, parameters: Sequence[Any] = ...) -> Cursor: ...


@dataclass(frozen=True)
class LedgerReport:
    """What a full verification found: entries, the head hash, and each account's state."""

    path: str
    entries: int
    head: str
    accounts: dict[str, AccountState]


@dataclass(frozen=True)
class StoredRequest:
    """A request as the ledger recorded it, with its release once stored (JSON text)."""

    id: str
    analyst: str
    dataset: str
    idempotency_key: str | None
    fingerprint: str
    created: float
    first_entry: int
    label: str
    release: str | None


@dataclass(frozen=True)
class Reservation:
    """The outcome of ``reserve``: the request, and whether it was found rather than made."""

    request: StoredRequest
    entries: tuple[Entry, ...]
    replayed: bool


_REQUEST_COLUMNS = ("id, analyst, dataset, idempotency_key, fingerprint, created, first_entry, "
                    "label, release")


class Ledger(ABC):
    """The ledger's logic over a database a subclass provides (SQLite, PostgreSQL)."""

    where: str

    def _start(self, ledger_id: str) -> None:
        """Called by the subclass once its database is open: verifies the whole chain."""
        self._lock = threading.RLock()
        _LIVE.add(self)
        self._ledger_id = ledger_id
        self._replay = Replay(self.where, genesis(ledger_id))
        self._published: dict[str, AccountState] = {}
        self._published_seq = -1
        with self._transaction(write=False):
            pass

    # -- what a subclass provides --------------------------------------------------------------

    @abstractmethod
    def _database(self, write: bool) -> AbstractContextManager[Connection]:
        """One transaction (a write one holds the writers' lock from its first read to its
        commit); commits on a clean exit, rolls back on an exception, and turns the
        database's own errors into dpcurator errors."""

    @abstractmethod
    def close(self) -> None:
        """Release the connection."""

    # -- transactions --------------------------------------------------------------------------

    @contextmanager
    def _transaction(self, write: bool) -> Iterator[Connection]:
        """One transaction, after checking every entry appended since the last look."""
        with self._lock:
            saved = self._replay.snapshot()
            try:
                with self._database(write) as db:
                    self._catch_up(db)
                    yield db
            except BaseException:
                # Entries appended in a transaction that did not commit are not the ledger's.
                self._replay.restore(saved)
                raise
            if self._replay.seq != self._published_seq:
                self._published = {k: copy_state(v) for k, v in self._replay.accounts.items()}
                self._published_seq = self._replay.seq

    def _catch_up(self, db: Connection) -> None:
        """Verify what was appended since the last look; refuse if history changed."""
        r = self._replay
        if r.seq:
            row = db.execute("SELECT hash FROM entries WHERE seq = ?", (r.seq,)).fetchone()
            if row is None or row[0] != r.hash:
                raise LedgerIntegrityError(
                    f"ledger {self.where}: entry {r.seq}, verified earlier by this process, "
                    f"was {'deleted' if row is None else 'changed'} since; the ledger refuses "
                    "to charge until its owner restores it")
        for seq, account, kind, body, stored in db.execute(
                "SELECT seq, account, kind, body, hash FROM entries WHERE seq > ? "
                "ORDER BY seq", (r.seq,)):
            r.apply(int(seq), str(account), str(kind), str(body), str(stored))
        head = db.execute("SELECT seq, hash FROM head WHERE id = 1").fetchone()
        if head is None:
            raise LedgerIntegrityError(f"ledger {self.where}: its head row is missing")
        if int(head[0]) != r.seq or (r.seq and head[1] != r.hash):
            if int(head[0]) > r.seq:
                raise LedgerIntegrityError(
                    f"ledger {self.where}: its head names entry {head[0]} but the entries end "
                    f"at {r.seq}: entry {r.seq + 1} onwards were deleted; the ledger refuses "
                    "to charge until its owner restores it")
            raise LedgerIntegrityError(
                f"ledger {self.where}: its head does not match entry {r.seq}, the newest "
                "(edited?); the ledger refuses to charge until its owner restores it")

    def _append(self, db: Connection, account: str, kind: str, spent: list[Fraction],
                limits: list[Fraction], *, label: str = "", cost: Cost | None = None,
                price: list[Fraction] | None = None, rule: FilterRule | None = None) -> Entry:
        r = self._replay
        seq = r.seq + 1
        body = make_body(seq=seq, prev=r.hash, kind=kind, account=account, time=time.time(),
                         spent=spent, limits=limits, label=label, cost=cost, price=price,
                         rule=rule)
        digest = entry_hash(body)
        db.execute("INSERT INTO entries (seq, account, kind, body, hash) VALUES (?, ?, ?, ?, ?)",
                   (seq, account, kind, body, digest))
        db.execute("UPDATE head SET seq = ?, hash = ? WHERE id = 1", (seq, digest))
        return r.apply(seq, account, kind, body, digest)

    # -- accounts ------------------------------------------------------------------------------

    def account(self, name: str) -> AccountState | None:
        """The account's current state (a copy), or None if the ledger has no such account."""
        with self._transaction(write=False):
            state = self._replay.accounts.get(name)
            return None if state is None else copy_state(state)

    def last_known(self, name: str) -> AccountState | None:
        """The account as this process last saw it committed, without waiting for a lock or
        reading the database: for showing, never for deciding (another process may have
        charged since). A copy."""
        state = self._published.get(name)
        return None if state is None else copy_state(state)

    def accounts(self) -> dict[str, AccountState]:
        """Every account's current state (copies)."""
        with self._transaction(write=False):
            return {k: copy_state(v) for k, v in self._replay.accounts.items()}

    def open_account(self, name: str, rule: FilterRule) -> AccountState:
        """Create the account with ``rule``'s total, or check that it already has that total."""
        _check_account_name(name)
        limits = rule.limits()
        with self._transaction(write=True) as db:
            state = self._replay.accounts.get(name)
            if state is None:
                self._append(db, name, "open", rule.zero(), limits, rule=rule)
                state = self._replay.accounts[name]
            elif state.rule.composition != rule.composition or state.limits != limits or (
                    state.rule.total.neighbouring is not rule.total.neighbouring):
                raise UserError(
                    f"ledger {self.where} holds a total of {state.rule.total} "
                    f"({state.rule.composition} composition, set at entry "
                    f"{state.total_set_at}) for account {name!r}, not {rule.total}. A ledger "
                    "keeps its total: open it without one (Budget.open, or leave out "
                    f"--budget-epsilon), or raise it with `dpcurator ledger raise "
                    f"{self.where} ...`")
            return copy_state(state)

    def debit(self, name: str, cost: Cost, label: str = "") -> Entry:
        """Charge ``cost`` to the account if it fits, in one transaction; else refuse whole."""
        with self._transaction(write=True) as db:
            return self._debit_all(db, [(name, cost)], label)[0]

    def _debit_all(self, db: Connection, debits: Sequence[tuple[str, Cost]],
                   label: str) -> list[Entry]:
        """Every debit fits, and all are appended; or none is (``BudgetExceededError``)."""
        priced = []
        for name, cost in debits:
            state = self._state(name)
            price = state.rule.price(cost)
            if not FilterRule.fits(state.spent, price, state.limits):
                left = [max(lim - s, Fraction(0)) for lim, s in
                        zip(state.limits, state.spent, strict=True)]
                whose = f" of {name!r}" if len(debits) > 1 else ""
                raise BudgetExceededError(
                    f"this charge ({cost}) exceeds the remaining budget{whose} "
                    f"({state.rule.amount(left, up=False).describe()}); nothing was charged")
            priced.append((name, cost, state, price))
        return [self._append(db, name, "charge",
                             [s + p for s, p in zip(state.spent, price, strict=True)],
                             state.limits, label=label, cost=cost, price=price)
                for name, cost, state, price in priced]

    def record(self, name: str, cost: Cost, label: str) -> Entry:
        """Append a charge whether or not it fits (a migrated journal's history)."""
        with self._transaction(write=True) as db:
            state = self._state(name)
            price = state.rule.price(cost)
            spent = [s + p for s, p in zip(state.spent, price, strict=True)]
            return self._append(db, name, "migrated", spent, state.limits, label=label,
                                cost=cost, price=price)

    def raise_total(self, name: str, total: Cost, label: str = "") -> Entry:
        """Record a raise of the account's total (every limit at least the old one)."""
        with self._transaction(write=True) as db:
            state = self._state(name)
            rule = FilterRule.make(total, state.rule.composition)
            limits = rule.limits()
            if total.neighbouring is not state.rule.total.neighbouring:
                raise UserError("a raise keeps the total's neighbouring relation "
                                f"('{state.rule.total.neighbouring}')")
            if len(limits) != len(state.limits) or any(
                    new < old for new, old in zip(limits, state.limits, strict=True)):
                raise UserError(
                    f"the new total {total} does not raise every part of the current "
                    f"{state.rule.total}; a ledger's total can only be raised")
            return self._append(db, name, "raise", state.spent, limits, label=label,
                                rule=rule)

    def _state(self, name: str) -> AccountState:
        state = self._replay.accounts.get(name)
        if state is None:
            raise UserError(f"ledger {self.where} has no account {name!r}; its accounts are "
                            f"{sorted(self._replay.accounts)}")
        return state

    # -- requests: reserve first, store the release, replay it -----------------------------------

    def reserve(self, debits: Sequence[tuple[str, Cost]], *, analyst: str, dataset: str,
                fingerprint: str, label: str, idempotency_key: str | None = None,
                release: str | None = None) -> Reservation:
        """Debit every account and record the request, in one transaction.

        With an ``idempotency_key`` that this analyst already used on this dataset, nothing
        is charged and the earlier request is returned (``replayed``); if it was for another
        request (another ``fingerprint``) a ``UserError`` says so. Raises
        ``BudgetExceededError`` (nothing written) when any debit does not fit. A request
        answered by a release already made (``release``, with no debits: free) is recorded
        with that release in the same transaction, so no request is ever left without either
        its charge or its release.
        """
        if release is None and not debits:
            raise UserError("a request without debits must come with its release")
        with self._transaction(write=True) as db:
            if idempotency_key is not None:
                found = _one_request(db, "analyst = ? AND dataset = ? AND idempotency_key = ?",
                                     (analyst, dataset, idempotency_key))
                if found is not None:
                    if found.fingerprint != fingerprint:
                        raise IdempotencyConflict(
                            "this Idempotency-Key was used for another request; use a new key "
                            "for a new request")
                    return Reservation(found, (), replayed=True)
            entries = self._debit_all(db, debits, label)
            request_id = secrets.token_hex(16)
            created = time.time()
            first = entries[0].seq if entries else 0
            db.execute(f"INSERT INTO requests ({_REQUEST_COLUMNS}) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (request_id, analyst, dataset, idempotency_key, fingerprint, created,
                        first, label, release))
            return Reservation(StoredRequest(request_id, analyst, dataset, idempotency_key,
                                             fingerprint, created, first, label, release),
                               tuple(entries), replayed=False)

    def store_release(self, request_id: str, release: str) -> str:
        """Store the request's release unless one is stored already; return the stored one.

        Only what this returns may be sent: two workers finishing the same request agree on
        one release, and a release is never replaced.
        """
        with self._transaction(write=True) as db:
            db.execute("UPDATE requests SET release = ? WHERE id = ? AND release IS NULL",
                       (release, request_id))
            row = db.execute("SELECT release FROM requests WHERE id = ?",
                             (request_id,)).fetchone()
            if row is None or row[0] is None:
                raise LedgerIntegrityError(f"ledger {self.where}: request {request_id} vanished "
                                           "before its release was stored")
            return str(row[0])

    def request(self, request_id: str) -> StoredRequest | None:
        with self._transaction(write=False) as db:
            return _one_request(db, "id = ?", (request_id,))

    def requests(self, analyst: str, dataset: str) -> list[StoredRequest]:
        """The analyst's requests on the dataset, oldest first."""
        with self._transaction(write=False) as db:
            rows = db.execute(f"SELECT {_REQUEST_COLUMNS} FROM requests WHERE analyst = ? AND "
                              "dataset = ? ORDER BY created, id", (analyst, dataset)).fetchall()
            return [_request_of(row) for row in rows]

    # -- the owner's view ----------------------------------------------------------------------

    def entries(self, account: str | None = None) -> list[Entry]:
        """Every entry (of one account), in order, each checked against the chain."""
        with self._transaction(write=False) as db:
            replay = Replay(self.where, genesis(self._ledger_id))
            out = []
            for row in db.execute("SELECT seq, account, kind, body, hash FROM entries "
                                  "WHERE seq <= ? ORDER BY seq", (self._replay.seq,)):
                entry = replay.apply(int(row[0]), str(row[1]), str(row[2]), str(row[3]),
                                     str(row[4]))
                if account is None or entry.account == account:
                    out.append(entry)
            return out

    def verify(self) -> LedgerReport:
        """Check the whole chain from its first entry, and the head."""
        with self._transaction(write=False) as db:
            replay = Replay(self.where, genesis(self._ledger_id))
            for row in db.execute("SELECT seq, account, kind, body, hash FROM entries "
                                  "ORDER BY seq"):
                replay.apply(int(row[0]), str(row[1]), str(row[2]), str(row[3]), str(row[4]))
            if replay.seq != self._replay.seq or replay.hash != self._replay.hash:
                raise LedgerIntegrityError(f"ledger {self.where}: the chain changed while it "
                                           "was being verified")
            return LedgerReport(self.where, replay.seq, replay.hash,
                                {k: copy_state(v) for k, v in replay.accounts.items()})


_LIVE: weakref.WeakSet[Ledger] = weakref.WeakSet()


def _after_fork() -> None:
    """In a forked child every ledger gets a new thread lock: the parent's may have been held
    by a thread that does not exist here. Each subclass replaces its connection on first use
    in the child."""
    for ledger in list(_LIVE):
        if hasattr(ledger, "_lock"):
            ledger._lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class IdempotencyConflict(UserError):
    """An idempotency key was reused for a different request."""


def fingerprint(*parts: str) -> str:
    """A request's identity for idempotency: the hash of what it asked."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    return digest.hexdigest()


def _one_request(db: Connection, where: str, parameters: Sequence[Any]) -> StoredRequest | None:
    row = db.execute(f"SELECT {_REQUEST_COLUMNS} FROM requests WHERE {where}",
                     parameters).fetchone()
    return None if row is None else _request_of(row)


def _request_of(row: Sequence[Any]) -> StoredRequest:
    return StoredRequest(str(row[0]), str(row[1]), str(row[2]),
                         None if row[3] is None else str(row[3]), str(row[4]), float(row[5]),
                         int(row[6]), str(row[7]), None if row[8] is None else str(row[8]))


def _check_account_name(name: str) -> None:
    if not isinstance(name, str) or not name or len(name) > 200 or not name.isprintable():
        raise UserError(f"account must be a printable name of 1 to 200 characters, got {name!r}")
