"""One service on several processes (issue 28, part 3), in process: what they share is the ledger.

Two ``Service`` objects over one ledger stand for two workers of ``dpcurator serve --workers
N``, or two services on two machines over one PostgreSQL ledger: each has its own memory, so
whatever holds across them holds through the ledger alone. Each test runs on SQLite and on
the run's PostgreSQL server. The live servers (uvicorn workers, two services on two ports,
``kill -9`` of one worker) are in tests/test_workers_live.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server extra is not installed")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from dpcurator.ledger import open_ledger
from dpcurator.server import create_app, load_config
from test_server import ALICE, BOB, BY_REGION, COUNT, ask, auth, write_service

ONE_TOKEN_IN_A_MILLENNIUM = 1 / (1000 * 365 * 24 * 3600)  # a rate that never refills in a test


@pytest.fixture
def services(tmp_path: Path, ledger_factory: Callable[[], str]) -> Iterator[Any]:
    """``services(n, extra=..., dataset_extra=...)``: n test clients, each of a service of its
    own over one ledger (SQLite, or a schema on the run's PostgreSQL server)."""
    target = ledger_factory()
    apps: list[Any] = []

    def start(n: int, *, extra: str = "", dataset_extra: str = "") -> list[TestClient]:
        config = write_service(tmp_path, extra=extra)
        text = config.read_text().replace('ledger = "ledger.sqlite"', f'ledger = "{target}"')
        text = text.replace("[datasets.visits]", f"{dataset_extra}\n[datasets.visits]")
        config.write_text(text)
        clients = []
        for _ in range(n):
            app = create_app(load_config(config))
            apps.append(app)
            clients.append(TestClient(app, raise_server_exceptions=False))
        return clients

    start.target = target  # type: ignore[attr-defined]
    yield start
    for app in apps:
        app.state.service.close()


def charges(target: str, account: str) -> int:
    ledger = open_ledger(target, create=False)
    try:
        return sum(e.kind == "charge" for e in ledger.entries(account))
    finally:
        ledger.close()


def test_a_release_made_by_one_service_is_sent_free_by_another(services: Any) -> None:
    a, b = services(2)
    made = ask(a, ALICE, BY_REGION, epsilon=0.2)
    assert made.status_code == 200 and made.json()["cached"] is False
    target = services.target
    assert charges(target, "analyst/alice/orders") == 1
    for key in (None, "a-new-key"):  # found in the ledger by the query's fingerprint
        again = ask(b, ALICE, BY_REGION, epsilon=0.2, key=key)
        assert again.status_code == 200 and again.json()["cached"] is True
        assert again.json()["rows"] == made.json()["rows"]
        assert again.json()["intervals"] == made.json()["intervals"]
    unkeyed = ask(b, ALICE, BY_REGION, epsilon=0.2).json()
    assert unkeyed["query_id"] == made.json()["query_id"]  # her own request, found
    # The same query written otherwise resolves to the same plan: the same release.
    spaced = "select region,  COUNT(*) AS n, SUM(amount) AS total FROM data GROUP BY region"
    assert ask(b, ALICE, spaced, epsilon=0.2).json()["query_id"] == made.json()["query_id"]
    assert charges(target, "analyst/alice/orders") == 1
    assert charges(target, "dataset/orders") == 1
    # A third process, started after all this (a restart), finds it too.
    (c,) = services(1)
    assert ask(c, ALICE, BY_REGION, epsilon=0.2).json()["query_id"] == made.json()["query_id"]
    # Another analyst asking the same is charged and answered afresh, told nothing.
    bob = ask(b, BOB, BY_REGION, epsilon=0.2).json()
    assert bob["cached"] is False and made.json()["query_id"] not in json.dumps(bob)
    assert charges(target, "analyst/bob/orders") == 1
    # Another privacy or another interval level is another release (found only at the level
    # it was stored at): charged.
    assert ask(b, ALICE, BY_REGION, epsilon=0.3).json()["cached"] is False
    assert ask(b, ALICE, BY_REGION, epsilon=0.2, confidence=0.9).json()["cached"] is False
    assert charges(target, "analyst/alice/orders") == 3


def test_a_retry_on_another_process_completes_the_same_request(services: Any) -> None:
    """The Idempotency-Key is checked against the query's fingerprint, which every process
    computes alike: the retry of a request made on one is that request on the other."""
    a, b = services(2)
    first = ask(a, ALICE, COUNT, epsilon=0.25, key="k-1").json()
    retry = ask(b, ALICE, COUNT, epsilon=0.25, key="k-1").json()
    assert retry["query_id"] == first["query_id"] and retry["cached"] is True
    conflict = ask(b, ALICE, COUNT, epsilon=0.5, key="k-1")
    assert conflict.status_code == 409
    assert charges(services.target, "analyst/alice/orders") == 1


def test_shared_releases_cross_processes_only_through_the_askers_budget(
        services: Any) -> None:
    a, b = services(2, dataset_extra="share_releases = true")
    alice = ask(a, ALICE, BY_REGION, epsilon=0.3).json()
    bob = ask(b, BOB, BY_REGION, epsilon=0.3).json()
    assert bob["rows"] == alice["rows"] and bob["cached"] is True
    assert bob["query_id"] != alice["query_id"] and alice["query_id"] not in json.dumps(bob)
    target = services.target
    assert charges(target, "analyst/bob/orders") == 1  # Bob pays for what he sees ...
    assert charges(target, "dataset/orders") == 1  # ... the data once
    assert b.get(f"/v1/datasets/orders/queries/{alice['query_id']}",
                 headers=auth(BOB)).status_code == 404
    assert ask(a, BOB, BY_REGION, epsilon=0.3).json()["query_id"] == bob["query_id"]  # his own
    assert charges(target, "analyst/bob/orders") == 1


def test_the_rate_limit_holds_across_processes(services: Any) -> None:
    """Burst 10 and no refill: exactly 10 requests pass, however they are spread."""
    a, b = services(2, extra=f"""
[limits]
requests_per_second = {ONE_TOKEN_IN_A_MILLENNIUM!r}
burst = 10
""")
    statuses = [c.get("/v1/datasets/orders/budget", headers=auth(ALICE)).status_code
                for _ in range(8) for c in (a, b)]
    assert statuses.count(200) == 10 and statuses.count(429) == 6
    assert statuses[:10] == [200] * 10
    assert b.get("/v1/datasets/orders/budget", headers=auth(BOB)).status_code == 200  # his own


_TAKE_MANY = """
import sys
from dpcurator.ledger import open_rate_buckets
buckets = open_rate_buckets(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()  # all ready: go
print(sum(buckets.take("alice", rate=float(sys.argv[2]), burst=50) for _ in range(2000)))
"""


def test_rate_buckets_admit_exactly_the_burst_across_racing_processes(
        ledger_factory: Callable[[], str]) -> None:
    """4 processes, released together, try 2,000 takes each from one bucket of 50: exactly
    50 are had (the take is one atomic statement; with no refill the count is exact)."""
    target = ledger_factory()
    open_ledger(target).close()  # the ledger's folder or schema exists, as under a service
    racers = [subprocess.Popen([sys.executable, "-c", _TAKE_MANY, target,
                                repr(ONE_TOKEN_IN_A_MILLENNIUM)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
              for _ in range(4)]
    for racer in racers:  # each opened its buckets ...
        assert racer.stdout is not None and racer.stdout.readline() == "ready\n"
    for racer in racers:  # ... then all are released at once
        assert racer.stdin is not None
        racer.stdin.write("go\n")
        racer.stdin.flush()
    taken = [int(racer.communicate(timeout=120)[0]) for racer in racers]
    assert sum(taken) == 50, taken


def test_a_ledger_made_before_gets_the_index_of_stored_releases(
        ledger_factory: Callable[[], str]) -> None:
    """Stored releases are looked up by (dataset, fingerprint) through an index; a ledger made
    before it has it added when it is next opened (still verifying)."""
    target = ledger_factory()
    open_ledger(target).close()
    if target.startswith("postgresql://"):
        import psycopg

        url, schema = target.split("?schema=")
        with psycopg.connect(url, autocommit=True) as db:
            db.execute(f'DROP INDEX "{schema}".requests_by_fingerprint')

            def indexed() -> bool:
                return db.execute("SELECT 1 FROM pg_indexes WHERE schemaname = %s AND "
                                  "indexname = 'requests_by_fingerprint'",
                                  (schema,)).fetchone() is not None

            assert not indexed()
            open_ledger(target, create=False).close()
            assert indexed()
        return
    import sqlite3

    def has_index() -> bool:
        with sqlite3.connect(target) as db:
            return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'index' AND "
                              "name = 'requests_by_fingerprint'").fetchone() is not None

    with sqlite3.connect(target) as db:
        db.execute("DROP INDEX requests_by_fingerprint")
    assert not has_index()
    ledger = open_ledger(target, create=False)
    ledger.verify()
    ledger.close()
    assert has_index()
