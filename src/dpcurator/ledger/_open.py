"""Which ledger a target names: a PostgreSQL URL, or a SQLite file (or memory).

``open_ledger("postgresql://user@host/db")`` opens a ``PostgresLedger`` (its tables in the
schema ``dpcurator_ledger``, or the one a ``?schema=NAME`` parameter names); anything else is
a SQLite file path (``None``: in memory). A URL's password never appears in what a ledger
prints or raises: ``mask_url`` replaces it with ``***``.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit, urlunsplit

if TYPE_CHECKING:
    from ._ledger import Ledger

__all__ = ["is_postgres_url", "mask_url", "open_ledger", "url_secrets"]

_SCHEMES = ("postgresql", "postgres")
_SECRET_KEYS = ("password", "sslpassword")


def is_postgres_url(target: object) -> bool:
    """Whether ``target`` is a ``postgresql://`` or ``postgres://`` URL."""
    return isinstance(target, str) and re.match(r"(?i)(postgresql|postgres)://",
                                                target) is not None


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


def _split_query(query: str) -> list[tuple[str, str]]:
    """The raw ``key=value`` pieces of a query string, keys decoded, values kept as written."""
    pieces = []
    for piece in query.split("&"):
        if piece:
            key, _, value = piece.partition("=")
            pieces.append((unquote(key), value))
    return pieces


def mask_url(url: str) -> str:
    """``url`` with its password (in the user part or a ``password=`` parameter) as ``***``."""
    parts = urlsplit(url)
    netloc = parts.netloc
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.split(':', 1)[0]}:***@{hosts}"
    query = "&".join(f"{raw_key}={'***' if unquote(raw_key) in _SECRET_KEYS else value}"
                     if eq else piece
                     for piece in parts.query.split("&") if piece
                     for raw_key, eq, value in [piece.partition("=")])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def url_secrets(url: str) -> list[str]:
    """The passwords a URL holds, as written and decoded (to scrub them from messages)."""
    parts = urlsplit(url)
    found = []
    userinfo, at, _ = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        found.append(userinfo.split(":", 1)[1])
    found += [value for key, value in _split_query(parts.query) if key in _SECRET_KEYS]
    return sorted({s for raw in found for s in (raw, unquote(raw)) if s}, key=len,
                  reverse=True)
