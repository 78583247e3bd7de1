"""Every error status in the API's own body (``{"error", "detail", ...}``,
never Litestar's ``{"status_code", "detail"}``), a wrong authorization scheme named as such,
and a body whose Content-Type is not JSON refused with 415. Over HTTP against a real server
(uvicorn on a loopback port), each answer checked against the OpenAPI document's error body."""

from __future__ import annotations

import uuid

import httpx
import pytest

from kb_rerank.app import create_app

from tests.live_server import OPS, OPS_TOKEN, SECRET, FakeReranker, bearer, metric_values, serve_in_thread
from tests.endpoints.test_openapi import _assert_valid

ROUTES = {"/v1/kb/search/rerank": {"query": "recurring invoice"},
          "/v1/kb/context": {"query": "recurring invoice"},
          "/v2/rerank": {"query": "recurring invoice", "documents": ["Invoices repeat monthly.", "Refunds."]}}


class FailingEmbedder:
    """An embedder whose every call raises: a bug the API has no answer of its own for (500)."""

    dim = 384

    def __getattr__(self, name):
        def fail(*_a, **_k):
            raise RuntimeError("secret internal detail /srv/model")
        return fail


@pytest.fixture(scope="module")
def live(settings, embedder):
    app = create_app(settings.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN, rate_limit_per_minute=0),
                     reranker=FakeReranker(), embedder=embedder)
    with serve_in_thread(app) as base:
        spec = httpx.get(base + "/schema/openapi.json").json()
        yield base, spec["components"]["schemas"]["ErrorBody"], spec


def _error_body(live, r, status, error):
    base, schema, spec = live
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json") and r.headers["x-trace-id"]
    body = r.json()
    assert body["error"] == error and "status_code" not in body, body
    _assert_valid(spec, schema, body, (status, error))
    return body


def test_404_is_the_api_error_body(live):
    base = live[0]
    for path in ("/no/such/route", "/v1/kb/nothing", "/v3/rerank"):
        body = _error_body(live, httpx.get(base + path), 404, "not_found")
        assert body["detail"] == "Not Found"


def test_405_is_the_api_error_body_with_allow(live):
    base = live[0]
    for path in ROUTES:
        r = httpx.get(base + path, headers=bearer(uuid.uuid4()))
        body = _error_body(live, r, 405, "method_not_allowed")
        assert body["detail"] and "POST" in r.headers["allow"]
    r = httpx.post(base + "/healthz")
    _error_body(live, r, 405, "method_not_allowed")
    assert "GET" in r.headers["allow"]


def test_another_scheme_than_bearer_is_named(live):
    base = live[0]
    for header in ("Token abc", "Basic dXNlcjpwYXNz", "abc.def.ghi"):
        r = httpx.post(base + "/v2/rerank", json=ROUTES["/v2/rerank"], headers={"Authorization": header})
        body = _error_body(live, r, 401, "unauthorized")
        assert body == {"error": "unauthorized", "reason": "wrong_scheme",
                        "detail": "use Authorization: Bearer <token>"}
        assert r.headers["www-authenticate"].startswith("Bearer")
    # a Bearer token that is no JWT is still "malformed", with no detail to help forge one
    r = httpx.post(base + "/v2/rerank", json=ROUTES["/v2/rerank"], headers={"Authorization": "Bearer abc"})
    assert _error_body(live, r, 401, "unauthorized") == {"error": "unauthorized", "reason": "malformed"}


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_body_that_is_not_json_by_its_content_type_is_a_415(live, path, owner_conn):
    base = live[0]
    tenant = uuid.uuid4() if path == "/v2/rerank" else None
    tenant = tenant or uuid.uuid4()
    before = metric_values(httpx.get(base + "/metrics", headers=OPS).text).get(
        "kb_rerank_rejected_total{reason=unsupported_media_type}", 0)
    raw = httpx.Request("POST", "/", json=ROUTES[path]).content  # valid JSON: only the type is wrong
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "text/json", "multipart/form-data; boundary=x"):
        r = httpx.post(base + path, content=raw, headers={**bearer(tenant), "content-type": ctype})
        body = _error_body(live, r, 415, "unsupported_media_type")
        assert body["field"] is None and ctype.split(";")[0] in body["detail"]
    after = metric_values(httpx.get(base + "/metrics", headers=OPS).text)
    assert after["kb_rerank_rejected_total{reason=unsupported_media_type}"] == before + 4
    # a refused request writes nothing
    assert owner_conn.execute("select count(*) from kb.kb_rerank_audit where tenant_id = %s",
                              [tenant]).fetchone()[0] == 0
    # JSON with parameters, a +json type, and no Content-Type at all (bare bodies) are read
    for headers in ({"content-type": "application/json; charset=utf-8"}, {"content-type": "application/vnd.kb+json"},
                    {}):
        r = httpx.post(base + path, content=raw, headers={**bearer(tenant), **headers}, timeout=60)
        assert r.status_code == 200, (headers, r.text)


def test_an_unhandled_exception_is_a_500_in_the_api_body_without_its_detail(settings, embedder):
    app = create_app(settings.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN, rate_limit_per_minute=0),
                     reranker=FakeReranker(), embedder=FailingEmbedder())
    with serve_in_thread(app) as base:
        spec = httpx.get(base + "/schema/openapi.json").json()
        r = httpx.post(base + "/v1/kb/search/rerank", json={"query": "recurring invoice", "source": "semantic_only"},
                       headers=bearer(uuid.uuid4()), timeout=60)
        body = _error_body((base, spec["components"]["schemas"]["ErrorBody"], spec), r, 500, "internal_server_error")
        assert body == {"error": "internal_server_error", "detail": "Internal Server Error"}
        assert "secret" not in r.text and "RuntimeError" not in r.text
