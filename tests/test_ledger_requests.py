"""The ledger's whole state is covered by its chain, and re-checked while it is used.

The requests table (who asked what, the idempotency key, the label, the stored release) is
recorded by ``request`` and ``release`` entries; an edited, inserted or deleted row is
refused at open, by ``verify`` and by ``dpcurator ledger verify``. A ledger object in use
re-reads what each debit depends on and sweeps the old entries, so an old entry edited under
a running process is found; once found, the object refuses everything. Files are 0600.
Both databases, as in tests/test_ledger.py.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import dpcurator as dp
from dpcurator.accounting.filters import FilterRule
from dpcurator.cli import app
from dpcurator.errors import LedgerIntegrityError, UserError
from dpcurator.ledger import Ledger, open_ledger
from test_ledger import _raw, _rehash, _tamper

QUARTER = dp.PureDP(0.25)
RELEASE = json.dumps({"rows": [{"n": 12}]})


def _service_like(target: str) -> tuple[Ledger, str, str]:
    """A ledger as the service uses it: two accounts, a request answered, one charged only."""
    ledger = open_ledger(target)
    for account in ("dataset/d", "analyst/a/d"):
        ledger.open_account(account, FilterRule.make(dp.PureDP(1.0)))
    debits = [("analyst/a/d", QUARTER), ("dataset/d", QUARTER)]
    answered = ledger.reserve(debits, analyst="a", dataset="d", fingerprint="f1",
                              label="a: SELECT 1", idempotency_key="k1").request.id
    assert ledger.store_release(answered, RELEASE) == RELEASE
    pending = ledger.reserve(debits, analyst="a", dataset="d", fingerprint="f2",
                             label="a: SELECT 2", idempotency_key="k2").request.id
    return ledger, answered, pending


def _verify_cli(target: str) -> dict[str, object]:
    result = CliRunner().invoke(app, ["ledger", "verify", target, "--json"])
    out: dict[str, object] = json.loads(result.stdout)
    assert (result.exit_code == 0) == (out["ok"] is True), result.output
    return out


REQUEST_TAMPERING: dict[str, tuple[Callable[[str, str, str], object], str]] = {
    "edit a label": (lambda t, a, p: _tamper(
        t, f"UPDATE requests SET label = 'b: SELECT 1' WHERE id = '{a}'"),
        r"request {a} does not match entry \d+, which recorded it"),
    "give a request to another analyst": (lambda t, a, p: _tamper(
        t, f"UPDATE requests SET analyst = 'b' WHERE id = '{a}'"),
        r"request {a} does not match entry"),
    "edit a stored release": (lambda t, a, p: _tamper(
        t, "UPDATE requests SET release = '{\"rows\": [{\"n\": 13}]}' " f"WHERE id = '{a}'"),
        r"request {a} holds a release that does not match entry"),
    "delete a stored release": (lambda t, a, p: _tamper(
        t, f"UPDATE requests SET release = NULL WHERE id = '{a}'"),
        r"request {a} lost the release that entry \d+ recorded"),
    "store a release no one made": (lambda t, a, p: _tamper(
        t, "UPDATE requests SET release = '{\"rows\": []}' " f"WHERE id = '{p}'"),
        r"request {p} holds a release that no entry recorded"),
    "insert a request": (lambda t, a, p: _tamper(
        t, "INSERT INTO requests (id, analyst, dataset, idempotency_key, fingerprint, created, "
           "first_entry, label, release) VALUES ('forged', 'a', 'd', 'k9', 'f9', 1.0, 3, "
           "'a: x', '{}')"),
        r"request forged is recorded by no entry"),
    "delete a request": (lambda t, a, p: _tamper(t, f"DELETE FROM requests WHERE id = '{p}'"),
                         r"the request recorded by entry \d+ was deleted"),
}


@pytest.mark.parametrize("case", sorted(REQUEST_TAMPERING))
@pytest.mark.parametrize("ledger_factory", ["sqlite", "postgres"], indirect=True)
def test_the_requests_table_is_covered_by_the_chain(ledger_factory: Callable[[], str],
                                                    case: str) -> None:
    target = ledger_factory()
    ledger, answered, pending = _service_like(target)
    assert ledger.verify().requests == 2
    ledger.close()
    assert _verify_cli(target)["ok"] is True
    action, message = REQUEST_TAMPERING[case]
    action(target, answered, pending)
    pattern = message.format(a=answered, p=pending)
    with pytest.raises(LedgerIntegrityError, match=pattern):
        open_ledger(target, create=False)
    out = _verify_cli(target)
    assert out["ok"] is False and "request" in str(out["error"])


@pytest.mark.parametrize("ledger_factory", ["sqlite", "postgres"], indirect=True)
def test_a_request_read_while_serving_is_checked(ledger_factory: Callable[[], str]) -> None:
    """A retry (by key), a replay (by id) and a history read each check the rows they read;
    after one fails the object refuses every operation, charges included."""
    target = ledger_factory()
    ledger, answered, _ = _service_like(target)
    _tamper(target, "UPDATE requests SET release = '{\"rows\": [{\"n\": 99}]}' "
                    f"WHERE id = '{answered}'")
    with pytest.raises(LedgerIntegrityError, match=f"request {answered} holds a release"):
        ledger.reserve([("analyst/a/d", QUARTER)], analyst="a", dataset="d", fingerprint="f1",
                       label="a: SELECT 1", idempotency_key="k1")
    for read in (lambda: ledger.request(answered), lambda: ledger.requests("a", "d"),
                 lambda: ledger.debit("dataset/d", QUARTER), ledger.accounts):
        with pytest.raises(LedgerIntegrityError, match=f"request {answered}"):
            read()
    assert ledger.integrity_failure is not None
    with _raw(target) as db:  # nothing more was charged
        assert db.execute("SELECT COUNT(*) FROM entries WHERE kind = 'charge' AND "
                          "account = 'dataset/d'").fetchone()[0] == 2
    ledger.close()


@pytest.mark.parametrize("ledger_factory", ["sqlite", "postgres"], indirect=True)
def test_an_old_entry_edited_under_a_live_ledger_is_found(
        ledger_factory: Callable[[], str]) -> None:
    """The account's opening entry, edited (and rehashed) while the ledger is open: the next
    debit of that account re-reads it and refuses; a consistent edit of an old entry of
    another account is found by the sweep within a bounded number of writes, and by verify."""
    target = ledger_factory()
    ledger, _, _ = _service_like(target)
    _rehash(target, 1, lambda d: d.update(label="edited"))
    with pytest.raises(LedgerIntegrityError, match="entry 1, verified earlier by this process, "
                                                   "was changed"):
        ledger.debit("dataset/d", QUARTER)
    with pytest.raises(LedgerIntegrityError, match="entry 1"):
        ledger.account("analyst/a/d")  # the object refuses from now on
    ledger.close()

    target = ledger_factory()
    ledger = open_ledger(target)
    ledger.open_account("old", FilterRule.make(dp.PureDP(1.0)))
    ledger.open_account("busy", FilterRule.make(dp.PureDP(1000.0)))
    for _ in range(150):
        ledger.debit("old", dp.PureDP(1e-3), "old charge")
    _rehash(target, 40, lambda d: d.update(label="edited"))
    writes = 0
    with pytest.raises(LedgerIntegrityError, match="entry 40, verified earlier"):
        while writes < 10:  # 152 entries, 64 a write: round the chain in at most 3 writes
            ledger.debit("busy", dp.PureDP(1e-3), "new charge")
            writes += 1
    assert writes <= 3
    ledger.close()
    with pytest.raises(LedgerIntegrityError):
        open_ledger(target, create=False)


def test_verify_finds_an_edit_the_targeted_checks_do_not_read(tmp_path: Path) -> None:
    target = str(tmp_path / "ledger.sqlite")
    ledger, _, _ = _service_like(target)
    _tamper(target, "UPDATE entries SET body = replace(body, 'SELECT 1', 'SELECT 9') "
                    "WHERE seq = 3")
    assert ledger.account("dataset/d") is not None  # a read checks only the newest entries
    with pytest.raises(LedgerIntegrityError, match="entry 3 does not match its hash"):
        ledger.verify()
    with pytest.raises(LedgerIntegrityError, match="entry 3"):
        ledger.account("dataset/d")
    assert ledger.integrity_failure is not None and "entry 3" in ledger.integrity_failure


def test_a_ledger_made_before_requests_were_chained_records_them_once(tmp_path: Path) -> None:
    """Rows written by an older version (no request entries) are recorded at the first open,
    as they stand; from then on they are covered like any other."""
    target = str(tmp_path / "ledger.sqlite")
    ledger = open_ledger(target)
    ledger.open_account("dataset/d", FilterRule.make(dp.PureDP(1.0)))
    ledger.close()
    with _raw(target) as db:
        db.execute("INSERT INTO requests (id, analyst, dataset, idempotency_key, fingerprint, "
                   "created, first_entry, label, release) VALUES ('old', 'a', 'd', NULL, 'f', "
                   "1.5, 0, 'a: SELECT 1', '{\"rows\": []}')")
    reopened = open_ledger(target)
    assert reopened.verify().requests == 1
    kinds = [e.kind for e in reopened.entries()]
    assert kinds == ["open", "request", "release"]
    reopened.close()
    open_ledger(target).close()  # a second open records nothing more
    assert [e.kind for e in open_ledger(target).entries()] == kinds
    _tamper(target, "UPDATE requests SET label = 'x' WHERE id = 'old'")
    with pytest.raises(LedgerIntegrityError, match="request old does not match"):
        open_ledger(target)


def test_request_accounts_are_the_ledgers_own(tmp_path: Path) -> None:
    ledger = open_ledger(str(tmp_path / "ledger.sqlite"))
    with pytest.raises(UserError, match="request/"):
        ledger.open_account("request/x", FilterRule.make(dp.PureDP(1.0)))


@pytest.fixture
def umask_022() -> Iterator[None]:
    saved = os.umask(0o022)
    yield
    os.umask(saved)


def test_ledger_files_are_created_owner_only(tmp_path: Path, umask_022: None) -> None:
    path = tmp_path / "ledger.sqlite"
    budget = dp.Budget(dp.PureDP(1.0), journal=path)
    budget.charge(QUARTER, "a query")
    reader = sqlite3.connect(path)  # keeps the -wal and -shm files while we look
    reader.execute("SELECT COUNT(*) FROM entries").fetchone()
    files = [path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}.lock")]
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in files if f.exists()}
    assert set(modes) >= {path.name, f"{path.name}-wal", f"{path.name}-shm"}
    assert all(mode == 0o600 for mode in modes.values()), modes
    reader.close()
    budget.close()
