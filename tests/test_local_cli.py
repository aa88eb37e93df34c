"""``dpcurator survey``: every command prints one JSON object with the documented keys; refused
input prints one ``{"error": ...}`` object and exits with status 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dpcurator.cli.survey import survey_app
from dpcurator.local import plot_interval_widths

runner = CliRunner()


def _run(*args: str, code: int = 0) -> dict[str, Any]:
    result = runner.invoke(survey_app, list(args))
    assert result.exit_code == code, result.output
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, result.stdout  # exactly one JSON object on stdout
    out: dict[str, Any] = json.loads(lines[0])
    return out


def test_simulate_binary() -> None:
    out = _run("simulate", "--mechanism", "rr", "--epsilon", "1", "--n", "20000",
               "--true-rate", "0.3", "--seed", "1", "--json")
    assert {"estimate", "interval", "epsilon", "n"} <= set(out)
    assert out["n"] == 20000 and out["epsilon"] == 1.0 and out["true_rate"] == 0.3
    lo, hi = out["interval"]
    assert lo <= out["estimate"] <= hi and abs(out["estimate"] - 0.3) < 0.1
    assert "INSECURE" in out["warning"]


def test_simulate_two_coin_exact() -> None:
    out = _run("simulate", "-m", "two-coin", "-e", "1.1", "--n", "5000", "--true-rate", "0.5",
               "--exact", "--json")
    assert out["method"] == "exact" and out["mechanism"] == "two-coin"


@pytest.mark.parametrize("mechanism", ["auto", "grr", "sue", "oue", "olh", "hadamard"])
def test_simulate_categories(mechanism: str) -> None:
    out = _run("simulate", "-m", mechanism, "-e", "2", "--n", "20000", "--true-frequencies",
               "0.5,0.3,0.2", "--categories", "bus,bike,car", "--seed", "3", "--json")
    assert set(out["estimates"]) == {"bus", "bike", "car"}
    assert set(out["intervals"]) == {"bus", "bike", "car"}
    assert out["n"] == 20000 and out["epsilon"] == 2.0
    for cat, (lo, hi) in out["intervals"].items():
        assert 0 <= lo <= hi <= 1
        assert abs(out["estimates"][cat] - out["true_frequencies"][cat]) < 0.1


@pytest.mark.parametrize("mechanism", ["duchi", "piecewise"])
def test_simulate_numeric(mechanism: str) -> None:
    out = _run("simulate", "-m", mechanism, "-e", "1", "--n", "20000", "--true-rate", "30",
               "--low", "0", "--high", "100", "--seed", "4", "--json")
    assert {"estimate", "interval", "epsilon", "n", "true_mean"} <= set(out)
    assert abs(out["estimate"] - out["true_mean"]) < 10


def test_simulate_writes_reports_and_estimate_reads_them(tmp_path: Path) -> None:
    reports = tmp_path / "reports.jsonl"
    sim = _run("simulate", "-m", "olh", "-e", "1", "--n", "3000", "--true-frequencies",
               "0.6,0.4", "--categories", "yes,no", "--seed", "5", "--reports", str(reports),
               "--json")
    with open(reports, "a", encoding="utf-8") as handle:
        handle.write("garbage line\n")
    est = _run("estimate", str(reports), "-m", "olh", "-e", "1", "--categories", "yes,no",
               "--json")
    assert est["n"] == 3000 and est["bad_reports"] == 1
    assert est["errors"] == [{"line": 3001, "error": "not valid JSON"}]
    assert est["estimates"] == sim["estimates"]


def test_config_then_client_reports_then_estimate(tmp_path: Path) -> None:
    from dpcurator.local import client

    result = runner.invoke(survey_app, ["config", "-m", "hadamard", "-e", "1", "--categories",
                                        "a,b,c"])
    assert result.exit_code == 0
    cfg = json.loads(result.stdout)
    assert cfg["mechanism"] == "hadamard" and cfg["categories"] == ["a", "b", "c"]
    (tmp_path / "survey.json").write_text(result.stdout, encoding="utf-8")
    reports = tmp_path / "r.jsonl"
    reports.write_text("".join(json.dumps(client.randomize(cfg, v)) + "\n"
                               for v in ["a", "b", "c"] * 200), encoding="utf-8")
    out = _run("estimate", str(reports), "--config", str(tmp_path / "survey.json"), "--json")
    assert out["n"] == 600 and set(out["estimates"]) == {"a", "b", "c"}


def test_estimate_csv(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text("y\n1\n0\n1\nmaybe\n1\n", encoding="utf-8")
    out = _run("estimate", str(path), "-m", "rr", "-e", "2", "--json")
    assert out["n"] == 4 and out["bad_reports"] == 1 and out["errors"][0]["line"] == 5


def test_survey_help_lists_every_command() -> None:
    from dpcurator.cli import app

    result = runner.invoke(app, ["--help"])
    assert "simulate, estimate, plan, config" in result.stdout


def test_plan_two_coin_figure_leaves_out_unreachable_epsilons(tmp_path: Path) -> None:
    """Two-coin needs epsilon > ln 2: the figure's usual 0.5 curve is left out (it used to fail
    the whole command with an epsilon the user never gave)."""
    fig = tmp_path / "tc.svg"
    out = _run("plan", "-m", "two-coin", "-e", "1.5", "--margin", "0.01", "--figure", str(fig),
               "--json")
    assert out["figure"] == str(fig) and fig.stat().st_size > 1000
    assert out["figure_epsilons"] == [1.0, 1.5, 2.0]
    assert plot_interval_widths(tmp_path / "tc.png", mechanism="two-coin").stat().st_size > 1000


def test_plan(tmp_path: Path) -> None:
    out = _run("plan", "-m", "rr", "-e", "1", "--margin", "0.01", "--json")
    assert out["n"] == 44971 and out["worst_case"] is True and out["rate"] is None
    given = _run("plan", "-m", "rr", "-e", "1", "--margin", "0.01", "--rate", "0.05", "--json")
    assert given["n"] < out["n"]
    fig = tmp_path / "w.svg"
    drawn = _run("plan", "-m", "oue", "-e", "1", "--k", "16", "--margin", "0.02", "--figure",
                 str(fig), "--json")
    assert drawn["figure"] == str(fig) and fig.stat().st_size > 1000
    assert drawn["figure_epsilons"] == [0.5, 1.0, 2.0]
    numeric = _run("plan", "-m", "duchi", "-e", "1", "--margin", "1", "--low", "0", "--high",
                   "100", "--json")
    assert numeric["n"] > 0


@pytest.mark.parametrize(("args", "message"), [
    (("simulate", "-m", "rr", "-e", "0", "--n", "10", "--true-rate", "0.5"), "epsilon"),
    (("simulate", "-m", "rr", "-e", "-1", "--n", "10", "--true-rate", "0.5"), "epsilon"),
    (("simulate", "-m", "grr", "-e", "1", "--n", "10"), "--true-frequencies"),
    (("simulate", "-m", "grr", "-e", "1", "--n", "10", "--true-frequencies", "0.5,0.6"),
     "summing to 1"),
    (("simulate", "-m", "nope", "-e", "1", "--n", "10", "--true-rate", "0.5"), "mechanism"),
    (("plan", "-m", "rr", "-e", "1", "--margin", "-1"), "margin"),
    (("estimate", "/nonexistent/r.jsonl", "-m", "rr", "-e", "1"), "cannot read"),
    (("estimate", "/nonexistent/r.jsonl"), "--config"),
    (("simulate", "-m", "duchi", "-e", "1", "--n", "10", "--true-rate", "0", "--low", "-1e308",
      "--high", "1e308"), "high - low must be a finite number"),
])
def test_errors_are_one_json_object(args: tuple[str, ...], message: str) -> None:
    out = _run(*args, "--json", code=2)
    assert message in out["error"]


def test_auto_with_a_range_runs_a_numeric_survey() -> None:
    """``-m auto --low 0 --high 100`` ran a yes/no survey (and then refused --true-rate 30 as
    outside [0, 1]); a range asks for a numeric survey, as the help text says."""
    out = _run("simulate", "-m", "auto", "-e", "1", "--n", "20000", "--true-rate", "30",
               "--low", "0", "--high", "100", "--seed", "4", "--json")
    assert out["mechanism"] == "duchi" and out["low"] == 0 and out["high"] == 100
    assert abs(out["estimate"] - out["true_mean"]) < 10
    config = json.loads(runner.invoke(survey_app, ["config", "-e", "1", "--high", "5"]).stdout)
    assert config["mechanism"] == "duchi" and (config["low"], config["high"]) == (0, 5)
    yes_no = _run("simulate", "-m", "auto", "-e", "1", "--n", "100", "--true-rate", "0.5",
                  "--json")
    assert yes_no["mechanism"] == "rr"  # no range, no categories: unchanged


@pytest.mark.parametrize("args", [
    ("simulate", "-m", "auto", "-e", "1", "--n", "10", "--true-frequencies", "0.5,0.5",
     "--low", "0"),
    ("config", "-m", "auto", "-e", "1", "--k", "3", "--high", "9"),
    ("simulate", "-m", "rr", "-e", "1", "--n", "10", "--true-rate", "0.5", "--high", "9"),
    ("plan", "-m", "oue", "-e", "1", "--k", "4", "--margin", "0.1", "--low", "-1"),
])
def test_a_range_is_refused_where_it_would_be_ignored(args: tuple[str, ...]) -> None:
    out = _run(*args, "--json", code=2)
    assert "--low/--high" in out["error"] and "--mechanism" in out["error"]


def test_make_randomizer_auto_reads_a_range_as_a_numeric_question() -> None:
    from dpcurator.errors import UserError
    from dpcurator.local import Duchi, make_randomizer
    from dpcurator.local.survey import choose_numeric

    rand = make_randomizer("auto", 1.0, low=-3, high=3)
    assert isinstance(rand, Duchi) and (rand.low, rand.high) == (-3, 3)
    assert make_randomizer("auto", 1.0).mechanism == "rr"
    assert all(choose_numeric(e) == "duchi" for e in (0.01, 0.5, 1.0, 4.0, 50.0))
    with pytest.raises(UserError, match="both categories and a range"):
        make_randomizer("auto", 1.0, categories=3, high=2)
