"""Local differential privacy: surveys where nobody is trusted with raw answers.

Each respondent randomizes their own answer before sending it (``randomize``, or the
standard-library-only ``client.py`` on their device); the collector aggregates the reports
(``Collector``, streaming) and estimates population figures with exact variances and confidence
intervals (``estimate``). Every randomizer is epsilon-DP under ``Neighbouring.REPLACE`` of one
respondent's answer, built from exact rational parameters, and sampled from the secure source.

    >>> survey = make_randomizer("auto", 1.0, categories=["bus", "bike", "car", "walk"])
    >>> reports = survey.randomize(answers)          # on the respondents' side
    >>> survey.estimate(reports).to_json()           # on the collector's side

Mechanisms: yes/no ``BinaryResponse`` ("rr", "two-coin"); categories ``GeneralizedRR`` ("grr"),
``SymmetricUnaryEncoding`` ("sue"), ``OptimizedUnaryEncoding`` ("oue"),
``OptimizedLocalHashing`` ("olh"), ``HadamardResponse`` ("hadamard"), chosen by
``choose_mechanism``; bounded numbers ``Duchi`` ("duchi"), ``Piecewise`` ("piecewise").

The names load on first use (``dpcurator._lazy``): the randomizers pull in numpy and numba,
while ``dpcurator.local.client`` (and so ``ConfigError``) is standard library only, which
keeps ``dpcurator survey --help`` and the other commands quick to start.
"""

from typing import TYPE_CHECKING

from dpcurator._lazy import exports

if TYPE_CHECKING:
    from dpcurator.local._base import Accumulator, LocalRandomizer, ReportError
    from dpcurator.local.client import ConfigError
    from dpcurator.local.collector import BadReport, Collector
    from dpcurator.local.estimators import (
        FrequencyEstimate,
        MeanEstimate,
        RateEstimate,
        SurveyEstimate,
        project_simplex,
    )
    from dpcurator.local.frequency import (
        BinaryResponse,
        FrequencyOracle,
        GeneralizedRR,
        HadamardResponse,
        OptimizedLocalHashing,
        OptimizedUnaryEncoding,
        SymmetricUnaryEncoding,
    )
    from dpcurator.local.numeric import Duchi, NumericRandomizer, Piecewise
    from dpcurator.local.planning import (
        interval_half_width,
        plot_interval_widths,
        report_variance,
        sample_size,
    )
    from dpcurator.local.survey import (
        MECHANISMS,
        choose_mechanism,
        from_config,
        make_randomizer,
    )

__all__ = [
    "MECHANISMS",
    "Accumulator",
    "BadReport",
    "BinaryResponse",
    "Collector",
    "ConfigError",
    "Duchi",
    "FrequencyEstimate",
    "FrequencyOracle",
    "GeneralizedRR",
    "HadamardResponse",
    "LocalRandomizer",
    "MeanEstimate",
    "NumericRandomizer",
    "OptimizedLocalHashing",
    "OptimizedUnaryEncoding",
    "Piecewise",
    "RateEstimate",
    "ReportError",
    "SurveyEstimate",
    "SymmetricUnaryEncoding",
    "choose_mechanism",
    "from_config",
    "interval_half_width",
    "make_randomizer",
    "plot_interval_widths",
    "project_simplex",
    "report_variance",
    "sample_size",
]

__getattr__, __dir__ = exports(__name__, {
    **dict.fromkeys(("Accumulator", "LocalRandomizer", "ReportError"), "dpcurator.local._base"),
    "ConfigError": "dpcurator.local.client",
    **dict.fromkeys(("BadReport", "Collector"), "dpcurator.local.collector"),
    **dict.fromkeys(("FrequencyEstimate", "MeanEstimate", "RateEstimate", "SurveyEstimate",
                     "project_simplex"), "dpcurator.local.estimators"),
    **dict.fromkeys(("BinaryResponse", "FrequencyOracle", "GeneralizedRR", "HadamardResponse",
                     "OptimizedLocalHashing", "OptimizedUnaryEncoding",
                     "SymmetricUnaryEncoding"), "dpcurator.local.frequency"),
    **dict.fromkeys(("Duchi", "NumericRandomizer", "Piecewise"), "dpcurator.local.numeric"),
    **dict.fromkeys(("interval_half_width", "plot_interval_widths", "report_variance",
                     "sample_size"), "dpcurator.local.planning"),
    **dict.fromkeys(("MECHANISMS", "choose_mechanism", "from_config", "make_randomizer"),
                    "dpcurator.local.survey"),
})
