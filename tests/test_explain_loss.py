"""``dpcurator explain``: a mechanism's two deltas and the pictures, read back and checked.

The pictures' tests open the matplotlib figures and read the drawn data (bar heights and
positions, lines), then check them against closed forms computed here, not only that a file
was written.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import special
from typer.testing import CliRunner

from dpcurator.accounting import (
    ApproxDP,
    PureDP,
    loss_profile,
    plot_privacy_loss,
    posterior_bounds,
    posterior_figure,
)
from dpcurator.accounting import events as ev
from dpcurator.cli import app

runner = CliRunner()


def run_json(*args: str) -> dict[str, Any]:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    parsed = json.loads(result.stdout)
    assert isinstance(parsed, dict)
    return parsed


# ------------------------------------------------------------------------------ the command


def test_explain_gaussian_reads_both_deltas() -> None:
    out = run_json("explain", "--mechanism", "gaussian", "--noise", "1", "--epsilon", "1")
    assert abs(out["delta_pdp"] - 0.30854) < 1e-5 and abs(out["delta_adp"] - 0.12694) < 1e-5
    assert out["epsilon"] == 1.0 and out["exact"] is True
    assert "P[L > epsilon]" in out["atom_at_epsilon"]


def test_explain_laplace_rr_and_name_and_shame() -> None:
    lap = run_json("explain", "--mechanism", "laplace", "--noise", "2", "--sensitivity", "2",
                   "--epsilon", "0.5", "--delta", "1e-3")
    assert abs(lap["delta_pdp"] - 0.61060) < 1e-5 and abs(lap["delta_adp"] - 0.22120) < 1e-5
    assert lap["epsilon_pdp"] == pytest.approx(1.0, abs=1e-9)  # the atom at 1 / b
    assert lap["epsilon_adp"] == pytest.approx(1 + 2 * math.log1p(-1e-3), abs=1e-9)
    rr = run_json("explain", "--mechanism", "rr", "--probability", "0.75", "--epsilon", "0.5")
    assert rr["delta_pdp"] == pytest.approx(0.75, rel=1e-9)
    assert rr["delta_adp"] == pytest.approx(0.75 - math.exp(0.5) * 0.25, rel=1e-9)
    assert rr["neighbouring"] == "replace one privacy unit"
    for eps in ("0", "0.3", "7"):
        ns = run_json("explain", "--mechanism", "name-and-shame", "--probability", "1e-3",
                      "--epsilon", eps)
        assert ns["delta_pdp"] == pytest.approx(1e-3, rel=1e-9)
        assert ns["delta_adp"] == pytest.approx(1e-3, rel=1e-9)


def test_explain_a_composition_and_dpsgd() -> None:
    four = run_json("explain", "--mechanism", "gaussian", "--noise", "2", "--times", "4",
                    "--epsilon", "1")
    assert four["delta_pdp"] == pytest.approx(1 - special.ndtr(0.5), rel=1e-9)  # = sigma 1
    sgd = run_json("explain", "--mechanism", "dpsgd", "--noise", "1", "--sampling-rate", "0.01",
                   "--times", "300", "--epsilon", "1", "--delta", "1e-5")
    profile = loss_profile(ev.SelfComposedEvent(
        ev.PoissonSampledEvent(0.01, ev.GaussianEvent(1.0)), 300))
    assert sgd["delta_pdp"] == pytest.approx(profile.delta_pdp(1.0), rel=1e-12)
    assert sgd["delta_adp"] == pytest.approx(profile.delta_adp(1.0), rel=1e-12)
    assert sgd["delta_adp"] <= sgd["delta_pdp"] and sgd["exact"] is False
    assert sgd["epsilon_adp"] <= sgd["epsilon_pdp"]


def test_explain_writes_the_loss_picture(tmp_path: Path) -> None:
    path = tmp_path / "plrv.png"
    out = run_json("explain", "--mechanism", "name-and-shame", "--probability", "0.05",
                   "--epsilon", "1", "--plot", str(path))
    assert out["plot"] == str(path) and path.stat().st_size > 5000


def test_explain_posterior_unchanged_and_its_plot(tmp_path: Path) -> None:
    out = run_json("explain", "--epsilon", "1.1", "--prior", "0.5")
    assert abs(out["posterior_max"] - 0.75) < 1e-3 and abs(out["posterior_min"] - 0.25) < 1e-3
    path = tmp_path / "posterior.png"
    out = run_json("explain", "--epsilon", "1.1", "--prior", "0.3", "--plot", str(path))
    assert out["plot"] == str(path) and path.stat().st_size > 5000


@pytest.mark.parametrize(("args", "word"), [
    (["--mechanism", "poisson", "--noise", "1"], "mechanism"),
    (["--mechanism", "gaussian"], "--noise"),
    (["--mechanism", "gaussian", "--noise", "-1"], "noise"),
    (["--mechanism", "name-and-shame", "--probability", "1.5"], "probability"),
    (["--mechanism", "rr", "--noise", "1"], "--noise"),
    (["--mechanism", "dpsgd", "--noise", "1"], "sampling-rate"),
    (["--mechanism", "gaussian", "--noise", "1", "--times", "0"], "times"),
    (["--mechanism", "gaussian", "--noise", "1", "--prior", "0.5"], "prior"),
    (["--noise", "1"], "--mechanism"),
])
def test_bad_input_names_the_parameter(args: list[str], word: str) -> None:
    result = runner.invoke(app, ["explain", "--epsilon", "1", *args])
    assert result.exit_code == 2, result.output
    assert word in result.output and "Traceback" not in result.output
    as_json = runner.invoke(app, ["explain", "--epsilon", "1", *args, "--json"])
    assert as_json.exit_code == 2 and word in json.loads(as_json.stdout)["error"]


# ------------------------------------------------------------------- the loss picture


def _bars(ax: Any, label: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(left edges, widths, heights) of the bar container with that label."""
    (container,) = [c for c in ax.containers if c.get_label() == label]
    patches = list(container)
    return (np.array([p.get_x() for p in patches]), np.array([p.get_width() for p in patches]),
            np.array([p.get_height() for p in patches]))


def _epsilon_line(ax: Any) -> float:
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == "epsilon"]
    xs = np.asarray(line.get_xdata(), dtype=float)
    assert np.all(xs == xs[0])
    return float(xs[0])


def test_gaussian_picture_shades_tail_mass_and_weighted_excess(tmp_path: Path) -> None:
    """sigma = 1, eps = 1: L ~ N(1/2, 1) under P and N(-1/2, 1) under Q. Each drawn bar is the
    P-mass of its bin; the pDP panel shades every bin right of eps in full, the aDP panel only
    P(bin) - e^eps Q(bin); the shaded totals are 0.30854 and 0.12694."""
    picture = plot_privacy_loss(loss_profile(ev.GaussianEvent(1.0)), 1.0, tmp_path / "g.png")
    assert picture.path is not None and picture.path.stat().st_size > 5000
    left, right = picture.figure.axes
    for ax in (left, right):
        assert _epsilon_line(ax) == 1.0
        x, w, mass = _bars(ax, "distribution")
        hi = x + w
        inner = slice(1, -1)  # the end bins also hold the tails beyond the drawn range
        expected = special.ndtr(hi - 0.5) - special.ndtr(x - 0.5)
        assert np.allclose(mass[inner], expected[inner], rtol=1e-9, atol=1e-13)
        assert mass.sum() == pytest.approx(1.0, abs=1e-12)
        assert np.any(np.isclose(x, 1.0, rtol=0, atol=1e-12))  # eps is a bin edge
    x, w, shaded = _bars(left, "shaded")
    _, _, mass = _bars(left, "distribution")
    right_of = x >= 1.0 - 1e-12
    assert np.all(shaded[~right_of] == 0) and np.allclose(shaded[right_of], mass[right_of])
    assert shaded.sum() == pytest.approx(0.30854, abs=1e-5)
    x, w, shaded = _bars(right, "shaded")
    excess = (special.ndtr(x + w - 0.5) - special.ndtr(x - 0.5)) - math.e * (
        special.ndtr(x + w + 0.5) - special.ndtr(x + 0.5))
    assert np.all(shaded[x < 1.0 - 1e-12] == 0)
    inner = (x >= 1.0 - 1e-12) & (np.arange(x.size) < x.size - 1)
    assert np.allclose(shaded[inner], excess[inner], rtol=1e-8, atol=1e-13)
    assert shaded.sum() == pytest.approx(0.12694, abs=1e-5)
    for ax in (left, right):
        assert _bars(ax, "infinity")[2].tolist() == [0.0]
    assert picture.pdp.delta == pytest.approx(picture.delta_pdp, rel=1e-9)
    assert picture.adp.delta == pytest.approx(picture.delta_adp, rel=1e-8)


def test_name_and_shame_picture_is_all_at_infinity() -> None:
    picture = plot_privacy_loss(loss_profile(ev.NameAndShameEvent(0.05)), 0.5)
    for ax in picture.figure.axes:
        x, w, mass = _bars(ax, "distribution")
        (at_zero,) = np.flatnonzero((x < 0) & (x + w >= 0))  # the bin (a, b] holding 0
        assert mass[at_zero] == pytest.approx(0.95, rel=1e-12)
        assert mass.sum() == pytest.approx(0.95, rel=1e-12)
        assert _bars(ax, "shaded")[2].sum() == 0.0
        assert _bars(ax, "infinity")[2].tolist() == [pytest.approx(0.05, rel=1e-12)]
        assert _epsilon_line(ax) == 0.5


def test_laplace_picture_keeps_its_atoms() -> None:
    """Scale 1, eps = 0.5: atoms of 1/2 at L = 1 and e^-1 / 2 at L = -1; the shaded bars of the
    pDP panel add up to 1 - e^(-1/4) / 2, those of the aDP panel to 1 - e^(-1/4)."""
    picture = plot_privacy_loss(loss_profile(ev.LaplaceEvent(1.0)), 0.5)
    left, right = picture.figure.axes
    x, w, mass = _bars(left, "distribution")
    (top,) = np.flatnonzero((x < 1.0) & (x + w >= 1.0))
    (bottom,) = np.flatnonzero((x < -1.0) & (x + w >= -1.0))
    assert mass[top] >= 0.5 and mass[top] - 0.5 < 0.05  # the atom and a sliver of density
    assert mass[bottom] >= math.exp(-1) / 2
    assert _bars(left, "shaded")[2].sum() == pytest.approx(1 - math.exp(-0.25) / 2, rel=1e-9)
    assert _bars(right, "shaded")[2].sum() == pytest.approx(1 - math.exp(-0.25), rel=1e-9)


def test_composition_picture_adds_up_to_the_reported_deltas() -> None:
    event = ev.SelfComposedEvent(ev.PoissonSampledEvent(0.1, ev.GaussianEvent(0.8)), 20)
    profile = loss_profile(event)
    picture = plot_privacy_loss(profile, 1.0)
    left, right = picture.figure.axes
    pdp = _bars(left, "shaded")[2].sum() + _bars(left, "infinity")[2].sum()
    adp = _bars(right, "shaded")[2].sum() + _bars(right, "infinity")[2].sum()
    assert pdp == pytest.approx(profile.delta_pdp(1.0), rel=1e-6)
    assert adp == pytest.approx(profile.delta_adp(1.0), rel=1e-6)
    assert adp < pdp


# ------------------------------------------------------------------ the posterior picture


def _line(ax: Any, label: str) -> tuple[np.ndarray, np.ndarray]:
    (line,) = [ln for ln in ax.get_lines() if ln.get_label().startswith(label)]
    return np.asarray(line.get_xdata(), dtype=float), np.asarray(line.get_ydata(), dtype=float)


@pytest.mark.parametrize("guarantee", [PureDP(1.1), ApproxDP(1.0, 1e-4)])
def test_posterior_picture_marks_the_asked_epsilon_and_prior(
        guarantee: PureDP | ApproxDP) -> None:
    prior = 0.3
    (ax,) = posterior_figure(guarantee=guarantee, prior=prior).axes
    bounds = posterior_bounds(guarantee, prior)
    e = bounds.epsilon  # eps itself for pure DP, eps' for (eps, delta)
    xs, ys = _line(ax, "asked: highest")
    assert np.allclose(ys, math.exp(e) * xs / (1 + (math.exp(e) - 1) * xs), rtol=1e-12)
    xs, ys = _line(ax, "asked: lowest")
    assert np.allclose(ys, xs / (math.exp(e) + (1 - math.exp(e)) * xs), rtol=1e-12, atol=1e-15)
    xs, _ = _line(ax, "prior")
    assert np.all(xs == prior)
    xs, ys = _line(ax, "bounds")
    assert np.all(xs == prior)
    assert ys.tolist() == [bounds.posterior_min, bounds.posterior_max]
    label = next(ln.get_label() for ln in ax.get_lines()
                 if ln.get_label().startswith("asked: h"))
    assert f"{guarantee.epsilon:g}" in label


def test_posterior_picture_matches_the_cli_numbers() -> None:
    out = run_json("explain", "--epsilon", "2", "--prior", "0.1")
    (ax,) = posterior_figure(guarantee=PureDP(2.0), prior=0.1).axes
    _, ys = _line(ax, "bounds")
    assert ys.tolist() == [out["posterior_min"], out["posterior_max"]]
    # the family of curves is still drawn, with the asked one on top
    assert {ln.get_label() for ln in ax.get_lines()} >= {"ε = 0.1", "ε = 1", "ε = 5"}
