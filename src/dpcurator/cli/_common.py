"""What every command shares: one JSON object with --json, clear errors without tracebacks.

Errors, for every command: a mistake in the input (a library ``UserError`` or ``ValueError``,
a file that cannot be read, a number out of range, a usage error of the options) prints
``error: <one line>`` on stderr, or with ``--json`` one object ``{"error": ..., "type": ...}``
on stdout, and exits with status 2. An ``InternalError`` (a bug) is reported the same way with
status 1. Three layers make this hold whatever the command: ``guarded`` around each command
function, ``user_errors`` for a block inside one, and ``JsonErrorsGroup``, the root command
group, which also turns the option parser's usage errors into the JSON object.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NoReturn, TypeVar

import typer
from typer.core import TyperGroup

from dpcurator.errors import DPCuratorError, InternalError

__all__ = ["JsonErrorsGroup", "emit", "fail", "guarded", "user_errors"]

F = TypeVar("F", bound=Callable[..., Any])

#: Whether the running command was given --json (None: not known; then plain text).
_AS_JSON: ContextVar[bool | None] = ContextVar("dpcurator_cli_json", default=None)

#: Exceptions that report a mistake in the input: shown as one line, never a traceback.
USER_INPUT_ERRORS: tuple[type[BaseException], ...] = (
    DPCuratorError, ValueError, TypeError, ArithmeticError, OSError, typer.TyperException)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _report(message: str, kind: str, as_json: bool | None, code: int = 2) -> NoReturn:
    """Print the error (JSON on stdout, or one line on stderr) and exit with ``code``."""
    json_output = _AS_JSON.get() if as_json is None else as_json
    message = _one_line(message) or kind
    if json_output:
        typer.echo(json.dumps({"error": message, "type": kind}))
    else:
        typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=code)


def fail(message: str, as_json: bool | None = None) -> NoReturn:
    """Report a user error and exit with status 2: ``{"error", "type"}`` on stdout with
    ``--json`` (``as_json``; None: as the running command was asked), else ``error: ...``
    on stderr."""
    _report(message, "UserError", as_json)


def describe(exc: BaseException) -> tuple[str, str, int]:
    """(one-line message, type name, exit status) for an error of the input."""
    if isinstance(exc, InternalError):
        return str(exc), type(exc).__name__, 1
    if isinstance(exc, typer.TyperException):  # click's usage errors, BadParameter
        return exc.format_message(), "UsageError", 2
    if isinstance(exc, OSError):
        what = f" {exc.filename}" if exc.filename is not None else ""
        reason = exc.strerror or type(exc).__name__
        return f"cannot use the file{what}: {reason}", type(exc).__name__, 2
    if isinstance(exc, ArithmeticError):
        return (f"a number is out of range ({exc}); use smaller values",
                type(exc).__name__, 2)
    return str(exc), type(exc).__name__, 2


@contextmanager
def user_errors(as_json: bool | None = None) -> Iterator[None]:
    """Turn errors of the input (library errors naming the bad parameter, unreadable files,
    numbers out of range) into clean CLI errors: with ``as_json`` one JSON object
    ``{"error", "type"}`` on stdout, else a line on stderr; exit status 2 (1 for a bug).
    ``as_json=None`` follows the running command's --json."""
    try:
        yield
    except USER_INPUT_ERRORS as exc:
        message, kind, code = describe(exc)
        _report(message, kind, as_json, code)


def guarded(command: F) -> F:
    """Wrap a command function: its errors of the input are reported by ``user_errors``
    (as JSON when it was called with ``as_json=True``), never as a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        token = _AS_JSON.set(bool(kwargs.get("as_json", False)))
        try:
            with user_errors():
                return command(*args, **kwargs)
        finally:
            _AS_JSON.reset(token)

    return wrapper  # type: ignore[return-value]


class JsonErrorsGroup(TyperGroup):
    """The root command group: with ``--json`` anywhere on the command line, a usage error
    of the options (a missing option, a value that is not a number) is the JSON error object
    on stdout too, and any error of the input escaping a command is reported, not raised."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode,
                                windows_expand_args, **extra)
        argv = list(sys.argv[1:] if args is None else args)
        as_json = "--json" in argv
        token = _AS_JSON.set(as_json)
        try:
            if not as_json:  # click shows its usage errors as usual
                with user_errors(False):
                    return super().main(argv, prog_name, complete_var, True,
                                        windows_expand_args, **extra)
            try:
                with user_errors(True):
                    code = super().main(argv, prog_name, complete_var, False,
                                        windows_expand_args, **extra)
            except typer.Exit as exc:
                code = exc.exit_code
            except typer.Abort:
                typer.echo(json.dumps({"error": "aborted", "type": "Abort"}))
                code = 1
            sys.exit(code if isinstance(code, int) else 0)
        except typer.Exit as exc:
            sys.exit(exc.exit_code)
        finally:
            _AS_JSON.reset(token)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def emit(result: dict[str, Any], as_json: bool, render: Callable[[dict[str, Any]], None]) -> None:
    """One JSON object on stdout with ``--json``; otherwise the human rendering."""
    if as_json:
        typer.echo(json.dumps(_jsonable(result)))
    else:
        render(result)
