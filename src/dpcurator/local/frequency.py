"""Frequency oracles: randomizers for yes/no and multiple-choice questions, and their estimates.

Every oracle here is epsilon-LDP under ``Neighbouring.REPLACE`` (see ``_base``) and fits the
"support" structure of Wang, Blocki, Li and Jha, "Locally differentially private protocols for
frequency estimation" (USENIX Security 2017), whose estimator and closed-form variances are in
``estimators``. With E <= e^epsilon the exact rational from ``client.exp_lower``:

=============  ============================================  =========================  ========
mechanism      report                                        p* / q*                    ratio
=============  ============================================  =========================  ========
rr             truth w.p. p, else a fair coin                (1+p)/2 / (1-p)/2          (1+p)/(1-p)
two-coin       truth w.p. p, else "yes" w.p. p               2p-p^2 / p-p^2 (for yes)   see below
grr            truth w.p. E/(E+k-1), else another category   p / (1-p)/(k-1)            E
sue            k bits: own bit 1 w.p. E'/(E'+1), others      E'/(E'+1) / 1/(E'+1)       E'^2
               1 w.p. 1/(E'+1), E' <= e^(epsilon/2)
oue            k bits: own bit 1 w.p. 1/2, others 1/(E+1)    1/2 / 1/(E+1)              E
olh            (seed, y): y = GRR over g values of h_seed(x)  E/(E+g-1) / 1/g            E
hadamard       y in [0, K): in C_x w.p. E/(E+1)              E/(E+1) / 1/2              E
=============  ============================================  =========================  ========

The two binary protocols reuse ``dpcurator.mechanisms.RandomizedResponse`` (its exact truth
probability, its epsilon, its release); "rr" is its "truth-or-coin" protocol and "two-coin" its
two-coin survey, whose "no" reports bind above epsilon = ln 3 (see that module).

Sources: SUE is basic one-time RAPPOR (Erlingsson, Pihur and Korolova, CCS 2014); OUE and OLH
are Wang et al. 2017 (Sections 4.3 and 4.4); GRR is k-ary randomized response (Kairouz, Oh and
Viswanath 2014); Hadamard response is Acharya, Sun and Zhang, "Hadamard response: estimating
distributions privately, efficiently, and with little communication" (AISTATS 2019), in its
high-privacy form (one set C_x of K/2 columns per category).
"""

from __future__ import annotations

import itertools
import math
from abc import abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from dpcurator.errors import UserError
from dpcurator.local import _sampling, client
from dpcurator.local._base import (
    Accumulator,
    Categories,
    IntArray,
    LocalRandomizer,
    ReportError,
    Reports,
    Row,
    check_confidence,
    check_epsilon,
    check_int_field,
    check_method,
    fraction_text,
)
from dpcurator.local.estimators import (
    FloatArray,
    FrequencyEstimate,
    RateEstimate,
    frequency_arrays,
    project_simplex,
    support_variance,
)
from dpcurator.mechanisms.randomized_response import ProtocolName, RandomizedResponse
from dpcurator.noise import RandomSource

__all__ = [
    "BinaryResponse",
    "FrequencyOracle",
    "GeneralizedRR",
    "HadamardResponse",
    "OptimizedLocalHashing",
    "OptimizedUnaryEncoding",
    "SymmetricUnaryEncoding",
]

_CELLS = 1 << 22  # elements per chunk of a (reports x categories) working array


class CountAccumulator(Accumulator):
    """Support counts C_v (one per category) and the number of reports."""

    def __init__(self, oracle: SupportOracle) -> None:
        self._oracle = oracle
        self._counts = np.zeros(oracle.k, dtype=np.int64)
        self.n = 0

    def add(self, reports: Reports) -> None:
        reports = np.asarray(reports)
        self._counts += self._oracle._count_supports(reports)
        self.n += int(reports.shape[0])

    def support_counts(self) -> IntArray:
        return self._counts.copy()


class SupportOracle(LocalRandomizer):
    """The shared machinery of every frequency oracle: support counts and their estimates.

    Intervals default to "exact" (Clopper-Pearson): the asymptotic "normal" one covers far less
    than its level for rare categories (83% for a 95% interval at a 1% share, n = 200) and has
    zero width when no report supports a category, while "exact" costs about the same.
    """

    k: int
    default_method: ClassVar[str] = "exact"

    @abstractmethod
    def support_probabilities(self) -> tuple[list[Fraction], list[Fraction]]:
        """Exact (p*_v, q*_v) per category: P[a report supports v | answer v, | answer not v]."""

    @abstractmethod
    def supports(self, reports: Reports, category: int) -> npt.NDArray[np.bool_]:
        """For each report, whether it supports category index ``category``."""

    def _count_supports(self, reports: Reports) -> IntArray:
        return np.array([np.count_nonzero(self.supports(reports, v)) for v in range(self.k)],
                        dtype=np.int64)

    def _verify(self) -> None:
        """Also refuse parameters that are private but carry no signal: p*_v <= q*_v, where a
        report supports its own answer no more often than another (the estimate divides by
        p* - q*)."""
        super()._verify()
        p, q = self.support_probabilities()
        for pv, qv in zip(p, q, strict=True):
            if not pv > qv:
                raise UserError(
                    f"the {self.mechanism} parameters {self._params_text()} carry no signal: a "
                    f"report supports its own answer with probability p* = {fraction_text(pv)} "
                    f"and another answer with q* = {fraction_text(qv)}; p* must exceed q*")

    def _params_text(self) -> str:
        return str(self.config().get("params", {}))

    def accumulator(self) -> CountAccumulator:
        return CountAccumulator(self)

    def support_counts(self, reports: Reports | Accumulator) -> tuple[IntArray, int]:
        """(C_v for every category, n): how many of the n reports support each category."""
        acc = self._accumulated(reports)
        assert isinstance(acc, CountAccumulator)
        return acc.support_counts(), acc.n

    def variance(self, frequencies: npt.ArrayLike, n: int, model: str = "sampled") -> FloatArray:
        """Exact variance of each category's unbiased estimate, for true shares ``frequencies``.

        ``model="sampled"``: respondents drawn at random from a population with these shares
        (the references' model); ``"fixed"``: exactly these shares among the n respondents.
        """
        p, q = self.support_probabilities()
        f = np.broadcast_to(np.asarray(frequencies, dtype=np.float64), (self.k,))
        return support_variance(f, n, [float(x) for x in p], [float(x) for x in q], model)

    def report_variance(self, rate: float | None = None) -> float:
        """The variance of one report's contribution, n * Var[f_hat_v], in the sampled model.

        Worst case over the categories and over the unknown share (the share of the support
        probability lambda closest to 1/2), unless ``rate`` gives the share.
        """
        p, q = self.support_probabilities()
        worst = 0.0
        for pv, qv in zip(p, q, strict=True):
            hi, lo = max(float(pv), float(qv)), min(float(pv), float(qv))
            lam = min(max(0.5, lo), hi) if rate is None else float(qv + (pv - qv) * rate)
            worst = max(worst, lam * (1 - lam) / float(pv - qv) ** 2)
        return worst

    def _frequency_arrays(
        self, reports: Reports | Accumulator, confidence: float, method: str
    ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, int]:
        confidence = check_confidence(confidence)
        counts, n = self.support_counts(reports)
        p, q = self.support_probabilities()
        return (*frequency_arrays(counts, n, p, q, confidence, method), n)


class FrequencyOracle(SupportOracle):
    """A randomizer for one answer among k categories, with unbiased frequency estimates.

    ``categories``: the labels, or their number k (labels 0..k-1); k is at most
    ``client.MAX_CATEGORIES`` (10^6), refused above it before anything of size k is made.
    """

    def __init__(self, epsilon: float, categories: Sequence[Any] | int,
                 source: RandomSource | None) -> None:
        super().__init__(epsilon, source)
        self._categories = Categories(categories)
        self.k = self._categories.k

    @property
    def categories(self) -> tuple[Any, ...]:
        return self._categories.labels

    def category_indices(self, values: Any) -> IntArray:
        return self._categories.indices(values)

    def randomize(self, values: Any) -> Reports:
        """One report per answer; answers are category labels (a clear error for others)."""
        return self.randomize_indices(self._categories.indices(values))

    @abstractmethod
    def randomize_indices(self, idx: IntArray) -> Reports:
        """Reports for answers given as category indices 0..k-1."""

    def _config_body(self) -> dict[str, Any]:
        return {"categories": list(self.categories), "params": self._params()}

    @abstractmethod
    def _params(self) -> dict[str, Any]:
        """The exact parameters, JSON-ready (rationals as 'numerator/denominator')."""

    def estimate(self, reports: Reports | Accumulator, *, confidence: float = 0.95,
                 method: str | None = None, project: bool = False) -> FrequencyEstimate:
        """Each category's share: unbiased, with exact-variance standard errors and intervals.

        ``method``: "exact" (Clopper-Pearson, coverage >= confidence per category; the default)
        or "normal" (asymptotic: it under-covers for rare categories). ``project=True`` projects
        the estimates onto the probability simplex (explicit post-processing: estimates become
        biased; intervals stay those of the unbiased estimator). See
        ``dpcurator.local.estimators``.
        """
        method = check_method(method, self.default_method)
        value, se, low, high, n = self._frequency_arrays(reports, confidence, method)
        shown = project_simplex(value) if project else value
        return FrequencyEstimate(
            mechanism=self.mechanism, epsilon=self.epsilon, n=n, confidence=confidence,
            method=method, categories=self.categories, estimates=shown, standard_errors=se,
            intervals=(low, high), projected=bool(project), unbiased=value)

    def _value_index(self, value: Any) -> int:
        return int(self._categories.indices(np.array([value]))[0])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(epsilon={self.epsilon!r}, k={self.k})"


# ---------------------------------------------------------------------------------------------
# Yes/no questions: randomized response, through the mechanisms package.


class BinaryResponse(SupportOracle):
    """Randomized response to a yes/no question ("rr" or "two-coin").

    - ``"rr"``: the truth with probability p, otherwise a fair coin; epsilon = ln((1 + p) /
      (1 - p)) (Lalanne, lesson 1, eqs. (7)-(8)); any epsilon > 0.
    - ``"two-coin"``: the references' survey: first coin tails (probability p), the truth;
      otherwise a second coin says "yes" on tails. epsilon > ln 2 only.

    Both are ``RandomizedResponse`` (``protocol="truth-or-coin"`` and ``"two-coin"``): the exact
    truth probability p, its epsilon and the release come from there. Answers are booleans or
    0/1; reports are booleans. ``estimate`` gives the share of "yes" answers.
    """

    report_fields = ("y",)
    k = 2
    _PROTOCOLS: ClassVar[dict[str, ProtocolName]] = {
        "rr": "truth-or-coin", "two-coin": "two-coin"}

    def __init__(self, epsilon: float, protocol: str = "rr", source: RandomSource | None = None,
                 *, truth_probability: Fraction | None = None) -> None:
        if protocol not in self._PROTOCOLS:
            raise UserError(f"protocol must be 'rr' or 'two-coin', got {protocol!r}")
        super().__init__(epsilon, source)
        self.mechanism = protocol
        if truth_probability is None:
            self._rr = RandomizedResponse(epsilon=self.epsilon, protocol=self._PROTOCOLS[protocol],
                                          source=source)
        else:
            self._rr = RandomizedResponse(truth_probability=truth_probability,
                                          protocol=self._PROTOCOLS[protocol], source=source)
        self._verify()

    @property
    def truth_probability(self) -> Fraction:
        return self._rr.truth_probability

    @property
    def randomized_response(self) -> RandomizedResponse:
        """The underlying mechanism (exact matrix, its own estimate and exact interval)."""
        return self._rr

    def _config_body(self) -> dict[str, Any]:
        return {"params": {"p": fraction_text(self.truth_probability)}}

    def support_probabilities(self) -> tuple[list[Fraction], list[Fraction]]:
        m = self._rr.probability_matrix()  # m[answer][report], answers/reports (no, yes)
        return [m[0][0], m[1][1]], [m[1][0], m[0][1]]

    def supports(self, reports: Reports, category: int) -> npt.NDArray[np.bool_]:
        r: npt.NDArray[np.bool_] = np.asarray(reports, dtype=np.bool_)
        return r if category == 1 else ~r

    def _count_supports(self, reports: Reports) -> IntArray:
        yes = int(np.count_nonzero(reports))
        return np.array([reports.shape[0] - yes, yes], dtype=np.int64)

    def randomize(self, values: Any) -> Reports:
        """Reports (booleans) for answers given as booleans or 0/1."""
        return np.asarray(self._rr.release(np.asarray(values).reshape(-1)), dtype=np.bool_)

    def report_distribution(self, value: Any) -> dict[Row, Fraction]:
        row = self._rr.probability_matrix()[1 if bool(value) else 0]
        return {(0,): row[0], (1,): row[1]}

    def parse_report(self, obj: Mapping[str, Any]) -> Row:
        y = obj.get("y")
        if isinstance(y, str):
            y = y.strip().lower()
            y = {"1": 1, "0": 0, "true": 1, "false": 0}.get(y, y)
        if y is True or y is False:
            return (int(y),)
        if isinstance(y, int) and y in (0, 1):
            return (y,)
        raise ReportError("field 'y' must be 0 or 1")

    def rows_to_reports(self, rows: Sequence[Row]) -> Reports:
        return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)).astype(bool)

    def report_rows(self, reports: Reports) -> Iterator[dict[str, Any]]:
        for y in np.asarray(reports, dtype=np.bool_).tolist():
            yield {"mechanism": self.mechanism, "y": int(y)}

    def estimate(self, reports: Reports | Accumulator, *, confidence: float = 0.95,
                 method: str | None = None, project: bool = False) -> RateEstimate:
        """The share of "yes": mu_hat = (mean - q*) / (p* - q*), unbiased (Lalanne eq. (10)).

        ``method``: "exact" (the default) inverts Clopper-Pearson; "normal" is the references'
        asymptotic interval, eq. (15). ``project=True`` clips mu_hat to [0, 1].
        """
        method = check_method(method, self.default_method)
        value, se, low, high, n = self._frequency_arrays(reports, confidence, method)
        shown = float(np.clip(value[1], 0.0, 1.0)) if project else float(value[1])
        return RateEstimate(mechanism=self.mechanism, epsilon=self.epsilon, n=n,
                            confidence=confidence, method=method, estimate=shown,
                            standard_error=float(se[1]),
                            interval=(float(low[1]), float(high[1])))

    def __repr__(self) -> str:
        return f"BinaryResponse(epsilon={self.epsilon!r}, protocol={self.mechanism!r})"


# ---------------------------------------------------------------------------------------------
# k-ary randomized response.


class GeneralizedRR(FrequencyOracle):
    """k-ary randomized response: the true category w.p. p = E/(E+k-1), else another one.

    The exact p is that of ``RandomizedResponse(protocol="generalized")``; sampling works on
    category indices (one exact Bernoulli and one exact uniform draw per report).
    """

    mechanism = "grr"

    def __init__(self, epsilon: float, categories: Sequence[Any] | int,
                 source: RandomSource | None = None, *, p: Fraction | None = None) -> None:
        super().__init__(epsilon, categories, source)
        if p is None:
            p = RandomizedResponse(epsilon=self.epsilon, categories=list(range(self.k)),
                                   protocol="generalized").truth_probability
        self._p = Fraction(p)
        self._verify()

    @property
    def truth_probability(self) -> Fraction:
        return self._p

    def _params(self) -> dict[str, Any]:
        return {"p": fraction_text(self._p)}

    def support_probabilities(self) -> tuple[list[Fraction], list[Fraction]]:
        return [self._p] * self.k, [(1 - self._p) / (self.k - 1)] * self.k

    def randomize_indices(self, idx: IntArray) -> Reports:
        src = self.source
        keep = _sampling.bernoulli(self._p, idx.size, src)
        other = _sampling.uniform(self.k - 1, idx.size, src)
        other += other >= idx  # uniform over the k - 1 other categories
        return _sampling.select(keep, idx, other)

    def supports(self, reports: Reports, category: int) -> npt.NDArray[np.bool_]:
        return np.asarray(np.asarray(reports) == category, dtype=np.bool_)

    def _count_supports(self, reports: Reports) -> IntArray:
        return np.bincount(np.asarray(reports, dtype=np.int64), minlength=self.k).astype(np.int64)

    def report_distribution(self, value: Any) -> dict[Row, Fraction]:
        x = self._value_index(value)
        other = (1 - self._p) / (self.k - 1)
        return {(j,): self._p if j == x else other for j in range(self.k)}

    def parse_report(self, obj: Mapping[str, Any]) -> Row:
        return (self._categories.index_of(obj.get("y")),)

    def rows_to_reports(self, rows: Sequence[Row]) -> Reports:
        return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))

    def report_rows(self, reports: Reports) -> Iterator[dict[str, Any]]:
        labels = self.categories
        for j in np.asarray(reports).tolist():
            yield {"mechanism": self.mechanism, "y": labels[j]}


# ---------------------------------------------------------------------------------------------
# Unary encoding.


class _UnaryEncoding(FrequencyOracle):
    """k bits per report: the answer's bit is 1 w.p. p, every other bit w.p. q, independently."""

    report_fields = ("bits",)

    def __init__(self, epsilon: float, categories: Sequence[Any] | int,
                 source: RandomSource | None, p: Fraction, q: Fraction) -> None:
        super().__init__(epsilon, categories, source)
        self._p, self._q = p, q
        self._verify()

    @property
    def bit_probabilities(self) -> tuple[Fraction, Fraction]:
        """(p, q): P[own bit = 1], P[any other bit = 1]."""
        return self._p, self._q

    def _params(self) -> dict[str, Any]:
        return {"p": fraction_text(self._p), "q": fraction_text(self._q)}

    def support_probabilities(self) -> tuple[list[Fraction], list[Fraction]]:
        return [self._p] * self.k, [self._q] * self.k

    def randomize_indices(self, idx: IntArray) -> Reports:
        src = self.source
        out = np.empty((idx.size, self.k), dtype=np.bool_)
        rows = max(1, _CELLS // self.k)
        for start in range(0, idx.size, rows):
            part = idx[start:start + rows]
            # Shape (len(part), k): every bit Bernoulli(q), then the answer's bit Bernoulli(p).
            bits = _sampling.bernoulli(self._q, part.size * self.k, src).reshape(-1, self.k)
            bits[np.arange(part.size), part] = _sampling.bernoulli(self._p, part.size, src)
            out[start:start + rows] = bits
        return out

    def supports(self, reports: Reports, category: int) -> npt.NDArray[np.bool_]:
        return np.asarray(reports, dtype=np.bool_)[:, category]

    def _count_supports(self, reports: Reports) -> IntArray:
        counts = np.count_nonzero(np.asarray(reports, dtype=np.bool_), axis=0)
        return np.asarray(counts, dtype=np.int64)

    def report_distribution(self, value: Any) -> dict[Row, Fraction]:
        if self.k > 16:
            raise UserError("report_distribution enumerates 2^k reports: only for k <= 16")
        x = self._value_index(value)
        out: dict[Row, Fraction] = {}
        for bits in itertools.product((0, 1), repeat=self.k):
            prob = Fraction(1)
            for j, b in enumerate(bits):
                one = self._p if j == x else self._q
                prob *= one if b else 1 - one
            out[bits] = prob
        return out

    def parse_report(self, obj: Mapping[str, Any]) -> Row:
        bits = obj.get("bits")
        if not isinstance(bits, str) or len(bits) != self.k or bits.strip("01"):
            raise ReportError(f"field 'bits' must be a string of {self.k} characters 0 or 1")
        return (bits.encode("ascii"),)

    def rows_to_reports(self, rows: Sequence[Row]) -> Reports:
        data = b"".join(bytes(r[0]) for r in rows)
        bits = np.frombuffer(data, dtype=np.uint8).reshape(len(rows), self.k)
        return np.asarray(bits == ord("1"), dtype=np.bool_)

    def report_rows(self, reports: Reports) -> Iterator[dict[str, Any]]:
        table = np.array([ord("0"), ord("1")], dtype=np.uint8)
        for row in np.asarray(reports, dtype=np.bool_):
            yield {"mechanism": self.mechanism, "bits": table[row.astype(np.int64)].tobytes()
                   .decode("ascii")}


class SymmetricUnaryEncoding(_UnaryEncoding):
    """Symmetric unary encoding (basic one-time RAPPOR): p = E'/(E'+1), q = 1 - p.

    E' <= e^(epsilon/2), so the ratio p(1-q) / (q(1-p)) = E'^2 <= e^epsilon.
    """

    mechanism = "sue"

    def __init__(self, epsilon: float, categories: Sequence[Any] | int,
                 source: RandomSource | None = None, *, p: Fraction | None = None,
                 q: Fraction | None = None) -> None:
        epsilon = check_epsilon(epsilon)  # before exp_lower uses it (NaN, inf, 1e9)
        if p is None or q is None:
            half = client.exp_lower(Fraction(epsilon) / 2)
            p, q = half / (half + 1), 1 / (half + 1)
        super().__init__(epsilon, categories, source, Fraction(p), Fraction(q))


class OptimizedUnaryEncoding(_UnaryEncoding):
    """Optimized unary encoding (Wang et al. 2017): p = 1/2, q = 1/(E+1), E <= e^epsilon."""

    mechanism = "oue"

    def __init__(self, epsilon: float, categories: Sequence[Any] | int,
                 source: RandomSource | None = None, *, p: Fraction | None = None,
                 q: Fraction | None = None) -> None:
        epsilon = check_epsilon(epsilon)  # before exp_lower uses it (NaN, inf, 1e9)
        if p is None or q is None:
            e = client.exp_lower(epsilon)
            p, q = Fraction(1, 2), 1 / (e + 1)
        super().__init__(epsilon, categories, source, Fraction(p), Fraction(q))


# ---------------------------------------------------------------------------------------------
# Optimized local hashing.


def _digit_matrix(k: int, g: int, digits: int) -> IntArray:
    """D[v, j] = the j-th base-g digit of v (least significant first), shape (k, digits)."""
    v = np.arange(k, dtype=np.int64)
    out = np.empty((k, digits), dtype=np.int64)
    for j in range(digits):
        out[:, j] = v % g
        v //= g
    return out


def _seed_digits(seeds: IntArray, g: int, digits: int) -> tuple[IntArray, IntArray]:
    """(b, A) from seeds: b = seed mod g, A[:, j] = the (j+1)-th base-g digit, shape (n, m)."""
    b = seeds % g
    rest = seeds // g
    a = np.empty((seeds.size, digits), dtype=np.int64)
    for j in range(digits):
        a[:, j] = rest % g
        rest = rest // g
    return b, a


def _mod_inverse(a: IntArray, g: int) -> IntArray:
    """a^(g-2) mod g (the inverse of a != 0 modulo the prime g), by repeated squaring."""
    result = np.ones_like(a)
    base = a % g
    e = g - 2
    while e:
        if e & 1:
            result = result * base % g
        base = base * base % g
        e >>= 1
    return result


class HashAccumulator(CountAccumulator):
    """Support counts for OLH, aggregated without touching every (report, category) pair.

    A report (seed, y) with seed = (b, a_1..a_m) supports v iff sum_j a_j d_j(v) = y - b (mod g).
    So all that matters about it is the key (a, c = y - b mod g): the accumulator keeps a
    histogram N[a, c] over the g^(m+1) keys (O(1) per report, memory independent of n), and
    ``support_counts`` evaluates C_v = sum_a N[a, <a, d(v)> mod g] once, by the cheaper of
    - a gather over (a, v): O(g^m k) (g^m < g k), or
    - a digit-by-digit partial-sum transform: O(m g^(m+2)) (cheaper for large k and small g).
    For m = 1 and large g (then g >= k) each report with a != 0 supports exactly one v, namely
    c / a mod g, counted directly; with larger key spaces the accumulator falls back to hashing
    every category for every report, chunk by chunk, O(n k m) numpy work.
    """

    _MAX_KEYS = 1 << 24

    def __init__(self, oracle: OptimizedLocalHashing) -> None:
        super().__init__(oracle)
        self._olh = oracle
        g, m = oracle.g, oracle.digits
        self._keys = g ** (m + 1)
        if m == 1 and g > 4096:
            self._mode = "inverse"
        elif self._keys <= self._MAX_KEYS:
            self._mode = "keys"
            self._hist = np.zeros(self._keys, dtype=np.int64)
        else:
            self._mode = "direct"
        self._all = 0  # inverse mode: reports with a = 0 and c = 0 support every category

    def add(self, reports: Reports) -> None:
        r = np.asarray(reports, dtype=np.int64).reshape(-1, 2)
        g = self._olh.g
        seeds, y = r[:, 0], r[:, 1]
        b = seeds % g
        c = (y - b) % g
        if self._mode == "keys":
            # key = a * g + c, with a = seed // g: seed - b + c.
            self._hist += np.bincount(seeds - b + c, minlength=self._keys)
        elif self._mode == "inverse":
            a = seeds // g
            nonzero = a != 0
            v = c[nonzero] * _mod_inverse(a[nonzero], g) % g
            self._counts += np.bincount(v[v < self.k_categories], minlength=self.k_categories)
            self._all += int(np.count_nonzero(~nonzero & (c == 0)))
        else:
            self._counts += self._olh._direct_counts(r)
        self.n += int(r.shape[0])

    @property
    def k_categories(self) -> int:
        return self._olh.k

    def support_counts(self) -> IntArray:
        if self._mode == "inverse":
            return self._counts + self._all
        if self._mode == "direct":
            return self._counts.copy()
        g, m, k = self._olh.g, self._olh.digits, self._olh.k
        if g ** m * k * m <= m * g ** (m + 2):
            return self._gather(g, m, k)
        return self._transform(g, m, k)

    def _gather(self, g: int, m: int, k: int) -> IntArray:
        hist = self._hist.reshape(g ** m, g)  # hist[a, c]
        digits = self._olh._digits_table.astype(np.float64)  # (k, m)
        out = np.zeros(k, dtype=np.int64)
        step = max(1, _CELLS // k)
        for start in range(0, g ** m, step):
            a_index = np.arange(start, min(start + step, g ** m), dtype=np.int64)
            _, a = _seed_digits(a_index * g, g, m)  # the digits a_1..a_m of each a
            # residues[a, v] = <a, d(v)> mod g, shape (chunk, k); exact in doubles (< 2^53).
            residues = (a.astype(np.float64) @ digits.T).astype(np.int64) % g
            out += np.take_along_axis(hist[a_index], residues, axis=1).sum(axis=0)
        return out

    def _transform(self, g: int, m: int, k: int) -> IntArray:
        # S[a_m, ..., a_1, c]; after step j the axis of a_j holds s_j, and
        # S[..., s_j, ..., c] = sum_{a_j} S[..., a_j, ..., c + a_j s_j].
        s = self._hist.reshape((g,) * (m + 1))
        for axis in range(m):
            new = np.zeros_like(s)
            for sv in range(g):
                total = np.zeros_like(np.take(s, 0, axis=axis))
                for av in range(g):
                    total += np.roll(np.take(s, av, axis=axis), -(av * sv) % g, axis=-1)
                index: list[Any] = [slice(None)] * (m + 1)
                index[axis] = sv
                new[tuple(index)] = total
            s = new
        d = self._olh._digits_table  # (k, m): d_1..d_m of each v; S's axes are a_m..a_1
        return np.asarray(s[(*(d[:, j] for j in reversed(range(m))), 0)], dtype=np.int64)


class OptimizedLocalHashing(FrequencyOracle):
    """Optimized local hashing (Wang et al. 2017, Section 4.4).

    Each respondent draws a hash function h from a family mapping the k categories to g values,
    and reports (h, y) where y is h(x) randomized by g-ary randomized response: y = h(x) w.p.
    p = E/(E+g-1), else one of the other g - 1 values uniformly. The ratio is E <= e^epsilon
    whatever the family, because h is drawn independently of the answer.

    The family is exactly pairwise independent (``client.olh_hash``): g is prime and
    h(x) = b + sum_j a_j d_j(x) mod g over the base-g digits d_j of x, with the seed
    (b, a_1..a_m) uniform on [0, g^(m+1)), drawn from the secure source. Two categories then
    collide with probability exactly 1/g, so q* = 1/g exactly and the estimate is exactly
    unbiased (with xxhash, as in pure-LDP, q* = 1/g is only approximate). g is the prime that
    minimizes the exact variance q*(1-q*)/(p*-q*)^2 (Wang et al. take round(e^epsilon) + 1; the
    variance is flat there, so the prime costs well under 1%).
    """

    mechanism = "olh"
    report_fields = ("seed", "y")
    _MAX_G = 1 << 31

    def __init__(self, epsilon: float, categories: Sequence[Any] | int,
                 source: RandomSource | None = None, *, g: int | None = None,
                 p: Fraction | None = None) -> None:
        super().__init__(epsilon, categories, source)
        e = client.exp_lower(self.epsilon)
        if g is None:
            g = self._best_prime(e)
        if not client.is_prime(g) or g > self._MAX_G:
            raise UserError(f"g must be a prime <= 2^31, got {g}")
        self.g = g
        self.digits = client.olh_digits(self.k, g)
        if g ** (self.digits + 1) > 2**62:
            raise UserError("this epsilon and k need more hash seeds than 2^62; use oue or grr")
        self._p = Fraction(p) if p is not None else e / (e + g - 1)
        self._digits_table = _digit_matrix(self.k, g, self.digits)
        self._verify()

    @classmethod
    def _best_prime(cls, e: Fraction) -> int:
        target = float(e) + 1.0  # the real-valued optimum g = e^epsilon + 1
        if target > cls._MAX_G:
            raise UserError("epsilon is too large for olh (g would exceed 2^31); use grr")
        below = max(2, math.floor(target))
        while below > 2 and not client.is_prime(below):
            below -= 1
        above = max(2, math.ceil(target))
        while not client.is_prime(above):
            above += 1

        def var0(g: int) -> float:  # q*(1 - q*) / (p* - q*)^2 with q* = 1/g
            p = float(e / (e + g - 1))
            return (1 / g) * (1 - 1 / g) / (p - 1 / g) ** 2

        return min((below, above), key=lambda g: (var0(g), g))

    @property
    def keep_probability(self) -> Fraction:
        return self._p

    def _params(self) -> dict[str, Any]:
        return {"g": self.g, "p": fraction_text(self._p)}

    def support_probabilities(self) -> tuple[list[Fraction], list[Fraction]]:
        return [self._p] * self.k, [Fraction(1, self.g)] * self.k

    def hash_values(self, seeds: IntArray, idx: IntArray) -> IntArray:
        """h_seed(x) for each (seed, category index) pair, vectorized ``client.olh_hash``."""
        b, a = _seed_digits(np.asarray(seeds, dtype=np.int64), self.g, self.digits)
        d = self._digits_table[idx]
        h = b
        for j in range(self.digits):
            h = (h + a[:, j] * d[:, j]) % self.g
        return h

    def randomize_indices(self, idx: IntArray) -> Reports:
        src = self.source
        seeds = _sampling.uniform(self.g ** (self.digits + 1), idx.size, src)
        h = self.hash_values(seeds, idx)
        keep = _sampling.bernoulli(self._p, idx.size, src)
        other = _sampling.uniform(self.g - 1, idx.size, src)
        other += other >= h
        # Shape (n, 2): the hash function's seed and the randomized hash value.
        return np.stack([seeds, _sampling.select(keep, h, other)], axis=1)

    def supports(self, reports: Reports, category: int) -> npt.NDArray[np.bool_]:
        r = np.asarray(reports, dtype=np.int64).reshape(-1, 2)
        return np.asarray(self.hash_values(r[:, 0], np.full(r.shape[0], category)) == r[:, 1])

    def _direct_counts(self, reports: IntArray) -> IntArray:
        """Support counts by hashing every category for every report (chunks of reports)."""
        out = np.zeros(self.k, dtype=np.int64)
        dt = self._digits_table.T.astype(np.float64)  # (m, k)
        step = max(1, _CELLS // self.k)
        for start in range(0, reports.shape[0], step):
            part = reports[start:start + step]
            b, a = _seed_digits(part[:, 0], self.g, self.digits)
            if self.g ** 2 * self.digits < 2**53:
                h = (b[:, None] + (a.astype(np.float64) @ dt).astype(np.int64)) % self.g
            else:
                h = b[:, None] + np.zeros((1, self.k), dtype=np.int64)
                for j in range(self.digits):
                    h = (h + a[:, j:j + 1] * self._digits_table[:, j][None, :]) % self.g
            out += np.count_nonzero(h == part[:, 1:2], axis=0)
        return out

    def accumulator(self) -> HashAccumulator:
        return HashAccumulator(self)

    def report_distribution(self, value: Any) -> dict[Row, Fraction]:
        seeds = self.g ** (self.digits + 1)
        if seeds * self.g > 1 << 16:
            raise UserError("report_distribution enumerates every (seed, y): small g and k only")
        x = self._value_index(value)
        other = (1 - self._p) / (self.g - 1)
        out: dict[Row, Fraction] = {}
        for seed in range(seeds):
            h = client.olh_hash(seed, x, self.g, self.digits)
            for y in range(self.g):
                out[(seed, y)] = (self._p if y == h else other) / seeds
        return out

    def parse_report(self, obj: Mapping[str, Any]) -> Row:
        seed = check_int_field(obj, "seed", 0, self.g ** (self.digits + 1))
        return (seed, check_int_field(obj, "y", 0, self.g))

    def rows_to_reports(self, rows: Sequence[Row]) -> Reports:
        return np.array(rows, dtype=np.int64).reshape(-1, 2)

    def report_rows(self, reports: Reports) -> Iterator[dict[str, Any]]:
        for seed, y in np.asarray(reports, dtype=np.int64).reshape(-1, 2).tolist():
            yield {"mechanism": self.mechanism, "seed": seed, "y": y}

    def __repr__(self) -> str:
        return f"OptimizedLocalHashing(epsilon={self.epsilon!r}, k={self.k}, g={self.g})"


# ---------------------------------------------------------------------------------------------
# Hadamard response.


def walsh_hadamard(values: npt.ArrayLike) -> IntArray:
    """W[r] = sum_y (-1)^popcount(r & y) values[y], length a power of two (in-place butterflies)."""
    a = np.array(values, dtype=np.int64)
    size = a.size
    h = 1
    while h < size:
        view = a.reshape(-1, 2, h)
        left = view[:, 0, :].copy()
        view[:, 0, :] += view[:, 1, :]
        view[:, 1, :] = left - view[:, 1, :]
        h *= 2
    return a


class HadamardAccumulator(CountAccumulator):
    """A histogram of the reported columns; ``support_counts`` applies one Walsh-Hadamard
    transform: C_v = (n + W[v + 1]) / 2, O(K log K) however many reports were added."""

    def __init__(self, oracle: HadamardResponse) -> None:
        super().__init__(oracle)
        self._size = oracle.columns
        self._hist = np.zeros(self._size, dtype=np.int64)

    def add(self, reports: Reports) -> None:
        r = np.asarray(reports, dtype=np.int64).reshape(-1)
        self._hist += np.bincount(r, minlength=self._size)
        self.n += int(r.size)

    def support_counts(self) -> IntArray:
        w = walsh_hadamard(self._hist)
        k = self._oracle.k
        return (self.n + w[1:k + 1]) // 2


class HadamardResponse(FrequencyOracle):
    """Hadamard response (Acharya, Sun and Zhang, AISTATS 2019), high-privacy form.

    K = the smallest power of two above k. Category x owns the row x + 1 of the K x K Sylvester
    Hadamard matrix, and C_x = {y : H[x + 1, y] = +1} (popcount((x + 1) & y) even), K/2 columns.
    The report is a column: uniform in C_x w.p. E/(E+1), else uniform outside it, so every
    column has probability 2E/((E+1)K) or 2/((E+1)K): ratio E. Two rows agree on exactly half
    the columns, so q* = 1/2. Reports are log2(K) bits; aggregation is one fast transform.
    """

    mechanism = "hadamard"

    def __init__(self, epsilon: float, categories: Sequence[Any] | int,
                 source: RandomSource | None = None, *, p: Fraction | None = None) -> None:
        super().__init__(epsilon, categories, source)  # k <= MAX_CATEGORIES: K <= 2^21
        self.columns = 1 << self.k.bit_length()  # smallest power of two > k
        if p is None:
            e = client.exp_lower(self.epsilon)
            p = e / (e + 1)
        self._p = Fraction(p)
        self._verify()

    def _params(self) -> dict[str, Any]:
        return {"K": self.columns, "p": fraction_text(self._p)}

    def support_probabilities(self) -> tuple[list[Fraction], list[Fraction]]:
        return [self._p] * self.k, [Fraction(1, 2)] * self.k

    def randomize_indices(self, idx: IntArray) -> Reports:
        src = self.source
        inside = _sampling.bernoulli(self._p, idx.size, src)
        y = _sampling.uniform(self.columns, idx.size, src)
        row = idx + 1
        odd = (np.bitwise_count(row & y) & 1).astype(np.bool_)
        # Flipping the bit of row's lowest set bit flips the parity: a bijection C_x <-> rest.
        return np.asarray(y ^ ((odd == inside) * (row & -row)), dtype=np.int64)

    def supports(self, reports: Reports, category: int) -> npt.NDArray[np.bool_]:
        r = np.asarray(reports, dtype=np.int64)
        return np.asarray((np.bitwise_count(r & (category + 1)) & 1) == 0)

    def accumulator(self) -> HadamardAccumulator:
        return HadamardAccumulator(self)

    def report_distribution(self, value: Any) -> dict[Row, Fraction]:
        x = self._value_index(value)
        half = self.columns // 2
        return {(y,): (self._p if bin((x + 1) & y).count("1") % 2 == 0 else 1 - self._p) / half
                for y in range(self.columns)}

    def parse_report(self, obj: Mapping[str, Any]) -> Row:
        return (check_int_field(obj, "y", 0, self.columns),)

    def rows_to_reports(self, rows: Sequence[Row]) -> Reports:
        return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))

    def report_rows(self, reports: Reports) -> Iterator[dict[str, Any]]:
        for y in np.asarray(reports, dtype=np.int64).tolist():
            yield {"mechanism": self.mechanism, "y": y}
