"""The releases a service has sent, remembered in front of the ledger's stored releases.

Each process of a service (a worker of ``dpcurator serve --workers N``, or a service on
another machine over the same PostgreSQL ledger) remembers the releases it made or found, per
analyst, in a bounded memory. What it does not remember it looks up in the ledger, where
every release is stored under its request with the query's fingerprint: so a release made by
any process is sent again, free, by every other, and a restarted service still knows it.

The fingerprint (``query_fingerprint``) is the resolved query (the plan and the privacy
asked, in their canonical text) and the interval level. A release this process made answers
its query at any level (its intervals are recomputed: post-processing); one found in the
ledger answers only the level it was stored at (only its JSON is there), and the same query
asked at another level through another process is a new release, charged.

Releases are the analyst's own: a lookup names the analyst, and never finds another's
release unless the dataset shares them (``anyones``, which the service charges to the
asker's own budget; the other analyst's request id is never read).
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from dpcurator.curator import Release, ResolvedQuery
from dpcurator.errors import InternalError
from dpcurator.ledger import Ledger, fingerprint

__all__ = ["Kept", "Releases", "query_fingerprint"]

CACHE_SIZE = 4096  # releases remembered per process, per analyst and shared alike


@functools.lru_cache(maxsize=4096)
def query_fingerprint(dataset: str, resolved: ResolvedQuery) -> str:
    """The query's identity in the ledger: the same in every process (and on every machine)
    for the same dataset, resolved query and interval level, and different otherwise.

    The plan and the privacy request are frozen dataclasses whose text (``repr``) names every
    field; a text holding an object's address would differ between processes, so it is
    refused as a bug rather than left to miss silently (and to refuse retries as conflicts)."""
    text = repr(resolved.key)
    if " object at 0x" in text:
        raise InternalError("this is probably a bug: a resolved query's text holds an "
                            "object's address, so other processes cannot recognise it")
    return fingerprint(dataset, text, repr(float(resolved.level)))


@dataclass(frozen=True)
class Kept:
    """A release remembered: the ``Release`` itself when this process made it (it answers at
    any interval level), or the JSON found stored at ``level`` (it answers that level only)."""

    release: Release | None
    stored: dict[str, Any] | None
    level: float

    def at(self, level: float) -> dict[str, Any] | None:
        """The release as JSON data at the interval ``level``, or None if it cannot say."""
        if self.release is not None:
            return self.release.to_dict(level)
        if self.stored is not None and level == self.level:
            return self.stored
        return None


class Releases:
    """The releases one process has sent: per analyst, and per dataset where shared."""

    def __init__(self, ledger: Ledger, size: int = CACHE_SIZE) -> None:
        self.ledger, self.size = ledger, size
        # (analyst, dataset, resolved query) -> (request id, release): per analyst
        self._own: OrderedDict[tuple[str, str, Any], tuple[str, Kept]] = OrderedDict()
        # (dataset, resolved query) -> release: only for datasets that share releases
        self._shared: OrderedDict[tuple[str, Any], Kept] = OrderedDict()
        self._lock = threading.Lock()

    def own(self, analyst: str, dataset: str, resolved: ResolvedQuery, *,
            in_ledger: bool) -> tuple[str, dict[str, Any]] | None:
        """The analyst's own release of this query (its request id, and the release at the
        level asked): from memory, or with ``in_ledger`` from the ledger's stored releases
        (one read; the event loop's fast path leaves it out)."""
        with self._lock:
            found = self._own.get((analyst, dataset, resolved.key))
        if found is not None:
            answer = found[1].at(resolved.level)
            if answer is not None:
                return found[0], answer
        if not in_ledger:
            return None
        request = self.ledger.stored_release(dataset, query_fingerprint(dataset, resolved),
                                             analyst=analyst)
        if request is None or request.release is None:
            return None
        stored = json.loads(request.release)
        self.remember(analyst, dataset, resolved, request.id,
                      Kept(None, stored, resolved.level), shared=False)
        return request.id, stored

    def anyones(self, dataset: str, resolved: ResolvedQuery) -> Kept | None:
        """A release of this query made for any analyst of a dataset that shares them, from
        memory or the ledger; only the release is read, never whose request it was."""
        with self._lock:
            found = self._shared.get((dataset, resolved.key))
        if found is not None and found.at(resolved.level) is not None:
            return found
        request = self.ledger.stored_release(dataset, query_fingerprint(dataset, resolved))
        if request is None or request.release is None:
            return None
        kept = Kept(None, json.loads(request.release), resolved.level)
        self._keep_shared(dataset, resolved, kept)
        return kept

    def remember(self, analyst: str, dataset: str, resolved: ResolvedQuery, request_id: str,
                 kept: Kept, *, shared: bool) -> None:
        """Remember a release sent to the analyst (and, where the dataset shares releases,
        for its other analysts too); the least recently used is forgotten first."""
        key = (analyst, dataset, resolved.key)
        with self._lock:
            self._own[key] = (request_id, kept)
            self._own.move_to_end(key)
            while len(self._own) > self.size:
                self._own.popitem(last=False)
        if shared:
            self._keep_shared(dataset, resolved, kept)

    def _keep_shared(self, dataset: str, resolved: ResolvedQuery, kept: Kept) -> None:
        key = (dataset, resolved.key)
        with self._lock:
            known = self._shared.get(key)
            if known is None or known.release is None:  # one made here answers any level
                self._shared[key] = kept
            self._shared.move_to_end(key)
            while len(self._shared) > self.size:
                self._shared.popitem(last=False)
