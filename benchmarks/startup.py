"""Start-up cost: how long ``import dpcurator`` and the ``dpcurator`` command take to begin.

Every command pays its imports before it does anything, so they are measured here as whole
processes, each against baselines timed in the same run, round-robin (so load from other
processes falls on every case alike): the bare interpreter (``python -c pass``) and
``python -c "import duckdb"`` (the engine every query needs anyway).

    .venv/bin/python benchmarks/startup.py                 # about 30 s on 2 cores
    .venv/bin/python benchmarks/startup.py --repeats 21 --json benchmarks/results/startup.json

Targets (issue 11), on the medians: ``dpcurator --help`` <= 3x ``import duckdb``,
``import dpcurator`` <= 0.5 s, ``dpcurator account convert`` <= 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

PYTHON = sys.executable
CLI = shutil.which("dpcurator", path=str(Path(PYTHON).parent)) or "dpcurator"

CASES: dict[str, list[str]] = {
    "python -c pass": [PYTHON, "-c", "pass"],
    "import duckdb": [PYTHON, "-c", "import duckdb"],
    "import dpcurator": [PYTHON, "-c", "import dpcurator"],
    "import dpcurator; dp.Curator": [PYTHON, "-c", "import dpcurator as dp; dp.Curator"],
    "dpcurator --help": [CLI, "--help"],
    "dpcurator account convert": [CLI, "account", "convert", "--from", "zcdp", "--rho", "0.5",
                                  "--delta", "1e-6", "--json"],
    "dpcurator ledger --help": [CLI, "ledger", "--help"],
}

TARGETS = [  # (case, baseline or None for seconds, limit)
    ("dpcurator --help", "import duckdb", 3.0),
    ("import dpcurator", None, 0.5),
    ("dpcurator account convert", None, 1.0),
]


def time_once(command: list[str]) -> float:
    start = time.perf_counter()
    # As a user runs it: bytecode may be written (the warm-up pass writes what is missing).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                          check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {done.stderr.decode()[-500:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    for command in CASES.values():  # warm the file cache and the bytecode
        time_once(command)
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.repeats):
        for name, command in CASES.items():
            times[name].append(time_once(command))
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    width = max(map(len, CASES))
    print(f"{'case':{width}}  median s   min s   x duckdb import")
    for name in CASES:
        print(f"{name:{width}}  {medians[name]:8.3f}  {min(times[name]):6.3f}  "
              f"{medians[name] / medians['import duckdb']:8.2f}")
    print()
    verdicts = []
    for case, baseline, limit in TARGETS:
        if baseline is None:
            value, text = medians[case], f"{medians[case]:.3f} s (target <= {limit} s)"
        else:
            value = medians[case] / medians[baseline]
            text = f"{value:.2f}x {baseline} (target <= {limit}x)"
        ok = value <= limit
        verdicts.append({"case": case, "value": value, "limit": limit, "pass": ok})
        print(f"{'PASS' if ok else 'FAIL'}  {case}: {text}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                        "platform": platform.platform()},
            "repeats": args.repeats, "times": times, "medians": medians,
            "targets": verdicts}, indent=2))


if __name__ == "__main__":
    main()
