"""The SQLite ledger: hash-chained, append-only entries; one conditional debit per transaction.

One file holds any number of *accounts* (a budget each: the library's ``Budget`` uses one,
the service one per dataset and per analyst). Correctness across threads, processes and
crashes rests on SQLite itself:

- every change is one ``BEGIN IMMEDIATE`` transaction, which takes the file's write lock
  before it reads anything, so the read-check-append of a debit is atomic against every
  other connection, in this process or another (the busy timeout makes contenders wait);
- writers also queue on an advisory ``flock`` of ``<ledger>.lock`` before they begin, so
  that many processes contending take turns in the kernel instead of in SQLite's sleeping
  busy handler (40 racing processes: seconds without it, milliseconds with it). Correctness
  never rests on this lock, only throughput;
- the journal is write-ahead (WAL) with ``synchronous=FULL``: a transaction that returned
  from COMMIT is on disk, and a process killed at any point leaves either all of a
  transaction or none of it;
- triggers refuse UPDATE and DELETE on entries, so honest code can only append.

Before each operation the connection checks the entries appended since it last looked
(and that the last one it verified is still there, unchanged) and that the ``head`` row names
the newest entry; opening a ledger checks the whole chain. What the files themselves cannot
show: someone who rewrites the chain consistently from some entry on (recomputing every
later hash and the head), restores an older copy of the file, or deletes the ``-wal`` file
of a ledger no process has open, leaves a ledger that verifies. A live process notices any of
these at its next operation (its last verified entry changed); against the rest, keep the
head hash somewhere else (``dpcurator ledger show`` prints it) and check it with
``dpcurator ledger verify --expect-head``, or use the PostgreSQL ledger of the service.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, TypeVar

from dpcurator.accounting.filters import Cost, FilterRule
from dpcurator.errors import BudgetExceededError, LedgerIntegrityError, UserError

from ._chain import (
    FORMAT,
    VERSION,
    AccountState,
    Entry,
    Replay,
    copy_state,
    entry_hash,
    genesis,
    make_body,
)

__all__ = ["LedgerReport", "SQLiteLedger"]

T = TypeVar("T")
BUSY_TIMEOUT_S = 120.0
_SQLITE_MAGIC = b"SQLite format 3\x00"

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE entries (
    seq INTEGER PRIMARY KEY,
    account TEXT NOT NULL,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE INDEX entries_by_account ON entries (account, seq);
CREATE TABLE head (id INTEGER PRIMARY KEY CHECK (id = 1), seq INTEGER NOT NULL,
                   hash TEXT NOT NULL);
CREATE TRIGGER entries_are_append_only_u BEFORE UPDATE ON entries
    BEGIN SELECT RAISE(ABORT, 'ledger entries are append-only'); END;
CREATE TRIGGER entries_are_append_only_d BEFORE DELETE ON entries
    BEGIN SELECT RAISE(ABORT, 'ledger entries are append-only'); END;
CREATE TRIGGER head_stays BEFORE DELETE ON head
    BEGIN SELECT RAISE(ABORT, 'the ledger head cannot be deleted'); END;
"""


@dataclass(frozen=True)
class LedgerReport:
    """What a full verification found: entries, the head hash, and each account's state."""

    path: str
    entries: int
    head: str
    accounts: dict[str, AccountState]


class SQLiteLedger:
    """A ledger in one SQLite file (``path``), or in memory (``path=None``).

    The file is created, atomically, the first time it is opened (unless ``create=False``);
    an existing file must be a dpcurator ledger whose whole chain verifies. A connection
    must not cross a ``fork``: open the ledger in the process that uses it.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *,
                 create: bool = True) -> None:
        self._lock = threading.RLock()
        if path is None:
            self.where = ":memory:"
            self.path: Path | None = None
            self._db = _connect(":memory:")
            _initialise(self._db, in_memory=True)
            self._queue = _WriterQueue(None)
        else:
            self.path = _check_path(Path(path))
            self.where = str(self.path)
            if not self.path.exists():
                if not create:
                    raise UserError(f"no ledger at {self.path}")
                _create_atomically(self.path)
            _check_is_ledger_file(self.path)
            self._db = self._guard(lambda: _connect(str(self.path)))
            self._queue = _WriterQueue(self.path)
        self._pid = os.getpid()
        self._inherited: list[object] = []
        _LIVE.add(self)
        self._ledger_id = self._guard(self._read_meta)
        self._replay = Replay(self.where, genesis(self._ledger_id))
        with self._transaction(write=False):
            pass  # verifies the whole chain

    # -- transactions --------------------------------------------------------------------------

    def _guard(self, action: Callable[[], T]) -> T:
        try:
            return action()
        except sqlite3.DatabaseError as exc:
            raise LedgerIntegrityError(
                f"ledger {self.where} cannot be read as a database ({exc}); it was damaged "
                "or truncated: restore it from a backup. Nothing was charged") from None

    @contextmanager
    def _transaction(self, write: bool) -> Iterator[sqlite3.Connection]:
        """One transaction, after checking every entry appended since the last look.

        A write transaction holds the file's write lock from its first read to its commit.
        SQLite's own errors become dpcurator errors (a lock held too long, a damaged file).
        """
        self._reopen_after_fork()
        with self._lock, self._queue.turn(write):
            db = self._db
            saved = self._replay.snapshot()
            try:
                db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    self._catch_up(db)
                    yield db
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
            except BaseException as exc:
                # Entries appended in a transaction that did not commit are not the ledger's.
                self._replay.restore(saved)
                if isinstance(exc, sqlite3.OperationalError) and (
                        "locked" in str(exc) or "busy" in str(exc)):
                    raise UserError(
                        f"ledger {self.where} stayed locked by another process for "
                        f"{BUSY_TIMEOUT_S:.0f} s; nothing was charged, try again") from None
                if isinstance(exc, sqlite3.DatabaseError):
                    raise self._damaged(exc) from None
                raise

    def _reopen_after_fork(self) -> None:
        """In a forked child, use a connection (and lock file) of its own.

        SQLite connections must not cross a fork, and a forked ``flock`` descriptor is shared
        with the parent. The inherited ones are kept, unused and unclosed (closing them here
        could release locks the parent holds); an in-memory ledger stays the parent's copy.
        """
        if self._pid == os.getpid() or self.path is None:
            return
        with self._lock:  # a fresh lock: _after_fork replaced the inherited one
            if self._pid == os.getpid():
                return
            self._inherited += [self._db, self._queue]
            self._db = _connect(str(self.path))
            self._queue = _WriterQueue(self.path)
            self._pid = os.getpid()

    def _damaged(self, exc: Exception) -> LedgerIntegrityError:
        return LedgerIntegrityError(
            f"ledger {self.where} cannot be read as a database ({exc}); it was damaged or "
            "truncated: restore it from a backup. Nothing was charged")

    def _catch_up(self, db: sqlite3.Connection) -> None:
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

    def _append(self, db: sqlite3.Connection, account: str, kind: str, state_spent:
                list[Fraction], limits: list[Fraction], *, label: str = "",
                cost: Cost | None = None, price: list[Fraction] | None = None,
                rule: FilterRule | None = None) -> Entry:
        r = self._replay
        seq = r.seq + 1
        body = make_body(seq=seq, prev=r.hash, kind=kind, account=account, time=time.time(),
                         spent=state_spent, limits=limits, label=label, cost=cost,
                         price=price, rule=rule)
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
            state = self._state(name)
            price = state.rule.price(cost)
            if not FilterRule.fits(state.spent, price, state.limits):
                left = [max(lim - s, Fraction(0)) for lim, s in
                        zip(state.limits, state.spent, strict=True)]
                raise BudgetExceededError(
                    f"this charge ({cost}) exceeds the remaining budget "
                    f"({state.rule.amount(left, up=False).describe()}); nothing was charged")
            spent = [s + p for s, p in zip(state.spent, price, strict=True)]
            return self._append(db, name, "charge", spent, state.limits, label=label,
                                cost=cost, price=price)

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

    def close(self) -> None:
        with self._lock:
            self._db.close()
            self._queue.close()

    # -- set-up --------------------------------------------------------------------------------

    def _read_meta(self) -> str:
        try:
            rows = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):
                raise
            rows = {}
        if rows.get("format") != FORMAT:
            raise UserError(f"{self.where} is a SQLite database but not a dpcurator ledger")
        if rows.get("version") != str(VERSION):
            raise UserError(f"ledger {self.where} has format version {rows.get('version')}; "
                            f"this dpcurator reads version {VERSION}")
        if "id" not in rows:
            raise LedgerIntegrityError(f"ledger {self.where}: its id is missing")
        return str(rows["id"])


_LIVE: weakref.WeakSet[SQLiteLedger] = weakref.WeakSet()


def _after_fork() -> None:
    """In the child, every ledger gets a new thread lock: the parent's may have been held by
    a thread that does not exist here. Connections are replaced on first use."""
    for ledger in list(_LIVE):
        ledger._lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class _WriterQueue:
    """An advisory ``flock`` on ``<ledger>.lock`` that writers take in turn (POSIX only)."""

    def __init__(self, path: Path | None) -> None:
        self._fd: int | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        if path is not None and sys.platform != "win32":
            try:
                self._fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            except OSError:
                self._fd = None  # a read-only folder: SQLite's own locking still holds
            else:
                self._finalizer = weakref.finalize(self, os.close, self._fd)

    @contextmanager
    def turn(self, write: bool) -> Iterator[None]:
        if not write or self._fd is None:
            yield
            return
        import fcntl

        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # closes the descriptor once
        self._fd = None


def _connect(target: str) -> sqlite3.Connection:
    db = sqlite3.connect(target, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                         check_same_thread=False)
    db.execute("PRAGMA synchronous = FULL")
    db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    return db


def _initialise(db: sqlite3.Connection, *, in_memory: bool) -> None:
    if not in_memory:
        mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise UserError("the ledger's file system does not support SQLite's write-ahead "
                            "log; put the ledger on a local disk")
    db.executescript("BEGIN;" + _SCHEMA + "COMMIT;")
    db.execute("BEGIN")
    db.executemany("INSERT INTO meta (key, value) VALUES (?, ?)",
                   [("format", FORMAT), ("version", str(VERSION)),
                    ("id", secrets.token_hex(16)), ("created", repr(time.time()))])
    db.execute("INSERT INTO head (id, seq, hash) VALUES (1, 0, '')")
    db.execute("COMMIT")


def _create_atomically(path: Path) -> None:
    """Build the empty ledger beside ``path`` and link it into place; losing a race is fine."""
    scratch = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.new")
    try:
        db = _connect(str(scratch))
        try:
            _initialise(db, in_memory=False)
        finally:
            db.close()  # checkpoints the WAL into the file and removes it
        try:
            os.link(scratch, path)
        except FileExistsError:
            pass  # another process created it first: use theirs
        else:
            _fsync_directory(path.parent)
    except OSError as exc:
        raise UserError(f"cannot create the ledger {path}: {exc.strerror or exc}") from None
    finally:
        for leftover in (scratch, Path(f"{scratch}-wal"), Path(f"{scratch}-shm")):
            leftover.unlink(missing_ok=True)


def _fsync_directory(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _check_path(path: Path) -> Path:
    if path.is_dir():
        raise UserError(f"the ledger path {path} is a folder; give a file path such as "
                        f"{path / 'ledger.sqlite'}")
    if not path.parent.is_dir():
        raise UserError(f"the ledger's folder {path.parent} does not exist; create it first")
    return path


def _check_is_ledger_file(path: Path) -> None:
    try:
        with path.open("rb") as handle:
            start = handle.read(4096)
    except OSError as exc:
        raise UserError(f"cannot read the ledger {path}: {exc.strerror or exc}") from None
    if start.startswith(_SQLITE_MAGIC):
        return
    if not start.strip():
        raise LedgerIntegrityError(
            f"ledger {path} is empty. A ledger is never empty: if it was emptied, what it "
            "recorded is still spent. Restore it from a backup; to start a new budget on "
            "purpose, give a new path")
    first = start.split(b"\n", 1)[0]
    if first.lstrip().startswith(b"{") and b'"cost"' in first:
        raise UserError(
            f"{path} is a JSONL budget journal written by an older dpcurator; migrate it "
            f"once with `dpcurator ledger migrate {path} --epsilon TOTAL [--delta TOTAL]` "
            "(the old file is kept beside it as .jsonl.bak)")
    raise UserError(f"{path} exists but is not a dpcurator ledger; give another path")


def _check_account_name(name: str) -> None:
    if not isinstance(name, str) or not name or len(name) > 200 or not name.isprintable():
        raise UserError(f"account must be a printable name of 1 to 200 characters, got {name!r}")


def entries_as_json(entries: Sequence[Entry]) -> list[dict[str, object]]:
    return [e.to_json() for e in entries]
