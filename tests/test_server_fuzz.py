"""Fuzzing the service: schemathesis over its OpenAPI spec, and raw hostile requests.

Every outcome must be a 2xx/4xx with a JSON body (never a 5xx), no error may hold a record,
and nothing may be charged except for a query that was answered. Hypothesis runs
derandomized, so these tests are deterministic.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("schemathesis", reason="the dev tools are not installed")
pytest.importorskip("fastapi", reason="the server extra is not installed")

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from dpcurator.ledger import SQLiteLedger
from dpcurator.server import create_app, load_config
from test_server import ALICE, SECRET, auth, write_service

_FOLDER = Path(tempfile.mkdtemp(prefix="dpcurator-fuzz-"))
_APP = create_app(load_config(write_service(
    _FOLDER, rows=400, extra="[limits]\nrequests_per_second = 100000\nburst = 100000\n"
                             "address_requests_per_second = 100000\naddress_burst = 100000\n")))
schema = schemathesis.openapi.from_asgi("/openapi.json", _APP)
_ANSWERED: list[str] = []  # query ids of fresh (charged) answers
_HOSTILE: list[int] = []  # statuses of the hostile requests


@pytest.fixture(scope="module", autouse=True)
def _every_charge_is_an_answer() -> Iterator[None]:
    """After this module's tests (in this worker): nothing was charged but what was answered.

    Each pytest-xdist worker imports the module, and so has its own app and ledger."""
    yield
    ledger = SQLiteLedger(_FOLDER / "ledger.sqlite", create=False)
    charged = [e for e in ledger.entries("dataset/orders") if e.kind == "charge"]
    requests = ledger.requests("alice", "orders")
    assert len(charged) == len(requests)
    assert all(r.release is not None for r in requests)  # nothing charged went unanswered
    assert {r.id for r in requests} == set(_ANSWERED)
    if _HOSTILE:  # the hostile fuzzer ran here: it did get answers, so the check means something
        assert _ANSWERED and 200 in _HOSTILE and 400 in _HOSTILE and 401 in _HOSTILE


def _check(status: int, text: str, path: str, payload: Any) -> None:
    assert status < 500, f"{status} on {path}: {text[:300]}"
    assert str(SECRET) not in text and "271828" not in text
    if status >= 400:
        body = json.loads(text)
        assert set(body) == {"error"} and set(body["error"]) == {"type", "message"}
    elif isinstance(payload, dict) and payload.get("cached") is False:
        _ANSWERED.append(str(payload["query_id"]))


@schema.parametrize()
@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_schemathesis_finds_no_server_error(case: Any) -> None:
    response = case.call(headers=auth(ALICE))
    try:
        payload = response.json()
    except ValueError:
        payload = None
    _check(response.status_code, response.text, case.path, payload)


_JSON_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.sampled_from(["NaN", "Infinity", "-1", "1e308", "1e-320", "0"]))
_VALID_SQL = st.sampled_from([
    "SELECT COUNT(*) AS a FROM data", "SELECT SUM(amount) AS s FROM data",
    "SELECT region, COUNT(*) AS n FROM data GROUP BY region",
    "SELECT AVG(amount) AS m FROM data WHERE region = 'north'"])
_SQL = st.one_of(
    _VALID_SQL,
    st.text(max_size=80),
    st.sampled_from([
        "SELECT COUNT(*) FROM data", "SELECT COUNT(*) FROM data; DROP TABLE data",
        "SELECT amount FROM data", "SELECT SUM(amount) FROM data WHERE amount = 271828.5",
        "SELECT COUNT(*) FROM data WHERE customer_id = 999999",
        "SELECT region, COUNT(*) FROM data GROUP BY region",
        "SELECT COUNT(*) FROM read_csv_auto('/etc/passwd')",
        "SELECT COUNT(*) FROM data WHERE 1=1 --", "SELECT COUNT(*) FROM data UNION SELECT 1",
        "SELECT customer_id, COUNT(*) FROM data GROUP BY customer_id",
        "' OR 1=1 --", "SELECT COUNT(*) FROM (SELECT * FROM data)",
    ]))


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(sql=_SQL, extra=st.one_of(
    st.dictionaries(st.sampled_from(["epsilon", "delta", "rho", "noise", "confidence", "keys",
                                     "x"]), _JSON_VALUES, max_size=4),
    st.fixed_dictionaries({"epsilon": st.floats(1e-3, 1e-2)})),  # often a valid request
    raw=st.booleans() | st.just(True), token=st.sampled_from([ALICE, ALICE, ALICE, "x", ""]),
    dataset=st.sampled_from(["orders", "orders", "orders", "visits", "../orders", "%00"]))
def test_hostile_requests_are_refused_cleanly(sql: str, extra: dict[str, Any], raw: bool,
                                              token: str, dataset: str) -> None:
    with TestClient(_APP, raise_server_exceptions=False) as client:
        body: dict[str, Any] = {"sql": sql, **extra}
        content = json.dumps(body, default=str).encode()  # NaN and Infinity included
        if not raw:
            content = content[: len(content) // 2]  # malformed: cut in the middle
        response = client.post(f"/v1/datasets/{dataset}/queries",
                               headers=auth(token) | {"Content-Type": "application/json"},
                               content=content)
        try:
            payload = response.json()
        except ValueError:
            payload = None
        _check(response.status_code, response.text, "queries", payload)
        _HOSTILE.append(response.status_code)
