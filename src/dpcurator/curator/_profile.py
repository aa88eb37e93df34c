"""The statistics bounds are chosen from: counts of what the caps would cut, from the engine's
profile of the contributions (``BoundedQuery.profile``), each moving by at most 1 when one
unit is added or removed (``_auto_bounds``' module docstring, "The statistics" and
"Exactness": summed exactly as fractions, capped at ``STAT_CAP`` and rounded down to the
``GRID``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import Any

from dpcurator.engines import MEAN_OCTAVES, PROFILE_STEPS, UNIT_TOTALS
from dpcurator.errors import InternalError

__all__ = ["GRID", "ROW_OCTAVES", "STAT_CAP", "Profile"]

STAT_CAP = 2**36
GRID = 2**16
#: the bins of a pair's rows (``Profile.row_octaves``): n = 1 to 8 rows each its own, then
#: the octaves (2^(b-1), 2^b] up to 2^12, the last every pair above 2^12 (the upper ends)
ROW_OCTAVES = (*range(1, 9), *(2**b for b in range(4, 13)), 2**13)


def _down(value: Fraction) -> float:
    """An exact statistic, capped at ``STAT_CAP`` and rounded down to the ``GRID`` (both
    1-Lipschitz up to 2^-16): an exact float."""
    return math.floor(min(value, Fraction(STAT_CAP)) * GRID) / GRID


#: each point of the pairs' rows grid (``UNIT_TOTALS``, as the engine rounds them) with the
#: point below it
_BELOW = dict(zip(UNIT_TOTALS[1:], UNIT_TOTALS[:-1], strict=True))


def _span(n: int) -> int:
    """The width of the interval of rows a pair counted as n rows may have: 1 up to 16
    (counted exactly), else n less the grid's point below it (the engine rounds a pair's
    rows up to ``UNIT_TOTALS``, eight steps an octave; beyond the grid, (n / 2, n])."""
    if n <= 16:
        return 1
    return n - _BELOW[n] if n in _BELOW else n // 2


def _beyond(n: int, cap: float) -> Fraction:
    """The part of the pairs counted as n rows with more than ``cap`` rows, exactly, in
    [0, 1]: all when n <= 16 (counted exactly), else the part of the interval of rows they
    may have (``_span``) above the cap: the rows spread evenly between the grid's points."""
    if n <= cap:
        return Fraction(0)
    return min(Fraction(1), (n - Fraction(cap)) / _span(n))


def _counts(rows: Sequence[tuple[int, int, int]]) -> dict[tuple[int, int], int]:
    """(a, b, count) rows -> the count per (a, b)."""
    out: dict[tuple[int, int], int] = {}
    for a, b, c in rows:
        out[(a, b)] = out.get((a, b), 0) + c
    return out


def _counts3(rows: Iterable[tuple[int, int, int, int]]) -> dict[tuple[int, int, int], int]:
    """(a, b, q, count) rows -> the count per (a, b, q)."""
    out: dict[tuple[int, int, int], int] = {}
    for a, b, q, c in rows:
        out[(a, b, q)] = out.get((a, b, q), 0) + c
    return out


def _suffix_fractions(per_bucket: dict[int, Fraction]) -> list[float]:
    """Per q in ``PROFILE_STEPS``, the weight in buckets >= q (exact suffix sums, each then
    ``_down``), from the exact weight per bucket."""
    out, beyond = [], Fraction(0)
    for q in reversed(PROFILE_STEPS):
        beyond += per_bucket.get(q, Fraction(0))
        out.append(_down(beyond))
    return out[::-1]


def _exact(terms: Iterable[tuple[int, int]]) -> Fraction:
    """sum(Fraction(a, b) for a, b in terms), exactly, in integers: the numerators summed per
    denominator, then over the denominators' least common multiple (they are few: a pair's
    partitions, a unit's rows). Some ten times faster than summing fractions term by term,
    which was a tenth of a SUM's release."""
    per: dict[int, int] = {}
    for a, b in terms:
        per[b] = per.get(b, 0) + a
    d = math.lcm(1, *per)
    return Fraction(sum(a * (d // b) for b, a in per.items()), d)


def _exact_by(terms: Iterable[tuple[int, int, int]]) -> dict[int, Fraction]:
    """Per key, ``_exact`` of its (numerator, denominator) pairs, from (key, a, b) triples."""
    per: dict[int, list[tuple[int, int]]] = {}
    for key, a, b in terms:
        per.setdefault(key, []).append((a, b))
    return {key: _exact(pairs) for key, pairs in per.items()}


def _on_grid(count: int, d: int) -> float:
    """count / d, capped at ``STAT_CAP`` and rounded down to the ``GRID``, exactly."""
    return min(count * GRID // d, STAT_CAP * GRID) / GRID


def _suffix_series(per_bucket: dict[int, int], d: int) -> list[float]:
    """Per q in ``PROFILE_STEPS``, the weight in buckets >= q, from integer weights over the
    common denominator ``d`` (exact suffix sums, each then on the grid)."""
    beyond, series = 0, []
    for q in reversed(PROFILE_STEPS):
        beyond += per_bucket.get(q, 0)
        series.append(_on_grid(beyond, d))
    return series[::-1]


class Profile:
    """The statistics of the module docstring, from a profile's rows (``BoundedQuery.profile``):
    each moves by at most 1 when one unit is added or removed."""

    def __init__(self, rows: Sequence[tuple[Any, ...]]) -> None:
        # (partitions of the unit P, rows of the pair n, pairs), the units' rows T per pair,
        # and, per column, (rows of the unit T, sign, bucket q, values)
        self.pairs = [(int(r[1]), int(r[2]), int(r[5])) for r in rows if r[0] == 0]
        # where the first column is profiled, the pairs by (P, n, octave of the pair's mean |x|)
        self.pair_means = _counts3((int(r[1]), int(r[2]), int(r[3]), int(r[5]))
                                   for r in rows if r[0] == 0 and r[3] is not None)
        # the units' rows in all, where profiled (``BoundedQuery.profile_totals``)
        self.unit_totals = [(int(r[1]), int(r[4]), int(r[5])) for r in rows
                            if r[0] == 0 and r[4] is not None]
        # per column of the sums: (partitions of the unit P, bucket of its sum of |x|, pairs)
        self.sums: dict[int, list[tuple[int, int, int]]] = {}
        for r in rows:
            if r[0] < 0:
                self.sums.setdefault(-int(r[0]) - 1, []).append((int(r[1]), int(r[4]),
                                                                 int(r[5])))
        self.values: dict[int, list[tuple[int, int, int, int]]] = {}
        for r in rows:
            if r[0] > 0:
                self.values.setdefault(int(r[0]) - 1, []).append(
                    (int(r[1]), int(r[3]), int(r[4]), int(r[5])))
        # the same pairs summed over what a statistic does not read (exact integer counts):
        # the sums of fractions below then run over a few dozen terms, not every profile row
        self._by_shape = _counts(self.pairs)
        self._by_total = _counts(self.unit_totals)

    def nonzero(self, column: int, r: int = 1, side: int = 0) -> int:
        """The floor of the exact weighted count of the column's values above 2^-30 in
        magnitude, each weighing 1 / max(T, r) as in ``magnitudes`` (a unit adds at most 1;
        the floor moves by at most 1 when the exact count does): ``within`` every
        magnitude, of the ``side``'s sign (1 positive, -1 negative, 0 both)."""
        return self.within(column, r, math.inf, side)

    def within(self, column: int, r: int, q: float, side: int = 0) -> int:
        """The floor of the exact weighted count of the column's nonzero values within the
        magnitude 2^(q/4): those above 2^-30 that ``magnitudes`` does not count at q, of the
        ``side``'s sign (1 positive, -1 negative, 0 both: what a clamp [0, M], [-M, 0] or
        [-M, M] keeps), each weighing 1 / max(T, r) as there (a unit adds at most 1; the
        floor moves by at most 1 when the exact count does)."""
        first = PROFILE_STEPS[0]
        return math.floor(_exact((c, max(t, r)) for t, s, b, c in self.values.get(column, [])
                                 if first <= b < q and s * side >= 0))

    def partitions(self, caps: Sequence[int]) -> list[float]:
        """Units with more than K partitions (each pair weighs 1 / P)."""
        per: dict[int, int] = {}  # the pairs per P
        for (p, _), c in self._by_shape.items():
            per[p] = per.get(p, 0) + c
        return [_down(_exact((c, p) for p, c in per.items() if p > cap)) for cap in caps]

    def rows(self, caps: Sequence[int], k: int = 1) -> list[float]:
        """Pairs with more than R rows, each weighing 1 / max(P, k) (a unit adds at most the
        fraction of its partitions beyond R; ``k`` > 1 for the per-k statistic of the module
        docstring), those of n > 16 rows (rounded up to the grid) counted for the part of
        their interval above R (``_beyond``)."""
        # exactly as sum(Fraction(c, max(p, k)) * _beyond(n, cap)), in integers over one
        # common denominator d (a multiple of every max(p, k) h, h = ``_span(n)``): 20x
        # faster
        shapes = [(max(p, k), n, c, _span(n)) for (p, n), c in self._by_shape.items()]
        d = math.lcm(1, *(p * h for p, _, _, h in shapes))
        out = []
        for cap in caps:
            if cap != int(cap):
                raise InternalError(f"row caps are integers, got {cap!r}; this is a bug")
            total = sum(c * (d // (p * h)) * min(h, n - int(cap))
                        for p, n, c, h in shapes if n > cap)
            out.append(_down(Fraction(total, d)))
        return out

    def mean_octaves(self, cap: int) -> list[float]:
        """The pairs with more than ``cap`` rows as ``rows`` counts them (each weighing 1 / P,
        those of n > 16 rows for the part of their interval above the cap), by the octave of their
        rows' mean |x| of the first profiled column: per o in ``MEAN_OCTAVES``, the pairs whose
        mean the engine puts in (2^o, 2^(o+1)]; o = -21 holds the means at or below 2^-20,
        zeros included. Each pair counts in one octave with
        its ``rows`` weight, so one unit adds at most 1 in all (L1); exact, then each as
        ``_down`` (the sum of the roundings' errors is below 2^-10)."""
        if cap != int(cap):
            raise InternalError(f"row caps are integers, got {cap!r}; this is a bug")
        # Fraction(c, p) * _beyond(n, cap) = c min(h, n - cap) / (p h), h = _span(n)
        per = _exact_by((o, c * min(_span(n), n - int(cap)), p * _span(n))
                        for (p, n, o), c in self.pair_means.items() if n > cap)
        return [_down(per.get(o, Fraction(0))) for o in MEAN_OCTAVES]

    def row_octaves(self) -> list[float]:
        """The pairs by the octave of their rows (``ROW_OCTAVES``), each weighing 1 / P, so
        one unit adds at most 1 in all (L1). The engine rounds a pair's rows up to
        ``UNIT_TOTALS``, whose points include every power of two: a pair lands in its own
        octave. Exact, then each as ``_down``."""
        per = _exact_by((n if n <= 8 else min(1 << (n - 1).bit_length(), ROW_OCTAVES[-1]), c, p)
                        for (p, n), c in self._by_shape.items())
        return [_down(per.get(b, Fraction(0))) for b in ROW_OCTAVES]

    def light_octaves(self, cap: int) -> list[float]:
        """The pairs with at most ``cap`` rows (``cap`` at most 8, where rows are exact), each
        weighing 1 / P, by the octave of their rows' mean |x| as in ``mean_octaves``. A pair
        counts here or there, never in both, so the two together still add at most 1 per
        unit (L1)."""
        if cap > 8:
            raise InternalError(f"light pairs are counted up to 8 rows, got {cap!r}; this is "
                                "a bug")
        per = _exact_by((o, c, p) for (p, n, o), c in self.pair_means.items() if n <= cap)
        return [_down(per.get(o, Fraction(0))) for o in MEAN_OCTAVES]

    def unit_rows(self, caps: Sequence[int]) -> list[float]:
        """Units with more than M rows in all, M on the grid ``UNIT_TOTALS`` (each pair
        weighs 1 / P; T is rounded up to that grid, so T > M exactly when the rounded T is;
        every power of two is on it)."""
        if self.pairs and not self.unit_totals:
            raise InternalError("the units' rows in all were not profiled; this is a bug")
        return [_down(_exact((c, p) for (p, t), c in self._by_total.items() if t > cap))
                for cap in caps]

    def unit_sums(self, column: int) -> list[float]:
        """Units whose sum of |x| exceeds 2^(q/4), q in ``PROFILE_STEPS`` (each pair weighs
        1 / P; the engine's bucket is the largest q with the sum above 2^(q/4))."""
        return _suffix_fractions(_exact_by((b, c, p) for p, b, c in self.sums.get(column, [])))

    def magnitudes(self, column: int, r: int = 1) -> list[float]:
        """Values above 2^(q/4) in magnitude, q in ``PROFILE_STEPS``, each weighing
        1 / max(T, r): a row's share of what the row cap r keeps of its unit, over r (a unit
        adds at most T / max(T, r) <= 1)."""
        return self.magnitudes_by_cap(column, [r])[r]

    def magnitudes_by_cap(self, column: int, caps: Sequence[int]) -> dict[int, list[float]]:
        """``magnitudes`` for each row cap in ``caps``, exactly as sums of fractions, in
        integers over one common denominator per cap (the T are few: 1 to 8 and powers of
        two)."""
        per: dict[tuple[int, int], int] = {}  # (T, bucket) -> values
        for t, _, b, c in self.values.get(column, []):
            per[(t, b)] = per.get((t, b), 0) + c
        out = {}
        for r in caps:
            d = math.lcm(1, *(max(t, r) for t, _ in per))
            per_bucket: dict[int, int] = {}
            for (t, b), c in per.items():
                per_bucket[b] = per_bucket.get(b, 0) + c * (d // max(t, r))
            out[r] = _suffix_series(per_bucket, d)
        return out

    def raised(self, column: int, r: int, side: int) -> list[float]:
        """What a floor on the clamp raises: per q in ``PROFILE_STEPS``, the values a clamp
        [2^(q/4), M] (``side`` 1) or [-M, -2^(q/4)] (``side`` -1) moves inwards, those on
        its side at or below 2^(q/4) in magnitude (zeros on the positive side) and every
        value on the other side, each weighing 1 / max(T, r) as in ``magnitudes``. Each value
        is counted once, so a unit adds at most T / max(T, r) <= 1; exact, then as
        ``_down``."""
        per: dict[tuple[int, bool, int], int] = {}  # (T, on the side, bucket) -> values
        for t, s, b, c in self.values.get(column, []):
            key = (t, (s < 0) == (side < 0), b)
            per[key] = per.get(key, 0) + c
        d = math.lcm(1, *(max(t, r) for t, _, _ in per))
        other, same = 0, dict[int, int]()
        for (t, on_side, b), c in per.items():
            weight = c * (d // max(t, r))
            if on_side:
                same[b] = same.get(b, 0) + weight
            else:
                other += weight
        below, series = other + sum(w for b, w in same.items() if b < PROFILE_STEPS[0]), []
        for q in PROFILE_STEPS:  # exact prefix sums: buckets below q (|x| <= 2^(q/4))
            series.append(_on_grid(below, d))
            below += same.get(q, 0)
        return series

    def side_magnitudes(self, column: int, r: int, side: int) -> tuple[float, list[float]]:
        """What one end of a two-sided clamp cuts: (every value of the ``side``'s sign, then
        per q in ``PROFILE_STEPS`` those above 2^(q/4) in magnitude), each weighing
        1 / max(T, r) as in ``magnitudes``. Each is a count of values, each value counted
        once, so a unit adds at most T / max(T, r) <= 1 to each; exact, then as ``_down``."""
        per: dict[tuple[int, int], int] = {}  # (T, bucket) -> values on the side
        for t, s, b, c in self.values.get(column, []):
            if (s < 0 if side < 0 else s > 0):
                per[(t, b)] = per.get((t, b), 0) + c
        d = math.lcm(1, *(max(t, r) for t, _ in per))
        per_bucket: dict[int, int] = {}
        for (t, b), c in per.items():
            per_bucket[b] = per_bucket.get(b, 0) + c * (d // max(t, r))
        return _on_grid(sum(per_bucket.values()), d), _suffix_series(per_bucket, d)

    def signs(self, column: int) -> tuple[float, float]:
        """(negative, positive) values above 2^-30 in magnitude (each weighs 1 / T)."""
        values = self.values.get(column, [])
        first = PROFILE_STEPS[0]
        negative = _exact((c, t) for t, s, b, c in values if s < 0 and b >= first)
        positive = _exact((c, t) for t, s, b, c in values if s > 0 and b >= first)
        return _down(negative), _down(positive)
