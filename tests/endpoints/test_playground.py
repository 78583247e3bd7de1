"""GET /playground without a browser (tests/endpoints/test_playground_browser.py drives it in Chromium):
the page and its assets with their content types and the page's own security headers, the
API routes' headers left as they were, the files shipped as package data, and the demo-token
route present only under ``serve --dev`` with the development secret."""

from __future__ import annotations

import re

import jwt as pyjwt
import pytest
from litestar.testing import TestClient

from kb_rerank.core.dev import DEMO_TENANT, DEV_JWT_SECRET
from kb_rerank.app import create_app
from kb_rerank.core.settings import SOURCES, Settings

from tests.live_server import SECRET


def client(dev: bool = False, secret: str = SECRET) -> TestClient:
    # no lifespan (no `with`): these routes need neither the database nor the models
    return TestClient(create_app(Settings(jwt_secret=secret), dev=dev))


def test_page_and_assets_with_their_content_types():
    c = client()
    page = c.get("/playground")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    html = page.text
    assert '<meta name="viewport"' in html
    # the assets the page names are served, with their types
    wanted = {"js": "text/javascript; charset=utf-8", "css": "text/css; charset=utf-8"}
    linked = re.findall(r'(?:src|href)="(/playground/assets/[^"]+)"', html)
    assert sorted(u.rsplit(".", 1)[1] for u in linked) == ["css", "js"]
    for url in linked:
        r = c.get(url)
        assert r.status_code == 200 and r.headers["content-type"] == wanted[url.rsplit(".", 1)[1]], url
        assert r.headers["x-content-type-options"] == "nosniff"
    # nothing else under the folder (index.html itself, traversal) is served as an asset
    for name in ("index.html", "..%2F..%2Fsettings.py", "x.js"):
        assert c.get("/playground/assets/" + name).status_code == 404
    cfg = c.get("/playground/config.json").json()
    assert cfg == {"sources": list(SOURCES), "dev_token": False}


def test_every_input_has_a_label_and_no_inline_script():
    html = client().get("/playground").text
    ids = re.findall(r"<(?:input|select|textarea)\b[^>]*\bid=\"([^\"]+)\"", html)
    labelled = set(re.findall(r'<label for="([^"]+)"', html))
    assert {"token", "query", "endpoint", "source", "documents", "explain"} <= set(ids)
    assert set(ids) <= labelled
    # the CSP forbids inline script: every <script> is a file
    assert all('src="' in tag for tag in re.findall(r"<script\b[^>]*>", html))
    assert "localStorage" not in client().get("/playground/assets/playground.js").text


def test_page_headers_are_strict_and_the_api_headers_unchanged():
    c = client()
    csp = c.get("/playground").headers["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["script-src"] == "'self'" and "unsafe-inline" not in csp
    assert directives["connect-src"] == "'self'" and directives["frame-ancestors"] == "'none'"
    # the API routes keep their own headers: the playground's are not added to them
    api = c.post("/v1/kb/search/rerank", json={"query": "x"}, headers={"Authorization": "Bearer bad"})
    assert api.status_code == 401 and api.json()["error"] == "unauthorized"
    for h in ("content-security-policy", "x-frame-options", "referrer-policy"):
        assert h not in api.headers
    assert "content-security-policy" not in c.get("/healthz").headers


# (the development secret without --dev: the app refuses to start at all, tests/http/test_auth.py)
@pytest.mark.parametrize("dev", [False, True])
def test_no_dev_token_route_without_dev_mode_and_the_dev_secret(dev):
    """Not in production, and not under --dev with a real secret either (a token minted with
    it would be real)."""
    c = client(dev=dev)
    assert c.post("/playground/dev-token").status_code == 404
    assert c.get("/playground/config.json").json()["dev_token"] is False
    assert "/playground/dev-token" not in c.get("/schema/openapi.json").text


def test_dev_token_route_under_dev_mints_a_demo_token_the_api_accepts():
    c = client(dev=True, secret=DEV_JWT_SECRET)
    assert c.get("/playground/config.json").json()["dev_token"] is True
    r = c.post("/playground/dev-token")
    assert r.status_code == 200
    body = r.json()
    assert body["tenant_id"] == str(DEMO_TENANT)
    claims = pyjwt.decode(body["token"], DEV_JWT_SECRET, algorithms=["HS256"])
    assert claims["tenant_id"] == str(DEMO_TENANT) and claims["exp"] - claims["iat"] == body["expires_in_s"] == 3600
    # the app's own verifier accepts it
    from kb_rerank.http.auth import tenant_from_authorization

    assert str(tenant_from_authorization("Bearer " + body["token"], c.app.state.jwt)) == str(DEMO_TENANT)
    assert c.get("/playground/dev-token").status_code == 405  # minting is a POST


# --------------------------------------------------------------------------- Server-Timing (the page's "time per stage")


def _stages(header: str) -> dict[str, float]:
    out = {}
    for part in header.split(","):
        name, _, dur = part.strip().partition(";dur=")
        out[name] = float(dur)
    return out


def test_server_timing_names_the_stages_a_request_went_through(settings, app_conn, embedder, tmp_path):
    import uuid

    from tests.live_server import FakeReranker, bearer, ingest_small_tenant

    tenant = uuid.uuid4()
    ingest_small_tenant(app_conn, tenant, embedder, settings, tmp_path)
    app = create_app(settings.with_(jwt_secret=SECRET), reranker=FakeReranker(), embedder=embedder)
    with TestClient(app) as c:
        body = {"query": "how do I export a report", "source": "hybrid_lexical_semantic"}
        miss = c.post("/v1/kb/search/rerank", json=body, headers=bearer(tenant))
        assert miss.status_code == 200 and not miss.json()["from_cache"]
        stages = _stages(miss.headers["server-timing"])
        # the lexical list is read while the query is embedded: in the header's order, not in the sum
        assert list(stages) == ["cache", "embed", "lexical", "retrieve", "rerank", "record", "total"]
        assert all(v >= 0 for v in stages.values())
        assert stages["total"] >= sum(v for k, v in stages.items() if k not in ("total", "lexical"))
        hit = c.post("/v1/kb/search/rerank", json=body, headers=bearer(tenant))
        assert hit.json()["from_cache"] and list(_stages(hit.headers["server-timing"])) == ["cache", "total"]
        lexical = c.post("/v1/kb/search/rerank", json={"query": "export", "source": "lexical_only"}, headers=bearer(tenant))
        assert "embed" not in _stages(lexical.headers["server-timing"])  # no query embedding for lexical_only
        v2 = c.post("/v2/rerank", json={"query": "refund", "documents": ["refunds take five days", "two-factor"]},
                    headers=bearer(tenant))
        assert v2.status_code == 200
        assert {"guard", "rerank", "total"} <= set(_stages(v2.headers["server-timing"]))
        # an error has no timings
        assert "server-timing" not in c.post("/v1/kb/search/rerank", json={}, headers=bearer(tenant)).headers
