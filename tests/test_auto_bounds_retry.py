"""Bounds chosen again where the data is too thin for the first choice (``plan_retry``).

The first choice spends the bounds' share; where its thin-data count says the clamps cannot
be located, every choice is made again with ``RETRY_SHARE`` of the budget in all, taken from
the answer's part. The query is charged what it states on either path; the retry's path is
proven, before the charge, to compose within that charge (``_cost.within_charge``), and a
retry whose answer keeps the first path's epsilon is refused by that proof (the broken twin).
Seeded sources: the same draws every run, so nothing here is statistical.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
import pytest

import dpcurator as dp
from dpcurator.accounting.events import ComposedEvent
from dpcurator.curator import _auto_bounds, _auto_plan, _auto_thin, _compile
from dpcurator.curator._auto_bounds import choose_bounds
from dpcurator.curator._auto_plan import TAIL_WEIGHT, VALUES, VALUES_WEIGHT
from dpcurator.curator._cost import within_charge
from dpcurator.curator._privacy import PrivacyRequest
from dpcurator.curator._profile import Profile
from dpcurator.errors import InternalError
from dpcurator.noise import SeededRandom

WIDEST = _auto_plan.MAGNITUDES[-1]
SQL = "SELECT g, SUM(x) AS s FROM data GROUP BY g"
KEYS = list("abcdef")

def per_group(frame: Any, **options: Any) -> dp.Curator:
    """A curator whose queries keep the caps per group (``bounding="rescale"``): this file
    tests that choice, which a COUNT(*)/SUM query with public keys and no bounds would
    otherwise leave for the caps on each unit's total (``_resolve.default_bounding``)."""
    return dp.Curator.from_pandas(frame, bounding="rescale", **options)



def thin_frame(units: int = 7_000, seed: int = 8) -> pd.DataFrame:
    """One row per person, 5% of them nonzero (1 to 20, geometric), as COMPAS's juvenile
    felonies: about 300 nonzero values, too few for 10% of epsilon 1 (F about 520)."""
    rng = np.random.default_rng(seed)
    x = np.where(rng.random(units) < 0.05, np.minimum(rng.geometric(0.4, units), 20), 0)
    return pd.DataFrame({"u": np.arange(units), "g": rng.choice(KEYS, units),
                         "x": x.astype(float)})


#: a SUM's retry at the default share: half of the budget, and each path's kept count on top
#: (``kept_check``): the first's 0.1 x 0.5 / 5.25 (weights 6.5 + w, w = ``VALUES_WEIGHT``
#: + ``TAIL_WEIGHT`` the histograms', 1.25 + w of them on top), the retry's 1/2 of 6 on top
#: of its other choices' 0.5 - 0.1 x (6 + w) / 5.25 (it draws no histogram: it reads the
#: first's)
RETRY_WHOLE = 0.5 + 0.1 * 0.5 / 5.25 + \
    (0.5 - 0.1 * (6.0 + VALUES_WEIGHT + TAIL_WEIGHT) / 5.25) * 0.5 / 6.0
#: the first choice's whole part: its share, the count's 3/4, the cut count and the histograms
FIRST_WHOLE = 0.1 * (6.5 + VALUES_WEIGHT + TAIL_WEIGHT) / 5.25


def test_thin_data_is_chosen_again_with_half_of_the_budget() -> None:
    """At epsilon 1 the first count (302 nonzero values against 1.25 F, F about 520) calls
    for the retry in 11 of the first 12 seeds; the retry's F is about 4 times smaller (its
    choices have 0.4 of epsilon, not 0.1), and it chooses a clamp of 3.4 to 11.3 in 10 of them
    (the widest only where its own count is still below 1.25 F). The release says so, the
    answer's noise is that of epsilon 0.5, and the query costs exactly epsilon 1."""
    frame = thin_frame()
    again = chosen = 0
    for seed in range(12):
        curator = per_group(frame, privacy_unit="u", budget=dp.PureDP(100.0),
                                         source=SeededRandom(seed), cache=False)
        release = curator.sql(SQL, epsilon=1.0, keys=KEYS)
        assert curator.spent.epsilon == 1.0 and release.privacy == dp.PureDP(1.0)
        bounds = release.bounds_chosen
        assert bounds is not None
        if "first_choice" not in bounds:
            continue
        again += 1
        assert bounds["share"] == pytest.approx(RETRY_WHOLE)
        assert bounds["epsilon"] == pytest.approx(RETRY_WHOLE)
        # the first choice's share with a sum's histogram, the count's 3/4 and the cut count
        # on top
        assert bounds["first_choice"]["epsilon"] == pytest.approx(FIRST_WHOLE)
        (measure,) = release.mechanisms["s"]
        assert measure["guarantee"].startswith(f"{1 - RETRY_WHOLE:.6g}-DP")
        assert any("chosen again with 54% of the budget" in w for w in release.warnings)
        lo, hi = bounds["bounds"]["x"]
        if hi < WIDEST:
            chosen += 1
            # seeds 0 to 59: 3.4 (in 2) to 11.3, 4 to 9.5 in 57 (2^-20 to 2^40 as the
            # magnitudes: 4 to 9.5 in all 60, about the same RMSE, 21.8 against 21.3)
            assert 2**1.75 <= hi <= 16.0 and lo in (0.0, -hi), (lo, hi)
        else:
            assert any("widest" in w and "bounds_share" in w for w in release.warnings)
    assert again >= 10 and chosen >= 9, (again, chosen)


def test_explain_states_the_retry_before_the_charge() -> None:
    curator = per_group(thin_frame(), privacy_unit="u", budget=dp.PureDP(1.0))
    explained = curator.explain(SQL, epsilon=1.0, keys=KEYS)
    retry = explained["bounds_to_choose"]["if_too_thin"]
    assert retry["share"] == pytest.approx(RETRY_WHOLE)
    assert retry["answer"] == pytest.approx(1 - RETRY_WHOLE)
    first = sum(explained["bounds_to_choose"]["epsilons"].values())  # 0.1, and more on top
    assert first == pytest.approx(FIRST_WHOLE)
    assert sum(retry["epsilons"].values()) == pytest.approx(RETRY_WHOLE - first, rel=1e-9)
    # the retry reads the first choice's histogram: it draws none of its own
    assert "values" in explained["bounds_to_choose"]["epsilons"]
    assert "values" not in retry["epsilons"]
    assert curator.spent.epsilon == 0.0
    at_small = curator.explain(SQL, epsilon=0.1, keys=KEYS)
    assert any("chosen again with 54% of the budget" in w for w in at_small["warnings"])


def _compiled(sql: str, request: PrivacyRequest, **options: object
              ) -> _compile.CompiledQuery:
    """The query compiled as ``Curator.sql`` compiles it (nothing charged or read)."""
    curator = per_group(thin_frame(500), privacy_unit="u",
                                     budget=dp.ZCDP(10.0) if request.rho else dp.PureDP(10.0))
    plan = curator.parse(sql, **options)  # type: ignore[arg-type]
    resolved = curator.resolve(plan, epsilon=request.epsilon, delta=request.delta or None,
                               rho=request.rho, noise=request.noise)
    return curator.prepare(resolved).compiled


@pytest.mark.parametrize("aggregate", ["SUM", "AVG"])
def test_the_retry_reads_the_first_choices_histogram(aggregate: str) -> None:
    """A row cap aimed by a histogram (``value_factors``): the first choice pays for it, the
    retry reads it (``Aim``) and draws none, so its other choices share what a second one
    would have cost; a mean's retry still reads both halves (``AutoPlan.means``). Without
    the first's histogram the retry's choice refuses to run rather than aim at the fixed
    factors unseen."""
    compiled = _compiled(f"SELECT g, {aggregate}(x) AS s FROM data GROUP BY g",
                         PrivacyRequest(epsilon=1.0), keys=KEYS)
    first, retry = compiled.auto, compiled.retry
    assert first is not None and retry is not None
    assert VALUES in first.epsilons and VALUES not in retry.epsilons
    assert retry.values_share == 0.0 and first.values_share > 0.0
    assert first.means == retry.means == (aggregate == "AVG")
    with pytest.raises(InternalError, match="histogram that was not drawn"):
        choose_bounds(retry, compiled.plan, Profile([]), retry.auto.columns, SeededRandom(0),
                      again=True)


def test_no_retry_where_its_path_would_cost_more_in_rho() -> None:
    """(epsilon, delta) with Gaussian noise: the answer's rho at (0.9, 1e-6) is small (about
    0.02) and the retry's pure choices at 0.4 cost epsilon^2 / 2 each, so priced in rho (a
    zCDP budget) the retry's path would cost more than the path charged (0.054 against
    0.023): ``within_charge`` refuses it, and the widest clamps stay the rule."""
    compiled = _compiled(SQL, PrivacyRequest(epsilon=1.0, delta=1e-6, noise="gaussian"),
                         keys=KEYS)
    assert compiled.auto is not None and compiled.retry is None


@pytest.mark.parametrize("request_", [
    PrivacyRequest(epsilon=1.0), PrivacyRequest(rho=0.5), PrivacyRequest(epsilon=0.01),
    PrivacyRequest(rho=1e-4), PrivacyRequest(epsilon=10.0)])
def test_the_retrys_path_composes_within_the_charge(request_: PrivacyRequest) -> None:
    """Pure DP and zCDP, small and large: the retry exists, and its path (the first choices,
    the retry's and its answer) composes within the request and, priced in rho, costs no
    more than the path the query is charged for. The broken twin: a retry whose answer keeps
    the first answer's request spends more than the charge, and the proof refuses it."""
    compiled = _compiled(SQL, request_, keys=KEYS)
    first, retry = compiled.auto, compiled.retry
    assert first is not None and retry is not None and compiled.retry_candidates is not None
    whole = request_.rho if request_.rho is not None else request_.epsilon
    main = retry.request.rho if retry.request.rho is not None else retry.request.epsilon
    # half of the budget in all for the bounds, and each path's kept count on top of it
    # (``kept_check``)
    assert retry.share == pytest.approx(0.5 + first.kept_share + retry.kept_share, rel=1e-9)
    assert 0.0 < first.kept_share < retry.kept_share < 0.05
    assert main == pytest.approx((1.0 - retry.share) * whole, rel=1e-9)
    assert main <= (1.0 - retry.share) * whole * (1 + 1e-12)
    assert first.spent + retry.spent + main <= whole
    choices = list(compiled.events[:len(first.epsilons)])
    _, retry_choices = _auto_plan.plan_retry(compiled.plan, first) or (None, [])
    # the retry's answer: any of its proven candidates (the events do not depend on bounds)
    answer = next(iter(compiled.retry_candidates.frontier.values()))
    path = ComposedEvent((*choices, *retry_choices, *answer.events))
    # the twin: the retry's choices on top of the first answer, unreduced
    assert within_charge(ComposedEvent((*choices, *retry_choices)), retry.request, path,
                         compiled.event, request_)
    assert not within_charge(ComposedEvent((*choices, *retry_choices)), first.request, path,
                             compiled.event, request_)


def test_no_retry_where_it_cannot_do_better_or_would_choose_other_caps() -> None:
    """No retry where the first choices already have half of what it would spend (a
    bounds_share of 0.3: the retry's 0.5 in all would give its choices less than the first's),
    where nothing is chosen (a COUNT with its caps given; with its caps chosen it has a
    retry, ``caps_thin_rule``), or where the total intervals' outer caps are chosen too
    (their choice is not repeated)."""
    request = PrivacyRequest(epsilon=1.0)
    assert _compiled(SQL, request, keys=KEYS).retry is not None
    assert _compiled(SQL, request, keys=KEYS, bounds_share=0.3).retry is None
    count = "SELECT g, COUNT(*) AS n FROM data GROUP BY g"
    assert _compiled(count, request, keys=KEYS).retry is not None
    assert _compiled(count, request, keys=KEYS, max_partitions=1,
                     max_rows_per_partition=4).retry is None
    assert _compiled(SQL, request, keys=KEYS, intervals="total").retry is None


def test_a_retry_that_would_overspend_is_not_proven(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken twin, at compile time: ``plan_retry`` giving the answer the first path's
    request (no epsilon taken from it) makes the retry's path spend more than the charge;
    ``_prove_retry`` refuses it and the query keeps the widest clamps as its rule."""
    real = _auto_plan.plan_retry

    def overspending(plan, first, remaining=1.0):  # type: ignore[no-untyped-def]
        planned = real(plan, first, remaining)
        assert planned is not None
        retry, events = planned
        return replace(retry, request=first.request), events

    monkeypatch.setattr(_compile, "plan_retry", overspending)
    compiled = _compiled(SQL, PrivacyRequest(epsilon=1.0), keys=KEYS)
    assert compiled.auto is not None and compiled.retry is None



def family_shape(number: int) -> tuple[pd.DataFrame, Any]:
    """The table of the family's shape ``number`` (``benchmarks/auto_bounds_family.py``)."""
    sys.path.insert(0, "benchmarks")
    try:
        import auto_bounds_family as family
        shape = family.family_shapes(56)[number]
        return family.shape_table(shape), shape
    finally:
        sys.path.remove("benchmarks")


def test_no_clamp_below_every_value_where_the_noise_outweighs_them() -> None:
    """The family's shape #42 (14,731 units, 20 groups, 10% of the values nonzero, all of
    them 22.9 or more) at epsilon 0.3: the noise's rate per unit's worth of values (the
    magnitude's target t) is large against the nonzero values' count N, the clamps below
    every value score max(0, N - t) and the data's about 2 F - N, so with N below F + t / 2
    the choice picked clamps near 1e-6 and answered about zero with a tight interval (4 of
    these 6 seeds before the rule). The thin rule's threshold THIN F + t / 2 gives the
    widest clamps there instead, and says so. Seeded: the same draws every run."""
    frame, shape = family_shape(42)
    least = float(frame.x[frame.x != 0].abs().min())
    keys = [f"g{i}" for i in range(shape.groups)]
    widest = 0
    for seed in range(6):
        curator = per_group(frame, privacy_unit="user", budget=dp.PureDP(100.0),
                                         source=SeededRandom(seed), cache=False)
        release = curator.sql("SELECT g, SUM(x) AS v FROM data GROUP BY g",
                              epsilon=shape.epsilon, keys=keys)
        chosen = release.bounds_chosen
        assert chosen is not None
        lo, hi = chosen["bounds"]["x"]
        assert hi >= least / 4, (seed, lo, hi)
        if hi == WIDEST:
            widest += 1
            assert any("widest" in w for w in release.warnings)
    assert widest >= 4


# -- the retry's path audited end to end ------------------------------------------------------

class _ExactCount:
    """The broken twin's thin-data count: released as it is, with no noise."""

    def __init__(self, epsilon: float, source: object = None) -> None:
        del epsilon, source

    def release(self, count: int) -> int:
        return count


AUDIT_SQL = "SELECT SUM(x) AS s FROM data"
AUDIT_EPSILON = 0.3


def _one_row_each(nonzero: int, zeros: int = 200) -> pd.DataFrame:
    """One row per unit: ``nonzero`` of them 5.0, the rest 0. With both caps given (1 and
    1), the thin-data count is exactly the nonzero units."""
    x = np.r_[np.full(nonzero, 5.0), np.zeros(zeros)]
    return pd.DataFrame({"u": np.arange(x.size), "x": x})


def _chosen_again(curator: dp.Curator, unit: bool | None = False, sql: str = AUDIT_SQL
                  ) -> str:
    """Whether the release was chosen again; ``unit``: under the caps on each unit's total
    (nothing to give: the sum's cap, or a COUNT's on the rows, is the one choice); False:
    with both per-group caps given (1 and 1); None: the per-group caps chosen too."""
    caps: dict[str, Any] = {"bounding": "unit"} if unit else {} if unit is None else {
        "max_partitions": 1, "max_rows_per_partition": 1}
    release = curator.sql(sql, epsilon=AUDIT_EPSILON, **caps)
    assert release.bounds_chosen is not None
    return "again" if "first_choice" in release.bounds_chosen else "first"


#: releases per step of the bisection (``_threshold``)
TRIES = 6


def _threshold(monkeypatch: pytest.MonkeyPatch, unit: bool | None = False,
               sql: str = AUDIT_SQL) -> int:
    """The least nonzero count whose exact (noiseless) count makes no retry: found with the
    twin's count by bisection (the retry is monotonic in the count). Above the threshold a
    release is still chosen again where its clamp collapsed below every value (the kept
    count: about 1.5% of releases near the threshold, 6 of 400 at 2,040 units), so a step
    counts as above where any of ``TRIES`` releases is not chosen again; below it every one
    is. One step is misread w.p. below 0.02^6 (6.4e-11), the 15 steps below 1e-9 (one
    misread step once set the threshold 19 units high, and the twin's audit missed)."""
    monkeypatch.setattr(_auto_thin, "DiscreteLaplace", _ExactCount)
    low, high = 1, 20_000  # again at low, first at high
    while high - low > 1:
        middle = (low + high) // 2
        curator = per_group(_one_row_each(middle), privacy_unit="u",
                            budget=dp.PureDP(1e9), cache=False)
        if all(_chosen_again(curator, unit, sql) == "again" for _ in range(TRIES)):
            low = middle
        else:
            high = middle
    monkeypatch.undo()
    return high


def _audit_retry(nonzero: int, draws: int, unit: bool | None = False, sql: str = AUDIT_SQL
                 ) -> Any:
    """The auditor on whether the release was chosen again, D with ``nonzero`` units and its
    neighbour with one of them removed, every release through ``Curator.sql``."""
    from dpcurator.audit import audit_epsilon

    def sampler(units: int, seed: int) -> Any:
        curator = per_group(_one_row_each(units), privacy_unit="u",
                            budget=dp.PureDP(1e9), source=SeededRandom(seed), cache=False)
        return lambda k: np.array([_chosen_again(curator, unit, sql) for _ in range(k)],
                                  dtype=object)

    return audit_epsilon(sampler(nonzero, 1), sampler(nonzero - 1, 2), n=draws, events="set")


@pytest.mark.audit
def test_the_retry_decision_passes_the_audit_and_a_noiseless_count_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end through ``Curator.sql``: at the retry's threshold (its count exactly there,
    one row per unit, found by bisection), the neighbour without one nonzero unit is chosen
    again about as often (the count is discrete Laplace with the ``units`` choice's epsilon,
    so their odds differ by e^0.005 or so) and the audit of the whole query's epsilon 0.3
    holds. The broken twin releases the count without noise: D retries only where its clamp
    collapsed (about 1.5%) and its neighbour always does, and the audit proves epsilon above
    0.3 (at 40 test draws each, p1 >= 0.64 and p2 <= 0.36: about 0.6). Each audit is wrong
    w.p. at most 1e-7, so a correct implementation fails below 1e-6; 320 releases, about a
    minute."""
    threshold = _threshold(monkeypatch)
    assert 500 < threshold < 10_000, threshold  # epsilon 0.3's F, about 2,000
    assert not _audit_retry(threshold, 80).exceeds(AUDIT_EPSILON)
    monkeypatch.setattr(_auto_thin, "DiscreteLaplace", _ExactCount)
    assert _audit_retry(threshold, 80).exceeds(AUDIT_EPSILON)


@pytest.mark.audit
def test_the_unit_modes_retry_passes_the_audit_and_a_noiseless_count_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As above, for the caps on each unit's total (``bounding="unit"``, whose thin-data
    count ``unit_thin`` decides its retry): at its threshold (about 1,840 units at epsilon
    0.3, its count of units with a nonzero sum exactly there), the audit of the query's
    epsilon holds, and the twin whose count has no noise is caught. Wrong w.p. at most 1e-7
    each; 320 releases."""
    threshold = _threshold(monkeypatch, unit=True)
    assert 500 < threshold < 10_000, threshold
    assert not _audit_retry(threshold, 80, unit=True).exceeds(AUDIT_EPSILON)
    monkeypatch.setattr(_auto_thin, "DiscreteLaplace", _ExactCount)
    assert _audit_retry(threshold, 80, unit=True).exceeds(AUDIT_EPSILON)


@pytest.mark.audit
def test_a_count_alones_retry_passes_the_audit_and_a_noiseless_count_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As above, for a COUNT(*) alone under the caps on each unit's total, whose thin-data
    count is of the units with a row (``unit_thin`` without a sum): every unit of
    ``_one_row_each`` counts, the 200 zeros too, and the neighbour removes one. At its
    threshold the audit of the query's epsilon holds, and the twin whose count has no noise
    is caught. Wrong w.p. at most 1e-7 each; 320 releases."""
    sql = "SELECT COUNT(*) AS n FROM data"
    threshold = _threshold(monkeypatch, unit=True, sql=sql)
    assert 100 < threshold < 10_000, threshold
    assert not _audit_retry(threshold, 80, unit=True, sql=sql).exceeds(AUDIT_EPSILON)
    monkeypatch.setattr(_auto_thin, "DiscreteLaplace", _ExactCount)
    assert _audit_retry(threshold, 80, unit=True, sql=sql).exceeds(AUDIT_EPSILON)


@pytest.mark.audit
def test_caps_per_group_chosen_alones_retry_passes_the_audit_and_a_noiseless_count_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As above, for a COUNT(*) whose caps per group are chosen with no clamp beside them
    (``caps_thin_rule``: its count is of the units, every one of ``_one_row_each``'s, the
    zeros too; the neighbour removes one). At its threshold the audit of the query's epsilon
    holds, and the twin whose count has no noise is caught. Wrong w.p. at most 1e-7 each;
    320 releases."""
    sql = "SELECT COUNT(*) AS n FROM data"
    threshold = _threshold(monkeypatch, unit=None, sql=sql)
    assert 500 < threshold < 10_000, threshold  # epsilon 0.3: about 1,290 units
    assert not _audit_retry(threshold, 80, unit=None, sql=sql).exceeds(AUDIT_EPSILON)
    monkeypatch.setattr(_auto_thin, "DiscreteLaplace", _ExactCount)
    assert _audit_retry(threshold, 80, unit=None, sql=sql).exceeds(AUDIT_EPSILON)


def _honest(release: Any, truth: pd.Series, name: str, within: float) -> None:
    """Each released value within ``within`` of the truth and 4 of its noise's scales
    (``mechanisms``), or the widest caps said: a collapse (caps within the noise, counts at
    10% to 45% of the truth) has small caps, so a small noise, and fails; a value beyond 4
    scales of an unbiased one has probability e^-4 (Laplace). Seeded: the same draws every
    run. (A margin of ``within`` alone held only by the seeds' luck where the caps chosen are
    wide: at epsilon 0.3 and caps of k 2, r 7 the scale is 12% of the truth.)"""
    if any("the widest caps were used" in w for w in release.warnings):
        return
    # (private keys: those the selection released, none at times on such thin data)
    frame = release.to_pandas().set_index(release.to_pandas().columns[0])
    scale = max(float(m["scale"]) for m in release.mechanisms[name])
    for g, row in frame.iterrows():
        assert abs(row[name] - truth[g]) <= within * truth[g] + 4.0 * scale, \
            (frame, release.bounds_chosen)


def test_caps_per_group_chosen_alone_on_thin_data_choose_again_or_use_the_widest() -> None:
    """A COUNT(*) per group with private keys, 600 and 300 units of 10 rows at epsilon 0.3:
    its caps per group were chosen within the noise (r of 1 or 2) and the counts came out at
    10% to 45% of the truth with intervals about the capped counts (a bug hunt). A noisy count
    of the units now decides (``caps_thin_rule``): below its threshold the caps are chosen
    again with half the budget, and a second noisy count, of the units those caps cut, keeps
    them (each count then within 25% of the truth and 4 noise scales: ``_honest``) or uses the
    widest caps (whose selection releases no key at this epsilon), said. 300 units of one
    row keep the caps of one row. Seeded: the same draws every run."""
    rng = np.random.default_rng(1)
    sql = "SELECT g, COUNT(*) AS n FROM data GROUP BY g"
    for units in (600, 300):
        df = pd.DataFrame({"user": np.repeat(np.arange(units), 10)})
        df["g"] = rng.choice(["a", "b"], len(df))
        truth = df.groupby("g").size()
        for seed in range(4):
            cur = dp.Curator.from_pandas(df, privacy_unit="user", source=SeededRandom(seed),
                                         budget=dp.ApproxDP(10.0, 1e-3), cache=False)
            release = cur.sql(sql, epsilon=0.3, delta=1e-6)
            assert any("chosen again" in w for w in release.warnings), release.warnings
            _honest(release, truth, "n", 0.25)
            if units == 600:  # an answer, not only the honest refusals
                assert len(release.to_pandas()) == 2
    # one row per unit: the first count (the units) cannot tell these 300 from the above, so
    # they are chosen again too; the second counts the units the caps of one row cut (none),
    # and keeps them, which are right
    df = pd.DataFrame({"user": np.arange(300), "g": rng.choice(["a", "b"], 300)})
    truth = df.groupby("g").size()
    for seed in range(3):
        cur = dp.Curator.from_pandas(df, privacy_unit="user", source=SeededRandom(seed),
                                     budget=dp.ApproxDP(10.0, 1e-3), cache=False)
        release = cur.sql(sql, epsilon=1.0, delta=1e-6)
        assert release.bounds_chosen["max_rows_per_partition"] == 1
        assert not any("widest" in w for w in release.warnings)
        _honest(release, truth, "n", 0.2)  # the noise's scale is about 3% of the truth


def test_caps_chosen_again_are_checked_by_the_units_they_cut() -> None:
    """Two cases of a bug hunt where the retry's check (then of the units beyond the lowest
    caps) kept collapsed caps: with ``max_partitions=20`` given, that count weighed each unit
    1 / 20 and saw 15 of 300; and a SUM with its bounds given over 20 public keys, where the
    caps' target (about 460 units) was above the data's 300, kept caps of 1 row, answers at
    7-11% of the truth with intervals that missed it in 100 of 100 partitions. The check now
    counts the units the caps chosen again cut (each pair 1 / P): every release is within 40%
    of the truth, or says it used the widest caps. Seeded."""
    rng = np.random.default_rng(5)
    df = pd.DataFrame({"user": np.repeat(np.arange(300), 10), "g": "a"})
    truth = df.groupby("g").size()
    for seed in range(4):
        cur = per_group(df, privacy_unit="user", budget=dp.PureDP(100.0),
                        source=SeededRandom(seed), cache=False)
        release = cur.sql("SELECT g, COUNT(*) AS n FROM data GROUP BY g", epsilon=0.3,
                          keys=["a"], max_partitions=20)
        _honest(release, truth, "n", 0.4)
    unit = np.arange(300)
    df = pd.DataFrame({"user": np.repeat(unit, 10),
                       "g": np.repeat(rng.integers(0, 20, 300), 10).astype(str),
                       "x": rng.uniform(10.0, 90.0, 3000)})
    truth = df.groupby("g")["x"].sum()
    for seed in range(4):
        cur = per_group(df, privacy_unit="user", budget=dp.PureDP(100.0),
                        source=SeededRandom(seed), cache=False)
        release = cur.sql("SELECT g, SUM(x) AS s FROM data GROUP BY g", epsilon=0.3,
                          keys=sorted(truth.index), bounds={"x": (0.0, 100.0)})
        _honest(release, truth, "s", 0.4)


def test_the_thin_data_rule_reads_every_clamped_column() -> None:
    """AVG(x), AVG(y) over 20,000 units, y present on about 600 of them: the thin-data count
    read x alone, and y's clamp collapsed to about 2e-6 (an answer of 2e-6 with a zero-width
    interval where the truth is 80, nothing said; with y first it was seen: a bug hunt). The
    count is now the least over the columns clamped, so either order is chosen again (or
    gets the widest clamps), says so, and the interval covers y's mean. Seeded; at the
    intervals' confidence of 1 - 1e-6 a correct release misses one of its four with
    probability about 4e-6 (at 95%, about 19%: seed 0 missed once when the retry stopped
    drawing a histogram of its own and the noise's stream moved)."""
    rng = np.random.default_rng(3)
    n = 20_000
    y = np.where(rng.random(n) < 0.97, np.nan, rng.normal(80.0, 10.0, n))
    df = pd.DataFrame({"user": np.arange(n), "g": rng.choice(["a", "b"], n),
                       "x": rng.normal(50.0, 10.0, n), "y": y})
    truth = df.groupby("g")["y"].mean()
    for select in ("AVG(x) AS mx, AVG(y) AS my", "AVG(y) AS my, AVG(x) AS mx"):
        cur = dp.Curator.from_pandas(df, privacy_unit="user", budget=dp.PureDP(10.0),
                                     source=SeededRandom(0), cache=False)
        release = cur.sql(f"SELECT g, {select} FROM data GROUP BY g", epsilon=1.0,
                          keys=["a", "b"])
        assert release.warnings
        frame = release.to_pandas(intervals=True, confidence=1 - 1e-6).set_index("g")
        for g in ("a", "b"):
            assert frame.loc[g, "my_low"] <= truth[g] <= frame.loc[g, "my_high"], frame


def test_a_floor_chosen_where_it_cannot_see_a_tail_says_so() -> None:
    """VARIANCE of N(50, 15) over 20,000 units: the clamp's floor (about 19) raises the
    lowest 2% of the values, the variance falls below the truth with a tight interval, and
    nothing was said (a bug hunt). The floor's own choice cannot see a tail of fewer than
    about its F (2,500 units at epsilon 1); below 20 F units' worth of values the release now
    says so, as the clamps' thin-data warning does for theirs. With the bounds given,
    nothing is said. Seeded."""
    rng = np.random.default_rng(7)
    n = 20_000
    df = pd.DataFrame({"user": np.arange(n), "g": rng.choice(["a", "b"], n),
                       "x": rng.normal(50.0, 15.0, n)})
    cur = dp.Curator.from_pandas(df, privacy_unit="user", budget=dp.PureDP(10.0),
                                 source=SeededRandom(0), cache=False)
    sql = "SELECT g, VARIANCE(x) AS v FROM data GROUP BY g"
    release = cur.sql(sql, epsilon=1.0, keys=["a", "b"])
    lo, _ = release.bounds_chosen["bounds"]["x"]
    assert lo > 0.0
    assert any("narrowed on one side" in w and "moved to it unseen" in w
               for w in release.warnings)
    given = cur.sql(sql, epsilon=1.0, keys=["a", "b"], bounds={"x": (-50.0, 150.0)},
                    max_partitions=1, max_rows_per_partition=1)
    assert not any("narrowed" in w for w in given.warnings)


def test_caps_per_group_chosen_alone_say_how_many_units_they_need() -> None:
    """A COUNT(*) per group with private keys chooses its caps per group with no clamp beside
    them, so no count checks the data's thinness: 300 units of 10 rows at epsilon 0.3 chose
    r of 1 or 2 and answered 10% to 45% of the truth with tight intervals, nothing said (a
    bug hunt). The units the choice needs are public: stated before the charge and in the
    release where they are 1,000 or more, not at epsilon 3 nor with the caps given."""
    rng = np.random.default_rng(1)
    df = pd.DataFrame({"user": np.repeat(np.arange(300), 10)})
    df["g"] = rng.choice(["a", "b"], len(df))
    cur = dp.Curator.from_pandas(df, privacy_unit="user", budget=dp.ApproxDP(10.0, 1e-3),
                                 source=SeededRandom(2), cache=False)
    sql = "SELECT g, COUNT(*) AS n FROM data GROUP BY g"
    said = "caps per group (max_partitions and max_rows_per_partition) are chosen from"
    assert any(said in w for w in cur.explain(sql, epsilon=0.3, delta=1e-6)["warnings"])
    assert any(said in w for w in cur.sql(sql, epsilon=0.3, delta=1e-6).warnings)
    assert not any(said in w for w in cur.explain(sql, epsilon=3.0, delta=1e-6)["warnings"])
    given = cur.sql(sql, epsilon=0.3, delta=1e-6, max_partitions=1, max_rows_per_partition=5)
    assert not any("caps per group" in w for w in given.warnings)


# -- the clamps' kept count (``kept_check``) ---------------------------------------------------

def _joint_at(magnitude: float) -> Any:
    """A joint choice that always lands on ``magnitude`` (the caps given: k = r = 1): the
    broken choice whose collapse the kept count must catch, or a fixed one for its audit."""
    index = _auto_plan.MAGNITUDES.index(magnitude)

    def choose(auto_plan: Any, plan: Any, stats: Any, source: Any, rows_for: Any = None,
               factors: Any = None, *, tail: Any = None) -> tuple[int, int, int]:
        del auto_plan, plan, stats, source, rows_for, factors, tail
        return 1, 1, index
    return choose


def test_a_collapsed_clamp_is_set_aside_and_a_sound_one_is_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A joint choice forced onto the lowest magnitude (2^-20, the plateau a thin-data count
    near its threshold let through in a few percent of releases: 500 units of 20 rows, AVG at
    epsilon 0.5, answered 0 within [0, 0]) keeps none of the values: the kept count (0,
    against a bound of 3 noise scales, about 30) sets the clamps aside, the choice is made
    again (collapsing there too, forced) and the widest are used, and the release says why.
    At a magnitude above every value (8, values 0.01 to 5) it keeps them all (3,000) and the
    clamp stays. Seeded (the same draws every run): a collapsed clamp's count passes its
    bound with probability e^-3 / 2, about 2.5% (seed 0 draws that: 76 against 65)."""
    frame = pd.DataFrame({"u": np.arange(3000), "x": np.linspace(0.01, 5.0, 3000)})
    sql = "SELECT AVG(x) AS m FROM data"
    monkeypatch.setattr(_auto_bounds, "choose_joint", _joint_at(_auto_plan.MAGNITUDES[0]))
    for seed in range(1, 4):
        curator = dp.Curator.from_pandas(frame, privacy_unit="u", budget=dp.PureDP(100.0),
                                         source=SeededRandom(seed), cache=False)
        release = curator.sql(sql, epsilon=3.0, max_partitions=1, max_rows_per_partition=1)
        chosen = release.bounds_chosen
        assert chosen is not None and chosen["first_choice"]["kept"] < 100, chosen
        # chosen again (the forced choice collapses there too), then the widest clamps
        assert chosen["bounds"]["x"] == (-WIDEST, WIDEST), chosen
        assert chosen["rule"] == "widest" and chosen["kept"] < 100, chosen
        assert release.warnings[0].startswith("the first choice of the clamps kept almost none "
                                              "of the values"), release.warnings
        assert any("the clamps chosen from the data kept almost none of the values" in w
                   for w in release.warnings), release.warnings
        low, high = release.interval("m", 1 - 1e-7)
        assert low[0] <= 2.5 <= high[0]  # the widest clamps' interval holds the truth
    monkeypatch.setattr(_auto_bounds, "choose_joint", _joint_at(8.0))
    for seed in range(3):
        curator = dp.Curator.from_pandas(frame, privacy_unit="u", budget=dp.PureDP(100.0),
                                         source=SeededRandom(seed), cache=False)
        release = curator.sql(sql, epsilon=3.0, max_partitions=1, max_rows_per_partition=1)
        chosen = release.bounds_chosen
        assert chosen is not None and chosen["rule"] != "widest", chosen
        assert "first_choice" not in chosen
        assert max(abs(b) for b in chosen["bounds"]["x"]) == 8.0
        assert chosen["kept"] > 2500, chosen
        assert not any("almost none" in w for w in release.warnings)


def test_thin_data_near_its_threshold_answers_no_mean_its_interval_excludes() -> None:
    """The bug hunt's shape: 500 units of 20 rows, values N(100, 20), two public keys, AVG at
    epsilon 0.5: the first count is below its threshold, and the retry's, just above its
    own, kept a clamp drawn near zero in 8 of 200 seeded releases (answers 0 within [0, 0],
    or 38 within [33, 38]). Now each release's interval holds the true mean, or misses it by
    less than its width (the widest clamps where the choice collapsed). Seeded: the same
    draws every run; 40 releases."""
    keys = ["a", "b"]
    for seed in range(40):
        rng = np.random.default_rng(seed)
        u = np.repeat(np.arange(500), 20)
        frame = pd.DataFrame({"u": u, "g": rng.choice(keys, u.size),
                              "v": rng.normal(100, 20, u.size)})
        truth = frame.groupby("g").v.mean().reindex(keys).to_numpy()
        curator = dp.Curator.from_pandas(frame, privacy_unit="u", budget=dp.PureDP(100.0),
                                         source=SeededRandom(seed), cache=False)
        release = curator.sql("SELECT g, AVG(v) AS m FROM data GROUP BY g", epsilon=0.5,
                              keys=keys)
        table = release.to_pandas(intervals=True)
        low, high = table.m_low.to_numpy(), table.m_high.to_numpy()
        width = high - low
        assert np.all((low - width <= truth) & (truth <= high + width)), \
            (seed, table, release.bounds_chosen)


def _kept_frame(inside: int) -> pd.DataFrame:
    """One row per unit: ``inside`` units at 1.0 (within a clamp of 4) and 3,000 at 5.0."""
    x = np.r_[np.ones(inside), np.full(3000, 5.0)]
    return pd.DataFrame({"u": np.arange(x.size), "x": x})


def _set_aside(curator: dp.Curator) -> str:
    release = curator.sql("SELECT AVG(x) AS m FROM data", epsilon=AUDIT_EPSILON,
                          max_partitions=1, max_rows_per_partition=1)
    assert release.bounds_chosen is not None
    # set aside on the first choice: chosen again
    return "aside" if "first_choice" in release.bounds_chosen else "kept"


@pytest.mark.audit
def test_the_kept_count_passes_the_audit_and_a_noiseless_count_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end through ``Curator.sql``, the joint choice fixed at a clamp of 4 (so that
    only the counts decide): at the kept count's bound (that many units at 1.0, within the
    clamp, beside 3,000 at 5.0 beyond it; the bound is public: 3 noise scales of the count),
    the neighbour without one unit at 1.0 is set aside about as often, and the audit of the
    whole query's epsilon 0.3 holds. The broken twin releases the counts without noise: D
    is always kept and its neighbour always set aside, and the audit proves epsilon above
    0.3. Each audit is wrong w.p. at most 1e-7, so a correct implementation fails below
    1e-6; 320 releases."""
    from dpcurator.audit import audit_epsilon

    monkeypatch.setattr(_auto_bounds, "choose_joint", _joint_at(4.0))
    probe = dp.Curator.from_pandas(_kept_frame(1000), privacy_unit="u", budget=dp.PureDP(1e9),
                                   cache=False)
    compiled = probe.prepare(probe.resolve(probe.parse(
        "SELECT AVG(x) AS m FROM data", max_partitions=1, max_rows_per_partition=1),
        epsilon=AUDIT_EPSILON)).compiled
    assert compiled.auto is not None
    edge = math.ceil(_auto_thin.kept_bound(compiled.auto))
    assert 300 < edge < 1000, edge  # 3 / epsilon 0.0046: about 650

    def sampler(inside: int, seed: int) -> Any:
        curator = dp.Curator.from_pandas(_kept_frame(inside), privacy_unit="u",
                                         budget=dp.PureDP(1e9), source=SeededRandom(seed),
                                         cache=False)
        return lambda k: np.array([_set_aside(curator) for _ in range(k)], dtype=object)

    def audit() -> Any:
        return audit_epsilon(sampler(edge, 1), sampler(edge - 1, 2), n=80, events="set")

    assert not audit().exceeds(AUDIT_EPSILON)
    monkeypatch.setattr(_auto_thin, "DiscreteLaplace", _ExactCount)
    assert audit().exceeds(AUDIT_EPSILON)
