"""Every bound the choice can pick, proven to compile before the charge.

A query whose bounds are chosen from the data (``_auto_bounds``) is charged before its data
is read, and its bounds are chosen after that; so whatever the choice picks must compile,
or the query would be charged without an answer. Whether a candidate compiles depends on
public numbers only: the request's shares, the caps and the bounds (a cap too large for a
tiny epsilon cannot be calibrated on the fixed-point grid, nor its noise drawn).

So, before the charge, ``prove_candidates``:

- builds every choice's selection mechanism (permute-and-flip with that choice's epsilon),
  which refuses an epsilon it cannot run with;
- for each partition cap k the choice may pick, finds the largest row cap that compiles
  (a binary search over the row candidates, each compile at the largest magnitude and the
  largest outer caps, where the noise is widest), and keeps that compiled query;
- compiles the smallest corner (smallest caps, smallest magnitude) once.

The choice is then made over the proven candidates only (``Candidates.rows_for``): a
restriction computed from public numbers, so the choice keeps its epsilon. A query with no
proven candidate is refused with nothing charged.

After the charge, ``Candidates.bind`` compiles the chosen bounds. For a fixed k the
calibration is monotone in the row cap (each measure's grid is floor(T eps / (k r)), its
noise scale k r / eps), so this cannot fail; if it ever did (a bug), the compiled query kept
at the chosen k's frontier answers instead: post-processing of the DP choice, with a
calibration of its own, so the release is as private as stated and says which bounds it used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dpcurator.errors import UserError
from dpcurator.mechanisms.exponential import PermuteAndFlip
from dpcurator.noise import RandomSource
from dpcurator.query.plan import MAX_UNIT_SUM, Bounds, Plan

from ._auto_joint import SENSITIVITY
from ._auto_plan import MAGNITUDES, ROW_CANDIDATES, AutoPlan, partition_candidates, with_bounds
from ._auto_units import OUTER_CANDIDATES

__all__ = ["Candidates", "prove_candidates"]

#: a ``_compile.CompiledQuery`` (not imported: ``_compile`` imports this module)
CompiledQuery = Any
Compile = Callable[[Plan], CompiledQuery]


@dataclass(frozen=True)
class Candidates:
    """The caps the choice may pick, each proven to compile (``prove_candidates``).

    ``rows_for``: (k, the number of row candidates proven at k), in increasing k;
    ``frontier``: per k, the query compiled at its largest proven row cap, at the largest
    magnitudes and outer caps."""

    rows_for: tuple[tuple[int, int], ...]
    frontier: dict[int, CompiledQuery]
    compile: Compile

    def bind(self, plan: Plan, chosen: dict[str, Any]) -> CompiledQuery:
        """The chosen bounds compiled (proven before the charge), else k's frontier query,
        with ``chosen`` updated to the bounds it uses."""
        try:
            return self.compile(plan)
        except Exception:
            fallback = self.frontier[plan.max_partitions or 1]
            used = fallback.plan
            chosen["max_rows_per_partition"] = used.max_rows_per_partition
            if "max_unit_rows" in chosen:  # the frontier's outer caps are the widest
                chosen["max_unit_rows"] = used.max_unit_rows
            if "max_unit_sums" in chosen:
                chosen["max_unit_sums"] = {c: v for c, v in used.max_unit_sums
                                           if c in chosen["max_unit_sums"]}
            chosen["bounds"] = {a.column: (a.bounds.lo, a.bounds.hi)
                                for a in used.aggregates
                                if a.column is not None and a.bounds is not None
                                and a.column in chosen.get("bounds", {})}
            chosen["note"] = ("the bounds chosen could not be compiled (a bug); the release "
                              "uses the largest proven ones at the chosen partition cap")
            return fallback


def _at(plan: Plan, auto: AutoPlan, k: int, r: int, magnitude: float, outer: int,
        outer_sum: float) -> Plan:
    """The plan at one corner of the candidate grid."""
    columns = set(auto.auto.columns)
    aggregates = tuple(
        with_bounds(a, {c: Bounds(-magnitude, magnitude) for c in columns})
        for a in plan.aggregates)
    sums = dict(plan.max_unit_sums)
    for column in auto.auto.unit_sums:
        sums[column] = outer_sum
    return plan.replace(
        aggregates=aggregates, max_partitions=k, max_rows_per_partition=r, auto=None,
        max_unit_rows=outer if auto.auto.unit_rows else plan.max_unit_rows,
        max_unit_sums=tuple(sums.items()))


def _largest(n: int, proven: Callable[[int], bool]) -> int:
    """The largest count c in [0, n] with ``proven(c)``, for ``proven`` true up to some c and
    false above it: n at once when it holds there (the usual case), else a binary search."""
    if proven(n):
        return n
    low, high = 0, n - 1
    while low < high:
        middle = (low + high + 1) // 2
        if proven(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _compiles(compile_at: Compile, plan: Plan) -> CompiledQuery | None:
    try:
        return compile_at(plan)
    except UserError:  # compile_query reports every refusal of its parameters as one
        return None


def prove_candidates(plan: Plan, auto: AutoPlan, compile_at: Compile,
                     source: RandomSource | None) -> Candidates:
    """The candidates of ``auto``'s choice that compile (the module docstring); a
    ``UserError`` when none does or a choice's epsilon cannot be run."""
    for name, epsilon in auto.epsilons.items():
        try:
            PermuteAndFlip(epsilon=epsilon, sensitivity=SENSITIVITY, source=source)
        except ValueError:
            raise UserError(f"epsilon is too small to choose the bounds ({name}: epsilon "
                            f"{epsilon:.3g}); raise epsilon, or give the bounds") from None
    choice = auto.auto
    ks = partition_candidates(plan) if choice.max_partitions else [plan.max_partitions or 1]
    rs = list(ROW_CANDIDATES) if choice.max_rows_per_partition else \
        [plan.max_rows_per_partition or 1]
    widest = (MAGNITUDES[-1], OUTER_CANDIDATES[-1], MAX_UNIT_SUM)
    rows_for: list[tuple[int, int]] = []
    frontier: dict[int, CompiledQuery] = {}
    for k in ks:
        compiled: dict[int, CompiledQuery | None] = {}

        def proven(count: int, k: int = k, compiled: dict[int, Any] = compiled) -> bool:
            compiled[count] = _compiles(compile_at, _at(plan, auto, k, rs[count - 1], *widest))
            return compiled[count] is not None

        count = _largest(len(rs), proven)
        if count:
            rows_for.append((k, count))
            frontier[k] = compiled[count]
    smallest = (MAGNITUDES[0], OUTER_CANDIDATES[0], MAGNITUDES[0])
    if not rows_for or _compiles(compile_at, _at(plan, auto, rows_for[0][0], rs[0],
                                                 *smallest)) is None:
        give = ("max_unit_rows and max_unit_sums" if plan.bounding == "unit" else
                "max_partitions, max_rows_per_partition and the bounds")
        raise UserError("epsilon is too small for any of the contribution bounds the query "
                        f"would choose from the data; raise epsilon, or give {give}")
    return Candidates(tuple(rows_for), frontier, compile_at)
