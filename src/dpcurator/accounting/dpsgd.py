"""Accounting for DP-SGD: Poisson-subsampled Gaussian steps, and the noise a target needs.

One step of DP-SGD (Abadi et al., "Deep learning with differential privacy", CCS 2016) clips
each example's gradient to L2 norm C, sums the gradients of a Poisson sample (each example kept
independently with probability q) and adds N(0, (sigma C)^2) noise: a Poisson-subsampled
Gaussian mechanism with noise multiplier sigma, under add/remove of one example. T steps are
its T-fold adaptive composition.
"""

from __future__ import annotations

import math

from dpcurator.accounting.accountant import AccountingResult, account
from dpcurator.accounting.events import (
    DpEvent,
    GaussianEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
)
from dpcurator.errors import UserError

__all__ = ["dpsgd_epsilon", "dpsgd_event", "dpsgd_noise_multiplier"]


def _check(sampling_rate: float, steps: int, delta: float, *, zero_delta: bool = False) -> None:
    if isinstance(sampling_rate, bool) or not 0 < sampling_rate <= 1:
        raise UserError(f"sampling_rate must lie in (0, 1], got {sampling_rate!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise UserError(f"steps must be an integer >= 1, got {steps!r}")
    if isinstance(delta, bool) or not (0 <= delta < 1 if zero_delta else 0 < delta < 1):
        interval = "[0, 1)" if zero_delta else "(0, 1)"
        raise UserError(f"delta must lie in {interval}, got {delta!r}")


def dpsgd_event(*, sampling_rate: float, noise_multiplier: float, steps: int) -> DpEvent:
    """The event of ``steps`` Poisson-subsampled Gaussian steps."""
    if isinstance(noise_multiplier, bool) or not (
        isinstance(noise_multiplier, int | float) and noise_multiplier > 0
        and math.isfinite(noise_multiplier)
    ):
        raise UserError(f"noise_multiplier must be a positive number, got {noise_multiplier!r}")
    step = PoissonSampledEvent(sampling_rate, GaussianEvent(float(noise_multiplier)))
    return SelfComposedEvent(step, steps)


def dpsgd_epsilon(
    *, sampling_rate: float, noise_multiplier: float, steps: int, delta: float,
    method: str = "best",
) -> AccountingResult:
    """Epsilon at ``delta`` after ``steps`` steps; ``method`` is "pld", "rdp" or "best".

    An upper bound on the true epsilon for every accepted input, or +inf (at delta = 0, where
    the Gaussian's loss is unbounded; and where no method can bound it, as for noise far below
    1 over many steps at a tiny delta). If the method asked for gives no finite bound (a PLD
    cannot hold single-step losses above 500, from a noise multiplier below about 0.03), the
    result comes from another sound method, named in ``method`` and ``note``. "best" also
    uses the exact analytic Gaussian curve when ``sampling_rate`` is 1. Cost: at most about
    200 MiB of working memory and a few seconds for every input (noise multipliers 1e-6 to
    1e6, sampling rates from 1e-6, up to 10^9 steps; see ``account``).
    """
    _check(sampling_rate, steps, delta, zero_delta=True)
    if method not in ("best", "pld", "rdp"):
        raise UserError(f"method must be 'pld', 'rdp' or 'best', got {method!r}")
    event = dpsgd_event(sampling_rate=sampling_rate, noise_multiplier=noise_multiplier,
                        steps=steps)
    methods = ("pld", "rdp", "analytic-gaussian") if method == "best" else (method,)
    return account(event, delta=delta, methods=methods)


def dpsgd_noise_multiplier(
    *, sampling_rate: float, steps: int, delta: float, target_epsilon: float,
    method: str = "best", tolerance: float = 1e-3,
) -> tuple[float, AccountingResult]:
    """The smallest noise multiplier (within ``tolerance``, relative, rounded up) reaching the
    target epsilon, and the accounting at that multiplier (its epsilon <= target_epsilon)."""
    _check(sampling_rate, steps, delta)
    if isinstance(target_epsilon, bool) or not (
        isinstance(target_epsilon, int | float) and 0 < target_epsilon < math.inf
    ):
        raise UserError(f"target_epsilon must be a positive number, got {target_epsilon!r}")
    # 0 or less searched forever and NaN not at all (a bug hunt); 1e-9 is about 30 halvings
    if isinstance(tolerance, bool) or not (
        isinstance(tolerance, int | float) and 1e-9 <= tolerance < math.inf
    ):
        raise UserError(f"tolerance must be a number of at least 1e-9 (relative), got "
                        f"{tolerance!r}")

    def eps_at(sigma: float) -> AccountingResult:
        return dpsgd_epsilon(sampling_rate=sampling_rate, noise_multiplier=sigma, steps=steps,
                             delta=delta, method=method)

    low, high = 0.05, 1.0
    result_high = eps_at(high)
    while result_high.epsilon > target_epsilon:  # epsilon falls as the noise grows
        low, high = high, high * 2
        if high > 1e4:
            raise UserError("no noise multiplier up to 10^4 reaches this target epsilon")
        result_high = eps_at(high)
    while high / low > 1 + tolerance:
        mid = math.sqrt(low * high)
        result_mid = eps_at(mid)
        if result_mid.epsilon <= target_epsilon:
            high, result_high = mid, result_mid
        else:
            low = mid
    return high, result_high
