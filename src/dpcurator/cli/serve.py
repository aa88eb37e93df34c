"""``dpcurator serve``: run the curator service, and make analysts' tokens.

    dpcurator serve --config curator.toml [--host 127.0.0.1] [--port 8000]
                    [--workers N] [--forwarded-allow-ips IPS] [--access-log -|PATH|off]
    dpcurator serve token alice          # a fresh token, and the line for the config
    dpcurator serve token alice --token-file alice.token >> curator.toml

With ``--workers N`` the command first builds the service once (so that a wrong
configuration, dataset or ledger is reported here, once, and the ledger and its accounts
exist), then starts N uvicorn worker processes on the port, a socket each (``_workers``: with
Nagle's algorithm off on their connections, as one worker's are), and replaces any that dies.
Each worker builds its own service (``worker_app``, from the configuration's path the command
puts in its environment) over the same ledger: budgets are debited there in one transaction
each, releases are found there by any worker, and the per-analyst rate limit is kept beside
it.

The service needs the ``server`` extra (``pip install 'dpcurator[server]'``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from dpcurator._validation import config_key
from dpcurator.cli._common import emit, fail, user_errors
from dpcurator.cli._workers import serve_workers
from dpcurator.errors import UserError

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["serve_app", "worker_app"]

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
    workers: int = typer.Option(
        1, "--workers", min=1, max=64, help="Worker processes serving the port (a socket "
                                            "each where the system has SO_REUSEPORT), each "
                                            "with its own service over the same ledger."),
    forwarded_allow_ips: str = typer.Option(
        "127.0.0.1", "--forwarded-allow-ips",
        help="Addresses (comma-separated, or *) of the reverse proxies whose X-Forwarded-For "
             "and X-Forwarded-Proto are believed: a request from one of them is counted "
             "against the address the proxy names. From anywhere else those headers are "
             "ignored."),
    access_log: str = typer.Option(
        "-", "--access-log", help="Where each request's access-log line goes: - (stderr), a "
                                  "file (appended, created 0600), or off. The audit log is "
                                  "separate and always on."),
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
        handler = _access_handler(access_log)
        app = create_app(load_config(config))
        if workers > 1:  # checked, and the ledger made: each worker builds its own
            app.state.service.close()
            os.environ[_CONFIG] = str(config.resolve())
            os.environ[_ACCESS_LOG] = access_log
    # uvicorn's own access log is off: the service writes its own, with bounded fields.
    common: dict[str, Any] = {"log_level": "info", "access_log": False, "proxy_headers": True,
                              "forwarded_allow_ips": forwarded_allow_ips}
    if workers > 1:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
        with user_errors(as_json):
            serve_workers(f"{__name__}:worker_app", workers, host, port, common)
    else:
        _use_access_log(handler)
        uvicorn.run(app, host=host, port=port, **common)


_CONFIG = "DPCURATOR_SERVE_CONFIG"  # what `serve --workers N` tells its workers
_ACCESS_LOG = "DPCURATOR_SERVE_ACCESS_LOG"


def worker_app() -> FastAPI:
    """The app of one worker of ``dpcurator serve --workers N`` (uvicorn's factory, called in
    each worker process): its own service, from the configuration the command checked."""
    from dpcurator.server import create_app, load_config

    path = os.environ.get(_CONFIG)
    if not path:
        raise UserError(f"worker_app is started by `dpcurator serve --workers N`, which sets "
                        f"{_CONFIG}; it is not set")
    _use_access_log(_access_handler(os.environ.get(_ACCESS_LOG, "-")))
    return create_app(load_config(path))


def _use_access_log(handler: logging.Handler | None) -> None:
    if handler is not None:
        logger = logging.getLogger("dpcurator.server.access")
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        logger.propagate = False


def _access_handler(target: str) -> logging.Handler | None:
    """The access log's handler: stderr (``-``), a file (appended, owner-only), or none."""
    if target == "off":
        return None
    if target == "-":
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
    else:
        path = Path(target)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))
        except OSError as exc:
            raise UserError(f"cannot write the access log {path}: {exc.strerror}") from None
        handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    return handler


@serve_app.command()
def token(
    name: str = typer.Argument(..., help="The analyst's name, as in \\[analysts.NAME] (or "
                                         "the owner's, with --owner)."),
    owner: bool = typer.Option(False, "--owner", help="A data owner's token (\\[owners.NAME]: "
                                                     "the dashboard's owner's view) instead "
                                                     "of an analyst's."),
    token_file: Path | None = typer.Option(
        None, "--token-file", help="Write the token to this new file (owner-only) instead of "
                                   "printing it, and print only the configuration's lines "
                                   "(to append to curator.toml)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """A fresh analyst (or owner) token (give it to them) and the lines to put in the config."""
    fresh = "dpc_" + secrets.token_urlsafe(32)
    digest = hashlib.sha256(fresh.encode()).hexdigest()
    role = "owner" if owner else "analyst"
    with user_errors(as_json):  # before anything is written: a name the config refuses
        key = config_key(name, f"the {role}'s name")
    lines = f'[{role}s.{key}]\ntoken_sha256 = "{digest}"'
    if token_file is not None:
        with user_errors(as_json):
            try:
                fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                raise UserError(f"{token_file} exists; a token file is never "
                                "overwritten") from None
            except OSError as exc:
                raise UserError(f"cannot write {token_file}: {exc.strerror}") from None
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(fresh + "\n")
        written = {role: name, "token_file": str(token_file), "token_sha256": digest,
                   "config": lines}
        emit(written, as_json, lambda r: typer.echo(r["config"]))
        return
    result = {role: name, "token": fresh, "token_sha256": digest, "config": lines}
    emit(result, as_json, lambda r: typer.echo(
        f"token for {name} (give it to them; it is not stored anywhere):\n  {r['token']}\n\n"
        f"in the configuration:\n{r['config']}"))
