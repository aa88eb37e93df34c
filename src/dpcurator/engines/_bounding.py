"""Stages 2 and 3 and the aggregate statement: each (unit, partition) pair's contribution
after the row cap (``pairs``), each unit's number of partitions (``units``), the contributions
after the partition cap (``bounded``, or ``per_row_bounded`` where the kept rows are the
contributions), and the statement summing them exactly per partition (``statement``)."""

from __future__ import annotations

from sqlglot import exp

from dpcurator.engines._context import Context, hashed, indexed, partition_order
from dpcurator.engines._rows import rows
from dpcurator.engines._trees import (
    alias,
    case,
    cast,
    col,
    div,
    least,
    mul,
    num,
    paren,
    select,
    star,
    window,
    with_ctes,
)
from dpcurator.errors import InternalError
from dpcurator.query.bounding import OUTER_KINDS, MeasureSpec

__all__ = ["bounded", "pairs", "per_row_bounded", "statement", "units"]


def _count_of(ctx: Context, column: str) -> exp.Expr:
    for spec in ctx.values:
        if spec.column == column:
            return exp.Count(this=col(ctx.v(spec)))
    return exp.Count(this=col(ctx.x(column)))


def _per_pair(ctx: Context, measure: MeasureSpec) -> exp.Expr:
    """The unit's contribution in one partition after the row cap, as a BIGINT aggregate
    expression over the pair's rows (every measure but ``units``, which is constant).

    Computing it inside the pair aggregation keeps the pairs table narrow (BIGINTs only:
    the raw per-pair sum, exact over any number of rows, never leaves it)."""
    r = ctx.q.rows_cap
    weight = num(measure.weight)
    if measure.kind == "rows":
        return mul(least(exp.Count(this=exp.Star()), num(r)), weight)
    if measure.kind == "unit_rows":
        # n rows weighted by min(1, M / T), T the unit's rows in all its pairs: n M // T
        # truncated, exact in BIGINT (n M < 2^63), so its pairs sum to at most M
        n, outer = exp.Count(this=exp.Star()), num(measure.outer)
        rows = cast(window(exp.Sum(this=exp.Count(this=exp.Star())), [col("__u")]),
                    "BIGINT")
        capped = cast(exp.IntDiv(this=paren(mul(n.copy(), outer)), expression=rows.copy()),
                      "BIGINT")
        return mul(case((exp.LTE(this=rows, expression=outer.copy()), n), default=capped),
                   weight)
    assert measure.value is not None
    if measure.kind == "present":
        return mul(least(_count_of(ctx, measure.value.column), num(r)), weight)
    small, total = ctx.d.pair_sum(col(ctx.v(measure.value)))
    kept = exp.Coalesce(this=small, expressions=[num(0)])
    if ctx.sample:  # at most r rows were kept: |sum| <= r M < 2^52
        return kept
    c = _count_of(ctx, measure.value.column)
    # rescale rows: s * min(c, r) / c, truncated toward zero; |s| <= c M when c <= r.
    scaled = cast(exp.IntDiv(this=paren(mul(total, num(r))), expression=c.copy()),
                  "BIGINT")
    return case((exp.LTE(this=c, expression=num(r)), kept), default=scaled)


def _unit_values(ctx: Context, index: int) -> exp.Expr:
    """The pair's exact sum P (``__a``) of fixed-point values divided by 2^j, truncated
    toward zero, 2^j the smallest power of two with A <= V 2^j, A the unit's exact sum of
    |value| over its pairs (``__s``; ``bounding``: the unit's parts then sum to at most
    V). j runs while V 2^j stays below 2^120, every engine's exact integers (a unit
    beyond contributes 0: NULL)."""
    measure = ctx.q.measures[index]
    pair, unit = col(f"__a{index}"), col(f"__s{index}")
    whens: list[tuple[exp.Expr, exp.Expr]] = []
    j = 0
    while measure.outer * 2**j < 2**120:
        whens.append((exp.LTE(this=unit.copy(), expression=num(measure.outer * 2**j)),
                      num(2**j)))
        j += 1
    divisor = case(*whens[1:])
    down = cast(exp.IntDiv(this=paren(pair.copy()), expression=divisor.copy()), "BIGINT")
    up = exp.Neg(this=cast(exp.IntDiv(this=exp.Neg(this=paren(pair.copy())),
                                      expression=divisor), "BIGINT"))
    # most units are within V (2^0): their pairs' sums as they are, no division (11% off a
    # SUM's statement on TPC-H at scale 1, DuckDB)
    return case((whens[0][0], cast(pair.copy(), "BIGINT")),
                (exp.GTE(this=pair, expression=num(0)), down), default=up)


def _amount(ctx: Context, index: int) -> exp.Expr:
    """Measure ``index``'s per-pair amount, as a column of ``pairs`` (or a constant)."""
    measure = ctx.q.measures[index]
    return num(measure.weight) if measure.kind == "units" else col(f"__a{index}")


#: Rank (hash and sort) only the pairs of units in more than k partitions where each unit's
#: number of partitions is known beside its pairs (``bounded``); a switch for the tests,
#: which check that it changes no result.
RANK_ONLY_SPREAD_UNITS = True


def pairs(ctx: Context, source: str) -> exp.Select:
    q, r = ctx.q, ctx.q.rows_cap
    items: list[exp.Expr] = [col("__u"), *ctx.keys()]
    joined = _totals_joined(ctx)
    for j, m in enumerate(q.measures):
        if m.kind == "unit_values":  # divided in the next stage (``_unit_values``)
            assert m.value is not None
            value = col(ctx.v(m.value))
            _, pair = ctx.d.pair_sum(value)
            _, absolute = ctx.d.pair_sum(exp.Abs(this=value.copy()))
            items += [alias(pair, f"__a{j}"),
                      alias(absolute, f"__b{j}") if joined else
                      alias(window(exp.Sum(this=absolute), [col("__u")]), f"__s{j}")]
        elif m.kind == "unit_rows" and joined:  # capped in the next stage (``_contribution``)
            items.append(alias(exp.Count(this=exp.Star()), f"__a{j}"))
        elif m.kind != "units":
            items.append(alias(_per_pair(ctx, m), f"__a{j}"))
    if q.partitions_mode == "rescale" and ctx.d.partitions_by_window:
        items.append(alias(window(exp.Count(this=exp.Star()), [col("__u")]), "__m"))
    note = f" over at most {r} sampled rows" if ctx.sample else \
        f" (rows weighted by min(1, {r}/n))"
    return select(items, source, group=[col("__u"), *ctx.keys()],
                  comment=f"one row per (unit, partition): its contribution to each "
                  f"measure{note}")


def _totals_joined(ctx: Context) -> bool:
    """Whether the units' totals of the outer-capped measures (T, A) come from a grouped
    ``totals`` joined back to the pairs (``totals``) rather than windows over the pairs:
    where the dialect joins the rescaled partitions' counts too (DuckDB: the join measured
    10% faster than the window on a TPC-H SUM at scale 1)."""
    return not ctx.d.partitions_by_window and any(m.kind in OUTER_KINDS
                                                  for m in ctx.q.measures)


def totals(ctx: Context) -> tuple[exp.Select, exp.Select]:
    """Each unit's totals over its pairs (``grouped``, the pairs before them): its number of
    partitions (``__np``), T, its rows (``__t{j}``, for ``unit_rows``), and A, its sum of
    |value| (``__s{j}``, for ``unit_values``); and the pairs with their unit's totals beside
    them."""
    items: list[exp.Expr] = [col("__u"), alias(exp.Count(this=exp.Star()), "__np")]
    for j, m in enumerate(ctx.q.measures):
        if m.kind == "unit_rows":
            items.append(alias(cast(exp.Sum(this=col(f"__a{j}")), "BIGINT"), f"__t{j}"))
        elif m.kind == "unit_values":
            items.append(alias(exp.Sum(this=col(f"__b{j}")), f"__s{j}"))
    per_unit = select(items, "grouped", group=[col("__u")],
                      comment="one row per unit: its totals over all its pairs")
    joined = exp.Select(expressions=[star()]).from_(exp.table_("grouped"), copy=False)
    joined.set("joins", [exp.Join(this=exp.table_("totals"),
                                  using=[exp.to_identifier("__u")])])
    return per_unit, joined


def units(ctx: Context) -> exp.Select:
    """Rescaled partitions: each unit's number of partitions, joined back to the pairs
    (a window count over the pairs measured about 30% slower on DuckDB)."""
    return select([col("__u"), alias(exp.Count(this=exp.Star()), "__m")], "pairs",
                  group=[col("__u")], comment="one row per unit: how many partitions it has")


def _contribution(ctx: Context, index: int) -> exp.Expr:
    measure = ctx.q.measures[index]
    if measure.kind == "unit_values":
        return _unit_values(ctx, index)
    if measure.kind == "unit_rows" and _totals_joined(ctx):
        # the pair's n rows weighted by min(1, M / T), as ``_per_pair`` computes it by a
        # window: n M // T truncated, exact in BIGINT
        n, total, outer = col(f"__a{index}"), col(f"__t{index}"), num(measure.outer)
        capped = cast(exp.IntDiv(this=paren(mul(n.copy(), outer)), expression=total.copy()),
                      "BIGINT")
        return mul(case((exp.LTE(this=total, expression=outer.copy()), n), default=capped),
                   num(measure.weight))
    amount = _amount(ctx, index)
    if ctx.q.partitions_mode != "rescale" or ctx.q.measures[index].kind in OUTER_KINDS:
        return amount  # an outer cap's weights already bound the unit's whole contribution
    k = ctx.q.partitions_cap
    # trunc(amount * k / m) toward zero, in DOUBLE: exact because |amount * k| is at
    # most the L1 sensitivity, below 2^52 (``Context.of`` checks it), so the product and m
    # are exact doubles and the one rounding of the division moves the quotient by less
    # than 1/m, never across an integer (an integer quotient is exact). Cheaper than
    # BIGINT division (tests/test_engine_duckdb.py checks it at the limit).
    quotient = div(cast(mul(amount.copy(), num(k)), "DOUBLE"), col("__m"))
    return case((exp.LTE(this=col("__m"), expression=num(k)), amount),
                default=cast(exp.Trunc(this=quotient), "BIGINT"))


def bounded(ctx: Context) -> exp.Query:
    q = ctx.q
    k = q.partitions_cap
    items: list[exp.Expr] = ctx.keys()
    items += [alias(_contribution(ctx, j), f"__m{j}") for j in range(len(q.measures))]
    if not items:
        items.append(alias(num(1), "__one"))
    comment = "one row per kept (unit, partition): its bounded contribution to each measure"
    if q.partitions_mode == "none":
        return select(items, "pairs", comment=comment)
    if q.partitions_mode == "rescale" and ctx.d.partitions_by_window:
        return select(items, "pairs", comment=comment)
    if q.partitions_mode == "rescale":
        joined = exp.Select(expressions=items).from_(exp.table_("pairs"), copy=False)
        joined.set("joins", [exp.Join(this=exp.table_("units"),
                                      using=[exp.to_identifier("__u")])])
        joined.add_comments([f" {comment} "])
        return joined
    # the unit's first k partitions in the keyed order: a window over the pairs, about
    # 20% faster on DuckDB than a per-unit top-(k+1) and a join
    few: exp.Expr | None = None
    source: exp.Expr | str = "pairs"
    if _totals_joined(ctx) and RANK_ONLY_SPREAD_UNITS:
        # each unit's number of partitions is beside its pairs (``totals``), and the pairs
        # of a unit in at most k partitions are all among its first k: only the others are
        # hashed and ranked (TPC-H at scale 1, customers' line items by ship mode with k =
        # 7, ``bounding="unit"``: no pair is ranked, 0.51 s -> 0.33 s a release)
        few = exp.LTE(this=col("__np"), expression=num(k))
        source = select([star()], "pairs", where=exp.Not(this=paren(few.copy())))
    ranked = select([star(), alias(window(exp.RowNumber(), [col("__u")],
                                          partition_order(ctx)), "__pr")],
                    hashed(ctx, source))
    first_k = exp.LTE(this=col("__pr"), expression=num(k))
    if q.partitions_mode == "select":  # every pair measured; the first k counted for the
        comment += f" (every pair; the selection counts the unit in its first {k})"
        out = select([*items, alias(case((first_k, num(1)), default=num(0)), "__sel")],
                     ranked, comment=comment)
        kept = [*(i.copy() for i in items), alias(num(1), "__sel")]
    else:
        out = select(items, ranked, where=first_k, comment=comment)
        kept = [i.copy() for i in items]
    if few is None:
        return out
    return exp.Union(this=select(kept, "pairs", where=few), expression=out, distinct=False)


def per_row_bounded(ctx: Context, source: str, comment: str) -> exp.Select:
    """Row-level privacy (each row its own unit), or sampled rows under a hard (or no)
    partition cap: the kept rows are the bounded contributions themselves; a unit counts
    once per kept partition (its row of rank 1)."""
    items: list[exp.Expr] = ctx.keys()
    for j, m in enumerate(ctx.q.measures):
        value: exp.Expr
        if m.kind == "rows":
            value = num(m.weight)
        elif m.kind == "units":
            if ctx.q.unit is None:
                raise InternalError("COUNT(DISTINCT unit) needs a privacy unit; a bug")
            value = case((exp.EQ(this=col("__rr"), expression=num(1)), num(m.weight)),
                         default=num(0))
        elif m.kind == "present":
            assert m.value is not None
            value = case((exp.Is(this=_first_value(ctx, m.value.column),
                                 expression=exp.Null()), num(0)), default=num(m.weight))
        else:
            assert m.value is not None
            value = exp.Coalesce(this=col(ctx.v(m.value)), expressions=[num(0)])
        items.append(alias(value, f"__m{j}"))
    items += [col(f"__b{i}") for i in range(len(ctx.q.histograms))]
    if ctx.q.unit is not None:
        items.append(col("__rr"))
    if not items:
        items.append(alias(num(1), "__one"))
    return select(items, source, comment=comment)


def _first_value(ctx: Context, column: str) -> exp.Expr:
    for spec in ctx.values:
        if spec.column == column:
            return col(ctx.v(spec))
    return col(ctx.x(column))


def statement(ctx: Context) -> exp.Query:
    """The statement of an aggregate query: rows, (pairs, with the units' totals of the
    outer-capped measures joined back where the dialect joins (``totals``), units,) bounded,
    then one row per partition of exact sums (and, tagged by ``__part``, the histograms'
    bounded counts)."""
    q = ctx.q
    ctes, source = rows(ctx)
    per_row = q.unit is None or (ctx.sample and q.partitions_mode != "rescale")
    if q.unit is None:
        ctes.append(("bounded", per_row_bounded(
            ctx, source, "one row per row (each row is its own unit)")))
    elif per_row:
        ctes.append(("bounded", per_row_bounded(
            ctx, source, "one row per kept row: its contribution to each measure")))
    else:
        if ctx.d.sort_pairs_input and not ctx.sample:
            name, last = ctes[-1]
            ordered = last.order_by(col("__u"), *ctx.keys(), copy=True)
            if ordered.args.get("offset") is None:
                ordered = ordered.offset(0, copy=False)
            ctes[-1] = (name, ordered)
        if _totals_joined(ctx):  # the units' totals joined back (``totals``)
            per_unit, joined = totals(ctx)
            ctes += [("grouped", pairs(ctx, source)), ("totals", per_unit), ("pairs", joined)]
        else:
            ctes.append(("pairs", pairs(ctx, source)))
        if q.partitions_mode == "rescale" and not ctx.d.partitions_by_window:
            ctes.append(("units", units(ctx)))
        ctes.append(("bounded", bounded(ctx)))
    keyed = ctx.keys_table is not None
    sums: list[exp.Expr] = [alias(ctx.d.exact_sum(col(f"__m{j}")), f"__m{j}")
                                  for j in range(len(q.measures))]
    if q.selection_units:
        # one row per kept pair, or (per kept row) the pair's row of rank 1; without a
        # unit column each row is its own unit
        counted: exp.Expr = exp.Count(this=exp.Star())
        if per_row and q.unit is not None:
            counted = exp.Filter(this=counted, expression=exp.Where(
                this=exp.EQ(this=col("__rr"), expression=num(1))))
        elif q.partitions_mode == "select":  # the unit's first k pairs only
            counted = exp.Filter(this=counted, expression=exp.Where(
                this=exp.EQ(this=col("__sel"), expression=num(1))))
        sums.append(alias(counted, "__units"))
    if not sums and not ctx.k:
        sums.append(alias(exp.Count(this=exp.Star()), "__pairs"))  # never an empty list
    names = [s.alias for s in sums]
    main = select([*ctx.keys(), *sums], "bounded", group=ctx.keys(),
                  comment="one row per partition: exact integer sums of bounded "
                  "contributions")
    if not q.histograms:
        body: exp.Query = main
        if keyed:
            body = indexed(ctx, body, names)
        return with_ctes(ctes, body)
    # Histograms share the bounded rows with the sums: one statement, so the bounding
    # pipeline runs once. Each row is tagged with __part: 0 for the sums, 1 + i for
    # histogram i.
    null = exp.Null()
    first = select([alias(num(0), "__part"), *ctx.keys(), *sums,
                    alias(cast(null, "BIGINT"), "__bin"),
                    alias(cast(null.copy(), "BIGINT"), "__count")], "bounded",
                   group=ctx.keys(), comment="one row per partition: exact integer "
                   "sums of bounded contributions")
    branches: list[exp.Query] = [first]
    for i in range(len(q.histograms)):
        # histograms need sampled rows, so ``bounded`` has one row per kept row
        binned = select([*ctx.keys(), alias(col(f"__b{i}"), "__bin")], "bounded",
                        where=exp.Not(this=exp.Is(this=col(f"__b{i}"),
                                                  expression=exp.Null())))
        branches.append(select(
            [alias(num(i + 1), "__part"), *ctx.keys(),
             *(alias(cast(exp.Null(), "BIGINT"), name) for name in names),
             col("__bin"), alias(exp.Count(this=exp.Star()), "__count")],
            binned, group=[*ctx.keys(), col("__bin")],
            comment=f"one row per (partition, bin) of histogram {i}: bounded row counts"))
    union: exp.Query = branches[0]
    for branch in branches[1:]:
        union = exp.Union(this=union, expression=branch, distinct=False)
    columns = ["__part", *names, "__bin", "__count"]
    if keyed:
        return with_ctes(ctes, indexed(ctx, union, columns))
    # the key columns first, as in the statement without histograms
    return with_ctes(ctes, select([*ctx.keys(), *(col(c) for c in columns)], union))
