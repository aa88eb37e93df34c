"""A compiled query (its statement and what running it needs), an engine's cache of them, and
the statement's result rows turned into ``ExactAggregates`` (``collect``)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dpcurator.engines._base import ExactAggregates
from dpcurator.engines._hash import hash_parameters
from dpcurator.query.bounding import BoundedQuery

__all__ = ["CompileCache", "CompiledQuery", "collect"]


@dataclass(frozen=True)
class CompiledQuery:
    """One bounded query compiled for one engine: its statement and what running it needs."""

    query: BoundedQuery
    statement: str
    parameter_names: tuple[str, ...]
    keys_table: str | None
    key_types: tuple[str, ...]
    sql: list[str] = field(default_factory=list)  # as shown in releases (no key)

    def parameters(self, key: int) -> dict[str, int]:
        return hash_parameters(key, self.parameter_names)


class CompileCache:
    """An engine's compiled queries, each compiled once and kept (least recently used out):
    validation and computation of one query share its statement, and a repeated query is
    not compiled again. The caller holds the engine's lock."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._items: OrderedDict[BoundedQuery, CompiledQuery] = OrderedDict()

    def get(self, query: BoundedQuery, compile_: Callable[[], CompiledQuery]) -> CompiledQuery:
        compiled = self._items.get(query)
        if compiled is None:
            compiled = self._items[query] = compile_()
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        else:
            self._items.move_to_end(query)
        return compiled


def _split_parts(query: BoundedQuery, rows: Sequence[tuple[Any, ...]]
                 ) -> list[list[tuple[Any, ...]]]:
    """One tagged result (keys, __part, sums..., __bin, __count) -> [sums rows, histogram
    rows...], each shaped as its own statement would return it."""
    width = 1 if query.keys is not None else len(query.group_keys)
    parts: list[list[tuple[Any, ...]]] = [[] for _ in range(1 + len(query.histograms))]
    for row in rows:
        part = int(row[width])
        if part == 0:
            parts[0].append(row[:width] + row[width + 1:-2])
        else:
            parts[part].append(row[:width] + row[-2:])
    return parts


def collect(compiled: CompiledQuery, rows: Sequence[tuple[Any, ...]]) -> ExactAggregates:
    """The statement's result rows as exact aggregates (Python ints, whatever the engine's
    exact type: HUGEINT, NUMERIC or DECIMAL)."""
    query = compiled.query
    if query.profile is not None:
        return ExactAggregates([], {}, sql=list(compiled.sql), profile=[
            tuple(None if v is None else int(v) for v in row) for row in rows])
    results = _split_parts(query, rows) if query.histograms else [list(rows)]
    # With public keys the statement returns the key's index in ``query.keys`` instead of
    # the key itself (so a key given as "1" for an integer column is still the same key).
    width = 1 if query.keys is not None else len(query.group_keys)
    main = results[0]
    keys = [tuple(row[:width]) for row in main]
    if query.keys is not None:
        keys = [(int(k[0]),) for k in keys]
    measures: dict[str, list[int]] = {}
    for j, measure in enumerate(query.measures):
        measures[measure.name] = [int(row[width + j] or 0) for row in main]
    selection = None
    if query.selection_units:
        selection = [int(row[width + len(query.measures)] or 0) for row in main]
    histograms: dict[str, dict[tuple[Any, ...], list[int]]] = {}
    for spec, part in zip(query.histograms, results[1:], strict=True):
        table: dict[tuple[Any, ...], list[int]] = {}
        for row in part:
            key = tuple(row[:width]) if query.keys is None else (int(row[0]),)
            counts = table.setdefault(key, [0] * spec.bins)
            counts[int(row[width])] = int(row[width + 1])
        histograms[spec.name] = table
    return ExactAggregates(keys, measures, selection, histograms, list(compiled.sql))
