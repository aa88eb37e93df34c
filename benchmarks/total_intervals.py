"""Total intervals: how often COUNT(*)'s interval covers the count *without* the caps.

Issue 14, part 5. Two data sets, each query asked ``--runs`` times with the caps (and a
SUM's clamping bounds) chosen from the data, so each run chooses them and its outer cap
afresh:

- the demo's orders (``dpcurator demo``: 20,000 customers, a Pareto tail of very active
  ones): orders and revenue (SUM(amount)) per region, epsilon 0.4, one region per customer
  (as the demo's first query);
- the skewed generator (``skewed.py``: many units with 1-3 rows, 3% with 100-600): rows and
  SUM(amount) per category, epsilon 1.

For each: the coverage of the ``total`` intervals and of the ``bounded`` ones against the true
unbounded answers, their median widths, and the outer caps chosen. Run:

    .venv/bin/python benchmarks/total_intervals.py --runs 200        # about two minutes

Target: total intervals cover >= 95% where bounded ones almost never do.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
import dpcurator as dp
from dpcurator.cli.demo_curator import REGIONS, shop_orders
from skewed import categories, skewed_table


def measure(table: pd.DataFrame, unit: str, column: str, keys: list[str], epsilon: float,
            runs: int, value: str | None = None, **options: Any) -> dict[str, Any]:
    """COUNT(*) per ``column`` (or SUM(``value``), its bounds chosen from the data too)."""
    grouped = table.groupby(column)
    truth = (grouped.size() if value is None else grouped[value].sum()).reindex(
        keys, fill_value=0).to_numpy(float)
    aggregate = "COUNT(*)" if value is None else f"SUM({value})"
    curator = dp.Curator.from_pandas(table, privacy_unit=unit,
                                     budget=dp.PureDP(epsilon * runs * 2), cache=False)
    covered = {"total": 0, "bounded": 0}
    widths: dict[str, list[float]] = {"total": [], "bounded": []}
    outers: Counter[float] = Counter()
    for _ in range(runs):
        release = curator.sql(f"SELECT {column}, {aggregate} AS n FROM data GROUP BY {column}",
                              epsilon=epsilon, keys=keys, **options)
        # a COUNT(*)'s total interval is beside its value; a SUM's total is its own column
        assert release.interval_kinds["n"] == ("total" if value is None else "bounded")
        outers[float(release.max_unit_rows or 0) if value is None
               else release.max_unit_sums[value]] += 1
        for kind in ("total", "bounded"):
            low, high = release.interval("n", kind=kind)
            covered[kind] += int(np.sum((low <= truth) & (truth <= high)))
            widths[kind].extend((high - low).tolist())
    intervals = runs * len(keys)
    return {"intervals": intervals,
            "coverage": {k: v / intervals for k, v in covered.items()},
            "median_width": {k: float(np.median(v)) for k, v in widths.items()},
            "median_true_count": float(np.median(truth)),
            "outer_caps": dict(sorted(outers.items()))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--units", type=int, default=50_000, help="skewed generator's units")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    orders, skewed = shop_orders(), skewed_table(args.units)
    results = {
        "demo orders per region (epsilon 0.4)": measure(
            orders, "customer_id", "region", REGIONS, 0.4, args.runs, max_partitions=1),
        "demo revenue per region, SUM(amount) (epsilon 0.4)": measure(
            orders, "customer_id", "region", REGIONS, 0.4, args.runs, "amount",
            max_partitions=1),
        f"skewed rows per category ({args.units:,} units, epsilon 1)": measure(
            skewed, "user", "category", categories(8), 1.0, args.runs),
        f"skewed SUM(amount) per category ({args.units:,} units, epsilon 1)": measure(
            skewed, "user", "category", categories(8), 1.0, args.runs, "amount"),
    }
    for name, result in results.items():
        print(f"{name}: {result['intervals']:,} intervals")
        print(f"  coverage of the true count: total {result['coverage']['total']:.3f}, "
              f"bounded {result['coverage']['bounded']:.3f}")
        print(f"  median width: total {result['median_width']['total']:,.0f}, bounded "
              f"{result['median_width']['bounded']:,.0f} (median true count "
              f"{result['median_true_count']:,.0f})")
        print(f"  outer caps chosen: {result['outer_caps']}")  # rows, or sums of |amount|
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
