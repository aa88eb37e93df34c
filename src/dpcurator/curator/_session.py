"""The Curator: one table (or a schema of several, joined in queries), one privacy unit, one
budget; DP answers to aggregate questions.

The central path reads like the data flow, one call per stage, each taking a frozen value and
returning a new one; everything that can refuse a query runs before the charge, and after it
only the engine runs and the noise is drawn:

    plan     = self.parse(text)                        # sqlglot, once: the plan holds trees
    resolved = self.resolve(plan, epsilon=...)         # _resolve: defaults, schema, request
    prepared = self.prepare(resolved)                  # _compile (every bound the choice may
                                                       # pick proven: _candidates), the engine
                                                       # binds the SQL, priced once (_prepared)
    compiled, cost = self._charge(prepared, label)     # one ledger transaction, or refused
    chosen   = self._choose_bounds(compiled, key)      # bounds from the data: among the proven
    exact    = engine.compute_exact_aggregates(...)    # bounding inside the engine
    kept     = select_partitions(compiled, exact)      # _release_stages (private keys)
                                                       # (bounding="unit": its caps chosen
                                                       # now, and the engine run again)
    noisy    = add_noise(compiled, exact, kept)        # secure exact noise
    values   = estimate(compiled.estimators, noisy)    # post-processing
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from dpcurator.accounting import RDP, ZCDP, ApproxDP, Neighbouring, PureDP
from dpcurator.accounting.filters import Amount
from dpcurator.engines import (
    Engine,
    ExactAggregates,
    PostgresTable,
    TableSet,
    column_kind,
    open_engine,
    open_tables,
)
from dpcurator.errors import (
    BudgetExceededError,
    InternalError,
    UnsupportedChargeError,
    UserError,
)
from dpcurator.ledger import Budget, Charge
from dpcurator.noise import RandomSource, resolve_source
from dpcurator.query.builder import Query
from dpcurator.query.errors import QueryError, UnknownColumnError
from dpcurator.query.joins import UNIT_COLUMN, flatten_plan, rekey, rekey_auto
from dpcurator.query.plan import (
    AUTO,
    INTERVAL_KINDS,
    AutoBounds,
    Bounds,
    Count,
    Plan,
    auto_options,
)
from dpcurator.query.schema import Schema as Declared
from dpcurator.query.schema import declare, folded
from dpcurator.query.sql import parse_sql, too_deep_error

from ._auto_aims import draw_aim
from ._auto_bounds import choose_bounds, chosen_again
from ._auto_plan import TAIL, VALUES, AutoPlan, defers_unit_caps, outer_names
from ._auto_thin import needs_retry
from ._auto_units import choose_unit_caps
from ._candidates import Candidates
from ._compile import CompiledQuery, compile_query
from ._estimators import Intervals, describe_with_error_95, estimate, estimate_totals
from ._prepared import PreparedQuery, ResolvedQuery, charge_cost, profile_query
from ._privacy import PrivacyRequest, check_delta
from ._profile import Profile
from ._release_stages import (
    Partitions,
    add_noise,
    describe_selection,
    key_token,
    select_partitions,
)
from ._resolve import Defaults, match_column, resolve_plan
from ._schema import Schema, schema_parts
from ._warnings import after_noise, before_charge, collect, take_chosen, unused_settings
from .release import Release, check_confidence

__all__ = ["Curator", "CuratorQuery", "PreparedQuery", "ResolvedQuery", "Schema",
           "charge_cost"]

BudgetLike = PureDP | ApproxDP | ZCDP | RDP | Budget
_SLACK = 1e-9  # a request this close above the remaining budget is calibrated to it


@dataclass(frozen=True)
class CuratorQuery(Query):
    """A ``Query`` bound to a curator: build it, then ``.release(epsilon=...)``."""

    curator: Any = None

    def release(self, **privacy: Any) -> Release:
        """Run the query on the curator (same keywords as ``Curator.run``)."""
        if self.curator is None:
            raise UserError("this query is not bound to a curator; use Curator.run(query, ...)")
        curator: Curator = self.curator
        return curator.run(self, **privacy)


def _engine_for(data: Any, table: str | None, threads: int | None) -> Engine:
    """The engine reading ``data``, as the registry of source kinds picks it."""
    return open_engine(data, table=table, threads=threads)


class Curator:
    """Answers DP aggregate queries about one table, or several joined (``Schema``),
    charging one privacy budget.

    Args:
        data: a CSV or Parquet path (scanned in place), a pandas or Polars DataFrame, an Arrow
            table, or use ``Curator.from_duckdb(connection, table)``. Several tables: a
            mapping ``{name: data}`` (or a ``Schema``), queried with joins in DP SQL.
        privacy_unit: the column identifying whose data a row is (a user id, a patient id):
            the guarantee protects all rows of one unit together. With several tables, a
            mapping from each private table to its unit column or to its path to the unit,
            ``{"customer": "c_custkey", "orders": "o_custkey -> customer.c_custkey"}``
            (``dpcurator.query.schema``): the guarantee then protects one unit with every
            row that reaches it, in every table.
        public: with several tables, the tables that hold no one's data (joined freely).
        budget: the total privacy loss allowed, ``PureDP(eps)``, ``ApproxDP(eps, delta)``,
            ``ZCDP(rho)``, ``RDP(...)``, or a ``Budget`` (to share one ledger).
        one_row_per_person: the explicit, deliberately loud opt-in to row-level privacy when
            there is no privacy unit column: every row is treated as a different person. If
            one person can have several rows, this understates their privacy loss.
        table: the table's name in DP SQL (``FROM data``).
        bounds: default clamping bounds per column, ``{"age": (0, 120)}``. Declared here, the
            columns are checked once for NaN (a data-owner check; see ``check_nan``).
            ``"auto"`` (or ``{"age": "auto"}``): bounds not given are chosen from the data
            under DP with 10% of each query's budget (``Release.bounds_chosen``).
        max_partitions: the default cap on the partitions one unit contributes to
            (``"auto"``: chosen from the data, as for ``bounds``).
        max_rows_per_partition: the default cap on one unit's rows in one partition
            (``"auto"``: chosen from the data, as for ``bounds``).
        bounding: how the caps are applied, ``"rescale"``, ``"sample"``, or ``"unit"``
            (caps on each unit's total: ``Plan.bounding``). None (the default): ``"unit"``
            for a query of COUNT(*) and SUM that leaves every bound to the data, with public
            keys or no GROUP BY; ``"rescale"`` otherwise (``_resolve.default_bounding``).
        auto_bounds: choose every bound that neither the curator nor a query gives from the
            data, under DP, with 10% of the query's budget (the default; the release states
            them). False: caps not given are 1, and an aggregate without bounds is refused.
        auto_bounds_share: the share of each query's budget (epsilon, or rho) spent choosing
            its bounds, in (0, 1); default 0.1. A query may state its own (``bounds_share``).
        cache: return the stored release for a repeated identical query, for free.
        journal: the budget's ledger file (SQLite; see ``dpcurator.ledger``): every charge is
            committed to it before any release, and every curator, thread and process using
            the same file shares one total, which the ledger stores when it is created.
        confidence: the default interval level of releases.
        postprocess: clip counts at zero and means to their bounds (free post-processing).
        source: where noise comes from. Leave it None for the cryptographically secure
            default. A ``SeededRandom`` is INSECURE and for tests and benchmarks only.
        check_nan: refuse, at construction, declared-bound columns holding NaN (at query time
            NaN and NULL values are ignored by SUM/AVG/VARIANCE/quantiles).
        allow_large_delta: the explicit opt-in to a delta above 0.001 (in the budget or in a
            query). Delta is the probability that the guarantee fails outright: with delta of
            1/n or more a mechanism may publish records as they are.

    Construction is the data owner's step: a CSV file is read once in full here, and a line
    that does not fit the column types inferred from the file's first rows is named in the
    error (line and column, never the value), so that no query can fail on the data after
    it was charged. A DataFrame's columns that are not NumPy numbers or dates (such as a
    pandas ``object`` column, whose type DuckDB infers from a sample of its rows) are read
    once in full too, and a column holding a value that does not fit is named. An empty
    table is answered like any other (noisy counts around zero).
    """

    def __init__(
        self,
        data: Any,
        *,
        privacy_unit: str | Mapping[str, str] | None = None,
        budget: BudgetLike,
        public: Any = (),
        one_row_per_person: bool = False,
        table: str = "data",
        bounds: Mapping[str, Any] | str | None = None,
        max_partitions: int | str | None = None,
        max_rows_per_partition: int | str | None = None,
        bounding: str | None = None,
        cache: bool = True,
        journal: str | os.PathLike[str] | None = None,
        confidence: float = 0.95,
        postprocess: bool = True,
        source: RandomSource | None = None,
        check_nan: bool = True,
        connection_table: str | None = None,
        threads: int | None = None,
        allow_large_delta: bool = False,
        auto_bounds: bool = True,
        auto_bounds_share: float | None = None,
        intervals: str | None = None,
        total_share: float | None = None,
    ) -> None:
        self._tables: TableSet | None = None
        self.schema: Declared | None = None
        self.privacy_unit: str | None = None
        self.excluded: tuple[str, ...] = ()
        parts = schema_parts(data, privacy_unit, public, connection_table)
        if parts is not None:
            sources, privacy_unit, public, connection = parts
            if one_row_per_person:
                raise UserError("one_row_per_person is for one table; with several tables, "
                                "declare each private table's unit or path in privacy_unit")
            self._tables = open_tables(sources, connection=connection, threads=threads)
            self.schema = declare(self._tables.columns(), privacy_unit, public)
            self.table = ""
            self.privacy_unit = UNIT_COLUMN
            # the curator's bounds name columns as queries do: by their own names, or as
            # table.column (``joins.rekey`` applies them to each query's columns)
            columns: Mapping[str, str] = {
                **{c: kind for cols in self._tables.columns().values()
                   for c, kind in cols.items()},
                **{f"{t}.{c}": kind for t, cols in self._tables.columns().items()
                   for c, kind in cols.items()}}
        else:
            self._engine = _engine_for(data, connection_table, threads)
            self.table = _check_table_name(table)
            columns = self._engine.columns()
            self.privacy_unit = _unit_column(privacy_unit, one_row_per_person, columns)
        self._budget = _make_budget(budget, journal)
        if self._budget.total.neighbouring is not Neighbouring.ADD_REMOVE:
            raise UserError("the curator states guarantees for add/remove one privacy unit; "
                            "create the budget with the default neighbouring relation")
        self._allow_large_delta = bool(allow_large_delta)
        check_delta(getattr(self._budget.total, "delta", 0.0), "the budget's delta",
                    self._allow_large_delta)
        declared = {}
        bounds, max_partitions, max_rows_per_partition, auto = auto_options(
            bounds, max_partitions, max_rows_per_partition)
        # every bound given nowhere is chosen from the data (auto_bounds), with this share
        try:
            base = AutoBounds(open=bool(auto_bounds), share=auto_bounds_share)
        except QueryError as exc:
            raise UserError(f"auto_bounds_share: {exc}") from None
        auto = base.merged(auto)  # with nothing open or asked for, it chooses nothing
        if bounds is not None and not isinstance(bounds, Mapping):
            raise UserError("bounds must be a mapping {column: (lo, hi)} or 'auto'")
        for name, value in (bounds or {}).items():
            if self._tables is not None and folded(str(name), columns) is None:
                raise UnknownColumnError(
                    f"bounds names the column {str(name)!r}, which none of the tables has; "
                    "name it as column or table.column (a query's aliases are its own)")
            column = match_column(str(name), columns, "bounds")
            if column in declared:
                raise UserError(f"bounds name the column {column!r} twice (column names are "
                                "case-insensitive)")
            if column_kind(columns[column]) not in ("numeric", "boolean"):
                raise UserError(f"bounds were given for {column!r}, which is not numeric "
                                f"(type {columns[column]})")
            declared[column] = Bounds.of(value, column)
        if auto is not None:
            for column in auto.columns:
                match_column(column, columns, "bounds")
        if intervals is not None and intervals not in INTERVAL_KINDS:
            raise UserError(f"intervals must be 'bounded' or 'total' (or None: 'bounded'), "
                            f"got {intervals!r}")
        try:  # validated as a plan's
            Plan(aggregates=(Query().count().plan().aggregates[0],), total_share=total_share)
        except QueryError as exc:
            raise UserError(str(exc)) from None
        self._defaults = Defaults(declared, max_partitions, max_rows_per_partition, bounding,
                                  auto, intervals, total_share)
        Plan(aggregates=(Query().count().plan().aggregates[0],),  # validates the defaults
             max_partitions=max_partitions, max_rows_per_partition=max_rows_per_partition,
             bounding=bounding)  # type: ignore[arg-type]
        if self._tables is not None:
            self._check_tables(declared if check_nan else {})
        else:
            self._engine.check_source()  # every value read once: no query fails on the data
        if check_nan and declared and self._tables is None:
            bad = self._engine.nan_columns(sorted(declared))
            if bad:
                raise UserError(f"column(s) {bad} contain NaN values; clean them, or pass "
                                "check_nan=False to have queries ignore NaN like NULL")
        self._cache_enabled = bool(cache)
        self._cache: dict[Any, Release] = {}
        self._confidence = check_confidence(confidence)
        self._postprocess = postprocess
        self._source = source
        self._lock = threading.Lock()

    # -- constructors ------------------------------------------------------------------------

    @classmethod
    def from_csv(cls, path: str | os.PathLike[str], **options: Any) -> Curator:
        """A CSV file, scanned in place at every query."""
        return cls(_existing(path), **options)

    @classmethod
    def from_parquet(cls, path: str | os.PathLike[str], **options: Any) -> Curator:
        """A Parquet file (or glob), scanned in place at every query."""
        return cls(_existing(path), **options)

    @classmethod
    def from_pandas(cls, frame: Any, **options: Any) -> Curator:
        return cls(frame, **options)

    @classmethod
    def from_polars(cls, frame: Any, **options: Any) -> Curator:
        return cls(frame, **options)

    @classmethod
    def from_arrow(cls, table: Any, **options: Any) -> Curator:
        return cls(table, **options)

    @classmethod
    def from_duckdb(cls, connection: Any, table: str | Any, **options: Any) -> Curator:
        """A table or view of an existing DuckDB connection, queried where it is; several
        (a list of names, or ``{name in queries: table}``) with ``privacy_unit`` a mapping."""
        if not isinstance(table, str):
            tables = dict(table) if isinstance(table, Mapping) else {t: t for t in table}
            return cls(Schema(tables, options.pop("privacy_unit", None),
                              options.pop("public", ()), connection=connection), **options)
        return cls(connection, connection_table=table, **options)

    @classmethod
    def from_postgres(cls, dsn: str, table: str | Any, **options: Any) -> Curator:
        """A table or view of a PostgreSQL database (``postgresql://`` URL), queried where it
        is: bounding and sums run in PostgreSQL (psycopg 3: ``dpcurator[postgres]``). Several
        (a list of names, or ``{name in queries: table}``) with ``privacy_unit`` a mapping:
        the joins run in PostgreSQL too."""
        if not isinstance(table, str):
            names = dict(table) if isinstance(table, Mapping) else {t: t for t in table}
            return cls({n: PostgresTable(dsn, t) for n, t in names.items()}, **options)
        return cls(PostgresTable(dsn, table), **options)

    @classmethod
    def from_spark(cls, dataframe: Any, **options: Any) -> Curator:
        """A Spark DataFrame (pyspark), queried where it is: bounding and the exact sums run
        as Spark SQL on its session's cluster, and one row per partition comes back
        (``dpcurator[spark]``). Several: ``{name: DataFrame}`` with ``privacy_unit`` a
        mapping."""
        return cls(dataframe, **options)

    # -- state -------------------------------------------------------------------------------

    @property
    def budget(self) -> Budget:
        return self._budget

    @property
    def remaining(self) -> Amount:
        """What is left of the budget (rounded down)."""
        return self._budget.remaining

    @property
    def spent(self) -> Amount:
        return self._budget.spent

    @property
    def ledger(self) -> tuple[Charge, ...]:
        """Every charge, in order (cached answers are not charged and not listed)."""
        return self._budget.ledger

    @property
    def columns(self) -> dict[str, str]:
        """The table's schema (column -> type); public. With several tables, every table's
        columns as ``table.column``."""
        if self._tables is not None:
            return self._schema_columns()
        return dict(self._engine.columns())

    def _schema_columns(self) -> dict[str, str]:
        assert self._tables is not None
        return {f"{t}.{c}": kind for t, cols in self._tables.columns().items()
                for c, kind in cols.items()}

    def _check_tables(self, declared: Mapping[str, Any]) -> None:
        """The data owner's check of a schema's tables, at construction: every value read
        once, every path's target unique, rows with a broken path counted (warned, kept in
        ``excluded``), and declared-bound columns checked for NaN in every table."""
        import warnings

        assert self._tables is not None and self.schema is not None
        for engine in self._tables.engines.values():
            engine.check_source()
        report = self._tables.check_links(self.schema)
        self.excluded = tuple(report.lines())
        for line in self.excluded:
            warnings.warn(line, UserWarning, stacklevel=3)
        for name, engine in self._tables.engines.items():
            columns = engine.columns()
            mine = sorted({c for c in declared if c in columns} |
                          {c[len(name) + 1:] for c in declared
                           if c.startswith(f"{name}.") and c[len(name) + 1:] in columns})
            bad = engine.nan_columns(sorted(mine)) if mine else []
            if bad:
                raise UserError(f"column(s) {bad} of {name!r} contain NaN values; clean them, "
                                "or pass check_nan=False to have queries ignore NaN like NULL")

    def _defaults_for(self, plan: Plan) -> Defaults:
        """The curator's defaults for a plan: over a join, its bounds and the columns it
        chooses bounds for keyed as the joined rows name their columns (``joins.rekey``)."""
        defaults = self._defaults
        if plan.source is None or self.schema is None:
            return defaults
        what = "the curator's bounds"
        return replace(defaults, bounds=rekey(defaults.bounds, plan.source, self.schema, what),
                       auto=rekey_auto(defaults.auto, plan.source, self.schema, what))

    def _engine_of(self, plan: Plan) -> Engine:
        """The engine reading a plan's rows: the one table's, or its join's."""
        if self._tables is None:
            if plan.source is not None:
                raise UserError("this curator has one table; a joined query needs a curator "
                                "over several tables")
            return self._engine
        if plan.source is None:
            raise UserError("this curator holds several tables: ask in DP SQL, naming the "
                            f"tables in FROM and JOIN ({', '.join(self.schema.names())})"
                            if self.schema is not None else "no table")
        return cast(Engine, self._tables.view(plan.source))

    def query(self) -> CuratorQuery:
        """A query builder bound to this curator: ``curator.query()...release(epsilon=1)``."""
        return CuratorQuery(curator=self)

    # -- asking ------------------------------------------------------------------------------

    def sql(self, query: str, *, epsilon: float | None = None, delta: float | None = None,
            rho: float | None = None, bounds: Mapping[str, Any] | str | None = None,
            keys: Any = None, max_partitions: int | str | None = None,
            max_rows_per_partition: int | str | None = None, bounding: str | None = None,
            noise: str | None = None, weights: Mapping[str, float] | None = None,
            confidence: float | None = None, cache: bool | None = None,
            label: str | None = None, bounds_share: float | None = None,
            intervals: str | None = None, total_share: float | None = None,
            max_unit_rows: int | str | None = None,
            max_unit_sums: Mapping[str, float | str] | None = None) -> Release:
        """Answer a DP SQL query (see ``dpcurator.query.sql`` for the accepted subset).

        ``epsilon`` [and ``delta``] or ``rho`` is what this query spends; ``bounds`` clamps
        columns; ``keys`` lists public partitions (without keys, and unless every group key
        is binned, partitions are selected privately, which needs ``delta``). ``"auto"``
        (``bounds="auto"``, a column's bounds, ``max_partitions``, ``max_rows_per_partition``)
        chooses that bound from the data under DP with a share of the query's budget
        (``bounds_share``; default the curator's, 10%); the release states the bounds chosen
        and what choosing them cost (``Release.bounds_chosen``). ``intervals`` says what
        the intervals of COUNT(*) and SUM cover: ``"bounded"`` (the capped answer) or
        ``"total"`` (the answer without the caps and the clamping, for a 10% share, or
        ``total_share``; asked for only: ``Release.interval_kinds``).
        ``bounding="unit"`` caps each unit's total instead (COUNT(*) and SUM): at most
        ``max_unit_rows`` rows in all, and a sum of |value| of at most ``max_unit_sums[col]``,
        each chosen from the data where not given (or ``"auto"``); these also give the
        outer caps of ``intervals="total"``. Under ``bounding="unit"`` the curator's bounds
        for a summed column and total intervals asked by the curator or by ``total_share``
        are not used, and the release's ``warnings`` say so (``_warnings.unused_settings``).
        """
        plan = self.parse(query, bounds=bounds, keys=keys, max_partitions=max_partitions,
                          max_rows_per_partition=max_rows_per_partition, bounding=bounding,
                          bounds_share=bounds_share, intervals=intervals,
                          total_share=total_share, max_unit_rows=max_unit_rows,
                          max_unit_sums=max_unit_sums)
        return self.run(plan, epsilon=epsilon, delta=delta, rho=rho, noise=noise,
                        weights=weights, confidence=confidence, cache=cache,
                        label=label or " ".join(query.split()))

    def parse(self, query: str, *, bounds: Mapping[str, Any] | str | None = None,
              keys: Any = None, max_partitions: int | str | None = None,
              max_rows_per_partition: int | str | None = None, bounding: str | None = None,
              bounds_share: float | None = None, intervals: str | None = None,
              total_share: float | None = None, max_unit_rows: int | str | None = None,
              max_unit_sums: Mapping[str, float | str] | None = None) -> Plan:
        """The plan of a DP SQL query about this curator's table (``FROM <table>``), with the
        options of ``sql``; nothing is resolved, compiled, charged or read. ``sql`` is
        ``run(parse(...))``, and a service parses with it before its own checks."""
        if isinstance(bounds, Mapping) and self._tables is None:  # a misspelt column is
            for name in bounds:                                   # named, not unused
                match_column(str(name), self._engine.columns(), "bounds")
        plan = parse_sql(query, table=self.table, privacy_unit=self.privacy_unit,
                         bounds=bounds, keys=keys, max_partitions=max_partitions,
                         max_rows_per_partition=max_rows_per_partition,
                         bounding=bounding, schema=self.schema)  # type: ignore[arg-type]
        if bounds_share is not None:
            try:
                plan = plan.replace(auto=AutoBounds(share=bounds_share).merged(plan.auto))
            except QueryError as exc:
                raise UserError(f"bounds_share: {exc}") from None
        if intervals is not None or total_share is not None:
            try:
                plan = plan.replace(intervals=intervals or plan.intervals,
                                    total_share=total_share)
            except QueryError as exc:
                raise UserError(str(exc)) from None
        if isinstance(max_unit_sums, Mapping) and plan.source is not None and \
                self.schema is not None:  # keyed as the joined rows name their columns
            max_unit_sums = rekey({str(c): v for c, v in max_unit_sums.items()},
                                  plan.source, self.schema, "max_unit_sums")
        return _given_unit_caps(plan, max_unit_rows, max_unit_sums)

    def run(self, query: Query | Plan, *, epsilon: float | None = None,
            delta: float | None = None, rho: float | None = None, noise: str | None = None,
            weights: Mapping[str, float] | None = None, confidence: float | None = None,
            cache: bool | None = None, label: str | None = None) -> Release:
        """Answer a query built with ``Query`` (or a ``Plan``), spending what is given."""
        resolved = self.resolve(query, epsilon=epsilon, delta=delta, rho=rho, noise=noise,
                                weights=weights, confidence=confidence)
        use_cache = self._cache_enabled if cache is None else bool(cache)
        with self._lock:
            if use_cache and resolved.key in self._cache:
                return _with_confidence(self._cache[resolved.key], resolved.level, cached=True)
            prepared = self.prepare(resolved)  # compiled, checked, priced: before any charge
            compiled, cost = self._charge(prepared, label or repr(prepared.compiled.plan))
            release = self._answer(compiled, prepared.statements, prepared.level, cost,
                                   prepared.warnings)
            if use_cache:
                self._cache[resolved.key] = release
            return release

    def resolve(self, query: Query | Plan, *, epsilon: float | None = None,
                delta: float | None = None, rho: float | None = None,
                noise: str | None = None, weights: Mapping[str, float] | None = None,
                confidence: float | None = None) -> ResolvedQuery:
        """The query with this curator's defaults and the privacy asked, checked (cheap:
        nothing is compiled or read). Its ``key`` says when two queries are the same release."""
        plan = query.plan() if isinstance(query, Query) else query
        if not isinstance(plan, Plan):
            raise UserError("run() takes a Query or a Plan; for SQL use curator.sql(...)")
        if plan.tables is not None:  # the builder's joins: checked as DP SQL's
            if self.schema is None:
                raise UserError("from_ and join name tables of a curator over several "
                                "tables; this curator has one")
            plan = flatten_plan(plan, self.schema)
        defaults = self._defaults_for(plan)
        try:
            resolved = resolve_plan(plan, self._engine_of(plan).columns(), defaults,
                                    self.privacy_unit)
        except RecursionError:  # sqlglot reads and writes expressions recursively
            raise too_deep_error() from None
        request = PrivacyRequest.make(epsilon=epsilon, delta=delta, rho=rho, noise=noise,
                                      weights=weights,
                                      allow_large_delta=self._allow_large_delta)
        level = check_confidence(self._confidence if confidence is None else confidence)
        return ResolvedQuery(resolved, request, level,
                             tuple(unused_settings(plan, resolved, defaults)))

    def prepare(self, resolved: ResolvedQuery) -> PreparedQuery:
        """Compile and cost a resolved query, and check it against the table's types, without
        charging anything or reading a row. What it returns can be charged (by ``run``, or by
        a service's ledger: ``cost_in``) and then ``answer``-ed."""
        try:
            compiled = self._compile(resolved.plan, resolved.request)
            engine = self._engine_of(compiled.plan)
            statements = engine.validate(compiled.bounded)
            if compiled.auto is not None:  # the choice's statement too, before any charge
                engine.validate(profile_query(compiled))
        except RecursionError:
            raise too_deep_error() from None
        try:  # priced once, here; a budget that cannot account it refuses at the charge
            cost: PureDP | ApproxDP | ZCDP | None = self._charge_cost(compiled)
            refusal = ""
        except UserError as exc:
            cost, refusal = None, str(exc)
        return PreparedQuery(compiled, tuple(statements), resolved.level,
                             self._budget.composition, cost, refusal,
                             collect(resolved.notes, before_charge(compiled)))

    def answer(self, prepared: PreparedQuery, privacy: PureDP | ApproxDP | ZCDP) -> Release:
        """Run a prepared query and add its noise; the caller has charged ``privacy`` for it.

        Nothing is charged here: this is the stage a service calls after its own ledger
        reserved the cost (``cost_in``) for every account concerned.
        """
        release = self._answer(prepared.compiled, prepared.statements, prepared.level, privacy,
                               prepared.warnings)
        if self._cache_enabled:
            with self._lock:
                self._cache.setdefault(prepared.key, release)
        return release

    def cost_in(self, prepared: PreparedQuery, composition: str) -> PureDP | ApproxDP | ZCDP:
        """What a prepared query costs in a budget of the given composition (priced when it
        was prepared, for this curator's budget)."""
        if composition == prepared.composition:
            return prepared.price()
        return charge_cost(prepared.compiled, composition)

    def describe(self, prepared: PreparedQuery) -> dict[str, Any]:
        """How a prepared query's answer is noised, as its mechanisms state it (free).

        ``{"noise": {aggregate: [one dict per noised measure]}, "partition_selection": ...,
        "warnings": [...]}``: each measure's noise (kind, scale or sigma in the query's units,
        guarantee) and ``error_95``, the half-width w with P[|noise| > w] <= 0.05, computed by
        the mechanism itself (``accuracy``), on its grid, in the query's units; and what is
        known before spending that the release will warn of (``PreparedQuery.warnings``).
        """
        compiled = prepared.compiled
        return {"noise": {e.aggregate.name: describe_with_error_95(e)
                          for e in compiled.estimators},
                "partition_selection": repr(compiled.selection) if compiled.selection else None,
                "warnings": list(prepared.warnings)}

    def explain(self, query: Query | Plan | str, **privacy: Any) -> dict[str, Any]:
        """What a query would run and cost, and its noise, without charging or reading rows."""
        if isinstance(query, str):  # with ``sql``'s options of the query itself
            plan = self.parse(query, **{name: privacy.pop(name) for name in (
                "bounds", "keys", "max_partitions", "max_rows_per_partition", "bounding",
                "bounds_share", "intervals", "total_share", "max_unit_rows",
                "max_unit_sums") if name in privacy})
        else:
            plan = query.plan() if isinstance(query, Query) else query
        if not isinstance(plan, Plan):
            raise UserError("explain() takes DP SQL text, a Query or a Plan")
        prepared = self.prepare(self.resolve(
            plan, epsilon=privacy.get("epsilon"), delta=privacy.get("delta"),
            rho=privacy.get("rho"), noise=privacy.get("noise"), weights=privacy.get("weights")))
        compiled, statements, plan = prepared.compiled, prepared.statements, prepared.compiled.plan
        explained: dict[str, Any] = {
            "plan": plan,
            "cost": prepared.price(),
            "sql": list(statements),
            **self.describe(prepared),  # "noise", "partition_selection" and "warnings"
        }
        if compiled.auto is not None:
            auto = compiled.auto
            outers = outer_names(auto.auto)
            if compiled.plan.bounding == "unit":  # paid from the bounds' share
                outers = []
            explained["bounds_to_choose"] = {
                "max_partitions": auto.auto.max_partitions,
                "max_rows_per_partition": auto.auto.max_rows_per_partition,
                "columns": list(auto.auto.columns), "share": auto.auto.spent_share,
                "epsilons": {k: v for k, v in auto.epsilons.items() if k not in outers},
                "note": "chosen from the data when the query runs; the plan, SQL, noise and "
                        "partition selection above show placeholder bounds (caps of 1, bounds "
                        "(0, 1))"}
            if VALUES in auto.epsilons:  # a sum's row cap's histogram, on top of the share
                explained["bounds_to_choose"]["values_share"] = auto.values_share
            if TAIL in auto.epsilons:  # the row cap's tail's histogram, on top too
                explained["bounds_to_choose"]["tail_share"] = auto.tail_share
            if compiled.retry is not None:  # where the data is too thin for the first choice
                explained["bounds_to_choose"]["if_too_thin"] = {
                    "share": compiled.retry.share, "epsilons": compiled.retry.epsilons,
                    "answer": compiled.retry.request.rho if compiled.retry.request.rho
                    is not None else compiled.retry.request.epsilon,
                    "note": "where the thin-data rule's count is too small for the first "
                            "choice, the bounds are chosen again with these, from the answer's "
                            "part, and the answer keeps the rest"}
            if compiled.plan.bounding == "unit":
                explained["bounds_to_choose"].update(
                    max_unit_rows=auto.auto.unit_rows, max_unit_sums=list(auto.auto.unit_sums))
            if defers_unit_caps(compiled.plan):
                explained["bounds_to_choose"]["order"] = (
                    "the keys are selected first (a pass over the data counting each unit in "
                    "its first max_partitions partitions), then the caps on each unit's total "
                    "are chosen for the keys released, and a second pass measures them")
            if outers:
                explained["outer_caps_to_choose"] = {
                    "caps": outers, "epsilons": {k: auto.epsilons[k] for k in outers},
                    "note": "the total intervals' outer caps, chosen from the data when the "
                            "query runs (placeholders of 1 above)"}
        return explained

    def show_progress(self, enabled: bool) -> None:
        """The engine's own progress display on long queries (DuckDB's progress bar)."""
        engines = self._tables.engines.values() if self._tables is not None else [self._engine]
        for engine in engines:
            engine.show_progress(enabled)

    def close(self) -> None:
        if self._tables is not None:
            self._tables.close()
        else:
            self._engine.close()

    # -- stages ------------------------------------------------------------------------------

    def _compile(self, plan: Plan, request: PrivacyRequest, total: float | None = None
                 ) -> CompiledQuery:
        return compile_query(plan, request, privacy_unit=self.privacy_unit,
                             postprocess=self._postprocess, source=self._source, total=total)

    def _charge_cost(self, compiled: CompiledQuery) -> PureDP | ApproxDP | ZCDP:
        """The guarantee to charge, in the budget's currency (tightest valid statement)."""
        return charge_cost(compiled, self._budget.composition)

    def _charge(self, prepared: PreparedQuery, label: str
                ) -> tuple[CompiledQuery, PureDP | ApproxDP | ZCDP]:
        """Charge the prepared query its price, durably, or refuse it whole (nothing charged,
        nothing run); what it charged, and the query compiled for it."""
        compiled, cost = prepared.compiled, prepared.price()
        try:
            fits = self._budget.can_afford(cost)
        except UnsupportedChargeError as exc:
            raise UserError(str(exc)) from None
        if not fits:
            shrunk = self._shrink(compiled, cost)
            if shrunk is None:
                raise BudgetExceededError(
                    f"this query costs {cost}, more than what remains "
                    f"({_describe(self._budget.remaining)}); nothing was charged or run")
            compiled, cost = shrunk
        self._budget.charge(cost, label[:500])
        return compiled, cost

    def _shrink(self, compiled: CompiledQuery, cost: PureDP | ApproxDP | ZCDP
                ) -> tuple[CompiledQuery, PureDP | ApproxDP | ZCDP] | None:
        """Calibrate to exactly what remains when the request exceeds it by < 1e-9 relative.

        Never the reverse: the new request is smaller (more noise), never larger.
        """
        left = self._budget.remaining
        request = compiled.request
        if isinstance(cost, ZCDP):
            if left.rho is None or cost.rho > left.rho * (1 + _SLACK):
                return None
            ratio = left.rho / cost.rho
            factor = ratio if request.rho is not None else math.sqrt(ratio)
        else:
            if left.epsilon is None or cost.epsilon > left.epsilon * (1 + _SLACK):
                return None
            factor = left.epsilon / cost.epsilon
            if cost.delta > 0:
                if not left.delta or cost.delta > left.delta * (1 + _SLACK):
                    return None
                factor = min(factor, left.delta / cost.delta)
        factor = min(factor, 1.0) * (1 - 1e-12)
        smaller = self._compile(compiled.plan, request.scaled(factor))
        new_cost = self._charge_cost(smaller)
        if not self._budget.can_afford(new_cost):
            return None
        return smaller, new_cost

    def _choose_bounds(self, compiled: CompiledQuery, key: int
                       ) -> tuple[CompiledQuery, dict[str, Any], _Deferred | None]:
        """Choose the bounds a charged query left to the data (``_auto_bounds``) among the
        candidates proven to compile before the charge (``_candidates``), and bind them;
        ``bounding="unit"``'s caps are left at the widest where they are chosen after the
        keys (the third value: ``_auto_plan.defers_unit_caps``, ``_unit_caps_for``)."""
        auto, candidates = compiled.auto, compiled.candidates
        if auto is None or candidates is None:
            raise InternalError("bounds to choose without proven candidates; this is a bug")
        profile = self._engine_of(compiled.plan).compute_exact_aggregates(
            profile_query(compiled), key).profile
        if profile is None:
            raise InternalError("the engine returned no profile; this is a bug")
        defer = defers_unit_caps(compiled.plan)
        retry, again = compiled.retry, compiled.retry_candidates
        stats = Profile(profile)
        # the row cap's histogram, drawn once: the retry reads it too (post-processing)
        aim = draw_aim(auto, stats, self._source)
        plan, chosen = choose_bounds(auto, compiled.plan, stats, auto.auto.columns,
                                     self._source, candidates.rows_for, defer_unit_caps=defer,
                                     aim=aim)
        if defer:
            return candidates.bind(plan, chosen), chosen, _Deferred(auto, profile, candidates)
        if retry is not None and again is not None and needs_retry(
                auto, compiled.plan, chosen, candidates.rows_for):
            # too thin for the first choice: chosen again, from the answer's part
            # (``_auto_plan.plan_retry``; its privacy: ``_compile._prove_retry``)
            plan, second = choose_bounds(retry, compiled.plan, stats, auto.auto.columns,
                                         self._source, again.rows_for, again=True, aim=aim)
            chosen = chosen_again(auto, retry, chosen, second)
            return again.bind(plan, chosen), chosen, None
        return candidates.bind(plan, chosen), chosen, None

    def _unit_caps_for(self, deferred: _Deferred, compiled: CompiledQuery,
                       chosen: dict[str, Any], first: ExactAggregates, kept: Partitions,
                       key: int) -> tuple[CompiledQuery, ExactAggregates, Partitions]:
        """``bounding="unit"``'s caps chosen for the keys the selection kept
        (``_auto_units.choose_unit_caps``), and the engine run again with them for the
        measures the noise is added to (the first run computed the selection's unit counts
        alone, which the caps do not move); the keys' rows in that second run."""
        plan, chosen = choose_unit_caps(deferred.auto, compiled.plan, chosen, deferred.profile,
                                        len(kept.keys), self._source)
        compiled = deferred.candidates.bind(plan, chosen)
        if not kept.keys:  # nothing to measure: no partition, no measure
            return compiled, ExactAggregates([], {m.name: [] for m in compiled.bounded.measures},
                                             sql=first.sql), kept
        exact = self._engine_of(compiled.plan).compute_exact_aggregates(compiled.bounded, key)
        exact.sql = [*first.sql, *exact.sql]  # the release shows both passes' statements
        where = {key_token(k): i for i, k in enumerate(exact.keys)}
        return compiled, exact, replace(kept, rows=[where.get(key_token(k), -1)
                                                    for k in kept.keys])

    def _answer(self, compiled: CompiledQuery, statements: tuple[str, ...], level: float,
                privacy: PureDP | ApproxDP | ZCDP, warned: tuple[str, ...] = ()) -> Release:
        """Run a charged query: one call per stage, the data's shape after each. ``warned``:
        the prepared query's warnings, which the release repeats (``_warnings``)."""
        key = int(resolve_source(self._source).words(1)[0])  # the engine's sampling key
        chosen = deferred = None
        if compiled.auto is not None:
            compiled, chosen, deferred = self._choose_bounds(compiled, key)
        # the selection's pass alone first where the caps are chosen for its keys
        bounded = compiled.bounded if deferred is None else \
            replace(compiled.bounded, measures=(), histograms=())
        exact = self._engine_of(compiled.plan).compute_exact_aggregates(bounded, key)
        # exact: E partitions found, each with its exact integer measures and histograms
        kept = select_partitions(compiled, exact)
        # kept: P released keys, each with its row in exact (-1: no row, a public key unseen)
        if deferred is not None and chosen is not None:  # the caps, for the P keys kept
            compiled, exact, kept = self._unit_caps_for(deferred, compiled, chosen, exact,
                                                         kept, key)
        if chosen is not None:
            warned = collect(warned, take_chosen(chosen), before_charge(compiled))
        noisy = add_noise(compiled, exact, kept)
        # noisy: per aggregate, its noisy integer measures (P,) each, or noisy trees (P, 2047)
        values = estimate(compiled.estimators, noisy)
        # values: per aggregate, P released floats
        totals = estimate_totals(compiled.estimators, noisy)
        # totals: per SUM with a measured total, its own P released floats (``_total``)
        intervals = Intervals(compiled.estimators, noisy)
        warned = collect(warned, after_noise(compiled, values, {
            name: intervals(name, 1.0 - level, True) for name in totals}, level))
        plan = compiled.plan
        mechanisms = {e.aggregate.name: e.describe() for e in compiled.estimators}
        total = plan.intervals == "total"
        kinds = tuple((e.aggregate.name, "total" if e.total is not None or (
            total and type(e.aggregate) is Count) else "bounded") for e in compiled.estimators)
        selection = describe_selection(compiled) if compiled.selection is not None else None
        return Release(
            keys=kept.keys, group_columns=tuple(k.name for k in plan.group_by),
            values=values, privacy=privacy, plan=plan,
            sql=tuple(exact.sql or statements), confidence=level, mechanisms=mechanisms,
            _intervals=intervals, kinds=kinds, selection=selection, chosen=chosen,
            totals=totals, warnings=warned,
            secure=bool(getattr(resolve_source(self._source), "secure", False)))


@dataclass(frozen=True)
class _Deferred:
    """What choosing ``bounding="unit"``'s caps after the selection needs (``_unit_caps_for``):
    the choices' plan, the profile's rows, the proven candidates."""

    auto: AutoPlan
    profile: Sequence[tuple[Any, ...]]
    candidates: Candidates


def _with_confidence(release: Release, level: float, cached: bool) -> Release:
    return replace(release, confidence=level, from_cache=cached)


def _describe(amount: Amount) -> str:
    parts = [f"{n}={v:g}" for n, v in (("epsilon", amount.epsilon), ("delta", amount.delta),
                                          ("rho", amount.rho)) if v is not None]
    return ", ".join(parts) or "see the ledger"


def _make_budget(budget: BudgetLike, journal: str | os.PathLike[str] | None) -> Budget:
    if isinstance(budget, Budget):
        if journal is not None:
            raise UserError("give journal= when creating the Budget, not both")
        return budget
    if not isinstance(budget, PureDP | ApproxDP | ZCDP | RDP):
        raise UserError("budget must be PureDP(eps), ApproxDP(eps, delta), ZCDP(rho), RDP(...) "
                        f"or a Budget, got a {type(budget).__name__}")
    return Budget(budget, journal=journal)


def _unit_column(privacy_unit: Any, one_row_per_person: bool, columns: Mapping[str, str]
                 ) -> str | None:
    """One table's privacy unit, as the table spells it (None: each row its own, asked for
    explicitly)."""
    if privacy_unit is None:
        if one_row_per_person is not True:
            raise UserError(
                "say whose privacy to protect: privacy_unit='<column>' (for example a user "
                "id). Row-level privacy, where every row is assumed to be a different "
                "person, needs the explicit opt-in one_row_per_person=True")
        return None
    if one_row_per_person:
        raise UserError("give privacy_unit or one_row_per_person=True, not both")
    found = folded(privacy_unit, columns) if isinstance(privacy_unit, str) else None
    if found is None:
        raise UnknownColumnError(f"unknown privacy unit {privacy_unit!r}: the table's columns "
                                 f"are {list(columns)}")
    return found


def _check_table_name(name: str) -> str:
    if not isinstance(name, str) or not name.isidentifier():
        raise UserError(f"table must be a simple name such as 'data', got {name!r}")
    return name


def _existing(path: str | os.PathLike[str]) -> str:
    text = os.fspath(path)
    if "*" not in text and not Path(text).exists():
        raise UserError(f"data file not found: {text}")
    return text


def _given_unit_caps(plan: Plan, rows: int | str | None,
                    sums: Mapping[str, float | str] | None) -> Plan:
    """The plan with the caps on each unit's total that ``sql`` was given ("auto", or a
    column left out: chosen from the data)."""
    if sums is not None and not isinstance(sums, Mapping):
        raise UserError("max_unit_sums must map columns to positive numbers (or 'auto')")
    given = {str(c): v for c, v in (sums or {}).items() if v != AUTO}
    try:
        if rows is not None and rows != AUTO:
            plan = plan.replace(max_unit_rows=rows)
        if given:
            plan = plan.replace(max_unit_sums=tuple(given.items()))
    except QueryError as exc:
        raise UserError(str(exc)) from None
    return plan
