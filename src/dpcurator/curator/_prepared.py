"""The frozen values the curator's stages hand on: a query resolved (``ResolvedQuery``), then
prepared (``PreparedQuery``: compiled, checked against the table and priced, before any
charge), and the statement that profiles the contributions for bounds chosen from the data.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpcurator.accounting import ZCDP, ApproxDP, PureDP
from dpcurator.errors import UserError
from dpcurator.query.bounding import BoundedQuery
from dpcurator.query.plan import Plan

from ._auto_plan import VALUES
from ._compile import CompiledQuery
from ._cost import query_cost
from ._privacy import PrivacyRequest

__all__ = ["PreparedQuery", "ResolvedQuery", "charge_cost", "profile_query"]


def profile_query(compiled: CompiledQuery) -> BoundedQuery:
    """The statement measuring the shape of the contributions, for choosing bounds."""
    auto, shell = compiled.auto, compiled.bounded
    assert auto is not None
    unit = shell.unit is not None
    return BoundedQuery(
        unit=shell.unit, group_keys=shell.group_keys, where=shell.where, keys=shell.keys,
        max_partitions=1, max_rows_per_partition=1,
        rows_mode="rescale" if unit else "none",
        partitions_mode="rescale" if unit and shell.group_keys else "none",
        measures=(), profile=auto.auto.columns,
        profile_sums=auto.auto.unit_sums if unit else (),
        profile_means=VALUES in auto.epsilons,  # a SUM's row cap's histogram
        # the units' rows in all, only for a cap on them (``_auto_plan.outer_names``): on
        # the fine grid its comparisons were a third of the profile's time on DuckDB
        profile_totals=auto.auto.unit_rows)


@dataclass(frozen=True)
class ResolvedQuery:
    """A query with the curator's defaults applied and the privacy asked (``Curator.resolve``).

    ``notes``: what the curator or the query set that the plan does not use (sentences,
    ``_warnings.unused_settings``); ``prepare`` puts them first among the warnings."""

    plan: Plan
    request: PrivacyRequest
    level: float
    notes: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[Plan, PrivacyRequest]:
        """What makes two queries the same release (the interval level is post-processing)."""
        return (self.plan, self.request)


@dataclass(frozen=True)
class PreparedQuery:
    """A query checked, compiled and priced, not yet charged or run (``Curator.prepare``).

    ``cost`` is its price in a budget of ``composition`` (the curator's own), computed once
    (None where that budget cannot account it: ``refusal`` says why, and ``price`` raises it);
    everything that can refuse it has run. What remains after a charge is running it.
    ``warnings``: what is known before spending that its release will warn of (sentences,
    public numbers only: ``_warnings``), which ``explain`` shows and the release repeats."""

    compiled: CompiledQuery
    statements: tuple[str, ...]
    level: float
    composition: str
    cost: PureDP | ApproxDP | ZCDP | None
    refusal: str = ""
    warnings: tuple[str, ...] = ()

    def price(self) -> PureDP | ApproxDP | ZCDP:
        """The price in the curator's budget, or the ``UserError`` saying why it has none."""
        if self.cost is None:
            raise UserError(self.refusal)
        return self.cost

    @property
    def key(self) -> tuple[Plan, PrivacyRequest]:
        """What makes two queries the same release (the interval level is post-processing)."""
        return (self.compiled.plan, self.compiled.request)


def charge_cost(compiled: CompiledQuery, composition: str) -> PureDP | ApproxDP | ZCDP:
    """The guarantee to charge for a compiled query, in a budget's currency (``_cost``)."""
    return query_cost(compiled.event, compiled.cost, composition)
