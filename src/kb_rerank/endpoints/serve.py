"""What every JSON route does, written once (the trace id and tenant are already in the log
context: kb_rerank.http.telemetry's middleware and the auth guard): the body parsed (a
rejection counted and logged, then answered by the error
handler), the flow built and run by the app's :class:`~kb_rerank.endpoints.runner.Pipeline`,
the flow's response Struct returned with ``X-Trace-Id`` and ``Server-Timing``
(the stages' milliseconds, :mod:`kb_rerank.core.timing`), and on a degraded answer
``X-KB-Fallback: <reason>`` or ``X-KB-Partial: budget`` (:func:`~kb_rerank.rerank.compose.degraded_headers`).
A body with a Content-Type other than JSON is a 415 (none at all is read as JSON).

A request nobody waits for stops: once its body is read, the flow runs beside a watch on the
connection (:func:`until_disconnected`); a client that disconnects cancels it (embedding units
and model batches not started are dropped, the guard's and MMR's waits end), the tenant is
charged for what ran (the flow's bill settles on cancellation too), and the request is counted
(``kb_rerank_abandoned_total``) and logged in one line, its status 499 (no one reads it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any, Awaitable, Callable, TypeVar

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
        try:
            served = await until_disconnected(request.receive, state.pipeline.run(flow, tenant, trace_id))
        except ClientDisconnected:
            state.metrics.abandoned.labels(request.url.path).inc()
            log.info("client disconnected: tenant=%s route=%s work cancelled after %.0f ms", tenant, request.url.path,
                     (time.perf_counter() - t0) * 1000.0)
            return Response({"error": "client_closed_request"}, status_code=CLIENT_CLOSED,
                            headers={"X-Trace-Id": trace_id})
        answer = flow.answer(served, trace_id)
        stages["total"] = (time.perf_counter() - t0) * 1000.0
        out = served.outcome  # None on a cache hit: a cached answer is a whole model answer
        return Response(answer, headers={"X-Trace-Id": trace_id, "Server-Timing": timing.server_timing(stages),
                                         **(degraded_headers(out.fallback_reason, out.partial) if out else {})})
    finally:
        timing.stop(timing_token)


CLIENT_CLOSED = 499  # nginx's status for a request whose client closed the connection first
# how long a cancelled flow may take to unwind (release its flight, settle its bill) before the
# handler stops waiting for it
UNWIND_S = 5.0


class ClientDisconnected(Exception):
    """The client closed the connection before the answer: its work was cancelled."""


async def until_disconnected(receive: Callable[[], Awaitable[dict]], work: Awaitable[T]) -> T:
    """``work``'s result, unless the client disconnects first (an ``http.disconnect`` from
    ``receive``, read once the body is): then ``work`` is cancelled, waited for at most
    :data:`UNWIND_S`, and :class:`ClientDisconnected` raised."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnect(receive))
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.wait((task,), timeout=UNWIND_S)
        if task.done() and not task.cancelled():
            task.exception()  # read: a failure while unwinding is not reported as unhandled
        raise ClientDisconnected()
    finally:
        watch.cancel()
        if not task.done():  # this handler itself cancelled (the server stopping)
            task.cancel()


async def _disconnect(receive: Callable[[], Awaitable[dict]]) -> None:
    while True:
        with contextlib.suppress(Exception):
            message = await receive()
            if message.get("type") == "http.disconnect":
                return
            continue
        await asyncio.sleep(3600)  # the server gives no messages: never reports a disconnect
