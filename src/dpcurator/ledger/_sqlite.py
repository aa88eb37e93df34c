"""The SQLite ledger: the default home of budgets, one file shared by threads and processes.

The ledger's logic (chain, accounts, debits, requests) is ``_ledger.Ledger``'s; this module
holds it in SQLite. Correctness across threads, processes and crashes rests on SQLite itself:

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
- triggers refuse UPDATE and DELETE on entries, so honest code can only append;
- the file is created readable and writable by its owner only (0600), and so are the
  ``-wal`` and ``-shm`` files SQLite makes beside it (it copies the database's mode) and the
  ``.lock`` file: a ledger holds every analyst's SQL and every stored release.

What the files themselves cannot show: someone who rewrites the chain consistently from some
entry on (recomputing every later hash and the head), restores an older copy of the file, or
deletes the ``-wal`` file of a ledger no process has open, leaves a ledger that verifies. A
live process notices any of these at its next operation (its last verified entry changed);
against the rest, keep the head hash somewhere else (``dpcurator ledger show`` prints it) and
check it with ``dpcurator ledger verify --expect-head``.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from dpcurator.errors import LedgerBusyError, LedgerIntegrityError, UserError

from ._chain import FORMAT, VERSION
from ._ledger import Ledger

__all__ = ["SQLiteLedger"]

T = TypeVar("T")
BUSY_TIMEOUT_S = 120.0
SQLITE_MAGIC = b"SQLite format 3\x00"

_REQUESTS = """
CREATE TABLE IF NOT EXISTS requests (
    id TEXT PRIMARY KEY,
    analyst TEXT NOT NULL,
    dataset TEXT NOT NULL,
    idempotency_key TEXT,
    fingerprint TEXT NOT NULL,
    created REAL NOT NULL,
    first_entry INTEGER NOT NULL,
    label TEXT NOT NULL,
    release TEXT,
    UNIQUE (analyst, dataset, idempotency_key)
);
CREATE INDEX IF NOT EXISTS requests_by_analyst ON requests (analyst, dataset, created);
"""

# The stored releases by what they answered (``Ledger.stored_release``); added to ledgers made
# before it when they are opened, where the file can be written.
_FINGERPRINTS = """
CREATE INDEX IF NOT EXISTS requests_by_fingerprint ON requests (dataset, fingerprint);
"""

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
""" + _REQUESTS + _FINGERPRINTS


class SQLiteLedger(Ledger):
    """A ledger in one SQLite file (``path``), or in memory (``path=None``).

    The file is created, atomically, the first time it is opened (unless ``create=False``);
    an existing file must be a dpcurator ledger whose whole chain verifies. A forked child
    gets a connection of its own on first use.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *,
                 create: bool = True) -> None:
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
        self._start(self._guard(self._read_meta))

    def _guard(self, action: Callable[[], T]) -> T:
        try:
            return action()
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc) from None

    def _damaged(self, exc: sqlite3.Error) -> UserError | LedgerIntegrityError:
        """The error for a database error that is not a lock held too long: a file this
        process may not write (or open) is the owner's permissions to fix, not damage; telling
        them to restore a backup, or to start anew, would be wrong advice."""
        if _not_permitted(exc):
            return UserError(
                f"ledger {self.where} cannot be opened or written by this process ({exc}): "
                "the file or its folder is read-only for this user. Give it write access to "
                "both (SQLite writes the -wal and -shm files beside the ledger, even to read "
                "it); nothing was charged")
        return LedgerIntegrityError(
            f"ledger {self.where} cannot be read as a database ({exc}); it was damaged or "
            "truncated: restore it from a backup. Nothing was charged")

    @contextmanager
    def _database(self, write: bool) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` (writers, after their turn in the queue) or ``BEGIN``."""
        self._reopen_after_fork()
        if write and self.path is None and self._pid != os.getpid():
            # A forked child holds a copy of the parent's in-memory ledger that no other
            # process sees: its charges would spend the whole total again in every child.
            raise UserError(
                "this budget is in memory and was made in another process (this one was "
                "forked from it): a charge here would not be seen by the parent or the other "
                "processes, each of which could spend the whole total. Give the budget a "
                "journal file (Budget(..., journal='budget.sqlite')) so that processes share "
                "it; nothing was charged")
        with self._queue.turn(write):
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    yield db
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                if "locked" in str(exc) or "busy" in str(exc):
                    raise LedgerBusyError(
                        f"ledger {self.where} stayed locked by another process for "
                        f"{BUSY_TIMEOUT_S:.0f} s; nothing was charged, try again") from None
                raise self._damaged(exc) from None
            except sqlite3.DatabaseError as exc:
                raise self._damaged(exc) from None

    def _reopen_after_fork(self) -> None:
        """In a forked child, use a connection (and lock file) of its own.

        SQLite connections must not cross a fork, and a forked ``flock`` descriptor is shared
        with the parent. The inherited ones are kept, unused and unclosed (closing them here
        could release locks the parent holds); an in-memory ledger stays the parent's copy,
        readable, but refuses every write (``_database``).
        """
        if self._pid == os.getpid() or self.path is None:
            return
        with self._lock:  # a fresh lock: Ledger's fork hook replaced the inherited one
            if self._pid == os.getpid():
                return
            self._inherited += [self._db, self._queue]
            self._db = _connect(str(self.path))
            self._queue = _WriterQueue(self.path)
            self._pid = os.getpid()

    def close(self) -> None:
        with self._lock:
            self._db.close()
            self._queue.close()

    def _read_meta(self) -> str:
        try:
            rows = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):
                raise
            rows = {}
        if rows.get("format") != FORMAT:
            if self.path is not None and _looks_like_a_ledger(self.path):
                raise LedgerIntegrityError(
                    f"ledger {self.where} is damaged: it holds a dpcurator ledger's tables "
                    "but not its format record. What it recorded is still spent: restore it "
                    "from a backup. Nothing was charged")
            raise UserError(f"{self.where} is a SQLite database but not a dpcurator ledger")
        if rows.get("version") != str(VERSION):
            raise UserError(f"ledger {self.where} has format version {rows.get('version')}; "
                            f"this dpcurator reads version {VERSION}")
        if "id" not in rows:
            raise LedgerIntegrityError(f"ledger {self.where}: its id is missing")
        self._db.executescript(_REQUESTS)  # ledgers made before the service had no requests
        try:
            self._db.executescript(_FINGERPRINTS)
        except sqlite3.OperationalError as exc:  # read-only: its lookups scan instead
            if "readonly" not in str(exc):
                raise
        return str(rows["id"])


# SQLite's primary result codes for a file this process may not write or open (sqlite3.h):
# SQLITE_PERM, SQLITE_READONLY (with its extended codes), SQLITE_CANTOPEN.
_NOT_PERMITTED = (3, 8, 14)


def _not_permitted(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in _NOT_PERMITTED
    text = str(exc)
    return "readonly" in text or "unable to open database file" in text


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
        # Owner-only from the start (it holds every analyst's SQL and every release): SQLite
        # opens the empty file as a new database, and gives its -wal and -shm files the
        # database file's permissions.
        os.close(os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.chmod(scratch, 0o600)  # whatever the umask left
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
            fsync_directory(path.parent)
    except OSError as exc:
        raise UserError(f"cannot create the ledger {path}: {exc.strerror or exc}") from None
    finally:
        for leftover in (scratch, Path(f"{scratch}-wal"), Path(f"{scratch}-shm")):
            leftover.unlink(missing_ok=True)


def fsync_directory(folder: Path) -> None:
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
    if start.startswith(SQLITE_MAGIC):
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
    if _looks_like_a_ledger(path):
        # A ledger whose first bytes were overwritten: starting a new one at another path
        # would refund everything it recorded.
        raise LedgerIntegrityError(
            f"ledger {path} is damaged: its SQLite header is gone but it still holds a "
            "dpcurator ledger's tables. What it recorded is still spent: restore it from a "
            "backup. Nothing was charged")
    raise UserError(f"{path} exists but is not a dpcurator ledger; give another path")


_LEDGER_MARKS = (FORMAT.encode(), b"entries_are_append_only", b"CREATE TABLE entries")


def _looks_like_a_ledger(path: Path) -> bool:
    """Whether the file's first MiB holds what only a ledger's pages hold: its schema (page
    1 keeps the CREATE statements) or its format name (in the meta table)."""
    try:
        with path.open("rb") as handle:
            start = handle.read(1 << 20)
    except OSError:
        return False
    return any(mark in start for mark in _LEDGER_MARKS)

