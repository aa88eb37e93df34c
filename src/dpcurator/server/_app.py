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
    GET  /healthz                             liveness and the ledger's readability

Errors are ``{"error": {"type", "message"}}`` with 400 (bad request), 401 (no or wrong token),
404 (no such dataset or release), 403 ``budget_exhausted``, 409 (idempotency key reused for
another request), 413 (body too large), 429 (rate limited); nothing is charged for any of
them. Messages name what was wrong with the request and never hold a record; whether a
query is refused depends only on the query, the schema and the budgets, never on the rows.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Annotated, Any, Literal, TypeVar

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ._config import AnalystConfig, ServiceConfig
from ._service import QueryBody, Service, ServiceError

__all__ = ["create_app"]

_log = logging.getLogger("dpcurator.server")
T = TypeVar("T")

Scalar = str | int | float | bool | None
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class QueryRequest(BaseModel):
    """A DP SQL query (or the builder's plan as JSON) and the privacy it may spend."""

    model_config = ConfigDict(extra="forbid")

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
                          "after the caps, or the total without them (default: total where "
                          "the caps are chosen from the data)")
    total_share: float | None = Field(None, gt=0, lt=1, allow_inf_nan=False,
                                      description="the share of the query's budget the total "
                                                  "intervals spend (default 0.1)")

    def body(self) -> QueryBody:
        if (self.sql is None) == (self.plan is None):
            raise ServiceError(400, "bad_request", "give the query as sql or as plan (one)")
        keys = None
        if self.keys is not None:
            keys = tuple(tuple(k) if isinstance(k, list) else k for k in self.keys)
        plan = (json.dumps(self.plan, sort_keys=True, allow_nan=False)
                if self.plan is not None else None)
        return QueryBody(self.sql, self.epsilon, self.delta, self.rho, self.noise,
                         self.confidence, keys, plan, self.intervals, self.total_share)

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
        (413, "body too large"), (429, "rate limited"))}


_bearer = HTTPBearer(auto_error=False, description="the analyst's token")


async def _analyst(request: Request, credentials: Annotated[
        HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> AnalystConfig:
    """The analyst a request's bearer token names (401 otherwise), within their rate (429).

    On the event loop: a hash and a dictionary, no thread hop."""
    service: Service = request.app.state.service
    who = service.authenticate(credentials.credentials if credentials else None)
    service.admit(who)
    return who


Analyst = Annotated[AnalystConfig, Depends(_analyst)]


def create_app(config: ServiceConfig | Service, *, docs: bool = True) -> FastAPI:
    """The ASGI app for a configuration (or an already built ``Service``)."""
    service = config if isinstance(config, Service) else Service(config)
    app = FastAPI(title="dpcurator", version="1", responses=_ERRORS,
                  description="A trusted curator: differentially private answers to aggregate "
                              "questions, each charged to the asking analyst's budget and the "
                              "dataset's.",
                  docs_url="/docs" if docs else None, redoc_url=None)
    app.state.service = service

    @app.post("/v1/datasets/{name}/queries", summary="Answer a DP SQL query")
    async def query(name: str, body: QueryRequest, who: Analyst,
                    idempotency_key: Annotated[str | None, Header(max_length=200)] = None
                    ) -> dict[str, Any]:
        asked = _audited(service, who, name, "query", body.text, body.body)
        # A release already made is sent from the event loop (no engine, no database);
        # anything else runs in a worker thread: reserve, answer, store.
        fast = _audited(service, who, name, "query", asked.text,
                        lambda: service.cached_answer(who, name, asked, idempotency_key))
        if fast is not None:
            return fast
        return await run_in_threadpool(
            _audited, service, who, name, "query", asked.text,
            lambda: service.query(who, name, asked, idempotency_key))

    @app.post("/v1/datasets/{name}/explain", summary="Cost and noise of a query (free)")
    def explain(name: str, body: QueryRequest, who: Analyst) -> dict[str, Any]:
        asked = _audited(service, who, name, "explain", body.text, body.body)
        return _audited(service, who, name, "explain", asked.text,
                        lambda: service.explain(who, name, asked))

    @app.get("/v1/datasets/{name}/budget", summary="The analyst's and the dataset's budget")
    def budget(name: str, who: Analyst) -> dict[str, Any]:
        return service.budget(who, name)

    @app.get("/v1/datasets/{name}/ledger",
             summary="The charges to the analyst's budget on the dataset")
    def ledger(name: str, who: Analyst) -> dict[str, Any]:
        return {"charges": service.charges(who, name)}

    @app.get("/v1/datasets/{name}/history", summary="The analyst's releases on the dataset")
    def history(name: str, who: Analyst) -> dict[str, Any]:
        return {"releases": service.history(who, name)}

    @app.get("/v1/datasets/{name}/queries/{query_id}", summary="A stored release, free")
    def replay(name: str, query_id: str, who: Analyst) -> dict[str, Any]:
        return service.replay(who, name, query_id)

    @app.get("/v1/datasets", summary="The analyst's datasets")
    def datasets(who: Analyst) -> dict[str, Any]:
        return {"datasets": service.catalogue(who)}

    @app.get("/healthz", summary="Liveness, and whether the ledger verifies")
    def healthz() -> JSONResponse:
        try:
            service.ledger.accounts()
        except Exception:  # any failure is "not healthy", said without detail
            return JSONResponse({"status": "ledger unavailable"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.exception_handler(ServiceError)
    def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return _error(exc.status, exc.kind, exc.message)

    @app.exception_handler(RequestValidationError)
    def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for error in exc.errors()[:5]:
            where = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
            parts.append(f"{where or 'body'}: {error.get('msg', 'invalid')}")
        return _error(400, "bad_request", "; ".join(parts) or "the request is malformed")

    @app.exception_handler(StarletteHTTPException)
    def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kinds = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}
        return _error(exc.status_code, kinds.get(exc.status_code, "bad_request"),
                      str(exc.detail))

    @app.exception_handler(Exception)
    def _internal(request: Request, exc: Exception) -> JSONResponse:
        incident = secrets.token_hex(6)
        _log.error("internal error %s on %s", incident, request.url.path, exc_info=exc)
        return _error(500, "internal", f"internal error {incident}: this is a bug in "
                                       "dpcurator; anything charged stays charged and nothing "
                                       "unstored was released")

    app.add_middleware(_BodyLimit, limit=service.config.limits.max_body_bytes)
    return app


def _audited(service: Service, who: AnalystConfig, name: str, action: str, sql: str,
             run: Callable[[], T]) -> T:
    """Run an analyst's request and append what happened to the audit log (nothing is
    logged when ``run`` returns None: the request goes on elsewhere)."""
    try:
        result = run()
    except ServiceError as exc:
        service.audit.write(analyst=who.name, dataset=name, action=action, status=exc.status,
                            error=exc.kind, sql=sql[:2000])
        raise
    except Exception:
        service.audit.write(analyst=who.name, dataset=name, action=action, status=500,
                            error="internal", sql=sql[:2000])
        raise
    if isinstance(result, dict):
        service.audit.write(analyst=who.name, dataset=name, action=action, status=200,
                            query_id=result.get("query_id"), cached=result.get("cached"),
                            cost=result.get("privacy", result.get("cost")), sql=sql[:2000])
    return result


def _error(status: int, kind: str, message: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status,
                        headers=headers)


class _BodyLimit:
    """Refuse (413) a request body over ``limit`` bytes, declared or streamed."""

    def __init__(self, app: Callable[..., Awaitable[None]], limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        too_large = _error(413, "too_large", f"the request body is over {self.limit} bytes")
        try:
            if declared is not None and int(declared) > self.limit:
                await too_large(scope, receive, send)
                return
        except ValueError:
            await _error(400, "bad_request", "bad Content-Length")(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await too_large(scope, receive, send)


class _TooLarge(Exception):
    pass

