"""Accuracy and privacy of whole releases: interval coverage, and the Escargots category.

Each statistical assertion states its false-failure probability (below 1e-6): coverage counts
are compared with the 1e-7 lower quantile of Binomial(N, 0.95), release counts with the 1e-7
upper quantile of Binomial(N, delta). The seeds make runs reproducible, not the assertions true.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pandas as pd
import pytest
from scipy.stats import binom

import dpcurator as dp
from dpcurator.curator import Curator
from dpcurator.noise import SeededRandom


def test_95_percent_intervals_cover_the_truth_at_least_95_percent_of_the_time() -> None:
    """Data inside every cap (one row per unit, values in bounds): bounded truth = truth."""
    rng = np.random.default_rng(0)
    partitions, runs = 40, 25
    sizes = rng.integers(20, 400, partitions)
    frame = pd.DataFrame({
        "g": np.repeat([f"p{i}" for i in range(partitions)], sizes),
        "x": rng.uniform(0, 10, sizes.sum()),
    })
    frame["uid"] = np.arange(len(frame))
    truth = frame.groupby("g")["x"].agg(n="count", s="sum", m="mean", v=lambda x: x.var(ddof=0))
    keys = [f"p{i}" for i in range(partitions)]
    curator = Curator(frame, privacy_unit="uid", budget=dp.PureDP(1e6), cache=False,
                      bounds={"x": (0, 10)}, source=SeededRandom(7))
    covered = dict.fromkeys(["n", "s", "m", "v", "u"], 0)
    for _ in range(runs):
        release = curator.sql(
            "SELECT g, COUNT(*) AS n, SUM(x) AS s, AVG(x) AS m, VAR_POP(x) AS v, "
            "COUNT(DISTINCT uid) AS u FROM data GROUP BY g", epsilon=2.0, keys=keys)
        frame_out = release.to_pandas(intervals=True).set_index("g").loc[keys]
        for name in covered:
            exact = truth["n" if name == "u" else name].loc[keys].to_numpy()
            low = frame_out[f"{name}_low"].to_numpy()
            high = frame_out[f"{name}_high"].to_numpy()
            covered[name] += int(np.sum((low <= exact + 1e-9) & (exact - 1e-9 <= high)))
    trials = partitions * runs
    floor = binom.ppf(1e-7, trials, 0.95)  # a correct 95% interval falls below w.p. < 1e-7
    for name, hits in covered.items():
        assert hits >= floor, (name, hits / trials)


def test_escargots_created_by_one_person_is_released_with_probability_at_most_delta() -> None:
    """The references' food survey: free-text categories, one of them typed by one person."""
    foods = ["Pizza"] * 200 + ["Sushi"] * 120 + ["Escargots"]
    frame = pd.DataFrame({"uid": np.arange(len(foods)), "food": foods})
    extra = pd.DataFrame({"uid": [len(foods) - 1] * 4, "food": ["Escargots"] * 4})
    frame = pd.concat([frame, extra], ignore_index=True)  # the snail lover answered 5 times
    delta = 0.05  # large on purpose, so that the test has power at a few hundred runs
    runs, escargots, pizza = 120, 0, 0
    for run in range(runs):
        curator = Curator(frame, privacy_unit="uid", budget=dp.ApproxDP(1.0, delta),
                          source=SeededRandom(run), max_rows_per_partition=5,
                          allow_large_delta=True)
        release = curator.sql("SELECT food, COUNT(*) AS n FROM data GROUP BY food",
                              epsilon=1.0, delta=delta)
        found = {key[0] for key in release.keys}
        escargots += "Escargots" in found
        pizza += "Pizza" in found
    # One unit backs Escargots: kept with probability pi(1) = delta (k = 1) in each run.
    assert escargots <= binom.isf(1e-7, runs, delta)
    assert pizza == runs  # 200 units: kept with probability 1


# -- quantiles --------------------------------------------------------------------------------

BINS = 1024


def true_quantile_bins(values: npt.NDArray[np.float64], q: float, lo: float, hi: float
                       ) -> tuple[int, int]:
    """The bins of x_(a) and x_(b), a = floor(q (n - 1)), b = ceil(q (n - 1)), of the clamped
    values, binned as the engine does: min(1023, floor((x - lo) * (1024 / (hi - lo))))."""
    clamped = np.clip(values, lo, hi)
    bins = np.minimum(BINS - 1, np.floor((clamped - lo) * (BINS / (hi - lo)))).astype(int)
    ordered = np.sort(bins)
    h = q * (len(values) - 1)
    return int(ordered[int(np.floor(h))]), int(ordered[int(np.ceil(h))])


def quantile_frame(rng: np.random.Generator) -> tuple[pd.DataFrame, list[str]]:
    """Partitions from 1 to 3,000 rows; uniform, skewed (lognormal, partly above the bounds)
    and tied (rounded) values; one row per unit, so the bounded data is the data."""
    sizes = [1, 2, 3, 5, 8, 13, 20, 30, 50, 80, 120, 200, 300, 500, 800, 1200, 2000, 3000,
             7, 40, 150, 600, 1500, 60]
    parts = []
    for i, size in enumerate(sizes):
        kind = i % 3
        if kind == 0:
            x = rng.uniform(0, 10, size)
        elif kind == 1:
            x = rng.lognormal(0.0, 1.0, size)  # skewed; about 1% above hi = 10 (clamped)
        else:
            x = np.round(rng.exponential(2.0, size))  # heavy ties
        parts.append(pd.DataFrame({"g": f"p{i}", "x": x}))
    frame = pd.concat(parts, ignore_index=True)
    frame["uid"] = np.arange(len(frame))
    return frame, [f"p{i}" for i in range(len(sizes))]


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_quantile_intervals_cover_the_true_quantile_at_their_level(noise: str) -> None:
    """MEDIAN, the 0.9 and the 0.1 quantile at 95% and 80%, pure DP (discrete Laplace tree) and
    zCDP (discrete Gaussian tree). Covering means: the interval contains the whole bins of
    x_(a) and x_(b) (the Release docstring's definition), hence the sample quantile (checked
    too, against numpy's linear quantile = SQL QUANTILE_CONT). Each of the 6 counts is compared
    with the 1e-8 lower quantile of Binomial(N, level): false failure < 6e-8 per noise kind."""
    rng = np.random.default_rng(11)
    frame, keys = quantile_frame(rng)
    lo, hi = 0.0, 10.0
    edges = np.linspace(lo, hi, BINS + 1)
    quantiles = {"med": 0.5, "q9": 0.9, "q1": 0.1}
    groups = {g: part["x"].to_numpy() for g, part in frame.groupby("g")}
    truth = {(name, g): true_quantile_bins(groups[g], q, lo, hi)
             for name, q in quantiles.items() for g in keys}
    exact = {(name, g): float(np.quantile(np.clip(groups[g], lo, hi), q))
             for name, q in quantiles.items() for g in keys}
    budget = dp.PureDP(1e6) if noise == "laplace" else dp.ZCDP(1e6)
    privacy = {"epsilon": 3.0} if noise == "laplace" else {"rho": 0.3}
    curator = Curator(frame, privacy_unit="uid", budget=budget, cache=False,
                      bounds={"x": (lo, hi)}, source=SeededRandom(3))
    levels = (0.95, 0.8)
    covered = {(name, level): 0 for name in quantiles for level in levels}
    runs = 20
    for _ in range(runs):
        release = curator.sql(
            "SELECT g, MEDIAN(x) AS med, QUANTILE_CONT(x, 0.9) AS q9, "
            "PERCENTILE_CONT(0.1) WITHIN GROUP (ORDER BY x) AS q1 FROM data GROUP BY g",
            keys=keys, **privacy)
        assert [k[0] for k in release.keys] == keys
        for level in levels:
            for name in quantiles:
                low, high = release.interval(name, level)
                value = release.values[name]
                assert np.all((low <= value) & (value <= high))
                for i, g in enumerate(keys):
                    a_bin, b_bin = truth[name, g]
                    hit = bool(low[i] <= edges[a_bin] and edges[b_bin + 1] <= high[i])
                    if hit:  # the bins hold the sample quantile (up to binning's rounding)
                        assert low[i] - 1e-9 <= exact[name, g] <= high[i] + 1e-9
                    covered[name, level] += hit
    trials = runs * len(keys)
    for (name, level), hits in covered.items():
        assert hits >= binom.ppf(1e-8, trials, level), (name, level, hits / trials)


def test_quantile_estimate_is_accurate_on_a_large_partition() -> None:
    """200,000 rows, epsilon = 1 for two quantiles: the estimate and the true quantile both lie
    in the (1 - 1e-7) interval (the truth fails w.p. < 1e-7), which is at most 8 bins wide:
    the error is below 0.04 on a range of 10."""
    rng = np.random.default_rng(5)
    x = rng.normal(4.0, 1.5, 200_000)
    frame = pd.DataFrame({"uid": np.arange(len(x)), "x": x})
    curator = Curator(frame, privacy_unit="uid", budget=dp.PureDP(1.0), bounds={"x": (0, 10)},
                      source=SeededRandom(9))
    release = curator.sql("SELECT MEDIAN(x) AS med, QUANTILE_CONT(x, 0.9) AS q9 FROM data",
                          epsilon=1.0)
    for name, q in (("med", 0.5), ("q9", 0.9)):
        truth = float(np.quantile(np.clip(x, 0, 10), q))
        low, high = release.interval(name, 1 - 1e-7)
        estimate = float(release.values[name][0])
        assert low[0] <= truth <= high[0], name
        assert high[0] - low[0] <= 8 * 10 / BINS + 1e-12, (name, high[0] - low[0])
        assert abs(estimate - truth) <= 0.04


def _discrete_laplace_pmf(scale: float, reach: int) -> npt.NDArray[np.float64]:
    """P[Z = z] for z = -reach..reach, written out from the law (not the library's code)."""
    s = np.exp(-1.0 / scale)
    z = np.arange(-reach, reach + 1)
    return (1 - s) / (1 + s) * s ** np.abs(z)


def test_quantile_interval_is_exactly_at_its_stated_miss_rate_on_the_worst_data() -> None:
    """The spike that makes the coverage proof tight (``_quantiles`` docstring): 501 rows in
    bin 639 and 500 in bin 1000 (n = 1001, the median is the 501st row, in bin 639), so the
    lower end misses iff edge 640 = 512 + 128 tests confidently below, whose noise is
    D = Z_512 + Z_128 - Z_0 / 2, at the fine stage's margin (the coarse stages' wider margins at
    the same edge only shrink the event; the upper end would need D >= 500). Its probability,
    computed here by convolving the discrete Laplace law (scale 11, epsilon = 1), is about
    0.090 against the stated bound 0.98 * 0.2 / 2 = 0.098 at 80%. 4,000 intervals must cover
    within the 1e-8 binomial quantiles on both sides of the exact rate: false failure < 2e-8."""
    from dpcurator.curator._quantiles import STAGES, QuantileTree
    from dpcurator.query.bounding import HistogramSpec
    from dpcurator.query.plan import Quantile

    level, parts, runs = 0.8, 200, 20
    tree = QuantileTree.build(Quantile("x", (0.0, 1024.0), "med", q=0.5),
                              HistogramSpec("med", "x", 0.0, 1024.0, BINS), "laplace", 1.0,
                              k=1, r=1, source=SeededRandom(21))
    leaves = np.zeros((parts, BINS), dtype=np.int64)
    leaves[:, 639], leaves[:, 1000] = 501, 500
    fine_share = STAGES[-1][1]
    m_low = tree.margins((1 - level) * fine_share)[0][640]
    # Rejected iff G~(640) = 0.5 + D <= -m_low, i.e. 2 D = 2 Z_a + 2 Z_b - Z_0 <= -2 m_low - 1.
    reach = 600
    pmf = _discrete_laplace_pmf(11.0, reach)
    doubled = np.zeros(4 * reach + 1)
    doubled[::2] = pmf  # 2 Z on the integers -2 reach..2 reach
    total = np.convolve(np.convolve(doubled, doubled), pmf[::-1])  # 2 Z_a + 2 Z_b - Z_0
    support = np.arange(total.size) - 5 * reach
    miss = float(total[support <= -2 * m_low - 1].sum())
    assert 0.07 < miss <= (1 - level) * fine_share / 2
    covered = 0
    for _ in range(runs):
        low, high = tree.interval(tree.add_noise(leaves), 1 - level)
        covered += int(np.sum((low <= 639.5) & (high >= 639.5)))
    trials = runs * parts
    assert binom.ppf(1e-8, trials, 1 - miss) <= covered <= binom.isf(1e-8, trials, 1 - miss), (
        covered / trials, 1 - miss)


def test_staged_quantile_intervals_are_narrower_on_spread_data_and_no_wider_on_dense(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same noisy trees read by the staged rule and by one fine stage at the whole alpha
    (the rule before 2026-11): on 300 normal values per partition (epsilon = 1, bounds 0-100)
    the staged intervals' mean width is below 0.65x (measured 0.53x); on 20,000 values, where a
    bin decides, no wider (measured 0.996x; 0.2% allowed, and the shares 5/5/90%, tried
    first, measured 1.004x). Seeded; the margins are wide (the widths' spread
    over 60 partitions is a few percent)."""
    from dpcurator.curator import _quantiles
    from dpcurator.curator._quantiles import QuantileTree
    from dpcurator.query.bounding import HistogramSpec
    from dpcurator.query.plan import Quantile

    rng = np.random.default_rng(8)
    tree = QuantileTree.build(Quantile("x", (0.0, 100.0), "med", q=0.5),
                              HistogramSpec("med", "x", 0.0, 100.0, BINS), "laplace", 1.0,
                              k=1, r=1, source=SeededRandom(22))
    for n, bound in ((300, 0.65), (20_000, 1.002)):
        x = np.clip(rng.normal(50, 10, (60, n)), 0, 100)
        bins = np.minimum(BINS - 1, np.floor(x * (BINS / 100.0))).astype(np.int64)
        leaves = np.stack([np.bincount(row, minlength=BINS) for row in bins])
        staged, single = [], []
        for _ in range(5):
            noisy = tree.add_noise(leaves)
            low, high = tree.interval(noisy, 0.05)
            staged.append(high - low)
            with monkeypatch.context() as patch:
                patch.setattr(_quantiles, "STAGES", ((0, 1.0),))
                low, high = tree.interval(noisy, 0.05)
            single.append(high - low)
        ratio = float(np.mean(staged) / np.mean(single))
        assert ratio <= bound, (n, ratio)


def _laplace_sum_tail(x: float, terms: int, scale: float) -> float:
    """An upper bound on P[sum_i beta_i Z_i >= x] for ``terms`` independent discrete Laplace
    Z_i of scale t and |beta_i| <= 1, by Chernoff: E exp(lam beta Z) <= M(lam) =
    (1 - s)^2 / ((1 - s e^lam) (1 - s e^-lam)), s = e^(-1/t), for 0 < lam < 1/t (the law's
    moment generating function, even and rising in |lam|); the least of M^terms e^(-lam x)
    over a grid of lam."""
    s = math.exp(-1.0 / scale)
    lam = np.linspace(0.01, 0.99, 99) / scale
    mgf = (1 - s) ** 2 / ((1 - s * np.exp(lam)) * (1 - s * np.exp(-lam)))
    return float(min(1.0, np.min(mgf**terms * np.exp(-lam * x))))


def _integer_miss_bound(counts: npt.NDArray[np.int64], q: float, scale: float) -> float:
    """An upper bound on P[the estimate is not the integer of bin m] for one bin per integer
    (bin i = the i-th integer), where the rank q n falls strictly inside bin m's rows.

    With G(j) = F(j) - q n, the estimate is that integer whenever G~(j) = G(j) + D_j < 0 at
    every edge 1 <= j <= m and > 0 at every edge m < j < 1024 (both crossings then find bin
    m strictly inside it: ``_quantiles``' estimate). D_j sums popcount(j) + 1 node noises with
    coefficients of size <= 1 and is symmetric; a union bound over the edges."""
    leaves = np.zeros(BINS, dtype=np.int64)
    leaves[:counts.size] = counts
    cdf = np.concatenate([[0], np.cumsum(leaves)])
    gap = cdf - q * cdf[-1]
    m = int(np.argmax(gap[1:] >= 0))
    assert gap[m] < 0 < gap[m + 1], "the rank must fall strictly inside one integer's rows"
    return sum(_laplace_sum_tail(abs(float(gap[j])), bin(j).count("1") + 1, scale)
               for j in range(1, BINS))


def test_median_of_an_integer_column_is_exactly_the_integer_in_most_releases() -> None:
    """Ages 17..90 of 9,999 people (a hump at 39 over a floor, as census ages), in 10
    partitions (public keys, one row per person), MEDIAN at epsilon = 1 with bounds that are
    not integers: the true median is 41 in each, with 129.5 and 168.5 people of margin on either
    side of the rank inside the 298 aged 41. ``_integer_miss_bound`` bounds the chance that a
    release is not exactly 41 by 0.002 (the tree's discrete Laplace noise of scale 11 r k /
    epsilon = 11); over 4 releases (40 trials), fewer hits than the 1e-7 binomial quantile at
    that rate (36 of 40) fail a correct implementation with probability < 1e-7 (2e-8). Each
    interval's ends are integers inside [17, 90] (or the value, where it lies outside)."""
    ages = np.arange(17, 91)
    hump = np.exp(-0.5 * ((ages - 39.25) / 12.0) ** 2)
    counts = np.round(10_000 * (0.2 / ages.size + 0.8 * hump / hump.sum())).astype(np.int64)
    one = np.repeat(ages, counts)
    assert np.median(one) == 41.0 and np.quantile(one, 0.5) == 41.0
    miss = _integer_miss_bound(counts, 0.5, 11.0)
    assert miss < 0.0025
    partitions, runs = 10, 4
    keys = [f"p{i}" for i in range(partitions)]
    frame = pd.DataFrame({"g": np.repeat(keys, one.size), "age": np.tile(one, partitions)})
    frame["uid"] = np.arange(len(frame))
    curator = Curator(frame, privacy_unit="uid", budget=dp.PureDP(100.0), cache=False,
                      bounds={"age": (16.5, 90.7)}, source=SeededRandom(31))
    hits = 0
    for _ in range(runs):
        release = curator.sql("SELECT g, MEDIAN(age) AS med FROM data GROUP BY g",
                              epsilon=1.0, keys=keys, max_partitions=1,
                              max_rows_per_partition=1)
        assert "'scale': 11.0," in release.explain()  # the bound's noise: the whole epsilon
        value = release.values["med"]
        low, high = release.interval("med", 0.95)
        assert np.all((low >= 17) & (low <= high) & (high <= 90))
        ends, values = np.concatenate([low, high]), np.concatenate([value, value])
        assert np.all((ends == np.floor(ends)) | (ends == values))  # integers, or the value
        hits += int(np.sum(value == 41.0))
    trials = partitions * runs
    threshold = binom.ppf(1e-7, trials, 1 - miss)
    assert threshold >= 0.9 * trials  # "the large majority" is what the test holds
    assert hits >= threshold, (hits, trials)


@pytest.mark.parametrize(("bounds", "spread"), [((-0.3, 20.6), 1), ((-3.5, 1021.0), 47)])
def test_quantile_intervals_of_integer_columns_cover_at_their_level(
        bounds: tuple[float, float], spread: int) -> None:
    """Integer columns, one integer per bin (21 integers; 1025, the last bin holding two):
    MEDIAN and the 0.9 and 0.1 quantiles at 95% and 80%, pure DP. The true quantile is that
    of the values clamped to the integers L..H inside the bounds; covering means the interval
    holds x_(a) and x_(b) (which the coverage proof guarantees at the level: ``_quantiles``).
    Ends are integers (or the value). Each of the 6 counts against the 1e-8 lower quantile of
    Binomial(N, level): false failure < 6e-8 per case."""
    rng = np.random.default_rng(12)
    low_int, high_int = math.ceil(bounds[0]), math.floor(bounds[1])
    sizes = [1, 2, 3, 5, 8, 13, 20, 30, 50, 80, 120, 200, 300, 500, 800, 1200, 2000, 7, 40,
             150, 600, 60]
    parts, keys = [], [f"p{i}" for i in range(len(sizes))]
    for i, size in enumerate(sizes):
        if i % 3 == 0:
            x = rng.integers(-2, 23, size) * spread  # partly outside the bounds
        elif i % 3 == 1:
            x = rng.poisson(3.0, size) * spread  # heavy ties
        else:
            x = np.full(size, 7 * spread)  # one value
        parts.append(pd.DataFrame({"g": keys[i], "x": x.astype(np.int64)}))
    frame = pd.concat(parts, ignore_index=True)
    frame["uid"] = np.arange(len(frame))
    quantiles = {"med": 0.5, "q9": 0.9, "q1": 0.1}
    ordered = {g: np.sort(np.clip(part["x"].to_numpy(), low_int, high_int))
               for g, part in frame.groupby("g")}
    curator = Curator(frame, privacy_unit="uid", budget=dp.PureDP(1e6), cache=False,
                      bounds={"x": bounds}, source=SeededRandom(32))
    levels, runs = (0.95, 0.8), 20
    covered = {(name, level): 0 for name in quantiles for level in levels}
    for _ in range(runs):
        release = curator.sql(
            "SELECT g, MEDIAN(x) AS med, QUANTILE_CONT(x, 0.9) AS q9, "
            "QUANTILE_CONT(x, 0.1) AS q1 FROM data GROUP BY g", epsilon=3.0, keys=keys)
        for level in levels:
            for name, q in quantiles.items():
                low, high = release.interval(name, level)
                value = release.values[name]
                assert np.all((low <= value) & (value <= high))
                assert np.all((low >= low_int) & (high <= high_int))
                ends, values = np.concatenate([low, high]), np.concatenate([value, value])
                assert np.all((ends == np.floor(ends)) | (ends == values))
                for i, g in enumerate(keys):
                    x = ordered[g]
                    h = q * (x.size - 1)
                    if low[i] <= x[math.floor(h)] and x[math.ceil(h)] <= high[i]:
                        covered[name, level] += 1
                        assert low[i] <= np.quantile(x, q) <= high[i]
    trials = runs * len(keys)
    for (name, level), hits in covered.items():
        assert hits >= binom.ppf(1e-8, trials, level), (name, level, hits / trials)
