"""Migration of a JSONL budget journal (dpcurator 0.1's ``journal=`` format) into a ledger.

The old journal held one JSON line per charge and did not record its total, so the owner
states the total when migrating. Every old charge becomes a ``migrated`` entry, recorded even
where it does not fit: a journal that had overspent stays overspent (its budget refuses every
charge until the owner raises the total), and nothing is ever refunded by the migration.

The migration is atomic, whenever the process is killed: the ledger is built whole in a
scratch file beside the target (every charge in one transaction), synced, and only then put
in place (linked, or renamed over the journal, after the journal was linked to ``.bak``). So
the path holds either the untouched journal (a rerun migrates it again) or the finished
ledger, never a ledger with some of the charges: that would refund the rest.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dpcurator.accounting.filters import Composition, Cost, FilterRule, decode_cost
from dpcurator.errors import UserError

from ._sqlite import SQLITE_MAGIC, SQLiteLedger, fsync_directory

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
    target = Path(to) if to is not None else source
    if not source.is_file():
        raise UserError(f"no journal file at {source}")
    # The ledger writers' queue lock of the target: two migrations (or a migration and a
    # Budget charging the finished ledger) take turns, and each looks again once it has it.
    with _locked(target):
        # A scratch ledger left by a migration killed part-way: no live one holds the lock.
        for pattern in (f".{target.name}.*.migrating*", f"..{target.name}.*.migrating*"):
            for stale in target.parent.glob(pattern):
                stale.unlink(missing_ok=True)
        charges = _read_journal(source)
        rule = FilterRule.make(total, composition)
        for cost, _ in charges:
            rule.price(cost)  # every old charge must fit the new ledger's currency
        backup = source.with_name(source.name + ".bak")
        if target == source:
            if backup.exists() and not _same_file(source, backup):
                raise UserError(f"{backup} already exists; move it away first")
        elif target.exists():
            raise UserError(f"{target} already exists; give a new path for the ledger")
        scratch = target.with_name(f".{target.name}.{os.getpid()}."
                                   f"{secrets.token_hex(4)}.migrating")
        try:
            _build(scratch, account, rule, charges)
            if target == source:
                if not backup.exists():
                    os.link(source, backup)  # the journal stays at the path until the swap
                    fsync_directory(backup.parent)
                os.replace(scratch, target)  # the journal, whole, becomes the ledger, whole
            else:
                os.link(scratch, target)  # never over a file made meanwhile
            fsync_directory(target.parent)
        except OSError as exc:
            raise UserError(f"cannot migrate {source} to {target}: "
                            f"{exc.strerror or exc}") from None
        finally:
            for leftover in ("", "-wal", "-shm", ".lock"):
                Path(f"{scratch}{leftover}").unlink(missing_ok=True)
    return target


def _read_journal(source: Path) -> list[tuple[Cost, str]]:
    """The journal's charges (cost, label), in order; a ledger already there is named."""
    if not source.is_file():
        raise UserError(f"no journal file at {source}")
    charges: list[tuple[Cost, str]] = []
    with source.open("rb") as handle:
        if handle.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC:
            raise UserError(f"{source} is already a ledger (migrated: the journal is kept "
                            "beside it as .bak); open it with Budget.open")
        handle.seek(0)
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
            charges.append((cost, label or "migrated from a JSONL journal"))
    return charges


def _build(scratch: Path, account: str, rule: FilterRule,
           charges: list[tuple[Cost, str]]) -> None:
    """The whole ledger in ``scratch``: opened, every charge in one transaction, synced."""
    ledger = SQLiteLedger(scratch)
    try:
        ledger.open_account(account, rule)
        ledger.record(account, charges)
    finally:
        ledger.close()  # the last connection: checkpoints the WAL into the file
    fd = os.open(scratch, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``b`` is a link to ``a`` (a migration killed after linking the journal)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


@contextmanager
def _locked(target: Path) -> Iterator[None]:
    """Hold the ledger's writers' lock (``<target>.lock``, POSIX ``flock``) meanwhile."""
    if sys.platform == "win32" or not target.parent.is_dir():
        yield
        return
    import fcntl

    try:
        fd = os.open(f"{target}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield  # a read-only folder: the migration fails when it writes, with its reason
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
