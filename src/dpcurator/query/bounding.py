"""Contribution bounding: what each privacy unit may contribute, and the sensitivities it gives.

This module describes bounding as data (``BoundedQuery``) that any engine runs, and derives
every measure's sensitivity from the bounds alone. The engine computes, per partition, exact
integer *measures* (fixed-point sums of bounded contributions); the curator adds noise.

The bounding, stage by stage (the engine follows these stages; shapes in brackets):

1. ``rows`` [one row per input row passing WHERE; rows without a privacy unit are dropped]:
   each value is clamped to [lo, hi], centred, and rounded to a power-of-two grid: an integer
   of magnitude at most ``ValueSpec.bound``.
2. ``pairs`` [one row per (unit, partition)]: the unit's rows there are capped at
   r = max_rows_per_partition:
   - ``sample``: r rows chosen uniformly at random: each row gets a keyed random priority,
     a hash of its content and of a copy index numbering identical rows (so the choice is
     uniform over rows, not over contents), and the r smallest are kept; every aggregate of
     the pair is computed over the same kept rows;
   - ``rescale`` (default): all rows, weighted by min(1, r / n) -- the expected value of the
     random choice, with the same bound and no sampling noise.
3. ``units`` [one row per unit]: the unit's partitions are capped at k = max_partitions:
   - ``sample`` (always used for private keys): k partitions chosen uniformly at random
     (smallest keyed hashes of (unit, partition key), ties broken by the key: exactly
     min(m, k) partitions are kept);
   - ``rescale``: all partitions, weighted by min(1, k / m) for a unit with m partitions;
   - ``select`` (``bounding="unit"`` with private keys): every partition kept for the
     measures, whose outer caps bound the unit's whole contribution; the first k in the
     keyed order (as ``sample`` keeps them) are the only ones where the unit is counted for
     the private selection (``selection_units``).
4. the final aggregation [one row per partition]: exact integer sums of contributions.

Why the sensitivity holds (add/remove one unit u): every unit's bounded contribution is a
function of *that unit's rows only* and of the per-query secret key -- never of row order,
row numbers or other units -- so adding u changes the measures by u's contribution alone.
In one partition that contribution is at most ``B = r * (per-row bound)`` in absolute value;
over partitions its L1 norm is at most ``k * B`` (rescale: sum of k/m over m partitions is k)
and its L2 norm at most ``sqrt(k) * B`` (rescale: m (k/m)^2 <= k when m > k). The rescale
weights' divisions are exact and truncate toward zero, which never increases a magnitude
(the partition rescale runs in DOUBLE, exact because |a k| < 2^52; see the DuckDB engine).
Sums are integers (fixed point), so floating-point summation cannot exceed these bounds.

The one measure outside the caps, ``unit_rows`` (the outer-capped count behind a ``total``
interval), weighs each of a unit's rows by min(1, M / T), T the unit's rows in all its pairs,
truncating each pair's part: the unit's parts sum to at most M (its L1 norm; its L2 norm is
no larger), whatever its rows, so its sensitivity is M times its weight. ``unit_values``
divides each pair's exact sum P by 2^j, A <= V 2^j with A the unit's exact sum of |value|:
sum over pairs of |P| / 2^j <= A / 2^j <= V, truncation only lowering each part.

These two are also the measures of ``bounding="unit"`` (``Plan.bounding``): COUNT(*) and
SUM under caps on each unit's total instead of the caps per partition (stages 2 and 3 keep
every row of every pair: partitions ``none``, or with private keys ``select``, where the
partition cap k applies to the selection's count of units alone). The measures' vector over
all partitions moves by at most M (or V) in L1, and the selection, a mechanism of its own on
the units counted in at most k partitions each, releases partitions that hold data; the
measures released on them are that vector restricted to the selection's output
(post-processing of the two, which compose). So the count's own noise cannot select the
partitions here (a unit's count reaches all its partitions, not k): the selection is always
the separate step.
The bound is Tumult Analytics' ``MaxRowsPerID`` truncation's (rows per identifier in all),
here as the expected value of a uniform choice of M rows (each row weighted min(1, M / T))
rather than a sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from dpcurator.errors import InternalError
from dpcurator.query.plan import GroupKey, PublicKeys

__all__ = [
    "OUTER_KINDS",
    "BoundedQuery",
    "HistogramSpec",
    "MeasureKind",
    "MeasureSpec",
    "Mode",
    "ValueSpec",
    "isqrt_ceil",
]

Mode = Literal["rescale", "sample", "none", "select"]
MeasureKind = Literal["rows", "units", "present", "values", "squares", "unit_rows",
                      "unit_values"]
#: the measures outside the caps, each under an outer cap of its own (``MeasureSpec``)
OUTER_KINDS = ("unit_rows", "unit_values")

MAX_VALUE_BITS = 52  # per-row fixed-point magnitudes stay below 2^52 (exact in double, BIGINT)
MAX_OUTER_BITS = 30  # n * outer stays within BIGINT for pairs of up to 2^33 rows


def isqrt_ceil(n: int) -> int:
    """ceil(sqrt(n)) exactly, for an integer n >= 0."""
    root = math.isqrt(n)
    return root if root * root == n else root + 1


@dataclass(frozen=True, slots=True)
class ValueSpec:
    """A per-row fixed-point value: round(f(clamp(x, lo, hi) - center) * scale).

    f is the identity, or the square (``square``). The engine evaluates exactly these double
    operations, each monotone (correctly rounded subtraction, multiplication, and rounding to
    an integer), so every value's magnitude is at most ``bound``, computed here with the same
    operations on the bounds and rounded up. One integer unit is worth 1 / scale.
    """

    column: str
    lo: float
    hi: float
    center: float
    scale: float
    square: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lo) and math.isfinite(self.hi) and self.lo < self.hi):
            raise InternalError("ValueSpec needs finite lo < hi; this is probably a bug")
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise InternalError("ValueSpec needs a positive finite scale; this is a bug")
        if self.bound >= 2**MAX_VALUE_BITS:
            raise InternalError("fixed-point values would exceed 2^52; this is a bug")

    def _transform(self, value: float) -> float:
        centred = value - self.center
        return centred * centred if self.square else centred

    @property
    def bound(self) -> int:
        """The largest |fixed-point value| any row can have."""
        worst = max(abs(self._transform(self.lo)), abs(self._transform(self.hi)))
        return math.ceil(worst * self.scale)


@dataclass(frozen=True, slots=True)
class MeasureSpec:
    """One exact integer aggregate per partition.

    - ``rows``: rows (COUNT(*)), each worth ``weight`` integer units;
    - ``units``: distinct units (COUNT(DISTINCT unit)), each worth ``weight``;
    - ``present``: rows whose ``value`` is not NULL/NaN, each worth ``weight``;
    - ``values`` / ``squares``: the sum of ``value`` (fixed point; ``weight`` is 1);
    - ``unit_rows``: rows under an *outer* cap instead of the query's caps: a unit with T rows
      in all (its pairs, every partition) counts each of its n rows in a partition as
      min(1, ``outer`` / T), the pair's ``n * outer // T`` truncated (so at most ``outer`` rows
      over all partitions, and exactly its rows when T <= ``outer``); the measure of the
      *unbounded* COUNT(*) behind a ``total`` interval (``dpcurator.curator._total``);
    - ``unit_values``: the sum of ``value`` (clamped to [-V, V], fixed point) under an outer
      cap on the unit's absolute sum instead of the query's caps: with A the unit's sum of
      |value| over all its pairs (exact), the smallest power of two 2^j with A <= ``outer``
      2^j divides each pair's exact sum (truncated toward zero), so the unit's parts sum to
      at most ``outer`` in absolute value, and are its exact sums when A <= ``outer``
      (``outer`` is the value's ``bound``; ``weight`` is 1): the unbounded SUM's measure.

    Under partition rescaling a unit's weight is multiplied by k / m and truncated, so the
    weight's size sets the resolution of the fractional contributions.
    """

    name: str
    kind: MeasureKind
    value: ValueSpec | None = None
    weight: int = 1
    outer: int = 0

    def __post_init__(self) -> None:
        needs_value = self.kind in ("present", "values", "squares", "unit_values")
        if needs_value != (self.value is not None):
            raise InternalError(f"measure {self.name} of kind {self.kind} has the wrong value "
                                "spec; this is probably a bug")
        if not 1 <= self.weight < 2**MAX_VALUE_BITS:
            raise InternalError("measure weight out of range; this is probably a bug")
        if (self.kind in OUTER_KINDS) != (self.outer > 0) or (
                self.kind == "unit_rows" and self.outer * self.weight >= 2**MAX_OUTER_BITS) or (
                self.kind == "unit_values" and (self.weight != 1 or self.value is None
                                                or self.value.bound != self.outer)):
            raise InternalError(f"measure {self.name}: an outer cap goes with unit_rows (below "
                                "2^30 units) or unit_values (its value's bound) only; this is "
                                "probably a bug")


@dataclass(frozen=True, slots=True)
class HistogramSpec:
    """Counts of bounded rows per bin of ``column``, its values clamped to [lo, hi].

    ``bins`` equal bins of [lo, hi]: x falls in bin min(bins - 1, floor((x - lo) bins /
    (hi - lo))). With ``integers`` (an integer column; lo, hi integers, hi - lo <= bins), one
    bin per integer: x falls in bin min(bins - 1, floor(x - lo + 1/2)), exact in doubles
    (|lo|, |hi| <= 2^50): bin b holds lo + b, the last bin the rest up to hi.
    """

    name: str
    column: str
    lo: float
    hi: float
    bins: int
    integers: bool = False

    def __post_init__(self) -> None:
        if self.integers and not (self.lo == math.floor(self.lo) and self.hi == math.floor(
                self.hi) and 0 <= self.hi - self.lo <= self.bins
                and max(abs(self.lo), abs(self.hi)) <= 2.0**50):
            raise InternalError(f"histogram {self.name}: one bin per integer needs integer "
                                "bounds at most bins apart; this is a bug")


@dataclass(frozen=True, slots=True)
class BoundedQuery:
    """An engine-neutral bounded aggregation: everything an engine needs, nothing private.

    ``unit`` is the privacy unit column (None: each row is its own unit). ``rows_mode`` and
    ``partitions_mode`` choose the caps of stages 2 and 3 (``"none"`` when a stage cannot
    bind: row-level privacy, or a single global partition). ``selection_units`` asks for the
    integer number of distinct (kept) units per partition, for private partition selection.

    ``profile`` (with no measures or histograms) asks instead for the shape of the units'
    contributions, from which contribution bounds are chosen under DP
    (``dpcurator.curator._auto_bounds``): pairs counted by (the unit's number of partitions,
    the pair's number of rows), and, for each named column, its non-missing values counted by
    (the same two numbers, sign, power-of-two bucket of the magnitude); with
    ``profile_totals``, the pairs also by the unit's number of rows in all (for the outer cap
    of a total interval or ``bounding="unit"``'s cap on a unit's rows). The numbers are rounded
    up: a unit's partitions and rows to a power of two above 8, a pair's rows and a unit's
    rows in all to ``UNIT_TOTALS`` (eight steps an octave) above 16. For each column of
    ``profile_sums``, the pairs are also counted by (the unit's partitions, the bucket of the
    unit's sum of |value|), for the outer cap of a total SUM. ``profile_means``: the pairs also
    by the octave of their rows' mean |value| of the first profiled column (for a SUM's row cap:
    ``dpcurator.curator._auto_aims.value_factors``).
    """

    unit: str | None
    group_keys: tuple[GroupKey, ...]
    where: str | None
    keys: PublicKeys | None
    max_partitions: int
    max_rows_per_partition: int
    rows_mode: Mode
    partitions_mode: Mode
    measures: tuple[MeasureSpec, ...]
    histograms: tuple[HistogramSpec, ...] = ()
    selection_units: bool = False
    profile: tuple[str, ...] | None = None
    profile_sums: tuple[str, ...] = ()
    profile_means: bool = False
    profile_totals: bool = False

    def __post_init__(self) -> None:
        if self.profile is not None and (self.measures or self.histograms):
            raise InternalError("a profile query has no measures; this is a bug")
        if self.profile_sums and (self.profile is None or self.unit is None):
            raise InternalError("units' sums are profiled with a unit only; this is a bug")
        if self.profile_totals and self.profile is None:
            raise InternalError("the units' totals are profiled with a profile; this is a bug")
        if self.profile_means and not self.profile:
            raise InternalError("the pairs' means need a profiled column; this is a bug")
        if self.unit is None and (self.rows_mode != "none" or self.partitions_mode != "none"):
            raise InternalError("row-level bounding has no caps to apply; this is a bug")
        if self.selection_units and self.partitions_mode == "rescale":
            raise InternalError("partition selection needs a hard partition cap; this is a bug")
        if self.histograms and "rescale" in (self.rows_mode, self.partitions_mode):
            raise InternalError("histograms need sampled bounding; this is a bug")
        if self.partitions_mode == "select" and (
                self.unit is None or any(m.kind not in OUTER_KINDS for m in self.measures)):
            raise InternalError("partitions are kept whole for outer-capped measures only; "
                                "this is a bug")
        if any(m.kind in OUTER_KINDS for m in self.measures) and self.rows_mode != "rescale":
            # (its weights ignore a partition rescale; a hard partition cap keeps a subset of
            # the unit's pairs, whose parts still sum to at most the outer cap)
            raise InternalError("an outer cap needs every row of every pair; this is a bug")

    @property
    def rows_cap(self) -> int:
        """r as it binds: 1 under row-level privacy."""
        return 1 if self.unit is None else self.max_rows_per_partition

    @property
    def partitions_cap(self) -> int:
        """k as it binds: 1 with one global partition or row-level privacy; at most the
        number of public keys."""
        if self.unit is None or not self.group_keys:
            return 1
        if self.keys is not None:
            return min(self.max_partitions, len(self.keys))
        return self.max_partitions

    def per_partition_bound(self, measure: MeasureSpec) -> int:
        """The most one unit's contribution to one partition can be, in the measure's units."""
        one = measure.weight
        if measure.kind in OUTER_KINDS:
            return measure.outer * one
        if measure.kind == "units":
            return one
        if measure.kind in ("rows", "present"):
            return self.rows_cap * one
        assert measure.value is not None
        return self.rows_cap * measure.value.bound

    def l1_sensitivity(self, measure: MeasureSpec) -> int:
        """Bound on the L1 norm of one unit's contribution over all partitions."""
        if measure.kind in OUTER_KINDS:  # the unit's parts sum to at most outer
            return measure.outer * measure.weight
        return self.partitions_cap * self.per_partition_bound(measure)

    def l2_sensitivity(self, measure: MeasureSpec) -> int:
        """Bound on the L2 norm of one unit's contribution, rounded up to an integer."""
        bound = self.per_partition_bound(measure)
        if measure.kind in OUTER_KINDS:  # L2 <= L1
            return bound
        return isqrt_ceil(self.partitions_cap * bound * bound)
