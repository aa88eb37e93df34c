"""The curator on each engine against that engine's own floors, and DuckDB's scaling, in one run.

    .venv/bin/python benchmarks/engines.py [--duckdb-rows 5000000] [--baseline REF]
        [--scale 1000000,10000000,100000000] [--memory-limit 4GB]
        [--postgres-rows 1000000,10000000] [--spark-rows 10000000]
        [--repeats 3] [--only duckdb,scale,postgres,spark] [--json out.json]

The question everywhere is benchmarks/query.py's: per category a DP count and a DP sum of
value clamped to [0, 100], each user in at most 5 categories with at most 2 rows in each,
epsilon = 1, rows of (user_id, category, value) with ten rows per user on average and a skewed
category. Every section runs in processes of its own (one engine at a time on the machine) and
reports ratios to floors measured in the same process, round-robin, medians:

- ``duckdb``: from a Parquet file with string user ids ('user-123456'), dpcurator with public
  keys, private keys and ``bounding="sample"`` against the plain-SQL unit-cap floor (GROUP BY
  user, category; each user's number of categories joined back to weight the pairs: the least
  an exact partition cap costs). Targets: public keys <= 1.25x, private keys <= 1.3x. For
  context, the plain-SQL hard cap that private keys need (``row_number`` over each user's
  pairs in DuckDB's ``hash`` order, keeping 5) is timed against the same floor. With
  ``--baseline REF`` the same process runs once more with the package's source taken from
  that git commit (a temporary worktree), so that "no slower than before" is measured too.
- ``scale``: DuckDB from Parquet (integer user ids) at each ``--scale`` size, the two-level
  floor and dpcurator (public keys) once each in a fresh process, with time, peak resident
  memory and DuckDB's ``memory_limit`` (spilling to a temporary folder past it). Time should
  grow linearly and memory stay within the limit.
- ``postgres``: benchmarks/postgres.py at each ``--postgres-rows`` size (a server of its own),
  target: the DP query <= 2x PostgreSQL's two-level floor.
- ``spark``: benchmarks/spark.py (local[2]) at ``--spark-rows``, target <= 2x Spark's
  two-level floor; with ``--tumult-python PATH`` (an environment with tmlt.analytics and
  duckdb: see benchmarks/query.py) also Tumult Analytics on local Spark, on the same question
  and data shape at the same size, once, against dpcurator's public-keys median (target:
  dpcurator >= 10x faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _rounds import time_rounds

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SQL = "SELECT category, COUNT(*) AS n, SUM(value) AS total FROM data GROUP BY category"
UNIT_CAP_FLOOR = """
    WITH pairs AS (SELECT user_id, category, count(*) AS c, sum(value) AS s
                   FROM data GROUP BY user_id, category),
         users AS (SELECT user_id, count(*) AS m FROM pairs GROUP BY user_id)
    SELECT category, sum(c * least(1.0, 5 / m)), sum(s * least(1.0, 5 / m))
    FROM pairs JOIN users USING (user_id) GROUP BY category"""
# Context for private keys, which need a hard cap (each unit in at most 5 partitions, not
# weighted over all of them): the plain-SQL way to keep 5 per unit, in DuckDB's own hash order.
HARD_CAP_FLOOR = """
    WITH pairs AS (SELECT user_id, category, least(count(*), 2) AS c, sum(value) AS s
                   FROM data GROUP BY user_id, category)
    SELECT category, sum(c), sum(s) FROM (
        SELECT *, row_number() OVER (PARTITION BY user_id ORDER BY hash(user_id, category))
            AS r FROM pairs) WHERE r <= 5 GROUP BY category"""
TWO_LEVEL_FLOOR = ("SELECT category, sum(c), sum(s) FROM (SELECT user_id, category, "
                   "count(*) AS c, sum(value) AS s FROM data GROUP BY user_id, category) "
                   "GROUP BY category")
TARGETS = {("duckdb", "dpcurator (public keys)"): 1.25,
           ("duckdb", "dpcurator (private keys)"): 1.3,
           ("postgres", "dpcurator (public keys)"): 2.0,
           ("postgres", "dpcurator (private keys)"): 2.0,
           ("postgres", "dpcurator (bounding=sample)"): 2.0,
           ("spark", "dpcurator (public keys)"): 2.0,
           ("spark", "dpcurator (private keys)"): 2.0,
           ("spark", "dpcurator (bounding=sample)"): 2.0}


def write_parquet(path: Path, rows: int, string_units: bool) -> None:
    """The benchmark table (benchmarks/query.py's generator) written once to Parquet."""
    import duckdb

    sys.path.insert(0, str(HERE))
    from query import make_table

    if path.exists():
        return
    con = duckdb.connect()
    con.execute(f"SET temp_directory='{path.parent / 'spill'}'")
    make_table(con, rows, max(1, rows // 10), 1000, string_units)
    con.execute(f"COPY data TO '{path}.tmp' (FORMAT parquet)")
    con.close()
    os.replace(f"{path}.tmp", path)


def connect(parquet: Path, threads: int, memory_limit: str | None) -> Any:
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads={threads}")
    if memory_limit:
        con.execute(f"SET memory_limit='{memory_limit}'")
        con.execute(f"SET temp_directory='{tempfile.mkdtemp(prefix='dpcurator-spill-')}'")
    con.execute(f"CREATE VIEW data AS SELECT * FROM read_parquet('{parquet}')")
    return con


def curator_cases(con: Any) -> dict[str, Callable[[], Any]]:
    import dpcurator as dp

    curator = dp.Curator.from_duckdb(
        con, "data", privacy_unit="user_id", budget=dp.ApproxDP(1e12, 0.5), cache=False,
        bounds={"value": (0, 100)}, max_partitions=5, max_rows_per_partition=2,
        allow_large_delta=True)  # a total that lasts every round
    keys = list(range(1000))
    return {
        "dpcurator (public keys)": lambda: curator.sql(SQL, epsilon=1.0, keys=keys),
        "dpcurator (private keys)": lambda: curator.sql(SQL, epsilon=1.0, delta=1e-6),
        "dpcurator (bounding=sample)": lambda: curator.sql(SQL, epsilon=1.0, keys=keys,
                                                           bounding="sample"),
    }


def peak_rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child_duckdb(args: argparse.Namespace) -> dict[str, Any]:
    """Round-robin: the unit-cap floor and the three dpcurator cases, on one connection."""
    con = connect(Path(args.parquet), args.threads, None)
    cases: dict[str, Callable[[], Any]] = {
        "floor: two-level + unit cap": lambda: con.execute(UNIT_CAP_FLOOR).fetchall(),
        "plain SQL: hard cap (row_number)": lambda: con.execute(HARD_CAP_FLOOR).fetchall(),
        **curator_cases(con)}
    times = time_rounds(cases, args.repeats)
    floor = times["floor: two-level + unit cap"]
    return {name: {"median_s": statistics.median(values),
                   "x_floor": statistics.median(values) / statistics.median(floor),
                   "paired": statistics.median(v / f for v, f in zip(values, floor,
                                                                     strict=True))}
            for name, values in times.items()}


def child_scale(args: argparse.Namespace) -> dict[str, Any]:
    """One case, once, in this fresh process: its time and the process's peak memory."""
    con = connect(Path(args.parquet), args.threads, args.memory_limit)
    if args.case == "floor: two-level":
        def fn() -> Any:
            return con.execute(TWO_LEVEL_FLOOR).fetchall()
    else:
        fn = curator_cases(con)["dpcurator (public keys)"]
        from fractions import Fraction

        from dpcurator.noise import sample_discrete_laplace

        sample_discrete_laplace(Fraction(2**40), 1)  # the sampler's one-off tables first
    before = peak_rss_mib()
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_rss_mib": peak_rss_mib(), "before_mib": before}


def run_child(kind: str, extra: list[str], src: Path | None = None,
              timeout: float = 3600) -> dict[str, Any]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = f"{src}{os.pathsep}{env.get('PYTHONPATH', '')}"
    out = subprocess.run([sys.executable, __file__, "--child", kind, *extra], env=env,
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} child failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def baseline_source(ref: str, folder: Path) -> Path:
    """The package's source at ``ref``, checked out in a temporary worktree."""
    worktree = folder / "baseline"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force",
                    str(worktree), ref], check=True, capture_output=True)
    return worktree / "src"


def section_duckdb(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    parquet = folder / f"strings_{args.duckdb_rows}.parquet"
    write_parquet(parquet, args.duckdb_rows, string_units=True)
    extra = ["--parquet", str(parquet), "--repeats", str(args.repeats),
             "--threads", str(args.threads)]
    report = {"rows": args.duckdb_rows, "now": run_child("duckdb", extra)}
    if args.baseline:
        src = baseline_source(args.baseline, folder)
        try:
            report["baseline"] = {"ref": args.baseline,
                                  "cases": run_child("duckdb", extra, src=src)}
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(src.parent)], capture_output=True)
    return report


def section_scale(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    sizes = [int(float(s)) for s in args.scale.split(",") if s]
    report: dict[str, Any] = {"memory_limit": args.memory_limit, "sizes": {}}
    for rows in sizes:
        parquet = folder / f"ints_{rows}.parquet"
        start = time.perf_counter()
        write_parquet(parquet, rows, string_units=False)
        generated = time.perf_counter() - start
        entry: dict[str, Any] = {"generate_s": generated,
                                 "parquet_mib": parquet.stat().st_size / 2**20}
        for case in ("floor: two-level", "dpcurator (public keys)"):
            entry[case] = run_child("scale", ["--parquet", str(parquet), "--case", case,
                                              "--threads", str(args.threads),
                                              "--memory-limit", args.memory_limit])
        report["sizes"][rows] = entry
        print(f"  scale {rows:>11,} rows: " + ", ".join(
            f"{c}: {entry[c]['seconds']:.1f}s {entry[c]['peak_rss_mib']:.0f} MiB"
            for c in ("floor: two-level", "dpcurator (public keys)")), flush=True)
        parquet.unlink()
    return report


def section_script(script: str, rows: int, repeats: int, folder: Path) -> dict[str, Any]:
    out = folder / f"{script}_{rows}.json"
    done = subprocess.run([sys.executable, str(HERE / f"{script}.py"), "--rows", str(rows),
                           "--repeats", str(repeats), "--json", str(out)],
                          capture_output=True, text=True, timeout=7200)
    if done.returncode != 0:
        raise RuntimeError(f"{script}.py failed:\n{done.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def section_tumult(python: str, rows: int, driver_memory: str) -> float | None:
    """Tumult Analytics' time for the question (benchmarks/query.py's child, its own env,
    its Spark driver given ``driver_memory``); None, with the reason printed, if it fails."""
    env = {**os.environ,
           "PYSPARK_SUBMIT_ARGS": f"--driver-memory {driver_memory} pyspark-shell"}
    done = subprocess.run([python, str(HERE / "query.py"), "--tumult-child", "--rows",
                           str(rows), "--units", str(max(1, rows // 10)), "--categories",
                           "1000", "--threads", "2"], capture_output=True, text=True,
                          timeout=7200, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        print(f"Tumult failed: {done.stderr.strip().splitlines()[-1:]}", flush=True)
        return None
    return float(json.loads(lines[-1])["seconds"])


def summary(report: dict[str, Any]) -> None:
    print(f"\n{'engine':10s} {'rows':>12s} {'case':30s} {'x floor':>8s} {'paired':>7s} "
          f"{'target':>7s}")

    def line(engine: str, rows: int, case: str, ratio: float, paired: float) -> None:
        target = TARGETS.get((engine, case))
        verdict = ("" if target is None else
                   f"{target:5.2f} {'met' if paired <= target else 'MISSED'}")
        print(f"{engine:10s} {rows:>12,} {case:30s} {ratio:8.2f} {paired:7.2f} {verdict}")

    if "duckdb" in report:
        d = report["duckdb"]
        for case, r in d["now"].items():
            if case.startswith(("dpcurator", "plain SQL")):
                line("duckdb", d["rows"], case, r["x_floor"], r["paired"])
        if "baseline" in d:
            for case, r in d["baseline"]["cases"].items():
                if case.startswith("dpcurator"):
                    now = d["now"][case]
                    print(f"{'':10s} {'':>12s} {'  ' + case[10:]:30s} {r['x_floor']:8.2f} "
                          f"{r['paired']:7.2f} at {d['baseline']['ref'][:10]}: now/before "
                          f"{now['paired'] / r['paired']:.2f}")
    for engine in ("postgres", "spark"):
        for rows, r in report.get(engine, {}).items():
            for case, c in r["cases"].items():
                if case.startswith("dpcurator"):
                    line(engine, int(rows), case, c["x_two_level"], c["paired"])
    for rows, seconds in report.get("tumult", {}).items():
        if seconds is None:
            continue
        ours = report["spark"][rows]["cases"]["dpcurator (public keys)"]["median_s"]
        print(f"\nTumult Analytics, {int(rows):,} rows: {seconds:.1f}s; dpcurator on Spark "
              f"(public keys) {ours:.1f}s: {seconds / ours:.1f}x faster (target >= 10x)")
    if "scale" in report:
        print(f"\nDuckDB from Parquet, memory_limit {report['scale']['memory_limit']}:")
        print(f"{'rows':>12s} {'floor s':>8s} {'dp s':>8s} {'dp/floor':>8s} "
              f"{'s per 1e6':>9s} {'floor MiB':>9s} {'dp MiB':>8s}")
        for rows, e in report["scale"]["sizes"].items():
            f, p = e["floor: two-level"], e["dpcurator (public keys)"]
            print(f"{int(rows):>12,} {f['seconds']:8.1f} {p['seconds']:8.1f} "
                  f"{p['seconds'] / f['seconds']:8.2f} {p['seconds'] / int(rows) * 1e6:9.3f} "
                  f"{f['peak_rss_mib']:9.0f} {p['peak_rss_mib']:8.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duckdb-rows", type=int, default=5_000_000)
    parser.add_argument("--baseline", type=str, default=None,
                        help="a git commit whose dpcurator is timed too (DuckDB section)")
    parser.add_argument("--scale", type=str, default="1000000,10000000,100000000")
    parser.add_argument("--memory-limit", type=str, default="4GB")
    parser.add_argument("--postgres-rows", type=str, default="1000000,10000000")
    parser.add_argument("--spark-rows", type=str, default="10000000")
    parser.add_argument("--tumult-python", type=str, default=None)
    parser.add_argument("--tumult-driver-memory", type=str, default="8g")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", type=str, default="duckdb,scale,postgres,spark")
    parser.add_argument("--json", type=str, default=None)
    parser.add_argument("--child", type=str, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--parquet", type=str, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--case", type=str, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child = child_duckdb if args.child == "duckdb" else child_scale
        print(json.dumps(child(args)))
        return
    sections = set(args.only.split(","))
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="dpcurator-engines-") as tmp:
        folder = Path(tmp)
        if "duckdb" in sections:
            print(f"duckdb: {args.duckdb_rows:,} rows from Parquet ...", flush=True)
            report["duckdb"] = section_duckdb(args, folder)
        if "scale" in sections:
            print("scale: DuckDB from Parquet ...", flush=True)
            report["scale"] = section_scale(args, folder)
        for engine, sizes in (("postgres", args.postgres_rows), ("spark", args.spark_rows)):
            if engine in sections:
                report[engine] = {}
                for rows in (int(float(s)) for s in sizes.split(",") if s):
                    print(f"{engine}: {rows:,} rows ...", flush=True)
                    report[engine][rows] = section_script(engine, rows, args.repeats, folder)
                    if engine == "spark" and args.tumult_python:
                        print(f"tumult: {rows:,} rows ...", flush=True)
                        report.setdefault("tumult", {})[rows] = section_tumult(
                            args.tumult_python, rows, args.tumult_driver_memory)
    summary(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
