"""What every SQL engine shares: a query compiled once, validated before its charge, its public
keys checked, its exact aggregates computed. An engine is a dialect (``_dialect.Dialect``) plus
the transport a subclass gives: run a statement, bind one without reading a row, register the
public keys as a table, and name its errors. No engine's message ever quotes the database's
error text (it could quote a value of the data).
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import decimal
import itertools
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sqlglot.errors import SqlglotError

from dpcurator.engines._base import ExactAggregates
from dpcurator.engines._dialect import Dialect
from dpcurator.engines._results import CompileCache, CompiledQuery, collect
from dpcurator.engines._sql import compile_bounding
from dpcurator.errors import InternalError, UserError
from dpcurator.query.bounding import BoundedQuery

__all__ = ["SqlEngine"]

_ids = itertools.count()
CHECKED_KEYS = 16  # sets of public keys whose check is remembered


class SqlEngine:
    """The shared half of an engine (module docstring); subclasses set ``name``, ``title``,
    ``dialect``, ``label`` and ``_relation`` and give the transport below."""

    name: str
    title: str  # as messages name the engine
    dialect: Dialect
    label: str
    _relation: str
    _fixed_columns: dict[str, str] | None = None  # a derived engine's (a join's) columns

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._compiled = CompileCache()
        # public keys (with the types they convert to) already checked: the check reads only
        # them, so a query that repeats them (a chosen-bounds query runs three statements
        # over one set of keys) is not checked again; the most recent few are kept
        self._checked_keys: OrderedDict[tuple[Any, tuple[str, ...]], None] = OrderedDict()

    # -- the transport ---------------------------------------------------------------------------

    def columns(self) -> Mapping[str, str]:
        raise NotImplementedError

    def check_source(self) -> None:
        raise NotImplementedError

    def nan_columns(self, columns: Sequence[str]) -> list[str]:
        raise NotImplementedError

    def show_progress(self, enabled: bool) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def group_key_types(self, query: BoundedQuery) -> list[str]:
        """The SQL type of each group key expression (no row is read)."""
        raise NotImplementedError

    def _errors(self) -> tuple[type[BaseException], ...]:
        """The exceptions the database raises (mapped here to the curator's errors)."""
        raise NotImplementedError

    def _fetch(self, text: str, parameters: Mapping[str, int] | None = None
               ) -> list[tuple[Any, ...]]:
        """Run one statement (under the engine's lock) and return its rows."""
        raise NotImplementedError

    def _bind(self, compiled: CompiledQuery) -> None:
        """Bind or plan the query's statement without reading a row."""
        raise NotImplementedError

    def _registered(self, compiled: CompiledQuery) -> contextlib.AbstractContextManager[None]:
        """The query's public keys as a table ``compiled.keys_table`` for a while: columns
        ``i`` (the key's index) and what ``_key_columns`` names."""
        raise NotImplementedError

    def _key_columns(self, compiled: CompiledQuery) -> tuple[list[str], list[str]]:
        """Per group key, the keys table's expressions of the value as given and of it
        converted to the key's type (NULL where it does not convert)."""
        raise NotImplementedError

    def _refused(self, exc: BaseException) -> str:
        """The message of a query the database refuses to bind (types that do not fit)."""
        return (f"the query does not fit the table's column types (check the WHERE clause, "
                f"group keys and keys); {self.title} said: {type(exc).__name__}")

    def quote(self, name: str) -> str:
        """An identifier of this engine's SQL, always quoted."""
        return '"' + name.replace('"', '""') + '"'

    def scalar(self, text: str) -> int:
        """One integer from a data owner's check (``dpcurator.engines._joins``)."""
        try:
            value = self._fetch(text)[0][0]
        except self._errors():
            raise UserError(f"{self.title} could not run a check of the schema's tables; "
                            "check that the declared columns have comparable types") from None
        return int(value or 0)

    def derived(self, relation: str, label: str, columns: Mapping[str, str]) -> SqlEngine:
        """An engine on the same connection (and lock) reading ``relation``, whose columns
        are ``columns``, instead: a schema's joined rows (``_joins.TableSet.view``). It never
        closes the connection."""
        view = copy.copy(self)
        view._relation = relation
        view.label = label
        view._fixed_columns = dict(columns)
        view._compiled = CompileCache()
        view._checked_keys = OrderedDict()
        view._reset_derived()
        return view

    def _reset_derived(self) -> None:
        """Forget what a copy must not share with the engine it was derived from."""

    # -- shared ----------------------------------------------------------------------------------

    def prepare(self, query: BoundedQuery) -> CompiledQuery:
        """The query's statement, compiled once and kept (validation and computation share
        it; a repeated query is not compiled again)."""
        with self._lock:
            return self._compiled.get(query, lambda: compile_bounding(
                query, self.dialect, self.columns(), self.group_key_types(query),
                self._relation,
                f"__dpcurator_keys_{next(_ids)}" if query.keys is not None else None))

    def compile(self, query: BoundedQuery) -> list[str]:
        """The statements ``compute_exact_aggregates`` runs (no row is read)."""
        return list(self.prepare(query).sql)

    @contextlib.contextmanager
    def _with_keys(self, compiled: CompiledQuery) -> Iterator[None]:
        with self._lock:
            if compiled.keys_table is None:
                yield
                return
            with self._registered(compiled):
                yield

    def validate(self, query: BoundedQuery) -> list[str]:
        """Bind the statement without reading rows, and check the public keys: a UserError
        for a query the table's column types cannot run, before anything is charged.
        Returns the statements, as a release shows them."""
        try:
            compiled = self.prepare(query)
            with self._with_keys(compiled):
                if compiled.keys_table is not None:
                    checked = (compiled.query.keys, tuple(compiled.key_types))
                    if checked in self._checked_keys:
                        self._checked_keys.move_to_end(checked)
                    else:
                        self._check_keys(compiled)
                        self._checked_keys[checked] = None
                        while len(self._checked_keys) > CHECKED_KEYS:
                            self._checked_keys.popitem(last=False)
                self._bind(compiled)
        except self._errors() as exc:
            raise UserError(self._refused(exc)) from None
        except SqlglotError:  # an expression sqlglot cannot write back in the dialect
            raise UserError(f"an expression of the query could not be written in "
                            f"{self.title}'s SQL; write it more simply") from None
        return list(compiled.sql)

    def _check_keys(self, compiled: CompiledQuery) -> None:
        """Every public key converts to the group keys' types, and no two become one."""
        name, types = compiled.keys_table, list(compiled.key_types)
        _check_integral_keys(compiled.query.keys.values if compiled.query.keys else (),
                             [self.dialect.hash_kind(t) in ("int64", "int128") for t in types],
                             types)
        given, converted = self._key_columns(compiled)
        bad = " OR ".join(f"({g} IS NOT NULL AND ({c}) IS NULL)"
                          for g, c in zip(given, converted, strict=True))
        row = self._fetch(f"SELECT min(i) FROM {name} WHERE {bad}")[0]
        if row[0] is not None:
            raise UserError(f"key #{int(row[0]) + 1} does not convert to the group key types "
                            f"{types}")
        row = self._fetch(f"SELECT (SELECT count(*) FROM {name}) - (SELECT count(*) FROM "
                          f"(SELECT DISTINCT {', '.join(converted)} FROM {name}) AS d)")[0]
        if row[0]:
            raise UserError("two keys name the same partition once converted to the group "
                            f"key types {types}")

    def compute_exact_aggregates(self, query: BoundedQuery, key: int) -> ExactAggregates:
        """Bound each unit's contribution and aggregate exactly, keyed by ``key``."""
        compiled = self.prepare(query)
        try:
            with self._with_keys(compiled):
                rows = self._fetch(compiled.statement, compiled.parameters(key) or None)
        except self._errors():
            raise InternalError(f"{self.title} failed while computing the aggregates; "
                                "nothing was released. This is probably a bug") from None
        return collect(compiled, rows)


_INTEGER_TEXT = re.compile(r"^\s*[+-]?[0-9]+\s*$")


def _check_integral_keys(values: Sequence[Sequence[Any]], integral: Sequence[bool],
                         types: Sequence[str]) -> None:
    """A key of an integer group key is a whole number (an int, a float or decimal without a
    fraction, or text of a sign and digits): the engines' casts round 2.5 or '1.7', and the
    release would label a partition that cannot exist with its neighbour's count (a bug
    hunt). Public input only."""
    for index, row in enumerate(values):
        for value, whole in zip(row, integral, strict=False):
            if not whole or value is None or isinstance(value, bool | int):
                continue
            if isinstance(value, str):
                ok = bool(_INTEGER_TEXT.match(value))
            else:
                try:
                    ok = float(value).is_integer() and value == int(value)
                except (TypeError, ValueError, OverflowError):
                    ok = False
            if not ok:
                raise UserError(f"key #{index + 1} is not a whole number, so it names no "
                                f"partition of the integer group key types {list(types)}")
    scales = [_decimal_scale(t) for t in types]
    for index, row in enumerate(values):
        for value, scale in zip(row, scales, strict=False):
            if scale is None or value is None or isinstance(value, bool | int):
                continue
            try:
                exponent = decimal.Decimal(str(value).strip()).as_tuple().exponent
                digits = -exponent if isinstance(exponent, int) and exponent < 0 else 0
            except (decimal.InvalidOperation, ValueError):
                continue  # not a number: the conversion's own check refuses it
            if digits > scale:
                raise UserError(
                    f"key #{index + 1} has {digits} decimal places where the group key types "
                    f"{list(types)} keep {scale}: it would be rounded onto another partition, "
                    "and that partition's count released under this key (a bug hunt)")


_DECIMAL_TYPE = re.compile(r"^\s*(?:DECIMAL|NUMERIC)\s*\(\s*\d+\s*,\s*(\d+)\s*\)\s*$",
                           re.IGNORECASE)


def _decimal_scale(sql_type: str) -> int | None:
    """The scale s of a DECIMAL(p, s) or NUMERIC(p, s) type, else None."""
    match = _DECIMAL_TYPE.match(sql_type)
    return int(match.group(1)) if match else None


def key_text(value: Any, engine: str, *, intervals: bool = False) -> str | None:
    """A public key's value as the text that ``engine`` casts back to the same value (its
    keys are loaded as text, then cast to the group key's type in SQL); ``intervals``: the
    engine reads a ``timedelta``'s text as an interval."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        return ("Infinity" if value > 0 else "-Infinity") if math.isinf(value) else repr(value)
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, int | str | decimal.Decimal) or (
            intervals and isinstance(value, datetime.timedelta)):
        return str(value)
    raise UserError(f"keys of type {type(value).__name__} are not supported on {engine}")
