"""Which law of the privacy loss an event has (private; the public surface is
``accounting.loss``).

``exact_laws(event)`` gives the laws of both orders of the pair for every event whose privacy
loss is known in closed form: one Gaussian, Laplace, discrete Laplace, discrete Gaussian or
randomized-response mechanism, name-and-shame, any composition of Gaussian mechanisms (their
losses add to one Gaussian loss), one Poisson-sampled Gaussian or Laplace step (the mixtures'
tails through the noise CDF) or discrete one (exact atoms), and a mechanism known only by its
pure or approximate guarantee (the worst case over every such mechanism: an envelope for the
probabilistic reading, the dominating pair for the approximate one). Anything else is a
composition that ``_loss_grid`` computes on a grid, block by block: ``blocks(event)`` lists the
blocks, each with its laws and how many times it runs.

The pair. Each law is that of the pair of neighbours the event describes: for additive noise
the two datasets whose query answers differ by the full sensitivity. For the Gaussian, Laplace
and randomized-response mechanisms that pair is the worst one for both readings (the loss's
tails grow with the shift; see ``_loss_laws``). Add/remove neighbours: "remove" draws the
output from the dataset with the unit, "add" from the one without it (as in ``pld``).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from dpcurator.accounting import _pld_profiles as prof
from dpcurator.accounting._loss_laws import (
    ApproxEnvelope,
    AtomLaw,
    GaussianLaw,
    Law,
    MixtureLaw,
    PureEnvelope,
)
from dpcurator.accounting.events import (
    ApproxDPEvent,
    ComposedEvent,
    DiscreteGaussianEvent,
    DiscreteLaplaceEvent,
    DpEvent,
    GaussianEvent,
    LaplaceEvent,
    NameAndShameEvent,
    PoissonSampledEvent,
    PureDPEvent,
    RandomizedResponseEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    ZCDPEvent,
)
from dpcurator.accounting.guarantees import Neighbouring
from dpcurator.errors import UnsupportedEventError, UserTypeError

__all__ = ["Block", "LawPair", "blocks", "exact_laws", "relation_of"]

# Noise scales beyond these are read at the ends, as the PLD accountant does (``pld``): more
# noise than 1e100 as 1e100 (the loss only grows as the noise falls), less than 1e-100 as no
# noise at all (the unit is revealed: loss +infinity).
_NOISE_SCALES = (1e-100, 1e100)
# Discrete Gaussian pmf sums: tails beyond this mass are moved up (pessimistic), as in ``pld``.
_DISCRETE_GAUSSIAN_TAIL = 1e-16


@dataclass(frozen=True, eq=False)
class LawPair:
    """The laws of both orders of a pair, for each reading.

    ``remove``/``add`` are read for the probabilistic delta; ``adp_remove``/``adp_add`` for the
    approximate one (the same laws, except for a mechanism known only by its guarantee).
    ``spacing``: every finite loss is a multiple of it (0: the only finite loss is 0), so a grid
    of that interval holds the laws exactly; None when not.
    """

    remove: Law
    add: Law
    adp_remove: Law
    adp_add: Law
    method: str
    relation: Neighbouring | None = None
    spacing: float | None = None

    @classmethod
    def symmetric(
        cls,
        law: Law,
        method: str,
        *,
        adp: Law | None = None,
        relation: Neighbouring | None = None,
        spacing: float | None = None,
    ) -> LawPair:
        """Both orders have the same law."""
        adp_law = law if adp is None else adp
        return cls(law, law, adp_law, adp_law, method, relation, spacing)


@dataclass(frozen=True, eq=False)
class Block:
    """One building block of a composition and how many times it runs."""

    laws: LawPair
    count: int
    event: DpEvent = field(repr=False)


def _atoms_law(atoms: prof.Atoms) -> AtomLaw:
    return AtomLaw(atoms.losses, atoms.masses, atoms.infinity_mass)


def _no_noise() -> AtomLaw:
    """The unit's presence is revealed: loss +infinity with probability 1."""
    return AtomLaw(np.zeros(0), np.zeros(0), 1.0)


@functools.singledispatch
def exact_laws(event: DpEvent) -> LawPair | None:
    """The closed-form laws of the event, or None when only a grid composition has them."""
    if not isinstance(event, DpEvent):
        raise UserTypeError(f"event must be a DpEvent, got {type(event).__name__}")
    return None


@exact_laws.register
def _(event: GaussianEvent) -> LawPair:
    sigma = min(float(event.noise_multiplier), _NOISE_SCALES[1])
    if sigma < _NOISE_SCALES[0]:
        return LawPair.symmetric(_no_noise(), "closed form (no noise)")
    return LawPair.symmetric(GaussianLaw(0.5 / (sigma * sigma)), "closed form (Gaussian)")


@exact_laws.register
def _(event: LaplaceEvent) -> LawPair:
    b = min(float(event.noise_multiplier), _NOISE_SCALES[1])
    if b < _NOISE_SCALES[0]:
        return LawPair.symmetric(_no_noise(), "closed form (no noise)")
    # Both orders of the unsampled pair have one law (the noise is symmetric).
    law = MixtureLaw(prof.MixtureProfile(prof.LaplaceNoise(b), 1.0, "remove"))
    return LawPair.symmetric(law, "closed form (Laplace)")


@exact_laws.register
def _(event: DiscreteLaplaceEvent) -> LawPair:
    atoms = prof.discrete_laplace_atoms(float(event.scale), int(event.sensitivity))
    return LawPair.symmetric(
        _atoms_law(atoms), "exact atoms (discrete Laplace)", spacing=1.0 / float(event.scale)
    )


@exact_laws.register
def _(event: DiscreteGaussianEvent) -> LawPair:
    sigma, k = float(event.sigma), int(event.sensitivity)
    if sigma < _NOISE_SCALES[0]:
        return LawPair.symmetric(_no_noise(), "closed form (no noise)")
    atoms = prof.discrete_gaussian_atoms(sigma, k, _DISCRETE_GAUSSIAN_TAIL)
    return LawPair.symmetric(
        _atoms_law(atoms), "exact atoms (discrete Gaussian)", spacing=k / (2.0 * sigma * sigma)
    )


@exact_laws.register
def _(event: RandomizedResponseEvent) -> LawPair:
    atoms = prof.randomized_response_atoms(float(event.truth_probability), int(event.categories))
    return LawPair.symmetric(
        _atoms_law(atoms),
        "exact atoms (randomized response)",
        relation=event.neighbouring,
        spacing=atoms.spacing,
    )


@exact_laws.register
def _(event: NameAndShameEvent) -> LawPair:
    delta = float(event.delta)
    law = AtomLaw(np.array([0.0]), np.array([1.0 - delta]), delta)
    return LawPair.symmetric(law, "exact atoms (name-and-shame)", spacing=0.0)


@exact_laws.register
def _(event: PureDPEvent) -> LawPair:
    eps = float(event.epsilon)
    return LawPair.symmetric(
        PureEnvelope(eps),
        "worst case over every mechanism with this guarantee",
        adp=_atoms_law(prof.approx_dp_atoms(eps, 0.0)),
    )


@exact_laws.register
def _(event: ApproxDPEvent) -> LawPair:
    eps, delta = float(event.epsilon), float(event.delta)
    method = "worst case over every mechanism with this guarantee"
    if eps == 0.0 and delta == 0.0:  # releases nothing
        law = AtomLaw(np.array([0.0]), np.array([1.0]))
        return LawPair.symmetric(law, "exact atoms (no release)", spacing=0.0)
    envelope: Law = PureEnvelope(eps) if delta == 0.0 else ApproxEnvelope(eps, delta)
    return LawPair.symmetric(envelope, method, adp=_atoms_law(prof.approx_dp_atoms(eps, delta)))


@exact_laws.register
def _(event: ZCDPEvent) -> LawPair:
    raise UnsupportedEventError(
        "a zCDP guarantee does not determine a privacy loss distribution; convert it to "
        "(epsilon, delta) first (dpcurator.accounting.conversions)"
    )


def _gaussian_mu(event: DpEvent) -> float | None:
    """The mean (= half the variance) of the one Gaussian loss a structure of Gaussian
    mechanisms has, or None: mu^2 / 2 for the mu-GDP that ``accountant`` finds the structure
    to be (Dong, Roth and Su 2022, Corollary 3.3), mu kept within the scales handled here."""
    from dpcurator.accounting.accountant import _gaussian_mu as gdp_mu

    mu = gdp_mu(event)
    if mu is None or not mu <= 1 / _NOISE_SCALES[0]:
        return None
    mu = max(mu, 1 / _NOISE_SCALES[1])
    return 0.5 * mu * mu


def _composed_gaussian(event: DpEvent) -> LawPair | None:
    mu = _gaussian_mu(event)
    if mu is None or not math.isfinite(mu):
        return None
    return LawPair.symmetric(GaussianLaw(mu), "closed form (composed Gaussians)")


for _kind in (ComposedEvent, SelfComposedEvent):
    exact_laws.register(_kind, _composed_gaussian)


@exact_laws.register
def _(event: PoissonSampledEvent) -> LawPair | None:
    q = float(event.sampling_rate)
    if q == 1.0:
        return exact_laws(event.event)
    inner = event.event
    if isinstance(inner, GaussianEvent | LaplaceEvent):
        scale = min(float(inner.noise_multiplier), _NOISE_SCALES[1])
        if scale >= _NOISE_SCALES[0]:
            noise: prof.GaussianNoise | prof.LaplaceNoise = (
                prof.GaussianNoise(scale) if isinstance(inner, GaussianEvent)
                else prof.LaplaceNoise(scale)
            )
            return LawPair(
                MixtureLaw(prof.MixtureProfile(noise, q, "remove")),
                MixtureLaw(prof.MixtureProfile(noise, q, "add")),
                MixtureLaw(prof.MixtureProfile(noise, q, "remove")),
                MixtureLaw(prof.MixtureProfile(noise, q, "add")),
                "closed form (Poisson-sampled mixture)",
                Neighbouring.ADD_REMOVE,
            )
    base = exact_laws(inner)
    exact_atoms = isinstance(
        inner,
        DiscreteLaplaceEvent | DiscreteGaussianEvent | NameAndShameEvent | GaussianEvent
        | LaplaceEvent,
    )
    if base is None or not exact_atoms or not isinstance(base.remove, AtomLaw):
        return None
    if base.relation is Neighbouring.REPLACE:  # pragma: no cover - no such atom leaf
        return None
    law = base.remove
    atoms = prof.Atoms(law.losses, law.masses, law.infinity_mass, None)
    remove = _atoms_law(prof.subsample_atoms(atoms, q, "remove"))
    add = _atoms_law(prof.subsample_atoms(atoms, q, "add"))
    # The sampled pair of the mechanism's own pair (Zhu, Dong and Wang 2022, Theorem 8).
    return LawPair(remove, add, remove, add, "exact atoms (Poisson-sampled)",
                   Neighbouring.ADD_REMOVE)


def relation_of(pair_relations: list[Neighbouring | None]) -> Neighbouring | None:
    """The one relation the parts are stated under (None: any); mixed relations raise."""
    named = {r for r in pair_relations if r is not None}
    if len(named) > 1:
        raise UnsupportedEventError(
            "the composed events are stated under different neighbouring relations "
            f"({', '.join(sorted(str(r) for r in named))}); account them separately"
        )
    return named.pop() if named else None


def blocks(event: DpEvent, count: int = 1) -> list[Block]:
    """The event's building blocks with closed-form laws, each with how often it runs.

    Raises ``UnsupportedEventError`` for what has no law of its own here: sampling without
    replacement and Poisson sampling of anything but one Gaussian, Laplace or discrete
    mechanism. Their PLDs are dominating pairs, which bound the approximate delta but not the
    probabilistic one (pDP is not closed under post-processing).
    """
    laws = exact_laws(event)
    if laws is not None:
        return [Block(laws, count, event)]
    match event:
        case ComposedEvent(events=children):
            if not children:
                raise UnsupportedEventError("ComposedEvent with no events has no privacy loss")
            out: list[Block] = []
            for child, times in Counter(children).items():
                out.extend(blocks(child, count * times))
            return out
        case SelfComposedEvent(event=inner, count=times):
            return blocks(inner, count * times)
        case PoissonSampledEvent() | SampledWithoutReplacementEvent():
            raise UnsupportedEventError(
                "the probabilistic reading needs the sampled mechanism's own privacy loss, "
                "known here for one Gaussian, Laplace or discrete mechanism under Poisson "
                f"sampling, not for {type(event).__name__} of {type(event.event).__name__}; "
                "its PLD is a dominating pair, which bounds the approximate delta only"
            )
    raise UnsupportedEventError(  # pragma: no cover - every event type is handled above
        f"no privacy loss law for {type(event).__name__}"
    )
