"""The engine interface: run a bounded query, return exact aggregates per partition.

An engine has one job (``compute_exact_aggregates``) plus the schema questions the curator
asks before it charges anything. Everything private stays inside the engine and the exact
aggregates it returns; the curator adds noise to those before anything leaves.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from dpcurator.query.bounding import BoundedQuery
from dpcurator.query.schema import ColumnKind, column_kind

__all__ = ["ColumnKind", "Engine", "ExactAggregates", "column_kind", "integer_valued"]

_INTEGERS = frozenset((
    "TINYINT", "SMALLINT", "INTEGER", "INT", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
    "UINTEGER", "UBIGINT", "UHUGEINT", "INT1", "INT2", "INT4", "INT8", "INT128", "SIGNED",
    "SHORT", "LONG", "BOOLEAN", "BOOL", "LOGICAL"))
_WHOLE_DECIMAL = re.compile(r"^(DECIMAL|NUMERIC)\s*\(\s*\d+\s*,\s*0\s*\)$")


def integer_valued(sql_type: str) -> bool:
    """Does every value of this SQL type read as an integer (integer types, booleans,
    DECIMAL(p, 0))? A public fact: quantiles over such a column land on integers."""
    upper = " ".join(sql_type.upper().split())
    return upper in _INTEGERS or bool(_WHOLE_DECIMAL.match(upper))


@dataclass
class ExactAggregates:
    """Exact (un-noised) results of a bounded query: private, never shown to an analyst.

    - ``keys``: one tuple per partition present in the (filtered, bounded) data;
    - ``measures``: for each measure name, one exact Python int per partition;
    - ``selection_units``: distinct kept units per partition, when asked for;
    - ``histograms``: for each histogram name, {partition key: list of bin counts};
    - ``sql``: the statements the engine ran (the secret key is a parameter, not inlined);
    - ``profile``: for a profile query (``BoundedQuery.profile``), its rows (part, partitions
      per unit, rows per pair, sign, bucket, count) as Python ints (None where not applicable).
    """

    keys: list[tuple[Any, ...]]
    measures: dict[str, list[int]]
    selection_units: list[int] | None = None
    histograms: dict[str, dict[tuple[Any, ...], list[int]]] = field(default_factory=dict)
    sql: list[str] = field(default_factory=list)
    profile: list[tuple[int | None, ...]] | None = None


@runtime_checkable
class Engine(Protocol):
    """Runs bounded queries where the data lives: exactly what the curator calls.

    The schema questions come first (at construction, nothing charged), then ``validate``
    before a query is charged and ``compute_exact_aggregates`` after. An engine compiles a
    query once for both (``dpcurator.engines._sql``) and never lets a value of the data make
    a statement fail or appear in a message.
    """

    name: str

    def columns(self) -> Mapping[str, str]:
        """Column name -> SQL type name, in table order (the schema is public)."""
        ...

    def check_source(self) -> None:
        """Make sure no query can fail on a value of the data (a data-owner check, once):
        raise a UserError naming the bad lines and columns (never their values)."""
        ...

    def nan_columns(self, columns: Sequence[str]) -> list[str]:
        """Those of ``columns`` holding a NaN (a data-owner check, at construction)."""
        ...

    def validate(self, query: BoundedQuery) -> list[str]:
        """Bind the query's statements without reading a row (UserError if the table's types
        cannot run it); returns the statements, as a release shows them."""
        ...

    def compute_exact_aggregates(self, query: BoundedQuery, key: int) -> ExactAggregates:
        """Bound each unit's contribution and aggregate exactly, keyed by the secret ``key``."""
        ...

    def show_progress(self, enabled: bool) -> None:
        """Show the engine's own progress display on long queries, where it has one."""
        ...

    def close(self) -> None:
        """Release what the engine opened (not a connection the caller passed in)."""
        ...
