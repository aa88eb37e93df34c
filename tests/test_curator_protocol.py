"""The curator seam: ``Curator`` and ``RemoteCurator`` are both ``CuratorLike``, with the same
names, parameter names and return types (``remaining`` an ``Amount``, ``ledger`` a tuple of
``Charge``); the differences are listed here, as ``dpcurator.curator.protocol`` states them.
And the noise a curator describes carries each mechanism's own 95% error."""

from __future__ import annotations

import inspect
import typing
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import dpcurator as dp
from dpcurator.accounting.filters import Amount
from dpcurator.curator import Curator, CuratorLike
from dpcurator.ledger import Charge
from dpcurator.noise import SeededRandom
from dpcurator.query import Query
from dpcurator.server.client import RemoteCurator

#: What each side takes beyond the protocol's parameters (the protocol module's docstring).
EXTRA = {
    (Curator, "sql"): {"bounds", "max_partitions", "max_rows_per_partition",
                       "weights", "cache", "label", "bounds_share", "max_unit_rows",
                       "max_unit_sums"},
    (Curator, "run"): {"weights", "cache", "label"},
    (Curator, "explain"): set(),
    (RemoteCurator, "sql"): {"idempotency_key"},
    (RemoteCurator, "run"): {"idempotency_key"},
    (RemoteCurator, "explain"): set(),
}


def frame(rows: int = 2000) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    return pd.DataFrame({"user_id": rng.integers(0, 400, rows),
                         "region": rng.choice(["n", "s"], rows),
                         "amount": rng.uniform(0, 100, rows)})


def test_both_are_curator_like_and_the_check_asks_nothing() -> None:
    local = Curator(frame(), privacy_unit="user_id", budget=dp.PureDP(1.0))
    # Nothing listens on port 9: reading remaining or ledger would raise RemoteError.
    remote = RemoteCurator("http://127.0.0.1:9", "token", dataset="orders")
    assert isinstance(local, CuratorLike) and isinstance(remote, CuratorLike)
    assert isinstance(local, dp.CuratorLike)
    assert not isinstance(object(), CuratorLike)
    assert not isinstance(dp.mechanisms.Laplace(epsilon=1, sensitivity=1), CuratorLike)
    local.close()


@pytest.mark.parametrize("implementation", [Curator, RemoteCurator])
@pytest.mark.parametrize("method", ["sql", "run", "explain"])
def test_the_methods_take_the_protocols_parameters(implementation: type,
                                                   method: str) -> None:
    """Same names, same kinds, same defaults (None) as the protocol; anything more is listed
    in EXTRA and keyword-only with a default, so a call through the protocol works on both."""
    wanted = inspect.signature(getattr(CuratorLike, method)).parameters
    given = inspect.signature(getattr(implementation, method)).parameters
    assert list(given)[:1] == list(wanted)[:1] == ["self"]
    for name, parameter in wanted.items():
        assert name in given, f"{implementation.__name__}.{method} lacks {name}"
        assert given[name].kind == parameter.kind, name
        assert given[name].default == parameter.default, name
    extra = set(given) - set(wanted)
    assert extra == EXTRA[(implementation, method)]
    for name in extra:
        assert given[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert given[name].default is not inspect.Parameter.empty


@pytest.mark.parametrize("implementation", [Curator, RemoteCurator])
def test_remaining_and_ledger_have_the_same_types(implementation: type) -> None:
    names = {"Amount": Amount, "Charge": Charge}
    for member, expected in (("remaining", Amount), ("ledger", tuple[Charge, ...])):
        getter = getattr(implementation, member).fget
        assert typing.get_type_hints(getter, localns=names)["return"] == expected
        protocol = getattr(CuratorLike, member).fget
        assert typing.get_type_hints(protocol, localns=names)["return"] == expected


# -- the same answers' types, in process and through the service --------------------------------


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Any]:
    pytest.importorskip("fastapi", reason="the server extra is not installed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient
    from dpcurator.server import create_app, load_config
    from test_server import write_service

    app = create_app(load_config(write_service(tmp_path)))
    with TestClient(app) as client:
        yield client
    app.state.service.close()


class _InProcess(RemoteCurator):
    """A RemoteCurator whose requests go to the app in this process (FastAPI's client)."""

    def __init__(self, client: Any, token: str, dataset: str) -> None:
        self._client = client
        super().__init__("http://testserver", token, dataset=dataset)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
              headers: dict[str, str] | None = None, retries: int = 0,
              key: str | None = None) -> dict[str, Any]:
        answer = self._client.request(method, path, json=body, headers={
            "Authorization": f"Bearer {self._token}", **(headers or {})})
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        return found


def test_a_remote_curator_answers_like_a_curator(service: Any) -> None:
    from test_server import ALICE

    remote = _InProcess(service, ALICE, "orders")
    local = Curator(frame(), privacy_unit="user_id", budget=dp.ApproxDP(1.0, 1e-7),
                    bounds={"amount": (0, 500)}, source=SeededRandom(2))
    asked: list[CuratorLike] = [local, remote]
    for curator in asked:  # one function, either curator
        assert curator.remaining == Amount(epsilon=1.0, delta=1e-7)
        assert curator.ledger == ()
        curator.sql("SELECT COUNT(*) AS n FROM data", epsilon=0.25)
        curator.sql("SELECT COUNT(*) AS n FROM data", epsilon=0.25)  # again: free, not listed
        curator.run(Query().count("rows"), epsilon=0.25)
        assert curator.remaining == Amount(epsilon=0.5, delta=1e-7)
        ledger = curator.ledger
        assert isinstance(ledger, tuple) and all(isinstance(c, Charge) for c in ledger)
        assert [c.cost for c in ledger] == [dp.PureDP(0.25), dp.PureDP(0.25)]
        assert ledger[0].sequence < ledger[1].sequence and ledger[0].timestamp > 0
        assert "COUNT" in ledger[0].label
        explained = curator.explain("SELECT COUNT(*) AS n FROM data", epsilon=0.5)
        assert explained["noise"]["n"][0]["error_95"] > 0
        assert curator.explain(Query().count("n"), epsilon=0.5)["noise"] == explained["noise"]
    assert [len(r["release"]["rows"]) for r in remote.history()] == [1, 1, 1]
    # the releases' warnings, in process and from the service: the SUM's total has its own
    # column, and both say so
    sql = "SELECT region, COUNT(*) AS n, SUM(amount) AS s FROM data GROUP BY region"
    remote_release = remote.sql(sql, epsilon=0.2, keys=["north", "south", "east", "west"],
                                intervals="total")
    local_release = local.sql(sql, epsilon=0.2, keys=["n", "s"], intervals="total")
    assert local_release.to_dict()["warnings"] == list(local_release.warnings)
    said = [w for w in remote_release["warnings"] if w.startswith("s_total ")]
    assert len(said) == 1 and said[0] in local_release.warnings
    assert said == [w for w in remote.explain(sql, epsilon=0.2, intervals="total")["warnings"]
                    if w.startswith("s_total ")]
    assert said == [w for w in local.explain(sql, epsilon=0.2, keys=["n", "s"],
                                             intervals="total")["warnings"]
                    if w.startswith("s_total ")]
    local.close()


def test_the_service_explains_with_the_curators_own_description(service: Any) -> None:
    """The service's ``noise`` is ``Curator.describe``'s: the same dicts, ``error_95`` and all."""
    from test_server import ALICE

    sql = "SELECT COUNT(*) AS n, AVG(amount) AS m FROM data"
    remote = _InProcess(service, ALICE, "orders").explain(sql, epsilon=0.5)
    curator = service.app.state.service.datasets["orders"].curator
    assert remote["noise"] == curator.explain(sql, epsilon=0.5)["noise"]
    assert remote["cost"] == {"guarantee": "PureDP", "epsilon": 0.5, "delta": 0.0}


# -- error_95: the mechanism's own --------------------------------------------------------------


def test_error_95_is_the_mechanisms_accuracy() -> None:
    """A COUNT(*) with one row per unit: sensitivity 1, discrete Laplace of epsilon 0.5; its
    error_95 is that mechanism's ``accuracy(0.05)`` (exact: P[|Z| > w] <= 0.05)."""
    local = Curator(frame(), privacy_unit="user_id", budget=dp.ApproxDP(10, 1e-6),
                    bounds={"amount": (0, 100)}, max_rows_per_partition=1,
                    auto_bounds=False)
    noise = local.explain("SELECT COUNT(*) AS n FROM data", epsilon=0.5)["noise"]["n"]
    expected = dp.mechanisms.DiscreteLaplace(epsilon=0.5, sensitivity=1).accuracy(0.05)
    assert noise == [{"measure": "rows", "noise": "discrete Laplace", "scale": 2.0,
                      "guarantee": noise[0]["guarantee"], "error_95": expected}]
    every = local.explain(
        "SELECT region, COUNT(*) AS n, AVG(amount) AS m, MEDIAN(amount) AS q FROM data "
        "GROUP BY region", epsilon=1.0, keys=["n", "s"])["noise"]
    gauss = local.explain("SELECT SUM(amount) AS t FROM data", epsilon=1.0, delta=1e-7,
                          noise="gaussian")["noise"]
    for described in [*every.values(), *gauss.values()]:
        for measure in described:
            assert measure["error_95"] > 0
            width = measure.get("scale", measure.get("sigma"))
            assert width is not None and measure["error_95"] < 5 * width
    local.close()
