"""DP count and sum per category on Spark: dpcurator against Spark SQL's own floors.

    .venv/bin/python benchmarks/spark.py [--rows 10000000] [--units 1000000]
        [--categories 1000] [--repeats 3] [--master local[2]] [--driver-memory 6g]
        [--json out.json]

The data and the question are those of benchmarks/query.py and benchmarks/postgres.py:
``rows`` rows of (user_id, category, value), user_id uniform over ``units`` users, category
skewed (category 0 holds about 10% of the rows), value uniform in [0, 100), generated inside
Spark from hashes of the row number and cached in memory (Spark's columnar cache) before
anything is timed; per category a DP count and a DP sum of value clamped to [0, 100], each
user in at most 5 categories with at most 2 rows in each, epsilon = 1. Timed round-robin in
one process, medians, with each case's per-round ratio to the two-level floor ("paired"):

- ``floor: GROUP BY category``: the plain non-private aggregate;
- ``floor: two-level``: GROUP BY user, category, then GROUP BY category -- the least work any
  per-user bounding must do (the issue's yardstick: the DP query within 2x of it);
- ``dpcurator``: ``Curator.from_spark(...).sql`` end to end (compiled once, bounding and exact
  sums in Spark, noise in Python), with public keys (rescale), private keys (partition
  selection) and ``bounding="sample"``.

Spark's settings are its defaults (adaptive execution, whole-stage code generation) but for
the master and the driver's memory.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _rounds import ratios, time_rounds

SQL = "SELECT category, COUNT(*) AS n, SUM(value) AS total FROM data GROUP BY category"


def make_frame(spark: Any, rows: int, units: int, categories: int) -> Any:
    """The benchmark table, generated in Spark (deterministic: hashes of the row number; the
    same distributions as benchmarks/query.py, not the same rows), cached."""
    frame = spark.range(rows).selectExpr(
        f"pmod(xxhash64(id * 3 + 1), {units}) AS user_id",
        f"CAST(least({categories - 1}, floor(power({float(categories)}, "
        f"pmod(xxhash64(id * 3 + 2), 1000000) / 1000000.0)) - 1) AS INT) AS category",
        "pmod(xxhash64(id * 3 + 3), 100000) / 1000.0 AS value")
    frame = frame.cache()
    frame.count()
    return frame


def cases(spark: Any, frame: Any, categories: int) -> dict[str, Callable[[], Any]]:
    import dpcurator as dp

    frame.createOrReplaceTempView("bench_data")

    def plain(sql: str) -> Callable[[], Any]:
        return lambda: spark.sql(sql).collect()

    curator = dp.Curator.from_spark(
        frame, privacy_unit="user_id", budget=dp.ApproxDP(1e12, 0.5), cache=False,
        bounds={"value": (0, 100)}, max_partitions=5, max_rows_per_partition=2,
        allow_large_delta=True)
    keys = list(range(categories))
    return {
        "floor: GROUP BY category": plain(
            "SELECT category, count(*), sum(value) FROM bench_data GROUP BY category"),
        "floor: two-level": plain(
            "SELECT category, sum(c), sum(s) FROM (SELECT user_id, category, count(*) AS c, "
            "sum(value) AS s FROM bench_data GROUP BY user_id, category) GROUP BY category"),
        "dpcurator (public keys)": lambda: curator.sql(SQL, epsilon=1.0, keys=keys),
        "dpcurator (private keys)": lambda: curator.sql(SQL, epsilon=1.0, delta=1e-6),
        "dpcurator (bounding=sample)": lambda: curator.sql(SQL, epsilon=1.0, keys=keys,
                                                           bounding="sample"),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(args.master).appName("dpcurator-bench")
             .config("spark.driver.memory", args.driver_memory)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        start = time.perf_counter()
        frame = make_frame(spark, args.rows, args.units, args.categories)
        pairs = frame.select("user_id", "category").distinct().count()
        print(f"generated and cached {args.rows:,} rows ({pairs:,} user-category pairs) in "
              f"{time.perf_counter() - start:.1f}s", flush=True)
        timed = cases(spark, frame, args.categories)
        times = time_rounds(timed, args.repeats)
        settings = {"spark": spark.version, "master": args.master,
                    "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
                    "adaptive": spark.conf.get("spark.sql.adaptive.enabled")}
    finally:
        spark.stop()
    report: dict[str, Any] = {"settings": settings, "rows": args.rows, "units": args.units,
                              "categories": args.categories,
                              "cases": ratios(times, "floor: two-level")}
    print(f"(Spark {settings['spark']}, {settings['master']}, shuffle partitions "
          f"{settings['shuffle_partitions']}, adaptive {settings['adaptive']})")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--units", type=int, default=None, help="default: rows / 10")
    parser.add_argument("--categories", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--master", type=str, default="local[2]")
    parser.add_argument("--driver-memory", type=str, default="6g")
    parser.add_argument("--json", type=str, default=None)
    args = parser.parse_args()
    args.units = args.units or max(1, args.rows // 10)
    report = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    sys.exit(main())
