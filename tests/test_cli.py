"""The command line: one JSON object with --json, clear errors naming the parameter."""

from __future__ import annotations

import json
import math
from pathlib import Path

from scipy import stats
from typer.testing import CliRunner

from dpcurator.cli import app

runner = CliRunner()


def run_json(*args: str) -> dict[str, object]:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    parsed = json.loads(result.stdout)
    assert isinstance(parsed, dict)
    return parsed


def test_demo_json() -> None:
    """The demo's survey estimate is close to the true rate, by an exact binomial test.

    The demo draws each respondent's truth as Bernoulli(0.3) (``--true-rate``), then the
    two-coin protocol reports yes with probability 3/4 when the truth is yes and 1/4 when it
    is no: every report is independently yes with probability 0.3 * 3/4 + 0.7 * 1/4 = 0.4, so
    the number of yes reports Y is exactly Binomial(n, 0.4). The unbiased estimate is
    (Y / n - 1/4) / (1/2), so Y = n (estimate + 1/2) / 2. A wrong randomizer or estimator (no
    debiasing gives 0.4, a wrong coin another rate) moves Y many standard deviations away
    (the test's acceptance region is about +-0.026 around 0.3 in the estimate).

    False-failure probability: at most 1e-7 for the exact binomial test (each tail of
    Binomial(40000, 0.4) at 5e-8), plus 1e-7 for the estimate against the respondents' own
    true share t (Hoeffding, given the truths: the reports are independent, so
    P[|Y/n - E[Y/n]| >= s] <= 2 exp(-2 n s^2) = 1e-7 for s = sqrt(ln(2e7) / (2n)), and the
    estimate's error is 2 |Y/n - E[Y/n]|): 2e-7 in all. The demo's randomness is secure (not
    seeded), so these are the real probabilities of a false failure.
    """
    n, true_rate = 40_000, 0.3
    out = run_json("demo", "--respondents", str(n), "--true-rate", str(true_rate))
    assert out["respondents"] == n
    estimate = float(out["estimate"])  # type: ignore[arg-type]
    yes = n * (estimate + 0.5) / 2
    assert abs(yes - round(yes)) < 1e-6, estimate  # the unbiased estimate of a count
    yes_rate = true_rate * 3 / 4 + (1 - true_rate) / 4
    assert stats.binom.cdf(round(yes), n, yes_rate) > 5e-8, estimate
    assert stats.binom.sf(round(yes) - 1, n, yes_rate) > 5e-8, estimate
    shown = float(out["true_rate"])  # type: ignore[arg-type]
    assert abs(estimate - shown) <= 2 * math.sqrt(math.log(2e7) / (2 * n)), (estimate, shown)
    assert abs(out["epsilon"] - 1.0986) < 1e-3  # type: ignore[operator]


def test_explain_matches_the_references() -> None:
    out = run_json("explain", "--epsilon", "1.1", "--prior", "0.5")
    assert abs(out["posterior_max"] - 0.75) < 1e-3  # type: ignore[operator]
    assert abs(out["posterior_min"] - 0.25) < 1e-3  # type: ignore[operator]


def test_explain_plot(tmp_path: Path) -> None:
    path = tmp_path / "posterior.svg"
    out = run_json("explain", "--epsilon", "1", "--delta", "1e-6", "--prior", "0.2",
                   "--plot", str(path))
    assert out["plot"] == str(path) and path.stat().st_size > 1000


def test_bad_input_names_the_parameter() -> None:
    for args, word in (
        (["explain", "--epsilon", "1", "--prior", "1.5"], "prior"),
        (["explain", "--epsilon", "-1", "--prior", "0.5"], "epsilon"),
        (["explain", "--epsilon", "1", "--delta", "2", "--prior", "0.5"], "delta"),
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2
        assert word in result.output and "Traceback" not in result.output


def test_account_dpsgd_both_ways() -> None:
    forward = run_json("account", "dpsgd", "--sampling-rate", "0.01", "--noise-multiplier", "1",
                       "--steps", "1000", "--delta", "1e-5")
    assert forward["method"] in ("pld", "rdp") and forward["delta"] == 1e-5
    assert forward["epsilon"] > 1.0 and forward["epsilon"] < 3.0  # type: ignore[operator]
    inverse = run_json("account", "dpsgd", "--sampling-rate", "0.01", "--steps", "1000",
                       "--delta", "1e-5", "--target-epsilon", str(forward["epsilon"]))
    # Solving back for the multiplier lands just above 1 (rounded up, within 0.1%).
    assert inverse["noise_multiplier"] >= 1.0  # type: ignore[operator]
    assert inverse["noise_multiplier"] <= 1.002  # type: ignore[operator]
    assert inverse["epsilon"] <= forward["epsilon"]  # type: ignore[operator]


def test_account_compose_and_convert() -> None:
    gauss = run_json("account", "compose", "--mechanism", "gaussian", "--noise", "4",
                     "--times", "16", "--delta", "1e-5")
    one = run_json("account", "compose", "--mechanism", "gaussian", "--noise", "1",
                   "--times", "1", "--delta", "1e-5")
    # 16 Gaussians of sigma 4 are exactly one Gaussian of sigma 1.
    assert abs(gauss["epsilon"] - one["epsilon"]) < 0.01 * one["epsilon"]  # type: ignore[operator]
    rr = run_json("account", "compose", "--mechanism", "randomized-response", "--epsilon", "1",
                  "--times", "3", "--delta", "1e-6")
    assert rr["epsilon"] <= 3.0 + 1e-9  # type: ignore[operator]
    conv = run_json("account", "convert", "--from", "zcdp", "--rho", "0.5", "--delta", "1e-5")
    assert {"epsilon", "delta"} <= set(conv)


def test_account_bad_input_names_the_parameter() -> None:
    for args, word in (
        (["account", "dpsgd", "--sampling-rate", "2", "--noise-multiplier", "1", "--steps",
          "10", "--delta", "1e-5"], "sampling_rate"),
        (["account", "dpsgd", "--sampling-rate", "0.1", "--noise-multiplier", "-1", "--steps",
          "10", "--delta", "1e-5"], "noise_multiplier"),
        (["account", "dpsgd", "--sampling-rate", "0.1", "--noise-multiplier", "1", "--steps",
          "0", "--delta", "1e-5"], "steps"),
        (["account", "dpsgd", "--sampling-rate", "0.1", "--noise-multiplier", "1", "--steps",
          "10", "--delta", "1.5"], "delta"),
        (["account", "compose", "--mechanism", "gaussian", "--noise", "0"], "noise"),
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert word in result.output and "Traceback" not in result.output


def test_query_help_shows_percentages_as_written() -> None:
    """Typer's help strings are not %-formatted: "10%%" would be shown as written."""
    result = runner.invoke(app, ["query", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "10%" in result.output and "%%" not in result.output
