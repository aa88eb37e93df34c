"""The attacker's view: how far a DP guarantee lets a prior belief about one person move.

An attacker knows everything except whether one person's records are in the data: D_in or D_out
(neighbouring datasets), with prior probability ``prior`` for D_in. After seeing the output o,
Bayes' rule gives posterior odds = prior odds * P[M(D_in) = o] / P[M(D_out) = o].

Pure epsilon-DP bounds that likelihood ratio by e^(+-eps) for *every* output, so (Desfontaines,
"Differential privacy in (a bit) more detail"; Lalanne, lesson 1, equations (4)-(5), both in the
project's references)

    prior / (e^eps + (1 - e^eps) prior) <= P[in | o] <= e^eps prior / (1 + (e^eps - 1) prior);

with eps = 1.1 and prior 0.5 the attacker ends at most 75% sure.

(epsilon, delta)-DP bounds no single output's ratio, so the bound is stated with a failure
probability beta > delta. Our derivation (the argument of Kasiviswanathan and Smith, "On the
'semantics' of differential privacy: a Bayesian formulation", JPC 2014, made explicit): for
eps' > eps let B+ = {o : P(o) > e^eps' Q(o)} and B- = {o : Q(o) > e^eps' P(o)}, P and Q the
output distributions on D_in and D_out. (eps, delta)-DP gives P(B+) <= e^eps Q(B+) + delta
< e^(eps - eps') P(B+) + delta, so P(B+) <= delta / (1 - e^(eps - eps')), and
Q(B+) <= e^-eps' P(B+); symmetrically for B-. Hence, whichever dataset is the real one, the
output falls in B+ or B- with probability at most beta = (1 + e^-eps') delta / (1 - e^(eps-eps')),
and outside them the pure-DP odds bound holds with eps'. Solving for eps' given beta:
eps' = log((beta e^eps + delta) / (beta - delta)).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dpcurator.accounting.guarantees import ApproxDP, PureDP
from dpcurator.errors import UserError, UserTypeError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["PosteriorBounds", "plot_posterior", "posterior_bounds", "posterior_figure"]

DEFAULT_PLOT_EPSILONS: tuple[float, ...] = (0.1, 0.5, 1.0, 2.0, 3.0, 5.0)


@dataclass(frozen=True, slots=True)
class PosteriorBounds:
    """The lowest and highest posterior P[in | output] an attacker can reach, and the odds.

    ``posterior_min <= P[in | o] <= posterior_max`` and ``odds_min <= posterior odds <=
    odds_max`` hold for every output o when ``failure_probability`` is 0 (pure DP); for
    (epsilon, delta)-DP they hold for all outputs except a set that the mechanism produces with
    probability at most ``failure_probability``, whether or not the person is in the data.
    ``epsilon`` is the privacy-loss bound used in the odds (eps' >= eps for approximate DP).
    Probabilities are rounded outward (min down, max up).
    """

    prior: float
    posterior_min: float
    posterior_max: float
    prior_odds: float
    odds_min: float
    odds_max: float
    epsilon: float
    failure_probability: float

    def __str__(self) -> str:
        text = (
            f"prior {self.prior:.4g} -> posterior in [{self.posterior_min:.4g}, "
            f"{self.posterior_max:.4g}] (odds x e^+-{self.epsilon:.4g})"
        )
        if self.failure_probability > 0:
            text += f", except with probability <= {self.failure_probability:.3g}"
        return text


def _check_prior(prior: float) -> float:
    if isinstance(prior, bool) or not isinstance(prior, int | float):
        raise UserTypeError(f"prior must be a real number in [0, 1], got {type(prior).__name__}")
    p = float(prior)
    if math.isnan(p) or not 0 <= p <= 1:
        raise UserError(f"prior must lie in [0, 1] (a probability), got {prior!r}")
    return p


def _posterior(prior: float, log_ratio: float) -> float:
    """1 / (1 + (1 - p)/p * e^-log_ratio): the posterior when the odds move by e^log_ratio."""
    if prior == 0 or prior == 1:
        return prior
    log_odds = math.log(prior) - math.log1p(-prior) + log_ratio
    if log_odds >= 0:
        return 1 / (1 + math.exp(-log_odds))
    e = math.exp(log_odds)
    return e / (1 + e)


def _odds(prior: float, log_ratio: float) -> float:
    if prior == 1:
        return math.inf
    if prior == 0:
        return 0.0
    try:
        return math.exp(math.log(prior) - math.log1p(-prior) + log_ratio)
    except OverflowError:
        return math.inf


def _widen(low: float, high: float) -> tuple[float, float]:
    return max(0.0, math.nextafter(math.nextafter(low, -1.0), -1.0)), min(
        1.0, math.nextafter(math.nextafter(high, 2.0), 2.0)
    )


def _epsilon_and_failure(
    guarantee: PureDP | ApproxDP, failure_probability: float | None
) -> tuple[float, float]:
    if isinstance(guarantee, PureDP) or guarantee.delta == 0:
        if failure_probability not in (None, 0, 0.0):
            raise UserError(
                "failure_probability applies only to (epsilon, delta)-DP with delta > 0"
            )
        return guarantee.epsilon, 0.0
    delta, eps = guarantee.delta, guarantee.epsilon
    if failure_probability is None:
        beta = 10 * delta
        if beta >= 1:
            raise UserError(
                f"delta={delta!r} is too large for the default failure_probability (10 delta); "
                "give failure_probability in (delta, 1) explicitly"
            )
    else:
        if isinstance(failure_probability, bool) or not isinstance(
            failure_probability, int | float
        ):
            raise UserTypeError("failure_probability must be a real number")
        beta = float(failure_probability)
        if math.isnan(beta) or not delta < beta < 1:
            raise UserError(
                f"failure_probability must lie in (delta, 1) = ({delta!r}, 1), "
                f"got {failure_probability!r}"
            )
    # eps' = log((beta e^eps + delta) / (beta - delta)), rounded up (see module docstring).
    # log(beta e^eps + delta) = eps + log(beta + delta e^-eps): no overflow past eps = 709.78
    eps_prime = eps + math.log(beta + delta * math.exp(-eps)) - math.log(beta - delta)
    return math.nextafter(eps_prime * (1 + 1e-12), math.inf), beta


def posterior_bounds(
    guarantee: PureDP | ApproxDP,
    prior: float,
    *,
    failure_probability: float | None = None,
) -> PosteriorBounds:
    """Bounds on the attacker's posterior that the person is in the data, given their prior.

    For ``PureDP(eps)``: prior odds * e^(+-eps), for every output (references' derivation).
    For ``ApproxDP(eps, delta)`` with delta > 0: the same with eps' = log((beta e^eps + delta) /
    (beta - delta)), valid except on outputs of total probability at most beta =
    ``failure_probability`` (default 10 delta); see the module docstring for the derivation.
    Under the replace relation, read "in" and "out" as "the person's true record" and "another
    record". Raises ValueError naming ``prior`` unless 0 <= prior <= 1.
    """
    p = _check_prior(prior)
    if not isinstance(guarantee, PureDP | ApproxDP):
        raise UserTypeError(
            f"guarantee must be PureDP or ApproxDP, got {type(guarantee).__name__}; convert it "
            "first (dpcurator.accounting.conversions, e.g. zcdp_to_approx)"
        )
    eps, beta = _epsilon_and_failure(guarantee, failure_probability)
    low, high = _posterior(p, -eps), _posterior(p, eps)
    if 0 < p < 1:
        low, high = _widen(low, high)
    odds_low = _odds(p, -eps)
    odds_high = _odds(p, eps)
    return PosteriorBounds(
        prior=p,
        posterior_min=low,
        posterior_max=high,
        prior_odds=_odds(p, 0.0),
        odds_min=math.nextafter(odds_low, 0.0) if odds_low > 0 else 0.0,
        odds_max=math.nextafter(odds_high, math.inf) if math.isfinite(odds_high) else odds_high,
        epsilon=eps,
        failure_probability=beta,
    )


def posterior_figure(
    epsilons: Sequence[float] = DEFAULT_PLOT_EPSILONS,
    *,
    guarantee: PureDP | ApproxDP | None = None,
    prior: float | None = None,
    failure_probability: float | None = None,
) -> Figure:
    """The figure of ``plot_posterior``, not written anywhere (its lines can be read back).

    Lines: "no information" (the diagonal), one pair per epsilon of ``epsilons`` (labelled
    "ε = ..."; solid the highest posterior, dashed the lowest), and, when ``guarantee`` is
    given, the asked epsilon's pair drawn in black (labels "asked: highest" and "asked:
    lowest"; for (epsilon, delta)-DP the epsilon' of ``posterior_bounds``, which holds except
    with ``failure_probability``). With ``prior`` as well, the prior is marked (the line
    labelled "prior") with the two bounds it reaches (the points labelled "bounds").
    """
    eps_list = [float(e) for e in epsilons]
    if not eps_list or any(not (math.isfinite(e) and e > 0) for e in eps_list):
        raise UserError(
            f"epsilons must be a non-empty sequence of positive numbers, got {epsilons!r}"
        )
    asked: PosteriorBounds | None = None
    if guarantee is not None:
        asked = posterior_bounds(guarantee, 0.5 if prior is None else prior,
                                 failure_probability=failure_probability)
    elif prior is not None:
        _check_prior(prior)

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    priors = [i / 400 for i in range(401)]
    fig = Figure(figsize=(8.0, 5.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], color="0.6", linestyle=":", linewidth=1, label="no information (ε = 0)")
    palette = ["C0", "C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8", "C9"]
    for n, e in enumerate(eps_list):
        color = palette[n % len(palette)]
        upper = [_posterior(p, e) for p in priors]
        lower = [_posterior(p, -e) for p in priors]
        ax.plot(priors, upper, color=color, linewidth=1.4, alpha=0.7, label=f"ε = {e:g}")
        ax.plot(priors, lower, color=color, linewidth=1.0, alpha=0.7, linestyle="--")
    title = "How far ε-DP lets a belief move (solid: highest, dashed: lowest)"
    if asked is not None and guarantee is not None:
        e = asked.epsilon
        name = f"ε = {guarantee.epsilon:g}" if asked.failure_probability == 0 else (
            f"ε' = {e:.3g} (ε = {guarantee.epsilon:g}, δ = {guarantee.delta:g}; "
            f"fails w.p. ≤ {asked.failure_probability:.2g})")
        ax.plot(priors, [_posterior(p, e) for p in priors], color="black", linewidth=2.4,
                label=f"asked: highest, {name}")
        ax.plot(priors, [_posterior(p, -e) for p in priors], color="black", linewidth=2.0,
                linestyle="--", label="asked: lowest")
        title = f"How far your guarantee lets a belief move ({name})"
    if prior is not None:
        p = _check_prior(prior)
        ax.axvline(p, color="0.25", linestyle="-.", linewidth=1.0, label="prior")
        if asked is not None:
            ax.plot([p, p], [asked.posterior_min, asked.posterior_max], linestyle="none",
                    marker="o", markersize=7, color="black", label="bounds")
            ax.annotate(f"prior {p:.3g}: posterior in [{asked.posterior_min:.3g}, "
                        f"{asked.posterior_max:.3g}]", xy=(p, asked.posterior_max),
                        xytext=(8, 8), textcoords="offset points", fontsize="small",
                        bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none"})
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("prior: attacker's belief that the person is in the data")
    ax.set_ylabel("posterior after seeing the output")
    ax.set_title(title, fontsize="medium")
    ax.grid(True, linewidth=0.4, alpha=0.5)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small", frameon=False)
    fig.tight_layout()
    return fig


def plot_posterior(
    path: str | os.PathLike[str],
    epsilons: Sequence[float] = DEFAULT_PLOT_EPSILONS,
    *,
    guarantee: PureDP | ApproxDP | None = None,
    prior: float | None = None,
    failure_probability: float | None = None,
) -> Path:
    """Draw the highest (solid) and lowest (dashed) posterior against the prior for each epsilon.

    The references' figure (Desfontaines; Lalanne, Figure 1), with the asked ``guarantee``'s
    curves and the ``prior`` marked when given (``posterior_figure``). The format follows the
    file extension: ``.png`` or ``.svg``. Uses matplotlib's Agg canvas directly, so no global
    backend is changed. Returns the path written.
    """
    out = Path(path)
    fmt = out.suffix.lower().lstrip(".")
    if fmt not in ("png", "svg"):
        raise UserError(f"path must end in .png or .svg, got {str(path)!r}")
    fig = posterior_figure(epsilons, guarantee=guarantee, prior=prior,
                           failure_probability=failure_probability)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format=fmt)
    return out
