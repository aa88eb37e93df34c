"""The dashboard's pages and the API calls each makes, with a long history in the ledger.

    .venv/bin/python benchmarks/dashboard.py                   # about a minute on 2 cores
    .venv/bin/python benchmarks/dashboard.py --releases 10000 --repeats 30 \\
        --json benchmarks/results/dashboard.json

One analyst's ``--releases`` answered requests are written into a fresh SQLite ledger the way
the service records them (a charge to the analyst's and the dataset's accounts, the request,
its stored release: four hash-chained entries each, so 10,000 releases are 40,000 entries),
then ``dpcurator serve`` answers on loopback (a process of its own) and each call
below is made ``--repeats`` times over one keep-alive connection; the median and 90th
percentile are printed. A page's time is the sum of the medians of the calls it makes (the
browser makes some of them at once, so this is an upper bound). Target: every page < 300 ms
(issue 28): the history and the ledger are read one page at a time, however long they are.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ANALYST, OWNER = "bench-analyst-token-0123456789", "bench-owner-token-0123456789"
SQL = "SELECT region, COUNT(*) AS n, SUM(amount) AS total FROM data GROUP BY region"
TARGET_MS = 300.0


def write_config(folder: Path) -> Path:
    shutil.copy(ROOT / "examples" / "orders.csv", folder / "orders.csv")
    config = folder / "curator.toml"
    config.write_text(f"""ledger = "ledger.sqlite"
verify_every_s = 86400
[datasets.orders]
path = "orders.csv"
privacy_unit = "customer_id"
bounds = {{ amount = [0, 500] }}
keys = {{ region = ["north", "south", "east", "west"] }}
budget = {{ epsilon = 1000000.0 }}
[analysts.alice]
token_sha256 = "{hashlib.sha256(ANALYST.encode()).hexdigest()}"
budgets = {{ orders = {{ epsilon = 1000000.0 }} }}
[owners.olga]
token_sha256 = "{hashlib.sha256(OWNER.encode()).hexdigest()}"
[limits]
requests_per_second = 100000
burst = 100000
address_requests_per_second = 100000
address_burst = 100000
""")
    return config


def fill_ledger(config: Path, releases: int) -> tuple[list[str], int, float]:
    """``releases`` answered requests of alice, each with a real release's JSON (one made by
    the service first, then stored again under every request)."""
    from fastapi.testclient import TestClient

    from dpcurator.accounting import PureDP
    from dpcurator.server import Service, create_app, load_config

    service = Service(load_config(config))
    with TestClient(create_app(service)) as client:
        made = client.post("/v1/datasets/orders/queries", json={"sql": SQL, "epsilon": 0.5},
                           headers={"Authorization": f"Bearer {ANALYST}"}).json()
    release = json.dumps({k: v for k, v in made.items()
                          if k not in ("query_id", "cached", "remaining")})
    started = time.perf_counter()
    ids = [made["query_id"]]
    for i in range(releases - 1):
        reserved = service.ledger.reserve(
            [("analyst/alice/orders", PureDP(0.01)), ("dataset/orders", PureDP(0.01))],
            analyst="alice", dataset="orders", fingerprint=f"bench-{i}",
            label=f"alice: {SQL} -- {i}")
        service.ledger.store_release(reserved.request.id, release)
        ids.append(reserved.request.id)
    took = time.perf_counter() - started
    head = service.ledger.head()[0]
    service.close()
    return ids, head, took


class Served:
    """``python -m dpcurator serve`` in a process of its own, on a free loopback port (the
    ledger already filled: ``open_s`` includes verifying its whole chain at start)."""

    def __init__(self, config: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        started = time.perf_counter()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dpcurator", "serve", "--config", str(config), "--port",
             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while True:
            if self.process.poll() is not None:
                raise RuntimeError("dpcurator serve exited")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1):
                    break
            except OSError:
                time.sleep(0.05)
        self.open_s = time.perf_counter() - started

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def measure(client: Any, method: str, path: str, token: str | None, body: Any,
            repeats: int) -> list[float]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        answer = client.request(method, path, headers=headers, json=body)
        took = (time.perf_counter() - started) * 1000
        if answer.status_code != 200:
            raise RuntimeError(f"{method} {path}: {answer.status_code} {answer.text[:200]}")
        times.append(took)
    return times[1:]  # the first warms the connection and the caches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--releases", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import httpx

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config = write_config(folder)
        ids, head, fill_s = fill_ledger(config, args.releases)
        served = Served(config)
        print(f"{args.releases} releases, {head} ledger entries (filled in {fill_s:.1f} s; "
              f"dpcurator serve started and verified them in {served.open_s:.1f} s)")
        ds = "/v1/datasets/orders"
        middle = ids[len(ids) // 2]
        explain = {"sql": SQL, "epsilon": 0.5}
        calls: dict[str, tuple[str, str, str | None, Any]] = {
            "GET /": ("GET", "/", None, None),
            "GET /static/app/main.js": ("GET", "/static/app/main.js", None, None),
            "GET chart.umd.min.js": ("GET", "/static/vendor/chart.umd.min.js", None, None),
            "GET /v1/whoami": ("GET", "/v1/whoami", ANALYST, None),
            "GET /v1/datasets": ("GET", "/v1/datasets", ANALYST, None),
            "GET budget": ("GET", f"{ds}/budget", ANALYST, None),
            "GET ledger?limit=500": ("GET", f"{ds}/ledger?limit=500", ANALYST, None),
            "GET history?limit=20": ("GET", f"{ds}/history?limit=20", ANALYST, None),
            "GET history?limit=20&before=(middle)": (
                "GET", f"{ds}/history?limit=20&before={middle}", ANALYST, None),
            "GET queries/{id} (replay)": ("GET", f"{ds}/queries/{middle}", ANALYST, None),
            "POST explain": ("POST", f"{ds}/explain", ANALYST, explain),
            "GET /v1/posterior": ("GET", "/v1/posterior?epsilon=1&delta=1e-6", ANALYST, None),
            "GET /v1/owner/overview": ("GET", "/v1/owner/overview", OWNER, None),
            "GET /v1/owner/audit?limit=200": ("GET", "/v1/owner/audit?limit=200", OWNER,
                                              None),
        }
        pages = {
            "sign-in (page, scripts, whoami)": ["GET /", "GET /static/app/main.js",
                                                "GET chart.umd.min.js", "GET /v1/whoami"],
            "datasets (budgets, spent over time)": ["GET /v1/datasets", "GET budget",
                                                    "GET ledger?limit=500"],
            "history (newest page)": ["GET history?limit=20"],
            "history (a page in the middle)": ["GET history?limit=20&before=(middle)"],
            "release (and its free replay)": ["GET queries/{id} (replay)"],
            "ask (budget, explain)": ["GET budget", "POST explain"],
            "what ε means (budget, posterior, 6 explains)": (
                ["GET budget", "GET /v1/posterior"] + ["POST explain"] * 6),
            "owner (overview, audit)": ["GET /v1/owner/overview",
                                        "GET /v1/owner/audit?limit=200"],
        }
        results: dict[str, dict[str, float]] = {}
        try:
            with httpx.Client(base_url=served.url, timeout=60) as client:
                for name, (method, path, token, body) in calls.items():
                    times = measure(client, method, path, token, body, args.repeats)
                    results[name] = {"median_ms": statistics.median(times),
                                     "p90_ms": statistics.quantiles(times, n=10)[-1]}
        finally:
            served.close()

    print(f"\n{'call':<42} {'median ms':>10} {'p90 ms':>9}")
    for name, row in results.items():
        print(f"{name:<42} {row['median_ms']:>10.2f} {row['p90_ms']:>9.2f}")
    print(f"\n{'page (sum of its calls medians)':<48} {'ms':>8}  target < {TARGET_MS:.0f} ms")
    page_ms = {}
    for name, used in pages.items():
        page_ms[name] = sum(results[c]["median_ms"] for c in used)
        verdict = "PASS" if page_ms[name] < TARGET_MS else "FAIL"
        print(f"{name:<48} {page_ms[name]:>8.1f}  {verdict}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "releases": args.releases, "entries": head, "repeats": args.repeats,
            "calls": results, "pages_ms": page_ms, "machine": platform.platform(),
            "python": sys.version.split()[0]}, indent=1))


if __name__ == "__main__":
    main()
