"""``bounding="unit"`` with its caps chosen from the data, on the family of shapes.

A query of COUNT(*) and SUM may cap each unit's total (``bounding="unit"``: its rows M, or its
sum of |value| V) instead of k partitions of r rows clamped to a bound (the default,
``"rescale"``). ``auto_bounds.py --family`` computes the per-partition choice's error exactly
over its law; this script measures the unit mode's on the same 56 shapes
(``auto_bounds_family``):

- ``best unit``: the best fixed caps on each unit's total in hindsight, exactly: every power of
  two for the rows cap M or for V, each answer bounded as ``dpcurator.query.bounding`` does
  (``UnitAnswers``), scored by the exact bias plus the noise's variance with the whole
  budget on the answer (Laplace 2 (V / epsilon)^2, Gaussian V^2 / (2 rho): the sensitivity
  is the cap alone);
- ``default``: the curator's releases with ``bounding="unit"`` and nothing else given (the
  caps chosen from the data with 10% of the budget), RMSE over the groups and ``--releases``
  seeded releases against the true answer without caps; with ``--exact``, its expected RMSE
  exactly over the caps' law instead (``exact_unit``: every cap, however unlikely, and the
  ratio given a penalty below the ramp's cap CAP F, with that plateau's chance beside it);
- with ``--family-json`` (the output of ``auto_bounds.py --family --json``), the best fixed
  per-partition bounds of the same shapes too, and the ratio to the better of the two.

    .venv/bin/python benchmarks/auto_bounds_unit.py --questions SUM,COUNT --releases 12 \
        --family-json family.json --json unit.json
    .venv/bin/python benchmarks/auto_bounds_unit.py --exact --family-json family.json  # 5 min
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


class UnitAnswers:
    """A shape's answers per group under a cap on each unit's total, exactly as
    ``dpcurator.query.bounding`` bounds them (COUNT: a unit's n rows in a group count n M //
    T where its T rows in all exceed M; SUM: each value clamped to [-V, V], a unit's sum
    divided by the least power of two 2^j with its sum of |value| at most V 2^j), and the
    true answers without caps."""

    def __init__(self, table: pd.DataFrame, shape: Shape, question: str) -> None:
        keys = [f"g{i}" for i in range(shape.groups)]
        self.groups, self.question = shape.groups, question
        self.group = table["g"].map({key: i for i, key in enumerate(keys)}).to_numpy()
        self.unit = np.unique(table["user"].to_numpy(), return_inverse=True)[1]
        self.x = table["x"].to_numpy(dtype=float)
        self.rows = np.bincount(self.unit)
        pairs, inverse = np.unique(self.unit * shape.groups + self.group, return_inverse=True)
        self.pair_rows = np.bincount(inverse).astype(float)  # a unit's rows in a group
        self.pair_total = self.rows[pairs // shape.groups].astype(float)
        self.pair_group = pairs % shape.groups
        self.truth = np.bincount(self.group, None if question == "COUNT" else self.x,
                                 shape.groups).astype(float)
        #: the least cap that changes no answer: the most rows of a unit, or the largest
        #: sum of |value| of a unit (at least the largest |value|)
        self.top = float(self.rows.max() if question == "COUNT" else
                         np.bincount(self.unit, np.abs(self.x)).max())

    def __call__(self, cap: float) -> np.ndarray:
        if self.question == "COUNT":  # n M // T of a unit's n rows in a group, T > M
            kept = np.where(self.pair_total <= cap, self.pair_rows,
                            np.floor(self.pair_rows * cap / self.pair_total))
            return np.bincount(self.pair_group, kept, self.groups)
        clamped = np.clip(self.x, -cap, cap)
        total = np.bincount(self.unit, np.abs(clamped))
        halvings = np.where(total > cap, np.ceil(np.log2(np.maximum(total, 1e-300) / cap)),
                            0.0)
        return np.bincount(self.group, clamped * (2.0 ** -halvings)[self.unit], self.groups)

    def fixed_caps(self) -> list[float]:
        """The best cap's candidates: every power of two."""
        if self.question == "COUNT":
            return [2.0**j for j in range(21)]
        top = math.ceil(math.log2(float(np.abs(self.x).max()) or 1.0)) + 1
        return [2.0**j for j in range(top - 16, top + 14)]


def best_unit(table: pd.DataFrame, shape: Shape, question: str,
              answers: UnitAnswers | None = None) -> tuple[float, float]:
    """(RMSE, cap) of the best fixed cap on each unit's total, a power of two, in hindsight."""
    answers = answers or UnitAnswers(table, shape, question)

    def noise_variance(cap: float) -> float:
        if shape.rho is not None:
            return cap * cap / (2.0 * shape.rho)
        assert shape.epsilon is not None
        return 2.0 * (cap / shape.epsilon) ** 2

    best = min((float(np.mean((answers(cap) - answers.truth) ** 2)) + noise_variance(cap), cap)
               for cap in answers.fixed_caps())
    return math.sqrt(best[0]), best[1]


def capture_unit(table: pd.DataFrame, shape: Shape, question: str) -> dict[str, Any]:
    """One default release of ``question`` under ``bounding="unit"``, keeping what its caps'
    choice read: ``auto_plan`` and ``stats`` (``_auto_units._with_unit_caps``' first call),
    ``retry`` (the retry's plan, ``_compile._prove_retry``, or None), and the ``release``."""
    from dpcurator.curator import _auto_units, _compile

    captured: dict[str, Any] = {}
    real_with, real_retry = _auto_units._with_unit_caps, _compile._prove_retry

    def spy_with(auto_plan: Any, plan: Any, chosen: Any, stats: Any, source: Any) -> Any:
        captured.setdefault("auto_plan", auto_plan)
        captured.setdefault("stats", stats)
        return real_with(auto_plan, plan, chosen, stats, source)

    def spy_retry(*args: Any, **kwargs: Any) -> Any:
        retry = real_retry(*args, **kwargs)
        captured["retry"] = None if retry is None else retry[0]
        return retry

    keys = [f"g{i}" for i in range(shape.groups)]
    budget = dp.PureDP(1e9) if shape.rho is None else dp.ZCDP(1e9)
    privacy = {"epsilon": shape.epsilon} if shape.rho is None else {"rho": shape.rho}
    curator = dp.Curator.from_pandas(table, privacy_unit="user", budget=budget, cache=False,
                                     source=SeededRandom(shape.seed))
    _auto_units._with_unit_caps = spy_with  # type: ignore[assignment]
    _compile._prove_retry = spy_retry  # type: ignore[assignment]
    try:
        captured["release"] = curator.sql(
            f"SELECT g, {AGGREGATES[question]} AS v FROM data GROUP BY g", keys=keys,
            bounding="unit", **privacy)  # type: ignore[arg-type]
    finally:
        _auto_units._with_unit_caps = real_with  # type: ignore[assignment]
        _compile._prove_retry = real_retry  # type: ignore[assignment]
    if "auto_plan" not in captured:
        raise RuntimeError(f"{question} on {shape.label()}: no cap was chosen")
    return captured


def _below(threshold: float, count: int, epsilon: float) -> float:
    """P[count + Z < threshold], Z discrete Laplace of parameter q = e^-epsilon."""
    q = math.exp(-epsilon)
    z = math.ceil(threshold - count) - 1  # P[count + Z < threshold] = P[Z <= z]
    return q ** (-z) / (1 + q) if z < 0 else 1 - q ** (z + 1) / (1 + q)


def exact_unit(table: pd.DataFrame, shape: Shape, question: str, best: float,
               answers: UnitAnswers, draws: int = 400) -> dict[str, Any]:
    """The default's expected RMSE under ``bounding="unit"``, exactly over its caps' law, as
    ``auto_bounds.py --family`` computes the caps per group's: one release's profile kept
    (``capture_unit``); the thin-data count's law (``_auto_units.unit_thin``: the discrete
    Laplace's, exact) and, where it calls for the widest cap, the retry's path with its own
    (``_auto_plan.plan_retry``); each path's cap weighed by its permute-and-flip probability
    (``_auto_units.unit_row_scores`` or ``unit_sum_scores``); each cap's error its exact bias
    and the noise the release calibrates (its own noise per unit of cap, scaled by each
    path's epsilon or rho). P[error > 3x ``best``] over ``draws`` common draws of the noise.
    As the family, the widest cap of the stated rule (``fallback``) is left out of the RMSE
    and of P[error > 3x], and given beside them."""
    from auto_bounds_family import Noise, _law
    from dpcurator.curator import _auto_joint, _auto_plan, _auto_units

    captured = capture_unit(table, shape, question)
    release, stats, first = captured["release"], captured["stats"], captured["auto_plan"]
    gaussian = shape.rho is not None
    spread = "sigma" if gaussian else "scale"
    cap0 = float(release.max_unit_rows if question == "COUNT" else
                 next(iter(release.max_unit_sums.values())))
    per_cap = float(release.mechanisms["v"][0][spread]) / cap0
    chosen = release.chosen or {}
    retry = captured.get("retry")
    released = retry if retry is not None and "first_choice" in chosen else first

    def main(ap: Any) -> float:
        return float(ap.request.rho if gaussian else ap.request.epsilon)

    def scale(ap: Any) -> float:  # the noise per unit of cap on this path
        factor = main(released) / main(ap)
        return per_cap * (math.sqrt(factor) if gaussian else factor)

    noise = Noise(shape.groups, draws, gaussian, shape.seed)
    cache: dict[float, np.ndarray] = {}

    def squared(cap: float, ap: Any) -> np.ndarray:
        """Per draw of the noise, the squared error over the groups at ``cap``."""
        key = min(cap, answers.top)  # no bias at or above the data's largest total
        if key not in cache:
            cache[key] = answers(key) - answers.truth
        return np.mean((cache[key][None, :] + scale(ap) * cap * noise.a) ** 2, axis=1)

    def path(ap: Any) -> tuple[float, list[tuple[float, float, bool]]]:
        """(P[the thin-data rule's widest cap], the law of the caps chosen otherwise: each
        cap's probability, the cap, and whether its penalty is at the ramp's cap, CAP F)."""
        threshold, _ = _auto_units.unit_thin_threshold(ap)
        if question == "COUNT":
            threshold = _auto_units.unit_rows_threshold(ap)
            scores, eps = _auto_units.unit_row_scores(ap, stats)
            caps = [float(c) for c in _auto_plan.UNIT_ROW_CANDIDATES]
            floor = ap.floor(_auto_plan.OUTER, len(caps))
        else:
            caps = [float(c) for c in _auto_plan.MAGNITUDES]
            floor = ap.floor(f"{_auto_plan.OUTER_SUM}:x", len(caps))
            scores, eps = _auto_units.unit_sum_scores(ap, stats, 0, "x")
        widest = _below(threshold, _auto_units.unit_thin_statistic(ap, stats),
                        ap.epsilons[_auto_plan.UNITS]) if _auto_plan.UNITS in ap.epsilons \
            else 0.0
        law = _law(np.maximum(scores, -_auto_joint.PENALTY_CAP), eps, _auto_joint.SENSITIVITY)
        plateau = scores <= -_auto_joint.CAP * floor * (1.0 - 1e-12)
        return widest, [(float(p), caps[i], bool(plateau[i])) for i, p in enumerate(law)
                        if p > 0.0]

    sums = {name: 0.0 for name in ("total", "mass", "far", "plateau", "plateau_mse")}
    likeliest: list[tuple[float, float]] = []
    weight = 1.0
    for ap in (first, retry) if retry is not None else (first,):
        widest, law = path(ap)
        for p, cap, on_plateau in law:
            w = weight * (1.0 - widest) * p
            per = squared(cap, ap)
            sums["total"] += w * float(per.mean())
            sums["mass"] += w
            sums["far"] += w * float((per > 9.0 * best * best).mean())
            if on_plateau:
                sums["plateau"] += w
                sums["plateau_mse"] += w * float(per.mean())
            likeliest.append((w, cap))
        weight *= widest
    likeliest.sort(reverse=True)
    at_default = min(float(squared(cap, first).mean()) for cap in answers.fixed_caps())
    mass = sums["mass"]
    off = mass - sums["plateau"]
    return {"rmse": math.sqrt(sums["total"] / mass) if mass > 0 else math.inf,
            "rmse_off_plateau": math.sqrt((sums["total"] - sums["plateau_mse"]) / off)
            if off > 0 else math.inf,
            "plateau": sums["plateau"] / mass if mass > 0 else 0.0,
            "p_far": sums["far"] / mass if mass > 0 else 1.0, "fallback": weight,
            "best_at_default": math.sqrt(at_default),
            "likeliest": [(round(w, 4), c) for w, c in likeliest[:3]],
            "modes": [release.plan.bounding]}


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
    parser.add_argument("--exact", action="store_true",
                        help="the default's expected RMSE exactly over its caps' law "
                        "(exact_unit), not over --releases releases")
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
          f"{'ratio':>6s} {'vs best of both':>15s} {'P[>3x]':>7s} {'warned':>6s}"
          + (f" {'off cap F':>9s} {'P[cap F]':>9s}" if args.exact else ""))
    for shape in family_shapes(args.shapes):
        if only is not None and shape.seed not in only:
            continue
        table = shape_table(shape)
        for question in questions:
            answers = UnitAnswers(table, shape, question)
            best, cap = best_unit(table, shape, question, answers)
            other = per_partition.get((shape.label(), question))
            both = min(best, other) if other is not None else best
            if args.exact:
                default = exact_unit(table, shape, question, both, answers)
                default["warned"] = default["fallback"]
                far = default["p_far"]
            else:
                default = default_rmse(table, shape, question, args.releases)
                far = statistics.fmean(e > 3.0 * both for e in default["per_release"])
            row = {"shape": shape.label(), "question": question, "best_unit": best,
                   "best_unit_cap": cap, "best_per_partition": other,
                   "ratio": default["rmse"] / best, "ratio_best_of_both": default["rmse"] / both,
                   "p_far": far, **default}
            if args.exact:
                row["ratio_off_plateau"] = default["rmse_off_plateau"] / both
            out.append(row)
            plateau = (f" {row['ratio_off_plateau']:9.2f} {default['plateau']:9.2g}"
                       if args.exact else "")
            print(f"{shape.label():52s} {question:8s} {best:10.4g} {default['rmse']:10.4g} "
                  f"{row['ratio']:6.2f} {row['ratio_best_of_both']:15.2f} {far:7.2f} "
                  f"{default['warned']:6.2f}{plateau}", flush=True)
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
        if args.exact:
            off = [r["ratio_off_plateau"] for r in rows]
            print(f"{question}: off the ramp's cap (the law given a penalty below CAP F), "
                  f"median {statistics.median(off):.2f}, geometric mean "
                  f"{math.exp(statistics.fmean(math.log(r) for r in off)):.2f}, worst "
                  f"{max(off):.2f}, {sum(r <= 1.25 for r in off)} of {len(rows)} within "
                  f"1.25x; P[the cap's plateau] at most "
                  f"{max(r['plateau'] for r in rows):.2g}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
