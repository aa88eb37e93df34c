"""A remote curator: the service's API with the library's names (``dp.connect``).

    import dpcurator as dp
    orders = dp.connect("http://127.0.0.1:8000", token, dataset="orders")
    release = orders.sql("SELECT region, COUNT(*) AS n FROM data GROUP BY region", epsilon=0.5)
    release["rows"], orders.remaining, orders.ledger

``RemoteCurator`` is a ``dpcurator.curator.CuratorLike``, as ``Curator`` is: the same
``sql``, ``run``, ``explain``, and ``remaining`` (an ``Amount``) and ``ledger`` (a tuple of
``Charge``), built from the service's JSON. ``sql`` and ``run`` return the JSON object the
service sends (``Release.to_dict()`` with ``query_id``, ``cached`` and ``remaining``), not a
``Release``: the service stores and sends releases as that JSON (see ``CuratorLike``). Its
``"warnings"`` is the release's list of sentences (an empty list for a release stored before
the service sent them), as is ``explain``'s.

Standard library (``urllib``) and dpcurator only, so an analyst's machine needs none of the
``server`` extra. Every refusal raises the ``DPCuratorError`` the library would raise
(``BudgetExceededError`` for a spent budget, ``UserError`` for a bad query), with the service's
message.

Idempotency keys, and completing a stranded request
---------------------------------------------------
The service charges a query before it runs it. If the connection is lost after the charge
(the server killed, a network failure), the request is *stranded*: charged, its release not
yet received. Sending it again with the same ``Idempotency-Key`` completes it for free (the
service answers the charged request, or sends the release it stored).

``sql`` and ``run`` derive the key from the call: the dataset, the token's identity (its
SHA-256), the query and every parameter sent, and ``n``, the number of identical calls this
client has already had answered. So:

- a retry of the same call (same client, after a ``RemoteError``) sends the same key and
  completes the stranded request: a failed call does not advance ``n``;
- re-running the same script (a new client, the same calls in the same order) sends the same
  keys, so it completes what a crash stranded, and gets its earlier releases back for free;
- two deliberate identical calls are two requests (``n`` differs), as two calls to a
  ``Curator`` are. (The service itself answers an analyst's repeat of a query with the
  release already made, for free: asking again does not buy fresh noise.)
- ``idempotency_key=`` overrides the derivation: pass a new value to make a request that no
  earlier one can be mistaken for, or ``error.idempotency_key`` to retry exactly that one.

Why derived rather than random: a random key is lost with the process that made it, so the
ordinary fix after a crash (run it again) would pay again and leave the stranded charge
unused. Two threads making the same call at once with one client send one key: the service
answers both with one release.

Every ``RemoteError`` raised by ``sql`` or ``run`` carries the request's key
(``error.idempotency_key``); to complete the request, call again with
``idempotency_key=error.idempotency_key`` (or simply make the same call again).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dpcurator.errors import BudgetExceededError, DPCuratorError, InternalError, UserError

if TYPE_CHECKING:
    from dpcurator.accounting.filters import Amount
    from dpcurator.ledger import Charge
    from dpcurator.query import Plan, Query

__all__ = ["RemoteCurator", "RemoteError", "connect"]


class RemoteError(DPCuratorError):
    """The service could not be reached, or answered with an error that is not the caller's.

    ``idempotency_key``: the key of the query request that failed (None for a read). The
    request may have been charged without an answer; calling again with
    ``idempotency_key=error.idempotency_key`` (or making the same call again) completes it,
    for free if it was charged."""

    def __init__(self, message: str, *, idempotency_key: str | None = None) -> None:
        if idempotency_key is not None:
            message = (f"{message} (Idempotency-Key {idempotency_key}: retry with "
                       f"idempotency_key={idempotency_key!r}, or make the same call again, to "
                       "complete this request without paying twice)")
        super().__init__(message)
        self.idempotency_key = idempotency_key


def connect(url: str, token: str, *, dataset: str | None = None,
            timeout: float = 300.0) -> RemoteCurator:
    """A remote curator for ``dataset`` (or, if the analyst has exactly one, that one)."""
    return RemoteCurator(url, token, dataset=dataset, timeout=timeout)


class RemoteCurator:
    """The same ``.sql()``, ``.run()``, ``.explain()``, ``.remaining`` and ``.ledger`` as
    ``dp.Curator`` (both are ``CuratorLike``), answered by a curator service; releases come
    back as the JSON the service sends."""

    def __init__(self, url: str, token: str, *, dataset: str | None = None,
                 timeout: float = 300.0) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise UserError(f"url must start with http:// or https://, got {url!r}")
        if not isinstance(token, str) or not token:
            raise UserError("token must be the analyst's token (a non-empty string)")
        self.url = url.rstrip("/")
        self._token = token
        self._identity = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
        self._answered: dict[str, int] = {}  # call -> identical calls answered (see the docs)
        self._answered_lock = threading.Lock()
        self.timeout = timeout
        if dataset is None:
            names = [d["name"] for d in self.datasets()]
            if len(names) != 1:
                raise UserError(f"this token has {len(names)} datasets {names}; "
                                "choose one: connect(url, token, dataset=...)")
            dataset = names[0]
        self.dataset = dataset

    # -- the library's names -------------------------------------------------------------------

    def sql(self, query: str, *, epsilon: float | None = None, delta: float | None = None,
            rho: float | None = None, noise: str | None = None,
            confidence: float | None = None, keys: Sequence[Any] | None = None,
            idempotency_key: str | None = None, intervals: str | None = None,
            total_share: float | None = None, bounding: str | None = None) -> dict[str, Any]:
        """Answer a DP SQL query: ``{"rows", "intervals", "privacy", "warnings", "query_id",
        "cached", "remaining"}``. A retry after a lost answer is safe: the request carries an
        idempotency key derived from the call (see the module's docstring), so the same call
        made again completes a request that was charged but not answered, never charging it
        twice; a ``RemoteError`` carries the key. ``intervals``: what the intervals of
        COUNT(*) and SUM cover ("bounded", "total"), and ``total_share`` what the total ones
        spend; ``bounding`` how the caps apply ("rescale", "sample", "unit"; default the
        dataset's, else ``Curator``'s default)."""
        body = _drop_none({"sql": query, "epsilon": epsilon, "delta": delta, "rho": rho,
                           "noise": noise, "confidence": confidence,
                           "keys": list(keys) if keys is not None else None,
                           "intervals": intervals, "total_share": total_share,
                           "bounding": bounding})
        return self._ask(body, idempotency_key)

    def run(self, query: Query | Plan, *, epsilon: float | None = None,
            delta: float | None = None, rho: float | None = None, noise: str | None = None,
            confidence: float | None = None, idempotency_key: str | None = None
            ) -> dict[str, Any]:
        """Answer a query built with ``dpcurator.query.Query`` (or a ``Plan``), sent as the
        plan's JSON; for SQL text use ``sql``."""
        if isinstance(query, str):
            raise UserError("run() takes a Query or a Plan; for SQL use sql(...)")
        body = _drop_none({**_asked(query), "epsilon": epsilon, "delta": delta,
                           "rho": rho, "noise": noise, "confidence": confidence})
        return self._ask(body, idempotency_key)

    def _derive_key(self, body: dict[str, Any], repeat: int) -> str:
        """The key ``sql`` and ``run`` send for ``body`` (the JSON they send) the ``repeat``-th
        time (0 first) that this client asks it and gets an answer."""
        call = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
        digest = hashlib.sha256()
        for part in ("dpcurator-idempotency-v1", self.dataset, self._identity, call,
                     str(repeat)):
            digest.update(part.encode("utf-8", "surrogatepass"))
            digest.update(b"\x00")
        return "dpc-" + digest.hexdigest()[:48]

    def _ask(self, body: dict[str, Any], idempotency_key: str | None) -> dict[str, Any]:
        """Send a query with its key; an answer (not an error) advances the call's count."""
        call = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
        with self._answered_lock:
            repeat = self._answered.get(call, 0)
        key = (idempotency_key if idempotency_key is not None
               else self._derive_key(body, repeat))
        answer = self._call("POST", f"/v1/datasets/{_quote(self.dataset)}/queries", body,
                            {"Idempotency-Key": key}, retries=2, key=key)
        if idempotency_key is None:
            with self._answered_lock:
                self._answered[call] = max(self._answered.get(call, 0), repeat + 1)
        return _with_warnings(answer)

    def explain(self, query: Query | Plan | str, **privacy: Any) -> dict[str, Any]:
        """The cost and noise of a query (DP SQL, a ``Query`` or a ``Plan``), charging
        nothing: ``{"cost", "dataset_cost", "noise", "partition_selection", "warnings",
        "confidence"}``, each noised measure with its mechanism's ``error_95``."""
        body = _drop_none({**_asked(query), **privacy})
        return _with_warnings(self._call("POST", f"/v1/datasets/{_quote(self.dataset)}/explain",
                                         body))

    @property
    def budget(self) -> dict[str, Any]:
        """``{"total", "spent", "remaining", "dataset": {...}}``."""
        return self._call("GET", f"/v1/datasets/{_quote(self.dataset)}/budget")

    @property
    def remaining(self) -> Amount:
        """What is left of this analyst's budget on the dataset (rounded down), as
        ``Curator.remaining`` states it; ``budget`` has the JSON, with the dataset's."""
        return _amount_of(self.budget["remaining"])

    @property
    def ledger(self) -> tuple[Charge, ...]:
        """Every charge to this analyst's budget on the dataset, oldest first, as
        ``Curator.ledger`` lists them (answers sent again for free are not charges);
        ``history()`` has the releases themselves."""
        pages = self._pages(f"/v1/datasets/{_quote(self.dataset)}/ledger", "charges")
        return _charges_of({"charges": pages})

    def history(self) -> list[dict[str, Any]]:
        """This analyst's requests on the dataset, oldest first, with their releases, each
        replayable for free (``release(query_id)``): ``{"query_id", "time", "label",
        "release"}``."""
        releases = self._pages(f"/v1/datasets/{_quote(self.dataset)}/history", "releases")
        for item in releases:
            if isinstance(item.get("release"), dict):
                _with_warnings(item["release"])
        return releases

    def release(self, query_id: str) -> dict[str, Any]:
        """A stored release again, for free."""
        return _with_warnings(self._call("GET", f"/v1/datasets/{_quote(self.dataset)}/queries/"
                                                f"{_quote(query_id)}"))

    def datasets(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._call("GET", "/v1/datasets")["datasets"]
        return found

    # -- transport -----------------------------------------------------------------------------

    def _pages(self, path: str, key: str) -> list[Any]:
        """Every item of a paged list (the service sends them newest first, a page at a
        time), oldest first."""
        items: list[Any] = []
        before: Any = None
        while True:
            query = urllib.parse.urlencode({"limit": 500, **(
                {"before": before} if before is not None else {})})
            page = self._call("GET", f"{path}?{query}")
            try:
                items.extend(page[key])
                before = page.get("next")
            except (AttributeError, KeyError, TypeError):
                raise RemoteError("the curator sent a page this client cannot read") from None
            if before is None:
                return items[::-1]

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
              headers: dict[str, str] | None = None, retries: int = 0,
              key: str | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self._token}", "Accept": "application/json",
            **({"Content-Type": "application/json"} if data is not None else {}),
            **(headers or {})})
        for attempt in range(retries + 1):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    answer: dict[str, Any] = json.loads(response.read())
                    return answer
            except urllib.error.HTTPError as exc:
                raise _error_of(exc, key) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError,
                    http.client.HTTPException) as exc:
                if attempt == retries:
                    raise RemoteError(f"cannot reach the curator at {self.url}: "
                                      f"{getattr(exc, 'reason', exc)}",
                                      idempotency_key=key) from None
        raise InternalError("unreachable; this is probably a bug")  # pragma: no cover

    def __repr__(self) -> str:
        return f"RemoteCurator({self.url!r}, dataset={self.dataset!r})"


def _error_of(exc: urllib.error.HTTPError, key: str | None = None) -> DPCuratorError:
    try:
        detail = json.loads(exc.read())["error"]
        kind, message = str(detail["type"]), str(detail["message"])
    except (ValueError, KeyError, TypeError):
        kind, message = "http", f"HTTP {exc.code}"
    if kind == "budget_exhausted":
        return BudgetExceededError(message)
    if exc.code in (400, 404, 409, 413, 422):
        return UserError(message)
    if exc.code == 401:
        return UserError(f"the curator refused the token: {message}")
    return RemoteError(f"the curator answered {exc.code} ({kind}): {message}",
                       idempotency_key=key)


def _asked(query: Query | Plan | str) -> dict[str, Any]:
    """A query as the service's body names it: ``sql`` text, or a ``plan`` as JSON."""
    from dpcurator.query import Plan, Query, plan_to_json

    if isinstance(query, str):
        return {"sql": query}
    plan = query.plan() if isinstance(query, Query) else query
    if not isinstance(plan, Plan):
        raise UserError("give DP SQL text, a dpcurator.query.Query or a Plan, got a "
                        f"{type(query).__name__}")
    return {"plan": plan_to_json(plan)}


def _amount_of(data: Any) -> Amount:
    """The ``Amount`` a service's JSON states (``{"epsilon", "delta", "rho", "rdp"}``)."""
    from dpcurator.accounting.filters import Amount

    try:
        rdp = data.get("rdp")
        return Amount(**{name: float(data[name]) for name in ("epsilon", "delta", "rho")
                         if data.get(name) is not None},
                      rdp=tuple(float(e) for e in rdp) if rdp is not None else None)
    except (AttributeError, KeyError, TypeError, ValueError):
        raise RemoteError("the curator sent a budget this client cannot read") from None


def _charges_of(answer: Any) -> tuple[Charge, ...]:
    """The ``Charge``s a service's ledger JSON lists (costs as ``encode_cost`` writes them)."""
    from dpcurator.accounting.filters import decode_cost
    from dpcurator.ledger import Charge

    try:
        return tuple(Charge(int(c["sequence"]), decode_cost(c["cost"]), str(c["label"]),
                            float(c["time"])) for c in answer["charges"])
    except (DPCuratorError, KeyError, TypeError, ValueError):
        raise RemoteError("the curator sent a ledger this client cannot read") from None


def _with_warnings(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer with its ``"warnings"`` as a list of sentences (empty where a release stored
    before the service sent them has none)."""
    warnings = answer.get("warnings")
    answer["warnings"] = [str(w) for w in warnings] if isinstance(warnings, list) else []
    return answer


def _drop_none(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="")


if TYPE_CHECKING:  # mypy checks that both curators implement the seam, as the protocol says
    from dpcurator.curator import Curator, CuratorLike

    def _both_are_curator_like(local: Curator, remote: RemoteCurator) -> list[CuratorLike]:
        return [local, remote]
