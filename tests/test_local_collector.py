"""The collector's side: streaming aggregation, every aggregation strategy, bad input."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

import dpcurator.local as local
from dpcurator.errors import UserError
from dpcurator.local import (
    Collector,
    FrequencyOracle,
    OptimizedLocalHashing,
    ReportError,
    make_randomizer,
)
from dpcurator.local.frequency import HadamardResponse, HashAccumulator, walsh_hadamard
from dpcurator.local.survey import MECHANISMS
from dpcurator.noise import SeededRandom


def _answers(rand: Any, n: int, rng: np.random.Generator) -> Any:
    if isinstance(rand, FrequencyOracle):
        return np.asarray(rand.categories, dtype=object)[rng.integers(0, rand.k, n)]
    if rand.mechanism in ("rr", "two-coin"):
        return rng.random(n) < 0.3
    return rng.uniform(rand.low, rand.high, n)


def _make(name: str, seed: int = 1) -> Any:
    return make_randomizer(name, 1.0, categories=["x", "y", "z", "w", "v"], low=-1, high=3,
                           source=SeededRandom(seed))


@pytest.mark.parametrize("name", MECHANISMS)
def test_jsonl_round_trip_with_bad_lines(name: str, tmp_path: Any) -> None:
    rand = _make(name)
    rng = np.random.default_rng(2)
    reports = rand.randomize(_answers(rand, 500, rng))
    rows = [json.dumps(r) for r in rand.report_rows(reports)]
    bad = ["{not json", json.dumps({"mechanism": rand.mechanism}),
           json.dumps({"mechanism": "other", "y": 1}), json.dumps([1, 2]),
           json.dumps({"mechanism": rand.mechanism, "y": "secret-value-123", "seed": -5,
                       "bits": "01"})]
    lines = rows[:100] + bad[:2] + [""] + rows[100:300] + bad[2:] + rows[300:]
    path = tmp_path / "reports.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    collector = Collector(rand, chunk_size=64)  # many small chunks: streaming
    collector.read(path)
    assert collector.n == 500
    assert collector.bad_count == 5
    assert [e.line for e in collector.errors] == [101, 102, 304, 305, 306]
    assert all("secret" not in e.error for e in collector.errors)  # never echoes a record
    direct = rand.estimate(reports)
    streamed = collector.estimate()
    assert streamed.to_json() == direct.to_json()


@pytest.mark.parametrize("name", ["rr", "grr", "oue", "olh", "piecewise"])
def test_csv_and_iterator_inputs(name: str, tmp_path: Any) -> None:
    rand = _make(name, 3)
    reports = rand.randomize(_answers(rand, 200, np.random.default_rng(4)))
    objs = list(rand.report_rows(reports))
    fields = list(rand.report_fields)
    text = ",".join(fields) + "\n" + "\n".join(
        ",".join(str(o[f]) for f in fields) for o in objs[:50]) + "\nbroken\n" + "\n".join(
        ",".join(str(o[f]) for f in fields) for o in objs[50:]) + "\n"
    path = tmp_path / "reports.csv"
    path.write_text(text, encoding="utf-8")
    from_csv = Collector(rand)
    from_csv.read(path)
    assert from_csv.n == 200 and from_csv.bad_count <= 1
    if len(fields) > 1:  # "broken" has the wrong number of fields: its line is reported
        assert from_csv.errors[0].line == 52
    from_iter = Collector(rand)
    from_iter.add_reports(iter(objs[:10] + ["{bad"] + [json.dumps(o) for o in objs[10:]]))
    assert from_iter.n == 200 and from_iter.errors[0].line == 11
    assert from_csv.estimate().to_json() == from_iter.estimate().to_json()


def test_csv_without_the_report_fields_is_refused(tmp_path: Any) -> None:
    path = tmp_path / "r.csv"
    path.write_text("seed,value\n1,2\n", encoding="utf-8")
    with pytest.raises(ReportError, match="line 1: the CSV header"):
        Collector(_make("olh")).read(path)


def test_csv_with_a_utf8_byte_order_mark_is_read(tmp_path: Any) -> None:
    """Excel's "CSV UTF-8" starts with a BOM; the header used to read as "\\ufeffy"."""
    path = tmp_path / "r.csv"
    path.write_bytes(b"\xef\xbb\xbfy\n1\n0\n1\n")
    collector = Collector(_make("rr"))
    collector.read(path)
    assert collector.n == 3 and collector.bad_count == 0


@pytest.mark.parametrize(("call", "message"), [
    (lambda: local.sample_size(local.Duchi(1.0), 0.1, rate=float("nan")), "rate must be"),
    (lambda: local.sample_size(local.Duchi(1.0), 0.1, rate=float("inf")), "rate must be"),
    (lambda: local.sample_size(local.Duchi(1.0), 0.1, rate=2.0), "rate (the expected mean)"),
    (lambda: local.sample_size(_make("rr"), 0.1, rate="x"), "rate must be"),
    (lambda: local.sample_size(_make("rr"), 1e-300), "margin=1e-300 is too small"),
    (lambda: local.interval_half_width(_make("rr"), "3"), "n must be a positive integer"),
    (lambda: local.interval_half_width(_make("rr"), float("nan")), "n must be"),
    (lambda: Collector(_make("rr"), chunk_size="a"), "chunk_size must be an integer"),
    (lambda: Collector(_make("rr"), max_errors=1.5), "max_errors must be an integer"),
    (lambda: local.Piecewise(1.0, grid_bits=1.5), "grid_bits must be an integer"),
    (lambda: local.Piecewise(1.0, grid_bits=True), "grid_bits must be an integer"),
    (lambda: HadamardResponse(1.0, 2**40), "k (the number of categories) must be an integer"),
], ids=["rate-nan", "rate-inf", "rate-range", "rate-text", "margin-tiny", "n-text", "n-nan",
        "chunk-text", "max-errors-float", "grid-float", "grid-bool", "hadamard-k"])
def test_bad_parameters_name_the_parameter(call: Any, message: str) -> None:
    """A UserError naming the parameter, not a raw TypeError, ZeroDivisionError or MemoryError
    (Hadamard's limit on k is checked before the categories are built)."""
    with pytest.raises(UserError, match=re.escape(message)):
        call()


@pytest.mark.parametrize("k", [local.client.MAX_CATEGORIES + 1, 10**9, 2**40])
@pytest.mark.parametrize("mechanism", ["grr", "sue", "oue", "olh", "hadamard", "auto"])
def test_a_huge_category_count_is_refused_before_anything_is_allocated(
        mechanism: str, k: int) -> None:
    """k = 10^9 categories raised MemoryError (a list of 10^9 labels, then per-category
    arrays) instead of an error naming k; every frequency oracle, and the chooser of "auto",
    now refuses k above the limit with the limit in the message, having allocated nothing of
    size k (peak under 1 MB where 10^9 labels need gigabytes)."""
    import tracemalloc

    limit = f"{local.client.MAX_CATEGORIES:,}"
    tracemalloc.start()
    try:
        with pytest.raises(UserError, match=rf"\bk\b.*\[2, {limit}\], got {k}"):
            make_randomizer(mechanism, 1.0, categories=k)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak


def test_too_many_category_labels_are_refused_by_library_and_client() -> None:
    labels = list(range(local.client.MAX_CATEGORIES + 1))
    with pytest.raises(UserError, match=r"at most 1,000,000 labels \(k, the number of "):
        local.GeneralizedRR(1.0, labels)
    config = {"format": local.client.FORMAT, "mechanism": "grr", "epsilon": 1.0,
              "categories": labels, "params": {"p": "1/2"}}
    with pytest.raises(local.ConfigError, match="at most 1,000,000 labels"):
        local.client.check_config(config)
    with pytest.raises(UserError, match=r"k must be an integer in \[2, 1,000,000\]"):
        local.choose_mechanism(len(labels), 1.0)
    assert local.GeneralizedRR(1.0, 200).k == 200  # well within: unchanged


def test_no_valid_report_is_a_clear_error(tmp_path: Any) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text("nonsense\n", encoding="utf-8")
    collector = Collector(_make("rr"))
    collector.read(path)
    with pytest.raises(ValueError, match="no valid report"):
        collector.estimate()


@pytest.mark.parametrize(("epsilon", "k", "mode"), [
    (1.0, 6, "keys"),        # gather over (a, v)
    (1.0, 300, "keys"),      # digit-by-digit transform (k > g^2)
    (9.0, 50, "inverse"),    # g ~ 8100 > k: one supported category per report
    (6.0, 1000, "direct"),   # g^3 > 2^24 keys: hash every category
])
def test_olh_aggregation_strategies_agree_with_direct_counting(
        epsilon: float, k: int, mode: str) -> None:
    olh = OptimizedLocalHashing(epsilon, k, SeededRandom(5))
    rng = np.random.default_rng(6)
    reports = olh.randomize_indices(rng.integers(0, k, 3000))
    acc = olh.accumulator()
    assert isinstance(acc, HashAccumulator) and acc._mode == mode
    for start in range(0, 3000, 700):
        acc.add(reports[start:start + 700])
    counts, n = olh.support_counts(acc)
    assert n == 3000
    expected = [int(olh.supports(reports, v).sum()) for v in range(k)]
    assert counts.tolist() == expected
    assert np.array_equal(olh._direct_counts(reports), np.array(expected))


def test_olh_hash_matches_the_client() -> None:
    olh = OptimizedLocalHashing(1.0, 30)
    seeds = np.arange(olh.g ** (olh.digits + 1))
    for x in (0, 7, 29):
        vec = olh.hash_values(seeds, np.full(seeds.size, x))
        assert vec.tolist() == [local.client.olh_hash(int(s), x, olh.g, olh.digits)
                                for s in seeds]


def test_hadamard_transform_counts() -> None:
    assert walsh_hadamard([1, 0, 0, 0]).tolist() == [1, 1, 1, 1]
    assert walsh_hadamard([0, 1, 0, 0]).tolist() == [1, -1, 1, -1]
    hr = HadamardResponse(1.0, 20, SeededRandom(7))
    reports = hr.randomize_indices(np.random.default_rng(8).integers(0, 20, 5000))
    counts, _ = hr.support_counts(reports)
    assert counts.tolist() == [int(hr.supports(reports, v).sum()) for v in range(20)]


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "1", True, 51.0, 1e9])
def test_bad_epsilon_names_the_parameter(bad: Any) -> None:
    """Every mechanism checks epsilon before using it: OUE and SUE used to compute e^epsilon
    first (a raw NaN error, or minutes of CPU for 1e9)."""
    for name in MECHANISMS:
        with pytest.raises(ValueError, match="epsilon must be"):
            make_randomizer(name, bad, categories=3)


NO_SIGNAL = [  # private (ratio <= e^epsilon) but p* <= q*: nothing can be estimated
    ("grr", {"p": "3/10"}, "1/k = 1/3"), ("grr", {"p": "1/3"}, "1/k = 1/3"),
    ("hadamard", {"p": "1/2"}, "1/2"), ("hadamard", {"p": "1/3"}, "1/2"),
    ("oue", {"p": "1/3", "q": "1/3"}, "params.q"), ("sue", {"p": "1/4", "q": "1/3"}, "params.q"),
    ("olh", {"p": "1/5"}, "1/g = 1/5"),
]


@pytest.mark.parametrize(("name", "edit", "rule"), NO_SIGNAL,
                         ids=[f"{c[0]}-{'-'.join(c[1].values())}" for c in NO_SIGNAL])
def test_configuration_without_signal_is_refused(name: str, edit: dict[str, str],
                                                 rule: str) -> None:
    """p* <= q* is refused by the client, by from_config and by the constructors, before any
    report or estimate (it used to give inverted intervals and negative or NaN errors)."""
    cfg = make_randomizer(name, 1.0, categories=3).config()
    if name == "olh":
        cfg["params"]["g"] = 5
    cfg["params"].update(edit)
    with pytest.raises(local.ConfigError, match=re.escape(f"params.p must exceed {rule}")):
        local.client.check_config(cfg)
    with pytest.raises(local.ConfigError, match=r"params\.p must exceed"):
        local.from_config(cfg)
    params: dict[str, Any] = {key: Fraction(value) for key, value in edit.items()}
    if name == "olh":
        params["g"] = 5
    oracle = type(make_randomizer(name, 1.0, categories=3))
    with pytest.raises(ValueError, match=r"carry no signal.*p\* must exceed q\*"):
        oracle(1.0, 3, **params)


def test_two_coin_below_ln2_is_refused() -> None:
    with pytest.raises(ValueError, match="ln 2"):
        make_randomizer("two-coin", 0.5)


@pytest.mark.parametrize("name", ["duchi", "piecewise"])
def test_range_whose_width_overflows_is_refused(name: str) -> None:
    """[-1e308, 1e308] has a width of inf: every answer used to map to the middle."""
    with pytest.raises(ValueError, match=r"high - low must be a finite number"):
        make_randomizer(name, 1.0, low=-1e308, high=1e308)
    cfg = make_randomizer(name, 1.0, low=-1e307, high=1e307).config()
    cfg["low"], cfg["high"] = -1e308, 1e308
    with pytest.raises(local.ConfigError, match=r"high - low must be a finite number"):
        local.client.check_config(cfg)


def test_unknown_categories_and_out_of_range_values() -> None:
    grr = make_randomizer("grr", 1.0, categories=["bus", "car"])
    with pytest.raises(ValueError, match="not among the survey's 2 categories"):
        grr.randomize(["bus", "plane"])
    with pytest.raises(ValueError, match="not among"):
        make_randomizer("olh", 1.0, categories=4).randomize(np.array([0, 4]))
    with pytest.raises(ValueError, match="outside the survey's range"):
        make_randomizer("duchi", 1.0, low=0, high=1).randomize([0.5, 1.5])
    with pytest.raises(ValueError, match="finite"):
        make_randomizer("piecewise", 1.0).randomize([float("nan")])
    with pytest.raises(ValueError, match="needs categories"):
        make_randomizer("oue", 1.0)
    with pytest.raises(ValueError, match="mechanism must be one of"):
        make_randomizer("laplace", 1.0)
    with pytest.raises(ValueError, match="distinct"):
        make_randomizer("grr", 1.0, categories=["1", 1])


def test_config_round_trip_gives_the_same_randomizer() -> None:
    for name in MECHANISMS:
        rand = _make(name)
        again = local.from_config(json.loads(json.dumps(rand.config())))
        assert again.config() == rand.config()
        assert again.privacy_ratio() == rand.privacy_ratio()


def test_public_surface() -> None:
    assert set(local.__all__) == {
        "MECHANISMS", "Accumulator", "BadReport", "BinaryResponse", "Collector", "ConfigError",
        "Duchi", "FrequencyEstimate", "FrequencyOracle", "GeneralizedRR", "HadamardResponse",
        "LocalRandomizer", "MeanEstimate", "NumericRandomizer", "OptimizedLocalHashing",
        "OptimizedUnaryEncoding", "Piecewise", "RateEstimate", "ReportError", "SurveyEstimate",
        "SymmetricUnaryEncoding", "choose_mechanism", "from_config", "interval_half_width",
        "make_randomizer", "plot_interval_widths", "project_simplex", "report_variance",
        "sample_size",
    }
    for name in local.__all__:
        assert hasattr(local, name)
    rand = make_randomizer("oue", 1.0, categories=4)
    assert rand.guarantee.epsilon == 1.0
    assert str(rand.guarantee.neighbouring) == "replace one privacy unit"
    assert rand.event.epsilon == 1.0
