"""Privacy guarantees as immutable values.

A guarantee says how much a mechanism's output distribution may change between two
neighbouring datasets, and *which* neighbouring relation it is stated under:

- ``PureDP(epsilon)``: P[M(D1) in S] <= e^epsilon * P[M(D2) in S] for all S (Dwork, McSherry,
  Nissim and Smith 2006).
- ``ApproxDP(epsilon, delta)``: the same with "+ delta" (Dwork, Kenthapadi, McSherry, Mironov and
  Naor 2006).
- ``ZCDP(rho)``: D_alpha(M(D1) || M(D2)) <= rho * alpha for every Renyi order alpha > 1 (Bun and
  Steinke 2016, Definition 1.1).

Neighbouring datasets differ by all records of one privacy unit, added or removed
(``Neighbouring.ADD_REMOVE``, the default), or by one unit's records replaced by another's
(``Neighbouring.REPLACE``), which must be asked for by name.
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass

from dpcurator import _validation as check

__all__ = ["ZCDP", "ApproxDP", "Guarantee", "Neighbouring", "PureDP"]


class Neighbouring(enum.Enum):
    """The neighbouring relation a guarantee holds under."""

    ADD_REMOVE = "add/remove one privacy unit"
    REPLACE = "replace one privacy unit"

    def __str__(self) -> str:
        return self.value


def check_neighbouring(value: Neighbouring) -> Neighbouring:
    if not isinstance(value, Neighbouring):
        raise TypeError(
            f"neighbouring must be a dpcurator.Neighbouring (ADD_REMOVE or REPLACE), got {value!r}"
        )
    return value


@dataclass(frozen=True, slots=True)
class PureDP:
    """epsilon-differential privacy (pure DP).

    Guarantee: P[M(D1) in S] <= e^epsilon P[M(D2) in S] for all neighbouring D1, D2 and every
    event S. Source: Dwork, McSherry, Nissim and Smith, "Calibrating noise to sensitivity in
    private data analysis" (TCC 2006), Definition 2.
    """

    epsilon: float
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check.positive("epsilon", self.epsilon))
        check_neighbouring(self.neighbouring)

    @property
    def delta(self) -> float:
        """Pure DP is approximate DP with delta = 0."""
        return 0.0

    def __str__(self) -> str:
        return f"{self.epsilon:g}-DP ({self.neighbouring})"


@dataclass(frozen=True, slots=True)
class ApproxDP:
    """(epsilon, delta)-differential privacy (approximate DP).

    Guarantee: P[M(D1) in S] <= e^epsilon P[M(D2) in S] + delta for all neighbouring D1, D2 and
    every event S. Source: Dwork, Kenthapadi, McSherry, Mironov and Naor, "Our data, ourselves"
    (EUROCRYPT 2006). Unlike pure DP, epsilon may be 0 here when delta > 0.
    """

    epsilon: float
    delta: float
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE

    def __post_init__(self) -> None:
        eps = check.nonnegative("epsilon", self.epsilon)
        object.__setattr__(self, "epsilon", eps)
        delta = check.unit_interval("delta", self.delta, include_zero=True)
        object.__setattr__(self, "delta", delta)
        if eps == 0.0 and self.delta == 0.0:
            raise ValueError("epsilon and delta cannot both be 0: that mechanism releases nothing")
        check_neighbouring(self.neighbouring)

    def __str__(self) -> str:
        return f"({self.epsilon:g}, {self.delta:g})-DP ({self.neighbouring})"


@dataclass(frozen=True, slots=True)
class ZCDP:
    """rho-zero-concentrated differential privacy.

    Guarantee: the Renyi divergence of order alpha between M(D1) and M(D2) is at most rho * alpha
    for every alpha > 1 and all neighbouring D1, D2. Source: Bun and Steinke, "Concentrated
    differential privacy: simplifications, extensions, and lower bounds" (TCC 2016),
    Definition 1.1.
    """

    rho: float
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE

    def __post_init__(self) -> None:
        object.__setattr__(self, "rho", check.positive("rho", self.rho))
        check_neighbouring(self.neighbouring)

    def __str__(self) -> str:
        return f"{self.rho:g}-zCDP ({self.neighbouring})"



@dataclass(frozen=True, slots=True)
class RDP:
    """Renyi differential privacy: epsilon(alpha) on a grid of orders alpha > 1.

    Guarantee: D_alpha(M(D1) || M(D2)) <= epsilon(alpha) for each listed order and all
    neighbouring D1, D2. Source: Mironov, "Renyi differential privacy" (CSF 2017),
    Definition 4. An order may carry epsilon = inf (no guarantee at that order).
    """

    orders: tuple[float, ...]
    epsilons: tuple[float, ...]
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE

    def __post_init__(self) -> None:
        orders = tuple(float(a) for a in self.orders)
        epsilons = tuple(float(e) for e in self.epsilons)
        if not orders or len(orders) != len(epsilons):
            raise ValueError("orders and epsilons must be non-empty and of the same length")
        if any(not math.isfinite(a) or a <= 1 for a in orders):
            raise ValueError("every order alpha must be a finite number > 1")
        if any(b <= a for a, b in itertools.pairwise(orders)):
            raise ValueError("orders must be strictly increasing")
        if any(math.isnan(e) or e < 0 for e in epsilons):
            raise ValueError("every epsilon(alpha) must be >= 0 (inf allowed)")
        object.__setattr__(self, "orders", orders)
        object.__setattr__(self, "epsilons", epsilons)
        check_neighbouring(self.neighbouring)

    def __str__(self) -> str:
        return f"RDP over {len(self.orders)} orders ({self.neighbouring})"


@dataclass(frozen=True, slots=True)
class GDP:
    """mu-Gaussian differential privacy.

    Guarantee: distinguishing M(D1) from M(D2) is at least as hard as distinguishing N(0, 1)
    from N(mu, 1) (trade-off function G_mu). Source: Dong, Roth and Su, "Gaussian differential
    privacy" (JRSS-B 2022), Definition 2.6; mu-GDP holds iff (epsilon, delta(epsilon))-DP for
    all epsilon >= 0 with delta(epsilon) = Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu
    - mu/2) (their Corollary 2.13).
    """

    mu: float
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE

    def __post_init__(self) -> None:
        object.__setattr__(self, "mu", check.positive("mu", self.mu))
        check_neighbouring(self.neighbouring)

    def __str__(self) -> str:
        return f"{self.mu:g}-GDP ({self.neighbouring})"


Guarantee = PureDP | ApproxDP | ZCDP | RDP | GDP
