"""``dpcurator explain``: what a guarantee means, in two views.

- ``explain --epsilon E [--delta D] [--prior P] [--plot FILE]``: what an attacker can learn
  about one person from a release, the posterior bounds for a prior (the plot marks the asked
  epsilon and prior).
- ``explain --mechanism gaussian|laplace|rr|name-and-shame|dpsgd ... --epsilon E [--delta D]
  [--times K] [--sampling-rate Q] [--plot FILE]``: what delta means for that mechanism (or K
  runs of it): the probabilistic delta P[L > E] and the approximate delta
  E[max(0, 1 - e^(E - L))] of its privacy loss L, with the epsilon each reading gives at D, and
  a picture of the loss distribution with both shaded (``accounting.loss_plot``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from dpcurator.accounting.guarantees import ApproxDP, PureDP
from dpcurator.cli._common import emit, guarded, user_errors
from dpcurator.errors import UserError

if TYPE_CHECKING:
    from dpcurator.accounting.events import DpEvent

MECHANISMS = ("gaussian", "laplace", "rr", "name-and-shame", "dpsgd")


@guarded
def explain(
    epsilon: float = typer.Option(
        ..., help="The guarantee's epsilon; with --mechanism, the epsilon to read delta at."),
    prior: float | None = typer.Option(
        None, help="The attacker's prior that the person is in the data (default 0.5)."),
    delta: float = typer.Option(
        0.0, help="The guarantee's delta (0 for pure DP); with --mechanism, a target delta: "
        "the epsilon each reading gives at it is reported too."),
    mechanism: str | None = typer.Option(
        None, help="Explain what delta means for a mechanism: gaussian, laplace, rr, "
        "name-and-shame or dpsgd."),
    noise: float | None = typer.Option(
        None, help="gaussian and dpsgd: the noise's standard deviation; laplace: its scale."),
    probability: float | None = typer.Option(
        None, help="name-and-shame: the probability of publishing everything; rr: of "
        "reporting the true answer."),
    categories: int = typer.Option(2, help="rr: the number of possible answers."),
    sensitivity: float = typer.Option(
        1.0, help="gaussian, laplace, dpsgd: the query's sensitivity (L2 or L1)."),
    times: int = typer.Option(1, help="How many times the mechanism runs (composition)."),
    sampling_rate: float | None = typer.Option(
        None, help="Poisson sampling rate of each run (dpsgd needs it)."),
    plot: Path | None = typer.Option(
        None, help="Also draw the figure (PNG/SVG): the posterior against the prior, or with "
        "--mechanism the privacy loss distribution with both deltas shaded."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """What a guarantee means: an attacker's posterior bounds, or a mechanism's two deltas."""
    if mechanism is None:
        for name, value in (("--noise", noise), ("--probability", probability),
                            ("--sampling-rate", sampling_rate)):
            if value is not None:
                raise UserError(f"{name} describes a mechanism: give --mechanism as well")
        if times != 1:
            raise UserError("--times describes a mechanism: give --mechanism as well")
        _explain_posterior(epsilon, 0.5 if prior is None else prior, delta, plot, as_json)
        return
    if prior is not None:
        raise UserError("--prior is for the posterior bounds, without --mechanism")
    event, described = _mechanism_event(mechanism, noise, probability, categories, sensitivity,
                                        times, sampling_rate)
    _explain_mechanism(event, described, epsilon, delta, plot, as_json)


def _explain_posterior(epsilon: float, prior: float, delta: float, plot: Path | None,
                       as_json: bool) -> None:
    from dpcurator.accounting.posterior import plot_posterior, posterior_bounds

    with user_errors():
        guarantee = ApproxDP(epsilon, delta) if delta > 0 else PureDP(epsilon)
        bounds = posterior_bounds(guarantee, prior)
        result: dict[str, Any] = {
            "epsilon": epsilon,
            "delta": delta,
            "prior": bounds.prior,
            "posterior_min": bounds.posterior_min,
            "posterior_max": bounds.posterior_max,
            "odds_min": bounds.odds_min,
            "odds_max": bounds.odds_max,
        }
        if delta > 0:
            result["failure_probability"] = bounds.failure_probability
        if plot is not None:
            result["plot"] = str(plot_posterior(plot, guarantee=guarantee, prior=prior))

    def render(r: dict[str, Any]) -> None:
        from rich.console import Console
        from rich.table import Table

        console = Console()
        table = Table(title=f"What an attacker can learn at epsilon = {epsilon:g}")
        table.add_column("prior")
        table.add_column("lowest posterior")
        table.add_column("highest posterior")
        table.add_row(f"{r['prior']:.1%}", f"{r['posterior_min']:.1%}", f"{r['posterior_max']:.1%}")
        console.print(table)
        if delta > 0:
            console.print(
                f"Holds except on outputs of probability at most {r['failure_probability']:g}."
            )
        if "plot" in r:
            console.print(f"Figure written to {r['plot']}")

    emit(result, as_json, render)


def _positive(name: str, value: float | None, why: str) -> float:
    if value is None:
        raise UserError(f"{why} needs {name}")
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"{name} must be a positive number, got {value!r}")
    return value


def _mechanism_event(
    mechanism: str, noise: float | None, probability: float | None, categories: int,
    sensitivity: float, times: int, sampling_rate: float | None,
) -> tuple[DpEvent, dict[str, Any]]:
    """The event the options describe, and the options as reported back."""
    from dpcurator.accounting import events as ev

    if mechanism not in MECHANISMS:
        raise UserError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}")
    if isinstance(times, bool) or times < 1:
        raise UserError(f"times must be an integer >= 1, got {times!r}")
    described: dict[str, Any] = {"mechanism": mechanism, "times": times,
                                 "sampling_rate": sampling_rate}
    single: DpEvent
    if mechanism in ("gaussian", "laplace", "dpsgd"):
        if probability is not None:
            raise UserError(f"--probability does not apply to {mechanism}; give --noise")
        scale = _positive("--noise", noise, mechanism)
        sens = _positive("--sensitivity", sensitivity, mechanism)
        described.update(noise=scale, sensitivity=sens)
        multiplier = scale / sens
        single = ev.LaplaceEvent(multiplier) if mechanism == "laplace" else ev.GaussianEvent(
            multiplier)
        if mechanism == "dpsgd" and sampling_rate is None:
            raise UserError("dpsgd needs --sampling-rate (the Poisson rate of each step) "
                            "and --times (the number of steps)")
    else:
        if noise is not None:
            raise UserError(f"--noise does not apply to {mechanism}; give --probability")
        p = _positive("--probability", probability, mechanism)
        if not p < 1:
            raise UserError(f"--probability must lie in (0, 1), got {p!r}")
        described["probability"] = p
        if mechanism == "rr":
            described["categories"] = categories
            single = ev.RandomizedResponseEvent(p, categories)
        else:
            single = ev.NameAndShameEvent(p)
    if sampling_rate is not None:
        if mechanism == "rr":
            raise UserError("--sampling-rate: randomized response is stated for replace-one "
                            "neighbours, which Poisson sampling does not amplify")
        if not 0 < sampling_rate <= 1:
            raise UserError(f"sampling_rate must lie in (0, 1], got {sampling_rate!r}")
        single = ev.PoissonSampledEvent(sampling_rate, single)
    return (ev.SelfComposedEvent(single, times) if times > 1 else single), described


def _explain_mechanism(event: DpEvent, described: dict[str, Any], epsilon: float, delta: float,
                       plot: Path | None, as_json: bool) -> None:
    from dpcurator.accounting.loss import loss_profile

    with user_errors():
        if not (math.isfinite(epsilon) and epsilon >= 0):
            raise UserError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
        if not (math.isfinite(delta) and 0 <= delta < 1):
            raise UserError(f"delta must lie in [0, 1), got {delta!r}")
        profile = loss_profile(event)
        result: dict[str, Any] = {
            "epsilon": epsilon,
            "delta_pdp": float(profile.delta_pdp(epsilon)),
            "delta_adp": float(profile.delta_adp(epsilon)),
            **described,
            "neighbouring": str(profile.neighbouring),
            "exact": profile.exact,
            "method_pdp": profile.method_pdp,
            "method_adp": profile.method_adp,
            "atom_at_epsilon": "counted within epsilon: delta_pdp is P[L > epsilon], strict",
        }
        if delta > 0:
            result.update(delta=delta, epsilon_pdp=profile.epsilon_pdp(delta),
                          epsilon_adp=profile.epsilon_adp(delta))
        if plot is not None:
            from dpcurator.accounting.loss_plot import plot_privacy_loss

            picture = plot_privacy_loss(profile, epsilon, plot, title=_title(described))
            result["plot"] = str(picture.path)

    def render(r: dict[str, Any]) -> None:
        from rich.console import Console
        from rich.table import Table

        console = Console()
        table = Table(title=f"What delta means for {_title(described)} at epsilon = "
                            f"{epsilon:g}")
        table.add_column("reading")
        table.add_column("delta")
        table.add_column("what it is")
        table.add_row("probabilistic DP", f"{r['delta_pdp']:.6g}",
                      "P[privacy loss > epsilon]: how often epsilon is exceeded at all")
        table.add_row("approximate DP", f"{r['delta_adp']:.6g}",
                      "E[max(0, 1 - e^(epsilon - loss))]: the excess, weighted")
        console.print(table)
        if "epsilon_pdp" in r:
            console.print(f"At delta = {r['delta']:g}: epsilon = {r['epsilon_pdp']:.6g} "
                          f"(probabilistic), {r['epsilon_adp']:.6g} (approximate).")
        if not r["exact"]:
            console.print("Upper bounds (computed on grids), never below the true values.")
        if "plot" in r:
            console.print(f"Figure written to {r['plot']}")

    emit(result, as_json, render)


def _title(described: dict[str, Any]) -> str:
    name = described["mechanism"]
    if name == "dpsgd":
        text = (f"DP-SGD (noise multiplier {described['noise'] / described['sensitivity']:g}, "
                f"sampling rate {described['sampling_rate']:g}, {described['times']} steps)")
        return text
    if name in ("gaussian", "laplace"):
        what = "σ" if name == "gaussian" else "scale"
        text = (f"{name.capitalize()} noise ({what} {described['noise']:g}, sensitivity "
                f"{described['sensitivity']:g})")
    elif name == "rr":
        text = (f"randomized response (truth w.p. {described['probability']:g}, "
                f"{described['categories']} answers)")
    else:
        text = f"name-and-shame (publishes everything w.p. {described['probability']:g})"
    if described.get("sampling_rate") is not None:
        text += f", sampled at rate {described['sampling_rate']:g}"
    if described["times"] > 1:
        text += f", {described['times']} runs"
    return text
