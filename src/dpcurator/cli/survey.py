"""``dpcurator survey``: local-DP surveys from the command line.

    dpcurator survey simulate --mechanism rr --epsilon 1 --n 10000 --true-rate 0.3 --json
    dpcurator survey simulate --mechanism oue --epsilon 1 --n 100000 \\
        --true-frequencies 0.5,0.3,0.2 --categories bus,bike,car --json
    dpcurator survey config --mechanism oue --epsilon 1 --categories bus,bike,car > survey.json
    python client.py survey.json bike >> reports.jsonl          # on each respondent's device
    dpcurator survey estimate reports.jsonl --config survey.json --json
    dpcurator survey plan --mechanism rr --epsilon 1 --margin 0.01 --figure widths.png --json

``--mechanism auto`` (the default of ``simulate`` and ``config``) chooses by the question:
a multiple-choice oracle with ``--categories``, ``--k`` or ``--true-frequencies``, a numeric
mechanism with ``--low`` or ``--high``, else randomized response (yes/no). ``--low`` and
``--high`` are refused where they would be ignored (beside categories under auto, or with a
mechanism that is not numeric).

With ``--json`` every command prints exactly one JSON object on stdout; when the input is
refused that object is ``{"error": ..., "type": ...}`` (without ``--json``, ``error: ...`` on
stderr) and the exit status is 2, as for every dpcurator command. Every number read from a
configuration or a report is bounded in size before it is used (``client.parse_number``).
Output keys:

- yes/no (rr, two-coin): ``estimate``, ``interval`` [lo, hi], ``epsilon``, ``n``;
- categories: ``estimates`` and ``intervals`` keyed by category, ``epsilon``, ``n``;
- numbers (duchi, piecewise): ``estimate``, ``interval`` (in the answers' units), ``epsilon``,
  ``n``;
- plan: ``n`` (the required number of respondents), ``margin``, ``confidence``, ``rate`` (null:
  worst case over the unknown rate), ``report_variance``, ``figure``, ``figure_epsilons`` (the
  curves drawn: 0.5, 1, 2 and the given epsilon, less those the mechanism cannot reach).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from dpcurator.cli._common import JsonErrorsGroup, emit, fail, guarded
from dpcurator.errors import DPCuratorError, UserError

# The respondent's client is standard library only: its list of mechanisms (the same as
# dpcurator.local.survey.MECHANISMS) and ConfigError are all that the help text and the
# except clauses need. The randomizers (numpy, numba) are imported by the commands.
from dpcurator.local.client import MAX_CATEGORIES, MECHANISMS, ConfigError

if TYPE_CHECKING:
    import numpy as np

    from dpcurator.local import LocalRandomizer

__all__ = ["survey_app"]

survey_app = typer.Typer(
    name="survey",
    help="Local-DP surveys: simulate, plan, configure and estimate from respondents' reports.",
    no_args_is_help=True,
    add_completion=False,
    cls=JsonErrorsGroup,
)

_MECH_HELP = (f"Mechanism: {', '.join(MECHANISMS)}, or auto (the lowest-variance one for the "
              "question: a multiple-choice one with --categories, --k or --true-frequencies; "
              "a numeric one, duchi or piecewise, with --low or --high; else rr, yes/no).")
_LOW_HELP = ("Numbers: smallest possible answer (default 0). Only for duchi and piecewise; "
             "with --mechanism auto it asks for a numeric survey.")
_HIGH_HELP = ("Numbers: largest possible answer (default 1). Only for duchi and piecewise; "
              "with --mechanism auto it asks for a numeric survey.")
_METHOD_HELP = ("Intervals: exact (Clopper-Pearson; the default for yes/no and categories) or "
                "normal (asymptotic; the default for numbers).")


class _Refused(UserError):
    """A user error to report (as JSON with --json) and exit 2."""


def _render(result: dict[str, Any]) -> None:
    for key, value in result.items():
        typer.echo(f"{key}: {value}")


def _emit(result: dict[str, Any], as_json: bool) -> None:
    emit(result, as_json, _render)


def _fail(message: str, as_json: bool) -> None:
    fail(message, as_json)


def _method(method: str | None, exact: bool) -> str | None:
    """--exact, else --method; None leaves the mechanism's default."""
    if exact and method not in (None, "exact"):
        raise _Refused("--exact contradicts --method")
    return "exact" if exact else method


def _categories(categories: str | None, k: int | None, count: int | None) -> list[Any] | None:
    """Labels from --categories, else 0..k-1 from --k (or from the frequencies' length)."""
    if categories is not None:
        labels = [c.strip() for c in categories.split(",")]
        if any(not c for c in labels):
            raise _Refused("--categories must be a comma-separated list of non-empty labels")
        if count is not None and count != len(labels):
            raise _Refused(f"--true-frequencies has {count} entries but --categories has "
                           f"{len(labels)}")
        return labels
    size = k if k is not None else count
    return None if size is None else list(range(size))


def _frequencies(text: str) -> np.ndarray[Any, np.dtype[np.float64]]:
    import numpy as np

    try:
        f = np.array([float(v) for v in text.split(",")], dtype=np.float64)
    except ValueError:
        raise _Refused("--true-frequencies must be comma-separated numbers") from None
    if f.size < 2 or not np.all(np.isfinite(f)) or np.any(f < 0) or not math.isclose(
            float(f.sum()), 1.0, abs_tol=1e-9):
        raise _Refused("--true-frequencies must be at least 2 non-negative numbers summing to 1")
    return f


def _counts(shares: np.ndarray[Any, np.dtype[np.float64]],
            n: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Largest-remainder rounding of shares * n to integers summing to n."""
    import numpy as np

    raw = shares * n
    counts = np.floor(raw).astype(np.int64)
    order = np.argsort(-(raw - counts), kind="stable")
    counts[order[: n - int(counts.sum())]] += 1
    return np.asarray(counts, dtype=np.int64)


def _result(rand: LocalRandomizer, estimate: Any) -> dict[str, Any]:
    out: dict[str, Any] = estimate.to_json()
    out["mechanism"] = rand.mechanism
    return out


def _build(mechanism: str, epsilon: float, categories: list[Any] | None, low: float | None,
           high: float | None, seed: int | None) -> LocalRandomizer:
    """The randomizer the options describe. --low/--high (a range) are refused where they
    would be ignored: with a mechanism that is not numeric, and with auto beside categories
    (auto with a range alone chooses the numeric mechanism, ``choose_numeric``)."""
    from dpcurator.local import make_randomizer
    from dpcurator.local.survey import NUMERIC
    from dpcurator.noise import SeededRandom

    ranged = low is not None or high is not None
    if ranged and mechanism == "auto" and categories is not None:
        raise _Refused("--low/--high ask for a numeric survey and --categories, --k or "
                       "--true-frequencies for a multiple-choice one: with --mechanism auto "
                       "give one of them, or name the mechanism with --mechanism")
    if ranged and mechanism in MECHANISMS and mechanism not in NUMERIC:
        raise _Refused(f"--low/--high are the range of a numeric survey "
                       f"({', '.join(NUMERIC)}); --mechanism {mechanism} has none: drop them, "
                       "or choose a numeric mechanism with --mechanism (or auto)")
    source = SeededRandom(seed) if seed is not None else None
    try:
        return make_randomizer(mechanism, epsilon, categories=categories, low=low, high=high,
                               source=source)
    except ValueError as exc:
        raise _Refused(str(exc)) from None


@survey_app.command(help="Simulate a survey: randomize a synthetic population, then estimate.")
@guarded
def simulate(
    mechanism: str = typer.Option("auto", "--mechanism", "-m", help=_MECH_HELP),
    epsilon: float = typer.Option(..., "--epsilon", "-e", help="Epsilon per respondent."),
    n: int = typer.Option(..., "--n", min=1, max=10_000_000,
                          help="Number of respondents (at most ten million)."),
    true_rate: float | None = typer.Option(
        None, "--true-rate", help="Yes/no: the true share of 'yes'. Numbers: the true mean."),
    true_frequencies: str | None = typer.Option(
        None, "--true-frequencies", help="Categories: true shares, comma-separated."),
    categories: str | None = typer.Option(None, "--categories", help="Category labels."),
    low: float | None = typer.Option(None, "--low", help=_LOW_HELP),
    high: float | None = typer.Option(None, "--high", help=_HIGH_HELP),
    confidence: float = typer.Option(0.95, "--confidence", help="Interval level."),
    method: str | None = typer.Option(None, "--method", help=_METHOD_HELP),
    exact: bool = typer.Option(False, "--exact", help="Same as --method exact."),
    project: bool = typer.Option(False, "--project", help="Project estimates (biased)."),
    seed: int | None = typer.Option(
        None, "--seed", help="INSECURE reproducible randomness, for tests and demos only."),
    reports: str | None = typer.Option(None, "--reports", help="Also write reports (JSONL)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    import numpy as np

    from dpcurator.local import NumericRandomizer
    from dpcurator.local.frequency import BinaryResponse, FrequencyOracle
    from dpcurator.local.survey import CATEGORICAL

    try:
        freqs = _frequencies(true_frequencies) if true_frequencies is not None else None
        cats = _categories(categories, None, None if freqs is None else freqs.size)
        if mechanism in CATEGORICAL and freqs is None:
            raise _Refused(f"mechanism {mechanism!r} needs --true-frequencies")
        rand = _build(mechanism, epsilon, cats, low, high, seed)
        data = np.random.default_rng(seed)  # the synthetic population (not privacy noise)
        truth: dict[str, Any]
        if isinstance(rand, FrequencyOracle):
            if freqs is None:
                raise _Refused(f"mechanism {rand.mechanism!r} needs --true-frequencies")
            counts = _counts(freqs, n)
            answers = data.permutation(np.repeat(np.arange(rand.k), counts))
            values: Any = np.asarray(rand.categories, dtype=object)[answers]
            truth = {"true_frequencies": {str(c): float(x) / n for c, x in
                                          zip(rand.categories, counts, strict=True)}}
            out = rand.randomize_indices(answers)
        elif isinstance(rand, BinaryResponse):
            if true_rate is None or not 0 <= true_rate <= 1:
                raise _Refused("a yes/no survey needs --true-rate in [0, 1]")
            yes = round(true_rate * n)
            values = data.permutation(np.arange(n) < yes)
            truth = {"true_rate": yes / n}
            out = rand.randomize(values)
        else:
            assert isinstance(rand, NumericRandomizer)
            low, high = rand.low, rand.high
            if true_rate is None or not low <= true_rate <= high:
                raise _Refused("a numeric survey needs --true-rate (the mean) in [low, high]")
            t = (true_rate - low) / (high - low)
            unit = data.beta(2 * t, 2 * (1 - t), n) if 0 < t < 1 else np.full(n, t)
            values = np.clip(low + unit * (high - low), low, high)
            truth = {"true_mean": float(values.mean())}
            out = rand.randomize(values)
        if reports is not None:
            with open(reports, "w", encoding="utf-8") as handle:
                for row in rand.report_rows(out):
                    handle.write(json.dumps(row) + "\n")
        est = rand.estimate(out, confidence=confidence, method=_method(method, exact),
                            project=project)
    except (_Refused, ValueError, DPCuratorError) as exc:
        _fail(str(exc), as_json)
        return
    result = _result(rand, est)
    result.update(truth)
    if seed is not None:
        result["warning"] = "--seed makes the randomness reproducible and INSECURE"
    _emit(result, as_json)


@survey_app.command(help="Estimate from a file of reports (JSONL, or CSV with a header).")
@guarded
def estimate(
    reports: str = typer.Argument(..., help="Reports: .jsonl (one JSON per line) or .csv."),
    mechanism: str | None = typer.Option(None, "--mechanism", "-m", help=_MECH_HELP),
    epsilon: float | None = typer.Option(None, "--epsilon", "-e", help="Epsilon per report."),
    config: str | None = typer.Option(
        None, "--config", help="The survey's configuration (instead of mechanism/epsilon)."),
    categories: str | None = typer.Option(None, "--categories", help="Category labels."),
    k: int | None = typer.Option(None, "--k", min=2, max=MAX_CATEGORIES,
                                  help="Categories 0..k-1."),
    low: float | None = typer.Option(None, "--low", help=_LOW_HELP),
    high: float | None = typer.Option(None, "--high", help=_HIGH_HELP),
    confidence: float = typer.Option(0.95, "--confidence", help="Interval level."),
    method: str | None = typer.Option(None, "--method", help=_METHOD_HELP),
    exact: bool = typer.Option(False, "--exact", help="Same as --method exact."),
    project: bool = typer.Option(False, "--project", help="Project estimates (biased)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    from dpcurator.local import Collector, from_config

    try:
        if config is not None:
            try:
                cfg = json.loads(Path(config).read_text(encoding="utf-8"))
            except (OSError, ValueError, RecursionError):  # JSON errors are ValueErrors
                raise _Refused(f"cannot read the configuration file {str(config)!r}") from None
            rand = from_config(cfg)
        else:
            if mechanism is None or epsilon is None:
                raise _Refused("give --config, or both --mechanism and --epsilon")
            if mechanism == "auto":
                raise _Refused("--mechanism auto cannot read reports: name the mechanism")
            rand = _build(mechanism, epsilon, _categories(categories, k, None), low, high, None)
        collector = Collector(rand)
        try:
            collector.read(reports)
        except OSError:
            raise _Refused(f"cannot read the reports file {str(reports)!r}") from None
        est = collector.estimate(confidence=confidence, method=_method(method, exact),
                                 project=project)
    except (_Refused, ValueError, ConfigError, DPCuratorError) as exc:
        _fail(str(exc), as_json)
        return
    result = _result(rand, est)
    summary = collector.summary()
    result["bad_reports"] = summary["bad_reports"]
    result["errors"] = summary["errors"]
    _emit(result, as_json)


@survey_app.command(help="How many respondents a target margin needs; optionally the figure.")
@guarded
def plan(
    mechanism: str = typer.Option("rr", "--mechanism", "-m", help=_MECH_HELP),
    epsilon: float = typer.Option(..., "--epsilon", "-e", help="Epsilon per respondent."),
    margin: float = typer.Option(..., "--margin", help="Target half-width of the interval."),
    confidence: float = typer.Option(0.95, "--confidence", help="Interval level."),
    rate: float | None = typer.Option(
        None, "--rate", help="Expected rate (or mean); default: worst case over all rates."),
    categories: str | None = typer.Option(None, "--categories", help="Category labels."),
    k: int | None = typer.Option(None, "--k", min=2, max=MAX_CATEGORIES,
                                  help="Number of categories."),
    low: float | None = typer.Option(None, "--low", help=_LOW_HELP),
    high: float | None = typer.Option(None, "--high", help=_HIGH_HELP),
    figure: str | None = typer.Option(
        None, "--figure", help="Save half-width vs sample size (.png or .svg)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    from dpcurator.local import (
        NumericRandomizer,
        plot_interval_widths,
        report_variance,
        sample_size,
    )
    from dpcurator.local.planning import minimum_epsilon

    try:
        cats = _categories(categories, k, None)
        rand = _build(mechanism, epsilon, cats, low, high, None)
        needed = sample_size(rand, margin, confidence, rate)
        variance = report_variance(rand, rate)
        written, curves = None, None
        span = (rand.low, rand.high) if isinstance(rand, NumericRandomizer) else (0.0, 1.0)
        if figure is not None:
            # the usual curves, less those the mechanism cannot reach (two-coin: eps > ln 2)
            curves = sorted(e for e in {0.5, 1.0, 2.0, epsilon}
                            if e > minimum_epsilon(rand.mechanism))
            written = str(plot_interval_widths(
                figure, mechanism=rand.mechanism, epsilons=curves,
                confidence=confidence, rate=rate, categories=None if cats is None else len(cats),
                low=span[0], high=span[1]))
    except (_Refused, ValueError, DPCuratorError) as exc:
        _fail(str(exc), as_json)
        return
    _emit({"n": needed, "mechanism": rand.mechanism, "epsilon": epsilon, "margin": margin,
           "confidence": confidence, "rate": rate, "worst_case": rate is None,
           "report_variance": variance, "figure": written, "figure_epsilons": curves}, as_json)


@survey_app.command(help="Print the survey configuration that respondents' client.py uses.")
@guarded
def config(
    mechanism: str = typer.Option("auto", "--mechanism", "-m", help=_MECH_HELP),
    epsilon: float = typer.Option(..., "--epsilon", "-e", help="Epsilon per respondent."),
    categories: str | None = typer.Option(None, "--categories", help="Category labels."),
    k: int | None = typer.Option(None, "--k", min=2, max=MAX_CATEGORIES,
                                  help="Categories 0..k-1."),
    low: float | None = typer.Option(None, "--low", help=_LOW_HELP),
    high: float | None = typer.Option(None, "--high", help=_HIGH_HELP),
    as_json: bool = typer.Option(True, "--json", help="Print one JSON object (always)."),
) -> None:
    try:
        rand = _build(mechanism, epsilon, _categories(categories, k, None), low, high, None)
    except (_Refused, ValueError, DPCuratorError) as exc:
        _fail(str(exc), True)
        return
    typer.echo(json.dumps(rand.config()))
