"""The curator service's logic, apart from HTTP: who may ask what, and reserve-first answers.

One ``Service`` holds the datasets (a ``Curator`` each, over its engine), the analysts (known by
the SHA-256 of their token), and one ledger with an account per dataset (the global budget, so
that colluding analysts together cannot exceed it) and one per analyst and dataset.

A query goes through these stages, and nothing is read before the charge is committed:

    resolve   the DP SQL, parsed by the dataset's curator, with the dataset's defaults and
              the privacy asked (400 if wrong)
    replay    the same release made before for the same analyst (by this process, or found
              in the ledger's stored releases by the query's fingerprint: made by another
              worker, another service over the same ledger, or before a restart): returned
              free, ``cached``
              (with ``share_releases``, one made for another analyst of the dataset:
              charged to the asker's own budget only, under a request id of the asker's own)
    prepare   the curator compiles, prices and checks it against the table's types (400 if
              wrong); the service asks it for the price in each account's composition
    reserve   one ledger transaction debits the analyst's and the dataset's accounts and
              records the request (403 ``budget_exhausted`` if either does not fit; a retry
              with the same Idempotency-Key finds the request instead of paying again)
    answer    the engine runs and noise is added
    store     the release is stored under the request, once; only the stored one is sent

A failure after ``reserve`` keeps the charge and sends nothing that was not stored; a retry with
the same key then completes the request (its charge already covers exactly one release).

The service keeps only what is its own: who asks (tokens), limits, the audit log, the
reservation in its ledger and the stored releases. Parsing, pricing and describing the noise
(each mechanism's own ``error_95``) are the curator's (``Curator.parse``, ``prepare``,
``cost_in``, ``describe``), through its public surface only.

Releases made are remembered per analyst (``_releases``: a bounded cache in front of the
ledger's stored releases, which every process of a service reads): an analyst gets their own
earlier release again for free, never another analyst's, and never learns that another
analyst asked the same (``cached`` and ``query_id`` are the asker's own). The datasets'
curators run with ``cache=False``: their cache is one per dataset, shared by every analyst,
so it must not answer here. A dataset configured with ``share_releases = true`` also keeps
a cache per dataset, read only through a charge to the asker's own budget (see ``_config``).

While it serves, the service verifies the whole ledger (chain and requests) every
``verify_every_s`` seconds on a connection of its own (``health`` says when it last did, and
what failed); the ledger itself re-checks what each charge reads. Once either finds the
ledger does not verify, every query is refused (503 ``ledger_unavailable``), nothing charged.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from dpcurator.accounting import ZCDP, ApproxDP, PureDP
from dpcurator.accounting.filters import FilterRule, encode_cost
from dpcurator.curator import Curator, PreparedQuery, ResolvedQuery
from dpcurator.errors import (
    BudgetExceededError,
    DPCuratorError,
    InternalError,
    LedgerBusyError,
    LedgerIntegrityError,
    UserError,
)
from dpcurator.ledger import (
    AccountState,
    Budget,
    IdempotencyConflict,
    Ledger,
    open_rate_buckets,
)
from dpcurator.noise import RandomSource
from dpcurator.query import plan_from_json, public_keys
from dpcurator.query.plan import DEFAULT_AUTO_SHARE, Plan

from ._config import AnalystConfig, DatasetConfig, OwnerConfig, ServiceConfig
from ._releases import Kept, Releases, query_fingerprint

__all__ = ["QueryBody", "Service", "ServiceError", "account_view"]

_log = logging.getLogger("dpcurator.server")

T = TypeVar("T")
Price = PureDP | ApproxDP | ZCDP  # what a query is charged (``Curator.cost_in``)
_MAX_SQL = 20_000
PAGE = 50  # history and ledger pages: the default size ...
MAX_PAGE = 500  # ... and the largest (a page is read alone, however long the history)


class ServiceError(DPCuratorError):
    """A refusal with its HTTP status and error type; the message never holds a record."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


@dataclass(frozen=True)
class QueryBody:
    """What an analyst sends (after the HTTP layer checked the JSON's shape): DP SQL text,
    or the builder's plan as JSON (``dpcurator.query.plan_to_json``)."""

    sql: str | None
    epsilon: float | None = None
    delta: float | None = None
    rho: float | None = None
    noise: str | None = None
    confidence: float | None = None
    keys: tuple[Any, ...] | None = None
    plan: str | None = None  # the plan's JSON text, canonical (sorted keys)
    intervals: str | None = None  # "bounded" or "total" (None: the curator's default)
    total_share: float | None = None  # of the query's budget, for total intervals
    bounding: str | None = None  # "rescale", "sample" or "unit" (None: the curator's default)

    @property
    def text(self) -> str:
        """What the audit log and the ledger's label show of the query."""
        return self.sql if self.sql is not None else f"plan {self.plan}"


@dataclass
class _Dataset:
    config: DatasetConfig
    curator: Curator
    account: str
    parse: Callable[..., Plan]  # the curator's parse, remembered (plans are frozen)


class _Limiter:
    """A token bucket per key, in this process (a client address, before authentication):
    ``rate`` requests a second, up to ``burst`` at once. At most ``keys`` buckets are kept
    (the least recently used is forgotten first: a forgotten key starts full again)."""

    def __init__(self, rate: float, burst: int, keys: int = 100_000) -> None:
        self.rate, self.burst, self.keys = rate, burst, keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, who: str) -> bool:
        now = time.monotonic()
        with self._lock:
            tokens, then = self._buckets.pop(who, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - then) * self.rate)
            taken = tokens >= 1
            self._buckets[who] = (tokens - 1 if taken else tokens, now)
            while len(self._buckets) > self.keys:
                self._buckets.popitem(last=False)
            return taken

    def give_back(self, who: str) -> None:
        """Return a token taken by ``take`` (the request turned out not to count here)."""
        with self._lock:
            found = self._buckets.get(who)
            if found is not None:
                self._buckets[who] = (min(float(self.burst), found[0] + 1), found[1])


# The longest text each audit field keeps (characters; longer ones are cut and marked), so
# that no request writes more than a few KB to the log, whatever it sent.
_AUDIT_LIMITS = {"sql": 1000, "path": 256, "dataset": 64, "analyst": 64, "client": 64,
                 "error": 64, "query_id": 64, "method": 16, "action": 32}
_AUDIT_DEFAULT_LIMIT = 128


def _clip(value: Any, limit: int) -> Any:
    if isinstance(value, str):
        return value if len(value) <= limit else f"{value[:limit]}...[{len(value)} chars]"
    if isinstance(value, dict):
        return {_clip(str(k), 32): _clip(v, _AUDIT_DEFAULT_LIMIT)
                for k, v in list(value.items())[:16]}
    if isinstance(value, list | tuple):
        return [_clip(v, _AUDIT_DEFAULT_LIMIT) for v in value[:16]]
    if value is None or isinstance(value, bool | int | float):
        return value
    return _clip(str(value), _AUDIT_DEFAULT_LIMIT)


class _AuditLog:
    """Append-only JSON lines: who asked what, the outcome and what it cost (never data).

    One line per request, whatever its outcome (401, 429 and GETs included); every field is
    cut to its bound (``_AUDIT_LIMITS``), so a line stays a few KB at most."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fd: int | None = None
        if path is not None:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def write(self, **record: Any) -> None:
        if self._fd is None:
            return
        record = {"time": time.time(), **{
            key: _clip(value, _AUDIT_LIMITS.get(key, _AUDIT_DEFAULT_LIMIT))
            for key, value in list(record.items())[:32] if value is not None}}
        line = (json.dumps(record, default=str, allow_nan=False) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class _Verifier:
    """Verifies the whole ledger every ``every`` seconds, on a connection of its own (so the
    serving connection is never held up), and keeps what it found; a failure is passed to
    the serving ledger, which then refuses every charge."""

    def __init__(self, target: str, serving: Ledger, every: float) -> None:
        self.target, self.serving, self.every = target, serving, every
        self.last_verified: float | None = time.time()  # the serving ledger verified at open
        self.entries: int | None = None
        self.failure: str | None = None
        self.failed_at: float | None = None
        self._ledger: Ledger | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dpcurator-ledger-verifier",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.verify_now()

    def verify_now(self) -> None:
        """One verification of the whole ledger (chain, head, requests)."""
        from dpcurator.ledger import open_ledger

        with self._lock:
            if self.failure is not None or self._stop.is_set():
                return
            try:
                if self._ledger is None:
                    self._ledger = open_ledger(self.target, create=False)
                report = self._ledger.verify()
            except LedgerIntegrityError as exc:
                self.failure, self.failed_at = str(exc), time.time()
                self.serving.refuse(str(exc))
                _log.error("the ledger does not verify: %s", exc)
            except Exception as exc:  # the database unreachable for now: try again next time
                _log.warning("the ledger could not be verified this time: %s", exc)
                if self._ledger is not None:
                    self._ledger.close()
                    self._ledger = None
            else:
                self.last_verified, self.entries = time.time(), report.entries

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        with self._lock:
            if self._ledger is not None:
                self._ledger.close()
                self._ledger = None


class Service:
    """The curator service: datasets, analysts, one ledger; no HTTP (see ``_app``)."""

    def __init__(self, config: ServiceConfig, *, source: RandomSource | None = None) -> None:
        from dpcurator.ledger import open_ledger

        self.config = config
        self.ledger: Ledger = open_ledger(config.ledger)
        self.datasets: dict[str, _Dataset] = {}
        for name, spec in config.datasets.items():
            budget = Budget(spec.budget, ledger=self.ledger, account=f"dataset/{name}")
            curator = Curator(
                spec.source, privacy_unit=spec.privacy_unit, public=spec.public, budget=budget,
                one_row_per_person=spec.one_row_per_person, bounds=spec.bounds or None,
                max_partitions=spec.max_partitions,
                max_rows_per_partition=spec.max_rows_per_partition,
                auto_bounds_share=spec.bounds_share, bounding=spec.bounding,
                allow_large_delta=spec.allow_large_delta, source=source,
                cache=False)  # shared by all analysts: the service keeps its own, per analyst
            self.datasets[name] = _Dataset(spec, curator, budget.account,
                                           functools.lru_cache(maxsize=1024)(curator.parse))
        self._analysts = dict(config.analysts)
        for analyst in self._analysts.values():
            for dataset, total in analyst.budgets.items():
                self.ledger.open_account(self.account_of(analyst, dataset),
                                         FilterRule.make(total))
        # Per analyst (and owner): buckets beside the ledger, shared by every worker and
        # every service over it. Per client address, before authentication: this process's
        # own (a shared bucket would cost a database write for each unauthenticated request,
        # the very flood it guards against; N workers admit N times the address rate).
        self._rates = open_rate_buckets(config.ledger)
        self.addresses = _Limiter(config.limits.address_requests_per_second,
                                  config.limits.address_burst)
        self.audit = _AuditLog(config.audit_log)
        self.releases = Releases(self.ledger)
        self.verifier = _Verifier(config.ledger, self.ledger, config.verify_every_s)

    # -- who is asking -------------------------------------------------------------------------

    def authenticate(self, token: str | None) -> AnalystConfig:
        """The analyst whose token this is (compared in constant time), or 401."""
        if token:
            digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
            found = None
            for analyst in self._analysts.values():
                if hmac.compare_digest(digest, analyst.token_sha256):
                    found = analyst
            if found is not None:
                return found
        raise ServiceError(401, "unauthorized", "a valid bearer token is required")

    def authenticate_owner(self, token: str | None) -> OwnerConfig:
        """The owner whose token this is (compared in constant time), or 401: an analyst's
        token is not an owner's."""
        if token:
            digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
            found = None
            for owner in self.config.owners.values():
                if hmac.compare_digest(digest, owner.token_sha256):
                    found = owner
            if found is not None:
                return found
        raise ServiceError(401, "unauthorized", "a valid owner's bearer token is required")

    def admit(self, who: AnalystConfig | OwnerConfig) -> None:
        """Rate limit per analyst, or per owner (429)."""
        key = who.name if isinstance(who, AnalystConfig) else f"owner/{who.name}"
        limits = self.config.limits
        try:
            admitted = self._rates.take(key, rate=limits.requests_per_second,
                                        burst=limits.burst)
        except DPCuratorError as exc:
            _log.error("the rate limits cannot be read: %s", exc)
            raise ServiceError(503, "rate_limits_unavailable", "the rate limits cannot be "
                               "read just now; nothing was charged, try again") from None
        if not admitted:
            raise ServiceError(429, "rate_limited", "too many requests; slow down and retry")

    def dataset(self, analyst: AnalystConfig, name: str) -> _Dataset:
        """A dataset the analyst has a budget on; any other name is 404, as if it did not
        exist (an analyst learns nothing of the datasets of others)."""
        found = self.datasets.get(name)
        if found is None or name not in analyst.budgets:
            raise ServiceError(404, "not_found", f"no dataset {name!r}")
        return found

    @staticmethod
    def account_of(analyst: AnalystConfig, dataset: str) -> str:
        return f"analyst/{analyst.name}/{dataset}"

    # -- asking --------------------------------------------------------------------------------

    def cached_answer(self, analyst: AnalystConfig, name: str, body: QueryBody,
                      idempotency_key: str | None = None) -> dict[str, Any] | None:
        """The fast path: a release already made for the same query, sent again for free.

        No engine, no database, no lock held by a writer: cheap enough to run on the event
        loop. None when the full path (``query``) is needed: no such release, or a request
        that carries an idempotency key (which the ledger must record).
        """
        if idempotency_key is not None:
            return None
        data = self.dataset(analyst, name)
        self._check_ledger()
        resolved = self._resolve(data, body)
        hit = self.releases.own(analyst.name, name, resolved, in_ledger=False)
        if hit is None:
            return None
        return self._response(analyst, name, hit[0], hit[1], cached=True)

    def query(self, analyst: AnalystConfig, name: str, body: QueryBody,
              idempotency_key: str | None = None) -> dict[str, Any]:
        """Answer a query: reserve first, answer, store, send (see the module docstring)."""
        data = self.dataset(analyst, name)
        self._check_ledger()
        resolved = self._resolve(data, body)
        share = data.config.share_releases
        try:  # made before for this analyst, by this process or any other: free
            hit = self.releases.own(analyst.name, name, resolved, in_ledger=True)
            shared = self.releases.anyones(name, resolved) if hit is None and share else None
        except LedgerIntegrityError:
            raise _ledger_unavailable() from None
        if hit is not None and idempotency_key is None:
            return self._response(analyst, name, hit[0], hit[1], cached=True)
        prepared: PreparedQuery | None = None
        costs: dict[str, Price] = {}
        reserve = functools.partial(
            self.ledger.reserve, analyst=analyst.name, dataset=name,
            fingerprint=query_fingerprint(name, resolved),
            label=f"{analyst.name}: {body.text}"[:2000], idempotency_key=idempotency_key)
        try:
            if hit is not None:  # free: the key is recorded with the release already made
                reservation = reserve([], release=json.dumps(hit[1], allow_nan=False))
            elif shared is not None:  # another analyst's release: charged to the asker only
                prepared = _user(lambda: data.curator.prepare(resolved))
                mine = self.account_of(analyst, name)
                answer = shared.at(resolved.level)
                reservation = reserve([(mine, self._cost_in(data, prepared, mine))],
                                      release=json.dumps(answer, allow_nan=False))
                if not reservation.replayed:
                    self.releases.remember(analyst.name, name, resolved,
                                           reservation.request.id, shared, shared=False)
            else:
                prepared = _user(lambda: data.curator.prepare(resolved))
                costs = self._costs(analyst, data, prepared)
                reservation = reserve(list(costs.items()))
        except BudgetExceededError as exc:
            raise ServiceError(403, "budget_exhausted", str(exc)) from None
        except IdempotencyConflict as exc:
            raise ServiceError(409, "idempotency_conflict", str(exc)) from None
        except LedgerIntegrityError:
            raise _ledger_unavailable() from None
        except LedgerBusyError:
            raise  # 503, nothing charged (the app's handler)
        except UserError as exc:  # the ledger refused to record the request (the query's own
            _log.warning("the ledger refused a request: %s", exc)  # errors are ServiceErrors)
            raise ServiceError(400, "ledger_refused", "the budget ledger cannot record this "
                               "request (its text may hold a character the ledger's database "
                               "cannot store, such as NUL); nothing was charged") from None
        request = reservation.request
        if request.release is not None:  # a retry of an answered request, or a free one
            return self._response(analyst, name, request.id, json.loads(request.release),
                                  cached=True)
        # Charged, not yet answered: this request, or one that a failure interrupted (its
        # charge covers exactly one release, and none was sent).
        if prepared is None:
            prepared = _user(lambda: data.curator.prepare(resolved))
        # What the release states it cost: the dataset's charge (the curator's own price).
        privacy = costs[data.account] if costs else self._cost_in(data, prepared, data.account)
        release = data.curator.answer(prepared, privacy)
        ours = json.dumps(release.to_dict(resolved.level), allow_nan=False)
        try:
            stored = self.ledger.store_release(request.id, ours)
        except LedgerIntegrityError:
            raise _ledger_unavailable() from None
        if stored == ours:  # another worker may have stored first: remember only what was sent
            self.releases.remember(analyst.name, name, resolved, request.id,
                                   Kept(release, None, resolved.level), shared=share)
        return self._response(analyst, name, request.id, json.loads(stored),
                              cached=reservation.replayed)

    def _check_ledger(self) -> None:
        """Refuse (503) once the ledger was found not to verify, by any check."""
        if self.ledger.integrity_failure is not None:
            raise _ledger_unavailable()

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Whether the ledger is readable and verifies, and when it was last verified whole
        (Unix time); a failure is said without the ledger's location."""
        verifier = self.verifier
        failure = self.ledger.integrity_failure or verifier.failure
        if failure is None:
            try:
                self.ledger.accounts()  # readable, and the newest entries check out
            except LedgerIntegrityError as exc:
                failure = str(exc)
            except DPCuratorError:
                return False, {"status": "ledger unavailable", "ledger": {
                    "readable": False, "verified_at": verifier.last_verified,
                    "verify_every_s": verifier.every}}
        view: dict[str, Any] = {"verified": failure is None,
                                "verified_at": verifier.last_verified,
                                "verify_every_s": verifier.every}
        if failure is not None:
            view["failed_at"] = verifier.failed_at or time.time()
            view["error"] = failure.removeprefix(f"ledger {self.ledger.where}: ")
        return failure is None, {"status": "ok" if failure is None else
                                 "ledger does not verify", "ledger": view}

    def _costs(self, analyst: AnalystConfig, data: _Dataset,
               prepared: PreparedQuery) -> dict[str, Price]:
        """The query's price in the analyst's account and in the dataset's, as the curator
        states it (priced once when prepared, in the dataset's composition)."""
        return {account: self._cost_in(data, prepared, account)
                for account in (self.account_of(analyst, data.config.name), data.account)}

    def _cost_in(self, data: _Dataset, prepared: PreparedQuery, account: str) -> Price:
        composition = self._composition(account)
        return _user(lambda: data.curator.cost_in(prepared, composition))

    def explain(self, analyst: AnalystConfig, name: str, body: QueryBody) -> dict[str, Any]:
        """The cost (in the analyst's and the dataset's budgets), the noise and what its
        release will warn of, known before spending (``warnings``); free."""
        data = self.dataset(analyst, name)
        prepared = _user(lambda: data.curator.prepare(self._resolve(data, body)))
        costs = self._costs(analyst, data, prepared)
        described = data.curator.describe(prepared)
        return {"cost": _guarantee_json(costs[self.account_of(analyst, name)]),
                "dataset_cost": _guarantee_json(costs[data.account]),
                "noise": described["noise"],
                "partition_selection": described["partition_selection"],
                "warnings": described["warnings"], "confidence": prepared.level}

    def budget(self, analyst: AnalystConfig, name: str) -> dict[str, Any]:
        data = self.dataset(analyst, name)
        return {**self._account_view(self.account_of(analyst, name)),
                "dataset": self._account_view(data.account)}

    def charges(self, analyst: AnalystConfig, name: str, *, limit: int = PAGE,
                before: int | None = None) -> dict[str, Any]:
        """One page of the charges to the analyst's account on the dataset, newest first,
        as ``Curator.ledger`` lists a budget's (costs as ``encode_cost`` writes them), each
        with what the account had spent after it; ``next`` is the ``before`` of the page
        after (None at the oldest). Reads one page of the ledger, however long."""
        self.dataset(analyst, name)
        limit = _page_size(limit)
        account = self.account_of(analyst, name)
        rule = self._rule(account)
        entries = self.ledger.account_entries(account, limit=limit, before=before)
        charges = [{"sequence": e.seq, "cost": encode_cost(e.cost), "label": e.label,
                    "time": e.time, "spent": _amount_json(rule.amount(list(e.spent), up=True))}
                   for e in entries if e.kind in ("charge", "migrated") and e.cost is not None]
        return {"charges": charges,
                "next": entries[-1].seq if len(entries) == limit else None}

    def history(self, analyst: AnalystConfig, name: str, *, limit: int = PAGE,
                before: str | None = None) -> dict[str, Any]:
        """One page of the analyst's own requests on the dataset, newest first, with their
        stored releases; ``next`` is the ``before`` of the page after (None at the oldest).
        Reads one page of the ledger's requests, however many there are."""
        self.dataset(analyst, name)
        page = _user(lambda: self.ledger.requests_page(analyst.name, name,
                                                       limit=_page_size(limit), before=before))
        return {"releases": [{"query_id": r.id, "time": r.created, "label": r.label,
                              "release": json.loads(r.release) if r.release is not None
                              else None} for r in page],
                "next": page[-1].id if len(page) == limit else None}

    def replay(self, analyst: AnalystConfig, name: str, query_id: str) -> dict[str, Any]:
        """A stored release of the analyst's, again, for free, with its query (``label``)
        and when it was asked (``time``)."""
        self.dataset(analyst, name)
        request = self.ledger.request(query_id)
        if (request is None or request.analyst != analyst.name or request.dataset != name
                or request.release is None):
            raise ServiceError(404, "not_found", f"no stored release {query_id!r}")
        return {**self._response(analyst, name, request.id, json.loads(request.release),
                                 cached=True), "label": request.label, "time": request.created}

    def catalogue(self, analyst: AnalystConfig) -> list[dict[str, Any]]:
        """The analyst's datasets: schema, bounds, public keys, privacy unit (all public)."""
        out = []
        for name in sorted(analyst.budgets):
            data = self.datasets[name]
            spec = data.config
            out.append({"name": name, "columns": data.curator.columns,
                        "privacy_unit": spec.privacy_unit,
                        "bounds": spec.bounds if isinstance(spec.bounds, str) else {
                            k: v if isinstance(v, str) else list(v)
                            for k, v in spec.bounds.items()},
                        "keys": spec.keys,  # not given: chosen from the data ("auto")
                        "max_partitions": spec.max_partitions or "auto",
                        "max_rows_per_partition": spec.max_rows_per_partition or "auto",
                        "bounding": spec.bounding,
                        "bounds_share": (spec.bounds_share if spec.bounds_share is not None
                                         else DEFAULT_AUTO_SHARE)})
        return out

    def close(self) -> None:
        self.verifier.close()
        self._rates.close()
        for data in self.datasets.values():
            data.curator.close()
        self.ledger.close()
        self.audit.close()

    # -- helpers -------------------------------------------------------------------------------

    def _resolve(self, data: _Dataset, body: QueryBody) -> ResolvedQuery:
        if body.plan is not None:
            plan = _plan(body.plan, body.keys)
        else:
            assert body.sql is not None
            plan = _parse(data, body.sql, body.keys)
        configured = data.config.keys
        if body.keys is None and configured and plan.keys is None and len(plan.group_by) == 1:
            # The dataset's public keys apply to a query grouped by exactly that column.
            ((column, values),) = configured.items()
            if plan.group_by[0].expression.strip('"').lower() == column.lower():
                plan = dataclasses.replace(plan, keys=_user(lambda: public_keys(
                    [(v,) for v in values], [plan.group_by[0].name])))
        if body.intervals is not None or body.total_share is not None:
            plan = _user(lambda: plan.replace(intervals=body.intervals or plan.intervals,
                                              total_share=body.total_share))
        if body.bounding is not None:
            plan = _user(lambda: plan.replace(bounding=body.bounding))
        return _user(lambda: data.curator.resolve(
            plan, epsilon=body.epsilon, delta=body.delta, rho=body.rho, noise=body.noise,
            confidence=body.confidence))

    def _composition(self, account: str) -> str:
        return self._rule(account).composition

    def _rule(self, account: str) -> FilterRule:
        state = self.ledger.last_known(account)  # an account's rule never changes
        assert state is not None
        return state.rule

    def _account_view(self, account: str, *, fresh: bool = True) -> dict[str, Any]:
        state = self.ledger.account(account) if fresh else self.ledger.last_known(account)
        assert state is not None
        return account_view(state)

    def _response(self, analyst: AnalystConfig, name: str, query_id: str,
                  release: dict[str, Any], *, cached: bool) -> dict[str, Any]:
        # As this process last committed it: no read of the database on the answer's path.
        remaining = self._account_view(self.account_of(analyst, name), fresh=False)["remaining"]
        return {**release, "query_id": query_id, "cached": cached, "remaining": remaining}


@functools.lru_cache(maxsize=1024)
def _plan_cached(text: str, keys: tuple[Any, ...] | None) -> Plan:
    plan = plan_from_json(json.loads(text))
    if keys is not None:
        plan = dataclasses.replace(plan, keys=public_keys(keys, [k.name for k in plan.group_by]))
    return plan


def _plan(text: str, keys: tuple[Any, ...] | None) -> Plan:
    return _user(lambda: _plan_cached(text, keys))


def _parse(data: _Dataset, sql: str, keys: tuple[Any, ...] | None) -> Plan:
    """The dataset's curator parses the SQL (it knows its table's name)."""
    if len(sql) > _MAX_SQL:
        raise ServiceError(400, "bad_request", f"sql is longer than {_MAX_SQL} characters")
    return _user(lambda: data.parse(sql, keys=keys))


def _user(action: Callable[[], T]) -> T:
    """Run ``action``; a dpcurator user error becomes 400 with its (record-free) message."""
    try:
        return action()
    except (ServiceError, InternalError):
        raise  # an InternalError is a bug: the app answers 500, not the user's 400
    except DPCuratorError as exc:
        if isinstance(exc, LedgerIntegrityError):
            raise _ledger_unavailable() from None
        raise ServiceError(400, "bad_request", " ".join(str(exc).split())) from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise ServiceError(400, "bad_request", f"the query could not be read "
                           f"({type(exc).__name__})") from None


def _page_size(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise ServiceError(422, "invalid_request",
                           f"limit must be a whole number from 1 to {MAX_PAGE}, got {limit!r}")
    return limit


def _ledger_unavailable() -> ServiceError:
    """The refusal once the ledger does not verify (its details are for the owner: the log,
    ``/healthz``, ``dpcurator ledger verify``)."""
    return ServiceError(503, "ledger_unavailable",
                        "the budget ledger does not verify: nothing was charged, and nothing "
                        "will be until its owner restores it (GET /healthz says what failed "
                        "and when the ledger was last verified)")


def account_view(state: AccountState) -> dict[str, Any]:
    """An account's total, what was spent (rounded up) and what is left (rounded down)."""
    left = [max(lim - s, 0 * lim) for lim, s in zip(state.limits, state.spent, strict=True)]
    return {"total": _guarantee_json(state.rule.total),
            "spent": _amount_json(state.rule.amount(state.spent, up=True)),
            "remaining": _amount_json(state.rule.amount(left, up=False))}


def _guarantee_json(cost: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"guarantee": type(cost).__name__}
    for name in ("epsilon", "delta", "rho"):
        if hasattr(cost, name):
            out[name] = getattr(cost, name)
    return out


def _amount_json(amount: Any) -> dict[str, Any]:
    return {k: v for k, v in vars(amount).items() if v is not None}

