"""The durable budget ledger: the only place a privacy budget changes.

- ``Budget``: a privacy filter whose state lives in a ledger (in memory, or a SQLite file
  shared by every thread and process that opens it).
- ``Ledger``: the ledger itself, whatever holds it: hash-chained, append-only entries; the
  total stored when an account is opened; one conditional debit (of one or several accounts)
  per transaction; the service's requests and their stored releases. ``SQLiteLedger`` holds
  it in a SQLite file (the default) or in memory.
- ``migrate_journal``: turn a JSONL journal of dpcurator 0.1 into a ledger.

The owner's view is ``dpcurator ledger verify|show|export|raise|migrate LEDGER``.
"""

from dpcurator.accounting.filters import Amount

from ._chain import AccountState, Entry
from ._journal import migrate_journal
from ._ledger import Ledger, LedgerReport, Reservation, StoredRequest
from ._sqlite import SQLiteLedger
from .budget import Budget, Charge

__all__ = [
    "AccountState",
    "Amount",
    "Budget",
    "Charge",
    "Entry",
    "Ledger",
    "LedgerReport",
    "Reservation",
    "SQLiteLedger",
    "StoredRequest",
    "migrate_journal",
]
