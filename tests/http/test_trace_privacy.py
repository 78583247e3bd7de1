"""Exported spans carry no query string: a document list's cursor (base64 of a source path) and
any extra parameter stay out of every attribute, as they stay out of the access log (one rule,
kb_rerank.http.telemetry.route_of); the handler still reads them."""

from __future__ import annotations

import logging

import pytest
from litestar.testing import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from kb_rerank.app import create_app

from tests.live_server import SECRET, FakeReranker, bearer

DOCS = "/v1/kb/documents"


def _strings(span) -> list[str]:
    out = [span.name, span.status.description or ""]
    for attrs in [span.attributes, *[e.attributes for e in span.events]]:
        for k, v in (attrs or {}).items():
            out += [str(k), str(v)]
    return out


@pytest.fixture(scope="module")
def traced(settings, embedder, sample_tenant):
    exporter = InMemorySpanExporter()
    app = create_app(settings.with_(jwt_secret=SECRET, rate_limit_per_minute=0), reranker=FakeReranker(),
                     embedder=embedder, span_exporter=exporter)
    with TestClient(app) as client:
        yield client, exporter, sample_tenant


def test_spans_and_the_access_log_carry_no_query_string(traced, caplog):
    client, exporter, tenant = traced
    exporter.clear()
    with caplog.at_level(logging.INFO, logger="kb_rerank.access"):
        first = client.get(DOCS, params={"limit": 1}, headers=bearer(tenant))
        assert first.status_code == 200, first.text
        cursor = first.json()["next_cursor"]
        assert cursor, "the sample tenant holds more than one document"
        r = client.get(DOCS, params={"limit": 1, "cursor": cursor, "zqxextra": "zqxvalue"}, headers=bearer(tenant))
    assert r.status_code == 200, r.text
    # the handler read its parameters: the second page is another document
    assert r.json()["documents"] and r.json()["documents"] != first.json()["documents"]
    spans = exporter.get_finished_spans()
    servers = [s for s in spans if s.kind == SpanKind.SERVER]
    assert len(servers) == 2
    for server in servers:
        url = server.attributes.get("http.url") or server.attributes.get("url.full") or ""
        assert url.endswith(DOCS), url  # the URL is there, without its query string
        assert server.attributes.get("http.target", DOCS) == DOCS
    for span in spans:
        for text in _strings(span):
            assert cursor not in text and "zqx" not in text and "limit=" not in text, (span.name, text)
    access = [rec.getMessage() for rec in caplog.records if rec.name == "kb_rerank.access"]
    assert len(access) == 2 and all(DOCS in line and "?" not in line and "zqx" not in line for line in access)
