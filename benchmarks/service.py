"""The curator service against the library in one process, on the same queries, in one run.

    .venv/bin/python benchmarks/service.py                  # about 2 minutes on 2 cores
    .venv/bin/python benchmarks/service.py --rows 1000000 --uncached 30 --seconds 10 \\
        --json benchmarks/results/service.json

Two measurements, each against its baseline in the same run:

- **Uncached queries** (each a new release, charged to the ledger, run by DuckDB over
  ``--rows`` rows): the same sequence of distinct queries through ``Curator.sql`` in this
  process, then through ``dp.connect(...).sql`` against ``dpcurator serve`` on loopback. The
  service's throughput over the library's is the ratio (target >= 0.8: the service adds little).
- **Cached answers** (a query already released, sent again, free): ``--clients`` concurrent
  clients for ``--seconds`` seconds, each a keep-alive HTTP/1.1 connection driven by asyncio
  streams in one process of their own (a thin client on purpose: httpx's pool, tried first,
  could not itself send more than a few hundred requests a second here). Target: >= 1,000
  queries/s with p99 < 100 ms under 50 clients.

Medians and percentiles are over all requests of a phase; queries/s is requests over wall time.
Needs the ``server`` extra (``.venv`` has it after ``scripts/test``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

TOKEN = "benchmark-token-0123456789"
CACHED_SQL = "SELECT region, COUNT(*) AS n, SUM(amount) AS total FROM data GROUP BY region"


def make_data(folder: Path, rows: int) -> Path:
    import duckdb

    path = folder / "orders.parquet"
    duckdb.sql(f"""COPY (SELECT (i * 7919) % {max(rows // 5, 1)} AS customer_id,
                         ['north', 'south', 'east', 'west'][1 + i % 4] AS region,
                         (i * 31) % 500 + 0.25 AS amount
                  FROM range({rows}) t(i)) TO '{path}' (FORMAT parquet)""")
    return path


def write_config(folder: Path, data: Path) -> Path:
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    config = folder / "curator.toml"
    config.write_text(f"""ledger = "ledger.sqlite"
[datasets.orders]
path = "{data.name}"
privacy_unit = "customer_id"
bounds = {{ amount = [0, 500] }}
max_partitions = 1
max_rows_per_partition = 1
keys = {{ region = ["north", "south", "east", "west"] }}
budget = {{ epsilon = 1e6 }}
[analysts.bench]
token_sha256 = "{digest}"
budgets = {{ orders = {{ epsilon = 1e6 }} }}
[limits]
requests_per_second = 1e9
burst = 1000000000
""")
    return config


def uncached_sql(i: int) -> str:
    return (f"SELECT region, COUNT(*) AS n_{i}, SUM(amount) AS total_{i}, AVG(amount) AS "
            f"mean_{i} FROM data GROUP BY region")


def percentiles(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {"p50_ms": 1000 * statistics.median(ordered),
            "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]}


def run_library(data: Path, n: int, offset: int) -> dict[str, Any]:
    import dpcurator as dp

    curator = dp.Curator(str(data), privacy_unit="customer_id", budget=dp.PureDP(1e6),
                         bounds={"amount": (0, 500)}, max_partitions=1,
                         max_rows_per_partition=1)  # the caps the service's config states
    keys = ["north", "south", "east", "west"]
    curator.sql(uncached_sql(offset - 1), epsilon=1.0, keys=keys)  # warm the engine
    times = []
    start = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        curator.sql(uncached_sql(offset + i), epsilon=1.0, keys=keys)
        times.append(time.perf_counter() - t0)
    wall = time.perf_counter() - start
    curator.close()
    return {"queries": n, "qps": n / wall, **percentiles(times)}


def run_service_uncached(url: str, n: int, offset: int) -> dict[str, Any]:
    import dpcurator as dp

    remote = dp.connect(url, TOKEN, dataset="orders")
    remote.sql(uncached_sql(offset - 1), epsilon=1.0)  # warm the service's engine
    times = []
    start = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        remote.sql(uncached_sql(offset + i), epsilon=1.0)
        times.append(time.perf_counter() - t0)
    wall = time.perf_counter() - start
    return {"queries": n, "qps": n / wall, **percentiles(times)}


def run_service_cached(url: str, clients: int, seconds: float) -> dict[str, Any]:
    client = Path(__file__).with_name("_http_load.py")
    done = subprocess.run([sys.executable, str(client), url, TOKEN, CACHED_SQL, str(clients),
                           str(seconds)], capture_output=True, text=True, check=True)
    result = json.loads(done.stdout)
    times = result["times"]
    return {"requests": len(times), "clients": clients, "errors": result["errors"],
            "qps": len(times) / result["wall"], **percentiles(times)}


def start_service(config: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cli = shutil.which("dpcurator", path=str(Path(sys.executable).parent)) or "dpcurator"
    process = subprocess.Popen([cli, "serve", "--config", str(config), "--port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1):
                return process, url
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit("the service did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--uncached", type=int, default=30, help="queries per side")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="dpcurator-service-bench-"))
    try:
        data = make_data(folder, args.rows)
        config = write_config(folder, data)
        process, url = start_service(config)
        try:
            # Interleaved halves, so that drift in the machine's load falls on both sides.
            half = args.uncached // 2
            library = [run_library(data, half, 1000)]
            service = [run_service_uncached(url, half, 2000)]
            library.append(run_library(data, args.uncached - half, 3000))
            service.append(run_service_uncached(url, args.uncached - half, 4000))
            cached = run_service_cached(url, args.clients, args.seconds)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    def merged(parts: list[dict[str, Any]]) -> dict[str, Any]:
        n = sum(p["queries"] for p in parts)
        return {"queries": n, "qps": n / sum(p["queries"] / p["qps"] for p in parts),
                "p50_ms": statistics.mean(p["p50_ms"] for p in parts),
                "p99_ms": max(p["p99_ms"] for p in parts)}

    lib, svc = merged(library), merged(service)
    ratio = svc["qps"] / lib["qps"]
    print(f"{args.rows:,} rows; {args.uncached} uncached queries per side; "
          f"{args.clients} clients for {args.seconds:g} s on the cached answer")
    print(f"{'case':32} {'queries/s':>10} {'p50 ms':>9} {'p99 ms':>9}")
    for name, row in (("library, uncached (in process)", lib),
                      ("service, uncached (HTTP)", svc), ("service, cached (HTTP)", cached)):
        print(f"{name:32} {row['qps']:10.1f} {row['p50_ms']:9.2f} {row['p99_ms']:9.2f}")
    verdicts = [
        ("uncached service / library >= 0.8", ratio >= 0.8, f"{ratio:.2f}"),
        ("cached >= 1000 queries/s", cached["qps"] >= 1000, f"{cached['qps']:.0f}"),
        ("cached p99 < 100 ms", cached["p99_ms"] < 100, f"{cached['p99_ms']:.1f} ms"),
        ("cached answers all 200 and cached", cached["errors"] == 0, str(cached["errors"])),
    ]
    print()
    for text, ok, value in verdicts:
        print(f"{'PASS' if ok else 'FAIL'}  {text}: {value}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
            "rows": args.rows, "library": library, "service": service, "cached": cached,
            "ratio": ratio, "targets": [{"target": t, "pass": ok, "value": v}
                                        for t, ok, v in verdicts]}, indent=2))


if __name__ == "__main__":
    main()
