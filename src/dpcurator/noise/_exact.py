"""Exact decisions about a uniform real number known only by a prefix of its random bits.

The fast samplers compare a 64-bit random word with 64-bit thresholds. A word that lands on
an ambiguous threshold (probability about 2^-40 per draw or less) is handed here, where the
uniform variable U = 0.b1 b2 b3 ... is refined 64 bits at a time and compared with the target
quantity in rigorous interval arithmetic (``mpmath.iv``) until the answer is certain. Nothing
here rounds: every decision is proven by an enclosing interval, so the distribution of the
outputs is exactly the mathematical one.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from fractions import Fraction
from typing import Any, TypeVar

from mpmath.ctx_iv import MPIntervalContext

from dpcurator.errors import InternalError
from dpcurator.noise.source import RandomSource

T = TypeVar("T")

# An interval decision: given an interval context and an interval enclosing U, return the
# answer, or None while the enclosure is too wide to tell.
Decision = Callable[[Any, Any], T | None]


_CONTEXTS = threading.local()


def interval_context(bits: int) -> Any:
    """An mpmath interval context at ``bits`` of precision, private to this thread.

    Contexts are cached per thread and precision (making one costs about a millisecond), and
    never shared between threads, whose precisions would otherwise interfere.
    """
    cache: dict[int, Any] | None = getattr(_CONTEXTS, "by_bits", None)
    if cache is None:
        cache = _CONTEXTS.by_bits = {}
    ctx = cache.get(bits)
    if ctx is None:
        ctx = cache[bits] = MPIntervalContext()
        ctx.prec = bits
    return ctx


def _iv_rational(iv: Any, value: Fraction) -> Any:
    return iv.mpf(value.numerator) / iv.mpf(value.denominator)


def _raw_to_fraction(raw: tuple[int, int, int, int]) -> Fraction:
    sign, mantissa, exponent, _ = raw
    if mantissa == 0 and exponent != 0:
        raise InternalError("interval endpoint is infinite or NaN; this is a bug in dpcurator")
    value = Fraction(mantissa) * (Fraction(2) ** exponent)
    return -value if sign else value


def interval_bounds(x: Any) -> tuple[Fraction, Fraction]:
    """The exact endpoints of an mpmath interval, as fractions."""
    low, high = x._mpi_
    return _raw_to_fraction(low), _raw_to_fraction(high)


def resolve_uniform(prefix: int, bits: int, decide: Decision[T], source: RandomSource) -> T:
    """Decide a property of U ~ Uniform[0, 1) whose first ``bits`` bits are ``prefix``.

    ``decide`` receives an interval enclosing every U consistent with the bits seen so far and
    returns the answer once it is determined; more bits are drawn from ``source`` until then.
    Terminates with probability 1 when the property's boundary has probability zero.
    """
    while True:
        iv = interval_context(bits + 96)
        scale = iv.mpf(2) ** bits
        enclosure = iv.mpf([iv.mpf(prefix) / scale, iv.mpf(prefix + 1) / scale])
        answer = decide(iv, enclosure)
        if answer is not None:
            return answer
        prefix = (prefix << 64) | int(source.words(1)[0])
        bits += 64


def below_exp(gamma: Fraction) -> Decision[bool]:
    """Decision for the event U < exp(-gamma), gamma >= 0 rational."""

    def decide(iv: Any, u: Any) -> bool | None:
        u_low, u_high = interval_bounds(u)
        t_low, t_high = interval_bounds(iv.exp(-_iv_rational(iv, gamma)))
        if u_high <= t_low:
            return True
        if u_low >= t_high:
            return False
        return None

    return decide


def below_rational(p: Fraction) -> Decision[bool]:
    """Decision for the event U < p, p rational in [0, 1]."""

    def decide(iv: Any, u: Any) -> bool | None:
        u_low, u_high = interval_bounds(u)
        if u_high <= p:
            return True
        if u_low >= p:
            return False
        return None

    return decide


def _folding_factor(iv: Any, rate: Fraction) -> Any:
    """2 / (1 + e^-rate): P[|Y| >= a] = f e^(-a rate) for the discrete Laplace with 1/t = rate."""
    return iv.mpf(2) / (1 + iv.exp(-_iv_rational(iv, rate)))


def geometric_count(rate: Fraction, folded: bool = False) -> Decision[int]:
    """Decision for A = #{j >= 1 : U < f exp(-j * rate)}.

    With f = 1, A is Geometric(exp(-rate)); with ``folded`` (f = 2 / (1 + e^-rate)), A is the
    magnitude |Y| of a discrete Laplace variable with scale 1 / rate. U < f exp(-j rate) iff
    j < y with y = -ln(U / f) / rate, so A = ceil(y) - 1 (y > 0 as U < 1 <= f), determined once
    the enclosure of y lies strictly inside one unit interval (k, k + 1].
    """

    def decide(iv: Any, u: Any) -> int | None:
        if interval_bounds(u)[0] <= 0:
            return None
        ratio = u / _folding_factor(iv, rate) if folded else u
        y_low, y_high = interval_bounds(-iv.log(ratio) / _iv_rational(iv, rate))
        low = math.floor(y_low)
        if low == math.floor(y_high) and y_low > low:
            return low
        return None

    return decide


def floor_scaled_exp(exponent: Fraction, bits: int = 64) -> int:
    """floor(2^bits * exp(-exponent)), computed exactly (precision raised until certain)."""
    prec = 128
    while True:
        iv = interval_context(prec)
        value = iv.exp(-_iv_rational(iv, exponent)) * (iv.mpf(2) ** bits)
        value_low, value_high = interval_bounds(value)
        if math.floor(value_low) == math.floor(value_high):
            return math.floor(value_low)
        prec *= 2


def floor_scaled_folded_exp(rate: Fraction, a: int, bits: int = 64) -> int:
    """floor(2^bits * 2 exp(-a rate) / (1 + exp(-rate))), computed exactly."""
    prec = 128
    while True:
        iv = interval_context(prec)
        value = (
            _folding_factor(iv, rate) * iv.exp(-_iv_rational(iv, rate * a)) * (iv.mpf(2) ** bits)
        )
        value_low, value_high = interval_bounds(value)
        if math.floor(value_low) == math.floor(value_high):
            return math.floor(value_low)
        prec *= 2


def floor_scaled_rational(p: Fraction, bits: int = 64) -> int:
    """floor(2^bits * p) for rational p, exactly."""
    return (p.numerator << bits) // p.denominator
