"""Which ledger a target names: a PostgreSQL URL, or a SQLite file (or memory).

``open_ledger("postgresql://user@host/db")`` opens a ``PostgresLedger`` (its tables in the
schema ``dpcurator_ledger``, or the one a ``?schema=NAME`` parameter names); anything else is
a SQLite file path (``None``: in memory). A URL's password never appears in what a ledger
prints or raises: ``mask_url`` (``_urls``) replaces it with ``***``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ._urls import is_postgres_url, mask_url, url_secrets

if TYPE_CHECKING:
    from ._ledger import Ledger

__all__ = ["is_postgres_url", "mask_url", "open_ledger", "url_secrets"]


def open_ledger(target: str | os.PathLike[str] | None, *, create: bool = True) -> Ledger:
    """The ledger ``target`` names: PostgreSQL for a ``postgresql://`` URL, else SQLite.

    With ``create=False`` a ledger that does not exist yet is refused (``UserError``)
    instead of created: the owner's commands only ever look at an existing one.
    """
    if is_postgres_url(target):
        from ._postgres import PostgresLedger

        assert isinstance(target, str)
        return PostgresLedger(target, create=create)
    from ._sqlite import SQLiteLedger

    return SQLiteLedger(target, create=create)
