"""Database URLs: which targets are PostgreSQL, and how to keep a URL's password out of text.

``mask_url`` replaces a password (in the user part or a ``password=`` parameter) with ``***``;
``url_secrets`` lists the passwords a URL holds, to scrub them from messages.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = ["is_postgres_url", "mask_url", "url_secrets"]

_SECRET_KEYS = ("password", "sslpassword")


def is_postgres_url(target: object) -> bool:
    """Whether ``target`` is a ``postgresql://`` or ``postgres://`` URL."""
    return isinstance(target, str) and re.match(r"(?i)(postgresql|postgres)://",
                                                target) is not None


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
