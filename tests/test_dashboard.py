"""The dashboard's API, asked directly (no browser): who may read what, paging, the owner's
view, the posterior, the static pages.

An analyst's token must never open another analyst's queries or releases, nor a dataset it
has no budget on (such a dataset reads exactly as an unknown one); an owner's token is not an
analyst's and the reverse. Every route the app has is listed here with who may read it, so
a new route without a rule fails ``test_every_route_has_a_rule``.
"""

from __future__ import annotations

import json
import re
import sqlite3
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server extra is not installed")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient
    from starlette.routing import Route

from typer.testing import CliRunner

from dpcurator.accounting import ApproxDP, PureDP
from dpcurator.accounting.posterior import posterior_bounds
from dpcurator.cli import app as cli
from dpcurator.server import ConfigError, create_app, load_config
from test_server import ALICE, BOB, EVE, SECRET, ask, auth, sha, write_service

OLGA = "olga-owner-token-0123456789"
MARKER = "SELECT COUNT(*) AS alice_private_marker FROM data"
OWNER = f"""[owners.olga]
token_sha256 = "{sha(OLGA)}"
[limits]
requests_per_second = 10000
burst = 10000
address_requests_per_second = 10000
address_burst = 10000
"""

# Who may read each route: "dataset" (an analyst, on a dataset they have a budget on),
# "analyst", "owner", "token" (an analyst or an owner), "public" (no token: data-free).
RULES = {
    ("POST", "/v1/datasets/{name}/queries"): "dataset",
    ("POST", "/v1/datasets/{name}/explain"): "dataset",
    ("GET", "/v1/datasets/{name}/budget"): "dataset",
    ("GET", "/v1/datasets/{name}/ledger"): "dataset",
    ("GET", "/v1/datasets/{name}/history"): "dataset",
    ("GET", "/v1/datasets/{name}/queries/{query_id}"): "dataset",
    ("GET", "/v1/datasets"): "analyst",
    ("GET", "/v1/whoami"): "token",
    ("GET", "/v1/posterior"): "token",
    ("GET", "/v1/owner/overview"): "owner",
    ("GET", "/v1/owner/audit"): "owner",
    ("GET", "/healthz"): "public",
    ("GET", "/docs"): "public",
    ("GET", "/docs/assets/{asset}"): "public",
    ("GET", "/openapi.json"): "public",
    ("GET", "/"): "public",
    ("GET", "/static/{path:path}"): "public",
}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    write_service(tmp_path, extra=OWNER)
    return tmp_path


@pytest.fixture
def client(folder: Path) -> Iterator[TestClient]:
    app = create_app(load_config(folder / "curator.toml"))
    with TestClient(app) as test_client:
        yield test_client
    app.state.service.close()


def _routes(client: TestClient) -> set[tuple[str, str]]:
    found = set()
    for route in client.app.routes:  # type: ignore[attr-defined]
        if isinstance(route, Route):
            for method in route.methods or ():
                if method != "HEAD":
                    found.add((method, route.path))
    return found


def test_every_route_has_a_rule(client: TestClient) -> None:
    assert _routes(client) == set(RULES)


def _dataset_requests(name: str, query_id: str) -> list[tuple[str, str, Any]]:
    """One request to every dataset route of ``RULES``."""
    base = f"/v1/datasets/{name}"
    return [("POST", f"{base}/queries", {"sql": "SELECT COUNT(*) AS n FROM data",
                                          "epsilon": 0.1}),
            ("POST", f"{base}/explain", {"sql": "SELECT COUNT(*) AS n FROM data",
                                          "epsilon": 0.1}),
            ("GET", f"{base}/budget", None), ("GET", f"{base}/ledger", None),
            ("GET", f"{base}/history", None), ("GET", f"{base}/queries/{query_id}", None)]


def _call(client: TestClient, method: str, path: str, body: Any, token: str | None) -> Any:
    headers = auth(token) if token else {}
    return client.request(method, path, headers=headers, json=body)


def test_an_unbudgeted_dataset_reads_as_an_unknown_one_on_every_route(
        client: TestClient) -> None:
    """Alice has no budget on visits: every dataset route answers as for a name that does
    not exist (status, type and message, but for the name itself)."""
    assert len(_dataset_requests("x", "q")) == sum(r == "dataset" for r in RULES.values())
    for (method, path, body), (_, other, _) in zip(
            _dataset_requests("visits", "0" * 32), _dataset_requests("nosuch", "0" * 32),
            strict=True):
        unbudgeted = _call(client, method, path, body, ALICE)
        unknown = _call(client, method, other, body, ALICE)
        assert unbudgeted.status_code == unknown.status_code == 404, path
        assert unbudgeted.json() == json.loads(unknown.text.replace("nosuch", "visits")), path


def test_owner_and_analyst_tokens_open_only_their_own_routes(client: TestClient) -> None:
    made = ask(client, ALICE, epsilon=0.1).json()
    for method, path, body in _dataset_requests("orders", made["query_id"]):
        assert _call(client, method, path, body, OLGA).status_code == 401, path
        assert _call(client, method, path, body, None).status_code == 401, path
    assert _call(client, "GET", "/v1/datasets", None, OLGA).status_code == 401
    for path in ("/v1/owner/overview", "/v1/owner/audit"):
        for token in (ALICE, BOB, None):
            refused = _call(client, "GET", path, None, token)
            assert refused.status_code == 401, (path, token)
            assert refused.json() == client.get(path).json()  # as if no token at all
        assert _call(client, "GET", path, None, OLGA).status_code == 200
    assert client.get("/v1/whoami", headers=auth(OLGA)).json() == {"role": "owner",
                                                                    "name": "olga"}
    assert client.get("/v1/whoami", headers=auth(BOB)).json() == {"role": "analyst",
                                                                   "name": "bob"}
    assert client.get("/v1/whoami").status_code == 401
    assert client.get("/v1/posterior?epsilon=1").status_code == 401


def test_an_analyst_never_reads_another_analysts_queries(client: TestClient) -> None:
    """Alice asks a query with a marker in it; every answer Bob gets, on every route he may
    use (his datasets, his own release, the static pages), holds neither her query's text nor
    its id; asking for her release by id is the same 404 as for an id that never existed."""
    alice = ask(client, ALICE, MARKER, epsilon=0.1).json()
    mine = ask(client, BOB, "SELECT COUNT(*) AS bobs FROM data", epsilon=0.1).json()
    secrets_of_alice = ("alice_private_marker", alice["query_id"], str(SECRET))
    answers = []
    for name in ("orders", "visits"):
        for method, path, body in _dataset_requests(name, mine["query_id"]):
            answers.append(_call(client, method, path, body, BOB))
    for path in ("/v1/datasets", "/v1/whoami", "/v1/posterior?epsilon=1", "/healthz", "/",
                 "/openapi.json", "/static/app/main.js"):
        answers.append(_call(client, "GET", path, None, BOB))
    for answer in answers:
        for secret in secrets_of_alice:
            assert secret not in answer.text, (answer.url, secret)
    theirs = client.get(f"/v1/datasets/orders/queries/{alice['query_id']}", headers=auth(BOB))
    never = client.get(f"/v1/datasets/orders/queries/{'0' * 32}", headers=auth(BOB))
    assert theirs.status_code == never.status_code == 404
    assert theirs.json() == json.loads(never.text.replace("0" * 32, alice["query_id"]))
    # and the owner, who may, sees Alice's query in the audit log
    audit = client.get("/v1/owner/audit", headers=auth(OLGA)).text
    assert "alice_private_marker" in audit and str(SECRET) not in audit


def test_the_static_pages_hold_no_data(client: TestClient) -> None:
    """The page and its scripts are the same bytes whoever asks (no token, any token), and
    carry a strict Content-Security-Policy; nothing outside static/ is served."""
    from dpcurator.server._dashboard import STATIC

    ask(client, ALICE, MARKER, epsilon=0.1)
    files = ["/"] + [f"/static/{p.relative_to(STATIC).as_posix()}" for p in STATIC.rglob("*")
                     if p.suffix in (".js", ".css", ".svg", ".html")]
    assert "/static/vendor/chart.umd.min.js" in files and len(files) > 10
    for path in files:
        plain = client.get(path)
        assert plain.status_code == 200, path
        assert "script-src 'self'" in plain.headers["content-security-policy"]
        for token in (ALICE, BOB, OLGA):
            assert client.get(path, headers=auth(token)).content == plain.content, path
        assert b"alice_private_marker" not in plain.content
    for path in ("/static/../_app.py", "/static/%2e%2e/_service.py", "/static/vendor/README",
                 "/static/nosuch.js", "/static/app"):
        assert client.get(path).status_code == 404, path


# -- paging ---------------------------------------------------------------------------------------


def _fill_history(client: TestClient, analyst: str, count: int) -> list[str]:
    """``count`` answered requests of ``analyst`` on orders, straight into the ledger (as the
    service records them: a charge to both accounts and the stored release)."""
    service = client.app.state.service  # type: ignore[attr-defined]
    release = json.dumps({"rows": [{"n": 1.0}], "intervals": [{"n": [0.0, 2.0]}],
                          "confidence": 0.95, "privacy": {"epsilon": 0.001}})
    ids = []
    for i in range(count):
        made = service.ledger.reserve(
            [(f"analyst/{analyst}/orders", PureDP(0.001)), ("dataset/orders", PureDP(0.001))],
            analyst=analyst, dataset="orders", fingerprint=f"f{i}", label=f"{analyst}: q{i}")
        service.ledger.store_release(made.request.id, release)
        ids.append(made.request.id)
    return ids


def test_history_is_paged_newest_first(client: TestClient) -> None:
    ids = _fill_history(client, "alice", 23)
    seen, before = [], None
    while True:
        page = client.get("/v1/datasets/orders/history", headers=auth(ALICE),
                          params={"limit": 10, **({"before": before} if before else {})}).json()
        assert len(page["releases"]) <= 10
        seen += [r["query_id"] for r in page["releases"]]
        before = page["next"]
        if before is None:
            break
    assert seen == ids[::-1]
    bob = client.get("/v1/datasets/orders/history", headers=auth(BOB),
                     params={"before": ids[5]})
    assert bob.status_code == 400 and ids[5] in bob.text  # not his: no page of Alice's
    assert client.get("/v1/datasets/orders/history?limit=501",
                      headers=auth(ALICE)).status_code == 422
    assert client.get("/v1/datasets/orders/history?limit=0",
                      headers=auth(ALICE)).status_code == 422


def test_the_history_route_reads_one_page_of_the_ledger(client: TestClient) -> None:
    """However long the history, a page reads at most its size of request rows from the
    ledger, and never the whole list (``Ledger.requests``)."""
    _fill_history(client, "alice", 120)
    ledger = client.app.state.service.ledger  # type: ignore[attr-defined]
    read: list[int] = []
    paged = ledger.requests_page

    def counting(*args: Any, **kwargs: Any) -> Any:
        rows = paged(*args, **kwargs)
        read.append(len(rows))
        return rows

    def whole(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the history read every request")

    ledger.requests_page, ledger.requests = counting, whole
    page = client.get("/v1/datasets/orders/history?limit=25", headers=auth(ALICE)).json()
    assert len(page["releases"]) == 25 and read == [25]
    client.get("/v1/datasets/orders/history", headers=auth(ALICE))
    assert read == [25, 50]  # the default page


def test_a_history_page_checks_its_rows_against_the_chain(client: TestClient,
                                                        folder: Path) -> None:
    ids = _fill_history(client, "alice", 5)
    db = sqlite3.connect(folder / "ledger.sqlite", isolation_level=None)
    db.execute("UPDATE requests SET label = 'alice: forged' WHERE id = ?", (ids[2],))
    db.close()
    fine = client.get("/v1/datasets/orders/history?limit=2", headers=auth(ALICE))
    assert fine.status_code == 200  # ids[4] and ids[3]: the page does not hold the row
    forged = client.get("/v1/datasets/orders/history?limit=3", headers=auth(ALICE))
    assert forged.status_code == 503 and "forged" not in forged.text


def test_a_ledger_page_checks_its_entries_against_the_chain(client: TestClient,
                                                          folder: Path) -> None:
    _fill_history(client, "alice", 3)
    db = sqlite3.connect(folder / "ledger.sqlite", isolation_level=None)
    db.execute("DROP TRIGGER IF EXISTS entries_are_append_only_u")
    seq, body = db.execute("SELECT seq, body FROM entries WHERE account = "
                           "'analyst/alice/orders' ORDER BY seq DESC LIMIT 1").fetchone()
    db.execute("UPDATE entries SET body = ? WHERE seq = ?",
               (body.replace("alice: q2", "alice: forged"), seq))
    db.close()
    forged = client.get("/v1/datasets/orders/ledger", headers=auth(ALICE))
    assert forged.status_code == 503 and "forged" not in forged.text


def test_the_ledger_route_is_paged_with_what_was_spent(client: TestClient) -> None:
    _fill_history(client, "alice", 12)
    first = client.get("/v1/datasets/orders/ledger?limit=5", headers=auth(ALICE)).json()
    spent = [c["spent"]["epsilon"] for c in first["charges"]]
    assert len(spent) == 5 and spent == sorted(spent, reverse=True)
    assert spent[0] == pytest.approx(0.012)
    seen, before = [c["sequence"] for c in first["charges"]], first["next"]
    while before is not None:
        page = client.get(f"/v1/datasets/orders/ledger?limit=5&before={before}",
                          headers=auth(ALICE)).json()
        seen += [c["sequence"] for c in page["charges"]]
        before = page["next"]
    assert len(seen) == 12 and seen == sorted(seen, reverse=True)
    assert client.get("/v1/datasets/orders/ledger", headers=auth(BOB)).json()["charges"] == []


def test_the_remote_client_reads_every_page_oldest_first(client: TestClient) -> None:
    """``RemoteCurator.history()`` and ``.ledger`` still list everything, oldest first."""
    from dpcurator.server.client import RemoteCurator

    ids = _fill_history(client, "alice", 7)
    remote = RemoteCurator.__new__(RemoteCurator)
    remote.dataset = "orders"
    pages = []

    def call(method: str, path: str, body: Any = None, **_: Any) -> Any:
        pages.append(path)
        path = path.replace("limit=500", "limit=3")
        return client.request(method, path, headers=auth(ALICE), json=body).json()

    remote._call = call  # type: ignore[method-assign]
    assert [r["query_id"] for r in remote.history()] == ids
    assert len(pages) == 3
    assert len(remote.ledger) == 7


# -- the owner's view ----------------------------------------------------------------------------


def test_the_owner_sees_every_budget_and_who_is_near_their_limit(client: TestClient) -> None:
    ask(client, ALICE, epsilon=0.85)  # 85% of Alice's 1.0 on orders
    ask(client, BOB, epsilon=0.5)  # 20% of Bob's 2.5
    view = client.get("/v1/owner/overview", headers=auth(OLGA)).json()
    assert [d["name"] for d in view["datasets"]] == ["orders", "visits"]
    assert view["datasets"][0]["spent"]["epsilon"] == pytest.approx(1.35)
    analysts = {a["name"]: a for a in view["analysts"]}
    assert set(analysts) == {"alice", "bob", "eve"}
    assert analysts["alice"]["near_limit"] and not analysts["bob"]["near_limit"]
    assert analysts["alice"]["budgets"][0]["share_spent"] == pytest.approx(0.85)
    assert [b["dataset"] for b in analysts["bob"]["budgets"]] == ["orders", "visits"]
    ledger = view["ledger"]
    assert ledger["verified"] is True and re.fullmatch(r"[0-9a-f]{64}", ledger["head"]["hash"])
    service = client.app.state.service  # type: ignore[attr-defined]
    assert (ledger["head"]["entry"], ledger["head"]["hash"]) == service.ledger.head()
    assert service.ledger.verify().head == ledger["head"]["hash"]


def test_the_owner_sees_a_ledger_that_does_not_verify_beside_the_budgets(
        client: TestClient, folder: Path) -> None:
    """The owner most needs the view when the ledger fails (here found by the periodic
    verification): it says so, with the budgets as the service last saw them (marked stale)
    and no head."""
    ask(client, ALICE, epsilon=0.3)
    db = sqlite3.connect(folder / "ledger.sqlite", isolation_level=None)
    db.execute("DROP TRIGGER IF EXISTS entries_are_append_only_u")
    db.execute("UPDATE entries SET body = replace(body, '0.3', '0.1') WHERE seq = "
               "(SELECT MAX(seq) FROM entries WHERE account = 'analyst/alice/orders')")
    db.close()
    client.app.state.service.verifier.verify_now()  # type: ignore[attr-defined]
    view = client.get("/v1/owner/overview", headers=auth(OLGA)).json()
    assert view["ledger"]["verified"] is False and view["ledger"]["stale"] is True
    assert view["ledger"]["head"] is None and "error" in view["ledger"]
    alice = next(a for a in view["analysts"] if a["name"] == "alice")
    assert alice["budgets"][0]["spent"]["epsilon"] == pytest.approx(0.3)


def test_the_owner_reads_the_audit_logs_newest_lines(client: TestClient, folder: Path) -> None:
    for _ in range(250):
        client.get("/healthz")
    entries = client.get("/v1/owner/audit", headers=auth(OLGA)).json()["entries"]
    assert len(entries) == 200
    times = [e["time"] for e in entries]
    assert times == sorted(times, reverse=True)
    lines = (folder / "ledger.audit.jsonl").read_text().splitlines()
    assert entries[-1] == json.loads(lines[-201])  # the line just before this request's
    assert len(client.get("/v1/owner/audit?limit=3",
                          headers=auth(OLGA)).json()["entries"]) == 3


def test_the_audit_tail_reads_from_the_end(tmp_path: Path) -> None:
    from dpcurator.server._owner import audit_tail

    log = tmp_path / "audit.jsonl"
    log.write_text("".join(json.dumps({"i": i, "pad": "x" * 300}) + "\n"
                           for i in range(5000)) + "{cut")
    assert [e.get("i") for e in audit_tail(log, 3)] == [None, 4999, 4998]
    assert audit_tail(log, 3)[0] == {"unreadable": True}
    assert [e["i"] for e in audit_tail(log, 400)[1:]] == list(range(4999, 4600, -1))
    assert audit_tail(tmp_path / "none.jsonl", 5) == []


# -- what an epsilon means -----------------------------------------------------------------------


@pytest.mark.parametrize(("epsilon", "delta"), [(1.0, 0.0), (0.3, 1e-6)])
def test_the_posterior_route_gives_the_accounting_packages_bounds(
        client: TestClient, epsilon: float, delta: float) -> None:
    answer = client.get("/v1/posterior", headers=auth(BOB),
                        params={"epsilon": epsilon, "delta": delta, "prior": 0.2}).json()
    guarantee = ApproxDP(epsilon, delta) if delta else PureDP(epsilon)
    expected = posterior_bounds(guarantee, 0.2)
    assert answer["posterior_max"] == expected.posterior_max
    assert answer["posterior_min"] == expected.posterior_min
    assert answer["failure_probability"] == expected.failure_probability
    curve = answer["curve"]
    assert len(curve["prior"]) == 101 and curve["prior"][50] == 0.5
    assert curve["highest"][50] == posterior_bounds(guarantee, 0.5).posterior_max
    assert all(lo <= p <= hi for p, lo, hi in zip(curve["prior"], curve["lowest"],
                                                  curve["highest"], strict=True))


@pytest.mark.parametrize("query", ["epsilon=0", "epsilon=nan", "epsilon=1&delta=0.5",
                                   "epsilon=1&prior=2", "delta=0.1"])
def test_the_posterior_route_names_a_bad_parameter(client: TestClient, query: str) -> None:
    answer = client.get(f"/v1/posterior?{query}", headers=auth(OLGA))
    assert answer.status_code == 422
    named = query.split("&")[-1].split("=")[0] if "epsilon=" in query else "epsilon"
    assert named in answer.json()["error"]["message"]


# -- the configuration ---------------------------------------------------------------------------


def test_an_owner_token_must_be_its_own(tmp_path: Path) -> None:
    config = write_service(tmp_path, extra=f'[owners.olga]\ntoken_sha256 = "{sha(EVE)}"\n')
    with pytest.raises(ConfigError, match="analyst 'eve' and owner 'olga' have the same"):
        load_config(config)
    config = write_service(tmp_path, extra='[owners.olga]\ntoken = "x"\n')
    with pytest.raises(ConfigError, match=r"\[owners.olga\] has unknown key"):
        load_config(config)
    config = write_service(tmp_path, extra='[owners.olga]\ntoken_sha256 = "abc"\n')
    with pytest.raises(ConfigError, match=r"\[owners.olga\] token_sha256 must be 64"):
        load_config(config)


def test_serve_token_makes_an_owners_lines(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["serve", "token", "--owner", "olga", "--json"])
    assert result.exit_code == 0, result.output
    made = json.loads(result.output)
    assert made["owner"] == "olga" and made["config"].startswith("[owners.olga]")
    config = write_service(tmp_path, extra=made["config"] + "\n")
    owner = load_config(config).owners["olga"]
    assert owner.token_sha256 == sha(made["token"])
