"""``dpcurator explain``: what an attacker can learn about one person from a release."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from dpcurator.accounting.guarantees import ApproxDP, PureDP
from dpcurator.cli._common import emit, guarded, user_errors


@guarded
def explain(
    epsilon: float = typer.Option(..., help="The guarantee's epsilon."),
    prior: float = typer.Option(0.5, help="The attacker's prior that the person is in the data."),
    delta: float = typer.Option(0.0, help="The guarantee's delta (0 for pure DP)."),
    plot: Path | None = typer.Option(None, help="Also draw posterior against prior (PNG/SVG)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Bounds on the attacker's posterior belief that a person is in the data."""
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
            result["plot"] = str(plot_posterior(plot))

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
