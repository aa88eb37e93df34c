"""``Dialect``: one engine's SQL, as the primitives the bounding trees are built from.

The primitives are listed in ``_sql``'s docstring; DuckDB, PostgreSQL and Spark subclass
``Dialect`` and override the few where they differ. The boolean class attributes are plan
choices that change no result (``PLAN_FLAGS``; tests/test_engine_contract.py runs each
off and on, on every engine). They are not independent: Spark refuses
``sort_pairs_input``'s ORDER BY beside ``distribute_rows``' DISTRIBUTE BY.
"""

from __future__ import annotations

import math
import re
from typing import ClassVar, Literal

from sqlglot import exp

from dpcurator.engines._trees import cast, user_col
from dpcurator.query import expressions as ex

__all__ = ["PLAN_FLAGS", "Dialect", "HashKind", "ValueKind", "base_type"]

ValueKind = Literal["float", "exact", "other"]
HashKind = Literal["small", "int32", "int64", "int128", "bool", "float", "date", "timestamp",
                   "text", "other"]

_TYPE_KINDS: dict[str, HashKind] = {
    # every integer type hashes as 64 bits: a value hashes the same whatever its width
    **dict.fromkeys(("TINYINT", "SMALLINT", "INT1", "INT2", "UTINYINT", "USMALLINT", "SHORT",
                     "INTEGER", "INT", "INT4", "SIGNED", "BIGINT", "INT8", "UINTEGER",
                     "UBIGINT", "LONG"), "int64"),
    **dict.fromkeys(("HUGEINT", "UHUGEINT", "INT128"), "int128"),
    **dict.fromkeys(("BOOLEAN", "BOOL", "LOGICAL"), "bool"),
    **dict.fromkeys(("DOUBLE", "FLOAT", "REAL", "FLOAT4", "FLOAT8", "DOUBLE PRECISION"),
                    "float"),
    "DATE": "date",
    **dict.fromkeys(("TIMESTAMP", "DATETIME", "TIMESTAMPTZ", "TIMESTAMP WITH TIME ZONE",
                     "TIMESTAMP WITHOUT TIME ZONE", "TIMESTAMP_US"), "timestamp"),
    **dict.fromkeys(("VARCHAR", "TEXT", "STRING", "CHAR", "BPCHAR", "CHARACTER",
                     "CHARACTER VARYING", "NAME"), "text"),
}


def base_type(sql_type: str) -> str:
    """``"DECIMAL(18,3)"`` -> ``"DECIMAL"``; spaces normalised, upper case."""
    return " ".join(re.sub(r"\(.*\)", "", sql_type).upper().split())


class Dialect:
    """One engine's SQL: the primitives the bounding trees are built from.

    The defaults are the SQL that DuckDB and PostgreSQL share; an engine overrides the few
    primitives where it differs (sqlglot writes each tree in the engine's spelling).
    """

    sqlglot: ClassVar[str] = "duckdb"
    guards_underflow: ClassVar[bool] = False  # does a double product that underflows raise?
    # Plan choices (the same rows and sums either way): each unit's number of partitions by
    # a window over the pairs instead of a grouped count joined back, and the row stage
    # behind an optimisation fence, so that an engine that inlines it into the pairs'
    # aggregates does not evaluate each fixed-point value once per aggregate.
    partitions_by_window: ClassVar[bool] = False
    fence_rows: ClassVar[bool] = False
    # A distributed engine: send each unit's rows to one place first (DISTRIBUTE BY the
    # unit), so that the pairs, each unit's partition count and its keyed top-k all run where
    # the rows already are (one shuffle of the rows instead of one for the pairs and another
    # for the units).
    distribute_rows: ClassVar[bool] = False
    # The contribution profile's counts by windows over the rows instead of grouped pairs
    # and units joined back (Spark: its rows are already distributed by unit).
    profile_by_window: ClassVar[bool] = False
    # The pairs' input ordered by (unit, keys) behind a fence, so that the pairs are grouped
    # by a sort whose order the unit's windows then reuse, instead of hashed and sorted again
    # (PostgreSQL).
    sort_pairs_input: ClassVar[bool] = False
    # A few public keys of one column, text or integers and none NULL, as an IN list of
    # literals instead of a semi-join with the keys table (DuckDB: the semi-join probed
    # every input row, 0.42 s -> 0.37 s for a TPC-H SUM at scale 1 with 5 keys).
    inline_keys: ClassVar[bool] = False

    # types -------------------------------------------------------------------------------

    def hash_kind(self, sql_type: str) -> HashKind:
        return _TYPE_KINDS.get(base_type(sql_type), "other")

    def value_kind(self, sql_type: str) -> ValueKind:
        """How a column becomes a double: a float (NaN possible), an exact number, or other
        (a cast that may fail)."""
        kind = self.hash_kind(sql_type)
        if kind == "float":
            return "float"
        if kind in ("small", "int32", "int64", "int128", "bool") or base_type(sql_type) in (
                "DECIMAL", "NUMERIC"):
            return "exact"
        return "other"

    # expressions -------------------------------------------------------------------------

    def total(self, text: str) -> exp.Expr:
        """The plan's canonical expression ``text``, written so that no row can make it
        raise (a failing operation gives NULL)."""
        raise NotImplementedError

    def condition(self, text: str) -> exp.Expr:
        """A WHERE filter made total (``total``), as a BOOLEAN where the engine would convert
        it unasked."""
        return self.total(text)

    def group_key(self, text: str) -> exp.Expr:
        """A group key's expression: a plain column as it is (it cannot raise)."""
        node = ex.tree_of(text)  # the plan's tree: parsed once, where the query entered
        if isinstance(node, exp.Column):
            return user_col(node.name)
        return self.total(text)

    def safe_cast(self, node: exp.Expr, sql_type: str) -> exp.Expr:
        return exp.TryCast(this=node, to=exp.DataType.build(sql_type, dialect=self.sqlglot,
                                                            udt=True))

    def key_column(self, node: exp.Expr, sql_type: str) -> exp.Expr:
        """A column of the public keys table as the group key's type (NULL if it does not
        convert; the engine checked the keys when it registered them)."""
        return self.safe_cast(node, sql_type)

    def to_double(self, node: exp.Expr, sql_type: str) -> exp.Expr:
        kind = self.value_kind(sql_type)
        if kind == "float":
            return node
        if kind == "exact":
            return cast(node, "DOUBLE")
        return self.safe_cast(node, "DOUBLE")

    def is_nan(self, node: exp.Expr) -> exp.Expr:
        return exp.IsNan(this=node)

    def double(self, value: float) -> exp.Expr:
        value = float(value)
        if math.isfinite(value):
            return cast(exp.Literal.number(repr(value)), "DOUBLE")
        return cast(exp.Literal.string(repr(value)), "DOUBLE")  # 'inf', '-inf', 'nan'

    def round_half_away(self, node: exp.Expr, sign: int = 0) -> exp.Expr:
        """ROUND of a double, half away from zero; ``sign`` is the value's sign where it is
        known (1: never negative, -1: never positive, 0: unknown)."""
        return exp.Round(this=node)

    def exact_sum(self, node: exp.Expr) -> exp.Expr:
        return exp.Sum(this=node)

    def pair_sum(self, node: exp.Expr) -> tuple[exp.Expr, exp.Expr]:
        """A pair's sum of fixed-point values (each below 2^52 in magnitude), as (a BIGINT,
        exact where the sum is below 2^63: pairs of at most r rows; an exact sum of any
        size, for the rescale of larger pairs)."""
        total = self.exact_sum(node)
        return cast(total, "BIGINT"), total.copy()

    def parameter(self, name: str) -> exp.Expr:
        return cast(exp.Placeholder(this=name), "BIGINT")

    def epoch_microseconds(self, node: exp.Expr) -> exp.Expr:
        raise NotImplementedError

    def digest(self, node: exp.Expr) -> exp.Expr:
        """Text -> its MD5 digest in the form ``digest_words`` reads (computed once a row)."""
        raise NotImplementedError

    def digest_words(self, node: exp.Expr) -> list[exp.Expr]:
        """The digest's bytes 0-3 and 4-7, each read little-endian: two 32-bit words."""
        raise NotImplementedError

    def order_key(self, node: exp.Expr, sql_type: str) -> exp.Expr:
        """A group key as a sort key that orders the same on every engine (text by bytes)."""
        return node

    def render(self, tree: exp.Expr) -> str:
        return tree.sql(dialect=self.sqlglot, pretty=True)

    def runnable(self, text: str, parameters: bool) -> str:
        """The statement's text as the driver takes it (with parameters bound or not)."""
        return text



#: The plan choices of ``Dialect`` (class attributes): each changes the statement, never a result.
PLAN_FLAGS = ("guards_underflow", "partitions_by_window", "fence_rows", "distribute_rows",
              "profile_by_window", "sort_pairs_input", "inline_keys")
