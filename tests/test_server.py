"""The curator service, in process (FastAPI's test client): routes, budgets, refusals.

Live servers (uvicorn on loopback, many processes, ``kill -9``) are in
tests/test_server_live.py; fuzzing in tests/test_server_fuzz.py.
"""

from __future__ import annotations

import hashlib
import json
import random
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server extra is not installed")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

import dpcurator as dp
from dpcurator.ledger import SQLiteLedger
from dpcurator.server import ConfigError, create_app, load_config

SECRET = 271828.5  # one record's amount: it must never appear in anything the service says
ALICE, BOB, EVE = "alice-token-0123456789", "bob-token-0123456789", "eve-token-0123456789"
COUNT = "SELECT COUNT(*) AS n FROM data"
BY_REGION = "SELECT region, COUNT(*) AS n, SUM(amount) AS total FROM data GROUP BY region"


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def write_service(folder: Path, *, extra: str = "", rows: int = 3000) -> Path:
    """orders.csv (customers, regions, amounts; one secret amount) and curator.toml."""
    rng = random.Random(7)
    lines = ["customer_id,region,amount"]
    regions = ["north", "south", "east", "west"]
    for _ in range(rows):
        lines.append(f"{rng.randrange(rows // 4)},{rng.choice(regions)},"
                     f"{rng.uniform(0, 400):.2f}")
    lines.append(f"999999,north,{SECRET}")
    (folder / "orders.csv").write_text("\n".join(lines) + "\n")
    (folder / "visits.csv").write_text("visitor,page\n1,a\n2,b\n")
    config = folder / "curator.toml"
    config.write_text(f"""
ledger = "ledger.sqlite"
[datasets.orders]
path = "orders.csv"
privacy_unit = "customer_id"
bounds = {{ amount = [0, 500] }}
keys = {{ region = ["north", "south", "east", "west"] }}
budget = {{ epsilon = 3.0, delta = 1e-6 }}
[datasets.visits]
path = "visits.csv"
privacy_unit = "visitor"
budget = {{ epsilon = 1.0 }}
[analysts.alice]
token_sha256 = "{sha(ALICE)}"
budgets = {{ orders = {{ epsilon = 1.0, delta = 1e-7 }} }}
[analysts.bob]
token_sha256 = "{sha(BOB)}"
budgets = {{ orders = {{ epsilon = 2.5 }}, visits = {{ epsilon = 1.0 }} }}
[analysts.eve]
token_sha256 = "{sha(EVE)}"
budgets = {{ visits = {{ epsilon = 1.0 }} }}
{extra}""")
    return config


@pytest.fixture
def service_dir(tmp_path: Path) -> Path:
    write_service(tmp_path)
    return tmp_path


@pytest.fixture
def client(service_dir: Path) -> Iterator[TestClient]:
    app = create_app(load_config(service_dir / "curator.toml"))
    with TestClient(app) as test_client:
        yield test_client
    app.state.service.close()


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def ask(client: TestClient, token: str, sql: str = COUNT, dataset: str = "orders",
        key: str | None = None, **privacy: Any) -> Any:
    headers = auth(token) | ({"Idempotency-Key": key} if key else {})
    return client.post(f"/v1/datasets/{dataset}/queries", headers=headers,
                       json={"sql": sql, **({"epsilon": 0.1} | privacy)})


def charges(folder: Path, account: str) -> int:
    return sum(1 for e in SQLiteLedger(folder / "ledger.sqlite", create=False).entries(account)
               if e.kind == "charge")


# -- the minimal configuration of the issue, as written -----------------------------------------


def test_the_minimal_configuration_works_as_written(tmp_path: Path) -> None:
    (tmp_path / "orders.csv").write_text("customer_id,amount\n1,10\n2,20\n3,30\n")
    (tmp_path / "curator.toml").write_text(f"""ledger = "ledger.sqlite"
[datasets.orders]
path = "orders.csv"
privacy_unit = "customer_id"
bounds = {{ amount = [0, 500] }}
budget = {{ epsilon = 3.0, delta = 1e-6 }}
[analysts.alice]
token_sha256 = "{sha(ALICE)}"
budgets = {{ orders = {{ epsilon = 1.0, delta = 1e-7 }} }}
""")
    app = create_app(load_config(tmp_path / "curator.toml"))
    with TestClient(app) as c:
        answer = ask(c, ALICE, "SELECT COUNT(*) AS n, AVG(amount) AS mean FROM data",
                     epsilon=0.5)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert set(body) >= {"rows", "intervals", "privacy", "query_id", "cached"}
        assert body["privacy"]["epsilon"] == 0.5 and body["cached"] is False
        assert body["remaining"]["epsilon"] == 0.5
    app.state.service.close()
    assert (tmp_path / "ledger.sqlite").exists()  # relative to the configuration file


def regions_service(folder: Path, options: str) -> Any:
    """A service over 2,400 orders of 300 customers in two public regions, with the
    dataset's ``options`` (TOML lines), written to ``folder/curator.toml``; Alice has 1.0."""
    rows = "\n".join(f"{i % 300},{['n', 's'][i % 2]},{(i * 37) % 90}" for i in range(2400))
    (folder / "orders.csv").write_text("customer_id,region,amount\n" + rows + "\n")
    (folder / "curator.toml").write_text(f"""ledger = "ledger.sqlite"
[datasets.orders]
path = "orders.csv"
privacy_unit = "customer_id"
{options}
keys = {{ region = ["n", "s"] }}
budget = {{ epsilon = 3.0 }}
[analysts.alice]
token_sha256 = "{sha(ALICE)}"
budgets = {{ orders = {{ epsilon = 1.0 }} }}
""")
    return create_app(load_config(folder / "curator.toml"))


def test_a_dataset_can_have_its_bounds_chosen_under_dp(tmp_path: Path) -> None:
    """bounds = "auto" and max_rows_per_partition = "auto" in the configuration: each query
    chooses them with 10% of its epsilon, says so, and is charged exactly its epsilon."""
    app = regions_service(tmp_path, 'bounds = "auto"\nmax_rows_per_partition = "auto"')
    with TestClient(app) as c:
        catalogue = c.get("/v1/datasets", headers=auth(ALICE)).json()["datasets"][0]
        assert catalogue["bounds"] == "auto"
        assert catalogue["max_rows_per_partition"] == "auto"
        answer = ask(c, ALICE, "SELECT region, SUM(amount) AS total FROM data GROUP BY region",
                     epsilon=0.5)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert set(body["bounds_chosen"]) >= {"max_rows_per_partition", "bounds", "epsilon"}
        assert body["privacy"]["epsilon"] == 0.5 and body["remaining"]["epsilon"] == 0.5
    app.state.service.close()
    (tmp_path / "bad.toml").write_text((tmp_path / "curator.toml").read_text().replace(
        'max_rows_per_partition = "auto"', 'max_rows_per_partition = "many"'))
    with pytest.raises(ConfigError, match="max_rows_per_partition"):
        load_config(tmp_path / "bad.toml")


def test_a_dataset_can_cap_each_units_total(tmp_path: Path) -> None:
    """bounding = "unit" in the configuration: COUNT(*) and SUM under caps on each
    customer's total, chosen in each query with 10% of its epsilon; an AVG is refused with
    the reason and nothing charged; a bounding the curator does not know is refused when
    the configuration is read."""
    app = regions_service(tmp_path, 'bounding = "unit"')
    with TestClient(app) as c:
        catalogue = c.get("/v1/datasets", headers=auth(ALICE)).json()["datasets"][0]
        assert catalogue["bounding"] == "unit"
        answer = ask(c, ALICE, "SELECT region, COUNT(*) AS n, SUM(amount) AS total FROM data "
                               "GROUP BY region", epsilon=0.5)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["bounding"] == "unit" and body["max_unit_rows"] >= 1
        assert set(body["bounds_chosen"]) >= {"max_unit_rows", "max_unit_sums", "epsilon"}
        refused = ask(c, ALICE, "SELECT AVG(amount) AS m FROM data", epsilon=0.25)
        assert refused.status_code == 400 and "COUNT(*) and SUM only" in refused.text
        budget = c.get("/v1/datasets/orders/budget", headers=auth(ALICE)).json()
        assert budget["remaining"]["epsilon"] == pytest.approx(0.5)
    app.state.service.close()
    (tmp_path / "bad.toml").write_text((tmp_path / "curator.toml").read_text().replace(
        'bounding = "unit"', 'bounding = "total"'))
    with pytest.raises(ConfigError, match="bounding must be"):
        load_config(tmp_path / "bad.toml")


def test_the_answer_says_which_settings_unit_bounding_did_not_use(tmp_path: Path) -> None:
    """A dataset with bounds for amount and bounding = "unit": the SUM is clamped by its cap
    on each customer's sum alone, and the dataset's bounds and a query's total_share went
    unused without a word. The answer's and explain's warnings now say so; the charge is the
    query's epsilon, as before."""
    app = regions_service(tmp_path, 'bounding = "unit"\nbounds = { amount = [0, 90] }')
    sql = "SELECT region, COUNT(*) AS n, SUM(amount) AS total FROM data GROUP BY region"
    bounds = "The curator's bounds for amount were not used: under bounding='unit'"
    share = "The query's total_share=0.3 was not used: under bounding='unit'"
    with TestClient(app) as c:
        answer = ask(c, ALICE, sql, epsilon=0.5, total_share=0.3)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        for said in (bounds, share):
            assert sum(w.startswith(said) for w in body["warnings"]) == 1, body["warnings"]
        assert body["privacy"]["epsilon"] == 0.5 and body["remaining"]["epsilon"] == 0.5
        explained = c.post("/v1/datasets/orders/explain", headers=auth(ALICE),
                           json={"sql": sql, "epsilon": 0.5, "total_share": 0.3})
        assert explained.status_code == 200, explained.text
        assert any(w.startswith(bounds) for w in explained.json()["warnings"])
        assert any(w.startswith(share) for w in explained.json()["warnings"])
    app.state.service.close()


@pytest.mark.parametrize(("text", "message"), [
    ("[datasets.x]\npath='a.csv'\nbudget={epsilon=1}\n[analysts.a]\n"
     f"token_sha256='{sha('t')}'\nbudgets={{x={{epsilon=1}}}}", "privacy_unit"),
    ("[datasets.x]\npath='a.csv'\nprivacy_unit='u'\nbudget={epsilon=1}\n[analysts.a]\n"
     "token_sha256='short'\nbudgets={x={epsilon=1}}", "token_sha256"),
    ("[datasets.x]\npath='a.csv'\nprivacy_unit='u'\nbudget={epsilon=1}\n[analysts.a]\n"
     f"token_sha256='{sha('t')}'\nbudgets={{y={{epsilon=1}}}}", "not configured"),
    ("[datasets.x]\npath='a.csv'\nprivacy_unit='u'\nbudget={epsilon=-1}\n", "epsilon"),
    ("ledger = 3", "ledger"),
    ("[datasets.x", "not valid TOML"),
    ("surprise = 1", "unknown key"),
    # a bug hunt: a rate of 1e308 overflowed PostgreSQL's refill and locked the analyst out
    ("[datasets.x]\npath='a.csv'\nprivacy_unit='u'\nbudget={epsilon=1}\n"
     f"[analysts.a]\ntoken_sha256='{sha('t')}'\nbudgets={{x={{epsilon=1}}}}\n"
     "[limits]\nrequests_per_second = 1e308", "requests_per_second must be a positive number"),
    ("[datasets.x]\npath='a.csv'\nprivacy_unit='u'\nbudget={epsilon=1}\n"
     f"[analysts.a]\ntoken_sha256='{sha('t')}'\nbudgets={{x={{epsilon=1}}}}\n"
     "[limits]\naddress_requests_per_second = 2e6", "at most 1e\\+06"),
])
def test_configuration_errors_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "c.toml").write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(tmp_path / "c.toml")


# -- answers and budgets ---------------------------------------------------------------------


def test_a_query_is_charged_to_the_analyst_and_the_dataset(client: TestClient,
                                                           service_dir: Path) -> None:
    answer = ask(client, ALICE, BY_REGION, epsilon=0.4)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    # The configured public keys apply to a GROUP BY region: all four, no delta spent.
    assert sorted(r["region"] for r in body["rows"]) == ["east", "north", "south", "west"]
    assert body["privacy"] == {"guarantee": "PureDP", "epsilon": 0.4, "delta": 0.0,
                               "neighbouring": "add/remove one privacy unit"}
    budget = client.get("/v1/datasets/orders/budget", headers=auth(ALICE)).json()
    assert budget["spent"]["epsilon"] == pytest.approx(0.4)
    assert budget["remaining"]["epsilon"] == pytest.approx(0.6)
    assert budget["dataset"]["spent"]["epsilon"] == pytest.approx(0.4)
    assert budget["dataset"]["total"]["epsilon"] == 3.0
    assert charges(service_dir, "analyst/alice/orders") == 1
    assert charges(service_dir, "dataset/orders") == 1


def test_a_query_may_ask_what_its_count_intervals_cover(client: TestClient) -> None:
    """Intervals cover the bounded answers by default (the dataset's caps are chosen from the
    data); ``intervals`` asks for either kind, and an unknown kind is a 400."""
    default = ask(client, BOB, BY_REGION, epsilon=0.4).json()
    assert default["interval_kinds"] == {"n": "bounded", "total": "bounded"}
    assert "bounded_intervals" not in default
    total = ask(client, BOB, BY_REGION, epsilon=0.4, intervals="total").json()
    assert total["interval_kinds"] == {"n": "total", "total": "bounded",
                                       "total_total": "total"}  # the SUM's own column
    assert total["max_unit_rows"] >= 1 and len(total["bounded_intervals"]) == 4
    assert set(total["max_unit_sums"]) == {"amount"}
    assert ask(client, BOB, BY_REGION, epsilon=0.4, intervals="wide").status_code == 422
    shared = ask(client, BOB, BY_REGION, epsilon=0.4, total_share=0.3).json()
    assert shared["interval_kinds"] == total["interval_kinds"]  # a share asks for totals
    assert shared["bounds_chosen"]["outer_caps_epsilon"] == pytest.approx(0.06)
    assert ask(client, BOB, BY_REGION, epsilon=0.4, total_share=1.5).status_code == 422


def test_a_spent_budget_is_403_and_charges_nothing(client: TestClient,
                                                   service_dir: Path) -> None:
    assert ask(client, ALICE, epsilon=0.9).status_code == 200
    refused = ask(client, ALICE, "SELECT COUNT(*) AS m FROM data", epsilon=0.2)
    assert refused.status_code == 403
    assert refused.json()["error"]["type"] == "budget_exhausted"
    assert charges(service_dir, "analyst/alice/orders") == 1
    assert charges(service_dir, "dataset/orders") == 1


def test_the_dataset_budget_binds_colluding_analysts(service_dir: Path) -> None:
    # Alice may spend 1 and Bob 2.5 on orders, but orders as a whole only 3.
    app = create_app(load_config(service_dir / "curator.toml"))
    with TestClient(app) as c:
        assert ask(c, ALICE, epsilon=1.0).status_code == 200
        assert ask(c, BOB, "SELECT COUNT(*) AS b FROM data", epsilon=2.0).status_code == 200
        refused = ask(c, BOB, "SELECT COUNT(*) AS c FROM data", epsilon=0.25)
        assert refused.status_code == 403 and "dataset/orders" in refused.json()["error"][
            "message"]
        bob = c.get("/v1/datasets/orders/budget", headers=auth(BOB)).json()
        assert bob["remaining"]["epsilon"] == pytest.approx(0.5)  # his own is not the limit
    app.state.service.close()
    assert charges(service_dir, "dataset/orders") == 2


def test_identical_queries_and_retries_are_free(client: TestClient, service_dir: Path) -> None:
    first = ask(client, ALICE, epsilon=0.3, key="k-1").json()
    retry = ask(client, ALICE, epsilon=0.3, key="k-1").json()
    assert retry["query_id"] == first["query_id"] and retry["cached"] is True
    assert retry["rows"] == first["rows"]
    again = ask(client, ALICE, epsilon=0.3).json()  # the same query, no key: the cache
    assert again["cached"] is True and again["rows"] == first["rows"]
    keyed = ask(client, ALICE, epsilon=0.3, key="k-2").json()  # a new key, the same query
    assert keyed["cached"] is True and keyed["rows"] == first["rows"]
    assert ask(client, ALICE, epsilon=0.3, key="k-2").json()["query_id"] == keyed["query_id"]
    assert charges(service_dir, "analyst/alice/orders") == 1
    conflict = ask(client, ALICE, "SELECT COUNT(*) AS other FROM data", key="k-1")
    assert conflict.status_code == 409
    assert conflict.json()["error"]["type"] == "idempotency_conflict"
    assert charges(service_dir, "analyst/alice/orders") == 1


def test_an_answer_is_free_again_only_to_the_analyst_who_paid(client: TestClient,
                                                              service_dir: Path) -> None:
    """The release cache is per analyst: Bob's identical query is charged to Bob (it does not
    read Alice's release), and each gets their own release again for free."""
    alice = ask(client, ALICE, epsilon=0.3).json()
    bob = ask(client, BOB, epsilon=0.3).json()
    assert alice["cached"] is False and bob["cached"] is False
    assert bob["query_id"] != alice["query_id"]
    assert charges(service_dir, "analyst/bob/orders") == 1
    assert charges(service_dir, "dataset/orders") == 2
    for token, first in ((ALICE, alice), (BOB, bob)):
        again = ask(client, token, epsilon=0.3).json()
        assert again["cached"] is True and again["query_id"] == first["query_id"]
        assert again["rows"] == first["rows"]
    assert charges(service_dir, "dataset/orders") == 2


def test_a_query_is_priced_once_by_the_curator(client: TestClient,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The service asks the curator for the price (``cost_in``); a query and an explain are
    each priced once (when prepared), an answer sent again not at all."""
    import dpcurator.curator._prepared as session

    calls: list[object] = []
    real = session.query_cost
    monkeypatch.setattr(session, "query_cost", lambda *a: calls.append(a) or real(*a))
    assert ask(client, ALICE, BY_REGION, epsilon=0.4).status_code == 200
    assert len(calls) == 1
    assert ask(client, ALICE, BY_REGION, epsilon=0.4).json()["cached"] is True
    assert len(calls) == 1
    explained = client.post("/v1/datasets/orders/explain", headers=auth(ALICE),
                            json={"sql": BY_REGION, "epsilon": 0.5})
    assert explained.status_code == 200 and len(calls) == 2


def test_the_ledger_route_lists_the_analysts_charges(client: TestClient) -> None:
    from dpcurator.accounting.filters import decode_cost

    made = ask(client, ALICE, epsilon=0.2).json()
    ask(client, ALICE, epsilon=0.2)  # free: not a charge
    charged = client.get("/v1/datasets/orders/ledger", headers=auth(ALICE)).json()["charges"]
    assert [decode_cost(c["cost"]) for c in charged] == [dp.PureDP(0.2)]
    assert charged[0]["label"] == f"alice: {COUNT}" and charged[0]["time"] > 0
    assert made["query_id"]  # the releases themselves are in history
    assert client.get("/v1/datasets/orders/ledger", headers=auth(BOB)).json() == {
        "charges": [], "next": None}
    assert client.get("/v1/datasets/orders/ledger", headers=auth(EVE)).status_code == 404


def test_history_and_replay_are_the_analysts_own(client: TestClient) -> None:
    made = ask(client, ALICE, epsilon=0.2).json()
    history = client.get("/v1/datasets/orders/history", headers=auth(ALICE)).json()
    assert [r["query_id"] for r in history["releases"]] == [made["query_id"]]
    assert history["releases"][0]["release"]["rows"] == made["rows"]
    replay = client.get(f"/v1/datasets/orders/queries/{made['query_id']}", headers=auth(ALICE))
    assert replay.status_code == 200 and replay.json()["rows"] == made["rows"]
    # Bob cannot read Alice's release, even knowing its id.
    other = client.get(f"/v1/datasets/orders/queries/{made['query_id']}", headers=auth(BOB))
    assert other.status_code == 404
    assert client.get("/v1/datasets/orders/history", headers=auth(BOB)).json() == {
        "releases": [], "next": None}


def test_explain_is_free(client: TestClient, service_dir: Path) -> None:
    explained = client.post("/v1/datasets/orders/explain", headers=auth(ALICE),
                            json={"sql": BY_REGION, "epsilon": 0.5}).json()
    assert explained["cost"]["epsilon"] == 0.5
    assert explained["noise"]["n"][0]["error_95"] > 0
    assert charges(service_dir, "analyst/alice/orders") == 0


def test_the_answer_and_explain_carry_the_releases_warnings(client: TestClient) -> None:
    """The SUM's total is printed as its own column, and the release says so in its
    ``warnings`` (sentences of public numbers only), as explain does before spending; the
    answer stored and replayed carries them too."""
    explained = client.post("/v1/datasets/orders/explain", headers=auth(BOB),
                            json={"sql": BY_REGION, "epsilon": 0.4,
                                  "intervals": "total"}).json()
    assert any("total_total" in w for w in explained["warnings"])
    answer = ask(client, BOB, BY_REGION, epsilon=0.4, intervals="total").json()
    assert isinstance(answer["warnings"], list) and answer["warnings"]
    assert set(explained["warnings"]) <= set(answer["warnings"])
    assert all(str(SECRET) not in w and "271828" not in w for w in answer["warnings"])
    again = client.get(f"/v1/datasets/orders/queries/{answer['query_id']}",
                       headers=auth(BOB)).json()
    assert again["warnings"] == answer["warnings"]
    # bounded intervals, per group as asked: the caps' thin-data rule is stated at 0.1
    # (about 3,200 units; the sample has 300 customers), and the release says what it did
    from dpcurator.query import Query, plan_to_json

    per_group = plan_to_json(Query().count("n").plan().replace(bounding="rescale"))
    plain = client.post("/v1/datasets/orders/queries", headers=auth(BOB),
                        json={"plan": per_group, "epsilon": 0.1}).json()
    assert "bounding" not in plain and len(plain["warnings"]) >= 2
    assert plain["warnings"][0].startswith("At this epsilon the caps per group "
                                           "(max_rows_per_partition) are chosen")
    assert any(w.startswith("too few units for the first choice of the caps per group")
               for w in plain["warnings"])
    # the same asked of SQL with the request's own bounding: the same release, free
    again = ask(client, BOB, COUNT, epsilon=0.1, bounding="rescale").json()
    assert again["cached"] and again["rows"] == plain["rows"]
    assert ask(client, BOB, COUNT, epsilon=0.1, bounding="per-group").status_code == 422
    unit = ask(client, BOB, COUNT, epsilon=0.1).json()
    assert unit["bounding"] == "unit" and not unit["cached"]
    assert unit["warnings"], (unit["cached"], unit.get("bounds_chosen"))
    # 300 customers: too few for the caps' choice at 0.1, and for the retry's: the widest cap
    assert all("each unit's" in w for w in unit["warnings"])
    assert any("the widest cap on each unit's rows" in w for w in unit["warnings"])


def test_analysts_see_only_their_datasets(client: TestClient) -> None:
    names = [d["name"] for d in client.get("/v1/datasets", headers=auth(EVE)).json()["datasets"]]
    assert names == ["visits"]
    for route in ("budget", "history"):
        answer = client.get(f"/v1/datasets/orders/{route}", headers=auth(EVE))
        assert answer.status_code == 404
    assert ask(client, EVE).status_code == 404
    assert ask(client, EVE, dataset="no-such-dataset").status_code == 404


# -- refusals: the right status, a JSON error, nothing charged, no record ------------------------

REFUSALS: list[tuple[str, dict[str, Any], int, str]] = [
    ("no token", {"headers": {}}, 401, "unauthorized"),
    ("wrong token", {"headers": auth("nope")}, 401, "unauthorized"),
    ("not a query", {"json": {"sql": "DROP TABLE data", "epsilon": 0.1}}, 400, "bad_request"),
    ("rows, not aggregates", {"json": {"sql": "SELECT amount FROM data", "epsilon": 0.1}},
     400, "bad_request"),
    ("injection", {"json": {"sql": "SELECT COUNT(*) FROM data; DELETE FROM data",
                            "epsilon": 0.1}}, 400, "bad_request"),
    ("other table", {"json": {"sql": "SELECT COUNT(*) FROM read_csv('/etc/passwd')",
                              "epsilon": 0.1}}, 400, "bad_request"),
    ("unknown column", {"json": {"sql": "SELECT SUM(secret) FROM data", "epsilon": 0.1}},
     400, "bad_request"),
    ("negative epsilon", {"json": {"sql": COUNT, "epsilon": -1}}, 422, "invalid_request"),
    ("epsilon as text", {"json": {"sql": COUNT, "epsilon": "0.1"}}, 422, "invalid_request"),
    ("epsilon as a boolean", {"json": {"sql": COUNT, "epsilon": True}}, 422, "invalid_request"),
    ("delta as text", {"json": {"sql": COUNT, "epsilon": 0.1, "delta": "1e-9"}}, 422,
     "invalid_request"),
    ("sql as a number", {"json": {"sql": 7, "epsilon": 0.1}}, 422, "invalid_request"),
    ("huge epsilon", {"json": {"sql": COUNT, "epsilon": 1e308}}, 400, "bad_request"),
    ("epsilon past the budget", {"json": {"sql": COUNT, "epsilon": 2.0}}, 403,
     "budget_exhausted"),
    ("delta too large", {"json": {"sql": COUNT, "epsilon": 0.1, "delta": 0.5}}, 400,
     "bad_request"),
    ("no privacy", {"json": {"sql": COUNT}}, 400, "bad_request"),
    ("extra field", {"json": {"sql": COUNT, "epsilon": 0.1, "x": 1}}, 422, "invalid_request"),
    ("malformed JSON", {"content": b'{"sql": "SELECT', "headers_extra": {
        "Content-Type": "application/json"}}, 400, "bad_request"),
    ("not an object", {"json": [1, 2]}, 422, "invalid_request"),
    ("body of 10 MB", {"content": b" " * 10_000_000, "headers_extra": {
        "Content-Type": "application/json"}}, 413, "too_large"),
]


@pytest.mark.parametrize("case", [c[0] for c in REFUSALS])
def test_refusals_are_json_errors_that_charge_nothing(client: TestClient, service_dir: Path,
                                                      case: str) -> None:
    _, spec, status, kind = next(c for c in REFUSALS if c[0] == case)
    headers = spec.get("headers", auth(ALICE)) | spec.get("headers_extra", {})
    kwargs = ({"json": spec["json"]} if "json" in spec else
              {"content": spec["content"]} if "content" in spec else
              {"json": {"sql": COUNT, "epsilon": 0.1}})
    answer = client.post("/v1/datasets/orders/queries", headers=headers, **kwargs)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["type"] == kind and error["message"]
    assert str(SECRET) not in answer.text and "271828" not in answer.text
    assert charges(service_dir, "analyst/alice/orders") == 0
    assert charges(service_dir, "dataset/orders") == 0


def test_the_rate_limit_is_per_analyst(service_dir: Path) -> None:
    config = write_service(service_dir, extra="[limits]\nrequests_per_second = 1\nburst = 3\n")
    app = create_app(load_config(config))
    with TestClient(app) as c:
        statuses = [c.get("/v1/datasets", headers=auth(ALICE)).status_code for _ in range(5)]
        assert statuses[:3] == [200, 200, 200] and 429 in statuses[3:]
        assert c.get("/v1/datasets", headers=auth(BOB)).status_code == 200
        limited = next(r for r in (c.get("/v1/datasets", headers=auth(ALICE))
                                   for _ in range(3)) if r.status_code == 429)
        assert limited.json()["error"]["type"] == "rate_limited"
    app.state.service.close()


def test_the_audit_log_says_who_asked_what_and_what_it_cost(client: TestClient,
                                                            service_dir: Path) -> None:
    ask(client, ALICE, epsilon=0.2)
    ask(client, ALICE, "SELECT nothing", epsilon=0.2)
    ask(client, BOB, dataset="visits", epsilon=0.1)
    lines = [json.loads(line) for line in
             (service_dir / "ledger.audit.jsonl").read_text().splitlines()]
    assert [(r["analyst"], r["dataset"], r["status"]) for r in lines] == [
        ("alice", "orders", 200), ("alice", "orders", 400), ("bob", "visits", 200)]
    assert lines[0]["cost"]["epsilon"] == 0.2 and lines[1]["error"] == "bad_request"
    assert str(SECRET) not in (service_dir / "ledger.audit.jsonl").read_text()


def test_health_and_docs(client: TestClient) -> None:
    health = client.get("/healthz").json()
    assert health["status"] == "ok" and health["ledger"]["verified"] is True
    spec = client.get("/openapi.json").json()
    assert "/v1/datasets/{name}/queries" in spec["paths"]
    assert client.get("/docs").status_code == 200


def test_a_changed_total_is_refused_at_start(service_dir: Path) -> None:
    create_app(load_config(service_dir / "curator.toml")).state.service.close()
    text = (service_dir / "curator.toml").read_text().replace("epsilon = 3.0", "epsilon = 30.0")
    (service_dir / "curator.toml").write_text(text)
    with pytest.raises(dp.errors.UserError, match="ledger raise"):
        create_app(load_config(service_dir / "curator.toml"))


def test_the_service_on_a_postgresql_ledger(tmp_path: Path, postgres_ledger_url: str) -> None:
    """The same flow with ``ledger = "postgresql://..."``, on the run's real server."""
    config = write_service(tmp_path)
    text = config.read_text().replace('ledger = "ledger.sqlite"',
                                      f'ledger = "{postgres_ledger_url}"')
    config.write_text(text)
    app = create_app(load_config(config))
    with TestClient(app) as c:
        first = ask(c, ALICE, epsilon=0.5, key="pg-1").json()
        assert first["cached"] is False and first["remaining"]["epsilon"] == 0.5
        assert ask(c, ALICE, epsilon=0.5, key="pg-1").json()["query_id"] == first["query_id"]
        refused = ask(c, ALICE, "SELECT COUNT(*) AS other FROM data", epsilon=0.75)
        assert refused.status_code == 403
        assert c.get("/v1/datasets/orders/budget", headers=auth(ALICE)).json()[
            "dataset"]["spent"]["epsilon"] == 0.5
    ledger = app.state.service.ledger
    assert len([e for e in ledger.entries("dataset/orders") if e.kind == "charge"]) == 1
    # 6 accounts opened, one debit of two accounts, the request and its release recorded
    assert ledger.verify().entries == 10
    app.state.service.close()
    # two answers and the budget read (every request is audited)
    assert (tmp_path / "audit.jsonl").read_text().count('"status": 200') == 3


def test_a_plan_from_the_builder_is_answered_like_its_sql(client: TestClient,
                                                          service_dir: Path) -> None:
    from dpcurator.query import Query, plan_to_json

    plan = Query().group_by("region").count("n").sum("amount", name="total").plan()
    answer = client.post("/v1/datasets/orders/queries", headers=auth(ALICE),
                         json={"plan": plan_to_json(plan), "epsilon": 0.4})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    # The configured public keys applied (a GROUP BY region), as for the SQL.
    assert sorted(r["region"] for r in body["rows"]) == ["east", "north", "south", "west"]
    # The same plan again is the same release, free; so is its SQL (the same plan).
    again = client.post("/v1/datasets/orders/queries", headers=auth(ALICE),
                        json={"plan": plan_to_json(plan), "epsilon": 0.4}).json()
    assert again["cached"] is True and again["rows"] == body["rows"]
    assert ask(client, ALICE, BY_REGION, epsilon=0.4).json()["cached"] is True
    assert charges(service_dir, "analyst/alice/orders") == 1
    for bad in ({"plan": {"aggregates": [{"kind": "drop"}]}, "epsilon": 0.1},
                {"plan": plan_to_json(plan), "sql": COUNT, "epsilon": 0.1},
                {"epsilon": 0.1},
                {"plan": {"aggregates": [{"kind": "count"}], "where": "1=1; DROP TABLE x"},
                 "epsilon": 0.1}):
        refused = client.post("/v1/datasets/orders/queries", headers=auth(ALICE), json=bad)
        assert refused.status_code == 400, refused.text
    assert charges(service_dir, "analyst/alice/orders") == 1


@pytest.mark.parametrize(("error", "status", "kind"), [
    ("busy", 503, "ledger_busy"),
    ("refused", 400, "ledger_refused"),
])
def test_a_ledger_that_cannot_record_a_request_is_answered_as_such_not_as_a_bug(
        client: TestClient, service_dir: Path, monkeypatch: pytest.MonkeyPatch, error: str,
        status: int, kind: str) -> None:
    """A bug hunt: a PostgreSQL ledger whose connection dropped (or locked too long), or that
    could not store a query's text (a NUL), was answered 500 'this is a bug in dpcurator',
    though nothing was charged and a retry (or another text) would do."""
    from dpcurator.errors import LedgerBusyError, UserError

    service = client.app.state.service  # type: ignore[attr-defined]

    def failing(*args: Any, **kwargs: Any) -> Any:
        if error == "busy":
            raise LedgerBusyError("ledger /x stayed locked; nothing was charged, try again")
        raise UserError("ledger /x cannot store this request's text (NUL); nothing charged")

    monkeypatch.setattr(service.ledger, "reserve", failing)
    answer = ask(client, ALICE)
    assert answer.status_code == status and answer.json()["error"]["type"] == kind
    assert "/x" not in answer.text and "bug" not in answer.text
    assert charges(service_dir, "analyst/alice/orders") == 0
    monkeypatch.undo()
    assert ask(client, ALICE).status_code == 200
