"""What an ε means to an attacker, as the dashboard draws it: the posterior against the prior.

The numbers are the accounting package's (``posterior_bounds``): for (ε, δ)-DP they hold
except on outputs of probability at most ``failure_probability`` (10 δ). Nothing here reads
data or a budget, so it is free.
"""

from __future__ import annotations

from typing import Any

from dpcurator.accounting import ApproxDP, PureDP
from dpcurator.accounting.posterior import posterior_bounds
from dpcurator.errors import UserError

from ._service import ServiceError

__all__ = ["POINTS", "posterior_curve"]

POINTS = 101  # priors 0, 0.01, ..., 1


def posterior_curve(epsilon: float, delta: float = 0.0, prior: float = 0.5) -> dict[str, Any]:
    """The lowest and highest posterior an attacker can reach from every prior (``curve``),
    and from ``prior``; ``epsilon_bound`` is the ε the odds move by (ε' > ε under δ > 0)."""
    try:
        guarantee = ApproxDP(epsilon, delta) if delta > 0 else PureDP(epsilon)
        asked = posterior_bounds(guarantee, prior)
        priors = [i / (POINTS - 1) for i in range(POINTS)]
        bounds = [posterior_bounds(guarantee, p) for p in priors]
    except (UserError, ValueError, TypeError) as exc:
        raise ServiceError(422, "invalid_request", " ".join(str(exc).split())) from None
    return {"epsilon": epsilon, "delta": delta, "epsilon_bound": asked.epsilon,
            "failure_probability": asked.failure_probability, "prior": asked.prior,
            "posterior_min": asked.posterior_min, "posterior_max": asked.posterior_max,
            "curve": {"prior": priors, "lowest": [b.posterior_min for b in bounds],
                      "highest": [b.posterior_max for b in bounds]}}
