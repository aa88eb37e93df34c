"""Round-robin timing and ratios to a floor, shared by the engine benchmarks.

Every case runs once to warm up, then once per round in turn, so load from other processes
falls on every case alike; each case is reported by its median and by the median of its
per-round ratio to the floor timed in the same round ("paired")."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def time_rounds(cases: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    for fn in cases.values():
        fn()  # warm-up: caches, compiled statements, noise tables
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def ratios(times: dict[str, list[float]], floor_name: str) -> dict[str, dict[str, float]]:
    """Each case's min, median, median over the floor's and paired ratio, printed too."""
    floor = times[floor_name]
    out: dict[str, dict[str, float]] = {}
    print(f"\n{'case':32s} {'min s':>8s} {'median s':>9s} {'x floor':>9s} {'paired':>7s}")
    for name, values in times.items():
        median = statistics.median(values)
        paired = statistics.median(v / f for v, f in zip(values, floor, strict=True))
        out[name] = {"min_s": min(values), "median_s": median,
                     "x_two_level": median / statistics.median(floor), "paired": paired}
        print(f"{name:32s} {min(values):8.3f} {median:9.3f} "
              f"{median / statistics.median(floor):9.2f} {paired:7.2f}")
    return out
