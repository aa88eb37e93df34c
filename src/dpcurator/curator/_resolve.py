"""The first pass: a plan resolved against the table and the curator's defaults.

``resolve_plan`` fills what the query leaves open (bounds, contribution caps, the bounding
mode, what the intervals cover), checks every column against the schema, and says which bounds
will be chosen from the data (``Plan.auto``, compiled with placeholders until then); Plan ->
Plan, nothing is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dpcurator.query import expressions as ex
from dpcurator.query.errors import (
    BoundsError,
    QueryError,
    UnknownColumnError,
)
from dpcurator.query.plan import (
    DEFAULT_AUTO_SHARE,
    Aggregate,
    AutoBounds,
    Bounds,
    Count,
    CountUnits,
    GroupKey,
    Plan,
    PublicKeys,
    Quantile,
    Sum,
    Variance,
)
from dpcurator.query.schema import folded

from . import _total

__all__ = ["Defaults", "match_column", "resolve_plan"]


@dataclass(frozen=True)
class Defaults:
    """The curator's defaults for what a plan leaves open."""

    bounds: Mapping[str, Bounds] = field(default_factory=dict)
    max_partitions: int | None = None  # None: not given (1, unless chosen automatically)
    max_rows_per_partition: int | None = None
    bounding: str | None = None  # None: per query (``default_bounding``)
    auto: AutoBounds | None = None
    intervals: str | None = None  # None: "bounded"; "total" on request
    total_share: float | None = None  # None: _total.SHARE


# The bounds an automatically bounded column is compiled with before its bounds are chosen:
# what the query costs does not depend on them (``_auto_bounds``).
_AUTO_PLACEHOLDER = Bounds(0.0, 1.0)


def match_column(name: str, columns: Mapping[str, str], what: str) -> str:
    found = folded(name, columns)
    if found is not None:
        return found
    raise UnknownColumnError(f"{what} names the column {name!r}, which the table does not "
                             f"have; its columns are {list(columns)}")


def _resolve_expression(text: str, columns: Mapping[str, str], what: str) -> ex.Sql:
    """The expression with each column named as the table names it (its tree, not reparsed)."""
    from sqlglot import exp

    def fix(sub: exp.Expr) -> exp.Expr:
        if isinstance(sub, exp.Column):
            return exp.column(match_column(sub.name, columns, what))
        return sub

    return ex.Sql(ex.tree_of(text).transform(fix, copy=False))


def resolve_plan(plan: Plan, columns: Mapping[str, str], defaults: Defaults,
                 privacy_unit: str | None) -> Plan:
    """Fill defaults and check the plan against the schema (column names and types)."""
    from dpcurator.engines import column_kind, integer_valued

    wanted = plan.auto.merged(defaults.auto) if plan.auto is not None else defaults.auto
    bounding = default_bounding(plan, defaults, privacy_unit, wanted)
    unit_mode = bounding == "unit"
    if unit_mode:
        if privacy_unit is None:
            raise QueryError("bounding='unit' caps what each privacy unit contributes in all; "
                             "this curator treats each row as its own unit (give "
                             "privacy_unit=...), or ask with bounding='rescale'")
        plan = plan.replace(bounding="unit")  # checks the aggregates and the intervals
    given_sums: dict[str, float] = {}
    for c, v in plan.max_unit_sums:  # each summed column once, by any spelling
        column = match_column(c, columns, "max_unit_sums")
        if column in given_sums:
            raise QueryError(f"max_unit_sums names column {column!r} twice; give it once")
        given_sums[column] = v
    unsummed = set(given_sums) - {match_column(a.column, columns, f"aggregate {a.name!r}")
                                  for a in plan.aggregates if type(a) is Sum} \
        if given_sums else set()
    if unsummed:  # accepted and ignored before (a bug hunt)
        raise QueryError(f"max_unit_sums names {', '.join(sorted(unsummed))}, which the query "
                         "does not sum; max_unit_sums caps each unit's sum of |value| of a "
                         "column in a SUM")
    auto_columns: list[str] = []
    aggregates: list[Aggregate] = []
    for agg in plan.aggregates:
        if isinstance(agg, CountUnits) and privacy_unit is None:
            raise QueryError("COUNT(DISTINCT unit) needs a privacy unit; this curator treats "
                             "each row as its own unit")
        if isinstance(agg, Count | CountUnits):
            aggregates.append(agg)
            continue
        column = match_column(agg.column, columns, f"aggregate {agg.name!r}")
        if column_kind(columns[column]) not in ("numeric", "boolean"):
            raise QueryError(f"aggregate {agg.name!r} needs a numeric column, but {column!r} "
                             f"has type {columns[column]}")
        if unit_mode:  # each value clamped to [-V, V]: the unit's sum of |value| is capped
            cap = given_sums.get(column)
            # a release's own plan replays: its clamp is [-V, V] for the cap V it states
            if agg.bounds is not None and (cap is None or agg.bounds != Bounds(-cap, cap)):
                raise QueryError(f"under bounding='unit' SUM({column}) is bounded by the cap "
                                 f"on each unit's sum of |{column}| (max_unit_sums={{"
                                 f"'{column}': V}}, or leave it to be chosen from the data), "
                                 "not by clamping bounds: drop bounds for it")
            aggregates.append(type(agg)(column, _AUTO_PLACEHOLDER if cap is None else
                                        Bounds(-cap, cap), agg.name))
            continue
        bounds = agg.bounds
        if bounds is None and plan.auto is not None and plan.auto.columns and \
                plan.auto.wants_column(column):
            bounds = _AUTO_PLACEHOLDER  # asked by the query itself: before the curator's
        bounds = bounds or defaults.bounds.get(column)
        if bounds is None and wanted is not None and wanted.wants_column(column):
            bounds = _AUTO_PLACEHOLDER
        if bounds is None:
            raise BoundsError(
                f"{type(agg).__name__.upper()} over {column!r} needs clamping bounds: pass "
                f"bounds={{'{column}': (lo, hi)}} with values chosen without looking at the "
                "data (the noise is calibrated to them), or bounds='auto' to have them "
                "chosen from the data under DP with a share of the query's budget")
        if bounds is _AUTO_PLACEHOLDER and column not in auto_columns:
            auto_columns.append(column)
        if isinstance(agg, Quantile):  # integer-valued by the column's (public) type
            aggregates.append(Quantile(column, bounds, agg.name, q=agg.q,
                                       integer=integer_valued(columns[column])))
        elif isinstance(agg, Variance):
            aggregates.append(Variance(column, bounds, agg.name, std=agg.std))
        else:
            aggregates.append(type(agg)(column, bounds, agg.name))
    group = tuple(GroupKey(k.name, _resolve_expression(k.expression, columns,
                                                        f"group key {k.name!r}"), k.labels)
                  for k in plan.group_by)
    where = (_resolve_expression(plan.where, columns, "WHERE")
             if plan.where is not None else None)
    keys = plan.keys if plan.keys is not None else _labels_as_keys(plan)
    caps: list[int] = []
    chosen: list[bool] = []
    for name in ("max_partitions", "max_rows_per_partition"):
        value = getattr(plan, name)
        if value is None and not (plan.auto is not None and getattr(plan.auto, name)):
            value = getattr(defaults, name)
        if value is None and wanted is not None and (wanted.open or getattr(wanted, name)):
            caps.append(1)  # a placeholder: chosen when the query runs
            chosen.append(True)
        else:
            caps.append(1 if value is None else value)
            chosen.append(False)
    unit = privacy_unit is not None
    # a cap is chosen only where it binds: k with several partitions, r where rows count
    # (under bounding="unit", k only where it caps a private selection, and never r)
    choose_k = chosen[0] and unit and bool(group) and (keys is None or len(keys) > 1) and \
        (keys is None or not unit_mode)
    choose_r = chosen[1] and unit and any(not isinstance(a, CountUnits) for a in aggregates) \
        and not unit_mode
    auto = None
    share = wanted.spent_share if wanted is not None else DEFAULT_AUTO_SHARE
    if choose_k or choose_r or auto_columns:
        auto = AutoBounds(choose_k, choose_r, tuple(auto_columns), share=share)
    resolved = plan.replace(
        aggregates=tuple(aggregates), group_by=group, where=where, keys=keys,
        max_partitions=caps[0], max_rows_per_partition=caps[1],
        bounding=bounding, auto=auto,
    )
    if unit_mode:  # the caps on each unit's total, given or chosen from the data
        resolved = _unit_caps(resolved, given_sums, share)
        return resolved.replace(intervals="bounded", total_share=None,
                                max_unit_rows=resolved.max_unit_rows
                                if any(type(a) is Count for a in aggregates) else None)
    # what the intervals of COUNT(*) and SUM cover (``_total``): a measured total needs outer
    # caps, given or chosen
    total_share = resolved.total_share or defaults.total_share or _total.SHARE
    # asking for a total's share asks for the totals
    shared = resolved.total_share is not None or defaults.total_share is not None
    kind, measured = _total.resolve(resolved, privacy_unit,
                                    defaults.intervals or ("total" if shared else None))
    if measured:
        return _unit_caps(resolved, given_sums, share).replace(intervals=kind,
                                                               total_share=total_share)
    return resolved.replace(intervals=kind, auto=auto, max_unit_rows=None, max_unit_sums=(),
                            total_share=None)


def default_bounding(plan: Plan, defaults: Defaults, privacy_unit: str | None,
                     wanted: AutoBounds | None) -> str:
    """The query's bounding mode: the one it asks for, else the curator's, else chosen here
    from the plan alone (public: what the query asks and gives, never the data).

    ``"unit"`` (caps on each unit's total, chosen from the data) where the query leaves
    every bound to the data and ``"unit"`` can answer it: a privacy unit; only COUNT(*) and
    SUM; no clamping bounds for a summed column (the query's or the curator's); no cap per
    group given (``max_partitions``, ``max_rows_per_partition``) nor asked for by name
    (``"auto"``; caps on each unit's total, ``max_unit_rows`` and ``max_unit_sums``, given
    alone ask for this mode); no interval kind or total share asked for; and public keys, no
    GROUP BY, or private keys over a join of several tables. Else ``"rescale"``.

    Why (issue 26; ``benchmarks/auto_bounds_unit.py``, the family of 56 generated shapes,
    against the best fixed bounds in hindsight): the unit mode's two one-dimensional choices
    beat the per-partition joint choice on nearly every shape, SUM's RMSE a median of 0.15x
    the per-partition default's and COUNT's 0.37x. With private keys a COUNT(*) selects the
    keys by its own noisy count in both modes (``_auto_plan.count_selects``), and a SUM
    alone by a separate step in both. Over a join, where a unit's rows multiply through its
    paths and spread over the partitions, the unit mode is the default with private keys
    too (TPC-H at scale 0.1, ``benchmarks/joins_expected.py``, median relative error per
    partition against the unit mode: count by market segment 0.0020 -> 0.0012, by ship mode
    0.0048 -> 0.0016, revenue by ship mode 0.012 -> 0.0035; Tumult's best truncation in
    hindsight 0.0016, 0.0021 and 0.0058). On one table it is not: UCI Adult's COUNT by
    education with private keys (one row per person) is 1.27x the best fixed bounds under it
    against 1.12x per partition, whose row cap of 1 costs nothing there. Thin data: both
    modes choose again with half the budget (``_auto_plan.plan_retry``)."""
    if plan.bounding is not None:
        return plan.bounding
    if defaults.bounding is not None:
        return defaults.bounding
    if privacy_unit is None or wanted is None or not wanted.open:
        return "rescale"
    if not plan.aggregates or any(type(a) not in (Count, Sum) for a in plan.aggregates):
        return "rescale"
    if plan.private_keys and not (plan.source is not None and len(plan.source.tables) > 1):
        return "rescale"
    if any(a.bounds is not None or folded(a.column, defaults.bounds) is not None
           for a in plan.aggregates if isinstance(a, Sum)):
        return "rescale"
    if wanted.max_partitions or wanted.max_rows_per_partition or wanted.columns:
        return "rescale"  # a per-group cap or a clamp asked for by name ("auto")
    # caps on each unit's total given alone ask for them (a bug hunt: the unit mode's own
    # warning said "give max_unit_rows and max_unit_sums", and giving them switched to the
    # caps per group and dropped them); beside total intervals they are those' outer caps
    given = (plan.max_partitions, plan.max_rows_per_partition, defaults.max_partitions,
             defaults.max_rows_per_partition, plan.intervals, defaults.intervals,
             plan.total_share, defaults.total_share)
    if any(v is not None for v in given):
        return "rescale"
    return "unit"


def _labels_as_keys(plan: Plan) -> PublicKeys | None:
    """The keys implied by binned group keys (``Plan.public_labels``), each key's labels of
    one type: a CASE whose THEN and ELSE values mix text and numbers has no type its
    partitions could be named in (the keys' own check said "mixed types in a column of
    keys", though no keys were given; a bug hunt)."""
    labels = plan.public_labels
    if labels is None:
        return None
    for key in plan.group_by:
        kinds = {"text" if isinstance(v, str) else "a boolean" if isinstance(v, bool)
                 else "a number" for v in key.labels or () if v is not None}
        if len(kinds) > 1:
            raise QueryError(
                f"group key {key.name!r}: its CASE's THEN and ELSE values are of different "
                f"types ({' and '.join(sorted(kinds))}), so its partitions have no one type; "
                "give them one type (quote them all, or none)")
    return labels


def _unit_caps(plan: Plan, given: Mapping[str, float], share: float) -> Plan:
    """The plan with the caps on each unit's total (a total interval's outer caps, or
    ``bounding="unit"``'s) it gives, and the rest to be chosen from the data: the rows where
    it has a COUNT(*), each SUM's column not in ``given``."""
    plan = plan.replace(max_unit_sums=tuple(given.items()))
    chosen = AutoBounds(
        unit_rows=plan.max_unit_rows is None and
        any(type(a) is Count for a in plan.aggregates),
        unit_sums=tuple(c for c in _total.sum_columns(plan) if c not in given),
        share=share)
    if chosen.unit_rows or chosen.unit_sums:
        return plan.replace(auto=chosen.merged(plan.auto))
    return plan
