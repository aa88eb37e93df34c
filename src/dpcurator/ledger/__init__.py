"""The durable budget ledger: the only place a privacy budget changes.

- ``Budget``: a privacy filter whose state lives in a ledger (in memory, or a SQLite file
  shared by every thread and process that opens it).
- ``SQLiteLedger``: the ledger itself: hash-chained, append-only entries; the total stored
  when an account is opened; one conditional debit per transaction.
- ``migrate_journal``: turn a JSONL journal of dpcurator 0.1 into a ledger.

The owner's view is ``dpcurator ledger verify|show|export|raise|migrate LEDGER``.
"""

from dpcurator.accounting.filters import Amount

from ._chain import AccountState, Entry
from ._journal import migrate_journal
from ._sqlite import LedgerReport, SQLiteLedger
from .budget import Budget, Charge

__all__ = [
    "AccountState",
    "Amount",
    "Budget",
    "Charge",
    "Entry",
    "LedgerReport",
    "SQLiteLedger",
    "migrate_journal",
]
