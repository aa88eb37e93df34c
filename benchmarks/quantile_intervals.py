"""Quantile intervals: coverage and width, the staged rule against one fine stage.

Issue 14, part 3. The noisy dyadic tree of ``dpcurator.curator._quantiles`` is read twice per
release: by the staged first-crossing rule (``STAGES``: grids of 64, 8 and 1 bins at 1%, 1% and
98% of alpha) and by the single fine stage at the whole alpha that it replaced (2026-11). Each
partition holds n values drawn afresh per run, one per privacy unit, bounds [0, 100]:

- ``normal``: N(50, 10), spread out;
- ``uniform``: U(0, 100), spread over the whole range;
- ``ties``: N(40, 13) rounded to integers (ages: heavy ties, as UCI Adult's).

For each shape and n: the share of 95% intervals that hold the true sample median, and their mean
width, both ways on the same noise. Run:

    .venv/bin/python benchmarks/quantile_intervals.py                  # about a minute
    .venv/bin/python benchmarks/quantile_intervals.py --noise gaussian --budget 0.5
    .bench-venv/bin/python benchmarks/quantile_intervals.py --fair --shapes none

``--fair`` also reads real data through the curator: statsmodels' "fair" data (6,366 women,
shipped with statsmodels, as ``utility.py`` uses it), MEDIAN(age) clamped to [17.5, 42] and
MEDIAN(yrs_married) to [0, 25] per education level (public keys, 48 to 2,277 people), epsilon
1, each release's 95% intervals read both ways. Ages take 6 values and years married 7: tied
data, where the quantile's bin is certain.

Target (issue 14): coverage within [94%, 97%] at 95%, widths no larger than before.
"""

from __future__ import annotations

import argparse

import numpy as np

from dpcurator.curator import _quantiles
from dpcurator.curator._quantiles import BINS, QuantileTree
from dpcurator.noise import SeededRandom
from dpcurator.query.bounding import HistogramSpec
from dpcurator.query.plan import Quantile

LO, HI = 0.0, 100.0


def draw(shape: str, rng: np.random.Generator, parts: int, n: int) -> np.ndarray:
    if shape == "normal":
        return np.clip(rng.normal(50, 10, (parts, n)), LO, HI)
    if shape == "uniform":
        return rng.uniform(LO, HI, (parts, n))
    return np.clip(np.round(rng.normal(40, 13, (parts, n))), LO, HI)


def measure(shape: str, n: int, runs: int, parts: int, noise: str, budget: float, q: float,
            seed: int) -> dict[str, tuple[float, float]]:
    rng = np.random.default_rng(seed)
    tree = QuantileTree.build(Quantile("x", (LO, HI), "m", q=q),
                              HistogramSpec("m", "x", LO, HI, BINS), noise, budget, k=1, r=1,
                              source=SeededRandom(seed))
    rules = {"staged": _quantiles.STAGES, "one stage": ((0, 1.0),)}
    hits = {name: 0 for name in rules}
    widths: dict[str, list[np.ndarray]] = {name: [] for name in rules}
    for _ in range(runs):
        x = draw(shape, rng, parts, n)
        bins = np.minimum(BINS - 1, np.floor((x - LO) * (BINS / (HI - LO)))).astype(np.int64)
        leaves = np.stack([np.bincount(row, minlength=BINS) for row in bins])
        truth = np.quantile(x, q, axis=1)
        noisy = tree.add_noise(leaves)
        for name, stages in rules.items():
            _quantiles.STAGES = stages
            try:
                low, high = tree.interval(noisy, 0.05)
            finally:
                _quantiles.STAGES = rules["staged"]
            hits[name] += int(np.sum((low <= truth) & (truth <= high)))
            widths[name].append(high - low)
    return {name: (hits[name] / (runs * parts), float(np.mean(np.concatenate(widths[name]))))
            for name in rules}


def fair_medians(runs: int) -> None:
    """MEDIAN per education level on the fair data, each release read both ways."""
    import statsmodels.api as sm

    import dpcurator as dp

    raw = sm.datasets.fair.load_pandas().data
    frame = raw.assign(educ=raw["educ"].astype(int), pid=np.arange(len(raw)))
    keys = sorted(frame.educ.unique())
    sizes = [int((frame.educ == k).sum()) for k in keys]
    print(f"\nfair data, MEDIAN per education level (sizes {sizes}), epsilon 1, {runs} runs")
    print("| column | one stage: coverage, mean width | staged: coverage, mean width | ratio |")
    print("| --- | --- | --- | --- |")
    for column, lo, hi in (("age", 17.5, 42.0), ("yrs_married", 0.0, 25.0)):
        truth = np.array([np.quantile(np.clip(frame[frame.educ == k][column], lo, hi), 0.5)
                          for k in keys])
        curator = dp.Curator.from_pandas(frame, privacy_unit="pid", budget=dp.PureDP(1e9),
                                         bounds={column: (lo, hi)}, source=SeededRandom(1),
                                         cache=False)
        rules = {"one stage": ((0, 1.0),), "staged": _quantiles.STAGES}
        hits = {name: 0 for name in rules}
        widths: dict[str, list[np.ndarray]] = {name: [] for name in rules}
        for _ in range(runs):
            release = curator.sql(f"SELECT educ, MEDIAN({column}) AS m FROM data GROUP BY educ",
                                  epsilon=1.0, keys=keys)
            for name, stages in rules.items():
                _quantiles.STAGES = stages
                try:
                    low, high = release.interval("m", 0.95)
                finally:
                    _quantiles.STAGES = rules["staged"]
                hits[name] += int(np.sum((low <= truth) & (truth <= high)))
                widths[name].append(high - low)
        (c1, w1), (c2, w2) = ((hits[n] / (runs * len(keys)), float(np.mean(widths[n])))
                              for n in rules)
        print(f"| {column} | {c1:.3f}, {w1:.2f} | {c2:.3f}, {w2:.2f} | {w2 / w1:.3f} |",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="150,300,1000,3000,10000,100000")
    parser.add_argument("--shapes", default="normal,uniform,ties")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--parts", type=int, default=50)
    parser.add_argument("--noise", choices=["laplace", "gaussian"], default="laplace")
    parser.add_argument("--budget", type=float, default=1.0, help="epsilon, or rho (gaussian)")
    parser.add_argument("--q", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fair", action="store_true",
                        help="also MEDIAN on statsmodels' fair data (the benchmark environment)")
    parser.add_argument("--fair-runs", type=int, default=300)
    args = parser.parse_args()
    print(f"{args.noise} noise, budget {args.budget}, q = {args.q}, 95% intervals, "
          f"{args.runs * args.parts} per cell, bounds [0, 100]")
    print("| shape | n | one stage: coverage, width | staged: coverage, width | width ratio |")
    print("| --- | --- | --- | --- | --- |")
    for shape in [] if args.shapes == "none" else args.shapes.split(","):
        for n in (int(v) for v in args.sizes.split(",")):
            got = measure(shape, n, args.runs, args.parts, args.noise, args.budget, args.q,
                          args.seed)
            (c1, w1), (c2, w2) = got["one stage"], got["staged"]
            print(f"| {shape} | {n:,} | {c1:.3f}, {w1:.3f} | {c2:.3f}, {w2:.3f} | "
                  f"{w2 / w1:.3f} |", flush=True)
    if args.fair:
        fair_medians(args.fair_runs)


if __name__ == "__main__":
    main()
