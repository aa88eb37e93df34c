"""DP count and sum per category: dpcurator against DuckDB's own floors and three DP libraries.

Run it from the benchmark environment (``scripts/setup-bench`` creates it)::

    .bench-venv/bin/python benchmarks/query.py [--rows 10000000] [--units 1000000]
        [--categories 1000] [--repeats 3] [--peer-rows 100000,1000000] [--json out.json]
        [--tumult-python PATH]

Tumult Analytics pins numpy < 2 and pandas < 2 on Python 3.11, which dpcurator cannot share,
so it runs in a separate environment given by ``--tumult-python`` (create it with
``uv venv /tmp/tumult && uv pip install -p /tmp/tumult tmlt.analytics duckdb``; Java 17 runs
its local Spark); without it the Tumult row says so.

The data (generated inside DuckDB, deterministically): ``rows`` rows of (user_id, category,
value); user_id uniform over ``units`` users (10 rows per user on average); category skewed
(P[category >= c] falls like a log-uniform law, so category 0 holds ~10% of the rows);
value uniform in [0, 100). Every library answers the same question: per category, a DP
count and a DP sum of value clamped to [0, 100], each user contributing to at most 5
categories and at most 2 rows per category, epsilon = 1 (split evenly), the 1,000
categories public.

Timed in the same process, round-robin over ``--repeats`` rounds (load from other processes
falls on every case alike), on a DuckDB in-memory table with ``--threads`` threads. Each case
is reported as ratios of medians and as the median of its per-round ratio to the two-level
floor ("paired"), which is steadier where the machine's speed drifts between rounds:

- ``floor: GROUP BY category``: the plain non-private aggregate;
- ``floor: two-level``: GROUP BY user, category, then GROUP BY category -- the least work any
  per-user bounding must do;
- ``floor: two-level + unit cap``: the same, plus what an exact per-user partition cap adds in
  plain SQL: each user's number of categories (a GROUP BY user over the pairs) joined back to
  weight the pairs (no clamping, no fixed point, no noise). It shows how much of dpcurator's
  time is the cap itself and how much is dpcurator's own;
- ``reference: window bounding``: bounding the obvious way, with window functions over the
  rows (a random row rank per user and category, a random category rank per user), no noise;
- ``dpcurator``: ``Curator.sql`` end to end (planning, bounding in DuckDB, exact noise,
  release), public keys, default (rescale) bounding; also with private keys (partition
  selection, delta = 1e-6) and with ``bounding="sample"``.

Peak memory: each case runs once more in a fresh subprocess that builds the same table, resets
the kernel's peak-RSS counter (``/proc/self/clear_refs``), runs the case, and reports the peak
RSS above the level before the case.

Peers (PipelineDP's local backend, OpenDP's Polars API, Tumult Analytics on local Spark) run
at the smaller ``--peer-rows`` sizes, with dpcurator timed at the same sizes; throughput
(rows per second) is what is compared, and the scaling between the two peer sizes is shown.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from _rounds import time_rounds

EPSILON = 1.0
MAX_PARTITIONS = 5
MAX_ROWS = 2
SQL = "SELECT category, COUNT(*) AS n, SUM(value) AS total FROM data GROUP BY category"


def make_table(con: Any, rows: int, units: int, categories: int,
               string_units: bool = False) -> None:
    """The benchmark table, generated in DuckDB (deterministic: hashes of the row number).

    ``string_units``: user ids are strings ('user-123456'), as e-mail addresses or UUIDs
    would be, instead of integers."""
    unit = (f"'user-' || (hash(i, 1) % {units})" if string_units
            else f"(hash(i, 1) % {units})::BIGINT")
    con.execute(f"""
        CREATE OR REPLACE TABLE data AS
        SELECT {unit} AS user_id,
               LEAST({categories - 1},
                     floor(pow({float(categories)}, (hash(i, 2) % 1000000) / 1000000.0)) - 1
               )::INTEGER AS category,
               ((hash(i, 3) % 100000) / 1000.0)::DOUBLE AS value
        FROM range({rows}) t(i)""")


FLOOR_PLAIN = "SELECT category, count(*), sum(value) FROM data GROUP BY category"
FLOOR_TWO_LEVEL = ("SELECT category, sum(c), sum(s) FROM (SELECT user_id, category, count(*) AS c,"
                   " sum(value) AS s FROM data GROUP BY user_id, category) GROUP BY category")
FLOOR_UNIT_CAP = f"""
    WITH pairs AS (SELECT user_id, category, count(*) AS c, sum(value) AS s
                   FROM data GROUP BY user_id, category),
         users AS (SELECT user_id, count(*) AS m FROM pairs GROUP BY user_id)
    SELECT category, sum(c * least(1.0, {MAX_PARTITIONS} / m)),
           sum(s * least(1.0, {MAX_PARTITIONS} / m))
    FROM pairs JOIN users USING (user_id) GROUP BY category"""
# The obvious way to bound in SQL (the "window functions over the rows"): a random
# row rank per (user, category) and a random category rank per user, then the filter; not
# private by itself (no noise, no fixed point), a reference for dpcurator's bounding plan.
WINDOW_BOUNDING = f"""
    WITH ranked AS (
        SELECT category, value,
               row_number() OVER (PARTITION BY user_id, category
                                  ORDER BY hash(user_id, category, value, 7)) AS row_rank,
               dense_rank() OVER (PARTITION BY user_id
                                  ORDER BY hash(user_id, category, 7)) AS category_rank
        FROM data)
    SELECT category, count(*), sum(least(greatest(value, 0.0), 100.0))
    FROM ranked WHERE row_rank <= {MAX_ROWS} AND category_rank <= {MAX_PARTITIONS}
    GROUP BY category"""


def dpcurator_case(con: Any, categories: int, mode: str) -> Callable[[], Any]:
    import dpcurator as dp
    from dpcurator.curator import Curator

    curator = Curator.from_duckdb(
        con, "data", privacy_unit="user_id", budget=dp.ApproxDP(1e12, 0.5), cache=False,
        bounds={"value": (0, 100)}, max_partitions=MAX_PARTITIONS,
        max_rows_per_partition=MAX_ROWS,
        allow_large_delta=True)  # a total that lasts every round; each query spends 1e-6
    keys = list(range(categories))
    if mode == "public":
        return lambda: curator.sql(SQL, epsilon=EPSILON, keys=keys)
    if mode == "sample":
        return lambda: curator.sql(SQL, epsilon=EPSILON, keys=keys, bounding="sample")
    return lambda: curator.sql(SQL, epsilon=EPSILON, delta=1e-6)


def duckdb_case(con: Any, sql: str) -> Callable[[], Any]:
    return lambda: con.execute(sql).fetchall()


def build_cases(con: Any, categories: int, with_sample: bool) -> dict[str, Callable[[], Any]]:
    cases = {
        "floor: GROUP BY category": duckdb_case(con, FLOOR_PLAIN),
        "floor: two-level": duckdb_case(con, FLOOR_TWO_LEVEL),
        "floor: two-level + unit cap": duckdb_case(con, FLOOR_UNIT_CAP),
        "reference: window bounding": duckdb_case(con, WINDOW_BOUNDING),
        "dpcurator (public keys)": dpcurator_case(con, categories, "public"),
        "dpcurator (private keys)": dpcurator_case(con, categories, "private"),
    }
    if with_sample:
        cases["dpcurator (bounding=sample)"] = dpcurator_case(con, categories, "sample")
    return cases


# -- memory: one case per subprocess ----------------------------------------------------------


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def memory_child(args: argparse.Namespace) -> None:
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads={args.threads}")
    make_table(con, args.rows, args.units, args.categories, args.string_units)
    fn = build_cases(con, args.categories, True)[args.memory_case]
    if args.memory_case.startswith("dpcurator"):
        # Build the noise sampler's tables (a one-off per process) without running a query,
        # so that DuckDB's own memory is measured from the same cold start as the floors'.
        from fractions import Fraction

        from dpcurator.noise import sample_discrete_laplace

        sample_discrete_laplace(Fraction(2**40), 1)
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # reset the peak RSS counter (VmHWM)
    before = _rss_kib("VmRSS")
    fn()
    print(json.dumps({"peak_above_kib": _rss_kib("VmHWM") - before}))


def measure_memory(args: argparse.Namespace, case: str) -> float | None:
    command = [sys.executable, __file__, "--memory-case", case, "--rows", str(args.rows),
               "--units", str(args.units), "--categories", str(args.categories),
               "--threads", str(args.threads)] + (["--string-units"] if args.string_units else [])
    try:
        out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=900)
        return float(json.loads(out.stdout.strip().splitlines()[-1])["peak_above_kib"]) / 1024
    except (subprocess.SubprocessError, ValueError, KeyError, IndexError):
        return None


# -- peers ------------------------------------------------------------------------------------


def peer_rows(con: Any) -> list[tuple[int, int, float]]:
    return [tuple(r) for r in con.execute("SELECT user_id, category, value FROM data").fetchall()]


def run_pipelinedp(rows: list[tuple[int, int, float]], categories: int) -> float:
    import pipeline_dp

    start = time.perf_counter()
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=EPSILON, total_delta=1e-6)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
    params = pipeline_dp.AggregateParams(
        noise_kind=pipeline_dp.NoiseKind.LAPLACE,
        metrics=[pipeline_dp.Metrics.COUNT, pipeline_dp.Metrics.SUM],
        max_partitions_contributed=MAX_PARTITIONS,
        max_contributions_per_partition=MAX_ROWS, min_value=0, max_value=100)
    extractors = pipeline_dp.DataExtractors(
        privacy_id_extractor=lambda r: r[0], partition_extractor=lambda r: r[1],
        value_extractor=lambda r: r[2])
    result = engine.aggregate(rows, params, extractors,
                              public_partitions=list(range(categories)))
    accountant.compute_budgets()
    out = list(result)
    assert len(out) == categories
    return time.perf_counter() - start


def run_opendp(con: Any, categories: int) -> float:
    import opendp.prelude as dp
    import polars as pl

    dp.enable_features("contrib")
    frame = pl.from_pandas(con.execute("SELECT * FROM data").fetchdf())
    start = time.perf_counter()
    context = dp.Context.compositor(
        data=frame.lazy(),
        privacy_unit=dp.unit_of(contributions=[
            dp.polars.Bound(per_group=MAX_ROWS, num_groups=MAX_PARTITIONS, by=["category"]),
        ], identifier="user_id"),
        privacy_loss=dp.loss_of(epsilon=EPSILON),
        split_evenly_over=1,
        # OpenDP needs a public bound on a group's length to bound float sums' rounding.
        margins=[dp.polars.Margin(by=["category"], invariant="keys", max_length=frame.height)],
    )
    keys = pl.DataFrame({"category": list(range(categories))},
                        schema={"category": frame.schema["category"]})
    query = (context.query()
             .truncate_per_group(MAX_ROWS, by=["category"])
             # keep="sample" fails in OpenDP 0.16 with this Polars (a duplicate struct field
             # name in its hash-rank); "first" does the same work with a fixed order.
             .truncate_num_groups(MAX_PARTITIONS, by=["category"], keep="first")
             .group_by("category")
             .agg(dp.len(signed=False), pl.col("value").fill_null(0.0).dp.sum((0.0, 100.0)))
             .with_keys(keys))
    out = query.release().collect()
    assert out.height == categories
    return time.perf_counter() - start


def run_tumult_subprocess(args: argparse.Namespace, size: int) -> float:
    """Tumult needs numpy < 2 and pandas < 2 (on Python 3.11), which dpcurator cannot share:
    it runs in its own environment (``--tumult-python``) on the same generated data."""
    if not args.tumult_python:
        raise RuntimeError("pass --tumult-python PATH (an environment with tmlt.analytics "
                           "and duckdb; see the module docstring)")
    command = [args.tumult_python, __file__, "--tumult-child", "--rows", str(size),
               "--units", str(max(1, size // 10)), "--categories", str(args.categories),
               "--threads", str(args.threads)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"Tumult run failed: {out.stderr.strip().splitlines()[-1:]}")
    return float(json.loads(lines[-1])["seconds"])


def tumult_child(args: argparse.Namespace) -> None:
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads={args.threads}")
    make_table(con, args.rows, args.units, args.categories)
    print(json.dumps({"seconds": run_tumult(con, args.categories)}))


def run_tumult(con: Any, categories: int) -> float:
    from pyspark.sql import SparkSession
    from tmlt.analytics import (
        AddRowsWithID,
        KeySet,
        MaxGroupsPerID,
        MaxRowsPerGroupPerID,
        PureDPBudget,
        QueryBuilder,
        Session,
    )

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    import tempfile

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.warehouse.dir", tempfile.mkdtemp(prefix="tumult-warehouse-"))
             .config("spark.sql.shuffle.partitions", "8").getOrCreate())
    frame = con.execute("SELECT * FROM data").fetchdf()
    sdf = spark.createDataFrame(frame)
    sdf.cache().count()
    start = time.perf_counter()
    session = Session.from_dataframe(privacy_budget=PureDPBudget(EPSILON), source_id="data",
                                     dataframe=sdf,
                                     protected_change=AddRowsWithID(id_column="user_id"))
    keys = KeySet.from_dict({"category": list(range(categories))})
    base = (QueryBuilder("data").enforce(MaxGroupsPerID("category", MAX_PARTITIONS))
            .enforce(MaxRowsPerGroupPerID("category", MAX_ROWS)).groupby(keys))
    counts = session.evaluate(base.count(), PureDPBudget(EPSILON / 2)).collect()
    base = (QueryBuilder("data").enforce(MaxGroupsPerID("category", MAX_PARTITIONS))
            .enforce(MaxRowsPerGroupPerID("category", MAX_ROWS)).groupby(keys))
    sums = session.evaluate(base.sum("value", 0, 100), PureDPBudget(EPSILON / 2)).collect()
    assert len(counts) == categories and len(sums) == categories
    return time.perf_counter() - start


def peer_timings(args: argparse.Namespace) -> list[dict[str, Any]]:
    import duckdb

    results = []
    for size in args.peer_rows:
        con = duckdb.connect()
        con.execute(f"SET threads={args.threads}")
        units = max(1, size // 10)
        make_table(con, size, units, args.categories)
        fn = dpcurator_case(con, args.categories, "public")
        fn()
        ours = statistics.median(_timed(fn) for _ in range(max(args.repeats, 3)))
        entry: dict[str, Any] = {"rows": size, "units": units, "dpcurator_s": ours}
        runners: dict[str, Callable[[], float]] = {
            "pipelinedp": lambda con=con: run_pipelinedp(peer_rows(con), args.categories),
            "opendp_polars": lambda con=con: run_opendp(con, args.categories),
            "tumult_spark": lambda size=size: run_tumult_subprocess(args, size),
        }
        for name, runner in runners.items():
            if name in args.skip_peers:
                continue
            try:
                entry[f"{name}_s"] = runner()
            except Exception as exc:  # a peer that cannot run is reported, not fatal
                entry[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        results.append(entry)
        print(json.dumps(entry), flush=True)
    return results


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--units", type=int, default=1_000_000)
    parser.add_argument("--categories", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--peer-rows", type=lambda s: [int(x) for x in s.split(",") if x],
                        default=[100_000, 1_000_000])
    parser.add_argument("--skip-peers", type=lambda s: s.split(","), default=[])
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--no-sample", action="store_true", help="skip bounding='sample'")
    parser.add_argument("--string-units", action="store_true",
                        help="user ids as strings ('user-123'), not integers (main table only)")
    parser.add_argument("--json", type=str, default=None)
    parser.add_argument("--tumult-python", type=str, default=None,
                        help="python of an environment with tmlt.analytics and duckdb")
    parser.add_argument("--memory-case", type=str, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--tumult-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tumult_child:
        tumult_child(args)
        return
    if args.memory_case:
        memory_child(args)
        return

    import duckdb

    import dpcurator

    con = duckdb.connect()
    con.execute(f"SET threads={args.threads}")
    start = time.perf_counter()
    make_table(con, args.rows, args.units, args.categories, args.string_units)
    pairs = con.execute("SELECT count(*) FROM (SELECT DISTINCT user_id, category FROM data)"
                        ).fetchone()
    print(f"generated {args.rows:,} rows ({pairs[0] if pairs else 0:,} user-category pairs) "
          f"in {time.perf_counter() - start:.1f}s", flush=True)
    cases = build_cases(con, args.categories, not args.no_sample)
    times = time_rounds(cases, args.repeats)
    # Ratios of medians (the project's convention); the minima's ratios go to the JSON too.
    floor_plain = statistics.median(times["floor: GROUP BY category"])
    floor_two = statistics.median(times["floor: two-level"])
    floor_cap = statistics.median(times["floor: two-level + unit cap"])
    min_two = min(times["floor: two-level"])
    report: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "threads": args.threads, "duckdb": duckdb.__version__,
                    "dpcurator": dpcurator.__version__},
        "data": {"rows": args.rows, "units": args.units, "categories": args.categories,
                 "string_units": args.string_units,
                 "user_category_pairs": pairs[0] if pairs else None},
        "cases": {},
    }
    print(f"\n{'case':32s} {'min s':>8s} {'median s':>9s} {'x plain':>8s} {'x 2-level':>9s}"
          f" {'paired':>7s} {'x cap':>6s} {'peak MiB':>9s}")
    two_level_memory = None if args.no_memory else measure_memory(args, "floor: two-level")
    for name, values in times.items():
        best, median = min(values), statistics.median(values)
        # The median over rounds of the ratio to the two-level floor timed in the same round:
        # load from outside drifts over minutes, and each round times every case back to back.
        paired = statistics.median(v / f for v, f in zip(values, times["floor: two-level"],
                                                         strict=True))
        memory = (two_level_memory if name == "floor: two-level" else
                  None if args.no_memory else measure_memory(args, name))
        report["cases"][name] = {"min_s": best, "median_s": median, "times_s": values,
                                 "vs_plain": median / floor_plain,
                                 "vs_two_level": median / floor_two,
                                 "vs_unit_cap_floor": median / floor_cap,
                                 "vs_two_level_of_minima": best / min_two,
                                 "vs_two_level_paired": paired, "peak_mib": memory}
        mem = f"{memory:9.0f}" if memory is not None else f"{'-':>9s}"
        print(f"{name:32s} {best:8.3f} {median:9.3f} {median / floor_plain:8.1f} "
              f"{median / floor_two:9.2f} {paired:7.2f} {median / floor_cap:6.2f} {mem}",
              flush=True)
    print("(x plain, x 2-level, x cap: ratios of medians; paired: the median of each round's "
          "ratio to the two-level floor)")
    if args.peer_rows:
        print("\npeers (same query, smaller data; seconds, and dpcurator's speed-up):")
        report["peers"] = peer_timings(args)
        for entry in report["peers"]:
            for name in ("pipelinedp", "opendp_polars", "tumult_spark"):
                if f"{name}_s" in entry:
                    print(f"  {entry['rows']:>9,} rows  {name:14s} {entry[f'{name}_s']:8.2f}s"
                          f"   dpcurator {entry['dpcurator_s']:.3f}s  "
                          f"x{entry[f'{name}_s'] / entry['dpcurator_s']:.0f}")
                elif f"{name}_error" in entry:
                    print(f"  {entry['rows']:>9,} rows  {name:14s} failed: "
                          f"{entry[f'{name}_error']}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)


if __name__ == "__main__":
    main()
