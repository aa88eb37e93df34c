"""The DuckDB engine: exact bounded aggregates, and the caps that make sensitivities true."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

from dpcurator.engines import DuckDBEngine
from dpcurator.errors import InternalError
from dpcurator.query import GroupKey, PublicKeys
from dpcurator.query.bounding import BoundedQuery, MeasureSpec, ValueSpec

VALUE = ValueSpec("v", -10.0, 100.0, 0.0, 64.0)
CENTRED = ValueSpec("v", -10.0, 100.0, 45.0, 3.7)
SQUARES = ValueSpec("v", -10.0, 100.0, 45.0, 0.25, square=True)
MEASURES = (
    MeasureSpec("rows", "rows"),
    MeasureSpec("units", "units"),
    MeasureSpec("present", "present", CENTRED),
    MeasureSpec("sum", "values", VALUE),
    MeasureSpec("centred", "values", CENTRED),
    MeasureSpec("squares", "squares", SQUARES),
)
GROUP = (GroupKey("g", '"g"'),)


def frame(seed: int, units: int = 60, rows: int = 600) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    v = rng.normal(40, 60, rows)
    v[rng.random(rows) < 0.05] = np.nan
    return pd.DataFrame({
        "uid": rng.integers(0, units, rows),
        "g": rng.choice(["a", "b", "c", "d", "e", "f"], rows, p=[.4, .2, .15, .1, .1, .05]),
        "v": v,
        "w": rng.integers(0, 5, rows),
    })


def query(rows_mode: str = "rescale", partitions_mode: str = "rescale", k: int = 2, r: int = 3,
          weight: int = 300, keys: PublicKeys | None = None, unit: str | None = "uid",
          selection: bool = False, where: str | None = None) -> BoundedQuery:
    measures = tuple(
        MeasureSpec(m.name, m.kind, m.value, weight if m.kind in ("rows", "units",
                                                                  "present") else 1)
        for m in MEASURES if unit is not None or m.kind != "units")
    if unit is None:
        rows_mode = partitions_mode = "none"
    return BoundedQuery(unit, GROUP, where, keys, k, r, rows_mode,  # type: ignore[arg-type]
                        partitions_mode, measures, selection_units=selection)  # type: ignore[arg-type]


def fixed(spec: ValueSpec, x: float) -> int:
    """The engine's per-row value (round half away from zero, like DuckDB's ROUND)."""
    c = min(max(x, spec.lo), spec.hi) - spec.center
    body = c * c if spec.square else c
    scaled = body * spec.scale
    return int(math.copysign(math.floor(abs(scaled) + 0.5), scaled))


def trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def reference_rescale(df: pd.DataFrame, k: int, r: int, one: int) -> dict[str, dict[str, int]]:
    """A plain-Python statement of rescaled bounding (the engine must agree exactly)."""
    out: dict[str, dict[str, int]] = {m.name: {} for m in MEASURES}
    for _, unit_rows in df.groupby("uid"):
        parts = dict(tuple(unit_rows.groupby("g")))
        m = len(parts)

        def weigh(amount: int, scaled: bool, m: int = m) -> int:
            return amount if m <= k else trunc_div(amount * k, m)

        for g, rows in parts.items():
            present = rows["v"].dropna()
            c = len(present)
            add = {
                "rows": weigh(min(len(rows), r) * one, True),
                "units": weigh(one, True),
                "present": weigh(min(c, r) * one, True),
            }
            for name, spec in (("sum", VALUE), ("centred", CENTRED), ("squares", SQUARES)):
                s = sum(fixed(spec, x) for x in present)
                total = 0 if c == 0 else (s if c <= r else trunc_div(s * r, c))
                add[name] = weigh(total, False)
            for name, value in add.items():
                out[name][g] = out[name].get(g, 0) + value
    return out


def as_table(result: object) -> dict[str, dict[str, int]]:
    keys = [k[0] for k in result.keys]  # type: ignore[attr-defined]
    return {name: dict(zip(keys, column, strict=True))
            for name, column in result.measures.items()}  # type: ignore[attr-defined]


@pytest.mark.parametrize("seed", [0, 1])
def test_rescaled_bounding_matches_a_plain_python_reference(seed: int) -> None:
    df = frame(seed)
    got = as_table(DuckDBEngine.from_frame(df).compute_exact_aggregates(query(), key=7))
    assert got == reference_rescale(df, k=2, r=3, one=300)


def test_rescaled_partitions_are_exact_at_the_largest_contributions() -> None:
    """The partition rescale trunc(a * k / m) runs in DOUBLE; it is exact while |a * k| stays
    below 2^52, which the compiler enforces: weights just under that limit must still agree
    with exact integer arithmetic to the last unit."""
    df = frame(3)
    weight = (2**52 - 1) // (2 * 3)  # k * r * weight, the L1 sensitivity, just below 2^52
    got = as_table(DuckDBEngine.from_frame(df).compute_exact_aggregates(
        query(weight=weight), key=7))
    expected = reference_rescale(df, k=2, r=3, one=weight)
    assert got == expected
    uneven = [min(len(rows), 3) * weight * 2 % m  # some divisions do not come out even
              for _, unit in df.groupby("uid") if (m := unit["g"].nunique()) > 2
              for _, rows in unit.groupby("g")]
    assert any(uneven)


def test_contributions_reaching_2_to_the_52_are_refused_before_anything_runs() -> None:
    """The exactness of the DOUBLE rescale rests on every L1 sensitivity staying below 2^52:
    a measure at the limit must be refused when the statements are compiled."""
    weight = 2**52 // (2 * 3) + 1  # k * r * weight >= 2^52
    with pytest.raises(InternalError, match="2\\^52"):
        DuckDBEngine.from_frame(frame(3)).compile(query(weight=weight))


def extreme_unit(base: pd.DataFrame, rows: int = 400) -> pd.DataFrame:
    rng = np.random.default_rng(99)
    return pd.DataFrame({
        "uid": np.full(rows, 10_000),
        "g": rng.choice(["a", "b", "c", "d", "e", "f", "zz1", "zz2"], rows),
        "v": rng.choice([1e9, -1e9, 100.0, np.inf], rows),
        "w": np.zeros(rows, dtype=np.int64),
    })


@pytest.mark.parametrize("rows_mode, partitions_mode, keys, selection, counts_only", [
    ("rescale", "rescale", None, False, False),
    ("rescale", "sample", None, True, False),
    ("sample", "sample", None, True, False),
    ("sample", "sample", None, True, True),  # counts only: no copy index, no content order
    ("sample", "rescale", None, False, False),
    ("rescale", "rescale", PublicKeys((("a",), ("b",), ("zz1",))), False, False),
])
def test_adding_one_heavy_unit_moves_every_measure_by_at_most_its_sensitivity(
        rows_mode: str, partitions_mode: str, keys: PublicKeys | None, selection: bool,
        counts_only: bool) -> None:
    """The sensitivity argument, checked on the engine's exact outputs (before any noise)."""
    base = frame(3)
    bigger = pd.concat([base, extreme_unit(base)], ignore_index=True).sample(
        frac=1.0, random_state=5)  # the new unit's rows land anywhere in the file
    q = query(rows_mode, partitions_mode, k=3, r=2, keys=keys, selection=selection)
    if counts_only:
        q = dataclasses.replace(q, measures=tuple(
            m for m in q.measures if m.kind in ("rows", "units")))
        assert "copies" not in DuckDBEngine.from_frame(base).compile(q)[0]
    # The key fixes the random choices; under some keys (about 5% for sampled rows) the heavy
    # unit's kept +55/-55 centred values cancel in every partition and the last check below
    # would be vacuous, so the key is one where they do not.
    before = DuckDBEngine.from_frame(base).compute_exact_aggregates(q, key=124)
    after = DuckDBEngine.from_frame(bigger).compute_exact_aggregates(q, key=124)
    b, a = as_table(before), as_table(after)
    for measure in q.measures:
        diffs = [a[measure.name].get(g, 0) - b[measure.name].get(g, 0)
                 for g in set(a[measure.name]) | set(b[measure.name])]
        assert max(abs(d) for d in diffs) <= q.per_partition_bound(measure), measure.name
        assert sum(abs(d) for d in diffs) <= q.l1_sensitivity(measure), measure.name
        assert math.isqrt(sum(d * d for d in diffs)) <= q.l2_sensitivity(measure), measure.name
        assert any(diffs), measure.name  # the unit did contribute: the check is not vacuous
    if selection:
        assert before.selection_units is not None and after.selection_units is not None
        units_before = dict(zip(before.keys, before.selection_units, strict=True))
        units_after = dict(zip(after.keys, after.selection_units, strict=True))
        moved = [units_after.get(g, 0) - units_before.get(g, 0)
                 for g in set(units_before) | set(units_after)]
        assert all(d in (0, 1) for d in moved) and sum(moved) <= 3


@pytest.mark.parametrize("rows_mode, partitions_mode", [("sample", "sample"),
                                                         ("rescale", "sample"),
                                                         ("rescale", "rescale")])
def test_row_order_never_changes_the_bounded_aggregates(rows_mode: str,
                                                        partitions_mode: str) -> None:
    """Choices are keyed by content, never by position: shuffled files give equal results."""
    df = frame(4)
    q = query(rows_mode, partitions_mode, k=2, r=1, selection=partitions_mode == "sample")
    first = as_table(DuckDBEngine.from_frame(df).compute_exact_aggregates(q, key=2024))
    for seed in range(3):
        shuffled = df.sample(frac=1.0, random_state=seed).reset_index(drop=True)
        again = as_table(DuckDBEngine.from_frame(shuffled).compute_exact_aggregates(q, key=2024))
        assert again == first
    other_key = as_table(DuckDBEngine.from_frame(df).compute_exact_aggregates(q, key=2025))
    if rows_mode == "sample":
        assert other_key != first  # the secret key does choose the rows


@pytest.mark.parametrize(("values", "present", "total"), [
    (pa.array([-5, 3, 200, None, 7], pa.int64()), 4, 0 + 3 + 100 + 7),  # CAST, no NaN test
    (pa.array([-5.0, 3.0, math.inf, math.nan, None]), 3, 0 + 3 + 100),  # NaN, NULL missing
    (pa.array(["-5", "3", "1e9", "nan", "not a number"]), 3, 0 + 3 + 100),  # TRY_CAST
])
def test_values_are_clamped_and_missing_values_left_out_for_every_column_type(
        values: pa.Array, present: int, total: int) -> None:
    """Out-of-range values are clamped (+inf too); NULL, NaN and text that is not a number
    are missing: counted by neither COUNT(v) nor SUM(v)."""
    table = pa.table({"uid": [1, 2, 3, 4, 5], "g": ["a"] * 5, "v": values})
    spec = ValueSpec("v", 0.0, 100.0, 0.0, 1.0)
    q = BoundedQuery("uid", GROUP, None, None, 1, 1, "rescale", "rescale",
                     (MeasureSpec("present", "present", spec), MeasureSpec("sum", "values", spec)))
    got = as_table(DuckDBEngine.from_frame(table).compute_exact_aggregates(q, key=3))
    assert got == {"present": {"a": present}, "sum": {"a": total}}


def test_row_level_privacy_counts_every_row_alone() -> None:
    df = frame(5)
    result = as_table(DuckDBEngine.from_frame(df).compute_exact_aggregates(
        query(unit=None, weight=1), key=1))
    assert result["rows"] == df.groupby("g").size().to_dict()
    expected_sum = {g: sum(fixed(VALUE, x) for x in rows["v"].dropna())
                    for g, rows in df.groupby("g")}
    assert result["sum"] == expected_sum


def test_every_source_gives_the_same_aggregates(tmp_path: Path) -> None:
    df = frame(6)
    q = query()
    expected = as_table(DuckDBEngine.from_frame(df).compute_exact_aggregates(q, key=3))
    csv, parquet = tmp_path / "d.csv", tmp_path / "d.parquet"
    df.to_csv(csv, index=False)
    df.to_parquet(parquet)
    con = duckdb.connect()
    con.register("staging", df)
    con.execute("CREATE TABLE events AS SELECT * FROM staging")
    engines = [
        DuckDBEngine.from_path(csv),
        DuckDBEngine.from_path(parquet),
        DuckDBEngine.from_frame(pl.from_pandas(df)),
        DuckDBEngine.from_frame(pa.Table.from_pandas(df)),
        DuckDBEngine.from_connection(con, "events"),
    ]
    for engine in engines:
        assert as_table(engine.compute_exact_aggregates(q, key=3)) == expected


def test_user_expressions_cannot_raise_on_data() -> None:
    """Division by zero, failed casts and overflow become NULL (row dropped), not errors."""
    df = pd.DataFrame({"uid": [1, 2, 3], "g": ["a", "b", "x"], "v": [1.0, 2.0, 3.0],
                       "w": [0, 1, 2]})
    q = query(where="1 / w > 0 AND CAST(g AS INTEGER) IS NULL AND w * 9223372036854775807 > 0")
    result = DuckDBEngine.from_frame(df).compute_exact_aggregates(q, key=1)
    # "x" (w = 2): 2 * (2^63 - 1) overflows, so the filter is NULL (DuckDB's optimizer, which
    # reads ``w * c > 0`` as ``w > 0``, kept it while one TRY wrapped the whole filter)
    assert sorted(k[0] for k in result.keys) == ["b"]


def test_public_keys_filter_rows_and_report_key_indexes() -> None:
    df = frame(7)
    keys = PublicKeys((("b",), ("nope",), ("a",)))
    result = DuckDBEngine.from_frame(df).compute_exact_aggregates(query(keys=keys), key=1)
    assert sorted(k[0] for k in result.keys) == [0, 2]  # indexes of "b" and "a"


def test_a_null_public_key_names_the_rows_whose_group_is_null() -> None:
    df = pd.DataFrame({"uid": [1, 2, 3, 4], "g": ["a", None, None, "b"], "v": [1.0] * 4,
                       "w": [0] * 4})
    engine = DuckDBEngine.from_frame(df)
    with_null = engine.compute_exact_aggregates(query(keys=PublicKeys((("a",), (None,)))), key=1)
    rows = dict(zip((k[0] for k in with_null.keys), with_null.measures["rows"], strict=True))
    assert rows == {0: 300, 1: 600}  # key 1 (NULL) holds units 2 and 3
    assert "IS NOT DISTINCT FROM" in with_null.sql[0]
    plain = engine.compute_exact_aggregates(query(keys=PublicKeys((("a",), ("b",)))), key=1)
    rows = dict(zip((k[0] for k in plain.keys), plain.measures["rows"], strict=True))
    assert rows == {0: 300, 1: 300}  # the NULL rows match no key
    assert "IS NOT DISTINCT FROM" not in plain.sql[0]


def test_the_secret_key_is_a_parameter_not_sql_text() -> None:
    df = frame(8)
    key = 0xDEADBEEF12345
    result = DuckDBEngine.from_frame(df).compute_exact_aggregates(
        query("sample", "sample", selection=True), key=key)
    text = "\n".join(result.sql)
    assert "$dp_key" in text and str(key) not in text and "sampled AS" in text


@pytest.mark.parametrize("copies_of_a, r, expected, variance", [
    # rows {1, 1, 2}, one row kept: P[keep a 1] = 2/3, so E = 4/3 and Var = 2/9
    (2, 1, 4 / 3, 2 / 9),
    # rows {1, 1, 1, 2}, two rows kept: {1, 2} for 3 of the 6 pairs, else {1, 1}: E = 5/2
    (3, 2, 5 / 2, 1 / 4),
])
def test_row_sampling_is_uniform_over_rows_even_with_identical_rows(
        copies_of_a: int, r: int, expected: float, variance: float) -> None:
    """Identical rows are separate rows: the sample is uniform over rows, not over contents.

    (Ordering rows by a hash of their content alone would keep the 1 with probability 1/2
    in the first case, 50 standard deviations away.) 20,000 units each hold the same rows in
    one partition; the sum of their sampled values has standard deviation sqrt(N Var), and a
    correct sampler leaves N E by more than 5.4 of them with probability below 1e-7 (normal
    approximation of a sum of 20,000 bounded independent terms; the priorities of distinct
    units come from hashes of distinct inputs under a random key)."""
    n = 20_000
    per_unit = [1.0] * copies_of_a + [2.0]
    df = pd.DataFrame({"uid": np.repeat(np.arange(n), len(per_unit)), "g": "a",
                       "v": np.tile(per_unit, n)})
    spec = ValueSpec("v", 0.0, 2.0, 0.0, 1.0)
    bounded = BoundedQuery("uid", GROUP, None, None, 1, r, "sample", "sample",
                           (MeasureSpec("sum", "values", spec),
                            MeasureSpec("rows", "rows")))
    result = DuckDBEngine.from_frame(df).compute_exact_aggregates(bounded, key=20261122)
    assert result.measures["rows"] == [n * r]
    total = result.measures["sum"][0]
    assert abs(total - n * expected) <= 5.4 * math.sqrt(n * variance)


def test_sampled_bounding_without_group_keys_keeps_r_rows_per_unit() -> None:
    df = pd.DataFrame({"uid": [1, 1, 1, 2], "v": [1.0, 2.0, 3.0, 4.0]})
    q = BoundedQuery("uid", (), None, None, 2, 2, "sample", "sample",
                     (MeasureSpec("rows", "rows"), MeasureSpec("units", "units")))
    result = DuckDBEngine.from_frame(df).compute_exact_aggregates(q, key=3)
    assert result.measures == {"rows": [3], "units": [2]}  # min(3, 2) + min(1, 2) rows


@pytest.mark.parametrize("rows_mode", ["sample", "rescale"])
def test_a_hard_partition_cap_keeps_exactly_k_partitions(rows_mode: str) -> None:
    """Both hard-cap paths rank a unit's partitions in the same keyed order (ties broken by
    the keys), so a unit in 6 partitions is counted in exactly k = 3 of them, the same 3."""
    df = pd.DataFrame({"uid": [1] * 12, "g": list("abcdef") * 2, "v": [1.0] * 12,
                       "w": [0] * 12})
    q = BoundedQuery("uid", GROUP, None, None, 3, 2, rows_mode, "sample",  # type: ignore[arg-type]
                     (MeasureSpec("units", "units"),), selection_units=True)
    result = DuckDBEngine.from_frame(df).compute_exact_aggregates(q, key=5)
    kept = {k[0] for k, u in zip(result.keys, result.measures["units"], strict=True) if u}
    assert len(kept) == 3 and sum(result.selection_units or []) == 3
    other = dataclasses.replace(q, rows_mode="rescale" if rows_mode == "sample" else "sample")
    again = DuckDBEngine.from_frame(df).compute_exact_aggregates(other, key=5)
    assert kept == {k[0] for k, u in zip(again.keys, again.measures["units"], strict=True) if u}


def test_public_keys_are_checked_once_per_set_and_a_bad_set_every_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The public keys' check reads only the keys and their types, so a set already checked
    is not checked again (a chosen-bounds query runs three statements over one set); a set
    that failed is refused again, and the remembered sets are the most recent few."""
    from dpcurator.engines import _engine
    from dpcurator.errors import UserError

    engine = DuckDBEngine.from_frame(frame(1))
    calls: list[object] = []
    check = engine._check_keys
    monkeypatch.setattr(engine, "_check_keys", lambda c: (calls.append(c.query.keys), check(c)))

    def query(keys: tuple[object, ...], rows: int = 1) -> BoundedQuery:
        return BoundedQuery("uid", GROUP, None, PublicKeys(tuple((k,) for k in keys)), 2,
                            rows, "rescale", "rescale", (MeasureSpec("rows", "rows"),))

    engine.validate(query(("a", "b")))
    engine.validate(query(("a", "b"), rows=3))  # another statement, the same keys
    assert len(calls) == 1
    engine.validate(query(("a", "c")))
    assert len(calls) == 2
    for n in range(_engine.CHECKED_KEYS):  # push ("a", "b") out of the remembered sets
        engine.validate(query((f"k{n}",)))
    engine.validate(query(("a", "b"), rows=5))
    assert len(calls) == 3 + _engine.CHECKED_KEYS
    ints = DuckDBEngine.from_frame(frame(1).assign(g=lambda d: d.uid % 3))
    for _ in range(2):
        with pytest.raises(UserError, match="key #2"):
            ints.validate(query(("1", "not-a-number")))


def test_integer_keys_beyond_bigint_are_released_and_accepted_as_public_keys() -> None:
    """A bug hunt: a UBIGINT key of 2^64 - 1 (a 64-bit hash) was released and charged, then
    ``to_arrow`` raised pyarrow's OverflowError; and the same key given as a public key was
    refused as "beyond 64 bits". HUGEINT and UHUGEINT keys go through as well."""
    import dpcurator as dp

    big = 2**64 - 1
    df = pd.DataFrame({"uid": np.arange(4000),
                       "bucket": np.repeat(np.array([big, 3], dtype=np.uint64), 2000)})
    c = dp.Curator.from_pandas(df, privacy_unit="uid", budget=dp.ApproxDP(20, 1e-6))
    assert c.columns["bucket"] == "UBIGINT"
    query_text = "SELECT bucket, COUNT(*) AS n FROM data GROUP BY bucket"
    private = c.sql(query_text, epsilon=1.0, delta=1e-7)
    assert sorted(private.keys) == [(3,), (big,)]
    table = private.to_arrow(intervals=True)
    assert table.schema.field("bucket").type == pa.uint64()
    assert sorted(table.column("bucket").to_pylist()) == [3, big]
    public = c.sql(query_text, epsilon=1.0, keys=[big, 3, 2**63])
    assert public.keys == ((big,), (3,), (2**63,))
    assert abs(public.values["n"][0] - 2000) < 100 and abs(public.values["n"][2]) < 100
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT i AS uid, CASE WHEN i % 2 = 0 THEN "
                "CAST('-170141183460469231731687303715884105727' AS HUGEINT) ELSE "
                "CAST(2 AS HUGEINT) END AS h, CASE WHEN i % 2 = 0 THEN "
                "CAST('340282366920938463463374607431768211455' AS UHUGEINT) ELSE "
                "CAST(3 AS UHUGEINT) END AS uh FROM range(4000) r(i)")
    wide = dp.Curator.from_duckdb(con, "t", privacy_unit="uid", budget=dp.PureDP(10))
    for column, huge in (("h", -(2**127) + 1), ("uh", 2**128 - 1)):
        release = wide.sql(f"SELECT {column}, COUNT(*) AS n FROM data GROUP BY {column}",
                           epsilon=1.0, keys=[huge, 3 if column == "uh" else 2])
        assert release.keys[0] == (huge,) and abs(release.values["n"][0] - 2000) < 100
        assert release.to_arrow().column(column).to_pylist()[0] == huge
    assert c.spent.epsilon == 2.0 and wide.spent.epsilon == 2.0
