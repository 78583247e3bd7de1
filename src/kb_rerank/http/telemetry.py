"""Telemetry: the request's trace id (W3C ``traceparent`` / ``X-Trace-Id``, on every log
record of the request) and the Prometheus metrics (the pipeline's counters and the HTTP
middleware)."""

from __future__ import annotations

import contextvars
import logging
import os
import re
import time
import uuid
from typing import Any, Mapping

import psycopg
from litestar.exceptions import HTTPException
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kb_rerank.http.body import ApiError
from kb_rerank.core.metrics import PipelineMetrics
from kb_rerank.core.limits import LimitExceeded


_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


_TRACE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def trace_id_from_headers(traceparent: str | None, x_trace_id: str | None) -> str:
    """W3C ``traceparent``'s trace-id when valid, else a valid ``X-Trace-Id``
    (1..64 of ``[A-Za-z0-9_-]``), else a new uuid4 hex. Invalid values are ignored."""
    if traceparent:
        m = _TRACEPARENT.match(traceparent.strip().lower())
        if m and m.group(1) != "ff" and m.group(2) != "0" * 32 and m.group(3) != "0" * 16:
            if m.group(1) != "00" or m.group(5) is None:
                return m.group(2)
    if x_trace_id is not None:
        value = x_trace_id.strip()
        if _TRACE_ID.match(value):
            return value
    return uuid.uuid4().hex


def otel_wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for OpenTelemetry traces (:mod:`kb_rerank.http.tracing`):
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set, and neither
    ``OTEL_SDK_DISABLED=true`` nor ``OTEL_TRACES_EXPORTER=none``. Imports nothing of OpenTelemetry."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
                or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip())


TRACE_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("kb_rerank_trace_id", default=None)
# the authenticated tenant of the request (set by the auth guard), on every later log record
TENANT_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("kb_rerank_tenant_id", default=None)
access_log = logging.getLogger("kb_rerank.access")


_factory_installed = False


def install_trace_log_records() -> None:
    """Give every LogRecord ``trace_id`` and ``tenant_id`` attributes (the current request's,
    or None), via the record factory, so they reach every handler (caplog included) and the
    JSON formatter (:mod:`kb_rerank.core.logs`). Idempotent."""
    global _factory_installed
    if _factory_installed:
        return
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if not hasattr(record, "trace_id"):
            record.trace_id = TRACE_ID.get()
        if not hasattr(record, "tenant_id"):
            record.tenant_id = TENANT_ID.get()
        return record

    logging.setLogRecordFactory(factory)
    _factory_installed = True


def _status_of(exc: BaseException) -> int:
    if isinstance(exc, (ApiError, HTTPException, LimitExceeded)):
        return int(exc.status_code)
    if isinstance(exc, psycopg.OperationalError):
        return 503
    return 500


class ApiMetrics(PipelineMetrics):
    """Prometheus metrics in a registry of their own (one per app)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.requests = Counter("kb_rerank_http_requests_total", "HTTP requests", ["route", "method", "status"],
                                registry=r)
        self.http_latency = Histogram("kb_rerank_http_request_duration_seconds", "HTTP request latency",
                                      ["route"], registry=r)
        self.latency = Histogram("kb_rerank_rerank_duration_seconds", "latency of answered requests (hit or miss) per source, every JSON route",
                                 ["source"], registry=r)
        self.hits = Counter("kb_rerank_cache_hits_total", "cache hits", ["source"], registry=r)
        self.misses = Counter("kb_rerank_cache_misses_total", "cache misses", ["source"], registry=r)
        self.fallbacks = Counter("kb_rerank_fallbacks_total", "fallback responses", ["source", "reason"], registry=r)
        self.partials = Counter("kb_rerank_partial_answers_total",
                                "answers the cross-encoder ranked only in part (reason: budget)", ["source", "reason"],
                                registry=r)
        self.rejected = Counter("kb_rerank_rejected_total", "rejected requests", ["reason"], registry=r)
        self.abandoned = Counter("kb_rerank_abandoned_total", "requests whose client disconnected before the"
                                 " answer: their work cancelled (answered 499 to nobody)", ["route"], registry=r)
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

    def partial(self, source: str, reason: str) -> None:
        self.partials.labels(source, reason).inc()

    def model_call(self, seconds: float, pairs: int) -> None:
        self.model_seconds.observe(seconds)
        self.model_pairs.inc(pairs)

    def pair_scores(self, cached: int, scored: int) -> None:
        self.pair_hits.inc(cached)
        self.pair_misses.inc(scored)

    def served(self, source: str, seconds: float) -> None:
        self.latency.labels(source).observe(seconds)


def route_of(scope) -> str:
    """What the access log and the traces record of a request's URL: its route template
    (``/v1/kb/documents/{document_id:str}``), never the path's values or the query string
    (a cursor, a filter); ``other`` where no route matched."""
    handler = scope.get("route_handler")
    paths = sorted(getattr(handler, "paths", None) or []) if handler is not None else []
    return paths[0] if paths else "other"


def metrics_middleware(metrics: ApiMetrics):
    """Counts and times every HTTP request, and writes its access record (logger
    ``kb_rerank.access``: route template, method, status, duration; never the URL's query
    string or the body). The trace id is decided here, so that every record of the request,
    401s included, carries it; the auth guard adds the tenant."""
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

            headers = {k: v for k, v in scope.get("headers", ()) if k in (b"traceparent", b"x-trace-id")}
            tid = trace_id_from_headers(headers.get(b"traceparent", b"").decode("latin-1") or None,
                                        (headers[b"x-trace-id"].decode("latin-1") if b"x-trace-id" in headers else None))
            scope.setdefault("state", {})["trace_id"] = tid
            trace_token, tenant_token = TRACE_ID.set(tid), TENANT_ID.set(None)
            t0 = time.perf_counter()
            try:
                await app(scope, receive, send_wrapper)
            except BaseException as exc:
                status["code"] = _status_of(exc)
                raise
            finally:
                seconds = time.perf_counter() - t0
                route = route_of(scope)
                metrics.requests.labels(route, scope.get("method", ""), str(status["code"])).inc()
                metrics.http_latency.labels(route).observe(seconds)
                access_log.info("%s %s %d %.1f ms", scope.get("method", ""), route, status["code"], seconds * 1000,
                                extra={"route": route, "method": scope.get("method", ""), "status": status["code"],
                                       "duration_ms": round(seconds * 1000, 2)})
                TENANT_ID.reset(tenant_token)
                TRACE_ID.reset(trace_token)

        return middleware

    return factory
