"""DP questions over TPC-H joins, the privacy unit the customer: dpcurator against the same
join with the same per-customer caps written by hand, on DuckDB.

    .venv/bin/python benchmarks/joins.py [--scale 1] [--repeats 5] [--json out.json]
        [--data DIR] [--questions 1,2,...]

The data comes from the ``tpchgen-cli`` wheel (``pip install tpchgen-cli``; the dev extra
installs it), written once as Parquet into ``--data`` (default
``benchmarks/results/tpch-sf<scale>``) and scanned in place by both sides. The schema:
``customer`` holds the unit (``c_custkey``), ``orders`` reaches it through ``o_custkey``,
``lineitem`` through ``l_orderkey -> orders.o_orderkey``; ``nation`` is public.

Six questions at epsilon = 1 over ``lineitem JOIN orders JOIN customer`` (and ``nation``):
counts and sums of ``l_extendedprice`` (clamped to [0, 100000]) grouped by nation, market
segment, order priority and ship mode, three with public keys and three with private keys
(delta = 1e-6). Each customer is in at most ``k`` partitions (1 for the customer's nation and
segment, as many as there are priorities or ship modes otherwise) with at most 100 rows in
each.

Timed round-robin in one process (``_rounds``), medians, paired per round:

- ``plain``: the join and GROUP BY with no caps (the non-private query);
- ``by hand``: the join with the same caps written by hand in SQL, as a careful analyst would
  (rows per customer and partition capped at 100 with their counts and sums scaled by
  min(1, 100 / n); partitions per customer at k with contributions scaled by min(1, k / m)
  where the keys are public, and, where they are private, the first k of a customer's
  partitions in a hashed order, with the number of customers per partition that a private
  selection reads); the floor of the issue's target (dpcurator within 1.3x of it);
- ``dpcurator``: ``Curator.sql`` end to end with those caps (parse, the join rules, compile,
  bounding and exact integer sums in DuckDB, partition selection and noise in Python);
- ``dpcurator auto``: the same with the caps and bounds chosen from the data (10% of epsilon).

Accuracy: each question's median relative error against the exact answer without caps (the
plain query), over the released partitions and ``--repeats`` releases.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _rounds import ratios, time_rounds

TABLES = ("customer", "orders", "lineitem", "nation")
UNITS = {"customer": "c_custkey", "orders": "o_custkey -> customer.c_custkey",
         "lineitem": "l_orderkey -> orders.o_orderkey"}
JOIN = ("FROM lineitem JOIN orders ON l_orderkey = o_orderkey "
        "JOIN customer ON o_custkey = c_custkey JOIN nation ON c_nationkey = n_nationkey")
ROWS = 100
PRICE = (0.0, 100_000.0)
# (name, aggregate, group column, public keys?, partitions per customer)
QUESTIONS = [
    ("count by nation", "count", "n_name", True, 1),
    ("revenue by nation", "sum", "n_name", True, 1),
    ("count by segment", "count", "c_mktsegment", False, 1),
    ("revenue by priority", "sum", "o_orderpriority", True, 5),
    ("count by ship mode", "count", "l_shipmode", False, 7),
    ("revenue by ship mode", "sum", "l_shipmode", False, 7),
]


def generate(scale: float, folder: Path) -> dict[str, str]:
    """TPC-H tables as Parquet, written once by tpchgen-cli."""
    paths = {t: str(folder / f"{t}.parquet") for t in TABLES}
    if all(Path(p).exists() for p in paths.values()):
        return paths
    exe = shutil.which("tpchgen-cli") or str(Path(sys.executable).parent / "tpchgen-cli")
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([exe, "parquet", "-s", str(scale), f"--tables={','.join(TABLES)}",
                    f"--output-dir={folder}"], check=True, capture_output=True)
    return paths


def dp_sql(aggregate: str, group: str) -> str:
    value = "COUNT(*)" if aggregate == "count" else "SUM(l_extendedprice)"
    return f"SELECT {group}, {value} AS answer {JOIN} GROUP BY {group}"


def hand_sql(aggregate: str, group: str, k: int, public: bool) -> str:
    """The same caps written by hand (module docstring), in DuckDB's SQL."""
    lo, hi = PRICE
    per_pair = (f"least(count(*), {ROWS})" if aggregate == "count" else
                f"sum(least(greatest(l_extendedprice::DOUBLE, {lo}), {hi})) * "
                f"least(1.0, {ROWS} / count(*))")
    pairs = f"""
        WITH pairs AS (
            SELECT c_custkey AS u, {group} AS g, {per_pair} AS a
            {JOIN} GROUP BY c_custkey, {group})"""
    if not public:
        return f"""{pairs},
        kept AS (SELECT *, row_number() OVER (PARTITION BY u ORDER BY hash(u, g)) AS r
                 FROM pairs)
        SELECT g, sum(a), count(*) FROM kept WHERE r <= {k} GROUP BY g"""
    return f"""{pairs},
        units AS (SELECT u, count(*) AS m FROM pairs GROUP BY u)
        SELECT g, sum(CASE WHEN m <= {k} THEN a ELSE a * {k} / m END)
        FROM pairs JOIN units USING (u) GROUP BY g"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--questions", type=str, default=None,
                        help="comma-separated 1-based question numbers (default: all six)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import duckdb

    import dpcurator as dp
    from dpcurator.noise import SeededRandom

    folder = args.data or Path(__file__).parent / "results" / f"tpch-sf{args.scale:g}"
    start = time.perf_counter()
    paths = generate(args.scale, folder)
    print(f"TPC-H scale {args.scale:g} in {folder} ({time.perf_counter() - start:.1f} s)")
    con = duckdb.connect()
    for table, path in paths.items():
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet('{path}')")
    items = con.execute("SELECT count(*) FROM lineitem").fetchone()
    print(f"{items[0] if items else 0:,} line items")

    def curator(auto: bool, seed: int) -> dp.Curator:
        return dp.Curator(dp.Schema(paths, UNITS, ["nation"]), budget=dp.ApproxDP(1e9, 0.5),
                          cache=False, source=SeededRandom(seed), auto_bounds=auto,
                          allow_large_delta=True)

    fixed, chosen = curator(False, 1), curator(True, 2)
    chosen_id = 0
    wanted = {int(q) for q in args.questions.split(",")} if args.questions else None
    results: dict[str, Any] = {"scale": args.scale, "repeats": args.repeats, "questions": {}}
    for number, (name, aggregate, group, public, k) in enumerate(QUESTIONS, start=1):
        if wanted is not None and number not in wanted:
            continue
        sql = dp_sql(aggregate, group)
        plain = f"SELECT {group}, " + ("count(*)" if aggregate == "count" else
                                       "sum(l_extendedprice::DOUBLE)") + \
            f" {JOIN} GROUP BY {group}"
        truth = {row[0]: float(row[1]) for row in con.execute(plain).fetchall()}
        keys = sorted(truth) if public else None
        privacy: dict[str, Any] = {"epsilon": 1.0}
        if not public:
            privacy["delta"] = 1e-6
        options: dict[str, Any] = {"keys": keys, "max_partitions": k,
                                   "max_rows_per_partition": ROWS}
        if aggregate == "sum":
            options["bounds"] = {"l_extendedprice": PRICE}
        errors: dict[str, list[float]] = {"dpcurator": [], "dpcurator auto": []}

        def release(which: str, cur: dp.Curator, opts: dict[str, Any],
                    errors: dict[str, list[float]] = errors, truth: dict[Any, float] = truth,
                    sql: str = sql, privacy: dict[str, Any] = privacy) -> None:
            out = cur.sql(sql, **opts, **privacy).to_pandas()
            for key, value in zip(out.iloc[:, 0], out["answer"], strict=True):
                if truth.get(key):
                    errors[which].append(abs(float(value) - truth[key]) / truth[key])

        cases = {
            "plain": lambda plain=plain: con.execute(plain).fetchall(),
            "by hand": lambda aggregate=aggregate, group=group, k=k, public=public: con.execute(
                hand_sql(aggregate, group, k, public)).fetchall(),
            "dpcurator": lambda options=options, release=release: release(
                "dpcurator", fixed, options),
            "dpcurator auto": lambda keys=keys, release=release: release(
                "dpcurator auto", chosen, {"keys": keys}),
        }
        chosen_id += 1
        print(f"\n#{number} {name}: {sql}")
        times = time_rounds(cases, args.repeats)
        summary = ratios(times, "by hand")
        accuracy = {which: statistics.median(values) if values else None
                    for which, values in errors.items()}
        print("median relative error: " + ", ".join(
            f"{w} {v:.4f}" for w, v in accuracy.items() if v is not None))
        results["questions"][name] = {"sql": sql, "public_keys": public,
                                      "max_partitions": k, "times": summary,
                                      "median_relative_error": accuracy}
    print("\nquestion                       dpcurator / by hand (paired median)")
    for name, result in results["questions"].items():
        print(f"{name:30s} {result['times']['dpcurator']['paired']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
