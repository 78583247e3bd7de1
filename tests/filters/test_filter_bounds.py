"""A search filter's work is bounded and paid for: its price (terms times the thousands of
documents of the tenant) is charged before it runs, a 429 when the tenant cannot pay; ranges
on metadata read typed, indexed rows kept by a trigger; a statement past its timeout is a 503
with one log line, never an ERROR traceback."""

from __future__ import annotations

import logging
import uuid

import psycopg
import pytest
from litestar.testing import TestClient
from psycopg.types.json import Jsonb

from kb_rerank.app import create_app
from kb_rerank.filters import grammar as filters
from kb_rerank.core.costs import filter_price
from kb_rerank.core.limits import Limits
from kb_rerank.core.session import tenant_transaction

from tests.live_server import SECRET, FakeReranker, bearer

URL = "/v1/kb/search/rerank"
RANGES = {f"k{i}": {"$gte": "2024-01-01", "$lt": "2025-01-01"} for i in range(16)}


def _app(settings, embedder, **changes):
    return create_app(settings.with_(jwt_secret=SECRET, **changes), reranker=FakeReranker(), embedder=embedder)


def test_terms_and_price():
    c = filters.canonical({"a": 1, "b": {"$in": [1, 2, 3]}, "c": {"$gte": 1, "$lt": 2}})
    assert filters.terms(c) == 5 and filters.terms(None) == 0
    limits = Limits(cost_per_filter_kdoc=0.05)
    assert filter_price(limits, 16, 20_000) == pytest.approx(16.0)  # the reviewer's filter over 20,000 documents
    assert filter_price(limits, 16, 10) == pytest.approx(0.8)  # a small tenant pays for 1000 at least
    assert filter_price(Limits(), 16, 20_000) == 0.0


@pytest.fixture(scope="module")
def small_tenant(app_url):
    """A tenant of 30 documents with dated metadata (no chunks: the searches read the filter
    and find nothing)."""
    t = uuid.uuid4()
    with psycopg.connect(app_url) as conn, tenant_transaction(conn, t):
        for i in range(30):
            conn.execute("insert into kb.documents (tenant_id, source_uri, title, content_hash, metadata)"
                         " values (%s, %s, 'd', 'h', %s)",
                         [t, f"d{i}.md", Jsonb({f"k{j}": f"2024-0{1 + j % 9}-01" for j in range(16)})])
    return t


def test_a_filter_is_charged_before_it_runs(settings, embedder, small_tenant):
    """With a price above the bucket, the first filtered search passes (the bucket was full)
    and leaves the tenant in debt; the next is a 429 before any filter runs. Priced at 0, the
    same searches pass. (The full prices always: a tenant alone pays one token a request,
    tests/filters/test_filter_flood.py.)"""
    body = {"query": "how do I reset my password", "filter": RANGES}
    limits = dict(rate_limit_per_minute=1, rate_limit_burst=50, rate_work_conserving=False)
    with TestClient(_app(settings, embedder, rate_cost_per_filter_kdoc=10.0, **limits)) as client:
        first = client.post(URL, json=body, headers=bearer(small_tenant))
        assert first.status_code == 200, first.text
        second = client.post(URL, json={**body, "query": "another question"}, headers=bearer(small_tenant))
        assert second.status_code == 429, second.text
        assert second.json()["error"] == "rate_limited" and "retry-after" in second.headers
    with TestClient(_app(settings, embedder, rate_cost_per_filter_kdoc=0.0, **limits)) as client:
        for q in ("how do I reset my password", "another question", "a third one"):
            r = client.post(URL, json={**body, "query": q}, headers=bearer(small_tenant))
            assert r.status_code == 200, r.text


def test_a_statement_timeout_is_a_503_with_one_line(settings, embedder, small_tenant, caplog, monkeypatch):
    """The retrieval's statement runs past the database's statement timeout (a real
    QueryCanceled from PostgreSQL): 503 with Retry-After, one warning line, no traceback."""
    from kb_rerank.endpoints import runner as flow

    async def slow_read(conn, *args, **kw):
        await conn.execute("set local statement_timeout = 20")
        await conn.execute("select pg_sleep(2)")

    monkeypatch.setattr(flow, "read_spec", slow_read)
    app = _app(settings, embedder, rate_limit_per_minute=0)
    with TestClient(app) as client, caplog.at_level(logging.DEBUG):
        caplog.clear()
        r = client.post(URL, json={"query": f"a question never asked {uuid.uuid4()}", "filter": RANGES},
                        headers=bearer(small_tenant))
    assert r.status_code == 503, r.text
    assert r.json()["error"] == "statement_timeout" and "retry-after" in r.headers
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR], \
        [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert not [rec for rec in caplog.records if rec.exc_info]
    warnings = [rec for rec in caplog.records if rec.levelno == logging.WARNING and rec.name == "kb_rerank.http.errors"]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()


def test_typed_values_follow_the_metadata(app_conn):
    """kb.document_values holds one row per number or date of a document's metadata (a list:
    one per element), kept by the trigger on insert, update and delete."""
    t = uuid.uuid4()
    with tenant_transaction(app_conn, t):
        (doc,) = app_conn.execute(
            "insert into kb.documents (tenant_id, source_uri, title, content_hash, metadata)"
            " values (%s, 'a.md', 'a', 'h', %s) returning doc_id",
            [t, Jsonb({"v": 2, "released": ["2024-05-01", "2024-07-01T10:00:00+02:00", "not a date"],
                       "flag": True, "name": "x", "huge": 1e300})]).fetchone()
        rows = app_conn.execute("select key, num, ts::text from kb.document_values order by key, num, ts").fetchall()
        assert rows == [("huge", 1e300, None), ("released", None, "2024-05-01 00:00:00+00"),
                        ("released", None, "2024-07-01 08:00:00+00"), ("v", 2.0, None)]
        # equality on a large number: its double's text is the jsonpath literal (1e+300)
        assert app_conn.execute("select kb.search_filter_docs(%s)", [Jsonb({"huge": 1e300})]).fetchone()[0] == [doc]
        f = {"released": {"$gte": "2024-06-01"}}
        assert app_conn.execute("select kb.search_filter_docs(%s)", [Jsonb(f)]).fetchone()[0] == [doc]
        app_conn.execute("update kb.documents set metadata = %s where doc_id = %s", [Jsonb({"v": 5}), doc])
        assert app_conn.execute("select key, num from kb.document_values").fetchall() == [("v", 5.0)]
        assert app_conn.execute("select kb.search_filter_docs(%s)", [Jsonb(f)]).fetchone()[0] == []
        assert app_conn.execute("select kb.search_filter_docs(%s)",
                                [Jsonb({"v": {"$gt": 4, "$lte": 5}})]).fetchone()[0] == [doc]
        app_conn.execute("delete from kb.documents where doc_id = %s", [doc])
        assert app_conn.execute("select count(*) from kb.document_values").fetchone()[0] == 0
    # another tenant sees none of them
    with tenant_transaction(app_conn, uuid.uuid4()):
        assert app_conn.execute("select count(*) from kb.document_values").fetchone()[0] == 0


def test_typed_values_are_tenant_rows_under_forced_rls(owner_conn):
    relrowsecurity, relforce = owner_conn.execute(
        "select relrowsecurity, relforcerowsecurity from pg_class where oid = 'kb.document_values'::regclass").fetchone()
    assert relrowsecurity and relforce
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        with psycopg.connect(owner_conn.info.dsn) as c:  # noqa: F841 - a role without the grant below
            c.execute("set role kb_sql_reader")
            c.execute("insert into kb.document_values values (gen_random_uuid(), gen_random_uuid(), 'k', 1, null)")
