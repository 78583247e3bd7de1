"""OpenTelemetry (kb_rerank.http.tracing, the [otel] extra): one trace per request whose trace id
is the service's (X-Trace-Id, W3C traceparent honoured), a span per Server-Timing stage, the SQL
statements as child spans, the query text in no span; nothing of OpenTelemetry imported when
the environment does not ask for traces. In process through the SDK's InMemorySpanExporter, and
against a real `kb-rerank serve` process exporting OTLP/HTTP to a collector in this process."""

from __future__ import annotations

import ast
import gzip
import http.server
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest
from litestar.testing import TestClient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from kb_rerank.app import create_app
from kb_rerank.http.telemetry import otel_wanted

from tests.live_server import JWT, SECRET, FakeReranker, bearer, ingest_small_tenant, serve_process

RERANK, CONTEXT, V2, DOCS = "/v1/kb/search/rerank", "/v1/kb/context", "/v2/rerank", "/v1/kb/documents"
STAGES = {"cache", "embed", "lexical", "retrieve", "guard", "rerank", "record"}


def _stages(server_timing: str) -> set[str]:
    return {part.split(";", 1)[0].strip() for part in server_timing.split(",")} - {"total"}


def _hex(n: int, width: int) -> str:
    return format(n, f"0{width}x")


def unique_query() -> str:
    """A query no span may ever carry (nor its words, lower-cased by normalisation)."""
    return f"zqx{uuid.uuid4().hex[:12]} invoices refunds"


def _strings(span) -> list[str]:
    """Every string a span exports: its name, attribute keys and values, events, links, status."""
    out = [span.name, span.status.description or ""]
    for attrs in [span.attributes, span.resource.attributes, *[e.attributes for e in span.events]]:
        for k, v in (attrs or {}).items():
            out += [str(k), str(v)]
    out += [e.name for e in span.events]
    return out


def assert_query_nowhere(spans, query: str) -> None:
    token = query.split()[0]
    for s in spans:
        for text in _strings(s):
            assert token not in text.lower(), (s.name, text)


# --------------------------------------------------------------------------- imports


def _otel_modules_after(code: str, env: dict[str, str]) -> list[str]:
    probe = (f"{code}\nimport sys\n"
             "print(sorted({m for m in sys.modules if m.split('.')[0] == 'opentelemetry'}))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


SDK = ("opentelemetry.sdk", "opentelemetry.exporter", "opentelemetry.instrumentation.psycopg",
       "opentelemetry.instrumentation.dbapi")


def test_nothing_of_opentelemetry_is_imported_unless_asked():
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    # the package, the CLI and the app's module: nothing of OpenTelemetry at all
    assert _otel_modules_after("import kb_rerank, kb_rerank.cli.main, kb_rerank.app, kb_rerank.endpoints.runner",
                               env) == []
    # an app: Litestar itself imports the OpenTelemetry API and its ASGI middleware when they are
    # installed (Litestar._patch_opentelemetry_middleware), never the SDK, an exporter or the
    # SQL instrumentation
    app = ("from kb_rerank.app import create_app\nfrom kb_rerank.core.settings import Settings\n"
           f"app = create_app(Settings(jwt_secret={SECRET!r}))\nassert app.state.tracing is None")
    off = _otel_modules_after(app, env)
    assert not [m for m in off if m.startswith(SDK)], off
    # asked: the SDK is loaded and the app traces
    on = _otel_modules_after(app.replace("is None", "is not None"),
                             {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert {"opentelemetry.sdk.trace", "opentelemetry.instrumentation.psycopg",
            "opentelemetry.exporter.otlp.proto.http.trace_exporter"} <= set(on)


@pytest.mark.parametrize("env, wanted", [
    ({}, False), ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "otlp"}, True),
])
def test_the_environment_decides(env, wanted):
    assert otel_wanted(env) is wanted


# --------------------------------------------------------------------------- in process


@pytest.fixture(scope="module")
def traced(settings, embedder, sample_tenant):
    exporter = InMemorySpanExporter()
    app = create_app(settings.with_(jwt_secret=SECRET, rate_limit_per_minute=0), reranker=FakeReranker(),
                     embedder=embedder, span_exporter=exporter)
    with TestClient(app) as client:
        yield client, exporter, sample_tenant


def _request(client, exporter, method, path, tenant, body=None, headers=None):
    exporter.clear()
    r = client.request(method, path, json=body, headers={**bearer(tenant), **(headers or {})})
    assert r.status_code == 200, r.text
    spans = exporter.get_finished_spans()
    return r, spans


def _one_trace(r, spans, route: str):
    """The server span of the request, every span in its trace (the response's trace id)."""
    tid = r.headers["x-trace-id"]
    assert {_hex(s.context.trace_id, 32) for s in spans} == {tid}, "one trace per request, the service's id"
    (server,) = [s for s in spans if s.kind == SpanKind.SERVER]
    method = "GET" if route == DOCS else "POST"
    assert server.name == f"{method} {route}" and server.attributes["http.route"] == route
    assert (server.attributes.get("http.response.status_code") or server.attributes.get("http.status_code")) == 200
    return server


def test_a_request_is_one_trace_of_its_stages_and_statements(traced):
    client, exporter, tenant = traced
    query = unique_query()
    r, spans = _request(client, exporter, "POST", RERANK, tenant, {"query": query})
    server = _one_trace(r, spans, RERANK)
    assert server.parent is None  # no traceparent came: a root, with the id the service chose
    assert server.resource.attributes["service.name"] == "kb-rerank"
    stage_spans = [s for s in spans if s.attributes.get("kb.stage")]
    # one span per stage of the Server-Timing header, children of the server span
    assert {s.name for s in stage_spans} == _stages(r.headers["server-timing"]) >= {"cache", "embed", "retrieve",
                                                                                    "rerank", "record"}
    assert all(s.parent.span_id == server.context.span_id for s in stage_spans)
    # the SQL statements: client spans, each a child of the stage that ran it, placeholders only
    sql = [s for s in spans if s.attributes.get("db.system") == "postgresql"
           or s.attributes.get("db.system.name") == "postgresql"]
    by_id = {s.context.span_id: s for s in spans}
    assert sql and all(s.kind == SpanKind.CLIENT for s in sql)
    parents = {by_id[s.parent.span_id].name for s in sql}
    assert {"cache", "retrieve", "record"} <= parents <= STAGES
    statements = [s.attributes.get("db.statement") or s.attributes.get("db.query.text") or "" for s in sql]
    assert any("set_config('auth.tenant_id'" in q for q in statements)
    assert all("%s" in q or "$" in q or "(" not in q for q in statements if "set_config" in q)
    assert_query_nowhere(spans, query)

    # the same query again: a cache hit, its own trace (a new id), the cheap path's stages
    r2, spans2 = _request(client, exporter, "POST", RERANK, tenant, {"query": query})
    assert r2.json()["from_cache"] is True and r2.headers["x-trace-id"] != r.headers["x-trace-id"]
    server2 = _one_trace(r2, spans2, RERANK)
    assert {s.name for s in spans2 if s.attributes.get("kb.stage")} == _stages(r2.headers["server-timing"])
    assert "rerank" not in {s.name for s in spans2} and server2.parent is None
    assert_query_nowhere(spans2, query)


def test_every_route_traces_its_stages(traced):
    client, exporter, tenant = traced
    query = unique_query()
    r, spans = _request(client, exporter, "POST", CONTEXT, tenant, {"query": query})
    _one_trace(r, spans, CONTEXT)
    assert {s.name for s in spans if s.attributes.get("kb.stage")} == _stages(r.headers["server-timing"])
    assert_query_nowhere(spans, query)
    # /v2/rerank: the caller's documents, through the guard
    docs = [f"{query} passage one about invoices", "a second passage about refunds"]
    r, spans = _request(client, exporter, "POST", V2, tenant, {"query": query, "documents": docs})
    _one_trace(r, spans, V2)
    names = {s.name for s in spans if s.attributes.get("kb.stage")}
    assert "guard" in names and names == _stages(r.headers["server-timing"])
    assert_query_nowhere(spans, query)
    # the document list: its statements are children of the server span
    r, spans = _request(client, exporter, "GET", DOCS, tenant)
    server = _one_trace(r, spans, DOCS)
    sql = [s for s in spans if s.kind == SpanKind.CLIENT]
    assert len(sql) >= 2 and all(s.parent.span_id == server.context.span_id for s in sql)


def test_traceparent_is_honoured(traced):
    client, exporter, tenant = traced
    trace_id, parent = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    r, spans = _request(client, exporter, "POST", RERANK, tenant, {"query": unique_query()},
                        headers={"traceparent": f"00-{trace_id}-{parent}-01"})
    assert r.headers["x-trace-id"] == trace_id == r.json()["trace_id"]
    server = _one_trace(r, spans, RERANK)
    assert server.parent is not None and _hex(server.parent.span_id, 16) == parent and server.parent.is_remote
    # upper case: the service reads it (its trace id), OpenTelemetry's propagator does not: a root
    # span, still with that trace id
    up = uuid.uuid4().hex
    r, spans = _request(client, exporter, "POST", RERANK, tenant, {"query": unique_query()},
                        headers={"traceparent": f"00-{up.upper()}-{parent.upper()}-01"})
    assert r.headers["x-trace-id"] == up
    assert _one_trace(r, spans, RERANK).parent is None
    # not sampled by the caller: the trace id is still the caller's, and nothing is recorded
    quiet = uuid.uuid4().hex
    r, spans = _request(client, exporter, "POST", RERANK, tenant, {"query": unique_query()},
                        headers={"traceparent": f"00-{quiet}-{parent}-00"})
    assert r.headers["x-trace-id"] == quiet and spans == ()


def test_x_trace_id_becomes_the_trace_id_when_it_can(traced):
    client, exporter, tenant = traced
    given = uuid.uuid4().hex
    r, spans = _request(client, exporter, "POST", RERANK, tenant, {"query": unique_query()},
                        headers={"X-Trace-Id": given})
    server = _one_trace(r, spans, RERANK)
    assert r.headers["x-trace-id"] == given and "kb.trace_id" not in server.attributes
    # not 32 hex digits: no W3C trace id; the service keeps it, the server span carries it
    r, spans = _request(client, exporter, "POST", RERANK, tenant, {"query": unique_query()},
                        headers={"X-Trace-Id": "order-1234"})
    assert r.headers["x-trace-id"] == "order-1234"
    (server,) = [s for s in spans if s.kind == SpanKind.SERVER]
    assert server.attributes["kb.trace_id"] == "order-1234"
    assert len({s.context.trace_id for s in spans}) == 1


def test_probes_are_not_traced_and_errors_are_named_only(traced):
    client, exporter, tenant = traced
    exporter.clear()
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200  # it runs SQL: no span of it either
    assert exporter.get_finished_spans() == ()
    # a rejected body: one server span with its status, the body's words in no span
    query = unique_query()
    r = client.post(RERANK, json={"query": query, "top_n": "many"}, headers=bearer(tenant))
    assert r.status_code == 422
    spans = exporter.get_finished_spans()
    (server,) = [s for s in spans if s.kind == SpanKind.SERVER]
    assert _hex(server.context.trace_id, 32) == r.headers["x-trace-id"]
    assert_query_nowhere(spans, query)


# --------------------------------------------------------------------------- a real server, OTLP/HTTP


class Collector:
    """An OTLP/HTTP trace receiver on loopback: POST /v1/traces, protobuf (gzip or not)."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.paths: list[str] = []
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    data = gzip.decompress(data)
                msg = ExportTraceServiceRequest()
                msg.ParseFromString(data)
                collector.paths.append(self.path)
                collector.requests.append(msg)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def spans(self) -> list[tuple[dict, object]]:
        """(resource attributes, span) of everything received."""
        out = []
        for req in list(self.requests):
            for rs in req.resource_spans:
                res = {a.key: a.value.string_value for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    out += [(res, s) for s in ss.spans]
        return out

    def trace(self, trace_id: str) -> list:
        return [s for _, s in self.spans() if s.trace_id.hex() == trace_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _attrs(span) -> dict:
    out = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = v.string_value or v.int_value or v.bool_value or v.double_value
    return out


def _wait(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the spans did not arrive"
        time.sleep(0.1)


def test_a_served_process_exports_its_traces_by_otlp(settings, owner_url, app_url, embedder, tmp_path):
    from kb_rerank.testing.tiny_model import build_tiny_cross_encoder

    tenant = uuid.uuid4()
    with psycopg.connect(app_url) as conn:
        ingest_small_tenant(conn, tenant, embedder, settings, tmp_path, flavour="otelword")
    collector = Collector()
    env = {"KB_DATABASE_URL": owner_url, "KB_APP_DATABASE_URL": app_url, "KB_JWT_SECRET": SECRET,
           "KB_RERANKER_MODEL": str(build_tiny_cross_encoder(tmp_path / "ce", seed=0)), "KB_WORKERS": "1",
           "KB_RATE_LIMIT_PER_MINUTE": "0", "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
           "OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_SERVICE_NAME": "kb-rerank-under-test"}
    query = unique_query()
    trace_id, parent = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    try:
        with serve_process(env, Path(tmp_path) / "server.log") as (base, _proc):
            auth = {"Authorization": "Bearer " + __import__("kb_rerank.http.auth", fromlist=["x"]).mint_token(tenant, JWT)}
            r = httpx.post(base + RERANK, json={"query": query}, headers=auth, timeout=60)
            assert r.status_code == 200, r.text
            tid = r.headers["x-trace-id"]
            r2 = httpx.post(base + CONTEXT, json={"query": query}, timeout=60,
                            headers={**auth, "traceparent": f"00-{trace_id}-{parent}-01"})
            assert r2.status_code == 200 and r2.headers["x-trace-id"] == trace_id
            _wait(lambda: any(s.kind == s.SPAN_KIND_SERVER for s in collector.trace(tid))
                  and any(s.kind == s.SPAN_KIND_SERVER for s in collector.trace(trace_id)))
    finally:
        collector.close()
    assert set(collector.paths) == {"/v1/traces"}
    spans = collector.trace(tid)
    (server,) = [s for s in spans if s.kind == s.SPAN_KIND_SERVER]
    assert server.name == f"POST {RERANK}" and server.parent_span_id == b""
    stage = {s.name: s for s in spans if "kb.stage" in _attrs(s)}
    assert set(stage) == _stages(r.headers["server-timing"]) >= {"cache", "embed", "retrieve", "rerank", "record"}
    assert all(s.parent_span_id == server.span_id for s in stage.values())
    sql = [s for s in spans if s.kind == s.SPAN_KIND_CLIENT]
    assert sql and {s.parent_span_id for s in sql} <= {s.span_id for s in stage.values()}
    # the caller's traceparent: same trace id, the server span's parent is the caller's span
    (server2,) = [s for s in collector.trace(trace_id) if s.kind == s.SPAN_KIND_SERVER]
    assert server2.parent_span_id.hex() == parent and server2.name == f"POST {CONTEXT}"
    # no span outside a request's trace (start-up checks, /readyz probes): every trace has its server span
    roots = {s.trace_id for _, s in collector.spans() if s.kind == s.SPAN_KIND_SERVER}
    assert {s.trace_id for _, s in collector.spans()} == roots
    resources = {res.get("service.name") for res, _ in collector.spans()}
    assert resources == {"kb-rerank-under-test"}
    # the query text: in no name, attribute or event of anything exported
    token = query.split()[0]
    for req in collector.requests:
        assert token.encode() not in req.SerializeToString()
