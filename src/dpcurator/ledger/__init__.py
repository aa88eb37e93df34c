"""The durable budget ledger: the only place a privacy budget changes.

- ``Budget``: a privacy filter whose state lives in a ledger (in memory, a SQLite file, or a
  PostgreSQL database, shared by every thread and process that opens it).
- ``Ledger``: the ledger itself, whatever holds it: hash-chained, append-only entries; the
  total stored when an account is opened; one conditional debit (of one or several accounts)
  per transaction; the service's requests and their stored releases. ``SQLiteLedger`` holds
  it in a SQLite file (the default) or in memory; ``PostgresLedger`` in a schema of a
  PostgreSQL database (``pip install 'dpcurator[postgres]'``).
- ``open_ledger(target)``: the ledger a ``postgresql://`` URL or a file path names.
- ``is_postgres_url``, ``mask_url``: whether a target is a PostgreSQL URL; the URL with its
  password as ``***``.
- ``IdempotencyConflict``, ``fingerprint``: a request id reused for another request; a
  request's identity.
- ``migrate_journal``: turn a JSONL journal of dpcurator 0.1 into a ledger.
- ``open_rate_buckets(target)``, ``RateBuckets``: token buckets beside a ledger, shared by
  every process that opens them (the service's per-analyst rate limit across its workers).

The owner's view is ``dpcurator ledger verify|show|export|raise|migrate LEDGER``.
"""

from typing import TYPE_CHECKING, Any

from dpcurator.accounting.filters import Amount

from ._chain import AccountState, Entry
from ._journal import migrate_journal
from ._ledger import (
    IdempotencyConflict,
    Ledger,
    LedgerReport,
    Reservation,
    StoredRequest,
    fingerprint,
)
from ._open import open_ledger
from ._rates import RateBuckets, open_rate_buckets
from ._sqlite import SQLiteLedger
from ._urls import is_postgres_url, mask_url
from .budget import Budget, Charge

if TYPE_CHECKING:
    from ._postgres import PostgresLedger

__all__ = [
    "AccountState",
    "Amount",
    "Budget",
    "Charge",
    "Entry",
    "IdempotencyConflict",
    "Ledger",
    "LedgerReport",
    "PostgresLedger",
    "RateBuckets",
    "Reservation",
    "SQLiteLedger",
    "StoredRequest",
    "fingerprint",
    "is_postgres_url",
    "mask_url",
    "migrate_journal",
    "open_ledger",
    "open_rate_buckets",
]


def __getattr__(name: str) -> Any:
    """``PostgresLedger`` is imported on first use: psycopg is an optional extra."""
    if name == "PostgresLedger":
        from ._postgres import PostgresLedger

        globals()[name] = PostgresLedger
        return PostgresLedger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
