"""What a mechanism did, recorded as frozen data; accountants interpret it.

An event says which noise was added relative to the sensitivity, and how runs were sampled and
composed. It carries no privacy number itself: the PLD, RDP and zCDP accountants each turn the
same event into their own currency, so the curator, DP-SGD and local surveys all feed the same
arithmetic. Every event is stated for the add/remove-one-unit relation unless its
``neighbouring`` says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpcurator import _validation as check
from dpcurator.accounting.guarantees import Neighbouring
from dpcurator.errors import UserError, UserTypeError

__all__ = [
    "ApproxDPEvent",
    "ComposedEvent",
    "DiscreteGaussianEvent",
    "DiscreteLaplaceEvent",
    "DpEvent",
    "GaussianEvent",
    "LaplaceEvent",
    "NameAndShameEvent",
    "PoissonSampledEvent",
    "PureDPEvent",
    "RandomizedResponseEvent",
    "SampledWithoutReplacementEvent",
    "SelfComposedEvent",
    "ZCDPEvent",
]


class DpEvent:
    """Base class of all events (frozen dataclasses below)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class GaussianEvent(DpEvent):
    """Gaussian noise with standard deviation ``noise_multiplier`` times the L2 sensitivity."""

    noise_multiplier: float

    def __post_init__(self) -> None:
        check.positive("noise_multiplier", self.noise_multiplier)


@dataclass(frozen=True, slots=True)
class LaplaceEvent(DpEvent):
    """Laplace noise with scale ``noise_multiplier`` times the L1 sensitivity."""

    noise_multiplier: float

    def __post_init__(self) -> None:
        check.positive("noise_multiplier", self.noise_multiplier)


@dataclass(frozen=True, slots=True)
class DiscreteLaplaceEvent(DpEvent):
    """Discrete Laplace noise P[z] ∝ exp(-|z| / scale) on an integer query of sensitivity k."""

    scale: float
    sensitivity: int = 1

    def __post_init__(self) -> None:
        check.positive("scale", self.scale)
        if not isinstance(self.sensitivity, int) or self.sensitivity < 1:
            raise UserError(f"sensitivity must be a positive integer, got {self.sensitivity!r}")


@dataclass(frozen=True, slots=True)
class DiscreteGaussianEvent(DpEvent):
    """Discrete Gaussian noise (parameter sigma) on an integer query of L2 sensitivity k."""

    sigma: float
    sensitivity: int = 1

    def __post_init__(self) -> None:
        check.positive("sigma", self.sigma)
        if not isinstance(self.sensitivity, int) or self.sensitivity < 1:
            raise UserError(f"sensitivity must be a positive integer, got {self.sensitivity!r}")


@dataclass(frozen=True, slots=True)
class RandomizedResponseEvent(DpEvent):
    """k-ary randomized response: the true category w.p. p, each other one w.p. (1-p)/(k-1).

    For the binary two-coin survey pass its output probabilities through ``PureDPEvent`` or use
    ``categories=2`` with the probability of a truthful *report*. Neighbouring: replace.
    """

    truth_probability: float
    categories: int = 2
    neighbouring: Neighbouring = Neighbouring.REPLACE

    def __post_init__(self) -> None:
        if not (isinstance(self.categories, int) and self.categories >= 2):
            raise UserError(f"categories must be an integer >= 2, got {self.categories!r}")
        low = 1 / self.categories
        if not (low < self.truth_probability < 1):
            raise UserError(
                f"truth_probability must lie in (1/k, 1) = ({low:g}, 1), "
                f"got {self.truth_probability!r}"
            )


@dataclass(frozen=True, slots=True)
class PureDPEvent(DpEvent):
    """Any epsilon-DP mechanism, known only by its guarantee."""

    epsilon: float

    def __post_init__(self) -> None:
        check.positive("epsilon", self.epsilon)


@dataclass(frozen=True, slots=True)
class ApproxDPEvent(DpEvent):
    """Any (epsilon, delta)-DP mechanism, known only by its guarantee."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        check.nonnegative("epsilon", self.epsilon)
        check.unit_interval("delta", self.delta, include_zero=True)


@dataclass(frozen=True, slots=True)
class NameAndShameEvent(DpEvent):
    """Publish the whole dataset with probability ``delta``, nothing otherwise (a lesson, not a
    tool: ``dpcurator.mechanisms.NameAndShame``).

    Its privacy loss is 0 with probability 1 - delta (nothing published: equally likely on
    every dataset) and +infinity with probability delta (a dataset no neighbour can produce),
    in both orders of every pair of neighbours. As approximate DP it is exactly
    ``ApproxDPEvent(0, delta)``; unlike a mechanism known only by that guarantee, it is also
    (0, delta)-probabilistically DP.
    """

    delta: float

    def __post_init__(self) -> None:
        check.unit_interval("delta", self.delta)


@dataclass(frozen=True, slots=True)
class ZCDPEvent(DpEvent):
    """Any rho-zCDP mechanism, known only by its guarantee."""

    rho: float

    def __post_init__(self) -> None:
        check.positive("rho", self.rho)


@dataclass(frozen=True, slots=True)
class ComposedEvent(DpEvent):
    """The events, run one after another (adaptively chosen), on the same data."""

    events: tuple[DpEvent, ...]

    def __post_init__(self) -> None:
        if not all(isinstance(e, DpEvent) for e in self.events):
            raise UserTypeError("events must all be DpEvent instances")


@dataclass(frozen=True, slots=True)
class SelfComposedEvent(DpEvent):
    """The same event run ``count`` times."""

    event: DpEvent
    count: int

    def __post_init__(self) -> None:
        # numpy integers are counts too (kept as int); a bool is not
        object.__setattr__(self, "count", check.integer("count", self.count, minimum=1,
                                                        fractional=UserError))


@dataclass(frozen=True, slots=True)
class PoissonSampledEvent(DpEvent):
    """The event run on a Poisson sample: each unit kept independently w.p. sampling_rate."""

    sampling_rate: float
    event: DpEvent

    def __post_init__(self) -> None:
        if not 0 < self.sampling_rate <= 1:
            raise UserError(f"sampling_rate must lie in (0, 1], got {self.sampling_rate!r}")


@dataclass(frozen=True, slots=True)
class SampledWithoutReplacementEvent(DpEvent):
    """The event run on a uniformly random subset of ``sample_size`` of ``population_size``.

    The natural relation here is "replace one unit" (the population size is public).
    """

    sample_size: int
    population_size: int
    event: DpEvent

    def __post_init__(self) -> None:
        if not (0 < self.sample_size <= self.population_size):
            raise UserError(
                "sample_size must lie in [1, population_size], got "
                f"{self.sample_size!r} of {self.population_size!r}"
            )
