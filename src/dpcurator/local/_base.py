"""What every local randomizer shares: its guarantee, its configuration, its report format.

A local randomizer R runs on the respondent's side and maps one true answer x to one report y.
It is epsilon-LDP when P[R(x) = y] <= e^epsilon P[R(x') = y] for all answers x, x' and reports y:
``PureDP(epsilon, Neighbouring.REPLACE)``, the relation "replace one respondent's answer"
(whether someone answered at all is not hidden). Reports of different respondents use
independent randomness, so the table of all reports has the same guarantee (parallel
composition).

Every randomizer here is built from exact rational parameters (see ``client.exp_lower``), and
``privacy_ratio()`` returns the exact largest ratio, which is at most e^epsilon.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from dpcurator import _validation as check
from dpcurator.accounting import Neighbouring, PureDP
from dpcurator.accounting.events import PureDPEvent
from dpcurator.errors import UserError
from dpcurator.local import client
from dpcurator.local.estimators import SurveyEstimate
from dpcurator.noise import RandomSource, resolve_source

IntArray = npt.NDArray[np.int64]
Reports = npt.NDArray[Any]
Row = tuple[Any, ...]  # one parsed report: ints (a bytes object for unary encodings)

MAX_EPSILON = client.MAX_EPSILON  # beyond this a local report is practically the raw answer
MAX_CATEGORIES = client.MAX_CATEGORIES  # k at most this: what it allocates, in ``client``


class ReportError(UserError):
    """A report that cannot be parsed or does not fit the survey. Never quotes the report."""


def check_epsilon(epsilon: Any) -> float:
    eps = check.positive("epsilon", epsilon, wrong_type=UserError)
    if eps > MAX_EPSILON:
        raise UserError(
            f"epsilon must be at most {MAX_EPSILON:g} for a local survey (larger values leave "
            f"no privacy), got {epsilon!r}")
    return eps


def fraction_text(value: Fraction) -> str:
    return f"{value.numerator}/{value.denominator}"


def check_int_field(obj: Mapping[str, Any], key: str, low: int, high: int) -> int:
    """An integer field in [low, high), from JSON (int) or CSV (decimal text)."""
    raw = obj.get(key)
    if isinstance(raw, str):
        text = raw.strip()
        digits = text[1:] if text.startswith("-") else text
        # ASCII digits only, and at most 20 of them (every field fits in 64 bits)
        if not (digits.isascii() and digits.isdigit() and len(digits) <= 20):
            raise ReportError(f"field {key!r} must be an integer")
        raw = int(text)
    elif isinstance(raw, float) and raw.is_integer():
        raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ReportError(f"field {key!r} is missing or not an integer")
    if not low <= raw < high:
        raise ReportError(f"field {key!r} is out of range [{low}, {high})")
    return raw


class Accumulator(ABC):
    """Streaming sufficient statistics of reports: constant memory, chunk by chunk."""

    n: int

    @abstractmethod
    def add(self, reports: Reports) -> None:
        """Fold a chunk of reports (a randomizer's report array) into the statistics."""


class LocalRandomizer(ABC):
    """A respondent-side randomizer with an exact epsilon-LDP guarantee.

    ``source``: leave None for the cryptographically secure default; a ``SeededRandom`` is
    INSECURE and only for tests and benchmarks.
    """

    #: The mechanism's name in configurations, reports and the CLI.
    mechanism: str
    #: The JSON fields of one report, besides "mechanism".
    report_fields: ClassVar[tuple[str, ...]] = ("y",)
    #: The interval ``estimate`` gives when no ``method`` is named.
    default_method: ClassVar[str] = "normal"

    def __init__(self, epsilon: float, source: RandomSource | None) -> None:
        self._epsilon = check_epsilon(epsilon)
        self._source = source

    # -- the guarantee ------------------------------------------------------------------------

    @property
    def epsilon(self) -> float:
        return self._epsilon

    @property
    def guarantee(self) -> PureDP:
        """epsilon-DP under ``Neighbouring.REPLACE`` of one respondent's answer."""
        return PureDP(self._epsilon, neighbouring=Neighbouring.REPLACE)

    @property
    def event(self) -> PureDPEvent:
        """What one report costs each respondent, for the accountants."""
        return PureDPEvent(self._epsilon)

    @property
    def source(self) -> RandomSource:
        return resolve_source(self._source)

    def privacy_ratio(self) -> Fraction:
        """The exact largest P[R(x) = y] / P[R(x') = y] over answers x, x' and reports y."""
        return client.loss_ratio(self.config())

    def _verify(self) -> None:
        """Refuse parameters whose exact privacy ratio exceeds e^epsilon (explicit ones)."""
        if not client.at_most_exp(self.privacy_ratio(), self._epsilon):
            raise UserError(f"these parameters do not give epsilon={self._epsilon!r}-LDP")

    # -- configuration ------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        """The survey configuration that ``client.py`` randomizes with (JSON-ready)."""
        return {"format": client.FORMAT, "mechanism": self.mechanism,
                "epsilon": self._epsilon, **self._config_body()}

    @abstractmethod
    def _config_body(self) -> dict[str, Any]:
        """Mechanism-specific keys: categories or range, and ``params``."""

    # -- respondent side ----------------------------------------------------------------------

    @abstractmethod
    def randomize(self, values: Any) -> Reports:
        """One report per true answer, as an array (first axis: respondents)."""

    @abstractmethod
    def report_distribution(self, value: Any) -> dict[Row, Fraction]:
        """Every report's exact probability for one true answer (small configurations only)."""

    # -- collector side -----------------------------------------------------------------------

    @abstractmethod
    def parse_report(self, obj: Mapping[str, Any]) -> Row:
        """Validate one decoded report (JSON object or CSV row); raise ``ReportError``."""

    @abstractmethod
    def rows_to_reports(self, rows: Sequence[Row]) -> Reports:
        """Parsed rows as a report array, the inverse of ``report_rows``."""

    @abstractmethod
    def report_rows(self, reports: Reports) -> Iterator[dict[str, Any]]:
        """Reports as JSON objects, in the client's format."""

    @abstractmethod
    def accumulator(self) -> Accumulator:
        """An empty streaming aggregate for this randomizer's reports."""

    @abstractmethod
    def estimate(self, reports: Reports | Accumulator, *, confidence: float = 0.95,
                 method: str | None = None, project: bool = False) -> SurveyEstimate:
        """Estimate the population figure from reports (or an accumulator that saw them);
        ``method`` None is the mechanism's ``default_method``."""

    def _accumulated(self, reports: Reports | Accumulator) -> Accumulator:
        if isinstance(reports, Accumulator):
            return reports
        acc = self.accumulator()
        acc.add(reports)
        return acc

    def __repr__(self) -> str:
        return f"{type(self).__name__}(epsilon={self._epsilon!r})"


class Categories:
    """The answer labels of a categorical question and the map from labels to indices."""

    def __init__(self, labels: Sequence[Any] | int) -> None:
        if isinstance(labels, int | np.integer) and not isinstance(labels, bool | np.bool_):
            # k checked before anything of size k exists (k = 10^9 ran out of memory here)
            if not 2 <= labels <= MAX_CATEGORIES:
                raise UserError(f"k (the number of categories) must be an integer in "
                                f"[2, {MAX_CATEGORIES:,}], got {labels}")
            labels = list(range(int(labels)))
        if isinstance(labels, str | bytes) or not isinstance(labels, Sequence | np.ndarray):
            raise UserError("categories must be a sequence of at least 2 distinct labels, or "
                            "their number k (an integer)")
        if len(labels) > MAX_CATEGORIES:
            raise UserError(f"categories may hold at most {MAX_CATEGORIES:,} labels (k, the "
                            f"number of categories, must be at most {MAX_CATEGORIES:,}), got "
                            f"{len(labels):,}")
        values = tuple(labels.tolist() if isinstance(labels, np.ndarray) else labels)
        if len(values) < 2:
            raise UserError("categories must hold at least 2 distinct labels")
        for v in values:
            if isinstance(v, bool) or not isinstance(v, str | int | np.integer):
                raise UserError("categories must be strings or integers")
        values = tuple(int(v) if isinstance(v, np.integer) else v for v in values)
        text = [str(v) for v in values]
        if len(set(text)) != len(values):
            raise UserError("categories must be distinct, also when written as text")
        self.labels: tuple[Any, ...] = values
        self.k = len(values)
        self._by_text = {t: i for i, t in enumerate(text)}
        self._identity = values == tuple(range(self.k))
        self._sorted: npt.NDArray[Any] | None = None
        if all(isinstance(v, str) for v in values) or all(isinstance(v, int) for v in values):
            arr = np.array(values)
            self._order = np.argsort(arr, kind="stable")
            self._sorted = arr[self._order]

    def indices(self, values: Any, name: str = "values") -> IntArray:
        """Category indices of an array of labels; a clear error for unknown labels."""
        arr = np.asarray(values)
        if arr.ndim != 1:
            arr = arr.reshape(-1)
        if self._identity and arr.dtype.kind in "iu":
            if arr.size and (arr.min() < 0 or arr.max() >= self.k):
                raise UserError(
                    f"{name} contains answers that are not among the survey's {self.k} "
                    f"categories (0..{self.k - 1})")
            return arr.astype(np.int64, copy=False)
        if self._sorted is not None and arr.dtype.kind == self._sorted.dtype.kind:
            pos = np.searchsorted(self._sorted, arr).clip(0, self.k - 1)
            if not np.all(self._sorted[pos] == arr):
                raise UserError(f"{name} contains answers that are not among the survey's "
                                f"{self.k} categories")
            return np.asarray(self._order[pos], dtype=np.int64)
        out = np.fromiter((self._by_text.get(str(v), -1) for v in arr.tolist()),
                          dtype=np.int64, count=arr.size)
        if np.any(out < 0):
            raise UserError(f"{name} contains answers that are not among the survey's "
                            f"{self.k} categories")
        return out

    def index_of(self, label: Any) -> int:
        """The index of one reported label (JSON value or CSV text); ``ReportError`` if unknown."""
        if isinstance(label, bool) or not isinstance(label, str | int):
            raise ReportError("field 'y' must be a category label")
        idx = self._by_text.get(str(label))
        if idx is None:
            raise ReportError("field 'y' is not one of the survey's categories")
        return idx


def check_confidence(confidence: Any) -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, int | float):
        raise UserError(f"confidence must be a number in (0, 1), got {confidence!r}")
    c = float(confidence)
    if not (math.isfinite(c) and 0 < c < 1):
        raise UserError(f"confidence must be a number in (0, 1) such as 0.95, got {confidence!r}")
    return c


def check_method(method: Any, default: str = "normal") -> str:
    """The interval method by name; None is the mechanism's ``default``."""
    if method is None:
        return default
    if method not in ("normal", "exact"):
        raise UserError(f"method must be 'normal' or 'exact' (Clopper-Pearson), got {method!r}")
    return str(method)
