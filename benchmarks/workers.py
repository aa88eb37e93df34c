"""Cached answers from one worker and from several (``dpcurator serve --workers N``), in one run.

    .venv/bin/python benchmarks/workers.py                  # about 2 minutes on 2 cores
    .venv/bin/python benchmarks/workers.py --workers 4 --rounds 5 --seconds 5 --clients 50 \\
        --json benchmarks/results/workers.json

Two services are started on loopback, each over a SQLite ledger of its own: ``--workers 1``
and ``--workers N``. Round after round, the same load (``benchmarks/_http_load.py``: one
query released once, then ``--clients`` keep-alive connections sending it again for
``--seconds`` seconds) goes to one, then the other, so that drift in the machine's load falls
on both; each is reported by its median round. Every answer must be a 200 marked ``cached``:
with N workers, a worker that did not make the release finds it in the ledger's stored
releases once, then answers from its memory. Target: N workers at least as fast as one.

Also timed: one take of the shared per-analyst rate limit (a token from the bucket beside
the ledger; every authenticated request takes one), in this process, on SQLite, and on
PostgreSQL when ``--postgres URL`` names a server to use (a schema of its own is made).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from service import make_data, run_service_cached, write_config


def start(config: Path, workers: int) -> tuple[subprocess.Popen[bytes], str]:
    """``dpcurator serve --workers N`` on a free port, once every worker has started."""
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = config.parent / "serve.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "dpcurator", "serve", "--config", str(config), "--port",
         str(port), "--workers", str(workers), "--access-log", "off"],
        stdout=subprocess.DEVNULL, stderr=log.open("ab"))
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        if log.read_text(errors="replace").count("Application startup complete") >= workers:
            with urllib.request.urlopen(f"{url}/healthz", timeout=5):
                return process, url
        if process.poll() is not None:
            raise SystemExit(f"the service did not start: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    process.kill()
    raise SystemExit("the service did not start in 120 s")


def time_takes(target: str, n: int = 5000) -> float:
    """Microseconds per take of the shared rate limit beside the ledger ``target``."""
    from dpcurator.ledger import open_ledger, open_rate_buckets

    open_ledger(target).close()
    buckets = open_rate_buckets(target)
    try:
        for _ in range(100):
            buckets.take("bench", rate=1e9, burst=10**9)
        started = time.perf_counter()
        for _ in range(n):
            buckets.take("bench", rate=1e9, burst=10**9)
        return 1e6 * (time.perf_counter() - started) / n
    finally:
        buckets.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--postgres", default=None, help="a postgresql:// URL to time the "
                                                          "rate limit's take on too")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="dpcurator-workers-bench-"))
    counts = {"1 worker": 1, f"{args.workers} workers": args.workers}
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in counts}
    services = {}
    try:
        for name, n in counts.items():
            home = folder / f"w{n}"
            home.mkdir()
            services[name] = start(write_config(home, make_data(home, args.rows)), n)
        for _ in range(args.rounds):
            for name in counts:
                rounds[name].append(run_service_cached(services[name][1], args.clients,
                                                       args.seconds))
        takes = {"sqlite": time_takes(str(folder / "takes.sqlite"))}
        if args.postgres:
            separator = "&" if "?" in args.postgres else "?"
            takes["postgres"] = time_takes(
                f"{args.postgres}{separator}schema=bench_{secrets.token_hex(4)}")
    finally:
        for process, _ in services.values():
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
        shutil.rmtree(folder, ignore_errors=True)

    medians = {name: sorted(r, key=lambda x: x["qps"])[len(r) // 2] for name, r in
               rounds.items()}
    print(f"cached answers, {args.clients} clients, {args.rounds} rounds of {args.seconds:g} s "
          f"each (the median round)")
    print(f"{'service':12} {'queries/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'rounds':>30}")
    for name, row in medians.items():
        each = ", ".join(f"{r['qps']:.0f}" for r in rounds[name])
        print(f"{name:12} {row['qps']:10.0f} {row['p50_ms']:8.1f} {row['p99_ms']:8.1f} "
              f"{each:>30}")
    for where, micros in takes.items():
        print(f"one take of the shared rate limit ({where}): {micros:.1f} us")
    one, many = medians["1 worker"], medians[f"{args.workers} workers"]
    errors = sum(r["errors"] for rs in rounds.values() for r in rs)
    verdicts = [
        (f"{args.workers} workers >= 1 worker", many["qps"] >= one["qps"],
         f"{many['qps']:.0f} vs {one['qps']:.0f} queries/s "
         f"({many['qps'] / one['qps']:.2f}x)"),
        ("every answer a 200 marked cached", errors == 0, str(errors)),
    ]
    print()
    for text, ok, value in verdicts:
        print(f"{'PASS' if ok else 'FAIL'}  {text}: {value}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        slim = {name: [{k: v for k, v in r.items()} for r in rs] for name, rs in rounds.items()}
        args.json.write_text(json.dumps({
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
            "clients": args.clients, "seconds": args.seconds, "rounds": slim,
            "median": medians, "take_us": takes,
            "targets": [{"target": t, "pass": ok, "value": v} for t, ok, v in verdicts]},
            indent=2))


if __name__ == "__main__":
    main()
