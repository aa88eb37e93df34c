"""Utility at equal privacy: dpcurator against OpenDP, PipelineDP and Tumult Analytics.

Run it from the benchmark environment (``scripts/setup-bench`` creates it)::

    .bench-venv/bin/python benchmarks/utility.py [--runs 100] [--curator-runs 1000]
        [--tumult-python PATH] [--tumult-runs 5] [--json out.json]
        [--skewed-units 50000] [--skewed-runs 20] [--skewed-curator-runs 100]
        [--skip-fair | --skip-skewed]

Two sections, each of which can be skipped: the "fair" data (one row per person, the same
clamping bounds in every library) and the skewed data (many rows per unit, contribution bounds
that matter).

Data: statsmodels' "fair" data set (Fair 1978, 6,366 women; shipped inside the statsmodels
package, nothing is fetched), one row per person, privacy unit = the person (every library:
one partition and one row per unit). Queries, each at epsilon = 1 (delta = 1e-6 where keys are
private), with the same clamping bounds in every library:

- ``count/educ private``: COUNT(*) per education level (6 levels, 48 to 2,277 people), keys
  not public (partition selection);
- ``count/educ x occupation private``: the same per (education, occupation): 36 groups, some
  tiny, so partitions released differ between libraries;
- ``count/educ public``: COUNT(*) per education level, public keys (pure DP);
- ``sum(affairs)/educ public``: SUM(affairs) clamped to [0, 10], public keys;
- ``avg(age)/educ public``: AVG(age) clamped to [17.5, 42], public keys;
- ``release curve``: synthetic partitions of exactly n people (n = 10 .. 20, 300 partitions
  each), private COUNT: how often a partition of n people is released (the n where this
  reaches 1/2 is the partition selection's cost in people).

Measured per library and query, over ``--runs`` releases (``--curator-runs`` for dpcurator):
RMSE of the released values against the true (clamped) answers, pooled over released
partitions; partitions released per run (mean); and, where the library states a 95% interval
(dpcurator for every aggregate; OpenDP's ``summarize(alpha=0.05)`` accuracy for counts and
sums), the share of intervals that contain the truth.

Skewed data: ``skewed.py``'s ``skewed_table(--skewed-units, seed=0)`` (50,000 units: 623,589
rows; 97% of units with 1-3 rows in 1-2 categories, 3% with 100-600 rows over up to 8),
privacy unit = ``user``, public keys = the 8 categories, epsilon = 1, pure DP:
``count(*)/category`` and ``sum(amount)/category``. The truth is the true *unbounded* answer
(no caps, no clamping), so the RMSE holds both each library's bias from bounding and its
noise. dpcurator runs twice: ``(auto)`` with its default, bounds chosen under DP inside the
same epsilon; ``(fixed)`` with the best fixed powers of two in hindsight for this data
(``SKEWED_K``, ``SKEWED_R``, ``SKEWED_AMOUNT``), which every peer gets too, each applying its
own truncation. OpenDP runs twice: grouped by the public keys alone (which bound a unit's
groups by 8) and with its ``truncate_num_groups`` as well, on a quarter of the runs (that
helper keeps one group fewer than asked). Measured as above over ``--skewed-runs`` releases
(``--skewed-curator-runs`` for dpcurator; Tumult too runs ``--skewed-runs``), against the
unbounded truth, plus the seconds per release.

Peers come only from the benchmark environment. Tumult Analytics pins numpy < 2, so it runs in
an environment of its own given by ``--tumult-python`` (``uv venv /tmp/tumult && uv pip
install -p /tmp/tumult tmlt.analytics duckdb statsmodels``; Java 17 for its local Spark), on
fewer runs (``--tumult-runs``: one query takes seconds on Spark). A peer that cannot be
imported or run is skipped with a printed note.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

EPSILON = 1.0
DELTA = 1e-6
AFFAIRS = (0.0, 10.0)
AGE = (17.5, 42.0)
CURVE_SIZES = tuple(range(10, 21))
CURVE_COPIES = 300

# query name -> (group columns, aggregate, public keys?)
QUERIES: dict[str, tuple[tuple[str, ...], str, bool]] = {
    "count/educ private": (("educ",), "count", False),
    "count/educ x occupation private": (("educ", "occupation"), "count", False),
    "count/educ public": (("educ",), "count", True),
    "sum(affairs)/educ public": (("educ",), "sum", True),
    "avg(age)/educ public": (("educ",), "avg", True),
}

Result = dict[tuple[Any, ...], tuple[float, float, float]]  # key -> (value, low, high)

SKEWED_SEED = 0
# The fixed bounds every library gets on the skewed data: the best fixed powers of two in
# hindsight there (50,000 units, seed 0, epsilon 1), by auto_bounds.py's exact expected RMSE
# over k in 1..8, r in 1..1024, upper in 4..4096: COUNT(*) k 8, r 256 (expected RMSE 4,103);
# SUM(amount) k 8, r 256, upper 256 (787,470). benchmarks/README.md (2026-11-26); rerun
# 2026-11-26 (`.venv/bin/python benchmarks/auto_bounds.py --runs 30`): the same, 4,102.8 and
# 787,470.4.
SKEWED_K = 8  # partitions per unit (= the number of categories: no cap on this data)
SKEWED_R = 256  # rows per (unit, category)
SKEWED_AMOUNT = (0.0, 256.0)
# query name -> aggregate, GROUP BY category over the public keys c0..c7
SKEWED_QUERIES: dict[str, str] = {"count(*)/category": "count", "sum(amount)/category": "sum"}


# -- data ------------------------------------------------------------------------------------


def load_fair() -> Any:
    """statsmodels' fair data: one row per person, integer education and occupation codes."""
    import statsmodels.api as sm

    frame = sm.datasets.fair.load_pandas().data.copy()
    frame["educ"] = frame["educ"].astype(int)
    frame["occupation"] = frame["occupation"].astype(int)
    frame["pid"] = np.arange(len(frame))
    return frame[["pid", "educ", "occupation", "age", "affairs"]]


def curve_frame() -> Any:
    """CURVE_COPIES partitions of exactly n people for each n in CURVE_SIZES (column educ is
    the partition, a string 'n/copy')."""
    import pandas as pd

    keys = [f"{n}/{c}" for n in CURVE_SIZES for c in range(CURVE_COPIES)]
    sizes = [n for n in CURVE_SIZES for _ in range(CURVE_COPIES)]
    frame = pd.DataFrame({"educ": np.repeat(keys, sizes)})
    frame["pid"] = np.arange(len(frame))
    frame["occupation"] = 0
    frame["age"] = 30.0
    frame["affairs"] = 0.0
    return frame


def truth(frame: Any, group: tuple[str, ...], aggregate: str) -> dict[tuple[Any, ...], float]:
    grouped = frame.groupby(list(group))
    if aggregate == "count":
        series = grouped.size()
    elif aggregate == "sum":
        series = grouped["affairs"].apply(lambda x: float(np.clip(x, *AFFAIRS).sum()))
    else:
        series = grouped["age"].apply(lambda x: float(np.clip(x, *AGE).mean()))
    return {(k if isinstance(k, tuple) else (k,)): float(v) for k, v in series.items()}


def load_skewed(units: int) -> Any:
    """skewed.py's table; seeded, so Tumult's environment (numpy 1) builds the same rows."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from skewed import skewed_table

    return skewed_table(units, seed=SKEWED_SEED)


def skewed_truth(frame: Any, aggregate: str) -> dict[tuple[Any, ...], float]:
    """The true unbounded answer per category: what an analyst wants, whatever the bounds."""
    grouped = frame.groupby("category")
    series = grouped.size() if aggregate == "count" else grouped["amount"].sum()
    return {(k,): float(v) for k, v in series.items()}


def skewed_keys(frame: Any) -> list[str]:
    return sorted(str(k) for k in frame["category"].unique())


# -- dpcurator -------------------------------------------------------------------------------


def run_dpcurator(frame: Any, group: tuple[str, ...], aggregate: str, public: bool,
                  runs: int) -> tuple[list[Result], dict[str, Any]]:
    import dpcurator as dp

    # One row per person, declared as such (as the peers' row-level units): the counts are
    # then integers, with integer noise. (privacy_unit="pid" gives the same guarantee; its
    # default partition rescaling keeps counts on a fine fixed-point grid.)
    curator = dp.Curator(frame, one_row_per_person=True, budget=dp.ApproxDP(1e12, 1e-3),
                         cache=False, bounds={"affairs": AFFAIRS, "age": AGE})
    expr = {"count": "COUNT(*)", "sum": "SUM(affairs)", "avg": "AVG(age)"}[aggregate]
    cols = ", ".join(group)
    sql = f"SELECT {cols}, {expr} AS v FROM data GROUP BY {cols}"
    privacy: dict[str, Any] = {"epsilon": EPSILON}
    if public:
        keys = sorted(truth(frame, group, "count"))
        privacy["keys"] = [k[0] for k in keys] if len(group) == 1 else keys
    else:
        privacy["delta"] = DELTA
    out: list[Result] = []
    release = None
    for _ in range(runs):
        release = curator.sql(sql, **privacy)
        low, high = release.interval("v", 0.95)
        out.append({tuple(k): (float(v), float(lo), float(hi)) for k, v, lo, hi
                    in zip(release.keys, release.values["v"], low, high, strict=True)})
    selection = release.partition_selection if release is not None else None
    return out, {"partition_selection": selection}


def run_dpcurator_skewed(frame: Any, aggregate: str, runs: int, *,
                         fixed: bool) -> tuple[list[Result], dict[str, Any]]:
    """Skewed data, privacy unit ``user``: bounds chosen under DP (its default) or fixed."""
    import dpcurator as dp

    curator = dp.Curator.from_pandas(frame, privacy_unit="user",
                                     budget=dp.PureDP(2 * EPSILON * runs), cache=False)
    expr = "COUNT(*)" if aggregate == "count" else "SUM(amount)"
    sql = f"SELECT category, {expr} AS v FROM data GROUP BY category"
    options: dict[str, Any] = {}
    if fixed:
        options = {"max_partitions": SKEWED_K, "max_rows_per_partition": SKEWED_R}
        if aggregate == "sum":
            options["bounds"] = {"amount": SKEWED_AMOUNT}
    keys = skewed_keys(frame)
    out: list[Result] = []
    chosen: Counter[str] = Counter()
    start = time.perf_counter()
    for _ in range(runs):
        release = curator.sql(sql, epsilon=EPSILON, keys=keys, **options)
        low, high = release.interval("v", 0.95)
        out.append({tuple(k): (float(v), float(lo), float(hi)) for k, v, lo, hi
                    in zip(release.keys, release.values["v"], low, high, strict=True)})
        if release.bounds_chosen is not None:
            chosen[_bounds_label(release.bounds_chosen)] += 1
    info: dict[str, Any] = {"seconds": (time.perf_counter() - start) / runs}
    if chosen:
        info["bounds_chosen"] = dict(chosen.most_common(3))
    return out, info


def _bounds_label(chosen: dict[str, Any]) -> str:
    label = f"k {chosen['max_partitions']:g}, r {chosen['max_rows_per_partition']:g}"
    if "bounds" in chosen:
        label += f", amount <= {chosen['bounds']['amount'][1]:.0f}"
    return label


# -- OpenDP ----------------------------------------------------------------------------------


def run_opendp(frame: Any, group: tuple[str, ...], aggregate: str, public: bool,
               runs: int) -> tuple[list[Result], dict[str, Any]]:
    import opendp.prelude as odp
    import polars as pl

    odp.enable_features("contrib")
    data = pl.from_pandas(frame)
    column = {"count": None, "sum": "affairs", "avg": "age"}[aggregate]
    out: list[Result] = []
    info: dict[str, Any] = {}
    for _ in range(runs):
        margins = [odp.polars.Margin(by=list(group), invariant="keys",
                                     max_length=data.height)] if column else []
        context = odp.Context.compositor(
            data=data.lazy(), privacy_unit=odp.unit_of(contributions=1),
            privacy_loss=odp.loss_of(epsilon=EPSILON, delta=None if public else DELTA),
            split_evenly_over=1, margins=margins)
        if aggregate == "count":
            expr = odp.len(signed=False).alias("v")
        elif aggregate == "sum":
            expr = pl.col("affairs").fill_null(0.0).dp.sum(AFFAIRS).alias("v")
        else:
            expr = pl.col("age").fill_null(AGE[0]).dp.mean(AGE).alias("v")
        query = context.query().group_by(list(group)).agg(expr)
        if public:
            keys = data.select(list(group)).unique()
            query = query.with_keys(keys)
        summary = query.summarize(alpha=0.05)
        accuracy = (float(summary["accuracy"][0])
                    if aggregate != "avg" and "accuracy" in summary.columns else math.nan)
        if "threshold" in summary.columns:
            info["threshold"] = int(summary["threshold"][0])
        released = query.release().collect()
        result: Result = {}
        for row in released.iter_rows(named=True):
            key = tuple(row[c] for c in group)
            value = float(row["v"])
            result[key] = (value, value - accuracy, value + accuracy)
        out.append(result)
    return out, info


def run_opendp_skewed(frame: Any, aggregate: str, runs: int, *,
                      num_groups: bool = False) -> tuple[list[Result], dict[str, Any]]:
    """Skewed data, identifier ``user``, at the fixed bounds. ``truncate_per_group`` caps the
    rows per (user, category); the 8 public keys bound a user's groups by 8 (its summary's
    scale is k r / epsilon = 2,048 for COUNT either way). ``num_groups`` adds
    ``truncate_num_groups(SKEWED_K)``: OpenDP 0.16 filters on a 1-based dense rank ``< k``,
    so it keeps k - 1 groups (charging for k), and its default ``keep="sample"`` fails on
    the Polars it pins (1.36.1: "multiple fields with name 'category'"), hence ``"first"``."""
    import opendp.prelude as odp
    import polars as pl

    odp.enable_features("contrib")
    data = pl.from_pandas(frame)
    keys = pl.DataFrame({"category": skewed_keys(frame)})
    # A float sum needs max_length (a bound on the rows) in a margin; counts need none.
    margins = [odp.polars.Margin(by=["category"], invariant="keys", max_length=data.height)] \
        if aggregate == "sum" else []
    out: list[Result] = []
    accuracy = math.nan
    seconds = 0.0
    for run in range(runs):
        start = time.perf_counter()
        context = odp.Context.compositor(
            data=data.lazy(), privacy_unit=odp.unit_of(contributions=1, identifier="user"),
            privacy_loss=odp.loss_of(epsilon=EPSILON), split_evenly_over=1, margins=margins)
        query = context.query()
        if num_groups:
            query = query.truncate_num_groups(SKEWED_K, by=["category"], keep="first")
        query = query.truncate_per_group(SKEWED_R, by=["category"])
        expr = (odp.len(signed=False) if aggregate == "count"
                else pl.col("amount").fill_null(0.0).dp.sum(SKEWED_AMOUNT)).alias("v")
        query = query.group_by("category").agg(expr).with_keys(keys)
        if run == 0:  # the stated accuracy depends on the query only; not timed
            pause = time.perf_counter()
            accuracy = float(query.summarize(alpha=0.05)["accuracy"][0])
            start += time.perf_counter() - pause
        released = query.release().collect()
        seconds += time.perf_counter() - start
        out.append({(row["category"],): (float(row["v"]), float(row["v"]) - accuracy,
                                          float(row["v"]) + accuracy)
                    for row in released.iter_rows(named=True)})
    return out, {"seconds": seconds / runs, "accuracy": accuracy}


# -- PipelineDP ------------------------------------------------------------------------------


def run_pipelinedp(frame: Any, group: tuple[str, ...], aggregate: str, public: bool,
                   runs: int) -> tuple[list[Result], dict[str, Any]]:
    import pipeline_dp

    rows = list(zip(frame["pid"], *(frame[c] for c in group), frame["affairs"], frame["age"],
                    strict=True))
    width = len(group)
    value_index = 1 + width + (0 if aggregate == "sum" else 1)
    metric = {"count": pipeline_dp.Metrics.COUNT, "sum": pipeline_dp.Metrics.SUM,
              "avg": pipeline_dp.Metrics.MEAN}[aggregate]
    bounds = {"sum": AFFAIRS, "avg": AGE}.get(aggregate, (None, None))
    keys = sorted(truth(frame, group, "count")) if public else None
    out: list[Result] = []
    for _ in range(runs):
        accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=EPSILON,
                                                       total_delta=0.0 if public else DELTA)
        engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
        extra: dict[str, Any] = {}
        if not public and aggregate == "count":
            # Its best private-keys count: threshold the noisy count of units itself.
            metric = pipeline_dp.Metrics.PRIVACY_ID_COUNT
            extra = {"post_aggregation_thresholding": True,
                     "partition_selection_strategy":
                         pipeline_dp.PartitionSelectionStrategy.LAPLACE_THRESHOLDING}
        params = pipeline_dp.AggregateParams(
            metrics=[metric], noise_kind=pipeline_dp.NoiseKind.LAPLACE,
            max_partitions_contributed=1, max_contributions_per_partition=1,
            min_value=bounds[0], max_value=bounds[1], **extra)
        extractors = pipeline_dp.DataExtractors(
            privacy_id_extractor=lambda r: r[0],
            partition_extractor=(lambda r: r[1]) if width == 1 else (lambda r: r[1:1 + width]),
            value_extractor=lambda r: r[value_index])
        result = engine.aggregate(rows, params, extractors,
                                  public_partitions=[k[0] if width == 1 else k for k in keys]
                                  if keys is not None else None)
        accountant.compute_budgets()
        released: Result = {}
        for key, metrics in result:
            value = float(metrics[0])
            released[key if isinstance(key, tuple) else (key,)] = (value, math.nan, math.nan)
        out.append(released)
    return out, {}


def run_pipelinedp_skewed(frame: Any, aggregate: str,
                          runs: int) -> tuple[list[Result], dict[str, Any]]:
    """Skewed data at the fixed bounds: PipelineDP samples k partitions per user and r rows
    per (user, partition), clamps each row's amount, and adds Laplace noise."""
    import pipeline_dp

    rows = list(zip(frame["user"].tolist(), frame["category"].tolist(),
                    frame["amount"].tolist(), strict=True))
    metric = pipeline_dp.Metrics.COUNT if aggregate == "count" else pipeline_dp.Metrics.SUM
    keys = skewed_keys(frame)
    out: list[Result] = []
    start = time.perf_counter()
    for _ in range(runs):
        accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=EPSILON, total_delta=0.0)
        engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
        params = pipeline_dp.AggregateParams(
            metrics=[metric], noise_kind=pipeline_dp.NoiseKind.LAPLACE,
            max_partitions_contributed=SKEWED_K, max_contributions_per_partition=SKEWED_R,
            min_value=SKEWED_AMOUNT[0], max_value=SKEWED_AMOUNT[1])
        extractors = pipeline_dp.DataExtractors(privacy_id_extractor=lambda r: r[0],
                                                partition_extractor=lambda r: r[1],
                                                value_extractor=lambda r: r[2])
        result = engine.aggregate(rows, params, extractors, public_partitions=keys)
        accountant.compute_budgets()
        out.append({(key,): (float(metrics[0]), math.nan, math.nan) for key, metrics in result})
    return out, {"seconds": (time.perf_counter() - start) / runs}


# -- Tumult (its own environment) ------------------------------------------------------------


def tumult_child(args: argparse.Namespace) -> None:
    """Runs inside the Tumult environment: every query, ``--runs`` times (the skewed ones
    ``--skewed-runs`` times); prints JSON."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from tmlt.analytics import (
        AddOneRow,
        AddRowsWithID,
        ApproxDPBudget,
        KeySet,
        MaxGroupsPerID,
        MaxRowsPerGroupPerID,
        PureDPBudget,
        QueryBuilder,
        Session,
    )

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.warehouse.dir", tempfile.mkdtemp(prefix="tumult-warehouse-"))
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    results: dict[str, Any] = {}
    sources = {"fair": load_fair(), "curve": curve_frame()}
    if any(name in SKEWED_QUERIES for name in args.only):
        frame = load_skewed(args.skewed_units)
        skewed = spark.createDataFrame(frame)
        skewed.cache().count()
        keyset = KeySet.from_dict({"category": skewed_keys(frame)})
        data = [len(frame), round(float(frame["amount"].sum()), 2)]
        # One untimed release first: Spark's first job on a table pays its warm-up.
        Session.from_dataframe(privacy_budget=PureDPBudget(EPSILON), source_id="data",
                               dataframe=skewed, protected_change=AddRowsWithID("user")) \
            .evaluate(QueryBuilder("data").enforce(MaxGroupsPerID("category", SKEWED_K))
                      .enforce(MaxRowsPerGroupPerID("category", SKEWED_R)).groupby(keyset)
                      .count(), PureDPBudget(EPSILON)).toPandas()
    for name in args.only:
        if name in SKEWED_QUERIES:
            # Tumult's own bounds for a unit with many rows: at most k groups per user, r rows
            # per (user, group), each amount clamped by the sum.
            runs = []
            start = time.perf_counter()
            for _ in range(args.skewed_runs):
                session = Session.from_dataframe(
                    privacy_budget=PureDPBudget(EPSILON), source_id="data", dataframe=skewed,
                    protected_change=AddRowsWithID("user"))
                builder = (QueryBuilder("data").enforce(MaxGroupsPerID("category", SKEWED_K))
                           .enforce(MaxRowsPerGroupPerID("category", SKEWED_R)).groupby(keyset))
                query = (builder.count(name="v") if SKEWED_QUERIES[name] == "count"
                         else builder.sum("amount", *SKEWED_AMOUNT, name="v"))
                table = session.evaluate(query, PureDPBudget(EPSILON)).toPandas()
                runs.append([[row["category"], float(row["v"])] for _, row in table.iterrows()])
            results[name] = {"runs": runs, "seconds": time.perf_counter() - start, "data": data}
            continue
        group, aggregate, public = QUERIES.get(name, (("educ",), "count", False))
        frame = sources["curve" if name == "release curve" else "fair"]
        sdf = spark.createDataFrame(frame[["educ", "occupation", "age", "affairs"]])
        sdf.cache().count()
        runs = []
        start = time.perf_counter()
        for _ in range(args.runs):
            if public:
                session = Session.from_dataframe(
                    privacy_budget=PureDPBudget(EPSILON), source_id="data", dataframe=sdf,
                    protected_change=AddOneRow())
                keyset = KeySet.from_dataframe(sdf.select(*group).distinct())
                budget = PureDPBudget(EPSILON)
            else:
                # Tumult selects private keys by a separate step (get_groups), then counts.
                session = Session.from_dataframe(
                    privacy_budget=ApproxDPBudget(EPSILON, DELTA), source_id="data",
                    dataframe=sdf, protected_change=AddOneRow())
                groups = session.evaluate(QueryBuilder("data").get_groups(list(group)),
                                          ApproxDPBudget(EPSILON / 2, DELTA))
                keyset = KeySet.from_dataframe(groups)
                budget = PureDPBudget(EPSILON / 2)
            builder = QueryBuilder("data").groupby(keyset)
            if aggregate == "count":
                query = builder.count(name="v")
            elif aggregate == "sum":
                query = builder.sum("affairs", *AFFAIRS, name="v")
            else:
                query = builder.average("age", *AGE, name="v")
            table = session.evaluate(query, budget).toPandas()
            runs.append([[*(row[c] for c in group), float(row["v"])]
                         for _, row in table.iterrows()])
        results[name] = {"runs": runs, "seconds": time.perf_counter() - start}
    print(json.dumps(results, default=lambda v: v.item() if hasattr(v, "item") else str(v)))


def run_tumult(args: argparse.Namespace,
               names: list[str]) -> tuple[dict[str, list[Result]], dict[str, dict[str, Any]]]:
    """Tumult's releases per query, and per query its seconds per release (and, for the
    skewed data, the rows and total amount it saw, to check that it had the same table)."""
    command = [args.tumult_python, __file__, "--tumult-child", "--runs", str(args.tumult_runs),
               "--skewed-runs", str(args.skewed_runs), "--skewed-units", str(args.skewed_units),
               "--only", *names]
    done = subprocess.run(command, capture_output=True, text=True, timeout=7200)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"Tumult run failed: {done.stderr.strip().splitlines()[-3:]}")
    parsed = json.loads(lines[-1])
    out: dict[str, list[Result]] = {}
    extra: dict[str, dict[str, Any]] = {}
    for name, payload in parsed.items():
        width = len(QUERIES.get(name, (("educ",), "", False))[0])
        out[name] = [{tuple(r[:width]): (float(r[width]), math.nan, math.nan) for r in run}
                     for run in payload["runs"]]
        extra[name] = {"seconds": payload["seconds"] / max(1, len(payload["runs"])),
                       "data": payload.get("data")}
    return out, extra


# -- metrics ---------------------------------------------------------------------------------


def summarize(runs: list[Result], exact: dict[tuple[Any, ...], float]) -> dict[str, Any]:
    """RMSE over released partitions, partitions released per run, interval coverage."""
    errors, covered, stated = [], 0, 0
    for result in runs:
        for key, (value, low, high) in result.items():
            true = exact.get(_normal(key))
            if true is None:
                continue
            errors.append(value - true)
            if not math.isnan(low):
                stated += 1
                covered += low - 1e-9 <= true <= high + 1e-9
    return {
        "rmse": math.sqrt(float(np.mean(np.square(errors)))) if errors else math.nan,
        "released": float(np.mean([len(r) for r in runs])) if runs else math.nan,
        "coverage": covered / stated if stated else None,
        "runs": len(runs),
    }


def mean_error(runs: list[Result], exact: dict[tuple[Any, ...], float]) -> float:
    """The mean signed error over released partitions: the bias that bounding leaves (bounds
    only remove contributions, so against the unbounded truth it is negative)."""
    errors = [value - exact[_normal(key)] for result in runs
              for key, (value, _, _) in result.items() if _normal(key) in exact]
    return float(np.mean(errors)) if errors else math.nan


def _normal(key: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(int(k) if isinstance(k, float) and k.is_integer() else k for k in key)


def release_curve(runs: list[Result]) -> dict[int, float]:
    """Per partition size n: the share of its partitions released, over all runs."""
    counts = dict.fromkeys(CURVE_SIZES, 0)
    for result in runs:
        for key in result:
            counts[int(str(key[0]).split("/")[0])] += 1
    return {n: counts[n] / (CURVE_COPIES * len(runs)) for n in CURVE_SIZES}


def half_point(curve: dict[int, float]) -> int | None:
    """The least n whose partitions are released at least half of the time."""
    return next((n for n in CURVE_SIZES if curve[n] >= 0.5), None)


# -- main ------------------------------------------------------------------------------------


PEERS: dict[str, Callable[..., tuple[list[Result], dict[str, Any]]]] = {
    "dpcurator": run_dpcurator,
    "OpenDP 0.16": run_opendp,
    "PipelineDP 0.3.1": run_pipelinedp,
}


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="releases per query (peers)")
    parser.add_argument("--curator-runs", type=int, default=1000,
                        help="releases per query for dpcurator")
    parser.add_argument("--curve-runs", type=int, default=20,
                        help="releases of the synthetic release-curve query per library")
    parser.add_argument("--tumult-python", default=None,
                        help="python of an environment with tmlt.analytics and statsmodels")
    parser.add_argument("--tumult-runs", type=int, default=5)
    parser.add_argument("--skewed-units", type=int, default=50_000,
                        help="units of the skewed data (skewed.py)")
    parser.add_argument("--skewed-runs", type=int, default=20,
                        help="releases per skewed query for each peer, Tumult included")
    parser.add_argument("--skewed-curator-runs", type=int, default=100,
                        help="releases per skewed query for each dpcurator row")
    parser.add_argument("--skip-fair", action="store_true", help="skip the fair data section")
    parser.add_argument("--skip-skewed", action="store_true",
                        help="skip the skewed data section")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--tumult-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--only", nargs="*", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tumult_child:
        tumult_child(args)
        return

    report: dict[str, Any] = {"queries": {}, "curve": {}, "notes": []}
    names = ([] if args.skip_fair else [*QUERIES, "release curve"]) \
        + ([] if args.skip_skewed else [*SKEWED_QUERIES])
    tumult: dict[str, list[Result]] = {}
    tumult_extra: dict[str, dict[str, Any]] = {}
    if args.tumult_python and names:
        try:
            tumult, tumult_extra = run_tumult(args, names)
        except Exception as exc:  # a peer that fails is noted and skipped
            report["notes"].append(f"Tumult Analytics skipped: {exc}")
    elif names:
        report["notes"].append("Tumult Analytics skipped: pass --tumult-python (its own "
                               "environment; see the module docstring)")
    if not args.skip_fair:
        fair_section(args, report, tumult)
    if not args.skip_skewed:
        skewed_section(args, report, tumult, tumult_extra)
    for note in report["notes"]:
        print(f"note: {note}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2, default=str)


def fair_section(args: argparse.Namespace, report: dict[str, Any],
                 tumult: dict[str, list[Result]]) -> None:
    """The fair data's queries and release curve, into ``report["queries"]`` and
    ``report["curve"]``."""
    fair = load_fair()
    print(f"data: statsmodels fair, {len(fair)} people; epsilon = {EPSILON}, "
          f"delta = {DELTA} (private keys)\n")
    header = f"{'query':34} {'library':18} {'RMSE':>9} {'released':>9} {'coverage':>9} runs"
    print(header)
    print("-" * len(header))
    for name, (group, aggregate, public) in QUERIES.items():
        exact = truth(fair, group, aggregate)
        rows: dict[str, Any] = {}
        for library, runner in PEERS.items():
            runs = args.curator_runs if library == "dpcurator" else args.runs
            try:
                results, info = runner(fair, group, aggregate, public, runs)
            except Exception as exc:
                report["notes"].append(f"{library} skipped on {name!r}: "
                                       f"{type(exc).__name__}: {exc}")
                continue
            rows[library] = {**summarize(results, exact), **info}
        if name in tumult:
            rows["Tumult 0.21"] = summarize(tumult[name], exact)
        for library, row in rows.items():
            coverage = "" if row["coverage"] is None else f"{row['coverage']:.3f}"
            print(f"{name:34} {library:18} {row['rmse']:9.3f} {row['released']:9.2f} "
                  f"{coverage:>9} {row['runs']}")
        report["queries"][name] = rows
    print()

    curve_data = curve_frame()
    print(f"release curve: P[a partition of n people is released] ({CURVE_COPIES} partitions "
          f"per n, {args.curve_runs} releases)")
    print(f"{'library':18} " + " ".join(f"{n:>6}" for n in CURVE_SIZES) + "   n for 1/2")
    curves: dict[str, dict[int, float]] = {}
    for library, runner in PEERS.items():
        try:
            results, _ = runner(curve_data, ("educ",), "count", False, args.curve_runs)
        except Exception as exc:
            report["notes"].append(f"{library} skipped on the release curve: {exc}")
            continue
        curves[library] = release_curve(results)
    if "release curve" in tumult:
        curves["Tumult 0.21"] = release_curve(tumult["release curve"])
    for library, curve in curves.items():
        print(f"{library:18} " + " ".join(f"{curve[n]:6.3f}" for n in CURVE_SIZES)
              + f"   {half_point(curve)}")
    report["curve"] = {k: {str(n): v for n, v in c.items()} for k, c in curves.items()}


def skewed_section(args: argparse.Namespace, report: dict[str, Any],
                   tumult: dict[str, list[Result]],
                   tumult_extra: dict[str, dict[str, Any]]) -> None:
    """The skewed data's two queries, against the unbounded truth, into
    ``report["skewed"]``."""
    frame = load_skewed(args.skewed_units)
    data = [len(frame), round(float(frame["amount"].sum()), 2)]
    print(f"\nskewed data: skewed_table({args.skewed_units:,} units, seed {SKEWED_SEED}), "
          f"{len(frame):,} rows, {len(skewed_keys(frame))} public categories; "
          f"epsilon = {EPSILON}, pure DP")
    print(f"fixed bounds: k = {SKEWED_K} partitions per user, r = {SKEWED_R} rows per (user, "
          f"category), amount in [{SKEWED_AMOUNT[0]:g}, {SKEWED_AMOUNT[1]:g}]; "
          "errors against the unbounded truth\n")
    # The OpenDP row with truncate_num_groups shows that helper's cost, on fewer runs.
    peers: dict[str, tuple[Callable[..., tuple[list[Result], dict[str, Any]]], int]] = {
        "dpcurator (auto)": (partial(run_dpcurator_skewed, fixed=False),
                             args.skewed_curator_runs),
        "dpcurator (fixed)": (partial(run_dpcurator_skewed, fixed=True),
                              args.skewed_curator_runs),
        "OpenDP 0.16": (run_opendp_skewed, args.skewed_runs),
        "OpenDP 0.16 num_groups": (partial(run_opendp_skewed, num_groups=True),
                                   max(2, args.skewed_runs // 4)),
        "PipelineDP 0.3.1": (run_pipelinedp_skewed, args.skewed_runs),
    }
    header = (f"{'query':21} {'library':22} {'RMSE':>11} {'mean err':>11} {'released':>8} "
              f"{'coverage':>8} {'s/release':>9} runs")
    print(header)
    print("-" * len(header))
    section: dict[str, Any] = {
        "data": {"units": args.skewed_units, "seed": SKEWED_SEED, "rows": data[0],
                 "amount_total": data[1], "keys": skewed_keys(frame)},
        "bounds": {"max_partitions": SKEWED_K, "max_rows_per_partition": SKEWED_R,
                   "amount": list(SKEWED_AMOUNT)},
        "epsilon": EPSILON, "queries": {}}
    for name, aggregate in SKEWED_QUERIES.items():
        exact = skewed_truth(frame, aggregate)
        rows: dict[str, Any] = {}
        for library, (runner, runs) in peers.items():
            try:
                results, info = runner(frame, aggregate, runs)
            except Exception as exc:
                report["notes"].append(f"{library} skipped on {name!r}: "
                                       f"{type(exc).__name__}: {exc}")
                continue
            rows[library] = {**summarize(results, exact),
                             "mean_error": mean_error(results, exact), **info}
        if name in tumult:
            extra = tumult_extra.get(name, {})
            if extra.get("data") != data:
                report["notes"].append(f"Tumult skipped on {name!r}: its table differs "
                                       f"(rows, total amount {extra.get('data')} != {data})")
            else:
                rows["Tumult 0.21"] = {**summarize(tumult[name], exact),
                                       "mean_error": mean_error(tumult[name], exact),
                                       "seconds": extra["seconds"]}
        for library, row in rows.items():
            coverage = "" if row["coverage"] is None else f"{row['coverage']:.3f}"
            print(f"{name:21} {library:22} {row['rmse']:11,.1f} {row['mean_error']:11,.1f} "
                  f"{row['released']:8.2f} {coverage:>8} {row['seconds']:9.3f} {row['runs']}")
        section["queries"][name] = {"truth": {k[0]: v for k, v in exact.items()},
                                    "libraries": rows}
    report["skewed"] = section
    print()


if __name__ == "__main__":
    main()
