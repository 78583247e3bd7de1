"""HTTP API (Litestar): ``POST /v1/kb/search/rerank`` and the operational endpoints.

``create_app(settings, reranker=None, embedder=None)`` builds a new app; nothing lives at
module level (no pool, model or settings). The lifespan opens ONE AsyncConnectionPool as
``cyberos_app`` (autocommit connections, ``statement_timeout`` from settings, pgvector
registered), checks the database's embedding dimension, builds the embedder and the
reranker when not given (the model loads in the background: until it is ready requests are
served with the fallback ordering), starts the periodic cache eviction, and closes all of
it on shutdown. A reranker or embedder passed in belongs to the caller and is not closed.

Endpoints
---------
* ``POST /v1/kb/search/rerank`` -- Bearer JWT (tenant claim), body
  ``{"query": str, "source": "hybrid_lexical_semantic"|"lexical_only"|"semantic_only"|"manual_curation"}``.
* ``GET /healthz`` -- 200 while the process runs.
* ``GET /readyz`` -- 200 when the database answers and its schema is at the migrations'
  head with this code's idempotent layer (kb.schema_layer_version()) (the model state is reported; a model still loading is not a 503 because
  requests are served with the fallback); 503 otherwise. Only ``{"status"}`` unless the
  request carries ``Authorization: Bearer <ops_token>``.
* ``GET /metrics`` -- Prometheus text, from a registry owned by the app; needs the ops
  token (401 without it; 404 when no ops token is configured).
* ``GET /schema/openapi.json`` and ``/schema`` (docs page): the three JSON routes' request
  bodies, answers and error responses (:mod:`kb_rerank.schemas`), and the bearer scheme
  (HTTP bearer, JWT) they require, so the docs page can send a token.

Errors are JSON: ``{"error": ..., ...}``. 401 ``unauthorized`` with ``reason``; 400
``invalid_json``; 422 ``invalid_request`` with ``field`` and ``detail`` (and ``allowed``
for an unknown source) -- bodies decoded by :mod:`kb_rerank.body`, as on the v2.py
routes; 413 ``payload_too_large`` (refused while reading, from the Content-Length or as
the streamed bytes pass the route's limit); 429 ``rate_limited`` with ``Retry-After`` (per-tenant
token bucket: ``rate_limit_per_minute`` refill, ``rate_limit_burst`` size; 0 disables);
503 ``database_unavailable`` with ``Retry-After`` when no database connection is had
within ``db_timeout_s``. A rejected request
writes nothing (no cache row, no audit row); it is counted in the metrics only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import anyio
import psycopg
from litestar import Litestar, MediaType, Request, Response, Router, get, post
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.handlers import BaseRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import SwaggerRenderPlugin
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from . import __version__ as _version
from . import db
from . import body
from . import sqlfiles
from .auth import AuthError, JwtConfig, check_secret, tenant_from_authorization
from .body import ApiError  # noqa: F401 - the app's error type, defined with the body decoder
from .limits import Limits, LimitExceeded, RateLimiter  # noqa: F401 - RateLimiter: moved there, imported from here by older callers
from .schemas import ERROR_RESPONSES, SECURITY, SECURITY_COMPONENTS, body_operation
from .service import (
    TRACE_ID,
    PipelineMetrics,
    RerankRequest,
    RerankResponse,
    RerankService,
    install_trace_log_records,
    trace_id_from_headers,
)
from .settings import SOURCES, Settings

log = logging.getLogger("kb_rerank.api")

RERANK_PATH = "/v1/kb/search/rerank"


# --------------------------------------------------------------------------- errors


def _trace_headers(request: Request) -> dict[str, str]:
    tid = request.scope.get("state", {}).get("trace_id")
    return {"X-Trace-Id": tid} if tid else {}


def _api_error_handler(request: Request, exc: ApiError) -> Response:
    return Response(exc.payload, status_code=exc.status_code, headers={**_trace_headers(request), **exc.headers},
                    media_type=MediaType.JSON)


def _too_large_handler(request: Request, exc: RequestEntityTooLarge) -> Response:
    # Raised by Litestar while reading the body: from the Content-Length before reading
    # anything, or as soon as the streamed bytes pass the route's limit, so at most one
    # limit's worth is ever held. uvicorn then discards the rest of the upload unbuffered;
    # the connection is not closed early, so that the client reads this answer (an early
    # close resets the connection under a client still sending, losing the 413).
    handler = request.scope.get("route_handler")
    limit = handler.resolve_request_max_body_size() if handler is not None else None
    limit = limit if limit is not None else request.app.state.settings.max_body_bytes
    return Response({"error": "payload_too_large", "field": None, "detail": f"request body over {limit} bytes"},
                    status_code=413, headers=_trace_headers(request), media_type=MediaType.JSON)


def _db_error_handler(request: Request, exc: Exception) -> Response:
    log.warning("database unavailable: %s", type(exc).__name__)
    return Response({"error": "database_unavailable"}, status_code=503,
                    headers={"Retry-After": "5", **_trace_headers(request)}, media_type=MediaType.JSON)


def _status_of(exc: BaseException) -> int:
    if isinstance(exc, (ApiError, HTTPException)):
        return int(exc.status_code)
    if isinstance(exc, psycopg.OperationalError):
        return 503
    return 500


# --------------------------------------------------------------------------- request body


_invalid = body.invalid


def parse_request(raw: bytes, settings: Settings) -> RerankRequest:
    """Decode and validate the body (:mod:`kb_rerank.body`); raise ApiError naming the field."""
    obj = body.decode_object(raw)
    source = obj.get("source", None)
    if "source" in obj and (not isinstance(source, str) or source not in SOURCES):
        raise _invalid("source", "source must be one of: " + ", ".join(SOURCES), allowed=list(SOURCES))
    req = body.convert(obj, RerankRequest)
    q = req.query
    if "\x00" in q:
        raise _invalid("query", "query must not contain NUL characters")
    if not q.strip():
        raise _invalid("query", "query must not be empty or whitespace only")
    if len(q) > settings.max_query_chars:
        raise _invalid("query", f"query is longer than {settings.max_query_chars} characters")
    return req


# Documents the JSON body (the handler decodes it itself, to control the errors): the
# schema msgspec derives from RerankRequest, with the sources in their documented order.
RerankOperation = body_operation(RerankRequest, {
    "query": {"minLength": 1, "description": "search text; NFC, trimmed, whitespace collapsed"},
    "source": {"enum": list(SOURCES)},
})


# --------------------------------------------------------------------------- metrics


class ApiMetrics(PipelineMetrics):
    """Prometheus metrics in a registry of their own (one per app)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.requests = Counter("kb_rerank_http_requests_total", "HTTP requests", ["route", "method", "status"],
                                registry=r)
        self.http_latency = Histogram("kb_rerank_http_request_duration_seconds", "HTTP request latency",
                                      ["route"], registry=r)
        self.latency = Histogram("kb_rerank_rerank_duration_seconds", "rerank request latency per source",
                                 ["source"], registry=r)
        self.hits = Counter("kb_rerank_cache_hits_total", "cache hits", ["source"], registry=r)
        self.misses = Counter("kb_rerank_cache_misses_total", "cache misses", ["source"], registry=r)
        self.fallbacks = Counter("kb_rerank_fallbacks_total", "fallback responses", ["source", "reason"], registry=r)
        self.rejected = Counter("kb_rerank_rejected_total", "rejected requests", ["reason"], registry=r)
        self.model_seconds = Histogram("kb_rerank_model_batch_seconds", "cross-encoder scoring time per request",
                                       registry=r, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.model_pairs = Counter("kb_rerank_model_pairs_total", "pairs sent to the cross-encoder", registry=r)
        self.pair_hits = Counter("kb_rerank_pair_cache_hits_total",
                                 "pair scores served from the pair-score cache (non-fallback responses)", registry=r)
        self.pair_misses = Counter("kb_rerank_pair_cache_misses_total",
                                   "pair scores computed by the cross-encoder (non-fallback responses)", registry=r)
        self.model_ready = Gauge("kb_rerank_model_ready", "1 when the cross-encoder is loaded", registry=r)
        self.evicted = Counter("kb_rerank_cache_evicted_total", "expired cache rows evicted", registry=r)
        self.pool_size = Gauge("kb_rerank_db_pool_size", "connections held by the pool (busy + idle)", registry=r)
        self.pool_available = Gauge("kb_rerank_db_pool_available", "idle connections in the pool", registry=r)
        self.pool_waiting = Gauge("kb_rerank_db_pool_waiting", "requests waiting for a connection", registry=r)
        self.inflight = Gauge("kb_rerank_inflight_keys", "cache keys being computed (single flight)", registry=r)

    def cache_hit(self, source: str) -> None:
        self.hits.labels(source).inc()

    def cache_miss(self, source: str) -> None:
        self.misses.labels(source).inc()

    def fallback(self, source: str, reason: str) -> None:
        self.fallbacks.labels(source, reason).inc()

    def model_call(self, seconds: float, pairs: int) -> None:
        self.model_seconds.observe(seconds)
        self.model_pairs.inc(pairs)

    def pair_scores(self, cached: int, scored: int) -> None:
        self.pair_hits.inc(cached)
        self.pair_misses.inc(scored)


def _metrics_middleware(metrics: ApiMetrics):
    def factory(app):
        async def middleware(scope, receive, send):
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            status = {"code": 500}

            async def send_wrapper(message):
                if message["type"] == "http.response.start":
                    status["code"] = message["status"]
                await send(message)

            t0 = time.perf_counter()
            try:
                await app(scope, receive, send_wrapper)
            except BaseException as exc:
                status["code"] = _status_of(exc)
                raise
            finally:
                handler = scope.get("route_handler")
                paths = sorted(getattr(handler, "paths", None) or []) if handler is not None else []
                route = paths[0] if paths else "other"
                metrics.requests.labels(route, scope.get("method", ""), str(status["code"])).inc()
                metrics.http_latency.labels(route).observe(time.perf_counter() - t0)

        return middleware

    return factory


# --------------------------------------------------------------------------- auth


def _auth_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    state = connection.app.state
    headers = connection.headers
    tid = trace_id_from_headers(headers.get("traceparent"), headers.get("x-trace-id"))
    connection.scope.setdefault("state", {})["trace_id"] = tid
    limits: Limits = state.limits  # 429s are LimitExceeded, answered with the trace id set above
    # per client address, before the token is verified: floods of bad tokens are bounded too
    limits.charge_address(connection.client.host if connection.client else None)
    try:
        tenant = tenant_from_authorization(headers.get("authorization"), state.jwt)
    except AuthError as exc:
        state.metrics.rejected.labels("unauthorized").inc()
        raise ApiError(401, {"error": "unauthorized", "reason": exc.reason},
                       headers={"WWW-Authenticate": 'Bearer realm="kb-rerank"', "X-Trace-Id": tid}) from None
    connection.scope["state"]["tenant"] = tenant
    limits.charge(tenant)  # 1 token: the whole cost of a cache hit; costly work is charged before it starts


# --------------------------------------------------------------------------- handlers


@post(RERANK_PATH, status_code=200, operation_class=RerankOperation, responses=ERROR_RESPONSES,
      summary="Rerank search results",
      description="Hybrid/lexical/semantic retrieval, cross-encoder rerank, per-tenant cache and audit.")
async def rerank_handler(request: Request, state: State) -> Response[RerankResponse]:
    scope_state = request.scope["state"]
    trace_id: str = scope_state["trace_id"]
    tenant: uuid.UUID = scope_state["tenant"]
    token = TRACE_ID.set(trace_id)
    try:
        settings: Settings = state.settings
        try:
            req = parse_request(await request.body(), settings)
        except ApiError as exc:
            state.metrics.rejected.labels(exc.payload.get("error", "invalid")).inc()
            log.info("rerank rejected tenant=%s status=%d field=%s", tenant, exc.status_code,
                     exc.payload.get("field"))
            raise
        t0 = time.perf_counter()
        result = await state.service.rerank(tenant, req.query, req.source, trace_id)
        state.metrics.latency.labels(req.source).observe(time.perf_counter() - t0)
        return Response(result, headers={"X-Trace-Id": trace_id})
    finally:
        TRACE_ID.reset(token)


@get("/healthz", include_in_schema=True, sync_to_thread=False)
def healthz() -> dict[str, str]:
    return {"status": "ok"}


async def _db_revision(pool, timeout: float) -> str | None:
    async with pool.connection(timeout=timeout) as conn:
        cur = await conn.execute("select to_regclass('public.kb_alembic_version') is not null")
        if not (await cur.fetchone())[0]:
            return None
        cur = await conn.execute("select version_num from public.kb_alembic_version")
        row = await cur.fetchone()
        return row[0] if row else None


async def _db_layer_version(pool, timeout: float) -> str | None:
    async with pool.connection(timeout=timeout) as conn:
        cur = await conn.execute("select to_regprocedure('kb.schema_layer_version()') is not null")
        if not (await cur.fetchone())[0]:
            return None
        cur = await conn.execute("select kb.schema_layer_version()")
        return (await cur.fetchone())[0]


# Operational endpoints. /metrics (tenant-independent but revealing: traffic, pool, model
# timings) and the detail of /readyz (model name and last load error, schema revision,
# exception names) are for operators only. Chosen: a bearer ops token (KB_OPS_TOKEN) on the
# same listener, not a second listener, because it holds with `--workers N` and behind any
# proxy or port mapping (a second port is easily published by mistake, e.g. the old
# compose file's 0.0.0.0), and Prometheus sends bearer tokens natively
# (`authorization: {credentials: ...}`). Without KB_OPS_TOKEN /metrics is 404 and /readyz
# answers only {"status"} (its status code is unchanged, for load balancers); /healthz is
# public.


def _ops_authorized(request: Request) -> bool:
    """True when ``Authorization: Bearer <KB_OPS_TOKEN>`` matches (constant-time compare)."""
    expected = request.app.state.settings.ops_token
    if not expected:
        return False
    scheme, _, presented = (request.headers.get("authorization") or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.strip().encode("utf-8"), expected.encode("utf-8"))


def _ops_denied(request: Request) -> ApiError:
    if not request.app.state.settings.ops_token:
        return ApiError(404, {"error": "not_found", "detail": "/metrics is disabled: set KB_OPS_TOKEN"})
    request.app.state.metrics.rejected.labels("unauthorized").inc()
    return ApiError(401, {"error": "unauthorized", "reason": "ops_token"},
                    headers={"WWW-Authenticate": 'Bearer realm="kb-rerank-ops"'})


@get("/readyz")
async def readyz(request: Request, state: State) -> Response[dict[str, Any]]:
    info: dict[str, Any] = {"head_revision": state.head_revision}
    rr = state.reranker
    model_state = getattr(rr, "state", "ready" if getattr(rr, "ready", True) else "not_loaded")
    info["model"] = {"name": state.service.model_name, "state": model_state,
                     "ready": bool(getattr(rr, "ready", True)), "last_error": getattr(rr, "last_error", None)}
    status = 200
    try:
        rev = await asyncio.wait_for(_db_revision(state.pool, state.db_timeout_s), state.db_timeout_s + 1)
        info["database"] = "ok"
        info["revision"] = rev
        if rev != state.head_revision:
            info["schema"] = "behind"
            status = 503
        elif await asyncio.wait_for(_db_layer_version(state.pool, state.db_timeout_s),
                                    state.db_timeout_s + 1) != state.layer_version:
            # functions, policies or views of another release (kb.schema_layer_version()):
            # `kb-rerank migrate` re-applies this code's layer
            info["schema"] = "layer_mismatch"
            status = 503
        else:
            info["schema"] = "ok"
    except psycopg.errors.InsufficientPrivilege:
        info["database"] = "ok"
        info["schema"] = "unknown"
    except (psycopg.Error, asyncio.TimeoutError, TimeoutError, OSError) as exc:
        info["database"] = "unavailable"
        info["error"] = type(exc).__name__
        status = 503
    info["status"] = "ready" if status == 200 else "not_ready"
    if not _ops_authorized(request):
        return Response({"status": info["status"]}, status_code=status)  # coarse: no internal detail
    return Response(info, status_code=status)


@get("/metrics", media_type=CONTENT_TYPE_LATEST, include_in_schema=False)
async def metrics_handler(request: Request, state: State) -> Response[bytes]:
    if not _ops_authorized(request):
        raise _ops_denied(request)
    m: ApiMetrics = state.metrics
    m.model_ready.set(1 if getattr(state.reranker, "ready", False) else 0)
    if state.pool is not None:
        stats = state.pool.get_stats()
        m.pool_size.set(stats.get("pool_size", 0))
        m.pool_available.set(stats.get("pool_available", 0))
        m.pool_waiting.set(stats.get("requests_waiting", 0))
    if state.service is not None:
        m.inflight.set(len(state.service._inflight))
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)


# --------------------------------------------------------------------------- lifespan


@dataclass
class _Startup:
    head_revision: str


def _startup_checks(settings: Settings, url: str, timeout_s: float) -> _Startup:
    """Sync checks run once on a thread: the migration head and the embedding dimension.
    A database behind the code refuses the start with what to run, rather than failing
    every request on a missing column."""
    head = db.head_revision()
    with psycopg.connect(url, connect_timeout=max(1, math.ceil(timeout_s))) as conn:
        current = db.current_revision(conn)
        if current != head:
            raise db.DatabaseSetupError(
                f"the database is at migration {current or '(none)'} but this code needs {head}: "
                "run `kb-rerank migrate` first"
            )
        db.check_embedding_dim(conn, settings)
    return _Startup(head_revision=head)


def _maint_url(settings: Settings) -> str | None:
    """Where the eviction loop connects: KB_MAINT_DATABASE_URL, else the owner URL only in
    embedded/dev mode (no database URL configured: the server is ours); None otherwise. The
    app role may not evict (kb.evict_expired_cache counts every tenant's rows)."""
    if settings.maint_database_url:
        return settings.maint_database_url
    if not settings.database_url and not settings.app_database_url:
        return db.owner_url(settings)
    return None


async def _evict_loop(app: Litestar, url: str) -> None:
    st = app.state
    interval = max(1.0, float(st.settings.evict_interval_s))
    while True:
        await asyncio.sleep(interval)
        try:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True,
                                                             connect_timeout=max(1, math.ceil(st.db_timeout_s))) as conn:
                cur = await conn.execute("select kb.evict_expired_cache()")
                n = (await cur.fetchone())[0] or 0
            st.metrics.evicted.inc(n)
            log.info("evicted %d expired cache rows", n)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - eviction retries next interval
            log.warning("cache eviction failed: %s", type(exc).__name__)


@contextlib.asynccontextmanager
async def _lifespan(app: Litestar):
    from psycopg_pool import AsyncConnectionPool

    st = app.state
    settings: Settings = st.settings
    url = db.app_url(settings)
    timeout_s: float = st.db_timeout_s

    async def configure(conn: psycopg.AsyncConnection) -> None:
        await db.aconfigure_connection(conn)

    pool = AsyncConnectionPool(
        url,
        min_size=settings.pool_min,
        max_size=settings.pool_max,
        open=False,
        configure=configure,
        check=AsyncConnectionPool.check_connection,
        kwargs={
            "autocommit": True,
            "options": f"-c statement_timeout={int(settings.statement_timeout_ms)}",
            "connect_timeout": max(1, math.ceil(timeout_s)),
        },
        timeout=timeout_s,
        reconnect_timeout=max(0.0, float(settings.db_reconnect_timeout_s)),
        name="kb-rerank",
    )
    embed_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kb-embed")
    owned_reranker = None
    tasks: list[asyncio.Task] = []
    try:
        startup = await anyio.to_thread.run_sync(_startup_checks, settings, url, timeout_s)
        st.head_revision = startup.head_revision
        await pool.open(wait=True, timeout=max(timeout_s, 10.0))
        st.pool = pool
        if st.embedder is None:
            from .embed import get_embedder

            st.embedder = await anyio.to_thread.run_sync(get_embedder, settings)
        if st.reranker is None:
            from .rerank import Reranker

            owned_reranker = st.reranker = Reranker(
                settings.reranker_model,
                max_length=settings.rerank_max_length,
                batch_size=settings.rerank_batch_size,
                timeout_s=settings.rerank_timeout_s,
            )
        st.service = RerankService(settings, pool, st.embedder, st.reranker, embed_executor=embed_executor,
                                   metrics=st.metrics, limits=st.limits)
        ensure = getattr(st.reranker, "ensure_loaded_async", None)
        if ensure is not None and not getattr(st.reranker, "ready", False):
            tasks.append(asyncio.create_task(ensure(), name="kb-rerank-model-load"))
        if settings.evict_interval_s and settings.evict_interval_s > 0:
            maint = _maint_url(settings)
            if maint is None:
                log.info("cache eviction loop off: set KB_MAINT_DATABASE_URL, or run `kb-rerank evict` from cron")
            else:
                tasks.append(asyncio.create_task(_evict_loop(app, maint), name="kb-rerank-evict"))
        loading = any(t.get_name() == "kb-rerank-model-load" for t in tasks)
        log.info("kb-rerank api ready (model %s%s)", st.service.model_name, ", loading in background" if loading else "")
        yield
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        await pool.close()
        embed_executor.shutdown(wait=False, cancel_futures=True)
        if owned_reranker is not None:
            await anyio.to_thread.run_sync(owned_reranker.close)


# --------------------------------------------------------------------------- factory


def jwt_config(settings: Settings, *, allow_dev_secret: bool = False) -> JwtConfig:
    """The token verification config; refuses what would be unsafe to serve with: no key,
    both keys (which one would verify is a guess), a placeholder or weak secret, an
    ops token that is one. ``allow_dev_secret``: accept the public development secret
    (``kb-rerank serve --dev`` only)."""
    from .cli import DEV_JWT_SECRET  # the CLI owns the development secret

    if not settings.jwt_secret and not settings.jwt_public_key:
        raise ValueError("set KB_JWT_SECRET (HS256) or KB_JWT_PUBLIC_KEY (RS256): the API verifies Bearer tokens")
    if settings.jwt_secret and settings.jwt_public_key:
        raise ValueError("both KB_JWT_SECRET and KB_JWT_PUBLIC_KEY are set: set exactly one "
                         "(KB_JWT_SECRET for HS256 or KB_JWT_PUBLIC_KEY for RS256)")
    if settings.jwt_secret and not (allow_dev_secret and settings.jwt_secret == DEV_JWT_SECRET):
        check_secret("KB_JWT_SECRET", settings.jwt_secret)
    if settings.ops_token:
        check_secret("KB_OPS_TOKEN", settings.ops_token)
    return JwtConfig(
        secret=settings.jwt_secret or None,
        public_key=settings.jwt_public_key or None,
        issuer=settings.jwt_issuer,
        audience=settings.jwt_audience,
        max_lifetime_s=settings.jwt_max_lifetime_s,
    )


def create_app(settings: Settings, *, reranker=None, embedder=None, dev: bool = False) -> Litestar:
    """A new app for ``settings``. ``reranker`` / ``embedder`` given here are used as they
    are (and not closed at shutdown); when None they are built by the lifespan. ``dev``:
    accept the public development secret (``kb-rerank serve --dev``)."""
    install_trace_log_records()
    metrics = ApiMetrics()
    state = State({
        "settings": settings,
        "jwt": jwt_config(settings, allow_dev_secret=dev),
        "metrics": metrics,
        "reranker": reranker,
        "embedder": embedder,
        "db_timeout_s": max(0.1, float(settings.db_timeout_s)),
        "limits": (limits := Limits.from_settings(settings, on_reject=lambda r: metrics.rejected.labels(r).inc())),
        "rate_limiter": limits.tenant_rate,
        "head_revision": None,
        "layer_version": sqlfiles.layer_version(embedding_dim=settings.embedding_dim),  # /readyz
        "pool": None,
        "service": None,
    })
    from .v2 import context_handler, v2_rerank_handler  # imported here: kb_rerank.v2 imports this module

    # Each body route's limit is set here from the settings, on a router of its own, so it is
    # the limit Litestar enforces while reading (from the Content-Length before reading, then
    # on the bytes streamed): nothing over it is buffered. The handlers set no limit of their
    # own (a handler's would win over its router's).
    # security: the bearer scheme on every guarded route (not /healthz, /readyz), so that the
    # interactive docs (/schema) send the token
    v1 = Router(path="/", guards=[_auth_guard], security=SECURITY, route_handlers=[
        Router(path="/", route_handlers=[rerank_handler, context_handler],
               request_max_body_size=settings.max_body_bytes),  # POST /v1/kb/search/rerank, /v1/kb/context
        Router(path="/", route_handlers=[v2_rerank_handler],
               request_max_body_size=settings.v2_max_body_bytes),  # POST /v2/rerank
    ])
    return Litestar(
        route_handlers=[v1, healthz, readyz, metrics_handler],
        state=state,
        lifespan=[_lifespan],
        middleware=[_metrics_middleware(metrics)],
        exception_handlers={
            ApiError: _api_error_handler,
            LimitExceeded: _api_error_handler,  # 429 with Retry-After and a JSON body (kb_rerank.limits)
            RequestEntityTooLarge: _too_large_handler,
            psycopg.OperationalError: _db_error_handler,
        },
        request_max_body_size=settings.max_body_bytes,
        openapi_config=OpenAPIConfig(
            title="kb-rerank",
            version=_version,
            description="Multi-tenant hybrid search with cross-encoder reranking.",
            path="/schema",
            render_plugins=[SwaggerRenderPlugin()],
            components=SECURITY_COMPONENTS,
        ),
    )


def app_from_env() -> Litestar:
    """uvicorn factory (``kb-rerank serve``): settings from ``KB_*``. ``KB_SERVE_DEV=1`` is
    set by ``kb-rerank serve --dev`` (inherited by the workers) to accept the dev secret."""
    return create_app(Settings.from_env(), dev=os.environ.get("KB_SERVE_DEV") == "1")
