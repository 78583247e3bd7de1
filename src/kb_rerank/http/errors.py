"""Errors answered as JSON: the API's own (:class:`~kb_rerank.http.body.ApiError`, 401/400/422/429),
413 while a body is read, 503 when the database is unavailable; every one with the request's
``X-Trace-Id``."""

from __future__ import annotations

import logging

from litestar import MediaType, Request, Response
from litestar.exceptions.http_exceptions import RequestEntityTooLarge

from kb_rerank.http.body import ApiError

log = logging.getLogger(__name__)


def _trace_headers(request: Request) -> dict[str, str]:
    tid = request.scope.get("state", {}).get("trace_id")
    return {"X-Trace-Id": tid} if tid else {}


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
    log.warning("database unavailable: %s", type(exc).__name__)
    return Response({"error": "database_unavailable"}, status_code=503,
                    headers={"Retry-After": "5", **_trace_headers(request)}, media_type=MediaType.JSON)
