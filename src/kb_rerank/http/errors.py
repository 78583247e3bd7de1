"""Errors answered as JSON: the API's own (:class:`~kb_rerank.http.body.ApiError`, 401/400/415/422/429),
413 while a body is read, 503 when the database is unavailable or (``/v2/rerank``) no model can
score, and every other HTTP status Litestar raises (404, 405 with its ``Allow``, ...) in the
same body, ``{"error": <snake_case status name>, "detail"}``, never Litestar's
``{"status_code", "detail"}``; every one with the request's ``X-Trace-Id``."""

from __future__ import annotations

import logging
from http import HTTPStatus

import psycopg

from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge

from kb_rerank.http.body import ApiError
from kb_rerank.http.telemetry import trace_id_from_headers
from kb_rerank.rerank.compose import ModelUnavailable

log = logging.getLogger(__name__)


def _trace_headers(request: Request) -> dict[str, str]:
    """The request's trace id; where no middleware ran (no route matched: a 404 or 405) the
    one its headers give, as the telemetry middleware would have decided it."""
    tid = request.scope.get("state", {}).get("trace_id") or trace_id_from_headers(
        request.headers.get("traceparent"), request.headers.get("x-trace-id"))
    return {"X-Trace-Id": tid}


def api_error_handler(request: Request, exc: ApiError) -> Response:
    return Response(exc.payload, status_code=exc.status_code, headers={**_trace_headers(request), **exc.headers},
                    media_type=MediaType.JSON)


def too_large_handler(request: Request, exc: RequestEntityTooLarge) -> Response:
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


def db_error_handler(request: Request, exc: Exception) -> Response:
    """503, one warning line, no traceback: the database unavailable, or a statement that ran
    past KB_STATEMENT_TIMEOUT_MS (``statement_timeout``: the request's work was too large for
    the database now; the tenant's next ones pay for theirs before they run)."""
    if isinstance(exc, psycopg.errors.QueryCanceled):
        log.warning("statement timeout (%s %s)", request.method, request.url.path)
        return Response({"error": "statement_timeout", "field": None,
                         "detail": "the search ran past the database's statement timeout; retry later or narrow"
                                   " the filter"}, status_code=503,
                        headers={"Retry-After": "5", **_trace_headers(request)}, media_type=MediaType.JSON)
    log.warning("database unavailable: %s", type(exc).__name__)
    return Response({"error": "database_unavailable"}, status_code=503,
                    headers={"Retry-After": "5", **_trace_headers(request)}, media_type=MediaType.JSON)


def error_name(status: int) -> str:
    """The ``error`` of a status the API has no name of its own for: its HTTP phrase in
    snake case (404 ``not_found``, 405 ``method_not_allowed``)."""
    try:
        return HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return "error"


def http_error_handler(request: Request, exc: Exception) -> Response:
    """Any HTTP exception of Litestar's (no route, wrong method, ...) and any unhandled
    exception (a 500, already logged with its traceback) in the API's body. A 5xx says nothing
    of the exception; the exception's own headers (``Allow`` of a 405) are kept."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) and status < 500 else None
    headers = dict(exc.headers or {}) if isinstance(exc, HTTPException) else {}
    return Response({"error": error_name(status), "detail": detail or _phrase(status)}, status_code=status,
                    headers={**headers, **_trace_headers(request)}, media_type=MediaType.JSON)


def _phrase(status: int) -> str | None:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return None


def model_unavailable_handler(request: Request, exc: ModelUnavailable) -> Response:
    """``/v2/rerank`` with no model able to score (``KB_V2_FALLBACK=error``): 503 with the
    fallback reason and ``Retry-After``, as TEI and hosted rerankers answer."""
    request.app.state.metrics.rejected.labels("model_unavailable").inc()
    retry = exc.retry_after_s
    detail = ("no cross-encoder could score the documents; retry later" if retry is not None else
              "no cross-encoder can score the documents (it failed to load, or none is configured): a retry"
              " will not help until an operator fixes the model")
    headers = {"Retry-After": str(retry)} if retry is not None else {}
    return Response({"error": "model_unavailable", "reason": exc.reason, "detail": detail, "retry_after_s": retry},
                    status_code=503, headers={**headers, **_trace_headers(request)}, media_type=MediaType.JSON)
