"""Planning a survey: how many respondents a target margin needs, and the trade-off figure.

The normal interval's half-width (the *margin*) at n reports is z sqrt(V / n), where z is the
two-sided normal quantile of the confidence level and V the variance of one report's
contribution (``report_variance``: for the binary poll V = v(p, mu) of Lalanne, lesson 1,
eq. (14)). So n = ceil(z^2 V / margin^2) reports reach the margin. V depends on the unknown
rate; unless a rate is given it is taken in the worst case over all rates (for frequency
oracles the support probability closest to 1/2; for numeric mechanisms answers at the ends of
the range), so the planned n is enough whatever the population turns out to be.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real
from pathlib import Path
from typing import Any

import numpy as np

from dpcurator.errors import UserError, UserTypeError
from dpcurator.local._base import LocalRandomizer, check_confidence
from dpcurator.local.estimators import z_value
from dpcurator.local.frequency import SupportOracle
from dpcurator.local.numeric import NumericRandomizer
from dpcurator.local.survey import make_randomizer

__all__ = ["interval_half_width", "plot_interval_widths", "report_variance", "sample_size"]

_FIGURE_EPSILONS = (0.5, 1.0, 2.0, 4.0)


def minimum_epsilon(mechanism: str) -> float:
    """The epsilon a mechanism must exceed: ln 2 for the two-coin survey, else 0."""
    from dpcurator.mechanisms.randomized_response import RandomizedResponse

    return RandomizedResponse.MINIMUM_EPSILON["two-coin"] if mechanism == "two-coin" else 0.0


def report_variance(randomizer: LocalRandomizer, rate: float | None = None) -> float:
    """One report's variance contribution V (n times the estimate's variance), worst case over
    the unknown rate (or mean, for numeric mechanisms, in units) unless ``rate`` is given."""
    if rate is not None:
        if isinstance(rate, bool) or not isinstance(rate, Real) or not math.isfinite(rate):
            raise UserError(f"rate must be a finite number, got {rate!r}")
        if isinstance(randomizer, SupportOracle) and not 0 <= rate <= 1:
            raise UserError(f"rate must lie in [0, 1], got {rate!r}")
        if isinstance(randomizer, NumericRandomizer) and not (
                randomizer.low <= rate <= randomizer.high):
            raise UserError(f"rate (the expected mean) must lie in [low, high] = "
                            f"[{randomizer.low:g}, {randomizer.high:g}], got {rate!r}")
    if isinstance(randomizer, SupportOracle | NumericRandomizer):
        return randomizer.report_variance(rate)
    raise UserTypeError(f"cannot plan for {type(randomizer).__name__}")


def sample_size(randomizer: LocalRandomizer, margin: float, confidence: float = 0.95,
                rate: float | None = None) -> int:
    """The smallest n whose normal interval has half-width <= ``margin`` (see the module)."""
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not (
            math.isfinite(margin) and margin > 0):
        raise UserError(f"margin must be a positive number (the interval's half-width), "
                        f"got {margin!r}")
    z = z_value(check_confidence(confidence))
    v = report_variance(randomizer, rate)
    if z * math.sqrt(v) / margin > 1e9:  # also where margin * margin underflows to 0
        raise UserError(f"margin={margin!r} is too small: it would need more than 10^18 "
                        "respondents")
    n = math.ceil(z * z * v / (margin * margin))
    # Guard the float rounding of the ceiling: the margin at n must really be <= margin.
    while z * math.sqrt(v / n) > margin:
        n += 1
    return max(n, 1)


def interval_half_width(randomizer: LocalRandomizer, n: int, confidence: float = 0.95,
                        rate: float | None = None) -> float:
    """The normal interval's half-width z sqrt(V / n) at n reports."""
    if isinstance(n, bool) or not isinstance(n, Integral) or n < 1:
        raise UserError(f"n must be a positive integer number of reports, got {n!r}")
    return z_value(check_confidence(confidence)) * math.sqrt(report_variance(randomizer, rate) / n)


def plot_interval_widths(path: str | Path, *, mechanism: str = "rr",
                         epsilons: Sequence[float] | None = None,
                         sample_sizes: Sequence[int] | None = None, confidence: float = 0.95,
                         rate: float | None = None, categories: int | None = None,
                         low: float = 0.0, high: float = 1.0) -> Path:
    """Save the references' figure: interval half-width against sample size, one curve per
    epsilon, plus the no-privacy curve for a proportion (Lalanne, lesson 1, Figure 2).

    The format follows the file's suffix (.png, .svg, .pdf). Returns the path written.
    ``epsilons`` defaults to those of 0.5, 1, 2 and 4 that the mechanism can reach (two-coin
    needs epsilon > ln 2).
    """
    if epsilons is None:
        epsilons = [e for e in _FIGURE_EPSILONS if e > minimum_epsilon(mechanism)]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(path)
    if out.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise UserError(f"the figure's path must end in .png, .svg or .pdf, got {str(path)!r}")
    sizes = np.asarray(sample_sizes if sample_sizes is not None
                       else np.unique(np.logspace(2, 6, 60).astype(np.int64)), dtype=np.float64)
    z = z_value(check_confidence(confidence))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    numeric = False
    for eps in epsilons:
        rand: Any = make_randomizer(mechanism, eps, categories=categories, low=low, high=high)
        numeric = isinstance(rand, NumericRandomizer)
        v = report_variance(rand, rate)
        ax.plot(sizes, z * np.sqrt(v / sizes), label=f"ε = {eps:g}")
    if not numeric:
        r = 0.5 if rate is None else rate
        ax.plot(sizes, z * np.sqrt(r * (1 - r) / sizes), "k--", label="no privacy")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("number of respondents n")
    ax.set_ylabel(f"half-width of the {confidence:.0%} interval")
    which = "worst case over the rate" if rate is None else f"rate {rate:g}"
    ax.set_title(f"{mechanism}: accuracy against sample size ({which})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out
