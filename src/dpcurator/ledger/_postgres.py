"""The PostgreSQL ledger: the service's home of budgets, one schema shared by every connection.

The ledger's logic (chain, accounts, debits, requests) is ``_ledger.Ledger``'s; this module
holds it in PostgreSQL (psycopg 3: ``pip install 'dpcurator[postgres]'``), in one schema of a
database (``dpcurator_ledger`` by default; ``?schema=NAME`` in the URL, or ``schema=``, puts
the ledgers of several deployments in one database). Correctness across connections,
processes and crashes rests on PostgreSQL itself:

- every change is one transaction (READ COMMITTED) whose first statement locks the one row
  of ``head`` (``SELECT ... FOR UPDATE``): the writers' lock, taken before anything is read
  and held to COMMIT, so the read-check-append of a debit is atomic against every other
  connection. Writers queue on it in the server; after ``lock_timeout`` (120 s) a writer
  gives up with nothing charged. Each statement after the lock sees every commit before it.
  (A row lock, not ``LOCK TABLE``: a table lock would wait for autovacuum of ``head``. A
  ledger whose head row was deleted locks nothing, and refuses at once: see ``_catch_up``);
- reads are one REPEATABLE READ, READ ONLY transaction: one snapshot, so the entries and the
  head are seen as one commit left them, while writers go on;
- a transaction that returned from COMMIT is durable as the server's settings make it
  (``fsync`` and ``synchronous_commit`` on, the defaults); a client killed at any point leaves
  all of its transaction or none of it, and its locks are released with its connection;
- triggers (PL/pgSQL) refuse UPDATE, DELETE and TRUNCATE on ``entries`` and DELETE and
  TRUNCATE on ``head``, so honest code can only append;
- the tables are created, once, in one transaction under a transaction-level advisory lock
  keyed by the schema, so that processes opening a new ledger at once end with one ledger.

What the tables cannot show: a role that owns them can disable the triggers and rewrite the
chain consistently from some entry on, or restore an older backup, and leave a ledger that
verifies. A live process notices at its next operation (its last verified entry changed);
against the rest, keep the head hash elsewhere and check it with
``dpcurator ledger verify URL --expect-head HASH``. Give the service a role that may insert
and lock but not own the tables to take the triggers out of its reach.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import secrets
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql

from dpcurator.errors import LedgerBusyError, LedgerIntegrityError, UserError

from ._chain import FORMAT, VERSION
from ._ledger import Cursor, Ledger
from ._urls import is_postgres_url, mask_url, url_secrets

__all__ = ["DEFAULT_SCHEMA", "PostgresLedger"]

_log = logging.getLogger("dpcurator.ledger")
DEFAULT_SCHEMA = "dpcurator_ledger"
LOCK_TIMEOUT_S = 120.0
CONNECT_TIMEOUT_S = 30

# The stored releases by what they answered (``Ledger.stored_release``); added to a ledger made
# before it when it is opened, where the role may (its lookups scan otherwise).
_FINGERPRINTS = "CREATE INDEX requests_by_fingerprint ON {s}.requests (dataset, fingerprint)"

# {s} is the schema, quoted by psycopg.sql.Identifier. One statement per item.
_SCHEMA: tuple[str, ...] = (
    "CREATE TABLE {s}.meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE {s}.entries (
        seq BIGINT PRIMARY KEY,
        account TEXT NOT NULL,
        kind TEXT NOT NULL,
        body TEXT NOT NULL,
        hash TEXT NOT NULL
    )""",
    "CREATE INDEX entries_by_account ON {s}.entries (account, seq)",
    """CREATE TABLE {s}.head (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        seq BIGINT NOT NULL,
        hash TEXT NOT NULL
    )""",
    """CREATE TABLE {s}.requests (
        id TEXT PRIMARY KEY,
        analyst TEXT NOT NULL,
        dataset TEXT NOT NULL,
        idempotency_key TEXT,
        fingerprint TEXT NOT NULL,
        created DOUBLE PRECISION NOT NULL,
        first_entry BIGINT NOT NULL,
        label TEXT NOT NULL,
        release TEXT,
        UNIQUE (analyst, dataset, idempotency_key)
    )""",
    "CREATE INDEX requests_by_analyst ON {s}.requests (analyst, dataset, created)",
    _FINGERPRINTS,
    """CREATE FUNCTION {s}.refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION '%', TG_ARGV[0] USING ERRCODE = 'restrict_violation';
    END
    $$""",
    "CREATE TRIGGER entries_are_append_only BEFORE UPDATE OR DELETE ON {s}.entries "
    "FOR EACH ROW EXECUTE FUNCTION {s}.refuse_change('ledger entries are append-only')",
    "CREATE TRIGGER entries_are_never_truncated BEFORE TRUNCATE ON {s}.entries "
    "FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse_change('ledger entries are append-only')",
    "CREATE TRIGGER head_stays BEFORE DELETE ON {s}.head "
    "FOR EACH ROW EXECUTE FUNCTION {s}.refuse_change('the ledger head cannot be deleted')",
    "CREATE TRIGGER head_is_never_truncated BEFORE TRUNCATE ON {s}.head "
    "FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse_change('the ledger head cannot be deleted')",
)


class PostgresLedger(Ledger):
    """A ledger in one schema of a PostgreSQL database, opened with a ``postgresql://`` URL.

    The schema is ``schema`` (or the URL's ``?schema=`` parameter; default
    ``dpcurator_ledger``). Its tables are created, atomically, the first time it is opened
    (unless ``create=False``, which refuses a schema without a ledger); an existing ledger's
    whole chain must verify. One connection per object, used by one thread at a time; a
    forked child gets a connection of its own on first use. The URL's password never
    appears in ``where``, messages or errors.
    """

    def __init__(self, url: str, *, schema: str | None = None, create: bool = True) -> None:
        if not is_postgres_url(url):
            raise UserError("a PostgreSQL ledger is named by a postgresql:// URL, got "
                            f"{mask_url(str(url))!r}")
        self._conninfo, from_url, self._secrets = _parse(url)
        if schema is not None and from_url is not None and schema != from_url:
            raise UserError(f"the ledger's schema is given twice: {schema!r} and ?schema="
                            f"{from_url!r} in the URL")
        self.schema = _check_schema(schema or from_url or DEFAULT_SCHEMA)
        self.where = _where(url, self.schema)
        self.path = None  # not a file
        self._pid = os.getpid()
        self._inherited: list[object] = []
        self._db = self._connect()
        try:
            with self._translated():
                if not self._has_ledger():
                    if not create:
                        raise UserError(f"no ledger at {self.where} (schema {self.schema!r} "
                                        "holds none)")
                    self._create()
                ledger_id = self._read_meta()
                self._upgrade()
            self._start(ledger_id)
        except BaseException:
            self._db.close()
            raise

    # -- the connection ------------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        with self._translated():
            db = psycopg.connect(self._conninfo, autocommit=True)
            try:
                db.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
                db.execute(f"SET lock_timeout = '{int(LOCK_TIMEOUT_S * 1000)}ms'")
            except BaseException:
                db.close()
                raise
            return db

    def _current(self) -> psycopg.Connection[Any]:
        """This process's connection: a new one in a forked child, or after one was lost.

        A connection must not cross a fork. The inherited one is kept, unused and unclosed
        (closing it would end the parent's session); psycopg never closes it from the child.
        """
        if self._pid != os.getpid():
            self._inherited.append(self._db)
            self._pid = os.getpid()
            self._db = self._connect()
        elif self._db.closed:
            self._db = self._connect()
        return self._db

    def close(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                self._db.close()

    # -- transactions --------------------------------------------------------------------------

    @contextmanager
    def _database(self, write: bool) -> Iterator[_Connection]:
        """A writer locks the ``head`` row first (READ COMMITTED); a reader gets one snapshot."""
        with self._translated():
            db = self._current()
            if write:
                db.execute("BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE")
                try:
                    db.execute("SELECT seq FROM head WHERE id = 1 FOR UPDATE")
                except BaseException:
                    _rollback(db)
                    raise
            else:
                db.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            try:
                yield _Connection(db)
            except BaseException:
                _rollback(db)
                raise
            db.execute("COMMIT")

    @contextmanager
    def _translated(self) -> Iterator[None]:
        """Turn psycopg's errors into dpcurator's, with the URL's password scrubbed."""
        try:
            yield
        except psycopg.Error as exc:
            raise self._error(exc) from None

    def _error(self, exc: psycopg.Error) -> Exception:
        diag = getattr(exc, "diag", None)
        text = (diag.message_primary if diag is not None and diag.message_primary
                else str(exc).strip().split("\n")[0]) or type(exc).__name__
        for secret in self._secrets:
            text = text.replace(secret, "***")
        if isinstance(exc, pg_errors.LockNotAvailable):
            return LedgerBusyError(f"ledger {self.where} stayed locked by another connection "
                                   f"for {LOCK_TIMEOUT_S:.0f} s; nothing was charged, try again")
        if isinstance(exc, pg_errors.QueryCanceled | pg_errors.TransactionRollback):
            return LedgerBusyError(f"ledger {self.where}: the database stopped the "
                                   f"transaction ({text}); nothing was charged, try again")
        if isinstance(exc, pg_errors.InsufficientPrivilege | pg_errors.ReadOnlySqlTransaction):
            return UserError(f"ledger {self.where}: the database refused ({text}); the role "
                             "must be able to create the ledger's schema the first time, and "
                             "to read, insert into, update and lock its tables")
        if isinstance(exc, psycopg.DataError):  # text it cannot hold: a NUL, another encoding
            return UserError(f"ledger {self.where} cannot store this request's text ({text}); "
                             "nothing was charged")
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            return LedgerBusyError(f"cannot use the ledger {self.where}: {text}. No answer "
                                   "was released; try again")
        return LedgerIntegrityError(
            f"ledger {self.where} cannot be read as a ledger ({text}); its tables were "
            "dropped or changed: restore it from a backup. Nothing was charged")

    # -- creation ------------------------------------------------------------------------------

    def _has_ledger(self) -> bool:
        row = self._db.execute("SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = %s "
                               "AND tablename = 'meta'", (self.schema,)).fetchone()
        return row is not None

    def _create(self) -> None:
        """Create the schema's tables, unless another connection got there first."""
        db = self._db
        s = sql.Identifier(self.schema)
        with db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(%s)", (self._creation_key(),))
            if self._has_ledger():
                return  # another process created it while this one waited
            namespace = db.execute("SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %s",
                                   (self.schema,)).fetchone()
            if namespace is None:
                db.execute(sql.SQL("CREATE SCHEMA {}").format(s))
            try:
                for statement in _SCHEMA:
                    db.execute(sql.SQL(statement).format(s=s))
            except (pg_errors.DuplicateTable, pg_errors.DuplicateFunction,
                    pg_errors.DuplicateObject):
                raise UserError(f"schema {self.schema!r} at {self.where} holds "
                                "tables that are not a dpcurator ledger; give another "
                                "?schema=") from None
            for row in (("format", FORMAT), ("version", str(VERSION)),
                        ("id", secrets.token_hex(16)), ("created", repr(time.time()))):
                db.execute("INSERT INTO meta (key, value) VALUES (%s, %s)", row)
            db.execute("INSERT INTO head (id, seq, hash) VALUES (1, 0, '')")

    def _upgrade(self) -> None:
        """Add what later versions index to a ledger made before them, once, under the
        creation's advisory lock; a role that may not is told so in the log, not refused."""
        db = self._db
        if db.execute("SELECT 1 FROM pg_catalog.pg_indexes WHERE schemaname = %s AND "
                      "indexname = 'requests_by_fingerprint'", (self.schema,)).fetchone():
            return
        try:
            with db.transaction():
                db.execute("SELECT pg_advisory_xact_lock(%s)", (self._creation_key(),))
                if db.execute("SELECT 1 FROM pg_catalog.pg_indexes WHERE schemaname = %s AND "
                              "indexname = 'requests_by_fingerprint'",
                              (self.schema,)).fetchone() is None:
                    db.execute(sql.SQL(_FINGERPRINTS).format(s=sql.Identifier(self.schema)))
        except pg_errors.InsufficientPrivilege:
            _log.warning("ledger %s: this role may not add the index of stored releases by "
                         "fingerprint; looking them up reads the dataset's requests instead",
                         self.where)

    def _creation_key(self) -> int:
        return int.from_bytes(hashlib.sha256(f"{FORMAT}:{self.schema}".encode()).digest()[:8],
                              "big", signed=True)

    def _read_meta(self) -> str:
        rows = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
        if rows.get("format") != FORMAT:
            raise UserError(f"schema {self.schema!r} at {self.where} holds a table 'meta' but "
                            "not a dpcurator ledger")
        if rows.get("version") != str(VERSION):
            raise UserError(f"ledger {self.where} has format version {rows.get('version')}; "
                            f"this dpcurator reads version {VERSION}")
        if "id" not in rows:
            raise LedgerIntegrityError(f"ledger {self.where}: its id is missing")
        return str(rows["id"])


class _Connection:
    """The ledger's view of a psycopg connection: ``?`` placeholders, as in SQLite."""

    def __init__(self, db: psycopg.Connection[Any]) -> None:
        self._db = db

    def execute(self, statement: str, parameters: Sequence[Any] = ()) -> Cursor:
        return self._db.execute(_placeholders(statement), tuple(parameters))


@functools.lru_cache(maxsize=256)
def _placeholders(statement: str) -> str:
    return statement.replace("%", "%%").replace("?", "%s")


def _rollback(db: psycopg.Connection[Any]) -> None:
    """Roll back; a connection that cannot even do that is closed (the next use reconnects)."""
    try:
        db.execute("ROLLBACK")
    except psycopg.Error:
        db.close()


def _parse(url: str) -> tuple[str, str | None, list[str]]:
    """The URL for libpq (without ``schema=``), the schema it names, and its passwords."""
    parts = urlsplit(url)
    kept, schemas = [], []
    for piece in parts.query.split("&"):
        if not piece:
            continue
        key, _, value = piece.partition("=")
        if unquote(key) == "schema":
            schemas.append(unquote(value))
        else:
            kept.append(piece)
    if len(set(schemas)) > 1:
        raise UserError(f"the URL {mask_url(url)} names several schemas")
    if not any(piece.partition("=")[0] == "connect_timeout" for piece in kept):
        kept.append(f"connect_timeout={CONNECT_TIMEOUT_S}")
    if not any(piece.partition("=")[0] == "application_name" for piece in kept):
        kept.append("application_name=dpcurator-ledger")
    conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path, "&".join(kept),
                           parts.fragment))
    return conninfo, (schemas[0] if schemas else None), url_secrets(url)


def _where(url: str, schema: str) -> str:
    """The masked URL, naming the schema unless it is the default (a usable target)."""
    parts = urlsplit(url)
    query = [p for p in parts.query.split("&")
             if p and unquote(p.partition("=")[0]) != "schema"]
    if schema != DEFAULT_SCHEMA:
        query.append(f"schema={quote(schema, safe='')}")
    return mask_url(urlunsplit((parts.scheme, parts.netloc, parts.path, "&".join(query),
                                parts.fragment)))


def _check_schema(name: str) -> str:
    if not isinstance(name, str) or not name or len(name.encode()) > 63 or (
            not name.isprintable()):
        raise UserError("a ledger's schema must be a printable name of 1 to 63 bytes, got "
                        f"{name!r}")
    return name
