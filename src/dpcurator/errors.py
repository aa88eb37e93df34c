"""Every error dpcurator raises on purpose, and how they relate.

    DPCuratorError
    ├── UserError (also a ValueError): the request was wrong. The message names the parameter
    │   │                              (or query part) and what was expected; nothing was charged.
    │   ├── UserTypeError (also a TypeError): a value of the wrong kind (a string for a number).
    │   ├── ConfigError (also dpcurator.server's and dpcurator.local's): a configuration (the
    │   │                service's curator.toml, a survey's configuration) is wrong; the message
    │   │                names the key.
    │   ├── BudgetExceededError: the charge would take the budget past its total.
    │   ├── LedgerBusyError: a budget ledger could not be used just now (locked too long, its
    │   │                    database unreachable); nothing was charged: try again.
    │   ├── UnsupportedChargeError: the budget cannot account this kind of guarantee.
    │   ├── UnsupportedEventError: an accountant has no sound bound for this event.
    │   ├── GridTooLargeError (raised by dpcurator.accounting): a privacy loss distribution's grid
    │   │                     would exceed its size limit; ask for a coarser one.
    │   ├── IdempotencyConflict (dpcurator.ledger): a request id reused for another request.
    │   ├── ReportError (dpcurator.local): a local-DP report that does not fit its survey.
    │   ├── QueryError (dpcurator.query): the query cannot be answered as written.
    │   │   ├── UnsupportedQueryError: it uses something DP SQL does not support.
    │   │   └── UnknownColumnError: it names a column the data does not have.
    │   └── BoundsError (dpcurator.query): clamping bounds missing or malformed.
    ├── LedgerIntegrityError: a budget ledger was damaged or tampered with (an entry edited,
    │                         deleted or reordered); it refuses to charge until restored.
    ├── ServiceError (dpcurator.server): the service refuses a request, with its HTTP status.
    ├── RemoteError (dpcurator.server.client): the service could not be reached, or failed.
    └── InternalError (also a RuntimeError): dpcurator broke an invariant; this is a bug.

Catch ``UserError`` for every mistake a caller can fix (``except ValueError`` still works),
``DPCuratorError`` for everything dpcurator raises on purpose. An ``InternalError`` is never the
caller's fault: please report it. No message ever contains a record's value.
"""

from __future__ import annotations

__all__ = [
    "BudgetExceededError",
    "ConfigError",
    "DPCuratorError",
    "InternalError",
    "LedgerBusyError",
    "LedgerIntegrityError",
    "UnsupportedChargeError",
    "UnsupportedEventError",
    "UserError",
    "UserTypeError",
]


class DPCuratorError(Exception):
    """Base class of the errors dpcurator raises on purpose."""


class UserError(DPCuratorError, ValueError):
    """The request was wrong; nothing was charged. The message says what to change."""


class UserTypeError(UserError, TypeError):
    """A value of the wrong kind (also a ``TypeError``); the message names the parameter."""


class ConfigError(UserError):
    """A configuration is wrong (the service's file, a survey's configuration); the message
    names the key."""


class BudgetExceededError(UserError):
    """The requested charge does not fit in what is left of the budget; nothing was charged."""


class UnsupportedChargeError(UserError):
    """The budget's composition rule cannot account this kind of guarantee."""


class UnsupportedEventError(UserError):
    """An accountant has no sound bound for this event; nothing was composed."""


class LedgerBusyError(UserError):
    """A budget ledger could not be used just now (locked by another writer for too long,
    its database unreachable or the transaction stopped); nothing was charged: try again."""


class LedgerIntegrityError(DPCuratorError):
    """A budget ledger does not verify; nothing is charged until its owner restores it.

    Never read as a refund: a ledger that cannot be trusted refuses every charge.
    """


class InternalError(DPCuratorError, RuntimeError):
    """An invariant inside dpcurator failed. This is probably a bug: please report it."""
