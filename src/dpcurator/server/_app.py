"""The HTTP face of the service (FastAPI): routes, bearer tokens, limits, JSON errors.

Routes (every ``/v1`` route needs ``Authorization: Bearer <token>``; an analyst sees only the
datasets they have a budget on, and any other name is 404):

    POST /v1/datasets/{name}/queries          answer a DP SQL query (Idempotency-Key optional)
    POST /v1/datasets/{name}/explain          its cost and noise, charging nothing
    GET  /v1/datasets/{name}/budget           the analyst's budget and the dataset's
    GET  /v1/datasets/{name}/ledger           the charges to the analyst's budget on it
    GET  /v1/datasets/{name}/history          the analyst's releases on the dataset
    GET  /v1/datasets/{name}/queries/{id}     one stored release again, free
    GET  /v1/datasets                         the analyst's datasets (schema, bounds, keys)
    GET  /v1/whoami                           whose token this is: an analyst's or an owner's
    GET  /v1/posterior?epsilon=&delta=&prior= what an ε lets an attacker learn (free; any
                                              token)
    GET  /v1/owner/overview                   the owner's view: every budget, the ledger's
                                              verification and head (an owner's token only)
    GET  /v1/owner/audit?limit=               the audit log's newest lines (an owner's token)
    GET  /healthz                             liveness; whether the ledger verifies, and when
                                              it was last verified whole
    GET  /docs                                the API's documentation (Swagger UI, served from
                                              the swagger-ui-bundle package: no CDN)
    GET  /                                    the dashboard (``_dashboard``): static pages
                                              that hold no data; they ask the API above

The ledger and history are paged, newest first (``?limit=`` up to 500, default 50, and
``?before=`` the ``next`` of the page before): a page is read alone, however long the
ledger.

Errors are ``{"error": {"type", "message"}}`` with 400 (bad request, or a body that is not
JSON), 401 (no or wrong token), 404 (no such dataset or release), 403 ``budget_exhausted``,
409 (idempotency key reused for another request), 413 (body too large, declared or
streamed), 422 ``invalid_request`` (a field of the wrong type or out of range, named: JSON
types are strict, so ``"epsilon": "0.1"`` and ``"epsilon": true`` are refused), 429 (rate
limited), 503 ``ledger_unavailable`` (the ledger does not verify); nothing is charged for any
of them. Messages name what was wrong with the request and never hold a record; whether a
query is refused depends only on the query, the schema and the budgets, never on the rows.

Every request, whatever its outcome, is written to the audit log as one line of bounded
size (who, from where, what, the outcome and its cost), and to the access log (the logger
``dpcurator.server.access``, which ``dpcurator serve --access-log`` sends to stderr or a
file). Before authentication, requests are limited per client address
(``[limits] address_requests_per_second``, in each process; the address is the one a trusted
proxy names in X-Forwarded-For, see ``dpcurator serve --forwarded-allow-ips``); after it, per
analyst, across every process over the ledger (``dpcurator.ledger.open_rate_buckets``).
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from dpcurator.errors import LedgerBusyError, LedgerIntegrityError

from ._config import AnalystConfig, OwnerConfig, ServiceConfig
from ._dashboard import add_dashboard
from ._owner import AUDIT_LINES, audit_tail, overview
from ._posterior import posterior_curve
from ._service import MAX_PAGE, PAGE, QueryBody, Service, ServiceError

__all__ = ["create_app"]

_log = logging.getLogger("dpcurator.server")
_access = logging.getLogger("dpcurator.server.access")
T = TypeVar("T")
_NOTES = "dpcurator.notes"  # the scope's key for what a request's audit line says

Scalar = str | int | float | bool | None
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class QueryRequest(BaseModel):
    """A DP SQL query (or the builder's plan as JSON) and the privacy it may spend.

    Strict JSON types: a number is a JSON number (``"0.1"`` and ``true`` are refused, 422,
    naming the field), text is a JSON string."""

    model_config = ConfigDict(extra="forbid", strict=True)

    sql: str | None = Field(None, min_length=1, max_length=20_000,
                            description="DP SQL: SELECT ... FROM data [WHERE ...] [GROUP BY ...]")
    plan: dict[str, Any] | None = Field(
        None, description="instead of sql: a plan as dpcurator.query.plan_to_json writes it")
    epsilon: float | None = Field(None, gt=0, allow_inf_nan=False)
    delta: float | None = Field(None, ge=0, lt=1, allow_inf_nan=False)
    rho: float | None = Field(None, gt=0, allow_inf_nan=False)
    noise: Literal["laplace", "gaussian"] | None = None
    confidence: float | None = Field(None, gt=0, lt=1, allow_inf_nan=False)
    keys: list[Scalar | list[Scalar]] | None = Field(
        None, max_length=100_000, description="public partitions for the GROUP BY keys")
    intervals: Literal["bounded", "total"] | None = Field(
        None, description="what the intervals of COUNT(*) and SUM cover: the answer "
                          "after the caps (the default), or the total without them")
    total_share: float | None = Field(None, gt=0, lt=1, allow_inf_nan=False,
                                      description="the share of the query's budget the total "
                                                  "intervals spend (default 0.1)")
    bounding: Literal["rescale", "sample", "unit"] | None = Field(
        None, description="how the caps apply: per group (rescale, sample) or on each "
                          "unit's total (unit); default the dataset's, else unit for COUNT(*) "
                          "and SUM with nothing given and public keys")

    def body(self) -> QueryBody:
        if (self.sql is None) == (self.plan is None):
            raise ServiceError(400, "bad_request", "give the query as sql or as plan (one)")
        keys = None
        if self.keys is not None:
            keys = tuple(tuple(k) if isinstance(k, list) else k for k in self.keys)
        plan = (json.dumps(self.plan, sort_keys=True, allow_nan=False)
                if self.plan is not None else None)
        return QueryBody(self.sql, self.epsilon, self.delta, self.rho, self.noise,
                         self.confidence, keys, plan, self.intervals, self.total_share,
                         self.bounding)

    @property
    def text(self) -> str:
        return self.sql if self.sql is not None else "plan"


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorDetail


_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text} for code, text in (
        (400, "bad request"), (401, "no or wrong token"), (403, "budget exhausted"),
        (404, "no such dataset or release"), (409, "idempotency key reused"),
        (413, "body too large"), (422, "a field of the wrong type or out of range"),
        (429, "rate limited"), (503, "the ledger does not verify"))}


_bearer = HTTPBearer(auto_error=False, description="the analyst's token")


async def _analyst(request: Request, credentials: Annotated[
        HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> AnalystConfig:
    """The analyst a request's bearer token names (401 otherwise), within their rate (429).

    On the event loop: a hash and a dictionary, no thread hop. A request that authenticates
    is counted against its analyst's rate, not its address's (see ``_Front``)."""
    service: Service = request.app.state.service
    who = service.authenticate(credentials.credentials if credentials else None)
    return _admitted(request, service, who, "analyst")


async def _owner(request: Request, credentials: Annotated[
        HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> OwnerConfig:
    """The owner a request's bearer token names (401 otherwise: an analyst's token is not
    an owner's), within their rate (429)."""
    service: Service = request.app.state.service
    who = service.authenticate_owner(credentials.credentials if credentials else None)
    return _admitted(request, service, who, "owner")


async def _anyone(request: Request, credentials: Annotated[
        HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> AnalystConfig | OwnerConfig:
    """An analyst or an owner (401 otherwise), within their rate (429)."""
    service: Service = request.app.state.service
    token = credentials.credentials if credentials else None
    who: AnalystConfig | OwnerConfig
    try:
        who = service.authenticate(token)
        _notes(request)["analyst"] = who.name
    except ServiceError as refused:
        try:
            who = service.authenticate_owner(token)
        except ServiceError:
            raise refused from None  # the plain 401: it says nothing of who might exist
        _notes(request)["owner"] = who.name
    return _admitted(request, service, who, None)


_Who = TypeVar("_Who", AnalystConfig, OwnerConfig, AnalystConfig | OwnerConfig)


def _admitted(request: Request, service: Service, who: _Who, role: str | None) -> _Who:
    """An authenticated request: noted under ``role`` (where given), counted against its
    analyst's or owner's rate instead of its address's (429 over it)."""
    if role is not None:
        _notes(request)[role] = who.name
    service.addresses.give_back(_client(request.scope))
    service.admit(who)
    return who


Analyst = Annotated[AnalystConfig, Depends(_analyst)]
Owner = Annotated[OwnerConfig, Depends(_owner)]
Anyone = Annotated[AnalystConfig | OwnerConfig, Depends(_anyone)]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE, description="the page's size")]


def create_app(config: ServiceConfig | Service, *, docs: bool = True) -> FastAPI:
    """The ASGI app for a configuration (or an already built ``Service``)."""
    service = config if isinstance(config, Service) else Service(config)
    app = FastAPI(title="dpcurator", version="1", responses=_ERRORS,
                  description="A trusted curator: differentially private answers to aggregate "
                              "questions, each charged to the asking analyst's budget and the "
                              "dataset's.",
                  docs_url=None, redoc_url=None)
    app.state.service = service

    @app.post("/v1/datasets/{name}/queries", summary="Answer a DP SQL query")
    async def query(name: str, body: QueryRequest, who: Analyst, request: Request,
                    idempotency_key: Annotated[str | None, Header(max_length=200)] = None
                    ) -> dict[str, Any]:
        notes = _notes(request, action="query", sql=body.text)
        asked = body.body()
        notes["sql"] = asked.text
        # A release already made is sent from the event loop (no engine, no database);
        # anything else runs in a worker thread: reserve, answer, store.
        answer = service.cached_answer(who, name, asked, idempotency_key)
        if answer is None:
            answer = await run_in_threadpool(service.query, who, name, asked, idempotency_key)
        notes.update(query_id=answer.get("query_id"), cached=answer.get("cached"),
                     cost=answer.get("privacy"))
        return answer

    @app.post("/v1/datasets/{name}/explain", summary="Cost and noise of a query (free)")
    def explain(name: str, body: QueryRequest, who: Analyst, request: Request
                ) -> dict[str, Any]:
        notes = _notes(request, action="explain", sql=body.text)
        asked = body.body()
        notes["sql"] = asked.text
        return service.explain(who, name, asked)

    @app.get("/v1/datasets/{name}/budget", summary="The analyst's and the dataset's budget")
    def budget(name: str, who: Analyst, request: Request) -> dict[str, Any]:
        _notes(request, action="budget")
        return service.budget(who, name)

    @app.get("/v1/datasets/{name}/ledger",
             summary="The charges to the analyst's budget on the dataset, newest first")
    def ledger(name: str, who: Analyst, request: Request, limit: Limit = PAGE,
               before: Annotated[int | None, Query(ge=1, description="the page before's "
                                                   "next")] = None) -> dict[str, Any]:
        _notes(request, action="ledger")
        return service.charges(who, name, limit=limit, before=before)

    @app.get("/v1/datasets/{name}/history",
             summary="The analyst's releases on the dataset, newest first")
    def history(name: str, who: Analyst, request: Request, limit: Limit = PAGE,
                before: Annotated[str | None, Query(max_length=64, description="the page "
                                                    "before's next")] = None
                ) -> dict[str, Any]:
        _notes(request, action="history")
        return service.history(who, name, limit=limit, before=before)

    @app.get("/v1/datasets/{name}/queries/{query_id}", summary="A stored release, free")
    def replay(name: str, query_id: str, who: Analyst, request: Request) -> dict[str, Any]:
        _notes(request, action="replay", query_id=query_id)
        return service.replay(who, name, query_id)

    @app.get("/v1/datasets", summary="The analyst's datasets")
    def datasets(who: Analyst, request: Request) -> dict[str, Any]:
        _notes(request, action="datasets")
        return {"datasets": service.catalogue(who)}

    @app.get("/v1/whoami", summary="Whose token this is: an analyst's or an owner's")
    def whoami(who: Anyone, request: Request) -> dict[str, Any]:
        _notes(request, action="whoami")
        return {"role": "analyst" if isinstance(who, AnalystConfig) else "owner",
                "name": who.name}

    @app.get("/v1/posterior", summary="What an epsilon lets an attacker learn (free)")
    def posterior(who: Anyone, request: Request,
                  epsilon: Annotated[float, Query(gt=0, le=100, allow_inf_nan=False)],
                  delta: Annotated[float, Query(ge=0, lt=0.1, allow_inf_nan=False)] = 0.0,
                  prior: Annotated[float, Query(ge=0, le=1, allow_inf_nan=False)] = 0.5
                  ) -> dict[str, Any]:
        _notes(request, action="posterior")
        return posterior_curve(epsilon, delta, prior)

    @app.get("/v1/owner/overview", summary="Every budget, and the ledger's state (owners)")
    def owner_overview(who: Owner, request: Request) -> dict[str, Any]:
        _notes(request, action="owner_overview")
        return overview(service)

    @app.get("/v1/owner/audit", summary="The audit log's newest lines (owners)")
    def owner_audit(who: Owner, request: Request,
                    limit: Annotated[int, Query(ge=1, le=AUDIT_LINES)] = AUDIT_LINES
                    ) -> dict[str, Any]:
        _notes(request, action="owner_audit")
        return {"entries": audit_tail(service.config.audit_log, limit)}

    @app.get("/healthz", summary="Liveness; whether the ledger verifies, and when it was "
                                 "last verified whole")
    def healthz(request: Request) -> JSONResponse:
        _notes(request, action="healthz")
        ok, view = service.health()
        return JSONResponse(view, status_code=200 if ok else 503)

    if docs:
        _add_docs(app)
    add_dashboard(app, _notes)

    @app.exception_handler(ServiceError)
    def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return _error(exc.status, exc.kind, exc.message, request)

    @app.exception_handler(LedgerIntegrityError)
    def _ledger_error(request: Request, exc: LedgerIntegrityError) -> JSONResponse:
        _log.error("the ledger does not verify: %s", exc)
        return _error(503, "ledger_unavailable", "the budget ledger does not verify: nothing "
                      "was charged, and nothing will be until its owner restores it (GET "
                      "/healthz says what failed and when it was last verified)", request)

    @app.exception_handler(LedgerBusyError)
    def _ledger_busy(request: Request, exc: LedgerBusyError) -> JSONResponse:
        """A ledger locked for too long or its database unreachable (a bug hunt: answered 500,
        'a bug in dpcurator', where nothing was charged and a retry would do)."""
        _log.warning("the ledger could not be used: %s", exc)
        return _error(503, "ledger_busy", "the budget ledger could not be used just now "
                      "(locked, or its database unreachable); nothing was charged: try again",
                      request)

    @app.exception_handler(RequestValidationError)
    def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(error.get("type") == "json_invalid" for error in errors):
            return _error(400, "bad_request", "the request body is not valid JSON", request)
        parts = []
        for error in errors[:5]:
            where = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
            parts.append(f"{where or 'body'}: {error.get('msg', 'invalid')}")
        return _error(422, "invalid_request",
                      "; ".join(parts) or "the request is malformed", request)

    @app.exception_handler(StarletteHTTPException)
    def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kinds = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}
        return _error(exc.status_code, kinds.get(exc.status_code, "bad_request"),
                      str(exc.detail), request)

    @app.exception_handler(Exception)
    def _internal(request: Request, exc: Exception) -> JSONResponse:
        incident = secrets.token_hex(6)
        _log.error("internal error %s on %s", incident, request.url.path, exc_info=exc)
        return _error(500, "internal", f"internal error {incident}: this is a bug in "
                                       "dpcurator; anything charged stays charged and nothing "
                                       "unstored was released", request)

    app.add_middleware(_Front, service=service, limit=service.config.limits.max_body_bytes)
    return app


# -- the API's documentation, from the package ------------------------------------------------

_DOCS_ASSETS = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css",
                "favicon-32x32.png": "image/png"}


def _add_docs(app: FastAPI) -> None:
    """``/docs``: Swagger UI with its script and style served from the ``swagger-ui-bundle``
    package (the ``server`` extra's ``swagger-ui-bundle-v2``), so it works offline and sends
    the browser nowhere else. Without that package ``/docs`` says how to install it."""
    try:
        import swagger_ui_bundle
    except ImportError:
        swagger_ui_bundle = None

    @app.get("/docs", include_in_schema=False)
    def docs_page(request: Request) -> Response:
        _notes(request, action="docs")
        if swagger_ui_bundle is None:
            return _error(501, "not_installed", "the API's documentation needs the server "
                          "extra: pip install 'dpcurator[server]'", request)
        root = request.scope.get("root_path", "").rstrip("/")
        return _no_store(get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}", title="dpcurator API",
            swagger_js_url=f"{root}/docs/assets/swagger-ui-bundle.js",
            swagger_css_url=f"{root}/docs/assets/swagger-ui.css",
            swagger_favicon_url=f"{root}/docs/assets/favicon-32x32.png"))

    @app.get("/docs/assets/{asset}", include_in_schema=False)
    def docs_asset(asset: str, request: Request) -> Response:
        _notes(request, action="docs")
        if swagger_ui_bundle is None or asset not in _DOCS_ASSETS:
            return _error(404, "not_found", "no such file", request)
        folder = Path(str(swagger_ui_bundle.swagger_ui_path))
        return FileResponse(folder / asset, media_type=_DOCS_ASSETS[asset],
                            headers={"Cache-Control": "public, max-age=86400"})


def _no_store(page: HTMLResponse) -> HTMLResponse:
    page.headers["Cache-Control"] = "no-store"
    return page


# -- what every request leaves behind: the audit line and the access log ------------------------


def _notes(request: Request, **facts: Any) -> dict[str, Any]:
    """What the request's audit line will say (set by ``_Front``), with ``facts`` added."""
    notes: dict[str, Any] = request.scope.setdefault(_NOTES, {})
    notes.update(facts)
    return notes


def _client(scope: Message) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def _error(status: int, kind: str, message: str, request: Request | None = None
           ) -> JSONResponse:
    if request is not None:
        _notes(request, error=kind)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status,
                        headers=headers)


class _Front:
    """In front of every request, in this order:

    1. the per-address rate limit, before authentication (429; a request that then
       authenticates gives its token back, and is limited per analyst instead);
    2. the body limit: a declared length over it is refused at once, and a body streamed
       (chunked) is read up to it and refused (413) before the app sees any of it;
    3. when the request ends, whatever ended it: one audit line (bounded fields) and one
       access-log line.
    """

    def __init__(self, app: Callable[..., Awaitable[None]], service: Service,
                 limit: int) -> None:
        self.app, self.service, self.limit = app, service, limit

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        notes: dict[str, Any] = scope.setdefault(_NOTES, {})
        started = time.perf_counter()
        status = 500  # unless a response starts: an exception reaches the server's handler

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        client = _client(scope)
        try:
            if not self.service.addresses.take(client):
                notes["error"] = "rate_limited"
                await _error(429, "rate_limited", "too many requests from this address; slow "
                                                  "down and retry")(scope, receive, sending)
                return
            body = await self._body(scope, receive, notes)
            if isinstance(body, Response):
                await body(scope, receive, sending)
                return
            if body is None:  # the client went away before sending its body
                status = 499
                return
            await self.app(scope, _replay(body, receive), sending)
        finally:
            self._record(scope, notes, status, client, time.perf_counter() - started)

    async def _body(self, scope: Message, receive: Receive,
                    notes: dict[str, Any]) -> bytes | Response | None:
        declared = dict(scope.get("headers") or []).get(b"content-length")
        try:
            if declared is not None and int(declared) > self.limit:
                notes["error"] = "too_large"
                return self._too_large()
        except ValueError:
            notes["error"] = "bad_request"
            return _error(400, "bad_request", "bad Content-Length")
        chunks, seen = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.limit:
                notes["error"] = "too_large"
                return self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _too_large(self) -> JSONResponse:
        return _error(413, "too_large", f"the request body is over {self.limit} bytes")

    def _record(self, scope: Message, notes: dict[str, Any], status: int, client: str,
                took: float) -> None:
        params = scope.get("path_params") or {}
        path = str(scope.get("path", ""))
        try:
            self.service.audit.write(
                client=client, method=scope.get("method"), path=path, status=status,
                analyst=notes.get("analyst"), owner=notes.get("owner"),
                dataset=params.get("name"),
                action=notes.get("action"), error=notes.get("error"), sql=notes.get("sql"),
                query_id=notes.get("query_id"), cached=notes.get("cached"),
                cost=notes.get("cost"), ms=round(took * 1000, 1))
        except OSError as exc:  # the log's disk: say so, but the answer was already sent
            _log.error("cannot write the audit log: %s", exc)
        if _access.isEnabledFor(logging.INFO):
            shown = path if len(path) <= 200 else f"{path[:200]}...[{len(path)} chars]"
            _access.info('%s "%s %s" %d %s %.1fms', client[:64], str(scope.get("method"))[:16],
                         shown.encode("unicode_escape").decode("ascii"), status,
                         str(notes.get("analyst", "-"))[:64], took * 1000)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body, already read, as the app's ``receive``; after it, the client's own (so a
    disconnect is still seen)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
