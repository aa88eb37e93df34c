"""Building randomizers by name, from a published configuration, or by the default chooser."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from dpcurator.errors import UserError
from dpcurator.local import client
from dpcurator.local._base import MAX_CATEGORIES, LocalRandomizer, check_epsilon
from dpcurator.local.frequency import (
    BinaryResponse,
    FrequencyOracle,
    GeneralizedRR,
    HadamardResponse,
    OptimizedLocalHashing,
    OptimizedUnaryEncoding,
    SymmetricUnaryEncoding,
)
from dpcurator.local.numeric import Duchi, Piecewise
from dpcurator.noise import RandomSource

__all__ = ["BINARY", "CATEGORICAL", "MECHANISMS", "NUMERIC", "choose_mechanism",
           "choose_numeric", "from_config", "make_randomizer"]

BINARY = ("rr", "two-coin")
CATEGORICAL = ("grr", "sue", "oue", "olh", "hadamard")
NUMERIC = ("duchi", "piecewise")
MECHANISMS = BINARY + CATEGORICAL + NUMERIC

_ORACLES: dict[str, type[FrequencyOracle]] = {
    "grr": GeneralizedRR, "sue": SymmetricUnaryEncoding, "oue": OptimizedUnaryEncoding,
    "olh": OptimizedLocalHashing, "hadamard": HadamardResponse,
}


def choose_mechanism(k: int, epsilon: float,
                     candidates: Sequence[str] = CATEGORICAL) -> str:
    """The frequency oracle with the smallest variance for k categories at this epsilon.

    Compares the exact closed-form variance of each candidate at a rare category (f_v -> 0),
    Var* = q*(1 - q*) / (n (p* - q*)^2), the criterion of Wang et al. (USENIX Security 2017,
    Section 5): GRR (e^eps + k - 2)/(e^eps - 1)^2, OUE and OLH 4 e^eps/(e^eps - 1)^2, SUE
    e^(eps/2)/(e^(eps/2) - 1)^2, Hadamard response (e^eps + 1)^2/(e^eps - 1)^2, all per report,
    with the exact parameters actually used (so OLH's integer g and the rationals count). GRR
    wins when k < 3 e^eps + 2; otherwise OUE (OLH ties it only when e^eps + 1 is a prime). Ties go
    to the earlier name in ``candidates`` (shorter reports first by default).
    """
    eps = check_epsilon(epsilon)
    if isinstance(k, bool) or not isinstance(k, int) or not 2 <= k <= MAX_CATEGORIES:
        # checked here: each candidate refused (below) would leave no mechanism to name
        raise UserError(f"k must be an integer in [2, {MAX_CATEGORIES:,}], got {k!r}")
    unknown = [c for c in candidates if c not in _ORACLES]
    if unknown or not candidates:
        raise UserError(f"candidates must be among {', '.join(CATEGORICAL)}")
    best, best_var = "", float("inf")
    for name in candidates:
        try:
            oracle = _ORACLES[name](eps, k, None)
        except ValueError:  # e.g. olh beyond its largest g
            continue
        p, q = oracle.support_probabilities()
        var = float(q[0] * (1 - q[0]) / (p[0] - q[0]) ** 2)
        if var < best_var * (1 - 1e-12):
            best, best_var = name, var
    if not best:
        raise UserError(f"none of the candidates {', '.join(candidates)} can run at "
                        f"epsilon={eps!r} with k={k}; try grr or oue")
    return best


def choose_numeric(epsilon: float) -> str:
    """The numeric mechanism ("duchi" or "piecewise") with the smaller worst-case variance per
    report at this epsilon: ``report_variance`` with no mean given, the criterion
    ``planning.sample_size`` plans with (the range scales both alike, so it does not enter).
    Duchi wins it at every epsilon: Piecewise gains only where the answers gather near the
    middle of the range, which a survey does not know in advance. Ties go to "duchi"."""
    eps = check_epsilon(epsilon)
    best = "duchi"
    try:
        if Piecewise(eps).report_variance() < Duchi(eps).report_variance():
            best = "piecewise"
    except ValueError:  # an epsilon too small for Piecewise's grid
        pass
    return best


def make_randomizer(mechanism: str, epsilon: float, *,
                    categories: Sequence[Any] | int | None = None,
                    low: float | None = None, high: float | None = None,
                    source: RandomSource | None = None) -> LocalRandomizer:
    """A randomizer by name: rr, two-coin, grr, sue, oue, olh, hadamard, duchi, piecewise, or
    "auto": ``choose_mechanism`` for ``categories``; ``choose_numeric`` where ``low`` or
    ``high`` is given (a number in a range); else "rr" (a yes/no question). ``low`` and
    ``high`` are the numeric mechanisms' range (default [0, 1]; other mechanisms ignore
    them); "auto" given both ``categories`` and a range is refused."""
    numeric = low is not None or high is not None
    if mechanism == "auto":
        if categories is not None and numeric:
            raise UserError("mechanism 'auto' was given both categories and a range (low, "
                            "high): give one, or name the mechanism")
        if categories is not None:
            k = categories if isinstance(categories, int) else len(categories)
            mechanism = choose_mechanism(k, epsilon)
        else:
            mechanism = choose_numeric(epsilon) if numeric else "rr"
    low = 0.0 if low is None else low
    high = 1.0 if high is None else high
    if mechanism in BINARY:
        return BinaryResponse(epsilon, mechanism, source)
    if mechanism in _ORACLES:
        if categories is None:
            raise UserError(f"mechanism {mechanism!r} needs categories (labels, or k)")
        return _ORACLES[mechanism](epsilon, categories, source)
    if mechanism == "duchi":
        return Duchi(epsilon, low, high, source)
    if mechanism == "piecewise":
        return Piecewise(epsilon, low, high, source)
    raise UserError(f"mechanism must be one of {', '.join(MECHANISMS)} or auto, "
                    f"got {mechanism!r}")


def from_config(config: Any, source: RandomSource | None = None) -> LocalRandomizer:
    """The randomizer a published survey configuration describes (checked as the client does).

    Raises ``client.ConfigError`` if the configuration is malformed or its parameters do not
    give the epsilon it states.
    """
    cfg = client.check_config(config)
    mech, eps, params = cfg["mechanism"], float(cfg["epsilon"]), cfg["params"]
    if mech in BINARY:
        return BinaryResponse(eps, mech, source, truth_probability=Fraction(params["p"]))
    cats: list[Any] = cfg.get("categories") or []
    if mech == "grr":
        return GeneralizedRR(eps, cats, source, p=Fraction(params["p"]))
    if mech == "sue":
        return SymmetricUnaryEncoding(eps, cats, source, p=Fraction(params["p"]),
                                      q=Fraction(params["q"]))
    if mech == "oue":
        return OptimizedUnaryEncoding(eps, cats, source, p=Fraction(params["p"]),
                                      q=Fraction(params["q"]))
    if mech == "olh":
        return OptimizedLocalHashing(eps, cats, source, g=params["g"], p=Fraction(params["p"]))
    if mech == "hadamard":
        rand = HadamardResponse(eps, cats, source, p=Fraction(params["p"]))
        if rand.columns != params["K"]:
            raise client.ConfigError("params.K must be the smallest power of two above k")
        return rand
    if mech == "duchi":
        return Duchi(eps, cfg["low"], cfg["high"], source, rho=Fraction(params["rho"]))
    grid = params["grid"]
    return Piecewise(eps, cfg["low"], cfg["high"], source, grid_bits=grid.bit_length() - 1,
                     m=params["m"])
