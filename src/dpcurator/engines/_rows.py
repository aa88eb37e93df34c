"""Stage 1: the rows. One row per input row that passes the filter (unit, group keys,
clamped fixed-point values, cleaned doubles), restricted to the public keys, binned for the
histograms and, under sampled bounding, the kept rows chosen by the keyed hash."""

from __future__ import annotations

from sqlglot import exp

from dpcurator.engines._context import RELATION, Context, hashed, key_match, partition_order
from dpcurator.engines._keyed_hash import HashInput
from dpcurator.engines._trees import (
    add,
    alias,
    case,
    cast,
    col,
    greatest,
    least,
    mul,
    num,
    paren,
    select,
    star,
    sub,
    user_col,
    window,
)
from dpcurator.errors import InternalError
from dpcurator.query.bounding import ValueSpec

__all__ = ["rows"]


def _converted(ctx: Context) -> list[tuple[str, exp.Expr]]:
    """Where the dialect fences (``fence_rows``), each read column whose DOUBLE takes a
    conversion, with that conversion: computed once a row, in a stage of its own, instead of
    at each of the five places the clamp names it (PostgreSQL's NUMERIC to DOUBLE, a CASE
    of NUMERIC tests, measured at 40% of a TPC-H join's time)."""
    if not ctx.d.fence_rows:
        return []
    out = []
    for column in ctx.columns:
        node = user_col(column)
        double = ctx.d.to_double(node, ctx.types.get(column, ""))
        if not isinstance(double, exp.Column):
            out.append((column, double))
    return out


def _double_name(ctx: Context, column: str) -> str:
    return f"__r{ctx.columns.index(column)}"


def _raw(ctx: Context, column: str) -> tuple[exp.Expr, exp.Expr]:
    """(the column as a DOUBLE, the test for a missing value: NULL or NaN)."""
    node = user_col(column)
    sql_type = ctx.types.get(column, "")
    kind = ctx.d.value_kind(sql_type)
    raw = (col(_double_name(ctx, column)) if column in dict(_converted(ctx))
           else ctx.d.to_double(node, sql_type))
    if kind == "exact":
        return raw, exp.Is(this=node.copy(), expression=exp.Null())
    return raw, paren(exp.or_(exp.Is(this=raw.copy(), expression=exp.Null()),
                              ctx.d.is_nan(raw.copy()), copy=False))


def _clamped(ctx: Context, column: str, lo: float, hi: float,
             snap: tuple[float, float] | None = None) -> exp.Expr:
    """The column as a DOUBLE clamped to [lo, hi]; NULL where the value is missing.

    A CASE whose first branch takes the in-range values: no test for a missing value on
    most rows (a NULL fails every comparison and falls through to NULL; NaN, which the
    engines order above +inf, is caught before the upper clamp). LEAST/GREATEST skip
    NULLs, so they needed a second CASE around them for the missing values; this measured
    about 10% faster on benchmarks/query.py. ``snap`` (for engines whose double products
    raise on underflow) maps values closer than it to its centre onto the centre, which
    changes no rounded result."""
    raw, _ = _raw(ctx, column)
    low, high = ctx.d.double(lo), ctx.d.double(hi)
    above: exp.Expr = exp.GT(this=raw.copy(), expression=high)
    if ctx.d.value_kind(ctx.types.get(column, "")) != "exact":
        above = exp.and_(above, exp.Not(this=ctx.d.is_nan(raw.copy())), copy=False)
    whens: list[tuple[exp.Expr, exp.Expr]] = []
    if snap is not None:
        centre, width = snap
        whens.append((exp.LT(this=exp.Abs(this=sub(raw.copy(), ctx.d.double(centre))),
                             expression=ctx.d.double(width)), ctx.d.double(centre)))
    whens += [
        (exp.and_(exp.GTE(this=raw.copy(), expression=low.copy()),
                  exp.LTE(this=raw.copy(), expression=high.copy()), copy=False), raw.copy()),
        (exp.LT(this=raw.copy(), expression=low.copy()), low.copy()),
        (above, high.copy()),
    ]
    return case(*whens)


def _value(ctx: Context, spec: ValueSpec) -> exp.Expr:
    snap: tuple[float, float] | None = None
    if ctx.d.guards_underflow and (spec.square or spec.scale < 1.0):
        # A product underflows only below its smaller factor: c * c, or c * scale when
        # scale < 1. |c| < t keeps |f(c) * scale| below 0.25 (it rounds to 0 either way),
        # and every larger |c| keeps the products far from the underflow range.
        width = (0.25 / spec.scale) ** 0.5 / 2 if spec.square else 0.25 / spec.scale
        if spec.lo < spec.center + width and spec.hi > spec.center - width:
            snap = (spec.center, width)
    clamped = _clamped(ctx, spec.column, spec.lo, spec.hi, snap)
    centred: exp.Expr = paren(sub(clamped, ctx.d.double(spec.center))
                                    if spec.center != 0.0 else clamped)
    body = paren(mul(centred, centred.copy())) if spec.square else centred
    # the sign of the product, where the bounds fix it (the engine rounds it cheaper)
    sign = 1 if spec.square or spec.lo >= spec.center else \
        -1 if spec.hi <= spec.center else 0
    return cast(ctx.d.round_half_away(mul(body, ctx.d.double(spec.scale)), sign),
                "BIGINT")


def _bin(ctx: Context, index: int) -> exp.Expr:
    h = ctx.q.histograms[index]
    x = col(ctx.x(h.column))
    lo, hi = ctx.d.double(h.lo), ctx.d.double(h.hi)
    clamped = least(greatest(x.copy(), lo), hi)
    offset: exp.Expr = sub(clamped, lo.copy())
    if h.integers:  # one bin per integer (HistogramSpec): floor(x - lo + 1/2), exact
        offset, factor = add(offset, ctx.d.double(0.5)), 1.0
    else:
        factor = h.bins / (h.hi - h.lo)
    if ctx.d.guards_underflow and factor < 1.0:  # a tiny offset is bin 0 either way
        offset = case((exp.LT(this=offset.copy(), expression=ctx.d.double(0.25 / factor)),
                       ctx.d.double(0.0)), default=offset)
    bin_ = cast(exp.Floor(this=mul(paren(offset), ctx.d.double(factor))), "BIGINT")
    return case((exp.Is(this=x, expression=exp.Null()), exp.Null()),
                default=least(num(h.bins - 1), bin_))


def rows(ctx: Context) -> tuple[list[tuple[str, exp.Query]], str]:
    q = ctx.q
    items: list[exp.Expr] = []
    if q.unit is not None:
        items.append(alias(user_col(q.unit), "__u"))
    for key, name in zip(q.group_keys, ctx.k, strict=True):
        items.append(alias(ctx.d.group_key(key.expression), name))
    for column in ctx.x_columns:
        raw, missing = _raw(ctx, column)
        items.append(alias(case((missing, exp.Null()), default=raw), ctx.x(column)))
    items += [alias(_value(ctx, spec), ctx.v(spec)) for spec in ctx.values]
    if not items:
        items.append(alias(num(1), "__one"))  # a SELECT list is never empty
    conditions: list[exp.Expr] = []
    if q.unit is not None:
        conditions.append(exp.Not(this=exp.Is(this=user_col(q.unit), expression=exp.Null())))
    if q.where is not None:
        conditions.append(exp.Coalesce(this=ctx.d.condition(q.where),
                                       expressions=[exp.false()]))
    where = exp.and_(*conditions, copy=False) if conditions else None
    source: exp.Expr | str = RELATION
    converted = _converted(ctx)
    if converted:  # each conversion once a row (``_converted``), behind the fence
        source = select([star(), *(alias(double, _double_name(ctx, column))
                                   for column, double in converted)], RELATION)
        source = source.offset(0, copy=False)
    rows = select(items, source, where=where, comment="one row per input row that "
                  "passes the filter: unit, keys, clamped fixed-point values")
    if ctx.d.fence_rows:
        rows = rows.offset(0, copy=False)
    if ctx.d.distribute_rows and q.unit is not None:
        rows.set("distribute", exp.Distribute(expressions=[col("__u")]))
    ctes: list[tuple[str, exp.Query]] = [("rows", rows)]
    source = "rows"
    if ctx.keys_table is not None:
        listed = _inline_keys(ctx)
        keyed = exp.Select(expressions=[exp.Column(this=exp.Star(), table=exp.to_identifier(
            "rows"))]).from_(exp.table_("rows"), copy=False)
        if listed is not None:
            keyed = keyed.where(listed, copy=False)
        else:
            keyed.set("joins", [exp.Join(this=exp.table_(ctx.keys_table),
                                         on=key_match(ctx, "rows"), kind="SEMI")])
        keyed.add_comments([" the same rows, restricted to the public keys "])
        ctes.append(("keyed", keyed))
        source = "keyed"
    bins = [alias(_bin(ctx, i), f"__b{i}") for i in range(len(q.histograms))]
    if bins:
        ctes.append(("binned", select([star(), *bins], source, comment="each row's bin")))
        source = "binned"
    if ctx.sample:
        ctes += _sampled(ctx, source)
        source = "sampled"
    return ctes, source


#: At most this many public keys are listed in the statement (``Dialect.inline_keys``).
INLINE_KEYS = 64


def _inline_keys(ctx: Context) -> exp.Expr | None:
    """The public keys as ``key IN (...)`` where the dialect lists them (``inline_keys``):
    one key column, at most ``INLINE_KEYS`` keys, all text for a text column or all
    integers within BIGINT for an integer column, none NULL. Each literal goes through the
    same ``key_column`` cast as the keys table's column, so a row is kept exactly when the
    semi-join would keep it; None otherwise."""
    keys = ctx.q.keys
    if not ctx.d.inline_keys or keys is None or len(ctx.k) != 1 or \
            not 0 < len(keys.values) <= INLINE_KEYS:
        return None
    values = [row[0] for row in keys.values]
    kind = ctx.d.hash_kind(ctx.key_types[0])
    literals: list[exp.Expr]
    if kind == "text" and all(type(v) is str for v in values):
        literals = [exp.Literal.string(v) for v in values]
    elif kind in ("small", "int32", "int64") and \
            all(type(v) is int and -2**63 <= v < 2**63 for v in values):
        literals = [exp.Literal.number(v) for v in values]
    else:
        return None
    return exp.In(this=col(ctx.k[0], table="rows"),
                  expressions=[ctx.d.key_column(lit, ctx.key_types[0]) for lit in literals])


def _content(ctx: Context) -> list[tuple[HashInput, exp.Expr]]:
    """What the aggregates can see of a row besides its unit and keys: its fixed-point
    values, its bins and, for a column with neither, whether it is missing. Rows equal in
    all of these are interchangeable for every aggregate of the query. Each comes with
    the column that orders it (NULLs last) among the hash's ties."""
    content: list[tuple[HashInput, exp.Expr]] = [
        (HashInput(col(ctx.v(s)), "int64", nullable=True), col(ctx.v(s)))
        for s in ctx.values]
    content += [(HashInput(col(f"__b{i}"), "small", nullable=True), col(f"__b{i}"))
                for i in range(len(ctx.q.histograms))]
    seen = {s.column for s in ctx.values} | {h.column for h in ctx.q.histograms}
    for column in ctx.columns:
        if column not in seen:
            present = case((exp.Is(this=col(ctx.x(column)), expression=exp.Null()),
                            num(0)), default=num(1))
            content.append((HashInput(present, "small"), present.copy()))
    return content


def _sampled(ctx: Context, source: str) -> list[tuple[str, exp.Query]]:
    """Rows (and, under a hard partition cap, partitions) chosen uniformly at random by
    windows over a keyed random order.

    Rows: a unit's rows in a partition are ranked by a keyed hash of their content (unit,
    keys, and what the aggregates see of the row: ``_content``) and of a copy index
    numbering identical rows 1..c, so every row has its own random priority and the r
    smallest are a random r-subset of the rows (not of the distinct contents). Ties of
    the hash are broken by the content and the copy index. Partitions: a unit's
    partitions are ranked by a keyed hash of (unit, keys), ties broken by the keys, and
    the first k kept: exactly min(m, k) partitions.

    The kept rows are a function of the unit's own rows (as a multiset: which of two
    identical rows gets which copy index changes nothing) and of the secret key only,
    never of row order or of other units, which is what the sensitivity argument needs.
    """
    q = ctx.q
    r, k = q.rows_cap, q.partitions_cap
    pair = [col("__u"), *ctx.keys()]
    described = _content(ctx) if ctx.columns else []
    content = [value for value, _ in described]
    columns = [column for _, column in described]
    ctes: list[tuple[str, exp.Query]] = []
    if content:
        numbered = window(exp.RowNumber(), [*pair, *(c.copy() for c in columns)])
        ctes.append(("copies", select([star(), alias(numbered, "__d")], source,
                                      comment="each row numbered among the identical "
                                      "rows of its unit and partition")))
        source = "copies"
        content.append(HashInput(col("__d"), "int32"))  # a BIGINT below 2^31
        columns.append(col("__d"))
    hard = q.partitions_mode == "sample"
    if not hard and q.partitions_mode != "rescale" and ctx.k:
        raise InternalError("sampled rows with several partitions need a partition cap")
    ranks: list[exp.Expr] = []
    inner: exp.Expr | str = source
    if content or hard:
        inner = hashed(ctx, source, content, partitions=hard)
    if content:
        order = [col("__hr"), *columns]
        ranks.append(alias(window(exp.RowNumber(), pair, order), "__rr"))
    else:  # counts alone: a pair's rows are interchangeable, any r of them do
        ranks.append(alias(window(exp.RowNumber(), pair), "__rr"))
    keep: list[exp.Expr] = [exp.LTE(this=col("__rr"), expression=num(r))]
    if hard:
        ranks.append(alias(window(exp.DenseRank(), [col("__u")], partition_order(ctx)),
                           "__pr"))
        keep.append(exp.LTE(this=col("__pr"), expression=num(k)))
    what = f"{r} random rows per (unit, partition)" + (
        f", in {k} random partitions per unit" if hard else "")
    ranked = select([star(), *ranks], inner)
    ctes.append(("sampled", select([star()], ranked, where=exp.and_(*keep, copy=False),
                                   comment=f"the kept rows: {what}")))
    return ctes
