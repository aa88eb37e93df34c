"""Query plans: frozen, self-validating descriptions of a DP aggregate query.

A ``Plan`` says *what* to compute (aggregates, grouping, filter, keys) and *how each privacy
unit's influence is bounded* (``max_partitions``, ``max_rows_per_partition``, clamping bounds,
bounding mode). It says nothing about how much privacy to spend: that is the curator's
request. Both front ends, the Python builder (``Query``) and DP SQL (``parse_sql``), produce
plans, and the same question asked both ways gives equal plans.

Scalar expressions (the WHERE predicate, computed group keys) are stored as canonical SQL
text produced by sqlglot after ``dpcurator.query.expressions`` checked that they use only the
DP-safe scalar subset; engines parse that text again and write it in their own dialect.

Every dataclass here validates itself in ``__post_init__`` and raises a ``QueryError`` or
``BoundsError`` naming the bad parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from dpcurator.query.errors import BoundsError, QueryError
from dpcurator.query.joins import JoinSource

__all__ = [
    "AUTO",
    "INTERVAL_KINDS",
    "Aggregate",
    "AutoBounds",
    "BoundingMode",
    "Bounds",
    "Count",
    "CountUnits",
    "GroupKey",
    "IntervalKind",
    "Mean",
    "Plan",
    "PublicKeys",
    "Quantile",
    "Sum",
    "Variance",
]

BoundingMode = Literal["rescale", "sample", "unit"]
_BOUNDING_MODES = ("rescale", "sample", "unit")
IntervalKind = Literal["bounded", "total"]
MAX_UNIT_SUM = 2.0**49.75  # a total SUM's outer cap: the profile's largest bucket (below 1e15)
INTERVAL_KINDS = ("bounded", "total")
# Contribution bounds are capped so that fixed-point arithmetic in the engine cannot overflow
# (values times rows times weights stay below 2^127 in HUGEINT arithmetic).
MAX_CONTRIBUTIONS = 1 << 20
# Clamping bounds: magnitudes up to 1e15 (below 2^52, where doubles still hold every integer
# and the fixed-point values and their squares stay finite and exact enough), and at least
# 1e-100 apart (the fixed-point scale of a value, and of its square, stays a finite double).
MAX_BOUND = 1e15
MIN_BOUND_WIDTH = 1e-100


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name or not name.strip():
        raise QueryError(f"{what} must be a non-empty string, got {name!r}")
    if name.startswith("__"):
        raise QueryError(f"{what} must not start with '__' (reserved), got {name!r}")
    return name


def _check_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        import numpy as np

        if not isinstance(value, np.integer | np.floating):
            raise BoundsError(f"{name} must be a number, got a {type(value).__name__}")
        value = float(value)
    number = float(value)
    if math.isnan(number) or math.isinf(number):
        raise BoundsError(f"{name} must be a finite number, got {number!r}")
    return number


@dataclass(frozen=True, slots=True)
class Bounds:
    """Clamping bounds [lo, hi] for a numeric column: values are clamped into them first.

    They must be chosen without looking at the data (or from public knowledge): the noise is
    calibrated to them, so they are part of the privacy guarantee.
    """

    lo: float
    hi: float

    def __post_init__(self) -> None:
        lo = _check_number("lower bound", self.lo)
        hi = _check_number("upper bound", self.hi)
        if not lo < hi:
            raise BoundsError(f"bounds must satisfy lo < hi, got lo={lo!r}, hi={hi!r}")
        for name, value in (("lower bound", lo), ("upper bound", hi)):
            if abs(value) > MAX_BOUND:
                raise BoundsError(
                    f"the {name} {value:g} is too large: the largest allowed magnitude is "
                    f"{MAX_BOUND:g} (values are summed exactly in 52-bit fixed point); "
                    "change the column's unit, for example thousands instead of units")
        if hi - lo < MIN_BOUND_WIDTH:
            raise BoundsError(f"bounds lo={lo!r}, hi={hi!r} are too close: hi - lo must be at "
                              f"least {MIN_BOUND_WIDTH:g}; change the column's unit")
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)

    @classmethod
    def of(cls, value: Any, column: str = "column") -> Bounds:
        """Bounds from a Bounds, or a (lo, hi) pair; a BoundsError naming ``column`` if bad."""
        if isinstance(value, Bounds):
            return value
        if isinstance(value, str | bytes) or not hasattr(value, "__len__") or len(value) != 2:
            raise BoundsError(f"bounds for {column!r} must be a pair (lo, hi), got "
                              f"a {type(value).__name__}")
        lo, hi = value
        try:
            return cls(lo, hi)
        except BoundsError as exc:
            raise BoundsError(f"bounds for {column!r}: {exc}") from None

    @property
    def magnitude(self) -> float:
        """max(|lo|, |hi|): the largest absolute value a clamped value can take."""
        return max(abs(self.lo), abs(self.hi))

    @property
    def midpoint(self) -> float:
        return self.lo / 2 + self.hi / 2


@dataclass(frozen=True, slots=True)
class Count:
    """COUNT(*): rows per partition (each unit contributes at most max_rows_per_partition)."""

    name: str = "count"

    def __post_init__(self) -> None:
        _check_name(self.name, "aggregate name")

    column: None = field(default=None, init=False)
    bounds: None = field(default=None, init=False)


@dataclass(frozen=True, slots=True)
class CountUnits:
    """COUNT(DISTINCT privacy unit): distinct units per partition (each counts at most once)."""

    name: str = "count_units"

    def __post_init__(self) -> None:
        _check_name(self.name, "aggregate name")

    column: None = field(default=None, init=False)
    bounds: None = field(default=None, init=False)


@dataclass(frozen=True, slots=True)
class _ColumnAggregate:
    column: str
    bounds: Bounds | None = None
    name: str = ""

    def __post_init__(self) -> None:
        _check_name(self.column, "column")
        if not self.name:
            object.__setattr__(self, "name", f"{self._prefix()}_{self.column}")
        _check_name(self.name, "aggregate name")
        if self.bounds is not None:
            object.__setattr__(self, "bounds", Bounds.of(self.bounds, self.column))

    def _prefix(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Sum(_ColumnAggregate):
    """SUM(column) of values clamped to ``bounds``."""

    def _prefix(self) -> str:
        return "sum"


@dataclass(frozen=True, slots=True)
class Mean(_ColumnAggregate):
    """AVG(column): noisy sum of clamped values (centred) over a noisy count."""

    def _prefix(self) -> str:
        return "mean"


@dataclass(frozen=True, slots=True)
class Variance(_ColumnAggregate):
    """VARIANCE(column) (population variance of clamped values), or STDDEV with ``std``."""

    std: bool = False

    def _prefix(self) -> str:
        return "stddev" if self.std else "variance"


@dataclass(frozen=True, slots=True)
class Quantile(_ColumnAggregate):
    """The q-quantile of the clamped values (q = 0.5 is the median), from a noisy dyadic tree
    of counts over 1024 equal bins of ``bounds`` (see ``dpcurator.curator._quantiles``).

    ``integer``: the column's type holds only integers (set by the curator from the table's
    schema, which is public). Where ``bounds`` hold at most 1025 integers, its values are then
    clamped to those integers, each bin holds one integer, and the estimate lands on the
    integer wherever the noisy counts put the rank inside that integer's rows.
    """

    q: float = 0.5
    integer: bool = False

    def __post_init__(self) -> None:
        q = self.q
        if isinstance(q, bool) or not isinstance(q, int | float) or not 0.0 <= float(q) <= 1.0:
            raise QueryError(f"quantile q must be a number in [0, 1], got {q!r}")
        object.__setattr__(self, "q", float(q))
        if not isinstance(self.integer, bool):
            raise QueryError(f"quantile integer must be True or False, got {self.integer!r}")
        _ColumnAggregate.__post_init__(self)

    def _prefix(self) -> str:
        return "median" if self.q == 0.5 else f"quantile_{self.q:g}".replace(".", "_")


Aggregate = Count | CountUnits | Sum | Mean | Variance | Quantile


@dataclass(frozen=True, slots=True)
class GroupKey:
    """One GROUP BY key: an output column ``name`` computed by a scalar SQL ``expression``.

    ``labels`` is the set of values the expression can take when that set is fixed by the
    query alone (bins written with CASE ... THEN 'literal', or width_bucket); such keys are
    public and need no partition selection.
    """

    name: str
    expression: str
    labels: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        _check_name(self.name, "group key name")
        if not isinstance(self.expression, str) or not self.expression.strip():
            raise QueryError(f"group key {self.name!r} needs a SQL expression")
        if self.labels is not None:
            labels = tuple(self.labels)
            if not labels:
                raise QueryError(f"group key {self.name!r} has an empty label set")
            object.__setattr__(self, "labels", labels)


@dataclass(frozen=True, slots=True)
class PublicKeys:
    """The partitions to release, known without looking at the data.

    ``values`` holds one tuple per partition, in group key order. Partitions absent from the
    data are released as noise around zero; partitions not listed are never released.
    """

    values: tuple[tuple[Any, ...], ...]

    def __post_init__(self) -> None:
        rows = tuple(tuple(v) for v in self.values)
        if not rows:
            raise QueryError("keys must list at least one partition")
        width = len(rows[0])
        if any(len(r) != width for r in rows):
            raise QueryError("every key must have one value per group key")
        if len(set(rows)) != len(rows):
            raise QueryError("keys must not repeat a partition")
        object.__setattr__(self, "values", rows)

    def __len__(self) -> int:
        return len(self.values)


AUTO = "auto"
#: The share of a query's budget spent choosing its bounds, where neither the query nor the
#: curator states one.
DEFAULT_AUTO_SHARE = 0.1


@dataclass(frozen=True, slots=True)
class AutoBounds:
    """Contribution bounds the curator chooses from the data, under DP, for a query.

    Asked for with ``"auto"``: ``bounds="auto"`` (``open``: every bound that neither the query
    nor the curator gives), ``bounds={"x": "auto"}`` (``columns``), ``max_partitions="auto"``,
    ``max_rows_per_partition="auto"``. Choosing them spends ``share`` of the query's epsilon
    (or rho): the query's if it states one, else the curator's, else 10%
    (``spent_share``); see ``dpcurator.curator._auto_bounds``. Bounds given explicitly always
    win.
    After the curator resolves a plan, ``open`` is False and the flags name exactly what will
    be chosen.
    """

    max_partitions: bool = False
    max_rows_per_partition: bool = False
    columns: tuple[str, ...] = ()
    open: bool = False
    share: float | None = None
    unit_rows: bool = False  # a total interval's outer cap (paid from its own share)
    unit_sums: tuple[str, ...] = ()  # a total SUM's outer caps, per column (the same)

    def __post_init__(self) -> None:
        share = self.share
        if share is not None:
            if isinstance(share, bool) or not isinstance(share, int | float) or \
                    not 0.0 < float(share) < 1.0:
                raise QueryError(f"the share of the budget spent choosing bounds must be a "
                                 f"number in (0, 1), got {share!r}")
            object.__setattr__(self, "share", float(share))
        object.__setattr__(self, "columns", tuple(str(c) for c in self.columns))

    @property
    def spent_share(self) -> float:
        """The share of the query's budget that choosing the bounds spends."""
        return DEFAULT_AUTO_SHARE if self.share is None else self.share

    def merged(self, other: AutoBounds | None) -> AutoBounds:
        """What either asks for (this one's share, where it states one)."""
        if other is None:
            return self
        return AutoBounds(self.max_partitions or other.max_partitions,
                          self.max_rows_per_partition or other.max_rows_per_partition,
                          tuple(dict.fromkeys([*self.columns, *other.columns])),
                          self.open or other.open,
                          self.share if self.share is not None else other.share,
                          self.unit_rows or other.unit_rows,
                          tuple(dict.fromkeys([*self.unit_sums, *other.unit_sums])))

    def wants_column(self, column: str) -> bool:
        return self.open or column.lower() in {c.lower() for c in self.columns}

    @property
    def choices(self) -> int:
        """How many bounds are chosen from the bounds' share (two per column: lower and
        upper); ``unit_rows`` is paid from the total interval's share."""
        return int(self.max_partitions) + int(self.max_rows_per_partition) + \
            2 * len(self.columns)


def auto_options(bounds: Any, max_partitions: Any, max_rows_per_partition: Any
                 ) -> tuple[Any, int | None, int | None, AutoBounds | None]:
    """Split user options into explicit ones and what is asked to be chosen ("auto").

    Returns (bounds mapping without "auto" entries, or None; max_partitions or None;
    max_rows_per_partition or None; the AutoBounds asked for, or None)."""
    auto = AutoBounds()
    wanted = False
    if isinstance(bounds, str):
        if bounds != AUTO:
            raise BoundsError(f"bounds must be a mapping {{column: (lo, hi)}} or 'auto', got "
                              f"{bounds!r}")
        auto, wanted, bounds = AutoBounds(open=True), True, None
    elif hasattr(bounds, "items"):
        chosen = [str(c) for c, v in bounds.items() if isinstance(v, str) and v == AUTO]
        if chosen:
            auto, wanted = auto.merged(AutoBounds(columns=tuple(chosen))), True
            bounds = {c: v for c, v in bounds.items() if not (isinstance(v, str) and v == AUTO)}
    caps: list[int | None] = []
    flags: list[bool] = []
    for value in (max_partitions, max_rows_per_partition):
        if isinstance(value, str) and value == AUTO:
            caps.append(None)
            flags.append(True)
            wanted = True
        else:
            caps.append(value)
            flags.append(False)
    if flags[0] or flags[1]:
        auto = auto.merged(AutoBounds(flags[0], flags[1]))
    return bounds, caps[0], caps[1], auto if wanted else None


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise QueryError(f"{name} must be a positive integer, got {value!r}")
    if value > MAX_CONTRIBUTIONS:
        raise QueryError(f"{name} must be at most {MAX_CONTRIBUTIONS}, got {value!r}")
    return int(value)


@dataclass(frozen=True, slots=True)
class Plan:
    """A DP aggregate query: aggregates per partition, with per-unit contribution bounds.

    - ``aggregates``: what to release per partition (unique names).
    - ``group_by``: the partition keys (empty: one global partition).
    - ``where``: a row filter (canonical SQL), applied before bounding.
    - ``keys``: public partitions, or None. With None and group keys that are not all binned,
      the partitions are private and the curator selects them privately (needs delta > 0).
    - ``max_partitions``, ``max_rows_per_partition``: each privacy unit contributes to at
      most this many partitions, and at most this many rows in each (``None``: the curator's
      defaults). Their product and the bounds give every aggregate's sensitivity.
    - ``auto``: the bounds to choose from the data under DP (``AutoBounds``).
    - ``bounding``: None (the curator's, else ``"unit"`` for COUNT(*) and SUM with every
      bound left to the data and public keys, else ``"rescale"``:
      ``dpcurator.curator._resolve.default_bounding``), ``"rescale"`` (a unit over a
      cap contributes the *expected*
      contribution of a uniformly random choice within the cap, with the same sensitivity and
      less variance), ``"sample"`` (a uniformly random choice of rows and partitions), or
      ``"unit"``: caps on each unit's *total* over all partitions instead of the two caps
      per partition, for COUNT(*) and SUM only: at most ``max_unit_rows`` rows in all (a
      unit with T rows counts each as min(1, M / T)) and a sum of |value| of at most
      ``max_unit_sums[column]`` (a unit above it divided by the least power of two that
      brings it within), each given or chosen from the data. Where a unit's rows spread
      over several partitions this costs M noise where the two caps cost k r (the
      sensitivity argument: ``dpcurator.query.bounding``); ``max_partitions`` then only
      caps the partitions a unit adds to a private selection.
    - ``intervals``: what the intervals of COUNT(*) and SUM cover: ``"bounded"`` (the answer
      after the caps and the clamping) or ``"total"`` (the answer without them, for units of
      at most ``max_unit_rows`` rows and ``max_unit_sums`` in all;
      ``dpcurator.curator._total``); None: the curator's default (``"bounded"``
      unless the curator was made with another).
    - ``max_unit_rows``: the outer cap of a ``"total"`` interval, or the cap of
      ``bounding="unit"`` (None: chosen from the data).
    - ``max_unit_sums``: ((column, V), ...): the outer cap of a total SUM over the column, or
      the cap of a SUM under ``bounding="unit"``, on a unit's sum of |value| (a column not
      named: chosen from the data).
    - ``total_share``: the share of the query's budget the total intervals spend, in (0, 1)
      (None: the curator's, else 10%).
    - ``source``: the joined tables the query reads, over a curator's schema (None: the
      curator's one table); its columns are the joined rows' (``dpcurator.query.joins``).
    - ``tables``: the builder's FROM clause over a schema (``Query.from_``, ``join``), which
      the curator turns into ``source`` (``joins.flatten_plan``) when it resolves the plan.
    """

    aggregates: tuple[Aggregate, ...]
    group_by: tuple[GroupKey, ...] = ()
    where: str | None = None
    keys: PublicKeys | None = None
    max_partitions: int | None = None
    max_rows_per_partition: int | None = None
    bounding: BoundingMode | None = None
    auto: AutoBounds | None = None
    intervals: IntervalKind | None = None
    max_unit_rows: int | None = None
    max_unit_sums: tuple[tuple[str, float], ...] = ()
    total_share: float | None = None
    source: JoinSource | None = None
    tables: str | None = None

    def __post_init__(self) -> None:
        if self.tables is not None and (not isinstance(self.tables, str) or
                                        not self.tables.strip()):
            raise QueryError("tables must be a FROM clause (text) or None")
        if self.source is not None and not isinstance(self.source, JoinSource):
            raise QueryError("source must be a JoinSource (from DP SQL over a schema) or None")
        if self.auto is not None and not isinstance(self.auto, AutoBounds):
            raise QueryError("auto must be an AutoBounds value or None")
        aggregates = tuple(self.aggregates)
        if not aggregates:
            raise QueryError("a query needs at least one aggregate (COUNT, SUM, AVG, ...)")
        for agg in aggregates:
            if not isinstance(agg, Count | CountUnits | Sum | Mean | Variance | Quantile):
                raise QueryError(f"unknown aggregate {agg!r}")
        group_by = tuple(self.group_by)
        for key in group_by:
            if not isinstance(key, GroupKey):
                raise QueryError(f"group_by entries must be GroupKey, got {key!r}")
        names = [a.name for a in aggregates] + [k.name for k in group_by]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise QueryError(f"output column names must be unique; repeated: {duplicates}")
        if self.where is not None and (not isinstance(self.where, str) or not self.where):
            raise QueryError("where must be a SQL predicate string or None")
        if self.keys is not None:
            if not isinstance(self.keys, PublicKeys):
                raise QueryError("keys must be a PublicKeys value (use the builder or keys=)")
            if not group_by:
                raise QueryError("keys were given but the query has no GROUP BY")
            if len(self.keys.values[0]) != len(group_by):
                raise QueryError(f"each key must have {len(group_by)} value(s), one per group "
                                 f"key ({', '.join(k.name for k in group_by)})")
        if self.max_partitions is not None:
            _check_count("max_partitions", self.max_partitions)
        if self.max_rows_per_partition is not None:
            _check_count("max_rows_per_partition", self.max_rows_per_partition)
        if self.bounding is not None and self.bounding not in _BOUNDING_MODES:
            raise QueryError(f"bounding must be 'rescale', 'sample' or 'unit', got "
                             f"{self.bounding!r}")
        if self.intervals is not None and self.intervals not in INTERVAL_KINDS:
            raise QueryError(f"intervals must be 'bounded' or 'total', got {self.intervals!r}")
        if self.bounding == "unit":
            other = [a.name for a in aggregates if type(a) not in (Count, Sum)]
            if other:
                raise QueryError(f"bounding='unit' caps each unit's total rows and sums, "
                                 f"for COUNT(*) and SUM only; the aggregates {other} need the "
                                 "caps per partition: ask for them in a query of their own, "
                                 "or with bounding='rescale'")
            if self.intervals == "total":
                raise QueryError("bounding='unit' already answers for each unit's total "
                                 "(within max_unit_rows and max_unit_sums): its intervals are "
                                 "the bounded ones; leave intervals unset or 'bounded'")
        if self.max_unit_rows is not None:
            _check_count("max_unit_rows", self.max_unit_rows)  # at most 2^20 (< 2^30)
        sums = self.max_unit_sums
        if isinstance(sums, dict):
            sums = tuple(sums.items())
        if not isinstance(sums, tuple | list):
            raise QueryError("max_unit_sums must map columns to positive numbers")
        checked: dict[str, float] = {}
        for item in sums:
            if not isinstance(item, tuple | list) or len(item) != 2:
                raise QueryError("max_unit_sums must map columns to positive numbers")
            column = _check_name(item[0], "a max_unit_sums column")
            value = _check_number(f"max_unit_sums[{column!r}]", item[1])
            if not 0.0 < value <= MAX_UNIT_SUM:
                raise QueryError(f"max_unit_sums[{column!r}] must be in (0, {MAX_UNIT_SUM:g}], "
                                 f"got {item[1]!r}")
            checked[column] = value
        object.__setattr__(self, "max_unit_sums", tuple(sorted(checked.items())))
        if self.total_share is not None:
            share = self.total_share
            if isinstance(share, bool) or not isinstance(share, int | float) or \
                    not 0.0 < float(share) < 1.0:
                raise QueryError(f"total_share (the share of the budget the total intervals "
                                 f"spend) must be a number in (0, 1), got {share!r}")
            object.__setattr__(self, "total_share", float(share))
        object.__setattr__(self, "aggregates", aggregates)
        object.__setattr__(self, "group_by", group_by)

    @property
    def public_labels(self) -> PublicKeys | None:
        """The keys implied by binned group keys alone (cartesian product), if all are binned."""
        if not self.group_by or any(k.labels is None for k in self.group_by):
            return None
        rows: list[tuple[Any, ...]] = [()]
        for key in self.group_by:
            assert key.labels is not None
            rows = [(*r, label) for r in rows for label in key.labels]
            if len(rows) > 10_000_000:
                raise QueryError("the binned group keys have more than ten million "
                                 "combinations; use fewer bins")
        return PublicKeys(tuple(rows))

    @property
    def private_keys(self) -> bool:
        """True when partitions must be selected privately (no public keys, not all binned)."""
        return bool(self.group_by) and self.keys is None and self.public_labels is None

    def replace(self, **changes: Any) -> Plan:
        """A copy with some fields changed (validated again)."""
        values = {name: getattr(self, name) for name in (
            "aggregates", "group_by", "where", "keys", "max_partitions",
            "max_rows_per_partition", "bounding", "auto", "intervals", "max_unit_rows",
            "max_unit_sums", "total_share", "source", "tables")}
        values.update(changes)
        return Plan(**values)
