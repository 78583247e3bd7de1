"""Operational endpoints: ``/healthz`` (public), ``/readyz`` (status public, detail for the ops
token) and ``/metrics`` (ops token)."""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

import psycopg
from litestar import Request, Response, get
from litestar.datastructures import State
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kb_rerank.http.body import ApiError
from kb_rerank.http.telemetry import ApiMetrics
from kb_rerank.rerank import scoring
from kb_rerank.endpoints.requests import DEFAULT_SOURCE
from kb_rerank.retrieval.spec import RetrievalSpec
from kb_rerank.db import schema_state

# Operational endpoints. /metrics (tenant-independent but revealing: traffic, pool, model
# timings) and the detail of /readyz (model name and last load error, schema revision,
# exception names) are for operators only. Chosen: a bearer ops token (KB_OPS_TOKEN) on the
# same listener, not a second listener, because it holds with `--workers N` and behind any
# proxy or port mapping (a second port is easily published by mistake, e.g. the old
# compose file's 0.0.0.0), and Prometheus sends bearer tokens natively
# (`authorization: {credentials: ...}`). Without KB_OPS_TOKEN /metrics is 404 and /readyz
# answers only {"status"} (its status code is unchanged, for load balancers); /healthz is
# public.
#
# /readyz's status: `ready` (200: database and schema at head, the model ready), `degraded`
# (the database is fine, the model is not: loading, failed, absent, or a remote server that
# does not answer a one-passage rerank; 503 unless
# KB_READY_WHEN_DEGRADED=true, then 200), `not_ready` (503: database unavailable or schema
# behind / of another release). Default 503 for degraded, as TEI answers until its model is
# loaded: a rollout waits for the new replicas' models, and a fleet routes around the replica
# whose model failed (its answers would be fallbacks while the others rank). A single replica
# that should keep answering with honest fallbacks sets KB_READY_WHEN_DEGRADED=true.


@get("/healthz", include_in_schema=True, sync_to_thread=False)
def healthz() -> dict[str, str]:
    return {"status": "ok"}


async def _db_revision(pool, timeout: float) -> str | None:
    async with pool.connection(timeout=timeout) as conn:
        return await schema_state.arevision(conn)


async def _db_layer_version(pool, timeout: float) -> str | None:
    async with pool.connection(timeout=timeout) as conn:
        return await schema_state.alayer_version(conn)


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
    pipe = state.pipeline
    rr = pipe.reranker
    if rr is not None and hasattr(rr, "probe"):
        await rr.probe()  # a remote server: whether it scores now (a recent verdict is reused)
    model_ready = rr is not None and bool(getattr(rr, "ready", True))
    model_state = "absent" if rr is None else getattr(rr, "state", "ready" if model_ready else "not_loaded")
    info["model"] = {"name": pipe.model_name, "backend": getattr(rr, "backend", "flag") if rr is not None else None,
                     "state": model_state,
                     "ready": model_ready, "last_error": getattr(rr, "last_error", None)}
    budget = pipe.settings.rerank_budget_ms
    within = scoring.budget_pairs(rr, budget)
    if within is not None:
        # what this machine affords: the measured cost, and how many of a hybrid search's
        # candidates the budget lets the model score (at the length live batches have)
        hybrid = RetrievalSpec.of(pipe.settings, DEFAULT_SOURCE).limit
        info["model"]["rerank_budget"] = {
            "budget_ms": budget, "unit_ms": pipe.settings.rerank_unit_ms, **rr.cost.snapshot(),
            "candidates": hybrid, "scored_within_budget": min(within, hybrid)}
    status = 200
    try:
        rev = await asyncio.wait_for(_db_revision(pipe.pool, state.db_timeout_s), state.db_timeout_s + 1)
        info["database"] = "ok"
        info["revision"] = rev
        if rev != state.head_revision:
            info["schema"] = "behind"
            status = 503
        elif await asyncio.wait_for(_db_layer_version(pipe.pool, state.db_timeout_s),
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
    # read replicas: which server serves reads now, each standby's health and lag. A standby
    # down or behind does not make the service unready: its reads go to the primary.
    info["reads"] = pipe.replicas.describe() if pipe.replicas is not None else {"reads": "primary", "standbys": []}
    if status != 200:
        info["status"] = "not_ready"
    elif not model_ready:
        # the database is fine, the model is not (loading, failed, absent): answers are honest
        # fallbacks (v1) or 503s (/v2/rerank); whether to route here is the operator's choice
        info["status"] = "degraded"
        status = 200 if pipe.settings.ready_when_degraded else 503
    else:
        info["status"] = "ready"
    if not _ops_authorized(request):
        return Response({"status": info["status"]}, status_code=status)  # coarse: no internal detail
    return Response(info, status_code=status)


@get("/metrics", media_type=CONTENT_TYPE_LATEST, include_in_schema=False)
async def metrics_handler(request: Request, state: State) -> Response[bytes]:
    if not _ops_authorized(request):
        raise _ops_denied(request)
    m: ApiMetrics = state.metrics
    pipe = state.pipeline
    if pipe is not None:
        m.model_ready.set(1 if getattr(pipe.reranker, "ready", False) else 0)
        stats = pipe.pool.get_stats()
        m.pool_size.set(stats.get("pool_size", 0))
        m.pool_available.set(stats.get("pool_available", 0))
        m.pool_waiting.set(stats.get("requests_waiting", 0))
        m.inflight.set(pipe.inflight)
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
