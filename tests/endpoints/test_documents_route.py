"""GET /v1/kb/documents: the token's tenant's documents only (row-level security, as the app
role), keyset paged by source path, limit and cursor validated (422 naming the field), 401
without a token, in the OpenAPI document."""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime

import pytest
from litestar.testing import TestClient

from kb_rerank.app import create_app
from kb_rerank.core.session import tenant_transaction

from tests.live_server import SECRET, FakeReranker, bearer

URL = "/v1/kb/documents"


def add_documents(conn, tenant, paths, language="en") -> dict[str, str]:
    """{source path: doc id} of new documents of ``tenant``."""
    out = {}
    with tenant_transaction(conn, tenant):
        for p in paths:
            (doc_id,) = conn.execute(
                "insert into kb.documents (tenant_id, source_uri, title, language, content_hash)"
                " values (%s, %s, %s, %s, %s) returning doc_id",
                [tenant, p, f"Title of {p}", language, hashlib.sha256(p.encode()).hexdigest()]).fetchone()
            out[p] = str(doc_id)
    return out


@pytest.fixture(scope="module")
def tenants(app_url):
    import psycopg

    a, b = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(app_url) as conn:
        # 7 for A (out of order, one non-ASCII), 3 for B: pages of 3 are 3, 3, 1
        docs_a = add_documents(conn, a, ["guides/b.md", "guides/a.md", "faq/ç.md", "faq/a.md", "z.md", "m/n/o.md",
                                         "guides/c.md"])
        docs_b = add_documents(conn, b, ["b-secret/1.md", "b-secret/2.md", "guides/a.md"], language="vi")
    return a, b, docs_a, docs_b


@pytest.fixture(scope="module")
def client(settings, embedder):
    app = create_app(settings.with_(jwt_secret=SECRET, rate_limit_per_minute=0), reranker=FakeReranker(),
                     embedder=embedder)
    with TestClient(app) as c:
        yield c


def pages(client, tenant, limit):
    out, cursor = [], None
    for _ in range(20):
        params = {"limit": limit, **({"cursor": cursor} if cursor else {})}
        r = client.get(URL, params=params, headers=bearer(tenant))
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["trace_id"] == r.headers["x-trace-id"]
        out.append(body["documents"])
        cursor = body["next_cursor"]
        if cursor is None:
            return out
    raise AssertionError("no last page")


def test_each_tenant_lists_its_own_documents_in_pages(client, tenants):
    a, b, docs_a, docs_b = tenants
    got = pages(client, a, 3)
    assert [len(p) for p in got] == [3, 3, 1]
    flat = [d for p in got for d in p]
    assert [d["source_path"] for d in flat] == sorted(docs_a)  # source-path order, no repeat, none missing
    for d in flat:
        assert set(d) == {"doc_id", "title", "source_path", "language", "updated_at", "ingested_at"}
        assert d["doc_id"] == docs_a[d["source_path"]] and d["title"] == f"Title of {d['source_path']}"
        assert d["language"] == "en" and datetime.fromisoformat(d["updated_at"]).tzinfo is not None
    # B: its three, never A's (same path guides/a.md in both: B's doc id)
    (only,) = pages(client, b, 50)
    assert {d["doc_id"] for d in only} == set(docs_b.values())
    assert not {d["doc_id"] for d in only} & set(docs_a.values())
    # the default page holds all seven; a tenant without documents gets an empty page
    r = client.get(URL, headers=bearer(a))
    assert [d["doc_id"] for d in r.json()["documents"]] == [docs_a[p] for p in sorted(docs_a)]
    assert r.json()["next_cursor"] is None
    assert client.get(URL, headers=bearer(uuid.uuid4())).json()["documents"] == []


def test_a_cursor_of_another_tenant_reveals_nothing(client, tenants):
    a, b, docs_a, _ = tenants
    first = client.get(URL, params={"limit": 1}, headers=bearer(a)).json()
    # A's cursor used with B's token: B's documents after that path, only B's
    r = client.get(URL, params={"limit": 50, "cursor": first["next_cursor"]}, headers=bearer(b))
    assert r.status_code == 200
    assert not {d["doc_id"] for d in r.json()["documents"]} & set(docs_a.values())


@pytest.mark.parametrize("query, field", [
    ("limit=0", "limit"), ("limit=201", "limit"), ("limit=abc", "limit"), ("limit=-1", "limit"),
    ("limit=", "limit"), ("limit=2.5", "limit"), ("limit=1&limit=2", "limit"),
    ("cursor=%25%25%25", "cursor"), ("cursor=", "cursor"), ("cursor=_w", "cursor"), ("cursor=AA", "cursor"),
])
def test_bad_parameters_are_422_naming_the_field(client, tenants, query, field):
    r = client.get(f"{URL}?{query}", headers=bearer(tenants[0]))
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_request" and r.json()["field"] == field


def test_limit_bounds_are_accepted(client, tenants):
    for n, expect in (("1", 1), ("200", 7), (" 7 ", 7)):
        r = client.get(URL, params={"limit": n}, headers=bearer(tenants[0]))
        assert r.status_code == 200 and len(r.json()["documents"]) == expect


def test_no_token_is_401(client):
    r = client.get(URL)
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    assert client.get(URL, headers={"Authorization": "Bearer nope"}).status_code == 401


def test_openapi_documents_the_route(client):
    spec = client.get("/schema/openapi.json").json()
    op = spec["paths"][URL]["get"]
    assert {p["name"]: p["schema"]["type"] for p in op["parameters"]} == {"limit": "integer", "cursor": "string"}
    assert op["security"] == [{"bearerAuth": []}]
    assert {"200", "401", "422"} <= set(op["responses"])
    schema = op["responses"]["200"]["content"]["application/json"]["schema"]
    ref = schema["$ref"].rsplit("/", 1)[1]
    assert set(spec["components"]["schemas"][ref]["properties"]) == {"documents", "next_cursor", "trace_id"}
