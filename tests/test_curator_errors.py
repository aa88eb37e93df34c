"""Bad input gets a clear error naming the problem, never a stack trace or a record's value."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

import dpcurator as dp
from dpcurator.curator import Curator
from dpcurator.errors import BudgetExceededError, InternalError, UserError
from dpcurator.query import BoundsError, UnknownColumnError

SECRET_NAME = "Zebulon-Q-Secret"
SECRET_NUMBER = 987654.25


def data() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({
        "uid": rng.integers(0, 50, 400),
        "name": rng.choice(["ann", "bob", SECRET_NAME], 400),
        "amount": rng.uniform(0, 10, 400),
        "label": rng.choice(["x", "y"], 400),
    })
    frame.loc[7, "amount"] = SECRET_NUMBER
    return frame


def make(**options: object) -> Curator:
    settings: dict[str, object] = dict(privacy_unit="uid", budget=dp.ApproxDP(1.0, 1e-6))
    settings.update(options)
    return Curator(data(), **settings)  # type: ignore[arg-type]


def nan_data() -> object:
    """A table holding a real NaN (pandas NaN reaches DuckDB as NULL; Polars keeps NaN)."""
    import polars as pl

    frame = data()
    frame.loc[3, "amount"] = math.nan
    return pl.from_pandas(frame, nan_to_null=False)


CASES: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    ("unknown privacy unit", lambda: make(privacy_unit="user"), UnknownColumnError,
     "unknown privacy unit 'user'"),
    ("missing column in SUM", lambda: make().sql("SELECT SUM(price) FROM data", epsilon=0.1,
                                                 bounds={"price": (0, 1)}),
     UnknownColumnError, "'price'"),
    ("missing column in WHERE", lambda: make().sql("SELECT COUNT(*) FROM data WHERE age > 3",
                                                   epsilon=0.1), UnknownColumnError, "'age'"),
    ("missing group column", lambda: make().sql("SELECT city, COUNT(*) FROM data GROUP BY city",
                                                epsilon=0.1, delta=1e-7),
     UnknownColumnError, "'city'"),
    ("no bounds", lambda: make(auto_bounds=False).sql("SELECT AVG(amount) FROM data",
                                                      epsilon=0.1),
     BoundsError, "needs clamping bounds"),
    ("non-numeric bounds", lambda: make().sql("SELECT SUM(amount) FROM data", epsilon=0.1,
                                              bounds={"amount": ("0", "10")}),
     BoundsError, "must be a number"),
    ("lo > hi", lambda: make().sql("SELECT SUM(amount) FROM data", epsilon=0.1,
                                   bounds={"amount": (10, 0)}), BoundsError, "lo < hi"),
    ("NaN bound", lambda: make(bounds={"amount": (math.nan, 1)}), BoundsError, "finite"),
    ("text column summed", lambda: make().sql("SELECT SUM(name) FROM data", epsilon=0.1,
                                              bounds={"name": (0, 1)}),
     UserError, "numeric column"),
    ("delta too large", lambda: make().sql("SELECT label, COUNT(*) FROM data GROUP BY label",
                                           epsilon=0.1, delta=0.5), UserError,
     "allow_large_delta"),
    ("bound too large", lambda: make().sql("SELECT AVG(amount) FROM data", epsilon=0.1,
                                           bounds={"amount": (0, 1e16)}), BoundsError,
     "largest allowed magnitude is 1e+15"),
    ("NaN values", lambda: Curator(nan_data(), privacy_unit="uid", budget=dp.PureDP(1.0),
                                   bounds={"amount": (0, 10)}), UserError, "NaN"),
    ("missing file", lambda: Curator.from_csv("/nonexistent/x.csv", privacy_unit="uid",
                                              budget=dp.PureDP(1.0)), UserError, "not found"),
    ("no epsilon", lambda: make().sql("SELECT COUNT(*) FROM data"), UserError, "epsilon"),
    ("negative epsilon", lambda: make().sql("SELECT COUNT(*) FROM data", epsilon=-1),
     UserError, "positive"),
    ("private keys without delta", lambda: make().sql(
        "SELECT label, COUNT(*) FROM data GROUP BY label", epsilon=0.1), UserError, "delta"),
    ("type error in WHERE", lambda: make().sql("SELECT COUNT(*) FROM data WHERE name + 1 > 2",
                                               epsilon=0.1), UserError, "column types"),
    ("keys of the wrong type", lambda: make().sql(
        "SELECT uid, COUNT(*) FROM data GROUP BY uid", epsilon=0.1, keys=["not-a-number"]),
     UserError, "key #1"),
    ("bad confidence", lambda: make().sql("SELECT COUNT(*) FROM data", epsilon=0.1,
                                          confidence=1.5), UserError, "confidence"),
    ("unknown weight", lambda: make().sql("SELECT COUNT(*) AS n FROM data", epsilon=0.1,
                                          weights={"m": 2}), UserError, "unknown aggregates"),
    ("bad budget", lambda: make(budget=1.0), UserError, "budget must be"),
]


@pytest.mark.parametrize("case, action, error, message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_a_clear_error_without_record_values(
        case: str, action: Callable[[], object], error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        action()
    text = str(info.value)
    assert message.lower() in text.lower(), text
    assert SECRET_NAME not in text and "987654" not in text
    assert isinstance(info.value, UserError)


def test_interval_and_list_columns_are_not_numeric() -> None:
    """A bug hunt: INTERVAL read as INT and INTEGER[] as INTEGER (type names matched by
    prefix), so SUM over them was charged and answered about 0; now refused, free."""
    from dpcurator.engines import column_kind

    n = 600
    df = pd.DataFrame({"uid": np.arange(n), "wait_s": np.arange(n) % 3600})
    df["wait"] = pd.to_timedelta(df.wait_s, unit="s")
    df["scores"] = [[int(a), 1] for a in df.wait_s]
    c = Curator(df, privacy_unit="uid", budget=dp.PureDP(10.0))
    assert c.columns["wait"] == "INTERVAL" and c.columns["scores"].endswith("[]")
    for column in ("wait", "scores"):
        for aggregate in ("SUM", "AVG", "MEDIAN", "VARIANCE"):
            for bounds in (None, {column: (0, 3600)}):
                with pytest.raises(UserError, match=f"numeric column, but '{column}'"):
                    c.sql(f"SELECT {aggregate}({column}) AS s FROM data", epsilon=1.0,
                          bounds=bounds)
        with pytest.raises(UserError, match=f"'{column}', which is not numeric"):
            Curator(df, privacy_unit="uid", budget=dp.PureDP(1.0),
                    bounds={column: (0, 3600)})
    assert c.spent.epsilon == 0 and not c.ledger
    assert np.isfinite(c.sql("SELECT SUM(wait_s) AS s FROM data", epsilon=1.0,
                             bounds={"wait_s": (0, 3600)}).values["s"][0])
    kinds = {"INTERVAL": "temporal", "INTERVAL DAY TO SECOND": "temporal",
             "INTEGER[]": "other", "DECIMAL(18,3)[]": "other", "ARRAY<INT>": "other",
             "STRUCT(a INTEGER)": "other", "MAP(VARCHAR, DOUBLE)": "other",
             "BOOLEAN[]": "other", "INT8": "numeric", "numeric(10,2)": "numeric",
             "double precision": "numeric", "DECIMAL(18,3)": "numeric", "UBIGINT": "numeric",
             "timestamp(3) with time zone": "temporal", "character varying(20)": "text",
             "BOOLEAN": "boolean"}
    assert {t: column_kind(t) for t in kinds} == kinds


def test_spent_budget_is_refused_with_nothing_charged() -> None:
    c = make(budget=dp.PureDP(0.5))
    c.sql("SELECT COUNT(*) FROM data", epsilon=0.5)
    with pytest.raises(BudgetExceededError, match="nothing was charged") as info:
        c.sql("SELECT COUNT(*) AS other FROM data", epsilon=0.01)
    assert SECRET_NAME not in str(info.value)
    assert len(c.ledger) == 1


def test_nan_values_are_ignored_at_query_time_when_allowed() -> None:
    """AVG skips NaN like NULL: the noisy mean is near the mean of the non-NaN values.

    The table has one row per unit and every value in [0, 10], so the bounded mean equals
    the plain mean of the N = 1000 non-NaN values (the other 1000 are NaN). Mishandled NaN
    moves the answer far outside the tolerance: NaN counted but not summed, or read as 0,
    gives about 2.5 instead of 5; read as the upper bound, about 7.5; propagated, NaN.

    Tolerance, from the noise: PureDP(5) is split evenly between the count of non-NaN values
    (sensitivity 1, discrete Laplace scale b_n = 1 / 2.5 = 0.4) and the sum of the values
    centred at 5 (sensitivity 5, scale b_s = 5 / 2.5 = 2), the scales ``release.mechanisms``
    reports. A discrete Laplace Z of scale b has P[|Z| >= w] <= 2 e^(-w / b); with
    w = b ln(2e7), each noise exceeds its w with probability at most 1e-7. When neither
    does, with S the true centred sum (|S| <= 5 N),
    |(S + Z_s) / (N + Z_n) - S / N| = |N Z_s - S Z_n| / (N (N + Z_n))
                                    <= (w_s + 5 w_n) / (N - w_n),
    about 0.068; clipping the mean to [0, 10] only moves it towards the truth, and the
    fixed-point rounding of the values (2^-40 of a noise scale) adds under 1e-9.
    False-failure probability: at most 2e-7 for the tolerance, plus 1e-7 for the release's
    interval at level 1 - 1e-7 missing the true mean: 3e-7 in all (union bound).
    """
    import polars as pl

    values = np.random.default_rng(5).uniform(0, 10, 2000)
    values[::2] = math.nan
    frame = pl.DataFrame({"uid": np.arange(2000), "amount": values}, nan_to_null=False)
    c = Curator(frame, privacy_unit="uid", budget=dp.PureDP(10.0),
                bounds={"amount": (0, 10)}, check_nan=False)
    release = c.sql("SELECT AVG(amount) AS m FROM data", epsilon=5.0)
    n = int(np.sum(~np.isnan(values)))
    true_mean = float(np.nanmean(values))
    w_n, w_s = 0.4 * math.log(2e7), 2.0 * math.log(2e7)
    tolerance = (w_s + 5 * w_n) / (n - w_n) + 1e-9
    assert abs(release.values["m"][0] - true_mean) <= tolerance, (release.values, true_mean)
    low, high = release.interval("m", confidence=1 - 1e-7)
    assert low[0] <= true_mean <= high[0], (low, high, true_mean)


def test_engine_failures_never_echo_the_engine_message() -> None:
    c = make(budget=dp.PureDP(1.0))

    def broken(*args: object, **kwargs: object) -> object:
        import duckdb

        raise duckdb.ConversionException(f"could not convert '{SECRET_NAME}'")

    c._engine._con = _Failing(c._engine._con, broken)  # type: ignore[assignment]
    # An engine failure after the charge is dpcurator's fault, not the user's: an InternalError
    # that says so, never a UserError, and never the engine's own message.
    with pytest.raises(InternalError, match="probably a bug") as info:
        c.sql("SELECT COUNT(*) FROM data", epsilon=0.5)
    assert not isinstance(info.value, UserError)
    assert SECRET_NAME not in str(info.value) and "convert" not in str(info.value)
    assert c.remaining.epsilon == 0.5  # charged before running: a failure never refunds


class _Failing:
    """A connection whose data queries fail (DESCRIBE still works)."""

    def __init__(self, con: object, fail: Callable[..., object]) -> None:
        self._con, self._fail = con, fail

    def execute(self, sql: str, *args: object) -> object:
        if sql.startswith("DESCRIBE") or sql.startswith("SELECT 1"):
            return self._con.execute(sql, *args)  # type: ignore[attr-defined]
        return self._fail()

    def __getattr__(self, name: str) -> object:
        return getattr(self._con, name)


def test_errors_name_the_real_problem() -> None:
    """A bug hunt: CASE labels of mixed types were refused as "keys must have one type per
    group key column" though no keys were given, and an unknown date_trunc unit as "the
    query does not fit the table's column types". Both are refused before the charge."""
    n = 600
    df = pd.DataFrame({"uid": np.arange(n), "amount": np.arange(n) % 50,
                       "d": pd.Timestamp("2022-01-01") + pd.to_timedelta(np.arange(n) % 300,
                                                                        unit="D")})
    df["day"] = df["d"].dt.date
    c = Curator(df, privacy_unit="uid", budget=dp.PureDP(10.0))
    with pytest.raises(UserError, match="group key 'b': its CASE's THEN and ELSE values are "
                                        r"of different types \(a number and text\)"):
        c.sql("SELECT CASE WHEN amount < 20 THEN '1' ELSE 2 END AS b, COUNT(*) AS n "
              "FROM data GROUP BY b", epsilon=1.0)
    for where, what in [("date_trunc('fortnight', d) > DATE '2022-03-01'",
                         "date_trunc's unit 'fortnight'"),
                        ("date_trunc('fortnight', day) > DATE '2022-03-01'",
                         "date_trunc's unit 'fortnight'"),
                        ("EXTRACT(fortnight FROM d) = 1", "EXTRACT's date part 'fortnight'")]:
        with pytest.raises(UserError, match=f"{what} is not one DuckDB knows") as info:
            c.sql(f"SELECT COUNT(*) AS n FROM data WHERE {where}", epsilon=1.0)
        assert "column types" not in str(info.value)
    assert c.spent.epsilon == 0 and not c.ledger
    # what worked still works: known units and parts, and such a CASE with its keys given
    c.sql("SELECT COUNT(*) AS n FROM data WHERE date_trunc('month', d) > DATE '2022-03-01' "
          "AND EXTRACT(year FROM day) = 2022 AND date_trunc('week', day) < d", epsilon=1.0)
    c.sql("SELECT CASE WHEN amount < 20 THEN '1' ELSE 2 END AS b, COUNT(*) AS n "
          "FROM data GROUP BY b", epsilon=1.0, keys=[1, 2])
    assert c.spent.epsilon == 2.0
