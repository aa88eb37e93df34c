"""The service's configuration: datasets, analysts, the ledger, limits (a TOML file).

    ledger = "ledger.sqlite"                 # or "postgresql://..."
    [datasets.orders]
    path = "orders.csv"                      # CSV or Parquet, relative to this file
    privacy_unit = "customer_id"
    bounds = { amount = [0, 500] }           # a column without bounds has them chosen
    keys = { region = ["north", "south"] }   # public group keys (optional)
    budget = { epsilon = 3.0, delta = 1e-6 } # for all analysts together
    share_releases = false                   # optional (see below)
    [analysts.alice]
    token_sha256 = "<hex sha-256 of alice's token>"
    budgets = { orders = { epsilon = 1.0, delta = 1e-7 } }
    [owners.olga]                            # optional: the data owner's view (dashboard)
    token_sha256 = "<hex sha-256 of olga's token>"
    audit_log = "audit.jsonl"                # default: beside the ledger (or this file)
    verify_every_s = 60.0                    # the whole ledger is verified this often
    [limits]                                 # optional; these are the defaults
    max_body_bytes = 65536
    requests_per_second = 100.0              # per analyst
    burst = 200
    address_requests_per_second = 20.0       # per client address, before authentication
    address_burst = 100

Releases are the analyst's own: an analyst asking a query another analyst already asked is
charged and answered afresh, and never learns that anyone asked it. ``share_releases = true``
lets the analysts of a dataset share its releases: a query already answered for one analyst
is answered to another with the same release, charged to that analyst's own budget (what an
analyst sees is always counted in their budget, so one whose budget is spent gets nothing)
but not again to the dataset's; the answer carries a request id of the asker's own.

The address limit counts every request from a client address that does not authenticate
(no token, a wrong one, ``/healthz``, ``/docs``) and is checked before the token is; a request
that authenticates is counted against its analyst's limit instead. The analyst's limit holds
across every worker and every service over the ledger (its buckets are kept beside it); the
address limit is each process's own (``dpcurator serve --workers N`` admits N times it).

An owner's token opens the owner's view (every dataset and analyst, the ledger's state, the
audit log) and nothing an analyst's token opens; an analyst's token opens none of it.

Tokens are never stored: only their SHA-256 (``dpcurator serve token NAME`` makes one, and
``dpcurator serve token --owner NAME`` an owner's). No two tokens may be the same. Every
problem is reported as a ``ConfigError`` naming the key and what was expected.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpcurator._validation import CONFIG_NAME
from dpcurator.accounting.guarantees import ZCDP, ApproxDP, PureDP
from dpcurator.errors import ConfigError

__all__ = ["AnalystConfig", "ConfigError", "DatasetConfig", "Limits", "OwnerConfig",
           "ServiceConfig", "load_config"]

_NAME = CONFIG_NAME
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
Total = PureDP | ApproxDP | ZCDP


@dataclass(frozen=True)
class DatasetConfig:
    name: str
    path: Path | None  # one table; or ``tables``
    privacy_unit: str | dict[str, str] | None
    one_row_per_person: bool
    bounds: dict[str, tuple[float, float] | str] | str  # "auto": chosen under DP per query
    keys: dict[str, list[Any]] | None
    budget: Total
    max_partitions: int | str | None
    max_rows_per_partition: int | str | None
    allow_large_delta: bool
    bounds_share: float | None = None  # of each query's budget, choosing its bounds
    share_releases: bool = False  # analysts of the dataset may be sent each other's releases
    tables: dict[str, Path] | None = None  # several tables, joined in queries
    public: tuple[str, ...] = ()  # of ``tables``, those holding no one's data
    bounding: str | None = None  # how the caps apply (``Plan.bounding``): "unit" caps totals

    @property
    def source(self) -> Any:
        """What the curator reads: the file, or ``{name: file}`` of several tables."""
        if self.tables is not None:
            return {name: str(path) for name, path in self.tables.items()}
        return str(self.path)


@dataclass(frozen=True)
class AnalystConfig:
    name: str
    token_sha256: str
    budgets: dict[str, Total]


@dataclass(frozen=True)
class OwnerConfig:
    """A data owner: sees every budget, the ledger's state and the audit log, asks nothing."""

    name: str
    token_sha256: str


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 65536
    requests_per_second: float = 100.0  # per analyst
    burst: int = 200
    address_requests_per_second: float = 20.0  # per client address, before authentication
    address_burst: int = 100


@dataclass(frozen=True)
class ServiceConfig:
    ledger: str
    datasets: dict[str, DatasetConfig]
    analysts: dict[str, AnalystConfig]
    limits: Limits = field(default_factory=Limits)
    audit_log: Path | None = None
    verify_every_s: float = 60.0  # the whole ledger is verified this often while serving
    owners: dict[str, OwnerConfig] = field(default_factory=dict)


def load_config(path: str | Path) -> ServiceConfig:
    """Read and check a service configuration file (paths are relative to it)."""
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"no configuration file at {file}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the configuration {file}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file} is not valid TOML: {exc}") from None
    return parse_config(data, base=file.parent)


def parse_config(data: dict[str, Any], *, base: Path) -> ServiceConfig:
    _only(data, {"ledger", "datasets", "analysts", "owners", "limits", "audit_log",
                 "verify_every_s"}, "the configuration")
    ledger = data.get("ledger", "ledger.sqlite")
    if not isinstance(ledger, str) or not ledger:
        raise ConfigError("ledger must be a file path or a postgresql:// URL")
    if not _is_url(ledger):
        ledger = str((base / ledger).resolve())
    datasets = {name: _dataset(name, spec, base)
                for name, spec in _table(data, "datasets", required=True).items()}
    analysts = {name: _analyst(name, spec, datasets)
                for name, spec in _table(data, "analysts", required=True).items()}
    owners = {name: _owner(name, spec) for name, spec in _table(data, "owners").items()}
    seen: dict[str, str] = {}
    holders = [(f"analyst {a.name!r}", a.token_sha256) for a in analysts.values()]
    holders += [(f"owner {o.name!r}", o.token_sha256) for o in owners.values()]
    for who, digest in holders:
        if digest in seen:
            raise ConfigError(f"{seen[digest]} and {who} have the same token_sha256; give "
                              "each analyst and owner a token of their own")
        seen[digest] = who
    limits = _limits(_table(data, "limits"))
    audit = data.get("audit_log")
    if audit is not None and not isinstance(audit, str):
        raise ConfigError("audit_log must be a file path")
    if audit is None:  # beside the ledger file, or beside the configuration
        audit_path = (Path(ledger).with_suffix(".audit.jsonl") if not _is_url(ledger)
                      else (base / "audit.jsonl").resolve())
    else:
        audit_path = (base / audit).resolve()
    every = data.get("verify_every_s", 60.0)
    if not _is_number(every) or not 0.05 <= every <= 86_400:
        raise ConfigError("verify_every_s must be a number of seconds from 0.05 to 86400 (how "
                          "often the whole ledger is verified while serving)")
    return ServiceConfig(ledger, datasets, analysts, limits, audit_path, float(every), owners)


def _is_url(ledger: str) -> bool:
    return ledger.startswith(("postgresql://", "postgres://"))


def _table(data: dict[str, Any], key: str, *, required: bool = False) -> dict[str, Any]:
    value = data.get(key)
    if value is None:
        if required:
            raise ConfigError(f"the configuration needs a [{key}.NAME] table")
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key} must be a table")
    return value


def _only(data: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(f"{where} has unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _dataset(name: str, spec: Any, base: Path) -> DatasetConfig:
    where = f"[datasets.{name}]"
    if not _NAME.match(name):
        raise ConfigError(f"dataset name {name!r}: use letters, digits, '_', '-' or '.'")
    if not isinstance(spec, dict):
        raise ConfigError(f"{where} must be a table")
    _only(spec, {"path", "privacy_unit", "one_row_per_person", "bounds", "keys", "budget",
                 "max_partitions", "max_rows_per_partition", "bounds_share",
                 "allow_large_delta", "share_releases", "tables", "public", "bounding"},
          where)
    bounding = spec.get("bounding")
    if bounding is not None and bounding not in ("rescale", "sample", "unit"):
        raise ConfigError(f"{where} bounding must be \"rescale\", \"sample\" or \"unit\" "
                          "(caps on each unit's total, for COUNT(*) and SUM)")
    path = spec.get("path")
    tables, public = _tables(spec, where, base)
    if tables is None and (not isinstance(path, str) or not path):
        raise ConfigError(f"{where} needs path = \"<CSV or Parquet file>\", or tables = "
                          "{ name = \"<file>\", ... } for several tables")
    if tables is not None and path is not None:
        raise ConfigError(f"{where} takes path (one table) or tables (several), not both")
    unit = spec.get("privacy_unit")
    per_person = spec.get("one_row_per_person", False)
    if tables is not None:
        if not isinstance(unit, dict) or not unit or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in unit.items()):
            raise ConfigError(f"{where} with tables needs privacy_unit = {{ table = "
                              "\"unit column\" or \"column -> table.column\", ... }} for "
                              "each private table")
        unit = {str(k): str(v) for k, v in unit.items()}
    elif unit is not None and not isinstance(unit, str):
        raise ConfigError(f"{where} privacy_unit must be a column name")
    if not isinstance(per_person, bool) or (unit is None) != per_person:
        raise ConfigError(f"{where} needs privacy_unit = \"<column>\", or the explicit "
                          "one_row_per_person = true (every row a different person)")
    bounds: dict[str, tuple[float, float] | str] | str = {}
    given = spec.get("bounds") or {}
    if given == "auto":
        bounds = "auto"
    elif not isinstance(given, dict):
        raise ConfigError(f"{where} bounds must be {{ column = [low, high] }} or \"auto\"")
    else:
        bounds = {}
        entries: list[tuple[str, Any]] = []
        for column, pair in given.items():
            if isinstance(pair, dict) and tables is not None:  # a dotted key (``orders.amount
                # = [0, 500]``) is a TOML table: table.column
                entries += [(f"{column}.{inner}", value) for inner, value in pair.items()]
            else:
                entries.append((column, pair))
        for column, pair in entries:
            if pair == "auto":
                bounds[str(column)] = "auto"
                continue
            if (not isinstance(pair, list) or len(pair) != 2
                    or not all(_is_number(v) for v in pair) or not pair[0] < pair[1]):
                raise ConfigError(f"{where} bounds.{column} must be [low, high] with low < "
                                  "high, or \"auto\"")
            bounds[str(column)] = (float(pair[0]), float(pair[1]))
    keys = spec.get("keys")
    if keys is not None:
        if (not isinstance(keys, dict) or len(keys) != 1
                or not all(isinstance(v, list) and v for v in keys.values())):
            raise ConfigError(f"{where} keys must be {{ column = [value, ...] }} (one column)")
        keys = {str(k): list(v) for k, v in keys.items()}
    return DatasetConfig(
        name=name, path=(base / str(path)).resolve() if tables is None else None,
        tables=tables, public=public, privacy_unit=unit,
        one_row_per_person=per_person, bounds=bounds, keys=keys,
        budget=_total(spec.get("budget"), f"{where} budget"),
        max_partitions=_cap(spec.get("max_partitions"), f"{where} max_partitions"),
        max_rows_per_partition=_cap(spec.get("max_rows_per_partition"),
                                    f"{where} max_rows_per_partition"),
        bounds_share=_share(spec.get("bounds_share"), f"{where} bounds_share"),
        allow_large_delta=bool(spec.get("allow_large_delta", False)),
        share_releases=_flag(spec.get("share_releases", False), f"{where} share_releases"),
        bounding=None if bounding is None else str(bounding))


def _tables(spec: dict[str, Any], where: str, base: Path
            ) -> tuple[dict[str, Path] | None, tuple[str, ...]]:
    """A dataset's several tables (``tables = { name = "file" }``) and its public ones."""
    tables, public = spec.get("tables"), spec.get("public", [])
    if tables is None:
        if public:
            raise ConfigError(f"{where} public names public tables of tables = {{...}}")
        return None, ()
    if not isinstance(tables, dict) or not tables or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in tables.items()):
        raise ConfigError(f"{where} tables must be {{ name = \"<CSV or Parquet file>\", ... }}")
    if not isinstance(public, list) or not all(isinstance(p, str) for p in public):
        raise ConfigError(f"{where} public must be a list of table names")
    return {str(k): (base / v).resolve() for k, v in tables.items()}, tuple(public)


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    return value


def _share(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if not _is_number(value) or not 0 < value < 1:
        raise ConfigError(f"{where} must be a number in (0, 1) (the share of each query's "
                          f"budget spent choosing its bounds), got {value!r}")
    return float(value)


def _analyst(name: str, spec: Any, datasets: dict[str, DatasetConfig]) -> AnalystConfig:
    where = f"[analysts.{name}]"
    if not _NAME.match(name):
        raise ConfigError(f"analyst name {name!r}: use letters, digits, '_', '-' or '.'")
    if not isinstance(spec, dict):
        raise ConfigError(f"{where} must be a table")
    _only(spec, {"token_sha256", "budgets"}, where)
    token = spec.get("token_sha256")
    if not isinstance(token, str) or not _SHA256.match(token):
        raise ConfigError(f"{where} token_sha256 must be 64 lowercase hex digits (the SHA-256 "
                          "of the analyst's token; `dpcurator serve token NAME` makes one)")
    budgets = {}
    for dataset, total in (spec.get("budgets") or {}).items():
        if dataset not in datasets:
            raise ConfigError(f"{where} budgets name the dataset {dataset!r}, which is not "
                              f"configured; datasets: {sorted(datasets)}")
        budgets[str(dataset)] = _total(total, f"{where} budgets.{dataset}")
    if not budgets:
        raise ConfigError(f"{where} needs budgets = {{ DATASET = {{ epsilon = ... }} }}")
    return AnalystConfig(name, token, budgets)


def _owner(name: str, spec: Any) -> OwnerConfig:
    where = f"[owners.{name}]"
    if not _NAME.match(name):
        raise ConfigError(f"owner name {name!r}: use letters, digits, '_', '-' or '.'")
    if not isinstance(spec, dict):
        raise ConfigError(f"{where} must be a table")
    _only(spec, {"token_sha256"}, where)
    token = spec.get("token_sha256")
    if not isinstance(token, str) or not _SHA256.match(token):
        raise ConfigError(f"{where} token_sha256 must be 64 lowercase hex digits (the SHA-256 "
                          "of the owner's token; `dpcurator serve token --owner NAME` makes one)")
    return OwnerConfig(name, token)


def _total(value: Any, where: str) -> Total:
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be {{ epsilon = E, delta = D }} or {{ rho = R }}")
    _only(value, {"epsilon", "delta", "rho"}, where)
    for key, number in value.items():
        if not _is_number(number) or not math.isfinite(float(number)) or number < 0:
            raise ConfigError(f"{where}: {key} must be a finite number >= 0")
    try:
        if "rho" in value:
            if "epsilon" in value or "delta" in value:
                raise ConfigError(f"{where}: give rho, or epsilon and delta, not both")
            return ZCDP(float(value["rho"]))
        if "epsilon" not in value:
            raise ConfigError(f"{where} needs epsilon (and delta), or rho")
        delta = float(value.get("delta", 0.0))
        return ApproxDP(float(value["epsilon"]), delta) if delta > 0 else PureDP(
            float(value["epsilon"]))
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{where}: {exc}") from None


#: The largest rate a limit takes: a bucket's refill is the seconds elapsed times the rate, and
#: PostgreSQL's double overflowed on 1e308 two seconds apart (a bug hunt: every request of
#: that analyst refused from then on, 503)
MAX_RATE = 1e6


def _limits(spec: dict[str, Any]) -> Limits:
    _only(spec, {"max_body_bytes", "requests_per_second", "burst",
                 "address_requests_per_second", "address_burst"}, "[limits]")
    default = Limits()
    rates = {}
    for key in ("requests_per_second", "address_requests_per_second"):
        rate = spec.get(key, getattr(default, key))
        if not _is_number(rate) or not 0 < rate <= MAX_RATE:
            raise ConfigError(f"[limits] {key} must be a positive number of at most "
                              f"{MAX_RATE:.0e}")
        rates[key] = float(rate)
    return Limits(
        max_body_bytes=_positive_int(spec.get("max_body_bytes", default.max_body_bytes),
                                     "[limits] max_body_bytes"),
        requests_per_second=rates["requests_per_second"],
        burst=_positive_int(spec.get("burst", default.burst), "[limits] burst"),
        address_requests_per_second=rates["address_requests_per_second"],
        address_burst=_positive_int(spec.get("address_burst", default.address_burst),
                                    "[limits] address_burst"))


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where} must be a whole number >= 1")
    return value


def _cap(value: Any, where: str) -> int | str | None:
    """A contribution cap: a whole number >= 1, or "auto" (chosen under DP per query, per
    group), or None: not given (chosen under DP per query, the bounding mode the curator's
    default: ``_resolve.default_bounding``)."""
    if value is None:
        return None
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where} must be a whole number >= 1, or \"auto\"")
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
