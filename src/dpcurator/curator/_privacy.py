"""A query's privacy request: how much to spend, on which noise, split how.

The analyst states the privacy loss of the query (``epsilon`` [+ ``delta``], or ``rho``), never
a noise scale. The request is split across the query's aggregates (evenly, or by weights) and,
for private keys selected by a separate step, that selection (a selection that thresholds a
noisy count takes only delta). Shares are rounded *down* so that the exact sum of
the mechanisms' guarantees never exceeds what the request says.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from dpcurator.accounting import ZCDP, ApproxDP, PureDP
from dpcurator.accounting.conversions import zcdp_rho_for
from dpcurator.errors import InternalError, UserError

__all__ = ["MAX_DELTA", "NoiseKind", "PrivacyRequest", "check_delta", "split"]

NoiseKind = Literal["laplace", "gaussian"]
SELECTION = "partition_selection"
#: The largest delta accepted without ``allow_large_delta=True`` (budget total and query).
MAX_DELTA = 1e-3


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UserError(f"{name} must be a number, got a {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise UserError(f"{name} must be a positive finite number, got {number!r}")
    return number


def _weight(name: object, value: object) -> float:
    """A weight as a positive float (numpy numbers too); a UserError naming it otherwise."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = float(value)
    return _positive(f"weight of {name!r}", value)


def check_delta(delta: object, what: str, allow_large: bool) -> None:
    """Refuse a delta above ``MAX_DELTA`` unless the caller opted in explicitly.

    Delta is the probability that the guarantee fails outright. With delta >= 1/n (n units) a
    mechanism may publish records as they are: a private partition selection at delta = 0.5
    releases every unit's id in a GROUP BY on the privacy unit, with probability about 1/2
    each. Values well below 1/n (1e-6, 1e-9) are the norm.
    """
    if allow_large or isinstance(delta, bool) or not isinstance(delta, int | float):
        return  # the type (and range) is checked where delta is used
    if float(delta) > MAX_DELTA:
        raise UserError(
            f"{what} = {float(delta)!r} is above {MAX_DELTA:g}, the largest delta accepted "
            "without an explicit opt-in: delta is the probability that the guarantee fails "
            "outright, and with delta of 1/n or more (n privacy units) a mechanism may release "
            "records as they are, for example every unit's id in a GROUP BY on the privacy "
            "unit. Use a delta well below 1/n, such as 1e-6, or pass allow_large_delta=True "
            "(--allow-large-delta) if this is really meant")


@dataclass(frozen=True)
class PrivacyRequest:
    """What one query may spend: ``epsilon`` (+ ``delta``) or ``rho``; noise; weights.

    - ``epsilon`` alone: pure DP, Laplace noise; public keys only.
    - ``epsilon`` and ``delta``: Laplace noise (or Gaussian with ``noise="gaussian"``), and
      private keys allowed (the partition selection uses delta).
    - ``rho``: zCDP, Gaussian noise; public keys only.
    - ``weights``: relative shares per aggregate name (and ``"partition_selection"``, which
      asks for a separate selection step with that share); omitted names weigh 1.
    """

    epsilon: float | None = None
    delta: float = 0.0
    rho: float | None = None
    noise: NoiseKind | None = None
    weights: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if self.rho is not None:
            if self.epsilon is not None or self.delta:
                raise UserError("give either rho (zCDP) or epsilon [and delta], not both")
            object.__setattr__(self, "rho", _positive("rho", self.rho))
            if self.noise == "laplace":
                raise UserError("a rho (zCDP) request uses Gaussian noise; drop noise='laplace'")
        else:
            if self.epsilon is None:
                raise UserError("say how much privacy the query may spend: epsilon=... "
                                "(and delta=... for private keys), or rho=...")
            object.__setattr__(self, "epsilon", _positive("epsilon", self.epsilon))
            delta = self.delta
            if isinstance(delta, bool) or not isinstance(delta, int | float) or \
                    not 0.0 <= float(delta) < 1.0 or math.isnan(float(delta)):
                raise UserError(f"delta must be a number in [0, 1), got {delta!r}")
            object.__setattr__(self, "delta", float(delta))
            if self.noise == "gaussian" and self.delta == 0.0:
                raise UserError("Gaussian noise needs delta > 0 (or ask with rho=)")
        if self.noise not in (None, "laplace", "gaussian"):
            raise UserError(f"noise must be 'laplace' or 'gaussian', got {self.noise!r}")
        for name, weight in self.weights:
            _positive(f"weight of {name!r}", weight)

    @classmethod
    def make(cls, *, epsilon: float | None, delta: float | None, rho: float | None,
             noise: str | None, weights: Mapping[str, float] | None,
             allow_large_delta: bool = False) -> PrivacyRequest:
        """A checked request; a delta above ``MAX_DELTA`` needs ``allow_large_delta``."""
        if weights is not None and not isinstance(weights, Mapping):
            raise UserError("weights must be a mapping {aggregate name: weight}")
        check_delta(delta, "delta", allow_large_delta)
        return cls(epsilon=epsilon, delta=0.0 if delta is None else delta, rho=rho,
                   noise=noise,  # type: ignore[arg-type]
                   weights=tuple(sorted((str(k), _weight(k, v))
                                      for k, v in (weights or {}).items())))

    @property
    def kind(self) -> NoiseKind:
        if self.rho is not None:
            return "gaussian"
        return self.noise or "laplace"

    def weight(self, name: str) -> float:
        return dict(self.weights).get(name, 1.0)

    def check_weights(self, names: Sequence[str]) -> None:
        unknown = sorted(set(dict(self.weights)) - set(names))
        if unknown:
            raise UserError(f"weights name unknown aggregates {unknown}; the query has "
                            f"{list(names)}")

    def scaled(self, factor: float) -> PrivacyRequest:
        """The same request with epsilon and delta (or rho) scaled down by ``factor`` <= 1."""
        if self.rho is not None:
            return PrivacyRequest(rho=self.rho * factor, noise=self.noise, weights=self.weights)
        assert self.epsilon is not None
        return PrivacyRequest(epsilon=self.epsilon * factor, delta=self.delta * factor,
                              noise=self.noise, weights=self.weights)


def split(total: float, weights: Sequence[float]) -> list[float]:
    """Shares of ``total`` in proportion to ``weights``, each rounded down (exact sum <= total)."""
    exact_total = Fraction(total)
    weight_sum = sum(Fraction(w) for w in weights)
    shares = []
    for w in weights:
        exact = exact_total * Fraction(w) / weight_sum
        value = float(exact)
        if Fraction(value) > exact:
            value = math.nextafter(value, 0.0)
        if value <= 0:
            raise UserError("a privacy share rounded to zero; use larger weights or budget")
        shares.append(value)
    return shares


@dataclass(frozen=True)
class Allocation:
    """The request turned into per-mechanism parameters.

    ``pure`` maps a name to its epsilon (discrete Laplace); ``rho`` maps a name to its zCDP
    rho (discrete Gaussian); ``selection`` is the (epsilon, delta) of a separate partition
    selection; ``threshold_delta`` is the delta of a selection by thresholding the count
    ``threshold`` (which then costs no epsilon). ``cost`` is the guarantee the whole query keeps
    (what the budget is charged).
    """

    pure: dict[str, float]
    rho: dict[str, float]
    selection: tuple[float, float] | None
    cost: PureDP | ApproxDP | ZCDP
    threshold: str | None = None
    threshold_delta: float | None = None


def allocate(request: PrivacyRequest, names: Sequence[str], private_keys: bool,
             threshold: str | None = None) -> Allocation:
    """Split the request over the aggregates ``names`` and the partition selection.

    Private keys are selected either by a separate mechanism, which gets its own share of
    epsilon (weight ``"partition_selection"``) and delta (all of it under Laplace noise, half
    under Gaussian noise), or, when ``threshold`` names a count aggregate, by thresholding that
    count's noisy value: no epsilon is set aside, and the selection's delta is all of delta
    (Laplace) or half of it (Gaussian, whose noise keeps the other half).
    """
    if threshold is not None and (not private_keys or threshold not in names):
        raise InternalError("count thresholding needs private keys and a count; this is a bug")
    separate = private_keys and threshold is None
    request.check_weights([*names, SELECTION] if separate else list(names))
    if private_keys:
        if request.rho is not None:
            raise UserError("private keys need an (epsilon, delta) request: partition selection "
                            "is approximate DP. Give keys=... (public partitions) or ask with "
                            "epsilon= and delta=")
        if request.delta == 0.0:
            raise UserError("this query groups by keys that are not public, so the released "
                            "keys must be selected privately, which needs delta > 0 (for "
                            "example delta=1e-6); or pass the public keys with keys=...")
    if request.rho is not None:
        rhos = split(request.rho, [request.weight(n) for n in names])
        return Allocation({}, dict(zip(names, rhos, strict=True)), None, ZCDP(request.rho))
    assert request.epsilon is not None
    # the selection's share is kept by position, never by name: an aggregate may be called
    # "partition_selection" (its weight is then the aggregate's; the selection's is 1)
    weights = [request.weight(n) for n in names]
    if separate:
        weights.append(1.0 if SELECTION in names else request.weight(SELECTION))
    epsilons = split(request.epsilon, weights)
    shares = dict(zip(names, epsilons[:len(names)], strict=True))
    selection = None
    threshold_delta = None
    delta_left = request.delta
    if private_keys:
        selection_delta = request.delta / 2 if request.kind == "gaussian" else request.delta
        if separate:
            selection = (epsilons[len(names)], selection_delta)
        else:
            threshold_delta = selection_delta
        delta_left = request.delta - selection_delta
    if request.kind == "laplace":
        cost: PureDP | ApproxDP = (ApproxDP(request.epsilon, request.delta) if private_keys
                                   else PureDP(request.epsilon))
        return Allocation(shares, {}, selection, cost, threshold, threshold_delta)
    # Gaussian under (epsilon, delta): the aggregates' share of epsilon and delta_left become a
    # zCDP rho (the largest rho whose conversion gives them), split by weight.
    noise_epsilon = float(sum(Fraction(v) for v in shares.values()))
    if Fraction(noise_epsilon) > sum(Fraction(v) for v in shares.values()):
        noise_epsilon = math.nextafter(noise_epsilon, 0.0)
    rho_total = zcdp_rho_for(noise_epsilon, delta_left)
    rhos = split(rho_total, [request.weight(n) for n in names])
    return Allocation({}, dict(zip(names, rhos, strict=True)), selection,
                      ApproxDP(request.epsilon, request.delta), threshold, threshold_delta)
