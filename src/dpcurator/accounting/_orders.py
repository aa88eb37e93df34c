"""The default Renyi orders, shared by the conversions and the RDP accountant."""

from __future__ import annotations

__all__ = ["DEFAULT_ORDERS"]


def _default_orders() -> tuple[float, ...]:
    fine = [1 + x / 20 for x in range(1, 20)]  # 1.05 .. 1.95
    quarter = [2 + x / 4 for x in range(24)]  # 2 .. 7.75
    half = [8 + x / 2 for x in range(16)]  # 8 .. 15.5
    integers = [float(a) for a in range(16, 64)]
    large = [64.0 + 8 * x for x in range(8)] + [128.0 + 16 * x for x in range(8)]
    huge = [256.0, 320.0, 384.0, 448.0, 512.0, 640.0, 768.0, 1024.0, 1536.0, 2048.0, 4096.0]
    return tuple(fine + quarter + half + integers + large + huge)


DEFAULT_ORDERS: tuple[float, ...] = _default_orders()
"""The default Renyi orders: fine steps near 1, quarter and half steps to 16, every integer to
64, then sparser up to 4096 (large orders matter for tiny delta and for near-pure mechanisms)."""
