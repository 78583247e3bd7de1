"""OpenTelemetry traces (``pip install 'kb-rerank[otel]'``): one trace per request, exported by OTLP
(HTTP/protobuf) when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is
set; off otherwise, and then this module is never imported
(:func:`kb_rerank.http.telemetry.otel_wanted` reads only the environment).

What a trace holds:

* the server span of the request (Litestar's OpenTelemetry middleware, i.e. the ASGI
  instrumentation), named ``<METHOD> <route template>``; its trace id IS the service's trace id
  (``X-Trace-Id``, the audit row's, the log records'): a valid W3C ``traceparent`` is its parent
  (the same trace id, kb_rerank.http.telemetry.trace_id_from_headers agrees); otherwise the
  root span's trace id is the id the service decided (a new one, or a 32-hex ``X-Trace-Id``),
  fed to the SDK by the id generator below. An ``X-Trace-Id`` that is not 32 hex digits cannot
  be a trace id: the span carries it as ``kb.trace_id``.
* a span per stage ``Server-Timing`` names (``cache``, ``embed``, ``retrieve``, ``guard``,
  ``rerank``, ``record``): :func:`kb_rerank.core.timing.stage` opens them, children of the
  server span.
* a span per SQL statement (opentelemetry-instrumentation-psycopg), children of the stage
  that ran it: ``db.statement`` is the SQL text with its placeholders; the parameters (the
  query text among them) are never captured, and no sqlcommenter rewrites the SQL.

No attribute holds the query text, a request body or the URL's query string (a cursor, a
filter): the server span has the method, the route
(:func:`kb_rerank.http.telemetry.route_of`, the access log's rule), the status, and the URL
without its query string (the instrumentation never sees it); the stage spans only their names.

The standard ``OTEL_*`` variables configure the rest: ``OTEL_SERVICE_NAME`` (default
``kb-rerank``), ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER`` (default: parent-based,
always on), ``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_BSP_*`` (the batch span processor),
``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` to turn it off.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from kb_rerank.core.extras import require

require("opentelemetry.sdk.trace", "otel", "OpenTelemetry tracing (OTEL_EXPORTER_OTLP_ENDPOINT)")

from opentelemetry import context as otel_context  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter  # noqa: E402
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator  # noqa: E402
from opentelemetry.trace import NoOpTracer, Span, SpanKind, Status, StatusCode, Tracer  # noqa: E402

from kb_rerank import __version__  # noqa: E402
from kb_rerank.http.telemetry import route_of  # noqa: E402
from kb_rerank.core import timing  # noqa: E402

DEFAULT_SERVICE_NAME = "kb-rerank"
# the probes and the scrape: not requests worth a trace each
EXCLUDED = ["^/healthz$", "^/readyz$", "^/metrics$"]
_EXCLUDED = re.compile("|".join(EXCLUDED))
_HEX32 = re.compile(r"^[0-9a-f]{32}$")

# the trace id the next root span of this request gets (the service's trace id, as an int)
_ROOT_TRACE_ID: contextvars.ContextVar[int | None] = contextvars.ContextVar("kb_rerank_root_trace_id", default=None)
# the tracer of the request being served (the app's), for the SQL spans
_REQUEST_TRACER: contextvars.ContextVar[Tracer | None] = contextvars.ContextVar("kb_rerank_request_tracer",
                                                                                 default=None)


class RequestIdGenerator(RandomIdGenerator):
    """Random ids, except a request's root span: the service's trace id."""

    def generate_trace_id(self) -> int:
        given = _ROOT_TRACE_ID.get()
        return given if given else super().generate_trace_id()


class _RequestTracer(Tracer):
    """The tracer the psycopg instrumentation holds (it is installed once per process): the
    current request's app's tracer while a span of the request is current, else none (a
    statement outside a traced request: start-up checks, /readyz, the eviction loop) -- so no
    SQL span is ever a root of its own."""

    _noop = NoOpTracer()

    def _tracer(self) -> Tracer:
        tracer = _REQUEST_TRACER.get()
        if tracer is None or not trace.get_current_span().is_recording():
            return self._noop
        return tracer

    def start_span(self, *args: Any, **kwargs: Any) -> Span:
        return self._tracer().start_span(*args, **kwargs)

    @contextlib.contextmanager
    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Iterator[Span]:
        with self._tracer().start_as_current_span(*args, **kwargs) as span:
            yield span


class _RequestTracerProvider(trace.TracerProvider):
    def get_tracer(self, *args: Any, **kwargs: Any) -> Tracer:
        return _RequestTracer()


_sql_instrumented = False


def instrument_sql() -> None:
    """Spans for psycopg statements (connections opened from now on), once per process."""
    global _sql_instrumented
    if _sql_instrumented:
        return
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    # capture_parameters False: the values (the query text) never reach an attribute;
    # enable_commenter False: the SQL is sent as written (prepared statements stay shared)
    PsycopgInstrumentor().instrument(tracer_provider=_RequestTracerProvider(), capture_parameters=False,
                                     enable_commenter=False, skip_dep_check=True)
    _sql_instrumented = True


def resource() -> Resource:
    """``service.name`` kb-rerank unless OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES name one."""
    res = Resource.create({SERVICE_VERSION: __version__})
    if str(res.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        res = res.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return res


@dataclass
class Tracing:
    """The app's tracer provider and its middleware; :meth:`shutdown` flushes the spans."""

    provider: TracerProvider
    tracer: Tracer

    def middleware(self):
        """An app middleware (after kb_rerank.http.telemetry's, which decides the trace id)
        around Litestar's OpenTelemetry middleware (the server span)."""
        from litestar.plugins.opentelemetry import OpenTelemetryConfig, OpenTelemetryInstrumentationMiddleware

        config = OpenTelemetryConfig(tracer_provider=self.provider, scope_span_details_extractor=_span_details,
                                     server_request_hook_handler=_server_hook, exclude=EXCLUDED,
                                     exclude_spans=["receive", "send"], scopes={"http"})
        tracer = self.tracer

        def spans(name: str) -> "_StageSpan":
            return _StageSpan(tracer, name)

        def factory(app):
            async def with_query(scope, receive, send):
                scope["query_string"] = scope.pop(_HIDDEN_QUERY, b"")
                await app(scope, receive, send)

            inner = OpenTelemetryInstrumentationMiddleware(with_query, config)

            async def middleware(scope, receive, send):
                if scope["type"] != "http" or _EXCLUDED.match(scope.get("path", "")):
                    await app(scope, receive, send)
                    return
                tid = scope.get("state", {}).get("trace_id") or ""
                tokens = (_ROOT_TRACE_ID.set(int(tid, 16) if _HEX32.match(tid) and int(tid, 16) else None),
                          _REQUEST_TRACER.set(tracer), timing.SPANS.set(spans))
                # the instrumentation copies the URL, query string included, into http.url /
                # http.target (url.query): it is handed the request without it, and the app with it
                scope[_HIDDEN_QUERY], scope["query_string"] = scope.get("query_string", b""), b""
                try:
                    await inner(scope, receive, send)
                finally:
                    timing.SPANS.reset(tokens[2])
                    _REQUEST_TRACER.reset(tokens[1])
                    _ROOT_TRACE_ID.reset(tokens[0])

            return middleware

        return factory

    def shutdown(self) -> None:
        self.provider.shutdown()


_HIDDEN_QUERY = "kb.query_string"  # the scope key holding the query string while the instrumentation reads the scope


def _span_details(scope) -> tuple[str, dict[str, Any]]:
    """``POST /v1/kb/search/rerank``: the route template, never the raw URL."""
    route = route_of(scope)
    method = str(scope.get("method", "")).strip()
    return f"{method} {route}", {"http.route": route}


def _server_hook(span: Span, scope) -> None:
    tid = scope.get("state", {}).get("trace_id")
    if tid and span.get_span_context().is_valid and format(span.get_span_context().trace_id, "032x") != tid:
        span.set_attribute("kb.trace_id", tid)  # an X-Trace-Id that is no W3C trace id


def setup(exporter: SpanExporter | None = None, *, processors: Sequence[Any] = ()) -> Tracing:
    """The app's tracing: ``exporter`` given (tests: an InMemorySpanExporter) is fed span by
    span (SimpleSpanProcessor); none: the OTLP/HTTP exporter of the ``OTEL_EXPORTER_OTLP_*``
    variables, batched (BatchSpanProcessor, ``OTEL_BSP_*``)."""
    provider = TracerProvider(resource=resource(), id_generator=RequestIdGenerator())
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    for p in processors:
        provider.add_span_processor(p)
    instrument_sql()
    return Tracing(provider, provider.get_tracer("kb_rerank", __version__))


class _StageSpan:
    """A stage's span (kb_rerank.core.timing.stage), current while the stage runs: an
    exception marks it failed with its type name only (an exception's message might quote a
    value)."""

    __slots__ = ("tracer", "name", "span", "token")

    def __init__(self, tracer: Tracer, name: str) -> None:
        self.tracer, self.name = tracer, name

    def __enter__(self) -> Span:
        self.span = self.tracer.start_span(self.name, kind=SpanKind.INTERNAL, attributes={"kb.stage": self.name})
        self.token = otel_context.attach(trace.set_span_in_context(self.span))
        return self.span

    def __exit__(self, typ, exc, tb) -> None:
        try:
            if typ is not None:
                self.span.set_status(Status(StatusCode.ERROR, typ.__name__))
                self.span.set_attribute("error.type", typ.__qualname__)
        finally:
            otel_context.detach(self.token)
            self.span.end()
