"""The data owner's view: every budget, the ledger's state, the audit log's newest lines.

Served only to an owner's token (``[owners.NAME]`` in the configuration); an analyst's token
opens none of it. It reads the ledger's accounts once and the audit file's tail, so it costs
the same however long the ledger is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dpcurator.errors import LedgerIntegrityError
from dpcurator.ledger import AccountState

from ._service import Service, account_view

__all__ = ["AUDIT_LINES", "NEAR_LIMIT", "audit_tail", "overview", "share_spent"]

NEAR_LIMIT = 0.8  # an analyst who has spent this share of a budget is near their limit
AUDIT_LINES = 200  # the audit log's newest lines the owner's view shows (at most)
_BLOCK = 65_536
_MAX_TAIL_BYTES = 8 * 1024 * 1024  # audit lines are a few KB at most (bounded fields)


def share_spent(state: AccountState) -> float:
    """How much of its budget an account has spent, from 0 to 1 (exact sums, rounded to a
    float at the end). Each limit counts where a charge must fit all of them (epsilon and
    delta, rho); an RDP budget is spent only when every order is."""
    shares = [float(spent / limit) for spent, limit in zip(state.spent, state.limits,
                                                           strict=True) if limit > 0]
    if not shares:
        return 0.0
    return min(shares) if state.rule.composition == "rdp" else max(shares)


def overview(service: Service) -> dict[str, Any]:
    """Every dataset and analyst with what was spent and what is left, who is near their
    limit, and the ledger's verification and head. When the ledger does not verify, the
    budgets are those this process last saw committed (``stale``), so the owner still sees
    them beside the failure."""
    _, health = service.health()
    stale = False
    try:
        states = service.ledger.accounts()
        entry, head = service.ledger.head()
        ledger_head: dict[str, Any] | None = {"entry": entry, "hash": head}
    except LedgerIntegrityError:
        stale, ledger_head = True, None
        states = {}
    config = service.config

    def state(account: str) -> AccountState:
        found = states.get(account) or service.ledger.last_known(account)
        assert found is not None  # every configured account was opened at start
        return found

    datasets = []
    for name in sorted(config.datasets):
        account = state(service.datasets[name].account)
        datasets.append({"name": name, **account_view(account),
                         "share_spent": share_spent(account)})
    analysts = []
    for analyst in sorted(config.analysts.values(), key=lambda a: a.name):
        budgets = []
        for dataset in sorted(analyst.budgets):
            account = state(service.account_of(analyst, dataset))
            budgets.append({"dataset": dataset, **account_view(account),
                            "share_spent": share_spent(account)})
        analysts.append({"name": analyst.name, "budgets": budgets,
                         "near_limit": any(b["share_spent"] >= NEAR_LIMIT for b in budgets)})
    return {"datasets": datasets, "analysts": analysts, "near_limit_share": NEAR_LIMIT,
            "ledger": {**health["ledger"], "head": ledger_head, "stale": stale,
                       "status": health["status"]}}


def audit_tail(path: Path | None, limit: int = AUDIT_LINES) -> list[dict[str, Any]]:
    """The audit log's newest ``limit`` lines, newest first, read from the file's end (never
    the whole file). A line that is not JSON (cut by a crash) is shown as ``{"unreadable"}``."""
    if path is None or limit < 1:
        return []
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return []
    with os.fdopen(fd, "rb") as file:
        position = file.seek(0, os.SEEK_END)
        data = b""
        while position > 0 and data.count(b"\n") <= limit and len(data) < _MAX_TAIL_BYTES:
            step = min(_BLOCK, position)
            position -= step
            file.seek(position)
            data = file.read(step) + data
    lines = data.split(b"\n")
    if position > 0:
        lines = lines[1:]  # the first is cut
    out: list[dict[str, Any]] = []
    for raw in reversed(lines):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        out.append(record if isinstance(record, dict) else {"unreadable": True})
        if len(out) == limit:
            break
    return out
