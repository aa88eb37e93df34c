"""The ledger: its total is stored, raised only on purpose, and tampering never reads as a refund.

Concurrency across processes and ``kill -9`` are in tests/test_ledger_processes.py.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import dpcurator as dp
from dpcurator.accounting.filters import FilterRule
from dpcurator.cli import app
from dpcurator.errors import BudgetExceededError, LedgerIntegrityError, UserError
from dpcurator.ledger import Budget, SQLiteLedger, migrate_journal

QUARTER = dp.PureDP(0.25)


def _ledger_with_charges(path: Path, n: int = 3) -> None:
    with Budget(dp.PureDP(1.0), journal=path) as budget:
        for i in range(n):
            budget.charge(QUARTER, f"query {i}")


def _tamper(path: Path, *statements: str) -> None:
    """What an attacker with write access does: drop the guards, then change rows."""
    db = sqlite3.connect(path, isolation_level=None)
    for trigger in ("entries_are_append_only_u", "entries_are_append_only_d", "head_stays"):
        db.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    for statement in statements:
        db.execute(statement)
    db.close()


def _rehash(path: Path, seq: int, edit: Callable[[dict[str, object]], None]) -> None:
    """Edit entry ``seq`` and recompute its own hash (a careful attacker)."""
    db = sqlite3.connect(path, isolation_level=None)
    (body,) = db.execute("SELECT body FROM entries WHERE seq = ?", (seq,)).fetchone()
    data = json.loads(body)
    edit(data)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    digest = hashlib.sha256(text.encode()).hexdigest()
    db.close()
    _tamper(path, f"UPDATE entries SET body = '{text}', hash = '{digest}' WHERE seq = {seq}")


# -- the total -----------------------------------------------------------------------------------


def test_the_total_is_stored_and_a_different_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    _ledger_with_charges(path, 2)
    for other in (dp.PureDP(100.0), dp.PureDP(0.5), dp.ApproxDP(1.0, 1e-6)):
        with pytest.raises(UserError, match="ledger raise"):
            Budget(other, journal=path)
    with Budget.open(path) as budget:  # no total given: the stored one
        assert budget.total == dp.PureDP(1.0)
        assert budget.remaining.epsilon == 0.5
    with Budget(dp.ApproxDP(1.0, 0.0), journal=path) as same:  # the same limits
        assert same.remaining.epsilon == 0.5
    with pytest.raises(UserError, match="no ledger"):
        Budget.open(tmp_path / "missing.sqlite")


def test_a_raise_is_explicit_and_recorded(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    _ledger_with_charges(path, 4)
    budget = Budget.open(path)
    with pytest.raises(BudgetExceededError):
        budget.charge(QUARTER)
    with pytest.raises(UserError, match="only be raised"):
        budget.raise_total(dp.PureDP(0.5))
    budget.raise_total(dp.PureDP(2.0), "new quarter")
    assert budget.total == dp.PureDP(2.0)
    assert budget.remaining.epsilon == 1.0
    budget.charge(QUARTER)
    kinds = [e.kind for e in SQLiteLedger(path, create=False).entries()]
    assert kinds == ["open"] + ["charge"] * 4 + ["raise", "charge"]
    with pytest.raises(UserError, match="ledger raise"):
        Budget(dp.PureDP(1.0), journal=path)  # the old total is no longer the ledger's
    Budget(dp.PureDP(2.0), journal=path).close()


def test_accounts_in_one_ledger_are_separate_budgets(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    alice = Budget(dp.PureDP(1.0), journal=path, account="alice")
    bob = Budget(dp.ZCDP(0.5), journal=path, account="bob")
    alice.charge(dp.PureDP(1.0))
    bob.charge(dp.PureDP(1.0))  # costs rho = 0.5
    assert alice.remaining.epsilon == 0 and bob.remaining.rho == 0
    assert SQLiteLedger(path, create=False).verify().entries == 4


# -- tampering: each case refused, naming the first bad entry ---------------------------------

# Each case gets the ledger built by _tampering_target: 400 padding entries (so the file spans
# many pages and truncation cuts live data), then entry 401 opens the default account and
# entries 402, 403 and 404 charge 0.25 each; the newest entry is 404.
TAMPERING: dict[str, tuple[Callable[[Path], None], str]] = {
    "delete a middle entry": (
        lambda p: _tamper(p, "DELETE FROM entries WHERE seq = 402"), r"entry 402 is missing"),
    "edit an amount": (
        lambda p: _tamper(p, "UPDATE entries SET body = replace(body, '\"epsilon\":0.25', "
                             "'\"epsilon\":0.0625') WHERE seq = 403"),
        r"entry 403 does not match its hash"),
    "edit an entry and its hash": (
        lambda p: _rehash(p, 402, lambda d: d.update(label="edited")),
        r"entry 403 does not follow the entry before it"),
    "edit the newest entry's sums and hash, and the head": (
        lambda p: (_rehash(p, 404, lambda d: d.update(spent=["1/4", "0"])),
                   _tamper(p, "UPDATE head SET hash = (SELECT hash FROM entries "
                              "WHERE seq = 404)")),
        r"entry 404 states running sums"),
    "reorder two entries": (
        lambda p: _tamper(p, "UPDATE entries SET seq = -1 WHERE seq = 402",
                          "UPDATE entries SET seq = 402 WHERE seq = 403",
                          "UPDATE entries SET seq = 403 WHERE seq = -1"),
        r"entry 402 disagrees with its own row"),
    "delete the newest entries": (
        lambda p: _tamper(p, "DELETE FROM entries WHERE seq >= 403"),
        r"head names entry 404 but the entries end at 402"),
    "delete the newest entry and move the head back": (
        lambda p: _tamper(p, "DELETE FROM entries WHERE seq = 404",
                          "UPDATE head SET seq = 403"),
        r"head does not match entry 403"),
    "delete every entry": (
        lambda p: _tamper(p, "DELETE FROM entries"), r"entry 1 onwards were deleted"),
    "replace the ledger id": (
        lambda p: _tamper(p, "UPDATE meta SET value = 'x' WHERE key = 'id'"),
        r"entry 1 does not follow"),
    "truncate the file": (
        lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
        r"cannot be read as a database"),
    "empty the file": (lambda p: p.write_bytes(b""), r"is empty"),
}


def _tampering_target(path: Path) -> None:
    with Budget(dp.PureDP(1.0), journal=path, account="padding") as pad:
        for _ in range(399):
            pad.charge(dp.PureDP(1e-6), "x" * 400)
    _ledger_with_charges(path, 3)
    assert SQLiteLedger(path, create=False).verify().entries == 404


@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_tampering_is_refused_and_never_refunds(tmp_path: Path, case: str) -> None:
    path = tmp_path / "ledger.sqlite"
    _tampering_target(path)
    action, message = TAMPERING[case]
    action(path)
    with pytest.raises(LedgerIntegrityError, match=message):
        Budget(dp.PureDP(1.0), journal=path)
    if case != "empty the file":
        result = CliRunner().invoke(app, ["ledger", "verify", str(path), "--json"])
        assert result.exit_code == 1, result.output
        assert json.loads(result.stdout)["ok"] is False


def test_a_live_budget_refuses_once_its_ledger_is_rolled_back(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    budget = Budget(dp.PureDP(1.0), journal=path)
    budget.charge(QUARTER, "a")
    budget.charge(QUARTER, "b")
    # Roll the file back consistently (delete the newest charge, move the head back): the
    # file alone verifies, but this process remembers what it saw.
    _tamper(path, "DELETE FROM entries WHERE seq = 3",
            "UPDATE head SET seq = 2, hash = (SELECT hash FROM entries WHERE seq = 2)")
    with pytest.raises(LedgerIntegrityError, match="entry 3, verified earlier"):
        budget.charge(QUARTER)
    with pytest.raises(LedgerIntegrityError):
        _ = budget.remaining
    # A new process cannot tell from the file alone (the stated limit); the owner's recorded
    # head can (test_verify_expect_head_detects_a_rollback).
    fresh = SQLiteLedger(path, create=False)
    assert fresh.verify().entries == 2
    fresh.close()


def test_verify_expect_head_detects_a_rollback(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    _ledger_with_charges(path, 2)
    runner = CliRunner()
    shown = json.loads(runner.invoke(app, ["ledger", "show", str(path), "--json"]).stdout)
    head = shown["head"]
    ok = runner.invoke(app, ["ledger", "verify", str(path), "--expect-head", head, "--json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["expected_head_entry"] == 3
    _tamper(path, "DELETE FROM entries WHERE seq = 3",
            "UPDATE head SET seq = 2, hash = (SELECT hash FROM entries WHERE seq = 2)")
    bad = runner.invoke(app, ["ledger", "verify", str(path), "--expect-head", head, "--json"])
    assert bad.exit_code == 1 and "rolled back" in json.loads(bad.stdout)["error"]


def test_honest_code_cannot_update_or_delete_entries(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    _ledger_with_charges(path, 1)
    db = sqlite3.connect(path)
    for statement in ("DELETE FROM entries", "UPDATE entries SET label = 'x'",
                      "DELETE FROM head"):
        with pytest.raises(sqlite3.DatabaseError):
            db.execute(statement)
    db.close()


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


def test_ledger_commands(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    _ledger_with_charges(path, 2)
    runner = CliRunner()
    shown = json.loads(runner.invoke(app, ["ledger", "show", str(path), "--json"]).stdout)
    assert shown["accounts"]["default"]["remaining"]["epsilon"] == 0.5
    assert [e["kind"] for e in shown["recent"]] == ["open", "charge", "charge"]
    exported = runner.invoke(app, ["ledger", "export", str(path)]).stdout.splitlines()
    assert len(exported) == 3 and json.loads(exported[2])["label"] == "query 1"
    whole = json.loads(runner.invoke(app, ["ledger", "export", str(path), "--json"]).stdout)
    assert [e["seq"] for e in whole["entries"]] == [1, 2, 3]
    raised = runner.invoke(app, ["ledger", "raise", str(path), "--epsilon", "3", "--json"])
    assert raised.exit_code == 0 and json.loads(raised.stdout)["remaining"]["epsilon"] == 2.5
    lowered = runner.invoke(app, ["ledger", "raise", str(path), "--epsilon", "2", "--json"])
    assert lowered.exit_code == 2 and "only be raised" in json.loads(lowered.stdout)["error"]
    missing = runner.invoke(app, ["ledger", "show", str(tmp_path / "nope.sqlite"), "--json"])
    assert missing.exit_code == 2 and "no ledger" in json.loads(missing.stdout)["error"]
    assert not (tmp_path / "nope.sqlite").exists()  # the owner's commands never create one
    ok = runner.invoke(app, ["ledger", "verify", str(path)])
    assert ok.exit_code == 0 and ok.stdout.startswith("OK: 4 entries")


# -- the ledger against a model -------------------------------------------------------------------

_OPS = st.lists(st.one_of(
    st.tuples(st.just("charge"), st.floats(min_value=1e-9, max_value=0.6)),
    st.tuples(st.just("raise"), st.floats(min_value=0.0, max_value=0.5)),
    st.tuples(st.just("reopen"), st.just(0.0)),
), max_size=25)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(_OPS)
def test_the_ledger_matches_an_exact_model(tmp_path_factory: pytest.TempPathFactory,
                                           ops: list[tuple[str, float]]) -> None:
    path = tmp_path_factory.mktemp("model") / "ledger.sqlite"
    total, spent = Fraction(1), Fraction(0)
    budget = Budget(dp.PureDP(1.0), journal=path)
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
            budget = Budget.open(path)
        left = budget.remaining.epsilon
        assert left is not None and Fraction(left) <= total - spent  # rounded down, never up
    report = SQLiteLedger(path, create=False).verify()
    assert report.accounts["default"].spent[0] == spent
    budget.close()


# -- reservations: several accounts at once, idempotency, stored releases -----------------------


def test_a_reservation_debits_every_account_or_none(tmp_path: Path) -> None:
    ledger = SQLiteLedger(tmp_path / "ledger.sqlite")
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


def test_an_idempotent_retry_is_never_charged_twice(tmp_path: Path) -> None:
    ledger = SQLiteLedger(tmp_path / "ledger.sqlite")
    ledger.open_account("a", FilterRule.make(dp.PureDP(1.0)))
    ask = {"analyst": "alice", "dataset": "d", "label": "q", "idempotency_key": "k1"}
    made = ledger.reserve([("a", QUARTER)], fingerprint="f", **ask)
    again = ledger.reserve([("a", QUARTER)], fingerprint="f", **ask)
    assert again.replayed and again.request.id == made.request.id and not again.entries
    assert len(ledger.entries("a")) == 2  # the open and one charge
    with pytest.raises(UserError, match="another request"):
        ledger.reserve([("a", QUARTER)], fingerprint="other", **ask)
    # The first stored release wins; a second worker gets it back, never its own.
    assert ledger.store_release(made.request.id, '{"v": 1}') == '{"v": 1}'
    assert ledger.store_release(made.request.id, '{"v": 2}') == '{"v": 1}'
    assert ledger.request(made.request.id).release == '{"v": 1}'  # type: ignore[union-attr]
