"""dpcurator's accountants against dp_accounting, prv-accountant and Opacus: epsilon and time.

Run it from the benchmark environment (``scripts/setup-bench`` creates it)::

    .bench-venv/bin/python benchmarks/accounting.py [--quick] [--repeats 5] [--json out.json]

Every library runs in the same process, on the same machine, one case after another:

- **dpcurator**: ``account(event, delta=..., methods=("pld",))`` with its defaults (the PLD
  accountant refines its grid until the predicted error is below 0.1%) and
  ``RDPAccountant(neighbouring=...).compose(event).get_epsilon(delta)``; internal caches are
  cleared before every timed run, so each run is cold.
- **dp_accounting** (Google): ``PLDAccountant`` at value_discretization_interval 1e-4 (its
  finest practical grid) and ``RdpAccountant``. For 10,000-step DP-SGD rows it is also timed at
  the coarsest interval of 1e-3, 5e-4, 2e-4, 1e-4, 5e-5, 2e-5, 1e-5 whose epsilon is at most
  dpcurator's: the time it needs for *the same tightness*. Its ``PLDAccountant`` composes a
  ``RandomizedResponseDpEvent`` once whatever the count (dp_accounting 0.6.0), so randomized
  response rows call ``from_randomized_response(...).self_compose(k)`` instead.
- **prv-accountant** (Microsoft): ``PRVAccountant`` with eps_error 0.01 and delta_error
  delta / 1000; its *upper* bound is reported (the estimate and lower bound go to ``--json``).
- **Opacus**: ``RDPAccountant``, ``PRVAccountant`` (its upper bound, eps_error 0.01) and
  ``GaussianAccountant`` (the CLT of Gaussian DP, which Opacus itself calls experimental).
  Opacus imports PyTorch, whose wheel from PyPI pulls gigabytes of CUDA libraries; its
  accountants are pure numpy/scipy, so when ``import opacus`` fails they are loaded by file
  path from an ``opacus`` installed with ``--no-deps`` (see ``_load_opacus``).

The truth. For k-fold Gaussian and randomized response the exact epsilon is known in closed
form (k Gaussians of sigma are one of sigma / sqrt(k), analytic curve of Balle and Wang 2018;
k binary randomized responses have a binomial privacy loss). For DP-SGD and k-fold Laplace the
script computes a *rigorous lower bound* (``lower_bound_epsilon``): the hockey-stick divergence
of a post-processing of the k outputs is at most the mechanism's (data processing), and for the
statistic "sum of the grid cells of the per-step privacy losses" it is computed exactly. Any
library reporting less than the exact value or that lower bound is flagged BELOW: its claim is
false. Relative differences are to the exact value where known, else to the smallest reported
epsilon that is not below the lower bound ("tightest valid").

Times are medians of ``--repeats`` runs (dpcurator: at least 7; fewer when a library's runs add
up to more than ``--budget`` seconds; at least one). The speed-up pair (dpcurator PLD and
dp_accounting at the same tightness) is timed alternately, at least 5 rounds, so that load from
other processes falls on both alike. The machine may be shared: compare ratios measured in one
run, not absolute times across runs. PRV accountants are skipped where their grid would exceed
``--prv-max-points`` (default 5e6): they then run for minutes in gigabytes (see
``prv_domain_points``). A full run takes about 4 minutes on 2 cores, ``--quick`` under one.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import platform
import statistics
import sys
import time
import types
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy import optimize, signal, special, stats

from dpcurator.accounting import RDPAccountant, _pld_profiles, account, rdp
from dpcurator.accounting import events as ev
from dpcurator.accounting.guarantees import Neighbouring

DELTA = 1e-5
LADDER = (1e-3, 5e-4, 2e-4, 1e-4, 5e-5, 2e-5, 1e-5)
DPA_INTERVAL = 1e-4
PRV_EPS_ERROR = 0.01
BELOW_TOLERANCE = 1e-9  # relative: floating-point noise in the references themselves

try:
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.pld import privacy_loss_distribution as dpa_pld_lib
    from dp_accounting.rdp import rdp_privacy_accountant
except ImportError:  # pragma: no cover - the benchmark still runs, the columns say SKIPPED
    dp_accounting = None

try:
    import prv_accountant
except ImportError:  # pragma: no cover
    prv_accountant = None

logging.getLogger("absl").setLevel(logging.ERROR)  # dp_accounting's RDP convergence chatter


# --------------------------------------------------------------------------------------------
# Opacus without PyTorch
# --------------------------------------------------------------------------------------------


def _load_opacus() -> tuple[types.SimpleNamespace | None, str]:
    """Opacus's RDP, PRV and GDP accountants, and how they were loaded.

    ``import opacus`` needs PyTorch. Without it, the accountant modules (numpy and scipy only)
    are imported from the installed files under stand-in parent packages: ``opacus`` and
    ``opacus.accountants`` get a ``__path__`` but their ``__init__`` (which imports torch) never
    runs, and ``opacus.accountants.accountant`` -- whose only torch use is a type import for
    optimizer hooks -- is replaced by its abstract base class's one line of state (a history
    list). The arithmetic that runs is Opacus's own, file for file.
    """
    try:
        from opacus.accountants import GaussianAccountant, PRVAccountant
        from opacus.accountants import RDPAccountant as OpacusRDP

        version = importlib.metadata.version("opacus")
        return (
            types.SimpleNamespace(RDP=OpacusRDP, PRV=PRVAccountant, GDP=GaussianAccountant),
            f"opacus {version} (imported normally)",
        )
    except ImportError:
        pass
    spec = importlib.util.find_spec("opacus")  # locates the package without running it
    if spec is None or not spec.submodule_search_locations:
        return None, (
            "opacus not installed: run scripts/setup-bench (torch from disk, then Opacus), "
            "or uv pip install --python .bench-venv/bin/python --no-deps opacus==1.6.0"
        )
    root = next(iter(spec.submodule_search_locations))
    for name in [m for m in sys.modules if m == "opacus" or m.startswith("opacus.")]:
        del sys.modules[name]
    for name, path in (("opacus", root), ("opacus.accountants", os.path.join(root, "accountants"))):
        module = types.ModuleType(name)
        module.__path__ = [path]
        sys.modules[name] = module
    base = types.ModuleType("opacus.accountants.accountant")

    class IAccountant:
        def __init__(self) -> None:
            self.history: list[tuple[float, float, int]] = []

    base.IAccountant = IAccountant  # type: ignore[attr-defined]
    sys.modules[base.__name__] = base
    try:
        rdp_mod = importlib.import_module("opacus.accountants.rdp")
        prv_mod = importlib.import_module("opacus.accountants.prv")
        gdp_mod = importlib.import_module("opacus.accountants.gdp")
    except Exception as exc:  # pragma: no cover - a layout change in a future Opacus
        return None, f"opacus accountants could not be loaded without torch: {exc!r}"
    version = importlib.metadata.version("opacus")
    return (
        types.SimpleNamespace(
            RDP=rdp_mod.RDPAccountant, PRV=prv_mod.PRVAccountant, GDP=gdp_mod.GaussianAccountant
        ),
        f"opacus {version} (accountant modules loaded by file path, without torch)",
    )


OPACUS, OPACUS_NOTE = _load_opacus()


# --------------------------------------------------------------------------------------------
# exact values
# --------------------------------------------------------------------------------------------


def _root(delta_of: Callable[[float], float], delta: float, high: float) -> float:
    """Smallest epsilon in [0, high] with delta_of(epsilon) <= delta (delta_of decreasing)."""
    if delta_of(0.0) <= delta:
        return 0.0
    return float(optimize.brentq(lambda e: delta_of(e) - delta, 0.0, high, xtol=1e-13, rtol=1e-15))


def gaussian_epsilon(mu: float, delta: float = DELTA) -> float:
    """Exact epsilon of mu-GDP: delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)
    (Balle and Wang 2018, Theorem 8; Dong, Roth and Su 2022, Corollary 2.13), in log form."""

    def delta_of(eps: float) -> float:
        a = float(special.log_ndtr(-eps / mu + mu / 2))
        b = eps + float(special.log_ndtr(-eps / mu - mu / 2))
        return math.exp(a) * -math.expm1(b - a)

    return _root(delta_of, delta, 10.0 * mu * mu + 100.0 * mu + 10.0)


def binomial_epsilon(eps0: float, count: int, delta: float = DELTA) -> float:
    """Exact epsilon of count-fold binary randomized response with per-step epsilon eps0.

    The privacy loss is (2J - count) eps0 with J ~ Binomial(count, e^eps0 / (1 + e^eps0)), and
    delta(eps) = E[(1 - e^(eps - L))_+] (Kairouz, Oh and Viswanath 2015).
    """
    p = 1.0 / (1.0 + math.exp(-eps0))
    j = np.arange(count + 1)
    loss = (2.0 * j - count) * eps0
    logpmf = stats.binom.logpmf(j, count, p)

    def delta_of(eps: float) -> float:
        keep = loss > eps
        return float(np.sum(np.exp(logpmf[keep]) * -np.expm1(eps - loss[keep])))

    return _root(delta_of, delta, count * eps0)


# --------------------------------------------------------------------------------------------
# rigorous lower bounds by post-processing
# --------------------------------------------------------------------------------------------


def _normal_mass(lo: np.ndarray, hi: np.ndarray, mean: float, sd: float) -> np.ndarray:
    """N(mean, sd^2) mass of each [lo, hi), from the side of the mean where it is small."""
    a, b = (lo - mean) / sd, (hi - mean) / sd
    right = (a + b) > 0
    with np.errstate(invalid="ignore"):
        mass = np.where(
            right, special.ndtr(-a) - special.ndtr(-b), special.ndtr(b) - special.ndtr(a)
        )
    return np.maximum(np.nan_to_num(mass), 0.0)


def _laplace_mass(lo: np.ndarray, hi: np.ndarray, mean: float, b: float) -> np.ndarray:
    """Laplace(mean, b) mass of each [lo, hi), from the side of the mean where it is small."""

    def cdf(x: np.ndarray) -> np.ndarray:
        return 0.5 * np.exp(np.minimum(x - mean, 0.0) / b)

    def sf(x: np.ndarray) -> np.ndarray:
        return 0.5 * np.exp(-np.maximum(x - mean, 0.0) / b)

    with np.errstate(invalid="ignore"):
        left = np.where(hi <= mean, cdf(hi) - cdf(lo), 0.0)
        right = np.where(lo >= mean, sf(lo) - sf(hi), 0.0)
        across = np.where((lo < mean) & (hi > mean), 1.0 - cdf(lo) - sf(hi), 0.0)
    return np.maximum(left + right + across, 0.0)


@dataclass(frozen=True)
class MonotonePair:
    """Output distributions P, Q on the real line whose privacy loss ln(dP/dQ)(x) is
    non-decreasing in x, with the pieces the lower bound needs (all vectorized)."""

    x_at: Callable[[np.ndarray], np.ndarray]  # smallest x with loss(x) >= a, a in the range
    loss_at: Callable[[np.ndarray], np.ndarray]
    p_mass: Callable[[np.ndarray, np.ndarray], np.ndarray]
    q_mass: Callable[[np.ndarray, np.ndarray], np.ndarray]
    x_range: tuple[float, float]  # outside it P has negligible mass (clamped, still exact)
    loss_range: tuple[float, float]  # infimum and supremum of the loss


def subsampled_gaussian_pair(sigma: float, q: float, direction: str) -> MonotonePair:
    """Poisson-subsampled Gaussian, sensitivity 1: remove P = (1-q) N(0) + q N(1), Q = N(0);
    add is the reverse order, reflected (y = -x) so that its loss also increases."""
    z = 11.5  # P-mass beyond z standard deviations: below 1e-30
    log_q = math.log(q)
    low = math.log1p(-q) if q < 1 else -math.inf

    def remove_loss(x: np.ndarray) -> np.ndarray:
        u = (2 * np.asarray(x, float) - 1) / (2 * sigma * sigma)
        return u if q == 1 else np.logaddexp(low, log_q + u)

    def remove_x(a: np.ndarray) -> np.ndarray:
        a = np.asarray(a, float)
        if q == 1:
            return 0.5 + sigma * sigma * a
        with np.errstate(divide="ignore", invalid="ignore"):
            return 0.5 + sigma * sigma * (np.log(np.expm1(a) + q) - log_q)

    def mix(lo: np.ndarray, hi: np.ndarray, shift: float) -> np.ndarray:
        out = q * _normal_mass(lo, hi, shift, sigma)
        return out if q == 1 else out + (1 - q) * _normal_mass(lo, hi, 0.0, sigma)

    if direction == "remove":
        return MonotonePair(
            x_at=remove_x,
            loss_at=remove_loss,
            p_mass=lambda lo, hi: mix(lo, hi, 1.0),
            q_mass=lambda lo, hi: _normal_mass(lo, hi, 0.0, sigma),
            x_range=(-z * sigma, 1 + z * sigma),
            loss_range=(low, math.inf),
        )
    return MonotonePair(
        x_at=lambda a: -remove_x(-np.asarray(a, float)),
        loss_at=lambda y: -remove_loss(-np.asarray(y, float)),
        p_mass=lambda lo, hi: _normal_mass(lo, hi, 0.0, sigma),
        q_mass=lambda lo, hi: mix(lo, hi, -1.0),
        x_range=(-z * sigma, z * sigma),
        loss_range=(-math.inf, -low),
    )


def laplace_pair(b: float) -> MonotonePair:
    """Laplace noise of scale b, sensitivity 1: P = Lap(1, b), Q = Lap(0, b); the loss
    (|x| - |x - 1|) / b is -1/b left of 0, +1/b right of 1 and linear between. Both orders of
    the pair have this PLD (reflect x -> 1 - x)."""
    return MonotonePair(
        x_at=lambda a: (np.asarray(a, float) * b + 1) / 2,
        loss_at=lambda x: np.clip((2 * np.asarray(x, float) - 1) / b, -1 / b, 1 / b),
        p_mass=lambda lo, hi: _laplace_mass(lo, hi, 1.0, b),
        q_mass=lambda lo, hi: _laplace_mass(lo, hi, 0.0, b),
        x_range=(-80.0 * b, 1 + 80.0 * b),
        loss_range=(-1 / b, 1 / b),
    )


@dataclass
class Lattice:
    """Distribution of an integer statistic m under P and, tilted, under Q.

    ``p[i]`` = P[m = offset + i]; ``pt[i]`` = e^(m h) Q[m = offset + i]. The tilt keeps both
    arrays of comparable size (pt <= p up to the clamped cells), so that e^eps Q[m] is never
    formed from a tiny number times a huge one.
    """

    p: np.ndarray
    pt: np.ndarray
    offset: int


def _step_lattice(pair: MonotonePair, h: float) -> Lattice:
    """The statistic floor(loss(x) / h) of one output, its cells clamped to P's bulk."""
    lo_loss, hi_loss = (float(v) for v in pair.loss_at(np.array(pair.x_range)))
    j_lo = math.floor(max(lo_loss, pair.loss_range[0]) / h)
    j_hi = math.floor(min(hi_loss, pair.loss_range[1]) / h)
    js = np.arange(j_lo + 1, j_hi + 1)
    edges = np.concatenate(([-np.inf], pair.x_at(js * h), [np.inf]))
    p = pair.p_mass(edges[:-1], edges[1:])
    qm = pair.q_mass(edges[:-1], edges[1:])
    return Lattice(p, qm * np.exp(np.arange(j_lo, j_hi + 1) * h), j_lo)


def _trim(lat: Lattice, h: float, tau: float) -> Lattice:
    """Drop the low cells holding P-mass <= tau (a "sink" value of the statistic, counted as
    no evidence) and clamp the high cells holding P-mass <= tau into the highest kept one.
    Both are functions of the outputs, so the result is still an exact post-processing."""
    lo = int(np.searchsorted(np.cumsum(lat.p), tau))
    hi = len(lat.p) - 1 - int(np.searchsorted(np.cumsum(lat.p[::-1]), tau))
    hi = max(hi, lo)
    p, pt = lat.p[lo : hi + 1].copy(), lat.pt[lo : hi + 1].copy()
    p[-1] += lat.p[hi + 1 :].sum()
    pt[-1] += float(np.dot(lat.pt[hi + 1 :], np.exp(-h * np.arange(1, len(lat.p) - hi))))
    return Lattice(p, pt, lat.offset + lo)


def _convolve(a: Lattice, b: Lattice, h: float, tau: float) -> Lattice:
    p = np.maximum(signal.fftconvolve(a.p, b.p), 0.0)
    pt = np.maximum(signal.fftconvolve(a.pt, b.pt), 0.0)
    return _trim(Lattice(p, pt, a.offset + b.offset), h, tau)


def _compose(step: Lattice, count: int, h: float, tau: float) -> Lattice:
    """The statistic summed over ``count`` independent outputs (binary powering)."""
    result: Lattice | None = None
    base = step
    while count:
        if count & 1:
            result = base if result is None else _convolve(result, base, h, tau)
        count >>= 1
        if count:
            base = _convolve(base, base, h, tau)
    assert result is not None
    return result


def _lattice_delta(lat: Lattice, h: float, eps: float) -> float:
    """sum over m of (P[m] - e^eps Q[m])_+: the post-processed pair's hockey-stick divergence."""
    m = (np.arange(len(lat.p)) + lat.offset) * h
    return float(np.sum(np.maximum(lat.p - np.exp(np.minimum(eps - m, 700.0)) * lat.pt, 0.0)))


def _loss_std(pair: MonotonePair) -> float:
    lo, hi = (float(v) for v in pair.loss_at(np.array(pair.x_range)))
    lo, hi = max(lo, pair.loss_range[0]), min(hi, pair.loss_range[1])
    h = (hi - lo) / 65536
    lat = _step_lattice(pair, h)
    m = (np.arange(len(lat.p)) + lat.offset + 0.5) * h
    mean = float(np.dot(lat.p, m))
    return math.sqrt(float(np.dot(lat.p, (m - mean) ** 2)))


def lower_bound_epsilon(
    pair: MonotonePair,
    count: int,
    delta: float = DELTA,
    *,
    fineness: float = 0.01,
    grid_unit: float | None = None,
) -> float:
    """A rigorous lower bound on the true epsilon of ``count`` runs of the pair at ``delta``.

    The outputs x_1..x_count are mapped to S = sum_i floor(loss(x_i) / h) (with the tails of
    each step clamped, and partial sums trimmed, all deterministic functions of the outputs).
    S's laws under P and Q are computed exactly (cell masses from the CDFs; integer sums by
    FFT) and, by data processing, their hockey-stick divergence delta_S(eps) is at most the
    mechanism's delta(eps). So delta(eps) > delta wherever delta_S(eps) > delta (1 + 1e-5),
    and the root of that is below the true epsilon. The margin 1e-5 delta covers FFT rounding
    (about 1e-13 here); trimming only loses P-mass, which can only lower delta_S.
    h = fineness * (standard deviation of one step's loss), so the rounding blurs the optimal
    (likelihood-ratio) test by about 0.3 * fineness of its spread: the bound is within about
    1e-4 of the truth at fineness 0.01 (checked against the closed forms).
    """
    h = fineness * _loss_std(pair)
    if grid_unit is not None:  # align the grid with atoms of the loss (Laplace: +-1/b)
        h = grid_unit / math.ceil(grid_unit / h)
    tau = 1e-6 * delta / (4 * max(count, 2).bit_length())
    lat = _compose(_step_lattice(pair, h), count, h, tau)
    target = delta * (1 + 1e-5)
    top = (len(lat.p) + lat.offset + 1) * h
    return _root(lambda e: _lattice_delta(lat, h, e), target, max(top, 1e-9))


# --------------------------------------------------------------------------------------------
# cases and libraries
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # "dpsgd", "gaussian", "laplace", "rr"
    param: float  # sigma, sigma, b, or per-step epsilon
    count: int
    q: float = 1.0

    def event(self) -> ev.DpEvent:
        if self.kind == "dpsgd":
            inner: ev.DpEvent = ev.PoissonSampledEvent(self.q, ev.GaussianEvent(self.param))
        elif self.kind == "gaussian":
            inner = ev.GaussianEvent(self.param)
        elif self.kind == "laplace":
            inner = ev.LaplaceEvent(self.param)
        else:
            inner = ev.RandomizedResponseEvent(1.0 / (1.0 + math.exp(-self.param)))
        return ev.SelfComposedEvent(inner, self.count)

    @property
    def relation(self) -> Neighbouring:
        return Neighbouring.REPLACE if self.kind == "rr" else Neighbouring.ADD_REMOVE


class NotApplicable(Exception):
    """The library has no accountant for this kind of event."""


def _cold() -> None:
    _pld_profiles._loss_bounds.cache_clear()
    rdp._cached_curve.cache_clear()


def ours_pld(case: Case) -> float:
    _cold()
    return account(case.event(), delta=DELTA, methods=("pld",)).epsilon


def ours_rdp(case: Case) -> float:
    _cold()
    return RDPAccountant(neighbouring=case.relation).compose(case.event()).get_epsilon(DELTA)


def _dpa_event(case: Case) -> Any:
    if case.kind == "dpsgd":
        inner = dp_accounting.PoissonSampledDpEvent(
            case.q, dp_accounting.GaussianDpEvent(case.param)
        )
    elif case.kind == "gaussian":
        inner = dp_accounting.GaussianDpEvent(case.param)
    elif case.kind == "laplace":
        inner = dp_accounting.LaplaceDpEvent(case.param)
    else:
        # noise_parameter = probability of answering uniformly at random: truth w.p. 1 - p/2
        p_truth = 1.0 / (1.0 + math.exp(-case.param))
        inner = dp_accounting.RandomizedResponseDpEvent(2 * (1 - p_truth), 2)
    return dp_accounting.SelfComposedDpEvent(inner, case.count)


def dpa_pld(case: Case, interval: float = DPA_INTERVAL) -> float:
    if dp_accounting is None:
        raise NotApplicable("dp_accounting not installed")
    if case.kind == "rr":
        # Workaround: dp_accounting 0.6.0's PLDAccountant composes a RandomizedResponseDpEvent
        # once whatever its count, so compose its PLD directly.
        p_truth = 1.0 / (1.0 + math.exp(-case.param))
        pld = dpa_pld_lib.from_randomized_response(
            2 * (1 - p_truth), 2, value_discretization_interval=interval
        ).self_compose(case.count)
        return float(pld.get_epsilon_for_delta(DELTA))
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=interval)
    accountant.compose(_dpa_event(case))
    return float(accountant.get_epsilon(DELTA))


def dpa_rdp(case: Case) -> float:
    if dp_accounting is None:
        raise NotApplicable("dp_accounting not installed")
    relation = dp_accounting.NeighboringRelation
    accountant = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=relation.REPLACE_ONE
        if case.kind == "rr"
        else relation.ADD_OR_REMOVE_ONE
    )
    accountant.compose(_dpa_event(case))
    return float(accountant.get_epsilon(DELTA))


PRV_LAST: dict[Case, tuple[float, float, float]] = {}  # (lower, estimate, upper) per case
PRV_MAX_POINTS = 5e6


def prv_domain_points(case: Case) -> float:
    """About how many grid points a PRV accountant (Gopi et al. 2021) discretizes this case on:
    a domain [-L, L] with L = epsilon_RDP(delta_error / 4) + 3 and mesh
    eps_error / sqrt(T / 2 * ln(12 / delta_error)) (prv-accountant's own rule; Opacus copies
    it). prv-accountant took 66 s at 1e7 points and, at 3.5e7, 142 s and 5.9 GB before failing
    with "Discrete mean differs from continuous mean significantly" (2-core machine)."""
    delta_error = DELTA / 1000
    big = RDPAccountant(neighbouring=case.relation).compose(case.event())
    half_width = big.get_epsilon(delta_error / 4) + 3
    mesh = PRV_EPS_ERROR / math.sqrt(case.count / 2 * math.log(12 / delta_error))
    return 2 * half_width / mesh


def _prv_guard(case: Case) -> None:
    points = prv_domain_points(case)
    if points > PRV_MAX_POINTS:
        raise NotApplicable(f"skipped: PRV grid of {points:.1e} points (--prv-max-points)")


def prv_bounds(case: Case) -> tuple[float, float, float]:
    if prv_accountant is None:
        raise NotApplicable("prv-accountant not installed")
    _prv_guard(case)
    mechs = prv_accountant.privacy_random_variables
    if case.kind == "dpsgd":
        mech = mechs.PoissonSubsampledGaussianMechanism(
            sampling_probability=case.q, noise_multiplier=case.param
        )
    elif case.kind == "gaussian":
        mech = mechs.GaussianMechanism(noise_multiplier=case.param)
    elif case.kind == "laplace":
        mech = mechs.LaplaceMechanism(mu=1.0 / case.param)
    else:
        mech = mechs.PureDPMechanism(eps=case.param)  # binary RR is the pure-DP PRV
    accountant = prv_accountant.PRVAccountant(
        prvs=mech,
        max_self_compositions=case.count,
        eps_error=PRV_EPS_ERROR,
        delta_error=DELTA / 1000,
    )
    low, estimate, upper = accountant.compute_epsilon(DELTA, num_self_compositions=[case.count])
    PRV_LAST[case] = (float(low), float(estimate), float(upper))
    return PRV_LAST[case]


def _opacus(case: Case, which: str) -> float:
    if OPACUS is None:
        raise NotApplicable(OPACUS_NOTE)
    if case.kind not in ("dpsgd", "gaussian"):
        raise NotApplicable("Opacus accounts (subsampled) Gaussian steps only")
    if which == "PRV":
        _prv_guard(case)
    with warnings.catch_warnings():
        # GaussianAccountant warns that it is experimental; the RDP and PRV analyses warn about
        # their order range and log(0) on the way.
        warnings.simplefilter("ignore")
        accountant = getattr(OPACUS, which)()
        accountant.history = [(case.param, case.q, case.count)]  # as Opacus's own utils do
        if which == "PRV":
            return float(accountant.get_epsilon(DELTA, eps_error=PRV_EPS_ERROR))
        return float(accountant.get_epsilon(DELTA))


LIBRARIES: dict[str, Callable[[Case], float]] = {
    "dpcurator PLD": ours_pld,
    "dpcurator RDP": ours_rdp,
    "dp_acc. PLD": dpa_pld,
    "dp_acc. RDP": dpa_rdp,
    "prv-acc.": lambda case: prv_bounds(case)[2],
    "Opacus RDP": lambda case: _opacus(case, "RDP"),
    "Opacus PRV": lambda case: _opacus(case, "PRV"),
    "Opacus GDP": lambda case: _opacus(case, "GDP"),
}


# --------------------------------------------------------------------------------------------
# measuring
# --------------------------------------------------------------------------------------------


@dataclass
class Result:
    epsilon: float | None = None
    median_ms: float | None = None
    times_ms: list[float] = field(default_factory=list)
    note: str | None = None
    below: bool = False


def measure(fn: Callable[[], float], repeats: int, budget_s: float) -> Result:
    """Run fn up to ``repeats`` times (at least once; stop once the runs add up to
    ``budget_s``) and keep the median time. An exception becomes the result's note."""
    times: list[float] = []
    value = math.nan
    for _ in range(repeats):
        start = time.perf_counter()
        try:
            value = fn()
        except NotApplicable as exc:
            return Result(note=str(exc))
        except Exception as exc:  # a peer library failing on a case is a result too
            spent = (time.perf_counter() - start) * 1e3
            note = f"error after {spent:.0f} ms: {type(exc).__name__}: {str(exc)[:80]}"
            return Result(note=note, times_ms=[spent])
        times.append(time.perf_counter() - start)
        if sum(times) > budget_s:
            break
    ms = [t * 1e3 for t in times]
    return Result(value, statistics.median(ms), ms)


@dataclass
class Row:
    case: Case
    exact: float | None = None
    lower: float | None = None
    lower_s: float | None = None
    results: dict[str, Result] = field(default_factory=dict)
    prv_low_estimate: tuple[float, float] | None = None
    same_interval: float | None = None
    same_eps: float | None = None
    same_ms: float | None = None
    same_ours_ms: float | None = None  # dpcurator PLD, timed alternately with same_ms
    notes: list[str] = field(default_factory=list)

    @property
    def floor(self) -> float | None:
        """The value nobody may report less than: exact if known, else the lower bound."""
        return self.exact if self.exact is not None else self.lower

    @property
    def reference(self) -> float | None:
        """Exact if known, else the tightest reported epsilon that is not below the floor."""
        if self.exact is not None:
            return self.exact
        valid = [
            r.epsilon
            for r in self.results.values()
            if r.epsilon is not None and math.isfinite(r.epsilon) and not r.below
        ]
        return min(valid) if valid else None


def truth(case: Case, fineness: float) -> tuple[float | None, float | None]:
    """(exact epsilon, rigorous lower bound); one of them is None."""
    if case.kind == "gaussian":
        return gaussian_epsilon(math.sqrt(case.count) / case.param), None
    if case.kind == "rr":
        return binomial_epsilon(case.param, case.count), None
    if case.kind == "laplace":
        pair = laplace_pair(case.param)
        return None, lower_bound_epsilon(
            pair, case.count, fineness=fineness, grid_unit=1.0 / case.param
        )
    return None, max(
        lower_bound_epsilon(
            subsampled_gaussian_pair(case.param, case.q, d), case.count, fineness=fineness
        )
        for d in ("remove", "add")
    )


def run_case(case: Case, args: argparse.Namespace, ladder: bool) -> Row:
    start = time.perf_counter()
    exact, lower = truth(case, 0.03 if args.quick else 0.01)
    row = Row(case, exact, lower, time.perf_counter() - start)
    for name, fn in LIBRARIES.items():
        repeats = max(args.repeats, 7) if name.startswith("dpcurator") else args.repeats
        row.results[name] = measure(lambda fn=fn: fn(case), repeats, args.budget)
    if case in PRV_LAST:
        row.prv_low_estimate = PRV_LAST[case][:2]
    floor = row.floor
    for res in row.results.values():
        if res.epsilon is not None and floor is not None:
            res.below = res.epsilon < floor * (1 - BELOW_TOLERANCE)
    ours = row.results["dpcurator PLD"].epsilon
    if ladder and dp_accounting is not None and ours is not None:
        for interval in LADDER:
            if interval == DPA_INTERVAL and row.results["dp_acc. PLD"].epsilon is not None:
                eps = row.results["dp_acc. PLD"].epsilon
            else:
                eps = dpa_pld(case, interval)
            if eps is not None and eps <= ours:
                row.same_interval, row.same_eps = interval, eps
                break
        else:
            row.notes.append("dp_accounting never as tight on the ladder (down to 1e-5)")
    if row.same_interval is not None:
        # The pair behind the speed-up is timed round-robin, so that load from other processes
        # on a shared machine falls on both alike.
        theirs, mine = [], []
        for _ in range(max(args.repeats, 5)):
            mine.append(measure(lambda: ours_pld(case), 1, 0.0).median_ms or math.nan)
            res = measure(lambda: dpa_pld(case, row.same_interval), 1, 0.0)
            theirs.append(res.median_ms or math.nan)
        row.same_ms, row.same_ours_ms = statistics.median(theirs), statistics.median(mine)
    return row


def cases(quick: bool) -> list[tuple[Case, bool]]:
    """(case, whether to search dp_accounting's same-tightness interval)."""
    if quick:
        grid = [(0.01, 1.0, 1000), (0.001, 2.0, 10000), (0.01, 1.0, 10000), (0.1, 0.6, 10000)]
    else:
        grid = [
            (q, s, t)
            for q in (0.001, 0.01, 0.1)
            for s in (0.6, 1.0, 2.0)
            for t in (100, 1000, 10000)
        ]
    out = [(Case(f"DP-SGD q={q:g} sigma={s:g}", "dpsgd", s, t, q), t == 10000) for q, s, t in grid]
    kfold = [
        ("gaussian", "Gaussian sigma={:g}", ((2.0, 10), (20.0, 1000), (100.0, 10000))),
        ("laplace", "Laplace b={:g}", ((10.0, 10), (100.0, 1000), (1000.0, 10000))),
        ("rr", "rand. response eps0={:g}", ((1.0, 10), (0.2, 100), (0.04, 10000))),
    ]
    for kind, label, params in kfold:
        for param, count in params[:1] if quick else params:
            out.append((Case(label.format(param), kind, param, count), False))
    return out


# --------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------


def _fmt_eps(row: Row, res: Result) -> str:
    if res.epsilon is None:
        note = res.note or ""
        return "error" if note.startswith("error") else "skipped" if "skipped" in note else "n/a"
    text = f"{res.epsilon:.6g}"
    ref = row.reference
    if ref and math.isfinite(res.epsilon):
        text += f" ({(res.epsilon - ref) / ref:+.2%})"
    if res.below:
        text += " **BELOW**"
    return text


def print_tables(rows: list[Row]) -> None:
    names = list(LIBRARIES)
    print(f"delta = {DELTA:g}. epsilon (relative difference to the exact value, or to the")
    print("tightest valid reported value where no exact value is known); BELOW = less than")
    print("the exact value or a rigorous lower bound: a false claim.\n")
    print("| case | T | exact / lower bound | " + " | ".join(names) + " |")
    print("|---" * (3 + len(names)) + "|")
    for r in rows:
        truth_text = (
            f"= {r.exact:.6g}" if r.exact is not None else f">= {r.lower:.6g}" if r.lower else "-"
        )
        cells = [_fmt_eps(r, r.results[n]) for n in names]
        print(f"| {r.case.name} | {r.case.count} | {truth_text} | " + " | ".join(cells) + " |")

    print("\nMedian wall time, milliseconds (same run). Speed-up = dp_accounting PLD time at the")
    print("same tightness (coarsest interval whose epsilon <= dpcurator's) / dpcurator PLD time,")
    print("the two timed alternately.\n")
    print(
        "| case | T | "
        + " | ".join(names)
        + " | dp_acc. same tightness (interval, eps, ms vs dpcurator ms) | speed-up |"
    )
    print("|---" * (4 + len(names)) + "|")
    for r in rows:
        cells = []
        for n in names:
            res = r.results[n]
            cells.append("-" if res.median_ms is None else f"{res.median_ms:.4g}")
        if r.same_ms is not None and r.same_ours_ms:
            same = f"{r.same_interval:g}, {r.same_eps:.6g}, {r.same_ms:.4g} vs {r.same_ours_ms:.3g}"
            speed = f"{r.same_ms / r.same_ours_ms:.1f}x"
        else:
            same = speed = "-"
        line = f"| {r.case.name} | {r.case.count} | " + " | ".join(cells) + f" | {same} | {speed} |"
        print(line + (f" {'; '.join(r.notes)}" if r.notes else ""))

    print("\nErrors and skips:")
    for r in rows:
        for name, res in r.results.items():
            if res.note and ("error" in res.note or "skipped" in res.note):
                print(f"- {r.case.name} T={r.case.count}, {name}: {res.note}")


def summarize(rows: list[Row]) -> dict[str, Any]:
    speedups = [
        r.same_ms / r.same_ours_ms for r in rows if r.same_ms is not None and r.same_ours_ms
    ]
    below = [
        f"{name} on {r.case.name} T={r.case.count}: {res.epsilon:.6g} < {r.floor:.6g}"
        for r in rows
        for name, res in r.results.items()
        if res.below and r.floor is not None and res.epsilon is not None
    ]
    worst_vs_dpa = (
        max(
            (
                (r.results["dpcurator PLD"].epsilon - r.results["dp_acc. PLD"].epsilon)
                / r.results["dp_acc. PLD"].epsilon,
                r.case.name + f" T={r.case.count}",
            )
            for r in rows
            if r.results["dpcurator PLD"].epsilon and r.results["dp_acc. PLD"].epsilon
        )
        if any(r.results["dp_acc. PLD"].epsilon for r in rows)
        else None
    )
    worst_vs_floor = max(
        (
            (r.results["dpcurator PLD"].epsilon - r.floor) / r.floor,
            r.case.name + f" T={r.case.count}",
        )
        for r in rows
        if r.results["dpcurator PLD"].epsilon and r.floor
    )
    return {
        "speedup_same_tightness_min": min(speedups) if speedups else None,
        "speedup_same_tightness_median": statistics.median(speedups) if speedups else None,
        "speedup_target_10x": (min(speedups) >= 10) if speedups else None,
        "dpcurator_pld_worst_rel_excess_over_dp_accounting": worst_vs_dpa,
        "dpcurator_pld_worst_rel_excess_over_exact_or_lower_bound": worst_vs_floor,
        "below_true_epsilon": below,
    }


def main() -> None:
    global PRV_MAX_POINTS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 DP-SGD and 3 k-fold cases")
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed runs per peer library and case (dpcurator: at least 7; speed-up pairs: 5)",
    )
    parser.add_argument(
        "--budget", type=float, default=3.0, help="stop repeating once runs add up to this (s)"
    )
    parser.add_argument(
        "--prv-max-points",
        type=float,
        default=PRV_MAX_POINTS,
        help="skip PRV accountants whose grid would exceed this many points",
    )
    parser.add_argument("--json", help="write every number to this file")
    args = parser.parse_args()
    PRV_MAX_POINTS = args.prv_max_points

    print(
        f"dp_accounting {_version('dp-accounting')}, prv-accountant {_version('prv-accountant')}, "
        f"{OPACUS_NOTE}",
        file=sys.stderr,
    )
    rows = []
    for case, ladder in cases(args.quick):
        rows.append(run_case(case, args, ladder))
        print(f"done: {case.name} T={case.count}", file=sys.stderr, flush=True)
    print_tables(rows)
    summary = summarize(rows)
    print()
    if summary["speedup_same_tightness_min"] is not None:
        print(
            "10,000-step DP-SGD, dp_accounting PLD at the same tightness / dpcurator PLD: "
            f"min {summary['speedup_same_tightness_min']:.1f}x, median "
            f"{summary['speedup_same_tightness_median']:.0f}x (target >= 10x: "
            f"{'PASS' if summary['speedup_target_10x'] else 'FAIL'})"
        )
    if summary["dpcurator_pld_worst_rel_excess_over_dp_accounting"]:
        worst, where = summary["dpcurator_pld_worst_rel_excess_over_dp_accounting"]
        print(
            f"dpcurator PLD vs dp_accounting PLD @1e-4, worst: {worst:+.3%} ({where}); "
            f"target within 0.5%: {'PASS' if worst <= 0.005 else 'FAIL'}"
        )
    worst, where = summary["dpcurator_pld_worst_rel_excess_over_exact_or_lower_bound"]
    print(f"dpcurator PLD above the exact value or lower bound, worst: {worst:+.3%} ({where})")
    print("Below the true epsilon: " + ("; ".join(summary["below_true_epsilon"]) or "none"))
    print(f"Opacus: {OPACUS_NOTE}")
    if args.json:
        payload = {
            "delta": DELTA,
            "machine": platform.platform(),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "versions": {
                p: _version(p) for p in ("dpcurator", "dp-accounting", "prv-accountant", "opacus")
            },
            "opacus": OPACUS_NOTE,
            "summary": summary,
            "rows": [asdict(r) for r in rows],
        }
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1, default=str)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
