"""The bounding algorithm, written once as sqlglot syntax trees over a dialect's primitives.

``compile_bounding`` turns a frozen ``BoundedQuery`` into one statement per query, stage by
stage as ``dpcurator.query.bounding`` describes them (the data's shape after each stage is a
comment in the SQL). Everything that differs between engines is a primitive of ``Dialect``:

- ``total``: a user expression (WHERE, computed group keys) that raises on no row;
- ``safe_cast`` / ``key_column``: a cast that gives NULL where the value does not convert,
  and a public key's column as the group key's type;
- ``to_double`` / ``is_nan``: a column as a DOUBLE and the missing-value test (NULL or NaN);
- ``round_half_away``: ROUND of a double, half away from zero (C's ``round``);
- ``exact_sum`` / ``pair_sum``: exact integer sums (HUGEINT, NUMERIC, DECIMAL(38)), never
  overflowing;
- ``digest`` / ``digest_words``: text as two 30-bit words for the keyed hash (MD5, which
  every engine has); ``epoch_microseconds``: a timestamp as an integer; every other kind of
  value is encoded here, the same for every engine (``KeyedHash``);
- ``parameter`` / ``runnable``: a bound parameter (the hash coefficients: the secret key is
  never SQL text) and the statement as the driver takes it;
- ``order_key``: a key as a sort key that orders alike everywhere (text by bytes);
- plan choices that change no result (``PLAN_FLAGS``): ``partitions_by_window``,
  ``fence_rows``, ``distribute_rows``, ``profile_by_window``, ``sort_pairs_input``,
  ``inline_keys`` (a few public keys listed in the statement), and ``guards_underflow`` for
  engines whose double products raise on underflow;
- the semi-join to public keys is written as a ``SEMI JOIN``, which sqlglot writes as
  ``EXISTS`` where an engine has no semi-join. Rendering is sqlglot's writer per dialect.

An engine is such a dialect plus a transport (columns, bind, execute, register the keys).
Every arithmetic step on contributions is exact by construction: per-row values and every
contribution stay below 2^52 (``Context.of`` checks it), only per-pair raw sums go through
``exact_sum``.

The modules, each using only those above it (no import circle):

- ``_trees``: the small tree builders (col, num, cast, case, add, select, window, ...);
- ``_dialect``: ``Dialect`` and its primitives; ``_keyed_hash``: the keyed hash as trees;
- ``_context``: ``Context``, what every stage of one query reads (frozen), and the helpers
  the stages share (keyed priorities, the keyed partition order, the public keys' join);
- ``_rows``: stage 1; ``_bounding``: stages 2 and 3 and the aggregate statement;
- ``_profile_sql``: the contribution profile's statement (bounds chosen from the data);
- ``_results``: ``CompiledQuery``, ``CompileCache`` and ``collect`` (result rows as
  ``ExactAggregates``); this module: ``compile_bounding``, the entry point.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dpcurator.engines._bounding import statement
from dpcurator.engines._context import RELATION, Context
from dpcurator.engines._dialect import PLAN_FLAGS, Dialect, HashKind, ValueKind
from dpcurator.engines._profile_sql import (
    MEAN_OCTAVES,
    PROFILE_STEPS,
    UNIT_TOTALS,
    profile_statement,
)
from dpcurator.engines._results import CompileCache, CompiledQuery, collect
from dpcurator.engines._trees import width_bucket_case
from dpcurator.query.bounding import BoundedQuery

__all__ = ["MEAN_OCTAVES", "PLAN_FLAGS", "PROFILE_STEPS", "RELATION", "UNIT_TOTALS", "CompileCache",
           "CompiledQuery", "Dialect", "HashKind", "ValueKind", "collect", "compile_bounding",
           "width_bucket_case"]


def compile_bounding(query: BoundedQuery, dialect: Dialect, column_types: Mapping[str, str],
                     key_types: Sequence[str], relation: str,
                     keys_table: str | None = None) -> CompiledQuery:
    """The statement computing ``query``'s exact aggregates on ``relation`` (engine text
    spliced in place of ``RELATION``), with public keys read from ``keys_table``."""
    ctx = Context.of(query, dialect, column_types, key_types, keys_table)
    tree = profile_statement(ctx) if query.profile is not None else statement(ctx)
    text = dialect.render(tree).replace(RELATION, relation)
    names = tuple(ctx.hash.names)
    return CompiledQuery(query, dialect.runnable(text, bool(names)), names, keys_table,
                         tuple(key_types), [text])
