"""The service hardened (issue 28, part 2): each finding of the attacker's review, as a test.

- releases do not cross analysts (unless a dataset shares them, and then only through a charge
  to the asker's own budget, under a request id of the asker's own);
- a ledger edited while the service runs is found (by the charge that reads it, by the timer
  that verifies the whole ledger), every charge is then refused (503) and /healthz says so;
- every request is audited in one line of bounded size, 401, 429 and GETs included;
- requests are rate-limited per address before authentication;
- strict JSON types (422 naming the field), 413 for a streamed body over the limit;
- /docs is served from the package, with no CDN.

In process (FastAPI's test client); the live server (kill -9, the access log) is in
tests/test_server_live.py.
"""

from __future__ import annotations

import json
import sqlite3
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server extra is not installed")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from typer.testing import CliRunner

from dpcurator.cli import app as cli
from dpcurator.server import ConfigError, create_app, load_config
from test_server import ALICE, BOB, COUNT, SECRET, ask, auth, sha, write_service

CAROL = "carol-token-0123456789"
_CAROL = f"""
[analysts.carol]
token_sha256 = "{sha(CAROL)}"
budgets = {{ orders = {{ epsilon = 0.3 }} }}
"""


def _charges(folder: Path, account: str) -> int:
    """Charges to an account, read from the file as it is (even a ledger that no longer
    verifies)."""
    with sqlite3.connect(folder / "ledger.sqlite") as db:
        (n,) = db.execute("SELECT COUNT(*) FROM entries WHERE kind = 'charge' AND account = ?",
                          (account,)).fetchone()
    return int(n)


def _tamper(folder: Path, *statements: str) -> None:
    db = sqlite3.connect(folder / "ledger.sqlite", isolation_level=None)
    try:
        for trigger in ("entries_are_append_only_u", "entries_are_append_only_d"):
            db.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        for statement in statements:
            db.execute(statement)
    finally:
        db.close()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    """``serve(extra)``: a test client of a service with ``extra`` configuration."""
    apps = []

    def start(extra: str = "", dataset_extra: str = "", top: str = "") -> TestClient:
        config = write_service(tmp_path, extra=_CAROL + extra)
        config.write_text(top + config.read_text())
        if dataset_extra:
            text = config.read_text().replace("[datasets.visits]",
                                              f"{dataset_extra}\n[datasets.visits]")
            config.write_text(text)
        app = create_app(load_config(config))
        apps.append(app)
        return TestClient(app, raise_server_exceptions=False)

    yield start
    for app in apps:
        app.state.service.close()


# -- releases are the analyst's own --------------------------------------------------------------


def test_an_analyst_never_gets_a_colleagues_release(serve: Any, tmp_path: Path) -> None:
    """The review's attack: Bob, and Carol with no budget left, send Alice's query text and
    epsilon (with no key, and with Alice's key). Neither gets her release, her query_id, or
    ``cached: true``; Bob pays for his own; Carol is refused, charged nothing."""
    c = serve()
    alice = ask(c, ALICE, epsilon=0.3, key="alice-key").json()
    assert alice["cached"] is False
    assert ask(c, CAROL, "SELECT COUNT(*) AS mine FROM data", epsilon=0.3).status_code == 200
    before = _charges(tmp_path, "dataset/orders")

    for key in (None, "alice-key"):
        refused = ask(c, CAROL, epsilon=0.3, key=key)
        assert refused.status_code == 403, refused.text
        assert alice["query_id"] not in refused.text and "cached" not in refused.text
    assert _charges(tmp_path, "dataset/orders") == before  # nothing charged to Carol

    bob = ask(c, BOB, epsilon=0.3, key="alice-key").json()  # Alice's key, Alice's query
    assert bob["cached"] is False and bob["query_id"] != alice["query_id"]
    assert _charges(tmp_path, "analyst/bob/orders") == 1  # paid for by Bob
    unkeyed = ask(c, BOB, epsilon=0.3).json()  # no key: his own release again, free
    assert unkeyed["query_id"] == bob["query_id"] and unkeyed["cached"] is True
    assert alice["query_id"] not in json.dumps(unkeyed)
    assert _charges(tmp_path, "analyst/bob/orders") == 1
    assert c.get(f"/v1/datasets/orders/queries/{alice['query_id']}",
                 headers=auth(BOB)).status_code == 404
    history = c.get("/v1/datasets/orders/history", headers=auth(BOB)).json()["releases"]
    assert [r["query_id"] for r in history] == [bob["query_id"]]


def test_a_dataset_may_share_its_releases(serve: Any, tmp_path: Path) -> None:
    """``share_releases = true``: Bob gets Alice's release, charged to his own budget only,
    under a request id of his own; Carol, whose budget is spent, gets nothing."""
    c = serve(dataset_extra="share_releases = true")
    alice = ask(c, ALICE, epsilon=0.3).json()
    ask(c, CAROL, "SELECT COUNT(*) AS mine FROM data", epsilon=0.3)
    dataset_charges = _charges(tmp_path, "dataset/orders")
    bob = ask(c, BOB, epsilon=0.3).json()
    assert bob["rows"] == alice["rows"] and bob["cached"] is True
    assert bob["query_id"] != alice["query_id"] and alice["query_id"] not in json.dumps(bob)
    assert _charges(tmp_path, "analyst/bob/orders") == 1
    assert _charges(tmp_path, "dataset/orders") == dataset_charges  # the data paid once
    assert bob["remaining"]["epsilon"] == pytest.approx(2.2)
    again = ask(c, BOB, epsilon=0.3).json()
    assert again["query_id"] == bob["query_id"]  # his own, free
    assert _charges(tmp_path, "analyst/bob/orders") == 1
    refused = ask(c, CAROL, epsilon=0.3)
    assert refused.status_code == 403 and alice["query_id"] not in refused.text
    assert c.get(f"/v1/datasets/orders/queries/{bob['query_id']}",
                 headers=auth(BOB)).json()["rows"] == alice["rows"]
    assert c.get(f"/v1/datasets/orders/queries/{alice['query_id']}",
                 headers=auth(BOB)).status_code == 404


def test_share_releases_is_checked(tmp_path: Path) -> None:
    config = write_service(tmp_path)
    config.write_text(config.read_text().replace(
        "[datasets.visits]", 'share_releases = "yes"\n[datasets.visits]'))
    with pytest.raises(ConfigError, match="share_releases must be true or false"):
        load_config(config)


# -- the ledger, re-checked while serving --------------------------------------------------------


def _health(c: TestClient) -> tuple[int, dict[str, Any]]:
    answer = c.get("/healthz")
    return answer.status_code, answer.json()


def test_an_old_entry_edited_while_serving_is_found(serve: Any, tmp_path: Path) -> None:
    """An entry no charge reads (an analyst's opening, long ago), edited under the running
    service: the timer's verification finds it; from then on every query is a 503 JSON
    error with nothing charged, /healthz says what failed and when the ledger was last
    verified, and `dpcurator ledger verify` agrees."""
    c = serve(top="verify_every_s = 0.1\n")
    ask(c, ALICE, epsilon=0.2)
    status, health = _health(c)
    assert status == 200 and health["ledger"]["verified"] is True
    verified_at = health["ledger"]["verified_at"]
    time.sleep(0.3)
    assert _health(c)[1]["ledger"]["verified_at"] > verified_at  # verified again, and again
    _tamper(tmp_path, "UPDATE entries SET body = replace(body, '\"label\":\"\"', "
                      "'\"label\":\"x\"') WHERE seq = 4")
    deadline = time.monotonic() + 30
    while status == 200 and time.monotonic() < deadline:
        time.sleep(0.1)
        status, health = _health(c)
    assert status == 503, health
    assert health["ledger"]["verified"] is False
    assert "entry 4 does not match its hash" in health["ledger"]["error"]
    assert health["ledger"]["verified_at"] >= verified_at and health["ledger"]["failed_at"]
    assert str(tmp_path) not in json.dumps(health)  # not where the ledger is
    charged = _charges(tmp_path, "dataset/orders")
    for answer in (ask(c, ALICE, "SELECT COUNT(*) AS fresh FROM data", epsilon=0.2),
                   ask(c, ALICE, epsilon=0.2),  # a release already made: refused too
                   c.get("/v1/datasets/orders/budget", headers=auth(ALICE))):
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["type"] == "ledger_unavailable"
    assert _charges(tmp_path, "dataset/orders") == charged
    verified = CliRunner().invoke(cli, ["ledger", "verify", str(tmp_path / "ledger.sqlite"),
                                        "--json"])
    assert verified.exit_code == 1 and "entry 4" in json.loads(verified.stdout)["error"]


def test_a_charge_checks_the_entries_it_reads(serve: Any, tmp_path: Path) -> None:
    """The dataset account's opening entry, edited: the very next charge re-reads it and is
    refused, without waiting for the timer."""
    c = serve(top="verify_every_s = 3600\n")
    ask(c, ALICE, epsilon=0.2)
    with sqlite3.connect(tmp_path / "ledger.sqlite") as db:
        (opening,) = db.execute("SELECT seq FROM entries WHERE account = 'dataset/orders' "
                                "AND kind = 'open'").fetchone()
    _tamper(tmp_path, "UPDATE entries SET body = replace(body, '\"label\":\"\"', "
                      f"'\"label\":\"x\"') WHERE seq = {opening}")
    charged = _charges(tmp_path, "dataset/orders")
    refused = ask(c, ALICE, "SELECT COUNT(*) AS fresh FROM data", epsilon=0.2)
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "ledger_unavailable"
    assert _charges(tmp_path, "dataset/orders") == charged
    status, health = _health(c)
    assert status == 503 and f"entry {opening}" in health["ledger"]["error"]


def test_a_stored_release_edited_while_serving_is_never_sent(serve: Any,
                                                             tmp_path: Path) -> None:
    c = serve(top="verify_every_s = 3600\n")
    made = ask(c, ALICE, epsilon=0.2).json()
    forged = json.dumps({**made, "rows": [{"n": 1}]})
    db = sqlite3.connect(tmp_path / "ledger.sqlite", isolation_level=None)
    db.execute("UPDATE requests SET release = ? WHERE id = ?", (forged, made["query_id"]))
    db.close()
    replay = c.get(f"/v1/datasets/orders/queries/{made['query_id']}", headers=auth(ALICE))
    assert replay.status_code == 503 and '"n": 1' not in replay.text
    assert c.get("/v1/datasets/orders/history", headers=auth(ALICE)).status_code == 503
    assert ask(c, ALICE, "SELECT COUNT(*) AS other FROM data", epsilon=0.1).status_code == 503


# -- every request audited, in bounded lines; the address limit before authentication -----------


def _audit(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in
            (folder / "ledger.audit.jsonl").read_text().splitlines()]


def _raw_asgi(c: TestClient, method: str, path: str, headers: dict[str, str],
              body: bytes = b"") -> int:
    """One request straight to the ASGI app: a path longer than an HTTP client will send."""
    import anyio

    statuses: list[int] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("testclient", 50000),
             "server": ("testserver", 80),
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    anyio.run(c.app, scope, receive, send)
    return statuses[0]


def test_every_request_is_audited_in_a_bounded_line(serve: Any, tmp_path: Path) -> None:
    c = serve()
    huge = "d" * 100_000
    assert _raw_asgi(c, "GET", f"/v1/datasets/{huge}/budget", auth(ALICE)) == 404
    body = json.dumps({"sql": "x" * 15_000, "epsilon": 0.1}).encode()
    assert _raw_asgi(c, "POST", f"/v1/datasets/{huge}/queries",
                     auth("wrong") | {"content-type": "application/json"}, body) == 401
    assert c.get("/v1/datasets", headers=auth(ALICE)).status_code == 200
    assert c.get("/healthz").status_code == 200
    assert ask(c, ALICE, "SELECT COUNT(*) AS n FROM data WHERE region = '" + "r" * 15_000
               + "'", epsilon=0.1).status_code in (200, 400)
    text = (tmp_path / "ledger.audit.jsonl").read_text()
    lines = _audit(tmp_path)
    assert len(lines) == 5
    assert max(len(line) for line in text.splitlines()) < 4096
    assert [(r["method"], r["status"]) for r in lines] == [
        ("GET", 404), ("POST", 401), ("GET", 200), ("GET", 200), ("POST", lines[4]["status"])]
    assert lines[0]["analyst"] == "alice" and lines[0]["dataset"].endswith("[100000 chars]")
    assert lines[1]["error"] == "unauthorized" and "analyst" not in lines[1]
    assert lines[2]["action"] == "datasets" and lines[3]["action"] == "healthz"
    assert all(r["client"] == "testclient" for r in lines)
    assert str(SECRET) not in text


def test_requests_are_limited_per_address_before_authentication(serve: Any,
                                                                tmp_path: Path) -> None:
    c = serve(extra="[limits]\naddress_requests_per_second = 0.001\naddress_burst = 5\n")
    # Requests that authenticate count against the analyst, not the address.
    assert all(c.get("/v1/datasets", headers=auth(ALICE)).status_code == 200
               for _ in range(20))
    statuses = [c.get("/v1/datasets", headers=auth("guess")).status_code for _ in range(8)]
    assert statuses == [401] * 5 + [429] * 3
    # The address is now refused before its token is even looked at, valid or not.
    limited = c.get("/v1/datasets", headers=auth(ALICE))
    assert limited.status_code == 429 and limited.json()["error"]["type"] == "rate_limited"
    assert [r["status"] for r in _audit(tmp_path)][-4:] == [429] * 4


# -- strict input, and the size limit for every body ---------------------------------------------


@pytest.mark.parametrize("privacy", [{"epsilon": "0.1"}, {"epsilon": True},
                                     {"epsilon": 0.1, "delta": "0"},
                                     {"epsilon": 0.1, "confidence": False}])
def test_json_types_are_strict(serve: Any, tmp_path: Path, privacy: dict[str, Any]) -> None:
    c = serve()
    refused = c.post("/v1/datasets/orders/queries", headers=auth(ALICE),
                     json={"sql": COUNT, **privacy})
    assert refused.status_code == 422
    error = refused.json()["error"]
    field = next(k for k, v in privacy.items() if not isinstance(v, float) or k != "epsilon")
    assert error["type"] == "invalid_request" and error["message"].startswith(f"{field}:")
    assert _charges(tmp_path, "dataset/orders") == 0
    whole = c.post("/v1/datasets/orders/queries", headers=auth(ALICE),
                   json={"sql": COUNT, "epsilon": 1})  # an integer is a number
    assert whole.status_code == 200, whole.text


def test_a_streamed_body_over_the_limit_is_413(serve: Any, tmp_path: Path) -> None:
    c = serve(extra="[limits]\nmax_body_bytes = 1000\n")

    def chunks(total: int) -> Iterator[bytes]:
        body = json.dumps({"sql": COUNT, "epsilon": 0.1, "keys": ["k" * 50] * (total // 56)})
        for start in range(0, len(body), 100):
            yield body[start:start + 100].encode()

    too_large = c.post("/v1/datasets/orders/queries", content=chunks(5000),
                       headers=auth(ALICE) | {"Content-Type": "application/json"})
    assert too_large.status_code == 413, too_large.text
    assert too_large.json()["error"]["type"] == "too_large"
    fits = c.post("/v1/datasets/orders/queries", content=chunks(300),
                  headers=auth(ALICE) | {"Content-Type": "application/json"})
    assert fits.status_code != 413, fits.text
    assert _charges(tmp_path, "dataset/orders") == (1 if fits.status_code == 200 else 0)


# -- the documentation, offline --------------------------------------------------------------------


def test_the_docs_are_served_from_the_package(serve: Any) -> None:
    pytest.importorskip("swagger_ui_bundle", reason="the server extra is not installed")
    c = serve()
    page = c.get("/docs")
    assert page.status_code == 200 and "SwaggerUIBundle" in page.text
    assert "http://" not in page.text and "https://" not in page.text  # no CDN, no site
    for asset, kind in (("swagger-ui-bundle.js", "javascript"), ("swagger-ui.css", "css"),
                        ("favicon-32x32.png", "image/png")):
        assert f'"/docs/assets/{asset}"' in page.text
        answer = c.get(f"/docs/assets/{asset}")
        assert answer.status_code == 200 and kind in answer.headers["content-type"]
    assert len(c.get("/docs/assets/swagger-ui-bundle.js").content) > 500_000
    assert c.get("/docs/assets/..%2F..%2F__init__.py").status_code == 404
    assert c.get("/openapi.json").json()["openapi"].startswith("3.1")


# -- the command line: a token kept in a file of its own, the access log ---------------------------


def test_a_token_file_is_owner_only_and_never_overwritten(tmp_path: Path) -> None:
    import hashlib

    target = tmp_path / "alice.token"
    made = CliRunner().invoke(cli, ["serve", "token", "alice", "--token-file", str(target)])
    assert made.exit_code == 0, made.output
    token = target.read_text().strip()
    assert made.stdout == (f'[analysts.alice]\ntoken_sha256 = '
                           f'"{hashlib.sha256(token.encode()).hexdigest()}"\n')
    assert token not in made.stdout and target.stat().st_mode & 0o077 == 0
    again = CliRunner().invoke(cli, ["serve", "token", "alice", "--token-file", str(target)])
    assert again.exit_code != 0 and "never overwritten" in again.output
    assert target.read_text().strip() == token


def test_a_token_name_with_a_dot_is_one_toml_key_and_a_bad_name_writes_nothing(
        tmp_path: Path) -> None:
    """``serve token alice.smith`` wrote ``[analysts.alice.smith]``, a nested table the
    configuration then refused, and ``bob smith`` invalid TOML, exiting 0 with the token file
    written (a bug hunt). A dotted name is now a quoted key, and a name the configuration
    refuses is refused before any file is written."""
    import tomllib

    made = CliRunner().invoke(cli, ["serve", "token", "alice.smith"])
    assert made.exit_code == 0, made.output
    lines = made.stdout[made.stdout.index("[analysts"):]
    assert list(tomllib.loads(lines)["analysts"]) == ["alice.smith"]
    target = tmp_path / "bob.token"
    bad = CliRunner().invoke(cli, ["serve", "token", "bob smith", "--token-file", str(target)])
    assert bad.exit_code != 0 and "letters, digits" in bad.output and not target.exists()


def test_the_access_log_is_configurable(tmp_path: Path) -> None:
    import logging

    from dpcurator.cli.serve import _access_handler

    assert _access_handler("off") is None
    assert isinstance(_access_handler("-"), logging.StreamHandler)
    handler = _access_handler(str(tmp_path / "access.log"))
    assert isinstance(handler, logging.FileHandler)
    handler.close()
    assert (tmp_path / "access.log").stat().st_mode & 0o077 == 0
