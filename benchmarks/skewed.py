"""Skewed contributions: many units with 1-3 rows and a heavy tail of units with hundreds.

The data on which contribution bounds matter most (issue 14, part 4): a fixed cap either
clips the heavy tail hard (bias) or pays noise for a few heavy units. Seeded and
reproducible; no download.

    .venv/bin/python benchmarks/skewed.py --units 50000 --out /tmp/skewed.parquet

Columns: ``user`` (the privacy unit), ``category`` (one of ``--categories``, public keys
``c0``..), ``amount`` (a positive value, gamma-distributed, heavier for heavy units).
Each light unit (97%) has 1 to 3 rows, in 1 or 2 categories; each heavy unit (3%) has 100 to
600 rows spread over 1 to 8 categories.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

__all__ = ["categories", "skewed_table"]


def categories(count: int) -> list[str]:
    return [f"c{i}" for i in range(count)]


def skewed_table(units: int = 50_000, *, categories_count: int = 8, heavy: float = 0.03,
                 seed: int = 0) -> pd.DataFrame:
    """The table (module docstring), one row per contribution, in random order."""
    rng = np.random.default_rng(seed)
    is_heavy = rng.random(units) < heavy
    rows = np.where(is_heavy, rng.integers(100, 601, units), rng.integers(1, 4, units))
    spread = np.where(is_heavy, rng.integers(1, 9, units), rng.integers(1, 3, units))
    user = np.repeat(np.arange(units), rows)
    # each unit's own categories (``spread`` of them), its rows spread over them
    first = rng.integers(0, categories_count, units)
    offset = rng.integers(0, np.repeat(spread, rows))
    category = (np.repeat(first, rows) + offset) % categories_count
    scale = np.where(np.repeat(is_heavy, rows), 40.0, 15.0)
    amount = rng.gamma(2.0, 1.0, user.size) * scale
    order = rng.permutation(user.size)
    names = np.array(categories(categories_count))
    return pd.DataFrame({"user": user[order], "category": names[category[order]],
                         "amount": amount[order].round(2)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, default=50_000)
    parser.add_argument("--categories", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="a .parquet or .csv path")
    args = parser.parse_args()
    table = skewed_table(args.units, categories_count=args.categories, seed=args.seed)
    if args.out.endswith(".csv"):
        table.to_csv(args.out, index=False)
    else:
        table.to_parquet(args.out, index=False)
    print(f"{len(table):,} rows, {args.units:,} units -> {args.out}")


if __name__ == "__main__":
    main()
