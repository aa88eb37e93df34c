"""``dpcurator query`` and the curator part of ``dpcurator demo``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from dpcurator.cli.demo_curator import demo_curator
from dpcurator.cli.query import parse_bounds, query

app = typer.Typer()
app.command()(query)


@app.callback()
def _main() -> None:
    """Test harness: the lead registers ``query`` on the real app."""


@pytest.fixture()
def shop(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    n = 3000
    frame = pd.DataFrame({"uid": rng.integers(0, 500, n),
                          "region": rng.choice(["north", "south", "east"], n),
                          "amount": rng.gamma(2.0, 50.0, n)})
    path = tmp_path / "shop.parquet"
    frame.to_parquet(path)
    pd.DataFrame({"region": ["north", "south", "east", "west"]}).to_csv(
        tmp_path / "regions.csv", index=False)
    return path


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["query", *args])
    return result.exit_code, result.output


def test_json_output_has_rows_intervals_and_privacy(shop: Path) -> None:
    code, out = run(str(shop), "--sql",
                    "SELECT region, COUNT(*) AS n, AVG(amount) AS avg FROM data GROUP BY region",
                    "--privacy-unit", "uid", "--epsilon", "1", "--bounds", "amount=0:500",
                    "--keys", str(shop.parent / "regions.csv"), "--max-rows-per-partition", "3",
                    "--json")
    assert code == 0, out
    payload = json.loads(out)
    assert [row["region"] for row in payload["rows"]] == ["north", "south", "east", "west"]
    assert set(payload["intervals"][0]) == {"n", "avg"}
    assert payload["privacy"]["epsilon"] == 1.0 and payload["privacy"]["delta"] == 0.0


def test_private_keys_and_table_output(shop: Path) -> None:
    code, out = run(str(shop), "--sql", "SELECT region, COUNT(*) AS n FROM data GROUP BY region",
                    "--privacy-unit", "uid", "--epsilon", "1", "--delta", "1e-6")
    assert code == 0, out
    assert "privacy spent" in out and "interval" in out


def test_errors_are_one_clear_line(shop: Path) -> None:
    code, out = run(str(shop), "--sql", "SELECT SUM(amount) FROM data", "--privacy-unit", "uid",
                    "--epsilon", "1", "--bounds", "amount=5:1", "--json")
    assert code == 2 and json.loads(out)["type"] == "BoundsError"
    code, out = run(str(shop), "--sql", "DELETE FROM data", "--privacy-unit", "uid",
                    "--epsilon", "1", "--json")
    assert code == 2 and "DELETE" in json.loads(out)["error"]
    code, out = run(str(shop), "--sql", "SELECT COUNT(*) FROM data", "--epsilon", "1", "--json")
    assert code == 2 and "one_row_per_person" in json.loads(out)["error"]


def test_journal_shares_one_budget_across_runs(shop: Path, tmp_path: Path) -> None:
    journal = tmp_path / "ledger.sqlite"
    base = [str(shop), "--sql", "SELECT COUNT(*) AS n FROM data", "--privacy-unit", "uid",
            "--journal", str(journal), "--json"]
    assert run(*base, "--budget-epsilon", "1", "--epsilon", "0.6")[0] == 0
    code, out = run(*base, "--epsilon", "0.6")  # the ledger's stored total applies
    assert code == 2 and json.loads(out)["type"] == "BudgetExceededError"
    # A different total later is refused, not adopted (it would read as 99.4 remaining).
    code, out = run(*base, "--budget-epsilon", "100", "--epsilon", "0.1")
    assert code == 2 and "ledger raise" in json.loads(out)["error"]
    code, out = run(*base, "--epsilon", "0.4")  # exactly what is left
    assert code == 0 and json.loads(out)["remaining"]["epsilon"] == pytest.approx(0, abs=1e-12)


def test_parse_bounds() -> None:
    assert parse_bounds(["a=0:1", "b=-2.5:3"]) == {"a": (0.0, 1.0), "b": (-2.5, 3.0)}
    with pytest.raises(typer.BadParameter):
        parse_bounds(["a=0"])
    with pytest.raises(typer.BadParameter):
        parse_bounds(["a=x:1"])


def test_demo_part_runs_and_hides_escargots() -> None:
    results = demo_curator(customers=3000, print_output=False)
    assert results["budget_before"]["epsilon"] == 1.0
    assert results["budget_after"]["epsilon"] == pytest.approx(0.0, abs=1e-9)
    assert len(results["queries"]) == 3
    first = results["queries"][0]["rows"][0]
    assert {"dp", "interval", "true", "error"} <= set(first["orders"])
    json.dumps(results)


def test_a_postgresql_journal(shop: Path, postgres_ledger_url: str) -> None:
    base = [str(shop), "--sql", "SELECT COUNT(*) AS n FROM data", "--privacy-unit", "uid",
            "--journal", postgres_ledger_url, "--json"]
    assert run(*base, "--budget-epsilon", "1", "--epsilon", "0.6")[0] == 0
    code, out = run(*base, "--epsilon", "0.6")  # the stored total: 0.4 left
    assert code == 2 and json.loads(out)["type"] == "BudgetExceededError"
    code, out = run(*base, "--epsilon", "0.4")  # exactly what is left
    assert code == 0 and json.loads(out)["remaining"]["epsilon"] == pytest.approx(0, abs=1e-12)


SUM_BY_REGION = "SELECT region, COUNT(*) AS n, SUM(amount) AS s FROM data GROUP BY region"


def test_json_and_text_carry_the_warnings_and_each_value_its_own_interval(shop: Path) -> None:
    """Total intervals asked for: the SUM's total is measured, and ``--json`` has it as its own
    column ``s_total`` (its own interval beside it), and the release's warnings
    as a list; the text output prints them in a block after the table."""
    common = [str(shop), "--sql", SUM_BY_REGION, "--privacy-unit", "uid", "--epsilon", "1",
              "--bounds", "amount=0:500", "--keys", str(shop.parent / "regions.csv"),
              "--intervals", "total"]
    code, out = run(*common, "--json")
    assert code == 0, out
    payload = json.loads(out)
    assert payload["interval_kinds"] == {"n": "total", "s": "bounded", "s_total": "total"}
    assert set(payload["rows"][0]) == {"region", "n", "s", "s_total"}
    for row, intervals in zip(payload["rows"], payload["intervals"], strict=True):
        for name, (low, high) in intervals.items():
            assert low <= row[name] <= high
    assert any(w.startswith("s_total ") for w in payload["warnings"])
    code, text = run(*common)
    assert code == 0, text
    assert "s_total" in text and "warnings:" in text
    assert text.index("warnings:") > text.index("s_total")  # after the table
    assert "s_total is the sum without" in " ".join(text.split())


def test_explain_shows_the_cost_and_the_warnings_and_charges_nothing(shop: Path,
                                                                     tmp_path: Path) -> None:
    """``--explain``: the cost, the noise and the warnings known before spending (here: the
    SUM's total gets its own column); nothing is charged, and no ledger is made."""
    journal = tmp_path / "ledger.sqlite"
    common = [str(shop), "--sql", SUM_BY_REGION, "--privacy-unit", "uid", "--epsilon", "0.5",
              "--bounds", "amount=0:500", "--keys", str(shop.parent / "regions.csv"),
              "--journal", str(journal), "--intervals", "total", "--explain"]
    code, out = run(*common, "--json")
    assert code == 0, out
    payload = json.loads(out)
    assert payload["cost"]["epsilon"] == 0.5 and payload["noise"]["n"][0]["error_95"] > 0
    assert [w for w in payload["warnings"] if w.startswith("s_total ")]
    assert "outer_caps_to_choose" in payload and not journal.exists()
    code, text = run(*common)
    assert code == 0, text
    assert "nothing charged" in text and "warnings:" in text and not journal.exists()
    code, out = run(*common[:-5], "--explain", "--json")  # bounded intervals (the default)
    assert code == 0, out
    assert json.loads(out)["warnings"] == []


def test_json_says_which_options_bounding_unit_did_not_use(shop: Path) -> None:
    """``--bounding unit --intervals total --total-share 0.2``: the total intervals were
    quietly not measured (under caps on each unit's total the intervals are the bounded
    ones); ``--json`` and ``--explain --json`` now carry the sentence saying so."""
    common = [str(shop), "--sql", SUM_BY_REGION, "--privacy-unit", "uid", "--epsilon", "1",
              "--keys", str(shop.parent / "regions.csv"), "--bounding", "unit",
              "--max-unit-rows", "10", "--max-unit-sums", "amount=1000", "--intervals",
              "total", "--total-share", "0.2", "--json"]
    said = ("The curator's intervals='total' and the curator's total_share=0.2 were not "
            "used: under bounding='unit'")
    code, out = run(*common)
    assert code == 0, out
    payload = json.loads(out)
    assert sum(w.startswith(said) for w in payload["warnings"]) == 1, payload["warnings"]
    assert payload["privacy"]["epsilon"] == 1.0
    code, out = run(*common, "--explain")
    assert code == 0, out
    assert any(w.startswith(said) for w in json.loads(out)["warnings"])
