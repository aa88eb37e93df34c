"""The black-box auditor: a statistically valid lower bound on a mechanism's epsilon.

Method (the standard one for black-box DP auditing, e.g. Ding, Wang, Wang, Zhang and Kifer,
"Detecting violations of differential privacy", CCS 2018; Jagielski, Ullman and Oprea, "Auditing
differentially private machine learning", NeurIPS 2020):

1. Draw ``n`` outputs of M(D1) and ``n`` of M(D2).
2. On the first half of each sample, choose an event S for each direction (S likely under D1
   and unlikely under D2, and the reverse); see ``_events``.
3. On the second half, which is independent of the choice, bound each chosen event exactly:
   a Clopper–Pearson lower bound p1 on the favoured side's P[M(D) in S] and an upper bound p2 on
   the other side's.
4. If M is (epsilon, delta)-DP then P[M(Da) in S] <= e^epsilon P[M(Db) in S] + delta for either
   order, so epsilon >= ln((p1 - delta) / p2) whenever the two bounds hold.

Confidence: two directions times two one-sided bounds make four bounds; each is taken at level
beta / 4, so by the union bound all four hold together with probability at least 1 - beta, and
then the larger of the two directions' values is a valid lower bound. Nothing else is random: the
selection half only decides *which* events are tested.

What the caller must supply for that to hold: each sampler's draws are independent and
identically distributed (the same dataset, fresh randomness every draw, no state carried across
draws or calls), and the two samplers are independent of each other.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

import numpy as np
import numpy.typing as npt

from dpcurator import _validation as check
from dpcurator.audit._clopper_pearson import _lower_bounds, _upper_bounds
from dpcurator.audit._events import (
    Choice,
    Scorer,
    choose_interval,
    choose_outcome_set,
)
from dpcurator.errors import UserError, UserTypeError

__all__ = ["AuditResult", "EventFamily", "Releasing", "audit_epsilon", "audit_mechanism"]

EventFamily = Literal["auto", "threshold", "interval", "set"]
"""Which events the auditor may test; ``"auto"`` picks from the output dtype (see audit_epsilon)."""

Sampler = Callable[[int], npt.ArrayLike]
Statistic = Callable[[npt.NDArray[Any]], npt.ArrayLike]

_FAMILIES: tuple[str, ...] = get_args(EventFamily)
_NUMERIC_KINDS = "biuf"
_MAX_AUTO_SET_OUTCOMES = 256
_TEXT_KINDS = "US"


class Releasing(Protocol):
    """Anything with ``release(x)`` that maps an array of inputs to an array of noisy outputs."""

    def release(self, x: Any) -> Any:
        """Return a noisy release of ``x``, same shape, independent noise per element."""
        ...


@dataclass(frozen=True)
class AuditResult:
    """What an audit found: a lower bound on epsilon and the evidence behind it.

    With probability at least ``confidence`` (over the auditor's draws), the mechanism's true
    epsilon at the stated ``delta`` is at least ``epsilon_lower``. ``epsilon_lower`` is ``-inf``
    when no tested event gave a positive numerator, and may be negative or 0: both mean "no
    evidence against any epsilon >= 0".

    ``favours`` names the dataset under which the chosen event is more likely: ``p1_lower`` is
    the lower confidence bound on P[M(favours) in S] and ``p2_upper`` the upper bound on the
    other dataset's P[M in S], both on the test half. ``n`` is the number of draws per dataset.
    """

    epsilon_lower: float
    event: str
    p1_lower: float
    p2_upper: float
    n: int
    confidence: float
    delta: float
    favours: Literal["D1", "D2"] = "D1"

    def exceeds(self, epsilon: float) -> bool:
        """True when the audit refutes the claim ``epsilon`` (at this ``delta``).

        That is, ``epsilon_lower > epsilon``: a correct mechanism makes this True with
        probability at most ``1 - confidence``.
        """
        return self.epsilon_lower > epsilon


def audit_epsilon(
    sample_d1: Sampler,
    sample_d2: Sampler,
    *,
    n: int,
    failure_probability: float = 1e-7,
    delta: float = 0.0,
    events: EventFamily = "auto",
    statistic: Statistic | None = None,
    batch_size: int | None = None,
) -> AuditResult:
    """Lower-bound the epsilon of a mechanism from its outputs on two neighbouring datasets.

    The result is a valid lower bound with probability at least ``1 - failure_probability``,
    whatever the mechanism, provided each sampler returns independent, identically distributed
    draws (see the module docstring for the method and its confidence split).

    Args:
        sample_d1: ``sample_d1(k)`` returns k fresh outputs of M(D1) as an array whose first
            axis indexes draws.
        sample_d2: the same for M(D2), the neighbouring dataset.
        n: draws per dataset (at least 2); half choose the event, half test it.
        failure_probability: beta, the probability that the reported bound is wrong.
        delta: the claimed delta; 0 audits pure DP. It is subtracted from the favoured side.
        events: ``"threshold"`` (``x >= t`` and ``x <= t``), ``"interval"`` (also
            ``a <= x <= b``), ``"set"`` (sets of outcomes, for discrete outputs) or ``"auto"``:
            sets for bool, string and object outputs, thresholds for floats, and the better of
            thresholds and sets (judged on the selection half) for integers.
        statistic: needed when each draw is not a scalar (for example a vector output, one row
            per draw). It is called on a batch of draws (first axis = draws) and must return one
            scalar per draw, e.g. ``lambda rows: rows[:, 0]`` or ``lambda rows: rows.sum(axis=1)``.
            It may also transform scalar draws.
        batch_size: draw at most this many outputs per sampler call (to bound memory); the
            default draws all ``n`` in one call.

    Raises:
        TypeError: if an argument has the wrong type, or the outputs suit no event family.
        ValueError: if an argument is out of range, a sampler returns the wrong number of draws,
            non-scalar draws come without ``statistic``, or float outputs contain NaN.
    """
    draws = _check_draw_count(n)
    beta = check.unit_interval("failure_probability", failure_probability)
    claimed_delta = check.unit_interval("delta", delta, include_zero=True)
    family = _check_family(events)
    batch = _check_batch_size(batch_size, draws)
    if not callable(sample_d1) or not callable(sample_d2):
        raise UserTypeError("sample_d1 and sample_d2 must be callables: sample(k) -> k draws")
    if statistic is not None and not callable(statistic):
        raise UserTypeError("statistic must be a callable mapping a batch of draws to scalars")

    # Each: shape (n,), one scalar or hashable outcome per draw.
    outputs_1 = _draw(sample_d1, "sample_d1", draws, batch, statistic)
    outputs_2 = _draw(sample_d2, "sample_d2", draws, batch, statistic)
    outputs_1, outputs_2 = _common_kind(outputs_1, outputs_2)
    families = _families_for(family, outputs_1.dtype.kind)
    half = draws // 2
    if family == "auto" and "threshold" in families and "set" in families:
        # Many distinct integer outputs: a set event would be fitted to noise on the selection
        # half (each outcome seen a handful of times), so only thresholds are searched.
        distinct = np.unique(np.concatenate([outputs_1[:half], outputs_2[:half]])).size
        if distinct > _MAX_AUTO_SET_OUTCOMES:
            families = ("threshold",)

    # Four one-sided bounds (two directions x lower/upper) share beta: the union bound.
    alpha = beta / 4.0
    selection_scorer = Scorer(
        selection_trials=half, test_trials=draws - half, alpha=alpha, delta=claimed_delta
    )
    choices = _choose_events(families, outputs_1[:half], outputs_2[:half], selection_scorer)

    test = {"D1": outputs_1[half:], "D2": outputs_2[half:]}
    name = "x" if statistic is None else "statistic(x)"
    results = [
        _test_event(choice, test, draws, beta, alpha, claimed_delta, name) for choice in choices
    ]
    return max(results, key=lambda result: result.epsilon_lower)


def audit_mechanism(
    mechanism: Releasing,
    x1: npt.ArrayLike,
    x2: npt.ArrayLike,
    *,
    n: int,
    failure_probability: float = 1e-7,
    delta: float = 0.0,
    events: EventFamily = "auto",
    statistic: Statistic | None = None,
    batch_size: int | None = None,
) -> AuditResult:
    """Audit ``mechanism.release`` on the neighbouring query answers ``x1`` and ``x2``.

    ``x1`` and ``x2`` are the exact answers of a query on D1 and D2 (scalars, or arrays of the
    same shape for a vector query). Draws are vectorised: one call
    ``mechanism.release(np.broadcast_to(x1, (k, *x1.shape)).copy())`` yields k independent draws,
    one per element (scalar query) or per row (vector query), which is how every dpcurator
    mechanism treats an array input. Vector outputs need ``statistic``; the other arguments are
    those of ``audit_epsilon``, whose guarantee this inherits.
    """
    input_1 = np.asarray(x1)
    input_2 = np.asarray(x2)
    if input_1.shape != input_2.shape:
        raise UserError(
            f"x1 and x2 must have the same shape, got {input_1.shape} and {input_2.shape}"
        )
    if not callable(getattr(mechanism, "release", None)):
        raise UserTypeError("mechanism must have a release(x) method")
    return audit_epsilon(
        _mechanism_sampler(mechanism, input_1),
        _mechanism_sampler(mechanism, input_2),
        n=n,
        failure_probability=failure_probability,
        delta=delta,
        events=events,
        statistic=statistic,
        batch_size=batch_size,
    )


def _mechanism_sampler(mechanism: Releasing, answer: npt.NDArray[Any]) -> Sampler:
    """A sampler releasing ``answer`` k times in one vectorised call."""

    def sample(size: int) -> npt.NDArray[Any]:
        # Shape (size, *answer.shape): one copy of the query answer per draw.
        inputs = np.broadcast_to(answer, (size, *answer.shape)).copy()
        released = np.asarray(mechanism.release(inputs))
        if released.shape != inputs.shape:
            raise UserError(
                f"mechanism.release returned shape {released.shape} for input shape "
                f"{inputs.shape}; release must return the shape it was given"
            )
        return released

    return sample


# --- argument checks -------------------------------------------------------------------------


def _check_draw_count(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise UserTypeError(f"n must be an integer, got {type(n).__name__}")
    if n < 2:
        raise UserError(f"n must be at least 2 (half select, half test), got {n}")
    return int(n)


def _check_family(value: str) -> str:
    if value not in _FAMILIES:
        raise UserError(f"events must be one of {', '.join(_FAMILIES)}; got {value!r}")
    return value


def _check_batch_size(value: int | None, draws: int) -> int:
    if value is None:
        return draws
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise UserTypeError(f"batch_size must be an integer or None, got {type(value).__name__}")
    if value < 1:
        raise UserError(f"batch_size must be at least 1, got {value}")
    return int(value)


# --- drawing ---------------------------------------------------------------------------------


def _draw(
    sampler: Sampler, label: str, draws: int, batch: int, statistic: Statistic | None
) -> npt.NDArray[Any]:
    """Call ``sampler`` until ``draws`` outputs are collected; returns shape (draws,)."""
    parts: list[npt.NDArray[Any]] = []
    remaining = draws
    while remaining > 0:
        size = min(batch, remaining)
        raw = np.asarray(sampler(size))
        if raw.ndim == 0 or raw.shape[0] != size:
            raise UserError(
                f"{label}({size}) returned an array of shape {raw.shape}; "
                f"expected {size} draws along the first axis"
            )
        if statistic is not None:
            values = np.asarray(statistic(raw))
            if values.shape != (size,):
                raise UserError(
                    f"statistic returned shape {values.shape} for a batch of {size} draws; it "
                    f"must return one scalar per draw, shape ({size},), e.g. rows[:, 0]"
                )
        elif raw.ndim != 1:
            raise UserError(
                f"{label} returns draws of shape {raw.shape[1:]}, not scalars; pass statistic= "
                "to map each draw to a scalar, e.g. statistic=lambda rows: rows[:, 0]"
            )
        else:
            values = raw
        parts.append(values)
        remaining -= size
    outputs = np.concatenate(parts)
    if outputs.dtype.kind == "f" and bool(np.isnan(outputs).any()):
        raise UserError(
            f"{label} produced NaN outputs; map them to a comparable value with statistic="
        )
    return outputs


def _category(kind: str) -> str:
    if kind in _NUMERIC_KINDS:
        return "numeric"
    if kind in _TEXT_KINDS:
        return "text"
    return kind


def _common_kind(
    outputs_1: npt.NDArray[Any], outputs_2: npt.NDArray[Any]
) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """Outputs of different kinds (say ints and strings) are compared as Python objects."""
    if _category(outputs_1.dtype.kind) == _category(outputs_2.dtype.kind):
        return outputs_1, outputs_2
    return outputs_1.astype(object), outputs_2.astype(object)


def _families_for(family: str, kind: str) -> tuple[str, ...]:
    """The event families to search, from the requested family and the output dtype kind."""
    if family == "auto":
        if kind in "iu":
            return ("threshold", "set")
        if kind == "f":
            return ("threshold",)
        if kind in "bUSO":
            return ("set",)
    elif family == "set":
        if kind in "biufUSO":
            return ("set",)
    elif kind in _NUMERIC_KINDS:
        return (family,)
    raise UserTypeError(
        f"events={family!r} cannot be used on outputs of numpy dtype kind {kind!r}; scalar "
        "events need real numbers and set events need bool, integer, string or hashable outputs"
    )


# --- choosing and testing events ---------------------------------------------------------------


def _choose_events(
    families: tuple[str, ...],
    selection_1: npt.NDArray[Any],
    selection_2: npt.NDArray[Any],
    scorer: Scorer,
) -> tuple[Choice, Choice]:
    """For each direction, the best-scoring event over the allowed families (selection half)."""
    best: dict[str, Choice] = {}
    for family in families:
        if family == "set":
            found = choose_outcome_set(selection_1, selection_2, scorer)
        else:
            found = choose_interval(
                selection_1.astype(np.float64),
                selection_2.astype(np.float64),
                scorer,
                pairs=family == "interval",
            )
        for choice in found:
            current = best.get(choice.favours)
            if current is None or choice.score > current.score:
                best[choice.favours] = choice
    return best["D1"], best["D2"]


def _test_event(
    choice: Choice,
    test: dict[str, npt.NDArray[Any]],
    draws: int,
    beta: float,
    alpha: float,
    delta: float,
    name: str,
) -> AuditResult:
    """Bound the chosen event on the independent test halves and turn it into an epsilon bound."""
    favoured = choice.favours
    other = "D2" if favoured == "D1" else "D1"
    trials = test[favoured].size
    k_favoured = np.array([choice.event.count(test[favoured])], dtype=np.int64)
    k_other = np.array([choice.event.count(test[other])], dtype=np.int64)
    p1_lower = float(_lower_bounds(k_favoured, trials, alpha)[0])
    p2_upper = float(_upper_bounds(k_other, trials, alpha)[0])
    numerator = p1_lower - delta
    if numerator > 0.0:
        # Rounded down one ulp so floating point never overstates the bound.
        epsilon_lower = math.nextafter(math.log(numerator / p2_upper), -math.inf)
    else:
        epsilon_lower = -math.inf
    return AuditResult(
        epsilon_lower=epsilon_lower,
        event=f"{choice.event.describe(name)} (more likely on {favoured} than on {other})",
        p1_lower=p1_lower,
        p2_upper=p2_upper,
        n=draws,
        confidence=1.0 - beta,
        delta=delta,
        favours=favoured,
    )
