"""The collector's side: aggregate reports from files or iterators, streaming, in constant memory.

    collector = Collector(randomizer)
    collector.read("reports.jsonl")        # or .csv, or collector.add_reports(iterator)
    collector.estimate(confidence=0.95)

Reports are parsed and validated one by one and folded into the randomizer's accumulator in
chunks, so memory does not grow with the number of reports. A report that cannot be used
(malformed JSON, a missing field, an unknown category, another mechanism's report) is counted
and its line number kept (the first ``max_errors`` of them), and reading goes on: one bad line
never loses the rest of a file. Error messages never quote the report's content.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from numbers import Integral
from pathlib import Path
from typing import Any

from dpcurator.errors import UserError
from dpcurator.local._base import Accumulator, LocalRandomizer, ReportError, Reports, Row
from dpcurator.local.estimators import SurveyEstimate

__all__ = ["BadReport", "Collector"]


@dataclass(frozen=True)
class BadReport:
    """A report that was skipped: where it was (line or item number) and why."""

    line: int
    error: str

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "error": self.error}


class Collector:
    """Streaming aggregation of one survey's reports.

    ``chunk_size`` parsed reports are buffered before they are folded into the statistics;
    ``max_errors`` bad reports are remembered with their line numbers (all are counted).
    """

    def __init__(self, randomizer: LocalRandomizer, *, chunk_size: int = 1 << 15,
                 max_errors: int = 20) -> None:
        for name, value, least in (("chunk_size", chunk_size, 1), ("max_errors", max_errors, 0)):
            if isinstance(value, bool) or not isinstance(value, Integral) or value < least:
                raise UserError(f"{name} must be an integer >= {least}, got {value!r}")
        self.randomizer = randomizer
        self._acc: Accumulator = randomizer.accumulator()
        self._buffer: list[Row] = []
        self._chunk = chunk_size
        self._max_errors = max_errors
        self.errors: list[BadReport] = []
        self.bad_count = 0

    @property
    def n(self) -> int:
        """Reports aggregated so far."""
        return self._acc.n + len(self._buffer)

    @property
    def accumulator(self) -> Accumulator:
        self._flush()
        return self._acc

    # -- adding reports -----------------------------------------------------------------------

    def add_array(self, reports: Reports) -> None:
        """Reports already in the randomizer's array form (e.g. from ``randomize``)."""
        self._flush()
        self._acc.add(reports)

    def add(self, report: Mapping[str, Any]) -> None:
        """One decoded report; raises ``ReportError`` (nothing is counted) if it is bad."""
        self._buffer.append(self._parse(report))
        if len(self._buffer) >= self._chunk:
            self._flush()

    def add_reports(self, reports: Iterable[Mapping[str, Any] | str | bytes]) -> None:
        """Reports from an iterator: objects, or JSON texts; bad ones are counted (item 1, ...)."""
        for number, item in enumerate(reports, 1):
            self._add_item(number, item)
        self._flush()

    def read(self, path: str | Path) -> None:
        """A file of reports: CSV if it ends in .csv, else JSON lines."""
        if str(path).lower().endswith(".csv"):
            self.read_csv(path)
        else:
            self.read_jsonl(path)

    def read_jsonl(self, path: str | Path) -> None:
        """One JSON object per line; blank lines are skipped; bad lines counted by number."""
        with open(path, "rb") as handle:
            for number, raw in enumerate(handle, 1):
                if raw.strip():
                    self._add_item(number, raw)
        self._flush()

    def read_csv(self, path: str | Path) -> None:
        """A CSV file with a header naming the report fields (e.g. ``y``, or ``seed,y``); a
        UTF-8 byte order mark (Excel's "CSV UTF-8") is skipped."""
        with open(path, encoding="utf-8-sig", errors="replace", newline="") as handle:
            self._read_csv(handle)
        self._flush()

    def read_csv_text(self, text: str) -> None:
        self._read_csv(io.StringIO(text))
        self._flush()

    def _read_csv(self, handle: Iterable[str]) -> None:
        reader = csv.reader(handle)
        header: list[str] | None = None
        for row in _csv_rows(reader, self._bad):
            if not row or not any(cell.strip() for cell in row):
                continue
            if header is None:
                header = [cell.strip() for cell in row]
                missing = [f for f in self.randomizer.report_fields if f not in header]
                if missing:
                    raise ReportError(
                        f"line {reader.line_num}: the CSV header must name the report fields "
                        f"{', '.join(self.randomizer.report_fields)}; missing {', '.join(missing)}")
                continue
            if len(row) != len(header):
                self._bad(reader.line_num, f"expected {len(header)} fields, found {len(row)}")
                continue
            self._add_item(reader.line_num, dict(zip(header, row, strict=True)))

    def _add_item(self, number: int, item: Mapping[str, Any] | str | bytes) -> None:
        try:
            obj = json.loads(item) if isinstance(item, str | bytes) else item
        except (ValueError, UnicodeDecodeError, RecursionError):  # too deeply nested, too
            self._bad(number, "not valid JSON")                   # long a number: invalid
            return
        try:
            self._buffer.append(self._parse(obj))
        except ReportError as exc:
            self._bad(number, str(exc))
            return
        if len(self._buffer) >= self._chunk:
            self._flush()

    def _parse(self, obj: Any) -> Row:
        if not isinstance(obj, Mapping):
            raise ReportError("a report must be a JSON object")
        mech = obj.get("mechanism")
        if mech is not None and mech != self.randomizer.mechanism:
            raise ReportError(f"the report is for another mechanism (expected "
                              f"{self.randomizer.mechanism!r})")
        return self.randomizer.parse_report(obj)

    def _bad(self, number: int, message: str) -> None:
        self.bad_count += 1
        if len(self.errors) < self._max_errors:
            self.errors.append(BadReport(number, message))

    def _flush(self) -> None:
        if self._buffer:
            self._acc.add(self.randomizer.rows_to_reports(self._buffer))
            self._buffer = []

    # -- results ------------------------------------------------------------------------------

    def estimate(self, *, confidence: float = 0.95, method: str | None = None,
                 project: bool = False) -> SurveyEstimate:
        """The randomizer's estimate from every good report seen so far (``method`` None: the
        randomizer's default interval)."""
        self._flush()
        if self._acc.n == 0:
            raise UserError(f"no valid report to estimate from ({self.bad_count} bad reports)")
        return self.randomizer.estimate(self._acc, confidence=confidence, method=method,
                                        project=project)

    def summary(self) -> dict[str, Any]:
        """Counts of good and bad reports, with the first bad ones' line numbers."""
        return {"n": self.n, "bad_reports": self.bad_count,
                "errors": [e.to_json() for e in self.errors]}


def _csv_rows(reader: Any, bad: Any) -> Iterator[list[str]]:
    """The reader's rows; a line the csv module refuses (a field over its size limit, a NUL
    byte) is counted as bad by ``bad(line, why)`` and reading goes on."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error:
            bad(reader.line_num, "not a valid CSV line")
            continue
        yield row
