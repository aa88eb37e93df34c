"""The dashboard end to end, in a real headless Chromium against a real ``dpcurator serve``.

Debian's ``chromium`` (``/usr/bin/chromium``), driven by the ``playwright`` package's driver
(never ``playwright install``: the browser is the system's). The server runs in a process of
its own on a free loopback port, over two analysts, one owner and ``examples/orders.csv``.

Every test fails on any error the browser reports (console or uncaught) except the failed
requests it expects (a refused query is a 403, a wrong token a 401, which Chromium logs), and
saves a screenshot of every page it visits under ``test-artifacts/dashboard/``.

Without Chromium or playwright the tests skip, unless ``CI`` is set: CI installs both, so
there a missing browser fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ALICE, BOB, OLGA = "dpc_alice-browser-token", "dpc_bob-browser-token", "dpc_olga-owner-token"
BY_REGION = "SELECT region, COUNT(*) AS n, SUM(amount) AS total FROM data GROUP BY region"


def _missing(why: str) -> None:
    if os.environ.get("CI") or os.environ.get("DPCURATOR_REQUIRE_BROWSER"):
        pytest.fail(f"{why}: CI installs it (.ci/run), so the dashboard's browser tests must run")
    pytest.skip(why, allow_module_level=True)


try:
    from playwright.sync_api import ConsoleMessage, Page, expect, sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None
if sync_playwright is None:
    _missing("the playwright package is not installed (the dev extra)")
if not Path(CHROMIUM).exists():
    _missing(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
pytest.importorskip("uvicorn", reason="the server extra is not installed")


from test_server_live import _free_port, _sha  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python -m dpcurator serve`` over orders.csv: Alice (ε 1), Bob (ε 2), owner Olga."""
    folder = tmp_path_factory.mktemp("dashboard")
    shutil.copy(ROOT / "examples" / "orders.csv", folder / "orders.csv")
    config = folder / "curator.toml"
    config.write_text(f"""ledger = "ledger.sqlite"
[datasets.orders]
path = "orders.csv"
privacy_unit = "customer_id"
bounds = {{ amount = [0, 500] }}
keys = {{ region = ["north", "south", "east", "west"] }}
budget = {{ epsilon = 5.0 }}
[analysts.alice]
token_sha256 = "{_sha(ALICE)}"
budgets = {{ orders = {{ epsilon = 1.0 }} }}
[analysts.bob]
token_sha256 = "{_sha(BOB)}"
budgets = {{ orders = {{ epsilon = 2.0 }} }}
[owners.olga]
token_sha256 = "{_sha(OLGA)}"
[limits]
requests_per_second = 1000
burst = 1000
address_requests_per_second = 1000
address_burst = 1000
""")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = (folder / "server.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "dpcurator", "serve", "--config",
                                str(config), "--port", str(port)],
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError((folder / "server.log").read_text())
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=1) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the server did not start in 60 s") from None
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    assert sync_playwright is not None
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield launched
        launched.close()


class Watched:
    """A page whose console errors and uncaught errors are collected (``check`` fails on any
    but the failed requests ``expect`` names), with a screenshot per view (``shot``)."""

    def __init__(self, page: Page, server: str) -> None:
        self.page, self.server = page, server
        self.errors: list[str] = []
        self.expected: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(f"page error: {error}"))

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            where = message.location.get("url", "")
            if any(where.startswith(self.server + path) for path in self.expected) and (
                    message.text.startswith("Failed to load resource")):
                return
            self.errors.append(f"console: {message.text} ({where})")

    def expect(self, path: str) -> None:
        """A request to ``path`` may fail (Chromium logs it as a console error)."""
        self.expected.append(path)

    def shot(self, name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.wait_for_timeout(150)  # charts draw on the next animation frame
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

    def sign_in(self, token: str) -> None:
        self.page.goto(self.server + "/")
        self.page.wait_for_selector("#token")
        self.page.fill("#token", token)
        self.page.click("#sign-in")
        self.page.wait_for_selector("[data-testid=signed-in-as]")

    def check(self) -> None:
        assert self.errors == []


@pytest.fixture
def watched(browser: Any, server: str) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = Watched(context.new_page(), server)
    yield page
    context.close()
    page.check()


def _text(page: Page, selector: str) -> str:
    return page.locator(selector).first.inner_text()


def _chart_data(page: Page, testid: str) -> Any:
    """The first dataset of the Chart.js chart drawn in ``[data-testid=testid]``."""
    page.wait_for_function(f"""() => {{
        const canvas = document.querySelector('[data-testid="{testid}"] canvas');
        return canvas && window.Chart.getChart(canvas); }}""")
    return page.evaluate(f"""() => {{
        const chart = window.Chart.getChart(
            document.querySelector('[data-testid="{testid}"] canvas'));
        return {{type: chart.config.type, labels: chart.data.labels,
                 data: chart.data.datasets[0].data}}; }}""")


def test_sign_in_and_the_wrong_token(watched: Watched) -> None:
    page = watched.page
    page.goto(watched.server + "/")
    page.wait_for_selector("#token")
    watched.shot("sign-in")
    watched.expect("/v1/whoami")
    page.fill("#token", "not-a-token")
    page.click("#sign-in")
    page.wait_for_selector("[data-testid=error]")
    assert "valid bearer token" in _text(page, "[data-testid=error]")
    watched.shot("sign-in-refused")
    assert page.evaluate("sessionStorage.length") == 0  # a wrong token is not kept


def test_ask_after_reading_the_cost_then_the_release_and_its_error_bars(
        watched: Watched) -> None:
    page = watched.page
    watched.sign_in(ALICE)
    page.wait_for_selector("[data-testid=my-budget]")
    assert "left ε 1" in _text(page, "[data-testid=my-budget]")
    watched.shot("datasets-before")

    page.click("text=Ask")
    page.wait_for_selector("#sql")
    page.fill("#sql", BY_REGION)
    page.fill("#epsilon", "0.2")
    expect(page.locator("[data-testid=cost]")).to_contain_text("ε 0.2")
    cost = _text(page, "[data-testid=cost]")
    assert "Cost to your budget: ε 0.2; to the dataset's: ε 0.2" in cost
    errors = _text(page, "[data-testid=errors]")
    assert "n" in errors and "total" in errors and "discrete Laplace" in errors
    assert page.evaluate("sessionStorage.length") >= 1  # the token (and the draft) only
    watched.shot("ask")

    # The ε for a target error (explain, free): n within ±20 at 95% (±33 at ε 0.2).
    page.click("text=Choose ε from the error you accept")
    page.select_option("#output", "n")
    page.fill("#target", "20")
    page.click("#find-epsilon")
    expect(page.locator("[data-testid=found]")).to_contain_text("gives")
    found = float(page.input_value("#epsilon"))
    error = float(_text(page, "[data-testid=found]").rsplit("±", 1)[1])
    assert 0.25 < found < 0.5 and 19.5 < error <= 20  # the least ε (to 3 digits) that does
    expect(page.locator("[data-testid=cost]")).to_contain_text(f"ε {found:g};")
    watched.shot("ask-target-error")
    page.fill("#epsilon", "0.2")
    expect(page.locator("[data-testid=cost]")).to_contain_text("ε 0.2;")

    page.click("#ask")  # 0.2 of 1 left: 20%, below the confirmation's 25%
    page.wait_for_selector("[data-testid=release-table]")
    assert _text(page, "[data-testid=release-query]") == BY_REGION
    assert "ε 0.2" in _text(page, "[data-testid=release-cost]")
    rows = page.locator("[data-testid=release-table] tbody tr")
    assert rows.count() == 4
    bars = _chart_data(page, "errorbars-n")
    assert bars["type"] == "barWithErrorBars"
    assert bars["labels"] == ["north", "south", "east", "west"]
    first = rows.first.locator("td").all_inner_texts()
    assert first[0] == "north"
    for point in bars["data"]:
        assert point["yMin"] <= point["yMax"] and point["yMax"] > point["yMin"]
    watched.shot("release")

    page.click("#replay")
    page.wait_for_selector("[data-testid=replayed]")
    assert "left" in _text(page, "[data-testid=replayed]")
    watched.shot("release-replayed")

    page.click("text=your releases")
    page.wait_for_selector("[data-testid=history-row]")
    assert page.locator("[data-testid=history-row]").count() == 1
    assert BY_REGION in _text(page, "[data-testid=history]")
    watched.shot("history")

    page.click("text=Datasets")
    page.wait_for_selector("[data-testid=my-budget]")
    budget = _text(page, "[data-testid=my-budget]")
    assert "spent ε 0.2 of ε 1" in budget and "left ε 0.8" in budget
    spent = _chart_data(page, "spent-chart")
    assert [round(p["y"], 6) for p in spent["data"]] == [0, 0.2, 0.2]  # from nothing, to now
    watched.shot("datasets-after")


def test_a_large_query_asks_first_and_a_refused_one_shows_why(watched: Watched) -> None:
    page = watched.page
    watched.sign_in(BOB)
    page.goto(watched.server + "/#/ask/orders")
    page.wait_for_selector("#sql")
    page.fill("#epsilon", "3")  # more than Bob's 2
    expect(page.locator("[data-testid=cost]")).to_contain_text("ε 3;")
    page.click("#ask")
    page.wait_for_selector("#confirm[open]")
    assert "ε 3" in _text(page, "#confirm-text")
    watched.shot("ask-confirm")
    page.click("#confirm-no")  # cancelled: nothing asked
    assert page.locator("[data-testid=result] *").count() == 0

    watched.expect("/v1/datasets/orders/queries")
    page.click("#ask")
    page.wait_for_selector("#confirm[open]")
    page.click("#confirm-yes")
    page.wait_for_selector("[data-testid=result] [data-testid=error]")
    result = _text(page, "[data-testid=result]")
    assert "Refused: nothing was charged" in result and "budget" in result
    watched.shot("ask-refused")
    page.click("text=Datasets")
    page.wait_for_selector("[data-testid=my-budget]")
    assert "spent ε 0 of ε 2" in _text(page, "[data-testid=my-budget]")


def test_what_epsilon_means(watched: Watched) -> None:
    page = watched.page
    watched.sign_in(BOB)
    page.goto(watched.server + "/#/meaning/orders")
    page.wait_for_selector("[data-testid=posterior-text]")
    page.click("#use-budget")  # the whole budget: ε 2
    expect(page.locator("[data-testid=posterior-text]")).to_contain_text("88.1%")
    said = _text(page, "[data-testid=posterior-text]")
    assert "50%" in said and "11.9%" in said  # e^2 / (1 + e^2) = 0.8808
    curve = _chart_data(page, "posterior-chart")
    assert len(curve["data"]) == 101
    widths = _chart_data(page, "width-chart")
    ys = [p["y"] for p in widths["data"]]
    assert len(ys) == 5 and ys == sorted(ys, reverse=True)  # narrower as ε grows
    watched.shot("what-epsilon-means")


def test_the_owner_sees_both_analysts(watched: Watched, server: str) -> None:
    import json

    request = urllib.request.Request(
        f"{server}/v1/datasets/orders/queries", method="POST",
        data=json.dumps({"sql": "SELECT COUNT(*) AS n FROM data", "epsilon": 1.7}).encode(),
        headers={"Authorization": f"Bearer {BOB}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:  # Bob: 85% of his budget
        assert answer.status == 200
    page = watched.page
    watched.sign_in(OLGA)
    page.wait_for_selector("[data-testid=owner-analysts]")
    analysts = _text(page, "[data-testid=owner-analysts]")
    assert "alice" in analysts and "bob" in analysts
    assert "bob" in _text(page, "[data-testid=near-limit]")
    assert "alice" not in _text(page, "[data-testid=near-limit]")
    assert "verifies" in _text(page, "[data-testid=ledger]")
    assert len(_text(page, "[data-testid=head-hash]")) == 64
    audit = _text(page, "[data-testid=audit]")
    assert "owner_overview" in audit or "whoami" in audit
    watched.shot("owner")
    assert page.locator("#nav a[href='#/']").count() == 0  # no analyst's views
