"""The fixed-point grid of a measure: how many integer units one row's value spans.

Every Laplace measure is calibrated to one noise scale, ``CANONICAL_SCALE`` integer units, so
that one discrete Laplace table serves every query (``unit_bound``); a value's scale is the
largest that keeps its worst row within that bound (``value_scale``). Public numbers only.
"""

from __future__ import annotations

import math
from fractions import Fraction

from dpcurator.errors import InternalError, UserError

__all__ = ["CANONICAL_SCALE", "MIN_RESOLUTION", "unit_bound", "value_scale"]

CANONICAL_SCALE = 2**40  # every Laplace measure's noise scale, in its integer units
MIN_RESOLUTION = 2**20  # one row's value spans at least this many integer units


def unit_bound(kind: str, budget: float, k: int, multiplier: int) -> tuple[int, float]:
    """The integer bound M of one row's (or pair's) value, and the budget actually used.

    Laplace: M = floor(T eps / (k m)) so that the L1 sensitivity k m M divided by the epsilon
    used, k m M / T (exact in double), is exactly T = 2^40: every Laplace measure of every
    query then draws from one discrete Laplace of scale 2^40, whose sampling tables are built
    once per process. Flooring M spends at most a 2^-20 fraction less than the share.
    Gaussian: M = floor(2^40 sqrt(2 rho) / (sqrt(k) m)), so that sigma is about 2^40.
    """
    if kind == "laplace":
        exact = Fraction(budget) / (k * multiplier)
        scale = CANONICAL_SCALE
        while exact * scale * (k * multiplier) >= 2**52:  # keep k m M exact in a double
            scale //= 2
        if scale < 1:
            raise UserError(f"epsilon {budget:g} is too large: this query's noise cannot be "
                            f"calibrated above epsilon = {2**51 * k * multiplier:.3g} (its "
                            "answer would be exact, no longer private)")
        bound = math.floor(exact * scale)
        if bound < MIN_RESOLUTION:
            raise UserError("epsilon is too small for this query's contribution bounds; "
                            "raise epsilon or lower the caps (max_partitions / "
                            "max_rows_per_partition, or under bounding='unit' max_unit_rows / "
                            "max_unit_sums)")
        used = k * multiplier * bound / scale  # exact: an integer < 2^52 over a power of two
        if Fraction(used) > Fraction(budget):
            raise InternalError("canonical calibration overspent; this is a bug")
        return bound, used
    bound = math.floor(CANONICAL_SCALE * math.sqrt(2 * budget) / (math.sqrt(k) * multiplier))
    bound = min(bound, 2**50 // multiplier)
    if bound < MIN_RESOLUTION:
        raise UserError("rho is too small for this query's contribution bounds; raise it")
    return bound, budget


def value_scale(worst: float, bound: int) -> float:
    """The largest scale s with ceil(worst * s) <= bound (computed as the engine will)."""
    scale = bound / worst
    while math.ceil(worst * scale) > bound:
        scale = math.nextafter(scale, 0.0)
    return scale
