"""The respondent's ``client.py`` runs alone (standard library only) and draws exactly the
distribution the library enumerates.

Statistical check: 20,000 client reports per mechanism against the exact probabilities, chi-square
goodness of fit rejected at p < 1e-7 (cells grouped to expect >= 20 each), so a correct client
fails with probability < 1e-7 per mechanism.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from dpcurator.local import client, from_config, make_randomizer

CLIENT = Path(client.__file__)

CASES: list[tuple[str, dict[str, Any], Any]] = [
    ("rr", {}, "yes"),
    ("two-coin", {}, "no"),
    ("grr", {"categories": ["a", "b", "c", "d"]}, "b"),
    ("sue", {"categories": 3}, "1"),
    ("oue", {"categories": 3}, "2"),
    ("olh", {"categories": 5}, "3"),
    ("hadamard", {"categories": 5}, "4"),
    ("duchi", {"low": -1.0, "high": 3.0}, "0.5"),
]


def _row(report: dict[str, Any], rand: Any) -> tuple[int, ...]:
    if "bits" in report:
        return tuple(int(c) for c in report["bits"])
    if "seed" in report:
        return (report["seed"], report["y"])
    y = report["y"]
    if rand.mechanism == "grr":
        return (rand.categories.index(y),)
    return (int(y),)


@pytest.mark.parametrize(("name", "kwargs", "answer"), CASES, ids=[c[0] for c in CASES])
def test_client_draws_the_enumerated_distribution(
        name: str, kwargs: dict[str, Any], answer: Any) -> None:
    rand = make_randomizer(name, 1.2, **kwargs)
    cfg = client.check_config(json.loads(json.dumps(rand.config())))
    gen = random.Random(len(name))
    n = 20_000
    observed: dict[tuple[int, ...], int] = {}
    for _ in range(n):
        row = _row(client.randomize(cfg, answer, gen.randrange), rand)
        observed[row] = observed.get(row, 0) + 1
    if name in ("rr", "two-coin"):
        value: Any = answer == "yes"
    elif name == "duchi":
        value = Fraction(answer)
    elif name == "grr":
        value = answer
    else:
        value = int(answer)
    dist = rand.report_distribution(value)
    assert set(observed) <= set(dist)
    groups, acc_o, acc_e = [], 0.0, 0.0
    for key in sorted(dist, key=lambda k: dist[k]):
        acc_o += observed.get(key, 0)
        acc_e += float(dist[key]) * n
        if acc_e >= 20:
            groups.append((acc_o, acc_e))
            acc_o = acc_e = 0.0
    if acc_e and groups:
        o, e = groups.pop()
        groups.append((o + acc_o, e + acc_e))
    obs, exp = np.array(groups).T
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-7


def test_client_piecewise_matches_enumeration_on_a_small_grid() -> None:
    from dpcurator.local import Piecewise

    rand = Piecewise(1.0, 0.0, 1.0, grid_bits=3)
    cfg = client.check_config(rand.config())
    gen = random.Random(5)
    n = 20_000
    answer = Fraction(5, 16)  # between grid points: exercises the randomized rounding
    counts = np.zeros(rand.grid + rand.m)
    for _ in range(n):
        counts[client.randomize(cfg, "0.3125", gen.randrange)["y"]] += 1
    dist = rand.report_distribution(answer)
    exp = np.array([float(dist[(j,)]) for j in range(rand.grid + rand.m)]) * n
    assert stats.chisquare(counts, exp * counts.sum() / exp.sum()).pvalue > 1e-7


def test_client_runs_alone_in_isolated_mode(tmp_path: Path) -> None:
    """Copied alone into an empty directory and run with ``python -I`` (no site-packages, no
    user paths, no environment): it can only import the standard library."""
    shutil.copy(CLIENT, tmp_path / "client.py")
    cfg = make_randomizer("olh", 1.0, categories=["red", "green", "blue"]).config()
    (tmp_path / "survey.json").write_text(json.dumps(cfg), encoding="utf-8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["client.py", "survey.json"]
    done = subprocess.run(
        [sys.executable, "-I", "client.py", "survey.json", "red", "blue", "purple"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and done.returncode == 1
    assert "answer 3" in done.stderr and "purple" not in done.stderr  # no echo of the answer
    reports = [json.loads(line) for line in lines]
    assert all(r["mechanism"] == "olh" and {"seed", "y"} <= set(r) for r in reports)
    rand = from_config(cfg)
    rows = rand.rows_to_reports([rand.parse_report(r) for r in reports])
    assert rows.shape == (2, 2)
    piped = subprocess.run([sys.executable, "-I", "client.py", "survey.json"], cwd=tmp_path,
                           input="green\n\nred\n", capture_output=True, text=True, timeout=60,
                           check=False)
    assert piped.returncode == 0 and len(piped.stdout.splitlines()) == 2
    # A tampered configuration (weaker than it claims) is refused before anything is drawn.
    cfg["params"]["p"] = "99/100"
    (tmp_path / "survey.json").write_text(json.dumps(cfg), encoding="utf-8")
    refused = subprocess.run([sys.executable, "-I", "client.py", "survey.json", "red"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=60,
                             check=False)
    assert refused.returncode == 2 and refused.stdout == ""
    assert "do not give the epsilon" in refused.stderr


def test_client_help_prints_the_usage() -> None:
    """--help printed the docstring's intro line instead of the commands."""
    done = subprocess.run([sys.executable, "-I", str(CLIENT), "--help"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.startswith("usage:")
    assert 'python client.py survey.json "answer"' in done.stdout
    bare = subprocess.run([sys.executable, "-I", str(CLIENT)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert bare.returncode == 2 and "python client.py survey.json" in bare.stderr


@pytest.mark.parametrize("epsilon", [50.5, 900, float("nan")])
def test_client_refuses_epsilon_above_the_library_cap(epsilon: float) -> None:
    """The client accepted any promised epsilon below 1000; the library caps surveys at 50."""
    cfg = make_randomizer("rr", 1.0).config()
    cfg["epsilon"] = epsilon
    with pytest.raises(client.ConfigError, match=r"epsilon must be a number in \(0, 50\]"):
        client.check_config(cfg)
    cfg["epsilon"] = 50
    client.check_config(cfg)


def test_client_imports_only_the_standard_library() -> None:
    source = CLIENT.read_text(encoding="utf-8")
    imported = {line.split()[1].split(".")[0] for line in source.splitlines()
                if line.startswith(("import ", "from "))}
    assert imported <= {"__future__", "json", "math", "secrets", "sys", "collections",
                        "fractions", "typing"}
