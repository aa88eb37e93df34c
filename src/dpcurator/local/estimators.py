"""Unbiased estimates from local reports, their exact variances and confidence intervals.

Frequency oracles (every categorical randomizer here, binary ones included) share one
structure (Wang, Blocki, Li and Jha, "Locally differentially private protocols for frequency
estimation", USENIX Security 2017, Section 4): a report *supports* some categories, with

    P[report supports v | answer = v] = p*_v,    P[report supports v | answer != v] = q*_v.

With C_v the number of the n reports that support v, lambda_v = q*_v + (p*_v - q*_v) f_v is the
probability that one report supports v, and

    f_hat_v = (C_v / n - q*_v) / (p*_v - q*_v)

is unbiased for the share f_v of answers equal to v (for the binary question of the references
this is mu_hat = (mean - (1 - p) / 2) / p, Lalanne, lesson 1, eq. (10)). Two exact variances:

- *sampled* respondents (i.i.d. answers from a population with shares f, the references' model):
  C_v ~ Binomial(n, lambda_v) exactly, so Var[f_hat_v] = lambda_v (1 - lambda_v) / (n (p* - q*)^2)
  (for the binary poll: v(p, mu) / n, eq. (14));
- a *fixed* set of answers:
  Var[f_hat_v] = (f_v p*(1 - p*) + (1 - f_v) q*(1 - q*)) / (n (p* - q*)^2),
  smaller by f_v (1 - f_v) / n, the sampling variance.

Intervals, per category at level ``confidence``:

- ``"normal"``: f_hat_v +- z sqrt(lambda_hat (1 - lambda_hat) / n) / (p* - q*) with the observed
  lambda_hat = C_v / n (the references' asymptotic interval, eq. (15), with v(p, mu) evaluated at
  mu_hat, which is the same thing);
- ``"exact"``: the Clopper-Pearson interval for lambda_v (Clopper and Pearson, Biometrika 1934),
  mapped through the increasing affine map lambda -> f: coverage >= confidence for every n under
  the sampled model. For a fixed set of answers C_v is Poisson-binomial, whose tails are within
  the binomial ones (Hoeffding 1956, Theorem 4), so the interval stays conservative there too.

Frequency oracles default to ``"exact"``: the normal interval holds its level only when C_v and
n - C_v are large, so for a rare category it under-covers (83% for a 95% interval at a 1% share,
GRR, epsilon = 5, k = 4, n = 200), and when no report supports v it is the single point
f_hat_v. Computing Clopper-Pearson costs about as much (two beta quantiles per category).

Both are clipped to [0, 1] (which can only help coverage), unless the interval lies wholly
outside [0, 1] (then it is kept: clipped, it would be a single point that reads as certain); the
point estimates are never clipped.
``project=True`` replaces the estimates by their Euclidean projection onto the probability simplex
(post-processing: no privacy cost, but biased); intervals are those of the unbiased estimator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import stats

from dpcurator.errors import UserError

__all__ = [
    "FrequencyEstimate",
    "MeanEstimate",
    "RateEstimate",
    "SurveyEstimate",
    "clopper_pearson_interval",
    "project_simplex",
    "support_variance",
    "z_value",
]

FloatArray = npt.NDArray[np.float64]
_OUTWARD = 1e-12  # relative outward rounding of Clopper-Pearson ends (scipy's accuracy)


def z_value(confidence: float) -> float:
    """The two-sided normal quantile z_{(1 + confidence) / 2}."""
    return float(stats.norm.isf((1.0 - confidence) / 2.0))


def clopper_pearson_interval(counts: npt.ArrayLike, n: int,
                             confidence: float) -> tuple[FloatArray, FloatArray]:
    """Two-sided Clopper-Pearson bounds on binomial proportions, each end at (1 - c) / 2."""
    k = np.asarray(counts, dtype=np.float64)
    half = (1.0 - confidence) / 2.0
    low = np.zeros_like(k)
    high = np.ones_like(k)
    pos = k > 0
    low[pos] = stats.beta.ppf(half, k[pos], n - k[pos] + 1.0) * (1.0 - _OUTWARD)
    part = k < n
    high[part] = np.minimum(stats.beta.isf(half, k[part] + 1.0, n - k[part]) * (1 + _OUTWARD),
                            1.0)
    return low, high


def support_variance(frequencies: npt.ArrayLike, n: int, p_star: npt.ArrayLike,
                     q_star: npt.ArrayLike, model: str = "sampled") -> FloatArray:
    """Exact variance of f_hat_v for true shares ``frequencies`` (see the module docstring)."""
    if model not in ("sampled", "fixed"):
        raise UserError(f"model must be 'sampled' or 'fixed', got {model!r}")
    f = np.asarray(frequencies, dtype=np.float64)
    p = np.asarray(p_star, dtype=np.float64)
    q = np.asarray(q_star, dtype=np.float64)
    if model == "sampled":
        lam = q + (p - q) * f
        per_report = lam * (1 - lam)
    else:
        per_report = f * p * (1 - p) + (1 - f) * q * (1 - q)
    return np.asarray(per_report / (n * (p - q) ** 2), dtype=np.float64)


def project_simplex(values: npt.ArrayLike) -> FloatArray:
    """The Euclidean projection onto {f : f >= 0, sum f = 1}.

    Sort-based algorithm (Held, Wolfe and Crowder 1974; Duchi, Shalev-Shwartz, Singer and
    Chandra, ICML 2008): with u sorted decreasingly, rho = max{j : u_j > (sum_{i<=j} u_i - 1) / j}
    and theta = (sum_{i<=rho} u_i - 1) / rho, the projection is max(v - theta, 0).
    """
    v = np.asarray(values, dtype=np.float64)
    u = np.sort(v)[::-1]
    cumulative = np.cumsum(u) - 1.0
    j = np.arange(1, v.size + 1)
    rho = int(np.nonzero(u - cumulative / j > 0)[0][-1]) + 1
    theta = cumulative[rho - 1] / rho
    return np.asarray(np.maximum(v - theta, 0.0), dtype=np.float64)


@dataclass(frozen=True, kw_only=True)
class SurveyEstimate:
    """What every survey estimate states: how it was made and how sure it is."""

    mechanism: str
    epsilon: float
    n: int
    confidence: float
    method: str

    def to_json(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "epsilon": self.epsilon, "n": self.n,
                "confidence": self.confidence, "method": self.method}


@dataclass(frozen=True, kw_only=True)
class RateEstimate(SurveyEstimate):
    """The share of "yes" answers to a yes/no question.

    ``estimate`` is unbiased (it may leave [0, 1]); ``interval`` is clipped to [0, 1] (see the
    module); ``standard_error`` is the plug-in sqrt(v(p, mu_hat) / n).
    """

    estimate: float
    standard_error: float
    interval: tuple[float, float]

    def to_json(self) -> dict[str, Any]:
        return {"estimate": self.estimate, "interval": list(self.interval),
                "standard_error": self.standard_error, **super().to_json()}


@dataclass(frozen=True, kw_only=True)
class FrequencyEstimate(SurveyEstimate):
    """The share of each category, in the order of ``categories``.

    ``estimates`` are unbiased unless ``projected`` (then they are the simplex projection of the
    unbiased ones); ``intervals`` (lows, highs) hold marginally per category.
    """

    categories: tuple[Any, ...]
    estimates: FloatArray
    standard_errors: FloatArray
    intervals: tuple[FloatArray, FloatArray]
    projected: bool = False
    unbiased: FloatArray = field(repr=False, default_factory=lambda: np.zeros(0))

    def as_dict(self) -> dict[Any, float]:
        return {c: float(v) for c, v in zip(self.categories, self.estimates, strict=True)}

    def to_json(self) -> dict[str, Any]:
        keys = [str(c) for c in self.categories]
        lows, highs = self.intervals
        return {
            "estimates": {c: float(v) for c, v in zip(keys, self.estimates, strict=True)},
            "intervals": {c: [float(a), float(b)] for c, a, b in zip(keys, lows, highs,
                                                                     strict=True)},
            "standard_errors": {c: float(s) for c, s in zip(keys, self.standard_errors,
                                                             strict=True)},
            "projected": self.projected,
            **super().to_json(),
        }


@dataclass(frozen=True, kw_only=True)
class MeanEstimate(SurveyEstimate):
    """The mean of numeric answers in [low, high]; ``estimate`` is unbiased (never clipped).

    ``interval`` is clipped to [low, high] but always holds the estimate (interval[0] <=
    estimate <= interval[1]): where the estimate lies outside [low, high] the interval reaches
    out to it (``NumericRandomizer._mean_estimate``)."""

    estimate: float
    standard_error: float
    interval: tuple[float, float]
    low: float
    high: float

    def to_json(self) -> dict[str, Any]:
        return {"estimate": self.estimate, "interval": list(self.interval),
                "standard_error": self.standard_error, "low": self.low, "high": self.high,
                **super().to_json()}


def frequency_arrays(counts: npt.ArrayLike, n: int, p_star: list[Fraction],
                     q_star: list[Fraction], confidence: float,
                     method: str) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """(unbiased estimates, standard errors, interval lows, interval highs) from support counts."""
    if n < 1:
        raise UserError("at least one report is needed to estimate anything")
    c = np.asarray(counts, dtype=np.float64)
    p = np.array([float(x) for x in p_star])
    q = np.array([float(x) for x in q_star])
    gap = p - q
    if not np.all(gap > 0):
        raise UserError("p* must exceed q* for every category: these reports carry no signal")
    share = c / n
    value = (share - q) / gap
    se = np.sqrt(share * (1 - share) / n) / gap
    if method == "exact":
        lam_low, lam_high = clopper_pearson_interval(c, n, confidence)
        low, high = (lam_low - q) / gap, (lam_high - q) / gap
    else:
        z = z_value(confidence)
        low, high = value - z * se, value + z * se
    # An interval wholly outside [0, 1] (a sure miss) is kept: clipped, it would be one point,
    # which reads as certainty.
    outside = (high < 0.0) | (low > 1.0)
    return (value, se, np.where(outside, low, np.clip(low, 0.0, 1.0)),
            np.where(outside, high, np.clip(high, 0.0, 1.0)))


def mean_interval(estimate: float, variance: float, n: int,
                  confidence: float) -> tuple[float, float, float]:
    """(standard error, low, high) of a normal interval for a mean estimate."""
    se = math.sqrt(max(variance, 0.0) / n)
    z = z_value(confidence)
    return se, estimate - z * se, estimate + z * se
