"""Token buckets shared by every process that opens them, beside a ledger.

    buckets = open_rate_buckets(target)        # the ledger's file path or postgresql:// URL
    buckets.take("alice", rate=100.0, burst=200)  # True: admitted; False: over the rate

The service's per-analyst rate limit, held across its workers and across services over one
ledger (each process's own buckets would let N workers admit N times the rate). A bucket
holds up to ``burst`` tokens and refills at ``rate`` tokens a second; each request takes one.
A take is atomic (one read and write of the bucket under an exclusive lock of the mapped
table, or one upsert whose ``WHERE`` lets it through only while the bucket holds a whole
token), so however many processes take at once, no key is admitted more than
``burst + rate * t`` times in any ``t`` seconds (as long as the clock the buckets keep does
not jump forward).

Where they live:

- beside a SQLite ledger (on one machine, then), in a small file of their own,
  ``<ledger>.buckets`` (0600): a fixed table of ``SLOTS`` buckets mapped into every process's
  memory, a take being a few reads and one write of it under an exclusive ``lockf`` of the
  file (``MappedRateBuckets``), on the machine's clock. Not in the ledger's file, where every
  request would queue for the lock that charges hold; and no longer in a SQLite file of
  their own (``<ledger>.rates``, ``SQLiteRateBuckets``, still used where ``fcntl`` is
  missing): there a take was an upsert under a ``flock``, 13 µs of CPU with the lock held
  throughout, and with 4 workers on 2 busy cores a worker preempted while holding it stalled
  every other's event loop (measured: 4 workers served 28% more cached answers with no take
  at all; with this table the take is about 3 µs). A crash of the machine may leave a bucket
  unreadable, which then starts full again: a few seconds of limit lost, nothing worse.
  Services of an older version over the same ledger keep their buckets in ``.rates``, so
  during an upgrade the two halves do not share the limit;
- in a PostgreSQL ledger's schema, the ``UNLOGGED`` table ``rate_buckets`` (created on first
  use; the role needs CREATE on the schema then), on the database server's clock, so that
  services on several machines agree on the time.

They are the ledger package's because they share its databases and how it reaches them
(URLs, passwords kept out of messages, forks), never its chain: a rate is not a budget, and
losing the buckets loses nothing but a few seconds of limit.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import os
import sqlite3
import struct
import sys
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from dpcurator.errors import UserError

from ._sqlite import BUSY_TIMEOUT_S, _WriterQueue
from ._urls import is_postgres_url

__all__ = ["RateBuckets", "open_rate_buckets"]

SLOTS = 4096  # buckets in a mapped table: keys (analysts, owners) of every service over it

# ?1 key, ?2 burst, ?3 now, ?4 rate. The refill counts from the bucket's last take; a clock
# that steps back refills nothing.
_TAKE_SQLITE = """
INSERT INTO buckets (key, tokens, at) VALUES (?1, ?2 - 1, ?3)
ON CONFLICT (key) DO UPDATE SET
    tokens = min(?2, tokens + max(0.0, excluded.at - at) * ?4) - 1,
    at = max(at, excluded.at)
WHERE min(?2, tokens + max(0.0, excluded.at - at) * ?4) >= 1
RETURNING tokens
"""

_TAKE_POSTGRES = """
INSERT INTO rate_buckets AS b (key, tokens, at)
VALUES (%(key)s, %(burst)s - 1, extract(epoch FROM clock_timestamp())::double precision)
ON CONFLICT (key) DO UPDATE SET
    tokens = LEAST(%(burst)s, b.tokens + GREATEST(0, EXCLUDED.at - b.at) * %(rate)s) - 1,
    at = GREATEST(b.at, EXCLUDED.at)
WHERE LEAST(%(burst)s, b.tokens + GREATEST(0, EXCLUDED.at - b.at) * %(rate)s) >= 1
RETURNING b.tokens
"""


class RateBuckets(ABC):
    """Token buckets by key, shared by every process that opens the same ones."""

    where: str

    @abstractmethod
    def take(self, key: str, *, rate: float, burst: int) -> bool:
        """Take one token from ``key``'s bucket (``burst`` at most, refilled at ``rate`` a
        second; a new key starts full): True if there was one, False if not."""

    @abstractmethod
    def close(self) -> None:
        """Release the connection."""


def open_rate_buckets(target: str) -> RateBuckets:
    """The buckets beside the ledger ``target`` names (a file path or a PostgreSQL URL)."""
    if is_postgres_url(target):
        return PostgresRateBuckets(target)
    if sys.platform == "win32":  # no fcntl
        return SQLiteRateBuckets(Path(f"{target}.rates"))
    return MappedRateBuckets(Path(f"{target}.buckets"))


# The mapped table: a header (magic, slot count), then SLOTS slots of a key's digest (16 bytes,
# all zero: empty), its tokens and the time of its last take (two doubles), little-endian.
_MAGIC = b"dpcbkt01"
_HEADER = struct.Struct("<8sI4x")
_SLOT = struct.Struct("<16sdd")
_STATE = struct.Struct("<dd")
_EMPTY = bytes(16)


class MappedRateBuckets(RateBuckets):
    """Buckets in a file of ``SLOTS`` fixed slots (created 0600), mapped into memory and
    shared by every process that maps it; a take holds an exclusive ``lockf`` of the file
    for a few reads and one write. A key is found by its BLAKE2b digest (128 bits), probing
    from ``digest mod SLOTS``; a key never seen takes an empty slot and starts full. With
    every slot taken a new key is refused with an error (the service answers 503)."""

    def __init__(self, path: Path) -> None:
        self.path, self.where = path, str(path)
        self._lock = threading.Lock()
        self._pid = -1
        self._open()

    def _open(self) -> None:
        import fcntl

        size = _HEADER.size + SLOTS * _SLOT.size
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise UserError(f"cannot use the rate limits' file {self.path}: "
                            f"{exc.strerror}") from None
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
            try:  # the first to open it lays it out; anyone else checks the layout
                if os.fstat(fd).st_size == 0:
                    os.ftruncate(fd, size)
                    os.pwrite(fd, _HEADER.pack(_MAGIC, SLOTS), 0)
                header = os.pread(fd, _HEADER.size, 0)
                if (os.fstat(fd).st_size != size or len(header) != _HEADER.size
                        or _HEADER.unpack(header) != (_MAGIC, SLOTS)):
                    raise UserError(f"{self.path} is not a rate limits' file of this version "
                                    "of dpcurator (stop the services over the ledger and "
                                    "remove it: it holds nothing but the rate limits' "
                                    "tokens)")
            finally:
                fcntl.lockf(fd, fcntl.LOCK_UN)
            table = mmap.mmap(fd, size)
        except OSError as exc:
            os.close(fd)
            raise UserError(f"cannot use the rate limits' file {self.path}: "
                            f"{exc.strerror}") from None
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._table, self._pid = fd, table, os.getpid()

    def take(self, key: str, *, rate: float, burst: int) -> bool:
        import fcntl

        digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        first = int.from_bytes(digest[:8], "little") % SLOTS
        with self._lock:
            if self._pid != os.getpid():  # a forked child: a descriptor and map of its own
                self._open()
            table = self._table
            fcntl.lockf(self._fd, fcntl.LOCK_EX)
            try:
                now = time.time()
                for probe in range(SLOTS):
                    at = _HEADER.size + ((first + probe) % SLOTS) * _SLOT.size
                    found, tokens, then = _SLOT.unpack_from(table, at)
                    if found in (digest, _EMPTY):
                        break
                else:
                    raise UserError(f"the rate limits' file {self.path} has a bucket for "
                                    f"{SLOTS} keys already; a new one cannot be added (it "
                                    "keeps every name it has seen: stop the services over "
                                    "the ledger and remove it, it holds nothing but the "
                                    "rate limits' tokens)")
                if found == _EMPTY or not (math.isfinite(tokens) and math.isfinite(then)):
                    # a new key, or a slot left unreadable by a crash: it starts full
                    _SLOT.pack_into(table, at, digest, float(burst) - 1, now)
                    return True
                # The same arithmetic as the SQL takes': the refill counts from the last
                # take; a clock that steps back refills nothing; a refusal changes nothing.
                tokens = min(float(burst), tokens + max(0.0, now - then) * float(rate))
                if tokens < 1:
                    return False
                _STATE.pack_into(table, at + 16, tokens - 1, max(then, now))
                return True
            finally:
                fcntl.lockf(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                self._table.close()
                os.close(self._fd)


class SQLiteRateBuckets(RateBuckets):
    """Buckets in a SQLite file (created 0600), one autocommit statement a take."""

    def __init__(self, path: Path) -> None:
        self.path, self.where = path, str(path)
        self._lock = threading.Lock()
        self._pid = -1
        self._connect()

    def _connect(self) -> None:
        try:
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                 check_same_thread=False)
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = OFF")
            db.execute("CREATE TABLE IF NOT EXISTS buckets (key TEXT PRIMARY KEY, "
                       "tokens REAL NOT NULL, at REAL NOT NULL)")
        except (OSError, sqlite3.Error) as exc:
            raise UserError(f"cannot use the rate limits' file {self.path}: {exc}") from None
        self._db, self._queue, self._pid = db, _WriterQueue(self.path), os.getpid()

    def take(self, key: str, *, rate: float, burst: int) -> bool:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: a connection of its own
                self._connect()
            with self._queue.turn(True):
                row = self._db.execute(_TAKE_SQLITE, (key, float(burst), time.time(),
                                                      float(rate))).fetchone()
        return row is not None

    def close(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                self._db.close()
                self._queue.close()


class PostgresRateBuckets(RateBuckets):
    """Buckets in the ``rate_buckets`` table of a PostgreSQL ledger's schema, one autocommit
    statement a take (the row's lock orders takers of one key; others never wait)."""

    def __init__(self, url: str) -> None:
        from ._postgres import DEFAULT_SCHEMA, _check_schema, _parse, _where

        self._conninfo, schema, self._secrets = _parse(url)
        self.schema = _check_schema(schema or DEFAULT_SCHEMA)
        self.where = f"{_where(url, self.schema)} (rate_buckets)"
        self._lock = threading.Lock()
        self._pid = -1
        self._db: Any = None
        self._connect(create=True)

    def _connect(self, *, create: bool = False) -> None:
        import psycopg
        from psycopg import sql

        try:
            db = psycopg.connect(self._conninfo, autocommit=True)
            db.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
            db.execute("SET statement_timeout = '10s'")
            found = db.execute("SELECT to_regclass('rate_buckets')").fetchone()
            if create and (found is None or found[0] is None):
                with db.transaction():
                    db.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                               (f"dpcurator rate_buckets {self.schema}",))
                    db.execute("CREATE UNLOGGED TABLE IF NOT EXISTS rate_buckets (key TEXT "
                               "PRIMARY KEY, tokens DOUBLE PRECISION NOT NULL, at DOUBLE "
                               "PRECISION NOT NULL)")
        except psycopg.Error as exc:
            raise self._error(exc) from None
        self._db, self._pid = db, os.getpid()

    def _error(self, exc: Exception) -> UserError:
        text = str(exc).strip().split("\n")[0] or type(exc).__name__
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return UserError(f"cannot use the rate limits at {self.where}: {text}")

    def take(self, key: str, *, rate: float, burst: int) -> bool:
        import psycopg

        with self._lock:
            if self._pid != os.getpid() or self._db.closed:  # a forked child, or a lost one
                self._connect()
            try:
                row = self._db.execute(_TAKE_POSTGRES, {"key": key, "burst": float(burst),
                                                        "rate": float(rate)}).fetchone()
            except psycopg.Error as exc:
                if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
                    self._db.close()  # the next take reconnects
                raise self._error(exc) from None
        return row is not None

    def close(self) -> None:
        with self._lock:
            if self._pid == os.getpid() and self._db is not None:
                self._db.close()
