"""One service on several workers, for real (issue 28, part 3): ``dpcurator serve --workers 4``
on loopback, two services on two ports over one PostgreSQL ledger, ``kill -9`` of one worker.

What must hold: 200 clients racing over 4 workers, or over two services sharing a PostgreSQL
ledger, never spend more than any budget (the ledger's totals checked exactly), every answer
is charged once, retries are free wherever they land; a release made by one service is sent
free by the other; a worker killed under load loses no charge (every charge committed is
either answered or completed for free by a retry with its key), and is replaced.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server extra is not installed")
pytest.importorskip("uvicorn", reason="the server extra is not installed")

import dpcurator as dp
from dpcurator.ledger import open_ledger
from test_server_live import (
    ALICE,
    BOB,
    SLOW,
    LiveServer,
    _answers,
    _load,
    check_the_race,
    write_config,
)

WORKERS = 4


class WorkerServer(LiveServer):
    """``dpcurator serve --workers N`` (its log in a file); ``start`` waits for every worker."""

    def __init__(self, config: Path, workers: int, program: list[str] | None = None) -> None:
        super().__init__(config, program, ["--workers", str(workers), "--access-log", "off"])
        self.workers = workers
        self.log = config.parent / f"serve-{self.port}.log"

    def start(self) -> None:
        seen = self.started()
        self.process = subprocess.Popen(
            [*self.program, "serve", "--config", str(self.config), "--port", str(self.port),
             *self.options], stdout=subprocess.DEVNULL, stderr=self.log.open("ab"))
        self.wait_for(seen + self.workers)

    def started(self) -> int:
        """How many workers have started since the log began (replacements included)."""
        return (self.log.read_text(errors="replace").count("Application startup complete")
                if self.log.exists() else 0)

    def wait_for(self, started: int) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited: {self.log.read_text()[-3000:]}")
            if self.started() >= started:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=5) as answer:
                    assert answer.status == 200
                return
            time.sleep(0.1)
        raise RuntimeError(f"the workers did not start in 120 s: {self.log.read_text()[-3000:]}")

    def worker_pids(self) -> list[int]:
        """The uvicorn workers: the supervisor's spawned children."""
        assert self.process is not None
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            if parent == self.process.pid and b"spawn_main" in cmdline:
                pids.append(int(entry.name))
        return pids


def post_query(url: str, token: str, sql: str) -> tuple[int, dict[str, Any]]:
    """A query with no Idempotency-Key (as a bare HTTP client sends it)."""
    request = urllib.request.Request(
        f"{url}/v1/datasets/orders/queries", method="POST",
        data=json.dumps({"sql": sql, "epsilon": 2.0**-5}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def sockets(pid: int) -> int:
    """How many sockets a process holds (a worker's client connections, and a few of its own);
    a descriptor closed while they are counted is not one."""
    held = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            held += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return held


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[WorkerServer]:
    server = WorkerServer(write_config(tmp_path), WORKERS)
    server.start()
    yield server
    server.stop()


def test_200_clients_racing_over_4_workers_never_overspend(workers: WorkerServer,
                                                           tmp_path: Path) -> None:
    assert len(workers.worker_pids()) == WORKERS
    clients = [_load(workers, token, f"{name}{p}", 50, tmp_path / f"load-{name}{p}.jsonl")
               for name, token in (("alice", ALICE), ("bob", BOB)) for p in range(2)]
    for client in clients:
        assert client.wait(timeout=600) == 0
    ledger = open_ledger(str(tmp_path / "ledger.sqlite"), create=False)
    try:
        check_the_race(ledger, _answers(tmp_path))
    finally:
        ledger.close()


def test_keep_alive_answers_wait_for_no_acknowledgement_and_spread_over_workers(
        workers: WorkerServer) -> None:
    """Cached answers on one keep-alive connection take a few milliseconds each: with Nagle's
    algorithm on the workers' connections (uvicorn's own socket with ``workers=N``), every
    response's body waited for the client's delayed acknowledgement of its head, 40 ms on
    Linux. And 16 connections opened together land on more than one worker (the kernel
    spreads them over the workers' ``SO_REUSEPORT`` sockets by their addresses' hash: all 16
    on one of 4 has probability 4 * 4**-16 < 1e-9; uvicorn's shared socket put 50 on 2)."""
    import http.client

    body = json.dumps({"sql": "SELECT COUNT(*) AS n FROM data", "epsilon": 2.0**-5})
    headers = {"Authorization": f"Bearer {ALICE}", "Content-Type": "application/json"}
    before = {pid: sockets(pid) for pid in workers.worker_pids()}
    connections = [http.client.HTTPConnection("127.0.0.1", workers.port, timeout=60)
                   for _ in range(16)]
    try:
        took = []
        for i in range(60):
            connection = connections[0] if i >= 16 else connections[i]
            started = time.perf_counter()
            connection.request("POST", "/v1/datasets/orders/queries", body, headers)
            answer = connection.getresponse()
            sent = json.loads(answer.read())
            took.append(time.perf_counter() - started)
            assert answer.status == 200 and (i == 0 or sent["cached"] is True), sent
        held = [sockets(pid) - count for pid, count in before.items()]
    finally:
        for connection in connections:
            connection.close()
    assert sorted(took[20:])[20] < 0.02, [round(t * 1000, 1) for t in took]  # median, s
    assert sum(h > 0 for h in held) >= 2, held


def test_two_services_over_one_postgres_ledger(tmp_path: Path, postgres_ledger_url: str
                                               ) -> None:
    """As two machines would run them: each its own folder, configuration and audit log;
    the ledger (budgets, stored releases, rate limits) is the one thing they share."""
    servers = []
    for side in ("a", "b"):
        folder = tmp_path / side
        folder.mkdir()
        config = write_config(folder)
        config.write_text(config.read_text().replace('ledger = "ledger.sqlite"',
                                                     f'ledger = "{postgres_ledger_url}"'))
        servers.append(LiveServer(config, options=["--access-log", "off"]))
    try:
        for server in servers:
            server.start()
        a, b = servers
        clients = [_load(server, token, f"{name}{side}", 50,
                         tmp_path / f"load-{name}{side}.jsonl")
                   for side, server in (("a", a), ("b", b))
                   for name, token in (("alice", ALICE), ("bob", BOB))]
        for client in clients:
            assert client.wait(timeout=600) == 0
        answers = _answers(tmp_path)
        ledger = open_ledger(postgres_ledger_url, create=False)
        try:
            check_the_race(ledger, answers)
            charged = sum(e.kind == "charge" for e in ledger.entries())
            # A release one service made, asked of the other with no key: sent free (every
            # budget is spent by now, so anything but the stored release would be a 403).
            # Whose it is depends on the race (either analyst's budget may run out on a
            # first): the first release service a made, for whichever analyst it was.
            made_on_a = next(x for x in answers if x["status"] == 200
                             and str(x["key"]).startswith(("alicea", "boba")))
            prefix = "alicea" if str(made_on_a["key"]).startswith("alicea") else "boba"
            asker, other = (ALICE, BOB) if prefix == "alicea" else (BOB, ALICE)
            thread, n = str(made_on_a["key"]).rsplit("-", 2)[-2:]
            sql = f"SELECT COUNT(*) AS c_{prefix}_{thread}_{n} FROM data"
            status, again = post_query(b.url, asker, sql)
            assert status == 200 and again["cached"] is True
            assert again["query_id"] == made_on_a["query_id"]  # the asker's request, found
            assert again["rows"] == made_on_a["rows"]
            client = dp.connect(b.url, asker, dataset="orders").sql(sql, epsilon=2.0**-5)
            assert client["cached"] is True and client["rows"] == made_on_a["rows"]
            status, refused = post_query(b.url, other, sql)  # not sent another's release
            assert status == 403 and made_on_a["query_id"] not in json.dumps(refused)
            assert sum(e.kind == "charge" for e in ledger.entries()) == charged
        finally:
            ledger.close()
    finally:
        for server in servers:
            server.stop()


def test_kill_9_of_one_worker_loses_no_charge(tmp_path: Path) -> None:
    """Two workers (enough to kill one under load; fewer to start); each answer waits 1.5 s
    after its charge. 40 client threads each hold at most one request (one connection) at a
    time. Once 21 or more requests are charged and unanswered, the worker holding the most
    connections is killed: the other holds at most 20, so the victim held some of them
    (unless they were all answered in the milliseconds between; each waits 1.5 s). The
    supervisor starts a new worker; every charge in the ledger is either a release a client
    received or is completed, for free, by a retry with its key."""
    server = WorkerServer(write_config(tmp_path), 2, program=[sys.executable, SLOW, "1.5"])
    server.start()
    try:
        clients = [_load(server, token, f"{name}k", 20, tmp_path / f"load-{name}.jsonl",
                         repeat=True) for name, token in (("alice", ALICE), ("bob", BOB))]
        ledger = open_ledger(str(tmp_path / "ledger.sqlite"), create=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sum(
                r.release is None for name in ("alice", "bob")
                for r in ledger.requests(name, "orders")) < 21:
            time.sleep(0.01)
        victim = max(server.worker_pids(), key=sockets)
        started = server.started()
        os.kill(victim, 9)
        for client in clients:
            client.wait(timeout=120)
        server.wait_for(started + 1)  # a new worker in its place
        assert victim not in server.worker_pids() and len(server.worker_pids()) == 2
        received = [a for a in _answers(tmp_path) if a["status"] == 200]
        requests = {r.id: r for name in ("alice", "bob")
                    for r in ledger.requests(name, "orders")}
        ledger.verify()
        for answer in received:  # every release received is stored, as received
            stored = requests[str(answer["query_id"])].release
            assert stored is not None and json.loads(stored)["rows"] == answer["rows"]
        charges = sum(e.kind == "charge" for e in ledger.entries("dataset/orders"))
        assert charges == len(requests)  # one dataset charge per request, none without one
        stranded = [r for r in requests.values() if r.release is None]
        assert stranded, "the kill stranded nothing: the test did not test"

        def complete(request: Any) -> dict[str, Any]:  # the same call again, with its key
            prefix, thread, n = str(request.idempotency_key).rsplit("-", 2)
            token = ALICE if request.analyst == "alice" else BOB
            return dp.connect(server.url, token, dataset="orders").sql(
                f"SELECT COUNT(*) AS c_{prefix.replace('-', '_')}_{thread}_{n} FROM data",
                epsilon=2.0**-5, idempotency_key=request.idempotency_key)

        with ThreadPoolExecutor(len(stranded)) as pool:  # at once: each answer waits 1.5 s
            for request, again in zip(stranded, pool.map(complete, stranded), strict=True):
                assert again["query_id"] == request.id and again["cached"] is True
        assert sum(e.kind == "charge" for e in ledger.entries("dataset/orders")) == charges
        assert all(r.release is not None for name in ("alice", "bob")
                   for r in ledger.requests(name, "orders"))
        ledger.close()
    finally:
        server.stop()


def test_behind_a_proxy_the_address_limit_counts_the_forwarded_address(tmp_path: Path
                                                                        ) -> None:
    """From a trusted proxy (``--forwarded-allow-ips``, default 127.0.0.1) the per-address
    limit counts, and the audit log names, the address in X-Forwarded-For; from any other
    address the header is ignored, so a client cannot pick the address it is limited as."""
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace(
        "address_requests_per_second = 10000\naddress_burst = 10000",
        "address_requests_per_second = 1e-9\naddress_burst = 5"))

    def health(server: LiveServer, forwarded: str) -> int:
        request = urllib.request.Request(f"{server.url}/healthz",
                                         headers={"X-Forwarded-For": forwarded})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    trusted = LiveServer(config, options=["--access-log", "off"])
    trusted.start()
    try:
        assert [health(trusted, "203.0.113.7") for _ in range(6)] == [200] * 5 + [429]
        assert [health(trusted, f"203.0.113.{i}") for i in range(20, 26)] == [200] * 6
    finally:
        trusted.stop()
    clients = [json.loads(line)["client"] for line in
               (tmp_path / "ledger.audit.jsonl").read_text().splitlines()]
    assert clients.count("203.0.113.7") == 6 and "203.0.113.25" in clients
    elsewhere = LiveServer(config, options=["--access-log", "off",
                                            "--forwarded-allow-ips", "10.9.9.9"])
    elsewhere.start()  # its readiness check took one of 127.0.0.1's five
    try:
        statuses = [health(elsewhere, f"203.0.113.{i}") for i in range(40, 46)]
        assert statuses[-2:] == [429, 429] and statuses.count(200) <= 4
    finally:
        elsewhere.stop()
