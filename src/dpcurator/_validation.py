"""Argument checks shared by the public functions and classes of dpcurator.

One place for the checks, so that every public function rejects bad input the same way: a
``UserTypeError`` (a ``TypeError``) when the value is not of the right kind (a ``UserError``
where a caller's contract says so), a ``UserError`` (a ``ValueError``) when it is out of range,
each with a message naming the parameter and what was expected. Each check returns the value
converted to a plain ``float`` or ``int``.
"""

from __future__ import annotations

import math
import operator
import re
from numbers import Integral, Real

from dpcurator.errors import UserError, UserTypeError

__all__ = ["CONFIG_NAME", "config_key", "integer", "nonnegative", "positive", "real",
           "unit_interval"]

#: a dataset's, analyst's or owner's name in the service's configuration
CONFIG_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def config_key(name: str, what: str) -> str:
    """``name`` as a TOML key of the configuration's tables (quoted where it holds a dot, so
    ``[analysts."alice.smith"]`` is one analyst, not a nested table); a UserError where the
    configuration would refuse the name."""
    if not CONFIG_NAME.match(name):
        raise UserError(f"{what} {name!r}: use 1 to 64 letters, digits, '_', '-' or '.'")
    return f'"{name}"' if "." in name else name


def real(name: str, value: object, *, wrong_type: type[Exception] = UserTypeError) -> float:
    """A real number other than NaN (bools refused), as a float."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise wrong_type(f"{name} must be a real number, got {type(value).__name__}")
    out = float(value)
    if math.isnan(out):
        raise UserError(f"{name} must be a number, got NaN")
    return out


def positive(name: str, value: object, *, wrong_type: type[Exception] = UserTypeError) -> float:
    """A finite number > 0, as a float."""
    out = real(name, value, wrong_type=wrong_type)
    if not (math.isfinite(out) and out > 0):
        raise UserError(f"{name} must be a positive finite number, got {out!r}")
    return out


def nonnegative(name: str, value: object) -> float:
    """A finite number >= 0, as a float."""
    out = real(name, value)
    if not (math.isfinite(out) and out >= 0):
        raise UserError(f"{name} must be a non-negative finite number, got {out!r}")
    return out


def unit_interval(
    name: str,
    value: object,
    *,
    include_zero: bool = False,
    include_one: bool = False,
    hint: str = "",
    wrong_type: type[Exception] = UserTypeError,
) -> float:
    """A number in the interval from 0 to 1, each end included only if asked (open by default).

    ``hint`` is appended to the expected interval in the message, e.g. " (0.05 for 95%)".
    """
    out = real(name, value, wrong_type=wrong_type)
    low_ok = out >= 0 if include_zero else out > 0
    high_ok = out <= 1 if include_one else out < 1
    if not (low_ok and high_ok):
        interval = ("[" if include_zero else "(") + "0, 1" + ("]" if include_one else ")")
        raise UserError(f"{name} must lie in {interval}{hint}, got {out!r}")
    return out


def integer(
    name: str, value: object, *, minimum: int, fractional: type[Exception] = UserTypeError
) -> int:
    """An integer >= ``minimum`` (bools refused), as an int.

    A non-integral real number (2.5, or 2.0) raises ``fractional``; anything else that is not an
    integer raises ``UserTypeError``.
    """
    if isinstance(value, bool) or not isinstance(value, Integral):
        if isinstance(value, Real) and not isinstance(value, bool):
            raise fractional(f"{name} must be an integer >= {minimum}, got {value!r}")
        raise UserTypeError(f"{name} must be an integer, got {type(value).__name__}")
    out = operator.index(value)
    if out < minimum:
        raise UserError(f"{name} must be an integer >= {minimum}, got {out!r}")
    return out
