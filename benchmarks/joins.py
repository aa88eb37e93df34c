"""DP questions over TPC-H joins, the privacy unit the customer: dpcurator against the same
join with the same per-customer caps written by hand, on DuckDB.

    .venv/bin/python benchmarks/joins.py [--scale 1] [--repeats 5] [--json out.json]
        [--data DIR] [--questions 1,2,...] [--tumult-python PATH [--tumult-grid 1,2,...]
        [--tumult-releases 3] [--threads 2]]

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
- ``dpcurator auto``: the same with the caps and bounds chosen from the data (10% of epsilon);
- ``unit by hand`` and ``dpcurator unit caps``: ``bounding="unit"``'s caps given (128 rows,
  or a sum of 128 x 36,000), written by hand (``hand_unit_sql``) and asked of dpcurator;
- ``dpcurator unit``: ``bounding="unit"``, caps on each customer's total rows (COUNT) or sum
  of |l_extendedprice| (SUM) instead of per partition, chosen from the data (10% of epsilon;
  with private keys the partition cap of the selection too), as Tumult's ``MaxRowsPerID``
  bounds a customer's rows in all.

Accuracy: each question's median relative error against the exact answer without caps (the
plain query), over the released partitions and ``--repeats`` releases.

With ``--tumult-python`` (an environment with ``tmlt.analytics`` and ``duckdb``; Tumult pins
numpy < 2 and pandas < 2; Java 17 runs its local Spark on ``--threads`` cores), Tumult
Analytics answers the same six questions on the same Parquet files with ``join_private``
(``tumult_child``): the three private tables in one id space of customers (``AddRowsWithID``),
its ``lineitem`` given the customer column it needs (``o_custkey``, joined from ``orders``
outside Tumult and not timed), ``nation`` public. Its truncation is swept in hindsight:
``MaxRowsPerID(t)`` for t in ``--tumult-grid`` and, where a customer can be in k > 1
partitions, ``MaxGroupsPerID(k)`` with ``MaxRowsPerGroupPerID(r)`` for r in the grid,
``--tumult-releases`` releases each. Per question the threshold with the lowest median
relative error (the same definition, pooled over its releases) is Tumult's best; its error
and median wall time per release (session creation excluded, JVM and Spark's caches warm)
are set against dpcurator's: the issue's targets are an error at or below Tumult's best and
at least 10x less time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
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
MEAN_PRICE = 36_000.0  # about TPC-H's mean l_extendedprice (the unit caps' sweep step)
EPSILON = 1.0
DELTA = 1e-6  # with private keys
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


def hand_sql(aggregate: str, group: str, k: int, public: bool, *, rows: int = ROWS,
             hashed: str = "hash(u, g)", double: str = "DOUBLE") -> str:
    """The same caps written by hand (module docstring): in DuckDB's SQL, or another
    engine's with its hash of (u, g) and its name of the double type
    (benchmarks/joins_engines.py)."""
    lo, hi = PRICE
    per_pair = (f"least(count(*), {rows})" if aggregate == "count" else
                f"sum(least(greatest(CAST(l_extendedprice AS {double}), {lo}), {hi})) * "
                f"least(1.0, {rows}.0 / count(*))")
    pairs = f"""
        WITH pairs AS (
            SELECT c_custkey AS u, {group} AS g, {per_pair} AS a
            {JOIN} GROUP BY c_custkey, {group})"""
    if not public:
        return f"""{pairs},
        kept AS (SELECT *, row_number() OVER (PARTITION BY u ORDER BY {hashed}) AS r
                 FROM pairs)
        SELECT g, sum(a), count(*) FROM kept WHERE r <= {k} GROUP BY g"""
    return f"""{pairs},
        units AS (SELECT u, count(*) AS m FROM pairs GROUP BY u)
        SELECT g, sum(CASE WHEN m <= {k} THEN a ELSE a * {k}.0 / m END)
        FROM pairs JOIN units USING (u) GROUP BY g"""


UNIT_ROWS = 128  # bounding="unit"'s caps written by hand: a customer's rows in all,
UNIT_SUM = UNIT_ROWS * 36_000.0  # and their sum of |l_extendedprice| (128 at the mean price)


def hand_unit_sql(aggregate: str, group: str, k: int, public: bool) -> str:
    """``bounding="unit"``'s caps written by hand in DuckDB's SQL: each (customer, partition)
    pair's rows weighted by min(1, M / T) (T the customer's rows in all), or its sum of prices
    (each clamped to [-V, V]) divided by the least power of two bringing the customer's sum
    of |price| within V; with private keys also the customers counted in their first k
    partitions in a hashed order, for the selection."""
    if aggregate == "count":
        per_pair, per_unit = "count(*) AS a", "sum(a) AS t"
        weighted = f"CASE WHEN t <= {UNIT_ROWS} THEN a ELSE a * {UNIT_ROWS} // t END"
    else:
        price = f"least(greatest(l_extendedprice::DOUBLE, {-UNIT_SUM}), {UNIT_SUM})"
        per_pair = f"sum({price}) AS a, sum(abs({price})) AS b"
        per_unit = "sum(b) AS t"
        weighted = (f"CASE WHEN t <= {UNIT_SUM} THEN a ELSE a / pow(2, ceil(log2(t / "
                    f"{UNIT_SUM}))) END")
    pairs = f"""
        WITH pairs AS (SELECT c_custkey AS u, {group} AS g, {per_pair}
                       {JOIN} GROUP BY c_custkey, {group}),
        units AS (SELECT u, {per_unit} FROM pairs GROUP BY u)"""
    if public:
        return f"""{pairs}
        SELECT g, sum({weighted}) FROM pairs JOIN units USING (u) GROUP BY g"""
    return f"""{pairs},
        ranked AS (SELECT *, row_number() OVER (PARTITION BY u ORDER BY hash(u, g)) AS r
                   FROM pairs JOIN units USING (u))
        SELECT g, sum({weighted}), count(*) FILTER (WHERE r <= {k}) FROM ranked GROUP BY g"""


# -- Tumult Analytics' join_private on the same questions (a separate environment) ------------

KEYS_SHARE = 0.5  # of epsilon spent choosing private keys: Tumult's own split (see tumult_child)


def tumult_child(args: argparse.Namespace) -> None:
    """Run in Tumult's environment (``--tumult-python``): every question at every truncation
    of the grid, ``--tumult-releases`` releases each, printing one JSON line of the answers
    and the wall times (the parent computes the errors, with the same truth as dpcurator's).

    Set-up, not timed: DuckDB adds to each line item its order's customer (``o_custkey``, the
    id column Tumult needs in every private table) and casts ``l_extendedprice`` to DOUBLE
    (Tumult sums no decimals); Spark reads the three private tables (only the columns the
    questions use) and ``nation`` (public, ``n_nationkey`` renamed ``c_nationkey`` to join on),
    and caches them in memory. One Session per question, ``AddRowsWithID`` on the three tables
    in one id space, with a budget of epsilon (and delta) times the releases it makes; each
    release spends what dpcurator spends (epsilon = 1; with private keys also delta = 1e-6).
    Timed per release: building the query, ``Session.evaluate`` and ``toPandas``; with
    private keys that is two evaluations, ``get_groups`` and then the aggregate over
    ``KeySet.from_dataframe`` of its answer."""
    import duckdb
    from pyspark.sql import SparkSession
    from tmlt.analytics import (
        AddRowsWithID,
        ApproxDPBudget,
        KeySet,
        MaxGroupsPerID,
        MaxRowsPerGroupPerID,
        MaxRowsPerID,
        PureDPBudget,
        QueryBuilder,
        Session,
    )

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    folder = Path(args.data)
    work = Path(tempfile.mkdtemp(prefix="tumult-joins-"))
    con = duckdb.connect()
    con.execute(f"""COPY (SELECT o_custkey, l_orderkey, l_extendedprice::DOUBLE AS l_extendedprice,
                                 l_shipmode
                          FROM read_parquet('{folder / "lineitem.parquet"}')
                          JOIN read_parquet('{folder / "orders.parquet"}')
                            ON l_orderkey = o_orderkey)
                    TO '{work / "lineitem.parquet"}' (FORMAT parquet)""")
    spark = (SparkSession.builder.master(f"local[{args.threads}]")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "6g")
             .config("spark.sql.warehouse.dir", str(work / "warehouse"))
             .config("spark.sql.shuffle.partitions", str(4 * args.threads)).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    def load(path: Path, columns: list[str]) -> Any:
        frame = spark.read.parquet(str(path)).select(*columns)
        frame.cache().count()
        return frame

    customer = load(folder / "customer.parquet", ["c_custkey", "c_nationkey", "c_mktsegment"])
    orders = load(folder / "orders.parquet", ["o_orderkey", "o_custkey", "o_orderpriority"])
    lineitem = load(work / "lineitem.parquet",
                    ["o_custkey", "l_orderkey", "l_extendedprice", "l_shipmode"])
    nation = load(folder / "nation.parquet", ["n_nationkey", "n_name"]
                  ).withColumnRenamed("n_nationkey", "c_nationkey")

    def joined(group: str) -> Any:
        """lineitem JOIN orders JOIN customer (JOIN nation), each private join on the id."""
        query = (QueryBuilder("lineitem").rename({"l_orderkey": "o_orderkey"})
                 .join_private("orders", join_columns=["o_custkey", "o_orderkey"])
                 .join_private(QueryBuilder("customer").rename({"c_custkey": "o_custkey"}),
                               join_columns=["o_custkey"]))
        if group == "n_name":
            query = query.join_public("nation", join_columns=["c_nationkey"])
        return query

    def aggregate(query: Any, aggregate: str) -> Any:
        return query.count() if aggregate == "count" else query.sum(
            "l_extendedprice", low=PRICE[0], high=PRICE[1])

    grid = [int(t) for t in args.tumult_grid.split(",")]
    wanted = {int(q) for q in args.questions.split(",")} if args.questions else None
    out: dict[str, Any] = {"grid": grid, "releases": args.tumult_releases, "questions": {}}
    for number, (name, agg, group, public, k) in enumerate(QUESTIONS, start=1):
        if wanted is not None and number not in wanted:
            continue
        # The truncations swept: MaxRowsPerID(t) over the grid and, where a customer can be in
        # several partitions, MaxGroupsPerID(k) with MaxRowsPerGroupPerID(r) over the grid.
        truncations: list[tuple[str, list[Any]]] = [
            (f"MaxRowsPerID({t})", [MaxRowsPerID(t)]) for t in grid]
        if k > 1:
            truncations += [(f"MaxGroupsPerID({k}) + MaxRowsPerGroupPerID({r})",
                             [MaxGroupsPerID(group, k), MaxRowsPerGroupPerID(group, r)])
                            for r in grid]
        releases = len(truncations) * args.tumult_releases + 1  # + the warm-up
        budget = (PureDPBudget(EPSILON * releases) if public else
                  ApproxDPBudget(EPSILON * releases, DELTA * releases))
        session = (Session.Builder().with_privacy_budget(budget)
                   .with_id_space("customer")
                   .with_private_dataframe("customer", customer,
                                           AddRowsWithID("c_custkey", "customer"))
                   .with_private_dataframe("orders", orders,
                                           AddRowsWithID("o_custkey", "customer"))
                   .with_private_dataframe("lineitem", lineitem,
                                           AddRowsWithID("o_custkey", "customer"))
                   .with_public_dataframe("nation", nation).build())
        # Public keys: the nations (the public table) and the priorities (TPC-H's five,
        # read from the data as dpcurator's benchmark reads them); not timed.
        public_keys = KeySet.from_dict({group: sorted(
            row[0] for row in (nation if group == "n_name" else orders)
            .select(group).distinct().collect())}) if public else None

        def release(constraints: list[Any], group: str = group, agg: str = agg,
                    public: bool = public, k: int = k,
                    public_keys: Any = public_keys, session: Any = session) -> dict[str, float]:
            query = joined(group)
            if public:
                keys, spend = public_keys, PureDPBudget(EPSILON)
            else:
                # Private keys, as Tumult's docs do it: get_groups (ApproxDP, each customer
                # in at most k partitions, once in each), then the aggregate over those keys;
                # KEYS_SHARE of epsilon and all of delta on the keys, as Tumult's own
                # automatic partition selection splits them.
                chosen = session.evaluate(
                    query.enforce(MaxGroupsPerID(group, k))
                    .enforce(MaxRowsPerGroupPerID(group, 1)).get_groups([group]),
                    ApproxDPBudget(EPSILON * KEYS_SHARE, DELTA)).toPandas()
                if chosen.empty:
                    return {}
                keys = KeySet.from_dataframe(spark.createDataFrame(chosen))
                spend = ApproxDPBudget(EPSILON * (1 - KEYS_SHARE), 0)
                query = joined(group)
            for constraint in constraints:
                query = query.enforce(constraint)
            answer = session.evaluate(aggregate(query.groupby(keys), agg), spend).toPandas()
            return {str(key): float(value) for key, value in
                    zip(answer[group], answer.iloc[:, -1], strict=True)}

        release(truncations[0][1])  # warm-up: Spark's plans for this question's join
        runs = []
        for label, constraints in truncations:
            answers, times = [], []
            for _ in range(args.tumult_releases):
                start = time.perf_counter()
                answers.append(release(constraints))
                times.append(time.perf_counter() - start)
            runs.append({"truncation": label, "answers": answers, "times_s": times})
            print(f"#{number} {label}: median {statistics.median(times):.2f} s",
                  file=sys.stderr, flush=True)
        out["questions"][name] = runs
    print(json.dumps(out), flush=True)


def run_tumult(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Tumult pins numpy < 2 and pandas < 2, which dpcurator cannot share: its child runs in
    ``--tumult-python`` on the same Parquet files."""
    command = [args.tumult_python, __file__, "--tumult-child", "--data", str(folder),
               "--tumult-grid", args.tumult_grid, "--tumult-releases",
               str(args.tumult_releases), "--threads", str(args.threads)]
    if args.questions:
        command += ["--questions", args.questions]
    start = time.perf_counter()
    tail: list[str] = []
    # The answers come on stdout, in a file (too long for a pipe read after stderr's end);
    # progress lines ("#n truncation: median s") on stderr, shown as they come.
    with tempfile.TemporaryFile("w+") as answers, subprocess.Popen(
            command, stdout=answers, stderr=subprocess.PIPE, text=True) as child:
        assert child.stderr is not None
        for line in child.stderr:
            if line.startswith("#"):
                print("  " + line.rstrip(), flush=True)
            tail = [*tail[-4:], line.rstrip()]
            if time.perf_counter() - start > args.tumult_timeout:
                child.kill()
        child.wait()
        answers.seek(0)
        lines = [line for line in answers.read().splitlines() if line.startswith("{")]
    if child.returncode != 0 or not lines:
        raise RuntimeError(f"Tumult run failed (exit {child.returncode}): {tail}")
    result = json.loads(lines[-1])
    result["total_s"] = time.perf_counter() - start
    return result


def relative_errors(answer: dict[Any, float], truth: dict[Any, float]) -> list[float]:
    """|noisy - truth| / truth over the released partitions present in the truth."""
    return [abs(value - truth[key]) / truth[key] for key, value in answer.items()
            if truth.get(key)]


def compare_tumult(args: argparse.Namespace, folder: Path, results: dict[str, Any],
                   truths: dict[str, dict[Any, float]]) -> None:
    """Tumult's best truncation in hindsight per question (the lowest median relative error,
    pooled over its releases), against dpcurator's error and median time; into ``results``."""
    print(f"\nTumult Analytics (join_private, local Spark on {args.threads} cores): "
          f"thresholds {args.tumult_grid}, {args.tumult_releases} releases each ...",
          flush=True)
    try:
        tumult = run_tumult(args, folder)
    except (RuntimeError, subprocess.SubprocessError, OSError, ValueError) as exc:
        results["tumult_error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        print(f"Tumult failed: {results['tumult_error']}")
        return
    results["tumult"] = {"grid": tumult["grid"], "releases": tumult["releases"],
                         "keys_share_of_epsilon": KEYS_SHARE, "total_s": tumult["total_s"]}
    print(f"(the whole Tumult run, set-up and every threshold: {tumult['total_s']:.0f} s)")
    print(f"\n{'question':22s} {'ours':>8s} {'ours auto':>9s} {'Tumult best':>11s}  "
          f"{'threshold':34s} {'ours s':>7s} {'auto s':>7s} {'Tumult s':>8s} {'x faster':>8s}"
          f"  error <= Tumult / >= 10x faster")
    for name, runs in tumult["questions"].items():
        entry = results["questions"][name]
        sweep = []
        for run in runs:
            errors = [e for answer in run["answers"]
                      for e in relative_errors(answer, truths[name])]
            sweep.append({"truncation": run["truncation"],
                          "median_relative_error": statistics.median(errors) if errors
                          else None, "median_s": statistics.median(run["times_s"]),
                          "times_s": run["times_s"]})
        best = min((s for s in sweep if s["median_relative_error"] is not None),
                   key=lambda s: s["median_relative_error"], default=None)
        if best is None:
            entry["tumult"] = {"sweep": sweep, "best": None}
            print(f"{name:22s} Tumult released no partition at any threshold")
            continue
        ours = entry["median_relative_error"]["dpcurator"]
        auto = entry["median_relative_error"]["dpcurator auto"]
        unit = entry["median_relative_error"].get("dpcurator unit")
        ours_s = entry["times"]["dpcurator"]["median_s"]
        auto_s = entry["times"]["dpcurator auto"]["median_s"]
        faster = best["median_s"] / ours_s
        targets = {"error_at_or_below_tumult_best": ours is not None
                   and ours <= best["median_relative_error"],
                   "auto_error_at_or_below_tumult_best": auto is not None
                   and auto <= best["median_relative_error"],
                   "unit_error_at_or_below_tumult_best": unit is not None
                   and unit <= best["median_relative_error"],
                   "ten_times_faster": faster >= 10,
                   "auto_ten_times_faster": best["median_s"] / auto_s >= 10}
        entry["tumult"] = {"best": best, "sweep": sweep, "times_faster": faster,
                           "auto_times_faster": best["median_s"] / auto_s,
                           "targets": targets}

        def fmt(value: float | None) -> str:
            return "-" if value is None else f"{value:.4f}"

        print(f"{name:22s} {fmt(ours):>8s} {fmt(auto):>9s} "
              f"{fmt(best['median_relative_error']):>11s}  {best['truncation']:34s} "
              f"{ours_s:7.3f} {auto_s:7.3f} {best['median_s']:8.2f} {faster:8.0f}  "
              f"{'yes' if targets['error_at_or_below_tumult_best'] else 'NO'}"
              f"{' (auto yes)' if targets['auto_error_at_or_below_tumult_best'] else ''}"
              f" (unit {fmt(unit)}: "
              f"{'yes' if targets['unit_error_at_or_below_tumult_best'] else 'NO'}) / "
              f"{'yes' if targets['ten_times_faster'] else 'NO'}")
    print("(errors: median relative error against the uncapped answer, pooled over releases; "
          "times: medians per release, Tumult's at its best threshold, session creation "
          "excluded, JVM warm)")


def _sweep(curator: Any, sql: str, caps: Any, truth: dict[Any, float],
           args: argparse.Namespace, what: str) -> dict[str, Any]:
    """Each cap t of ``--ours-grid`` (``caps(t)``: the options of its releases), ``--repeats``
    releases each: the cap with the lowest median relative error, chosen with the truth, as
    Tumult's best threshold is."""
    errors = {}
    for t in (int(r) for r in args.ours_grid.split(",")):
        pooled: list[float] = []
        for _ in range(args.repeats):
            out = curator.sql(sql, **caps(t)).to_pandas()
            pooled += relative_errors({key: float(value) for key, value in zip(
                out.iloc[:, 0], out["answer"], strict=True)}, truth)
        errors[t] = statistics.median(pooled) if pooled else float("nan")
    best = min(errors, key=lambda r: errors[r])
    print(f"dpcurator's {what} in hindsight: {errors}; best {best}: {errors[best]:.4f}")
    return {"errors": errors, "best_rows": best, "best_error": errors[best]}


def hindsight(curator: Any, sql: str, options: dict[str, Any], privacy: dict[str, Any],
              truth: dict[Any, float], args: argparse.Namespace) -> dict[str, Any]:
    """dpcurator's row cap swept (``_sweep``), with the question's own partition cap and
    bounds."""
    return _sweep(curator, sql, lambda rows: {
        **options, "max_rows_per_partition": rows, **privacy}, truth, args, "row caps")


def unit_hindsight(curator: Any, sql: str, aggregate: str, keys: Any,
                   privacy: dict[str, Any], truth: dict[Any, float],
                   args: argparse.Namespace) -> dict[str, Any]:
    """``bounding="unit"``'s cap swept (``_sweep``) as Tumult's ``MaxRowsPerID(t)`` is: a
    customer's rows in all (COUNT), or for a SUM a customer's sum of |l_extendedprice| of t
    times ``MEAN_PRICE`` (t line items of the mean price; Tumult's bound is t times the
    clamp); with private keys the selection's partition cap is the question's k."""
    def caps(t: int) -> dict[str, Any]:
        cap: dict[str, Any] = ({"max_unit_rows": t} if aggregate == "count" else
                               {"max_unit_sums": {"l_extendedprice": t * MEAN_PRICE}})
        return {"keys": keys, "bounding": "unit", **cap, **privacy}

    return _sweep(curator, sql, caps, truth, args, "unit caps")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--questions", type=str, default=None,
                        help="comma-separated 1-based question numbers (default: all six)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--tumult-python", type=str, default=None,
                        help="python of an environment with tmlt.analytics and duckdb")
    parser.add_argument("--tumult-grid", type=str,
                        default=",".join(str(2**i) for i in range(10)),
                        help="Tumult's truncation thresholds swept (rows per customer, and "
                             "rows per customer and partition)")
    parser.add_argument("--tumult-releases", type=int, default=3,
                        help="Tumult's releases at each threshold")
    parser.add_argument("--tumult-timeout", type=float, default=7200.0)
    parser.add_argument("--threads", type=int, default=2, help="Spark's local cores")
    parser.add_argument("--ours-grid", type=str, default=None,
                        help="comma-separated row caps: dpcurator's fixed caps swept in "
                             "hindsight, as Tumult's are (--repeats releases each)")
    parser.add_argument("--tumult-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tumult_child:
        tumult_child(args)
        return

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
    truths: dict[str, dict[Any, float]] = {}
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
        privacy: dict[str, Any] = {"epsilon": EPSILON}
        if not public:
            privacy["delta"] = DELTA
        options: dict[str, Any] = {"keys": keys, "max_partitions": k,
                                   "max_rows_per_partition": ROWS}
        if aggregate == "sum":
            options["bounds"] = {"l_extendedprice": PRICE}
        errors: dict[str, list[float]] = {"dpcurator": [], "dpcurator auto": [],
                                          "dpcurator unit": [], "dpcurator unit caps": []}
        unit_caps: dict[str, Any] = {
            "bounding": "unit", **({"max_unit_rows": UNIT_ROWS} if aggregate == "count" else
                                   {"max_unit_sums": {"l_extendedprice": UNIT_SUM}}),
            **({} if public else {"max_partitions": k})}

        caps_chosen: list[float] = []  # "dpcurator unit"'s caps, rows (COUNT) or V (SUM)

        def release(which: str, cur: dp.Curator, opts: dict[str, Any],
                    errors: dict[str, list[float]] = errors, truth: dict[Any, float] = truth,
                    sql: str = sql, privacy: dict[str, Any] = privacy,
                    caps_chosen: list[float] = caps_chosen) -> None:
            answer = cur.sql(sql, **opts, **privacy)
            if which == "dpcurator unit":
                caps_chosen.append(float(answer.max_unit_rows or next(
                    iter(answer.max_unit_sums.values()))))
            out = answer.to_pandas()
            errors[which] += relative_errors(
                {key: float(value) for key, value in zip(out.iloc[:, 0], out["answer"],
                                                         strict=True)}, truth)

        cases = {
            "plain": lambda plain=plain: con.execute(plain).fetchall(),
            "by hand": lambda aggregate=aggregate, group=group, k=k, public=public: con.execute(
                hand_sql(aggregate, group, k, public)).fetchall(),
            "dpcurator": lambda options=options, release=release: release(
                "dpcurator", fixed, options),
            "dpcurator auto": lambda keys=keys, release=release: release(
                "dpcurator auto", chosen, {"keys": keys}),
            # the caps on each customer's total (bounding="unit"), chosen from the data
            "dpcurator unit": lambda keys=keys, release=release: release(
                "dpcurator unit", chosen, {"keys": keys, "bounding": "unit"}),
            # the same caps given, against the same written by hand
            "unit by hand": lambda aggregate=aggregate, group=group, k=k, public=public:
                con.execute(hand_unit_sql(aggregate, group, k, public)).fetchall(),
            "dpcurator unit caps": lambda keys=keys, release=release, unit_caps=unit_caps:
                release("dpcurator unit caps", fixed, {"keys": keys, **unit_caps}),
        }
        chosen_id += 1
        print(f"\n#{number} {name}: {sql}")
        times = time_rounds(cases, args.repeats)
        summary = ratios(times, "by hand")
        accuracy = {which: statistics.median(values) if values else None
                    for which, values in errors.items()}
        print("median relative error: " + ", ".join(
            f"{w} {v:.4f}" for w, v in accuracy.items() if v is not None))
        if caps_chosen:
            print("dpcurator unit's caps chosen: median "
                  f"{statistics.median(caps_chosen):,.4g}, range {min(caps_chosen):,.4g} to "
                  f"{max(caps_chosen):,.4g}")
        unit_paired = statistics.median(
            a / b for a, b in zip(times["dpcurator unit caps"], times["unit by hand"],
                                  strict=True))
        results["questions"][name] = {"sql": sql, "public_keys": public,
                                      "max_partitions": k, "times": summary,
                                      "unit_caps_over_unit_by_hand": unit_paired,
                                      "median_relative_error": accuracy,
                                      "unit_caps_chosen": caps_chosen}
        truths[name] = truth
        if args.ours_grid:
            results["questions"][name]["hindsight"] = hindsight(
                fixed, sql, options, privacy, truth, args)
            unit_fixed = {"max_partitions": k} if not public else {}
            results["questions"][name]["unit_hindsight"] = unit_hindsight(
                fixed, sql, aggregate, keys, {**privacy, **unit_fixed}, truth, args)
    print("\nquestion                       dpcurator / by hand   unit caps / unit by hand "
          "(paired medians)")
    for name, result in results["questions"].items():
        print(f"{name:30s} {result['times']['dpcurator']['paired']:.2f}"
              f"                {result['unit_caps_over_unit_by_hand']:.2f}")
    if args.tumult_python:
        con.close()  # DuckDB's memory back before Spark starts
        compare_tumult(args, folder, results, truths)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
