"""Secure randomness and exact noise samplers.

``SecureRandom`` (the default everywhere) is a cryptographically secure source;
``SeededRandom`` is for tests and benchmarks only. The samplers draw exactly from the
distributions they name, with no floating-point rounding deciding any output.

The exact decisions the samplers fall back on (a uniform real known by a prefix of its random
bits, compared in interval arithmetic): ``resolve_uniform`` with the decisions ``below_exp``
and ``geometric_count``; ``floor_scaled_exp`` (a fast sampler's 64-bit threshold);
``interval_context`` and ``interval_bounds``. Other packages' exact samplers build on these.
"""

from dpcurator.noise._exact import (
    Decision,
    below_exp,
    floor_scaled_exp,
    geometric_count,
    interval_bounds,
    interval_context,
    resolve_uniform,
)
from dpcurator.noise.samplers import (
    sample_bernoulli,
    sample_bernoulli_exp,
    sample_discrete_gaussian,
    sample_discrete_laplace,
    sample_uniform_int,
)
from dpcurator.noise.source import (
    RandomSource,
    SecureRandom,
    SeededRandom,
    default_source,
    resolve_source,
)

__all__ = [
    "Decision",
    "RandomSource",
    "SecureRandom",
    "SeededRandom",
    "below_exp",
    "default_source",
    "floor_scaled_exp",
    "geometric_count",
    "interval_bounds",
    "interval_context",
    "resolve_source",
    "resolve_uniform",
    "sample_bernoulli",
    "sample_bernoulli_exp",
    "sample_discrete_gaussian",
    "sample_discrete_laplace",
    "sample_uniform_int",
]
