"""What every ledger does, whatever database holds it: the chain, the accounts, the debits.

A ledger is a set of *accounts* (a budget each: the library's ``Budget`` uses one, the service
one per dataset and one per analyst and dataset) in one hash-chained, append-only sequence of
entries (``_chain``), plus a table of *requests* (the service's record of who asked what, and
the release it got), which the chain covers too: each request row and each stored release is
recorded by an entry holding its digest. A subclass supplies the database: a transaction
context that takes the writers' lock before it reads anything, and the SQL execution (``?``
placeholders). Everything else lives here, once:

- opening a ledger checks the whole chain, and every request row against it;
- before each operation the ledger checks the entries appended since it last looked (and that
  the last one it verified is still there, unchanged) and that the ``head`` row names the
  newest entry; each write also re-reads the entries it depends on (each debited account's
  opening, total and newest sums) and the next few old entries in turn (a sweep that comes
  round the whole chain every ``len / SWEEP`` writes), comparing each with the hash this
  process verified; each request row read (a retry's, a replay's, a history's) is checked
  against the entries that record it;
- ``verify`` checks everything again, from the first entry; the service runs it on a timer;
- once a check fails, this ledger object refuses every operation (``LedgerIntegrityError``)
  until the owner restores the ledger and the process opens it again;
- a reservation is one transaction: every account's debit fits or nothing is written, and the
  request is recorded with them (a retry with the same idempotency key finds it instead of
  paying again);
- a release is stored under its request once, and never replaced; any process finds it again
  by the request's fingerprint (``stored_release``: how a service's workers, or services
  sharing a ledger, send each other's releases free).
"""

from __future__ import annotations

import hashlib
import json
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

from ._chain import (
    DIGEST_BYTES,
    REQUEST_ACCOUNT,
    AccountState,
    Entry,
    Recorded,
    Replay,
    copy_state,
    entry_hash,
    genesis,
    make_body,
    read_entry,
    request_digest,
    text_digest,
)

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
    requests: int = 0  # request rows, each checked against the entries that record it


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
SWEEP = 64  # old entries re-checked by each write, in turn


class Ledger(ABC):
    """The ledger's logic over a database a subclass provides (SQLite, PostgreSQL)."""

    where: str

    def _start(self, ledger_id: str) -> None:
        """Called by the subclass once its database is open: verifies the whole chain."""
        self._lock = threading.RLock()
        _LIVE.add(self)
        self._ledger_id = ledger_id
        self._failure: str | None = None
        self._swept = 0  # the sweep's place: entries after it are re-checked next
        # The first look replays the whole chain, collecting what it records of the requests
        # to check the table against; later looks keep no such map.
        self._replay = Replay(self.where, genesis(ledger_id), collect_requests=True)
        self._published: dict[str, AccountState] = {}
        self._published_seq = -1
        with self._transaction(write=False) as db, self._tripwire():
            recorded, self._replay.requests = self._replay.requests, None
            assert recorded is not None
            unrecorded = self._replay.records == 0 and db.execute(
                "SELECT 1 FROM requests LIMIT 1").fetchone() is not None
            if not unrecorded:
                self._check_table(db, recorded)
        if unrecorded:
            self._record_old_requests()

    # -- integrity -----------------------------------------------------------------------------

    @property
    def integrity_failure(self) -> str | None:
        """Why this ledger object refuses every operation, or None while it verifies."""
        return self._failure

    def refuse(self, reason: str) -> None:
        """Refuse every later operation of this object (another check of the same ledger,
        on another connection, found it does not verify)."""
        if self._failure is None:
            self._failure = reason

    @contextmanager
    def _tripwire(self) -> Iterator[None]:
        """A check that fails leaves this object refusing everything (not a database error:
        those may pass; a chain that does not verify does not mend itself)."""
        try:
            yield
        except LedgerIntegrityError as exc:
            self.refuse(str(exc))
            raise

    def _check_entries(self, db: Connection, seqs: set[int]) -> None:
        """Entries this process verified are still there, each unchanged (its body, its hash,
        and the hash remembered for it)."""
        wanted = sorted(s for s in seqs if 0 < s <= self._replay.seq)
        if not wanted:
            return
        marks = ", ".join("?" for _ in wanted)
        rows = {int(seq): (str(body), str(stored)) for seq, body, stored in db.execute(
            f"SELECT seq, body, hash FROM entries WHERE seq IN ({marks})", wanted)}
        for seq in wanted:
            self._check_entry(seq, rows.get(seq))

    def _check_entry(self, seq: int, row: tuple[str, str] | None) -> None:
        if row is None:
            why = "deleted"
        elif entry_hash(row[0]) != row[1] or (
                row[1][: 2 * DIGEST_BYTES] != self._replay.digest_of(seq).hex()):
            why = "changed"
        else:
            return
        raise LedgerIntegrityError(
            f"ledger {self.where}: entry {seq}, verified earlier by this process, was {why} "
            "since; the ledger refuses to charge until its owner restores it")

    def _sweep(self, db: Connection) -> None:
        """Re-check the next ``SWEEP`` old entries (round the whole chain, write by write)."""
        newest = self._replay.seq
        if newest == 0:
            return
        start = self._swept + 1 if self._swept < newest else 1
        end = min(start + SWEEP - 1, newest)
        rows = {int(seq): (str(body), str(stored)) for seq, body, stored in db.execute(
            "SELECT seq, body, hash FROM entries WHERE seq >= ? AND seq <= ?", (start, end))}
        for seq in range(start, end + 1):
            self._check_entry(seq, rows.get(seq))
        self._swept = end if end < newest else 0  # at the newest: round again from entry 1

    def _check_requests(self, db: Connection, found: Sequence[StoredRequest]) -> None:
        """Each request row read matches the entries that record it (and its release)."""
        if not found:
            return
        recorded: dict[str, list[tuple[int, str, str, str]]] = {}
        for start in range(0, len(found), 500):
            chunk = found[start:start + 500]
            marks = ", ".join("?" for _ in chunk)
            for seq, account, kind, body, stored in db.execute(
                    f"SELECT seq, account, kind, body, hash FROM entries WHERE account IN "
                    f"({marks}) ORDER BY seq", [REQUEST_ACCOUNT + r.id for r in chunk]):
                recorded.setdefault(str(account), []).append(
                    (int(seq), str(kind), str(body), str(stored)))
        for request in found:
            chain = _recorded(recorded.get(REQUEST_ACCOUNT + request.id, []), self._check_entry)
            why = _mismatch(request, chain)
            if why is not None:
                raise LedgerIntegrityError(
                    f"ledger {self.where}: request {request.id} {why}; the ledger refuses to "
                    "charge until its owner restores it")

    def _record_old_requests(self) -> None:
        """Record, once, the request rows of a ledger made before the chain covered them
        (trusted as they stand when this version first opens the ledger)."""
        with self._transaction(write=True) as db:
            if db.execute("SELECT 1 FROM entries WHERE kind = 'request' LIMIT 1").fetchone():
                return  # another process did it first
            rows = db.execute(f"SELECT {_REQUEST_COLUMNS} FROM requests "
                              "ORDER BY created, id").fetchall()
            for request in (_request_of(row) for row in rows):
                self._append_request(db, request)

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
            if self._failure is not None:
                raise LedgerIntegrityError(self._failure)
            saved = self._replay.snapshot()
            swept = self._swept
            try:
                with self._database(write) as db:
                    with self._tripwire():
                        self._catch_up(db)
                        if write:
                            self._sweep(db)
                    yield db
            except BaseException:
                # Entries appended in a transaction that did not commit are not the ledger's.
                self._replay.restore(saved)
                self._swept = swept
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
                price: list[Fraction] | None = None, rule: FilterRule | None = None,
                record: dict[str, str] | None = None) -> Entry:
        r = self._replay
        seq = r.seq + 1
        body = make_body(seq=seq, prev=r.hash, kind=kind, account=account, time=time.time(),
                         spent=spent, limits=limits, label=label, cost=cost, price=price,
                         rule=rule, record=record)
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
            elif state.rule.measures() != rule.measures() or state.limits != limits or (
                    state.rule.total.neighbouring is not rule.total.neighbouring):
                orders = state.rule.measures()[1]
                raise UserError(
                    f"ledger {self.where} holds a total of {state.rule.total} "
                    f"{f'on orders {orders} ' if orders else ''}"
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
        with self._tripwire():
            self._check_entries(db, set().union(*(self._state(name).depends_on()
                                                  for name, _ in debits)))
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

    def record(self, name: str, charges: Sequence[tuple[Cost, str]]) -> list[Entry]:
        """Append charges (cost, label) whether or not they fit (a migrated journal's
        history), all in one transaction: a crash leaves every one of them or none."""
        with self._transaction(write=True) as db:
            out = []
            for cost, label in charges:
                state = self._state(name)
                price = state.rule.price(cost)
                spent = [s + p for s, p in zip(state.spent, price, strict=True)]
                out.append(self._append(db, name, "migrated", spent, state.limits,
                                        label=label, cost=cost, price=price))
            return out

    def raise_total(self, name: str, total: Cost, label: str = "") -> Entry:
        """Record a raise of the account's total (every limit at least the old one, at the
        same RDP orders: the sums spent so far hold only at the orders they were taken at)."""
        with self._transaction(write=True) as db:
            state = self._state(name)
            rule = FilterRule.make(total, state.rule.composition)
            limits = rule.limits()
            if total.neighbouring is not state.rule.total.neighbouring:
                raise UserError("a raise keeps the total's neighbouring relation "
                                f"('{state.rule.total.neighbouring}')")
            if rule.measures() != state.rule.measures():
                raise UserError(
                    f"the new total is on RDP orders {rule.measures()[1]}, the current one "
                    f"on {state.rule.measures()[1]}: the sums spent so far "
                    "hold only at the current orders, so a raise must keep them (raise the "
                    "epsilons at the same orders)")
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
                found = self._one_request(db, "analyst = ? AND dataset = ? AND "
                                               "idempotency_key = ?",
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
            request = StoredRequest(request_id, analyst, dataset, idempotency_key, fingerprint,
                                    created, first, label, release)
            self._append_request(db, request)
            return Reservation(request, tuple(entries), replayed=False)

    def _append_request(self, db: Connection, request: StoredRequest) -> None:
        """The entries that put a request row (and its release, if it has one) in the chain."""
        account = REQUEST_ACCOUNT + request.id
        self._append(db, account, "request", [], [], record={
            "id": request.id, "digest": _row_digest(request)})
        if request.release is not None:
            self._append(db, account, "release", [], [], record={
                "id": request.id, "digest": text_digest(request.release)})

    def store_release(self, request_id: str, release: str) -> str:
        """Store the request's release unless one is stored already; return the stored one.

        Only what this returns may be sent: two workers finishing the same request agree on
        one release, and a release is never replaced.
        """
        with self._transaction(write=True) as db:
            found = self._one_request(db, "id = ?", (request_id,))
            if found is None:
                raise self._vanished(request_id)
            if found.release is not None:
                return found.release
            db.execute("UPDATE requests SET release = ? WHERE id = ? AND release IS NULL",
                       (release, request_id))
            self._append(db, REQUEST_ACCOUNT + request_id, "release", [], [],
                         record={"id": request_id, "digest": text_digest(release)})
            return release

    def _vanished(self, request_id: str) -> LedgerIntegrityError:
        return LedgerIntegrityError(f"ledger {self.where}: request {request_id} vanished "
                                    "before its release was stored")

    def _one_request(self, db: Connection, where: str,
                     parameters: Sequence[Any]) -> StoredRequest | None:
        found = _one_request(db, where, parameters)
        if found is not None:
            with self._tripwire():
                self._check_requests(db, [found])
        return found

    def stored_release(self, dataset: str, fingerprint: str, *,
                       analyst: str | None = None) -> StoredRequest | None:
        """The oldest request on the dataset with this ``fingerprint`` whose release is
        stored (the analyst's own when ``analyst`` is given, anyone's otherwise), checked
        against the entries that record it; None if there is none.

        This is how a service's workers (or several services over one ledger) find a
        release that another of them made: one read through the (dataset, fingerprint)
        index. The oldest, so that every reader finds the same one."""
        where = "dataset = ? AND fingerprint = ? AND release IS NOT NULL"
        parameters = [dataset, fingerprint]
        if analyst is not None:
            where += " AND analyst = ?"
            parameters.append(analyst)
        with self._transaction(write=False) as db:
            return self._one_request(db, f"{where} ORDER BY created, id LIMIT 1", parameters)

    def request(self, request_id: str) -> StoredRequest | None:
        """A request and its release, checked against the entries that record them."""
        with self._transaction(write=False) as db:
            return self._one_request(db, "id = ?", (request_id,))

    def requests(self, analyst: str, dataset: str) -> list[StoredRequest]:
        """The analyst's requests on the dataset, oldest first, each checked against the
        entries that record it."""
        with self._transaction(write=False) as db:
            rows = db.execute(f"SELECT {_REQUEST_COLUMNS} FROM requests WHERE analyst = ? AND "
                              "dataset = ? ORDER BY created, id", (analyst, dataset)).fetchall()
            found = [_request_of(row) for row in rows]
            with self._tripwire():
                self._check_requests(db, found)
            return found

    def requests_page(self, analyst: str, dataset: str, *, limit: int,
                      before: str | None = None) -> list[StoredRequest]:
        """The analyst's requests on the dataset, newest first: at most ``limit`` of them,
        made before the request ``before`` (an id of theirs: the last of the page before)
        when given. One page through the (analyst, dataset, created) index, however long
        the history; each row checked against the entries that record it. A ``before`` that
        is not one of the analyst's requests on the dataset is a ``UserError``."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise UserError(f"limit must be a whole number >= 1, got {limit!r}")
        with self._transaction(write=False) as db:
            after = ""
            parameters: list[Any] = [analyst, dataset]
            if before is not None:
                mark = db.execute("SELECT created, id FROM requests WHERE id = ? AND "
                                  "analyst = ? AND dataset = ?",
                                  (before, analyst, dataset)).fetchone()
                if mark is None:
                    raise UserError(f"before: no request {before!r} of this analyst on "
                                    "this dataset")
                after = " AND (created < ? OR (created = ? AND id < ?))"
                parameters += [mark[0], mark[0], mark[1]]
            rows = db.execute(f"SELECT {_REQUEST_COLUMNS} FROM requests WHERE analyst = ? "
                              f"AND dataset = ?{after} ORDER BY created DESC, id DESC LIMIT ?",
                              [*parameters, limit]).fetchall()
            found = [_request_of(row) for row in rows]
            with self._tripwire():
                self._check_requests(db, found)
            return found

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

    def account_entries(self, account: str, *, limit: int,
                        before: int | None = None) -> list[Entry]:
        """The account's newest entries, newest first: at most ``limit``, numbered below
        ``before`` when given. One page through the (account, seq) index, however long the
        chain; each entry checked against the hash this process verified for it."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise UserError(f"limit must be a whole number >= 1, got {limit!r}")
        with self._transaction(write=False) as db:
            below = self._replay.seq + 1 if before is None else min(before,
                                                                    self._replay.seq + 1)
            rows = db.execute("SELECT seq, account, kind, body, hash FROM entries WHERE "
                              "account = ? AND seq < ? ORDER BY seq DESC LIMIT ?",
                              (account, below, limit)).fetchall()
            out = []
            with self._tripwire():
                for seq, name, kind, body, stored in rows:
                    self._check_entry(int(seq), (str(body), str(stored)))
                    out.append(read_entry(int(seq), str(kind), str(name), str(body),
                                          str(stored)))
            return out

    def head(self) -> tuple[int, str]:
        """The chain's head as this process verified it: the newest entry's number and
        hash (the empty chain's is 0 and its genesis hash)."""
        with self._transaction(write=False):
            return self._replay.seq, self._replay.hash

    def verify(self) -> LedgerReport:
        """Check the whole chain from its first entry, the head, and every request row (and
        its release) against the entries that record it. A failure also leaves this object
        refusing every later operation."""
        with self._transaction(write=False) as db, self._tripwire():
            replay = Replay(self.where, genesis(self._ledger_id), collect_requests=True)
            for row in db.execute("SELECT seq, account, kind, body, hash FROM entries "
                                  "ORDER BY seq"):
                replay.apply(int(row[0]), str(row[1]), str(row[2]), str(row[3]), str(row[4]))
            if replay.seq != self._replay.seq or replay.hash != self._replay.hash:
                raise LedgerIntegrityError(f"ledger {self.where}: the chain changed while it "
                                           "was being verified")
            assert replay.requests is not None
            rows = self._check_table(db, replay.requests)
            return LedgerReport(self.where, replay.seq, replay.hash,
                                {k: copy_state(v) for k, v in replay.accounts.items()}, rows)

    def _check_table(self, db: Connection, recorded: dict[str, Recorded]) -> int:
        """Every request row matches what the chain recorded of it, and every request the
        chain recorded has its row; returns the number of rows. Consumes ``recorded``."""
        rows = 0
        for row in db.execute(f"SELECT {_REQUEST_COLUMNS} FROM requests"):
            request = _request_of(row)
            rows += 1
            why = _mismatch(request, recorded.pop(request.id, None))
            if why is not None:
                raise LedgerIntegrityError(
                    f"ledger {self.where}: request {request.id} {why}; the ledger refuses "
                    "to charge until its owner restores it")
        if recorded:
            gone = min(recorded.values(), key=lambda r: r.entry)
            raise LedgerIntegrityError(
                f"ledger {self.where}: the request recorded by entry {gone.entry} was "
                "deleted from the requests table; the ledger refuses to charge until its "
                "owner restores it")
        return rows


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


def _row_digest(request: StoredRequest) -> str:
    return request_digest(request.id, request.analyst, request.dataset,
                          request.idempotency_key, request.fingerprint, request.created,
                          request.first_entry, request.label)


def _recorded(rows: list[tuple[int, str, str, str]],
              check: Any) -> Recorded | None:
    """What a request's entries (``seq, kind, body, hash``, oldest first) say of it, each
    entry checked by ``check(seq, (body, hash))`` against what the process verified."""
    found: Recorded | None = None
    for seq, kind, body, stored in rows:
        check(seq, (body, stored))
        digest = str(json.loads(body)["record"]["digest"])
        if kind == "request" and found is None:
            found = Recorded(seq, digest)
        elif kind == "release" and found is not None and found.release is None:
            found = Recorded(found.entry, found.digest, digest, seq)
        else:
            return Recorded(seq, "", "unordered")
    return found


def _mismatch(request: StoredRequest, chain: Recorded | None) -> str | None:
    """Why a request row does not match what the chain records of it, or None."""
    if chain is None:
        return "is recorded by no entry (inserted?)"
    if chain.release == "unordered":
        return f"has entries out of order (entry {chain.entry})"
    if chain.digest != _row_digest(request):
        return f"does not match entry {chain.entry}, which recorded it (edited?)"
    if request.release is None and chain.release is not None:
        return f"lost the release that entry {chain.release_entry} recorded (deleted?)"
    if request.release is not None and chain.release is None:
        return "holds a release that no entry recorded (inserted?)"
    if request.release is not None and text_digest(request.release) != chain.release:
        return (f"holds a release that does not match entry {chain.release_entry}, which "
                "recorded it (edited?)")
    return None


def _request_of(row: Sequence[Any]) -> StoredRequest:
    return StoredRequest(str(row[0]), str(row[1]), str(row[2]),
                         None if row[3] is None else str(row[3]), str(row[4]), float(row[5]),
                         int(row[6]), str(row[7]), None if row[8] is None else str(row[8]))


def _check_account_name(name: str) -> None:
    if not isinstance(name, str) or not name or len(name) > 200 or not name.isprintable():
        raise UserError(f"account must be a printable name of 1 to 200 characters, got {name!r}")
    if name.startswith(REQUEST_ACCOUNT):
        raise UserError(f"account names starting with {REQUEST_ACCOUNT!r} are the ledger's "
                        f"own (its requests' entries), got {name!r}")
