"""The TPC-H join questions of benchmarks/joins.py on PostgreSQL and Spark, each against its
own floor: the same join with the same per-customer caps written by hand in its SQL.

    .venv/bin/python benchmarks/joins_engines.py --engine postgres [--scale 0.1]
        [--repeats 5] [--url postgresql://...] [--json out.json]
    .venv/bin/python benchmarks/joins_engines.py --engine spark [--scale 0.1] [--master local[2]]

The issue's target is dpcurator within 2x of that floor on each engine, at scale 0.1 to 1.
PostgreSQL: without ``--url`` a throwaway server is started (benchmarks/postgres.py's, with
``work_mem`` 256MB, no parallel workers) and the four tables are copied into it from the
Parquet files (primary keys and ``ANALYZE``, as a database holding them would have them).
Spark: the Parquet files are read and cached in memory (``local[2]`` by default). The
questions, caps and hand-written floor are benchmarks/joins.py's; timed round-robin
(``_rounds``), medians, paired per round.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from _rounds import ratios, time_rounds
from joins import JOIN, PRICE, QUESTIONS, ROWS, UNITS, dp_sql, generate, hand_sql

# PostgreSQL's types for the TPC-H columns DuckDB reads from the Parquet files
_PG_TYPES = {"BIGINT": "bigint", "INTEGER": "integer", "VARCHAR": "text", "DATE": "date",
             "DOUBLE": "double precision"}
_KEYS = {"customer": "c_custkey", "orders": "o_orderkey", "nation": "n_nationkey"}


def _pg_type(duckdb_type: str) -> str:
    if duckdb_type.startswith("DECIMAL"):
        return "numeric" + duckdb_type[len("DECIMAL"):]
    return _PG_TYPES[duckdb_type]


def load_postgres(url: str, schema: str, paths: dict[str, str]) -> dict[str, str]:
    """The tables copied into ``schema`` of the database (CSV through COPY)."""
    import duckdb
    import psycopg

    names = {}
    with psycopg.connect(url, autocommit=True) as con:
        con.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        for table, path in paths.items():
            described = duckdb.sql(f"DESCRIBE SELECT * FROM read_parquet('{path}')").fetchall()
            columns = ", ".join(f"{name} {_pg_type(kind)}" for name, kind, *_ in described)
            name = f"{schema}.{table}"
            con.execute(f"DROP TABLE IF EXISTS {name}")
            con.execute(f"CREATE TABLE {name} ({columns})")
            csv = Path(path).with_suffix(".csv")
            if not csv.exists():
                duckdb.sql(f"COPY (SELECT * FROM read_parquet('{path}')) TO '{csv}' "
                           "(HEADER, DELIMITER ',')")
            with con.cursor() as cur, cur.copy(
                    f"COPY {name} FROM STDIN (FORMAT csv, HEADER true)") as copy, \
                    open(csv, "rb") as data:
                while chunk := data.read(1 << 20):
                    copy.write(chunk)
            if table in _KEYS:
                con.execute(f"ALTER TABLE {name} ADD PRIMARY KEY ({_KEYS[table]})")
            con.execute(f"ANALYZE {name}")
            names[table] = name
    return names


def questions(curator: Any, fetch: Any, hashed: str, double: str
              ) -> dict[str, dict[str, Any]]:
    """Each question's cases: the plain join, the caps by hand, dpcurator with those caps."""
    out = {}
    for number, (name, aggregate, group, public, k) in enumerate(QUESTIONS, start=1):
        value = "count(*)" if aggregate == "count" else \
            f"sum(CAST(l_extendedprice AS {double}))"
        plain = f"SELECT {group}, {value} {JOIN} GROUP BY {group}"
        hand = hand_sql(aggregate, group, k, public, hashed=hashed, double=double)
        keys = sorted(row[0] for row in fetch(plain)) if public else None
        privacy: dict[str, Any] = {"epsilon": 1.0} if public else {"epsilon": 1.0,
                                                                     "delta": 1e-6}
        options: dict[str, Any] = {"keys": keys, "max_partitions": k,
                                   "max_rows_per_partition": ROWS}
        if aggregate == "sum":
            options["bounds"] = {"l_extendedprice": PRICE}
        sql = dp_sql(aggregate, group)
        out[f"#{number} {name}"] = {
            "plain": lambda plain=plain: fetch(plain),
            "by hand": lambda hand=hand: fetch(hand),
            "dpcurator": lambda sql=sql, options=options, privacy=privacy: curator.sql(
                sql, **options, **privacy),
        }
    return out


def run_postgres(args: argparse.Namespace, paths: dict[str, str]) -> dict[str, Any]:
    import contextlib

    import psycopg

    import dpcurator as dp
    from postgres import local_server

    server = contextlib.nullcontext(args.url) if args.url else local_server("256MB", 0)
    results = {}
    with server as url:
        start = time.perf_counter()
        tables = load_postgres(url, f"tpch_{os.getpid()}", paths)
        print(f"loaded into PostgreSQL in {time.perf_counter() - start:.1f} s", flush=True)
        con = psycopg.connect(url, autocommit=True)
        schema = next(iter(tables.values())).split(".")[0]
        con.execute(f"SET search_path TO {schema}")  # the plain SQL names tables alone
        curator = dp.Curator.from_postgres(
            url, tables, privacy_unit=UNITS, public=["nation"], budget=dp.ApproxDP(1e9, 0.5),
            cache=False, auto_bounds=False, allow_large_delta=True)
        try:
            for name, cases in questions(
                    curator, lambda q: con.execute(q).fetchall(),
                    "hashtext(u::text || '|' || g::text)", "DOUBLE PRECISION").items():
                print(f"\n{name}")
                results[name] = ratios(time_rounds(cases, args.repeats), "by hand")
        finally:
            curator.close()
            con.execute(f"DROP SCHEMA {schema} CASCADE")
            con.close()
    return results


def run_spark(args: argparse.Namespace, paths: dict[str, str]) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    import dpcurator as dp

    spark = (SparkSession.builder.master(args.master).appName("dpcurator-joins")
             .config("spark.driver.memory", "6g").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    results = {}
    try:
        frames = {t: spark.read.parquet(p).cache() for t, p in paths.items()}
        for table, frame in frames.items():
            frame.createOrReplaceTempView(table)
            frame.count()
        curator = dp.Curator.from_spark(
            frames, privacy_unit=UNITS, public=["nation"], budget=dp.ApproxDP(1e9, 0.5),
            cache=False, auto_bounds=False, allow_large_delta=True)
        for name, cases in questions(curator, lambda q: spark.sql(q).collect(),
                                     "hash(u, g)", "DOUBLE").items():
            print(f"\n{name}")
            results[name] = ratios(time_rounds(cases, args.repeats), "by hand")
    finally:
        spark.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("postgres", "spark"), required=True)
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--url", type=str, default=None)
    parser.add_argument("--master", type=str, default="local[2]")
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    folder = args.data or Path(__file__).parent / "results" / f"tpch-sf{args.scale:g}"
    paths = generate(args.scale, folder)
    results = run_postgres(args, paths) if args.engine == "postgres" else \
        run_spark(args, paths)
    print(f"\n{args.engine}, scale {args.scale:g}: dpcurator / by hand (paired median)")
    for name, cases in results.items():
        print(f"{name:30s} {cases['dpcurator']['paired']:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"engine": args.engine, "scale": args.scale,
                                         "questions": results}, indent=2))


if __name__ == "__main__":
    main()
