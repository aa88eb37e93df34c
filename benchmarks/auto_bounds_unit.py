"""``bounding="unit"`` with its caps chosen from the data, on the family of shapes.

A query of COUNT(*) and SUM may cap each unit's total (``bounding="unit"``: its rows M, or its
sum of |value| V) instead of k partitions of r rows clamped to a bound (the default,
``"rescale"``). ``auto_bounds.py --family`` computes the per-partition choice's error exactly
over its law; this script measures the unit mode's on the same 56 shapes
(``auto_bounds_family``):

- ``best unit``: the best fixed caps on each unit's total in hindsight, exactly: every power of
  two for the rows cap M (COUNT: each of a unit's T rows weighs min(1, M / T)) or for V (SUM:
  each value clamped to [-V, V], a unit's sum divided by the least power of two 2^j with its
  sum of |value| at most V 2^j, as ``dpcurator.query.bounding`` does), scored by the exact
  bias plus the noise's variance with the whole budget on the answer (Laplace 2 (V / epsilon)^2,
  Gaussian V^2 / (2 rho): the sensitivity is the cap alone);
- ``default``: the curator's releases with ``bounding="unit"`` and nothing else given (the
  caps chosen from the data with 10% of the budget), RMSE over the groups and ``--releases``
  seeded releases against the true answer without caps;
- with ``--family-json`` (the output of ``auto_bounds.py --family --json``), the best fixed
  per-partition bounds of the same shapes too, and the ratio to the better of the two.

    .venv/bin/python benchmarks/auto_bounds_unit.py --questions SUM,COUNT --releases 12 \
        --family-json family.json --json unit.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dpcurator as dp
from auto_bounds_family import Shape, family_shapes, shape_table
from dpcurator.noise import SeededRandom

AGGREGATES = {"COUNT": "COUNT(*)", "SUM": "SUM(x)"}


def best_unit(table: pd.DataFrame, shape: Shape, question: str) -> tuple[float, float]:
    """(RMSE, cap) of the best fixed cap on each unit's total, a power of two, in hindsight."""
    keys = [f"g{i}" for i in range(shape.groups)]
    group = table["g"].map({key: i for i, key in enumerate(keys)}).to_numpy()
    unit = np.unique(table["user"].to_numpy(), return_inverse=True)[1]
    x = table["x"].to_numpy(dtype=float)

    def noise_variance(cap: float) -> float:
        if shape.rho is not None:
            return cap * cap / (2.0 * shape.rho)
        assert shape.epsilon is not None
        return 2.0 * (cap / shape.epsilon) ** 2

    best = (math.inf, 0.0)
    if question == "COUNT":
        truth = np.bincount(group, None, shape.groups)
        rows = np.bincount(unit)
        for j in range(21):
            answer = np.bincount(group, np.minimum(1.0, 2**j / rows)[unit], shape.groups)
            best = min(best, (float(np.mean((answer - truth) ** 2)) + noise_variance(2**j),
                              float(2**j)))
        return math.sqrt(best[0]), best[1]
    truth = np.bincount(group, x, shape.groups)
    top = math.ceil(math.log2(float(np.abs(x).max()) or 1.0)) + 1
    for j in range(top - 16, top + 14):
        cap = 2.0**j
        clamped = np.clip(x, -cap, cap)
        total = np.bincount(unit, np.abs(clamped))
        halvings = np.where(total > cap, np.ceil(np.log2(np.maximum(total, 1e-300) / cap)), 0.0)
        answer = np.bincount(group, clamped * (2.0 ** -halvings)[unit], shape.groups)
        best = min(best, (float(np.mean((answer - truth) ** 2)) + noise_variance(cap), cap))
    return math.sqrt(best[0]), best[1]


def default_rmse(table: pd.DataFrame, shape: Shape, question: str, releases: int
                 ) -> dict[str, Any]:
    """The default's RMSE over the groups and ``releases`` seeded releases, and what it
    chose and said."""
    keys = [f"g{i}" for i in range(shape.groups)]
    truth = (table.groupby("g")["x"].sum() if question == "SUM" else table.groupby("g").size())
    exact = np.array([float(truth.get(key, 0.0)) for key in keys])
    budget = dp.PureDP(1e9) if shape.rho is None else dp.ZCDP(1e9)
    privacy = {"epsilon": shape.epsilon} if shape.rho is None else {"rho": shape.rho}
    curator = dp.Curator.from_pandas(table, privacy_unit="user", budget=budget, cache=False,
                                     source=SeededRandom(shape.seed))
    squared, caps, warned, modes = [], [], 0, set()
    for _ in range(releases):
        release = curator.sql(f"SELECT g, {AGGREGATES[question]} AS v FROM data GROUP BY g",
                              keys=keys, bounding="unit", **privacy)  # type: ignore[arg-type]
        modes.add(release.plan.bounding)
        frame = release.to_pandas().set_index("g").reindex(keys)
        squared.append(float(np.mean((frame["v"].to_numpy(dtype=float) - exact) ** 2)))
        caps.append(float(release.max_unit_rows if question == "COUNT" else
                          next(iter(release.max_unit_sums.values()))))
        warned += bool(release.warnings)
    return {"rmse": math.sqrt(statistics.fmean(squared)), "modes": sorted(modes),
            "median_cap": statistics.median(caps), "warned": warned / releases,
            "per_release": [math.sqrt(s) for s in squared]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", default="SUM,COUNT")
    parser.add_argument("--releases", type=int, default=12)
    parser.add_argument("--shapes", type=int, default=56)
    parser.add_argument("--only", default=None, help="comma-separated shape numbers")
    parser.add_argument("--family-json", default=None,
                        help="auto_bounds.py --family --json output: the per-partition bests")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    only = {int(n) for n in args.only.split(",")} if args.only else None
    per_partition: dict[tuple[str, str], float] = {}
    if args.family_json:
        for case in json.loads(Path(args.family_json).read_text())["cases"]:
            per_partition[(case["shape"], case["question"])] = case["best"]
    questions = args.questions.split(",")
    out: list[dict[str, Any]] = []
    print(f"{'shape':52s} {'question':8s} {'best unit':>10s} {'default':>10s} "
          f"{'ratio':>6s} {'vs best of both':>15s} {'P[>3x]':>7s} {'warned':>6s}")
    for shape in family_shapes(args.shapes):
        if only is not None and shape.seed not in only:
            continue
        table = shape_table(shape)
        for question in questions:
            best, cap = best_unit(table, shape, question)
            default = default_rmse(table, shape, question, args.releases)
            other = per_partition.get((shape.label(), question))
            both = min(best, other) if other is not None else best
            far = statistics.fmean(e > 3.0 * both for e in default["per_release"])
            row = {"shape": shape.label(), "question": question, "best_unit": best,
                   "best_unit_cap": cap, "best_per_partition": other,
                   "ratio": default["rmse"] / best, "ratio_best_of_both": default["rmse"] / both,
                   "p_far": far, **default}
            out.append(row)
            print(f"{shape.label():52s} {question:8s} {best:10.4g} {default['rmse']:10.4g} "
                  f"{row['ratio']:6.2f} {row['ratio_best_of_both']:15.2f} {far:7.2f} "
                  f"{default['warned']:6.2f}", flush=True)
    for question in questions:
        rows = [r for r in out if r["question"] == question]
        if not rows:
            continue
        ratios = [r["ratio_best_of_both"] for r in rows]
        worst = max(rows, key=lambda r: r["ratio_best_of_both"])
        print(f"\n{question}: against the best of both fixed kinds, median "
              f"{statistics.median(ratios):.2f}, geometric mean "
              f"{math.exp(statistics.fmean(math.log(r) for r in ratios)):.2f}, worst "
              f"{worst['ratio_best_of_both']:.2f} ({worst['shape'].split()[0]}), "
              f"{sum(r <= 1.25 for r in ratios)} of {len(rows)} within 1.25x, "
              f"{sum(r['p_far'] <= 0.01 for r in rows)} with no release above 3x")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
