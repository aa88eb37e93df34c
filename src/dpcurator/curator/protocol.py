"""``CuratorLike``: the curator seam, one surface in process (``Curator``) and remote
(``dpcurator.connect``'s ``RemoteCurator``).

Code that only asks questions (the CLI, a dashboard, a notebook) takes a ``CuratorLike`` and
works with either. Both sides have these members, with these parameter names:

- ``sql(query, *, epsilon, delta, rho, noise, confidence, keys, intervals, total_share)``
- ``run(query, *, epsilon, delta, rho, noise, confidence)``: a ``Query`` or a ``Plan``
- ``explain(query, **privacy)``: DP SQL text, a ``Query`` or a ``Plan``; charges nothing
- ``remaining`` -> ``Amount`` (``dpcurator.accounting.filters``), rounded down
- ``ledger`` -> ``tuple[Charge, ...]`` (``dpcurator.ledger``): every charge, oldest first;
  answers given again for free are not charges and are not listed

Each side may take more keywords than these (``tests/test_curator_protocol.py`` pins the
differences): ``Curator`` also the data owner's and the session's options (``bounds``,
``max_partitions``, ``max_rows_per_partition``, ``weights``, ``cache``, ``label``,
``bounds_share``, ``max_unit_rows``, ``max_unit_sums``), which a service's analyst cannot set
(the dataset's owner configured them); ``RemoteCurator`` also ``idempotency_key``. How the
caps apply (``bounding``) is in the protocol: the analyst's choice on both sides, within the
caps the owner set or left to the data.

What ``sql`` and ``run`` return differs, and the protocol says so with a union rather than
hiding it: a ``Release`` in process (values as arrays, intervals at any level, the plan), and
from the service the JSON object it sends, that is ``Release.to_dict()`` plus ``query_id``,
``cached`` and ``remaining`` (the service's release is stored as that JSON, and the arrays,
plan and interval machinery do not cross the wire); both carry the release's ``warnings``
(a tuple of sentences in process, a list in the JSON). ``explain`` returns a dict on both sides
with ``cost``, ``noise`` (each measure with the mechanism's own ``error_95``) and ``warnings``
(what is known before spending that the release will warn of); in process
``cost`` is a guarantee object and the dict also holds the plan and the engine's SQL, and from
the service ``cost`` is JSON and the dict also holds ``dataset_cost`` and ``confidence``.

``isinstance(obj, CuratorLike)`` checks the members' presence without reading the properties
(no ledger read, no request to a service).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if sys.version_info >= (3, 12):
    from typing import Protocol, runtime_checkable
else:  # 3.11's isinstance would evaluate the properties (a request, for a remote curator)
    from typing_extensions import Protocol, runtime_checkable

if TYPE_CHECKING:
    from dpcurator.accounting.filters import Amount
    from dpcurator.curator.release import Release
    from dpcurator.ledger import Charge
    from dpcurator.query import Plan, Query

__all__ = ["CuratorLike"]


@runtime_checkable
class CuratorLike(Protocol):
    """What every curator answers, in process or remote (see the module docstring)."""

    def sql(self, query: str, *, epsilon: float | None = None, delta: float | None = None,
            rho: float | None = None, noise: str | None = None,
            confidence: float | None = None, keys: Any = None, intervals: str | None = None,
            total_share: float | None = None, bounding: str | None = None
            ) -> Release | dict[str, Any]:
        """Answer a DP SQL query, charging what it spends (or nothing, for an answer given
        before)."""
        ...

    def run(self, query: Query | Plan, *, epsilon: float | None = None,
            delta: float | None = None, rho: float | None = None, noise: str | None = None,
            confidence: float | None = None) -> Release | dict[str, Any]:
        """Answer a query built with ``dpcurator.query.Query`` (or its ``Plan``)."""
        ...

    def explain(self, query: Query | Plan | str, **privacy: Any) -> dict[str, Any]:
        """A query's cost and noise, charging nothing and reading no row."""
        ...

    @property
    def remaining(self) -> Amount:
        """What is left of the budget (rounded down)."""
        ...

    @property
    def ledger(self) -> tuple[Charge, ...]:
        """Every charge, oldest first."""
        ...
