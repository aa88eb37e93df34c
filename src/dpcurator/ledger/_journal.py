"""Migration of a JSONL budget journal (dpcurator 0.1's ``journal=`` format) into a ledger.

The old journal held one JSON line per charge and did not record its total, so the owner
states the total when migrating. Every old charge becomes a ``migrated`` entry, recorded even
where it does not fit: a journal that had overspent stays overspent (its budget refuses every
charge until the owner raises the total), and nothing is ever refunded by the migration.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dpcurator.accounting.filters import Composition, Cost, FilterRule, decode_cost
from dpcurator.errors import UserError

from ._sqlite import SQLiteLedger

__all__ = ["migrate_journal"]

_MAX_LINE = 1 << 20


def migrate_journal(journal: str | os.PathLike[str], total: Cost, *,
                    composition: Composition | None = None,
                    to: str | os.PathLike[str] | None = None,
                    account: str = "default") -> Path:
    """Turn the JSONL journal at ``journal`` into a ledger with ``total``; returns its path.

    Without ``to`` the ledger takes the journal's place (so ``journal=`` and ``--journal``
    keep pointing at the same path) and the JSONL file is kept as ``<name>.bak``.
    """
    source = Path(journal)
    if not source.is_file():
        raise UserError(f"no journal file at {source}")
    charges: list[tuple[Cost, str]] = []
    with source.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if len(raw) > _MAX_LINE:
                raise UserError(f"journal {source} line {number} is longer than 1 MiB")
            line = raw.decode("utf-8", errors="replace").strip()
            if not line:
                continue
            try:
                record = json.loads(line)
                cost = decode_cost(record["cost"])
                label = str(record.get("label", ""))
            except (ValueError, KeyError, TypeError, AttributeError):
                raise UserError(f"journal {source} line {number} is not a journal entry; "
                                "fix or remove it before migrating") from None
            charges.append((cost, label))
    rule = FilterRule.make(total, composition)
    for cost, _ in charges:
        rule.price(cost)  # every old charge must fit the new ledger's currency
    target = Path(to) if to is not None else source
    if target == source:
        backup = source.with_name(source.name + ".bak")
        if backup.exists():
            raise UserError(f"{backup} already exists; move it away first")
        os.replace(source, backup)
    elif target.exists():
        raise UserError(f"{target} already exists; give a new path for the ledger")
    ledger = SQLiteLedger(target)
    try:
        ledger.open_account(account, rule)
        for cost, label in charges:
            ledger.record(account, cost, label or "migrated from a JSONL journal")
    finally:
        ledger.close()
    return target
