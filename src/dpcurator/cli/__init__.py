"""The ``dpcurator`` command. Every subcommand takes ``--json`` and then prints one JSON object."""

from __future__ import annotations

import typer

from dpcurator.cli._common import JsonErrorsGroup
from dpcurator.cli.account import account_app
from dpcurator.cli.demo import demo
from dpcurator.cli.explain import explain
from dpcurator.cli.ledger import ledger_app
from dpcurator.cli.query import query
from dpcurator.cli.serve import serve_app
from dpcurator.cli.survey import survey_app

app = typer.Typer(
    name="dpcurator",
    help="Differential privacy with exact noise, exact accounting and empirical audits.",
    no_args_is_help=True,
    add_completion=False,
    cls=JsonErrorsGroup,  # --json: usage errors too are one JSON object on stdout
)
app.command(help="Run the main job end to end on simulated data.")(demo)
app.command(help="What an attacker can learn: posterior bounds for a guarantee.")(explain)
app.command(help="Answer a DP SQL query over a CSV/Parquet file, charging a budget.")(query)
app.add_typer(account_app, name="account", help="Privacy accounting: DP-SGD, composition.")
app.add_typer(ledger_app, name="ledger", help="The owner's view of a budget ledger: verify, "
              "show, export, raise, migrate.")
app.add_typer(serve_app, name="serve")
app.add_typer(survey_app, name="survey", help="Local-DP surveys: simulate, estimate, plan, config.")


@app.callback()
def _main() -> None:
    """dpcurator: answer aggregate questions about sensitive data with provable privacy."""


__all__ = ["app"]
