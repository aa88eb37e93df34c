"""The curator part of ``dpcurator demo``: DP answers about a shop's orders, next to the truth.

The dataset is generated deterministically here (a seeded generator draws *the data*, not any
noise): 20,000 customers in five regions place about 100,000 orders in eight categories, a
few customers order far more than the rest, and one customer alone invents a category
("Escargots") that must not appear in a private release. A curator holding a budget of
(1, 1e-6)-DP answers three questions; each answer is shown with its interval, the true value
(which only the data owner can see) and the error, and the budget before and after.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["demo_curator", "shop_orders"]

REGIONS = ["north", "south", "east", "west", "centre"]
CATEGORIES = ["books", "food", "games", "garden", "music", "sports", "toys", "travel"]


def shop_orders(customers: int = 20_000, seed: int = 2024) -> pd.DataFrame:
    """The demo's orders table (deterministic for a given seed)."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    activity = rng.pareto(1.5, customers) + 1.0  # a few very active customers
    orders = np.minimum(np.round(activity * 3).astype(int), 400)
    customer = np.repeat(np.arange(customers), orders)
    home = rng.choice(len(REGIONS), customers, p=[0.3, 0.25, 0.2, 0.15, 0.1])
    age = rng.integers(18, 90, customers)
    n = customer.size
    weights = np.array([0.22, 0.2, 0.14, 0.1, 0.1, 0.1, 0.08, 0.06])
    frame = pd.DataFrame({
        "customer_id": customer,
        "region": np.array(REGIONS)[home[customer]],
        "category": np.array(CATEGORIES)[rng.choice(len(CATEGORIES), n, p=weights)],
        "amount": np.round(rng.lognormal(3.5, 0.8, n), 2),
        "age": age[customer],
    })
    snail = pd.DataFrame({"customer_id": [customers] * 3, "region": ["west"] * 3,
                          "category": ["Escargots"] * 3, "amount": [89.0, 120.5, 64.0],
                          "age": [71] * 3})
    return pd.concat([frame, snail], ignore_index=True)


def _rows(release: Any, truth: pd.DataFrame, names: list[str]) -> list[dict[str, Any]]:
    intervals = release.intervals()
    kinds = release.interval_kinds
    bounded = {n: release.interval(n, kind="bounded") for n in names if kinds[n] == "total"}
    out = []
    for i, key in enumerate(release.keys):
        row: dict[str, Any] = dict(zip(release.group_columns, key, strict=True))
        for name in names:
            exact = float(truth.loc[key if len(key) != 1 else key[0], name]) if len(key) else \
                float(truth[name].iloc[0])
            value = float(release.values[name][i])
            low, high = intervals[name]
            row[name] = {"dp": value, "interval": [float(low[i]), float(high[i])],
                         "interval_kind": kinds[name], "true": exact, "error": value - exact}
            if name in bounded:  # the capped count's interval, for its width
                b_low, b_high = bounded[name]
                row[name]["bounded_interval"] = [float(b_low[i]), float(b_high[i])]
        out.append(row)
    return out


def demo_curator(*, as_json: bool = False, customers: int = 20_000, seed: int = 2024,
                 print_output: bool = True, console: Any = None) -> dict[str, Any]:
    """Run the curator demo; print a rich report (or JSON) and return the results.

    ``console``: the rich ``Console`` to print on (default: a new one on stdout); every table
    fits 80 columns."""
    import pandas as pd

    import dpcurator as dp
    from dpcurator.curator import Curator

    orders = shop_orders(customers, seed)
    curator = Curator(orders, privacy_unit="customer_id", budget=dp.ApproxDP(1.0, 1e-6),
                      bounds={"amount": (0, 300), "age": (18, 90)})
    before = curator.remaining
    results: dict[str, Any] = {"dataset": {"orders": len(orders), "customers": customers + 1},
                               "budget_before": {"epsilon": before.epsilon,
                                                 "delta": before.delta},
                               "note": "each interval covers the bounded answer (after "
                                       "each customer's contribution is capped); the true "
                                       "value is without the caps, so the error column "
                                       "includes that bias (a column marked CI* would have "
                                       "a total interval, covering the uncapped answer)",
                               "queries": []}

    # 1. Orders and average basket per region: the regions are public; a customer lives in
    # one region; how many orders of a customer count is chosen from the data, under DP.
    sql1 = ("SELECT region, COUNT(*) AS orders, AVG(amount) AS avg_amount FROM data "
            "GROUP BY region")
    r1 = curator.sql(sql1, epsilon=0.4, keys=REGIONS, max_partitions=1,
                     max_rows_per_partition="auto")
    bounded = orders.assign(amount=orders["amount"].clip(0, 300))
    truth1 = bounded.groupby("region").agg(orders=("amount", "size"),
                                           avg_amount=("amount", "mean"))
    chosen = r1.bounds_chosen or {}
    results["queries"].append({"sql": sql1, "spent": str(r1.privacy),
                               "bounds_chosen": {k: v for k, v in chosen.items()
                                                 if k != "method"},
                               "max_unit_rows": r1.max_unit_rows,
                               "rows": _rows(r1, truth1, ["orders", "avg_amount"])})

    # 2. Customers per category: categories are free text, so they are selected privately.
    sql2 = ("SELECT category, COUNT(DISTINCT customer_id) AS customers FROM data "
            "GROUP BY category")
    r2 = curator.sql(sql2, epsilon=0.4, delta=1e-6, max_partitions=len(CATEGORIES))
    truth2 = orders.groupby("category").agg(customers=("customer_id", "nunique"))
    released = {k[0] for k in r2.keys}
    results["queries"].append({
        "sql": sql2, "spent": str(r2.privacy),
        "rows": _rows(r2, truth2, ["customers"]),
        "escargots_released": "Escargots" in released,
    })

    # 3. Median customer age of big spenders.
    sql3 = "SELECT MEDIAN(age) AS median_age FROM data WHERE amount >= 100"
    r3 = curator.sql(sql3, epsilon=0.2, max_rows_per_partition=5)
    truth3 = pd.DataFrame({"median_age": [float(orders.loc[orders.amount >= 100, "age"]
                                                .median())]})
    results["queries"].append({"sql": sql3, "spent": str(r3.privacy),
                               "rows": _rows(r3, truth3, ["median_age"])})
    after = curator.remaining
    results["budget_after"] = {"epsilon": round(after.epsilon or 0.0, 12),
                               "delta": round(after.delta or 0.0, 18)}
    if print_output:
        if as_json:
            print(json.dumps(results))
        else:
            _print(results, console)
    return results


def _fmt(value: float, sign: bool = False) -> str:
    digits = 0 if abs(value) >= 100 else 1
    return f"{value:{'+' if sign else ''},.{digits}f}"


def _short(value: float) -> str:
    """An interval's end, in thousands from 10,000 up (so that a table fits 80 columns)."""
    return f"{value / 1000:,.1f}k" if abs(value) >= 10_000 else _fmt(value)


def _print(results: dict[str, Any], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console if console is not None else Console()
    data = results["dataset"]
    console.print(f"[bold]The curator[/bold]: {data['orders']:,} orders of "
                  f"{data['customers']:,} customers, privacy unit = customer "
                  f"(every query bounds each customer's influence)")
    before = results["budget_before"]
    console.print(f"budget before: epsilon={before['epsilon']:g}, delta={before['delta']:g}")
    console.print(f"Note: {results['note']}.")
    for query in results["queries"]:
        first = query["rows"][0] if query["rows"] else {}
        keys = [k for k, v in first.items() if not isinstance(v, dict)]
        names = [k for k, v in first.items() if isinstance(v, dict)]
        console.print(f"[bold]{query['sql']}[/bold]")
        # one table per aggregate, so that each fits 80 columns: keys, value, interval,
        # truth, error
        for name in names:
            table = Table()
            for key in keys:
                table.add_column(key)
            starred = first[name].get("interval_kind") == "total"
            for label in (name, "95% CI*" if starred else "95% CI", "true", "error"):
                table.add_column(label, justify="right", no_wrap=True)
            for row in query["rows"]:
                value = row[name]
                low, high = value["interval"]
                interval = "-" if low != low else f"{_short(low)}-{_short(high)}"
                table.add_row(*[str(row[k]) for k in keys], _fmt(value["dp"]), interval,
                              _fmt(value["true"]), _fmt(value["error"], sign=True))
            console.print(table)
        console.print(f"  spent {query['spent']}")
        chosen = query.get("bounds_chosen")
        if chosen:
            caps = ", ".join(f"{k}={v}" for k, v in chosen.items()
                             if k in ("max_partitions", "max_rows_per_partition"))
            console.print(f"  chosen from the data under DP: {caps} (epsilon "
                          f"{chosen.get('epsilon', 0):.3g} of the spend)")
        if query.get("max_unit_rows"):
            widths = [(v["interval"][1] - v["interval"][0],
                       v["bounded_interval"][1] - v["bounded_interval"][0])
                      for row in query["rows"] for v in row.values()
                      if isinstance(v, dict) and "bounded_interval" in v]
            total, capped = (sorted(w)[len(w) // 2] for w in zip(*widths, strict=True))
            console.print(f"  * total intervals: for customers of at most "
                          f"{query['max_unit_rows']} orders (chosen under DP; 10% of the "
                          f"query's epsilon in all); median width {_fmt(total)}, against "
                          f"{_fmt(capped)} for the bounded count's")
        if "escargots_released" in query:
            console.print("  the category one customer invented (Escargots) was "
                          + ("released (probability <= delta)" if query["escargots_released"]
                             else "not released, as designed"))
    after = results["budget_after"]
    console.print(f"budget after: epsilon={after['epsilon']:g}, delta={after['delta']:g}")
