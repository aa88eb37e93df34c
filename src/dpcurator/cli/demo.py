"""``dpcurator demo``: the main jobs end to end -- a local-DP survey, then a curator's queries.

First the red-light survey of the references, run through randomized response.

10,000 simulated respondents are asked "have you run a red light?". Each answers through the
two-coin protocol (truthful on tails; otherwise a second coin says yes or no), so no single
answer proves anything, and the collector still estimates the true rate with an interval.
Then a trusted curator answers grouped questions about a shop's orders within a budget
(``demo_curator``), each answer shown with its interval next to the truth.
"""

from __future__ import annotations

import json
import math

import typer

from dpcurator.cli._common import guarded


@guarded
def demo(
    respondents: int = typer.Option(10_000, min=100, max=10_000_000,
                                    help="Number of simulated respondents."),
    true_rate: float = typer.Option(
        0.3, min=0.0, max=1.0, help="Share of respondents who really ran a red light."
    ),
    confidence: float = typer.Option(0.95, min=0.5, max=0.999999, help="Interval level."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    import numpy as np

    from dpcurator.cli.demo_curator import demo_curator
    from dpcurator.mechanisms.randomized_response import RandomizedResponse
    from dpcurator.noise import sample_bernoulli

    # The simulated population: who really ran a red light (this is the private data).
    truth = sample_bernoulli(true_rate, respondents)
    # Each respondent randomizes their own answer with two fair coins: epsilon = ln 3.
    survey = RandomizedResponse(truth_probability=0.5, protocol="two-coin")
    reports = survey.release(truth)
    estimate = survey.estimate(reports, alpha=1 - confidence)
    result = {
        "question": "Have you run a red light?",
        "respondents": respondents,
        "true_rate": float(np.mean(truth)),
        "observed_yes_rate": float(np.mean(reports)),
        "estimate": float(estimate.value),
        "interval": [float(estimate.interval[0]), float(estimate.interval[1])],
        "confidence": confidence,
        "epsilon": survey.guarantee.epsilon,
        "neighbouring": str(survey.guarantee.neighbouring),
    }
    if as_json:
        result["curator"] = demo_curator(as_json=True, print_output=False)
        typer.echo(json.dumps(result))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print("[bold]The red-light survey[/bold] (randomized response, two fair coins)")
    table = Table(show_header=False)
    table.add_row("respondents", f"{respondents:,}")
    table.add_row("true rate (hidden from the collector)", f"{result['true_rate']:.4f}")
    table.add_row("share of 'yes' reports", f"{result['observed_yes_rate']:.4f}")
    table.add_row("estimated rate", f"{result['estimate']:.4f}")
    lo, hi = float(estimate.interval[0]), float(estimate.interval[1])
    table.add_row(f"{confidence:.0%} interval", f"[{lo:.4f}, {hi:.4f}]")
    table.add_row("epsilon per respondent", f"{result['epsilon']:.4f} (= ln 3 = {math.log(3):.4f})")
    console.print(table)
    console.print("Each answer alone is 3x more likely under one truth than the other, never more.")
    console.print()
    demo_curator(as_json=False, print_output=True, console=console)
