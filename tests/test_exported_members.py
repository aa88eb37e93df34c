"""Every public package's ``__all__`` is exactly its public surface, and every exception class
dpcurator defines sits in the one error tree drawn in ``dpcurator.errors``.

A name added to or removed from a package's surface changes this file too: that is the point.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

import dpcurator
from dpcurator import errors

EXPORTED: dict[str, list[str]] = {
    "dpcurator": [
        "ApproxDP", "Budget", "Curator", "CuratorLike", "Neighbouring", "PureDP", "Release",
        "Schema", "ZCDP", "__version__", "accounting", "audit", "connect", "ledger", "local",
        "mechanisms", "noise",
    ],
    "dpcurator.noise": [
        "Decision", "RandomSource", "SecureRandom", "SeededRandom", "below_exp",
        "default_source", "floor_scaled_exp", "geometric_count", "interval_bounds",
        "interval_context", "resolve_source", "resolve_uniform", "sample_bernoulli",
        "sample_bernoulli_exp", "sample_discrete_gaussian", "sample_discrete_laplace",
        "sample_uniform_int",
    ],
    "dpcurator.accounting": [
        "AccountingResult", "ApproxDP", "GDP", "Guarantee", "KeepRule", "LossPicture",
        "Neighbouring", "PLD", "PosteriorBounds", "PrivacyLossPmf", "PrivacyLossProfile",
        "ProbabilisticDP", "PureDP", "RDP", "RDPAccountant", "ThresholdedHistogram", "ZCDP",
        "account", "composition", "conversions", "delta_adp", "delta_pdp", "dpsgd_epsilon",
        "dpsgd_event", "dpsgd_noise_multiplier", "epsilon_adp", "epsilon_pdp", "events",
        "filters", "group_privacy", "loss_profile", "pair_deltas", "pld_epsilon",
        "pld_from_event", "plot_posterior", "plot_privacy_loss", "posterior_bounds",
        "posterior_figure",
    ],
    "dpcurator.mechanisms": [
        "CountIntervals", "DiscreteGaussian", "DiscreteLaplace", "Estimate", "Exponential",
        "Gaussian", "Laplace", "Mechanism", "NameAndShame", "NoiseTails", "PermuteAndFlip",
        "RandomizedResponse", "ReportNoisyMax", "SparseVector",
    ],
    "dpcurator.ledger": [
        "AccountState", "Amount", "Budget", "Charge", "Entry", "IdempotencyConflict", "Ledger",
        "LedgerReport", "PostgresLedger", "RateBuckets", "Reservation", "SQLiteLedger",
        "StoredRequest", "fingerprint", "is_postgres_url", "mask_url", "migrate_journal",
        "open_ledger", "open_rate_buckets",
    ],
    "dpcurator.query": [
        "Aggregate", "BoundedQuery", "Bounds", "BoundsError", "Count", "CountUnits", "GroupKey",
        "HistogramSpec", "Mean", "MeasureSpec", "Plan", "PublicKeys", "Quantile", "Query",
        "QueryError", "Sum", "UnknownColumnError", "UnsupportedQueryError", "ValueSpec",
        "Variance", "bins", "column_key", "expression_key", "parse_sql", "plan_from_json",
        "plan_to_json", "public_keys", "width_bucket",
    ],
    "dpcurator.engines": [
        "ColumnKind", "DuckDBEngine", "Engine", "ExactAggregates", "LinkReport",
        "MEAN_OCTAVES", "PROFILE_STEPS", "PostgresTable", "SourceKind", "TableSet",
        "UNIT_TOTALS", "column_kind", "integer_valued", "open_engine", "open_tables",
        "register_source",
    ],
    "dpcurator.curator": ["Curator", "CuratorLike", "CuratorQuery", "PreparedQuery",
                          "PrivacyRequest", "Release", "ResolvedQuery", "Schema"],
    "dpcurator.local": [
        "Accumulator", "BadReport", "BinaryResponse", "Collector", "ConfigError", "Duchi",
        "FrequencyEstimate", "FrequencyOracle", "GeneralizedRR", "HadamardResponse",
        "LocalRandomizer", "MECHANISMS", "MeanEstimate", "NumericRandomizer",
        "OptimizedLocalHashing", "OptimizedUnaryEncoding", "Piecewise", "RateEstimate",
        "ReportError", "SurveyEstimate", "SymmetricUnaryEncoding", "choose_mechanism",
        "from_config", "interval_half_width", "make_randomizer", "plot_interval_widths",
        "project_simplex", "report_variance", "sample_size",
    ],
    "dpcurator.learn": [
        "DPDataLoader", "DPOptimizer", "DpsgdAudit", "EpochReport", "PrivacyEngine",
        "audit_dpsgd", "sample_wide_discrete_gaussian",
    ],
    "dpcurator.audit": ["AuditResult", "audit_epsilon", "audit_mechanism", "clopper_pearson"],
    "dpcurator.server": [
        "ConfigError", "RemoteCurator", "Service", "ServiceConfig", "ServiceError", "connect",
        "create_app", "load_config",
    ],
    "dpcurator.cli": ["app"],
    "dpcurator.errors": [
        "BudgetExceededError", "ConfigError", "DPCuratorError", "InternalError",
        "LedgerBusyError", "LedgerIntegrityError", "UnsupportedChargeError",
        "UnsupportedEventError", "UserError", "UserTypeError",
    ],
}

#: The optional extra a package's names need when they are first used.
NEEDS = {"dpcurator.learn": "torch", "dpcurator.server": "fastapi"}

#: Exception classes outside the tree, each with the reason.
OUTSIDE_THE_TREE: set[str] = set()  # (the body limit now reads the body before the app)


def test_every_public_package_is_pinned() -> None:
    """A new public package is added to EXPORTED (and so has an ``__all__``)."""
    packages = {"dpcurator", "dpcurator.errors"} | {
        f"dpcurator.{info.name}" for info in pkgutil.iter_modules(dpcurator.__path__)
        if info.ispkg and not info.name.startswith("_")}
    assert packages == set(EXPORTED)


@pytest.mark.parametrize("package", sorted(EXPORTED))
def test_all_is_exactly_the_public_surface(package: str) -> None:
    module = importlib.import_module(package)
    exported = list(module.__all__)
    assert sorted(exported) == sorted(EXPORTED[package])
    assert len(set(exported)) == len(exported), "a name is listed twice"
    if package in NEEDS:
        pytest.importorskip(NEEDS[package])
    for name in exported:
        assert getattr(module, name) is not None, f"{package}.{name} is listed but missing"


def _modules() -> list[ModuleType]:
    found = [dpcurator]
    for info in pkgutil.walk_packages(dpcurator.__path__, "dpcurator."):
        if info.name.endswith("__main__"):
            continue  # running it is running the command
        try:
            found.append(importlib.import_module(info.name))
        except ImportError as exc:  # an optional extra that is not installed
            if exc.name is None or exc.name.startswith("dpcurator"):
                raise
    return found


def _exception_classes() -> dict[str, type[BaseException]]:
    return {f"{module.__name__}.{name}": obj
            for module in _modules() for name, obj in vars(module).items()
            if inspect.isclass(obj) and issubclass(obj, BaseException)
            and obj.__module__ == module.__name__}


def test_every_exception_class_is_in_the_tree() -> None:
    classes = _exception_classes()
    assert "dpcurator.query.errors.QueryError" in classes  # the walk did reach the packages
    outside = {name for name, cls in classes.items() if not issubclass(cls, errors.DPCuratorError)}
    assert outside == OUTSIDE_THE_TREE


def test_the_tree_is_drawn_in_errors_docstring() -> None:
    """Every public exception class appears in the drawing of ``dpcurator.errors``."""
    doc = errors.__doc__ or ""
    for name, cls in _exception_classes().items():
        if issubclass(cls, errors.DPCuratorError) and not cls.__name__.startswith("_"):
            assert f" {cls.__name__}" in doc, f"{name} is missing from errors.py's tree"


def test_user_errors_keep_the_builtin_bases() -> None:
    assert issubclass(errors.UserError, ValueError)
    assert issubclass(errors.UserTypeError, errors.UserError)
    assert issubclass(errors.UserTypeError, TypeError)
    assert issubclass(errors.InternalError, RuntimeError)
    assert not issubclass(errors.InternalError, errors.UserError)


def test_old_homes_name_the_tree_classes() -> None:
    from dpcurator import local, query
    from dpcurator.accounting import _pld_core
    from dpcurator.server import _config, client

    assert local.ConfigError is errors.ConfigError
    assert _config.ConfigError is errors.ConfigError
    for cls in (query.QueryError, query.BoundsError, local.ReportError,
                _pld_core.GridTooLargeError, dpcurator.ledger.IdempotencyConflict):
        assert issubclass(cls, errors.UserError)
    assert issubclass(client.RemoteError, errors.DPCuratorError)
