"""Continuous-valued noise without floating-point leaks: exact integer noise on a fine grid.

The textbook Laplace sampler, x + b * log(U) on uniform doubles, produces outputs whose low
bits reveal x (Mironov, "On significance of the least significant bits for differential
privacy", CCS 2012). Instead, as OpenDP and Google's libraries do, we round x to a grid of
spacing g = 2^k, add g times an *exactly* sampled discrete Laplace (or discrete Gaussian)
integer, and return the grid point. Every output is a multiple of g whatever x was, and the
distribution of the integer is exact.

Rounding to the grid can move each coordinate by up to g/2, so two inputs at distance d may
land on grid points up to d + g apart per coordinate: callers inflate the sensitivity by
g per coordinate (L1) or g * sqrt(k) (L2) and calibrate the noise to the inflated value, so the
stated epsilon holds exactly. ``granularity_for`` takes g = 2^(floor(log2(min(Delta, scale)))
- 40), so the inflation changes the noise scale by a factor of at most 1 + k * 2^-40 (unless
the scale exceeds 2^12 Delta, where g is coarsened to keep scale / g <= 2^52).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dpcurator.errors import UserError
from dpcurator.noise import RandomSource, sample_discrete_gaussian, sample_discrete_laplace

GRID_BITS = 40


def granularity_for(sensitivity: float, scale: float) -> float:
    """The grid step: a power of two about 2^-40 of min(sensitivity, scale), and >= scale/2^52."""
    for name, value in (("sensitivity", sensitivity), ("scale", scale)):
        if not (math.isfinite(value) and value > 0):
            raise UserError(f"{name} must be a positive finite number, got {value!r}")
    g = math.ldexp(1.0, math.frexp(min(sensitivity, scale))[1] - 1 - GRID_BITS)
    while scale / g > 2.0**52:
        g *= 2
    return g


def round_to_grid(values: npt.NDArray[np.float64], granularity: float) -> npt.NDArray[np.float64]:
    """Nearest multiple of the (power-of-two) granularity; exact in binary floating point."""
    return np.round(values / granularity) * granularity


def laplace_on_grid(
    values: npt.NDArray[np.float64], scale: Fraction, granularity: float, source: RandomSource
) -> npt.NDArray[np.float64]:
    """round(values) + g * Z with Z ~ discrete Laplace of scale ``scale / g`` (exact)."""
    noise = sample_discrete_laplace(scale / Fraction(granularity), values.shape, source)
    # g * Z is exact (|Z| < 2^53 with overwhelming probability); the sum is correctly rounded,
    # which is a post-processing of the exact grid point.
    return round_to_grid(values, granularity) + noise.astype(np.float64) * granularity


def gaussian_on_grid(
    values: npt.NDArray[np.float64], sigma: Fraction, granularity: float, source: RandomSource
) -> npt.NDArray[np.float64]:
    """round(values) + g * Z with Z ~ discrete Gaussian of sigma ``sigma / g`` (exact)."""
    noise = sample_discrete_gaussian(sigma / Fraction(granularity), values.shape, source)
    return round_to_grid(values, granularity) + noise.astype(np.float64) * granularity
