"""The probabilistic delta of a composition, on a grid rounded up (private; the public surface
is ``accounting.loss``).

The loss of a composition is the sum of the losses of its parts, each taken conditionally on
the outputs before it (Sommer, Meiser and Mohammadi, "Privacy loss classes", PoPETs 2019,
Section 4). If every part's loss is dominated by a variable U_i (P[L_i > t | past] <= P[U_i > t]
for all t), the sum is dominated by the sum of independent U_i (couple each L_i below its U_i,
one step at a time). So P[sum L_i > eps] <= P[sum U_i > eps]: the probabilistic delta of the
composition is bounded by a tail of the convolution of the U_i.

Here U_i is the part's loss *rounded up* to the grid h (mass in the cell (a - h, a] moved to a,
mass above the range to +infinity, mass below it to its lowest point), so U_i >= L_i; the
convolution is the PLD accountant's (``_pld_core.convolve`` and ``self_convolve``), whose every
truncation moves mass to higher losses and whose FFT window bounds the mass it would fold
downwards (Chernoff) and adds it at +infinity: each step keeps the domination. Rounding up
shifts each part by at most h (h / 2 on average), so the interval is chosen so that n parts
move the total by a small fraction of its spread; parts whose losses are multiples of one
spacing (randomized response, discrete Laplace) are held exactly on that grid.

Unlike the approximate delta, this reading cannot be taken from the connect-the-dots PLD:
connect the dots keeps every hockey-stick divergence above the truth, but it moves part of a
cell's mass down, so its P[L > eps] can fall below the true one.

A second bound needs no grid: Markov's inequality on e^((alpha - 1) L) gives
P[L > eps] <= exp((alpha - 1) (D_alpha - eps)) for every Renyi order alpha > 1, since
E_P[e^((alpha - 1) L)] = e^((alpha - 1) D_alpha(P || Q)) (Mironov, "Renyi differential
privacy", CSF 2017, Definition 3), with D_alpha bounded by the Renyi accountant (``rdp``; a
bound on D_alpha holds for the mechanism itself, whatever pair it was derived from, by the data
processing inequality). The profile reports the smaller of the two.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from dpcurator.accounting import _pld_core as core
from dpcurator.accounting._loss_events import Block, LawPair
from dpcurator.accounting._loss_laws import ATOM_TOLERANCE, AtomLaw, FloatArray, Law
from dpcurator.accounting.events import ComposedEvent, DpEvent, SelfComposedEvent
from dpcurator.accounting.guarantees import Neighbouring
from dpcurator.errors import InternalError, UnsupportedEventError

__all__ = [
    "GridBuild",
    "build_upward",
    "choose_interval",
    "renyi_delta",
    "renyi_epsilon",
    "renyi_tail",
    "upward_pmf",
]

#: Mass cut at each truncation (moved up: to +infinity or the lowest kept point).
TAIL = 1e-15
#: Grid cells per standard deviation of the smallest single step (as ``_pld_sources``).
CELLS_PER_SD = 20.0
#: How many times a grid that does not fit is widened (its interval doubled).
WIDENINGS = 12


def upward_pmf(law: Law, h: float) -> core.RawPmf:
    """The law rounded up to the grid h: every loss moves to the next grid point at or above it.

    Atoms on a grid point (to ``ATOM_TOLERANCE``) stay; a continuous law is cut into cells
    (a - h, a] between the points covering all but 2 * ``TAIL`` of its mass, the mass below the
    first point joins it and the mass above the last goes to +infinity.
    """
    if isinstance(law, AtomLaw):
        losses, masses = law.atoms()
        infinity_mass = law.infinity_mass
        if losses.size == 0:
            return core.RawPmf(0, np.zeros(1), infinity_mass)
        x = losses / h
        nearest = np.rint(x)
        snapped = np.abs(x - nearest) <= ATOM_TOLERANCE * np.maximum(1.0, np.abs(losses)) / h
        index = np.where(snapped, nearest, np.ceil(x)).astype(np.int64)
        lo, hi = int(index.min()), int(index.max())
        if hi - lo + 1 > core.MAX_GRID_POINTS:
            raise core.GridTooLargeError(f"interval {h:g} is too fine for these losses")
        probs = np.bincount(index - lo, weights=masses, minlength=hi - lo + 1).astype(np.float64)
        return core.RawPmf(lo, probs, infinity_mass)
    lo_loss, hi_loss = law.bounds(TAIL)
    i_lo = math.floor(lo_loss / h)
    i_hi = max(math.ceil(hi_loss / h), i_lo + 1)
    if i_hi - i_lo + 1 > core.MAX_STEP_POINTS * 4:
        raise core.GridTooLargeError(f"interval {h:g} is too fine for losses in "
                                     f"[{lo_loss:g}, {hi_loss:g}]")
    sf = law.sf_p(np.arange(i_lo, i_hi + 1, dtype=np.float64) * h)
    probs = np.empty(sf.size)
    probs[0] = 1.0 - sf[0]  # everything at or below the first point
    probs[1:] = sf[:-1] - sf[1:]  # the cells (a - h, a]
    np.maximum(probs, 0.0, out=probs)
    return core.RawPmf(i_lo, probs, float(sf[-1]))  # above the last point: +infinity


class GridBuild:
    """Upward grid PMFs of a composition's blocks, composed (both orders of the pair)."""

    def __init__(self, h: float) -> None:
        self.h = h
        self._memo: dict[int, tuple[core.RawPmf, core.RawPmf]] = {}

    def pair(self, laws: LawPair) -> tuple[core.RawPmf, core.RawPmf]:
        key = id(laws)
        found = self._memo.get(key)
        if found is None:
            remove = upward_pmf(laws.remove, self.h)
            add = remove if laws.add is laws.remove else upward_pmf(laws.add, self.h)
            found = self._memo[key] = (remove, add)
        return found

    def event(self, event: DpEvent, laws_of: dict[DpEvent, LawPair]) -> tuple[
            core.RawPmf, core.RawPmf]:
        """(remove, add) upward PMFs of the event (its blocks' laws in ``laws_of``)."""
        laws = laws_of.get(event)
        if laws is not None:
            return self.pair(laws)
        if isinstance(event, SelfComposedEvent):
            remove, add = self.event(event.event, laws_of)
            return self._power(remove, add, event.count)
        if isinstance(event, ComposedEvent):
            total: tuple[core.RawPmf, core.RawPmf] | None = None
            for child, count in Counter(event.events).items():
                remove, add = self.event(child, laws_of)
                if count > 1:
                    remove, add = self._power(remove, add, count)
                if total is None:
                    total = (remove, add)
                else:
                    total = (core.convolve(total[0], remove, TAIL),
                             core.convolve(total[1], add, TAIL))
            assert total is not None
            return total
        raise UnsupportedEventError(  # pragma: no cover - blocks() refused it first
            f"no grid for {type(event).__name__}")

    @staticmethod
    def _power(remove: core.RawPmf, add: core.RawPmf, count: int) -> tuple[
            core.RawPmf, core.RawPmf]:
        if remove is add:
            powered = core.self_convolve(remove, count, TAIL)
            return powered, powered
        r, a = core.self_convolve_all([remove, add], count, TAIL)
        return r, a


def choose_interval(blocks: list[Block]) -> tuple[float, bool]:
    """A grid interval for the composition, and whether it holds every block exactly.

    Exact: every block's finite losses are multiples of one spacing g (or only 0); then h = g.
    Otherwise h = min(sd / 20, 0.01) / max(1, 2 sqrt(n)) for the smallest single-step
    standard deviation sd and n runs in all: rounding up moves the sum by about n h / 2, which
    is then at most an eightieth of the sum's own spread (sqrt(n) sd). A grid that does not fit
    ``MAX_GRID_POINTS`` is widened by the caller.
    """
    spacings = [b.laws.spacing for b in blocks]
    if all(g is not None for g in spacings):
        positive = [g for g in spacings if g is not None and g > 0]
        if not positive:
            return 1.0, True
        g_min = min(positive)
        if all(abs(g / g_min - round(g / g_min)) < 1e-9 for g in positive):
            return g_min, True
    steps = sum(b.count for b in blocks)
    sds = [
        law.moments()[1]
        for b in blocks
        for law in (b.laws.remove, b.laws.add)
        if law.moments()[1] > 0
    ]
    h = min(min(sds) / CELLS_PER_SD, 0.01) if sds else 0.01
    h /= max(1.0, 2.0 * math.sqrt(steps))
    # the composed window: a block spans its width once, many runs spread like sqrt(count) (the
    # FFT window holds about 16 standard deviations of the sum at a tail mass of 1e-15)
    window = 0.0
    for b in blocks:
        lo, hi = b.laws.remove.bounds(TAIL)
        lo2, hi2 = b.laws.add.bounds(TAIL)
        width = max(hi - lo, hi2 - lo2, 0.0)
        sd = max(b.laws.remove.moments()[1], b.laws.add.moments()[1])
        window += min(width * b.count, width + 16.0 * math.sqrt(b.count) * sd)
    # windows of about half the largest grid (memory: about 250 MB at most); ``build_upward``
    # widens a grid that does not fit
    h = max(h, 2.1 * window / core.MAX_GRID_POINTS)
    return h, False


def build_upward(event: DpEvent, blocks: list[Block]) -> tuple[float, core.RawPmf, core.RawPmf]:
    """(interval, remove PMF, add PMF) of the event rounded up, widening a grid too large."""
    laws_of = {b.event: b.laws for b in blocks}
    h, _ = choose_interval(blocks)
    for widening in range(WIDENINGS + 1):
        try:
            remove, add = GridBuild(h).event(event, laws_of)
            return h, remove, add
        except core.GridTooLargeError:
            if widening == WIDENINGS:
                raise
            h *= 2.0
    raise InternalError("unreachable; this is probably a bug")  # pragma: no cover


def renyi_tail(
    event: DpEvent, relation: Neighbouring
) -> tuple[FloatArray, FloatArray, float] | None:
    """(orders, D_alpha bounds, pure epsilon) of the event from the Renyi accountant, or None.

    The bound holds for every ordered pair of neighbours (``RDPAccountant``'s guarantee), so
    both orders of the pair share it.
    """
    from dpcurator.accounting.rdp import RDPAccountant

    accountant = RDPAccountant(neighbouring=relation)
    if not accountant.supports(event):
        return None
    accountant.compose(event)
    rdp = accountant.rdp
    return (np.asarray(rdp.orders, dtype=np.float64),
            np.asarray(rdp.epsilons, dtype=np.float64), accountant.pure_epsilon)


def renyi_delta(bound: tuple[FloatArray, FloatArray, float], eps: FloatArray) -> FloatArray:
    """min over alpha of exp((alpha - 1) (D_alpha - eps)), and 0 from the pure epsilon on."""
    orders, divergences, pure = bound
    with np.errstate(invalid="ignore", over="ignore"):
        log = (orders[:, None] - 1.0) * (divergences[:, None] - eps[None, :])
    log = np.where(np.isnan(log), np.inf, log)
    out: FloatArray = np.exp(np.minimum(np.min(log, axis=0), 0.0))
    out = np.where(eps >= pure, 0.0, out)
    # rounded up like every other Renyi bound here (relative 1e-9)
    return np.minimum(out * (1.0 + 1e-9), 1.0)


def renyi_epsilon(bound: tuple[FloatArray, FloatArray, float], delta: float) -> float:
    """The smallest eps the Markov bound gives at ``delta``: min over alpha of
    D_alpha + ln(1 / delta) / (alpha - 1), or the pure epsilon."""
    orders, divergences, pure = bound
    if delta <= 0.0:
        return pure
    with np.errstate(invalid="ignore", over="ignore"):
        candidates = divergences + math.log(1.0 / delta) / (orders - 1.0)
    candidates = np.where(np.isnan(candidates), np.inf, candidates)
    best = max(min(float(np.min(candidates)), pure), 0.0)
    return math.nextafter(best * (1.0 + 1e-9), math.inf) if best > 0 else 0.0
