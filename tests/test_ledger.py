"""The ledger: its total is stored, raised only on purpose, and tampering never reads as a refund.

Most tests run against both databases a ledger lives in: a SQLite file, and a schema of the
test run's PostgreSQL server (``postgres_url`` in conftest.py). Concurrency across processes
and ``kill -9`` are in tests/test_ledger_processes.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import dpcurator as dp
from dpcurator.accounting.filters import FilterRule
from dpcurator.accounting.guarantees import RDP
from dpcurator.cli import app
from dpcurator.errors import BudgetExceededError, LedgerIntegrityError, UserError
from dpcurator.ledger import Budget, PostgresLedger, SQLiteLedger, migrate_journal, open_ledger
from dpcurator.ledger._chain import entry_hash, make_body

QUARTER = dp.PureDP(0.25)
BACKENDS = ("sqlite", "postgres")  # ledger_factory's (conftest.py)


def _is_postgres(target: str) -> bool:
    return target.startswith("postgresql://")


@contextmanager
def _raw(target: str) -> Iterator[Any]:
    """A plain connection to the ledger's database, as its owner (or an attacker) has."""
    if _is_postgres(target):
        import psycopg
        from psycopg import sql

        url, _, query = target.partition("?")
        db = psycopg.connect(url, autocommit=True)
        db.execute(sql.SQL("SET search_path TO {}").format(
            sql.Identifier(query.removeprefix("schema="))))
    else:
        db = sqlite3.connect(target, isolation_level=None)  # type: ignore[assignment]
    try:
        yield db
    finally:
        db.close()


def _ledger_with_charges(target: str | Path, n: int = 3) -> None:
    with Budget(dp.PureDP(1.0), journal=target) as budget:
        for i in range(n):
            budget.charge(QUARTER, f"query {i}")


def _tamper(target: str | Path, *statements: str) -> None:
    """What an attacker with write access does: drop (or disable) the guards, change rows."""
    target = str(target)
    with _raw(target) as db:
        if _is_postgres(target):  # the tables' owner may disable their triggers
            db.execute("ALTER TABLE entries DISABLE TRIGGER ALL")
            db.execute("ALTER TABLE head DISABLE TRIGGER ALL")
        else:
            for trigger in ("entries_are_append_only_u", "entries_are_append_only_d",
                            "head_stays"):
                db.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        for statement in statements:
            db.execute(statement)


def _rehash(target: str | Path, seq: int, edit: Callable[[dict[str, object]], None]) -> None:
    """Edit entry ``seq`` and recompute its own hash (a careful attacker)."""
    with _raw(str(target)) as db:
        (body,) = db.execute(f"SELECT body FROM entries WHERE seq = {seq}").fetchone()
    data = json.loads(body)
    edit(data)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    digest = hashlib.sha256(text.encode()).hexdigest()
    _tamper(target, f"UPDATE entries SET body = '{text}', hash = '{digest}' WHERE seq = {seq}")


# -- the total -----------------------------------------------------------------------------------


def test_the_total_is_stored_and_a_different_one_is_refused(
        ledger_factory: Callable[[], str]) -> None:
    target = ledger_factory()
    _ledger_with_charges(target, 2)
    for other in (dp.PureDP(100.0), dp.PureDP(0.5), dp.ApproxDP(1.0, 1e-6)):
        with pytest.raises(UserError, match="ledger raise"):
            Budget(other, journal=target)
    with Budget.open(target) as budget:  # no total given: the stored one
        assert budget.total == dp.PureDP(1.0)
        assert budget.remaining.epsilon == 0.5
    with Budget(dp.ApproxDP(1.0, 0.0), journal=target) as same:  # the same limits
        assert same.remaining.epsilon == 0.5
    missing = ledger_factory()
    with pytest.raises(UserError, match="no ledger"):
        Budget.open(missing)
    with pytest.raises(UserError, match="no ledger"):  # and opening did not create one
        Budget.open(missing)


def test_a_raise_is_explicit_and_recorded(ledger_factory: Callable[[], str]) -> None:
    target = ledger_factory()
    _ledger_with_charges(target, 4)
    budget = Budget.open(target)
    with pytest.raises(BudgetExceededError):
        budget.charge(QUARTER)
    with pytest.raises(UserError, match="only be raised"):
        budget.raise_total(dp.PureDP(0.5))
    budget.raise_total(dp.PureDP(2.0), "new quarter")
    assert budget.total == dp.PureDP(2.0)
    assert budget.remaining.epsilon == 1.0
    budget.charge(QUARTER)
    kinds = [e.kind for e in open_ledger(target, create=False).entries()]
    assert kinds == ["open"] + ["charge"] * 4 + ["raise", "charge"]
    with pytest.raises(UserError, match="ledger raise"):
        Budget(dp.PureDP(1.0), journal=target)  # the old total is no longer the ledger's
    Budget(dp.PureDP(2.0), journal=target).close()
    budget.close()


def test_a_raise_or_a_reopen_on_other_rdp_orders_is_refused(tmp_path: Path) -> None:
    """A bug hunt: an RDP total raised to one on other orders kept the sums of the old orders
    and compared them with the new orders' limits (every number went up, so it passed): three
    more ZCDP(0.1) were accepted, RDP 8 at order 10 against a limit of 5, and ``verify``
    passed. Reopening with the same numbers on other orders was accepted silently too."""
    path = tmp_path / "rdp.sqlite"
    with Budget(RDP((2.0, 3.0), (1.0, 1.5)), journal=path) as budget:
        budget.charge(dp.ZCDP(0.5))  # (1.0, 1.5) at orders (2, 3): all of it
        with pytest.raises(UserError, match=r"orders \(10.0, 20.0\).*\(2.0, 3.0\)"):
            budget.raise_total(RDP((10.0, 20.0), (5.0, 10.0)))
        assert not budget.can_afford(dp.ZCDP(0.1))
        budget.raise_total(RDP((2.0, 3.0), (2.0, 3.0)))  # the same orders: a raise
        assert budget.can_afford(dp.ZCDP(0.1))
    with pytest.raises(UserError, match=r"on orders \(2.0, 3.0\)"):
        Budget(RDP((10.0, 20.0), (2.0, 3.0)), journal=path)
    # A ledger that recorded such a raise (an older version wrote it) no longer verifies.
    ledger = SQLiteLedger(path, create=False)
    state = ledger.account("default")
    seq, prev = ledger.head()
    ledger.close()
    assert state is not None
    rule = FilterRule.make(RDP((10.0, 20.0), (50.0, 100.0)), "rdp")
    body = make_body(seq=seq + 1, prev=prev, kind="raise", account="default", time=0.0,
                     spent=state.spent, limits=rule.limits(), rule=rule)
    with _raw(str(path)) as db:  # what the old raise_total appended
        db.execute("INSERT INTO entries (seq, account, kind, body, hash) VALUES "
                   "(?, 'default', 'raise', ?, ?)", (seq + 1, body, entry_hash(body)))
        db.execute("UPDATE head SET seq = ?, hash = ?", (seq + 1, entry_hash(body)))
    with pytest.raises(LedgerIntegrityError, match="raise to a total on other RDP orders"):
        SQLiteLedger(path, create=False)


def test_accounts_in_one_ledger_are_separate_budgets(ledger_factory: Callable[[], str]) -> None:
    target = ledger_factory()
    alice = Budget(dp.PureDP(1.0), journal=target, account="alice")
    bob = Budget(dp.ZCDP(0.5), journal=target, account="bob")
    alice.charge(dp.PureDP(1.0))
    bob.charge(dp.PureDP(1.0))  # costs rho = 0.5
    assert alice.remaining.epsilon == 0 and bob.remaining.rho == 0
    assert open_ledger(target, create=False).verify().entries == 4


# -- tampering: each case refused, naming the first bad entry ---------------------------------


@dataclass(frozen=True)
class Tampering:
    """What the attacker does to a ledger whose account is opened at entry ``o`` and charged
    at ``o + 1``, ``o + 2`` and ``o + 3`` (the newest), and what the refusal says: ``{a}``,
    ``{b}`` and ``{c}`` in ``message`` stand for those three charges' entries."""

    action: Callable[[str, int], object]
    message: str
    backends: tuple[str, ...] = BACKENDS


TAMPERING: dict[str, Tampering] = {
    "delete a middle entry": Tampering(
        lambda t, o: _tamper(t, f"DELETE FROM entries WHERE seq = {o + 1}"),
        r"entry {a} is missing"),
    "edit an amount": Tampering(
        lambda t, o: _tamper(t, "UPDATE entries SET body = replace(body, '\"epsilon\":0.25', "
                                f"'\"epsilon\":0.0625') WHERE seq = {o + 2}"),
        r"entry {b} does not match its hash"),
    "edit an entry and its hash": Tampering(
        lambda t, o: _rehash(t, o + 1, lambda d: d.update(label="edited")),
        r"entry {b} does not follow the entry before it"),
    "edit the newest entry's sums and hash, and the head": Tampering(
        lambda t, o: (_rehash(t, o + 3, lambda d: d.update(spent=["1/4", "0"])),
                      _tamper(t, "UPDATE head SET hash = (SELECT hash FROM entries "
                                 f"WHERE seq = {o + 3})")),
        r"entry {c} states running sums"),
    "reorder two entries": Tampering(
        lambda t, o: _tamper(t, f"UPDATE entries SET seq = -1 WHERE seq = {o + 1}",
                             f"UPDATE entries SET seq = {o + 1} WHERE seq = {o + 2}",
                             f"UPDATE entries SET seq = {o + 2} WHERE seq = -1"),
        r"entry {a} disagrees with its own row"),
    "delete the newest entries": Tampering(
        lambda t, o: _tamper(t, f"DELETE FROM entries WHERE seq >= {o + 2}"),
        r"head names entry {c} but the entries end at {a}"),
    "delete the newest entry and move the head back": Tampering(
        lambda t, o: _tamper(t, f"DELETE FROM entries WHERE seq = {o + 3}",
                             f"UPDATE head SET seq = {o + 2}"),
        r"head does not match entry {b}"),
    "delete the head": Tampering(
        lambda t, o: _tamper(t, "DELETE FROM head"), r"its head row is missing"),
    "delete every entry": Tampering(
        lambda t, o: _tamper(t, "DELETE FROM entries"), r"entry 1 onwards were deleted"),
    "replace the ledger id": Tampering(
        lambda t, o: _tamper(t, "UPDATE meta SET value = 'x' WHERE key = 'id'"),
        r"entry 1 does not follow"),
    "truncate the file": Tampering(
        lambda t, o: Path(t).write_bytes(Path(t).read_bytes()[: Path(t).stat().st_size // 2]),
        r"cannot be read as a database", ("sqlite",)),
    "empty the file": Tampering(lambda t, o: Path(t).write_bytes(b""), r"is empty", ("sqlite",)),
    "truncate the entries table": Tampering(
        lambda t, o: _tamper(t, "TRUNCATE entries"), r"entry 1 onwards were deleted",
        ("postgres",)),
    "drop the entries table": Tampering(
        lambda t, o: _tamper(t, "DROP TABLE entries"), r"cannot be read as a ledger",
        ("postgres",)),
}


def _tampering_target(target: str) -> int:
    """The ledger each case tampers with; returns the entry that opens the default account.

    A SQLite file gets 400 padding entries first, so that it spans many pages and truncation
    cuts live data; PostgreSQL has no file to cut, and no padding."""
    padding = 400 if not _is_postgres(target) else 0
    if padding:
        with Budget(dp.PureDP(1.0), journal=target, account="padding") as pad:
            for _ in range(padding - 1):
                pad.charge(dp.PureDP(1e-6), "x" * 400)
    _ledger_with_charges(target, 3)
    assert open_ledger(target, create=False).verify().entries == padding + 4
    return padding + 1


@pytest.mark.parametrize(("ledger_factory", "case"), [
    (backend, case) for case, t in sorted(TAMPERING.items()) for backend in t.backends],
    indirect=["ledger_factory"])
def test_tampering_is_refused_and_never_refunds(ledger_factory: Callable[[], str],
                                                case: str) -> None:
    target = ledger_factory()
    opened = _tampering_target(target)
    tampering = TAMPERING[case]
    tampering.action(target, opened)
    message = tampering.message.format(a=opened + 1, b=opened + 2, c=opened + 3)
    with pytest.raises(LedgerIntegrityError, match=message):
        Budget(dp.PureDP(1.0), journal=target)
    if case != "empty the file":
        result = CliRunner().invoke(app, ["ledger", "verify", target, "--json"])
        assert result.exit_code == 1, result.output
        assert json.loads(result.stdout)["ok"] is False


def test_a_live_budget_refuses_once_its_ledger_is_rolled_back(
        ledger_factory: Callable[[], str]) -> None:
    target = ledger_factory()
    budget = Budget(dp.PureDP(1.0), journal=target)
    budget.charge(QUARTER, "a")
    budget.charge(QUARTER, "b")
    # Roll the ledger back consistently (delete the newest charge, move the head back): the
    # database alone verifies, but this process remembers what it saw.
    _tamper(target, "DELETE FROM entries WHERE seq = 3",
            "UPDATE head SET seq = 2, hash = (SELECT hash FROM entries WHERE seq = 2)")
    with pytest.raises(LedgerIntegrityError, match="entry 3, verified earlier"):
        budget.charge(QUARTER)
    with pytest.raises(LedgerIntegrityError):
        _ = budget.remaining
    # A new process cannot tell from the database alone (the stated limit); the owner's
    # recorded head can (test_verify_expect_head_detects_a_rollback).
    fresh = open_ledger(target, create=False)
    assert fresh.verify().entries == 2
    fresh.close()
    budget.close()


def test_verify_expect_head_detects_a_rollback(ledger_factory: Callable[[], str]) -> None:
    target = ledger_factory()
    _ledger_with_charges(target, 2)
    runner = CliRunner()
    shown = json.loads(runner.invoke(app, ["ledger", "show", target, "--json"]).stdout)
    head = shown["head"]
    ok = runner.invoke(app, ["ledger", "verify", target, "--expect-head", head, "--json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["expected_head_entry"] == 3
    _tamper(target, "DELETE FROM entries WHERE seq = 3",
            "UPDATE head SET seq = 2, hash = (SELECT hash FROM entries WHERE seq = 2)")
    bad = runner.invoke(app, ["ledger", "verify", target, "--expect-head", head, "--json"])
    assert bad.exit_code == 1 and "rolled back" in json.loads(bad.stdout)["error"]


def test_honest_code_cannot_update_or_delete_entries(ledger_factory: Callable[[], str]) -> None:
    target = ledger_factory()
    _ledger_with_charges(target, 1)
    statements = ["DELETE FROM entries", "UPDATE entries SET kind = 'x'", "DELETE FROM head"]
    if _is_postgres(target):
        import psycopg

        errors: tuple[type[Exception], ...] = (psycopg.errors.RestrictViolation,)
        statements += ["TRUNCATE entries", "TRUNCATE head"]
    else:
        errors = (sqlite3.DatabaseError,)
    with _raw(target) as db:
        for statement in statements:
            with pytest.raises(errors, match=r"append-only|cannot be deleted"):
                db.execute(statement)
    assert open_ledger(target, create=False).verify().entries == 2


# -- paths and files -----------------------------------------------------------------------------


def test_bad_paths_are_clear_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"folder .* does not exist"):
        Budget(QUARTER, journal=tmp_path / "missing" / "ledger.sqlite")
    with pytest.raises(UserError, match="is a folder"):
        Budget(QUARTER, journal=tmp_path)
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(UserError, match="not a dpcurator ledger"):
        Budget(QUARTER, journal=other)
    foreign = tmp_path / "other.sqlite"
    sqlite3.connect(foreign).execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(UserError, match="not a dpcurator ledger"):
        Budget(QUARTER, journal=foreign)


def test_a_ledger_whose_header_was_overwritten_is_damaged_not_foreign(tmp_path: Path) -> None:
    """A bug hunt: a ledger whose first 100 bytes were overwritten was called 'not a
    dpcurator ledger; give another path', inviting a new ledger (a refund of all it
    recorded). It is damaged: restore it from a backup."""
    path = tmp_path / "ledger.sqlite"
    _ledger_with_charges(path, 3)
    data = path.read_bytes()
    path.write_bytes(b"\0" * 100 + data[100:])
    with pytest.raises(LedgerIntegrityError, match=r"is damaged.*restore it from a backup"):
        Budget.open(path)
    # Its format record gone (the meta table emptied): damaged too, not someone else's file.
    path.write_bytes(data)
    with _raw(str(path)) as db:
        db.execute("DELETE FROM meta")
    with pytest.raises(LedgerIntegrityError, match=r"is damaged.*restore it from a backup"):
        Budget.open(path)


_READ_ONLY_CHILD = r"""
import json, sys
import dpcurator as dp
from dpcurator.ledger import Budget
found = {}
for what in ("open", "charge"):
    try:
        budget = Budget.open(sys.argv[1])
        if what == "charge":
            budget.charge(dp.PureDP(0.25))
        found[what] = ["ok", str(budget.remaining.epsilon)]
    except Exception as exc:
        found[what] = [type(exc).__name__, str(exc)]
print(json.dumps(found))
"""


def _unprivileged() -> list[str]:
    """A command prefix under which file permissions hold (root ignores them: drop the
    capabilities that let it), or skip where that is impossible."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        why = "running as root without setpriv: file permissions cannot be tested"
        if os.environ.get("DPCURATOR_REQUIRE_SETPRIV"):  # CI has util-linux: never skip there
            pytest.fail(why)
        pytest.skip(why)
    caps = "-dac_override,-dac_read_search"
    return [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}"]


@pytest.mark.parametrize("folder_writable", [True, False])
def test_a_read_only_ledger_is_not_called_damaged(tmp_path: Path, folder_writable: bool) -> None:
    """A bug hunt: a ledger this process may not write was reported as 'damaged or truncated:
    restore it from a backup' (every database error but a lock was called damage). It is a
    UserError that names the permissions; where the folder is writable it can still be read."""
    folder = tmp_path / "ledgers"
    folder.mkdir()
    path = folder / "ledger.sqlite"
    _ledger_with_charges(path, 1)
    path.chmod(0o400)
    if not folder_writable:
        folder.chmod(0o500)
    try:
        run = subprocess.run([*_unprivileged(), sys.executable, "-c", _READ_ONLY_CHILD,
                              str(path)], capture_output=True, text=True, timeout=120,
                             check=False)
    finally:
        folder.chmod(0o700)
        path.chmod(0o600)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    if folder_writable:
        assert found["open"] == ["ok", "0.75"]
    else:
        assert found["open"][0] == "UserError" and "read-only" in found["open"][1]
    assert found["charge"][0] == "UserError", found
    assert "read-only for this user" in found["charge"][1]
    assert "damaged" not in found["charge"][1] and "backup" not in found["charge"][1]
    with Budget.open(path) as budget:  # nothing was charged
        assert budget.remaining.epsilon == 0.75


# -- migration of a JSONL journal ---------------------------------------------------------------


def _old_journal(path: Path, epsilons: list[float]) -> None:
    lines = [json.dumps({"sequence": i + 1, "label": f"q{i}", "timestamp": 1.0,
                         "cost": {"type": "PureDP", "neighbouring": "ADD_REMOVE",
                                  "epsilon": e}})
             for i, e in enumerate(epsilons)]
    path.write_text("\n".join(lines) + "\n")


def test_an_old_journal_is_named_and_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    _old_journal(path, [0.25, 0.5])
    with pytest.raises(UserError, match="ledger migrate"):
        Budget(dp.PureDP(1.0), journal=path)
    result = CliRunner().invoke(app, ["ledger", "migrate", str(path), "--epsilon", "1",
                                      "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["remaining"]["epsilon"] == 0.25
    assert (tmp_path / "ledger.jsonl.bak").exists()
    with Budget(dp.PureDP(1.0), journal=path) as budget:  # same path, now a ledger
        assert [c.label for c in budget.ledger] == ["q0", "q1"]
        budget.charge(QUARTER)
        with pytest.raises(BudgetExceededError):
            budget.charge(dp.PureDP(1e-9))


def test_an_overspent_journal_stays_overspent(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    _old_journal(path, [0.75, 0.75])  # the old journal's race let it spend 1.5 of 1
    target = migrate_journal(path, dp.PureDP(1.0), to=tmp_path / "new.sqlite")
    with Budget.open(target) as budget:
        assert budget.spent.epsilon == 1.5 and budget.remaining.epsilon == 0
        with pytest.raises(BudgetExceededError):
            budget.charge(dp.PureDP(1e-9))
    assert SQLiteLedger(target, create=False).verify().entries == 3
    path.write_text("{broken\n")
    with pytest.raises(UserError, match="line 1"):
        migrate_journal(path, dp.PureDP(1.0), to=tmp_path / "other.sqlite")


# -- the owner's commands -----------------------------------------------------------------------


def test_ledger_commands(ledger_factory: Callable[[], str]) -> None:
    target = ledger_factory()
    _ledger_with_charges(target, 2)
    runner = CliRunner()
    shown = json.loads(runner.invoke(app, ["ledger", "show", target, "--json"]).stdout)
    assert shown["accounts"]["default"]["remaining"]["epsilon"] == 0.5
    assert [e["kind"] for e in shown["recent"]] == ["open", "charge", "charge"]
    assert shown["ledger"] == target
    exported = runner.invoke(app, ["ledger", "export", target]).stdout.splitlines()
    assert len(exported) == 3 and json.loads(exported[2])["label"] == "query 1"
    whole = json.loads(runner.invoke(app, ["ledger", "export", target, "--json"]).stdout)
    assert [e["seq"] for e in whole["entries"]] == [1, 2, 3]
    raised = runner.invoke(app, ["ledger", "raise", target, "--epsilon", "3", "--json"])
    assert raised.exit_code == 0 and json.loads(raised.stdout)["remaining"]["epsilon"] == 2.5
    lowered = runner.invoke(app, ["ledger", "raise", target, "--epsilon", "2", "--json"])
    assert lowered.exit_code == 2 and "only be raised" in json.loads(lowered.stdout)["error"]
    nope = ledger_factory()
    for command in ("show", "verify", "export", "raise"):
        missing = runner.invoke(app, ["ledger", command, nope, "--epsilon", "1", "--json"]
                                if command == "raise" else ["ledger", command, nope, "--json"])
        assert missing.exit_code == 2 and "no ledger" in json.loads(missing.stdout)["error"]
    with pytest.raises(UserError, match="no ledger"):  # the owner's commands never create one
        open_ledger(nope, create=False)
    if not _is_postgres(nope):
        assert not Path(nope).exists()
    ok = runner.invoke(app, ["ledger", "verify", target])
    assert ok.exit_code == 0 and ok.stdout.startswith("OK: 4 entries")


# -- the ledger against a model -------------------------------------------------------------------

_OPS = st.lists(st.one_of(
    st.tuples(st.just("charge"), st.floats(min_value=1e-9, max_value=0.6)),
    st.tuples(st.just("raise"), st.floats(min_value=0.0, max_value=0.5)),
    st.tuples(st.just("reopen"), st.just(0.0)),
), max_size=25)


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_OPS)
def test_the_ledger_matches_an_exact_model(ledger_factory: Callable[[], str],
                                           ops: list[tuple[str, float]]) -> None:
    target = ledger_factory()  # a new ledger for each example
    total, spent = Fraction(1), Fraction(0)
    budget = Budget(dp.PureDP(1.0), journal=target)
    for op, value in ops:
        if op == "charge":
            fits = spent + Fraction(value) <= total
            try:
                budget.charge(dp.PureDP(value))
                assert fits
                spent += Fraction(value)
            except BudgetExceededError:
                assert not fits
        elif op == "raise":
            new = float(total) + value
            budget.raise_total(dp.PureDP(new))
            total = Fraction(new)
        else:
            budget.close()
            budget = Budget.open(target)
        left = budget.remaining.epsilon
        assert left is not None and Fraction(left) <= total - spent  # rounded down, never up
    ledger = open_ledger(target, create=False)
    report = ledger.verify()
    assert report.accounts["default"].spent[0] == spent
    ledger.close()
    budget.close()


# -- reservations: several accounts at once, idempotency, stored releases -----------------------


def test_a_reservation_debits_every_account_or_none(ledger_factory: Callable[[], str]) -> None:
    ledger = open_ledger(ledger_factory())
    ledger.open_account("dataset", FilterRule.make(dp.PureDP(1.0)))
    ledger.open_account("alice", FilterRule.make(dp.PureDP(0.5)))
    both = [("alice", QUARTER), ("dataset", QUARTER)]
    first = ledger.reserve(both, analyst="alice", dataset="d", fingerprint="q1", label="q1")
    assert [e.account for e in first.entries] == ["alice", "dataset"] and not first.replayed
    ledger.reserve(both, analyst="alice", dataset="d", fingerprint="q2", label="q2")
    with pytest.raises(BudgetExceededError, match="of 'alice'"):
        ledger.reserve(both, analyst="alice", dataset="d", fingerprint="q3", label="q3")
    # Alice's refusal wrote nothing: the dataset's account still has exactly 0.5 left.
    assert ledger.account("dataset").spent[0] == Fraction(1, 2)  # type: ignore[union-attr]
    assert len(ledger.requests("alice", "d")) == 2
    assert [r.label for r in ledger.requests("alice", "d")] == ["q1", "q2"]
    assert ledger.requests("bob", "d") == []
    ledger.close()


def test_an_idempotent_retry_is_never_charged_twice(ledger_factory: Callable[[], str]) -> None:
    ledger = open_ledger(ledger_factory())
    ledger.open_account("a", FilterRule.make(dp.PureDP(1.0)))
    ask = {"analyst": "alice", "dataset": "d", "label": "q", "idempotency_key": "k1"}
    made = ledger.reserve([("a", QUARTER)], fingerprint="f", **ask)
    again = ledger.reserve([("a", QUARTER)], fingerprint="f", **ask)
    assert again.replayed and again.request.id == made.request.id and not again.entries
    assert again.request == made.request  # every column, the time included, read back exactly
    assert len(ledger.entries("a")) == 2  # the open and one charge
    with pytest.raises(UserError, match="another request"):
        ledger.reserve([("a", QUARTER)], fingerprint="other", **ask)
    # The first stored release wins; a second worker gets it back, never its own.
    assert ledger.store_release(made.request.id, '{"v": 1}') == '{"v": 1}'
    assert ledger.store_release(made.request.id, '{"v": 2}') == '{"v": 1}'
    assert ledger.request(made.request.id).release == '{"v": 1}'  # type: ignore[union-attr]
    ledger.close()


# -- PostgreSQL: where a ledger lives, and what its errors say ---------------------------------


def test_postgres_schemas_keep_deployments_apart(postgres_url: str) -> None:
    name = f"team {secrets.token_hex(4)}; DROP TABLE x"  # any name, quoted as an identifier
    first = PostgresLedger(postgres_url, schema=name)
    assert first.schema == name and "schema=" in first.where
    first.open_account("a", FilterRule.make(dp.PureDP(1.0)))
    first.debit("a", QUARTER)
    same = open_ledger(first.where)  # where names it: the same ledger, found by URL
    assert same.account("a").spent[0] == Fraction(1, 4)  # type: ignore[union-attr]
    other = PostgresLedger(f"{postgres_url}?schema=other_{secrets.token_hex(4)}")
    assert other.accounts() == {}
    with pytest.raises(UserError, match="given twice"):
        PostgresLedger(f"{postgres_url}?schema=a", schema="b")
    for ledger in (first, same, other):
        ledger.close()
    # A schema that holds another program's tables is refused, and left as it was.
    foreign = f"{postgres_url}?schema=app_{secrets.token_hex(4)}"
    with _raw(foreign) as db:
        db.execute(f"CREATE SCHEMA {foreign.rpartition('=')[2]}")
        db.execute("CREATE TABLE entries (x INTEGER)")
    with pytest.raises(UserError, match="not a dpcurator ledger"):
        PostgresLedger(foreign)
    with pytest.raises(UserError, match="no ledger"):
        PostgresLedger(foreign, create=False)


def test_postgres_ledgers_created_at_once_are_one(postgres_url: str) -> None:
    """Eight threads (eight connections) open a new schema at once: one ledger, one id."""
    import threading

    target = f"{postgres_url}?schema=race_{secrets.token_hex(4)}"
    barrier = threading.Barrier(8)
    opened: list[Any] = []

    def create() -> None:
        barrier.wait()
        opened.append(PostgresLedger(target))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(opened) == 8 and len({ledger._ledger_id for ledger in opened}) == 1
    for ledger in opened:
        ledger.close()


def test_postgres_errors_never_show_the_password(postgres_url: str) -> None:
    with_password = postgres_url.replace("postgres@", "postgres:s3cr%40t@", 1)
    shown = PostgresLedger(with_password + "?schema=pw_" + secrets.token_hex(4))
    assert "s3cr" not in shown.where and "postgres:***@" in shown.where
    shown.close()
    for url, message in ((with_password.rsplit("/", 1)[0] + "/no_such_db", "cannot use"),
                         (with_password + "?schema=missing_" + secrets.token_hex(4),
                          "no ledger")):
        with pytest.raises(UserError, match=message) as caught:
            Budget.open(url)
        assert "s3cr" not in str(caught.value) and "***" in str(caught.value)
        result = CliRunner().invoke(app, ["ledger", "verify", url, "--json"])
        assert result.exit_code == 2 and "s3cr" not in result.output


def test_text_postgres_cannot_hold_is_refused_with_nothing_charged(
        postgres_ledger_url: str) -> None:
    ledger = open_ledger(postgres_ledger_url)
    ledger.open_account("a", FilterRule.make(dp.PureDP(1.0)))
    with pytest.raises(UserError, match="cannot store"):
        ledger.reserve([("a", QUARTER)], analyst="alice", dataset="d", fingerprint="f",
                       label="nul \x00 inside")
    assert ledger.account("a").charges == 0  # type: ignore[union-attr]
    assert ledger.verify().entries == 1
    ledger.close()


def test_a_postgres_ledger_reconnects_after_its_connection_is_lost(
        postgres_ledger_url: str) -> None:
    budget = Budget(dp.PureDP(1.0), journal=postgres_ledger_url)
    budget.charge(QUARTER, "before")
    session = budget.ledger_store._db.info.backend_pid  # type: ignore[attr-defined]
    with _raw(postgres_ledger_url) as db:  # the server ends the ledger's session
        db.execute(f"SELECT pg_terminate_backend({int(session)})")
    with pytest.raises(UserError, match="No answer was released"):
        budget.charge(QUARTER, "lost")
    budget.charge(QUARTER, "after")  # a new connection; the chain is checked as before
    assert [c.label for c in budget.ledger] == ["before", "after"]
    budget.close()
