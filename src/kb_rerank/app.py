"""The app factory (Litestar): routes from :mod:`kb_rerank.endpoints`, the auth guard, error
handlers, telemetry, and the lifespan that builds the pool, the models and the
:class:`~kb_rerank.endpoints.runner.Pipeline`.

``create_app(settings, reranker=None, embedder=None)`` builds a new app; nothing lives at
module level (no pool, model or settings). The lifespan opens ONE AsyncConnectionPool as
the app role (``KB_APP_ROLE``, ``kb_app`` by default; autocommit connections,
``statement_timeout`` from settings, pgvector registered), checks the database's embedding
dimension, builds the embedder and the reranker when not given (the model loads in the
background: until it is ready the v1 routes answer honest fallbacks, ``/v2/rerank`` a 503,
and ``/readyz`` says ``degraded``), starts the periodic cache eviction, and closes all of
it on shutdown. A reranker or embedder passed in belongs to the caller and is not closed.

Endpoints
---------
* ``POST /v1/kb/search/rerank``, ``POST /v1/kb/context``, ``POST /v2/rerank`` -- Bearer JWT
  (tenant claim; a static key or a JWKS, :mod:`kb_rerank.http.auth`); one folder each under :mod:`kb_rerank.endpoints`, one handler body
  (:mod:`kb_rerank.endpoints.serve`), one flow each beside its route.
* ``GET /v1/kb/documents`` -- Bearer JWT: the tenant's documents, keyset paged
  (:mod:`kb_rerank.endpoints.documents.route`).
* ``GET /healthz`` -- 200 while the process runs.
* ``GET /readyz`` -- ``ready`` (200) when the database answers, its schema is at the
  migrations' head with this code's idempotent layer (kb.schema_layer_version()) and the
  model is ready; ``degraded`` when only the model is not (loading, failed, absent: 503, or
  200 with ``KB_READY_WHEN_DEGRADED=true``); ``not_ready`` (503) otherwise. Only
  ``{"status"}`` unless the request carries ``Authorization: Bearer <ops_token>``.
* ``GET /metrics`` -- Prometheus text, from a registry owned by the app; needs the ops
  token (401 without it; 404 when no ops token is configured).
* ``GET /playground`` -- the search playground page (:mod:`kb_rerank.endpoints.playground.route`);
  ``POST /playground/dev-token`` exists only under ``serve --dev`` with the development secret.
* ``GET /schema/openapi.json`` and ``/schema`` (the reference page, plain HTML without script,
  :mod:`kb_rerank.endpoints.docs.route`; 404 with ``KB_DOCS_PAGE`` off): the three JSON routes'
  request bodies, answers and error responses (:mod:`kb_rerank.endpoints.schemas`), and the bearer
  scheme (HTTP bearer, JWT) they require.

Traces: with ``OTEL_EXPORTER_OTLP_ENDPOINT`` set (or a ``span_exporter`` given), one OpenTelemetry
trace per request (:mod:`kb_rerank.http.tracing`, the ``[otel]`` extra); otherwise none, and the
SDK is never imported.

Errors are JSON: ``{"error": ..., ...}``, for every status (404 ``not_found``, 405
``method_not_allowed`` with ``Allow``, 500 ``internal_server_error``: :mod:`kb_rerank.http.errors`).
401 ``unauthorized`` with ``reason`` (``wrong_scheme`` for another scheme than Bearer); 415
``unsupported_media_type`` for a body that is not JSON by its Content-Type; 400
``invalid_json``; 422 ``invalid_request`` with ``field`` and ``detail`` (and ``allowed``
for an unknown source) -- bodies decoded by :mod:`kb_rerank.http.body` (:mod:`kb_rerank.endpoints.parse`), the same on the three
routes; 413 ``payload_too_large`` (refused while reading, from the Content-Length or as
the streamed bytes pass the route's limit); 429 ``rate_limited`` with ``Retry-After`` (per-tenant
token bucket: ``rate_limit_per_minute`` refill, ``rate_limit_burst`` size; 0 disables);
503 ``database_unavailable`` with ``Retry-After`` when no database connection is had
within ``db_timeout_s``; 503 ``model_unavailable`` with ``reason`` and ``Retry-After`` from
``/v2/rerank`` when no model can score (``KB_V2_FALLBACK=error``, the default). A rejected request
writes nothing (no cache row, no audit row); it is counted in the metrics only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import sys
from dataclasses import dataclass

import anyio
import psycopg
from litestar import Litestar, Router
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR
from litestar.logging import LoggingConfig
from litestar.openapi import OpenAPIConfig

from kb_rerank import __version__ as _version
from kb_rerank.db import layer as sqlfiles
from kb_rerank.db import database
from kb_rerank.http.auth import JwksKeys, JwtConfig, auth_guard, check_secret
from kb_rerank.http.body import ApiError
from kb_rerank.http.errors import (api_error_handler, db_error_handler, http_error_handler,
                                   model_unavailable_handler, too_large_handler)
from kb_rerank.endpoints.context.route import context_handler
from kb_rerank.endpoints.documents.route import documents_handler
from kb_rerank.endpoints.docs.route import render_plugins as docs_render_plugins
from kb_rerank.endpoints.ops.route import healthz, metrics_handler, readyz
from kb_rerank.endpoints.playground.route import playground_routes
from kb_rerank.endpoints.search.route import rerank_handler
from kb_rerank.endpoints.v2_rerank.route import v2_rerank_handler
from kb_rerank.endpoints.schemas import SECURITY, SECURITY_COMPONENTS
from kb_rerank.http.telemetry import ApiMetrics, install_trace_log_records, metrics_middleware, otel_wanted
from kb_rerank.rerank.compose import ModelUnavailable
from kb_rerank.core.embedding import EmbedPool
from kb_rerank.endpoints.runner import Pipeline
from kb_rerank.core.limits import LimitExceeded, Limits
from kb_rerank.core.settings import Settings
from kb_rerank.cache import eviction as cache_eviction
from kb_rerank.core.session import aconfigure_connection

log = logging.getLogger(__name__)


@dataclass
class _Startup:
    head_revision: str


def _startup_checks(settings: Settings, url: str, timeout_s: float) -> _Startup:
    """Sync checks run once on a thread: the migration head and the embedding dimension.
    A database behind the code refuses the start with what to run, rather than failing
    every request on a missing column."""
    head = database.head_revision()
    with psycopg.connect(url, connect_timeout=max(1, math.ceil(timeout_s))) as conn:
        current = database.current_revision(conn)
        if current != head:
            raise database.DatabaseSetupError(
                f"the database is at migration {current or '(none)'} but this code needs {head}: "
                "run `kb-rerank migrate` first"
            )
        database.check_embedding_dim(conn, settings)
    return _Startup(head_revision=head)


def _maint_url(settings: Settings) -> str | None:
    """Where the eviction loop connects: KB_MAINT_DATABASE_URL, else the owner URL only in
    embedded/dev mode (no database URL configured: the server is ours); None otherwise. The
    app role may not evict (kb.evict_expired_cache counts every tenant's rows)."""
    if settings.maint_database_url:
        return settings.maint_database_url
    if not settings.database_url and not settings.app_database_url:
        return database.owner_url(settings)
    return None


async def _evict_loop(app: Litestar, url: str) -> None:
    st = app.state
    interval = max(1.0, float(st.settings.evict_interval_s))
    while True:
        await asyncio.sleep(interval)
        try:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True,
                                                             connect_timeout=max(1, math.ceil(st.db_timeout_s))) as conn:
                n = await cache_eviction.aevict_expired(conn)
            st.metrics.evicted.inc(n)
            log.info("evicted %d expired cache rows", n)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - eviction retries next interval
            log.warning("cache eviction failed: %s", type(exc).__name__)


def _pool(url: str, settings: Settings, timeout_s: float, *, name: str, min_size: int | None = None):
    """A connection pool of the app role (the primary's, or a read replica's)."""
    from psycopg_pool import AsyncConnectionPool

    async def configure(conn: psycopg.AsyncConnection) -> None:
        await aconfigure_connection(conn, settings)

    return AsyncConnectionPool(
        url,
        min_size=settings.pool_min if min_size is None else min_size,
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
        name=name,
    )


@contextlib.asynccontextmanager
async def _lifespan(app: Litestar):
    st = app.state
    settings: Settings = st.settings
    url = database.app_url(settings)
    timeout_s: float = st.db_timeout_s

    pool = _pool(url, settings, timeout_s, name="kb-rerank")
    replicas = None
    if settings.read_database_url:
        from kb_rerank.db.replicas import ReadReplicas, Standby, label, standby_urls

        # a standby that does not answer gives its reads to the primary quickly (its pool's
        # wait is short); health and lag are checked in the background
        wait_s = min(timeout_s, 2.0)
        replicas = ReadReplicas(
            [Standby(u, label(u), _pool(u, settings, wait_s, name=f"kb-rerank-read-{i}"))
             for i, u in enumerate(standby_urls(settings))],
            primary_pool=pool, max_lag_s=settings.max_replica_lag_s,
            interval_s=settings.replica_check_interval_s, check_timeout_s=wait_s)
    embedding = None
    owned_reranker = None
    tasks: list[asyncio.Task] = []
    try:
        startup = await anyio.to_thread.run_sync(_startup_checks, settings, url, timeout_s)
        st.head_revision = startup.head_revision
        await pool.open(wait=True, timeout=max(timeout_s, 10.0))
        if replicas is not None:
            await replicas.open()
            log.info("read replicas: %s", replicas.describe())
        embedder, reranker = st.given_models
        if embedder is None:
            embedder = await anyio.to_thread.run_sync(build_embedders, settings)
        else:  # the caller's: one worker
            embedder = EmbedPool([embedder], unit_chars=settings.embed_unit_chars)
        embedding = embedder
        if reranker is None:
            owned_reranker = reranker = build_reranker(settings)
        st.pipeline = Pipeline(settings, pool, embedder, reranker,
                               metrics=st.metrics, limits=st.limits, replicas=replicas)
        if not reranker.ready:
            tasks.append(asyncio.create_task(reranker.ensure_loaded_async(), name="kb-rerank-model-load"))
        if settings.evict_interval_s and settings.evict_interval_s > 0:
            maint = _maint_url(settings)
            if maint is None:
                log.info("cache eviction loop off: set KB_MAINT_DATABASE_URL, or run `kb-rerank evict` from cron")
            else:
                tasks.append(asyncio.create_task(_evict_loop(app, maint), name="kb-rerank-evict"))
        loading = any(t.get_name() == "kb-rerank-model-load" for t in tasks)
        log.info("kb-rerank api ready (model %s%s)", st.pipeline.model_name, ", loading in background" if loading else "")
        yield
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        if replicas is not None:
            await replicas.close()
        await pool.close()
        if embedding is not None:
            embedding.close()
        if owned_reranker is not None:
            aclose = getattr(owned_reranker, "aclose", None)
            if aclose is not None:
                await aclose()
            else:
                await anyio.to_thread.run_sync(owned_reranker.close)
        if st.tracing is not None:  # the spans still batched are sent
            await anyio.to_thread.run_sync(st.tracing.shutdown)


def build_embedders(settings: Settings) -> EmbedPool:
    """``KB_EMBED_WORKERS`` embedders (0: two where the machine has two cores or more, else
    one), each with its share of the cores, behind one fair pool (:mod:`kb_rerank.core.embedding`)."""
    from kb_rerank.models.embedders import get_embedder

    cores = os.cpu_count() or 1
    workers = settings.embed_workers or min(2, cores)
    threads = max(1, cores // workers)
    return EmbedPool([get_embedder(settings, num_threads=threads) for _ in range(workers)],
                     unit_chars=settings.embed_unit_chars)


def build_reranker(settings: Settings):
    """The cross-encoder of ``KB_RERANKER_BACKEND``: ``flag`` (in process, loads in the
    background), ``onnx`` (the same, from ``kb-rerank model export``'s ONNX file, run by
    ONNX Runtime: :mod:`kb_rerank.models.onnx`) or ``remote`` (an inference server,
    :mod:`kb_rerank.models.remote`)."""
    if settings.reranker_backend == "remote":
        from kb_rerank.models.remote import RemoteReranker

        return RemoteReranker(settings.reranker_url, model_name=settings.reranker_model,
                              api_key=settings.reranker_api_key or None, timeout_s=settings.rerank_timeout_s)
    common = {"max_length": settings.rerank_max_length, "batch_size": settings.rerank_batch_size,
              "timeout_s": settings.rerank_timeout_s, "unit_ms": settings.rerank_unit_ms}
    if settings.reranker_backend == "onnx":
        from kb_rerank.models.onnx import QUANTIZE_CHOICES, OnnxReranker

        if settings.reranker_onnx_quantize not in QUANTIZE_CHOICES:
            raise ValueError(f"KB_RERANKER_ONNX_QUANTIZE={settings.reranker_onnx_quantize!r}: "
                             f"choose {' or '.join(QUANTIZE_CHOICES)}")
        return OnnxReranker(settings.reranker_model, export_root=settings.onnx_export_root,
                            quantize=settings.reranker_onnx_quantize, threads=settings.reranker_threads, **common)
    if settings.reranker_backend != "flag":
        raise ValueError(f"KB_RERANKER_BACKEND={settings.reranker_backend!r}: choose flag, onnx or remote")
    from kb_rerank.models.cross_encoder import Reranker

    return Reranker(settings.reranker_model, **common)


def jwt_config(settings: Settings, *, allow_dev_secret: bool = False) -> JwtConfig:
    """The token verification config; refuses what would be unsafe to serve with: no key,
    two key sources (which one would verify is a guess), a placeholder or weak secret, an
    ops token that is one, a JWKS over plain http to another machine. ``allow_dev_secret``: accept the public development secret
    (``kb-rerank serve --dev`` only)."""
    from kb_rerank.core.dev import DEV_JWT_SECRET

    sources = [name for name, value in (("KB_JWT_SECRET", settings.jwt_secret),
                                        ("KB_JWT_PUBLIC_KEY", settings.jwt_public_key),
                                        ("KB_JWT_JWKS_URL", settings.jwt_jwks_url)) if value]
    if not sources:
        raise ValueError("set KB_JWT_SECRET (HS256), KB_JWT_PUBLIC_KEY (RS256, ES256, EdDSA) or KB_JWT_JWKS_URL: "
                         "the API verifies Bearer tokens")
    if len(sources) > 1:
        raise ValueError(f"{' and '.join(sources)} are set: set exactly one "
                         "(KB_JWT_SECRET for HS256, KB_JWT_PUBLIC_KEY for a PEM public key, KB_JWT_JWKS_URL for a JWKS)")
    if settings.jwt_secret and not (allow_dev_secret and settings.jwt_secret == DEV_JWT_SECRET):
        check_secret("KB_JWT_SECRET", settings.jwt_secret)
    if settings.ops_token:
        check_secret("KB_OPS_TOKEN", settings.ops_token)
    return JwtConfig(
        secret=settings.jwt_secret or None,
        public_key=settings.jwt_public_key or None,
        jwks_url=settings.jwt_jwks_url or None,
        issuer=settings.jwt_issuer or None,
        audience=settings.jwt_audience or None,
        tenant_claim=settings.jwt_tenant_claim,
        max_lifetime_s=settings.jwt_max_lifetime_s,
        jwks_timeout_s=settings.jwt_jwks_timeout_s,
        jwks_max_age_s=settings.jwt_jwks_max_age_s,
        jwks_min_refresh_s=settings.jwt_jwks_min_refresh_s,
    )


def _status_of(exc: BaseException) -> int:
    """The status an exception is answered with by the app's handlers: its ``status_code``
    (Litestar's HTTP exceptions, ApiError, LimitExceeded), 503 for a database error
    (db_error_handler) or no model able to score (model_unavailable_handler), 500 for anything else."""
    if isinstance(exc, (psycopg.OperationalError, ModelUnavailable)):
        return 503
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else 500


def _log_server_error(logger: logging.Logger, scope, tb: list[str]) -> None:
    """Litestar's exception logging (called while the exception is handled): a 5xx is logged
    at ERROR with its traceback (a 503 ``model_unavailable`` at INFO, one line: a model still
    loading is a state, not a bug, and would flood the log); a 4xx only at DEBUG, one line without traceback (its access
    record, kb_rerank.access, already says route and status). A database error (unavailable,
    statement timeout) is logged by its handler, one line, without traceback."""
    exc = sys.exc_info()[1]
    status = _status_of(exc) if exc is not None else 500
    if isinstance(exc, ModelUnavailable):  # no model could score: the score step logged why, once
        logger.info("503 model_unavailable reason=%s (%s %s)", exc.reason, scope.get("method", ""),
                    scope.get("path", ""))
    elif isinstance(exc, psycopg.OperationalError):  # db_error_handler logged it, one line
        logger.debug("503 %s (%s %s)", type(exc).__name__, scope.get("method", ""), scope.get("path", ""))
    elif status >= 500:
        logger.exception("unhandled error %d (%s %s)", status, scope.get("method", ""), scope.get("path", ""))
    else:
        logger.debug("%d %s (%s %s)", status, type(exc).__name__, scope.get("method", ""), scope.get("path", ""))


def create_app(settings: Settings, *, reranker=None, embedder=None, dev: bool = False,
               span_exporter=None) -> Litestar:
    """A new app for ``settings``. ``reranker`` / ``embedder`` given here are used as they
    are (and not closed at shutdown); when None they are built by the lifespan. ``dev``:
    accept the public development secret (``kb-rerank serve --dev``). ``span_exporter``: an
    OpenTelemetry SpanExporter the app's traces go to (tests); without one the app traces only
    when the environment asks (OTEL_EXPORTER_OTLP_ENDPOINT: :mod:`kb_rerank.http.tracing`)."""
    install_trace_log_records()
    tracing = None
    if span_exporter is not None or otel_wanted():
        from kb_rerank.http import tracing as otel

        tracing = otel.setup(span_exporter)
    metrics = ApiMetrics()
    jwt_cfg = jwt_config(settings, allow_dev_secret=dev)
    state = State({
        "settings": settings,
        "jwt": jwt_cfg,
        "jwks": JwksKeys(jwt_cfg) if jwt_cfg.jwks_url is not None else None,  # keys fetched on first use
        "metrics": metrics,
        "given_models": (embedder, reranker),  # the caller's (None: built by the lifespan)
        "db_timeout_s": max(0.1, float(settings.db_timeout_s)),
        # the auth guard charges each request's token before the pipeline sees it
        "limits": Limits.from_settings(settings, on_reject=lambda r: metrics.rejected.labels(r).inc()),
        "head_revision": None,
        "layer_version": sqlfiles.layer_version(embedding_dim=settings.embedding_dim,  # /readyz
                                                app_role=settings.app_role),
        "pipeline": None,  # the pool, the replicas, the models: built by the lifespan
        "tracing": tracing,  # kb_rerank.http.tracing.Tracing, or None (not tracing)
    })

    # Each body route's limit is set here from the settings, on a router of its own, so it is
    # the limit Litestar enforces while reading (from the Content-Length before reading, then
    # on the bytes streamed): nothing over it is buffered. The handlers set no limit of their
    # own (a handler's would win over its router's).
    # security: the bearer scheme on every guarded route (not /healthz, /readyz), so that the
    # OpenAPI document says which routes need a token
    v1 = Router(path="/", guards=[auth_guard], security=SECURITY, route_handlers=[
        Router(path="/", route_handlers=[rerank_handler, context_handler],
               request_max_body_size=settings.max_body_bytes),  # POST /v1/kb/search/rerank, /v1/kb/context
        Router(path="/", route_handlers=[v2_rerank_handler],
               request_max_body_size=settings.v2_max_body_bytes),  # POST /v2/rerank
        documents_handler,  # GET /v1/kb/documents
    ])
    return Litestar(
        # the playground page (no guard: the page holds no data; its requests carry the token)
        route_handlers=[v1, healthz, readyz, metrics_handler, *playground_routes(settings, dev=dev)],
        state=state,
        lifespan=[_lifespan],
        # the trace id is decided first (metrics_middleware), then the server span is opened with it
        middleware=[metrics_middleware(metrics), *([tracing.middleware()] if tracing is not None else [])],
        exception_handlers={
            ApiError: api_error_handler,
            LimitExceeded: api_error_handler,  # 429 with Retry-After and a JSON body (kb_rerank.core.limits)
            RequestEntityTooLarge: too_large_handler,
            psycopg.OperationalError: db_error_handler,
            ModelUnavailable: model_unavailable_handler,  # /v2/rerank, KB_V2_FALLBACK=error: 503, Retry-After
            # Litestar's own (404, 405 with Allow, ...) and any unhandled exception: the API's body
            HTTPException: http_error_handler,
            HTTP_500_INTERNAL_SERVER_ERROR: http_error_handler,
        },
        request_max_body_size=settings.max_body_bytes,
        # the process owns the log format (kb_rerank.core.logs): Litestar leaves the root logger
        # alone and its records go to the root's handlers. Only a 5xx is logged, with its
        # traceback (_log_server_error); a 4xx is the client's doing and already has its access
        # record, so a flood of 401s or 404s writes one short line each, not a traceback.
        logging_config=LoggingConfig(configure_root_logger=False, log_exceptions="always",
                                     exception_logging_handler=_log_server_error,
                                     loggers={"litestar": {"level": "INFO", "handlers": [], "propagate": True}}),
        # /schema: a page rendered here, without script, or 404 with KB_DOCS_PAGE off;
        # /schema/openapi.json either way (kb_rerank.endpoints.docs.route)
        openapi_config=OpenAPIConfig(
            title="kb-rerank",
            version=_version,
            description="Multi-tenant hybrid search with cross-encoder reranking.",
            path="/schema",
            render_plugins=docs_render_plugins(settings.docs_page),
            components=SECURITY_COMPONENTS,
        ),
    )


def app_from_env() -> Litestar:
    """uvicorn factory (``kb-rerank serve``): settings from ``KB_*``. ``KB_SERVE_DEV=1`` is
    set by ``kb-rerank serve --dev`` (inherited by the workers) to accept the dev secret."""
    return create_app(Settings.from_env(), dev=os.environ.get("KB_SERVE_DEV") == "1")
