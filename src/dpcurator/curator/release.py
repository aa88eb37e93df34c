"""A release: the noisy answer to one query, with intervals, privacy spent and the plan.

Everything in a ``Release`` is safe to show: the values are noisy, the intervals are computed
from the noisy values and the (public) noise distributions, and the plan and SQL describe the
question, not the data. Intervals at any other level are free post-processing:
``release.to_pandas(intervals=True, confidence=0.9)``.

What is printed beside what. Every printed value (``to_pandas``, ``to_arrow``, ``to_dict``,
the CLI's table) has beside it *its own* interval: one that covers the quantity the value
estimates, and contains the value. A SUM's value is its bounded sum, with the bounded
interval; where the release also measured the sum without the caps and the clamping (a
``total`` SUM), that total is a different estimate, S~ (``totals``), printed as its own
column ``{name}_total`` with its own interval ([S~ - w, S~ + w]). A COUNT(*)'s total interval
stays beside its value: it is an interval of the same count without the caps, and it always
contains the value ([B~ - w_B, at least B~ + w_B], ``dpcurator.curator._total``).
``interval_kinds`` marks, per printed column, which kind of interval it has.

Interval methods, per aggregate (each covers the *bounded* aggregate: the answer after
clamping and contribution bounding, which equals the plain answer whenever no unit was over
its caps and no value outside its bounds), and the ``total`` intervals of COUNT(*) and SUM,
which cover the answer *without* the caps and the clamping wherever no unit has more than
``max_unit_rows`` rows in all (COUNT) or a sum of |value| above ``max_unit_sums[column]``
(SUM) (``interval_kinds`` says which kind each aggregate gives; ``dpcurator.curator._total``):

- COUNT, COUNT(DISTINCT unit): the shortest exact interval for the integer noise (at most one
  atom of the noise above the level; ``dpcurator.mechanisms._tails``). Where the noisy count
  also selected the private keys (``partition_selection`` says so), the interval is
  *conditional on the partition's release*: test inversion under the noise truncated at the
  threshold, so that partitions near the threshold, released because their noise was high,
  are still covered at the stated level.
- SUM: exact for the integer noise: P[|noise| > w] <= alpha.
- AVG: the centred mean r = S / C by its pivot: s~ - r c~ = Z_s - r Z_c has a known law at
  the true r, so the r in the bounds whose p-value P[|Z_s - r Z_c| >= |s~ - r c~|] exceeds
  alpha form a (1 - alpha) set, at its level rather than above it (no union bound, no box);
  computed with bounds that only widen it (``dpcurator.curator._ratio``).
- VARIANCE / STDDEV: VAR_POP = w - mu^2, with w = Q / C (centred second moment) by the same
  pivot at 0.95 alpha and mu at 0.05 alpha (union bound), over the range of w - mu^2.
- MEDIAN, QUANTILE_CONT / PERCENTILE_CONT, ``.quantile``: the release is a noisy dyadic tree
  of counts over 1024 equal bins of [lo, hi] (2047 nodes per partition, one noise mechanism
  for the whole tree); the value and the interval at every level are read from the same noisy
  CDF (see ``dpcurator.curator._quantiles``). The interval's ends are bin edges
  e_j = lo + j (hi - lo) / 1024, and it covers the *true quantile at the histogram's
  resolution*: with the n >= 1 bounded, clamped values sorted, x_(0) <= ... <= x_(n-1), and
  a = floor(q (n - 1)), b = ceil(q (n - 1)) (the order statistics between which SQL's
  QUANTILE_CONT lies), the interval contains the whole bins of x_(a) and x_(b), hence the
  sample quantile. The ends are searched in three stages, coarse to fine (grids of 64, 8 and 1
  bins, with 1%, 1% and 98% of alpha). Each end fails with probability at most alpha / 2: a
  stage's failure depends on the noise at one data-determined edge of its grid only (no union
  bound over edges, only over the three stages), bounded by a rigorous tail bound on that
  edge's noise (a sum of at most 11 node noises). Nothing is claimed for a partition with no
  rows, where the quantile is undefined. For a column whose type holds only integers, where
  [lo, hi] holds at most 1025 integers, the values are clamped to those integers, each bin
  holds one integer, the ends are integers, and the value is the integer wherever the noisy
  counts put the rank inside one integer's rows.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from dpcurator.accounting import ZCDP, ApproxDP, PureDP
from dpcurator.errors import UserError
from dpcurator.query.plan import Plan, Quantile

__all__ = ["Release", "check_confidence", "interval_columns", "total_columns"]

FloatArray = npt.NDArray[np.float64]


def check_confidence(confidence: float) -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, int | float) or \
            not 0.0 < float(confidence) < 1.0:
        raise UserError(f"confidence must be a number strictly between 0 and 1 (0.95 for a "
                        f"95% interval), got {confidence!r}")
    return float(confidence)


def total_columns(names: Sequence[str], sums: Sequence[str]) -> dict[str, str]:
    """The column printing each total SUM's own estimate: ``{name}_total``, with underscores
    added while that name is taken by another column (``names``: the group keys and the
    aggregates), so that no two printed columns share a name."""
    taken = set(names)
    out: dict[str, str] = {}
    for name in sums:
        column = f"{name}_total"
        while column in taken:
            column += "_"
        taken.add(column)
        out[name] = column
    return out


def interval_columns(names: Sequence[str], printed: Sequence[str]
                     ) -> dict[str, tuple[str, str]]:
    """The columns printing each printed value's interval in a table (``to_pandas``,
    ``to_arrow``): ``{name}_low`` and ``{name}_high``, with underscores added while that
    name is taken by another column (``names``: every column of the table), as
    ``total_columns`` names the totals, so that no column is written over another (a bug
    hunt: ``COUNT(*) AS income_low`` beside ``AVG(income) AS income`` lost the count)."""
    taken = set(names)
    out: dict[str, tuple[str, str]] = {}
    for name in printed:
        ends = []
        for end in ("low", "high"):
            column = f"{name}_{end}"
            while column in taken:
                column += "_"
            taken.add(column)
            ends.append(column)
        out[name] = (ends[0], ends[1])
    return out


def _arrow_keys(values: list[Any]) -> Any:
    """A group column as Arrow: integer keys beyond BIGINT (a UBIGINT hash, a HUGEINT) as
    UBIGINT where they fit, else as DECIMAL(38, 0) or DECIMAL(76, 0), exactly (pyarrow's
    own inference raised OverflowError after the release was charged; a bug hunt)."""
    import decimal

    import pyarrow as pa

    try:
        return pa.array(values)
    except OverflowError:
        if not all(v is None or (isinstance(v, int) and not isinstance(v, bool))
                   for v in values):
            raise
    if all(v is None or 0 <= v < 2**64 for v in values):
        return pa.array(values, type=pa.uint64())
    digits = 38 if all(v is None or abs(v) < 10**38 for v in values) else 76
    kind = pa.decimal128(digits, 0) if digits == 38 else pa.decimal256(digits, 0)
    return pa.array([None if v is None else decimal.Decimal(v) for v in values], type=kind)


@dataclass(frozen=True, eq=False)
class Release:
    """The noisy answer to one DP query.

    - ``keys``: one tuple per released partition; ``group_columns`` names their entries.
    - ``values``: aggregate name -> noisy values (one per partition).
    - ``privacy``: the guarantee this release cost (what the budget was charged).
    - ``plan``: the resolved plan; ``sql``: the statements the engine ran.
    - ``confidence``: the default interval level.
    - ``totals``: per SUM whose release measured its total (the sum without the caps and the
      clamping, for units under the outer cap ``max_unit_sums``), that total's own estimate
      S~, printed as the column ``total_columns[name]`` (``{name}_total``) with its own
      interval (``interval(name, kind="total")``); ``values[name]`` is the bounded sum.
    - ``warnings``: plain sentences on what this release cannot vouch for, or which stated
      rule it used (a user's outer cap below the caps, a total with its own estimate, ...).
      They hold public numbers only (caps, bounds, epsilons, counts of partitions), never a
      record; ``to_dict`` has them as a list under ``"warnings"``.
    """

    keys: tuple[tuple[Any, ...], ...]
    group_columns: tuple[str, ...]
    values: dict[str, FloatArray]
    privacy: PureDP | ApproxDP | ZCDP
    plan: Plan
    sql: tuple[str, ...]
    confidence: float
    mechanisms: dict[str, list[dict[str, Any]]]
    _intervals: Any  # callable(name, alpha, total) -> (low, high) arrays
    secure: bool = True
    from_cache: bool = False
    kinds: tuple[tuple[str, str], ...] = ()  # per aggregate: "total" or "bounded"
    # the curator's own stages, apart from the aggregates' names (``mechanisms``' keys)
    selection: dict[str, Any] | None = None
    chosen: dict[str, Any] | None = None
    totals: dict[str, FloatArray] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    # -- shape ---------------------------------------------------------------------------------

    @property
    def columns(self) -> tuple[str, ...]:
        """The printed columns: group keys, then each aggregate (and its total's column)."""
        return self.group_columns + tuple(self.interval_kinds)

    @property
    def total_columns(self) -> dict[str, str]:
        """Per SUM in ``totals``, the column that prints its total's estimate."""
        return total_columns(self.group_columns + tuple(self.values), list(self.totals))

    @property
    def interval_columns(self) -> dict[str, tuple[str, str]]:
        """Per printed value column, the (low, high) columns of its interval in
        ``to_pandas(intervals=True)`` and ``to_arrow(intervals=True)``: ``{name}_low`` and
        ``{name}_high``, an underscore added while another column has that name."""
        return interval_columns(self.columns, tuple(self.interval_kinds))

    def _column(self, column: str) -> FloatArray:
        """A printed value column's values: an aggregate's, or a total's estimate."""
        if column in self.values:
            return self.values[column]
        by_column = {c: name for name, c in self.total_columns.items()}
        return self.totals[by_column[column]]

    @property
    def aggregate_names(self) -> tuple[str, ...]:
        return tuple(self.values)

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def epsilon(self) -> float:
        """The epsilon charged (for a zCDP release, see ``privacy``)."""
        return float(getattr(self.privacy, "epsilon", math.nan))

    @property
    def delta(self) -> float:
        return float(getattr(self.privacy, "delta", 0.0))

    @property
    def partition_selection(self) -> dict[str, Any] | None:
        """How the released keys were selected, when they were not public (None otherwise):
        ``{"method": "count threshold", "count": name, "threshold": tau, ...}`` when the noisy
        count ``name`` itself selected them (released where it reached tau; selection cost
        only delta), or ``{"method": "separate", ...}`` for a separate selection step (its own
        share of epsilon and delta); ``units_for_half`` is the fewest units a partition needs
        to be released with probability 1/2."""
        return dict(self.selection) if self.selection is not None else None

    @property
    def bounds_chosen(self) -> dict[str, Any] | None:
        """The contribution bounds chosen from the data (``bounds="auto"``), None otherwise:
        ``max_partitions``, ``max_rows_per_partition`` and ``bounds`` {column: (lo, hi)} where
        chosen, what choosing them cost (``epsilon``, or ``rho``, part of ``privacy``), the
        ``share`` of the query's budget and the ``method``; for a query of SUMs whose row cap
        and clamp are chosen, ``value_factors`` (how the row cap was aimed by the values it
        cuts) and ``values_share`` (that histogram's share of the budget, on top of
        ``share``; so is part of the thin-data rule's count, whose epsilon ``epsilon``
        includes); where the row cap is chosen for sums or counts, ``row_tail`` (how the
        histogram of the pairs' rows moved its target) and ``tail_share`` (that histogram's
        share, on top of ``share`` too); where a clamp is chosen, ``rule`` and ``units``
        (the thin-data rule's outcome and its noisy count); where the data was too thin for
        the first choice and the bounds were chosen again, ``first_choice`` (its caps, count
        and cost), ``share`` then the retry's share in all and ``epsilon`` (or ``rho``) what
        both cost."""
        return dict(self.chosen) if self.chosen is not None else None

    # -- intervals -----------------------------------------------------------------------------

    @property
    def interval_kinds(self) -> dict[str, str]:
        """Per printed value column, what its interval (the one beside it) covers:
        ``"total"`` (the answer without the caps) or ``"bounded"`` (after the caps and the
        clamping). A COUNT(*) whose query measured its total (or where no cap can remove a
        row) has its total interval, which contains its value; a SUM whose query measured
        its total has the bounded one, and its total is another column (``total_columns``,
        kind ``"total"``), covering the sum without the clamping and the caps for units whose
        sum of |value| is at most ``max_unit_sums[column]``."""
        kinds = dict(self.kinds)
        columns = self.total_columns
        out: dict[str, str] = {}
        for a in self.plan.aggregates:
            out[a.name] = "bounded" if a.name in columns else kinds.get(a.name, "bounded")
            if a.name in columns:
                out[columns[a.name]] = "total"
        return out

    @property
    def max_unit_sums(self) -> dict[str, float]:
        """The outer caps under which the SUMs' ``total`` intervals cover, per column, or
        under ``bounding="unit"`` the caps on each unit's sum of |value| (per column)."""
        return dict(self.plan.max_unit_sums) if self.plan.intervals == "total" or \
            self.plan.bounding == "unit" else {}

    @property
    def max_unit_rows(self) -> int | None:
        """The outer cap under which the ``total`` intervals cover (None: none needed, or
        no total interval): they cover the count of every partition where no unit has more
        rows than this in all. Under ``bounding="unit"``, the cap on each unit's rows in all
        (a unit with more counts each of its T rows as M / T)."""
        return self.plan.max_unit_rows

    def interval(self, name: str, confidence: float | None = None, kind: str | None = None
                 ) -> tuple[FloatArray, FloatArray]:
        """(low, high) arrays at the given level for the printed column ``name``: by
        default the interval beside its value (``interval_kinds``); ``kind="bounded"`` or
        ``"total"`` asks for an aggregate's other one (a SUM's ``"total"`` is the interval
        of ``totals[name]``, its column ``total_columns[name]``)."""
        level = check_confidence(self.confidence if confidence is None else confidence)
        if kind is not None and kind not in ("bounded", "total"):
            raise UserError(f"kind must be 'bounded' or 'total', got {kind!r}")
        of_total = {column: agg for agg, column in self.total_columns.items()}
        if name in of_total:
            if kind == "bounded":
                raise UserError(f"{name!r} is the total of {of_total[name]!r}, whose interval "
                                f"is a total one; ask interval({of_total[name]!r}) for the "
                                "bounded sum's")
            return self._arrays(of_total[name], level, True)
        if name not in self.values:
            raise UserError(f"unknown column {name!r}; this release has "
                            f"{list(self.interval_kinds)}")
        default = self.interval_kinds[name]
        if kind == "total" and default != "total" and name not in self.totals:
            raise UserError(f"{name!r} has no total interval in this release (only COUNT(*) "
                            "and SUM can, when asked with intervals='total'); its kind is "
                            "'bounded'")
        return self._arrays(name, level, (kind or default) == "total")

    def _arrays(self, name: str, level: float, total: bool) -> tuple[FloatArray, FloatArray]:
        low, high = self._intervals(name, 1.0 - level, total)
        return np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)

    def intervals(self, confidence: float | None = None, kind: str | None = None
                  ) -> dict[str, tuple[FloatArray, FloatArray]]:
        """Every printed column's interval, the one beside its value (``interval_kinds``);
        or, with ``kind="bounded"``, every aggregate's bounded interval."""
        if kind not in (None, "bounded"):
            raise UserError(f"intervals(kind=) takes None or 'bounded', got {kind!r}; ask "
                            "interval(name, kind='total') for one aggregate's total")
        if kind == "bounded":
            return {name: self.interval(name, confidence, kind) for name in self.values}
        return {name: self.interval(name, confidence) for name in self.interval_kinds}

    # -- conversions ---------------------------------------------------------------------------

    def _columns_data(self, intervals: bool, confidence: float | None) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for i, column in enumerate(self.group_columns):
            data[column] = [key[i] for key in self.keys]
        ends = self.interval_columns
        for name in self.interval_kinds:
            data[name] = self._column(name)
            if intervals:
                low, high = self.interval(name, confidence)
                data[ends[name][0]] = low
                data[ends[name][1]] = high
        return data

    def to_pandas(self, *, intervals: bool = False, confidence: float | None = None) -> Any:
        """A pandas DataFrame: group columns, then each aggregate, each followed by its own
        interval (``{name}_low``, ``{name}_high``), and a total SUM's own estimate
        ``{name}_total`` with its interval (module docstring: what is printed beside what).
        Where another column already has such a name (an aggregate named ``income_low``
        beside ``income``), an underscore is added until none has (``income_low_``):
        ``interval_columns`` and ``total_columns`` say which."""
        import pandas as pd

        return pd.DataFrame(self._columns_data(intervals, confidence))

    def to_arrow(self, *, intervals: bool = False, confidence: float | None = None) -> Any:
        """An Arrow table with the same columns as ``to_pandas`` (each value beside its own
        interval)."""
        import pyarrow as pa

        data = self._columns_data(intervals, confidence)
        return pa.table({k: v if isinstance(v, np.ndarray) else _arrow_keys(list(v))
                         for k, v in data.items()})

    def rows(self) -> list[dict[str, Any]]:
        """One dict per partition: group columns and the printed values (each aggregate's,
        and each total SUM's own estimate, ``total_columns``)."""
        columns = {name: self._column(name) for name in self.interval_kinds}
        out = []
        for i, key in enumerate(self.keys):
            row: dict[str, Any] = dict(zip(self.group_columns, key, strict=True))
            for name, values in columns.items():
                row[name] = _json_number(values[i])
            out.append(row)
        return out

    def to_dict(self, confidence: float | None = None) -> dict[str, Any]:
        """``{"rows": [...], "intervals": [...], "privacy": {...}, "warnings": [...]}``
        (JSON-ready): each row's value columns, and beside them (same names) their own
        intervals (``interval_kinds`` says which kind each is)."""
        level = check_confidence(self.confidence if confidence is None else confidence)
        bounds = self.intervals(level)
        intervals = []
        for i in range(len(self.keys)):
            intervals.append({name: [_json_number(low[i]), _json_number(high[i])]
                              for name, (low, high) in bounds.items()})
        privacy: dict[str, Any] = {"guarantee": type(self.privacy).__name__,
                                   "neighbouring": str(self.privacy.neighbouring)}
        if self.plan.source is not None:  # over several tables: which rows one unit is
            privacy["unit"] = self.plan.source.neighbouring
        if isinstance(self.privacy, ZCDP):
            privacy.update(rho=self.privacy.rho, epsilon=None, delta=None)
        else:
            privacy.update(epsilon=self.privacy.epsilon, delta=self.privacy.delta)
        out = {"rows": _jsonable_rows(self.rows()), "intervals": intervals,
               "confidence": level, "privacy": privacy, "cached": self.from_cache,
               "interval_kinds": self.interval_kinds, "warnings": list(self.warnings)}
        counts = [n for n in self.values if self.interval_kinds[n] == "total"]
        if counts:  # the bounded intervals of the counts beside their totals, for the widths
            bounded = {name: self.interval(name, level, "bounded") for name in counts}
            out["bounded_intervals"] = [
                {name: [_json_number(low[i]), _json_number(high[i])]
                 for name, (low, high) in bounded.items()} for i in range(len(self.keys))]
        if self.totals:
            out["total_columns"] = self.total_columns
        if self.plan.bounding == "unit":
            out["bounding"] = "unit"
        if counts or self.totals or self.plan.bounding == "unit":
            out["max_unit_rows"] = self.max_unit_rows
            if self.max_unit_sums:
                out["max_unit_sums"] = self.max_unit_sums
        chosen = self.bounds_chosen
        if chosen is not None:
            out["bounds_chosen"] = {k: _plain(v) for k, v in chosen.items()}
        return out

    def explain(self) -> str:
        """The plan, the mechanisms and the SQL, as text for an audit."""
        lines = [f"privacy: {self.privacy}", f"plan: {self.plan}"]
        for name, mechs in self.mechanisms.items():
            for m in mechs:
                lines.append(f"aggregate {name!r}: {m}")
        if self.selection is not None:
            lines.append(f"partition selection: {self.selection}")
        if self.chosen is not None:
            lines.append(f"bounds chosen: {self.chosen}")
        lines.extend(f"warning: {w}" for w in self.warnings)
        lines.extend(self.sql)
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """A notebook's view: one row per partition, each value beside its interval (of the
        kind ``interval_kinds`` says), then what the release spent, the bounds chosen and the
        warnings. Every key, value and sentence is escaped (``html.escape``): group keys come
        from the data and may hold markup."""
        level = self.confidence
        bounds = self.intervals(level)
        names = list(self.interval_kinds)
        head = [*self.group_columns]
        for name in names:
            head += [name, f"{level:.0%} interval ({self.interval_kinds[name]})"]
        cells = []
        for i, key in enumerate(self.keys):
            row = [_html_value(k) for k in key]
            for name in names:
                low, high = bounds[name]
                row += [_html_value(self._column(name)[i]),
                        f"[{_html_value(low[i])}, {_html_value(high[i])}]"]
            cells.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row)
                         + "</tr>")
        header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
        notes = [f"privacy spent: {self.privacy}"]
        if self.plan.source is not None:
            notes.append(f"privacy unit: {self.plan.source.neighbouring}")
        chosen = self.bounds_chosen
        if chosen is not None:
            picked = ", ".join(f"{k}={v}" for k, v in chosen.items()
                               if k in ("max_partitions", "max_rows_per_partition", "bounds"))
            notes.append(f"bounds chosen from the data under DP: {picked}")
        if not self.secure:
            notes.append("INSECURE: the noise came from a seeded generator (tests only)")
        items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
        warned = "".join(f"<li>{html.escape(w)}</li>" for w in self.warnings)
        warnings = f"<p>warnings:</p><ul>{warned}</ul>" if warned else ""
        return (f"<div><table><thead><tr>{header}</tr></thead><tbody>{''.join(cells)}"
                f"</tbody></table><ul>{items}</ul>{warnings}</div>")

    def __repr__(self) -> str:
        warned = f", {len(self.warnings)} warning(s): see .warnings" if self.warnings else ""
        return (f"Release({len(self.keys)} partitions, columns={list(self.columns)}, "
                f"privacy={self.privacy}{warned})")


def _html_value(value: Any) -> str:
    """A cell's text (escaped by the caller): numbers to 6 significant digits, keys as str."""
    value = _json_number(value)
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.6g}" if abs(value) < 1e15 else f"{value:.6g}"
    return str(value)


def _plain(value: Any) -> Any:
    """Tuples as lists, inside dicts too (JSON-ready)."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _json_number(value: Any) -> Any:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _jsonable_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        clean: dict[str, Any] = {}
        for k, v in row.items():
            v = _json_number(v)
            if not isinstance(v, str | int | float | bool | type(None)):
                v = str(v)
            clean[k] = v
        out.append(clean)
    return out


def quantile_names(plan: Plan) -> list[str]:
    return [a.name for a in plan.aggregates if isinstance(a, Quantile)]
