"""Group privacy: what a guarantee for one privacy unit says about a group of k units.

Two datasets that differ in k units are joined by a path of k neighbouring steps, so a guarantee
for one unit degrades along the path. Each rule below says how, with its source; the result keeps
the neighbouring relation (now read as "k units added/removed" or "k units replaced").

- ``PureDP(eps)`` -> ``PureDP(k eps)`` (Dwork and Roth 2014, Theorem 2.2).
- ``ApproxDP(eps, delta)`` -> ``(k eps, delta (e^(k eps) - 1)/(e^eps - 1))`` (the path argument;
  Lalanne, "The notion of differential privacy", lesson 1, Proposition 6 in the project's
  references, after Dwork and Roth 2014; it is at most k e^((k-1) eps) delta, compare Vadhan,
  "The complexity of differential privacy" 2017, Lemma 2.2).
- ``ZCDP(rho)`` -> ``ZCDP(k^2 rho)`` (Bun and Steinke 2016, Proposition 1.9).
- ``GDP(mu)`` -> ``GDP(k mu)`` (Dong, Roth and Su 2022, Section 2.5, group privacy of f-DP,
  Theorem 2.14: f becomes 1 - (1 - f)^(o k), which maps G_mu to G_(k mu)).
- ``RDP``: for k <= 2^c and orders alpha >= 2^(c+1), (alpha, eps) becomes (alpha / 2^c, 3^c eps)
  (Mironov 2017, Proposition 2); orders too small for this are dropped. This is loose; for noise
  mechanisms, ``group_event`` is exact.
- ``group_event``: for additive-noise events the group's sensitivity is k times the unit's, so
  the event itself can be rescaled exactly (Gaussian/Laplace noise multiplier / k, discrete
  sensitivity * k) and handed to any accountant.
"""

from __future__ import annotations

import functools
import math
from typing import TypeVar

from dpcurator import _validation as check
from dpcurator.accounting.events import (
    ComposedEvent,
    DiscreteGaussianEvent,
    DiscreteLaplaceEvent,
    DpEvent,
    GaussianEvent,
    LaplaceEvent,
    PureDPEvent,
    SelfComposedEvent,
    ZCDPEvent,
)
from dpcurator.accounting.guarantees import GDP, RDP, ZCDP, ApproxDP, PureDP
from dpcurator.errors import UserError, UserTypeError

__all__ = ["group_event", "group_privacy"]

_G = TypeVar("_G", PureDP, ApproxDP, ZCDP, GDP, RDP)


def _up(x: float) -> float:
    return math.nextafter(x + abs(x) * 1e-12, math.inf)


def _approx_group(g: ApproxDP, k: int) -> ApproxDP:
    eps = g.epsilon
    # delta * (1 + e^eps + ... + e^((k-1) eps)) = delta * expm1(k eps) / expm1(eps).
    factor = float(k) if eps == 0 else math.expm1(k * eps) / math.expm1(eps)
    delta = _up(g.delta * factor)
    if not delta < 1:
        raise UserError(
            f"for a group of k={k} units the delta bound reaches {delta:.3g} >= 1: this "
            "guarantee says nothing about such groups; use a smaller k or a guarantee with "
            "smaller epsilon and delta"
        )
    return ApproxDP(_up(k * eps), delta, g.neighbouring)


def _rdp_group(g: RDP, k: int) -> RDP:
    c = math.ceil(math.log2(k)) if k > 1 else 0
    if c == 0:
        return g
    scale = 2**c
    kept = [(a, e) for a, e in zip(g.orders, g.epsilons, strict=True) if a >= 2 * scale]
    if not kept:
        raise UserError(
            f"Mironov's group-privacy rule for k={k} needs orders >= {2 * scale}; this RDP "
            "guarantee has none. Rescale the mechanism's event with group_event instead."
        )
    return RDP(
        tuple(a / scale for a, _ in kept),
        tuple(_up(3**c * e) for _, e in kept),
        g.neighbouring,
    )


def group_privacy(guarantee: _G, k: int) -> _G:
    """The guarantee for groups of ``k`` privacy units implied by ``guarantee`` (see module
    docstring for the rule and source per type). k = 1 returns an equal guarantee."""
    k = check.integer("k (the group size)", k, minimum=1)
    if not isinstance(guarantee, PureDP | ApproxDP | ZCDP | GDP | RDP):
        raise UserTypeError(
            f"guarantee must be PureDP, ApproxDP, ZCDP, GDP or RDP, got {type(guarantee).__name__}"
        )
    if k == 1:
        return guarantee
    if isinstance(guarantee, PureDP):
        return PureDP(_up(k * guarantee.epsilon), guarantee.neighbouring)
    if isinstance(guarantee, ApproxDP):
        return _approx_group(guarantee, k)
    if isinstance(guarantee, ZCDP):
        return ZCDP(_up(k * k * guarantee.rho), guarantee.neighbouring)
    if isinstance(guarantee, GDP):
        return GDP(_up(k * guarantee.mu), guarantee.neighbouring)
    return _rdp_group(guarantee, k)


@functools.singledispatch
def _rescale(event: DpEvent, k: int) -> DpEvent:
    raise UserError(
        f"no exact group rescaling for a {type(event).__name__}: sampled events and events "
        "known only by an (epsilon, delta) guarantee or by randomized response are refused; "
        "apply group_privacy to its guarantee instead"
    )


@_rescale.register
def _(event: GaussianEvent, k: int) -> DpEvent:
    return GaussianEvent(event.noise_multiplier / k)


@_rescale.register
def _(event: LaplaceEvent, k: int) -> DpEvent:
    return LaplaceEvent(event.noise_multiplier / k)


@_rescale.register
def _(event: DiscreteGaussianEvent, k: int) -> DpEvent:
    return DiscreteGaussianEvent(event.sigma, event.sensitivity * k)


@_rescale.register
def _(event: DiscreteLaplaceEvent, k: int) -> DpEvent:
    return DiscreteLaplaceEvent(event.scale, event.sensitivity * k)


@_rescale.register
def _(event: PureDPEvent, k: int) -> DpEvent:
    return PureDPEvent(_up(k * event.epsilon))


@_rescale.register
def _(event: ZCDPEvent, k: int) -> DpEvent:
    return ZCDPEvent(_up(k * k * event.rho))


@_rescale.register
def _(event: ComposedEvent, k: int) -> DpEvent:
    return ComposedEvent(tuple(_rescale(e, k) for e in event.events))


@_rescale.register
def _(event: SelfComposedEvent, k: int) -> DpEvent:
    return SelfComposedEvent(_rescale(event.event, k), event.count)


def group_event(event: DpEvent, k: int) -> DpEvent:
    """The event as seen by a group of ``k`` units: exact for additive noise.

    A query with sensitivity s per unit has sensitivity at most k s for k units (triangle
    inequality), so Gaussian and Laplace noise multipliers are divided by k and discrete
    mechanisms get sensitivity k times larger; pure-DP and zCDP events follow
    ``group_privacy``; compositions are mapped part by part. Sampled events are refused: under
    sampling a group is not a single unit with a larger sensitivity (its members are sampled
    separately), so no exact rescaling exists.
    """
    k = check.integer("k (the group size)", k, minimum=1)
    if not isinstance(event, DpEvent):
        raise UserTypeError(f"event must be a DpEvent, got {type(event).__name__}")
    return event if k == 1 else _rescale(event, k)
