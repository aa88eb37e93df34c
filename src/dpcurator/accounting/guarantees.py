"""Privacy guarantees as immutable values.

A guarantee says how much a mechanism's output distribution may change between two
neighbouring datasets, and *which* neighbouring relation it is stated under:

- ``PureDP(epsilon)``: P[M(D1) in S] <= e^epsilon * P[M(D2) in S] for all S (Dwork, McSherry,
  Nissim and Smith 2006).
- ``ApproxDP(epsilon, delta)``: the same with "+ delta" (Dwork, Kenthapadi, McSherry, Mironov and
  Naor 2006).
- ``ZCDP(rho)``: D_alpha(M(D1) || M(D2)) <= rho * alpha for every Renyi order alpha > 1 (Bun and
  Steinke 2016, Definition 1.1).
- ``ProbabilisticDP(epsilon, delta)``: the privacy loss exceeds epsilon with probability at most
  delta (Meiser 2018). It implies ``ApproxDP`` with the same parameters but, unlike every other
  guarantee here, is not closed under post-processing, so the budget refuses it.

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
from dpcurator.errors import UserError, UserTypeError

__all__ = [
    "GDP",
    "RDP",
    "ZCDP",
    "ApproxDP",
    "Guarantee",
    "Neighbouring",
    "ProbabilisticDP",
    "PureDP",
    "require_post_processing_closure",
]


class Neighbouring(enum.Enum):
    """The neighbouring relation a guarantee holds under."""

    ADD_REMOVE = "add/remove one privacy unit"
    REPLACE = "replace one privacy unit"

    def __str__(self) -> str:
        return self.value


def check_neighbouring(value: Neighbouring) -> Neighbouring:
    if not isinstance(value, Neighbouring):
        raise UserTypeError(
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
            raise UserError("epsilon and delta cannot both be 0: that mechanism releases nothing")
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
            raise UserError("orders and epsilons must be non-empty and of the same length")
        if any(not math.isfinite(a) or a <= 1 for a in orders):
            raise UserError("every order alpha must be a finite number > 1")
        if any(b <= a for a, b in itertools.pairwise(orders)):
            raise UserError("orders must be strictly increasing")
        if any(math.isnan(e) or e < 0 for e in epsilons):
            raise UserError("every epsilon(alpha) must be >= 0 (inf allowed)")
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


@dataclass(frozen=True, slots=True)
class ProbabilisticDP:
    """(epsilon, delta)-probabilistic differential privacy (pDP).

    Guarantee: for all neighbouring D1, D2 (both orders), the privacy loss
    L = ln(P[M(D1) = o] / P[M(D2) = o]) of an output o drawn from M(D1) exceeds epsilon with
    probability at most delta: P[L > epsilon] <= delta. Equivalently, there is a set S_delta of
    outputs with P[M(D1) in S_delta] <= delta outside of which epsilon-DP holds (Meiser,
    "Approximate and probabilistic differential privacy definitions", IACR ePrint 2018/277;
    Lalanne, lesson 1, Definition 2, in the project's references). An output with
    loss exactly epsilon satisfies the epsilon-DP inequality, so it does not count.

    What follows from it, each with its proof:

    - ``to_approx_dp()``: (epsilon, delta)-approximate DP with the same parameters (Meiser 2018;
      Lalanne, Proposition 5: P[M(D1) in S] <= P[M(D1) in S minus S_delta] + delta <=
      e^epsilon P[M(D2) in S] + delta). The converse fails: a Gaussian mechanism that is
      (1, 0.127)-approximately DP loses more than 1 with probability 0.309.
    - ``compose(...)``: basic composition, (sum of epsilons, sum of deltas)-pDP under the same
      neighbouring relation. Proof: the loss of an adaptive composition is the sum of the
      losses, each conditionally on the outputs before it (Sommer, Meiser and Mohammadi,
      "Privacy loss classes", PoPETs 2019, Section 4); if the sum exceeds the sum of the
      epsilons, some term exceeds its own epsilon, and the union bound gives the sum of deltas.
    - It is *not* closed under post-processing: a function of a pDP output may exceed every
      (epsilon, delta) pair the output kept (Meiser 2018; Lalanne, Proposition 4, whose
      counterexample ``tests/test_what_delta_means.py`` builds). Code that post-processes what
      it releases (a budget, whose curator clips and estimates from the noisy values)
      therefore refuses it (``require_post_processing_closure``); charge ``to_approx_dp()``.
    """

    epsilon: float
    delta: float
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE

    def __post_init__(self) -> None:
        eps = check.nonnegative("epsilon", self.epsilon)
        object.__setattr__(self, "epsilon", eps)
        delta = check.unit_interval("delta", self.delta, include_zero=True, include_one=True)
        object.__setattr__(self, "delta", delta)
        if eps == 0.0 and delta == 0.0:
            raise UserError("epsilon and delta cannot both be 0: that mechanism releases nothing")
        check_neighbouring(self.neighbouring)

    def to_approx_dp(self) -> ApproxDP:
        """(epsilon, delta)-approximate DP, the same parameters (pDP implies aDP)."""
        if self.delta >= 1.0:
            raise UserError(
                "delta = 1 states nothing; ApproxDP needs delta < 1 (every mechanism is "
                "(0, 1)-DP)"
            )
        return ApproxDP(self.epsilon, self.delta, self.neighbouring)

    def compose(self, *others: ProbabilisticDP | PureDP) -> ProbabilisticDP:
        """Basic composition with ``others`` (run one after another, adaptively chosen).

        A ``PureDP(epsilon)`` takes part as (epsilon, 0)-pDP (its loss never exceeds epsilon).
        All must be stated under the same neighbouring relation. The deltas add up (capped at
        1, where the statement becomes empty); see the class docstring for the proof.
        """
        epsilon, delta = self.epsilon, self.delta
        for other in others:
            if not isinstance(other, ProbabilisticDP | PureDP):
                raise UserTypeError(
                    "ProbabilisticDP composes with ProbabilisticDP or PureDP guarantees, got "
                    f"{type(other).__name__}; convert the pDP guarantee with to_approx_dp() "
                    "to compose it with approximate DP"
                )
            if other.neighbouring is not self.neighbouring:
                raise UserError(
                    f"cannot compose guarantees stated under different neighbouring relations "
                    f"({self.neighbouring} and {other.neighbouring})"
                )
            epsilon += other.epsilon
            delta += other.delta
        # rounded up: the sum of floats must not understate the sum of the parameters
        epsilon = math.nextafter(epsilon, math.inf) if others else epsilon
        delta = min(1.0, math.nextafter(delta, math.inf)) if others and delta > 0 else delta
        return ProbabilisticDP(epsilon, delta, self.neighbouring)

    def __str__(self) -> str:
        return f"({self.epsilon:g}, {self.delta:g})-probabilistic DP ({self.neighbouring})"


def require_post_processing_closure(
    guarantee: object, where: str, error: type[UserError] = UserError
) -> None:
    """Refuse a guarantee that is not closed under post-processing where ``where`` would treat
    it as if it were (by post-processing what it releases).

    Raises ``error`` (a ``UserError``) with the reason for a ``ProbabilisticDP``; does nothing
    for the other guarantees (pure, approximate, zCDP, Renyi and Gaussian DP are all closed
    under post-processing).
    """
    if isinstance(guarantee, ProbabilisticDP):
        raise error(
            f"{where} post-processes what it releases, and {guarantee} is not closed under "
            "post-processing: a function of a probabilistically DP output can lose more than "
            "epsilon with probability above delta (Meiser 2018, IACR ePrint 2018/277; "
            "Lalanne, lesson 1, Proposition 4). Use its approximate-DP guarantee, "
            "guarantee.to_approx_dp(), which holds with the same parameters and survives "
            "post-processing"
        )


Guarantee = PureDP | ApproxDP | ZCDP | RDP | GDP | ProbabilisticDP
