"""The service for real: uvicorn on loopback, clients in several processes, ``kill -9``.

What must hold (issue 12): 200 concurrent clients racing to overspend one analyst budget and
one dataset budget never charge more than either, every answered query is charged exactly
once, idempotent retries are never charged twice; after the server is killed under load and
restarted, the ledger verifies, every release a client received has its charge, no charge is
lost, and a retry completes a request the kill interrupted without paying again.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server extra is not installed")
pytest.importorskip("uvicorn", reason="the server extra is not installed")

import dpcurator as dp
from dpcurator.ledger import Ledger, SQLiteLedger
from dpcurator.server.client import RemoteError, connect

LOAD = str(Path(__file__).with_name("_service_load.py"))
SLOW = str(Path(__file__).with_name("_slow_server.py"))
ALICE, BOB = "alice-live-token-000000", "bob-live-token-000000"
STEP = Fraction(1, 32)


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def write_config(folder: Path) -> Path:
    rows = ["customer_id,region,amount"] + [f"{i % 400},{['n', 's'][i % 2]},{i % 90}"
                                            for i in range(4000)]
    (folder / "orders.csv").write_text("\n".join(rows) + "\n")
    config = folder / "curator.toml"
    config.write_text(f"""ledger = "ledger.sqlite"
[datasets.orders]
path = "orders.csv"
privacy_unit = "customer_id"
bounds = {{ amount = [0, 100] }}
budget = {{ epsilon = 1.5 }}
[analysts.alice]
token_sha256 = "{_sha(ALICE)}"
budgets = {{ orders = {{ epsilon = 1.0 }} }}
[analysts.bob]
token_sha256 = "{_sha(BOB)}"
budgets = {{ orders = {{ epsilon = 1.0 }} }}
[limits]
requests_per_second = 10000
burst = 10000
address_requests_per_second = 10000
address_burst = 10000
""")
    return config


class LiveServer:
    """``python -m dpcurator serve`` in a process of its own, on a free loopback port
    (``program``: what runs instead of ``python -m dpcurator``; ``options``: more options)."""

    def __init__(self, config: Path, program: list[str] | None = None,
                 options: list[str] | None = None) -> None:
        self.config = config
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.program = program or [sys.executable, "-m", "dpcurator"]
        self.options = options or []

    def start(self) -> None:
        self.process = subprocess.Popen(
            [*self.program, "serve", "--config", str(self.config), "--port", str(self.port),
             *self.options], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited: {self.process.stderr.read().decode()}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the server did not start in 60 s")

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveServer]:
    server = LiveServer(write_config(tmp_path))
    server.start()
    yield server
    server.stop()


def _load(server: LiveServer, token: str, prefix: str, threads: int, out: Path,
          repeat: bool = False) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, LOAD, server.url, token, "orders", prefix,
                             str(threads), str(out)] + (["--repeat"] if repeat else []))


def _answers(folder: Path) -> list[dict[str, object]]:
    return [json.loads(line) for out in sorted(folder.glob("load-*.jsonl"))
            for line in out.read_text().splitlines() if line.strip()]


def test_python_and_cli_clients(live: LiveServer, tmp_path: Path) -> None:
    orders = dp.connect(live.url, ALICE, dataset="orders")
    # 300 customers are too few to choose the cap on each one's rows at 0.25: the widest
    # cap's count is honest and may read 0, so only its type is checked here
    answer = orders.sql("SELECT COUNT(*) AS n FROM data", epsilon=0.25)
    assert answer["privacy"]["epsilon"] == 0.25
    assert isinstance(answer["rows"][0]["n"], int | float) and answer["warnings"]
    # remaining and ledger as a Curator's: an Amount, and a tuple of Charge (CuratorLike)
    assert orders.remaining == dp.ledger.Amount(epsilon=0.75, delta=0.0)
    assert [c.cost for c in orders.ledger] == [dp.PureDP(0.25)]
    assert [r["query_id"] for r in orders.history()] == [answer["query_id"]]
    assert connect(live.url, BOB).dataset == "orders"  # the only one: chosen for you
    from dpcurator.query import Query

    # one row per customer (300 of them): the noise's scale is 10, and a count of 0 needs
    # noise below -300 (w.p. e^-30); left to the data, the cap on each customer's rows is
    # too thin to choose at 0.1, and the widest cap's count may read 0
    built = connect(live.url, BOB).run(Query().count("rows").bound_contributions(
        max_partitions=1, max_rows_per_partition=1), epsilon=0.1)
    assert built["privacy"]["epsilon"] == 0.1 and built["rows"][0]["rows"] > 0
    bounded = connect(live.url, BOB).sql("SELECT COUNT(*) AS n FROM data", epsilon=0.1,
                                         intervals="bounded", bounding="unit")
    assert bounded["interval_kinds"] == {"n": "bounded"} and bounded["bounding"] == "unit"
    with pytest.raises(dp.errors.BudgetExceededError):
        orders.sql("SELECT COUNT(*) AS m FROM data", epsilon=0.9)
    with pytest.raises(dp.errors.UserError, match="token"):
        dp.connect(live.url, "wrong", dataset="orders").sql("SELECT COUNT(*) FROM data",
                                                            epsilon=0.1)
    command = [sys.executable, "-m", "dpcurator", "query", "orders", "--server", live.url,
               "--sql", "SELECT COUNT(*) AS k FROM data", "--epsilon", "0.5", "--json",
               "--bounding", "rescale"]  # the caps per group: the release names no bounding
    done = subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DPCURATOR_TOKEN": ALICE})
    assert done.returncode == 0, done.stderr
    assert "bounding" not in json.loads(done.stdout)
    assert json.loads(done.stdout)["remaining"] == {"epsilon": 0.25, "delta": 0.0}
    again = subprocess.run(command, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "DPCURATOR_TOKEN": ALICE})
    assert again.returncode == 0 and json.loads(again.stdout)["cached"] is True  # free
    other = [*command[:8], "SELECT COUNT(*) AS k2 FROM data", *command[9:]]
    refused = subprocess.run(other, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "DPCURATOR_TOKEN": ALICE})
    assert refused.returncode == 2
    assert json.loads(refused.stdout)["type"] == "BudgetExceededError"


def check_the_race(ledger: Ledger, answers: list[dict[str, Any]]) -> None:
    """200 clients (100 as Alice, 100 as Bob) each asked 1/32 and retried with the same key.
    Alice and Bob may spend 1 each, the dataset 1.5 (48 queries): the dataset's binds, and
    must be spent exactly; every answer charged once; every retry free, the same request."""
    firsts: dict[str, dict[str, Any]] = {}
    for a in answers:
        firsts.setdefault(str(a["key"]), a)
    answered = {k: a for k, a in firsts.items() if a["status"] == 200}
    refused = [a for a in firsts.values() if a["status"] != 200]
    assert len(firsts) == 200
    assert all(a["status"] == 403 and a["error"] == "budget_exhausted" for a in refused)
    report = ledger.verify()
    spent = {name: state.spent[0] for name, state in report.accounts.items()}
    assert spent["dataset/orders"] == Fraction(3, 2)  # exactly the total: 48 queries
    assert spent["analyst/alice/orders"] <= 1 and spent["analyst/bob/orders"] <= 1
    assert len(answered) == 48
    assert sum(e.kind == "charge" for e in ledger.entries("dataset/orders")) == 48
    retries = [a for a in answers if a["status"] == 200 and a is not firsts[str(a["key"])]]
    assert len(retries) == 48 and all(a["cached"] is True for a in retries)
    assert all(a["query_id"] == answered[str(a["key"])]["query_id"] for a in retries)
    stored = {r.id for name in ("alice", "bob") for r in ledger.requests(name, "orders")}
    assert stored == {str(a["query_id"]) for a in answered.values()}


def test_200_clients_racing_never_overspend(live: LiveServer, tmp_path: Path) -> None:
    # 4 processes of 50 threads: 100 clients as Alice, 100 as Bob, each asking 1/32 and then
    # retrying with the same key. Alice and Bob may spend 1 each (32 queries), the dataset
    # 1.5 (48 queries): the dataset's budget binds.
    clients = [_load(live, token, f"{name}{p}", 50, tmp_path / f"load-{name}{p}.jsonl")
               for name, token in (("alice", ALICE), ("bob", BOB)) for p in range(2)]
    for client in clients:
        assert client.wait(timeout=600) == 0
    check_the_race(SQLiteLedger(live.config.parent / "ledger.sqlite", create=False),
                   _answers(tmp_path))


def test_kill_9_under_load_then_restart(live: LiveServer, tmp_path: Path) -> None:
    clients = [_load(live, token, f"{name}k", 25, tmp_path / f"load-{name}.jsonl",
                     repeat=True) for name, token in (("alice", ALICE), ("bob", BOB))]
    deadline = time.monotonic() + 60
    while len(_answers(tmp_path)) < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    live.kill()  # in the middle of the load
    for client in clients:
        client.wait(timeout=120)
    received = [a for a in _answers(tmp_path) if a["status"] == 200]
    assert received, "the clients got nothing before the kill"
    live.start()  # the same configuration and ledger
    ledger = SQLiteLedger(live.config.parent / "ledger.sqlite", create=False)
    ledger.verify()
    requests = {r.id: r for name in ("alice", "bob") for r in ledger.requests(name, "orders")}
    entries = {e.seq: e for e in ledger.entries()}
    # Every release a client received is stored, with its charges (the analyst's, then the
    # dataset's, in the request's transaction), and is the one it got.
    for answer in received:
        request = requests[str(answer["query_id"])]
        assert request.release is not None
        assert json.loads(request.release)["rows"] == answer["rows"]
        mine, dataset = entries[request.first_entry], entries[request.first_entry + 1]
        assert (mine.account, dataset.account) == (f"analyst/{request.analyst}/orders",
                                                   "dataset/orders")
        assert mine.kind == dataset.kind == "charge" and mine.label == request.label
    # No charge without its request, none lost: one dataset charge per request.
    dataset_charges = [e for e in ledger.entries("dataset/orders") if e.kind == "charge"]
    assert len(dataset_charges) == len(requests)
    # Retrying every request after the restart completes the interrupted ones, for free.
    for request in requests.values():
        key = request.idempotency_key
        assert key is not None
        thread, n = key.rsplit("-", 2)[-2:]
        token = ALICE if request.analyst == "alice" else BOB
        prefix = key.rsplit("-", 2)[0]
        sql = f"SELECT COUNT(*) AS c_{prefix.replace('-', '_')}_{thread}_{n} FROM data"
        again = dp.connect(live.url, token, dataset="orders").sql(
            sql, epsilon=2.0**-5, idempotency_key=key)
        assert again["query_id"] == request.id and again["cached"] is True
    after = SQLiteLedger(live.config.parent / "ledger.sqlite", create=False)
    assert len([e for e in after.entries("dataset/orders") if e.kind == "charge"]) == len(
        requests)
    assert all(r.release is not None for name in ("alice", "bob")
               for r in after.requests(name, "orders"))


def test_a_stranded_request_is_completed_by_the_same_call(tmp_path: Path) -> None:
    """A server killed (-9) after charging a query and before answering it: the client's
    RemoteError carries the request's Idempotency-Key, and the same call made again (by the
    same client, by a new one as a re-run script would, or with the key given) completes that
    request, for free; a second deliberate identical call is a request of its own."""
    config = write_config(tmp_path)
    access = tmp_path / "access.log"
    server = LiveServer(config, program=[sys.executable, SLOW, "120"],
                        options=["--access-log", str(access)])
    server.start()
    try:
        orders = dp.connect(server.url, ALICE, dataset="orders")
        query = "SELECT COUNT(*) AS n FROM data"
        outcome: list[BaseException | dict[str, object]] = []

        def ask() -> None:
            try:
                outcome.append(orders.sql(query, epsilon=0.25))
            except BaseException as exc:  # what the test looks at
                outcome.append(exc)

        caller = threading.Thread(target=ask)
        caller.start()
        ledger_file = config.parent / "ledger.sqlite"
        deadline, stranded = time.monotonic() + 60, None
        while stranded is None and time.monotonic() < deadline:
            with sqlite3.connect(ledger_file) as db:
                stranded = db.execute("SELECT id FROM requests WHERE release IS NULL"
                                      ).fetchone()
            time.sleep(0.05)
        assert stranded is not None, "the request was never charged"
        server.kill()  # charged, not answered
        caller.join(timeout=60)
        (error,) = outcome
        assert isinstance(error, RemoteError), error
        assert error.idempotency_key and error.idempotency_key in str(error)
    finally:
        server.stop()
    server.program = [sys.executable, "-m", "dpcurator"]  # the same port, answers at once
    server.start()
    try:
        def charges() -> int:
            ledger = SQLiteLedger(ledger_file, create=False)
            try:
                return sum(e.kind == "charge" for e in ledger.entries("dataset/orders"))
            finally:
                ledger.close()

        assert charges() == 1
        retried = orders.sql(query, epsilon=0.25)  # the same call, the same client
        assert retried["query_id"] == stranded[0] and retried["cached"] is True
        rerun = dp.connect(server.url, ALICE, dataset="orders").sql(query, epsilon=0.25)
        assert rerun["query_id"] == stranded[0]  # a re-run script derives the same key
        keyed = dp.connect(server.url, ALICE, dataset="orders").sql(
            query, epsilon=0.25, idempotency_key=error.idempotency_key)
        assert keyed["query_id"] == stranded[0]
        assert charges() == 1  # completed for free
        second = orders.sql(query, epsilon=0.25)  # a deliberate second call: its own request
        assert second["query_id"] != stranded[0]
        other = orders.sql("SELECT COUNT(*) AS m FROM data", epsilon=0.25)
        assert other["cached"] is False and charges() == 2
    finally:
        server.stop()
    logged = access.read_text()  # the access log, one bounded line per request
    assert '"GET /healthz" 200' in logged and '"POST /v1/datasets/orders/queries" 200' in logged
    assert "alice" in logged
