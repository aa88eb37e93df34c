"""Plans: self-validation, and the builder and DP SQL producing the same plan."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from dpcurator.query import (
    Bounds,
    BoundsError,
    Count,
    GroupKey,
    Mean,
    Plan,
    PublicKeys,
    Query,
    QueryError,
    Sum,
    bins,
    parse_sql,
    width_bucket,
)


def test_builder_and_sql_give_the_same_plan() -> None:
    sql = parse_sql(
        "SELECT category, COUNT(*) AS n, AVG(value) AS mean_value FROM data "
        "WHERE age >= 18 GROUP BY category",
        bounds={"value": (0, 100)}, max_partitions=5, max_rows_per_partition=2)
    built = (Query()
             .where("age >= 18")
             .group_by("category")
             .count("n")
             .mean("value", bounds=(0, 100), name="mean_value")
             .bound_contributions(max_partitions=5, max_rows_per_partition=2)
             .plan())
    assert sql == built
    assert hash(sql) == hash(built)


def test_same_plan_with_several_aggregates_filters_and_keys() -> None:
    sql = parse_sql(
        "SELECT region, COUNT(*) AS n, SUM(x) AS total, STDDEV(x) AS sd, MEDIAN(x) AS med, "
        "COUNT(DISTINCT uid) AS users FROM data WHERE a > 1 AND b = 'x' GROUP BY region",
        privacy_unit="uid", bounds={"x": (-1, 1)}, keys=["north", "south"])
    built = (Query().where("a > 1").where("b = 'x'")
             .group_by("region", keys=["north", "south"])
             .count("n").sum("x", (-1, 1), name="total").stddev("x", (-1, 1), name="sd")
             .median("x", (-1, 1), name="med").count_units("users").plan())
    assert sql == built


def test_width_bucket_and_case_bins_are_public_keys() -> None:
    sql = parse_sql("SELECT width_bucket(age, 0, 100, 4) AS b, COUNT(*) AS n FROM data "
                    "GROUP BY b")
    built = Query().group_by(width_bucket("age", 0, 100, 4, name="b")).count("n").plan()
    assert sql == built
    assert sql.public_labels is not None and len(sql.public_labels) == 7  # 0..5 and NULL
    assert not sql.private_keys
    case = parse_sql("SELECT CASE WHEN age < 18 THEN 'minor' ELSE 'adult' END AS g, "
                     "COUNT(*) FROM data GROUP BY 1")
    assert case.group_by[0].labels == ("minor", "adult")
    histogram = Query().group_by(bins("age", [0, 18, 65, 120])).count().plan()
    assert histogram.group_by[0].labels == ("[0, 18)", "[18, 65)", "[65, 120]")


def test_width_bucket_with_equal_bounds_is_refused_before_the_charge() -> None:
    """PostgreSQL raises "lower bound cannot equal upper bound"; it was bucketed silently."""
    import dpcurator as dp

    with pytest.raises(QueryError, match="low and high bounds must differ"):
        parse_sql("SELECT width_bucket(age, 5, 5.0, 4) AS b, COUNT(*) AS n FROM data "
                  "GROUP BY b")
    with pytest.raises(QueryError, match="low and high bounds must differ"):
        width_bucket("age", 3, 3, 2)
    c = dp.Curator(pd.DataFrame({"uid": range(100), "age": range(100)}), privacy_unit="uid",
                   budget=dp.PureDP(1.0))
    for where in ("", "WHERE width_bucket(age, 1, 1, 3) = 2 "):
        with pytest.raises(QueryError, match="low and high bounds must differ"):
            c.sql(f"SELECT width_bucket(age, 0, 0, 4) AS b, COUNT(*) AS n FROM data {where}"
                  "GROUP BY b", epsilon=1.0)
    assert c.spent.epsilon == 0 and not c.ledger


def test_private_keys_are_detected() -> None:
    plan = parse_sql("SELECT food, COUNT(*) FROM data GROUP BY food")
    assert plan.private_keys
    assert not parse_sql("SELECT COUNT(*) FROM data").private_keys


@pytest.mark.parametrize("lo, hi", [(1, 0), (0, 0), ("a", 1), (None, 1), (math.nan, 1),
                                    (0, math.inf)])
def test_bad_bounds_are_refused_by_name(lo: object, hi: object) -> None:
    with pytest.raises(BoundsError, match="bound"):
        Bounds.of((lo, hi), "value")


def test_plans_validate_themselves() -> None:
    with pytest.raises(QueryError, match="at least one aggregate"):
        Plan(aggregates=())
    with pytest.raises(QueryError, match="unique"):
        Plan(aggregates=(Count("n"), Sum("x", Bounds(0, 1), "n")))
    with pytest.raises(QueryError, match="max_partitions"):
        Plan(aggregates=(Count(),), max_partitions=0)
    with pytest.raises(QueryError, match="max_rows_per_partition"):
        Plan(aggregates=(Count(),), max_rows_per_partition=1.5)  # type: ignore[arg-type]
    with pytest.raises(QueryError, match="no GROUP BY"):
        Plan(aggregates=(Count(),), keys=PublicKeys((("a",),)))
    with pytest.raises(QueryError, match="reserved"):
        Count("__secret")
    with pytest.raises(QueryError, match="q must"):
        Query().quantile("x", 1.5, (0, 1))
    with pytest.raises(QueryError, match="repeat"):
        PublicKeys((("a",), ("a",)))


def test_keys_from_tables_and_lists() -> None:
    frame = pd.DataFrame({"b": [1, 2], "a": ["x", "y"]})
    plan = Query().group_by("a", "b", keys=frame).count().plan()
    assert plan.keys is not None and plan.keys.values == (("x", 1), ("y", 2))
    plan = Query().group_by("a", keys=["x", "y", "x"]).count().plan()
    assert plan.keys is not None and plan.keys.values == (("x",), ("y",))
    with pytest.raises(QueryError, match="each key"):
        Query().group_by("a", "b", keys=[("x",)]).count().plan()


def test_group_key_and_default_names() -> None:
    plan = parse_sql("SELECT category AS c, SUM(v), AVG(v), VARIANCE(v) FROM data GROUP BY "
                     "category", bounds={"v": (0, 1)})
    assert plan.group_by == (GroupKey("c", '"category"'),)
    assert [a.name for a in plan.aggregates] == ["sum_v", "mean_v", "variance_v"]
    assert isinstance(plan.aggregates[1], Mean)


def test_plans_round_trip_through_json() -> None:
    """The builder's plan and the SQL front end's are the same JSON, and it reads back."""
    import json

    from dpcurator.query import Query, parse_sql, plan_from_json, plan_to_json

    built = (Query().where("amount > 10").group_by("region").count("n")
             .sum("amount", bounds=(0, 500), name="total")
             .quantile("amount", 0.9, bounds=(0, 500), name="p90")
             .with_keys(["north", "south"]).plan())
    parsed = parse_sql("SELECT region, COUNT(*) AS n, SUM(amount) AS total, "
                       "QUANTILE(amount, 0.9) AS p90 FROM data WHERE amount > 10 "
                       "GROUP BY region", bounds={"amount": (0, 500)},
                       keys=["north", "south"])
    assert plan_to_json(built) == plan_to_json(parsed)
    text = json.dumps(plan_to_json(built))
    assert plan_from_json(json.loads(text)) == built


@pytest.mark.parametrize("bad", [
    [], {"aggregates": []}, {"aggregates": [{"kind": "drop"}]},
    {"aggregates": [{"kind": "count"}], "sql": "x"},
    {"aggregates": [{"kind": "sum"}]},
    {"aggregates": [{"kind": "sum", "column": "a", "bounds": [1]}]},
    {"aggregates": [{"kind": "count"}], "keys": [["a"]]},
    {"aggregates": [{"kind": "count"}], "group_by": [{"name": "g"}]},
    {"aggregates": [{"kind": "count"}], "max_partitions": 0},
])
def test_bad_json_plans_are_query_errors(bad: object) -> None:
    from dpcurator.query import plan_from_json
    from dpcurator.query.errors import QueryError

    with pytest.raises(QueryError):
        plan_from_json(bad)
