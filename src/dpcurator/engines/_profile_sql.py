"""The contribution profile's statement (``BoundedQuery.profile``): the counts that bounds
chosen from the data (``bounds="auto"``) are chosen from, as counts only."""

from __future__ import annotations

import math

from sqlglot import exp

from dpcurator.engines._context import Context
from dpcurator.engines._rows import rows
from dpcurator.engines._trees import (
    add,
    alias,
    case,
    cast,
    col,
    greatest,
    least,
    mod,
    mul,
    num,
    select,
    star,
    sub,
    window,
    with_ctes,
    wrap,
)

__all__ = ["MEAN_OCTAVES", "PROFILE_STEPS", "UNIT_TOTALS", "profile_statement"]

#: The magnitude steps of a profile's value buckets: 2^(q/4), 2^-30 (about 9.3e-10) to
#: 2^49.75 (about 9.5e14, the last step within the bounds a query may give, 1e15). It was
#: 2^-20 to 2^40 until a bug hunt (2026-12-02) asked for AVG of epoch milliseconds (1.7e12:
#: clamped to 1.1e12, the answer 34% low) and SUM of values near 1e-7 (all of them read as
#: zero: the widest clamps, an answer 1e15 times the truth).
PROFILE_STEPS = tuple(range(-120, 200))
#: The octaves of a pair's mean |x| in a profile's pairs (part 0): 2^o < mean <= 2^(o+1),
#: o from -20 to 40, and -21 for the means at or below 2^-20 (zeros included); a mean
#: beyond counts in the last. Not widened with the steps above: with o from -30 to 49 the
#: means' row caps were aimed worse (``auto_bounds.py --family``, 32 draws of the
#: histogram: AVG on #2 2.06x -> 5.54x, #19 1.10x -> 3.02x), probably as each bin is one
#: more place for the histogram's noise to pass its threshold, far from the data.
MEAN_OCTAVES = tuple(range(-21, 41))


def _ceil_root(power: int, degree: int) -> int:
    """The least integer n with n^degree >= 2^power, exactly."""
    n = max(1, round(2.0 ** (power / degree)))
    while n**degree < 2**power:
        n += 1
    while n > 1 and (n - 1) ** degree >= 2**power:
        n -= 1
    return int(n)


#: The grid a unit's number of rows in all, and a pair's, are rounded up to in a profile's
#: pairs (part 0): itself up to 16, then ceil(2^(q/8)), eight steps an octave (every power
#: of two among them), up to 2^41. Fine enough for choosing ``bounding="unit"``'s cap on a
#: unit's rows, which moves its noise in proportion (``_auto_units.choose_unit_rows``), and
#: a row cap per group (``Profile.rows``).
UNIT_TOTALS = tuple(sorted({*range(1, 17), *(_ceil_root(q, 8) for q in range(33, 329))}))


def profile_statement(ctx: Context) -> exp.Query:
    """The shape of the units' contributions (``BoundedQuery.profile``), as counts only.

    Part 0 counts the (unit, partition) pairs by (``__pb``: the unit's number of
    partitions, ``__nb``: the pair's number of rows on ``UNIT_TOTALS`` (``up_total``:
    exact up to 16, then eight steps an octave), ``__b``: with ``profile_totals``, the
    unit's number of rows on ``UNIT_TOTALS``, else NULL, and ``__s``: with
    ``profile_means``, the octave of the mean of the first column's |x| over the pair's
    rows, the largest o in ``MEAN_OCTAVES`` with sum |x| > rows 2^o, NULL counted as 0, or
    the first less one; else NULL);
    part -1 - c by (``__pb``, ``__b``: the bucket of the unit's sum of |x| of column c of
    ``profile_sums``; NULL and NaN left out, +-inf in the top bucket).
    Part 1 + c counts column c's non-missing values by (``__tb``: the unit's number of
    rows on ``UNIT_TOTALS``, ``__s``: sign, ``__b``: the largest q with |x| > 2^(q/4), q in
    ``PROFILE_STEPS``; one less if none). Every
    count of a unit's partitions or rows is rounded up (``up``, ``up_total``), so that
    weights computed as 1 / count never exceed the exact ones. (A pair's rows, and a unit's
    beside its values, were rounded up to a power of two above 8 until the twenty-fifth
    session: a row cap then saw pairs of 65 to 72 rows as spread up to 128, and COUNT's cap
    landed an octave above the best; the values of a unit of 65 rows weighed 1 / 128 each.)"""
    q = ctx.q
    ctes, source = rows(ctx)
    rows_view = "shaped"  # one row per value, with its unit's rows (__tb)
    first = q.profile[0] if q.profile and q.profile_means else None
    if q.unit is None:  # each row its own unit: one partition, one row
        ones = [alias(num(1), name) for name in ("__pb", "__nb", "__tb")]
        if q.profile_totals:
            ones.append(alias(num(1), "__tt"))
        if first is not None:  # the pair's mean is its one value
            ones.append(alias(_bucket(ctx, exp.Abs(this=col(ctx.x(first))), MEAN_OCTAVES[1],
                                      MEAN_OCTAVES[-1], steps=1), "__mb"))
        ctes.append(("shaped", select([star(), *ones], source)))
    elif ctx.d.profile_by_window:
        ctes += _profile_windows(ctx, source)
        rows_view = "valued"
    else:
        ctes += _profile_grouped(ctx, source)
        rows_view = "units"  # values counted per unit, joined to its row count below
    null = cast(exp.Null(), "BIGINT")
    mean: exp.Expr = null if first is None else col("__mb")
    totals: exp.Expr = col("__tt") if q.profile_totals else null.copy()
    branches: list[exp.Query] = [select(
        [alias(num(0), "__part"), col("__pb"), col("__nb"), alias(mean, "__s"),
         alias(totals, "__b"), alias(exp.Count(this=exp.Star()), "__c")], "shaped",
        group=[col("__pb"), col("__nb"), *([col("__tt")] if q.profile_totals else []),
               *([] if first is None else [col("__mb")])],
        comment="pairs by (partitions of the unit, rows of the pair, rows of the unit, "
                "mean |value|)")]
    for c in range(len(q.profile_sums)):
        bucket = _bucket(ctx, col(f"__us{c}"), PROFILE_STEPS[0], PROFILE_STEPS[-1])
        sums_of = select([col("__pb"), alias(bucket, "__b")], "shaped")
        branches.append(select(
            [alias(num(-1 - c), "__part"), col("__pb"), alias(null.copy(), "__nb"),
             alias(null.copy(), "__s"), col("__b"), alias(exp.Count(this=exp.Star()),
                                                          "__c")], sums_of,
            group=[col("__pb"), col("__b")],
            comment=f"pairs by (partitions of the unit, the unit's sum of |value| of "
                    f"column {c} of the sums)"))
    for c, column in enumerate(q.profile or ()):
        x = col(ctx.x(column))
        sign = case((exp.LT(this=x.copy(), expression=ctx.d.double(0.0)), num(-1)),
                    default=num(1))
        magnitude = exp.Abs(this=x.copy())
        bucket = _bucket(ctx, magnitude, PROFILE_STEPS[0], PROFILE_STEPS[-1])
        present = exp.Not(this=exp.Is(this=x, expression=exp.Null()))
        count: exp.Expr = exp.Count(this=exp.Star())
        if rows_view == "units":  # each unit's values counted by (sign, magnitude) first,
            # then joined to its rows: a join of a few rows per unit, not of every row
            per_unit = [col("__u"), alias(sign, "__s"), alias(bucket, "__b")]
            counted = select([*per_unit, alias(exp.Count(this=exp.Star()), "__n")], source,
                             where=present, group=[col("__u"), col("__s"), col("__b")])
            values: exp.Expr = exp.Select(expressions=[
                alias(up_total(ctx, col("__t")), "__tb"), col("__s"), col("__b"), col("__n")]
            ).from_(exp.Subquery(this=counted, alias=exp.TableAlias(
                this=exp.to_identifier("__v"))), copy=False).join(
                "units", using=["__u"], copy=False)
            count = exp.Sum(this=col("__n"))
        else:
            values = select([col("__tb"), alias(sign, "__s"), alias(bucket, "__b")],
                            rows_view, where=present)
        branches.append(select(
            [alias(num(c + 1), "__part"), col("__tb"), alias(null.copy(), "__nb"),
             col("__s"), col("__b"), alias(count, "__c")], values,
            group=[col("__tb"), col("__s"), col("__b")],
            comment=f"values of column {c} by (rows of the unit, sign, magnitude)"))
    union: exp.Query = branches[0]
    for branch in branches[1:]:
        union = exp.Union(this=union, expression=branch, distinct=False)
    return with_ctes(ctes, union)


def _profile_grouped(ctx: Context, source: str) -> list[tuple[str, exp.Query]]:
    """The profile's views by grouped aggregates (pairs, then units, joined back): the
    profile 2.4x faster than by windows over the rows on DuckDB, an auto-bounded release
    14% faster on PostgreSQL. ``shaped``: one row per pair; ``units``: one row per unit
    (the values' counts per unit are joined to it in ``profile_statement``)."""
    q = ctx.q
    pair = [col("__u"), *ctx.keys()]
    sums = [alias(exp.Sum(this=exp.Abs(this=col(ctx.x(column)))), f"__a{c}")
            for c, column in enumerate(q.profile_sums)]
    if q.profile and q.profile_means:  # the pair's sum of |x|, for its mean's octave
        sums.append(alias(exp.Sum(this=exp.Abs(this=col(ctx.x(q.profile[0])))), "__am"))
    ctes: list[tuple[str, exp.Query]] = [("pairs", select(
        [*pair, alias(exp.Count(this=exp.Star()), "__n"), *sums], source, group=pair,
        comment="one row per (unit, partition): its rows and sums of |value|"))]
    ctes.append(("units", select(
        [col("__u"), alias(exp.Count(this=exp.Star()), "__p"),
         alias(exp.Sum(this=col("__n")), "__t"),
         *(alias(exp.Sum(this=col(f"__a{c}")), f"__us{c}")
           for c in range(len(q.profile_sums)))], "pairs", group=[col("__u")],
        comment="one row per unit: its partitions, rows and sums of |value|")))
    ctes.append(("shaped", exp.Select(expressions=[
        alias(up(col("__p")), "__pb"), alias(up_total(ctx, col("__n")), "__nb"),
        alias(up_total(ctx, col("__t")), "__tb"), *_unit_total(ctx),
        *(col(f"__us{c}") for c in range(len(q.profile_sums))),
        *_mean_bucket(ctx)]).from_(
        "pairs", copy=False).join("units", using=["__u"], copy=False)))
    return ctes


def _unit_total(ctx: Context) -> list[exp.Expr]:
    """The unit's rows in all on ``UNIT_TOTALS`` (``__tt``), with ``profile_totals`` only:
    a logarithm and up to four comparisons a pair (``up_total``), and more groups in the
    profile's part 0."""
    return [alias(up_total(ctx, col("__t")), "__tt")] if ctx.q.profile_totals else []


def _mean_bucket(ctx: Context) -> list[exp.Expr]:
    """The octave of a pair's mean |x| of the first profiled column (``__am`` its sum of |x|,
    ``__n`` its rows), with ``profile_means``: the largest o with sum > rows 2^o (exact:
    rows times a power of two is exact in floating point, the same on every engine), on the
    octaves, not the magnitudes' quarter steps: the histogram it feeds
    (``_auto_aims.value_histogram``) has one Laplace-noised bin per octave. (Quarter steps
    were first left out for the cost of a nested CASE per pair; ``_bucket`` now costs the
    same at any step.)"""
    if not (ctx.q.profile and ctx.q.profile_means):
        return []
    return [alias(_bucket(ctx, col("__am"), MEAN_OCTAVES[1], MEAN_OCTAVES[-1],
                          per=col("__n"), steps=1), "__mb")]


def _profile_windows(ctx: Context, source: str) -> list[tuple[str, exp.Query]]:
    """The same views by windows over the rows, for an engine that has distributed the
    rows by unit (Spark: each window runs where the unit's rows are, where a grouped
    CTE read twice would be computed twice)."""
    q = ctx.q
    pair = [col("__u"), *ctx.keys()]
    sums = [alias(window(exp.Sum(this=exp.Abs(this=col(ctx.x(column)))),
                         [col("__u")]), f"__us{c}")
            for c, column in enumerate(q.profile_sums)]
    if q.profile and q.profile_means:  # the pair's sum of |x|, for its mean's octave
        sums.append(alias(window(exp.Sum(this=exp.Abs(this=col(ctx.x(q.profile[0])))), pair),
                          "__am"))
    counted = select([star(), alias(window(exp.Count(this=exp.Star()), pair), "__n"),
                      alias(window(exp.Count(this=exp.Star()), [col("__u")]), "__t"),
                      alias(window(exp.RowNumber(), pair, [col("__u")]), "__i"),
                      *sums],
                     source, comment="each row with its pair's and its unit's rows")
    first = case((exp.EQ(this=col("__i"), expression=num(1)), num(1)), default=num(0))
    spread = select([star(), alias(window(exp.Sum(this=first), [col("__u")]), "__p")],
                    "counted", comment="and its unit's number of partitions")
    valued = select([star(), alias(up(col("__p")), "__pb"),
                     alias(up_total(ctx, col("__n")), "__nb"),
                     alias(up_total(ctx, col("__t")), "__tb"), *_unit_total(ctx)], "spread")
    shaped = select([star(), *_mean_bucket(ctx)], "valued",
                    where=exp.EQ(this=col("__i"), expression=num(1)))
    return [("counted", counted), ("spread", spread), ("valued", valued),
            ("shaped", shaped)]


def _step(ctx: Context, q: exp.Expr, lo: int, steps: int) -> exp.Expr:
    """2^(q/``steps``) for an integer q >= ``lo`` (``lo`` a multiple of ``steps``), as the
    double the literal 2.0 ** (q / steps) is: 2^(r/steps) (one of ``steps`` literals, r = q
    mod steps) times 2^((q - r)/steps), a power of two, exactly (scaling by a power of two
    is exact in floating point, and POWER of 2 to an integer is exact on every engine; that
    the product equals the literal is checked for every step at import:
    ``_check_steps``)."""
    if steps == 1:
        return exp.Pow(this=ctx.d.double(2.0), expression=cast(q, "DOUBLE"))
    r = mod(add(q.copy(), num(-lo)), num(steps))  # q - lo >= 0: no negative remainder
    fraction = exp.Case(this=r.copy())
    for i in range(steps):
        fraction = fraction.when(num(i), ctx.d.double(2.0 ** (i / steps)), copy=False)
    octave = exp.Div(this=cast(sub(q.copy(), r), "DOUBLE"), expression=ctx.d.double(steps))
    return mul(fraction, exp.Pow(this=ctx.d.double(2.0), expression=octave))


def _check_steps(lo: int, hi: int, steps: int) -> None:
    """``_step``'s product equals the literal 2.0 ** (q / steps) for every q in [lo, hi]."""
    for q in range(lo, hi + 2):
        r = (q - lo) % steps
        if math.ldexp(2.0 ** (r / steps), (q - r) // steps) != 2.0 ** (q / steps):
            raise AssertionError(f"2^({q}/{steps}) is not a literal times a power of two")


_check_steps(PROFILE_STEPS[0], PROFILE_STEPS[-1], 4)
_check_steps(MEAN_OCTAVES[1], MEAN_OCTAVES[-1], 1)


def _bucket(ctx: Context, magnitude: exp.Expr, lo: int, hi: int,
            per: exp.Expr | None = None, steps: int = 4) -> exp.Expr:
    """The largest q in [lo, hi] with magnitude > 2^(q/``steps``) (times ``per``, for a
    mean's bucket from a sum), or lo - 1 (also where magnitude is NULL).

    Computed from e = ``steps`` log2(magnitude / per): where e lies more than ``NEAR`` from
    every integer, floor(e) (clipped to [lo - 1, hi]) is the bucket, since no engine's
    logarithm errs by more than 5e-12 here (at most a few ulps of |e| <= 4,300, and the
    steps' literals lie within 7e-16 of 2^(q/steps) in e). Nearer an integer, two
    comparisons decide it exactly against the steps q0 and q0 + 1 around e (``_step``: the
    same doubles as the literals 2.0 ** (q / steps), times ``per`` as before), so the bucket
    is the same on every engine whatever each one's logarithm rounds to. +inf and NaN are
    read as 2^1000 by the logarithm (NaN compares above every double on the three engines,
    so LEAST leaves it out) and land in hi, as their comparisons put them.

    It replaced a binary search of nested CASEs (8 comparisons a value, and about 240
    branches of text a bucket): on the skewed benchmark (SUM, 50,000 units) DuckDB's
    profile statement went from 41 KB to 20 KB, bound in 28 to 32 ms instead of 60 to 73,
    and ran in 219 to 276 ms instead of 322 to 357 (medians of 7 releases, two runs each)."""
    if hi - lo < 1:
        raise ValueError("a bucket needs at least two steps")
    present = cast(exp.Coalesce(this=magnitude.copy(), expressions=[ctx.d.double(0.0)]),
                   "DOUBLE")
    read = greatest(least(present, ctx.d.double(2.0**1000)), ctx.d.double(2.0**-1000))
    logarithm: exp.Expr = exp.Ln(this=read)
    if per is not None:
        logarithm = sub(logarithm, exp.Ln(this=cast(per.copy(), "DOUBLE")))
    e = mul(wrap(logarithm), ctx.d.double(steps / math.log(2.0)))

    def clipped(low: int, high: int) -> exp.Expr:
        return cast(least(num(high), greatest(num(low), exp.Floor(this=e.copy()))), "BIGINT")

    def above(q: exp.Expr) -> exp.Expr:  # 1 where magnitude > the step q (times per), else 0
        step = _step(ctx, q, lo, steps)
        threshold = step if per is None else exp.Mul(this=per.copy(), expression=step)
        return cast(exp.GT(this=magnitude.copy(), expression=threshold), "INT")

    q0 = clipped(lo, hi - 1)
    exact = exp.Coalesce(this=sub(add(q0.copy(), above(add(q0.copy(), num(1)))),
                                  sub(num(1), above(q0.copy()))),
                         expressions=[num(lo - 1)])
    far = exp.GT(this=exp.Abs(this=sub(e.copy(), exp.Round(this=e.copy()))),
                 expression=ctx.d.double(NEAR))
    return case((far, clipped(lo - 1, hi)), default=exact)


#: ``_bucket`` decides by comparisons where its logarithm lies within NEAR of an integer
NEAR = 1e-9


def up(node: exp.Expr) -> exp.Expr:
    """A count >= 1 as itself up to 8, else rounded up to a power of two (at most 2^40)."""
    whens = [(exp.LTE(this=node.copy(), expression=num(8)), node.copy())]
    whens += [(exp.LTE(this=node.copy(), expression=num(2**b)), num(2**b))
              for b in range(4, 41)]
    return case(*whens, default=num(2**41))


def up_total(ctx: Context, node: exp.Expr) -> exp.Expr:
    """A unit's count of rows >= 1 rounded up to ``UNIT_TOTALS`` (itself up to 16), 2^42
    beyond the grid. Above 16 the grid is ceil(2^(q/8)), q from 33: a logarithm estimates
    the least q with ceil(2^(q/8)) >= the count within one, and two comparisons with the
    grid's values around it decide it. Each value, CEIL(POWER(2, q/8)), is exact on every
    engine: no 2^(q/8) on the grid lies within 3e-14 of an integer, relatively (about 140
    ulps; ``_check_totals``), far beyond any POWER's error. It replaced a binary search of
    nested CASEs (about 9 comparisons a pair, 296 branches of text)."""
    fine = [t for t in UNIT_TOTALS if t > 16]
    first = UNIT_TOTAL_FIRST

    def grid(i: exp.Expr) -> exp.Expr:  # fine[i], i in [0, len(fine))
        power = exp.Pow(this=ctx.d.double(2.0), expression=exp.Div(
            this=cast(add(i, num(first)), "DOUBLE"), expression=ctx.d.double(8.0)))
        return cast(exp.Ceil(this=power), "BIGINT")

    # the least q with 2^(q/8) > count - 1 (ceil(y) >= n for an integer n: y > n - 1)
    # (at least 1: no engine is asked for ln(0), whatever order it evaluates a CASE in)
    logarithm = exp.Ln(this=cast(greatest(sub(node.copy(), num(1)), num(1)), "DOUBLE"))
    estimate = sub(exp.Ceil(this=mul(wrap(logarithm), ctx.d.double(8.0 / math.log(2.0)))),
                   num(first))
    i0 = cast(least(num(len(fine) - 2), greatest(num(1), estimate)), "BIGINT")
    below, at = add(i0.copy(), num(-1)), i0
    return case((exp.LTE(this=node.copy(), expression=num(16)), node.copy()),
                (exp.GT(this=node.copy(), expression=num(fine[-1])), num(2**42)),
                (exp.LTE(this=node.copy(), expression=grid(below.copy())), grid(below)),
                (exp.LTE(this=node.copy(), expression=grid(at.copy())), grid(at.copy())),
                default=grid(add(at, num(1))))


#: the first q of ``UNIT_TOTALS``' grid above 16, ceil(2^(q/8)) (``up_total``)
UNIT_TOTAL_FIRST = 33


def _check_totals() -> None:
    """``up_total``'s grid: UNIT_TOTALS above 16 is ceil(2^(q/8)) for q from
    ``UNIT_TOTAL_FIRST`` on, and no 2^(q/8) there lies within 3e-14 of an integer
    (relatively) unless it is one, so every engine's CEIL(POWER(2, q / 8)) gives it."""
    fine = [t for t in UNIT_TOTALS if t > 16]
    for i, value in enumerate(fine):
        q = UNIT_TOTAL_FIRST + i
        exact = 2.0 ** (q / 8)
        if value != _ceil_root(q, 8) or value != math.ceil(exact):
            raise AssertionError(f"UNIT_TOTALS' grid is not ceil(2^(q/8)) at q = {q}")
        if q % 8 and abs(exact - round(exact)) < 3e-14 * exact:
            raise AssertionError(f"2^({q}/8) lies too near an integer for CEIL(POWER(...))")


_check_totals()
