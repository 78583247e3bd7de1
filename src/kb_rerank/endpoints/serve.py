"""What every JSON route does, written once (the trace id and tenant are already in the log
context: kb_rerank.http.telemetry's middleware and the auth guard): the body parsed (a
rejection counted and logged, then answered by the error
handler), the flow built and run by the app's :class:`~kb_rerank.endpoints.runner.Pipeline`,
the flow's response Struct returned with ``X-Trace-Id`` and ``Server-Timing``
(the stages' milliseconds, :mod:`kb_rerank.core.timing`), and on a degraded answer
``X-KB-Fallback: <reason>`` or ``X-KB-Partial: budget`` (:func:`~kb_rerank.rerank.compose.degraded_headers`).
A body with a Content-Type other than JSON is a 415 (none at all is read as JSON)."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, Callable, TypeVar

from litestar import Request, Response
from litestar.datastructures import State

from kb_rerank.http import body
from kb_rerank.http.body import ApiError
from kb_rerank.core import timing
from kb_rerank.rerank.compose import degraded_headers
from kb_rerank.core.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")


async def serve(request: Request, state: State, parse: Callable[[bytes, Settings], Any],
                make_flow: Callable[[Any, State], Any], response_type: type[T]) -> Response[T]:
    scope_state = request.scope["state"]
    trace_id: str = scope_state["trace_id"]
    tenant: uuid.UUID = scope_state["tenant"]
    t0 = time.perf_counter()
    timing_token, stages = timing.start()
    try:
        try:
            body.require_json(request.headers.get("content-type"))  # 415 before the body is read
            req = parse(await request.body(), state.settings)
        except ApiError as exc:
            state.metrics.rejected.labels(exc.payload.get("error", "invalid")).inc()
            log.info("rejected tenant=%s route=%s status=%d field=%s", tenant, request.url.path, exc.status_code,
                     exc.payload.get("field"))
            raise
        flow = make_flow(req, state)
        served = await state.pipeline.run(flow, tenant, trace_id)
        answer = flow.answer(served, trace_id)
        stages["total"] = (time.perf_counter() - t0) * 1000.0
        out = served.outcome  # None on a cache hit: a cached answer is a whole model answer
        return Response(answer, headers={"X-Trace-Id": trace_id, "Server-Timing": timing.server_timing(stages),
                                         **(degraded_headers(out.fallback_reason, out.partial) if out else {})})
    finally:
        timing.stop(timing_token)
