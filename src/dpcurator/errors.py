"""Every error dpcurator raises on purpose, and how they relate.

    DPCuratorError
    ├── UserError (also a ValueError): the request was wrong. The message names the parameter
    │   │                              (or query part) and what was expected; nothing was charged.
    │   ├── BudgetExceededError: the charge would take the budget past its total.
    │   ├── UnsupportedChargeError: the budget cannot account this kind of guarantee.
    │   └── UnsupportedEventError: an accountant has no sound bound for this event.
    ├── LedgerIntegrityError: a budget ledger was damaged or tampered with (an entry edited,
    │                         deleted or reordered); it refuses to charge until restored.
    └── InternalError (also a RuntimeError): dpcurator broke an invariant; this is a bug.

No message ever contains a record's value.
"""

from __future__ import annotations

__all__ = [
    "BudgetExceededError",
    "DPCuratorError",
    "InternalError",
    "LedgerIntegrityError",
    "UnsupportedChargeError",
    "UnsupportedEventError",
    "UserError",
]


class DPCuratorError(Exception):
    """Base class of the errors dpcurator raises on purpose."""


class UserError(DPCuratorError, ValueError):
    """The request was wrong; nothing was charged. The message says what to change."""


class BudgetExceededError(UserError):
    """The requested charge does not fit in what is left of the budget; nothing was charged."""


class UnsupportedChargeError(UserError):
    """The budget's composition rule cannot account this kind of guarantee."""


class UnsupportedEventError(UserError):
    """An accountant has no sound bound for this event; nothing was composed."""


class LedgerIntegrityError(DPCuratorError):
    """A budget ledger does not verify; nothing is charged until its owner restores it.

    Never read as a refund: a ledger that cannot be trusted refuses every charge.
    """


class InternalError(DPCuratorError, RuntimeError):
    """An invariant inside dpcurator failed. This is probably a bug: please report it."""
