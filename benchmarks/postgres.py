"""DP count and sum per category on PostgreSQL: dpcurator against PostgreSQL's own floors.

    .venv/bin/python benchmarks/postgres.py [--rows 1000000] [--units 100000]
        [--categories 1000] [--repeats 5] [--url postgresql://...] [--work-mem 256MB]
        [--parallel 0] [--json out.json]

Without ``--url`` a throwaway server is started (initdb into a temporary folder, as the test
suite does; stopped at the end) with ``work_mem`` and ``max_parallel_workers_per_gather`` as
given, so that the comparison is the same on every machine; with ``--url`` the table is made
in a schema of its own on that server (dropped at the end) and its settings are used.

The data and the question are those of benchmarks/query.py: ``rows`` rows of (user_id,
category, value), user_id uniform over ``units`` users, category skewed (category 0 holds
about 10% of the rows), value uniform in [0, 100); per category a DP count and a DP sum of
value clamped to [0, 100], each user in at most 5 categories with at most 2 rows in each,
epsilon = 1. Timed round-robin in one process, medians, with each case's per-round ratio to
the two-level floor ("paired"):

- ``floor: GROUP BY category``: the plain non-private aggregate;
- ``floor: two-level``: GROUP BY user, category, then GROUP BY category -- the least work any
  per-user bounding must do (the issue's yardstick: the DP query within 2x of it);
- ``dpcurator``: ``Curator.sql`` end to end (compile once, bounding and exact sums in
  PostgreSQL, noise in Python), with public keys (rescale), private keys (partition
  selection) and ``bounding="sample"``.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _rounds import ratios, time_rounds

SQL = "SELECT category, COUNT(*) AS n, SUM(value) AS total FROM data GROUP BY category"


def make_table(con: Any, table: str, rows: int, units: int, categories: int) -> None:
    """The benchmark table, generated in PostgreSQL (deterministic: hashes of the row number;
    the same distributions as benchmarks/query.py, not the same rows)."""
    con.execute(f"DROP TABLE IF EXISTS {table}")
    con.execute(f"""
        CREATE TABLE {table} AS
        SELECT (abs(hashint8(i * 3 + 1)) % {units})::bigint AS user_id,
               least({categories - 1}, floor(power({float(categories)},
                     (abs(hashint8(i * 3 + 2)) % 1000000) / 1000000.0)) - 1)::integer
                   AS category,
               ((abs(hashint8(i * 3 + 3)) % 100000) / 1000.0)::double precision AS value
        FROM generate_series(1, {rows}) AS t(i)""")
    con.execute(f"VACUUM ANALYZE {table}")


def _binaries() -> Path:
    found = shutil.which("pg_ctl")
    folders = [Path(os.path.realpath(found)).parent] if found else []
    folders += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    for folder in folders:
        if all((folder / t).is_file() for t in ("initdb", "pg_ctl", "postgres")):
            return folder
    raise SystemExit("no PostgreSQL server binaries found: give --url")


@contextmanager
def local_server(work_mem: str, parallel: int) -> Iterator[str]:
    """A throwaway server (run as the 'postgres' user when this process is root)."""
    import socket

    binaries = _binaries()
    folder = Path(tempfile.mkdtemp(prefix="dpcurator-bench-pg-"))
    os.chmod(folder, 0o777)
    ids: dict[str, Any] = {}
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        ids = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = folder / "data"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
    subprocess.run([str(binaries / "initdb"), "-D", str(data), "-U", "postgres",
                    "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"], check=True,
                   capture_output=True, env=env, cwd=folder, **ids)
    options = (f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories="
               f"{folder} -c shared_buffers=512MB -c work_mem={work_mem} "
               f"-c max_parallel_workers_per_gather={parallel} -c fsync=off")
    subprocess.run([str(binaries / "pg_ctl"), "start", "-D", str(data), "-w", "-l",
                    str(folder / "log"), "-o", options], check=True, capture_output=True,
                   env=env, cwd=folder, **ids)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([str(binaries / "pg_ctl"), "stop", "-D", str(data), "-m", "fast"],
                       capture_output=True, env=env, cwd=folder, **ids)
        shutil.rmtree(folder, ignore_errors=True)


def cases(con: Any, url: str, table: str, categories: int) -> dict[str, Callable[[], Any]]:
    import dpcurator as dp

    def plain(sql: str) -> Callable[[], Any]:
        return lambda: con.execute(sql).fetchall()

    curator = dp.Curator.from_postgres(
        url, table, privacy_unit="user_id", budget=dp.ApproxDP(1e12, 0.5), cache=False,
        bounds={"value": (0, 100)}, max_partitions=5, max_rows_per_partition=2,
        allow_large_delta=True)
    keys = list(range(categories))
    return {
        "floor: GROUP BY category": plain(
            f"SELECT category, count(*), sum(value) FROM {table} GROUP BY category"),
        "floor: two-level": plain(
            f"SELECT category, sum(c), sum(s) FROM (SELECT user_id, category, count(*) AS c, "
            f"sum(value) AS s FROM {table} GROUP BY user_id, category) AS p GROUP BY category"),
        "dpcurator (public keys)": lambda: curator.sql(SQL, epsilon=1.0, keys=keys),
        "dpcurator (private keys)": lambda: curator.sql(SQL, epsilon=1.0, delta=1e-6),
        "dpcurator (bounding=sample)": lambda: curator.sql(SQL, epsilon=1.0, keys=keys,
                                                           bounding="sample"),
    }


def run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    import psycopg

    schema = f"bench_{os.getpid()}"
    con = psycopg.connect(url, autocommit=True)
    con.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    table = f"{schema}.data"
    try:
        start = time.perf_counter()
        make_table(con, table, args.rows, args.units, args.categories)
        pairs = con.execute(f"SELECT count(*) FROM (SELECT DISTINCT user_id, category "
                            f"FROM {table}) AS d").fetchone()
        print(f"generated {args.rows:,} rows ({pairs[0] if pairs else 0:,} user-category "
              f"pairs) in {time.perf_counter() - start:.1f}s", flush=True)
        settings = {name: con.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
                    for name in ("server_version", "work_mem",
                                 "max_parallel_workers_per_gather")}
        timed = cases(con, url, table, args.categories)
        times = time_rounds(timed, args.repeats)
    finally:
        con.execute(f"DROP SCHEMA {schema} CASCADE")
        con.close()
    report: dict[str, Any] = {"settings": settings, "rows": args.rows, "units": args.units,
                              "categories": args.categories,
                              "cases": ratios(times, "floor: two-level")}
    print(f"(PostgreSQL {settings['server_version']}, work_mem {settings['work_mem']}, "
          f"max_parallel_workers_per_gather {settings['max_parallel_workers_per_gather']})")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--units", type=int, default=None, help="default: rows / 10")
    parser.add_argument("--categories", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--url", type=str, default=None)
    parser.add_argument("--work-mem", type=str, default="256MB")
    parser.add_argument("--parallel", type=int, default=0,
                        help="max_parallel_workers_per_gather of the throwaway server")
    parser.add_argument("--json", type=str, default=None)
    args = parser.parse_args()
    args.units = args.units or max(1, args.rows // 10)
    if args.url:
        report = run(args.url, args)
    else:
        with local_server(args.work_mem, args.parallel) as url:
            report = run(url, args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    sys.exit(main())
