"""``dpcurator serve``: run the curator service, and make analysts' tokens.

    dpcurator serve --config curator.toml [--host 127.0.0.1] [--port 8000]
    dpcurator serve token alice          # a fresh token, and the line for the config

The service needs the ``server`` extra (``pip install 'dpcurator[server]'``).
"""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path

import typer

from dpcurator.cli._common import emit, fail, user_errors
from dpcurator.errors import UserError

__all__ = ["serve_app"]

serve_app = typer.Typer(
    invoke_without_command=True, no_args_is_help=False,
    help="Run the curator service (analysts query it over HTTP; they never see the data).")


@serve_app.callback()
def serve(
    ctx: typer.Context,
    config: Path | None = typer.Option(
        None, "--config", help="The service's configuration (TOML): datasets, analysts, ledger."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="Port to listen on."),
    as_json: bool = typer.Option(False, "--json", help="Errors as one JSON object."),
) -> None:
    """Serve the datasets of a configuration until stopped (Ctrl-C)."""
    if ctx.invoked_subcommand is not None:
        return
    if config is None:
        fail("give the configuration: dpcurator serve --config curator.toml", as_json)
    with user_errors(as_json):
        try:
            import uvicorn

            from dpcurator.server import create_app, load_config
        except ImportError:
            raise UserError("the service needs the server extra: pip install "
                            "'dpcurator[server]'") from None
        app = create_app(load_config(config))
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False)


@serve_app.command()
def token(
    name: str = typer.Argument(..., help="The analyst's name, as in [analysts.NAME]."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """A fresh analyst token (give it to the analyst) and the line to put in the config."""
    fresh = "dpc_" + secrets.token_urlsafe(32)
    digest = hashlib.sha256(fresh.encode()).hexdigest()
    result = {"analyst": name, "token": fresh, "token_sha256": digest,
              "config": f'[analysts.{name}]\ntoken_sha256 = "{digest}"'}
    emit(result, as_json, lambda r: typer.echo(
        f"token for {name} (give it to them; it is not stored anywhere):\n  {r['token']}\n\n"
        f"in the configuration:\n{r['config']}"))
