"""Public keys from what an analyst passes: a list, tuples, a DataFrame or an Arrow table."""

from __future__ import annotations

import datetime
import decimal
import math
from collections.abc import Sequence
from typing import Any

from dpcurator.query.errors import QueryError
from dpcurator.query.plan import PublicKeys

__all__ = ["public_keys", "python_scalar"]


def python_scalar(value: Any) -> Any:
    """A plain Python value: numpy scalars unwrapped, NaN / NA / NaT as None."""
    if value is None:
        return None
    item = getattr(value, "item", None)
    if callable(item) and type(value).__module__ == "numpy":
        value = item()
    if isinstance(value, float) and math.isnan(value):
        return None
    try:
        import pandas as pd

        if value is pd.NA or value is pd.NaT:
            return None
        if isinstance(value, pd.Timestamp):
            return value.to_pydatetime()
    except ImportError:  # pragma: no cover - pandas is a dependency
        pass
    return value


_KEY_TYPES = (bool, int, float, str, bytes, datetime.date, datetime.time, datetime.timedelta,
              decimal.Decimal)


def _rows_from_table(table: Any, names: Sequence[str]) -> list[tuple[Any, ...]]:
    columns = list(table.column_names) if hasattr(table, "column_names") else list(table.columns)
    missing = [n for n in names if n not in columns]
    if missing:
        if len(columns) == len(names):
            chosen = columns  # positional: the table's columns are the keys in order
        else:
            raise QueryError(f"the keys table lacks the group key column(s) {missing}")
    else:
        chosen = list(names)
    if hasattr(table, "to_pydict"):  # Arrow
        data = table.to_pydict()
        cols = [data[c] for c in chosen]
    elif hasattr(table, "to_dict") and hasattr(table, "iloc"):  # pandas
        cols = [list(table[c]) for c in chosen]
    else:  # Polars
        cols = [table[c].to_list() for c in chosen]
    return [tuple(python_scalar(v) for v in row) for row in zip(*cols, strict=True)]


def public_keys(keys: Any, names: Sequence[str]) -> PublicKeys:
    """PublicKeys for group keys ``names`` from a list, tuples, DataFrame or Arrow table."""
    if isinstance(keys, PublicKeys):
        return keys
    if keys is None or isinstance(keys, str | bytes):
        raise QueryError("keys must be a list of partition values, a DataFrame or an Arrow "
                         "table (read a keys file with Curator.keys_from_csv)")
    if hasattr(keys, "column_names") or hasattr(keys, "columns"):
        rows = _rows_from_table(keys, names)
    else:
        try:
            items = list(keys)
        except TypeError:
            raise QueryError(f"keys must be iterable, got a {type(keys).__name__}") from None
        rows = []
        for item in items:
            if len(names) == 1 and not isinstance(item, tuple | list):
                rows.append((python_scalar(item),))
            elif isinstance(item, tuple | list):
                rows.append(tuple(python_scalar(v) for v in item))
            else:
                raise QueryError(f"with {len(names)} group keys, each key must be a tuple of "
                                 f"{len(names)} values")
    if not rows:
        raise QueryError("keys must list at least one partition")
    if any(len(r) != len(names) for r in rows):
        raise QueryError(f"each key must have {len(names)} value(s): {', '.join(names)}")
    for row in rows:
        for value in row:
            if value is not None and not isinstance(value, _KEY_TYPES):
                raise QueryError(f"keys must be plain values (numbers, text, booleans, dates "
                                 f"or None), got a {type(value).__name__}")
    unique = list(dict.fromkeys(rows))
    return PublicKeys(tuple(unique))
