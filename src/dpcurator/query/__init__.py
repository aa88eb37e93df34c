"""Queries: the Python builder, DP SQL, frozen plans and contribution bounding.

    >>> from dpcurator.query import Query, parse_sql
    >>> Query().group_by("category").count("n").plan() == parse_sql(
    ...     "SELECT category, COUNT(*) AS n FROM data GROUP BY category")
    True
"""

from dpcurator.query._keys import public_keys
from dpcurator.query._plan_json import plan_from_json, plan_to_json
from dpcurator.query.bounding import BoundedQuery, HistogramSpec, MeasureSpec, ValueSpec
from dpcurator.query.builder import Query, bins, column_key, expression_key, width_bucket
from dpcurator.query.errors import (
    BoundsError,
    QueryError,
    UnknownColumnError,
    UnsupportedQueryError,
)
from dpcurator.query.plan import (
    Aggregate,
    Bounds,
    Count,
    CountUnits,
    GroupKey,
    Mean,
    Plan,
    PublicKeys,
    Quantile,
    Sum,
    Variance,
)
from dpcurator.query.sql import parse_sql

__all__ = [
    "Aggregate",
    "BoundedQuery",
    "Bounds",
    "BoundsError",
    "Count",
    "CountUnits",
    "GroupKey",
    "HistogramSpec",
    "Mean",
    "MeasureSpec",
    "Plan",
    "PublicKeys",
    "Quantile",
    "Query",
    "QueryError",
    "Sum",
    "UnknownColumnError",
    "UnsupportedQueryError",
    "ValueSpec",
    "Variance",
    "bins",
    "column_key",
    "expression_key",
    "parse_sql",
    "plan_from_json",
    "plan_to_json",
    "public_keys",
    "width_bucket",
]
