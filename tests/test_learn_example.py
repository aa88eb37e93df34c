"""The DP-SGD example (examples/learn_digits.py) runs and reports what it trained."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from dpcurator.accounting.dpsgd import dpsgd_epsilon
from dpcurator.noise import SeededRandom

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "learn_digits.py"



def test_example_trains_and_reports_epsilon() -> None:
    """Two epochs at epsilon 2: the report's epsilon is the spent one, within the target; the
    non-private reference learns the digits, and so, far above chance (0.1), does the private
    model. Both are deterministic here: torch's seed, one thread, and for the private model
    a seeded noise source (0.525 at this seed and torch 2.13; the threshold leaves room for
    another torch's rounding)."""
    spec = importlib.util.spec_from_file_location("learn_digits", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.run([2.0], epochs=2, source=SeededRandom(0))
    assert [math.isinf(r["epsilon"]) for r in rows] == [True, False]
    assert rows[0]["accuracy"] > 0.8
    assert 1.9 < rows[1]["epsilon"] <= 2.0
    # the noise is calibrated tightly: 1% less of it would overshoot the target epsilon
    assert dpsgd_epsilon(sampling_rate=1 / 6, noise_multiplier=rows[1]["noise_multiplier"] * 0.99,
                         steps=12, delta=1e-5).epsilon > 2.0
    assert rows[1]["accuracy"] > 0.3
    # the reported epsilon is the accountant's for the steps taken: 1,437 examples in batches
    # of 256 expected are 6 Poisson steps an epoch at rate 1/6, 12 in two epochs
    spent = dpsgd_epsilon(sampling_rate=1 / 6, noise_multiplier=rows[1]["noise_multiplier"],
                          steps=12, delta=1e-5).epsilon
    assert rows[1]["epsilon"] == pytest.approx(spent, rel=1e-12)
    assert dpsgd_epsilon(sampling_rate=1 / 6, noise_multiplier=rows[1]["noise_multiplier"],
                         steps=13, delta=1e-5).epsilon > rows[1]["epsilon"]
