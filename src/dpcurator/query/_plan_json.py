"""Plans as JSON: what the builder makes, sent to a curator service instead of SQL text.

    {"aggregates": [{"kind": "count", "name": "n"},
                    {"kind": "sum", "column": "amount", "bounds": [0, 500]},
                    {"kind": "quantile", "column": "amount", "q": 0.9}],
     "group_by": [{"name": "region", "expression": "region"}],
     "where": "amount > 10", "keys": [["north"], ["south"]],
     "max_partitions": 1, "max_rows_per_partition": 1, "bounding": "rescale"}

``plan_from_json`` accepts exactly these keys and builds the same frozen ``Plan`` the builder
and the SQL front end build, so it validates itself; expressions and the WHERE clause are SQL
fragments that the curator checks as it checks those of DP SQL (the scalar subset only).
"""

from __future__ import annotations

from typing import Any

from dpcurator.query.errors import QueryError
from dpcurator.query.plan import (
    Aggregate,
    Bounds,
    Count,
    CountUnits,
    GroupKey,
    Mean,
    Plan,
    PublicKeys,
    Quantile,
    Sum,
    Variance,
)

__all__ = ["plan_from_json", "plan_to_json"]

_KINDS: dict[str, type[Any]] = {"count": Count, "count_units": CountUnits, "sum": Sum,
                                "mean": Mean, "variance": Variance, "quantile": Quantile}
_PLAN_KEYS = {"aggregates", "group_by", "where", "keys", "max_partitions",
              "max_rows_per_partition", "bounding", "intervals", "max_unit_rows",
              "max_unit_sums", "total_share", "tables"}
_MAX_ITEMS = 1000


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """The plan as plain JSON data (``plan_from_json`` gives it back)."""
    out: dict[str, Any] = {"aggregates": [_aggregate_to_json(a) for a in plan.aggregates]}
    if plan.group_by:
        out["group_by"] = [{"name": k.name, "expression": k.expression,
                            **({"labels": list(k.labels)} if k.labels is not None else {})}
                           for k in plan.group_by]
    if plan.source is not None:
        raise QueryError("a plan already resolved over joined tables is not sent as JSON; "
                         "send its SQL, or the builder's plan (with from_ and join)")
    for key in ("where", "max_partitions", "max_rows_per_partition", "bounding", "intervals",
                "max_unit_rows", "total_share", "tables"):
        if getattr(plan, key) is not None:
            out[key] = getattr(plan, key)
    if plan.keys is not None:
        out["keys"] = [list(row) for row in plan.keys.values]
    if plan.max_unit_sums:
        out["max_unit_sums"] = dict(plan.max_unit_sums)
    return out


def _aggregate_to_json(agg: Aggregate) -> dict[str, Any]:
    kind = next(k for k, cls in _KINDS.items() if type(agg) is cls)
    out: dict[str, Any] = {"kind": kind, "name": agg.name}
    if isinstance(agg, Sum | Mean | Variance | Quantile):
        out["column"] = agg.column
        if agg.bounds is not None:
            out["bounds"] = [agg.bounds.lo, agg.bounds.hi]
    if isinstance(agg, Variance) and agg.std:
        out["std"] = True
    if isinstance(agg, Quantile):
        out["q"] = agg.q
    return out


def plan_from_json(data: Any) -> Plan:
    """A ``Plan`` from JSON data, refusing anything but the documented shape (QueryError)."""
    if not isinstance(data, dict):
        raise QueryError("a plan must be a JSON object")
    unknown = sorted(set(data) - _PLAN_KEYS)
    if unknown:
        raise QueryError(f"a plan has unknown key(s) {unknown}; allowed: {sorted(_PLAN_KEYS)}")
    aggregates = _list(data.get("aggregates"), "aggregates")
    group_by = _list(data.get("group_by", []), "group_by")
    keys = data.get("keys")
    return Plan(
        aggregates=tuple(_aggregate_from_json(a) for a in aggregates),
        group_by=tuple(_group_key(k) for k in group_by),
        where=_optional_text(data.get("where"), "where"),
        keys=PublicKeys(tuple(_key_row(r) for r in _list(keys, "keys", 10_000_000)))
        if keys is not None else None,
        max_partitions=data.get("max_partitions"),
        max_rows_per_partition=data.get("max_rows_per_partition"),
        bounding=data.get("bounding"), intervals=data.get("intervals"),
        max_unit_rows=data.get("max_unit_rows"),
        max_unit_sums=_unit_sums(data.get("max_unit_sums", {})),
        total_share=data.get("total_share"),
        tables=_optional_text(data.get("tables"), "tables"))


def _unit_sums(value: Any) -> tuple[tuple[str, float], ...]:
    if not isinstance(value, dict):
        raise QueryError("max_unit_sums must be an object {column: number}")
    return tuple(value.items())


def _aggregate_from_json(data: Any) -> Aggregate:
    if not isinstance(data, dict) or data.get("kind") not in _KINDS:
        raise QueryError(f"each aggregate is an object with a kind in {sorted(_KINDS)}")
    kind = data["kind"]
    allowed = {"kind", "name"} | ({"column", "bounds"} if kind not in ("count", "count_units")
                                  else set())
    allowed |= {"std"} if kind == "variance" else {"q"} if kind == "quantile" else set()
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise QueryError(f"a {kind} aggregate has unknown key(s) {unknown}")
    options: dict[str, Any] = {k: v for k, v in data.items() if k != "kind"}
    if "bounds" in options:
        bounds = options["bounds"]
        if not isinstance(bounds, list) or len(bounds) != 2:
            raise QueryError("bounds must be [low, high]")
        options["bounds"] = Bounds.of(tuple(bounds), str(options.get("column")))
    if "std" in options and not isinstance(options["std"], bool):
        raise QueryError("std must be true or false")
    try:
        return _KINDS[kind](**options)  # type: ignore[no-any-return]
    except TypeError:
        raise QueryError(f"a {kind} aggregate needs a column") from None


def _group_key(data: Any) -> GroupKey:
    if not isinstance(data, dict) or not set(data) <= {"name", "expression", "labels"}:
        raise QueryError("each group key is {\"name\", \"expression\"[, \"labels\"]}")
    labels = data.get("labels")
    return GroupKey(str(data.get("name", "")), str(data.get("expression", "")),
                    tuple(_list(labels, "labels")) if labels is not None else None)


def _key_row(row: Any) -> tuple[Any, ...]:
    values = row if isinstance(row, list) else [row]
    for value in values:
        if value is not None and not isinstance(value, str | int | float | bool):
            raise QueryError("keys hold plain values (text, numbers, booleans, null)")
    return tuple(values)


def _list(value: Any, name: str, limit: int = _MAX_ITEMS) -> list[Any]:
    if not isinstance(value, list):
        raise QueryError(f"{name} must be a JSON list")
    if len(value) > limit:
        raise QueryError(f"{name} may hold at most {limit} items")
    return value


def _optional_text(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 10_000:
        raise QueryError(f"{name} must be a SQL text of at most 10,000 characters")
    return value
