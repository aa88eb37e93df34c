"""The front door of accounting: the tightest sound (epsilon, delta) for what happened.

``account(event, delta=...)`` asks every accountant that can analyse the event -- the
privacy-loss-distribution accountant (``pld``), the Renyi accountant (``rdp``), for sequences
of plain (epsilon, delta) guarantees the composition theorems (``composition``), and for
compositions of plain Gaussian mechanisms the exact curve of the analytic Gaussian mechanism
(``analytic-gaussian``) -- and reports the smallest epsilon, naming the method that gave it.

Soundness. Every method returns an upper bound on the true epsilon at that delta, or +inf
(``pld`` when its grid cannot hold the losses, as for a Gaussian with sigma below about 0.03;
every method at delta = 0 for a mechanism whose loss is unbounded), so their minimum is one
too. The analytic Gaussian curve is exact, so a candidate below it would be a bug; it is
dropped (and the note says so) rather than reported. When none of the requested methods gives
a finite epsilon, the other sound methods are tried before +inf is reported, and ``method``
and ``note`` say which answered.

Cost: bounded for every accepted input (see ``account``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from dpcurator.accounting import composition as comp
from dpcurator.accounting.conversions import gdp_to_epsilon
from dpcurator.accounting.events import (
    ApproxDPEvent,
    ComposedEvent,
    DpEvent,
    GaussianEvent,
    PoissonSampledEvent,
    PureDPEvent,
    SelfComposedEvent,
)
from dpcurator.accounting.guarantees import ApproxDP, Neighbouring, PureDP
from dpcurator.accounting.pld import pld_epsilon
from dpcurator.accounting.rdp import RDPAccountant
from dpcurator.errors import UnsupportedEventError, UserError

__all__ = ["METHODS", "AccountingResult", "Method", "account"]

Method = str  # one of METHODS

#: Every method ``account`` knows, in the order it falls back to them.
METHODS: tuple[Method, ...] = ("pld", "analytic-gaussian", "rdp", "composition")

# The exact curve is rounded up by 1e-9 (relative); a candidate below it by more than this is
# not a rounding difference but a wrong bound.
_EXACT_SLACK = 1e-12


@dataclass(frozen=True)
class AccountingResult:
    """The tightest epsilon found at ``delta``, the method that found it, and the others.

    ``epsilon`` may be +inf (no method bounds the event at this delta: every Gaussian at
    delta = 0, for one); ``note`` then says why, and says when ``method`` is a fallback from
    the methods asked for. ``candidates`` holds every method's epsilon (+inf included).
    """

    epsilon: float
    delta: float
    method: Method
    candidates: dict[Method, float] = field(default_factory=dict)
    note: str = ""

    @property
    def guarantee(self) -> ApproxDP:
        """The result as (epsilon, delta)-DP; ``ValueError`` when epsilon is +inf."""
        if not math.isfinite(self.epsilon):
            raise UserError(f"no finite epsilon at delta={self.delta!r}: {self.note}")
        return ApproxDP(self.epsilon, self.delta)


def _plain_guarantees(event: DpEvent) -> list[PureDP | ApproxDP] | None:
    """The event as a list of (epsilon, delta) guarantees, if it is nothing more than that."""
    if isinstance(event, PureDPEvent):
        return [PureDP(event.epsilon)]
    if isinstance(event, ApproxDPEvent):
        return [ApproxDP(event.epsilon, event.delta)]
    if isinstance(event, SelfComposedEvent):
        inner = _plain_guarantees(event.event)
        return None if inner is None else inner * event.count
    if isinstance(event, ComposedEvent):
        parts: list[PureDP | ApproxDP] = []
        for e in event.events:
            inner = _plain_guarantees(e)
            if inner is None:
                return None
            parts.extend(inner)
        return parts
    return None


def _gaussian_mu(event: DpEvent) -> float | None:
    """mu of the one Gaussian mechanism that a structure of Gaussians is, or None.

    Gaussian mechanisms with noise multipliers s_i compose to exactly one with
    1/s^2 = sum 1/s_i^2, i.e. mu-GDP with mu^2 = sum 1/s_i^2 (Dong, Roth and Su, "Gaussian
    differential privacy", JRSS-B 2022, Corollary 3.3); Poisson sampling at rate 1 is no
    sampling. None if anything else is in the event.
    """
    match event:
        case GaussianEvent(noise_multiplier=sigma):
            return 1.0 / sigma
        case SelfComposedEvent(event=inner, count=count):
            mu = _gaussian_mu(inner)
            return None if mu is None else mu * math.sqrt(count)
        case PoissonSampledEvent(sampling_rate=q, event=inner) if q == 1.0:
            return _gaussian_mu(inner)
        case ComposedEvent(events=children) if children:
            total = 0.0
            for child in children:
                mu = _gaussian_mu(child)
                if mu is None:
                    return None
                total += mu * mu
            return math.sqrt(total)
    return None


def _analytic_gaussian(event: DpEvent, delta: float) -> float:
    """Exact epsilon of a composition of Gaussians: the mu-GDP curve (Balle and Wang,
    "Improving the Gaussian mechanism for differential privacy", ICML 2018, Theorem 8; Dong,
    Roth and Su 2022, Corollary 2.13), rounded up. +inf at delta = 0 (the loss is unbounded)."""
    mu = _gaussian_mu(event)
    if mu is None:
        raise UnsupportedEventError("the analytic Gaussian curve covers compositions of Gaussians")
    if delta == 0.0 or not mu < 1e100:  # mu^2 / 2 would overflow: no finite bound is needed
        return math.inf
    return gdp_to_epsilon(mu, delta)


def _rdp(event: DpEvent, delta: float) -> float:
    # Events stated under "replace one" (randomized response, sampling without replacement)
    # are refused under add/remove: ask under each relation in turn.
    try:
        return RDPAccountant(neighbouring=Neighbouring.ADD_REMOVE).compose(event).get_epsilon(delta)
    except (UnsupportedEventError, ValueError):
        return RDPAccountant(neighbouring=Neighbouring.REPLACE).compose(event).get_epsilon(delta)


def _composition(event: DpEvent, delta: float) -> float:
    plain = _plain_guarantees(event)
    if not plain:
        raise UnsupportedEventError("composition theorems cover (epsilon, delta) guarantees only")
    found = comp.compose(plain, target_delta=delta if delta > 0 else None)
    return found.guarantee.epsilon if found.guarantee.delta <= delta else math.inf


_RUNNERS: dict[Method, Callable[[DpEvent, float], float]] = {
    "pld": pld_epsilon,
    "analytic-gaussian": _analytic_gaussian,
    "rdp": _rdp,
    "composition": _composition,
}


def account(
    event: DpEvent,
    *,
    delta: float,
    methods: tuple[Method, ...] = ("pld", "rdp", "composition", "analytic-gaussian"),
) -> AccountingResult:
    """The smallest sound epsilon at ``delta`` over the requested methods.

    Methods: "pld", "rdp", "composition" and "analytic-gaussian" (``METHODS``). If none of
    them gives a finite epsilon (a PLD whose grid cannot hold the losses reports +inf), the
    remaining methods of ``METHODS`` are tried in that order, and ``note`` says which answered.
    An epsilon of +inf is returned, not raised, when every method that can analyse the event
    gives +inf (a Gaussian at delta = 0); ``UnsupportedEventError`` when none can analyse it.

    Cost: at most about 200 MiB of working memory (the PLD's grids, ``MAX_GRID_POINTS``) and a
    few seconds, for every accepted input (noise multipliers from 1e-6 to 1e6, sampling rates
    down to 1e-6, up to 10^9 steps and more).
    """
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0 <= delta < 1:
        raise UserError(f"delta must lie in [0, 1), got {delta!r}")
    if not isinstance(event, DpEvent):
        raise UserError(f"event must be a dpcurator accounting event, got {type(event).__name__}")
    unknown = [m for m in methods if m not in _RUNNERS]
    if unknown or not methods:
        raise UserError(
            f"methods must be a non-empty tuple of {', '.join(METHODS)}; got {methods!r}"
        )
    delta = float(delta)
    candidates: dict[Method, float] = {}
    inapplicable: list[str] = []  # methods that do not cover this kind of event
    reasons: list[str] = []  # methods that cover it but could not bound it here

    def run(names: tuple[Method, ...]) -> None:
        for name in names:
            try:
                value = _RUNNERS[name](event, delta)
            except UnsupportedEventError as exc:
                inapplicable.append(f"{name}: {exc}")
                continue
            except (ValueError, ArithmeticError) as exc:
                # ValueError: a grid too fine to build; ArithmeticError: a bound overflowed.
                # Either way that method gives no bound here; the others still may.
                reasons.append(f"{name}: {exc}")
                continue
            if math.isnan(value):  # pragma: no cover - every method rounds towards +inf
                reasons.append(f"{name}: no bound (NaN)")
                continue
            candidates[name] = value

    run(methods)
    note = ""
    if not any(math.isfinite(e) for e in candidates.values()):
        fallbacks = tuple(m for m in METHODS if m not in methods)
        run(fallbacks)
        answered = [m for m in fallbacks if math.isfinite(candidates.get(m, math.inf))]
        if answered:
            asked = ", ".join(methods)
            note = f"{asked} gave no finite epsilon at this delta; fell back to sound methods"
    if not candidates:
        detail = "; ".join(reasons + inapplicable) or "no method applies"
        raise UnsupportedEventError(f"no accountant could bound this event ({detail})")
    sound = dict(candidates)
    exact = sound.get("analytic-gaussian")
    mu = _gaussian_mu(event)
    # Below mu = 1e-6 the curve is evaluated at 1e-6 (gdp_to_epsilon): sound, no longer exact,
    # so it is one candidate among others there, not the floor they are checked against.
    if exact is not None and math.isfinite(exact) and mu is not None and mu >= 1e-6:
        below = [m for m, e in sound.items() if e < exact * (1.0 - _EXACT_SLACK)]
        for m in below:  # pragma: no cover - a bug in that method; never reported
            del sound[m]
            reasons.append(f"{m}: below the exact analytic Gaussian value, discarded")
    method = min(sound, key=lambda m: (sound[m], METHODS.index(m)))
    epsilon = sound[method]
    if not math.isfinite(epsilon):
        details = "; ".join(reasons)
        note = "no method gives a finite epsilon at this delta" + (
            f" ({details})" if details else ""
        )
        if delta == 0.0:
            note += "; the privacy loss is unbounded, so only delta > 0 can bound it"
    elif note:
        note = f"{note}: {method}"
    return AccountingResult(epsilon, delta, method, candidates, note)
