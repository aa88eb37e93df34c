"""``dpcurator ledger``: the owner's view of a budget ledger.

    dpcurator ledger verify ledger.sqlite [--expect-head HASH] --json
    dpcurator ledger show ledger.sqlite --json
    dpcurator ledger export ledger.sqlite > ledger.jsonl
    dpcurator ledger raise ledger.sqlite --epsilon 2 --delta 1e-6
    dpcurator ledger migrate old-journal.jsonl --epsilon 1

LEDGER is a SQLite file or a ``postgresql://`` URL (``?schema=NAME`` for a schema other than
``dpcurator_ledger``); these commands never create a ledger, and never print a URL's password.

``verify`` exits 0 when the whole chain checks out, 1 when it does not (with the first bad
entry named), 2 on a usage error. Keep the head hash that ``show`` and ``verify`` print
somewhere else: ``verify --expect-head`` then also detects a ledger rolled back or rewritten
from that entry on, which the file alone cannot show.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer

from dpcurator.cli._common import emit, user_errors
from dpcurator.errors import UserError

ledger_app = typer.Typer(no_args_is_help=True, help="The owner's view of a budget ledger.")

_PATH = typer.Argument(..., help="The ledger: a SQLite file, or a postgresql:// URL.")
_ACCOUNT = typer.Option("default", "--account", help="The account (budget) in the ledger.")
_JSON = typer.Option(False, "--json", help="Print one JSON object.")


def _open(target: str) -> Any:
    from dpcurator.ledger import open_ledger

    return open_ledger(target, create=False)


def _shown(target: str) -> str:
    """The ledger as printed: a URL without its password."""
    from dpcurator.ledger import is_postgres_url, mask_url

    return mask_url(target) if is_postgres_url(target) else target


def _is_url(target: str) -> bool:
    from dpcurator.ledger import is_postgres_url

    return is_postgres_url(target)


def _fraction_text(values: list[Any]) -> list[float]:
    return [float(v) for v in values]


def _account_view(state: Any) -> dict[str, Any]:
    left = [max(lim - s, 0 * lim) for lim, s in zip(state.limits, state.spent, strict=True)]
    return {
        "total": str(state.rule.total),
        "composition": state.rule.composition,
        "spent": {k: v for k, v in vars(state.rule.amount(state.spent, up=True)).items()
                  if v is not None},
        "remaining": {k: v for k, v in vars(state.rule.amount(left, up=False)).items()
                      if v is not None},
        "charges": state.charges,
        "total_set_at_entry": state.total_set_at,
    }


@ledger_app.command()
def verify(
    path: str = _PATH,
    expect_head: str | None = typer.Option(
        None, "--expect-head", help="A head hash recorded earlier: it must still be in the "
                                    "chain (detects a rollback or rewrite from there on)."),
    as_json: bool = _JSON,
) -> None:
    """Check every entry's hash and link, the running sums, the head, and every request
    (who asked what, and its stored release) against the entries that record it."""
    from dpcurator.errors import LedgerIntegrityError

    with user_errors(as_json):
        if not _is_url(path) and not Path(path).is_file():
            raise UserError(f"no ledger at {path}")
        try:
            ledger = _open(path)
            report = ledger.verify()
            found = None
            if expect_head is not None:
                found = next((e.seq for e in ledger.entries() if e.hash == expect_head), None)
            ledger.close()
        except LedgerIntegrityError as exc:
            failed = {"ok": False, "ledger": _shown(path), "error": str(exc)}
            emit(failed, as_json, lambda r: typer.echo(f"NOT OK: {r['error']}"))
            raise typer.Exit(code=1) from None
    result: dict[str, Any] = {"ok": True, "ledger": _shown(path), "entries": report.entries,
                              "requests": report.requests, "head": report.head,
                              "accounts": {k: _account_view(v)
                                           for k, v in report.accounts.items()}}
    if expect_head is not None:
        result["expected_head_entry"] = found
        if found is None:
            result["ok"] = False
            result["error"] = (f"the head hash {expect_head} is not in the chain: the ledger "
                               "was rolled back or rewritten since it was recorded")
    emit(result, as_json, _render_verify)
    if not result["ok"]:
        raise typer.Exit(code=1)


def _render_verify(result: dict[str, Any]) -> None:
    if not result["ok"]:
        typer.echo(f"NOT OK: {result['error']}")
        return
    typer.echo(f"OK: {result['entries']} entries, {result['requests']} requests, head "
               f"{result['head']}")
    _render_accounts(result)


def _render_accounts(result: dict[str, Any]) -> None:
    for name, view in result["accounts"].items():
        typer.echo(f"  {name}: total {view['total']} ({view['composition']}); "
                   f"spent {view['spent']}; remaining {view['remaining']}; "
                   f"{view['charges']} charges")


@ledger_app.command()
def show(
    path: str = _PATH,
    last: int = typer.Option(10, "--last", min=0, help="How many recent entries to list."),
    as_json: bool = _JSON,
) -> None:
    """Totals, what is spent and left per account, the head hash and the newest entries."""
    with user_errors(as_json):
        ledger = _open(path)
        report = ledger.verify()
        entries = ledger.entries()
        ledger.close()
    recent = entries[-last:] if last else []
    result = {"ledger": _shown(path), "entries": report.entries, "head": report.head,
              "accounts": {k: _account_view(v) for k, v in report.accounts.items()},
              "recent": [_entry_view(e) for e in recent]}
    emit(result, as_json, _render_show)


def _entry_view(entry: Any) -> dict[str, Any]:
    view: dict[str, Any] = {"seq": entry.seq, "kind": entry.kind, "account": entry.account,
                            "time": entry.time, "label": entry.label}
    if entry.cost is not None:
        view["cost"] = str(entry.cost)
    return view


def _render_show(result: dict[str, Any]) -> None:
    typer.echo(f"{result['ledger']}: {result['entries']} entries, head {result['head']}")
    _render_accounts(result)
    for e in result["recent"]:
        typer.echo(f"  #{e['seq']} {e['kind']:8} {e['account']}: {e.get('cost', '')} "
                   f"{e['label'][:60]}")


@ledger_app.command("export")
def export_(
    path: str = _PATH,
    account: str | None = typer.Option(None, "--account", help="Only this account."),
    as_json: bool = _JSON,
) -> None:
    """Every entry as stored, with its hash: JSON lines, or one object with --json."""
    with user_errors(as_json):
        ledger = _open(path)
        entries = [e.to_json() for e in ledger.entries(account)]
        ledger.close()
    if as_json:
        typer.echo(json.dumps({"ledger": _shown(path), "entries": entries}))
        return
    for entry in entries:
        typer.echo(json.dumps(entry, sort_keys=True))


def _total(current: Any, epsilon: float | None, delta: float | None,
           rho: float | None) -> Any:
    from dpcurator.accounting import ZCDP, ApproxDP, PureDP

    relation = current.neighbouring
    if rho is not None:
        if epsilon is not None or delta is not None:
            raise UserError("give --rho, or --epsilon [--delta], not both")
        return ZCDP(rho, relation)
    if epsilon is None and delta is None:
        raise UserError("give the new total: --epsilon [--delta], or --rho")
    old_delta = getattr(current, "delta", 0.0) if not isinstance(current, ZCDP) else 0.0
    new_epsilon = epsilon if epsilon is not None else getattr(current, "epsilon", math.nan)
    new_delta = delta if delta is not None else old_delta
    if new_delta > 0:
        return ApproxDP(new_epsilon, new_delta, relation)
    return PureDP(new_epsilon, relation)


@ledger_app.command("raise")
def raise_(
    path: str = _PATH,
    epsilon: float | None = typer.Option(None, "--epsilon", help="The new total epsilon."),
    delta: float | None = typer.Option(None, "--delta", help="The new total delta."),
    rho: float | None = typer.Option(None, "--rho", help="The new total rho (zCDP)."),
    account: str = _ACCOUNT,
    label: str = typer.Option("", "--label", help="Why (recorded with the raise)."),
    as_json: bool = _JSON,
) -> None:
    """Raise an account's total; the raise is recorded as an entry of its own."""
    with user_errors(as_json):
        ledger = _open(path)
        state = ledger.account(account)
        if state is None:
            raise UserError(f"ledger {_shown(path)} has no account {account!r}")
        total = _total(state.rule.total, epsilon, delta, rho)
        entry = ledger.raise_total(account, total, label or "raised with dpcurator ledger raise")
        state = ledger.account(account)
        ledger.close()
    result = {"ledger": _shown(path), "account": account, "entry": entry.seq,
              **_account_view(state)}
    emit(result, as_json, lambda r: typer.echo(
        f"raised {account} to {r['total']} (entry {r['entry']}); remaining {r['remaining']}"))


@ledger_app.command()
def migrate(
    journal: Path = typer.Argument(..., help="A JSONL journal of dpcurator 0.1."),
    epsilon: float | None = typer.Option(None, "--epsilon", help="The budget's total epsilon."),
    delta: float = typer.Option(0.0, "--delta", help="The budget's total delta."),
    rho: float | None = typer.Option(None, "--rho", help="Or its total rho (zCDP)."),
    to: Path | None = typer.Option(
        None, "--to", help="Where the ledger goes (default: in place of the journal, which "
                           "is kept as .bak)."),
    as_json: bool = _JSON,
) -> None:
    """Turn an old JSONL journal into a ledger with the total it was meant to have."""
    from dpcurator.accounting import ZCDP, ApproxDP, PureDP
    from dpcurator.ledger import Budget, migrate_journal

    with user_errors(as_json):
        if (epsilon is None) == (rho is None):
            raise UserError("give the budget's total: --epsilon [--delta], or --rho")
        total = (ZCDP(rho) if rho is not None else
                 ApproxDP(epsilon, delta) if delta > 0 else PureDP(epsilon))  # type: ignore[arg-type]
        target = migrate_journal(journal, total, to=to)
        with Budget.open(target) as budget:
            result = {"ledger": str(target), "charges": len(budget.ledger),
                      "spent": {k: v for k, v in vars(budget.spent).items() if v is not None},
                      "remaining": {k: v for k, v in vars(budget.remaining).items()
                                    if v is not None}}
    emit(result, as_json, lambda r: typer.echo(
        f"migrated {r['charges']} charges into {r['ledger']}; remaining {r['remaining']}"))


__all__ = ["ledger_app"]
