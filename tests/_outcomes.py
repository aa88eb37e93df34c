"""The outcome of one query on a curator, for the tests that run neighbouring datasets: a
query is either refused before the charge or released, never failed after the charge."""

from __future__ import annotations

import dpcurator as dp
from dpcurator.errors import InternalError, UserError


def outcome(c: dp.Curator, query: str) -> str:
    """'released', or 'refused' (a UserError, nothing charged); never an error after it."""
    before = c.remaining.epsilon
    try:
        c.sql(query, epsilon=1.0)
    except UserError:
        assert c.remaining.epsilon == before, "refused after the charge"
        return "refused"
    except InternalError as exc:  # pragma: no cover - the bug
        raise AssertionError(f"failed after the charge: {query}") from exc
    assert c.remaining.epsilon == before - 1.0
    return "released"
