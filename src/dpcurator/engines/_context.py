"""What every stage of one compiled query reads: ``Context`` (the query, the dialect, the
column and key types, the keyed hash it records its parameters in, the internal column names),
and the helpers several stages share: the keyed priorities of pairs and rows, the keyed order
of a unit's partitions, and the join with the public keys table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlglot import exp

from dpcurator.engines._dialect import Dialect
from dpcurator.engines._keyed_hash import HashInput, KeyedHash
from dpcurator.engines._trees import alias, cast, col, select, star
from dpcurator.errors import InternalError
from dpcurator.query.bounding import BoundedQuery, ValueSpec

__all__ = ["RELATION", "Context", "hashed", "indexed", "key_match", "partition_order"]

RELATION = "__dpcurator_relation__"  # stands for the engine's relation until rendering


@dataclass(frozen=True)
class Context:
    """One bounded query ``q`` compiled for the dialect ``d``: what the stages read.

    ``hash`` records the keyed hash's parameters as the stages use them (the only thing that
    changes while a statement is built); ``k`` names the group keys' columns, ``columns`` the
    user columns read for values, bins and profiles, ``values`` the distinct fixed-point
    values, ``x_columns`` the columns that need their cleaned double (``__x``)."""

    q: BoundedQuery
    d: Dialect
    types: Mapping[str, str]
    key_types: tuple[str, ...]
    keys_table: str | None
    hash: KeyedHash
    k: tuple[str, ...]
    columns: tuple[str, ...]
    values: tuple[ValueSpec, ...]
    sample: bool
    x_columns: tuple[str, ...]

    @classmethod
    def of(cls, query: BoundedQuery, dialect: Dialect, column_types: Mapping[str, str],
           key_types: Sequence[str], keys_table: str | None) -> Context:
        for m in query.measures:
            if query.l1_sensitivity(m) >= 2**52:
                raise InternalError("a measure's sensitivity reaches 2^52; this is a bug")
        columns: list[str] = []
        for m in query.measures:
            if m.value is not None and m.value.column not in columns:
                columns.append(m.value.column)
        for h in query.histograms:
            if h.column not in columns:
                columns.append(h.column)
        for column in (*(query.profile or ()), *query.profile_sums):
            if column not in columns:
                columns.append(column)
        values: list[ValueSpec] = []
        for m in query.measures:
            if m.kind in ("values", "squares", "unit_values") and m.value is not None \
                    and m.value not in values:
                values.append(m.value)
        # The cleaned double of a column: for its bins, or to count and sample its values
        # when it has no fixed-point value of its own.
        with_value = {spec.column for spec in values}
        binned = {h.column for h in query.histograms}
        x_columns = [c for c in columns if c in binned or c not in with_value]
        return cls(query, dialect, dict(column_types), tuple(key_types), keys_table,
                   KeyedHash(dialect), tuple(f"__k{i}" for i in range(len(query.group_keys))),
                   tuple(columns), tuple(values), query.rows_mode == "sample",
                   tuple(x_columns))

    # names ----------------------------------------------------------------------------------

    def x(self, column: str) -> str:
        return f"__x{self.columns.index(column)}"

    def v(self, spec: ValueSpec) -> str:
        return f"__v{self.values.index(spec)}"

    def keys(self) -> list[exp.Expr]:
        return [col(k) for k in self.k]


# -- the keyed hash -----------------------------------------------------------------------------


def _pair_inputs(ctx: Context) -> list[HashInput]:
    assert ctx.q.unit is not None
    inputs = [HashInput(col("__u"), ctx.d.hash_kind(ctx.types.get(ctx.q.unit, "")),
                        digest="__hu")]
    for i, name in enumerate(ctx.k):
        kind = ctx.d.hash_kind(ctx.key_types[i]) if i < len(ctx.key_types) else "other"
        inputs.append(HashInput(col(name), kind, nullable=True, digest=f"__h{name}"))
    return inputs


def _with_digests(ctx: Context, source: exp.Expr | str, inputs: Sequence[HashInput]
                  ) -> exp.Expr | str:
    """The source with the digest of each text input as a column (one digest a row)."""
    items: list[exp.Expr] = []
    for value in inputs:
        if value.kind in ("text", "other"):
            assert value.digest is not None
            text = value.node.copy() if value.kind == "text" else cast(value.node.copy(),
                                                                      "VARCHAR")
            items.append(alias(ctx.d.digest(text), value.digest))
    if not items:
        return source
    return select([star(), *items], source)


def _fenced(ctx: Context, query: exp.Expr | str) -> exp.Expr | str:
    """The digests computed as written where the dialect fences (``fence_rows``): a planner
    that inlines a subquery's columns (PostgreSQL) would otherwise compute each MD5 again at
    every place the lanes name it (measured: 16 MD5s a row, 7x the by-hand floor on a TPC-H
    join with private keys)."""
    if ctx.d.fence_rows and isinstance(query, exp.Select):
        return query.offset(0, copy=False)
    return query


def hashed(ctx: Context, source: exp.Expr | str, content: Sequence[HashInput] = (), *,
           partitions: bool = True) -> exp.Select:
    """The source with the keyed priorities: ``__hp`` of its pair (unit, keys), when
    ``partitions``, and ``__hr`` of the row, given its content. Lane values are columns
    of their own (``__xa``, ``__xb``; a row's ``__ya``, ``__yb`` continue its pair's),
    and so are the priorities: an engine sorts a column faster than an expression."""
    pair = _pair_inputs(ctx)
    digested = _with_digests(ctx, source, [*pair, *content])
    xs = [alias(ctx.hash.accumulate(lane, None, pair, 0), f"__x{lane}") for lane in "ab"]
    out: exp.Expr | str = select([star(), *xs], _fenced(ctx, digested))
    if digested is not source:
        # text inputs make the lanes long (each digest word a term): computed once a row
        # too (PostgreSQL, a TPC-H join with private text keys: 1.05 s -> 0.67 s); without
        # them the lanes stay inline, where the pairs' sort is reused (one table, integer
        # keys: fencing them measured 1.68x -> 1.90x the floor at 2e6 rows)
        out = _fenced(ctx, out)
    priorities: list[exp.Expr] = []
    if partitions:
        priorities.append(alias(ctx.hash.priority("p", col("__xa"), col("__xb")), "__hp"))
    if content:
        ys = [alias(ctx.hash.accumulate(lane, col(f"__x{lane}"), content, len(pair)),
                    f"__y{lane}") for lane in "ab"]
        out = select([star(), *ys], out)
        priorities.append(alias(ctx.hash.priority("r", col("__ya"), col("__yb")), "__hr"))
    return select([star(), *priorities], out)


def partition_order(ctx: Context) -> list[exp.Expr]:
    """The keyed random order of a unit's partitions (both hard-cap paths): the 62-bit
    priority of (unit, keys), ties broken by the keys, so exactly min(m, k) are kept."""
    keys = [ctx.d.order_key(col(k), ctx.key_types[i] if i < len(ctx.key_types) else "")
            for i, k in enumerate(ctx.k)]
    return [col("__hp"), *keys]


# -- the public keys ----------------------------------------------------------------------------


def key_match(ctx: Context, side: str) -> exp.Expr:
    """The join condition of ``side``'s group keys with the public keys table.

    A NULL key matches NULL group values, so columns whose keys hold a NULL compare with
    IS NOT DISTINCT FROM; the others with ``=``, which DuckDB joins about 10% faster (the
    semi-join runs over every input row)."""
    assert ctx.keys_table is not None and ctx.q.keys is not None
    parts: list[exp.Expr] = []
    for i, (k, t) in enumerate(zip(ctx.k, ctx.key_types, strict=True)):
        has_null = any(key[i] is None for key in ctx.q.keys.values)
        left = col(k, table=side)
        right = ctx.d.key_column(col(f"c{i}", table=ctx.keys_table), t)
        parts.append(exp.NullSafeEQ(this=left, expression=right) if has_null
                     else exp.EQ(this=left, expression=right))
    return exp.and_(*parts, copy=False)


def indexed(ctx: Context, statement: exp.Query, columns: Sequence[str]) -> exp.Select:
    """Replace the key columns of a result by the public key's index."""
    assert ctx.keys_table is not None
    items = [alias(col("i", table=ctx.keys_table), "__key"),
             *(col(c, table="agg") for c in columns)]
    sub = exp.Subquery(this=statement, alias=exp.TableAlias(this=exp.to_identifier("agg")))
    return exp.Select(expressions=items).from_(sub, copy=False).join(
        exp.to_table(ctx.keys_table), on=key_match(ctx, "agg"), copy=False)
