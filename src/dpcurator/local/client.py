"""The respondent's side of a local-DP survey: one file, standard library only.

Copy this file onto a device and run it; it needs neither numpy nor dpcurator::

    python client.py survey.json "answer"            # one JSON report on stdout
    printf 'a\\nb\\n' | python client.py survey.json  # one report per input line

``survey.json`` is the survey's configuration (``dpcurator survey config`` writes one; the
collector publishes it). It names the mechanism, the promised epsilon, the categories or the
value range, and the mechanism's *exact* rational parameters. Before randomizing anything the
client checks, in exact rational arithmetic, that those parameters really give epsilon-local DP:
the largest ratio of two report probabilities must be at most e^epsilon, where e^epsilon is
bounded by ``exp_bounds`` (a Taylor series evaluated with rigorous integer error bounds). A
collector that published a weaker configuration than it promised is refused, so the respondent
does not have to trust the collector's arithmetic.

Randomness comes from ``secrets`` (the operating system's CSPRNG). Every random decision is an
exact comparison of a uniform integer with a rational threshold: ``secrets.randbelow(d) < c``
is a Bernoulli(c / d) draw with no floating point anywhere, so the report distribution is exactly
the one whose ratios were checked.

The library (``dpcurator.local``) imports ``exp_bounds``, ``olh_hash`` and ``loss_ratio`` from this
module, so the respondent and the collector share one definition of each.

Report formats (one JSON object per report; ``mechanism`` is always present):

==============  ==========================================================================
mechanism       payload
==============  ==========================================================================
rr, two-coin    ``"y"``: 0 or 1 (the randomized yes/no answer)
grr             ``"y"``: a category label
sue, oue        ``"bits"``: a string of k characters "0"/"1", one per category
olh             ``"seed"``: the hash function's index, ``"y"``: the randomized hash value
hadamard        ``"y"``: a column of the Hadamard matrix, 0 <= y < K
duchi           ``"y"``: +1 or -1
piecewise       ``"y"``: an output cell, 0 <= y < grid + m
==============  ==========================================================================
"""

from __future__ import annotations

import json
import math
import secrets
import sys
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

__all__ = [
    "FORMAT",
    "MAX_EPSILON",
    "ConfigError",
    "at_most_exp",
    "check_config",
    "exp_bounds",
    "exp_lower",
    "loss_ratio",
    "main",
    "olh_hash",
    "parse_number",
    "randomize",
]

#: The configuration format this client understands.
FORMAT = "dpcurator-survey/1"
#: The largest epsilon a local survey may promise (the library's cap too): beyond it a report
#: is practically the raw answer.
MAX_EPSILON = 50.0

RandBelow = Callable[[int], int]

MECHANISMS = ("rr", "two-coin", "grr", "sue", "oue", "olh", "hadamard", "duchi", "piecewise")


try:  # inside dpcurator: the error tree's classes (dpcurator.errors)
    from dpcurator.errors import ConfigError, UserError
except ImportError:  # pragma: no cover - this file copied alone onto a device

    class UserError(ValueError):  # type: ignore[no-redef]
        """The request was wrong (as dpcurator.errors.UserError)."""

    class ConfigError(UserError):  # type: ignore[no-redef]
        """The survey configuration is malformed or does not give the epsilon it promises."""


# ---------------------------------------------------------------------------------------------
# Numbers read from a configuration or an answer: bounded in size before any arithmetic.

#: The longest number text read (a configuration's rationals are about 60 characters).
MAX_NUMBER_TEXT = 400
#: The largest integer parameters: OLH's prime g, Hadamard's K, the piecewise grid.
MAX_HASH_RANGE = 1 << 31
MAX_COLUMNS = 1 << 31
MAX_GRID = 1 << 40
#: The most categories a survey may have. The collector (``dpcurator.local``) keeps a few
#: Python objects per category (the label, its text, its index: about 350 bytes) and several
#: arrays of k 8-byte numbers per estimate, and a unary-encoded (sue, oue) report is k bytes:
#: at 10^6 categories that is already about half a gigabyte and seconds of set-up before the
#: first report, and 1 MB a report. Ten times more does not fit a laptop; a billion (8 GB for
#: the list of labels alone) ran out of memory.
MAX_CATEGORIES = 1_000_000


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _number_shape(text: str) -> bool:
    """Whether ``text`` is an integer "n", a rational "n/d", or a decimal with an exponent of
    at most 3 digits (ASCII digits, an optional sign): parsing one costs time linear in its
    length, where ``Fraction("1e-999999999")`` would first build a billion-digit integer."""
    body = text[1:] if text[:1] in ("+", "-") else text
    if "/" in body:
        numerator, _, denominator = body.partition("/")
        return _digits(numerator) and _digits(denominator)
    mantissa, mark, exponent = body.replace("E", "e").partition("e")
    if mark:
        exponent = exponent[1:] if exponent[:1] in ("+", "-") else exponent
        if not (_digits(exponent) and len(exponent) <= 3):
            return False
    whole, _, fraction = mantissa.partition(".")
    return bool(whole or fraction) and all(_digits(p) for p in (whole, fraction) if p)


def parse_number(text: str) -> Fraction:
    """The exact value of a number written as text, refusing (ValueError) any text longer than
    ``MAX_NUMBER_TEXT`` characters, with an exponent beyond 3 digits, or not a number."""
    text = text.strip()
    if len(text) > MAX_NUMBER_TEXT:
        raise UserError(f"a number may have at most {MAX_NUMBER_TEXT} characters")
    if not _number_shape(text):
        raise UserError("not a number (write an integer, n/d, or a decimal with an exponent "
                        "of at most 3 digits)")
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise UserError("not a valid number (a zero denominator?)") from None


# ---------------------------------------------------------------------------------------------
# e^x with rigorous rational bounds.


def exp_bounds(x: Fraction | float | int, bits: int = 128) -> tuple[Fraction, Fraction]:
    """Rationals ``lo <= e^x <= hi`` for a rational ``x >= 0``, about ``bits`` bits apart.

    The Taylor series sum_j x^j / j! is evaluated in integers scaled by 2^P: each term is the
    previous one times x / j, rounded down, so every computed term is at most the true one and
    their sum ``lo`` is a lower bound (all terms are positive). Rounding loses less than 1 per
    step; ``err_j = err_{j-1} x / j + 1`` bounds the accumulated loss of term j. Summation stops
    once j > 2x and the computed term is 0, where the remaining tail is at most twice the next
    true term, itself at most ``err_j x / (j + 1) <= err_j / 2``; ``hi`` adds all of that.
    """
    x = Fraction(x)
    if x < 0:
        raise UserError("exp_bounds needs x >= 0")
    if isinstance(bits, bool) or not isinstance(bits, int) or bits < 8:
        raise UserError("bits must be an integer >= 8")
    num, den = x.numerator, x.denominator
    guard = 16 + max(1, int(x) + 1).bit_length() * 2
    scale = 1 << (bits + guard)
    term, err = scale, 0
    total, total_err = scale, 0
    j = 0
    while True:
        j += 1
        term = term * num // (den * j)
        err = -(-err * num // (den * j)) + 1  # ceil(err * x / j) + 1
        total += term
        total_err += err
        if term == 0 and 2 * x < j:
            break
    return Fraction(total, scale), Fraction(total + total_err + err, scale)


def exp_lower(x: Fraction | float | int, bits: int = 96) -> Fraction:
    """A dyadic rational ``E <= e^x`` with ``bits`` significant bits (relative error ~2^-bits).

    The mechanisms of ``dpcurator.local`` build every probability from such an ``E`` instead of
    the irrational e^epsilon, so each privacy ratio is at most ``E <= e^epsilon`` exactly.
    """
    lo, _ = exp_bounds(x, bits + 16)
    shift = bits - (lo.numerator.bit_length() - lo.denominator.bit_length())
    if shift >= 0:
        return Fraction(lo.numerator * (1 << shift) // lo.denominator, 1 << shift)
    return Fraction(lo.numerator // (lo.denominator << -shift) << -shift)


def at_most_exp(ratio: Fraction, epsilon: float) -> bool:
    """Decide ``ratio <= e^epsilon`` exactly (refining the bounds until they settle it)."""
    bits = 128
    while bits <= 4096:
        lo, hi = exp_bounds(Fraction(epsilon), bits)
        if ratio <= lo:
            return True
        if ratio > hi:
            return False
        bits *= 2
    return False  # equal to e^epsilon within 2^-4096: impossible for rational parameters


# ---------------------------------------------------------------------------------------------
# The hash family of optimized local hashing.


def olh_hash(seed: int, value: int, g: int, digits: int) -> int:
    """h_seed(value) = (b + sum_j a_j d_j) mod g, where d_j are the base-g digits of ``value``.

    ``seed`` in [0, g^(digits + 1)) encodes (b, a_1, ..., a_digits) as its base-g digits. With
    g prime and the seed uniform, the family is exactly pairwise independent: two distinct
    values (distinct digit vectors) collide with probability exactly 1/g, which makes the OLH
    estimator exactly unbiased (a generic 64-bit hash only approximately has this property).
    """
    b = seed % g
    seed //= g
    acc = b
    for _ in range(digits):
        acc += (seed % g) * (value % g)
        seed //= g
        value //= g
    return acc % g


def olh_digits(k: int, g: int) -> int:
    """The number of base-g digits needed for the values 0..k-1 (at least 1)."""
    digits, reach = 1, g
    while reach < k:
        digits += 1
        reach *= g
    return digits


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    return all(n % d for d in range(2, math.isqrt(n) + 1))


# ---------------------------------------------------------------------------------------------
# Configuration: parsing and the exact privacy check.


def _fraction(params: dict[str, Any], key: str) -> Fraction:
    raw = params.get(key)
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise ConfigError(f"params.{key} must be a rational written as 'numerator/denominator'")
    try:
        value = parse_number(raw) if isinstance(raw, str) else Fraction(raw)
    except ValueError as exc:
        raise ConfigError(f"params.{key} is not a valid rational number: {exc}") from None
    if not 0 < value < 1:
        raise ConfigError(f"params.{key} must lie strictly between 0 and 1")
    return value


def _integer(params: dict[str, Any], key: str, low: int, high: int) -> int:
    raw = params.get(key)
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        raise ConfigError(f"params.{key} must be an integer in [{low}, {high}]")
    return raw


def _range(config: dict[str, Any]) -> tuple[Fraction, Fraction]:
    low, high = config.get("low"), config.get("high")
    for name, v in (("low", low), ("high", high)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(
                _as_float(v)):
            raise ConfigError(f"{name} must be a finite number")
    assert isinstance(low, int | float) and isinstance(high, int | float)
    if not low < high:
        raise ConfigError("low must be smaller than high")
    if not math.isfinite(_as_float(high) - _as_float(low)):
        raise ConfigError("high - low must be a finite number (the range's width overflows)")
    return Fraction(low), Fraction(high)


def _as_float(value: int | float) -> float:
    """The value as a float; an integer beyond the float range is infinite."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _categories(config: dict[str, Any]) -> list[Any]:
    cats = config.get("categories")
    if not isinstance(cats, list) or len(cats) < 2:
        raise ConfigError("categories must be a list of at least 2 labels")
    if len(cats) > MAX_CATEGORIES:
        raise ConfigError(f"categories may hold at most {MAX_CATEGORIES:,} labels, got "
                          f"{len(cats):,}")
    for c in cats:
        if isinstance(c, bool) or not isinstance(c, str | int):
            raise ConfigError("categories must be strings or integers")
    if len({str(c) for c in cats}) != len(cats):
        raise ConfigError("categories must be distinct (also as text)")
    return cats


def loss_ratio(config: dict[str, Any]) -> Fraction:
    """The exact largest ratio P[R(x) = y] / P[R(x') = y] over all inputs x, x' and reports y.

    Raises ``ConfigError`` if the configuration is malformed.
    """
    mech = config.get("mechanism")
    params = config.get("params")
    if mech not in MECHANISMS:
        raise ConfigError(f"mechanism must be one of {', '.join(MECHANISMS)}")
    if not isinstance(params, dict):
        raise ConfigError("params must be an object")
    if mech == "rr":  # truth with probability p, else a fair coin
        p = _fraction(params, "p")
        return (1 + p) / (1 - p)
    if mech == "two-coin":  # first coin tails (p): truth; else second coin tails (p): yes
        p = _fraction(params, "p")
        return max((2 - p) / (1 - p), (1 - p + p * p) / ((1 - p) * (1 - p)))
    if mech in ("grr", "olh"):
        size = (len(_categories(config)) if mech == "grr"
                else _integer(params, "g", 2, MAX_HASH_RANGE))
        if mech == "olh":
            _categories(config)
            if not is_prime(size):
                raise ConfigError("params.g must be prime")
        p = _fraction(params, "p")
        keep, other = p, (1 - p) / (size - 1)
        return max(keep / other, other / keep)
    if mech in ("sue", "oue"):
        _categories(config)
        p, q = _fraction(params, "p"), _fraction(params, "q")
        r = p * (1 - q) / (q * (1 - p))
        return max(r, 1 / r)
    if mech == "hadamard":
        cats = _categories(config)
        size = _integer(params, "K", 2, MAX_COLUMNS)
        if size & (size - 1) or size <= len(cats):
            raise ConfigError("params.K must be a power of two larger than the category count")
        p = _fraction(params, "p")
        return max(p / (1 - p), (1 - p) / p)
    if mech == "duchi":
        _range(config)
        rho = _fraction(params, "rho")
        return (1 + rho) / (1 - rho)
    # piecewise
    _range(config)
    grid = _integer(params, "grid", 2, MAX_GRID)
    m = _integer(params, "m", 1, MAX_GRID)
    if grid & (grid - 1) or not m < grid:
        raise ConfigError("params.grid must be a power of two and params.m smaller than it")
    return Fraction(grid, m) ** 2


def _check_signal(config: dict[str, Any]) -> None:
    """Refuse parameters under which a report supports its own answer no more often than
    another answer (p* <= q*): private, but nothing can be estimated from such reports."""
    mech, params = config["mechanism"], config["params"]
    if mech in ("rr", "two-coin", "duchi", "piecewise"):
        return  # p, rho > 0 and m < grid (checked by loss_ratio) always carry a signal
    p = Fraction(params["p"])
    if mech in ("sue", "oue"):
        floor, rule = Fraction(params["q"]), "params.q"
    elif mech == "grr":
        k = len(config["categories"])
        floor, rule = Fraction(1, k), f"1/k = 1/{k}"
    elif mech == "olh":
        floor, rule = Fraction(1, params["g"]), f"1/g = 1/{params['g']}"
    else:  # hadamard: a report lands in the answer's half of the columns w.p. p
        floor, rule = Fraction(1, 2), "1/2"
    if not p > floor:
        raise ConfigError(
            f"params.p must exceed {rule} for a {mech} survey, got p = {params['p']}: "
            "otherwise a report supports its own answer no more often than any other, and no "
            "estimate can be made from the reports")


def check_config(config: Any) -> dict[str, Any]:
    """Validate a survey configuration and prove its epsilon; return it unchanged."""
    if not isinstance(config, dict):
        raise ConfigError("the survey configuration must be a JSON object")
    if config.get("format") != FORMAT:
        raise ConfigError(f"format must be {FORMAT!r}")
    eps = config.get("epsilon")
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 < eps <= MAX_EPSILON:
        raise ConfigError(f"epsilon must be a number in (0, {MAX_EPSILON:g}] (a larger one "
                          f"leaves respondents no privacy), got {eps!r}")
    ratio = loss_ratio(config)
    _check_signal(config)
    if not at_most_exp(ratio, float(eps)):
        raise ConfigError(
            "the configuration's parameters do not give the epsilon it promises: refusing to "
            "randomize with them")
    return config


# ---------------------------------------------------------------------------------------------
# Randomizing one answer.


def _bernoulli(p: Fraction, randbelow: RandBelow) -> bool:
    return randbelow(p.denominator) < p.numerator


def _category_index(config: dict[str, Any], value: Any) -> int:
    labels = [str(c) for c in config["categories"]]
    try:
        return labels.index(str(value))
    except ValueError:
        raise UserError("the answer is not one of the survey's categories") from None


def _binary_answer(value: Any) -> int:
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "y"):
        return 1
    if text in ("0", "false", "no", "n"):
        return 0
    raise UserError("a yes/no answer must be one of yes/no, true/false, 1/0")


def _unit_position(config: dict[str, Any], value: Any) -> Fraction:
    """The answer mapped exactly to t = (v - low) / (high - low) in [0, 1]."""
    low, high = _range(config)
    try:
        v = parse_number(str(value)) if not isinstance(value, int | float) else Fraction(value)
    except (ValueError, OverflowError):
        raise UserError("a numeric answer must be a finite number") from None
    if not low <= v <= high:
        raise UserError("the answer lies outside the survey's range [low, high]")
    return (v - low) / (high - low)


def randomize(config: dict[str, Any], value: Any,
              randbelow: RandBelow = secrets.randbelow) -> dict[str, Any]:
    """One report for one true answer (``config`` must have passed ``check_config``).

    ``randbelow(n)`` must return a uniform integer in [0, n); leave it as ``secrets.randbelow``
    (tests may pass a seeded generator's ``randrange``).
    """
    mech = config["mechanism"]
    params = config["params"]
    report: dict[str, Any] = {"mechanism": mech}
    if mech in ("rr", "two-coin"):
        x = _binary_answer(value)
        p = Fraction(params["p"])
        if mech == "rr":
            y = x if _bernoulli(p, randbelow) else randbelow(2)
        else:
            y = x if _bernoulli(p, randbelow) else int(_bernoulli(p, randbelow))
        report["y"] = y
    elif mech == "grr":
        x = _category_index(config, value)
        k = len(config["categories"])
        if _bernoulli(Fraction(params["p"]), randbelow):
            y = x
        else:
            y = randbelow(k - 1)
            y += y >= x
        report["y"] = config["categories"][y]
    elif mech in ("sue", "oue"):
        x = _category_index(config, value)
        p, q = Fraction(params["p"]), Fraction(params["q"])
        k = len(config["categories"])
        report["bits"] = "".join(
            "1" if _bernoulli(p if j == x else q, randbelow) else "0" for j in range(k))
    elif mech == "olh":
        x = _category_index(config, value)
        g, k = params["g"], len(config["categories"])
        digits = olh_digits(k, g)
        seed = randbelow(g ** (digits + 1))
        h = olh_hash(seed, x, g, digits)
        if _bernoulli(Fraction(params["p"]), randbelow):
            y = h
        else:
            y = randbelow(g - 1)
            y += y >= h
        report["seed"], report["y"] = seed, y
    elif mech == "hadamard":
        x = _category_index(config, value)
        size = params["K"]
        row = x + 1
        want_in = _bernoulli(Fraction(params["p"]), randbelow)
        y = randbelow(size)
        if (bin(row & y).count("1") % 2 == 0) != want_in:
            y ^= row & -row  # flips the parity of row & y: a bijection between the two halves
        report["y"] = y
    elif mech == "duchi":
        t = _unit_position(config, value)  # the answer in [0, 1]; x = 2t - 1 in [-1, 1]
        rho = Fraction(params["rho"])
        plus = (1 + rho * (2 * t - 1)) / 2
        report["y"] = 1 if _bernoulli(plus, randbelow) else -1
    else:  # piecewise
        t = _unit_position(config, value)
        grid, m = params["grid"], params["m"]
        pos = t * grid  # randomized rounding to the input grid 0..grid, unbiased
        i = math.floor(pos)
        if _bernoulli_or_zero(pos - i, randbelow):
            i += 1
        if _bernoulli(Fraction(grid, grid + m), randbelow):
            y = i + randbelow(m)  # the m cells of the centre piece
        else:
            y = randbelow(grid)
            y += m if y >= i else 0  # the other cells
        report["y"] = y
    return report


def _bernoulli_or_zero(p: Fraction, randbelow: RandBelow) -> bool:
    return p > 0 and _bernoulli(p, randbelow)


# ---------------------------------------------------------------------------------------------
# Command line.


def _usage() -> str:
    """The usage block of the module docstring (the paragraph that shows the commands)."""
    for block in (__doc__ or "").split("\n\n"):
        if "python client.py" in block:
            lines = [line.strip() for line in block.splitlines()]
            return "usage:\n" + "\n".join("  " + line for line in lines)
    return "usage: python client.py SURVEY.json [ANSWER ...]"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage(), file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    try:
        with open(args[0], encoding="utf-8") as handle:
            config = check_config(json.load(handle))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError, RecursionError) as exc:  # JSON errors are ValueErrors
        print(f"error: cannot read the survey configuration: {type(exc).__name__}",
              file=sys.stderr)
        return 2
    answers = args[1:] if len(args) > 1 else [line.rstrip("\r\n") for line in sys.stdin]
    status = 0
    for number, answer in enumerate(answers, 1):
        if not answer and len(args) == 1:
            continue
        try:
            print(json.dumps(randomize(config, answer)), flush=True)
        except ValueError as exc:
            print(f"error: answer {number}: {exc}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
