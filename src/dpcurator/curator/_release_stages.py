"""The stages after the charge, once the engine has computed the exact aggregates: which
partitions are released (``select_partitions``), their secure exact noise (``add_noise``),
and how private keys were selected, as the release states it (``describe_selection``).

Nothing here depends on what the user typed beyond the compiled query: every parameter was
checked and every mechanism built before the charge.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np
import numpy.typing as npt

from dpcurator.engines import ExactAggregates
from dpcurator.mechanisms import DiscreteGaussian, DiscreteLaplace
from dpcurator.mechanisms.partition_selection import CountThreshold
from dpcurator.noise import sample_discrete_laplace
from dpcurator.noise.samplers import sample_discrete_gaussian
from dpcurator.query.plan import Plan

from ._compile import CompiledQuery
from ._estimators import TOTAL, Noisy
from ._quantiles import BINS, QuantileTree

__all__ = ["Partitions", "add_noise", "describe_selection", "key_token", "select_partitions"]

_INT64_SAFE = 2**61


@dataclass(frozen=True)
class Partitions:
    """The partitions a query releases, and where each one's exact values are.

    ``noisy`` holds measures already noised while selecting (the thresholded count), for the
    released partitions, by measure name: ``add_noise`` uses them instead of drawing again.
    """

    keys: tuple[tuple[Any, ...], ...]  # (P,) group keys, in release order
    rows: list[int]  # (P,) each key's row in the exact aggregates; -1 where it has none
    noisy: Mapping[str, npt.NDArray[Any]] = field(default_factory=dict)


def select_partitions(compiled: CompiledQuery, exact: ExactAggregates) -> Partitions:
    """Which partitions are released: the public keys, the one global partition, or (private
    keys) those the partition selection keeps: from each one's count of distinct units (a
    separate selection), or where its noisy count reaches the threshold (``CountThreshold``)."""
    plan = compiled.plan
    n_exact = len(exact.keys)
    if plan.keys is not None:
        where = {int(k[0]): i for i, k in enumerate(exact.keys)}
        return Partitions(tuple(plan.keys.values),
                          [where.get(i, -1) for i in range(len(plan.keys.values))])
    if not plan.group_by:
        return Partitions(((),), [0 if n_exact else -1])
    selection = compiled.selection
    if isinstance(selection, CountThreshold):
        name = compiled.threshold_measure
        assert name is not None
        # order: (E,) the found partitions in key order, so that each gets the same noise
        # whatever order the engine returned them in
        order = _in_key_order(exact, np.ones(n_exact, dtype=np.bool_))
        column = exact.measures[name]
        # noisy: (E,) every found partition's noisy count, in key order; kept where >= tau
        noisy = _add_noise([column[i] for i in order], selection.noise)
        if noisy.dtype == object:  # counts beyond int64: compared as Python integers
            kept = np.asarray([int(v) >= selection.threshold for v in noisy], dtype=np.bool_)
        else:
            kept = np.asarray(noisy >= selection.threshold, dtype=np.bool_)
        chosen = [order[j] for j in np.flatnonzero(kept)]
        return Partitions(tuple(exact.keys[i] for i in chosen), chosen, {name: noisy[kept]})
    assert selection is not None and exact.selection_units is not None
    kept = selection.release(np.asarray(exact.selection_units, dtype=np.int64))
    chosen = _in_key_order(exact, kept)
    return Partitions(tuple(exact.keys[i] for i in chosen), chosen)


def _in_key_order(exact: ExactAggregates, kept: npt.NDArray[np.bool_]) -> list[int]:
    """The rows of the kept partitions, sorted by key (the release's order)."""
    return sorted((i for i in range(len(exact.keys)) if kept[i]),
                  key=lambda i: _sort_key(exact.keys[i]))


def add_noise(compiled: CompiledQuery, exact: ExactAggregates, kept: Partitions) -> Noisy:
    """Every aggregate's exact measures of the kept partitions, plus their mechanisms' noise.

    The noise is drawn aggregate by aggregate, measure by measure, in the plan's order (a
    measure noised while selecting keeps that noise).
    """
    noisy: dict[str, list[npt.NDArray[Any]]] = {}
    for estimator in compiled.estimators:
        name = estimator.aggregate.name
        if estimator.tree is not None:
            noisy[name] = [_noisy_tree(estimator.tree, exact.histograms, compiled.plan,
                                       kept.keys)]
            continue
        parts = []
        for measure in estimator.measures:
            if measure.spec.name in kept.noisy:
                parts.append(kept.noisy[measure.spec.name])
                continue
            column = exact.measures[measure.spec.name]
            ints = [column[i] if i >= 0 else 0 for i in kept.rows]
            parts.append(_add_noise(ints, measure.mechanism))
        noisy[name] = parts
    totals = {e.total.spec.name: e.total for e in compiled.estimators if e.total is not None}
    for name, measure in totals.items():  # each once (the COUNT(*)s share one: ``_total``)
        column = exact.measures[name]
        noisy[TOTAL + name] = [_add_noise([column[i] if i >= 0 else 0 for i in kept.rows],
                                          measure.mechanism)]
    return noisy


def describe_selection(compiled: CompiledQuery) -> dict[str, Any]:
    """How a query's private keys are selected, as the release states it."""
    selection = compiled.selection
    if isinstance(selection, CountThreshold):
        counted = next(e.aggregate.name for e in compiled.estimators
                       if any(m.spec.name == compiled.threshold_measure for m in e.measures))
        weight = selection.unit_weight
        return {"method": "count threshold", "count": counted,
                "threshold": selection.threshold / weight,
                "units_for_half": selection.units_for_half(),
                "guarantee": f"delta = {selection.delta:g} (its epsilon is the count's)",
                "mechanism": repr(selection)}
    assert selection is not None
    return {"method": "separate", "units_for_half": selection.units_for_half(),
            "guarantee": str(selection.guarantee), "mechanism": repr(selection)}


def _noisy_tree(tree: QuantileTree, histograms: Mapping[str, Any], plan: Plan,
                keys: tuple[tuple[Any, ...], ...]) -> npt.NDArray[np.int64]:
    """The released partitions' exact bin counts (P, 1024) -> their noisy trees (P, 2047)."""
    table = histograms.get(tree.histogram.name, {})
    leaves = np.zeros((len(keys), BINS), dtype=np.int64)
    for position, key in enumerate(keys):
        # With public keys the engine keys histograms by the key's index in plan.keys.
        counts = table.get((position,) if plan.keys is not None else key)
        if counts is not None:
            leaves[position] = counts
    return tree.add_noise(leaves)


def _add_noise(values: list[int], mechanism: DiscreteLaplace | DiscreteGaussian
               ) -> npt.NDArray[Any]:
    """Exact integer noise from the mechanism, added to exact integers (any size)."""
    n = len(values)
    if all(abs(v) < _INT64_SAFE for v in values):
        return np.asarray(mechanism.release(np.asarray(values, dtype=np.int64)),
                          dtype=np.int64).reshape(n)
    source = mechanism.source
    if isinstance(mechanism, DiscreteLaplace):
        noise = sample_discrete_laplace(mechanism.scale, n, source)
    else:
        noise = sample_discrete_gaussian(mechanism.noise_sigma(1), n, source)
    return np.array([int(v) + int(z) for v, z in zip(values, noise, strict=True)],
                    dtype=object)


def _sort_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """The release's order of private keys, the same whatever order an engine returned them
    in (each key gets its noise by its place): NULL first, then by type, then by value; a
    NaN (float or decimal) after its type's numbers, and nested values (lists, structs) by
    their text, as neither compares with <."""
    return tuple(_sort_part(v) for v in key)


def _sort_part(value: Any) -> tuple[Any, ...]:
    if value is None:
        return (False, "NoneType", 0, 0)
    if _is_nan(value):
        return (True, type(value).__name__, 1, 0)
    if isinstance(value, list | tuple | dict):
        return (True, type(value).__name__, 0, repr(value))
    return (True, type(value).__name__, 0, value)


_NAN = ("NaN",)  # a NaN's token (``key_token``): equal across the engine's runs


def key_token(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """A partition's key as a hashable value equal across two runs of the engine: a NaN
    (which equals no other NaN) as one token, lists and structs as tuples."""
    return tuple(_token(v) for v in key)


def _token(value: Any) -> Any:
    if _is_nan(value):
        return _NAN
    if isinstance(value, list | tuple):
        return ("list", tuple(_token(v) for v in value))
    if isinstance(value, dict):
        return ("struct", tuple((k, _token(v)) for k, v in value.items()))
    return value


def _is_nan(value: Any) -> bool:
    return (isinstance(value, float) and math.isnan(value)) or \
        (isinstance(value, Decimal) and value.is_nan())
